"""Length-prefixed binary frames over asyncio TCP, for peers and clients of a ledger node.

Every frame is ``u32 length`` + body, bounded by a maximum size that is checked before
any buffering, so a corrupt or hostile length cannot make a node allocate gigabytes. The
first frame on a connection is a hello saying who is calling: ``P<node id>`` for a peer,
``C`` for a client. A malformed frame closes only that connection, with a logged reason.

Peers talk over one outgoing connection per direction: a node writes its messages to a
peer on the connection it opened, and reads the peer's messages on the connection the
peer opened. Outgoing connections reconnect with exponential backoff; messages for a
peer that is down are dropped, which Raft tolerates by design.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable

from .messages import Message, MessageError, decode_message, encode_message

log = logging.getLogger("ledger.transport")

_LEN = struct.Struct("<I")
HELLO_PEER = b"P"
HELLO_CLIENT = b"C"


class FrameError(ValueError):
    """The byte stream does not hold a valid frame."""


class FrameProtocol(asyncio.Protocol):
    """Splits a TCP stream into frames and hands each to ``on_frame``.

    Parsing happens in ``data_received`` without creating a task per frame; frames are
    delivered as ``bytes`` slices of the receive buffer.
    """

    def __init__(self, max_frame: int, name: str = "") -> None:
        self.max_frame = max_frame
        self.name = name
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.peername = ""
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
                if size > self.max_frame:
                    raise FrameError(f"frame of {size} bytes exceeds the limit of {self.max_frame}")
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
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines((_LEN.pack(len(body)), body))

    def abort(self, reason: str) -> None:
        log.warning(
            "closing connection: %s", reason, extra={"peer": self.peername, "conn": self.name}
        )
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.closed.done():
            self.closed.set_result(None)

    def write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport else 0


class PeerOutbox:
    """The outgoing connection to one peer: connects lazily, reconnects with backoff."""

    def __init__(
        self,
        self_id: str,
        peer_id: str,
        address: tuple[str, int],
        max_frame: int,
        max_buffer: int = 64 << 20,
    ) -> None:
        self.self_id = self_id
        self.peer_id = peer_id
        self.address = address
        self.max_frame = max_frame
        self.max_buffer = max_buffer
        self.proto: FrameProtocol | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._backoff = 0.02
        self._closed = False
        self.dropped = 0

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
        if len(body) > self.max_frame:
            log.error("dropping oversize message to %s (%d bytes)", self.peer_id, len(body))
            return
        proto.send(body)

    def _ensure_connecting(self) -> None:
        if self._closed or (self._connecting is not None and not self._connecting.done()):
            return
        self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            try:
                _, proto = await asyncio.wait_for(
                    loop.create_connection(
                        lambda: _OutboundProtocol(self.max_frame, f"to {self.peer_id}"), *self.address
                    ),
                    timeout=1.0,
                )
            except (TimeoutError, OSError):
                await asyncio.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, 0.5)
                continue
            proto.send(HELLO_PEER + self.self_id.encode())
            self.proto = proto
            self._backoff = 0.02
            await proto.closed
            self.proto = None
            if self._closed:
                return
            await asyncio.sleep(self._backoff)

    def close(self) -> None:
        self._closed = True
        if self.proto is not None and self.proto.transport is not None:
            self.proto.transport.close()
        if self._connecting is not None:
            self._connecting.cancel()


class _OutboundProtocol(FrameProtocol):
    """Outgoing peer connections carry no inbound traffic; anything received is an error."""

    def on_frame(self, body: bytes) -> None:
        raise FrameError("unexpected frame on an outgoing peer connection")


class InboundProtocol(FrameProtocol):
    """A connection accepted by a node: a peer's message stream or a client's requests."""

    def __init__(
        self,
        max_frame: int,
        on_peer_message: Callable[[Message], None],
        make_client_handler: Callable[[FrameProtocol], Callable[[bytes], None]],
        members: set[str],
    ) -> None:
        super().__init__(max_frame, "inbound")
        self.on_peer_message = on_peer_message
        self.make_client_handler = make_client_handler
        self.members = members
        self.peer_id: str | None = None
        self.handler: Callable[[bytes], None] | None = None

    def on_frame(self, body: bytes) -> None:
        handler = self.handler
        if handler is not None:
            handler(body)
            return
        if self.peer_id is not None:
            m = decode_message(body)
            if m.src != self.peer_id:
                raise FrameError(f"message claims to be from {m.src!r} on {self.peer_id!r}'s connection")
            self.on_peer_message(m)
            return
        if body[:1] == HELLO_PEER:
            peer = body[1:].decode(errors="replace")
            if peer not in self.members:
                raise FrameError(f"hello from unknown peer {peer!r}")
            self.peer_id = peer
            self.name = f"from {peer}"
        elif body[:1] == HELLO_CLIENT:
            self.name = "client"
            self.handler = self.make_client_handler(self)
        else:
            raise FrameError("connection did not start with a hello frame")
