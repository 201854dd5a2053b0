"""``jepsen spark start|status|stop``: a standalone Spark cluster and a Spark Connect server from pip's pyspark.

pip's pyspark ships Spark's jars and ``bin/spark-class`` but no ``sbin/start-master.sh``,
so users without a cluster had no documented way to get one. This module starts, in the
background, the same JVM classes those scripts start: a standalone ``Master``, one
``Worker`` and a ``SparkConnectServer`` (its jar, ``spark-connect_*.jar``, is part of the
pyspark 4 wheel) whose driver runs on that master. Their PIDs, ports and logs live in a
state folder (``~/.ledgermq/spark`` or ``--state-dir``), so ``status`` and ``stop`` work
from any later shell, and ``jepsen analyze`` finds the running cluster by itself.

The state file is plain JSON. A PID is only ever signalled after checking that
``/proc/PID/cmdline`` still names the Spark class it was started as (PIDs get reused).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.process import free_port

DEFAULT_STATE_DIR = "~/.ledgermq/spark"
STATE_ENV = "LEDGERMQ_SPARK_STATE"
STATE_FILE = "cluster.json"
DEFAULT_HOST = "127.0.0.1"
START_TIMEOUT_S = 120.0  # JVM start-up on a busy 2-core machine takes tens of seconds
STOP_TIMEOUT_S = 20.0
PROBE_TIMEOUT_S = 1.0
DEFAULT_WORKER_MEMORY = "3g"  # room for the Connect server's executor and one more app's
DEFAULT_CONNECT_MEMORY = "1g"
#: the share of the heap Spark's execution and storage share (Spark's default: 0.6). The checks
#: run no user code in the JVM (Python runs in its own workers), so the 40% Spark leaves for it
#: by default mostly sat idle while the per-value aggregation spilled: an 8.5M-operation
#: history on a 6 GB local heap spilled 6.3 GiB from it (its job 27 s); at 0.8 nothing, 18 s.
MEMORY_FRACTION = "0.8"


MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
ROLES = {"master": MASTER_CLASS, "worker": WORKER_CLASS, "connect": CONNECT_CLASS}

_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
"""


class ClusterError(RuntimeError):
    """The cluster could not be started or found; the message is one line for the user."""


@dataclass(slots=True)
class Cluster:
    """What ``start`` wrote: URLs, PIDs, ports and where the logs are."""

    state_dir: Path
    host: str
    master_port: int
    connect_port: int | None
    pids: dict[str, int]
    logs: dict[str, str]

    @property
    def master(self) -> str:
        return f"spark://{self.host}:{self.master_port}"

    @property
    def connect(self) -> str | None:
        return f"sc://{self.host}:{self.connect_port}" if self.connect_port else None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "master_port": self.master_port,
            "connect_port": self.connect_port,
            "pids": self.pids,
            "logs": self.logs,
        }

    def urls(self) -> dict[str, str | None]:
        return {"master": self.master, "connect": self.connect}


def state_dir(path: str | Path | None = None) -> Path:
    return Path(path or os.environ.get(STATE_ENV) or DEFAULT_STATE_DIR).expanduser()


def spark_home() -> Path:
    """The installed pyspark's folder: its ``bin/spark-class`` and ``jars/`` are a Spark home."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ClusterError("pyspark is not installed (pip install pyspark)")
    return Path(spec.origin).parent


def connect_jar(home: Path) -> Path | None:
    """The Spark Connect server jar the wheel ships (pyspark >= 4), or None."""
    found = sorted((home / "jars").glob("spark-connect_*.jar"))
    return found[0] if found else None


def _port_open(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _is_ours(pid: int, role: str) -> bool:
    """The PID is alive and still the Spark class we started (not a reused PID)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return ROLES[role].encode() in cmd


