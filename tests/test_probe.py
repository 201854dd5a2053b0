"""``jepsen probe`` as a user runs it: a subprocess that stands up a local group, probes every
listener, prints the table and a JSON line, and stops the group; and a group without a
cluster secret, whose forged-peer probes must fail the run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.localcluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]
REPO = Path(__file__).resolve().parent.parent
PROBES = {
    "garbage",
    "oversize-length",
    "truncated-header",
    "bad-json-header",
    "unknown-code",
    "slowloris",
    "flood",
    "peer-old-hello",
    "peer-wrong-secret",
    "heartbeat-growth",
    "dedup-growth",
}


def run_probe(*args: str, timeout: float = 100) -> tuple[subprocess.CompletedProcess[str], dict]:
    done = subprocess.run(
        [sys.executable, "-m", "jepsen", "probe", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    return done, json.loads(lines[-1])


def test_probe_of_a_local_group_passes_every_row(tmp_path: Path) -> None:
    done, summary = run_probe("--work-dir", str(tmp_path / "group"))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary["probes"]
    assert {r["probe"] for r in rows} == PROBES
    assert all(r["result"] == "pass" for r in rows), [r for r in rows if r["result"] != "pass"]
    assert summary["failed"] == 0 and summary["passed"] == len(rows)
    kinds = {r["target"].split("@")[0] for r in rows if r["probe"] == "garbage"}
    assert kinds == {"namesrv", "broker", "broker-fast", "ledger"}
    table = done.stdout.splitlines()[0].split()
    assert table == ["probe", "target", "expected", "outcome", "result"]
    for probe in PROBES:
        assert any(line.startswith(probe + " ") for line in done.stdout.splitlines()), probe
    # the group it stood up is gone: nothing still runs from its directory
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert str(tmp_path / "group") not in ps


def test_probe_fails_a_ledger_that_accepts_unauthenticated_peers(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "open", 2, settings={"cluster_secret": "", "handshake_timeout_s": 1.0})
    cluster.start()
    try:
        leader = asyncio.run(cluster.wait_for_leader())
        follower = next(n for n in cluster.ids if n != leader)  # claims to be the leader, a real member
        done, summary = run_probe(
            "--ledger", cluster.address(follower), "--ledger-handshake-timeout-s", "1", timeout=60
        )
    finally:
        cluster.stop()
    assert done.returncode == 1, done.stdout + done.stderr
    verdicts = {r["probe"]: r["result"] for r in summary["probes"]}
    assert verdicts["peer-old-hello"] == "FAIL", summary
    assert verdicts["garbage"] == verdicts["slowloris"] == "pass", summary
    assert verdicts["dedup-growth"] == "skip"
    assert summary["failed"] >= 1
