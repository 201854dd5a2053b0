"""Orchestration of one test: stand up, load, break, heal, drain, record, check.

Order matters and is always the same: the group starts and elects a leader; workers
and the nemesis run until the deadline; every fault is healed (even on errors or
Ctrl-C); the group elects a leader again; the workload's final phase (drain / final
reads) runs; the history is closed; processes are stopped by PID; then the checker
judges the history. Everything lands in ``OUT/<test>/<timestamp>/``: ``history.jsonl``
(or, with worker processes, the ``history/`` folder of shards), ``nemesis.log``,
``leaders.jsonl``, ``cluster/<node>/node.log``, ``workers/`` (each worker's spec and log),
``run.json`` and, from the checker, ``results.json`` and ``report.html``.

With ``workers`` > 0 the clients run in that many OS processes (``worker``), each
recording its own shard; this process (the controller) keeps the group, the nemesis, the
leader monitor and the final reads, and records the faults and final reads in shard 0.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jepsen.faults.schedule import Nemesis
from jepsen.history import History, validate_shards
from jepsen.run.check import VERDICTS, run_checker, warm_up_checker
from jepsen.run.monitor import LeaderMonitor
from jepsen.run.pool import WorkerPool
from jepsen.run.worker import peak_rss_mb
from jepsen.systems.base import Backend, Unsupported
from jepsen.systems.broken import adapters_for
from jepsen.systems.registry import make_backend
from jepsen.workloads.base import RunContext, Workload
from jepsen.workloads.registry import WORKLOADS

DEFAULT_NEMESIS = ("kill-leader", "partition-leader")


@dataclass
class RunConfig:
    workload: str = "log"
    system: str = "ledger"  # "ledger", "pysyncobj" or "broker" (the queue workload's system)
    backend: str = "local"
    nemesis: tuple[str, ...] = DEFAULT_NEMESIS
    time: float = 40.0
    interval: float = 4.0
    rate: float = 50.0  # operations per second over all clients; math.inf: closed loop ("--rate max")
    clients: int | None = None  # logical clients over all workers; None: chosen by resolve_load
    out: Path = Path("jepsen-runs")
    seed: int | None = None
    op_timeout: float = 5.0
    drain_timeout: float = 120.0  # seconds a final drain (the whole log read back) may take
    send_batch: int | None = None  # queue workload: coalesce up to this many concurrent sends to a queue
    workers: int | None = None  # client processes; 0: clients in this process; None: resolve_load
    progress: bool = True
    check: bool = True
    keep_data: bool = False
    broken_adapter: str | None = None  # harness self-test: a client known to be wrong
    check_engine: str = "auto"  # the checker's engine: auto (small histories in-process), inprocess, spark
    name: str | None = None
    #: keyword arguments for the system's backend (``--system rocketmq``: namesrv, nodes, hooks, topic;
    #: ``--system broker``: groups, host_base, port_base)
    system_options: dict[str, Any] = field(default_factory=dict)
    #: several broker groups: a fault hits one group at random ("one") or every group at once ("all")
    fault_scope: str = "one"

    @property
    def full_rate(self) -> bool:
        return self.rate == math.inf

    def test_name(self) -> str:
        if self.name:
            return self.name
        parts = [self.system, self.workload, "+".join(self.nemesis) or "none"]
        if self.broken_adapter:
            parts.append(f"broken-{self.broken_adapter}")
        return "-".join(parts)


@dataclass
class RunResult:
    run_dir: Path
    valid: bool | str | None  # checker verdict; None: not checked / harness problem
    history: Path
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def report(self) -> Path:
        return self.run_dir / "report.html"

    @property
    def exit_code(self) -> int:
        """0 valid, 1 invalid, 2 unknown, 3 could not check (checker missing or failed)."""
        return VERDICTS.get(self.valid, 3)  # type: ignore[arg-type]


def make_run_dir(out: Path, test: str) -> Path:
    base = Path(out) / test
    stamp = time.strftime("%Y%m%dT%H%M%S")
    run_dir = base / stamp
    n = 1
    while run_dir.exists():
        n += 1
        run_dir = base / f"{stamp}-{n}"
    run_dir.mkdir(parents=True)
    latest = base / "latest"
    try:
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(run_dir.name)
    except OSError as exc:  # a convenience only: the run goes on without it
        warnings.warn(f"could not point {latest} at {run_dir.name}: {exc}", stacklevel=2)
    return run_dir


#: logical clients per worker process at --rate max, by workload: enough outstanding sends to
#: fill batches (queue), to keep the ledger's group commit busy (log); few for registers,
#: whose linearizability check grows with concurrency
FULL_RATE_CLIENTS = {"queue": 1024, "log": 64, "register": 4}
#: queue workload at --rate max: sends per batch request, at most. A broker group answers a
#: roughly constant number of requests per second under load, so recorded throughput follows
#: the messages in flight: measured (15 s runs, 2 workers, the same hour; ok sends/s, medians)
#: 512 clients / batch 64: 2.4-6.2k; 2048 / 128: 5.9-6.6k; 2048 / 256: 4.5k (3.9-10.3k);
#: 4096 / 512: 5.2k, with a third more memory per worker
FULL_RATE_SEND_BATCH = 256
#: at --rate max polls are 1% of operations. Each poll is a request the leader answers on its
#: own, while a batch of up to FULL_RATE_SEND_BATCH sends is one: at 5% polls they were nine
#: requests in ten the leader served, and took 13% of a worker's CPU. 0.95 -> 0.99 (25 s runs
#: without faults, three alternating pairs): 29.4k/30.1k/28.7k -> 42.8k/43.7k/36.9k ok sends/s,
#: worker CPU 31-34 -> 24-28 us per operation; a 60 s run still records about 20k polls
FULL_RATE_SEND_RATIO = 0.99
#: at --rate max a poll asks for fewer pairs: decoding polled messages was the largest client
#: cost in a worker's profile (50 pairs per poll cost more than all the sends together)
FULL_RATE_POLL_MAX = 10
DEFAULT_CLIENTS = 5


def resolve_load(cfg: RunConfig) -> RunConfig:
    """Fill in what the user left to us: workers, clients, batching (``--rate max`` loads hard).

    The default run (an open-loop rate) stays one light process; ``--rate max`` gets one
    worker process per core, closed-loop clients and batched sends.
    """
    if cfg.workers is None:
        cfg.workers = (os.cpu_count() or 1) if cfg.full_rate else 0
    if cfg.clients is None:
        per = FULL_RATE_CLIENTS.get(cfg.workload, DEFAULT_CLIENTS) if cfg.full_rate else DEFAULT_CLIENTS
        cfg.clients = per * max(1, cfg.workers) if cfg.full_rate else per
    if cfg.send_batch is None:
        cfg.send_batch = FULL_RATE_SEND_BATCH if cfg.full_rate and cfg.workload == "queue" else 1
    if cfg.workers and cfg.clients < cfg.workers:
        raise Unsupported(f"{cfg.workers} workers need at least as many clients, not {cfg.clients}")
    return cfg


class _Progress:
    """A tqdm bar over the test's seconds: ok/fail/info totals and rates, and the fault in force."""

    RATE_WINDOW_S = 2.0  # rates are averaged over about this long

    def __init__(self, cfg: RunConfig, counts: Callable[[], dict[str, int]], nemesis: Nemesis) -> None:
        self.enabled = cfg.progress
        self.counts = counts
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.nemesis = nemesis
        self.total = cfg.time
        self.bar: Any = None
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(
                total=round(cfg.time),
                unit="s",
                desc=cfg.test_name()[:40],
                leave=True,
                bar_format="{desc} {bar} {n:.0f}/{total_fmt}s{postfix}",
            )

    def refresh(self, elapsed: float, phase: str | None = None) -> None:
        if not self.bar:
            return
        c = self.counts()
        self.samples.append((elapsed, c))
        while len(self.samples) > 2 and elapsed - self.samples[1][0] >= self.RATE_WINDOW_S:
            self.samples.pop(0)
        t0, c0 = self.samples[0]
        dt = max(1e-3, elapsed - t0)
        state = phase or f"fault={self.nemesis.current or '-'}"
        text = " ".join(f"{t}={c[t]} ({(c[t] - c0[t]) / dt:,.0f}/s)" for t in ("ok", "fail", "info"))
        self.bar.n = min(self.total, elapsed)
        self.bar.set_postfix_str(f"{text} {state}", refresh=False)
        self.bar.refresh()

    async def run(self, start: float, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            self.refresh(loop.time() - start)
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass

    def close(self) -> None:
        if self.bar:
            self.bar.close()


async def _closing_clients(backend: Backend, drive: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run ``drive``, then close the backend's own clients inside this loop, whatever happened."""
    try:
        return await drive
    finally:
        await backend.close_clients()


async def _drive(
    cfg: RunConfig, backend: Backend, history: History, run_dir: Path, wraps: dict[str, Any]
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    rng = random.Random(cfg.seed)
    await backend.wait_for_leader(60)
    start = loop.time()
    ctx = RunContext(
        history=history,
        rng=rng,
        deadline=start + cfg.time,
        rate=cfg.rate,
        clients=cfg.clients,
        op_timeout=cfg.op_timeout,
        drain_timeout=cfg.drain_timeout,
        send_batch=cfg.send_batch or 1,
        send_ratio=FULL_RATE_SEND_RATIO if cfg.full_rate else 0.75,
        poll_max=FULL_RATE_POLL_MAX if cfg.full_rate else 50,
        **wraps,
    )
    workload: Workload = WORKLOADS[cfg.workload](backend, ctx)
    nemesis, monitor = _nemesis_and_monitor(cfg, backend, history, rng, run_dir)
    watch_stop = asyncio.Event()
    progress = _Progress(cfg, lambda: dict(history.counts), nemesis)
    side = [
        asyncio.create_task(monitor.run(watch_stop)),
        asyncio.create_task(progress.run(start, watch_stop)),
    ]
    try:
        phases = await _load_and_break(cfg, ctx, workload, nemesis)
        progress.refresh(cfg.time, "healed: waiting for a leader")
        leader = await backend.wait_for_leader(60)
        phases["leader_after_heal_s"] = round(loop.time() - start, 3)
        progress.refresh(cfg.time, "final reads")
        await workload.final()
        phases["final_done_s"] = round(loop.time() - start, 3)
        await monitor.poll_once()
    finally:
        watch_stop.set()
        await asyncio.gather(*side, return_exceptions=True)
        progress.close()
    return {
        "leader_after_heal": leader,
        "phases": phases,
        "workload": workload.summary(),
        "nemesis": nemesis.summary(),
        "leaders": monitor.summary(),
    }


async def _load_and_break(
    cfg: RunConfig, ctx: RunContext, workload: Workload, nemesis: Nemesis
) -> dict[str, float]:
    """Workers and the nemesis until the deadline; returns once every fault is healed, whatever happened."""
    loop = asyncio.get_running_loop()
    start = ctx.deadline - cfg.time
    workers = [asyncio.create_task(workload.worker(w)) for w in range(cfg.clients or 1)]
    nem = asyncio.create_task(nemesis.run(ctx.deadline))
    try:
        await nem
        done, pending = await asyncio.wait(
            workers, timeout=max(0.0, ctx.deadline - loop.time()) + cfg.op_timeout + 5
        )
        for t in pending:  # bounded: a worker stuck past its operation timeout is abandoned
            t.cancel()
        for t in done:
            if t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    finally:
        ctx.stop.set()
        for t in workers:
            t.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if not nem.done():
            nem.cancel()
            await asyncio.gather(nem, return_exceptions=True)
        await nemesis.heal_all()
    return {"healed_at_s": round(loop.time() - start, 3)}


def worker_specs(
    cfg: RunConfig, backend: Backend, history: History, history_dir: Path
) -> list[dict[str, Any]]:
    """One spec per worker: its shard, its share of the clients and rate, the group's endpoints."""
    n = cfg.workers or 0
    total = cfg.clients or n
    endpoints = backend.client_spec()
    specs = []
    first = 0
    for i in range(1, n + 1):
        clients = total // n + (1 if i <= total % n else 0)
        specs.append(
            {
                "shard": i,
                "shards": n + 1,
                "history": str(history_dir / f"shard-{i:02d}.jsonl"),
                "clock_origin_ns": history.clock_origin_ns,
                "workload": cfg.workload,
                "clients": clients,
                "client_offset": first,
                "rate": None if cfg.full_rate else cfg.rate / n,
                "op_timeout": cfg.op_timeout,
                "send_batch": cfg.send_batch or 1,
                "send_ratio": FULL_RATE_SEND_RATIO if cfg.full_rate else 0.75,
                "poll_max": FULL_RATE_POLL_MAX if cfg.full_rate else 50,
                "seed": None if cfg.seed is None else cfg.seed * 1000 + i,
                "broken_adapter": cfg.broken_adapter,
                "endpoints": endpoints,
            }
        )
        first += clients
    return specs


def merge_workload_summaries(mine: dict[str, Any], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """The controller's workload summary plus the workers': counts add up, maxima stay maxima."""
    out = dict(mine)
    for doc in theirs:
        for k, v in doc.items():
            if isinstance(v, bool) or not isinstance(v, int | list):
                out.setdefault(k, v)
            elif isinstance(v, list):
                out[k] = (list(out.get(k) or []) + v)[:5]
            elif k.startswith("largest"):
                out[k] = max(int(out.get(k) or 0), v)
            else:
                out[k] = int(out.get(k) or 0) + v
    return out


async def _drive_workers(
    cfg: RunConfig, backend: Backend, history: History, run_dir: Path, history_dir: Path
) -> dict[str, Any]:
    """Like ``_drive``, with the clients in worker processes and this process as the controller."""
    loop = asyncio.get_running_loop()
    rng = random.Random(cfg.seed)
    await backend.wait_for_leader(60)
    ctx = RunContext(
        history=history,
        rng=rng,
        deadline=loop.time() + cfg.time,
        rate=cfg.rate,
        clients=1,
        op_timeout=cfg.op_timeout,
        drain_timeout=cfg.drain_timeout,
        send_batch=1,
        values=iter(()),  # the controller only reads (drains, final reads); it sends nothing
    )
    workload: Workload = WORKLOADS[cfg.workload](backend, ctx)
    nemesis, monitor = _nemesis_and_monitor(cfg, backend, history, rng, run_dir)
    pool = WorkerPool(run_dir, worker_specs(cfg, backend, history, history_dir))
    watch_stop = asyncio.Event()
    progress = _Progress(cfg, lambda: _add(pool.counts(), history.counts), nemesis)
    side: list[asyncio.Task[None]] = []
    try:
        await pool.start()
        start = loop.time()
        ctx.deadline = start + cfg.time
        pool.go(ctx.deadline)
        side = [
            asyncio.create_task(monitor.run(watch_stop)),
            asyncio.create_task(progress.run(start, watch_stop)),
        ]
        try:
            await nemesis.run(ctx.deadline)
            await pool.wait(max(0.0, ctx.deadline - loop.time()) + cfg.op_timeout + 15)
        finally:
            await pool.stop()
            await nemesis.heal_all()
        phases: dict[str, float] = {"healed_at_s": round(loop.time() - start, 3)}
        progress.refresh(cfg.time, "healed: waiting for a leader")
        leader = await backend.wait_for_leader(60)
        phases["leader_after_heal_s"] = round(loop.time() - start, 3)
        progress.refresh(cfg.time, "final reads")
        await workload.final()
        phases["final_done_s"] = round(loop.time() - start, 3)
        await monitor.poll_once()
    finally:
        watch_stop.set()
        await asyncio.gather(*side, return_exceptions=True)
        progress.close()
        await pool.stop()
    summaries = pool.summaries()
    return {
        "leader_after_heal": leader,
        "phases": phases,
        "workload": merge_workload_summaries(
            workload.summary(), [w.get("workload") or {} for w in summaries]
        ),
        "nemesis": nemesis.summary(),
        "leaders": monitor.summary(),
        "workers": [{k: v for k, v in w.items() if k not in ("workload", "done")} for w in summaries],
    }


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {t: a.get(t, 0) + b.get(t, 0) for t in ("ok", "fail", "info")}


def run(cfg: RunConfig) -> RunResult:
    """Run one test end to end (synchronous; owns its event loop)."""
    if cfg.workload not in WORKLOADS:
        raise Unsupported(f"unknown workload {cfg.workload!r}; available: {', '.join(WORKLOADS)}")
    if cfg.workload == "queue" and cfg.system == "ledger":
        cfg.system = "broker"  # queues live on brokers (each embedding a ledger node)
    if cfg.system == "pysyncobj" and cfg.workload != "log":
        raise Unsupported("the pysyncobj system runs the log workload only")
    if (cfg.system in ("broker", "rocketmq", "rocketmq-rust")) != (cfg.workload == "queue"):
        raise Unsupported(
            "the queue workload runs on the broker, rocketmq and rocketmq-rust systems, and they run only it"
        )
    if (cfg.send_batch or 1) > 1 and cfg.workload != "queue":
        raise Unsupported("--send-batch applies to the queue workload only")
    resolve_load(cfg)
    wraps: dict[str, Any] = {}
    if cfg.broken_adapter:
        kind = WORKLOADS[cfg.workload].wraps
        table = adapters_for(kind)
        if cfg.broken_adapter not in table:
            raise Unsupported(
                f"no broken adapter {cfg.broken_adapter!r} for the {cfg.workload} workload; "
                f"available: {', '.join(table)}"
            )
        wraps[f"wrap_{kind}_client"] = table[cfg.broken_adapter].wrap
    run_dir = make_run_dir(cfg.out, cfg.test_name())
    backend = make_backend(cfg.backend, cfg.system, run_dir / "cluster", **cfg.system_options)
    backend.client_timeout = max(0.5, cfg.op_timeout - 1.0)
    backend.plan_faults(cfg.nemesis)  # before start: the docker group lays out disk-full's volumes
    sharded = bool(cfg.workers)
    history_path = run_dir / "history" if sharded else run_dir / "history.jsonl"
    history = (
        History(history_path / "shard-00.jsonl", shards=(cfg.workers or 0) + 1)
        if sharded
        else History(history_path)
    )
    summary: dict[str, Any] = {
        "config": {
            k: (str(v) if isinstance(v, Path) else "max" if v == math.inf else v)
            for k, v in asdict(cfg).items()
        },
        "run_dir": str(run_dir),
    }
    t0 = time.monotonic()
    try:
        backend.start()
        drive = (
            _drive_workers(cfg, backend, history, run_dir, history_path)
            if sharded
            else _drive(cfg, backend, history, run_dir, wraps)
        )
        summary.update(asyncio.run(_closing_clients(backend, drive)))
    finally:
        history.close()
        backend.stop()
        summary["duration_s"] = round(time.monotonic() - t0, 3)
        counts, by_f = dict(history.counts), {f"{f}:{t}": n for (f, t), n in history.counts_by_f.items()}
        for w in summary.get("workers", []):
            counts = _add(counts, w)
            for k, n in (w.get("counts_by_f") or {}).items():
                by_f[k] = by_f.get(k, 0) + n
        summary["counts"] = counts
        summary["counts_by_f"] = dict(sorted(by_f.items()))
        summary["controller_peak_rss_mb"] = peak_rss_mb()
        (run_dir / "run.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    # a large history's Spark session starts while the shards are validated, not after
    warm_up = warm_up_checker(history_path, cfg.check_engine) if cfg.check else None
    t_validate = time.monotonic()
    problems = validate_shards(history_path)  # streamed shard by shard: memory stays bounded
    summary["validate_s"] = round(time.monotonic() - t_validate, 3)
    summary["history_problems"] = problems[:20]
    valid: bool | str | None = None
    if problems:
        summary["check"] = {"valid": None, "output": "the recorded history breaks the contract; not checked"}
    elif cfg.check:
        t1 = time.monotonic()
        checked = run_checker(history_path, WORKLOADS[cfg.workload].checker, run_dir, engine=cfg.check_engine)
        summary["check"] = {**checked, "seconds": round(time.monotonic() - t1, 3)}
        if warm_up is not None:  # started before validation: `seconds` above holds only what was left of it
            summary["check"]["spark_start_s"] = warm_up.seconds
        valid = checked["valid"]
    mism = summary.get("workload", {}).get("ack_mismatches")
    if mism:
        valid = False  # an acknowledged index held another command: the system broke its promise
        summary["harness_anomalies"] = {"ack-mismatch": mism}
    summary["valid"] = valid
    (run_dir / "run.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    if valid is True and not cfg.keep_data:
        backend.cleanup_data()
    return RunResult(run_dir=run_dir, valid=valid, history=history_path, summary=summary)


def _nemesis_and_monitor(
    cfg: RunConfig, backend: Backend, history: History, rng: random.Random, run_dir: Path
) -> tuple[Nemesis, LeaderMonitor]:
    """The run's nemesis (its own seeded stream) and leader monitor, as every run mode makes them."""
    nemesis = Nemesis(
        backend,
        history,
        list(cfg.nemesis),
        cfg.interval,
        random.Random(rng.random()),
        run_dir / "nemesis.log",
        fault_scope=cfg.fault_scope,
    )
    return nemesis, LeaderMonitor(backend, history, run_dir / "leaders.jsonl")
