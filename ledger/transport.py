"""Length-prefixed binary frames over asyncio TCP (optionally TLS), for peers and clients of a ledger node.

Every frame is ``u32 length`` + body, bounded by a maximum size that is checked before
any buffering, so a corrupt or hostile length cannot make a node allocate gigabytes. The
first frame on a connection is a hello saying who is calling: a peer or a client. A
malformed frame closes only that connection, with a logged reason.

Peers prove membership with the cluster secret (see ``auth``): the hello starts a
challenge-response in both directions, and every later frame carries a MAC. A node
without a secret accepts the old unauthenticated hello ``P<node id>`` and warns at start.

Which peers may connect follows the group's membership (``Listener.set_members``): a node
accepts the members of its configuration and whoever it must still talk to (the leader it
follows, removed peers a leader still informs), refuses the peers its configuration history
removed, and closes their connections. With a cluster secret it also accepts an id it has
never heard of once that peer proves the secret: a member added by a configuration this
node does not hold yet (it lags) may need its vote. Without a secret only known members
are accepted. A node outside its own configuration (joining, or removed) accepts any peer,
so a leader it has not heard of yet can reach it.

Peers talk over one outgoing connection per direction: a node writes its messages to a
peer on the connection it opened, and reads the peer's messages on the connection the
peer opened. Outgoing connections reconnect with exponential backoff; messages for a
peer that is down are dropped, which Raft tolerates by design.

Every resource an accepted connection can hold is bounded by a named setting (see
``config``): connections, unfinished handshakes, handshake and idle time, the size of a
frame before the hello is done, all partly received frames together, and the replies
queued for a client that does not read them.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any

from common.settings import parse_host_port

from .auth import (
    FLAG_FRAME_MAC,
    HELLO_AUTH,
    HELLO_CLIENT_AUTH,
    TAG_BYTES,
    AuthError,
    FrameOpener,
    Handshake,
    PeerAuth,
)
from .config import NodeConfig
from .messages import Message, MessageError, decode_message, encode_message

log = logging.getLogger("ledger.transport")

_LEN = struct.Struct("<I")
HELLO_PEER = b"P"
HELLO_CLIENT = b"C"
_DIAL_FRAME_LIMIT = 1024  # a dialer only ever receives the authentication challenge
_FD_RESERVE = 256  # descriptors kept for segment files, outgoing peer connections, metrics, logs


class FrameError(ValueError):
    """The byte stream does not hold a valid frame."""


class ListenError(OSError):
    """The node cannot listen on its address (in use, not local, not permitted)."""


class FrameProtocol(asyncio.Protocol):
    """Splits a TCP stream into frames and hands each to ``on_frame``.

    Parsing happens in ``data_received`` without creating a task per frame; frames are
    delivered as ``bytes`` slices of the receive buffer. ``limit`` is the largest frame
    accepted right now (subclasses lower it until a connection has said who it is).
    """

    def __init__(self, max_frame: int, name: str = "") -> None:
        self.max_frame = max_frame
        self.limit = max_frame
        self.name = name
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.peername = ""
        self.sealer: Any = None  # an ``auth.FrameSealer`` once an outgoing peer connection is authenticated
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peername = f"{peer[0]}:{peer[1]}" if peer else "?"

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        off = 0
        n = len(buf)
        try:
            while n - off >= 4:
                (size,) = _LEN.unpack_from(buf, off)
                if size > self.limit:
                    raise FrameError(f"frame of {size} bytes exceeds the limit of {self.limit}")
                if n - off - 4 < size:
                    break
                body = bytes(buf[off + 4 : off + 4 + size])
                off += 4 + size
                self.on_frame(body)
                if self.transport is None or self.transport.is_closing():
                    return
        except (FrameError, MessageError, ValueError) as exc:
            self.abort(str(exc))
            return
        if off:
            del buf[:off]

    def on_frame(self, body: bytes) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def send(self, body: bytes) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            sealer = self.sealer
            if sealer is None:
                t.writelines((_LEN.pack(len(body)), body))
            else:
                t.writelines((_LEN.pack(len(body) + TAG_BYTES), body, sealer.tag(body)))

    def abort(self, reason: str, hard: bool = False) -> None:
        """Close the connection with a logged reason; ``hard`` drops unsent replies too."""
        log.warning(
            "closing connection from %s (%s): %s",
            self.peername,
            self.name,
            reason,
            extra={"peer": self.peername, "conn": self.name},
        )
        self.close(hard)

    def close(self, hard: bool = False) -> None:
        if self.transport is not None:
            if hard:
                self.transport.abort()
            else:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.closed.done():
            self.closed.set_result(None)

    def write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport else 0


class _OutboundProtocol(FrameProtocol):
    """An outgoing peer connection: says hello, answers the challenge, then only sends."""

    def __init__(self, max_frame: int, self_id: str, peer_id: str, auth: PeerAuth | None, flags: int) -> None:
        super().__init__(max_frame, f"to {peer_id}")
        self.limit = _DIAL_FRAME_LIMIT
        self.self_id = self_id
        self.peer_id = peer_id
        self.auth = auth
        self.flags = flags
        self._nonce: bytes | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.failure = ""

    def start(self) -> None:
        if self.auth is None:
            self.send(HELLO_PEER + self.self_id.encode())
            self.ready.set_result(None)
        else:
            hello, self._nonce = self.auth.hello(self.self_id, self.peer_id, self.flags)
            self.send(hello)

    def on_frame(self, body: bytes) -> None:
        if self.auth is None or self._nonce is None or self.ready.done():
            raise FrameError("unexpected frame on an outgoing peer connection")
        try:
            proof, sealer = self.auth.answer_challenge(
                self.self_id, self.peer_id, self._nonce, body, self.flags
            )
        except AuthError as exc:
            self.failure = f"{self.peer_id} at {self.peername} failed authentication: {exc}"
            self.close()
            return
        self.send(proof)
        self.sealer = sealer
        self.ready.set_result(None)

    def abort(self, reason: str, hard: bool = False) -> None:
        self.failure = reason
        self.close(hard)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.ready.done():
            self.ready.set_exception(
                ConnectionError(self.failure or "the peer closed the connection during the handshake")
            )
            self.ready.exception()  # retrieved here; the dialer reads ``failure``


#: Longest pause between reconnection attempts to a peer that is down. Short, because a
#: restarting peer is often the vote a failover waits for; a refused loopback or LAN
#: connect costs next to nothing.
RECONNECT_BACKOFF_MAX_S = 0.1


class PeerOutbox:
    """The outgoing connection to one peer: connects lazily, authenticates, reconnects with backoff."""

    def __init__(
        self,
        self_id: str,
        peer_id: str,
        address: tuple[str, int],
        max_frame: int,
        max_buffer: int = 64 << 20,
        *,
        auth: PeerAuth | None = None,
        ssl_context: ssl.SSLContext | None = None,
        handshake_timeout: float = 5.0,
        frame_mac: bool = True,
        on_lost: Callable[[str], None] | None = None,
        on_connected: Callable[[str], None] | None = None,
    ) -> None:
        self.self_id = self_id
        self.on_connected = on_connected  # told the peer's id after each successful handshake
        self.on_lost = on_lost  # told the peer's id when the OS says the peer is gone (reset, refused)
        self.peer_id = peer_id
        self.address = address
        self.max_frame = max_frame
        self.max_buffer = max_buffer
        self.auth = auth
        self.ssl_context = ssl_context
        self.handshake_timeout = handshake_timeout
        self.flags = FLAG_FRAME_MAC if frame_mac else 0
        self.proto: FrameProtocol | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._backoff = 0.02
        self._closed = False
        self._failing = ""
        self.dropped = 0

    @classmethod
    def for_member(
        cls,
        cfg: NodeConfig,
        peer_id: str,
        address: tuple[str, int],
        on_lost: Callable[[str], None] | None = None,
        on_connected: Callable[[str], None] | None = None,
    ) -> PeerOutbox:
        """The outbox to ``peer_id`` with this node's secret, TLS and handshake timeout."""
        return cls(
            cfg.id,
            peer_id,
            address,
            cfg.max_frame_bytes,
            auth=PeerAuth(cfg.secret, cfg.accepted_secrets) if cfg.secret else None,
            ssl_context=cfg.client_ssl,
            handshake_timeout=cfg.handshake_timeout_s,
            frame_mac=cfg.frame_mac,
            on_lost=on_lost,
            on_connected=on_connected,
        )

    def send(self, m: Message) -> None:
        proto = self.proto
        if proto is None or proto.transport is None:
            self.dropped += 1
            self._ensure_connecting()
            return
        if proto.write_buffer_size() > self.max_buffer:
            self.dropped += 1  # the peer is not keeping up; Raft will resend what matters
            return
        body = encode_message(m)
        if len(body) + TAG_BYTES > self.max_frame:
            log.error("dropping oversize message to %s (%d bytes)", self.peer_id, len(body))
            return
        proto.send(body)

    def _ensure_connecting(self) -> None:
        if self._closed or (self._connecting is not None and not self._connecting.done()):
            return
        self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _handshake(self) -> _OutboundProtocol:
        loop = asyncio.get_running_loop()
        host, port = self.address
        _, proto = await asyncio.wait_for(
            loop.create_connection(
                lambda: _OutboundProtocol(self.max_frame, self.self_id, self.peer_id, self.auth, self.flags),
                host,
                port,
                ssl=self.ssl_context,
                server_hostname=host if self.ssl_context is not None else None,
                ssl_handshake_timeout=self.handshake_timeout if self.ssl_context is not None else None,
            ),
            timeout=self.handshake_timeout,
        )
        try:
            proto.start()
            await asyncio.wait_for(asyncio.shield(proto.ready), self.handshake_timeout)
        except BaseException:
            proto.close(hard=True)
            raise
        return proto

    def _note_failure(self, reason: str, refused: bool) -> None:
        """Log a failing connection once per episode, not on every reconnection attempt.

        A peer that fails our authentication (or TLS) is a warning; a peer that is simply
        down (connection refused or reset) is normal while a group starts: info only.
        """
        if reason != self._failing:
            level = logging.WARNING if refused else logging.INFO
            log.log(
                level, "cannot connect to peer %s: %s", self.peer_id, reason, extra={"peer_id": self.peer_id}
            )
            self._failing = reason

    async def _connect(self) -> None:
        while not self._closed:
            try:
                proto = await self._handshake()
            except (TimeoutError, OSError) as exc:
                reason = str(exc) or type(exc).__name__
                refused = (
                    isinstance(exc, ssl.SSLError)
                    or reason.startswith(f"{self.peer_id} at ")
                    or reason.endswith("during the handshake")
                )
                self._note_failure(reason, refused)
                if isinstance(exc, ConnectionRefusedError | ConnectionResetError):
                    self._lost()
                await asyncio.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, RECONNECT_BACKOFF_MAX_S)
                continue
            if self._failing:
                log.info("connected to peer %s", self.peer_id, extra={"peer_id": self.peer_id})
                self._failing = ""
            self.proto = proto
            self._backoff = 0.02
            self._tell(self.on_connected)
            await proto.closed
            self.proto = None
            if proto.failure:
                self._note_failure(proto.failure, True)
            if self._closed:
                return
            self._lost()  # the peer closed or reset an established connection
            await asyncio.sleep(self._backoff)

    def _lost(self) -> None:
        self._tell(self.on_lost)

    def _tell(self, listener: Callable[[str], None] | None) -> None:
        if listener is not None and not self._closed:
            try:
                listener(self.peer_id)
            except Exception:
                log.exception("peer listener failed", extra={"peer_id": self.peer_id})

    def close(self) -> None:
        self._closed = True
        if self.proto is not None and self.proto.transport is not None:
            self.proto.transport.close()
        if self._connecting is not None:
            self._connecting.cancel()


