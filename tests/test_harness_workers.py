"""Short full-rate runs with worker processes: every workload, sharded histories, recovery per kill.

Each run is ``--rate max`` with two worker processes (closed-loop clients, the queue
workload batching its sends) for a few seconds while the nemesis kills the leader. The
tests check what sharding must not break: every worker wrote a shard, indexes are unique
across shards, each process lives in one shard with its events in order (one
outstanding operation at a time, nothing after an ``info``), every fault has its start
and end, the verdict is valid, and results.json has a numeric recovery for each kill. A
deliberately broken client must still be caught at full rate.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from jepsen.history import read_shards, validate_shards
from jepsen.run.config import RunConfig, RunResult
from jepsen.run.runner import run

pytestmark = pytest.mark.slow

WORKERS = 2


def _run(tmp_path: Path, workload: str, **kw) -> RunResult:
    settings = {
        "out": tmp_path,
        "progress": False,
        "workload": workload,
        "rate": math.inf,
        "workers": WORKERS,
        "time": 7,
        "interval": 2,
        "nemesis": ("kill-leader",),
        "seed": 5,
        "check_engine": "inprocess",  # the same rules as Spark without its start-up (see test_checker_*)
        **kw,
    }
    return run(RunConfig(**settings))


def _assert_sharded_history(result: RunResult) -> list[dict]:
    hist = result.history
    assert hist.is_dir() and hist.name == "history"
    per_shard = read_shards(hist)  # by shard name, whichever format recorded them
    shards = sorted(per_shard)
    assert shards == [f"shard-{i:02d}" for i in range(WORKERS + 1)]
    assert validate_shards(hist) == []
    for name in shards[1:]:  # every worker recorded client operations
        assert sum(1 for e in per_shard[name] if e["type"] == "ok") > 20, name
    events = [e for evs in per_shard.values() for e in evs]
    assert len({e["index"] for e in events}) == len(events), "an index repeats across shards"
    owner: dict = {}
    by_process: dict = defaultdict(list)
    for name, evs in per_shard.items():
        for e in evs:
            if e["process"] != "nemesis":
                assert owner.setdefault(e["process"], name) == name, f"process {e['process']} in two shards"
                by_process[e["process"]].append(e)
    for p, evs in by_process.items():  # per process: invoke, completion, invoke, ... in index and time order
        assert [e["index"] for e in evs] == sorted(e["index"] for e in evs)
        assert [e["time"] for e in evs] == sorted(e["time"] for e in evs)
        types = [e["type"] for e in evs]
        assert all(t == "invoke" for t in types[0::2]) and all(t != "invoke" for t in types[1::2]), p
        assert "info" not in types[:-1], f"process {p} went on after an info"
    nem = [e for e in per_shard["shard-00"] if e["process"] == "nemesis"]
    assert Counter(e["f"] for e in nem[0::2]) == Counter(e["f"] for e in nem[1::2]), "a fault without its end"
    assert result.summary["counts"]["ok"] == sum(1 for e in events if e["type"] == "ok")
    for w in result.summary["workers"]:  # bounded memory per worker (clients and a 1 MB buffer)
        assert 0 < w["peak_rss_mb"] < 400, w
    return sorted(events, key=lambda e: e["time"])


def _assert_recovery_per_kill(result: RunResult, events: list[dict]) -> None:
    results = json.loads((result.run_dir / "results.json").read_text())
    kills = [e for e in events if e["process"] == "nemesis" and e["f"] == "kill"][0::2]
    faults = [x for x in results["faults"] if x["f"] == "kill"]
    assert kills and len(faults) == len(kills), (kills, results.get("faults"))
    for x in faults:
        assert isinstance(x["recovery_ms"], float) and x["recovery_ms"] > 0, x
        assert x["gap_ms"] >= 0 and x["ok_per_s_before"] > 0, x
    assert results["recovery"]["kill-leader"]["recovered"] == len(kills)
    html = (result.run_dir / "report.html").read_text()
    assert "<h2>Recovery</h2>" in html and len(html) < 3_000_000


def _assert_valid(result: RunResult) -> None:
    check = result.summary.get("check") or {}
    assert result.valid is True, (check.get("output"), (check.get("results") or {}).get("anomalies"))


def test_queue_at_full_rate_with_workers(tmp_path):
    result = _run(tmp_path, "queue")
    events = _assert_sharded_history(result)
    _assert_valid(result)
    work = result.summary["workload"]
    assert work["largest_send_batch"] > 1, work  # closed-loop clients fill batches
    sends = {e["value"] for e in events if e["f"] == "send" and e["type"] == "invoke"}
    assert len(sends) == sum(1 for e in events if e["f"] == "send" and e["type"] == "invoke"), (
        "a value repeats"
    )
    _assert_recovery_per_kill(result, events)


def test_log_at_full_rate_with_workers(tmp_path):
    result = _run(tmp_path, "log")
    events = _assert_sharded_history(result)
    _assert_valid(result)
    _assert_recovery_per_kill(result, events)


def test_register_at_full_rate_with_workers(tmp_path):
    result = _run(tmp_path, "register", time=6)
    events = _assert_sharded_history(result)
    _assert_valid(result)
    assert result.summary["workload"]["ack_mismatches"] == 0
    _assert_recovery_per_kill(result, events)


def test_a_broken_client_is_caught_at_full_rate_with_workers(tmp_path):
    result = _run(tmp_path, "log", nemesis=(), time=4, broken_adapter="ack-unsent")
    _assert_sharded_history(result)
    results = result.summary["check"]["results"]
    assert result.valid is False and "lost-write" in results["anomaly-types"], results
