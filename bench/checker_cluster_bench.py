"""Checker on local[2], a standalone cluster and Spark Connect: the same histories, timed.

Starts a cluster with ``jepsen spark start`` (master, worker, Connect server from pip's
pyspark) in a temporary state folder, generates correct log histories of the given
sizes once, and analyzes each on every engine in a fresh process (one Spark session
per process, as ``jepsen analyze`` has). Session start-up is timed apart from the
analysis. For local and standalone runs the per-stage task counts are read from
Spark's status tracker, which shows how far the plan spreads: on standalone the
session asks for one-core executors (``spark.executor.cores=1``), so its tasks run on
several executors. The cluster is stopped at the end, whatever happens.

    python bench/checker_cluster_bench.py                       # 100k and 1M
    python bench/checker_cluster_bench.py --sizes 100000,1000000,10000000
    python bench/checker_cluster_bench.py --formats jsonl,parquet --engines local --runs 3
    python bench/checker_cluster_bench.py --history RUN_DIR --formats jsonl,parquet --engines local

``--formats``: the same history as JSON Lines and as Parquet parts (converted by Spark into
two shards split by process, as the harness's two workers record them); with several, the runs alternate between them, so a loaded
machine weighs on both alike. Ends with one JSON line: {"<engine>_<size>_s": seconds, ...}
(keys get a ``_<format>`` suffix for formats other than jsonl), plus bytes per operation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jepsen.checker import shards, spark_cluster  # noqa: E402
from jepsen.checker.synth import generate_log_history  # noqa: E402

LABELS = {100_000: "100k", 1_000_000: "1m", 10_000_000: "10m"}

# One analysis in a fresh interpreter; prints one JSON line.
INNER = r"""
import json, sys, time
from jepsen.checker.analyze import analyze_files
from jepsen.checker.spark import get_spark, is_connect
master, path, out = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.monotonic()
spark = get_spark(master)
opened = time.monotonic() - t0
tracker = None if is_connect(master) else spark.sparkContext.statusTracker()
if tracker is not None:
    spark.sparkContext.setJobGroup("bench", "checker bench")
t0 = time.monotonic()
res = analyze_files([path], workload="log", out_dir=out, master=master, engine="spark", report=False)
secs = time.monotonic() - t0
o = res["files"][0]
stages = []
if tracker is not None:
    for job in sorted(tracker.getJobIdsForGroup("bench")):
        info = tracker.getJobInfo(job)
        for sid in sorted(info.stageIds if info else []):
            st = tracker.getStageInfo(sid)
            if st is not None:
                stages.append(st.numTasks)
executors = None if tracker is None else spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - (0 if master.startswith("local") else 1)
print(json.dumps({"open_s": round(opened, 2), "analyze_s": round(secs, 2), "valid": o.valid,
                  "error": o.error, "stages": stages, "executors": executors}))
"""


# JSON Lines -> Parquet parts through Spark (Python's reader takes minutes for 10M operations):
# the checker's own JSON schema and the typed pairs column, one output file per shard
CONVERT = r"""
import sys
from pathlib import Path
from jepsen.checker.spark import get_spark
from jepsen.checker.frames import _schema
from jepsen.checker import columnar
src, dst = sys.argv[1], Path(sys.argv[2])
SHARDS = 2
spark = get_spark("local[2]")
spark.conf.set("spark.sql.files.maxPartitionBytes", str(256 << 20))
from pyspark.sql import functions as F
df = spark.read.schema(_schema(with_src=False, with_corrupt=False)).json(src)
# a read's pairs in the typed column, as the recorder writes them (only where lossless)
typed = F.from_json("value", "array<array<bigint>>")
is_read = F.col("f").isin(*columnar.READ_FS) & (F.col("type") == "ok") & F.col("value").startswith("[")
df = df.withColumn("pairs", F.when(is_read & (F.to_json(typed) == F.col("value")), typed))
df = df.withColumn("value", F.when(F.col("pairs").isNull(), F.col("value")))
# shards as the harness records them: each process's events in one shard, in index order
df = df.repartition(SHARDS, "process").sortWithinPartitions("index")
(df.write.option("compression", "zstd").option("parquet.compression.codec.zstd.level", "1")
   .parquet(str(dst / "spark")))
for i, f in enumerate(sorted((dst / "spark").glob("part-*.parquet"))):
    f.rename(columnar.part_path(dst / f"shard-{i:02d}", 1))
for f in (dst / "spark").iterdir():
    f.unlink()
