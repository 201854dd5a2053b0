"""The newer nemeses, each in a short real run: network delay and loss through the link
proxies, a corrupt tail and lost data on a stopped broker or follower, and a forged peer.

Each test asserts that the fault really happened (the proxy delayed or dropped, the file
was damaged, the attempt was refused), that it is recorded as nemesis events with values,
and what the checker said. ``lose-data`` variants other than the default are known to
find bugs until storage healing lands: their test records the verdict
and asserts only what the history shows.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from jepsen.faults.registry import FAULTS
from jepsen.history import read_history, validate_history
from jepsen.net.proxy import LinkProxy
from jepsen.run.config import RunConfig, RunResult
from jepsen.run.runner import run

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, **kw) -> RunResult:
    settings = {
        "out": tmp_path,
        "progress": False,
        "time": 8,
        "interval": 2,
        "rate": 40,
        "clients": 4,
        "seed": 11,
        **kw,
    }
    return run(RunConfig(**settings))


def _nemesis_events(result: RunResult) -> list[dict]:
    events = read_history(result.history)
    assert validate_history(events) == []
    nem = [e for e in events if e["process"] == "nemesis"]
    assert Counter(e["f"] for e in nem[0::2]) == Counter(e["f"] for e in nem[1::2]), "a start without its end"
    return nem


def _verdict(result: RunResult) -> dict:
    check = result.summary.get("check") or {}
    assert check.get("valid") is not None, f"the checker did not run: {check.get('output')}"
    return check.get("results") or {}


# ------------------------------------------------------------------ the proxy's shaping, alone


def _echo_server(host: str) -> tuple[socket.socket, str]:
    srv = socket.socket()
    srv.bind((host, 0))
    srv.listen(8)

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=c: _echo(c), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv, f"{host}:{srv.getsockname()[1]}"


def _echo(c: socket.socket) -> None:
    with c:
        try:
            while data := c.recv(65536):
                c.sendall(data)
        except OSError:
            pass


def _round_trip(addr: str, payload: bytes = b"x" * 100) -> float:
    host, port = addr.rsplit(":", 1)
    t0 = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            got += chunk
    assert got == payload
    return time.monotonic() - t0


def test_proxy_delays_and_drops_with_a_seed(tmp_path):
    srv, addr = _echo_server("127.0.0.1")
    proxy = LinkProxy({"a": "127.0.0.1:1", "b": addr}, log_path=tmp_path / "proxy.log")
    try:
        via = proxy.address("a", "b")
        assert _round_trip(via) < 0.15
        proxy.set_shape([("a", "b")], delay_ms=200, seed=1)
        slow = _round_trip(via)
        assert 0.2 <= slow < 2.0, slow  # one chunk each way is held 200 ms on its way to b (not back)
        assert proxy.stats()["a->b"]["delay_ms"] == 200
        with pytest.raises(ValueError):
            proxy.set_shape([("a", "c")], drop=0.5)
        proxy.set_shape([("a", "b")], drop=0.5, seed=3)
        outcomes = []
        for _ in range(40):
            try:
                _round_trip(via)
                outcomes.append("ok")
            except OSError:
                outcomes.append("lost")
        assert 5 <= outcomes.count("lost") < 40 and "ok" in outcomes, (
            outcomes
        )  # ~75%: connect, then one chunk
        assert proxy.stats()["a->b"]["dropped"] == outcomes.count("lost")
        proxy.set_shape([])
        assert _round_trip(via) < 0.15
    finally:
        proxy.close()
        srv.close()


# ------------------------------------------------------------------ real runs


def test_slow_and_lossy_network_on_the_log_workload(tmp_path):
    result = _run(tmp_path, workload="log", nemesis=("slow-network", "lossy-network"), time=12)
    nem = _nemesis_events(result)
    starts = [e["value"] for e in nem if e["f"] == "start-partition"]
    kinds = [v["fault"] for v in starts[0::2]]
    assert kinds[:2] == ["slow-network", "lossy-network"], kinds
    assert starts[0]["delay_ms"] > 0 and starts[2]["drop"] > 0 and "seed" in starts[2]
    # the end event says what the backend did: the links it shaped
    assert starts[1].get("shaped") and starts[3].get("shaped"), starts[1::2]
    assert [e for e in nem if e["f"] == "stop-partition"], "the network was never healed"
    results = _verdict(result)
    assert result.valid is True, results.get("anomalies")
    assert {"slow-network", "lossy-network"} <= set(results.get("recovery") or {}), results.get("recovery")


def test_corrupt_tail_on_the_queue_workload(tmp_path):
    result = _run(tmp_path, workload="queue", system="broker", nemesis=("corrupt-tail",))
    nem = _nemesis_events(result)
    corrupt = [e["value"] for e in nem if e["f"] == "corrupt"]
    assert corrupt and corrupt[1]["bytes"] >= 1 and corrupt[1]["file"].endswith(".seg"), corrupt
    corr = result.summary["nemesis"]["corruptions"]
    assert corr[0].get("tail-truncated") is True, f"the broker did not report cutting its tail: {corr}"
    assert result.valid is True, _verdict(result).get("anomalies")


def test_lose_data_default_is_recorded_and_valid(tmp_path):
    result = _run(tmp_path, workload="log", nemesis=("lose-data",))
    nem = _nemesis_events(result)
    damage = [e["value"] for e in nem if e["f"] == "corrupt"]
    assert damage and damage[1]["how"] == "truncate-log" and damage[1]["files"], damage
    kills = [e["value"] for e in nem if e["f"] == "kill"]
    assert kills[0]["fault"] == "lose-data" and kills[0]["nodes"][0] != kills[0]["leader"]
    # whether the node got its entries back is recorded (before the leader learned to lower a
    # follower's match index, it sat at commit 0 and the history said so)
    restarts = [e["value"] for e in nem[1::2] if e["f"] == "restart" and e["value"]["fault"] == "lose-data"]
    assert restarts and all(isinstance(v["caught-up"], bool) for v in restarts), restarts
    for v in restarts:
        assert v["caught-up"] == (v["commit_index"] is not None and v["commit_index"] >= v["commit_before"])
        assert v["commit_before"] > 0
    assert all(v["caught-up"] for v in restarts), (
        f"the leader did not repair a truncated follower: {restarts}"
    )
    assert result.valid is True, _verdict(result).get("anomalies")


def test_lose_data_variants_that_find_bugs_are_recorded(tmp_path):
    """Wipe, empty and hard-state loss, which can find bugs until storage healing is
    complete: the history must say what happened to the node, whatever the verdict."""
    faults = ("lose-data-wipe", "lose-data-empty", "lose-data-hardstate")
    result = _run(tmp_path, workload="log", nemesis=faults, time=16)  # room for all three
    nem = _nemesis_events(result)
    damage = [e["value"] for e in nem[1::2] if e["f"] == "corrupt"]
    assert [d["how"] for d in damage] == ["wipe", "empty-log", "hardstate"], damage
    assert damage[0].get("files_removed", 0) > 0 and "existed" in damage[2]
    restarts = [e["value"] for e in nem[1::2] if e["f"] == "restart" and e["value"]["fault"] in faults]
    assert [v["fault"] for v in restarts] == list(faults)
    for v in restarts:
        assert v["caught-up"] == (v["commit_index"] is not None and v["commit_index"] >= v["commit_before"])
    assert _verdict(result) is not None and result.valid in (True, False, "unknown")


def test_forge_peer_is_refused_and_the_run_stays_valid(tmp_path):
    result = _run(tmp_path, workload="log", nemesis=("forge-peer",))
    nem = _nemesis_events(result)
    forged = [e["value"] for e in nem if e["f"] == "forge-peer"]
    assert forged, "no forge-peer event"
    end = forged[1]
    assert end["secured"] is True
    attempts = {a["attempt"]: a["outcome"] for a in end["attempts"]}
    assert attempts == {"old-hello": "refused", "wrong-secret": "refused"}, end["attempts"]
    logs = "".join(p.read_text(errors="replace") for p in (result.run_dir / "cluster").glob("*/node.log"))
    assert "refused peer" in logs
    assert result.valid is True, _verdict(result).get("anomalies")


def test_every_new_nemesis_is_known():
    for f in ("slow-network", "lossy-network", "lose-data", "forge-peer", "corrupt-tail"):
        assert f in FAULTS
    assert random.Random(1).random() == random.Random(1).random()


def test_docker_loss_and_delay_rules(tmp_path):
    from jepsen.faults.schedule import Nemesis
    from jepsen.net import relay
    from jepsen.systems.docker import DockerBrokerBackend, loss_script

    script = loss_script(["10.1.0.11", "10.1.0.12"], 0.05)
    assert script.count("-m statistic --mode random --probability 0.0500 -j DROP") == 2
    assert "-s 10.1.0.11 " in script and "iptables -w -F LEDGERMQ-LOSS" in script
    assert "statistic" not in loss_script(["10.1.0.11"], 0)  # healing empties the chain
    # delay: each slowed peer's ledger port redirected to the relay, older connections reset
    script = relay.install_script([("10.1.0.12", 20921)], delay_ms=150, jitter_ms=50, seed=9)
    assert "--delay-ms 150 --jitter-ms 50 --seed 9" in script
    assert f"-d 10.1.0.12 --dport 20921 -m mark ! --mark {relay.RELAY_MARK} -j REDIRECT" in script
    assert "-j REJECT --reject-with tcp-reset" in script
    assert relay.install_script([], 150, 50, 9) == relay.remove_script()  # healing stops the relay
    backend = DockerBrokerBackend(tmp_path)  # nothing started: the nemesis accepts slow-network now
    assert backend.supports_delay
    Nemesis(backend, None, ["slow-network", "lossy-network"], 1.0, random.Random(1))  # type: ignore[arg-type]


@pytest.mark.skipif(os.geteuid() != 0, reason="disk-full mounts a tmpfs (root only); refused otherwise")
def test_disk_full_fills_the_leaders_tmpfs_and_frees_it(tmp_path):
    result = _run(tmp_path, workload="log", nemesis=("disk-full",), time=10)
    nem = _nemesis_events(result)
    setup = [
        e["value"] for e in nem[1::2] if e["f"] == "restart" and e["value"]["fault"] == "disk-full-setup"
    ]
    assert sorted(v["nodes"][0] for v in setup) == ["n1", "n2", "n3"], setup
    assert all(v["mount"]["size_mb"] >= 64 for v in setup)
    fills = [e["value"] for e in nem[1::2] if e["f"] == "fill-disk"]
    frees = [e["value"] for e in nem[1::2] if e["f"] == "free-disk"]
    assert fills and fills[0]["free_bytes"] < 8192 and fills[0]["filler_bytes"] > 32 << 20, fills
    assert len(frees) == len(fills) and frees[0]["freed"] == fills[0]["filler_bytes"]
    results = _verdict(result)
    assert "disk-full" in (results.get("recovery") or {}), results.get("recovery")
    # every tmpfs was released at the end and the data copied back to a plain directory
    mounts = Path("/proc/mounts").read_text()
    assert str(result.run_dir) not in mounts
    assert (result.run_dir / "cluster" / "n1" / "data" / "log").is_dir() or result.valid is True
    assert result.valid is True, results.get("anomalies")


def test_disk_full_is_refused_clearly_where_it_cannot_run(tmp_path):
    from jepsen.faults.schedule import Nemesis
    from jepsen.systems.base import Unsupported
    from jepsen.systems.docker import DockerBrokerBackend

    with pytest.raises(Unsupported, match="disk-full"):
        Nemesis(DockerBrokerBackend(tmp_path), None, ["disk-full"], 1.0, random.Random(1))  # type: ignore[arg-type]


def test_forge_peer_on_brokers_with_acl_is_refused_everywhere(tmp_path):
    """The broker group as the harness runs it (cluster secret on its ledger peers) with ACL on:
    the forged peer and every unsigned admin call are refused, and say so in the history."""
    import asyncio

    from jepsen.faults.schedule import Nemesis
    from jepsen.history import History
    from jepsen.systems.broker import LocalBrokerBackend

    acl = {
        "acl_enable": True,
        "acl_admin_access_key": "root",
        "acl_admin_secret_key": "root-secret-1",
        "access_key": "root",
        "secret_key": "root-secret-1",
    }
    backend = LocalBrokerBackend(tmp_path / "cluster", settings=acl)
    history = History(tmp_path / "history.jsonl")
    backend.start()
    try:

        async def scenario() -> None:
            # the harness's status calls are unsigned (refused with ACL on): wait for the listeners
            addrs = [*backend.group.broker_addr.values(), *backend.group.ledger_addr.values()]
            deadline = time.monotonic() + 60
            for addr in addrs:
                host, port = addr.rsplit(":", 1)
                while True:
                    try:
                        _, w = await asyncio.open_connection(host, int(port))
                        w.close()
                        break
                    except OSError:
                        assert time.monotonic() < deadline, f"{addr} never listened"
                        await asyncio.sleep(0.2)
            nemesis = Nemesis(backend, history, ["forge-peer"], 1.0, random.Random(3))
            await nemesis.start_fault("forge-peer")
            await nemesis.heal_all()

        asyncio.run(scenario())
    finally:
        history.close()
        backend.stop()
    nem = [e for e in read_history(tmp_path / "history.jsonl") if e["process"] == "nemesis"]
    assert [e["f"] for e in nem] == ["forge-peer", "forge-peer"]
    end = nem[1]["value"]
    assert end["secured"] is True and end["acl"] is True
    outcomes = [(a["attempt"], a["outcome"]) for a in end["attempts"]]
    assert outcomes.count(("admin-no-credentials", "refused")) == 3, end["attempts"]
    assert ("old-hello", "refused") in outcomes and ("wrong-secret", "refused") in outcomes
    assert end["accepted"] == 0 and end["refused"] == 5
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "cluster").glob("broker-*/broker.log"))
    assert "refused peer" in logs  # the node logged the forged peer
    # each unsigned admin call got the ACL's refusal (the broker logs only its first few refusals)
    admin = [a for a in end["attempts"] if a["attempt"] == "admin-no-credentials"]
    assert all("UPDATE_AND_CREATE_TOPIC is not signed" in a["detail"] for a in admin), admin
