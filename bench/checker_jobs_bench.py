"""Where a log check's time goes: every Spark job it runs, timed, in one process.

Analyzes one history (a JSON Lines file or Parquet folder given with ``--history``, or a
synthetic one of ``--ops`` operations) ``--runs`` times in one session and reports, per
run, the whole analysis and each of the log checker's phases: every ``materialize`` (a
cache or checkpoint: one job) and every ``collect`` (one job), labelled by the function
that asked for it, plus the number of Spark jobs. The checker is not changed: the bench
wraps its functions. Compare two checkouts by running this in each, alternately.

    python bench/checker_jobs_bench.py --ops 1000000 --runs 2
    python bench/checker_jobs_bench.py --history RUN_DIR/history.parquet --runs 3

Ends with one JSON line: {"total_s": median, "jobs": n, "<phase>_s": median, ...}.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jepsen.checker import analyze, log_checker, spark  # noqa: E402
from jepsen.checker.synth import generate_log_history  # noqa: E402

PHASES: dict[str, float] = collections.defaultdict(float)


def _caller() -> str:
    """The first frame outside this file and pyspark: the checker function that ran the job."""
    for fr in inspect.stack()[2:]:
        if fr.filename != __file__ and "pyspark" not in fr.filename:
            return f"{fr.function}:{fr.lineno}"
    return "?"


def _timed(fn, label: str | None = None):
    def wrapper(*args, **kwargs):
        name = label or _caller()
        t0 = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            PHASES[name] += time.monotonic() - t0

    return wrapper


def install() -> None:
    """Wrap the job-running calls (the checker's own code is untouched)."""
    try:
        from pyspark.sql.classic.dataframe import DataFrame
    except ImportError:  # pyspark < 4
        from pyspark.sql import DataFrame

    log_checker.materialize = _timed(spark.materialize)
    spark.materialize = _timed(spark.materialize, "load+pair")
    DataFrame.collect = _timed(DataFrame.collect)
    DataFrame.count = _timed(DataFrame.count)
    DataFrame.toArrow = _timed(DataFrame.toArrow)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", help="a JSON Lines file or Parquet folder (default: synthetic)")
    ap.add_argument("--ops", type=int, default=1_000_000, help="synthetic history size")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--conf", action="append", default=[], help="k=v: a Spark SQL setting for the runs")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="checker-jobs-bench-"))
    path = Path(args.history) if args.history else work / "log.jsonl"
    if not args.history:
        generate_log_history(path, args.ops, seed=args.ops)
    t0 = time.monotonic()
    session = spark.get_spark()
    print(f"session start {time.monotonic() - t0:.1f} s", flush=True)
    install()
    for kv in args.conf:
        k, _, v = kv.partition("=")
        session.conf.set(k, v)
    sc = session.sparkContext
    runs: list[dict[str, float]] = []
    try:
        for i in range(args.runs):
            PHASES.clear()
            sc.setJobGroup(f"bench-{i}", f"run {i}")
            t0 = time.monotonic()
            res = analyze.analyze_files(
                [path], workload="log", out_dir=work / "out", engine="spark", report=False
            )
            total = time.monotonic() - t0
            jobs = len(sc.statusTracker().getJobIdsForGroup(f"bench-{i}"))
            o = res["files"][0]
            counts = (o.result or {}).get("counts")
            row = {"total_s": round(total, 2), "jobs": jobs}
            row.update({f"{k}_s": round(v, 2) for k, v in sorted(PHASES.items())})
            print(f"run {i}: verdict {o.verdict} counts {counts}", flush=True)
            print("  " + json.dumps(row), flush=True)
            runs.append(row)
    finally:
        spark.stop_spark()
    keys = sorted({k for r in runs for k in r})
    print(json.dumps({k: statistics.median(r.get(k, 0) for r in runs) for k in keys}))


if __name__ == "__main__":
    main()
