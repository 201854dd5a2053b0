"""The collector settings every server process and harness worker starts with (common.gc_tuning).

Each case runs in a fresh interpreter: tuning the test process's own collector would leak
into every later test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from common.gc_tuning import GC_ENV, GC_THRESHOLDS, thresholds_from_env

PROBE = (
    "import gc, json; from common.gc_tuning import tune_gc; "
    "t = tune_gc(); print(json.dumps({'thresholds': t, 'frozen': gc.get_freeze_count()}))"
)


def probe(env_value: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != GC_ENV}
    if env_value is not None:
        env[GC_ENV] = env_value
    return subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_servers_freeze_start_up_objects_and_collect_less_often() -> None:
    out = probe(None)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert tuple(got["thresholds"]) == GC_THRESHOLDS
    assert got["thresholds"][0] > 700  # CPython's default young threshold, which cost the CPU
    assert got["frozen"] > 1000  # modules, classes and functions made at start-up


def test_default_leaves_cpython_settings_and_a_custom_value_applies() -> None:
    default = probe("default")
    assert default.returncode == 0, default.stderr
    got = json.loads(default.stdout)
    assert tuple(got["thresholds"]) == (700, 10, 10) and got["frozen"] == 0
    custom = probe("5000,5,7")
    assert custom.returncode == 0, custom.stderr
    assert tuple(json.loads(custom.stdout)["thresholds"]) == (5000, 5, 7)


@pytest.mark.parametrize("bad", ["lots", "1,2", "0,10,10", "10,-1,10", "1,2,3,4"])
def test_a_malformed_setting_is_one_line_naming_it(bad: str) -> None:
    out = probe(bad)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and GC_ENV in lines[0] and repr(bad) in lines[0], out.stderr
    with pytest.raises(ValueError):
        thresholds_from_env(bad)