(dst / "spark").rmdir()
"""


def count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


def to_parquet(path: Path, folder: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    res = subprocess.run(
        [sys.executable, "-c", CONVERT, str(path), str(folder)],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if res.returncode != 0:
        raise SystemExit(f"converting {path} to Parquet failed: {res.stderr[-2000:]}")


def run_inner(master: str, path: Path, out: Path, submit_args: str | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if submit_args:
        env["PYSPARK_SUBMIT_ARGS"] = f"{submit_args} pyspark-shell"
    res = subprocess.run(
        [sys.executable, "-c", INNER, master, str(path), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        raise SystemExit(f"{master}: analysis failed (exit {res.returncode}): {res.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000", help="comma-separated operation counts")
    ap.add_argument("--cores", type=int, default=None, help="cores for the cluster (default: all)")
    ap.add_argument("--runs", type=int, default=1, help="runs per engine and size (median reported)")
    ap.add_argument("--engines", default="local,standalone,connect")
    ap.add_argument("--formats", default="jsonl", help="jsonl, parquet or both (alternating runs)")
    ap.add_argument(
        "--history", default=None, help="a recorded JSON Lines history (run folder) instead of --sizes"
    )
    args = ap.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    sizes = [int(x) for x in args.sizes.split(",") if x]
    engines = [e for e in args.engines.split(",") if e]
    work = Path(tempfile.mkdtemp(prefix="checker-cluster-bench-"))
    state = work / "spark"
    figures: dict[str, float] = {}
    try:
        c = None
        if {"standalone", "connect"} & set(engines):
            t0 = time.monotonic()
            c = spark_cluster.start(state, cores=args.cores)
            print(f"cluster up in {time.monotonic() - t0:.1f} s: {c.master} {c.connect}", flush=True)
        for n in [0] if args.history else sizes:
            if args.history:  # a recorded JSON Lines history; Parquet by the structure-keeping converter
                label = "run"
                path, _ = shards.resolve(args.history)
                events = sum(count_lines(f) for f in shards.shard_files(path))
                n = events // 2  # about: each operation is an invoke and a completion
            else:
                label = LABELS.get(n, str(n))
                path = work / f"log-{label}.jsonl"
                events = generate_log_history(path, n, seed=n).events
            inputs = {"jsonl": Path(path)}
            if "parquet" in formats:
                t0 = time.monotonic()
                if args.history:
                    shards.to_parquet(path, work / f"log-{label}-parquet")
                else:
                    to_parquet(Path(path), work / f"log-{label}-parquet")
                inputs["parquet"] = work / f"log-{label}-parquet"
                print(f"  converted to Parquet in {time.monotonic() - t0:.0f} s", flush=True)
            for fmt in formats:
                size = shards.size_bytes(inputs[fmt])
                figures[f"{fmt}_bytes_per_op_{label}"] = round(size / n, 1)
                print(
                    f"\n{n:,} ops ({events:,} events), {fmt}: {size / 1e6:,.0f} MB = {size / n:.0f} bytes/op",
                    flush=True,
                )
            for engine in engines:
                master = {
                    "local": "local[2]",
                    "standalone": c.master if c else "",
                    "connect": c.connect if c else "",
                }[engine]
                submit = None
                if engine == "standalone":
                    # one-core executors, two of them: the plan's tasks spread over both
                    submit = "--conf spark.executor.cores=1 --conf spark.cores.max=2 --conf spark.executor.memory=1g"
                runs: dict[str, list[dict]] = {fmt: [] for fmt in formats}
                for _ in range(args.runs):  # alternating: A B A B ...
                    for fmt in formats:
                        runs[fmt].append(
                            run_inner(master, inputs[fmt], work / f"out-{engine}-{label}", submit)
                        )
                for fmt in formats:
                    r = runs[fmt][-1]
                    if r["valid"] is not True:
                        raise SystemExit(f"{engine}/{fmt}: correct history judged {r['valid']}: {r['error']}")
                    secs = statistics.median(x["analyze_s"] for x in runs[fmt])
                    all_s = ", ".join(f"{x['analyze_s']:.1f}" for x in runs[fmt])
                    figures[f"{engine}_{label}_s" + ("" if fmt == "jsonl" else f"_{fmt}")] = secs
                    stages = r["stages"]
                    spread = (
                        f"{len(stages)} stages, tasks per stage {min(stages)}-{max(stages)} "
                        f"(median {statistics.median(stages):g}), {r['executors']} executor(s)"
                        if stages
                        else "task counts not visible through Connect"
                    )
                    print(
                        f"  {engine:<10} {fmt:<7} {master:<28} open {r['open_s']:6.1f} s  analyze {secs:7.1f} s "
                        f"= {n / secs:>9,.0f} ops/s  (runs: {all_s})  {spread}",
                        flush=True,
                    )
            if not args.history:
                Path(path).unlink()
            if "parquet" in inputs:
                shutil.rmtree(inputs["parquet"], ignore_errors=True)
    finally:
        spark_cluster.stop(state)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
