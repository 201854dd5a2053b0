"""Orchestration of one test: stand up, load, break, heal, drain, record, check.

Order matters and is always the same: the group starts and elects a leader; workers
and the nemesis run until the deadline; every fault is healed (even on errors or
Ctrl-C); the group elects a leader again; the workload's final phase (drain / final
reads) runs; the history is closed; processes are stopped by PID; then the checker
judges the history. Everything lands in ``OUT/<test>/<timestamp>/``: the ``history/`` folder of
shards (Parquet parts by default; with ``--history-format jsonl`` and no worker processes the
one file ``history.jsonl``), ``nemesis.log``,
``leaders.jsonl``, ``cluster/<node>/node.log``, ``workers/`` (each worker's spec and log),
``run.json`` and, from the checker, ``results.json`` and ``report.html``.

With ``workers`` > 0 the clients run in that many OS processes (``worker``), each
recording its own shard; this process (the controller) keeps the group, the nemesis, the
leader monitor and the final reads, and records the faults and final reads in shard 0.
What differs between the two is the :class:`Load` (where the clients run); the rest of a
run's drive is one path.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import warnings
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from jepsen.checker.shards import crash_notes
from jepsen.faults.schedule import Nemesis
from jepsen.history import History, history_format, shard_path, validate_shards
from jepsen.run.check import run_checker, warm_up_checker
from jepsen.run.config import RunConfig, RunResult
from jepsen.run.monitor import LeaderMonitor
from jepsen.run.pool import WorkerPool
from jepsen.run.validate import validated
from jepsen.run.worker import peak_rss_mb
from jepsen.systems.base import Backend
from jepsen.systems.broken import BROKEN_ADAPTERS
from jepsen.systems.registry import make_backend
from jepsen.workloads.base import RunContext, Workload
from jepsen.workloads.registry import WORKLOADS

#: seconds the group has to elect a leader, at the start and again once every fault is healed
LEADER_TIMEOUT_S = 60.0


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
                "history": str(shard_path(history_dir, i, cfg.history_format)),
                "clock_origin_ns": history.clock_origin_ns,
                "workload": cfg.workload,
                "clients": clients,
                "client_offset": first,
                "rate": None if cfg.full_rate else cfg.rate / n,
                "op_timeout": cfg.op_timeout,
                "send_batch": cfg.send_batch or 1,
                "send_ratio": cfg.send_ratio,
                "poll_max": cfg.poll_max,
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


def client_wraps(cfg: RunConfig) -> dict[str, Any]:
    """The ``RunContext`` fields that wrap every client in the run's broken adapter (none without one)."""
    if not cfg.broken_adapter:
        return {}
    adapter = BROKEN_ADAPTERS[cfg.broken_adapter]
    return {f"wrap_{adapter.wraps}_client": adapter.wrap}


class Load(Protocol):
    """Where a run's clients run: tasks of this process, or worker processes."""

    def context(self, history: History, rng: random.Random) -> RunContext:
        """The run context of this process's clients (the controller's final reads included)."""
        ...

    def counts(self, history: History) -> Callable[[], dict[str, int]]:
        """ok / fail / info so far over every client, for the progress bar."""
        ...

    async def start(self) -> None:
        """Ready to load (worker processes started, their clients made)."""
        ...

    async def load(self, ctx: RunContext, workload: Workload, nemesis: Nemesis) -> None:
        """Clients and the nemesis until ``ctx.deadline``; returns once every fault is healed."""
        ...

    async def close(self) -> None: ...

    def summary(self, workload: Workload) -> dict[str, Any]:
        """The run summary's ``workload`` (and ``workers``) entries."""
        ...


