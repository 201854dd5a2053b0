"""Small histories, end to end: ``jepsen analyze`` wall time as a user sees it.

Each figure is a fresh ``python -m jepsen analyze`` process (interpreter, imports,
reading, checking, results.json and report.html), median of ``--runs``:

* a 10k-operation log history and the 102 Porcupine etcd vectors in one call, with
  the default engine (``auto``: in-process, no JVM);
* the same on Spark local[2] (``--engine spark``: what every call cost before), once;
* with a running ``jepsen spark start`` cluster: ``auto`` again, and ``--engine spark``,
  which then reuses the cluster's Connect server by itself (no JVM in the client).

Targets: 10k operations under 5 s with no cluster and under 2 s with one running; the
102 etcd vectors under 10 s. Ends with one JSON line.

    python bench/checker_small_bench.py [--runs 5] [--no-spark] [--no-cluster]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jepsen.checker import spark_cluster  # noqa: E402
from jepsen.checker.synth import generate_log_history  # noqa: E402

VECTORS = ROOT.parent / "shared" / "vectors" / "porcupine"


def analyze(args: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "jepsen", "analyze", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    secs = time.monotonic() - t0
    if res.returncode not in (0, 1):
        raise SystemExit(
            f"jepsen analyze {' '.join(args[:4])}... exited {res.returncode}: {res.stderr[-1500:]}"
        )
    return secs, res.returncode


def timed(label: str, args: list[str], env: dict[str, str], runs: int, want_exit: int) -> float:
    times = []
    for _ in range(runs):
        secs, code = analyze(args, env)
        if code != want_exit:
            raise SystemExit(f"{label}: exit {code}, expected {want_exit}")
        times.append(secs)
    med = statistics.median(times)
    print(f"  {label:<48} median {med:6.2f} s  (runs: {', '.join(f'{t:.2f}' for t in times)})", flush=True)
    return round(med, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--no-spark", action="store_true", help="skip the local[2] baseline")
    ap.add_argument("--no-cluster", action="store_true", help="skip the runs with `jepsen spark start`")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="checker-small-bench-"))
    hist = work / "log.jsonl"
    generate_log_history(hist, args.ops, seed=7)
    etcd = sorted(str(p) for p in (VECTORS / "etcd").glob("*.log"))
    state = work / "spark"
    env = {k: v for k, v in os.environ.items() if k != "LEDGERMQ_SPARK_MASTER"}
    env["LEDGERMQ_SPARK_STATE"] = str(state)  # no cluster there unless this bench starts one
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    out = str(work / "out")
    fig: dict[str, float] = {}
    n = f"{args.ops // 1000}k"
    print(
        f"{args.ops:,}-op log history ({hist.stat().st_size / 1e6:.1f} MB); {len(etcd)} etcd vectors",
        flush=True,
    )
    print("no cluster running:", flush=True)
    fig[f"auto_{n}_s"] = timed(f"{n} ops, auto (in-process)", ["--out", out, str(hist)], env, args.runs, 0)
    fig[f"auto_{n}_no_report_s"] = timed(
        f"{n} ops, auto, --no-report", ["--out", out, "--no-report", str(hist)], env, args.runs, 0
    )
    fig["auto_etcd102_s"] = timed(f"{len(etcd)} etcd vectors, auto", ["--out", out, *etcd], env, args.runs, 1)
    if not args.no_spark:
        spark = ["--engine", "spark", "--master", "local[2]", "--out", out]
        fig[f"spark_local_{n}_s"] = timed(
            f"{n} ops, Spark local[2] (the old path)", [*spark, str(hist)], env, 1, 0
        )
        fig["spark_local_etcd102_s"] = timed(
            f"{len(etcd)} etcd vectors, Spark local[2]", [*spark, *etcd], env, 1, 1
        )
    if not args.no_cluster:
        t0 = time.monotonic()
        c = spark_cluster.start(state)
        print(
            f"with `jepsen spark start` running (up in {time.monotonic() - t0:.1f} s, {c.connect}):",
            flush=True,
        )
        try:
            fig[f"cluster_auto_{n}_s"] = timed(f"{n} ops, auto", ["--out", out, str(hist)], env, args.runs, 0)
            spark = ["--engine", "spark", "--out", out]
            fig[f"cluster_connect_{n}_s"] = timed(
                f"{n} ops, --engine spark (reuses Connect)",
                [*spark, str(hist)],
                env,
                max(1, args.runs // 2),
                0,
            )
            fig["cluster_connect_etcd102_s"] = timed(
                f"{len(etcd)} etcd vectors, --engine spark (Connect)", [*spark, *etcd], env, 1, 1
            )
        finally:
            spark_cluster.stop(state)
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