def load(path: str | Path | None = None) -> Cluster | None:
    """The recorded cluster, or None when there is no (readable) state file."""
    d = state_dir(path)
    try:
        raw = json.loads((d / STATE_FILE).read_text())
        return Cluster(
            d,
            str(raw["host"]),
            int(raw["master_port"]),
            int(raw["connect_port"]) if raw.get("connect_port") else None,
            {str(k): int(v) for k, v in raw["pids"].items()},
            {str(k): str(v) for k, v in raw.get("logs", {}).items()},
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def alive(c: Cluster) -> dict[str, bool]:
    """Per role: its process is ours and alive, and its port answers (master, connect)."""
    out = {role: _is_ours(pid, role) for role, pid in c.pids.items()}
    if out.get("master"):
        out["master"] = _port_open(c.host, c.master_port)
    if out.get("connect") and c.connect_port:
        out["connect"] = _port_open(c.host, c.connect_port)
    return out


def running(path: str | Path | None = None) -> Cluster | None:
    """The recorded cluster if all of its processes are up, else None."""
    c = load(path)
    if c is None:
        return None
    up = alive(c)
    return c if up and all(up.values()) else None


def _write_state(c: Cluster) -> None:
    tmp = c.state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(c.to_json(), indent=2) + "\n")
    tmp.replace(c.state_dir / STATE_FILE)


def _env(d: Path, host: str) -> dict[str, str]:
    log4j = d / "log4j2.properties"
    log4j.write_text(_LOG4J2)
    env = dict(os.environ)
    env.update(
        {
            "SPARK_HOME": str(spark_home()),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": host,
            "SPARK_LOCAL_DIRS": str(d / "tmp"),
            "SPARK_WORKER_DIR": str(d / "work"),
            "SPARK_LOG_DIR": str(d / "logs"),
            "SPARK_DAEMON_JAVA_OPTS": f"-Dlog4j2.configurationFile=file:{log4j}",
            # the master's REST submission port is fixed (6066): two clusters would collide
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }
    )
    return env


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: stop signals the group
        )


def _wait(what: str, ready: Any, proc: subprocess.Popen[bytes], log: Path, deadline: float) -> None:
    # liveness from the child's exit status: its cmdline is briefly unreadable while
    # spark-class execs the JVM
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            raise ClusterError(f"the Spark {what} exited during start-up; see {log}")
        time.sleep(0.25)
    raise ClusterError(f"the Spark {what} was not ready within {START_TIMEOUT_S:g} s; see {log}")


