"""The local Spark driver's heap and what the checker keeps uncompressed in it
(``spark.driver_memory``, ``analyze.uncompressed_cache_bytes``): named sizes are obeyed, the
default grows with the machine within its bounds, and the cache bound follows the heap."""

from __future__ import annotations

import pytest

from jepsen.checker import analyze, spark


def test_memory_sizes_read_as_the_jvm_reads_them() -> None:
    assert spark.memory_bytes("3g") == 3 << 30
    assert spark.memory_bytes("6038m") == 6038 << 20
    assert spark.memory_bytes("512K") == 512 << 10
    assert spark.memory_bytes("1024") == 1024


def test_a_named_heap_wins_and_the_default_stays_within_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spark.MEMORY_ENV, "5g")
    assert spark.driver_memory() == "5g"
    monkeypatch.delenv(spark.MEMORY_ENV)
    for usable, want in (
        (2 << 10, spark.MEMORY_MIN_MB),
        (24 << 10, 6 << 10),
        (256 << 10, spark.MEMORY_MAX_MB),
    ):
        monkeypatch.setattr(spark, "_usable_memory_mb", lambda usable=usable: usable)
        assert spark.driver_memory() == f"{want}m"
    monkeypatch.setattr(spark, "_usable_memory_mb", lambda: None)
    assert spark.driver_memory() == f"{spark.MEMORY_MIN_MB}m"


def test_the_uncompressed_cache_bound_follows_a_local_heap_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spark.MEMORY_ENV, "8g")
    monkeypatch.setattr(spark, "_MASTER", "local[2]")
    assert analyze.uncompressed_cache_bytes() == 4 << 30
    assert analyze.analysis_conf(4, 3 << 30)["spark.sql.inMemoryColumnarStorage.compressed"] == "false"
    assert analyze.analysis_conf(4, 5 << 30)["spark.sql.inMemoryColumnarStorage.compressed"] == "true"
    monkeypatch.setenv(spark.MEMORY_ENV, "1g")
    assert analyze.uncompressed_cache_bytes() == analyze.UNCOMPRESSED_CACHE_BYTES
    monkeypatch.setattr(spark, "_MASTER", "spark://127.0.0.1:7077")
    monkeypatch.setenv(spark.MEMORY_ENV, "8g")
    assert analyze.uncompressed_cache_bytes() == analyze.UNCOMPRESSED_CACHE_BYTES
