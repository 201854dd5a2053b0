"""Optional TLS on remoting listeners (nameserver, broker) and on the connections clients dial.

Configured the way RocketMQ users know it: a listener's ``tls_server_mode`` is ``disabled``
(plain TCP, the default), ``permissive`` (TLS and plaintext clients both served, so a fleet
can move to TLS one client at a time) or ``enforcing`` (plaintext refused); a dialer turns
TLS on with ``tls_enable``. Certificates, key and CA come from files named in config; the
context builders are common.tls (the ledger's too), so both layers check certificates alike.

Both TLS modes need to see a connection's first byte before choosing how to read it: a TLS
ClientHello starts with the handshake record type 0x16, while a RocketMQ frame starts with a
big-endian length whose first byte is 0 for any frame under 16 MiB. ``SniffingListener``
accepts sockets itself and peeks at that byte (MSG_PEEK, so nothing is consumed) before
handing the socket to asyncio, with or without TLS. The wait for that byte is bounded by the
listener's handshake timeout, so a connection that never speaks cannot hold a socket.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Protocol

from common.settings import ConfigError
from common.tls import client_context, server_context

log = logging.getLogger("remoting.tls")

TLS_DISABLED = "disabled"
TLS_PERMISSIVE = "permissive"
TLS_ENFORCING = "enforcing"
TLS_MODES = (TLS_DISABLED, TLS_PERMISSIVE, TLS_ENFORCING)
_TLS_HANDSHAKE_RECORD = 0x16


def server_ssl(
    mode: str, cert_file: str, key_file: str, ca_file: str, require_client_cert: bool
) -> ssl.SSLContext | None:
    """The listener's TLS context for ``tls_server_mode`` (None when disabled); ConfigError names the key."""
    if mode not in TLS_MODES:
        raise ConfigError(f"key 'tls_server_mode' must be one of {', '.join(TLS_MODES)}, got {mode!r}")
    if mode == TLS_DISABLED:
        return None
    if not (cert_file and key_file):
        raise ConfigError(
            f"key 'tls_server_mode' is {mode!r} but 'tls_cert_file' and 'tls_key_file' are not both set"
        )
    if require_client_cert and not ca_file:
        raise ConfigError("key 'tls_require_client_cert' needs 'tls_ca_file' to check client certificates")
    return server_context(cert_file, key_file, ca_file, require_client_cert)


def client_ssl(enable: bool, ca_file: str, cert_file: str = "", key_file: str = "") -> ssl.SSLContext | None:
    """A dialer's TLS context (None when ``tls_enable`` is off).

    The server's certificate is checked against ``ca_file`` (the system's trust store when
    empty) and must name the host or IP address dialled; ``cert_file``/``key_file`` are
    presented when a listener requires client certificates.
    """
    if not enable:
        return None
    if bool(cert_file) != bool(key_file):
        raise ConfigError("keys 'tls_cert_file' and 'tls_key_file' go together (or neither)")
    if ca_file:
        return client_context(ca_file, cert_file, key_file)
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        try:
            ctx.load_cert_chain(cert_file, key_file)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"key 'tls_cert_file'/'tls_key_file': cannot load {cert_file} with {key_file}: {exc}"
            ) from None
    return ctx


class Listener(Protocol):
    """What the sniffing listener needs from its RemotingServer."""

    name: str

    def admit(self, peer: object) -> bool:
        """False when this connection must be refused (max_connections); the server counts and logs it."""
        ...

    def refuse(self, counter: str, message: str, peer: object) -> None:
        """Add one to LimitStats ``counter`` and log ``message`` (rate-limited) for a closed connection."""
        ...


class SniffingListener:
    """Accepts sockets, tells TLS from plaintext by the first byte, and serves each as its mode allows."""

    def __init__(
        self,
        owner: Listener,
        mode: str,
        context: ssl.SSLContext,
        make_protocol: Callable[[], asyncio.Protocol],
        handshake_timeout_s: float,
    ) -> None:
        if mode not in (TLS_PERMISSIVE, TLS_ENFORCING):
            raise ValueError(f"a sniffing listener serves permissive or enforcing mode, not {mode!r}")
        self.owner = owner
        self.mode = mode
        self.context = context
        self.make_protocol = make_protocol
        self.handshake_timeout_s = handshake_timeout_s
        self.pending: set[asyncio.Task[None]] = set()
        """Accepted connections still being sniffed or in their TLS handshake (count against max_connections)."""
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None

    async def listen(self, host: str, port: int, backlog: int = 1024) -> int:
        """Bind and start accepting; returns the bound port."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _name, addr = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._accepting = loop.create_task(self._accept_loop(sock))
        return int(sock.getsockname()[1])

    async def close(self) -> None:
        """Stop accepting and drop connections not yet handed to a protocol."""
        if self._accepting is not None:
            self._accepting.cancel()
            try:
                await self._accepting
            except asyncio.CancelledError:
                pass
            self._accepting = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for task in list(self.pending):
            task.cancel()
        if self.pending:
            await asyncio.wait(list(self.pending), timeout=1.0)

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:  # EMFILE and friends: back off rather than spin
                log.warning("accept failed: %s", exc, extra={"server": self.owner.name})
                await asyncio.sleep(0.1)
                continue
            if not self.owner.admit(peer):
                conn.close()
                continue
            conn.setblocking(False)
            task = loop.create_task(self._serve(conn, peer))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    async def _serve(self, conn: socket.socket, peer: object) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.handshake_timeout_s
        handed_over = False
        try:
            first = await self._first_byte(loop, conn)
            if first is None:
                self.owner.refuse(
                    "handshake_timeouts",
                    "closing connection: no TLS handshake or frame within handshake_timeout_s",
                    peer,
                )
                return
            if not first:
                return  # closed before saying anything
            if first[0] == _TLS_HANDSHAKE_RECORD:
                handed_over = True  # asyncio owns (and on failure closes) the socket from here
                try:
                    await loop.connect_accepted_socket(
                        self.make_protocol,
                        conn,
                        ssl=self.context,
                        ssl_handshake_timeout=max(0.1, deadline - loop.time()),
                    )
                except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                    self.owner.refuse("tls_failed", f"closing connection: TLS handshake failed: {exc}", peer)
                return
            if self.mode == TLS_ENFORCING:
                self.owner.refuse(
                    "plaintext_refused",
                    "refused plaintext connection: tls_server_mode is enforcing (the client must enable TLS)",
                    peer,
                )
                return
            handed_over = True
            await loop.connect_accepted_socket(self.make_protocol, conn)
        except OSError as exc:
            log.info("connection lost before it was served: %s", exc, extra={"server": self.owner.name})
        finally:
            if not handed_over:
                conn.close()

    async def _first_byte(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes | None:
        """The connection's first byte, left unread in the socket; b"" if it closed, None on timeout."""
        ready = loop.create_future()

        def readable() -> None:
            if not ready.done():
                ready.set_result(None)

        fd = conn.fileno()
        loop.add_reader(fd, readable)
        try:
            await asyncio.wait_for(ready, self.handshake_timeout_s)
        except TimeoutError:
            return None
        finally:
            loop.remove_reader(fd)
        try:
            return conn.recv(1, socket.MSG_PEEK)
        except BlockingIOError:  # pragma: no cover - readable yet nothing to read: treat as closed
            return b""
