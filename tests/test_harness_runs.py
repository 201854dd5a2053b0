"""Short real runs of the fault-injection harness: 3 local processes, real faults, the real checker.

Each run loads a group for about ten seconds while the nemesis kills, partitions or
corrupts, then heals, drains, and hands the history to the Spark checker. The tests
assert the verdict, that the history keeps the contract, and that the faults really bit
(leadership moved to a higher term). A deliberately broken client adapter must be judged
invalid, which is what shows the whole pipeline can fail.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from jepsen.history import read_history, validate_history
from jepsen.run.config import RunConfig, RunResult
from jepsen.run.run_cli import run as run_command
from jepsen.run.runner import run

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, **kw) -> RunResult:
    settings = {
        "out": tmp_path,
        "progress": False,
        "time": 10,
        "interval": 2,
        "rate": 40,
        "clients": 4,
        "seed": 7,
        **kw,
    }
    return run(RunConfig(**settings))


def _checked(result: RunResult) -> dict:
    """The checker's results, after making sure it read the same operations the harness recorded."""
    check = result.summary.get("check") or {}
    assert check.get("valid") is not None, f"the checker did not run: {check.get('output')}"
    results = check.get("results") or {}
    seen = {f"{f}:{t}": n for f, by_type in results["stats"]["by-f"].items() for t, n in by_type.items()}
    assert seen == result.summary["counts_by_f"], "the checker and the recorder disagree on the operations"
    return results


def _assert_well_formed(result: RunResult) -> list[dict]:
    events = read_history(result.history)
    assert validate_history(events) == []
    nem = [e for e in events if e["process"] == "nemesis"]
    starts, ends = Counter(e["f"] for e in nem[0::2]), Counter(e["f"] for e in nem[1::2])
    assert starts == ends, "every nemesis start has its end"
    retired = {e["process"] for e in events if e["type"] == "info" and e["process"] != "nemesis"}
    for p in retired:  # after info, a process id is never invoked again
        last_info = max(e["index"] for e in events if e["process"] == p and e["type"] == "info")
        assert not [e for e in events if e["process"] == p and e["index"] > last_info]
    assert (result.run_dir / "nemesis.log").exists()
    assert all((result.run_dir / "cluster" / n / "node.log").exists() for n in ("n1", "n2", "n3"))
    return events


def _assert_leadership_moved(result: RunResult) -> None:
    leaders = result.summary["leaders"]
    assert leaders["leader_changes"] >= 1, f"faults never moved leadership: {leaders}"
    assert max(leaders["terms_seen"]) > min(leaders["terms_seen"])


def test_log_kill_leader_and_corrupt_tail(tmp_path):
    result = _run(tmp_path, workload="log", nemesis=("kill-leader", "corrupt-tail"))
    events = _assert_well_formed(result)
    _assert_leadership_moved(result)
    fs = Counter(e["f"] for e in events if e["process"] == "nemesis")
    assert fs["kill"] >= 4 and fs["restart"] >= 4 and fs["corrupt"] == 2
    corr = result.summary["nemesis"]["corruptions"]
    assert corr and corr[0].get("tail-truncated") is True, f"the node did not report cutting its tail: {corr}"
    sends = [e for e in events if e["f"] == "send" and e["type"] == "ok"]
    drain = [e for e in events if e["f"] == "drain" and e["type"] == "ok"]
    assert len(sends) > 100 and len(drain) == 1
    results = _checked(result)
    assert result.valid is True, f"anomalies: {results.get('anomalies')}"
    assert (result.run_dir / "results.json").exists()


def test_log_partition_leader(tmp_path):
    result = _run(tmp_path, workload="log", nemesis=("partition-leader", "partition-majorities-ring"))
    events = _assert_well_formed(result)
    _assert_leadership_moved(result)
    starts = [e for e in events if e["f"] == "start-partition"]
    assert starts and starts[0]["value"]["cut"], "the partition cut no link"
    results = _checked(result)
    assert result.valid is True, f"anomalies: {results.get('anomalies')}"


def test_register_kill_leader(tmp_path):
    result = _run(tmp_path, workload="register", nemesis=("kill-leader",))
    events = _assert_well_formed(result)
    _assert_leadership_moved(result)
    oks = Counter(e["f"] for e in events if e["type"] == "ok")
    assert oks["read"] > 20 and oks["write"] > 20 and oks["cas"] > 0
    assert result.summary["workload"]["ack_mismatches"] == 0
    results = _checked(result)
    assert result.valid is True, f"anomalies: {results.get('anomalies')}"


def test_pysyncobj_log_with_faults_through_the_cli(tmp_path):
    """The same harness and checker on a system no one here wrote, through ``jepsen run``'s command."""
    args = [
        "--system",
        "pysyncobj",
        "--workload",
        "log",
        "--nemesis",
        "kill-leader,partition-leader",
        "--time",
        "10",
        "--interval",
        "2",
        "--rate",
        "30",
        "--clients",
        "4",
        "--seed",
        "3",
        "--out",
        str(tmp_path),
        "--no-progress",
    ]
    res = CliRunner().invoke(run_command, args, catch_exceptions=False)
    out = res.output
    assert "verdict" in out and "report" in out, out
    run_dir = next((tmp_path / "pysyncobj-log-kill-leader+partition-leader").glob("2*"))
    summary = json.loads((run_dir / "run.json").read_text())
    assert summary["leaders"]["leader_changes"] >= 1, summary["leaders"]
    assert (
        summary["nemesis"]["ops"].get("kill") == 1 and summary["nemesis"]["ops"].get("start-partition") == 1
    )
    assert validate_history(read_history(run_dir)) == []
    assert summary["check"]["valid"] is not None, summary["check"]["output"]
    assert (run_dir / "report.html").exists()
    # pysyncobj is expected to hold up; if it does not, the checker's anomalies are the finding.
    assert res.exit_code == 0 and summary["valid"] is True, (out, summary["check"].get("results"))


def test_a_client_that_acks_unsent_writes_is_caught(tmp_path):
    result = _run(tmp_path, workload="log", nemesis=(), broken_adapter="ack-unsent", time=5)
    results = _checked(result)
    assert result.valid is False
    assert "lost-write" in results.get("anomaly-types", []), results
    assert result.exit_code == 1


def test_a_register_client_that_reads_its_own_replica_is_caught(tmp_path):
    result = _run(tmp_path, workload="register", nemesis=(), broken_adapter="local-reads", time=5)
    results = _checked(result)
    assert result.valid is False
    assert results.get("anomaly-types") == ["nonlinearizable"], results