class ClientsHere:
    """The clients as tasks of this process (``--workers 0``), recording into one history file."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    def context(self, history: History, rng: random.Random) -> RunContext:
        cfg = self.cfg
        return RunContext(
            history=history,
            rng=rng,
            deadline=math.inf,
            rate=cfg.rate,
            clients=cfg.clients or 1,
            op_timeout=cfg.op_timeout,
            drain_timeout=cfg.drain_timeout,
            drain_page=cfg.drain_page,
            send_batch=cfg.send_batch or 1,
            send_ratio=cfg.send_ratio,
            poll_max=cfg.poll_max,
            **client_wraps(cfg),
        )

    def counts(self, history: History) -> Callable[[], dict[str, int]]:
        return lambda: dict(history.counts)

    async def start(self) -> None:
        return None

    async def load(self, ctx: RunContext, workload: Workload, nemesis: Nemesis) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.cfg
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

    async def close(self) -> None:
        return None

    def summary(self, workload: Workload) -> dict[str, Any]:
        return {"workload": workload.summary()}


class WorkerProcesses:
    """The clients in worker processes, each recording its own shard; this process is the
    controller (the nemesis and the final reads, in shard 0)."""

    def __init__(
        self, cfg: RunConfig, backend: Backend, history: History, run_dir: Path, history_dir: Path
    ) -> None:
        self.cfg, self.backend, self.history = cfg, backend, history
        self.run_dir, self.history_dir = run_dir, history_dir
        self._pool: WorkerPool | None = None

    @property
    def pool(self) -> WorkerPool:
        """The worker processes (made by ``start``, once the group has its leader)."""
        if self._pool is None:
            specs = worker_specs(self.cfg, self.backend, self.history, self.history_dir)
            self._pool = WorkerPool(self.run_dir, specs)
        return self._pool

    def context(self, history: History, rng: random.Random) -> RunContext:
        cfg = self.cfg
        return RunContext(
            history=history,
            rng=rng,
            deadline=math.inf,
            rate=cfg.rate,
            clients=1,
            op_timeout=cfg.op_timeout,
            drain_timeout=cfg.drain_timeout,
            drain_page=cfg.drain_page,
            send_batch=1,
            values=iter(()),  # the controller only reads (drains, final reads); it sends nothing
        )

    def counts(self, history: History) -> Callable[[], dict[str, int]]:
        return lambda: add_counts(self.pool.counts(), history.counts)

    async def start(self) -> None:
        await self.pool.start()

    async def load(self, ctx: RunContext, workload: Workload, nemesis: Nemesis) -> None:
        loop = asyncio.get_running_loop()
        self.pool.go(ctx.deadline)
        try:
            await nemesis.run(ctx.deadline)
            await self.pool.wait(max(0.0, ctx.deadline - loop.time()) + self.cfg.op_timeout + 15)
        finally:
            await self.pool.stop()
            await nemesis.heal_all()

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.stop()

    def summary(self, workload: Workload) -> dict[str, Any]:
        summaries = self.pool.summaries()
        return {
            "workload": merge_workload_summaries(
                workload.summary(), [w.get("workload") or {} for w in summaries]
            ),
            "workers": [{k: v for k, v in w.items() if k not in ("workload", "done")} for w in summaries],
        }


def add_counts(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """ok / fail / info counts added up."""
    return {t: a.get(t, 0) + b.get(t, 0) for t in ("ok", "fail", "info")}


async def drive(
    cfg: RunConfig, backend: Backend, history: History, run_dir: Path, load: Load
) -> dict[str, Any]:
    """Load and break the started group until the deadline, heal it, wait for a leader, run
    the final reads; the run summary's entries for all that."""
    loop = asyncio.get_running_loop()
    rng = random.Random(cfg.seed)
    await backend.wait_for_leader(LEADER_TIMEOUT_S)
    ctx = load.context(history, rng)
    workload: Workload = WORKLOADS[cfg.workload](backend, ctx)
    nemesis, monitor = _nemesis_and_monitor(cfg, backend, history, rng, run_dir)
    watch_stop = asyncio.Event()
    progress = _Progress(cfg, load.counts(history), nemesis)
    side: list[asyncio.Task[None]] = []
    try:
        await load.start()
        start = loop.time()
        ctx.deadline = start + cfg.time
        side = [
            asyncio.create_task(monitor.run(watch_stop)),
            asyncio.create_task(progress.run(start, watch_stop)),
        ]
        await load.load(ctx, workload, nemesis)
        phases: dict[str, float] = {"healed_at_s": round(loop.time() - start, 3)}
        progress.refresh(cfg.time, "healed: waiting for a leader")
        leader = await backend.wait_for_leader(LEADER_TIMEOUT_S)
        phases["leader_after_heal_s"] = round(loop.time() - start, 3)
        progress.refresh(cfg.time, "final reads")
        await workload.final()
        phases["final_done_s"] = round(loop.time() - start, 3)
        await monitor.poll_once()
    finally:
        watch_stop.set()
        await asyncio.gather(*side, return_exceptions=True)
        progress.close()
        await load.close()
    clients = load.summary(workload)
    return {
        "leader_after_heal": leader,
        "phases": phases,
        "workload": clients.pop("workload"),
        "nemesis": nemesis.summary(),
        "leaders": monitor.summary(),
        **clients,
    }


