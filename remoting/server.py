"""RemotingServer: listens where its config says and serves requests through processors.

Mirrors RocketMQ's NettyRemotingServer: ``register_processor(code, processor)``, a
default processor, and connection listeners (the nameserver drops a broker the moment its
connection closes). A misbehaving peer only ever loses its own connection.

Every listener is bounded (each limit a RemotingConfig setting): at most ``max_connections``
open connections (more are closed as soon as they are accepted), a connection must deliver a
complete frame within ``handshake_timeout_s`` and then at least one every ``idle_timeout_s``,
a frame once begun must be complete within ``frame_timeout_s`` (both deadlines extended by
what the bytes received are worth at ``frame_min_bytes_per_s``, so a large frame on a slow but
honest link is not cut, while a trickle is), and unfinished frames held over all connections
never exceed ``max_buffered_frame_bytes`` (the connection that would pass it is closed). A
connection's requests in flight and its unread answers are bounded too (remoting.connection:
its reading pauses, and past ``max_output_bytes`` it is closed). An optional request gate (remoting.acl's
AccessValidator) checks each request's signature and permissions before its processor runs.
With ``tls_mode`` permissive or enforcing, remoting.tls's SniffingListener accepts the
connections instead of asyncio's server, to tell TLS from plaintext clients by their first byte.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from remoting.config import RemotingConfig
from remoting.connection import RemotingConnection, RemotingStats
from remoting.dispatcher import Processor, RequestDispatcher
from remoting.protocol import FLAG_ONEWAY, RemotingCommand
from remoting.tls import TLS_DISABLED, SniffingListener

log = logging.getLogger("remoting.server")

ConnectionListener = Callable[[RemotingConnection], None]
_LOG_FIRST = 10  # refusals logged per server before only every 1000th is: a flood must not flood the log


class RequestGate(Protocol):
    """Checks a request before its processor runs (remoting.acl.AccessValidator implements it)."""

    def check(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        """None to let the request through, else the response that refuses it."""
        ...


class LimitStats:
    """What the listener's bounds refused; read by tests and metrics."""

    __slots__ = (
        "refused_connections",
        "handshake_timeouts",
        "idle_closed",
        "buffer_closed",
        "frame_timeouts",
        "output_closed",
        "gated",
        "plaintext_refused",
        "tls_failed",
    )

    def __init__(self) -> None:
        self.refused_connections = 0
        self.handshake_timeouts = 0
        self.idle_closed = 0
        self.buffer_closed = 0
        self.frame_timeouts = 0  # a frame begun but not complete in time (a trickle)
        self.output_closed = 0  # answers queued past max_output_bytes (a peer that does not read)
        self.gated = 0
        self.plaintext_refused = 0  # plaintext clients of a tls_mode=enforcing listener
        self.tls_failed = 0  # TLS handshakes that failed (bad or missing certificate, wrong CA)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}

    def total(self) -> int:
        return sum(getattr(self, name) for name in self.__slots__)


def _warn_if_over_fd_limit(name: str, max_connections: int) -> None:
    """Say so at start-up when max_connections cannot be reached: the process would run out of
    descriptors first and then refuse everyone, the failure the limit exists to prevent."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not on POSIX
        return
    if soft != resource.RLIM_INFINITY and max_connections > soft - 64:
        log.warning(
            "max_connections exceeds what the open-file limit allows; lower it or raise ulimit -n",
            extra={"server": name, "max_connections": max_connections, "nofile_soft_limit": soft},
        )


class _GatedDispatcher:
    """Runs the gate, then the real dispatcher; a refused request is answered at once."""

    __slots__ = ("inner", "gate", "limits")

    def __init__(self, inner: RequestDispatcher, gate: RequestGate, limits: LimitStats) -> None:
        self.inner = inner
        self.gate = gate
        self.limits = limits

    def dispatch(self, conn: RemotingConnection, request: RemotingCommand) -> None:
        refusal = self.gate.check(conn, request)
        if refusal is None:
            self.inner.dispatch(conn, request)
            return
        self.limits.gated += 1
        if not request.flags & FLAG_ONEWAY and not conn.closing:
            conn.send(refusal)


class _ServerConnection(RemotingConnection):
    """A server-side connection that keeps its listener's bounds."""

    __slots__ = (
        "_server",
        "refused",
        "opened_at",
        "last_frame_at",
        "framed",
        "_held",
        "frame_started_at",
        "frame_bytes",
    )

    def __init__(self, server: RemotingServer, dispatcher: RequestDispatcher | _GatedDispatcher) -> None:
        super().__init__(
            server.config,
            dispatcher,  # type: ignore[arg-type]  # both have dispatch(conn, request)
            server.stats,
            side="server",
            on_open=server._opened,
            on_lost=server._lost,
        )
        self._server = server
        self.refused = False
        self.opened_at = self.last_frame_at = self._loop.time()
        self.framed = False  # delivered a complete frame
        self._held = 0  # bytes of an unfinished frame this connection counts in the server's total
        self.frame_started_at = 0.0  # when the frame now arriving began (0: none is)
        self.frame_bytes = 0  # bytes of it received so far (each buys time at frame_min_bytes_per_s)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._server
        if len(server._connections) >= server.config.max_connections:
            self.refused = True
            server.refuse(
                "refused_connections",
                "connection refused: max_connections reached",
                transport.get_extra_info("peername"),
            )
            transport.abort()
            return
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        stats = self.stats
        before = stats.frames_in
        super().data_received(data)
        decoder = self._decoder
        held = decoder.buffered
        if stats.frames_in != before:
            now = self.last_frame_at = self._loop.time()
            self.framed = True
            if held or decoder.skipping:  # the next frame began in this read
                self.frame_started_at, self.frame_bytes = now, held
            else:
                self.frame_started_at = 0.0
        elif self.frame_started_at:
            self.frame_bytes += len(data)
        elif held or decoder.skipping:
            self.frame_started_at, self.frame_bytes = self._loop.time(), len(data)
        if held or self._held:
            server = self._server
            server.buffered_bytes += held - self._held
            self._held = held
            if held and server.buffered_bytes > server.config.max_buffered_frame_bytes:
                server.limits.buffer_closed += 1
                server._log_refusal(
                    "closing connection: unfinished frames over max_buffered_frame_bytes",
                    self.remote_addr,
                    server.limits.buffer_closed,
                )
                self.abort("unfinished frames over the server's max_buffered_frame_bytes")

    def _output_overflow(self, queued: int) -> None:
        server = self._server
        server.limits.output_closed += 1
        server._log_refusal(
            f"closing connection: {queued} bytes of answers queued, over max_output_bytes="
            f"{self._output_limit}; the peer does not read them",
            self.remote_addr,
            server.limits.output_closed,
        )
        self.abort(f"{queued} bytes of output queued, over max_output_bytes={self._output_limit}")

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.buffered_bytes -= self._held
        self._held = 0
        if not self.refused:
            super().connection_lost(exc)


