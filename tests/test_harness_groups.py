"""Several broker groups under test (``jepsen run --groups N``): real processes, real faults.

The slow tests run the ``jepsen run`` command as a user would, watch its process tree while
it runs (which sockets every descendant listens on) and check afterwards that the verdict
is valid, that the history's node names and keys carry both groups' broker names, that both
groups stored messages and that every process the run started is gone. The fast tests pin
down the option checks and the nemesis's choice of groups without starting anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from common.ports import PortPlan, PortPlanError
from jepsen.checker.recovery import key_group, node_group, summarize
from jepsen.faults.schedule import Nemesis
from jepsen.history import History, read_history

RUN_TIMEOUT_S = 150  # one short run: start-up, 10 s of load and faults, drain, check
WATCH_PERIOD_S = 0.5
PORT_SPAN = 64  # ports a 2-group run may take from its base (it needs 32)


def _jepsen(*args: str) -> list[str]:
    return [sys.executable, "-m", "jepsen", "run", "--workload", "queue", "--no-progress", *args]


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc's parent links)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = set(), {pid}
    for _ in range(64):  # depth bound
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        if not frontier:
            break
        out |= frontier
    return out


def _listening_ports(pids: set[int]) -> set[int]:
    """TCP ports the processes ``pids`` listen on (sockets from /proc/<pid>/fd, states from /proc/net/tcp)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
            ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _watched_run(args: list[str]) -> tuple[subprocess.CompletedProcess[str], set[int], set[int]]:
    """Run the command; returns its result, every descendant seen and every port they listened on."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    ports: set[int] = set()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            kids = _children(proc.pid)
            seen |= kids
            ports |= _listening_ports(kids)
            time.sleep(WATCH_PERIOD_S)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return subprocess.CompletedProcess(args, proc.returncode, out, err), seen, ports


def _events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's events whichever format recorded them (``read_history`` of the run folder)."""
    return read_history(run_dir)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_events_reads_a_run_in_either_shard_format(tmp_path: Path, suffix: str) -> None:
    hist = tmp_path / "history"
    controller = History(hist / f"shard-00{suffix}", shards=2)
    controller.nemesis_start("kill", {"nodes": ["broker-a/n1"]})
    controller.nemesis_end("kill", {"nodes": ["broker-a/n1"]})
    worker = History(hist / f"shard-01{suffix}", controller.clock_origin_ns, shard=1, shards=2)
    for v in range(3):
        p = worker.new_process()
        worker.invoke(p, "send", v, key="broker-a/q0")
        worker.complete(p, "ok", "send", v, key="broker-a/q0", offset=v)
    worker.close()
    controller.close()
    events = _events(tmp_path)
    assert [e["f"] for e in events if e["process"] == "nemesis"] == ["kill", "kill"]
    assert events[0]["value"] == {"nodes": ["broker-a/n1"]}
    assert sorted(e["value"] for e in events if e["f"] == "send" and e["type"] == "ok") == [0, 1, 2]


def _run_dir(stdout: str) -> Path:
    line = next(x for x in stdout.splitlines() if x.startswith("history"))
    path = Path(line.split(None, 1)[1])
    return path.parent


def _free_base() -> int:
    """A port base with ``PORT_SPAN`` free ports above it on the hosts a run uses (below the ephemeral range)."""
    rng = random.Random()
    for _ in range(50):
        base = rng.randrange(20000, 30000 - PORT_SPAN)
        free = True
        for host in ("127.0.0.1", "127.0.0.2", "127.0.0.3"):
            for p in range(base, base + PORT_SPAN):
                with socket.socket() as s:
                    try:
                        s.bind((host, p))
                    except OSError:
                        free = False
                        break
            if not free:
                break
        if free:
            return base
    pytest.skip("no free port range for the --port-base run")


