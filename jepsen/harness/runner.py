"""Orchestration of one test: stand up, load, break, heal, drain, record, check.

Order matters and is always the same: the group starts and elects a leader; workers
and the nemesis run until the deadline; every fault is healed (even on errors or
Ctrl-C); the group elects a leader again; the workload's final phase (drain / final
reads) runs; the history is closed; processes are stopped by PID; then the checker
judges the history. Everything lands in ``OUT/<test>/<timestamp>/``: ``history.jsonl``,
``nemesis.log``, ``leaders.jsonl``, ``cluster/<node>/node.log``, ``run.json`` and, from the
checker, ``results.json`` and ``report.html``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .backends import Backend, Unsupported, make_backend
from .check import VERDICTS, run_checker
from .clients import BROKEN_ADAPTERS, BROKEN_REGISTER_ADAPTERS
from .history import History, read_history, validate_history
from .monitor import LeaderMonitor
from .nemesis import Nemesis
from .queue import QueueWorkload  # noqa: F401 - registers the queue workload
from .workloads import WORKLOADS, RunContext, Workload

DEFAULT_NEMESIS = ("kill-leader", "partition-leader")


@dataclass
class RunConfig:
    workload: str = "log"
    system: str = "ledger"  # "ledger", "pysyncobj" or "broker" (the queue workload's system)
    backend: str = "local"
    nemesis: tuple[str, ...] = DEFAULT_NEMESIS
    time: float = 40.0
    interval: float = 4.0
    rate: float = 50.0
    clients: int = 5
    out: Path = Path("jepsen-runs")
    seed: int | None = None
    op_timeout: float = 5.0
    send_batch: int = 1  # queue workload: coalesce up to this many concurrent sends to a queue
    progress: bool = True
    check: bool = True
    keep_data: bool = False
    broken_adapter: str | None = None  # harness self-test: a client known to be wrong
    name: str | None = None

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


class _Progress:
    """A tqdm bar over the test's seconds, showing ok/fail/info and the fault in force."""

    def __init__(self, cfg: RunConfig, history: History, nemesis: Nemesis) -> None:
        self.enabled = cfg.progress
        self.history = history
        self.nemesis = nemesis
        self.total = cfg.time
        self.bar: Any = None
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=round(cfg.time), unit="s", desc=cfg.test_name()[:40], leave=True,
                            bar_format="{desc} {bar} {n:.0f}/{total_fmt}s{postfix}")

    def refresh(self, elapsed: float, phase: str | None = None) -> None:
        if not self.bar:
            return
        c = self.history.counts
        state = phase or f"fault={self.nemesis.current or '-'}"
        self.bar.n = min(self.total, elapsed)
        self.bar.set_postfix_str(f"ok={c['ok']} fail={c['fail']} info={c['info']} {state}", refresh=False)
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


async def _drive(cfg: RunConfig, backend: Backend, history: History, run_dir: Path,
                 wraps: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    rng = random.Random(cfg.seed)
    await backend.wait_for_leader(60)
    start = loop.time()
    ctx = RunContext(history=history, rng=rng, deadline=start + cfg.time, rate=cfg.rate, clients=cfg.clients,
                     op_timeout=cfg.op_timeout, send_batch=cfg.send_batch, **wraps)
    workload: Workload = WORKLOADS[cfg.workload](backend, ctx)
    nemesis = Nemesis(backend, history, list(cfg.nemesis), cfg.interval, random.Random(rng.random()),
                      run_dir / "nemesis.log")
    monitor = LeaderMonitor(backend, history, run_dir / "leaders.jsonl")
    watch_stop = asyncio.Event()
    progress = _Progress(cfg, history, nemesis)
    side = [asyncio.create_task(monitor.run(watch_stop)), asyncio.create_task(progress.run(start, watch_stop))]
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
    return {"leader_after_heal": leader, "phases": phases, "workload": workload.summary(),
            "nemesis": nemesis.summary(), "leaders": monitor.summary()}


async def _load_and_break(cfg: RunConfig, ctx: RunContext, workload: Workload, nemesis: Nemesis) -> dict[str, float]:
    """Workers and the nemesis until the deadline; returns once every fault is healed, whatever happened."""
    loop = asyncio.get_running_loop()
    start = ctx.deadline - cfg.time
    workers = [asyncio.create_task(workload.worker(w)) for w in range(cfg.clients)]
    nem = asyncio.create_task(nemesis.run(ctx.deadline))
    try:
        await nem
        done, pending = await asyncio.wait(workers, timeout=max(0.0, ctx.deadline - loop.time()) + cfg.op_timeout + 5)
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


def run(cfg: RunConfig) -> RunResult:
    """Run one test end to end (synchronous; owns its event loop)."""
    if cfg.workload not in WORKLOADS:
        raise Unsupported(f"unknown workload {cfg.workload!r}; available: {', '.join(WORKLOADS)}")
    if cfg.workload == "queue" and cfg.system == "ledger":
        cfg.system = "broker"  # queues live on brokers (each embedding a ledger node)
    if cfg.system == "pysyncobj" and cfg.workload != "log":
        raise Unsupported("the pysyncobj system runs the log workload only")
    if (cfg.system == "broker") != (cfg.workload == "queue"):
        raise Unsupported("the queue workload runs on the broker system, and the broker system runs only it")
    if cfg.send_batch > 1 and cfg.workload != "queue":
        raise Unsupported("--send-batch applies to the queue workload only")
    wraps: dict[str, Any] = {}
    if cfg.broken_adapter:
        table = BROKEN_REGISTER_ADAPTERS if cfg.workload == "register" else BROKEN_ADAPTERS
        if cfg.broken_adapter not in table:
            raise Unsupported(f"no broken adapter {cfg.broken_adapter!r} for the {cfg.workload} workload; "
                              f"available: {', '.join(table)}")
        wraps["wrap_register_client" if cfg.workload == "register" else "wrap_log_client"] = table[cfg.broken_adapter]
    run_dir = make_run_dir(cfg.out, cfg.test_name())
    backend = make_backend(cfg.backend, cfg.system, run_dir / "cluster")
    backend.client_timeout = max(0.5, cfg.op_timeout - 1.0)
    history_path = run_dir / "history.jsonl"
    history = History(history_path)
    summary: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
                               "run_dir": str(run_dir)}
    t0 = time.monotonic()
    try:
        backend.start()
        summary.update(asyncio.run(_drive(cfg, backend, history, run_dir, wraps)))
    finally:
        history.close()
        backend.stop()
        summary["duration_s"] = round(time.monotonic() - t0, 3)
        summary["counts"] = dict(history.counts)
        summary["counts_by_f"] = {f"{f}:{t}": n for (f, t), n in sorted(history.counts_by_f.items())}
        (run_dir / "run.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    problems = validate_history(read_history(history_path))
    summary["history_problems"] = problems[:20]
    valid: bool | str | None = None
    if problems:
        summary["check"] = {"valid": None, "output": "the recorded history breaks the contract; not checked"}
    elif cfg.check:
        t1 = time.monotonic()
        checked = run_checker(history_path, WORKLOADS[cfg.workload].checker, run_dir)
        summary["check"] = {**checked, "seconds": round(time.monotonic() - t1, 3)}
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
