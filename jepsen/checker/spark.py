"""One Spark session per process, built lazily and reused.

Starting a JVM costs seconds, so every analysis (and the whole test run) shares one
session. Local mode is the default because a checker must work on a laptop with no
cluster; ``spark://`` goes to a standalone master and ``sc://`` to Spark Connect.
The analysis itself only uses the DataFrame API so it runs unchanged on all three.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_SESSION: SparkSession | None = None
_MASTER: str | None = None
# One session is built at a time: a warm-up thread (SessionWarmUp) and the checker
# may both ask for it, and Spark allows one per JVM.
_OPEN_LOCK = threading.Lock()

DEFAULT_MASTER = "local[2]"
MASTER_ENV = "LEDGERMQ_SPARK_MASTER"
# An unreachable or failing master must fail within about 15 s, as one line.
CONNECT_PROBE_S = 5.0  # TCP connect to the master's / Connect server's port
OPEN_CONNECT_S = 30.0  # a Connect server must answer and run one task by then (15 s was short at load 15)
# A standalone master: our own driver JVM's start-up, registration and an executor's
# launch: 35-70 s were measured on this 2-core machine at load 15-18. A refused or unroutable
# address fails in CONNECT_PROBE_S instead.
OPEN_STANDALONE_S = 90.0
OPEN_TIMEOUT_ENV = "LEDGERMQ_SPARK_OPEN_S"  # overrides both limits (seconds)

# The driver JVM's garbage collection, tuned for a short batch job on few cores: the
# throughput collector (no concurrent marking threads taking a core from the two task
# threads). The JIT keeps its defaults. Stopping at C1 (quick, lightly optimised code) had
# helped when four other builds shared these two cores (a 779k-operation history: 41 -> 36 s),
# but C2's code is what large histories need: a 2.1M-operation `--rate max` history took
# 101 s with C1 and 79-81 s with C2 (160-180 s against 83-89 s in a busier hour), the JSON
# read and pairing job 43 -> 21 s (the window's sort alone 13 -> 3.5 s), and checker_bench's
# 1M operations 62 -> 43 s; the session starts about 1 s slower. G1 instead of the
# throughput collector: 90 s. Set the variable to change them ("" = the JVM's defaults).
JAVA_OPTS = "-XX:+UseParallelGC"
JAVA_OPTS_ENV = "LEDGERMQ_SPARK_JAVA_OPTS"


def driver_java_opts() -> str:
    """JVM options of the driver (local mode: driver and executors): JIT/GC tuning, quiet logs."""
    tuning = os.environ.get(JAVA_OPTS_ENV, JAVA_OPTS).strip()
    return " ".join(x for x in (tuning, f"-Dlog4j2.configurationFile=file:{_log4j_file()}") if x)


def jvm_log_path() -> Path:
    """Where the driver JVM's stderr goes (Spark's warnings, Java traces)."""
    return Path(tempfile.gettempdir()) / f"ledgermq-checker-jvm-{os.getuid()}.log"


class SparkUnavailable(RuntimeError):
    """The Spark master or Connect server cannot run the checker; one line for the user."""


def resolve_master(master: str | None = None) -> str:
    """The master to use: the given one, else $LEDGERMQ_SPARK_MASTER, else the Connect
    server of a running ``jepsen spark start`` cluster, else local[2]."""
    if master:
        return master
    if os.environ.get(MASTER_ENV):
        return os.environ[MASTER_ENV]
    from jepsen.checker import spark_cluster

    c = spark_cluster.running()
    if c is not None:
        return c.connect or c.master
    return DEFAULT_MASTER


LOOPBACK = ("localhost", "127.0.0.1", "::1", "ip6-localhost")


def is_remote_master(master: str) -> bool:
    """True when the master's executors may not share this machine's files (another host)."""
    hp = _host_port(master)
    if hp is None:
        return False
    import socket

    host = hp[0]
    return not (host in LOOPBACK or host.startswith("127.") or host == socket.gethostname())


def _host_port(master: str) -> tuple[str, int] | None:
    """(host, port) of a spark:// or sc:// URL (the first master of a list), else None."""
    from urllib.parse import urlparse

    if not master.startswith(("spark://", "sc://")):
        return None
    first = master.split(",")[0]
    u = urlparse(first)
    default = 7077 if master.startswith("spark://") else 15002
    try:
        return (u.hostname or "localhost", u.port or default)
    except ValueError as exc:
        raise SparkUnavailable(f"bad Spark master URL {master!r}: {exc}") from None


