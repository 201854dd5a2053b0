"""JSON Lines or Parquet for history shards: recording cost, size on disk, Spark read time.

The same synthetic queue-workload history (95% sends, 5% polls returning 50 pairs, two
keys) is recorded through the harness's own recorder (``jepsen.history.History``) into a
folder of shards each way, ``--runs`` times, alternating: JSON Lines shards, and Parquet
parts (``jepsen.checker.columnar``: a part per 2 s, written on a writer thread, whose CPU
is counted too).

Then Spark (``local[2]``) reads each folder as the checker does (``frames.load_events`` and
``frames.pair_ops``) and counts the operations, twice (the second run is warm).

    python bench/history_format_bench.py [--ops 500000] [--shards 2] [--runs 3]

Ends with one JSON line: jsonl_bytes_per_op, parquet_bytes_per_op, jsonl_record_us_per_op,
parquet_record_us_per_op (and their _cpu_ figures), jsonl_spark_read_s, parquet_spark_read_s.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from jepsen.checker.columnar import PART_SUFFIX
from jepsen.history import History

KEYS = ("JepsenQueue/0", "JepsenQueue/1")


def synthetic_ops(n: int, seed: int = 1) -> list[tuple[str, str, Any, Any, int | None]]:
    """(f, key, invoke value, ok value, offset) per operation."""
    rng = random.Random(seed)
    offsets = dict.fromkeys(KEYS, 0)
    out = []
    for v in range(1, n + 1):
        key = KEYS[v % 2]
        if rng.random() < 0.95:
            out.append(("send", key, v, v, offsets[key]))
            offsets[key] += 1
        else:
            start = max(0, offsets[key] - 60)
            out.append(("poll", key, {"from": start, "max": 50}, [[start + i, i] for i in range(50)], None))
    return out


def record(ops: list, folder: Path, shards: int, suffix: str) -> tuple[float, float]:
    """Record ``ops`` through the harness's recorder into ``shards`` shards of one format;
    returns (wall seconds, CPU seconds of this process, the Parquet writer thread included)."""
    folder.mkdir(parents=True)
    recs = [History(folder / f"shard-{s:02d}{suffix}", 0, shard=s, shards=shards) for s in range(shards)]
    procs = [r.new_process() for r in recs]
    t, c = time.perf_counter(), time.process_time()
    for i, (f, key, inv, ok, off) in enumerate(ops):
        r, p = recs[i % shards], procs[i % shards]
        r.invoke(p, f, inv, key=key)
        r.complete(p, "ok", f, ok, key=key, offset=off, node="n1")
    for r in recs:
        r.close()
    return time.perf_counter() - t, time.process_time() - c


def spark_read(folder: Path, fmt: str) -> tuple[float, int]:
    from jepsen.checker import frames
    from jepsen.checker.spark import get_spark

    spark = get_spark(None)
    t = time.perf_counter()
    n = frames.pair_ops(frames.load_events(spark, [frames.Source(0, str(folder), fmt)]), 4).count()
    return time.perf_counter() - t, n


def size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=500_000)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="alternating recordings per format (median)")
    args = ap.parse_args()
    ops = synthetic_ops(args.ops)
    n = len(ops)
    with tempfile.TemporaryDirectory(prefix="history-format-") as d:
        folders = {"jsonl": Path(d) / "jsonl", "parquet": Path(d) / "parquet"}
        rec: dict[str, list[tuple[float, float]]] = {"jsonl": [], "parquet": []}
        for _ in range(args.runs):
            for fmt, folder in folders.items():
                shutil.rmtree(folder, ignore_errors=True)
                rec[fmt].append(record(ops, folder, args.shards, ".jsonl" if fmt == "jsonl" else PART_SUFFIX))
        us = {fmt: 1e6 * statistics.median(w for w, _ in r) / n for fmt, r in rec.items()}
        cpu = {fmt: 1e6 * statistics.median(c for _, c in r) / n for fmt, r in rec.items()}
        print(
            f"{n:,} operations ({2 * n:,} events) in {args.shards} shards, median of {args.runs} recordings"
        )
        for fmt, folder in folders.items():
            print(
                f"  {fmt:8s}: {size(folder) / n:6.1f} bytes/op, recorded in {us[fmt]:5.2f} us/op "
                f"({cpu[fmt]:5.2f} us/op CPU)"
            )
        reads: dict[str, list[float]] = {"jsonl": [], "parquet": []}
        for _ in range(2):
            for fmt, folder in folders.items():
                secs, rows = spark_read(folder, fmt)
                reads[fmt].append(secs)
                assert rows == n, (fmt, rows, n)
        for fmt, secs in reads.items():
            print(f"  Spark local[2] load + pair {fmt:8s}: {secs[0]:.1f} s cold, {secs[1]:.1f} s warm")
        print(
            json.dumps(
                {
                    "ops": n,
                    "jsonl_bytes_per_op": round(size(folders["jsonl"]) / n, 1),
                    "parquet_bytes_per_op": round(size(folders["parquet"]) / n, 1),
                    "jsonl_record_us_per_op": round(us["jsonl"], 2),
                    "parquet_record_us_per_op": round(us["parquet"], 2),
                    "jsonl_record_cpu_us_per_op": round(cpu["jsonl"], 2),
                    "parquet_record_cpu_us_per_op": round(cpu["parquet"], 2),
                    "jsonl_spark_read_s": round(reads["jsonl"][1], 2),
                    "parquet_spark_read_s": round(reads["parquet"][1], 2),
                }
            )
        )


if __name__ == "__main__":
    main()
