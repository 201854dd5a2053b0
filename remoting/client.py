"""RemotingClient: cached connections by address, sync / async / oneway invokes.

Mirrors RocketMQ's NettyRemotingClient. One connection per address carries any number of
requests in flight (matched by opaque); a closed connection is dropped from the cache and the
next call reconnects. A call's timeout covers connecting, waiting for a congested socket and
waiting for the response, as RocketMQ subtracts connect time from the call's budget.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable

from common.settings import ConfigError, parse_host_port
from remoting.codes import request_code_name
from remoting.config import RemotingConfig
from remoting.connection import RemotingConnection, RemotingStats, ResponseCallback
from remoting.dispatcher import Processor, RequestDispatcher
from remoting.exceptions import RemotingConnectError, RemotingError, RemotingTimeoutError
from remoting.protocol import RemotingCommand

log = logging.getLogger("remoting.client")


class RemotingClient:
    """Client side of the protocol; also serves requests a server sends back (register_processor)."""

    def __init__(
        self,
        config: RemotingConfig | None = None,
        *,
        name: str = "remoting-client",
        rpc_hook: Callable[[RemotingCommand], None] | None = None,
    ) -> None:
        self.config = config or RemotingConfig()
        self.rpc_hook = rpc_hook  # e.g. remoting.acl.RequestSigner: runs on every request sent
        self.name = name
        self.dispatcher = RequestDispatcher(name)
        self.stats = RemotingStats()
        self._conns: dict[str, RemotingConnection] = {}
        self._connecting: dict[str, asyncio.Future[RemotingConnection]] = {}
        self._closed = False

    def register_processor(self, code: int, processor: Processor) -> None:
        """Answer requests the server sends on our connections (e.g. CHECK_TRANSACTION_STATE)."""
        self.dispatcher.register(code, processor)

    # --- connections ----------------------------------------------------------------------
    def ready_connection(self, addr: str) -> RemotingConnection | None:
        """The cached connection to ``addr`` if it is open and takes writes now, else None: the
        hot path of ``get_connection`` plus the writability check, without an await."""
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed and conn.writable:
            return conn
        return None

    async def get_connection(self, addr: str, timeout_s: float | None = None) -> RemotingConnection:
        """The cached open connection to ``addr``, or a new one; concurrent callers share one attempt."""
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self._closed:
            raise RemotingConnectError(f"client {self.name} is closed; cannot connect to {addr}")
        attempt = self._connecting.get(addr)
        if attempt is None:
            attempt = asyncio.ensure_future(self._connect(addr))
            self._connecting[addr] = attempt
            attempt.add_done_callback(lambda f: self._attempt_done(addr, f))
        timeout = (
            self.config.connect_timeout_s
            if timeout_s is None
            else min(timeout_s, self.config.connect_timeout_s)
        )
        try:
            return await asyncio.wait_for(asyncio.shield(attempt), timeout)
        except TimeoutError:
            raise RemotingConnectError(f"connect to {addr} timed out after {timeout:g}s") from None

    def _attempt_done(self, addr: str, attempt: asyncio.Future[RemotingConnection]) -> None:
        self._connecting.pop(addr, None)
        if not attempt.cancelled():
            # marked as seen: callers that gave up first (their own, shorter timeout) already
            # had their error, and asyncio would log this one as never retrieved
            attempt.exception()

    async def _connect(self, addr: str) -> RemotingConnection:
        try:
            host, port = parse_host_port("address", addr)
        except ConfigError as exc:
            raise RemotingConnectError(f"cannot connect to {addr!r}: {exc}") from None
        host = host.strip("[]")
        loop = asyncio.get_running_loop()
        tls = self.config.client_ssl
        try:
            _transport, conn = await asyncio.wait_for(
                loop.create_connection(
                    self._make_connection,
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                    ssl_handshake_timeout=self.config.connect_timeout_s if tls is not None else None,
                ),
                self.config.connect_timeout_s,
            )
        except TimeoutError:
            raise RemotingConnectError(
                f"connect to {addr} timed out after {self.config.connect_timeout_s:g}s"
            ) from None
        except (
            ssl.SSLError
        ) as exc:  # wrong CA, name mismatch, a plaintext server, a refused client certificate
            raise RemotingConnectError(f"TLS handshake with {addr} failed: {exc}") from None
        except OSError as exc:
            raise RemotingConnectError(f"connect to {addr} failed: {exc.strerror or exc}") from None
        old = self._conns.get(addr)
        if old is not None and not old.closed:  # pragma: no cover - attempts are shared, so unlikely
            conn.close("duplicate connection")
            return old
        self._conns[addr] = conn
        log.debug("connected", extra={"client": self.name, "peer": addr, "local": conn.local_addr})
        return conn

    def _make_connection(self) -> RemotingConnection:
        conn = RemotingConnection(self.config, self.dispatcher, self.stats, side="client", on_lost=self._lost)
        conn.rpc_hook = self.rpc_hook
        return conn

    def _lost(self, conn: RemotingConnection) -> None:
        for addr, cached in list(self._conns.items()):
            if cached is conn:
                del self._conns[addr]
                log.info(
                    "connection closed",
                    extra={"client": self.name, "peer": addr, "reason": conn.close_reason},
                )

    def close_connection(self, addr: str) -> None:
        """Drop the connection to ``addr`` (its in-flight calls fail); the next call reconnects."""
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close("closed by client")

    @property
    def connected_addresses(self) -> list[str]:
        return [a for a, c in self._conns.items() if not c.closed]

    async def close(self, grace_s: float = 1.0) -> None:
        """Close every connection; pending calls fail with RemotingConnectionClosedError.

        Queued output gets ``grace_s`` to drain; a congested connection (peer not reading) is
        aborted at once rather than holding up shutdown.
        """
        self._closed = True
        for attempt in list(self._connecting.values()):
            attempt.cancel()
        conns = list(self._conns.values())
        self._conns.clear()
        for conn in conns:
            if conn.writable:
                conn.close("client closed")
            else:
                conn.abort("client closed with unsent output")
        if conns:
            waits = [asyncio.ensure_future(c.wait_closed()) for c in conns]
            _done, pending = await asyncio.wait(waits, timeout=grace_s)
            for fut in pending:
                fut.cancel()
            for conn in conns:
                if not conn.closed:
                    conn.abort("client close grace period over")
        await self.dispatcher.shutdown()

    # --- calls ------------------------------------------------------------------------------
    async def _writable_connection(
        self, addr: str, deadline: float, request: RemotingCommand
    ) -> RemotingConnection:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RemotingTimeoutError(f"{request_code_name(request.code)} to {addr}: timeout before sending")
        conn = await self.get_connection(addr, remaining)
        if not conn.writable:
            remaining = deadline - time.monotonic()
            try:
                await asyncio.wait_for(conn.wait_writable(), max(remaining, 0))
            except TimeoutError:
                raise RemotingTimeoutError(
                    f"{request_code_name(request.code)} to {addr}: send buffer still full after the call's timeout; "
                    "request not sent"
                ) from None
        return conn

    async def invoke_sync(
        self, addr: str, request: RemotingCommand, timeout_s: float = 3.0
    ) -> RemotingCommand:
        """Send and wait for the response (any response code; use ``check_success`` to raise on errors).

        Raises RemotingConnectError (not sent), RemotingTimeoutError or
        RemotingConnectionClosedError (outcome unknown), RemotingFrameError.
        """
        deadline = time.monotonic() + timeout_s
        conn = await self._writable_connection(addr, deadline, request)
        future = conn.invoke(request, deadline - time.monotonic(), call_timeout_s=timeout_s)
        assert future is not None
        return await future

    async def invoke_async(
        self,
        addr: str,
        request: RemotingCommand,
        timeout_s: float,
        callback: ResponseCallback,
    ) -> None:
        """Send and return once written; ``callback(response, error)`` runs on the loop when it is answered.

        Connect errors raise here (nothing was sent); every later outcome goes to the callback.
        """
        deadline = time.monotonic() + timeout_s
        conn = await self._writable_connection(addr, deadline, request)
        conn.invoke(request, deadline - time.monotonic(), callback, call_timeout_s=timeout_s)

    async def invoke_oneway(self, addr: str, request: RemotingCommand, timeout_s: float = 3.0) -> None:
        """Send without expecting a response (the server sends none)."""
        deadline = time.monotonic() + timeout_s
        conn = await self._writable_connection(addr, deadline, request)
        conn.invoke_oneway(request)

    async def __aenter__(self) -> RemotingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["RemotingClient", "RemotingError"]
