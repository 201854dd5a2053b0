"""``jepsen run --backend docker``: the queue workload on the compose group, faults through Docker.

The group runs with ACL on, as docker-compose.yml has it: the harness's clients sign with the
account the backend generated, and the ``forge-peer`` nemesis's unsigned admin calls and
forged ledger peers must be refused. Skips with the reason when no Docker engine answers;
CI runs it where one does.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from jepsen.checker.recovery import key_group, node_group
from jepsen.docker.compose import ComposeGroup, docker_unavailable_reason
from jepsen.history import read_history, validate_history
from jepsen.run.config import RunConfig
from jepsen.run.runner import run
from jepsen.systems.base import SMALL_DISK_MB
from jepsen.systems.docker import DockerBrokerBackend

pytestmark = [pytest.mark.slow, pytest.mark.docker]
REASON = docker_unavailable_reason()


def _queue_run(
    tmp_path: Path,
    nemesis: tuple[str, ...],
    *,
    time: float,
    interval: float,
    seed: int,
    rate: float = 40,
    clients: int = 4,
    **options,
):  # type: ignore[no-untyped-def]
    """A short queue-workload run on the docker backend (by default 40 ops/s, 4 clients); the
    result and its history, already checked against the contract."""
    result = run(
        RunConfig(
            workload="queue",
            backend="docker",
            nemesis=nemesis,
            time=time,
            interval=interval,
            rate=rate,
            clients=clients,
            seed=seed,
            out=tmp_path,
            progress=False,
            system_options=options,
        )
    )
    events = read_history(result.history)
    assert validate_history(events) == []
    return result, events


@pytest.mark.skipif(REASON is not None, reason=f"no Docker engine: {REASON}")
def test_queue_on_the_compose_group_with_docker_faults(tmp_path):
    result, events = _queue_run(
        tmp_path, ("forge-peer", "kill-leader", "partition-leader"), time=20, interval=3, seed=5
    )
    faults = {e["f"] for e in events if e["process"] == "nemesis"}
    assert {"kill", "start-partition", "forge-peer"} <= faults, faults
    forged = [e["value"] for e in events if e["process"] == "nemesis" and e["f"] == "forge-peer"]
    end = forged[-1]
    assert end["acl"] is True and end["secured"] is True, end
    outcomes = [(a["attempt"], a["outcome"]) for a in end["attempts"]]
    assert [o for _, o in outcomes] == ["refused"] * len(outcomes), outcomes
    assert sum(a == "admin-no-credentials" for a, _ in outcomes) == 3, outcomes  # one per broker
    assert end["accepted"] == 0
    assert result.summary["leaders"]["leader_changes"] >= 1
    assert result.valid is True, result.summary.get("check", {}).get("results", {}).get("anomalies")
    assert (result.run_dir / "cluster" / "logs" / "broker1.log").exists(), "container logs were not saved"
    leftovers = subprocess.run(
        ["docker", "ps", "-a", "--filter", "label=com.docker.compose.project", "--format", "{{.Labels}}"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert "com.docker.compose.project=jepsen" not in leftovers, f"containers left behind: {leftovers[:500]}"


@pytest.mark.skipif(REASON is not None, reason=f"no Docker engine: {REASON}")
def test_two_broker_groups_on_compose_with_kill_leader(tmp_path):
    """``--groups 2`` on the docker backend: six broker containers from the generated override,
    node names ``broker-b/n2``, queues on both groups, each kill aimed at one group's leader."""
    result, events = _queue_run(tmp_path, ("kill-leader",), time=20, interval=3, seed=7, groups=2)
    nodes = {e["node"] for e in events if e.get("node")}
    assert {n.split("/")[0] for n in nodes} == {"broker-a", "broker-b"}, nodes
    sends = [e for e in events if e["f"] == "send" and e["type"] == "ok"]
    assert {key_group(e["key"]) for e in sends} == {"broker-a", "broker-b"}
    kills = [e for e in events if e["process"] == "nemesis" and e["f"] == "kill"]
    assert kills, "the nemesis killed nothing"
    for e in kills:  # --fault-scope one (the default): one group's leader per kill
        assert len(e["value"]["nodes"]) == 1 and node_group(e["value"]["nodes"][0]) in (
            "broker-a",
            "broker-b",
        )
    assert result.valid is True, result.summary.get("check", {}).get("results", {}).get("anomalies")
    logs = result.run_dir / "cluster" / "logs"
    assert {p.name for p in logs.glob("broker*.log")} >= {f"broker{k}.log" for k in range(1, 7)}


