"""The analysis uses no more partitions than a history's keys can fill, each key in its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jepsen.checker import keyspread
from jepsen.checker.frames import Source
from jepsen.checker.spark import get_spark

pytestmark = pytest.mark.timeout(300)


def _write(path: Path, keys: list[Any], n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            ev = {"index": i, "process": i % 3, "type": "invoke", "f": "send", "value": i}
            if keys[i % len(keys)] is not None:
                ev["key"] = keys[i % len(keys)]
            f.write(json.dumps(ev) + "\n")


def test_keys_are_sampled_from_files_and_shard_folders(tmp_path: Path) -> None:
    _write(tmp_path / "one.jsonl", ["a", "b"], 100)
    shards = tmp_path / "history"
    shards.mkdir()
    _write(shards / "shard-00.jsonl", [None], 5)  # the nemesis shard: no key
    _write(shards / "shard-01.jsonl", ["q/0", 7], 50)
    (shards / "notes.txt").write_text('{"key": "not a shard"}\n')
    got = keyspread.sample_keys(
        [Source(0, str(tmp_path / "one.jsonl"), "jsonl"), Source(1, str(shards), "jsonl")]
    )
    assert got == {(0, "a"), (0, "b"), (1, ""), (1, "q/0"), (1, "7")}
    assert keyspread.sample_keys([Source(0, str(tmp_path / "missing.jsonl"), "jsonl")]) is None
    assert keyspread.sample_keys([Source(0, str(shards), "parquet")]) is None  # no parts there
    from jepsen.checker.shards import to_parquet

    to_parquet(shards, tmp_path / "pq")
    got = keyspread.sample_keys([Source(2, str(tmp_path / "pq"), "parquet")])
    assert got == {(2, ""), (2, "q/0"), (2, "7")}


def test_a_few_keys_get_a_partition_each_and_many_keep_the_size_based_count(tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    spark = get_spark()
    path = tmp_path / "h.jsonl"
    keys = ["JepsenQueue/0", "JepsenQueue/1", "x"]
    _write(path, keys, 300)
    src = [Source(0, str(path), "jsonl")]
    n = keyspread.partitions(src, 22)
    assert 3 <= n < 22
    # Spark's own hash partitioning (what pair_ops uses) puts each key in its own partition
    df = spark.createDataFrame([(0, k) for k in keys], "src int, key string").repartition(n, "src", "key")
    placed = df.select("key", F.spark_partition_id().alias("p")).collect()
    assert len({r["p"] for r in placed}) == len(keys), placed
    many = tmp_path / "many.jsonl"
    _write(many, [f"k{i}" for i in range(40)], 400)
    assert keyspread.partitions([Source(0, str(many), "jsonl")], 22) == 22


def test_the_partition_hash_is_sparks_own() -> None:
    """keyspread computes Spark's Murmur3 hash of (src, key) itself; it must be Spark's, bit for
    bit, for keys of every length modulo 4, non-ASCII keys and the empty key."""
    from pyspark.sql import functions as F

    spark = get_spark()
    pairs = [
        (s, k)
        for s in (0, 1, 7, 123456)
        for k in ("", "a", "ab", "abc", "abcd", "q/0", "JepsenQueue/17", "é队列/3", "x" * 37)
    ]
    rows = (
        spark.createDataFrame(pairs, "src int, key string")
        .select("src", "key", F.hash("src", "key").alias("h"))
        .collect()
    )
    assert len(rows) == len(pairs)
    for r in rows:
        assert keyspread.spark_hash(r["src"], r["key"]) == r["h"], (r["src"], r["key"])