class RemotingServer:
    """Asyncio TCP server for the frame protocol."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        config: RemotingConfig | None = None,
        *,
        name: str = "remoting-server",
    ) -> None:
        self.host = host
        self.port = port
        self.config = config or RemotingConfig()
        self.name = name
        self.dispatcher = RequestDispatcher(name)
        self.stats = RemotingStats()
        self.limits = LimitStats()
        self.buffered_bytes = 0  # unfinished frames held over all connections
        self._gate: _GatedDispatcher | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._connections: set[RemotingConnection] = set()
        self._open_listeners: list[ConnectionListener] = []
        self._close_listeners: list[ConnectionListener] = []
        self._server: asyncio.base_events.Server | None = None
        self._sniffer: SniffingListener | None = None

    # --- configuration ------------------------------------------------------------------
    def register_processor(self, code: int, processor: Processor) -> None:
        """Serve request ``code`` with ``processor`` (see remoting.dispatcher for what it may return)."""
        self.dispatcher.register(code, processor)

    def register_default_processor(self, processor: Processor) -> None:
        self.dispatcher.register_default(processor)

    def set_request_gate(self, gate: RequestGate | None) -> None:
        """Check every request with ``gate`` before its processor (None: no check, the default)."""
        self._gate = None if gate is None else _GatedDispatcher(self.dispatcher, gate, self.limits)

    def add_connection_listener(
        self,
        on_closed: ConnectionListener | None = None,
        on_connected: ConnectionListener | None = None,
    ) -> None:
        """Be told when a peer connects or its connection closes (for whatever reason)."""
        if on_closed is not None:
            self._close_listeners.append(on_closed)
        if on_connected is not None:
            self._open_listeners.append(on_connected)

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind and listen; ``port`` becomes the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        if cfg.tls_mode == TLS_DISABLED:
            self._server = await loop.create_server(
                self._make_connection, self.host, self.port, reuse_address=True, backlog=1024
            )
            sockets = self._server.sockets or ()
            if sockets:
                self.port = sockets[0].getsockname()[1]
        else:
            assert cfg.server_ssl is not None  # RemotingConfig refuses a TLS mode without a context
            self._sniffer = SniffingListener(
                self, cfg.tls_mode, cfg.server_ssl, self._make_connection, cfg.handshake_timeout_s
            )
            self.port = await self._sniffer.listen(self.host, self.port)
        self._sweeper = loop.create_task(self._sweep())
        _warn_if_over_fd_limit(self.name, cfg.max_connections)
        log.info(
            "listening",
            extra={"server": self.name, "host": self.host, "port": self.port, "tls_mode": cfg.tls_mode},
        )

    @property
    def address(self) -> str:
        """``host:port`` as bound."""
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> frozenset[RemotingConnection]:
        return frozenset(self._connections)

    @property
    def connection_count(self) -> int:
        """Open connections; safe to read from another thread (the metrics endpoint does)."""
        return len(self._connections)

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting, cancel requests in progress, close every connection (flushing replies)."""
        if self._server is not None:
            self._server.close()
        if self._sniffer is not None:
            await self._sniffer.close()
            self._sniffer = None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        await self.dispatcher.shutdown()
        conns = list(self._connections)
        for conn in conns:
            if conn.writable:
                conn.close("server shutting down")
            else:  # the peer is not reading: its unsent answers would hold shutdown for the whole grace period
                conn.abort("server shutting down with unsent output")
        if conns:
            done, pending = await asyncio.wait(
                [asyncio.ensure_future(c.wait_closed()) for c in conns], timeout=grace_s
            )
            for conn in conns:
                if not conn.closed:
                    conn.abort("server shutdown grace period over")
            for fut in pending:
                fut.cancel()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        log.info("stopped", extra={"server": self.name, "port": self.port})

    # --- connections ------------------------------------------------------------------------
    def _make_connection(self) -> RemotingConnection:
        return _ServerConnection(self, self._gate or self.dispatcher)

    async def _sweep(self) -> None:
        """Close connections past the handshake, frame or idle timeout; runs while the server listens."""
        cfg = self.config
        idle = cfg.idle_timeout_s
        period = max(
            0.05, min(1.0, cfg.handshake_timeout_s / 4, cfg.frame_timeout_s / 4, idle / 4 if idle else 1.0)
        )
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            try:
                self._sweep_once(loop.time())
            except Exception:  # never let one bad pass stop the timeouts for good
                log.exception("connection sweep failed", extra={"server": self.name})

    def _sweep_once(self, now: float) -> None:
        cfg = self.config
        idle = cfg.idle_timeout_s
        per_byte = 1.0 / cfg.frame_min_bytes_per_s
        for conn in list(self._connections):
            if not isinstance(conn, _ServerConnection) or conn.closing:
                continue
            if conn.reading_paused:
                # we stopped reading, not the peer: its frame's clock waits with us (the idle
                # timeout still runs, so a peer that never takes its answers is closed by it)
                if conn.frame_started_at:
                    conn.frame_started_at = now
                    conn.frame_bytes = 0
            elif not conn.framed:
                if now - conn.opened_at > cfg.handshake_timeout_s + conn.frame_bytes * per_byte:
                    self.limits.handshake_timeouts += 1
                    self._log_refusal(
                        "closing connection: no complete frame within handshake_timeout_s",
                        conn.remote_addr,
                        self.limits.handshake_timeouts,
                    )
                    conn.abort("no complete frame within handshake_timeout_s")
                    continue
            elif (
                conn.frame_started_at
                and now - conn.frame_started_at > cfg.frame_timeout_s + conn.frame_bytes * per_byte
            ):
                self.limits.frame_timeouts += 1
                self._log_refusal(
                    f"closing connection: a frame begun {now - conn.frame_started_at:.1f}s ago is still "
                    f"incomplete ({conn.frame_bytes} bytes in), past frame_timeout_s={cfg.frame_timeout_s:g} "
                    f"at frame_min_bytes_per_s={cfg.frame_min_bytes_per_s}",
                    conn.remote_addr,
                    self.limits.frame_timeouts,
                )
                conn.abort("frame incomplete past frame_timeout_s")
                continue
            if idle and now - conn.last_frame_at > idle:
                self.limits.idle_closed += 1
                self._log_refusal(
                    "closing idle connection", conn.remote_addr, self.limits.idle_closed, logging.INFO
                )
                if conn.writable:
                    conn.close(f"idle for more than idle_timeout_s={idle:g}")
                else:  # its peer takes no output either: closing would wait for it to drain, for ever
                    conn.abort(f"idle for more than idle_timeout_s={idle:g} with unsent output")

    def _log_refusal(self, message: str, peer: object, count: int, level: int = logging.WARNING) -> None:
        if count <= _LOG_FIRST or count % 1000 == 0:
            log.log(level, message, extra={"server": self.name, "peer": str(peer), "so_far": count})

    def admit(self, peer: object) -> bool:
        """Whether one more accepted connection fits max_connections (ones still in their TLS
        handshake count too); refuses and logs it if not."""
        pending = len(self._sniffer.pending) if self._sniffer is not None else 0
        if len(self._connections) + pending < self.config.max_connections:
            return True
        self.refuse("refused_connections", "connection refused: max_connections reached", peer)
        return False

    def refuse(self, counter: str, message: str, peer: object) -> None:
        """Count a closed or refused connection in LimitStats ``counter`` and log it (rate-limited)."""
        count = getattr(self.limits, counter) + 1
        setattr(self.limits, counter, count)
        self._log_refusal(message, peer, count)

    def _opened(self, conn: RemotingConnection) -> None:
        self._connections.add(conn)
        log.debug("connection opened", extra={"server": self.name, "peer": conn.remote_addr})
        for listener in self._open_listeners:
            try:
                listener(conn)
            except Exception:
                log.exception("connection listener raised", extra={"peer": conn.remote_addr})

    def _lost(self, conn: RemotingConnection) -> None:
        self._connections.discard(conn)
        log.debug(
            "connection closed",
            extra={"server": self.name, "peer": conn.remote_addr, "reason": conn.close_reason},
        )
        for listener in self._close_listeners:
            try:
                listener(conn)
            except Exception:
                log.exception("connection listener raised", extra={"peer": conn.remote_addr})
