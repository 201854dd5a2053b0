"""``jepsen probe`` as a user runs it: a subprocess that stands up a local group (ACL on, the
nameserver holding the cluster secret), probes every listener with every probe, prints the
table and a JSON line, and stops the group; a ledger group without a cluster secret, whose
forged-peer and forged-client probes must fail the run; a ledger group that takes no client
without the secret, probed with and without it; and the pieces the command is built from."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from jepsen.probe.base import Account, Limits
from jepsen.probe.suite import PROBES as REGISTRY
from ledger.localcluster import LocalCluster

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
    "ledger-no-secret",
    "namesrv-register",
    "trickle",
    "compressed-body",
    "int-range",
    "nested-heartbeat",
    "acl-bypass",
    "max-message",
    "pipelined-pulls",
    "client-flood",
    "unappliable-entry",
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


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_probe_of_a_local_group_passes_every_row(tmp_path: Path) -> None:
    done, summary = run_probe("--work-dir", str(tmp_path / "group"))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary["probes"]
    assert summary["not_run"] == {}, summary["not_run"]  # the local group gives every probe what it needs
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


@pytest.mark.slow
@pytest.mark.timeout(150)
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
    assert verdicts["ledger-no-secret"] == "FAIL", summary  # it takes clients without the secret too
    assert verdicts["garbage"] == verdicts["slowloris"] == "pass", summary
    assert verdicts["dedup-growth"] == "skip"
    assert summary["failed"] >= 1


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_probe_of_a_ledger_that_takes_no_client_without_the_secret(tmp_path: Path) -> None:
    """Given the secret, every ledger probe runs and passes; without it the probes that must ask
    the node something are skipped, and "still serves" becomes "still accepts connections",
    instead of failing a node for refusing the probe itself."""
    cluster = LocalCluster(tmp_path / "closed", 2, settings={"client_auth": True, "handshake_timeout_s": 1.0})
    cluster.start()
    try:
        asyncio.run(cluster.wait_for_leader())
        addr = cluster.address("n1")
        common = ("--ledger", addr, "--ledger-handshake-timeout-s", "1")
        blind, blind_summary = run_probe(*common, timeout=90)
        secret_file = cluster.settings["cluster_secret_file"]
        told, told_summary = run_probe(*common, "--cluster-secret-file", secret_file, timeout=90)
        _, one_summary = run_probe(*common, "--only", "ledger-no-secret", timeout=60)
    finally:
        cluster.stop()
    assert blind.returncode == 0, blind.stdout + blind.stderr
    verdicts = {r["probe"]: r["result"] for r in blind_summary["probes"]}
    assert verdicts["ledger-no-secret"] == verdicts["garbage"] == verdicts["slowloris"] == "pass"
    assert verdicts["flood"] == verdicts["peer-old-hello"] == verdicts["peer-wrong-secret"] == "skip"
    garbage = next(r for r in blind_summary["probes"] if r["probe"] == "garbage")
    assert "still accepts connections" in garbage["outcome"], garbage
    assert told.returncode == 0, told.stdout + told.stderr
    rows = [r for r in told_summary["probes"] if r["probe"] != "dedup-growth"]
    assert rows and all(r["result"] == "pass" for r in rows), rows
    assert all("still serves" in r["outcome"] for r in rows), rows
    assert [r["probe"] for r in one_summary["probes"]] == ["ledger-no-secret"]  # --only


def test_every_probe_is_registered_once() -> None:
    names = [name for name, _ in REGISTRY]
    assert len(names) == len(set(names))
    assert set(names) - {"malformed", "peer-hello"} <= PROBES  # those two register several rows


def test_accounts_are_read_from_the_option_or_a_file(tmp_path: Path) -> None:
    assert Account.parse("ak:s:k", "--acl-admin") == Account("ak", "s:k")
    path = tmp_path / "admin"
    path.write_text("ops:a-long-secret\nignored\n")
    assert Account.parse(f"@{path}", "--acl-admin") == Account("ops", "a-long-secret")
    for bad in ("no-colon", ":secret", "key:", f"@{tmp_path / 'missing'}"):
        with pytest.raises(ValueError, match="--acl-user"):
            Account.parse(bad, "--acl-user")
    assert "a-long-secret" not in repr(Account("ops", "a-long-secret"))


def test_the_output_bound_a_probe_expects_is_the_brokers() -> None:
    """The pipelined-pulls probe sizes its attack by the broker's max_output_bytes: the value it
    assumes for a broker with default settings must be the one the broker computes."""
    conf = BrokerConfig("b", "n1", ["n1=127.0.0.1:10911@127.0.0.1:20911"], "127.0.0.1:9876", "/tmp/unused")
    assert Limits().output_limit_bytes == conf.remoting_config().output_limit_bytes
    assert Limits(max_output_bytes=16 << 20).output_limit_bytes == 16 << 20
