"""Checker benchmark: analyze synthetic log histories of 100k, 1M (and 10M) operations.

Generates a correct history of N operations with ``jepsen.checker.synth`` (and an
anomalous one, which must be caught), times ``analyze`` on each in Spark local mode,
then times the 102 Porcupine etcd histories in one call and checks their verdicts.
Spark start-up is measured once and reported apart; every analysis after it reuses
the session, as ``jepsen analyze`` with many files does.

Targets (2-core machine): 1M operations under 60 s, 10M under 10 min, the 102 etcd
histories under 30 s together. Ends with one JSON line.

    python bench/checker_bench.py --quick      # 100k and 1M
    python bench/checker_bench.py              # 100k, 1M and 10M
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jepsen.checker.analyze import analyze_files  # noqa: E402
from jepsen.checker.spark import get_spark, stop_spark  # noqa: E402
from jepsen.checker.synth import generate_log_history  # noqa: E402

VECTORS = ROOT.parent / "shared" / "vectors" / "porcupine"
LABELS = {100_000: "100k", 1_000_000: "1m", 10_000_000: "10m"}


def _label(n: int) -> str:
    return LABELS.get(n, str(n))


def bench_log(work: Path, n: int, master: str | None, report: bool) -> dict[str, float]:
    path = work / f"log-{_label(n)}.jsonl"
    t0 = time.monotonic()
    st = generate_log_history(path, n, seed=n)
    gen = time.monotonic() - t0
    size_mb = path.stat().st_size / 1e6
    t0 = time.monotonic()
    res = analyze_files([path], workload="log", out_dir=work / "out", master=master, report=report)
    secs = time.monotonic() - t0
    o = res["files"][0]
    if o.valid is not True:
        raise SystemExit(f"correct {n}-op history judged {o.verdict}: {o.error or o.result.get('counts')}")
    print(
        f"log {n:>10,} ops ({st.events:,} events, {size_mb:,.0f} MB; generated in {gen:.1f} s): "
        f"analyze {secs:.1f} s = {n / secs:,.0f} ops/s",
        flush=True,
    )
    path.unlink()
    return {f"seconds_{_label(n)}": round(secs, 2), f"ops_per_s_{_label(n)}": round(n / secs)}


def bench_anomalous(work: Path, n: int, master: str | None) -> dict[str, object]:
    path = work / f"log-bad-{_label(n)}.jsonl"
    st = generate_log_history(path, n, seed=n + 1, anomalies=True)
    t0 = time.monotonic()
    res = analyze_files([path], workload="log", out_dir=work / "out", master=master)
    secs = time.monotonic() - t0
    o = res["files"][0]
    found = o.result.get("anomaly-types", [])
    missed = sorted(set(st.planted) - set(found))
    print(
        f"anomalous {n:,} ops: {o.verdict} in {secs:.1f} s, found {found}, planted {sorted(st.planted)}",
        flush=True,
    )
    if o.valid is not False or missed:
        raise SystemExit(f"planted anomalies not all found: missed {missed}")
    return {f"anomalous_{_label(n)}_seconds": round(secs, 2), "anomalous_found": found}


def bench_etcd(work: Path, master: str | None) -> dict[str, object]:
    expected = dict(
        line.rstrip("\n").split("\t") for line in (VECTORS / "EXPECTED.tsv").open() if line.strip()
    )
    files = sorted(str(VECTORS / k) for k in expected if k.startswith("etcd/"))
    t0 = time.monotonic()
    res = analyze_files(files, out_dir=work / "etcd", master=master)
    secs = time.monotonic() - t0
    wrong = [
        p for p, v in res["summary"].items() if v is not (expected["etcd/" + Path(p).name] == "linearizable")
    ]
    print(
        f"etcd: {len(files)} histories in {secs:.1f} s, {len(wrong)} verdicts differ from EXPECTED.tsv",
        flush=True,
    )
    return {"etcd_102_seconds": round(secs, 2), "etcd_mismatches": len(wrong)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100k and 1M only")
    ap.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="comma-separated operation counts (overrides --quick)",
    )
    ap.add_argument("--master", default=None, help="Spark master (default local[2])")
    ap.add_argument("--no-report", action="store_true", help="time results.json only, no report.html")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed)")
    args = ap.parse_args()
    sizes = args.sizes or ([100_000, 1_000_000] if args.quick else [100_000, 1_000_000, 10_000_000])
    work = Path(args.dir or tempfile.mkdtemp(prefix="checker-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    out: dict[str, object] = {}
    try:
        t0 = time.monotonic()
        get_spark(args.master)
        out["spark_start_seconds"] = round(time.monotonic() - t0, 2)
        print(f"spark session: {out['spark_start_seconds']} s", flush=True)
        for n in sizes:
            out.update(bench_log(work, n, args.master, not args.no_report))
        out.update(bench_anomalous(work, min(sizes), args.master))
        if VECTORS.is_dir():
            out.update(bench_etcd(work, args.master))
    finally:
        stop_spark()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