class _RefusalLog:
    """At most ``per_second`` refusal lines a second; the rest are counted and summarised."""

    def __init__(self, per_second: int = 20) -> None:
        self.per_second = per_second
        self._window = 0.0
        self._count = 0
        self._suppressed = 0

    def __call__(self, msg: str, **extra: Any) -> None:
        now = time.monotonic()
        if now - self._window >= 1.0:
            if self._suppressed:
                log.warning(
                    "%d more connections refused in the last second (not logged one by one)", self._suppressed
                )
            self._window, self._count, self._suppressed = now, 0, 0
        self._count += 1
        if self._count <= self.per_second:
            log.warning(msg, extra=extra)
        else:
            self._suppressed += 1


class Listener:
    """What every connection accepted by one node shares: limits, counters, the secret, known peers."""

    def __init__(
        self,
        cfg: NodeConfig,
        on_peer_message: Callable[[Message], None],
        make_client_handler: Callable[[FrameProtocol], Callable[[bytes], None]],
    ) -> None:
        self.cfg = cfg
        self.self_id = cfg.id
        self.members = set(cfg.members) - {cfg.id}
        self.departed: frozenset[str] = frozenset()  # removed from the group (see set_members)
        self.open_to_all = False  # accept any peer (see set_members)
        # told the id of a removed member whose dial was refused (the node answers it "removed")
        self.on_departed: Callable[[str], None] | None = None
        self.auth = PeerAuth(cfg.secret) if cfg.secret else None
        self.flags = FLAG_FRAME_MAC if cfg.frame_mac else 0
        self.on_peer_message = on_peer_message
        self.make_client_handler = make_client_handler
        self.connections = 0
        self.handshaking = 0
        self.buffered = 0
        self.peers: dict[str, InboundProtocol] = {}
        self.max_connections = cfg.max_connections  # lowered at start if the open-file limit is smaller
        self.refused = _RefusalLog()
        self.server: asyncio.base_events.Server | None = None

    def accepts(self, peer: str) -> bool:
        """Whether ``peer`` (an id that will prove the secret, if one is set) may connect."""
        if peer == self.self_id:
            return False
        if peer in self.members or self.open_to_all:
            return True
        return self.auth is not None and peer not in self.departed

    def tell_departed(self, peer: str) -> None:
        """A removed member dialled us (its claim is not proven yet: the answer goes to the
        address the configuration had for it, through our own authenticated dial)."""
        if self.on_departed is not None:
            try:
                self.on_departed(peer)
            except Exception:  # noqa: BLE001 - a listener's fault must not break the accept path
                log.exception("on_departed failed for %s", peer)

    def set_members(
        self, peers: set[str], open_to_all: bool = False, departed: frozenset[str] = frozenset()
    ) -> None:
        """Accept ``peers`` from now on, refuse ``departed`` ones (removed from the group) unless
        listed, and close the connections of peers no longer accepted.

        ``open_to_all``: this node is not in its own configuration (it is joining, or was
        removed); any peer may connect.
        """
        self.members = set(peers) - {self.self_id}
        self.departed = departed
        self.open_to_all = open_to_all
        for peer, proto in list(self.peers.items()):
            if not self.accepts(peer):
                log.info("closing the connection of %s: no longer a member", peer, extra={"peer_id": peer})
                proto.close()

    def _fit_file_limit(self) -> None:
        """Make room for ``max_connections`` descriptors, or lower the limit and say so.

        With the limit above what the process may open, a flood would exhaust descriptors
        before the limit is reached and the node could no longer open its own segment files.
        """
        want = self.cfg.max_connections + _FD_RESERVE
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < want:
            new = want if hard == resource.RLIM_INFINITY else min(want, hard)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
                soft = new
            except (ValueError, OSError):
                pass
        if soft != resource.RLIM_INFINITY and soft < want:
            self.max_connections = max(1, soft - _FD_RESERVE)
            log.warning(
                "max_connections = %d does not fit the open-file limit %d; accepting at most %d connections",
                self.cfg.max_connections,
                soft,
                self.max_connections,
            )

    async def start(self) -> asyncio.base_events.Server:
        cfg = self.cfg
        self._fit_file_limit()
        host, port = parse_host_port("listen", cfg.listen)
        loop = asyncio.get_running_loop()
        try:
            self.server = await loop.create_server(
                lambda: InboundProtocol(self),
                host,
                port,
                reuse_address=True,
                ssl=cfg.server_ssl,
                ssl_handshake_timeout=cfg.handshake_timeout_s if cfg.server_ssl is not None else None,
            )
        except OSError as exc:
            raise ListenError(exc.errno, f"cannot listen on {cfg.listen}: {exc.strerror or exc}") from None
        if self.auth is None and self.members:
            log.warning(
                "peer authentication is OFF: no cluster_secret is set, so anyone who can reach %s can act "
                "as a member of this group; set cluster_secret or cluster_secret_file (env LEDGER_CLUSTER_SECRET)",
                cfg.listen,
            )
        return self.server


