"""``jepsen run --backend docker``: the queue workload on the compose group, faults through Docker.

The group runs with ACL on, as docker-compose.yml has it: the harness's clients sign with the
account the backend generated, and the ``forge-peer`` nemesis's unsigned admin calls and
forged ledger peers must be refused. Skips with the reason when no Docker engine answers;
CI runs it where one does.
"""

from __future__ import annotations

import subprocess

import pytest

from jepsen.checker.recovery import key_group, node_group
from jepsen.docker.compose import docker_unavailable_reason
from jepsen.harness.history import read_history, validate_history
from jepsen.harness.runner import RunConfig, run

pytestmark = [pytest.mark.slow, pytest.mark.docker]
REASON = docker_unavailable_reason()


@pytest.mark.skipif(REASON is not None, reason=f"no Docker engine: {REASON}")
def test_queue_on_the_compose_group_with_docker_faults(tmp_path):
    result = run(
        RunConfig(
            workload="queue",
            backend="docker",
            nemesis=("forge-peer", "kill-leader", "partition-leader"),
            time=20,
            interval=3,
            rate=40,
            clients=4,
            seed=5,
            out=tmp_path,
            progress=False,
        )
    )
    events = read_history(result.history)
    assert validate_history(events) == []
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
    result = run(
        RunConfig(
            workload="queue",
            backend="docker",
            nemesis=("kill-leader",),
            time=20,
            interval=3,
            rate=40,
            clients=4,
            seed=7,
            out=tmp_path,
            progress=False,
            system_options={"groups": 2},
        )
    )
    events = read_history(result.history)
    assert validate_history(events) == []
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
