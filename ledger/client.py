"""Async client of a ledger group: append, read, status, leadership transfer, membership.

Requests are pipelined (many in flight on one connection, matched by id). The client
follows ``not leader`` redirects and retries with backoff until its deadline, but it
never retries an append whose outcome is unknown (sent, then the connection dropped or
timed out): doing so could store the entry twice, so the caller is told instead
(``LedgerError`` with code ``UNKNOWN_OUTCOME``), which is exactly what a Jepsen history
needs to record as ``info``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import ssl as ssl_module
from collections.abc import Callable, Sequence
from typing import Any

from common.settings import parse_host_port

from .auth import AuthError, PeerAuth
from .codec import Entry
from .membership import ADD, PROMOTE, REMOVE
from .transport import HELLO_CLIENT, FrameProtocol
from .wire import (
    BUSY,
    MEMBER_LIST,
    NOT_LEADER,
    OK,
    UNAVAILABLE,
    UNKNOWN_OUTCOME,
    LedgerError,
    decode_response_head,
    encode_append,
    encode_member,
    encode_read,
    encode_status,
    encode_transfer,
    parse_append_ok,
    parse_entries,
    parse_error,
)


class _Conn(FrameProtocol):
    def __init__(self, max_frame: int) -> None:
        super().__init__(max_frame, "client")
        self.waiters: dict[int, asyncio.Future[tuple[int, memoryview]]] = {}
        self.challenge: asyncio.Future[bytes] | None = None  # set while proving the cluster secret

    def on_frame(self, body: bytes) -> None:
        if self.challenge is not None and not self.challenge.done():
            self.challenge.set_result(body)
            return
        rid, code, payload = decode_response_head(body)
        fut = self.waiters.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result((code, payload))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        err = ConnectionError(f"connection to {self.peername} lost")
        if self.challenge is not None and not self.challenge.done():
            self.challenge.set_exception(ConnectionError(f"{self.peername} closed the connection: refused?"))
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_exception(err)
        self.waiters.clear()


#: Seconds between repeats of a membership change the leader answered ``busy`` (see ``_member``).
MEMBER_RETRY_S = 0.1


class _Sent(Exception):
    """Wraps a failure that happened after the request left (its effect is unknown)."""


class LedgerClient:
    def __init__(
        self,
        addresses: Sequence[str],
        *,
        timeout: float = 10.0,
        attempt_timeout: float = 3.0,
        max_frame: int = 64 << 20,
        ssl: ssl_module.SSLContext | None = None,
        secret: bytes | None = None,
        accepted_secrets: Sequence[bytes] = (),
    ) -> None:
        if not addresses:
            raise ValueError("no ledger node address given")
        for a in addresses:
            parse_host_port("address", a)
        self.addresses = list(addresses)
        self.timeout = timeout
        self.attempt_timeout = attempt_timeout
        self.max_frame = max_frame
        self.ssl = ssl  # TLS to nodes that have it on (see common.tls.client_context)
        # Proves the cluster secret (nodes' client_auth); during a rotation it also accepts nodes
        # that still prove one of ``accepted_secrets``, as peers do.
        self.auth = PeerAuth(secret, tuple(accepted_secrets)) if secret else None
        self.leader_address: str | None = None
        self._conns: dict[str, _Conn] = {}
        self._connecting: dict[str, asyncio.Future[_Conn]] = {}
        self._ids = itertools.count(1)
        self._rr = random.randrange(len(self.addresses))

    async def close(self) -> None:
        for c in self._conns.values():
            if c.transport is not None:
                c.transport.close()
        self._conns.clear()

    async def __aenter__(self) -> LedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ API

    async def append(self, data: bytes) -> tuple[int, int]:
        """Append one entry; returns (index, term) once it is committed."""
        return await self.append_batch([data])

    async def append_batch(self, payloads: Sequence[bytes]) -> tuple[int, int]:
        """Append entries as one batch (consecutive indexes); returns (first index, term)."""
        code, payload = await self._call(lambda rid: encode_append(rid, payloads), idempotent=False)
        first, term, _ = parse_append_ok(payload)
        return first, term

    async def read(
        self,
        lo: int,
        hi: int,
        *,
        linearizable: bool = False,
        max_bytes: int = 0,
        address: str | None = None,
    ) -> list[Entry]:
        """Committed entries lo..hi; ``linearizable`` confirms leadership first (ReadIndex)."""
        _, payload = await self._call(
            lambda rid: encode_read(rid, lo, hi, max_bytes, linearizable),
            idempotent=True,
            address=address,
            follow_leader=linearizable or address is None,
        )
        return parse_entries(payload)

    async def status(self, address: str | None = None) -> dict[str, Any]:
        _, payload = await self._call(encode_status, idempotent=True, address=address, follow_leader=False)
        return json.loads(bytes(payload))

    async def status_all(self) -> dict[str, dict[str, Any] | str]:
        """Status of every configured node; unreachable ones map to an error string."""

        async def one(addr: str) -> dict[str, Any] | str:
            try:
                return await asyncio.wait_for(self.status(addr), self.attempt_timeout)
            except (TimeoutError, OSError, LedgerError) as exc:
                return f"unreachable: {exc or type(exc).__name__}"

        results = await asyncio.gather(*(one(a) for a in self.addresses))
        return dict(zip(self.addresses, results, strict=True))

    async def transfer_leadership(self, target: str) -> dict[str, Any]:
        _, payload = await self._call(lambda rid: encode_transfer(rid, target), idempotent=True)
        return json.loads(bytes(payload))

    # ------------------------------------------------------------------ membership

    async def members(self) -> dict[str, Any]:
        """The leader's configuration: ``voters`` and ``learners`` (id -> address), ``index`` of its
        entry, ``committed``, ``leader``, and ``progress`` (each member's ``match``, ``lag``, ``active``)."""
        _, payload = await self._call(lambda rid: encode_member(rid, MEMBER_LIST), idempotent=True)
        return json.loads(bytes(payload))

    async def add_learner(self, node_id: str, address: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        """Add ``node_id`` at ``address`` as a learner; returns the new configuration once committed.
        With ``wait_s`` a ``busy`` refusal (a new leader, another change under way) is retried."""
        return await self._member(ADD, node_id, address, wait_s=wait_s)

    async def promote(self, node_id: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        """Make learner ``node_id`` a voter. The leader refuses until the learner has caught up;
        with ``wait_s`` the request is repeated (every ``retry_s``) for up to that long."""
        return await self._member(PROMOTE, node_id, wait_s=wait_s)

    async def remove_member(self, node_id: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        """Remove voter or learner ``node_id`` (the leader itself steps down once it commits).
        With ``wait_s`` a ``busy`` refusal is retried for up to that long."""
        return await self._member(REMOVE, node_id, wait_s=wait_s)

    async def _member(self, op: str, node_id: str, address: str = "", wait_s: float = 0.0) -> dict[str, Any]:
        """One change, repeated while the leader answers ``busy`` (retryable) within ``wait_s``.

        Never resent once it may have been appended (an unanswered request): the caller gets
        ``UNKNOWN_OUTCOME`` and can look at ``members()``, as with appends.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            try:
                _, payload = await self._call(
                    lambda rid: encode_member(rid, op, node_id, address), idempotent=False
                )
                return json.loads(bytes(payload))
            except LedgerError as exc:
                if exc.code != BUSY or loop.time() + MEMBER_RETRY_S > deadline:
                    raise
            await asyncio.sleep(MEMBER_RETRY_S)

    # ------------------------------------------------------------------ plumbing

    def _next_address(self) -> str:
        self._rr = (self._rr + 1) % len(self.addresses)
        return self.addresses[self._rr]

    def dial_address(self, address: str) -> str:
        """Where to connect to reach the node known as ``address``.

        The node's own name by default; a subclass can map it (the Jepsen harness reaches
        nodes directly although they name each other by proxied addresses).
        """
        return address

    async def _conn(self, address: str) -> _Conn:
        address = self.dial_address(address)
        conn = self._conns.get(address)
        if conn is not None and conn.transport is not None and not conn.transport.is_closing():
            return conn
        pending = self._connecting.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[_Conn] = loop.create_future()
        self._connecting[address] = fut
        try:
            host, port = parse_host_port("address", address)
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Conn(self.max_frame),
                    host,
                    port,
                    ssl=self.ssl,
                    server_hostname=host if self.ssl is not None else None,
                ),
                self.attempt_timeout,
            )
            if self.auth is None:
                conn.send(HELLO_CLIENT)
            else:
                await asyncio.wait_for(self._authenticate(conn), self.attempt_timeout)
            self._conns[address] = conn
            fut.set_result(conn)
            return conn
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        finally:
            del self._connecting[address]

    async def _authenticate(self, conn: _Conn) -> None:
        """Prove the cluster secret to the node (and check that the node knows it too)."""
        assert self.auth is not None
        conn.challenge = asyncio.get_running_loop().create_future()
        hello, nonce = self.auth.client_hello()
        conn.send(hello)
        try:
            conn.send(self.auth.answer_client_challenge(nonce, await conn.challenge))
        except AuthError as exc:
            conn.close()
            raise ConnectionError(f"{conn.peername}: {exc}") from None
        except BaseException:
            conn.close()
            raise

    async def _once(self, address: str, build: Callable[[int], bytes]) -> tuple[int, memoryview]:
        conn = await self._conn(address)
        rid = next(self._ids)
        fut: asyncio.Future[tuple[int, memoryview]] = asyncio.get_running_loop().create_future()
        conn.waiters[rid] = fut
        conn.send(build(rid))
        try:
            return await asyncio.wait_for(fut, self.attempt_timeout)
        except (TimeoutError, OSError) as exc:
            conn.waiters.pop(rid, None)
            raise _Sent(str(exc) or type(exc).__name__) from exc

    async def _call(
        self,
        build: Callable[[int], bytes],
        *,
        idempotent: bool,
        address: str | None = None,
        follow_leader: bool = True,
    ) -> tuple[int, memoryview]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        backoff = 0.02
        last_error: Exception | None = None
        target = address or self.leader_address or self._next_address()
        while True:
            try:
                code, payload = await self._once(target, build)
            except _Sent as exc:
                if not idempotent:
                    raise LedgerError(
                        UNKNOWN_OUTCOME, f"request to {target} sent but unanswered: {exc}"
                    ) from None
                last_error = exc
                code, payload = -1, memoryview(b"")
            except OSError as exc:
                last_error = exc
                code, payload = -1, memoryview(b"")
            if code == OK:
                if follow_leader and address is None:
                    self.leader_address = target
                return code, payload
            if code >= 0:
                err = parse_error(code, payload)
                if code not in (NOT_LEADER, UNAVAILABLE) or not follow_leader:
                    raise err
                last_error = err
                if target == self.leader_address:
                    self.leader_address = None
                if err.leader_address and err.leader_address != target:
                    target = err.leader_address
                    self.leader_address = target
                    if loop.time() < deadline:
                        continue  # a redirect to a known leader needs no backoff
            elif address is not None and not follow_leader:
                raise LedgerError(UNAVAILABLE, f"{address}: {last_error}")
            if loop.time() + backoff > deadline:
                raise LedgerError(UNAVAILABLE, f"no node answered within {self.timeout:.1f}s: {last_error}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 1.5, 0.1)
            if code < 0 or not (address and not follow_leader):
                if target == self.leader_address:
                    self.leader_address = None
                target = self._next_address() if address is None or follow_leader else address