async def listen(
    cfg: NodeConfig,
    on_peer_message: Callable[[Message], None],
    make_client_handler: Callable[[FrameProtocol], Callable[[bytes], None]],
) -> asyncio.base_events.Server:
    """Serve peers and clients on ``cfg.listen`` with the node's secret, TLS and bounds.

    Raises ``ListenError`` (one line, no traceback needed) when the address cannot be bound.
    """
    return await Listener(cfg, on_peer_message, make_client_handler).start()


class InboundProtocol(FrameProtocol):
    """A connection accepted by a node: a peer's message stream or a client's requests."""

    def __init__(self, listener: Listener) -> None:
        cfg = listener.cfg
        super().__init__(cfg.max_frame_bytes, "inbound")
        self.listener = listener
        self.limit = cfg.max_handshake_frame_bytes
        self.peer_id: str | None = None
        self.handler: Callable[[bytes], None] | None = None
        self.opener: FrameOpener | None = None
        self._hs: Handshake | None = None
        self._claimed = ""
        self._client_hs: Handshake | None = None
        self._handshaking = False
        self._counted = False
        self.held = 0
        self.last_rx = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    # ---------------------------------------------------------------- lifecycle and bounds

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        lst, cfg = self.listener, self.listener.cfg
        lst.connections += 1
        lst.handshaking += 1
        self._counted = self._handshaking = True
        self.last_rx = self._loop.time()
        if lst.connections > lst.max_connections:
            self.refuse(f"connection limit reached (max_connections = {lst.max_connections})", hard=True)
        elif lst.handshaking > cfg.max_pending_handshakes:
            self.refuse(
                f"too many unfinished handshakes (max_pending_handshakes = {cfg.max_pending_handshakes})",
                hard=True,
            )
        else:
            self._timer = self._loop.call_later(cfg.handshake_timeout_s, self._on_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._hs is not None and self.opener is None:
            self.listener.refused(
                f"refused peer {self._claimed!r} from {self.peername}: it hung up instead of proving the "
                "cluster secret (our proof did not match its secret: a different cluster_secret?)",
                peer=self.peername,
                claimed_id=self._claimed,
                reason="hung up during authentication",
            )
            self._hs = None
        if self._client_hs is not None:
            self.listener.refused(
                f"refused client from {self.peername}: it hung up instead of proving the cluster secret "
                "(our proof did not match its secret: a different cluster_secret?)",
                peer=self.peername,
                reason="client hung up during authentication",
            )
            self._client_hs = None
        super().connection_lost(exc)
        lst = self.listener
        if self._counted:
            lst.connections -= 1
            self._counted = False
        if self._handshaking:
            lst.handshaking -= 1
            self._handshaking = False
        lst.buffered -= self.held
        self.held = 0
        self.buf = bytearray()
        if self.peer_id is not None and lst.peers.get(self.peer_id) is self:
            del lst.peers[self.peer_id]
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        if self.transport is None:
            return
        cfg = self.listener.cfg
        if self._handshaking:
            self.refuse(
                f"no complete hello within handshake_timeout_s = {cfg.handshake_timeout_s:g}", hard=True
            )
            return
        idle = self._loop.time() - self.last_rx
        if idle >= cfg.idle_timeout_s:
            self.abort(f"idle for {idle:.0f}s (idle_timeout_s = {cfg.idle_timeout_s:g})", hard=True)
        else:
            self._timer = self._loop.call_later(cfg.idle_timeout_s - idle, self._on_timer)

    def _hello_done(self) -> None:
        self._handshaking = False
        self.listener.handshaking -= 1
        self.limit = self.max_frame
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(self.listener.cfg.idle_timeout_s, self._on_timer)

    def data_received(self, data: bytes) -> None:
        self.last_rx = self._loop.time()
        super().data_received(data)
        held = len(self.buf)
        if held != self.held:
            lst = self.listener
            lst.buffered += held - self.held
            self.held = held
            if lst.buffered > lst.cfg.max_buffered_bytes and self.transport is not None:
                self.abort(
                    f"partly received frames of all connections exceed max_buffered_bytes = "
                    f"{lst.cfg.max_buffered_bytes}",
                    hard=True,
                )

    def send(self, body: bytes) -> None:
        if (
            self.handler is not None
            and self.write_buffer_size() > self.listener.cfg.max_client_write_buffer_bytes
        ):
            self.abort(
                "client does not read its replies (max_client_write_buffer_bytes = "
                f"{self.listener.cfg.max_client_write_buffer_bytes})",
                hard=True,
            )
            return
        super().send(body)

    def refuse(self, why: str, hard: bool = False) -> None:
        """Refuse this connection with one clear log line: who it claimed to be, from where, why."""
        who = f"peer {self._claimed!r}" if self._claimed else "connection"
        self.listener.refused(
            f"refused {who} from {self.peername}: {why}",
            peer=self.peername,
            claimed_id=self._claimed,
            reason=why,
        )
        self._hs = self._client_hs = None  # refused by us: not "hung up" when the connection goes
        self.close(hard)

    def abort(self, reason: str, hard: bool = False) -> None:
        if self._handshaking or (self._hs is not None and self.opener is None):
            self.refuse(reason, hard)
        else:
            super().abort(reason, hard)

    # ---------------------------------------------------------------- frames

    def on_frame(self, body: bytes) -> None:
        handler = self.handler
        if handler is not None:
            handler(body)
            return
        opener = self.opener
        if opener is not None:
            m = decode_message(opener.open(body))
            if m.src != self.peer_id:
                raise FrameError(f"message claims to be from {m.src!r} on {self.peer_id!r}'s connection")
            self.listener.on_peer_message(m)
            return
        if self.peer_id is not None:  # unauthenticated peer (no cluster secret configured)
            m = decode_message(body)
            if m.src != self.peer_id:
                raise FrameError(f"message claims to be from {m.src!r} on {self.peer_id!r}'s connection")
            self.listener.on_peer_message(m)
            return
        self._on_hello(body)

    def _on_hello(self, body: bytes) -> None:
        lst = self.listener
        auth = lst.auth
        if self._client_hs is not None:
            try:
                PeerAuth.check_proof(self._client_hs, body)
            except AuthError as exc:
                self.refuse(f"client authentication failed: {exc}")
                return
            self._client_hs = None
            self._accept_client()
            return
        if self._hs is not None:
            try:
                self.opener = auth.check_proof(self._hs, body)  # type: ignore[union-attr]
            except AuthError as exc:
                self.refuse(str(exc))
                return
            self._hs = None
            self._accept_peer(self._claimed)
            return
        kind = body[:1]
        if kind == HELLO_AUTH:
            if auth is None:
                self.refuse("it offered peer authentication but this node has no cluster_secret")
                return
            try:
                dialer, target, challenge, hs = auth.challenge(body)
            except AuthError as exc:
                self.refuse(str(exc))
                return
            self._claimed = dialer
            if target != lst.self_id:
                self.refuse(f"it dialled member {target!r} but this node is {lst.self_id!r}")
            elif dialer in lst.departed and not lst.accepts(dialer):
                self.refuse("that id was removed from this group")
                lst.tell_departed(dialer)
            elif not lst.accepts(dialer):
                self.refuse("that id is not another member of this group")
            elif hs.flags != lst.flags:
                self.refuse(
                    f"it {'asks for' if hs.flags & FLAG_FRAME_MAC else 'does not use'} frame MACs and this node "
                    f"{'requires' if lst.flags & FLAG_FRAME_MAC else 'does not use'} them "
                    "(peer_frame_mac or TLS settings differ)"
                )
            else:
                self._hs = hs
                self.name = f"from {dialer} (authenticating)"
                self.send(challenge)
        elif kind == HELLO_PEER:
            self._claimed = body[1:].decode(errors="replace")
            if auth is not None:
                self.refuse("unauthenticated peer hello; this node requires the cluster secret")
            elif self._claimed not in lst.members and not lst.open_to_all:
                self.refuse("that id is not another member of this group")
                if self._claimed in lst.departed:
                    lst.tell_departed(self._claimed)
            else:
                self._accept_peer(self._claimed)
        elif kind == HELLO_CLIENT:
            if lst.cfg.client_auth:
                self.refuse("client did not authenticate; this node requires it (client_auth = true)")
            else:
                self._accept_client()
        elif kind == HELLO_CLIENT_AUTH:
            if auth is None:
                self.refuse("client offered authentication but this node has no cluster_secret")
                return
            try:
                challenge, self._client_hs = auth.client_challenge(body)
            except AuthError as exc:
                self.refuse(str(exc))
                return
            self.name = "client (authenticating)"
            self.send(challenge)
        else:
            self.refuse("connection did not start with a hello frame")

    def _accept_client(self) -> None:
        self.name = "client"
        self.handler = self.listener.make_client_handler(self)
        self._hello_done()

    def _accept_peer(self, peer: str) -> None:
        lst = self.listener
        if peer not in lst.members and not lst.open_to_all:
            log.info(
                "accepted peer %s from %s: not in this node's configuration, but it proved the cluster "
                "secret (a member added by a configuration this node does not hold yet)",
                peer,
                self.peername,
                extra={"peer_id": peer},
            )
        self.peer_id = peer
        self.name = f"from {peer}"
        old = lst.peers.get(peer)
        if old is not None and old is not self:
            old.close()  # the peer reconnected; its old connection is dead or dying
        lst.peers[peer] = self
        self._hello_done()