def _assert_two_groups(res: subprocess.CompletedProcess[str], seen: set[int]) -> list[dict[str, Any]]:
    assert res.returncode == 0, f"run failed ({res.returncode}):\n{res.stdout}\n{res.stderr[-3000:]}"
    assert "verdict   VALID" in res.stdout
    run_dir = _run_dir(res.stdout)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True
    events = _events(run_dir)
    nodes = {e["node"] for e in events if e.get("node")}
    assert {n.split("/")[0] for n in nodes} == {"broker-a", "broker-b"}, nodes
    ok_sends = [e for e in events if e["f"] == "send" and e["type"] == "ok"]
    assert {key_group(e["key"]) for e in ok_sends} == {"broker-a", "broker-b"}
    drained = json.loads((run_dir / "run.json").read_text())["workload"]["drained_by_group"]
    assert drained["broker-a"] > 0 and drained["broker-b"] > 0, drained
    kills = [e for e in events if e["process"] == "nemesis" and e["f"] == "kill"]
    assert kills, "the nemesis killed nothing"
    assert all(node_group(n) for e in kills for n in e["value"]["nodes"])
    faults = results["faults"]
    assert faults and all(f.get("groups") for f in faults)
    assert all(node_group(n) in {"broker-a", "broker-b"} for f in faults for n in f["nodes"])
    assert seen, "the run started no processes?"
    left = sorted(p for p in seen if _alive(p))
    assert not left, f"processes outlived the run: {left}"
    return events


@pytest.mark.slow
def test_two_groups_kill_leader(tmp_path: Path) -> None:
    res, seen, _ = _watched_run(
        _jepsen(
            "--groups", "2", "--nemesis", "kill-leader", "--time", "10", "--interval", "2",
            "--seed", "3", "--out", str(tmp_path),
        )
    )  # fmt: skip
    events = _assert_two_groups(res, seen)
    kills = [e for e in events if e["process"] == "nemesis" and e["f"] == "kill"]
    for e in kills:  # --fault-scope one: each kill is one group's leader
        assert len(e["value"]["nodes"]) == 1 and len(e["value"]["broker_groups"]) == 1


@pytest.mark.slow
def test_two_groups_all_scope_on_planned_ports(tmp_path: Path) -> None:
    base = _free_base()
    res, seen, ports = _watched_run(
        _jepsen(
            "--groups", "2", "--fault-scope", "all", "--nemesis", "kill-leader,partition-leader",
            "--time", "10", "--interval", "2", "--port-base", str(base), "--workers", "2",
            "--seed", "5", "--out", str(tmp_path),
        )
    )  # fmt: skip
    events = _assert_two_groups(res, seen)
    kills = [e for e in events if e["process"] == "nemesis" and e["f"] == "kill"]
    for e in kills:  # --fault-scope all: every group's leader at once
        assert {node_group(n) for n in e["value"]["nodes"]} == {"broker-a", "broker-b"}
    # 2 nameservers, 6 brokers (fast, ledger, main) and 12 ledger links, all from the base
    assert len(ports) >= 2 + 6 * 3 + 12, sorted(ports)
    assert all(base <= p < base + PORT_SPAN for p in ports), (base, sorted(ports))


