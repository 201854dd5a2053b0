"""RemotingServer: listens where its config says and serves requests through processors.

Mirrors RocketMQ's NettyRemotingServer: ``register_processor(code, processor, pool)``, a
default processor, and connection listeners (the nameserver drops a broker the moment its
connection closes). A misbehaving peer only ever loses its own connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from remoting.config import RemotingConfig
from remoting.connection import RemotingConnection, RemotingStats
from remoting.dispatcher import Processor, ProcessorPool, RequestDispatcher

log = logging.getLogger("remoting.server")

ConnectionListener = Callable[[RemotingConnection], None]


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
        self._connections: set[RemotingConnection] = set()
        self._open_listeners: list[ConnectionListener] = []
        self._close_listeners: list[ConnectionListener] = []
        self._server: asyncio.base_events.Server | None = None

    # --- configuration ------------------------------------------------------------------
    def register_processor(self, code: int, processor: Processor, pool: ProcessorPool | None = None) -> None:
        """Serve request ``code`` with ``processor`` (see remoting.dispatcher for what it may return)."""
        self.dispatcher.register(code, processor, pool)

    def register_default_processor(self, processor: Processor, pool: ProcessorPool | None = None) -> None:
        self.dispatcher.register_default(processor, pool)

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
        self._server = await loop.create_server(
            self._make_connection, self.host, self.port, reuse_address=True, backlog=1024
        )
        sockets = self._server.sockets or ()
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("listening", extra={"server": self.name, "host": self.host, "port": self.port})

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
        return RemotingConnection(
            self.config,
            self.dispatcher,
            self.stats,
            side="server",
            on_open=self._opened,
            on_lost=self._lost,
        )

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
