"""The broker's side of nameserver registration (RocketMQ's BrokerOuterAPI, registration part).

A broker registers with EVERY nameserver, concurrently, one call per nameserver, and waits at
most a total timeout for all of them (RocketMQ's CountDownLatch pattern): nameservers are
independent, so one that is down or slow must not delay or fail registration with the others.
Results come back per nameserver; for a slave they carry its group's master address.

Kept independent of the rest of ``broker/``: the broker controller supplies its identity and
topic table and decides what to do with the results.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.settings import ConfigError, parse_host_port
from remoting import headers as H
from remoting.client import RemotingClient
from remoting.codes import RequestCode, ResponseCode, response_code_name
from remoting.config import RemotingConfig
from remoting.exceptions import RemotingCommandError, RemotingError
from remoting.jsonbody import Fields, deflate, dump_body, load_body
from remoting.protocol import HeaderValue, RemotingCommand
from remoting.topic import DataVersion, TopicConfigWrapper

log = logging.getLogger("broker.registration")

DEFAULT_REGISTER_TIMEOUT_S = 6.0  # RocketMQ's registerBrokerTimeoutMills
MIN_REGISTER_INTERVAL_S = 10.0
MAX_REGISTER_INTERVAL_S = 60.0


@dataclass(frozen=True, slots=True)
class BrokerIdentity:
    """Who is registering: the headers of REGISTER_BROKER / UNREGISTER_BROKER / QUERY_DATA_VERSION."""

    cluster_name: str
    broker_name: str
    broker_addr: str
    broker_id: int
    ha_server_addr: str = ""

    def headers(self) -> dict[str, HeaderValue]:
        return {
            H.CLUSTER_NAME: self.cluster_name,
            H.BROKER_NAME: self.broker_name,
            H.BROKER_ADDR: self.broker_addr,
            H.BROKER_ID: self.broker_id,
            H.HA_SERVER_ADDR: self.ha_server_addr,
        }


@dataclass(frozen=True, slots=True)
class RegisterBrokerResult:
    """Outcome of registering with one nameserver."""

    namesrv_addr: str
    ok: bool
    master_addr: str | None = None
    """For a slave: the current master of its group, as that nameserver knows it."""
    ha_server_addr: str | None = None
    kv_table: dict[str, str] = field(default_factory=dict)
    """ORDER_TOPIC_CONFIG entries of that nameserver."""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class NamesrvCallResult:
    """Outcome of a call without payload (unregister) on one nameserver."""

    namesrv_addr: str
    ok: bool
    error: str | None = None


def validate_namesrv_addrs(addrs: Iterable[str], key: str = "namesrv_addr") -> list[str]:
    """Check ``host:port`` syntax of each address (ConfigError names the bad one); drop duplicates."""
    out: list[str] = []
    for addr in addrs:
        addr = addr.strip()
        if not addr:
            continue
        parse_host_port(key, addr)
        if addr not in out:
            out.append(addr)
    return out


class BrokerOuterAPI:
    """Registration calls to all nameservers over one RemotingClient (its connections are cached)."""

    #: why this broker must not register any more (None: it may), e.g. it was removed from its group
    withhold: Callable[[], str | None] | None = None

    def __init__(
        self,
        namesrv_addrs: Sequence[str] = (),
        client: RemotingClient | None = None,
        *,
        compressed: bool = False,
        remoting_config: RemotingConfig | None = None,
    ) -> None:
        """``remoting_config`` is for the client made here (none given): its ``client_ssl`` dials
        the nameservers with TLS when they require it."""
        self._own_client = client is None
        self.client = client or RemotingClient(remoting_config, name="broker-outer-api")
        self.compressed = compressed
        self._namesrv_addrs = validate_namesrv_addrs(namesrv_addrs)

    @property
    def namesrv_addrs(self) -> list[str]:
        return list(self._namesrv_addrs)

    async def close(self) -> None:
        if self._own_client:
            await self.client.close()

    # --- fan-out helper -------------------------------------------------------------------------
    async def _on_all(
        self,
        call: Callable[[str], Awaitable[Any]],
        on_timeout: Callable[[str], Any],
        timeout_s: float,
    ) -> list[Any]:
        """Run ``call`` for each nameserver concurrently; whatever is not done after ``timeout_s`` is given up."""
        addrs = self._namesrv_addrs
        if not addrs:
            raise ConfigError("no nameserver address configured (namesrv_addr is empty)")
        tasks = [asyncio.ensure_future(call(addr)) for addr in addrs]
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        return [
            task.result() if task in done else on_timeout(addr)
            for addr, task in zip(addrs, tasks, strict=True)
        ]

    # --- register ---------------------------------------------------------------------------
    async def register_broker_all(
        self,
        identity: BrokerIdentity,
        topic_config: TopicConfigWrapper,
        *,
        timeout_s: float = DEFAULT_REGISTER_TIMEOUT_S,
        compressed: bool | None = None,
    ) -> list[RegisterBrokerResult]:
        """Register with every nameserver at once; one result per nameserver, in configured order.

        Never raises for a nameserver's failure (it is in that result's ``error``); raises
        ConfigError only when no nameserver is configured.
        """
        body = topic_config.body()
        use_zlib = self.compressed if compressed is None else compressed
        headers = identity.headers()
        if use_zlib:
            body = deflate(body)
            headers[H.COMPRESSED] = True

        async def one(addr: str) -> RegisterBrokerResult:
            request = RemotingCommand.request(RequestCode.REGISTER_BROKER, headers, body)
            try:
                response = await self.client.invoke_sync(addr, request, timeout_s)
            except RemotingError as exc:
                return self._failed(addr, identity, f"{type(exc).__name__}: {exc}")
            if response.code != ResponseCode.SUCCESS:
                return self._failed(addr, identity, f"{response_code_name(response.code)}: {response.remark}")
            try:
                kv = _parse_kv_table(response.body)
            except RemotingCommandError as exc:
                return self._failed(addr, identity, f"bad response body: {exc}")
            return RegisterBrokerResult(
                addr,
                True,
                master_addr=response.header_str(H.MASTER_ADDR, None) or None,
                ha_server_addr=response.header_str(H.HA_SERVER_ADDR, None) or None,
                kv_table=kv,
            )

        results = await self._on_all(
            one,
            lambda addr: self._failed(
                addr, identity, f"no answer within the {timeout_s:g}s registration timeout"
            ),
            timeout_s,
        )
        ok = sum(1 for r in results if r.ok)
        log.info(
            "registered broker with nameservers",
            extra={
                "broker_name": identity.broker_name,
                "broker_id": identity.broker_id,
                "ok": ok,
                "failed": len(results) - ok,
                "data_version": repr(topic_config.data_version),
            },
        )
        return results

    @staticmethod
    def _failed(addr: str, identity: BrokerIdentity, error: str) -> RegisterBrokerResult:
        log.warning(
            "register broker to name server failed",
            extra={
                "namesrv": addr,
                "broker_name": identity.broker_name,
                "broker_id": identity.broker_id,
                "error": error,
            },
        )
        return RegisterBrokerResult(addr, False, error=error)

    # --- unregister -------------------------------------------------------------------------
    async def unregister_broker_all(
        self, identity: BrokerIdentity, *, timeout_s: float = 3.0
    ) -> list[NamesrvCallResult]:
        """Tell every nameserver this broker is leaving (at shutdown), so routes drop it at once."""
        headers = identity.headers()

        async def one(addr: str) -> NamesrvCallResult:
            request = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, headers)
            try:
                response = await self.client.invoke_sync(addr, request, timeout_s)
            except RemotingError as exc:
                return NamesrvCallResult(addr, False, f"{type(exc).__name__}: {exc}")
            if response.code != ResponseCode.SUCCESS:
                return NamesrvCallResult(
                    addr, False, f"{response_code_name(response.code)}: {response.remark}"
                )
            return NamesrvCallResult(addr, True)

        results = await self._on_all(
            one, lambda addr: NamesrvCallResult(addr, False, f"no answer within {timeout_s:g}s"), timeout_s
        )
        for r in results:
            if not r.ok:
                log.warning(
                    "unregister broker from name server failed",
                    extra={"namesrv": r.namesrv_addr, "error": r.error},
                )
        return results

    # --- data version -----------------------------------------------------------------------
    async def need_register(
        self, identity: BrokerIdentity, data_version: DataVersion, *, timeout_s: float = 3.0
    ) -> bool:
        """True if any nameserver's view of our topic config differs from ``data_version``.

        A nameserver that does not answer also counts as "needs registering": unlike RocketMQ,
        which skips it, we would rather send one registration too many than let a restarted
        nameserver miss us until the next forced round.
        """
        headers = identity.headers()
        body = dump_body(data_version.to_json())

        async def one(addr: str) -> bool:
            request = RemotingCommand.request(RequestCode.QUERY_DATA_VERSION, headers, body)
            try:
                response = await self.client.invoke_sync(addr, request, timeout_s)
            except RemotingError as exc:
                log.warning("query data version failed", extra={"namesrv": addr, "error": str(exc)})
                return True
            if response.code != ResponseCode.SUCCESS:
                log.warning(
                    "query data version refused",
                    extra={
                        "namesrv": addr,
                        "code": response_code_name(response.code),
                        "remark": response.remark,
                    },
                )
                return True
            try:
                changed = response.header_bool(H.CHANGED)
            except RemotingCommandError:
                return True
            if changed:
                log.info("nameserver has another data version", extra={"namesrv": addr})
            return changed

        results = await self._on_all(one, lambda addr: True, timeout_s)
        return any(results)

    async def register_if_needed(
        self,
        identity: BrokerIdentity,
        topic_config: TopicConfigWrapper,
        *,
        force: bool,
        timeout_s: float = DEFAULT_REGISTER_TIMEOUT_S,
    ) -> list[RegisterBrokerResult] | None:
        """RocketMQ's registerBrokerAll: register if forced or any nameserver's data version differs.

        Returns None when registration was skipped (the version query refreshed our liveness, or
        registering is withheld).
        """
        if self._withheld():
            return None
        if not force and not await self.need_register(
            identity, topic_config.data_version, timeout_s=timeout_s
        ):
            return None
        return await self.register_broker_all(identity, topic_config, timeout_s=timeout_s)

    def _withheld(self) -> bool:
        """Whether ``withhold`` names a reason not to register; logged the first time it does,
        so the broker's log says why it left the routes and stays off them."""
        reason = self.withhold() if self.withhold is not None else None
        if reason is not None and not getattr(self, "_withheld_logged", False):
            self._withheld_logged = True
            log.warning("no longer registering with the nameservers", extra={"reason": reason})
        return reason is not None


