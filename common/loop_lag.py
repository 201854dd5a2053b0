"""How late an asyncio event loop runs its callbacks: the stalls that cost a leader its lease.

A server on one event loop answers nothing, heartbeats nobody and votes for nobody while a
callback holds the loop. A timer asks to run every ``interval_s``; how much later than asked it
ran is the loop's lag at that moment. The last ``window`` samples are kept (a bounded deque)
so an operator, or a benchmark flooding the server, can read the stall percentiles of the
last minute from the server's own status.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

DEFAULT_INTERVAL_S = 0.02
DEFAULT_WINDOW = 3000  # samples kept: a minute at the default interval


class LoopLagMonitor:
    """Samples the running loop's lag every ``interval_s`` while started."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, window: int = DEFAULT_WINDOW) -> None:
        if interval_s <= 0 or window < 1:
            raise ValueError("a loop lag monitor needs a positive interval and window")
        self.interval_s = interval_s
        self.samples: deque[tuple[float, float]] = deque(maxlen=window)  # (wall time, seconds late)
        self.worst_s = 0.0  # since start
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._due = loop.time() + self.interval_s
        self._handle = loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        late = max(0.0, now - self._due)
        self.samples.append((time.time(), late))
        self.worst_s = max(self.worst_s, late)
        self._due = now + self.interval_s
        self._handle = loop.call_at(self._due, self._tick)

    def summary(self, since: float = 0.0) -> dict[str, Any]:
        """Lag percentiles (ms) over the window (only samples taken at or after wall time
        ``since``, when given), and the worst since start."""
        ordered = sorted(late for at, late in self.samples if at >= since)

        def pct(q: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2) if ordered else 0.0

        return {
            "samples": len(ordered),
            "p50_ms": pct(0.5),
            "p99_ms": pct(0.99),
            "max_ms": round(ordered[-1] * 1000, 2) if ordered else 0.0,
            "worst_since_start_ms": round(self.worst_s * 1000, 2),
        }
