"""Inter-node requests prove the cluster secret: a broker's registration with a nameserver.

RocketMQ leaves registration open unless ACL is on, so anyone who reaches a nameserver can
register a "master" at an address of their choosing and pull clients' sends to it. Here a
nameserver given the cluster secret accepts REGISTER_BROKER, UNREGISTER_BROKER and
QUERY_DATA_VERSION (which refreshes a broker's liveness) only with a proof of it, whatever
the client ACL setting; brokers sign those requests with their group's secret.

The proof is two extFields: ``ClusterTime`` (the sender's clock, ms) and ``ClusterSignature``
= base64(HMAC-SHA256(secret, label, request code, every other extField in key order as
``name=value``, the body)). The time bounds replay of a captured request to
``max_skew_s`` either way; a replay within it only repeats a registration the broker made
anyway. ACL's ``AccessKey``/``Signature`` are added after this proof (the ACL signature
covers it) and are left out of it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from remoting.acl import ACCESS_KEY, SIGNATURE
from remoting.codes import RequestCode, ResponseCode, request_code_name
from remoting.protocol import HeaderValue, RemotingCommand

CLUSTER_SIGNATURE: Final = "ClusterSignature"
CLUSTER_TIME: Final = "ClusterTime"
DEFAULT_MAX_SKEW_S: Final = 300.0  # how far a signed request's clock may be from the receiver's
_UNSIGNED: Final = frozenset({CLUSTER_SIGNATURE, ACCESS_KEY, SIGNATURE})
_LABEL: Final = b"ledgermq-cluster-v1\x00"

#: what a node sends to another node of the same deployment, never a client
INTER_NODE_CODES: Final = frozenset(
    {
        int(RequestCode.REGISTER_BROKER),
        int(RequestCode.UNREGISTER_BROKER),
        int(RequestCode.QUERY_DATA_VERSION),
    }
)

RpcHook = Callable[[RemotingCommand], None]


def _text(value: HeaderValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _proof(secret: bytes, code: int, headers: Mapping[str, HeaderValue], body: bytes | memoryview) -> str:
    mac = hmac.new(secret, _LABEL + str(code).encode() + b"\x00", hashlib.sha256)
    for name in sorted(headers):
        value = headers[name]
        if name not in _UNSIGNED and value is not None:
            mac.update(f"{name}={_text(value)}\x00".encode())
    if body:
        mac.update(body)
    return base64.b64encode(mac.digest()).decode()


def sign_request(request: RemotingCommand, secret: bytes, now_ms: int) -> None:
    """Add ``ClusterTime`` and ``ClusterSignature`` to ``request`` (replacing an earlier proof)."""
    headers = request.headers
    headers.pop(CLUSTER_SIGNATURE, None)
    headers[CLUSTER_TIME] = str(now_ms)
    headers[CLUSTER_SIGNATURE] = _proof(secret, request.code, headers, request.body)


def proof_problem(
    secrets: Sequence[bytes], request: RemotingCommand, max_skew_ms: int, now_ms: int, missing: str
) -> str | None:
    """Why ``request`` does not prove one of ``secrets`` (None: it does); ``missing`` says
    what to do when it carries no proof at all (the receiver knows who should have signed)."""
    headers = request.headers
    sent, stamp = headers.get(CLUSTER_SIGNATURE), headers.get(CLUSTER_TIME)
    if not isinstance(sent, str) or not isinstance(stamp, str):
        return missing
    if not stamp.isdigit() or len(stamp) > 15:
        return f"{CLUSTER_TIME} {stamp[:20]!r} is not a time in milliseconds"
    skew = int(stamp) - now_ms
    if abs(skew) > max_skew_ms:
        return (
            f"{CLUSTER_TIME} is {skew / 1000:+.0f} s from the receiver's clock "
            f"(at most {max_skew_ms / 1000:.0f} s either way): a replay, or clocks out of sync"
        )
    if sent.isascii():
        for secret in secrets:
            if hmac.compare_digest(sent, _proof(secret, request.code, headers, request.body)):
                return None
    return "the cluster signature does not verify (a different cluster_secret)"


class ClusterSigner:
    """A node's RPC hook: signs its inter-node requests with the cluster secret."""

    __slots__ = ("_secret", "_clock")

    def __init__(self, secret: bytes, clock: Callable[[], float] = time.time) -> None:
        if not secret:
            raise ValueError("a cluster signer needs the cluster secret")
        self._secret = secret
        self._clock = clock

    def __call__(self, request: RemotingCommand) -> None:
        if request.code in INTER_NODE_CODES:
            sign_request(request, self._secret, int(self._clock() * 1000))

    def __repr__(self) -> str:  # never show the secret
        return "ClusterSigner()"


def chain_hooks(*hooks: RpcHook | None) -> RpcHook | None:
    """One RPC hook running ``hooks`` in order (None entries dropped); None if none is left."""
    present = [h for h in hooks if h is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]

    def run_all(request: RemotingCommand) -> None:
        for hook in present:
            hook(request)

    return run_all


class ClusterGate:
    """A server's request gate: inter-node requests must prove one of ``secrets``; every
    request then goes through ``inner`` (ACL) if there is one."""

    def __init__(
        self,
        secrets: Sequence[bytes],
        inner: Any = None,
        *,
        max_skew_s: float = DEFAULT_MAX_SKEW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not secrets or not all(secrets):
            raise ValueError("a cluster gate needs at least one non-empty secret")
        self._secrets = tuple(secrets)
        self.inner = inner
        self.max_skew_ms = int(max_skew_s * 1000)
        self._clock = clock
        self.refused = 0

    def check(self, conn: Any, request: RemotingCommand) -> RemotingCommand | None:
        if request.code in INTER_NODE_CODES:
            problem = self._problem(request)
            if problem is not None:
                self.refused += 1
                return request.make_response(
                    ResponseCode.NO_PERMISSION, f"{request_code_name(request.code)} refused: {problem}"
                )
        return None if self.inner is None else self.inner.check(conn, request)

    def _problem(self, request: RemotingCommand) -> str | None:
        return proof_problem(
            self._secrets,
            request,
            self.max_skew_ms,
            int(self._clock() * 1000),
            "this nameserver requires the cluster secret: the broker must be configured with the "
            "same cluster_secret (it signs ClusterTime/ClusterSignature)",
        )
