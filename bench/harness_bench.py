"""How much of the system's capacity a full-rate Jepsen run records, and how fast it is checked.

In one run on this machine:

1. ``python bench/broker_bench.py --quick``: the broker group's batched send rate (the
   capacity; the same group, the same machine, measured just before);
2. ``jepsen run --backend local --workload queue --nemesis kill-leader --rate max --time T``:
   worker processes drive a fresh group as hard as they can while the leader is killed,
   every operation is recorded in the sharded history, and the checker (Spark on
   ``local[2]`` for a history this size) judges it.

The figures: the bench's batched msgs/s, the ok sends per second the run recorded, their
ratio, the history's operations and bytes per operation, the checker's seconds, the
verdict, recovery per kill and each process's peak memory.

    python bench/harness_bench.py [--time 60] [--workers N] [--history-format jsonl|parquet]

Ends with one JSON line: bench_msgs_per_s, recorded_ok_per_s, ratio, ops, check_s,
history_bytes_per_op, check_ops_per_s (the checker's operations per second), spark_start_s
(its session, started while the shards are validated: validate_s), valid, calm_ok_per_s
(ok operations per second between faults), kills, recovery_p50_ms, recovery_max_ms, workers,
worker_peak_rss_mb, worker_cpu_us_per_op, controller_peak_rss_mb,
all_drained (every queue's final drain read the whole queue back: every ok send was judged).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("parquet", "jsonl")  # jepsen.history.SHARD_SUFFIXES (not imported: the bench runs the CLI)


def last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON line in:\n{text[-2000:]}")


def bench_rate() -> float:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "broker_bench.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise RuntimeError(f"broker_bench failed:\n{out.stderr[-2000:]}")
    for line in out.stdout.splitlines():
        if line.startswith("batched send"):
            print(f"  {line}", flush=True)
    return float(last_json(out.stdout)["send_batched_msgs_per_s"])


def harness_run(seconds: float, workers: int | None, out: Path, history_format: str = FORMATS[0]) -> dict:
    argv = [
        sys.executable,
        "-m",
        "jepsen",
        "run",
        "--backend",
        "local",
        "--workload",
        "queue",
        "--nemesis",
        "kill-leader",
        "--rate",
        "max",
        "--time",
        str(seconds),
        "--out",
        str(out),
        "--no-progress",
        "--history-format",
        history_format,
    ]
    if workers is not None:
        argv += ["--workers", str(workers)]
    started = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 1800, cwd=ROOT)
    wall = time.monotonic() - started
    print("\n".join(f"  {line}" for line in res.stdout.strip().splitlines()), flush=True)
    runs = sorted(out.glob("*/2*"))
    if not runs:
        raise RuntimeError(f"jepsen run left no run folder:\n{res.stderr[-2000:]}")
    run_dir = runs[-1]
    summary = json.loads((run_dir / "run.json").read_text())
    summary["wall_s"] = wall
    summary["history_bytes"] = sum(
        f.stat().st_size for pattern in ("*.jsonl", "*.parquet") for f in (run_dir / "history").glob(pattern)
    )
    results = run_dir / "results.json"
    summary["results"] = json.loads(results.read_text()) if results.exists() else {}
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time", type=float, default=60.0, help="seconds of load in the harness run")
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: jepsen run's)")
    ap.add_argument(
        "--history-format",
        choices=FORMATS,
        default=FORMATS[0],
        help="the run's history (jepsen run --history-format); compare formats by alternating invocations",
    )
    args = ap.parse_args()
    print("broker_bench --quick (capacity):", flush=True)
    capacity = bench_rate()
    print(f"jepsen run --rate max --time {args.time:g} (queue, kill-leader):", flush=True)
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as d:
        s = harness_run(args.time, args.workers, Path(d), args.history_format)
    by_f = s.get("counts_by_f", {})
    ok_sends = by_f.get("send:ok", 0)
    ops = sum(s.get("counts", {}).values())
    rate = ok_sends / args.time
    check = s.get("check", {})
    rec = (s["results"].get("recovery") or {}).get("kill-leader", {})
    faults = s["results"].get("faults") or []
    # ok operations per second in the 10 s before each fault: the rate between faults
    calm = statistics.median([x["ok_per_s_before"] for x in faults]) if faults else None
    workers = s.get("workers", [])
    drained = (s.get("workload") or {}).get("drained") or {}
    all_drained = bool(drained) and all(v is not None for v in drained.values())
    worker_rss = max((w.get("peak_rss_mb") or 0 for w in workers), default=0.0)
    worker_cpu_us = sum(w.get("cpu_s") or 0 for w in workers) / max(1, ops) * 1e6
    check_s = check.get("seconds")
    check_rate = ops / check_s if check_s else None
    print(
        f"checker: {ops:,} operations in {check_s} s = {check_rate or 0:,.0f} ops/s (the run recorded "
        f"{ops / args.time:,.0f} ops/s); its Spark session started in {check.get('spark_start_s')} s "
        f"while the shards were validated ({s.get('validate_s')} s), before the check's clock",
        flush=True,
    )
    print(
        f"recorded {ok_sends:,} ok sends in {args.time:g} s = {rate:,.0f}/s = {rate / capacity:.0%} of the "
        f"bench's {capacity:,.0f} msgs/s; {ops:,} operations, {s['history_bytes'] / max(1, ops):.0f} bytes/op; "
        f"checked in {check.get('seconds')} s ({check.get('valid')}); {len(workers)} workers, peak memory "
        f"{worker_rss:.0f} MB per worker, {s.get('controller_peak_rss_mb')} MB controller, "
        f"{worker_cpu_us:.1f} us of worker CPU per operation; "
        f"between faults {calm or 0:,.0f} ok/s (median over the 10 s before each fault); final drains "
        f"{'read ' + format(sum(drained.values()), ',') + ' pairs' if all_drained else 'FAILED: ' + str(drained)} "
        f"in {(s.get('phases') or {}).get('final_done_s', 0) - (s.get('phases') or {}).get('healed_at_s', 0):.1f} s",
        flush=True,
    )
    print(
        json.dumps(
            {
                "bench_msgs_per_s": round(capacity, 1),
                "recorded_ok_per_s": round(rate, 1),
                "ratio": round(rate / capacity, 3),
                "ops": ops,
                "check_s": check.get("seconds"),
                "history_bytes_per_op": round(s["history_bytes"] / max(1, ops), 1),
                "check_ops_per_s": round(check_rate, 1) if check_rate else None,
                "spark_start_s": check.get("spark_start_s"),
                "validate_s": s.get("validate_s"),
                "valid": check.get("valid"),
                "calm_ok_per_s": calm,
                "kills": rec.get("faults", 0),
                "recovery_p50_ms": rec.get("recovery_p50_ms"),
                "recovery_max_ms": rec.get("recovery_max_ms"),
                "workers": len(workers),
                "worker_peak_rss_mb": worker_rss,
                "worker_cpu_us_per_op": round(worker_cpu_us, 1),
                "controller_peak_rss_mb": s.get("controller_peak_rss_mb"),
                "all_drained": all_drained,
                "history_format": args.history_format,
            }
        )
    )


if __name__ == "__main__":
    main()