def probe_reachable(master: str, timeout: float = CONNECT_PROBE_S) -> None:
    """Fail fast, as one line, when nothing listens at the master's address."""
    import socket

    hp = _host_port(master)
    if hp is None:
        return
    try:
        with socket.create_connection(hp, timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SparkUnavailable(f"Spark master {master} is unreachable: {reason}") from None


_CONNECT_PROBE = """
import sys
from pyspark.sql import SparkSession
SparkSession.builder.remote(sys.argv[1]).getOrCreate().range(1).collect()
"""


def probe_connect(master: str, timeout: float) -> None:
    """Ask the Connect server for one tiny job from a child process, killed after ``timeout``.

    A Connect client that gets no answer retries for minutes in pool threads that
    interpreter shutdown then waits for; in a child they die with it, so a caller (the
    harness, a test) is never left hanging by a server that is not there.
    """
    import subprocess

    try:
        res = subprocess.run(
            [sys.executable, "-c", _CONNECT_PROBE, master],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise SparkUnavailable(
            f"Spark master {master} accepted the connection but ran no task within {timeout:g} s "
            "(not a Spark Connect service, or no live worker with free cores and memory)"
        ) from None
    if res.returncode != 0:
        lines = [ln.strip() for ln in res.stderr.splitlines() if ln.strip()]
        why = next(
            (ln for ln in reversed(lines) if "Error" in ln or "Exception" in ln), lines[-1] if lines else ""
        )
        raise SparkUnavailable(f"Spark master {master} failed a probe job: {why[:300]}")


def _open_bounded(builder: Any, master: str, timeout: float) -> SparkSession:
    """Create the session and run one tiny job, all within ``timeout``.

    A standalone master that is not answering makes ``getOrCreate`` wait out Spark's
    fixed registration retries (3 x 20 s) and a Connect client retries for minutes, so
    both run in a thread that is given up after ``timeout``; the driver JVM we launched
    is then killed, and the caller gets one line.
    """
    import threading

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            session = builder.getOrCreate()
            outcome["session"] = session
            session.range(1).collect()
            outcome["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - reported below as one line
            outcome["error"] = exc

    t = threading.Thread(target=run, name="spark-open", daemon=True)
    t.start()
    t.join(timeout)
    if outcome.get("ok"):
        return outcome["session"]
    err = outcome.get("error")  # before giving up: killing the JVM makes errors of its own
    _give_up(outcome.get("session"), master)
    if err is not None:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SparkUnavailable(f"Spark master {master} failed: {first[:300]}")
    raise SparkUnavailable(
        f"Spark master {master} accepted the connection but ran no task within {timeout:g} s "
        "(not a Spark service, or no live worker with free cores and memory)"
    )


def _give_up(session: Any, master: str) -> None:
    """Drop a session that never worked: interrupt it, stop it, kill the driver JVM we launched."""
    try:
        if session is not None and master.startswith("sc://"):
            session.interruptAll()
    except Exception:  # noqa: BLE001, S110 - best effort
        pass
    if master.startswith("sc://"):
        return
    try:
        from pyspark import SparkContext

        gw = SparkContext._gateway  # noqa: SLF001 - the JVM this process launched
        proc = getattr(gw, "proc", None) if gw is not None else None
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)
        SparkContext._gateway = None  # noqa: SLF001
        SparkContext._jvm = None  # noqa: SLF001
        SparkContext._active_spark_context = None  # noqa: SLF001
    except Exception:  # noqa: BLE001, S110 - best effort
        pass


@contextmanager
def jvm_stderr_to(path: Path) -> Iterator[None]:
    """Send what the driver JVM writes to stderr into ``path`` (it inherits fd 2 at launch).

    Spark's start-up warnings and Java traces are not for the terminal: the checker
    reports failures itself, as one line, and names this file for the details.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


# Spark's own start-up chatter (log4j defaults banner, native-hadoop warning) goes to
# stderr before setLogLevel can run; a config file given to the JVM silences it.
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
# PySpark counts as a shell; a level set here stops the "Setting default log level" banner.
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
"""


def _log4j_file() -> str:
    path = Path(tempfile.gettempdir()) / "ledgermq-checker-log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        path.write_text(_LOG4J2)
    return str(path)


def _quiet_python_warnings() -> None:
    # pyspark warns about pandas >= 3 on import; the checker uses Arrow, not pandas UDFs.
    warnings.filterwarnings("ignore", message=".*pandas.*", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="pyspark")


def _require_connect(master: str) -> None:
    """Fail clearly: without its extras pyspark's Connect client exits the process."""
    import importlib.util

    missing = [m for m in ("grpc", "grpc_status") if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(
            f"cannot use Spark master {master!r}: Spark Connect needs "
            f"{', '.join(missing)} (pip install 'pyspark[connect]')"
        )


def get_spark(master: str | None = None) -> SparkSession:
    """Return the process's Spark session, creating it on first use.

    A later call with a different master reuses the existing session (Spark allows one
    per JVM) unless ``stop_spark`` was called first.
    """
    if _SESSION is not None:
        return _SESSION
    with _OPEN_LOCK:
        if _SESSION is not None:  # another thread built it while this one waited
            return _SESSION
        return _open_session(master)


#: the local driver's heap (driver and executors in local mode): ``$LEDGERMQ_SPARK_MEMORY``, else
#: this share of the memory this process may use, within the bounds below
MEMORY_ENV = "LEDGERMQ_SPARK_MEMORY"
MEMORY_SHARE = 4
MEMORY_MIN_MB = 3 << 10
MEMORY_MAX_MB = 8 << 10


def _usable_memory_mb() -> int | None:
    """Physical memory, or the cgroup's limit when lower (a container's); None if unknown."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total >> 20


def driver_memory() -> str:
    """The local driver's heap. A full-rate history's per-value aggregation spilled gigabytes to
    disk at 3 GB (5.7M operations: 4.1 GiB spilled, the job 55 s; at 8 GB nothing spilled, 44 s),
    so the heap grows with the machine: a quarter of its memory, 3-8 GB. The JVM takes it
    from the system only as it fills."""
    named = os.environ.get(MEMORY_ENV)
    if named:
        return named
    usable = _usable_memory_mb()
    if usable is None:
        return f"{MEMORY_MIN_MB}m"
    return f"{max(MEMORY_MIN_MB, min(MEMORY_MAX_MB, usable // MEMORY_SHARE))}m"


def memory_bytes(text: str) -> int:
    """A JVM memory size (``6038m``, ``3g``, ``512k``, bytes) in bytes."""
    t = text.strip().lower().removesuffix("b")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in "kmgt" else t
    return int(digits) * scale


def local_heap_bytes() -> int:
    """The heap a local session's driver JVM gets (``driver_memory``)."""
    return memory_bytes(driver_memory())


def _open_session(master: str | None) -> SparkSession:
    global _SESSION, _MASTER
    _quiet_python_warnings()
    from pyspark.sql import SparkSession

    from jepsen.checker import spark_cluster

    master = resolve_master(master)
    probe_reachable(master)
    partitions = os.environ.get("LEDGERMQ_SPARK_PARTITIONS", "8")
    builder = SparkSession.builder.appName("ledgermq-checker")
    if master.startswith("sc://"):
        _require_connect(master)
        probe_connect(master, float(os.environ.get(OPEN_TIMEOUT_ENV) or OPEN_CONNECT_S))
        builder = builder.remote(master)
    else:
        # Workers must import the jepsen package; in local mode they inherit this env.
        root = str(Path(__file__).resolve().parents[2])
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if root not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        java_opts = driver_java_opts()
        builder = (
            builder.master(master)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", driver_memory())
            .config("spark.memory.fraction", spark_cluster.MEMORY_FRACTION)
            .config("spark.driver.extraJavaOptions", java_opts)
            .config("spark.sql.session.timeZone", "UTC")
        )
    builder = (
        builder.config("spark.sql.shuffle.partitions", partitions)
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    log = jvm_log_path()
    with jvm_stderr_to(log):
        if master.startswith("local"):
            session = builder.getOrCreate()
        else:
            timeout = OPEN_CONNECT_S if master.startswith("sc://") else OPEN_STANDALONE_S
            timeout = float(os.environ.get(OPEN_TIMEOUT_ENV) or timeout)
            session = _open_bounded(builder, master, timeout)
    if not master.startswith("sc://"):
        session.sparkContext.setLogLevel("ERROR")
    _SESSION, _MASTER = session, master
    return session


class SessionWarmUp:
    """The session started on a daemon thread while this process still has other work.

    A driver JVM takes seconds to start (about 6 s on this 2-core machine). A harness that
    will check a large history starts it as soon as the load has stopped, so that it starts
    while the shards are validated instead of after. A failure is not reported here: the
    checker's own ``get_spark`` then tries again and reports it as it always does.
    """

    def __init__(self, master: str | None = None) -> None:
        self.seconds: float | None = None  # how long the start took, once it has finished
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, args=(master,), name="spark-warm-up", daemon=True)
        self._thread.start()

    def _run(self, master: str | None) -> None:
        started = time.monotonic()
        try:
            get_spark(master)
        except Exception as exc:  # noqa: BLE001 - left for the checker's own attempt to report
            self.error = f"{type(exc).__name__}: {exc}"
        self.seconds = round(time.monotonic() - started, 3)

    def wait(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


def stop_spark() -> None:
    """Stop the cached session (tests and the bench call this at exit)."""
    global _SESSION, _MASTER
    if _SESSION is not None:
        _SESSION.stop()
    _SESSION, _MASTER = None, None


def master_in_use() -> str | None:
    """The master URL of the current session (None before one exists)."""
    return _MASTER


def is_connect(master: str | None = None) -> bool:
    """True when the session is Spark Connect (no SparkContext, no RDDs)."""
    m = master or _MASTER or ""
    return m.startswith("sc://")


def materialize(df: DataFrame, cut_lineage: bool, eager: bool = True) -> DataFrame:
    """Compute ``df`` once for the many checks that read it; free it with :func:`release`.

    With ``cut_lineage`` it becomes a local checkpoint: the checks' plans then start from
    it instead of re-analysing everything that built it, which on small histories is
    about half the time (11k operations: 10 s -> 5 s warm; 1M: 38 s -> 29 s). Very large
    inputs use the cache instead: there the gain is gone (10M: 195 s either way), and its
    compressed columnar form holds several times more in memory than checkpointed rows.

    ``eager=False`` runs no job of its own: the first job that reads ``df`` computes and
    keeps it (a cached or checkpointed partition is computed once, by whichever task needs
    it first; a later task waits for it), so frames read by the next action anyway cost no
    separate pass and no job start (a job per frame was most of a small history's check).
    The plan is still cut here, and the cache's partitioning is known from its plan.
    """
    if cut_lineage:
        return df.localCheckpoint(eager=eager)
    df = df.cache()
    if eager:
        df.count()
    if os.environ.get("LEDGERMQ_NO_LEAF"):
        return df
    return _cached_leaf(df)


def _cached_leaf(df: DataFrame) -> DataFrame:
    """A DataFrame whose plan starts at ``df``'s cached data.

    A query on a cached DataFrame still carries the whole lineage that built it: Spark
    analyses and optimises all of it, then matches it piece by piece against the cache, for
    every query. The log checks build dozens of queries on several caches of one lineage, so
    that planning was seconds of a large check with the two task threads idle. A plan that
    starts at the cached relation (with the same partitioning and ordering) skips it. Classic
    sessions only: Spark Connect gives no JVM handle, and there ``df`` itself is used.
    """
    from py4j.protocol import Py4JError

    session = df.sparkSession
    try:
        jspark = session._jsparkSession  # type: ignore[attr-defined]
        found = jspark.sharedState().cacheManager().lookupCachedData(df._jdf)  # type: ignore[attr-defined]
        if not found.isDefined():
            return df
        relation = found.get().cachedRepresentation()
        jvm = session._jvm  # type: ignore[attr-defined]
        leaf = type(df)(jvm.org.apache.spark.sql.classic.Dataset.ofRows(jspark, relation), session)
    except (AttributeError, Py4JError):
        return df
    leaf._ledgermq_cache_of = df  # type: ignore[attr-defined] - what release() unpersists
    return leaf


def release(df: DataFrame) -> None:
    """Free what :func:`materialize` kept (a no-op on a local checkpoint, which Spark drops
    once unreferenced)."""
    getattr(df, "__dict__", {}).get("_ledgermq_cache_of", df).unpersist()
