"""The checker on a real cluster: `jepsen spark start` (standalone master + worker + Spark Connect).

One cluster is started for the module from pip's pyspark, exactly as a user would start
it, and stopped at the end (every PID checked gone). Each check runs the ``jepsen``
command in its own process, as a user's would, so the test session's own local Spark
session is not in the way. Verdicts must match the local ones: EXPECTED.tsv for the
Porcupine vectors and the in-process results (which ``test_checker_paths`` ties to
local Spark) for log histories.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from common.process import free_port
from jepsen.checker import spark_cluster
from jepsen.checker.analyze import analyze_files
from jepsen.checker.synth import generate_log_history

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT.parent / "shared" / "vectors" / "porcupine"
WANT = {"linearizable": True, "not-linearizable": False}


def jepsen(
    *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    # a driver JVM and an executor starting on a loaded CI machine: the session gets
    # time here (the unreachable-master tests below use the default limits)
    return subprocess.run(
        [sys.executable, "-m", "jepsen", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={"LEDGERMQ_SPARK_OPEN_S": "300", **os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    state = tmp_path_factory.mktemp("spark-state")
    out = jepsen("spark", "start", "--state-dir", str(state), timeout=300)
    c = spark_cluster.load(state)
    try:
        assert out.returncode == 0, out.stderr
        assert c is not None and set(c.pids) == {"master", "worker", "connect"}
        yield c
    finally:
        stopped = jepsen("spark", "stop", "--state-dir", str(state), timeout=120)
        pids = c.pids.values() if c is not None else []
        assert stopped.returncode == 0, stopped.stderr
        assert not [p for p in pids if Path(f"/proc/{p}").exists() and _not_zombie(p)], "JVMs left running"


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_status_json_names_both_urls(cluster: Any) -> None:
    out = jepsen("spark", "status", "--state-dir", str(cluster.state_dir), "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "master": f"spark://127.0.0.1:{cluster.master_port}",
        "connect": f"sc://127.0.0.1:{cluster.connect_port}",
    }


@pytest.fixture(scope="module")
def histories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The Porcupine vectors plus two log histories, with their local (in-process) results."""
    d = tmp_path_factory.mktemp("cluster-histories")
    generate_log_history(d / "log-clean.jsonl", 3_000, seed=11)
    generate_log_history(d / "log-bad.jsonl", 3_000, seed=12, anomalies=True)
    logs = [d / "log-clean.jsonl", d / "log-bad.jsonl"]
    local = analyze_files(logs, out_dir=d / "local", engine="inprocess", report=False)
    expected = {}
    if VECTORS.is_dir():
        for line in (VECTORS / "EXPECTED.tsv").read_text().splitlines():
            if line.strip():
                name, verdict = line.split("\t")[:2]
                expected[str(VECTORS / name)] = WANT[verdict]
    return {"logs": logs, "local": {o.path: o.result for o in local["files"]}, "vectors": expected, "dir": d}


def _check_on(master: str, h: dict[str, Any], out: Path, *extra: str) -> None:
    files = [*h["vectors"], *map(str, h["logs"])]
    res = jepsen(
        "analyze",
        "--engine",
        "spark",
        "--master",
        master,
        "--no-report",
        "--budget",
        "30",
        "--out",
        str(out),
        *extra,
        *files,
    )
    assert res.returncode == 1, res.stderr  # log-bad and half the vectors are invalid
    summary = json.loads((out / "summary.json").read_text())
    wrong = [p for p, want in h["vectors"].items() if summary[p] is not want]
    assert not wrong
    for log in h["logs"]:
        got = json.loads((out / log.stem / "results.json").read_text())
        want = h["local"][str(log)]
        assert got["engine"] == f"spark {master}"
        for field in ("valid", "anomaly-types", "counts", "anomalies"):
            assert got[field] == want[field], (log.name, field)


def test_standalone_master_gives_the_local_verdicts(cluster: Any, histories: dict[str, Any]) -> None:
    _check_on(cluster.master, histories, histories["dir"] / "standalone")


def test_spark_connect_gives_the_local_verdicts_with_shipped_histories(
    cluster: Any, histories: dict[str, Any]
) -> None:
    """Through Connect, the JSON Lines histories go through the session, not as paths."""
    _check_on(cluster.connect, histories, histories["dir"] / "connect", "--ship-history")


