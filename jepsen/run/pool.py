"""The controller's side of the worker processes: start, hand over the clock, watch, stop.

Each worker is a ``python -m jepsen.run.worker`` child with pipes for the JSON-lines
conversation described in ``worker`` and its stderr in ``workers/worker-NN.log``. The pool
knows every child by PID and ends only those: politely (SIGTERM, stdin closed) at the end
of a run, by SIGKILL when one outlives its grace period. A killed worker's shard is still
a valid history: its outstanding operations stay invokes, which the contract reads as info.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 60.0  # a worker that has not built its clients by then is broken
STOP_GRACE_S = 10.0  # after SIGTERM, before SIGKILL
MAX_LINE = 1 << 20  # a worker's status line (its summary) is small; refuse anything larger


class WorkerFailed(RuntimeError):
    """A worker process exited or misbehaved before finishing its part of the run."""


@dataclass
class WorkerState:
    shard: int
    proc: asyncio.subprocess.Process
    log: Path
    counts: dict[str, int] = field(default_factory=lambda: {"ok": 0, "fail": 0, "info": 0})
    summary: dict[str, Any] | None = None


class WorkerPool:
    """N worker processes, each recording shard ``1..N`` of the history (the controller is 0)."""

    def __init__(self, run_dir: Path, specs: list[dict[str, Any]]) -> None:
        self.dir = run_dir / "workers"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.specs = specs
        self.workers: list[WorkerState] = []
        self._readers: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Start every worker and wait until each has its clients ready."""
        for spec in self.specs:
            n = spec["shard"]
            path = self.dir / f"worker-{n:02d}.json"
            path.write_text(json.dumps(spec, indent=1), encoding="utf-8")
            log = self.dir / f"worker-{n:02d}.log"
            with open(log, "wb") as err:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "jepsen.run.worker",
                    str(path),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=err,
                    limit=MAX_LINE,
                )
            self.workers.append(WorkerState(n, proc, log))
        await asyncio.wait_for(asyncio.gather(*(self._ready(w) for w in self.workers)), READY_TIMEOUT_S)

    async def _line(self, w: WorkerState) -> dict[str, Any] | None:
        assert w.proc.stdout is not None
        raw = await w.proc.stdout.readline()
        if not raw:
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise WorkerFailed(f"worker {w.shard} wrote a line that is not JSON: {raw[:200]!r}") from None
        if not isinstance(doc, dict):
            raise WorkerFailed(f"worker {w.shard} wrote {raw[:200]!r}")
        return doc

    def _died(self, w: WorkerState, when: str) -> WorkerFailed:
        tail = ""
        with contextlib.suppress(OSError):
            tail = w.log.read_text(encoding="utf-8", errors="replace")[-1500:]
        return WorkerFailed(f"worker {w.shard} (pid {w.proc.pid}) exited {when}; its log {w.log}:\n{tail}")

    async def _ready(self, w: WorkerState) -> None:
        doc = await self._line(w)
        if doc is None or not doc.get("ready"):
            raise self._died(w, "before it was ready")

    def go(self, deadline: float) -> None:
        """Start the load now; workers stop starting operations at monotonic time ``deadline``."""
        line = (json.dumps({"go": deadline}) + "\n").encode()
        for w in self.workers:
            assert w.proc.stdin is not None
            w.proc.stdin.write(line)
        self._readers = [asyncio.create_task(self._follow(w)) for w in self.workers]

    async def _follow(self, w: WorkerState) -> None:
        while True:
            doc = await self._line(w)
            if doc is None:
                return
            if doc.get("done"):
                w.summary = doc
            for t in ("ok", "fail", "info"):
                if isinstance(doc.get(t), int):
                    w.counts[t] = doc[t]

    def counts(self) -> dict[str, int]:
        """ok / fail / info completions over every worker, as last reported."""
        out = {"ok": 0, "fail": 0, "info": 0}
        for w in self.workers:
            for t in out:
                out[t] += w.counts[t]
        return out

    async def wait(self, timeout: float) -> None:
        """Wait for every worker to finish on its own; those still running after ``timeout`` are stopped."""
        try:
            await asyncio.wait_for(asyncio.gather(*(w.proc.wait() for w in self.workers)), timeout)
        except TimeoutError:
            pass
        await self.stop()
        await asyncio.gather(*self._readers, return_exceptions=True)
        for w in self.workers:
            if w.summary is None:
                raise self._died(w, f"without finishing (exit status {w.proc.returncode})")

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after the grace period, every worker still running (by PID)."""
        live = [w for w in self.workers if w.proc.returncode is None]
        for w in live:
            with contextlib.suppress(ProcessLookupError):
                w.proc.terminate()
            if w.proc.stdin is not None:
                w.proc.stdin.close()
        if not live:
            return
        try:
            await asyncio.wait_for(asyncio.gather(*(w.proc.wait() for w in live)), STOP_GRACE_S)
        except TimeoutError:
            for w in live:
                if w.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        w.proc.kill()
            await asyncio.gather(*(w.proc.wait() for w in live), return_exceptions=True)

    def summaries(self) -> list[dict[str, Any]]:
        return [w.summary or {} for w in self.workers]
