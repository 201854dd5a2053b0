"""A steady append load that records every acknowledgement, for failover tests and benchmarks.

Each worker appends unique payloads and records ``(index, term, payload, time)`` for
every acknowledged append, so afterwards one can check that nothing acknowledged was
lost and measure when the first acknowledgement from a new leader arrived.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from .client import LedgerClient
from .wire import UNKNOWN_OUTCOME, LedgerError


@dataclass
class Ack:
    index: int
    term: int
    payload: bytes
    at: float  # time.monotonic() of the acknowledgement


@dataclass
class AppendLoad:
    addresses: list[str]
    workers: int = 4
    batch: int = 1
    payload_size: int = 64
    attempt_timeout: float = 1.0
    acks: list[Ack] = field(default_factory=list)
    unknown: int = 0
    failed: int = 0
    _stop: bool = False
    _seq: int = 0

    def stop(self) -> None:
        self._stop = True

    def _payload(self, worker: int) -> bytes:
        self._seq += 1
        tag = f"w{worker}-{self._seq}-".encode()
        return tag + b"x" * max(0, self.payload_size - len(tag))

    async def run(self, seconds: float | None = None) -> None:
        """Append until ``stop()`` (or ``seconds`` elapse)."""
        deadline = None if seconds is None else time.monotonic() + seconds
        async with LedgerClient(self.addresses, timeout=30, attempt_timeout=self.attempt_timeout) as client:

            async def worker(w: int) -> None:
                while not self._stop and (deadline is None or time.monotonic() < deadline):
                    payloads = [self._payload(w) for _ in range(self.batch)]
                    try:
                        first, term = await client.append_batch(payloads)
                    except LedgerError as exc:
                        if exc.code == UNKNOWN_OUTCOME:
                            self.unknown += 1
                        else:
                            self.failed += 1
                        await asyncio.sleep(0.01)
                        continue
                    now = time.monotonic()
                    self.acks.extend(Ack(first + i, term, p, now) for i, p in enumerate(payloads))

            await asyncio.gather(*(worker(w) for w in range(self.workers)))

    def first_ack_after(self, t: float, min_term: int) -> Ack | None:
        """The earliest acknowledgement at or after ``t`` from a term of at least ``min_term``."""
        best = None
        for a in self.acks:
            if a.at >= t and a.term >= min_term and (best is None or a.at < best.at):
                best = a
        return best


async def missing_acks(client: LedgerClient, acks: list[Ack], address: str | None = None) -> list[Ack]:
    """Acknowledged entries that are not (or not byte-identical) in the committed log."""
    if not acks:
        return []
    hi = max(a.index for a in acks)
    have: dict[int, bytes] = {}
    lo = 1
    while lo <= hi:
        chunk = await client.read(lo, hi, linearizable=address is None, max_bytes=4 << 20, address=address)
        if not chunk:
            break
        for e in chunk:
            have[e.index] = bytes(e.data)
        lo = chunk[-1].index + 1
    return [a for a in acks if have.get(a.index) != a.payload]