def test_running_cluster_is_used_by_default(cluster: Any, histories: dict[str, Any]) -> None:
    out = histories["dir"] / "default"
    res = jepsen(
        "analyze",
        "--engine",
        "spark",
        "--no-report",
        "--out",
        str(out),
        str(histories["logs"][0]),
        env={"LEDGERMQ_SPARK_STATE": str(cluster.state_dir), "LEDGERMQ_SPARK_MASTER": ""},
    )
    assert res.returncode == 0, res.stderr
    got = json.loads((out / histories["logs"][0].stem / "results.json").read_text())
    assert got["engine"] == f"spark {cluster.connect}" and got["valid"] is True


def test_history_uri_is_read_by_the_cluster(cluster: Any, histories: dict[str, Any]) -> None:
    """The executors read the URI given (here file://, any Hadoop URI works), not the local path."""
    log = histories["logs"][1]
    out = histories["dir"] / "by-uri"
    res = jepsen(
        "analyze",
        "--master",
        cluster.connect,
        "--no-report",
        "--out",
        str(out),
        "--history-uri",
        log.as_uri(),
        str(log),
    )
    assert res.returncode == 1, res.stderr
    got = json.loads((out / log.stem / "results.json").read_text())
    assert got["engine"] == f"spark {cluster.connect}"
    assert got["counts"] == histories["local"][str(log)]["counts"]
    bad = jepsen("analyze", "--history-uri", "a", "--history-uri", "b", str(log), timeout=60)
    assert bad.returncode == 2 and "2 --history-uri for 1 histories" in bad.stderr


def _one_line_exit_4(master: str, path: Path, limit_s: float) -> str:
    started = time.monotonic()
    res = jepsen(
        "analyze",
        "--engine",
        "spark",
        "--master",
        master,
        "--out",
        str(path.parent / "x"),
        str(path),
        timeout=limit_s + 60,
        env={"LEDGERMQ_SPARK_OPEN_S": ""},  # the default limits
    )
    elapsed = time.monotonic() - started
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 4, res.stderr
    assert len(lines) == 1 and lines[0].startswith("error: the checker could not run"), res.stderr
    assert elapsed < limit_s, f"{elapsed:.1f} s"
    return lines[0]


@pytest.mark.parametrize("scheme", ["spark", "sc"])
def test_unreachable_master_is_one_line_and_exit_4(scheme: str, tmp_path: Path) -> None:
    h = tmp_path / "h.jsonl"
    generate_log_history(h, 100, seed=1)
    line = _one_line_exit_4(f"{scheme}://127.0.0.1:{free_port()}", h, 15)
    assert "unreachable" in line


def test_connect_url_that_is_not_spark_is_one_line_and_exit_4(tmp_path: Path) -> None:
    """A port that accepts and never answers (not a Spark service): bounded, one line."""
    h = tmp_path / "h.jsonl"
    generate_log_history(h, 100, seed=1)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    done = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while not done.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        line = _one_line_exit_4(f"sc://127.0.0.1:{port}", h, 45)
        assert "ran no task" in line
    finally:
        done.set()
        t.join(5)
        for c in held:
            c.close()
        srv.close()


def test_status_and_stop_without_a_cluster(tmp_path: Path) -> None:
    res = jepsen("spark", "status", "--state-dir", str(tmp_path), "--json", timeout=60)
    assert res.returncode == 1 and "no Spark cluster running" in res.stderr and res.stdout == ""
    res = jepsen("spark", "stop", "--state-dir", str(tmp_path), timeout=60)
    assert res.returncode == 0 and "nothing was running" in res.stdout


def test_stop_never_signals_a_reused_pid(tmp_path: Path) -> None:
    """A recorded PID now held by another program (PIDs get reused) is left alone."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / spark_cluster.STATE_FILE).write_text(
            json.dumps(
                {"host": "127.0.0.1", "master_port": 1, "connect_port": 2, "pids": {"master": other.pid}}
            )
        )
        assert spark_cluster.running(tmp_path) is None
        assert spark_cluster.stop(tmp_path) == []
        assert other.poll() is None, "stop signalled a process that is not the Spark master"
        assert not (tmp_path / spark_cluster.STATE_FILE).exists()
    finally:
        other.kill()
        other.wait(10)
