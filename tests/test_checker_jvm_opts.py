"""The checker's driver JVM gets its JIT/GC tuning, and the variable that changes it works.

The tuning is a measured speed-up of whole analyses (``spark.JAVA_OPTS``); these tests
make sure the options are built as documented and really reach the JVM Spark starts, and
that the session started early on a thread (the harness's warm-up) is the one the checker uses.
"""

from __future__ import annotations

import os
import time

import pytest

from jepsen.checker import spark

pytestmark = pytest.mark.timeout(300)


def test_default_options_tune_the_gc_and_keep_logs_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(spark.JAVA_OPTS_ENV, raising=False)
    opts = spark.driver_java_opts().split()
    assert not any(o.startswith("-XX:TieredStopAtLevel") for o in opts)  # C2 pays on large histories
    assert "-XX:+UseParallelGC" in opts
    assert opts[-1].startswith("-Dlog4j2.configurationFile=file:")


def test_empty_variable_drops_the_tuning_but_not_the_log_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spark.JAVA_OPTS_ENV, "  ")
    opts = spark.driver_java_opts().split()
    assert len(opts) == 1
    assert opts[0].startswith("-Dlog4j2.configurationFile=file:")


def test_variable_replaces_the_tuning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spark.JAVA_OPTS_ENV, "-XX:+UseSerialGC")
    opts = spark.driver_java_opts().split()
    assert opts[0] == "-XX:+UseSerialGC"
    assert "-XX:+UseParallelGC" not in opts


def test_the_local_driver_jvm_runs_with_the_options() -> None:
    if os.environ.get(spark.JAVA_OPTS_ENV) is not None:
        pytest.skip(f"${spark.JAVA_OPTS_ENV} is set: the default tuning is not in use")
    session = spark.get_spark("local[2]")
    if spark.is_connect():
        pytest.skip("a Spark Connect session has no driver JVM in this process")
    jvm = session.sparkContext._jvm  # noqa: SLF001 - the JVM this process launched
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    expected = spark.driver_java_opts().split()
    tuning = [a for a in expected if a.startswith("-XX:")]
    assert tuning
    assert [a for a in args if a in tuning] == tuning


def test_the_session_gives_spark_the_memory_share_the_checks_were_measured_with() -> None:
    from jepsen.checker import spark_cluster

    session = spark.get_spark("local[2]")
    if spark.is_connect():
        pytest.skip("a Spark Connect session's memory is the server's")
    conf = session.sparkContext.getConf()
    assert conf.get("spark.memory.fraction") == spark_cluster.MEMORY_FRACTION


def test_a_warm_up_thread_and_the_checker_share_one_session_and_stderr_survives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The harness starts the session on a thread while it validates shards; the checker then
    asks for it too. The session is built once (the second caller waits for it), and the
    JVM's stderr redirection (fd 2, process-wide) is not left pointing at the JVM log by two
    overlapping starts."""
    master = spark.resolve_master()  # the run's own engine (local or a cluster): it is rebuilt here
    builds: list[str | None] = []
    real_open = spark._open_session  # noqa: SLF001

    def slow_open(master: str | None):  # widens the window in which both callers race
        builds.append(master)
        time.sleep(0.5)
        return real_open(master)

    monkeypatch.setattr(spark, "_open_session", slow_open)
    before = os.fstat(2)
    spark.stop_spark()
    warm = spark.SessionWarmUp(master)
    time.sleep(0.1)  # the warm-up is inside its build when the checker asks
    session = spark.get_spark(master)
    warm.wait(180)
    assert builds == [master]
    assert warm.error is None
    assert warm.seconds is not None
    assert spark.get_spark() is session
    assert session.range(3).count() == 3
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)


def test_the_harness_warms_the_checker_only_for_histories_spark_will_judge(tmp_path) -> None:
    from jepsen.checker.inprocess import FAST_PATH_MAX_BYTES
    from jepsen.run.check import warm_up_checker

    small = tmp_path / "small.jsonl"
    small.write_text('{"index":0,"time":0,"process":0,"type":"invoke","f":"read","value":null}\n')
    assert warm_up_checker(small) is None  # judged in-process: no JVM wanted
    large = tmp_path / "large.jsonl"
    line = small.read_bytes()
    large.write_bytes(line * (FAST_PATH_MAX_BYTES // len(line) + 1))  # over the in-process limit
    assert warm_up_checker(large, engine="inprocess") is None
    warm = warm_up_checker(large)
    assert warm is not None
    warm.wait(180)
    assert warm.error is None
    assert spark.get_spark() is not None
