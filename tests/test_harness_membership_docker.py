"""``--nemesis membership`` on the docker backend: spare broker services that join empty,
a member re-created with an empty volume, a member replaced by a spare on a new address; the
changes recorded in the history as on the local backend, partitions covering the new member,
and nothing left behind.

Skips with the reason when no Docker engine answers; CI runs it where one does.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from jepsen.docker.compose import docker_unavailable_reason
from jepsen.docker.layout import membership_override, spare_layout
from jepsen.history import read_history, validate_history
from jepsen.run.config import RunConfig
from jepsen.run.runner import run
from jepsen.systems.docker import DockerBrokerBackend

REASON = docker_unavailable_reason()


def test_the_override_defines_spares_on_their_own_addresses_and_leaves_the_first_members_alone() -> None:
    spares = spare_layout(2, 3)
    assert list(spares) == [f"broker-{g}-n{i}" for g in "ab" for i in (4, 5, 6)]
    assert [s.octet for s in spares.values()] == [24, 25, 26, 34, 35, 36]
    assert {s.ledger_port for s in spares.values()} == {20941, 20951, 20961}
    text = membership_override(1, 2, "10.9.8")
    # the first members keep docker-compose.yml's group unless the harness re-creates them
    assert '"BROKER_GROUP": "${LEDGERMQ_GROUP_BROKER1:-n1=10.9.8.21:10911@10.9.8.21:20911,' in text
    assert '"BROKER_JOIN": "${LEDGERMQ_JOIN_BROKER1:-false}"' in text
    assert '"BROKER_JOIN": "${LEDGERMQ_JOIN_BROKER_A_N5:-true}"' in text
    assert "n5=10.9.8.25:10951@10.9.8.25:20951" in text
    with pytest.raises(ValueError, match="spare brokers must be"):
        spare_layout(1, 99)


def test_membership_is_refused_on_a_docker_group_laid_out_without_spares(tmp_path: Path) -> None:
    backend = DockerBrokerBackend(tmp_path)
    assert "name membership among the run's nemeses" in (backend.membership_refusal() or "")
    backend.plan_faults(["membership", "kill-leader"])
    assert backend.membership_refusal() is None
    assert backend.pool == ["n1", "n2", "n3", "n4", "n5", "n6"]
    assert backend.spare_nodes(["n1"]) == ["n4", "n5", "n6"]


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.skipif(REASON is not None, reason=f"no Docker engine: {REASON}")
def test_queue_run_with_membership_changes_on_the_compose_group(tmp_path: Path) -> None:
    result = run(
        RunConfig(
            workload="queue",
            backend="docker",
            nemesis=("membership", "partition-random-halves"),
            time=20,
            interval=1.5,
            rate=40,
            clients=4,
            seed=2,  # replace (a spare joins on a new address, an old member leaves), then a partition
            out=tmp_path,
            progress=False,
        )
    )
    events = read_history(result.history)
    assert validate_history(events) == []
    nem = [e for e in events if e["process"] == "nemesis"]
    changes = [e for e in nem[1::2] if e["f"] in ("member-add", "member-remove")]
    assert len(changes) >= 2 and not any("error" in e for e in changes), changes
    added = {n for e in changes if e["f"] == "member-add" for n in e["value"]["nodes"]}
    assert added & {"n4", "n5", "n6"}, changes  # a spare service joined
    assert all(len(e["value"]["voters"]) >= 2 for e in changes), changes
    joined = next(
        e for e in changes if e["f"] == "member-add" and set(e["value"]["nodes"]) & {"n4", "n5", "n6"}
    )
    assert set(joined["value"]["nodes"]) <= set(joined["value"]["voters"]), joined  # caught up, promoted
    assert result.valid is True, result.summary.get("check")
    # iptables cuts cover the joined spare, and pass over the removed member's deleted container
    cuts = [e for e in nem if e["f"] == "start-partition"]
    assert cuts and not any("error" in e for e in cuts), cuts
    assert added & set(cuts[-1]["value"]["nodes"]), cuts
    logs = result.run_dir / "cluster" / "logs"
    for n in added - {"n1", "n2", "n3"}:  # the spare's container log, kept even if it was removed again
        assert "joined" in (logs / f"broker-a-{n}.log").read_text(encoding="utf-8"), n
    removed = {n for e in changes if e["f"] == "member-remove" for n in e["value"]["nodes"]}
    for n in removed & {"n1", "n2", "n3"}:  # a removed member's log is kept too
        assert (logs / f"broker{n[1]}.log").exists(), n
    project = next(iter(logs.parent.glob("*.membership.yml"))).name.split(".")[0]
    leftovers = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert leftovers == []
