"""The checker's driver JVM gets its JIT/GC tuning, and the variable that changes it works.

The tuning is a measured speed-up of whole analyses (``spark.JAVA_OPTS``); these tests
make sure the options are built as documented and really reach the JVM Spark starts.
"""

from __future__ import annotations

import os

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