def _ui_json(host: str, ui_port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://{host}:{ui_port}/json/", timeout=PROBE_TIMEOUT_S) as r:
            data = json.loads(r.read().decode())
            return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _alive_workers(host: str, ui_port: int) -> int:
    return int(_ui_json(host, ui_port).get("aliveworkers", 0) or 0)


def _running_executors(host: str, worker_ui_port: int) -> int:
    """Executors the worker runs: the Connect server's, once its app got them."""
    return len(_ui_json(host, worker_ui_port).get("executors", []) or [])


def start(
    path: str | Path | None = None,
    *,
    host: str = DEFAULT_HOST,
    master_port: int | None = None,
    connect_port: int | None = None,
    cores: int | None = None,
    memory: str = DEFAULT_WORKER_MEMORY,
    with_connect: bool = True,
) -> Cluster:
    """Start master, worker and (if wanted) the Connect server; returns when all answer.

    Already running: returns the running cluster. A start that fails part-way stops
    what it started.
    """
    d = state_dir(path)
    up = running(d)
    if up is not None:
        return up
    stale = load(d)
    if stale is not None:
        stop(d)
    home = spark_home()
    spark_class = home / "bin" / "spark-class"
    if not spark_class.exists():
        raise ClusterError(f"{spark_class} is missing: this pyspark cannot start JVM daemons")
    jar = connect_jar(home)
    if with_connect and jar is None:
        raise ClusterError(
            f"this pyspark ({home}) ships no spark-connect_*.jar; Spark Connect needs pyspark >= 4 "
            "(or start with --no-connect)"
        )
    for sub in ("logs", "tmp", "work"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    env = _env(d, host)
    mp = master_port or free_port(host)
    ui = free_port(host)
    worker_ui = free_port(host)
    cp = (connect_port or free_port(host)) if with_connect else None
    # Task slots: twice the cores, and the Connect server may hold half of them, so a
    # client that brings its own driver (--master spark://...) still gets executors.
    slots = 2 * (cores or os.cpu_count() or 2)
    logs = {r: str(d / "logs" / f"{r}.log") for r in ("master", "worker", "connect") if r != "connect" or cp}
    c = Cluster(d, host, mp, cp, {}, logs)
    deadline = time.monotonic() + START_TIMEOUT_S
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs["master"] = _spawn(
            [str(spark_class), MASTER_CLASS, "--host", host, "--port", str(mp), "--webui-port", str(ui)],
            Path(logs["master"]),
            env,
        )
        c.pids["master"] = procs["master"].pid
        _write_state(c)
        _wait("master", lambda: _port_open(host, mp), procs["master"], Path(logs["master"]), deadline)
        procs["worker"] = _spawn(
            [
                str(spark_class),
                WORKER_CLASS,
                "--host",
                host,
                "--webui-port",
                str(worker_ui),
                "--cores",
                str(slots),
                "--memory",
                memory,
                "--work-dir",
                str(d / "work"),
                c.master,
            ],
            Path(logs["worker"]),
            env,
        )
        c.pids["worker"] = procs["worker"].pid
        _write_state(c)
        _wait(
            "worker", lambda: _alive_workers(host, ui) >= 1, procs["worker"], Path(logs["worker"]), deadline
        )
        if cp:
            procs["connect"] = _spawn(
                [
                    str(home / "bin" / "spark-submit"),
                    "--class",
                    CONNECT_CLASS,
                    "--name",
                    "ledgermq Spark Connect",
                    "--master",
                    c.master,
                    "--driver-memory",
                    DEFAULT_CONNECT_MEMORY,
                    "--driver-java-options",
                    env["SPARK_DAEMON_JAVA_OPTS"],
                    "--conf",
                    f"spark.connect.grpc.binding.port={cp}",
                    "--conf",
                    f"spark.connect.grpc.binding.address={host}",
                    "--conf",
                    f"spark.driver.host={host}",
                    "--conf",
                    "spark.ui.enabled=false",
                    "--conf",
                    f"spark.memory.fraction={MEMORY_FRACTION}",
                    "--conf",
                    f"spark.cores.max={slots // 2}",
                    "--conf",
                    f"spark.pyspark.python={sys.executable}",
                    "--conf",
                    f"spark.local.dir={d / 'tmp'}",
                    "spark-internal",
                ],
                Path(logs["connect"]),
                env,
            )
            c.pids["connect"] = procs["connect"].pid
            _write_state(c)
            # ready when it listens and its executor runs: the first query then needs no
            # executor start-up (tens of seconds on a busy machine)
            _wait(
                "Connect server",
                lambda: _port_open(host, cp) and _running_executors(host, worker_ui) >= 1,
                procs["connect"],
                Path(logs["connect"]),
                deadline,
            )
    except BaseException:
        stop(d)
        for p in procs.values():  # reap (and make sure of) what this call started
            if p.poll() is None:
                _signal_group(p.pid, signal.SIGKILL)
            p.wait(timeout=STOP_TIMEOUT_S)
        raise
    return c


def stop(path: str | Path | None = None) -> list[str]:
    """Stop every recorded process (TERM, then KILL after STOP_TIMEOUT_S); returns the roles stopped."""
    c = load(path)
    if c is None:
        return []
    stopped = []
    # the Connect driver first: it holds executors on the worker
    order = [r for r in ("connect", "worker", "master") if r in c.pids]
    for role in order:
        pid = c.pids[role]
        if not _is_ours(pid, role):
            continue
        _signal_group(pid, signal.SIGTERM)
        stopped.append(role)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for role in order:
        pid = c.pids[role]
        while _is_ours(pid, role) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if _is_ours(pid, role):
            _signal_group(pid, signal.SIGKILL)
            _reap(pid)
    try:
        (c.state_dir / STATE_FILE).unlink()
    except OSError:
        pass
    return stopped


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # started with start_new_session: the group id is its PID
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child (started in this process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        pass
