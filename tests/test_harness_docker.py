"""``jepsen run --backend docker``: the queue workload on the compose group, faults through Docker.

Skips with the reason when no Docker engine answers; CI runs it where one does.
"""

from __future__ import annotations

import subprocess

import pytest

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
            nemesis=("kill-leader", "partition-leader"),
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
    assert {"kill", "start-partition"} <= faults, faults
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
