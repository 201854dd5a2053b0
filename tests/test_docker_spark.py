"""The compose Spark service: a standalone master, a worker and a Spark Connect server in
containers (docker-compose.spark.yml, image ledgermq-spark built offline from the project image),
with the runs folder mounted at the same path as on the host.

A log history written into that folder is judged through the Connect server, its executors
reading the file by path (nothing shipped through the session), and the verdict, anomaly
types, counts and anomalies must equal the in-process (local) ones; then a short
``jepsen run --backend docker`` is checked on the same Connect server. Skips with the reason
where no Docker engine answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jepsen.checker.analyze import analyze_files
from jepsen.checker.synth import generate_log_history
from jepsen.docker.compose import ComposeGroup, docker_unavailable_reason, free_net_prefix, free_port
from jepsen.docker.images import build_image, build_spark_image

ROOT = Path(__file__).resolve().parents[1]
REASON = docker_unavailable_reason()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.docker,
    pytest.mark.skipif(REASON is not None, reason=f"needs a Docker engine and docker-compose: {REASON}"),
    pytest.mark.timeout(1800),
]


def test_compose_spark_connect_judges_a_history_from_the_shared_runs_folder(tmp_path: Path) -> None:
    t0 = time.monotonic()
    image = build_image("ledgermq:test", log=lambda m: print(f"[docker] {m}"))
    spark_image = build_spark_image("ledgermq-spark:test", log=lambda m: print(f"[docker] {m}"))
    print(f"[docker] images ready in {time.monotonic() - t0:.0f}s")
    runs = tmp_path / "runs"
    runs.mkdir()
    generate_log_history(runs / "log-clean.jsonl", 3_000, seed=11)
    generate_log_history(runs / "log-bad.jsonl", 3_000, seed=12, anomalies=True)
    logs = [runs / "log-clean.jsonl", runs / "log-bad.jsonl"]
    local = {
        o.path: o.result
        for o in analyze_files(logs, out_dir=tmp_path / "local", engine="inprocess", report=False)["files"]
    }
    g = ComposeGroup(
        project=f"ledgermqspark{os.getpid()}",
        net=free_net_prefix(start=120),
        image=image,
        env={"LEDGERMQ_SPARK_IMAGE": spark_image},
        log_dir=tmp_path / "logs",
        spark=True,
        runs_dir=runs,
    )
    g.published_ports = {name: free_port() for name in g.services if g.layout[name].publish_env}
    try:
        t1 = time.monotonic()
        g.up(build="never", timeout=300)
        print(f"[docker] group with Spark healthy in {time.monotonic() - t1:.0f}s")
        out = tmp_path / "connect"
        t2 = time.monotonic()
        res = subprocess.run(
            [sys.executable, "-m", "jepsen", "analyze", "--engine", "spark", "--master", g.spark_connect_url,
             "--no-ship-history", "--no-report", "--out", str(out), *map(str, logs)],
            capture_output=True, text=True, timeout=600, cwd=ROOT,
            env={**os.environ, "LEDGERMQ_SPARK_OPEN_S": "300"},
        )  # fmt: skip
        print(f"[docker] check through {g.spark_connect_url} in {time.monotonic() - t2:.0f}s")
        assert res.returncode == 1, res.stderr[-3000:]  # log-bad is invalid
        for log in logs:
            got = json.loads((out / log.stem / "results.json").read_text())
            want = local[str(log)]
            assert got["engine"] == f"spark {g.spark_connect_url}"
            for field in ("valid", "anomaly-types", "counts", "anomalies"):
                assert got[field] == want[field], (log.name, field)
        assert local[str(logs[0])]["valid"] is True and local[str(logs[1])]["valid"] is False

        # `jepsen run --backend docker --spark-master sc://...`: a short run on its own broker
        # group, its history (in the shared runs folder) judged by the compose Connect server.
        # A process of its own, as a user runs it (this one already holds a local Spark session).
        t3 = time.monotonic()
        res = subprocess.run(
            [sys.executable, "-m", "jepsen", "run", "--backend", "docker", "--workload", "queue",
             "--nemesis", "kill-leader", "--time", "8", "--interval", "2", "--rate", "30",
             "--clients", "2", "--seed", "3", "--out", str(runs), "--no-progress",
             "--spark-master", g.spark_connect_url],
            capture_output=True, text=True, timeout=900, cwd=ROOT,
            env={**os.environ, "LEDGERMQ_SPARK_OPEN_S": "300"},
        )  # fmt: skip
        print(f"[docker] docker run checked on compose Spark in {time.monotonic() - t3:.0f}s")
        assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-3000:])
        (verdict_file,) = {p.resolve() for p in runs.glob("*/*/results.json")}  # (a "latest" link too)
        verdict = json.loads(verdict_file.read_text())
        assert verdict["valid"] is True
        assert verdict["engine"] == f"spark {g.spark_connect_url}"
    finally:
        g.down()
    assert g.leftovers() == []
    assert (tmp_path / "logs" / "spark-connect.log").exists()