def _parse_kv_table(body: bytes | bytearray | memoryview) -> dict[str, str]:
    if not body:
        return {}
    table = Fields(load_body(body, "REGISTER_BROKER response"), "REGISTER_BROKER response").get_obj(
        "table", {}
    )
    return {str(k): str(v) for k, v in table.items()}


# --- periodic re-registration ----------------------------------------------------------------
TOPIC_CHANGE_GAP_S = 0.5  # topic changes re-register at most this often (see trigger_coalesced)


def clamp_register_interval(
    interval_s: float, lo: float = MIN_REGISTER_INTERVAL_S, hi: float = MAX_REGISTER_INTERVAL_S
) -> float:
    """RocketMQ clamps registerNameServerPeriod to 10..60 s: faster floods nameservers, slower risks expiry."""
    return max(lo, min(interval_s, hi))


class PeriodicRegistration:
    """Calls ``register(force)`` after ``first_delay_s``, then every clamped interval, until stopped.

    ``trigger()`` runs a round now (a DLedger role change re-registers at once) and restarts the
    interval. ``register`` errors are logged and the loop goes on: registration is the broker's
    heartbeat, and one bad round must not silence it for good.
    """

    def __init__(
        self,
        register: Callable[[bool], Awaitable[object]],
        *,
        interval_s: float = 30.0,
        first_delay_s: float = 10.0,
        force_register: bool = True,
        min_interval_s: float = MIN_REGISTER_INTERVAL_S,
        max_interval_s: float = MAX_REGISTER_INTERVAL_S,
        name: str = "register-broker",
    ) -> None:
        if min_interval_s <= 0 or max_interval_s < min_interval_s:
            raise ValueError(f"bad clamp range [{min_interval_s}, {max_interval_s}]")
        self.register = register
        self.interval_s = clamp_register_interval(interval_s, min_interval_s, max_interval_s)
        if self.interval_s != interval_s:
            log.info(
                "registration interval clamped",
                extra={
                    "requested_s": interval_s,
                    "used_s": self.interval_s,
                    "lo": min_interval_s,
                    "hi": max_interval_s,
                },
            )
        self.first_delay_s = max(0.0, first_delay_s)
        self.force_register = force_register
        self.name = name
        self.rounds = 0
        self.failures = 0
        self._wake = asyncio.Event()
        self._force_next = False
        self._task: asyncio.Task[None] | None = None
        self._coalesced_at = float("-inf")
        self._coalesced_handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._coalesced_handle is not None:
            self._coalesced_handle.cancel()
            self._coalesced_handle = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def trigger(self, force: bool = True) -> None:
        """Register as soon as possible instead of waiting for the next period."""
        self._force_next = self._force_next or force
        self._wake.set()

    def trigger_coalesced(self, gap_s: float = TOPIC_CHANGE_GAP_S) -> None:
        """Register now, or, within ``gap_s`` of the last such call, once at the gap's end: a
        burst of topic changes (thousands of auto-created topics) makes a round per gap, not
        one per change, each encoding and signing the whole table."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now - self._coalesced_at >= gap_s:
            self._coalesced_at = now
            self.trigger()
        elif self._coalesced_handle is None:
            self._coalesced_handle = loop.call_at(self._coalesced_at + gap_s, self._coalesced_fire)

    def _coalesced_fire(self) -> None:
        self._coalesced_handle = None
        self._coalesced_at = asyncio.get_running_loop().time()
        self.trigger()

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass
        self._wake.clear()

    async def _run(self) -> None:
        await self._sleep(self.first_delay_s)
        while True:
            force = self.force_register or self._force_next
            self._force_next = False
            try:
                await self.register(force)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.failures += 1
                log.exception("periodic broker registration failed", extra={"task": self.name})
            self.rounds += 1
            await self._sleep(self.interval_s)
