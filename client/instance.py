"""ClientInstance: the connections, nameserver client and route cache one process shares.

RocketMQ's MQClientInstance lets every producer and consumer of a process share one set of
broker connections and one route table; ours can be passed to several producers and
consumers the same way (each one otherwise makes its own). It is closed by whoever created it.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import socket
import ssl
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from client.namesrv_client import DEFAULT_NAMESRV_TIMEOUT_S, NamesrvClient
from client.route import DEFAULT_ROUTE_TTL_S, RouteTable
from remoting.acl import RequestSigner
from remoting.client import RemotingClient
from remoting.codes import RequestCode
from remoting.config import RemotingConfig
from remoting.connection import RemotingConnection
from remoting.message import MAX_PULL_FRAME_BYTES, Message, MessageFormatError, decode_stored_messages
from remoting.protocol import RemotingCommand
from remoting.tls import client_ssl

log = logging.getLogger("client")

_instance_counter = itertools.count(1)


def make_client_id() -> str:
    """``host@pid#n-random``: unique per instance, so consumers sharing a process still rebalance apart.

    The host name, not an IP: resolving it could block start-up for seconds on a bad resolver.
    """
    return f"{socket.gethostname()}@{os.getpid()}#{next(_instance_counter)}-{uuid.uuid4().hex[:8]}"


PROPERTY_PRODUCER_GROUP = "PGROUP"
"""The half message property naming its producer group (client.message_props has them all)."""
TransactionChecker = Callable[[RemotingConnection, RemotingCommand, Message], None]
"""Takes a broker's CHECK_TRANSACTION_STATE for one half message (and answers it later)."""

ACCESS_KEY_ENV = "LEDGERMQ_ACCESS_KEY"
SECRET_KEY_ENV = "LEDGERMQ_SECRET_KEY"


def make_signer(access_key: str | None = None, secret_key: str | None = None) -> RequestSigner | None:
    """The ACL signer for these credentials, else for LEDGERMQ_ACCESS_KEY/LEDGERMQ_SECRET_KEY, else None.

    Read from the environment when not given so that every producer and consumer (each makes its
    own ClientInstance unless handed one) signs once the operator exports the two variables.
    """
    if access_key is None and secret_key is None:
        access_key = os.environ.get(ACCESS_KEY_ENV) or None
        secret_key = os.environ.get(SECRET_KEY_ENV) or None
    if not access_key and not secret_key:
        return None
    if not access_key or not secret_key:
        raise ValueError(
            f"ACL credentials need both an access key and a secret key ({ACCESS_KEY_ENV}, {SECRET_KEY_ENV})"
        )
    return RequestSigner(access_key, secret_key)


TLS_ENABLE_ENV = "LEDGERMQ_TLS_ENABLE"
TLS_CA_FILE_ENV = "LEDGERMQ_TLS_CA_FILE"
TLS_CERT_FILE_ENV = "LEDGERMQ_TLS_CERT_FILE"
TLS_KEY_FILE_ENV = "LEDGERMQ_TLS_KEY_FILE"


