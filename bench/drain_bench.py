"""The final drain's memory and time in the recording process, with no broker in the way.

The queue workload's final phase (``QueueWorkload.final``: every queue drained at once)
runs against an in-memory client holding ``--pairs`` (offset, value) pairs over ``--queues``
queues, recording into a JSON Lines history as a run's controller does. The client can
drain a queue at once (``drain``) or page by page (``drain_pages``, where the workload has
it): the figures say what the workload and the recorder hold, not what a broker client
buffers. Each measurement is a fresh process; its peak RSS (``VmHWM``) less its RSS before
the drain is the drain's memory. Run it from a tree (or with ``PYTHONPATH``) to measure
that tree's workload.

    python bench/drain_bench.py [--pairs 3000000] [--queues 4] [--runs 3]

Ends with one JSON line: pairs, queues, drain_page (null: the tree records one event per
drain), peak_extra_mb (median), drain_s (median), drain_events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

#: pairs a fake pull hands over at once (the broker client's DRAIN_POLL)
POLL = 2048


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


class FakeQueues:
    """Queues of consecutive values, read back whole or page by page (in pulls of POLL)."""

    node = "n1"

    def __init__(self, per_queue: int) -> None:
        self.per_queue = per_queue

    async def drain(self, queue_id: int) -> list[tuple[int, int]]:
        out = []
        for start in range(0, self.per_queue, POLL):
            out.extend(
                (o, queue_id * self.per_queue + o + 1)
                for o in range(start, min(start + POLL, self.per_queue))
            )
            await asyncio.sleep(0)
        return out

    async def drain_pages(self, queue_id: int, page: int) -> AsyncIterator[list[tuple[int, int]]]:
        buf: list[tuple[int, int]] = []
        for start in range(0, self.per_queue + 1, POLL):
            buf.extend(
                (o, queue_id * self.per_queue + o + 1)
                for o in range(start, min(start + POLL, self.per_queue))
            )
            while len(buf) >= page:
                yield buf[:page]
                del buf[:page]
            await asyncio.sleep(0)
        yield buf

    async def close(self) -> None:
        return None


class Source:
    system = "broker"
    topic = "JepsenQueue"

    def __init__(self, queues: int, per_queue: int) -> None:
        self.queues = queues
        self.client = FakeQueues(per_queue)

    def queue_client(self, broker_name: str | None = None) -> FakeQueues:
        return self.client


def child(pairs: int, queues: int, out: Path) -> dict[str, Any]:
    """One measurement, in this process."""
    from jepsen.history import History
    from jepsen.workloads.base import RunContext
    from jepsen.workloads.queue import QueueWorkload

    async def go() -> dict[str, Any]:
        with History(out) as h:
            kw: dict[str, Any] = {}
            page = None
            if "drain_page" in RunContext.__dataclass_fields__:
                page = RunContext.__dataclass_fields__["drain_page"].default
            ctx = RunContext(history=h, rng=random.Random(1), deadline=0.0, rate=1.0, clients=1, **kw)
            w = QueueWorkload(Source(queues, pairs // queues), ctx)  # type: ignore[arg-type]
            before = _rss_kb("VmRSS:")
            t0 = time.monotonic()
            await w.final()
            took = time.monotonic() - t0
        events = sum(1 for line in open(out) if '"type":"ok"' in line and '"f":"drain"' in line)
        return {
            "drain_page": page,
            "peak_extra_mb": round((_rss_kb("VmHWM:") - before) / 1024, 1),
            "drain_s": round(took, 3),
            "drain_events": events,
            "drained_total": w.summary()["drained_total"],
        }

    return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=3_000_000)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.pairs, a.queues, a.child)))
        return
    runs = []
    with tempfile.TemporaryDirectory(prefix="drain-bench-") as d:
        for i in range(a.runs):
            cmd = [sys.executable, __file__, "--pairs", str(a.pairs), "--queues", str(a.queues)]
            out = subprocess.run(
                [*cmd, "--child", str(Path(d) / f"h{i}.jsonl")],
                check=True,
                capture_output=True,
                text=True,
                env=os.environ,
            ).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"run {i + 1}: {r}", flush=True)
            runs.append(r)
    print(
        json.dumps(
            {
                "pairs": a.pairs,
                "queues": a.queues,
                "drain_page": runs[0]["drain_page"],
                "peak_extra_mb": statistics.median(r["peak_extra_mb"] for r in runs),
                "drain_s": statistics.median(r["drain_s"] for r in runs),
                "drain_events": runs[0]["drain_events"],
            }
        )
    )


if __name__ == "__main__":
    main()