def _send_latencies(events: list[dict], inside: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Latencies (ns) of ok sends invoked inside any of the windows, and of the others."""
    invoked: dict = {}
    ins, outs = [], []
    for e in events:
        if e["process"] == "nemesis" or e["f"] != "send":
            continue
        if e["type"] == "invoke":
            invoked[e["process"]] = e["time"]
        elif e["type"] == "ok" and e["process"] in invoked:
            t0 = invoked.pop(e["process"])
            (ins if any(a <= t0 <= b for a, b in inside) else outs).append(e["time"] - t0)
    return ins, outs


@pytest.mark.skipif(REASON is not None, reason=f"no Docker engine: {REASON}")
def test_slow_network_delays_peer_links_through_the_relay(tmp_path):
    """``slow-network`` on the docker backend (no netem on this kernel): each container's new
    connections to its peers' ledger ports go through a relay that holds every chunk 150 ms (plus
    jitter), so a send, which waits for a follower's append, takes at least two of those; healed,
    sends are fast again. 16 clients: enough sends inside the slow windows to take a median."""
    result, events = _queue_run(
        tmp_path, ("slow-network",), time=24, interval=3, seed=4, rate=200, clients=16
    )
    nem = [e for e in events if e["process"] == "nemesis"]
    slow = [
        (a, b)
        for a, b in zip(nem[0::2], nem[1::2], strict=True)
        if a["f"] == "start-partition" and b["value"].get("delay_ms")
    ]
    assert slow, f"no slow-network fault in {[e['f'] for e in nem]}"
    for _, end in slow:
        assert not end.get("error") and end["value"]["delay_ms"] == 150, end
    # a fault is in force from its start's end event to the next stop-partition's start event
    windows = []
    for i, e in enumerate(nem):
        if e in [b for _, b in slow]:
            stop = next((x for x in nem[i + 1 :] if x["f"] == "stop-partition"), None)
            windows.append((e["time"], stop["time"] if stop else 1 << 62))
    ins, outs = _send_latencies(events, windows)
    assert len(ins) >= 10 and len(outs) >= 30, (len(ins), len(outs))  # CI: 23 (up to 2.6 s each)
    med_in, med_out = sorted(ins)[len(ins) // 2], sorted(outs)[len(outs) // 2]
    assert med_in >= 300e6 and med_in > 2 * med_out, (med_in / 1e6, med_out / 1e6)
    assert result.valid is True, result.summary.get("check", {}).get("results", {}).get("anomalies")


def _started_last_index(log: Path) -> list[int]:
    """``last_index`` of each "ledger node started" line of a broker's container log, in order."""
    found = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if "ledger node started" in line:
            m = re.search(r'"last_index": ?(\d+)', line)
            found.append(int(m.group(1)) if m else -1)
    return found


@pytest.mark.skipif(REASON is not None, reason=f"no Docker engine: {REASON}")
def test_disk_full_on_small_volumes_that_survive_kills(tmp_path):
    """``disk-full`` on the docker backend: each broker's data on a tmpfs volume kept mounted by a
    holder, the leader's filled to the last page and freed, as on the local backend. A kill-leader
    in the same run shows the volume keeps the data across ``docker kill`` + ``docker start``
    (a tmpfs volume without the holder comes back empty)."""
    result, events = _queue_run(tmp_path, ("disk-full", "kill-leader"), time=30, interval=4, seed=11)
    nem = [e for e in events if e["process"] == "nemesis"]
    ends = nem[1::2]
    assert not [e for e in ends if e.get("error")], [e for e in ends if e.get("error")]
    fills = [e["value"] for e in ends if e["f"] == "fill-disk"]
    frees = [e["value"] for e in ends if e["f"] == "free-disk"]
    assert fills, "the nemesis filled no disk"
    small = SMALL_DISK_MB << 20
    for fill in fills:
        assert fill["disk_bytes"] == small and fill["free_bytes"] < 8192, fill
        assert fill["filler_bytes"] > small // 2, fill  # the data took little; the filler the rest
    assert [f["node"] for f in frees] == [f["node"] for f in fills]
    assert [f["freed"] for f in frees] == [f["filler_bytes"] for f in fills]
    assert not [e for e in nem if e["value"].get("fault") == "disk-full-setup"], "no set-up restarts"
    # the fault bit: the full leader's appends failed with ENOSPC, it stopped leading and another
    # node led while its disk was full; once freed, it took writes again
    filled = fills[0]["node"]
    assert fills[0]["leader"] == filled, fills[0]
    window = [e["time"] for e in nem if e["f"] in ("fill-disk", "free-disk")][:4]
    moves = [json.loads(line) for line in (result.run_dir / "leaders.jsonl").read_text().splitlines()]
    others = [m for m in moves if window[0] <= m["time"] <= window[3] and m.get("role") == "leader"]
    assert [m["node"] for m in others if m["node"] != filled], (
        f"{filled} kept leading on a full disk: {moves}"
    )
    log = (result.run_dir / "cluster" / "logs" / f"broker{filled[1:]}.log").read_text(errors="replace")
    assert "No space left on device" in log and "disk takes writes again" in log
    recovery = result.summary["check"]["results"]["recovery"]["disk-full"]
    assert recovery["recovered"] == recovery["faults"] == len(fills), recovery
    assert result.valid is True, result.summary.get("check", {}).get("results", {}).get("anomalies")
    kills = [e["value"]["nodes"][0] for e in ends if e["f"] == "kill"]
    assert kills, "the nemesis killed nothing"
    logs = result.run_dir / "cluster" / "logs"
    starts = _started_last_index(logs / f"broker{kills[0][1:]}.log")
    assert len(starts) >= 2 and starts[1] > 0, f"the killed broker restarted without its log: {starts}"


@pytest.mark.skipif(REASON is not None, reason=f"no Docker engine: {REASON}")
def test_disk_full_volumes_are_laid_out_only_when_planned(tmp_path):
    """The small volumes come only with ``disk-full`` among the run's faults (told before start), and
    compose itself reads the generated override: a tmpfs volume and a holder for every broker."""
    backend = DockerBrokerBackend(tmp_path, groups=2)
    backend.plan_faults(["kill-leader"])
    assert "name disk-full among the run's nemeses" in (backend.small_disk_refusal() or "")
    assert "small-disks" not in " ".join(backend.group.compose("config", "--services").args)
    backend.plan_faults(["kill-leader", "disk-full"])
    assert backend.small_disk_refusal() is None
    config = backend.group.compose("config").stdout
    for k in range(1, 7):
        assert f"broker{k}-disk:" in config, config
    assert config.count("type: tmpfs") == 6 and config.count(f"o: size={SMALL_DISK_MB << 20}") == 6
    assert config.count("network_mode: none") == 6
    with pytest.raises(ValueError, match="small disk size"):
        ComposeGroup("x", small_disk_bytes=4096)
