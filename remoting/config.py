"""Transport settings shared by RemotingServer and RemotingClient.

Kept as one small dataclass so that a server's config (nameserver, broker) can embed the
same fields and hand them over, and so both ends agree on limits by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from remoting.protocol import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_HEADER_BYTES, MAX_HEADER_WIRE_BYTES


@dataclass(frozen=True, slots=True)
class RemotingConfig:
    """Limits and switches of one remoting endpoint."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Bodies above this are refused (FRAME_TOO_LARGE) before they are buffered."""
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    send_crc: bool = True
    """Put a CRC32 of every non-empty body in the frame (costs ~1 ms per 4 MiB)."""
    verify_crc: bool = True
    connect_timeout_s: float = 3.0
    write_buffer_high_bytes: int = 8 * 1024 * 1024
    """Above this much unsent output a server stops reading that peer and a client's callers wait."""

    def __post_init__(self) -> None:
        if not 0 < self.max_body_bytes <= 1 << 31:
            raise ValueError(f"max_body_bytes must be in 1..{1 << 31}, got {self.max_body_bytes}")
        if not 0 < self.max_header_bytes <= MAX_HEADER_WIRE_BYTES:
            raise ValueError(
                f"max_header_bytes must be in 1..{MAX_HEADER_WIRE_BYTES}, got {self.max_header_bytes}"
            )
        if self.connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be positive, got {self.connect_timeout_s}")
        if self.write_buffer_high_bytes < 64 * 1024:
            raise ValueError(
                f"write_buffer_high_bytes must be at least 65536, got {self.write_buffer_high_bytes}"
            )
