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

_AUTO_OUTPUT_FLOOR = 64 * 1024 * 1024  # max_output_bytes=0: never below this


#: The listener limits a server's own settings carry under the same names (a broker's and a
#: nameserver's config): ``listener_limits(settings)`` hands them over in one place.
LISTENER_LIMITS: tuple[str, ...] = (
    "max_connections",
    "handshake_timeout_s",
    "idle_timeout_s",
    "max_buffered_frame_bytes",
    "frame_timeout_s",
    "frame_min_bytes_per_s",
    "max_inflight_requests",
    "max_inflight_request_bytes",
    "max_output_bytes",
    "max_dispatch_per_turn",
)


def listener_limits(settings: object) -> dict[str, object]:
    """The LISTENER_LIMITS of a server's settings object, as RemotingConfig keyword arguments."""
    return {name: getattr(settings, name) for name in LISTENER_LIMITS}


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
    plus what the bytes it sent are worth at ``frame_min_bytes_per_s`` (slowloris: a peer that
    connects and trickles half a frame; an honest large first frame on a slow link is kept)."""
    idle_timeout_s: float = 120.0
    """A server closes a connection that delivered no complete frame for this long (RocketMQ's
    serverChannelMaxIdleTimeSeconds; clients heartbeat every 30 s). 0 turns it off."""
    max_buffered_frame_bytes: int = 256 * 1024 * 1024
    """Bytes of unfinished frames a server holds over all its connections; a connection that
    would push the total past it is closed, so half-sent frames cannot grow memory without end."""
    frame_timeout_s: float = 30.0
    """A server closes a connection whose frame, once its first byte is in, is not complete
    within this long plus the time its bytes received so far are worth at
    ``frame_min_bytes_per_s`` (the first frame gets ``handshake_timeout_s``, extended alike).
    Without it a peer that sent one frame could trickle the next a byte at a time and hold its
    connection slot for ever, as a complete frame now and then resets ``idle_timeout_s``."""
    frame_min_bytes_per_s: int = 64 * 1024
    """The slowest delivery a large frame may have: every byte received extends the frame's
    deadline by 1/this seconds, so an honest link at this rate or faster is never cut (a 4 MiB
    body at 64 KiB/s takes 64 s), while a peer sending slower is closed once its bytes no
    longer pay for the time it has taken."""
    max_inflight_requests: int = 1024
    """A server stops reading a connection while this many of its requests are read but not yet
    answered, and reads on when one is answered; the rest of a read already decoded waits,
    undispatched. Four times what the broker bench pipelines on one connection (256 unbatched
    sends), so the hot path never meets it; a client with more in flight (RocketMQ's Java client
    allows thousands of async sends) is slowed by TCP back-pressure, not refused."""
    max_inflight_request_bytes: int = 64 * 1024 * 1024
    """The same, by the bodies of the requests in flight: a peer pipelining large sends has at
    most this much (plus one request) held by the server at a time."""
    max_dispatch_per_turn: int = 256
    """A server dispatches at most this many requests of one connection per event-loop turn;
    the rest of a read waits (reading paused) for the next turn. One read can hold a thousand
    pipelined requests, and handling them all at once held the loop for 100+ ms (a burst of
    topic creations), delaying every other peer, the ledger's heartbeats among them."""
    max_output_bytes: int = 0
    """A connection whose queued output (written but not yet taken by the peer) passes this is
    closed: its peer does not read, and the answers to requests it sent before its reading was
    paused (``write_buffer_high_bytes``) would pile up past this. 0: automatic, the larger of
    64 MiB and ``write_buffer_high_bytes`` + 2 x ``max_body_bytes``, so that no honest answer is
    cut (a consumer with 16 pulls of 4 MiB answers in flight fits)."""
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
        if self.max_dispatch_per_turn < 1:
            raise ValueError(f"max_dispatch_per_turn must be at least 1, got {self.max_dispatch_per_turn}")
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
        if not self.frame_timeout_s > 0:
            raise ValueError(f"frame_timeout_s must be positive, got {self.frame_timeout_s}")
        if self.frame_min_bytes_per_s < 1:
            raise ValueError(f"frame_min_bytes_per_s must be at least 1, got {self.frame_min_bytes_per_s}")
        if self.max_inflight_requests < 1:
            raise ValueError(f"max_inflight_requests must be at least 1, got {self.max_inflight_requests}")
        if self.max_inflight_request_bytes < 64 * 1024:
            raise ValueError(
                f"max_inflight_request_bytes must be at least 65536, got {self.max_inflight_request_bytes}"
            )
        if self.max_output_bytes and self.max_output_bytes < 2 * self.write_buffer_high_bytes:
            raise ValueError(
                f"max_output_bytes must be 0 (automatic) or at least twice write_buffer_high_bytes "
                f"({2 * self.write_buffer_high_bytes}), got {self.max_output_bytes}"
            )

    @property
    def output_limit_bytes(self) -> int:
        """The queued output past which a connection is closed (``max_output_bytes`` resolved)."""
        if self.max_output_bytes:
            return self.max_output_bytes
        return max(_AUTO_OUTPUT_FLOOR, self.write_buffer_high_bytes + 2 * self.max_body_bytes)
