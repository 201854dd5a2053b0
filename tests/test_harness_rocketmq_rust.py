"""``jepsen run --system rocketmq-rust``: the harness on RocketMQ-Rust's nameserver and master/slave brokers.

The binaries come from ``scripts/build-rocketmq-rust.sh`` (a 20-minute cargo build into a
cache folder outside the repository); where they are absent, as in CI, the tests that run
them are skipped with a reason that names the script. The checks that need no binaries
(the error a user gets without them, the CLI's option rules) always run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from jepsen.history import read_history, validate_history
from jepsen.systems.base import Unsupported
from jepsen.systems.rocketmq_rust import (
    BROKER_BIN,
    BROKER_NAME,
    BUILD_SCRIPT,
    DIR_ENV,
    NAMESRV_BIN,
    RocketMQRustBackend,
    find_binaries,
    rust_dir,
)

RUN_TIMEOUT_S = 300


def _binaries_missing() -> str | None:
    try:
        find_binaries()
    except Unsupported as exc:
        return str(exc)
    return None


MISSING = _binaries_missing()
needs_binaries = pytest.mark.skipif(
    MISSING is not None,
    reason=f"RocketMQ-Rust binaries not built (run {BUILD_SCRIPT} once): {MISSING}",
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes (its parent has not reaped it yet)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _processes_under(folder: Path) -> list[int]:
    """PIDs of live processes whose command line names ``folder`` (the run's configs and stores)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in cmdline and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _reap(pids: list[int]) -> None:
    """Kill what a failed run left behind (by PID), so one failure does not leak processes."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _jepsen(out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jepsen.run.run_cli",
            "--out",
            str(out),
            "--no-progress",
            "--seed",
            "7",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    run_dir = next(
        (Path(ln.split(None, 1)[1]).parent for ln in proc.stdout.splitlines() if ln.startswith("history ")),
        out,
    )
    return proc, run_dir


# ---------------------------------------------------------------------------- no binaries needed


def test_missing_binaries_are_refused_with_the_build_script_named(tmp_path, monkeypatch):
    with pytest.raises(Unsupported, match=BUILD_SCRIPT.replace(".", r"\.")) as err:
        find_binaries(tmp_path)
    assert NAMESRV_BIN in str(err.value) and BROKER_BIN in str(err.value)
    (tmp_path / "bin").mkdir()
    for name in (NAMESRV_BIN, BROKER_BIN):
        (tmp_path / "bin" / name).write_text("#!/bin/sh\n")
    with pytest.raises(Unsupported, match="needs rocketmq-namesrv-rust and rocketmq-broker-rust"):
        find_binaries(tmp_path)  # present but not executable
    for name in (NAMESRV_BIN, BROKER_BIN):
        (tmp_path / "bin" / name).chmod(0o755)
    assert find_binaries(tmp_path) == {n: tmp_path / "bin" / n for n in (NAMESRV_BIN, BROKER_BIN)}
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    assert rust_dir() == tmp_path


def test_cli_without_binaries_says_how_to_build_them(tmp_path):
    env = {**os.environ, DIR_ENV: str(tmp_path / "empty")}
    proc = subprocess.run(
        [sys.executable, "-m", "jepsen.run.run_cli", "--out", str(tmp_path), "--system", "rocketmq-rust"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert BUILD_SCRIPT in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_cli_refuses_options_of_an_external_cluster(tmp_path):
    proc = subprocess.run(
        [
            sys.executable, "-m", "jepsen.run.run_cli", "--out", str(tmp_path),
            "--system", "rocketmq-rust", "--namesrv", "127.0.0.1:9876",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "starts its own cluster" in proc.stderr, proc.stderr


def test_configs_name_the_roles_and_route_replication_through_the_proxy(tmp_path):
    from jepsen.net.proxy import LinkProxy

    bins = tmp_path / "rust" / "bin"
    bins.mkdir(parents=True)
    for name in (NAMESRV_BIN, BROKER_BIN):
        (bins / name).write_text("#!/bin/sh\nexit 1\n")
        (bins / name).chmod(0o755)
    backend = RocketMQRustBackend(tmp_path / "cluster", bin_dir=tmp_path / "rust", queues=3)
    assert backend.nodes == ["n1", "n2", "n3"] and backend.queues == 3
    backend.proxy = LinkProxy(backend.peer_addresses())
    try:
        backend.write_configs()
        conf = {
            n: tomllib.loads((tmp_path / "cluster" / n / "broker.toml").read_text()) for n in backend.nodes
        }
        ids = [conf[n]["broker"]["brokerIdentity"]["brokerId"] for n in backend.nodes]
        assert ids == [0, 1, 2]
        for n, role in zip(backend.nodes, ["SYNC_MASTER", "SLAVE", "SLAVE"], strict=True):
            # both sections: the broker-level role decides whether a slave replicates at all
            assert conf[n]["broker"]["brokerRole"] == conf[n]["store"]["brokerRole"] == role
        assert "haMasterAddress" not in conf["n1"]["store"]
        for n in ("n2", "n3"):  # each slave reaches the master's HA port through its own cuttable link
            assert (
                conf[n]["store"]["haMasterAddress"] == backend.proxy.address(n, "n1") != backend.ha_addr["n1"]
            )
        assert {conf[n]["broker"]["namesrvAddr"] for n in backend.nodes} == {backend.namesrv_addr}
        assert len({conf[n]["store"]["storePathRootDir"] for n in backend.nodes}) == 3
        assert (
            conf["n1"]["store"]["inSyncReplicas"] == 2
            and conf["n1"]["store"]["flushDiskType"] == "SYNC_FLUSH"
        )
        b2 = conf["n2"]["broker"]
        assert f"{b2['brokerIp1']}:{b2['listenPort']}" == backend.broker_addr["n2"]
    finally:
        backend.proxy.close()
    with pytest.raises(Unsupported, match="slaves"):
        RocketMQRustBackend(tmp_path / "c2", bin_dir=tmp_path / "rust", slaves=0)


# ---------------------------------------------------------------------------- with the binaries


@pytest.mark.slow
@needs_binaries
def test_start_routes_a_master_and_two_slaves_and_stop_leaves_no_process(tmp_path):
    import asyncio

    backend = RocketMQRustBackend(tmp_path / "cluster")
    pids: list[int] = []
    try:
        backend.start()
        pids = [p for p in (backend.procs.pid(n) for n in ["namesrv", *backend.nodes]) if p]
        assert len(pids) == 4, pids
        statuses = asyncio.run(backend.statuses())
        assert {n: (s or {}).get("role") for n, s in statuses.items()} == {
            "n1": "leader",
            "n2": "follower",
            "n3": "follower",
        }, statuses
        assert asyncio.run(backend.wait_for_leader(10)) == "n1"
        target = json.loads((tmp_path / "cluster" / "target.json").read_text())
        assert target["broker_name"] == BROKER_NAME and target["master"] == backend.broker_addr["n1"]
        deadline = time.monotonic() + 15  # each slave's HA connection to the master crosses its link
        while time.monotonic() < deadline:
            stats = backend.proxy.stats()
            if stats["n2->n1"]["accepted"] and stats["n3->n1"]["accepted"]:
                break
            time.sleep(0.2)
        assert stats["n2->n1"]["accepted"] >= 1 and stats["n3->n1"]["accepted"] >= 1, stats
        backend.kill("n1")
        assert not backend.procs.is_running("n1") and asyncio.run(backend.statuses())["n1"] is None
        backend.restart("n1")
        assert asyncio.run(backend.wait_for_leader(30)) == "n1"
        pids.append(backend.procs.pid("n1") or 0)
    finally:
        backend.stop()
        backend.cleanup_data()
    left = [p for p in pids if p and _alive(p)] + _processes_under(tmp_path)
    _reap(left)
    assert not left, f"processes left after stop: {left}"


@pytest.mark.slow
@needs_binaries
def test_queue_run_without_faults_is_checked(tmp_path):
    proc, run_dir = _jepsen(tmp_path, "--system", "rocketmq-rust", "--time", "10", "--nemesis", "none")
    left = _processes_under(tmp_path)
    _reap(left)
    assert proc.returncode in (0, 1, 2), proc.stdout + proc.stderr  # 3: not checked / harness error
    assert "verdict   " in proc.stdout and "NOT CHECKED" not in proc.stdout, proc.stdout
    assert not left, f"processes left after the run: {left}"
    events = read_history(run_dir)
    assert validate_history(events) == []
    ok_sends = [e for e in events if e["f"] == "send" and e["type"] == "ok"]
    assert len(ok_sends) > 50, proc.stdout
    results = json.loads((run_dir / "results.json").read_text())
    assert results.get("valid") in (True, False, "unknown"), results


@pytest.mark.slow
@needs_binaries
def test_queue_run_with_the_master_killed_is_checked(tmp_path):
    proc, run_dir = _jepsen(
        tmp_path, "--system", "rocketmq-rust", "--time", "15", "--interval", "3", "--nemesis", "kill-leader"
    )
    left = _processes_under(tmp_path)
    _reap(left)
    assert proc.returncode in (0, 1, 2), proc.stdout + proc.stderr
    assert "verdict   " in proc.stdout and "NOT CHECKED" not in proc.stdout, proc.stdout
    assert not left, f"processes left after the run: {left}"
    events = read_history(run_dir)
    assert validate_history(events) == []
    nemesis = [e for e in events if e["process"] == "nemesis" and "error" not in e]
    kills = [e["value"] for e in nemesis if e["f"] == "kill" and e["type"] == "info"]
    assert kills and all(k["nodes"] == ["n1"] and k["leader"] == "n1" for k in kills), nemesis
    assert any(e["f"] == "restart" for e in nemesis), nemesis
    results = json.loads((run_dir / "results.json").read_text())
    assert results.get("valid") in (True, False, "unknown"), results