def tls_from_env(environ: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    """The client TLS context the LEDGERMQ_TLS_* variables ask for, or None when TLS is off.

    RocketMQ's clients take ``-Dtls.enable=true`` and the tls.client.* paths as system
    properties, so a deployment turns TLS on for every client at once; these variables do the
    same for every producer, consumer and admin command of a process.
    """
    env = os.environ if environ is None else environ
    flag = env.get(TLS_ENABLE_ENV, "").strip().lower()
    if flag in ("", "0", "false", "no", "off"):
        return None
    if flag not in ("1", "true", "yes", "on"):
        raise ValueError(f"environment variable {TLS_ENABLE_ENV} must be true or false, got {flag!r}")
    try:
        return client_ssl(
            True, env.get(TLS_CA_FILE_ENV, ""), env.get(TLS_CERT_FILE_ENV, ""), env.get(TLS_KEY_FILE_ENV, "")
        )
    except ValueError as exc:  # ConfigError names the key; say which variables feed it
        raise ValueError(f"{exc} (client TLS from the {TLS_ENABLE_ENV} / LEDGERMQ_TLS_* variables)") from None


class ClientInstance:
    """Shared plumbing: RemotingClient + NamesrvClient + RouteTable, plus a client id."""

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str] | None = None,
        *,
        remoting_config: RemotingConfig | None = None,
        namesrv_timeout_s: float = DEFAULT_NAMESRV_TIMEOUT_S,
        route_ttl_s: float = DEFAULT_ROUTE_TTL_S,
        name: str = "ledgermq-client",
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``tls`` dials nameservers and brokers with TLS (remoting.tls.client_ssl builds one);
        without it, a ``remoting_config`` carrying ``client_ssl``, else the LEDGERMQ_TLS_* variables."""
        self.client_id = make_client_id()
        self.signer = make_signer(access_key, secret_key)
        if remoting_config is None:  # a pull answer holds a message of the broker's largest size
            remoting_config = RemotingConfig(max_body_bytes=MAX_PULL_FRAME_BYTES)
        if self.signer is not None and (remoting_config is None or remoting_config.send_crc):
            # A signed request carries no body CRC field: the signature (HMAC-SHA1 over the
            # headers and the body) already protects the body end to end, and the CRC field,
            # added after signing, would make a RocketMQ broker verify different fields.
            remoting_config = dataclasses.replace(remoting_config or RemotingConfig(), send_crc=False)
        if remoting_config is None or remoting_config.client_ssl is None:
            tls = tls or tls_from_env()
            if tls is not None:
                remoting_config = dataclasses.replace(remoting_config or RemotingConfig(), client_ssl=tls)
        self.remoting = RemotingClient(remoting_config, name=name, rpc_hook=self.signer)
        self.namesrv = NamesrvClient(namesrv_addrs, self.remoting, timeout_s=namesrv_timeout_s)
        self.routes = RouteTable(self.namesrv, ttl_s=route_ttl_s)
        self._closed = False
        self._ids_watchers: dict[str, list[Callable[[], None]]] = {}
        # Brokers tell clients when a group's membership changes so they rebalance at once
        # instead of at the next periodic round (RocketMQ's NOTIFY_CONSUMER_IDS_CHANGED).
        self.remoting.register_processor(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_ids_changed)
        # A broker asks a transaction producer how a half message's transaction ended
        # (RocketMQ's ClientRemotingProcessor.checkTransactionState): by the PGROUP it carries.
        self._tx_checkers: dict[str, TransactionChecker] = {}
        self.remoting.register_processor(RequestCode.CHECK_TRANSACTION_STATE, self._on_check_transaction)

    def register_transaction_checker(self, group: str, checker: TransactionChecker) -> Callable[[], None]:
        """Route CHECK_TRANSACTION_STATE for half messages of producer ``group`` to ``checker``
        (one per group and process, as RocketMQ's producer table); returns the unregister function."""
        if group in self._tx_checkers:
            raise ValueError(
                f"producer group {group} already answers transaction checks in this client instance"
            )
        self._tx_checkers[group] = checker

        def unregister() -> None:
            if self._tx_checkers.get(group) is checker:
                del self._tx_checkers[group]

        return unregister

    def _on_check_transaction(self, conn: RemotingConnection, request: RemotingCommand) -> None:
        """Hand the half message to its group's checker; never answered (the broker sends it oneway)."""
        try:
            msgs = decode_stored_messages(request.body, max_messages=1)
        except MessageFormatError as exc:
            log.warning("transaction check with an undecodable message ignored", extra={"error": str(exc)})
            return None
        if not msgs:
            log.warning("transaction check without a message ignored", extra={"peer": conn.remote_addr})
            return None
        msg = msgs[0]
        group = msg.properties.get(PROPERTY_PRODUCER_GROUP, "")
        checker = self._tx_checkers.get(group)
        if checker is None:
            log.debug("transaction check for a producer group not here", extra={"group": group})
            return None
        try:
            checker(conn, request, msg)
        except Exception:
            log.exception("transaction checker raised", extra={"group": group})
        return None

    def watch_consumer_ids(self, group: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when a broker says ``group`` changed; returns the function that stops it."""
        self._ids_watchers.setdefault(group, []).append(callback)

        def unwatch() -> None:
            watchers = self._ids_watchers.get(group, [])
            if callback in watchers:
                watchers.remove(callback)

        return unwatch

    def _on_ids_changed(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        group = request.header_str("consumerGroup", "")
        for callback in list(self._ids_watchers.get(group, [])):
            try:
                callback()
            except Exception:
                log.exception("consumer-ids watcher raised", extra={"group": group})
        return request.make_response()

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self.remoting.close()
