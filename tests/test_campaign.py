"""``jepsen campaign``: a seeded plan that replays, and a small real campaign that is all valid."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from jepsen.cli import main as jepsen_main
from jepsen.faults.registry import FAULTS
from jepsen.run.campaign import CAMPAIGN_NEMESES, CAMPAIGN_WORKLOADS, plan
from jepsen.run.run_cli import run as run_command


def test_the_plan_is_a_function_of_the_seed():
    a, b, c = plan(20, 42, 8, 1.5), plan(20, 42, 8, 1.5), plan(20, 43, 8, 1.5)
    key = [(r.workload, r.nemeses, r.seed) for r in a]
    assert key == [(r.workload, r.nemeses, r.seed) for r in b]
    assert key != [(r.workload, r.nemeses, r.seed) for r in c]
    assert {r.workload for r in a} <= set(CAMPAIGN_WORKLOADS)
    assert all(len(set(r.nemeses)) == 2 and set(r.nemeses) <= set(CAMPAIGN_NEMESES) for r in a)
    assert set(CAMPAIGN_NEMESES) <= set(FAULTS)
    with pytest.raises(ValueError, match="--runs"):
        plan(0, 1, 8, 1.5)


def test_the_replay_command_parses_as_a_run(tmp_path):
    r = plan(1, 7, 8, 1.5)[0]
    argv = shlex.split(r.replay(tmp_path))
    assert argv[:2] == ["jepsen", "run"]
    ctx = run_command.make_context("run", argv[2:])
    assert ctx.params["nemesis"] == r.nemeses and ctx.params["seed"] == r.seed
    assert ctx.params["workload"] == r.workload and ctx.params["time_"] == 8


@pytest.mark.slow
def test_a_small_campaign_is_all_valid(tmp_path):
    out = tmp_path / "camp"
    res = CliRunner().invoke(
        jepsen_main, ["campaign", "--runs", "3", "--seed", "3", "--time", "8", "--out", str(out)]
    )
    doc = json.loads((out / "campaign.json").read_text())
    assert res.exit_code == 0, res.output + json.dumps(doc["runs"], indent=1)
    assert [r["run"] for r in doc["runs"]] == [1, 2, 3] and doc["valid"] == 3
    page = (out / "campaign.html").read_text()
    for row in doc["runs"]:
        assert row["verdict"] == "valid" and row["faults"] >= 2, row
        assert (out / row["report"]).exists(), row
        assert f"href='{row['report']}'" in page
        assert row["recovery_max_ms"] is not None and row["recovery_p50_ms"] <= row["recovery_max_ms"]
        run_json = json.loads((out / row["run_dir"].split(str(out) + "/", 1)[1] / "run.json").read_text())
        assert run_json["valid"] is True
        assert "--seed " + str(row["seed"]) in row["replay"]
    assert "replay:" in res.output
