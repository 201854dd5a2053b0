"""``jepsen run --system rocketmq``: the harness pointed at a RocketMQ-protocol cluster it did not start.

The cluster is ``broker local-cluster`` run as a user would (a child process printing its
nameserver); the harness reaches it only through that address, and kills a broker only
through the user's command hook (``kill -9`` of the PID file local-cluster writes). The
checker must find the histories valid and the hook's kills and restarts must be in them.
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

from jepsen.history import read_history, read_shards, validate_history
from jepsen.systems.base import Unsupported
from jepsen.systems.broker import BrokerQueueClient
from jepsen.systems.rocketmq import Hooks, RocketMQBackend, check_faults, parse_nodes
from remoting.protocol import SERIALIZE_JSON

READY_TIMEOUT_S = 90
RUN_TIMEOUT_S = 240


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory):
    """``broker local-cluster`` (one group) as a child; yields (namesrv, dir, node -> broker address)."""
    base = tmp_path_factory.mktemp("rmq-cluster")
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "local-cluster", "--dir", str(base), "--namesrv-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    restarted = base / "restarted.pids"
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        assert first.startswith("namesrv=127.0.0.1:"), first
        lines: list[str] = []
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"local-cluster exited early: {lines}"
            lines.append(line.strip())
            if line.startswith("ready:"):
                break
        else:
            pytest.fail(f"local-cluster not ready in {READY_TIMEOUT_S}s: {lines}")
        conf = tomllib.loads((base / "broker-a" / "n1" / "broker.toml").read_text())
        addrs = {}
        for item in conf["group"]:  # n1=BROKER@LEDGER
            nid, rest = item.split("=", 1)
            addrs[nid] = rest.split("@", 1)[0]
        yield first.split("=", 1)[1], base, addrs
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        # brokers the restart hook started are this test's to stop (by the PIDs it recorded)
        if restarted.exists():
            for pid in {int(x) for x in restarted.read_text().split()}:
                if _alive(pid):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            for pid in {int(x) for x in restarted.read_text().split()}:
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)


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
    if run_dir.name == "history":  # sharded: history/ is a folder in the run directory
        run_dir = run_dir.parent
    return proc, run_dir


@pytest.mark.slow
def test_no_nemesis_run_against_a_local_cluster_is_valid(local_cluster, tmp_path):
    namesrv, _base, _addrs = local_cluster
    proc, run_dir = _jepsen(tmp_path, "--system", "rocketmq", "--namesrv", namesrv, "--time", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict   VALID" in proc.stdout and "faults    none" in proc.stdout, proc.stdout
    target = json.loads((run_dir / "cluster" / "target.json").read_text())
    assert target["broker_name"] == "broker-a" and target["topic"].startswith("JepsenQueue-")
    events = read_history(run_dir)
    assert validate_history(events) == []
    assert not [e for e in events if e["process"] == "nemesis"]
    keys = {e.get("key") for e in events}
    assert keys == {f"{target['topic']}/0", f"{target['topic']}/1"}, keys
    ok_sends = {e["value"] for e in events if e["f"] == "send" and e["type"] == "ok"}
    drained = {v for e in events if e["f"] == "drain" and e["type"] == "ok" for _, v in e["value"]}
    assert len(ok_sends) > 50 and ok_sends == drained


@pytest.mark.slow
def test_kill_hook_kills_the_master_by_pid_and_the_run_stays_valid(local_cluster, tmp_path):
    namesrv, base, addrs = local_cluster
    group = base / "broker-a"
    restarted = base / "restarted.pids"
    pids_before = {n: int((group / n / "broker.pid").read_text()) for n in addrs}
    kill = f"kill -9 $(cat {group}/{{node}}/broker.pid)"
    restart = (
        f"{sys.executable} -m broker --config {group}/{{node}}/broker.toml >> {group}/{{node}}/broker.log 2>&1 & "
        f"echo $! > {group}/{{node}}/broker.pid; echo $! >> {restarted}"
    )
    nodes = ",".join(f"{n}={a}" for n, a in sorted(addrs.items()))
    proc, run_dir = _jepsen(
        tmp_path,
        "--system", "rocketmq", "--namesrv", namesrv, "--time", "8", "--interval", "2",
        "--nemesis", "kill-leader", "--nodes", nodes, "--kill-cmd", kill, "--restart-cmd", restart,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict   VALID" in proc.stdout, proc.stdout
    events = read_history(run_dir)
    assert validate_history(events) == []
    nemesis = [e for e in events if e["process"] == "nemesis"]
    kills = [e for e in nemesis if e["f"] == "kill" and "error" not in e]
    restarts = [e for e in nemesis if e["f"] == "restart" and "error" not in e]
    assert kills and restarts, nemesis
    killed = kills[0]["value"]["nodes"][0]
    assert kills[0]["value"]["leader"] == killed  # the master, told apart through --nodes' addresses
    assert not _alive(pids_before[killed]), "the hook did not kill the master's process"
    assert restarted.exists() and _alive(int((group / killed / "broker.pid").read_text()))
    hooks_log = (run_dir / "cluster" / "hooks.log").read_text()
    assert f"kill {killed}: kill -9 $(cat {group}/{killed}/broker.pid)" in hooks_log
    assert "exit 0" in hooks_log
    ok_sends = {e["value"] for e in events if e["f"] == "send" and e["type"] == "ok"}
    drained = {v for e in events if e["f"] == "drain" and e["type"] == "ok" for _, v in e["value"]}
    assert ok_sends and ok_sends <= drained
    leaders = json.loads((run_dir / "run.json").read_text())["leaders"]
    assert leaders["leader_changes"] >= 1, leaders  # the master moved: the fault really bit


@pytest.mark.slow
def test_pause_hooks_stop_and_continue_the_master(local_cluster, tmp_path):
    namesrv, base, addrs = local_cluster
    group = base / "broker-a"
    nodes = ",".join(f"{n}={a}" for n, a in sorted(addrs.items()))
    proc, run_dir = _jepsen(
        tmp_path,
        "--system", "rocketmq", "--namesrv", namesrv, "--time", "8", "--interval", "2",
        "--nemesis", "pause-leader", "--nodes", nodes,
        "--pause-cmd", f"kill -STOP $(cat {group}/{{node}}/broker.pid)",
        "--resume-cmd", f"kill -CONT $(cat {group}/{{node}}/broker.pid)",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict   VALID" in proc.stdout, proc.stdout
    nemesis = [e for e in read_history(run_dir) if e["process"] == "nemesis"]
    paused = [e["value"]["nodes"] for e in nemesis if e["f"] == "pause" and "error" not in e]
    resumed = [e["value"]["nodes"] for e in nemesis if e["f"] == "resume" and "error" not in e]
    assert paused and resumed and paused[-1] == resumed[-1], nemesis
    for n in addrs:  # every broker runs again (state R or S, not T)
        state = Path(f"/proc/{int((group / n / 'broker.pid').read_text())}/stat").read_text().split()[2]
        assert state != "T", (n, state)


@pytest.mark.slow
def test_full_rate_run_records_sharded_histories(local_cluster, tmp_path):
    namesrv, _base, _addrs = local_cluster
    proc, run_dir = _jepsen(
        tmp_path,
        "--system",
        "rocketmq",
        "--namesrv",
        namesrv,
        "--time",
        "4",
        "--rate",
        "max",
        "--workers",
        "2",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict   VALID" in proc.stdout and "workers   2 processes" in proc.stdout, proc.stdout
    shards = sorted(read_shards(run_dir))  # by name, whichever format recorded them
    assert shards == ["shard-00", "shard-01", "shard-02"]


# ---------------------------------------------------------------------------- no cluster needed


def test_faults_need_the_users_hooks_and_partitions_are_refused():
    nodes = parse_nodes("a=127.0.0.1:10911,b")
    assert [(n.name, n.addr, n.host) for n in nodes] == [
        ("a", "127.0.0.1:10911", "127.0.0.1"),
        ("b", None, "b"),
    ]
    with pytest.raises(Unsupported, match="needs --kill-cmd and --restart-cmd"):
        check_faults(("kill-leader",), Hooks(), nodes)
    with pytest.raises(Unsupported, match="go together"):
        check_faults((), Hooks(kill="true"), nodes)
    with pytest.raises(Unsupported, match="network or disks"):
        check_faults(("partition-leader",), Hooks(kill="true", restart="true"), nodes)
    with pytest.raises(Unsupported, match="need --nodes"):
        check_faults(("kill-random",), Hooks(kill="true", restart="true"), [])
    assert check_faults(("kill-random", "pause-random"), Hooks("k", "r", "p", "s"), nodes) == []
    assert "random node" in check_faults(("kill-leader",), Hooks("k", "r"), parse_nodes("a,b"))[0]
    with pytest.raises(Unsupported, match="node name"):
        parse_nodes("a;rm -rf /")
    with pytest.raises(Unsupported, match="more than once"):
        parse_nodes("a,a")


def test_hooks_get_the_node_and_a_failing_hook_says_what_failed(tmp_path):
    out = tmp_path / "out.txt"
    backend = RocketMQBackend(
        tmp_path,
        namesrv="127.0.0.1:9876",
        nodes=parse_nodes("n1=127.0.0.1:10911"),
        hooks=Hooks(
            kill=f"echo {{node}} {{addr}} {{host}} $JEPSEN_NODE > {out}", restart="echo boom; exit 3"
        ),
    )
    backend.kill("n1")
    assert out.read_text().split() == ["n1", "127.0.0.1:10911", "127.0.0.1", "n1"]
    assert backend.killed == {"n1"}
    with pytest.raises(RuntimeError, match="restart hook for n1 exited 3.*boom"):
        backend.restart("n1")
    assert backend.killed == {"n1"}  # still down as far as anyone knows: heal_all tries again
    with pytest.raises(Unsupported, match="no --pause-cmd"):
        backend.pause("n1")
    with pytest.raises(Unsupported, match="cannot cut links"):
        backend.set_cut({("n1", "n2")})


def test_rocketmq_clients_send_json_headers_without_ledgermq_fields():
    client = BrokerQueueClient(["127.0.0.1:9876"], {}, "T", broker_name="broker-a", rocketmq=True)
    config = client.producer.instance.remoting.config
    assert config.serialize_type == SERIALIZE_JSON and config.send_crc is False
    assert client.consumer.instance is client.producer.instance
    assert client.target(1)["queue"].broker_name == "broker-a"
    plain = BrokerQueueClient(["127.0.0.1:9876"], {}, "T")
    assert plain.target(1) == {"queue_id": 1}


@pytest.mark.slow
def test_rocketmq_clients_put_only_json_headers_on_the_wire(local_cluster, tmp_path, monkeypatch):
    """Every frame the harness's clients send is JSON (what any RocketMQ server reads) without our CRC field."""
    import asyncio

    import remoting.connection as connection
    from remoting.message import Message
    from remoting.protocol import CRC_EXT_FIELD, encode_parts

    namesrv, _base, _addrs = local_cluster
    backend = RocketMQBackend(tmp_path, namesrv=namesrv)
    backend.start()  # creates the run's topic (through the same JSON-only clients)
    frames: list[tuple[int, dict]] = []

    def recording(cmd, **kw):
        head, body = encode_parts(cmd, **kw)
        stype = head[4]
        header = json.loads(head[8:]) if stype == SERIALIZE_JSON else {}
        frames.append((stype, header))
        return head, body

    monkeypatch.setattr(connection, "encode_parts", recording)

    async def load() -> list:
        client = backend.queue_client()
        try:
            offsets = [await client.send(q % 2, 1000 + q) for q in range(4)]
            assert offsets == [0, 0, 1, 1]
            msgs = [Message(backend.topic, str(v).encode()) for v in (2000, 2001, 2002)]
            batch = await client.producer.send_batch(msgs, **client.target(0))
            assert batch.offsets == [2, 3, 4]
            return await client.drain(0) + await client.drain(1)
        finally:
            await client.close()

    pairs = asyncio.run(load())
    assert sorted(v for _, v in pairs) == [1000, 1001, 1002, 1003, 2000, 2001, 2002]
    assert len(frames) >= 6  # route lookups, sends, pulls
    assert {s for s, _ in frames} == {SERIALIZE_JSON}
    ext = {
        code: [h.get("extFields") or {} for _, h in frames if h.get("code") == code]
        for code in (310, 11, 320)
    }
    assert not [e for _, h in frames if CRC_EXT_FIELD in (e := h.get("extFields") or {})]
    assert all(isinstance(v, str) for _, h in frames for v in (h.get("extFields") or {}).values())
    # what RocketMQ 4.9's header classes require (@CFNotNull), as its broker would decode them
    assert ext[310] and all(set("abcdefghijkm") <= set(e) and "topic" not in e for e in ext[310])
    assert ext[11] and all(
        {"commitOffset", "subVersion", "subscription", "sysFlag"} <= set(e) for e in ext[11]
    )
    assert [set("abcdefgh") <= set(e) and "topic" not in e for e in ext[320]] == [True]  # V2 names
    # a topic that already holds messages would mix another run's values into this history
    with pytest.raises(Unsupported, match="already holds"):
        RocketMQBackend(tmp_path / "again", namesrv=namesrv, topic=backend.topic).start()
    # an existing topic is used as it is, never reconfigured: too few queues is refused
    few = f"{backend.topic}-few"
    RocketMQBackend(tmp_path / "few", namesrv=namesrv, topic=few, queues=1).start()
    with pytest.raises(Unsupported, match="with 1 queues, fewer than --queues 2"):
        RocketMQBackend(tmp_path / "few2", namesrv=namesrv, topic=few, queues=2).start()
