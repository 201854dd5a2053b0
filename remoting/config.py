"""Transport settings shared by RemotingServer and RemotingClient.

Kept as one small dataclass so that a server's config (nameserver, broker) can embed the
same fields and hand them over, and so both ends agree on limits by default.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from remoting.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_HEADER_BYTES,
    MAX_HEADER_WIRE_BYTES,
    SERIALIZE_NAMES,
    SERIALIZE_ROCKETMQ,
)
from remoting.tls import TLS_DISABLED, TLS_MODES


@dataclass(frozen=True, slots=True)
class RemotingConfig:
    """Limits and switches of one remoting endpoint."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Bodies above this are refused (FRAME_TOO_LARGE) before they are buffered."""
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    send_crc: bool = True
    """Put a CRC32 of every non-empty body in the extField ``lmqBodyCrc32`` (costs ~1 ms per 4 MiB)."""
    verify_crc: bool = True
    connect_timeout_s: float = 3.0
    serialize_type: int = SERIALIZE_ROCKETMQ
    """Header serialisation of the requests this endpoint sends (responses follow their request's)."""
    write_buffer_high_bytes: int = 8 * 1024 * 1024
    """Above this much unsent output a server stops reading that peer and a client's callers wait."""
    reply_flush_bytes: int = 32 * 1024
    """A server writes a connection's queued replies as soon as this many bytes wait, not only
    at the end of the event-loop turn. One commit can answer hundreds of unbatched sends in a
    turn; written in pieces, the first answers reach the client while the rest are still being
    made, so client and server work at the same time instead of taking turns. In A/B runs of
    256 unbatched senders through a group this gave 10-25% more msgs/s where cores were idle;
    it costs a little CPU per message (the client's next requests come in smaller groups, so
    proposals are smaller), so a saturated machine gains nothing. 0: at the end of the turn."""
    max_connections: int = 4096
    """A server refuses (closes at once) connections beyond this many open ones, so a flood
    cannot take every file descriptor; it must fit the process's open-file limit."""
    handshake_timeout_s: float = 10.0
    """A server closes a connection that has not delivered one complete frame within this long
    (slowloris: a peer that connects and trickles half a frame)."""
    idle_timeout_s: float = 120.0
    """A server closes a connection that delivered no complete frame for this long (RocketMQ's
    serverChannelMaxIdleTimeSeconds; clients heartbeat every 30 s). 0 turns it off."""
    max_buffered_frame_bytes: int = 256 * 1024 * 1024
    """Bytes of unfinished frames a server holds over all its connections; a connection that
    would push the total past it is closed, so half-sent frames cannot grow memory without end."""
    tls_mode: str = TLS_DISABLED
    """A server's TLS: disabled, permissive (TLS and plaintext clients) or enforcing (TLS only);
    RocketMQ's tls.server.mode. Needs ``server_ssl`` unless disabled."""
    server_ssl: ssl.SSLContext | None = None
    """The listener's certificate and client-certificate policy (remoting.tls.server_ssl builds it)."""
    client_ssl: ssl.SSLContext | None = None
    """Set: a client dials every address with TLS (RocketMQ's tls.enable), checking the server's
    certificate and host name with it (remoting.tls.client_ssl builds it)."""

    def __post_init__(self) -> None:
        if not 0 < self.max_body_bytes <= 1 << 31:
            raise ValueError(f"max_body_bytes must be in 1..{1 << 31}, got {self.max_body_bytes}")
        if not 0 < self.max_header_bytes <= MAX_HEADER_WIRE_BYTES:
            raise ValueError(
                f"max_header_bytes must be in 1..{MAX_HEADER_WIRE_BYTES}, got {self.max_header_bytes}"
            )
        if self.serialize_type not in SERIALIZE_NAMES:
            raise ValueError(
                f"serialize_type must be one of {sorted(SERIALIZE_NAMES)}, got {self.serialize_type}"
            )
        if self.connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be positive, got {self.connect_timeout_s}")
        if self.reply_flush_bytes < 0:
            raise ValueError(f"reply_flush_bytes must be 0 (off) or positive, got {self.reply_flush_bytes}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")
        if self.handshake_timeout_s <= 0:
            raise ValueError(f"handshake_timeout_s must be positive, got {self.handshake_timeout_s}")
        if self.idle_timeout_s < 0:
            raise ValueError(f"idle_timeout_s must be 0 (off) or positive, got {self.idle_timeout_s}")
        if self.max_buffered_frame_bytes < 64 * 1024:
            raise ValueError(
                f"max_buffered_frame_bytes must be at least 65536, got {self.max_buffered_frame_bytes}"
            )
        if self.tls_mode not in TLS_MODES:
            raise ValueError(f"tls_mode must be one of {', '.join(TLS_MODES)}, got {self.tls_mode!r}")
        if self.tls_mode != TLS_DISABLED and self.server_ssl is None:
            raise ValueError(f"tls_mode {self.tls_mode!r} needs a server certificate (server_ssl)")
        if self.write_buffer_high_bytes < 64 * 1024:
            raise ValueError(
                f"write_buffer_high_bytes must be at least 65536, got {self.write_buffer_high_bytes}"
            )
