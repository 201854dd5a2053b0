"""The queue workload: producers and consumers through a real broker group under faults.

Brokers are killed and partitioned while the project's Producer sends unique integers to
two queues and master-only polls read them back; every queue is drained after healing.
The checker must find the history valid, faults must have moved leadership, and a client
that acknowledges sends it never made must be caught.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from jepsen.history import read_history, validate_history
from jepsen.run.config import RunConfig, RunResult
from jepsen.run.runner import run
from jepsen.systems.base import Unsupported

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, **kw) -> RunResult:
    settings = {
        "out": tmp_path,
        "progress": False,
        "time": 12,
        "interval": 2,
        "rate": 40,
        "clients": 4,
        "seed": 11,
        "workload": "queue",
        **kw,
    }
    return run(RunConfig(**settings))


def test_queue_kill_and_partition_leader_is_valid(tmp_path):
    result = _run(tmp_path, nemesis=("kill-leader", "partition-leader"))
    events = read_history(result.history)
    assert validate_history(events) == []
    keys = {e.get("key") for e in events if e["process"] != "nemesis"}
    assert keys == {"JepsenQueue/0", "JepsenQueue/1"}, keys
    fs = Counter(e["f"] for e in events if e["process"] == "nemesis")
    assert fs["kill"] >= 2 and fs["start-partition"] >= 1
    leaders = result.summary["leaders"]
    assert leaders["leader_changes"] >= 1 and max(leaders["terms_seen"]) > min(leaders["terms_seen"])
    ok_sends = [e for e in events if e["f"] == "send" and e["type"] == "ok"]
    drains = [e for e in events if e["f"] == "drain" and e["type"] == "ok"]
    assert len(ok_sends) > 50 and len(drains) == 2
    drained = {v for d in drains for _, v in d["value"]}
    assert {e["value"] for e in ok_sends} <= drained, "an acknowledged send is missing from the drains"
    assert result.valid is True, (
        f"anomalies: {result.summary.get('check', {}).get('results', {}).get('anomalies')}"
    )
    assert (result.run_dir / "cluster" / "broker-n1" / "broker.log").exists()


def test_queue_broken_adapter_is_caught(tmp_path):
    result = _run(tmp_path, nemesis=(), time=6, broken_adapter="ack-unsent")
    assert result.valid is False
    counts = result.summary["check"]["results"]["counts"]
    assert counts.get("lost-write", 0) > 0, counts


def test_queue_batched_sends_through_a_leader_kill_are_valid(tmp_path):
    """Concurrent sends coalesced into batches (one ledger entry each) keep every guarantee."""
    result = _run(tmp_path, nemesis=("kill-leader",), time=10, rate=300, clients=12, send_batch=8)
    events = read_history(result.history)
    assert validate_history(events) == []
    work = result.summary["workload"]
    ok_sends = [e for e in events if e["f"] == "send" and e["type"] == "ok"]
    assert len(ok_sends) > 200
    assert work["largest_send_batch"] > 1 and work["send_batches"] < len(ok_sends), work
    assert sum(1 for e in events if e["process"] == "nemesis" and e["f"] == "kill") >= 1
    assert result.valid is True, (
        f"anomalies: {result.summary.get('check', {}).get('results', {}).get('anomalies')}"
    )


def test_send_batch_is_refused_outside_the_queue_workload(tmp_path):
    with pytest.raises(Unsupported, match="send-batch"):
        run(RunConfig(out=tmp_path, progress=False, workload="log", send_batch=4))


def test_queue_drain_bigger_than_a_page_is_recorded_in_pages(tmp_path):
    """A drain of more pairs than ``drain_page`` is several drain events per queue, recorded as
    read: each asks from just past the last offset before it, every page but the last is full,
    the last is short; together they hold every acknowledged send, and the run is valid."""
    page = 16
    result = _run(tmp_path, nemesis=("kill-leader",), time=8, rate=100, drain_page=page)
    events = read_history(result.history)
    assert validate_history(events) == []
    ok_sends = [e for e in events if e["f"] == "send" and e["type"] == "ok"]
    pages: dict[str, list[tuple[dict, dict]]] = {}
    invokes = {}
    for e in events:
        if e["f"] != "drain":
            continue
        if e["type"] == "invoke":
            invokes[e["process"]] = e
        elif e["type"] == "ok":
            pages.setdefault(e["key"], []).append((invokes[e["process"]], e))
    assert set(pages) == {"JepsenQueue/0", "JepsenQueue/1"}, set(pages)
    drained = set()
    for key, ps in pages.items():
        assert len(ps) > 2, f"{key}: {len(ps)} drain events for {len(ok_sends)} sends"
        start = 0
        for i, (inv, ok) in enumerate(ps):
            assert inv["value"] == {"from": start, "max": page}, (key, i, inv)
            last = i == len(ps) - 1
            assert (len(ok["value"]) < page) if last else (len(ok["value"]) == page), (key, i)
            if ok["value"]:
                start = ok["value"][-1][0] + 1
            drained |= {v for _, v in ok["value"]}
    assert {e["value"] for e in ok_sends} <= drained, "an acknowledged send is missing from the pages"
    assert result.summary["workload"]["drained_total"] == len(drained)
    assert result.valid is True, (
        f"anomalies: {result.summary.get('check', {}).get('results', {}).get('anomalies')}"
    )


def test_queue_paged_drain_still_finds_a_lost_write(tmp_path):
    """Acknowledged sends that never reached a queue are missing from every page: lost-write."""
    result = _run(tmp_path, nemesis=(), time=6, broken_adapter="ack-unsent", drain_page=8)
    assert result.valid is False
    counts = result.summary["check"]["results"]["counts"]
    assert counts.get("lost-write", 0) > 0, counts
