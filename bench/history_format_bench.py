"""JSON Lines or Parquet for history shards: recording cost, size on disk, Spark read time.

The same synthetic queue-workload history (95% sends, 5% polls returning 50 pairs, two
keys) is written twice, into a folder of shards each way:

* JSON Lines through the harness's own recorder (``jepsen.history.History``);
* Parquet through ``pyarrow.parquet.ParquetWriter``, buffering columns and writing a row
  group every ``--row-group`` events (what a Parquet recorder would have to do: a
  Parquet file is unreadable until its footer is written, so a crashed recorder loses
  the whole file unless it rolls files).

Then Spark (``local[2]``) reads each folder as the checker does (``frames.load_events`` and
``frames.pair_ops``) and counts the operations, twice (the second run is warm).

    python bench/history_format_bench.py [--ops 500000] [--shards 2]

Ends with one JSON line: jsonl_bytes_per_op, parquet_bytes_per_op, jsonl_record_us_per_op,
parquet_record_us_per_op, jsonl_spark_read_s, parquet_spark_read_s.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from jepsen.checker.frames import FIELDS
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


def write_jsonl(ops: list, folder: Path, shards: int) -> float:
    folder.mkdir(parents=True)
    recs = [History(folder / f"shard-{s:02d}.jsonl", 0, shard=s, shards=shards) for s in range(shards)]
    procs = [r.new_process() for r in recs]
    t = time.perf_counter()
    for i, (f, key, inv, ok, off) in enumerate(ops):
        r, p = recs[i % shards], procs[i % shards]
        r.invoke(p, f, inv, key=key)
        r.complete(p, "ok", f, ok, key=key, offset=off, node="n1")
    for r in recs:
        r.close()
    return time.perf_counter() - t


def write_parquet(ops: list, folder: Path, shards: int, row_group: int) -> float:
    import pyarrow as pa
    import pyarrow.parquet as pq

    kinds = {"long": pa.int64(), "string": pa.string()}
    schema = pa.schema([(name, kinds[kind]) for name, kind in FIELDS])
    folder.mkdir(parents=True)
    t = time.perf_counter()
    writers = [pq.ParquetWriter(folder / f"shard-{s:02d}.parquet", schema) for s in range(shards)]
    cols: list[dict[str, list[Any]]] = [{name: [] for name, _ in FIELDS} for _ in range(shards)]
    counters = [0] * shards

    def add(s: int, typ: str, f: str, key: str, value: Any, offset: int | None, node: str | None) -> None:
        c = cols[s]
        c["index"].append(counters[s] * shards + s)
        counters[s] += 1
        c["time"].append(time.monotonic_ns())
        c["process"].append(str(s))
        c["type"].append(typ)
        c["f"].append(f)
        c["key"].append(key)
        c["value"].append(json.dumps(value, separators=(",", ":")))
        c["error"].append(None)
        c["node"].append(node)
        c["offset"].append(offset)
        if len(c["index"]) >= row_group:
            flush(s)

    def flush(s: int) -> None:
        if cols[s]["index"]:
            writers[s].write_table(pa.table(cols[s], schema=schema))
            cols[s] = {name: [] for name, _ in FIELDS}

    for i, (f, key, inv, ok, off) in enumerate(ops):
        s = i % shards
        add(s, "invoke", f, key, inv, None, None)
        add(s, "ok", f, key, ok, off, "n1")
    for s in range(shards):
        flush(s)
        writers[s].close()
    return time.perf_counter() - t


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
    ap.add_argument("--row-group", type=int, default=65_536)
    args = ap.parse_args()
    ops = synthetic_ops(args.ops)
    with tempfile.TemporaryDirectory(prefix="history-format-") as d:
        jl, pq = Path(d) / "jsonl", Path(d) / "parquet"
        t_jl = write_jsonl(ops, jl, args.shards)
        t_pq = write_parquet(ops, pq, args.shards, args.row_group)
        n = len(ops)
        print(f"{n:,} operations ({2 * n:,} events) in {args.shards} shards")
        print(f"  JSON Lines: {size(jl) / n:6.1f} bytes/op, recorded in {1e6 * t_jl / n:5.2f} us/op")
        print(f"  Parquet   : {size(pq) / n:6.1f} bytes/op, recorded in {1e6 * t_pq / n:5.2f} us/op")
        reads: dict[str, list[float]] = {"jsonl": [], "parquet": []}
        for _ in range(2):
            for fmt, folder in (("jsonl", jl), ("parquet", pq)):
                secs, rows = spark_read(folder, fmt)
                reads[fmt].append(secs)
                assert rows == n, (fmt, rows, n)
        for fmt, secs in reads.items():
            print(f"  Spark local[2] load + pair {fmt:8s}: {secs[0]:.1f} s cold, {secs[1]:.1f} s warm")
        print(
            json.dumps(
                {
                    "ops": n,
                    "jsonl_bytes_per_op": round(size(jl) / n, 1),
                    "parquet_bytes_per_op": round(size(pq) / n, 1),
                    "jsonl_record_us_per_op": round(1e6 * t_jl / n, 2),
                    "parquet_record_us_per_op": round(1e6 * t_pq / n, 2),
                    "jsonl_spark_read_s": round(reads["jsonl"][1], 2),
                    "parquet_spark_read_s": round(reads["parquet"][1], 2),
                }
            )
        )


if __name__ == "__main__":
    main()
