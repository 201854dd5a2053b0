"""The delay, txn, retry and order workloads: their wiring, then real runs on a local broker group.

The wiring: the broker system runs them (on both of its backends), the group's timing reaches
worker processes in the client spec, a run's broken adapter reaches the workload's clients
however they are made, each workload has a broken adapter. The real runs (slow): each workload
through a nemesis must be judged valid, with the anomalies it could have had exercised (delays
of both kinds seen, transactions checked, messages dead-lettered, queues handed between
consumers); each broken adapter must be caught; and both checker paths must judge the real
histories alike.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import click
import pytest

from jepsen.checker.analyze import analyze_files
from jepsen.checker.parse import WORKLOADS as CHECKER_WORKLOADS
from jepsen.checker.semantics_model import DEFAULT_TOLERANCES, excused, fault_windows
from jepsen.cli import analyze
from jepsen.history import read_history, validate_history
from jepsen.run.config import RunConfig, RunResult
from jepsen.run.runner import run
from jepsen.run.validate import BACKEND_REFUSALS, validated
from jepsen.run.worker import build_context
from jepsen.systems.broken import BROKEN_ADAPTERS, adapters_for
from jepsen.systems.broker import LocalBrokerBackend, QueueEndpoints
from jepsen.systems.broker_semantics import SEMANTICS_SETTINGS, BrokerTiming
from jepsen.systems.registry import SYSTEMS
from jepsen.workloads.base import RunContext
from jepsen.workloads.registry import WORKLOADS

HELD = ("delay", "txn", "retry", "order")


def test_the_broker_runs_the_held_message_workloads_on_both_backends() -> None:
    broker = SYSTEMS["broker"]
    assert set(HELD) <= set(broker.workloads) and set(broker.backends) == {"local", "docker"}
    for name in HELD:
        assert WORKLOADS[name].checker == name and WORKLOADS[name].wraps == name
        assert len(adapters_for(name)) == 1, name  # one broken adapter each
        cfg = validated(RunConfig(workload=name))  # the default system moves to the broker
        assert cfg.system == "broker"
        assert validated(RunConfig(workload=name, backend="docker")).backend == "docker"
    assert "delay, txn, retry or order" in BACKEND_REFUSALS["docker"]


def test_the_groups_timing_reaches_worker_processes(tmp_path: Path) -> None:
    backend = LocalBrokerBackend(tmp_path)
    assert backend.timing.delay_levels_ms[:3] == (100, 200, 500)
    assert backend.timing.transaction_check_interval_s == SEMANTICS_SETTINGS["transaction_check_interval_s"]
    spec = json.loads(json.dumps(backend.client_spec()))  # as the controller writes it
    endpoints = QueueEndpoints(spec)
    assert endpoints.timing == backend.timing
    assert endpoints.queue_client().timing == backend.timing
    # a spec without timing (the docker group's brokers run with their defaults)
    del spec["timing"]
    default = QueueEndpoints(spec).timing
    assert default == BrokerTiming() and default.delay_levels_ms[:2] == (1000, 5000)
    assert default.transaction_check_interval_s == 60.0
    assert BrokerTiming.from_spec(backend.timing.to_spec()) == backend.timing


def test_a_runs_broken_adapter_reaches_the_workloads_clients() -> None:
    def mark(c: Any) -> Any:
        return ("wrapped", c)

    here = RunContext(history=None, rng=None, deadline=0, rate=1, clients=1, wrap_delay_client=mark)  # type: ignore[arg-type]
    assert here.wrapper("delay") is mark and here.wrapper("txn") is None and here.wrapper("log") is None
    # a worker process installs each adapter where its own workload looks for it, and nowhere else
    spec = {"shard": 1, "shards": 2, "clients": 1, "op_timeout": 1.0, "seed": 1, "rate": 1}
    for name, adapter in BROKEN_ADAPTERS.items():
        there = build_context({**spec, "broken_adapter": name}, None)  # type: ignore[arg-type]
        installed = {w for w in ("log", "register", "delay", "txn", "retry", "order") if there.wrapper(w)}
        assert installed == {adapter.wraps} and there.wrapper(adapter.wraps) is adapter.wrap, name


def test_analyze_takes_every_workload_the_checker_judges() -> None:
    """``jepsen analyze --workload`` offers exactly the workloads the checker knows, the
    held-message ones included."""
    option = next(p for p in analyze.params if p.name == "workload")
    assert isinstance(option.type, click.Choice)
    assert sorted(option.type.choices) == sorted(CHECKER_WORKLOADS)
    assert {"delay", "txn", "retry", "order"} <= set(option.type.choices)


def test_late_deliveries_are_excused_only_while_a_fault_lasts() -> None:
    ms = 1_000_000
    events = [
        (0, 1000 * ms, "kill", '{"nodes": ["n1"]}'),
        (1, 1001 * ms, "kill", '{"nodes": ["n1"]}'),
        (2, 3000 * ms, "restart", '{"nodes": ["n1"]}'),
        (3, 3001 * ms, "restart", '{"nodes": ["n1"]}'),
        (4, 20_000 * ms, "pause", '{"nodes": ["n2"]}'),  # never resumed: lasts to the end
        (5, 20_001 * ms, "pause", '{"nodes": ["n2"]}'),
    ]
    grace = DEFAULT_TOLERANCES.fault_grace_ms
    windows = fault_windows(events, grace)
    assert windows[0] == (1000 * ms, (3001 + grace) * ms) and windows[1][0] == 20_000 * ms
    assert excused(windows, 0, 2000 * ms) == 1000 * ms
    assert excused(windows, 9000 * ms, 10_000 * ms) == 0
    assert excused(windows, 19_000 * ms, 30_000 * ms) == 10_000 * ms


# --- real runs ------------------------------------------------------------------------------


def _run(out: Path, workload: str, **kw: Any) -> RunResult:
    settings: dict[str, Any] = {
        "out": out,
        "progress": False,
        "time": 12,
        "interval": 3,
        "rate": 40,
        "clients": 4,
        "seed": 7,
        "workload": workload,
        **kw,
    }
    return run(RunConfig(**settings))


#: each workload's run, and the fault it goes through
NEMESES = {
    "delay": ("kill-leader",),
    "txn": ("partition-leader",),
    "retry": ("kill-leader",),
    "order": ("pause-leader",),
}


#: and its options: the order run spans two broker groups (each with its own queue locks,
#: and its own queue of the consumers' retry topic, which orderly consumers lock too)
OPTIONS: dict[str, dict[str, Any]] = {"order": {"system_options": {"groups": 2}}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    out = tmp_path_factory.mktemp("held")
    return {w: _run(out, w, nemesis=NEMESES[w], **OPTIONS.get(w, {})) for w in HELD}


def _fs(result: RunResult) -> tuple[list[dict[str, Any]], Counter[str]]:
    events = read_history(result.history)
    assert validate_history(events) == []
    return events, Counter(f"{e['f']}:{e['type']}" for e in events if e["process"] != "nemesis")


def _valid(result: RunResult) -> None:
    check = result.summary.get("check", {})
    assert result.valid is True, f"anomalies: {(check.get('results') or {}).get('anomalies')}"
    faults = [e for e in read_history(result.history) if e["process"] == "nemesis"]
    assert faults, "the nemesis never struck"


@pytest.mark.slow
def test_delay_through_leader_kills(runs: dict[str, RunResult]) -> None:
    result = runs["delay"]
    _valid(result)
    events, fs = _fs(result)
    sends = [e["value"] for e in events if e["f"] == "send-delayed" and e["type"] == "invoke"]
    assert any("level" in s for s in sends) and any("deliver-ms" in s for s in sends)
    assert fs["send-delayed:ok"] > 100 and fs["drain:ok"] == 2
    assert result.summary["workload"]["held_at_drain"]["scheduled"]["left"] == 0


@pytest.mark.slow
def test_txn_through_leader_partitions(runs: dict[str, RunResult]) -> None:
    result = runs["txn"]
    _valid(result)
    events, fs = _fs(result)
    decisions = Counter(e["value"]["decision"] for e in events if e["f"] == "end" and e["type"] == "invoke")
    assert decisions["commit"] and decisions["rollback"] and decisions["unknown"]
    answers = Counter(e["value"]["answer"] for e in events if e["f"] == "check" and e["type"] == "ok")
    assert answers["commit"] and answers["rollback"], answers  # the broker asked about unknown ones
    assert result.summary["workload"]["held_at_drain"]["halves"]["left"] == 0


@pytest.mark.slow
def test_retry_through_leader_kills(runs: dict[str, RunResult]) -> None:
    result = runs["retry"]
    _valid(result)
    events, fs = _fs(result)
    assert fs["send-back:ok"] > 20 and fs["ack:ok"] > 20
    drained = {e["key"]: e["value"] for e in events if e["f"] == "drain" and e["type"] == "ok"}
    dead = [v for k, entries in drained.items() if k.startswith("%DLQ%") for _, v, _, _ in entries]
    retried = [a for k, entries in drained.items() if k.startswith("%RETRY%") for _, _, _, a in entries]
    assert dead and all(v % 4 == 3 for v in dead), "only values failing past their last try are dead letters"
    assert set(retried) == {1, 2}


@pytest.mark.slow
def test_order_through_leader_pauses(runs: dict[str, RunResult]) -> None:
    result = runs["order"]
    _valid(result)
    events, fs = _fs(result)
    assert fs["consume:ok"] > 20 and fs["consume:fail"] >= 1 and fs["lock:ok"] >= 4
    granted = {
        (e["process"], q)
        for e in events
        if e["f"] == "lock" and e["type"] == "ok"
        for q in e["value"]["granted"]
    }
    consumers = {e["value"]["consumer"] for e in events if e["f"] == "consume" and e["type"] == "invoke"}
    assert granted and len(consumers) >= 2, consumers
    locked = {q for _, q in granted}
    assert any(q.startswith("%RETRY%") for q in locked) and any("/broker-b/" in q for q in locked), locked


@pytest.mark.slow
def test_both_checker_paths_judge_the_real_histories_alike(
    runs: dict[str, RunResult], tmp_path: Path
) -> None:
    paths = [runs[w].history for w in HELD]
    fast = analyze_files(paths, out_dir=tmp_path / "inprocess", engine="inprocess", report=False)
    slow = analyze_files(paths, out_dir=tmp_path / "spark", engine="spark", report=False)
    for a, b in zip(fast["files"], slow["files"], strict=True):
        assert a.error is None and b.error is None, (a.error, b.error)
        ra = {k: v for k, v in a.result.items() if k != "engine"}
        rb = {k: v for k, v in b.result.items() if k != "engine"}
        assert ra == rb, a.workload


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "adapter", "anomaly"),
    [
        ("delay", "undelayed", "delivered-early"),
        ("txn", "commit-rollbacks", "rolled-back-visible"),
        ("retry", "unsent-send-backs", "never-redelivered"),
        ("order", "skip-messages", "order-broken"),
    ],
)
def test_a_broken_adapter_is_caught(tmp_path: Path, workload: str, adapter: str, anomaly: str) -> None:
    result = _run(tmp_path, workload, nemesis=(), time=5, broken_adapter=adapter)
    assert result.valid is False
    counts = result.summary["check"]["results"]["counts"]
    assert counts.get(anomaly, 0) > 0, counts
