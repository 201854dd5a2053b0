"""Throughput and latency of a 3-process ledger group, against pysyncobj in the same run.

Our group acknowledges an append only when a quorum has fsynced it; pysyncobj keeps its
log in memory and never fsyncs, so the comparison favours the baseline.

    python bench/ledger_bench.py [--quick] [--runs N] [--seconds S] [--peer-auth on|off|both]

Prints figures per run and ends with one JSON line (medians over runs):
entries_per_s, p50_ms, p99_ms (batched, per batch), unbatched_entries_per_s,
unbatched_p50_ms, unbatched_p99_ms, baseline_entries_per_s, speedup.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.process import free_port
from ledger.client import LedgerClient
from ledger.localcluster import LocalCluster

ENTRY = b"x" * 1024


async def load(addresses: list[str], seconds: float, concurrency: int, batch: int) -> dict[str, float]:
    """``concurrency`` tasks each appending ``batch`` entries at a time for ``seconds``."""
    latencies: list[float] = []
    done = 0
    errors = 0
    payloads = [ENTRY] * batch
    async with LedgerClient(addresses, timeout=10) as client:
        await client.append(b"warm-up")
        end = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done, errors
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                try:
                    await client.append_batch(payloads)
                except Exception:  # noqa: BLE001 - counted and reported
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t0)
                done += batch

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    lat = sorted(latencies) or [float("nan")]
    return {
        "entries_per_s": done / elapsed,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "errors": errors,
    }


def run_ledger(
    seconds: float, batch: int, concurrency: int, unbatched_concurrency: int, peer_auth: bool = True
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ledger-bench-") as d:
        cluster = LocalCluster(Path(d), 3, settings=None if peer_auth else {"cluster_secret": ""})
        cluster.start()
        try:
            asyncio.run(cluster.wait_for_leader(30))
            batched = asyncio.run(load(cluster.addresses, seconds, concurrency, batch))
            single = asyncio.run(load(cluster.addresses, seconds, unbatched_concurrency, 1))
        finally:
            cluster.stop()
    return {
        **batched,
        "unbatched_entries_per_s": single["entries_per_s"],
        "unbatched_p50_ms": single["p50_ms"],
        "unbatched_p99_ms": single["p99_ms"],
        "unbatched_errors": single["errors"],
    }


def run_pysyncobj(seconds: float) -> dict[str, float]:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    node = [sys.executable, "-m", "jepsen.systems.syncobj_node", "--bench", "--peers", ",".join(addrs)]
    procs = []
    try:
        for i in (1, 2):
            procs.append(subprocess.Popen([*node, "--self", addrs[i]], stdout=subprocess.DEVNULL))
        out = subprocess.run(
            [*node, "--self", addrs[0], "--load", str(seconds)],
            capture_output=True,
            text=True,
            timeout=seconds + 90,
        )
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(f"pysyncobj baseline printed no result: {out.stderr[-2000:]}")
        return json.loads(lines[-1])
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one short run (about a minute)")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--unbatched-concurrency", type=int, default=256)
    ap.add_argument(
        "--peer-auth",
        choices=("on", "off", "both"),
        default="on",
        help="peer authentication (cluster secret); both: also a group without it in each run, to state its cost",
    )
    args = ap.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    seconds = args.seconds or (5.0 if args.quick else 10.0)
    results = []
    for r in range(runs):
        off_first = args.peer_auth == "both" and r % 2 == 1  # alternate the order: drift hits both alike
        if off_first:
            off = run_ledger(seconds, args.batch, args.concurrency, args.unbatched_concurrency, False)
        ours = run_ledger(
            seconds, args.batch, args.concurrency, args.unbatched_concurrency, args.peer_auth != "off"
        )
        if args.peer_auth == "both":
            if not off_first:
                off = run_ledger(seconds, args.batch, args.concurrency, args.unbatched_concurrency, False)
            for k in ("entries_per_s", "p50_ms", "unbatched_entries_per_s", "unbatched_p50_ms"):
                ours[f"noauth_{k}"] = off[k]
            print(
                f"run {r + 1}/{runs} without peer auth: batched {off['entries_per_s']:,.0f} entries/s "
                f"(p50 {off['p50_ms']:.1f} ms) | unbatched {off['unbatched_entries_per_s']:,.0f} entries/s "
                f"(p50 {off['unbatched_p50_ms']:.1f} ms)",
                flush=True,
            )
        base = run_pysyncobj(seconds)
        ours["baseline_entries_per_s"] = base["entries_per_s"]
        ours["baseline_p50_ms"] = base["p50_ms"]
        results.append(ours)
        print(
            f"run {r + 1}/{runs}: batched {ours['entries_per_s']:,.0f} entries/s "
            f"(batch {args.batch} x {args.concurrency} in flight; p50 {ours['p50_ms']:.1f} ms, "
            f"p99 {ours['p99_ms']:.1f} ms per batch) | unbatched {ours['unbatched_entries_per_s']:,.0f} entries/s "
            f"({args.unbatched_concurrency} in flight; p50 {ours['unbatched_p50_ms']:.1f} ms, "
            f"p99 {ours['unbatched_p99_ms']:.1f} ms) | pysyncobj {base['entries_per_s']:,.0f} entries/s "
            f"(p50 {base['p50_ms'] or float('nan'):.1f} ms)",
            flush=True,
        )
    keys = [
        "entries_per_s",
        "p50_ms",
        "p99_ms",
        "unbatched_entries_per_s",
        "unbatched_p50_ms",
        "unbatched_p99_ms",
        "baseline_entries_per_s",
    ]
    summary = {k: round(statistics.median(r[k] for r in results), 2) for k in keys}
    summary["speedup"] = round(summary["entries_per_s"] / max(summary["baseline_entries_per_s"], 1e-9), 1)
    if args.peer_auth == "both":
        for k in ("entries_per_s", "p50_ms", "unbatched_entries_per_s", "unbatched_p50_ms"):
            summary[f"noauth_{k}"] = round(statistics.median(r[f"noauth_{k}"] for r in results), 2)
        for k in ("entries_per_s", "unbatched_entries_per_s"):  # throughput lost to authentication, in %
            summary[f"auth_cost_{k}_pct"] = round(100 * (1 - summary[k] / summary[f"noauth_{k}"]), 1)
    summary["runs"] = runs
    summary["errors"] = sum(r["errors"] + r["unbatched_errors"] for r in results)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
