"""A worker: one OS process running a workload's clients and recording its own history shard.

``jepsen run --workers N`` starts N of these (``python -m jepsen.run.worker SPEC``) so
that the clients, the history encoding and the client library's decoding spread over the
machine's cores instead of sharing one Python process. A worker gets addresses, never the
backend: the controller keeps the group, the nemesis and the final reads, and records the
faults in its own shard. Every shard shares the controller's clock origin (the machine's
monotonic clock), and shard ``s`` of ``n`` draws indexes, process ids and sent values from
``s, s + n, ...``, so the union of the shards is one history (``docs/history.md``).

The spec is a JSON file written by the controller. The conversation is JSON lines:

* worker -> controller ``{"ready": true}`` once its clients exist;
* controller -> worker ``{"go": D}``: start now, stop starting operations at monotonic time D;
* worker -> controller ``{"ok": n, "fail": n, "info": n}`` every ``PROGRESS_EVERY_S``;
* worker -> controller ``{"done": true, ...counts and the workload's summary}`` at the end.

SIGTERM (or the controller closing stdin) makes the worker stop starting operations,
finish or time out the outstanding ones and close its shard; an operation cut short by a
SIGKILL stays an invoke, which the contract reads as ``info``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import random
import resource
import signal
import sys
from pathlib import Path
from typing import Any

from common.cli import run_main
from jepsen.history import History
from jepsen.systems.broken import BROKEN_ADAPTERS
from jepsen.systems.registry import endpoints_from_spec
from jepsen.workloads.base import RunContext
from jepsen.workloads.registry import WORKLOADS

PROGRESS_EVERY_S = 0.5
GO_TIMEOUT_S = 120.0  # a controller that never says go (it died): give up and exit
PROFILE_ENV = "JEPSEN_WORKER_PROFILE"  # a folder: each worker writes its cProfile stats there
EXIT_GRACE_S = 5.0  # past the deadline and the operation timeout, abandon stuck clients


def _emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _counts(history: History) -> dict[str, int]:
    return {t: history.counts[t] for t in ("ok", "fail", "info")}


def cpu_seconds() -> float:
    """CPU time (user + system) this process has used: what its operations cost the machine."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return round(u.ru_utime + u.ru_stime, 2)


def peak_rss_mb() -> float:
    """This process's own peak resident memory in MB.

    Linux's ``VmHWM`` belongs to the process's current memory map, so it starts afresh at
    exec. ``ru_maxrss`` does not: it keeps the high-water mark of the process that forked
    it, so a worker started from a large parent (a long pytest session) would report the
    parent's memory as its own. ``ru_maxrss`` is the fallback where /proc is missing.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def build_context(spec: dict[str, Any], history: History) -> RunContext:
    rate = spec.get("rate")
    shard, shards = int(spec["shard"]), int(spec["shards"])
    ctx = RunContext(
        history=history,
        rng=random.Random(spec.get("seed")),
        deadline=math.inf,
        rate=math.inf if rate is None else float(rate),
        clients=int(spec["clients"]),
        op_timeout=float(spec["op_timeout"]),
        send_batch=int(spec.get("send_batch", 1)),
        send_ratio=float(spec.get("send_ratio", 0.75)),
        poll_max=int(spec.get("poll_max", 50)),
        client_offset=int(spec.get("client_offset", 0)),
        values=itertools.count(shard if shard > 0 else shards, shards),
    )
    broken = spec.get("broken_adapter")
    if broken:
        adapter = BROKEN_ADAPTERS[broken]
        setattr(ctx, f"wrap_{adapter.wraps}_client", adapter.wrap)  # as the controller does
    return ctx


async def _stdin() -> asyncio.StreamReader:
    """The controller's lines, read on the event loop (no thread left blocked at exit)."""
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    return reader


async def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    history = History(
        spec["history"], int(spec["clock_origin_ns"]), shard=int(spec["shard"]), shards=int(spec["shards"])
    )
    ctx = build_context(spec, history)
    workload = WORKLOADS[spec["workload"]](endpoints_from_spec(spec["endpoints"]), ctx)
    loop.add_signal_handler(signal.SIGTERM, ctx.stop.set)
    tasks: list[asyncio.Task[None]] = []
    try:
        stdin = await _stdin()
        _emit({"ready": True})
        line = await asyncio.wait_for(stdin.readline(), GO_TIMEOUT_S)
        go = json.loads(line) if line.strip() else None
        if not isinstance(go, dict) or not isinstance(go.get("go"), int | float):
            return {"done": True, "aborted": "no go from the controller", **_counts(history)}
        ctx.deadline = float(go["go"])
        tasks = [asyncio.create_task(workload.worker(w)) for w in range(ctx.clients)]
        watcher = asyncio.create_task(_watch_stdin(ctx, stdin))
        limit = max(0.0, ctx.deadline - loop.time()) + ctx.op_timeout + EXIT_GRACE_S
        end = loop.time() + limit
        pending = set(tasks)
        while pending and loop.time() < end:
            done, pending = await asyncio.wait(pending, timeout=min(PROGRESS_EVERY_S, end - loop.time()))
            for t in done:
                if t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            history.flush()
            _emit(_counts(history))
        watcher.cancel()
    finally:
        ctx.stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await workload.close()
        history.close()
    return {
        "done": True,
        **_counts(history),
        "counts_by_f": {f"{f}:{t}": n for (f, t), n in sorted(history.counts_by_f.items())},
        "events": history.events,
        "workload": workload.summary(),
        "peak_rss_mb": peak_rss_mb(),
        "cpu_s": cpu_seconds(),
    }


async def _watch_stdin(ctx: RunContext, stdin: asyncio.StreamReader) -> None:
    """The controller closing our stdin (it stopped or died), or saying anything more, means stop."""
    await stdin.readline()
    ctx.stop.set()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit("usage: python -m jepsen.run.worker SPEC.json")
    try:
        spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        sys.exit(f"cannot read worker spec {args[0]}: {exc}")
    # uvloop, and the collector tuned (half of a full-rate worker's CPU went to it before):
    # common.cli.run_main, as the servers run
    profile_dir = os.environ.get(PROFILE_ENV)
    if not profile_dir:
        _emit(run_main(run_worker(spec)))
        return
    import cProfile

    with cProfile.Profile() as prof:
        result = run_main(run_worker(spec))
    prof.dump_stats(Path(profile_dir) / f"worker-{spec['shard']:02d}.prof")
    _emit(result)


if __name__ == "__main__":
    main()