@pytest.mark.parametrize("groups", ["0", "100", "x"])
def test_bad_groups_is_one_clear_line(tmp_path: Path, groups: str) -> None:
    res = subprocess.run(
        _jepsen("--groups", groups, "--out", str(tmp_path)), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert "Traceback" not in res.stderr
    assert any("--groups" in x for x in lines), res.stderr
    if groups != "x":  # click's own message for a non-number has its usage lines too
        assert len(lines) == 1 and "1..26" in lines[0], res.stderr


def test_taken_port_base_is_refused(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        res = subprocess.run(
            _jepsen("--groups", "2", "--port-base", str(taken), "--out", str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert f"127.0.0.1:{taken} is in use" in res.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--host-base", "10.0.0.1"], "loopback"),
        (["--port-base", "80"], "outside"),
        (["--addresses", "127.0.0.1:abc"], "must be a number"),
        (["--addresses", "127.0.0.1:21000", "--port-base", "21000"], "one or the others"),
        (["--system", "pysyncobj", "--groups", "2"], "--system broker"),
    ],
)
def test_bad_placement_options(tmp_path: Path, args: list[str], needle: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "jepsen", "run", "--no-progress", "--out", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_port_plan_hands_out_from_its_base() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1] + 1  # the next ones are very likely free; checked below either way
    plan = PortPlan("127.0.0.5", base)
    try:
        first = plan.block("127.0.0.1", 3)
        second = plan.port("127.0.0.1")
    except PortPlanError:
        pytest.skip("the ports after a fresh one were taken")
    assert (first, second) == (base, base + 3)
    assert plan.span == (base, base + 3)
    assert plan.host(2) == "127.0.0.7"
    with pytest.raises(PortPlanError, match="loopback"):
        PortPlan("192.168.1.1")


class _Groups:
    """What the nemesis asks a backend for when it aims a fault, for two groups of three."""

    system = "broker"
    directed_links = True
    supports_corruption = supports_delay = supports_loss = True

    def __init__(self) -> None:
        self.groups = {g: [f"{g}/n{k}" for k in (1, 2, 3)] for g in ("broker-a", "broker-b")}
        self.nodes = [n for m in self.groups.values() for n in m]
        self.killed: set[str] = set()
        self.cut: set[tuple[str, str]] = set()

    def node_groups(self) -> dict[str, list[str]]:
        return self.groups

    async def leader(self, among: list[str] | None = None) -> str | None:
        return (among or self.nodes)[1]

    def kill(self, nid: str) -> None:
        self.killed.add(nid)

    def set_cut(self, links: set[tuple[str, str]]) -> None:
        self.cut = set(links)


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def now_ns(self) -> int:
        return 0

    def nemesis_start(self, f: str, value: Any) -> None:
        self.events.append((f, value))

    def nemesis_end(self, f: str, value: Any, error: str | None = None) -> None:
        assert error is None, error


@pytest.mark.parametrize("scope", ["one", "all"])
def test_nemesis_aims_at_one_or_all_groups(scope: str) -> None:
    backend, rec = _Groups(), _Recorder()
    nem = Nemesis(backend, rec, ["kill-leader"], 1.0, random.Random(1), fault_scope=scope)  # type: ignore[arg-type]
    asyncio.run(nem.start_fault("kill-leader"))
    want = {"broker-a/n2", "broker-b/n2"} if scope == "all" else None
    if want:
        assert backend.killed == want
    else:
        assert len(backend.killed) == 1 and backend.killed <= {"broker-a/n2", "broker-b/n2"}
    f, value = rec.events[0]
    assert f == "kill" and set(value["nodes"]) == backend.killed
    assert len(value["broker_groups"]) == (2 if scope == "all" else 1)


def test_partition_across_groups_cuts_only_links_within_groups() -> None:
    backend, rec = _Groups(), _Recorder()
    nem = Nemesis(backend, rec, ["partition-random-halves"], 1.0, random.Random(4), fault_scope="all")  # type: ignore[arg-type]
    for seed in range(10):
        nem.ctx.rng = random.Random(seed)
        asyncio.run(nem.start_fault("partition-random-halves"))
        assert all(node_group(a) == node_group(b) for a, b in backend.cut)
    with pytest.raises(ValueError, match="fault scope"):
        Nemesis(backend, rec, [], 1.0, random.Random(1), fault_scope="some")  # type: ignore[arg-type]


def test_recovery_is_split_by_group() -> None:
    assert key_group("JepsenQueue/broker-b/1") == "broker-b"
    assert key_group("JepsenQueue/1") is None and node_group("n1") is None
    faults = [
        {"kind": "kill-leader", "recovery_ms": 90.0, "gap_ms": 5.0, "groups": ["broker-a"],
         "recovery_ms_by_group": {"broker-a": 90.0, "broker-b": 3.0}},
        {"kind": "kill-leader", "recovery_ms": None, "gap_ms": 7.0, "groups": ["broker-b"],
         "recovery_ms_by_group": {"broker-a": 2.0, "broker-b": None}},
    ]  # fmt: skip
    by = summarize(faults)["kill-leader"]["by_group"]
    assert by["broker-a"] == {"faults": 1, "recovered": 1, "recovery_p50_ms": 90.0, "recovery_max_ms": 90.0}
    assert by["broker-b"]["recovered"] == 0 and by["broker-b"]["recovery_max_ms"] is None