async def _closing_clients(backend: Backend, driving: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run ``driving``, then close the backend's own clients inside this loop, whatever happened."""
    try:
        return await driving
    finally:
        await backend.close_clients()


def _nemesis_and_monitor(
    cfg: RunConfig, backend: Backend, history: History, rng: random.Random, run_dir: Path
) -> tuple[Nemesis, LeaderMonitor]:
    """The run's nemesis (its own seeded stream) and leader monitor."""
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


def _write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    (run_dir / "run.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")


def record(cfg: RunConfig, run_dir: Path, backend: Backend) -> tuple[Path, dict[str, Any]]:
    """Start the group, drive the run, stop the group: the history's path and the run summary
    (also written to ``run.json``, whatever happened)."""
    sharded = bool(cfg.workers)
    # one JSON Lines file when the clients run here; otherwise (workers, or Parquet, whose
    # parts need a folder) a folder of shards, shard 0 the controller's
    single = not sharded and history_format(cfg.history_format) == "jsonl"
    history_path = run_dir / "history.jsonl" if single else run_dir / "history"
    history = (
        History(history_path)
        if single
        else History(shard_path(history_path, 0, cfg.history_format), shards=(cfg.workers or 0) + 1)
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
        load: Load = (
            WorkerProcesses(cfg, backend, history, run_dir, history_path) if sharded else ClientsHere(cfg)
        )
        summary.update(asyncio.run(_closing_clients(backend, drive(cfg, backend, history, run_dir, load))))
    finally:
        history.close()
        backend.stop()
        summary["duration_s"] = round(time.monotonic() - t0, 3)
        counts, by_f = dict(history.counts), {f"{f}:{t}": n for (f, t), n in history.counts_by_f.items()}
        for w in summary.get("workers", []):
            counts = add_counts(counts, w)
            for k, n in (w.get("counts_by_f") or {}).items():
                by_f[k] = by_f.get(k, 0) + n
        summary["counts"] = counts
        summary["counts_by_f"] = dict(sorted(by_f.items()))
        summary["controller_peak_rss_mb"] = peak_rss_mb()
        _write_summary(run_dir, summary)
    return history_path, summary


def judge(cfg: RunConfig, run_dir: Path, history_path: Path, summary: dict[str, Any]) -> bool | str | None:
    """Check the recorded history against the contract, then the checker's verdict on it (None:
    not checked); fills in the summary's check entries."""
    # a large history's Spark session starts while the shards are validated, not after
    warm_up = warm_up_checker(history_path, cfg.check_engine) if cfg.check else None
    t_validate = time.monotonic()
    problems = validate_shards(history_path)  # streamed shard by shard: memory stays bounded
    summary["validate_s"] = round(time.monotonic() - t_validate, 3)
    summary["history_problems"] = problems[:20]
    notes = crash_notes(history_path)  # a worker killed mid-part: what the readers skip
    if notes:
        summary["history_notes"] = notes[:20]
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
    return valid


def run(cfg: RunConfig) -> RunResult:
    """Run one test end to end (synchronous; owns its event loop)."""
    validated(cfg)
    run_dir = make_run_dir(cfg.out, cfg.test_name())
    backend = make_backend(cfg.backend, cfg.system, run_dir / "cluster", **cfg.system_options)
    backend.client_timeout = max(0.5, cfg.op_timeout - 1.0)
    backend.plan_faults(cfg.nemesis)  # before start: the docker group lays out disk-full's volumes
    history_path, summary = record(cfg, run_dir, backend)
    valid = judge(cfg, run_dir, history_path, summary)
    summary["valid"] = valid
    _write_summary(run_dir, summary)
    if valid is True and not cfg.keep_data:
        backend.cleanup_data()
    return RunResult(run_dir=run_dir, valid=valid, history=history_path, summary=summary)
