"""Failover time of a 3-process ledger group under steady load, with default settings.

Repeatedly SIGKILLs the leader, measures from the kill to the first append acknowledged
in a newer term, restarts the victim and lets it catch up. At the end every acknowledged
entry is read back from the group; ``lost_acked`` must be 0.

    python bench/failover_bench.py [--quick] [--kills N]

Ends with one JSON line: failover_p50_ms, failover_max_ms, kills, lost_acked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from ledger.client import LedgerClient
from ledger.loadgen import AppendLoad, missing_acks
from ledger.localcluster import LocalCluster


async def measure(cluster: LocalCluster, kills: int, settle: float) -> dict[str, float]:
    load = AppendLoad(cluster.addresses, workers=8, batch=4, attempt_timeout=1.0)
    task = asyncio.create_task(load.run())
    times: list[float] = []
    try:
        async with LedgerClient(cluster.addresses, timeout=5) as client:
            for k in range(kills):
                leader = await cluster.wait_for_leader(30)
                term = (await client.status(cluster.address(leader)))["term"]
                await asyncio.sleep(settle)
                killed_at = time.monotonic()
                cluster.kill(leader)
                deadline = killed_at + 30
                ack = None
                while ack is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                    ack = load.first_ack_after(killed_at, term + 1)
                if ack is None:
                    raise RuntimeError(f"kill {k + 1}: no acknowledgement from a new leader within 30 s")
                ms = 1000 * (ack.at - killed_at)
                times.append(ms)
                print(
                    f"kill {k + 1}/{kills}: leader {leader} (term {term}) -> first new-term ack after {ms:.0f} ms"
                )
                cluster.start_node(leader)
        load.stop()
        await task
        async with LedgerClient(cluster.addresses, timeout=30) as client:
            lost = await missing_acks(client, load.acks)
    finally:
        load.stop()
        if not task.done():
            await task
    return {
        "failover_p50_ms": round(statistics.median(times), 1),
        "failover_max_ms": round(max(times), 1),
        "failover_min_ms": round(min(times), 1),
        "kills": len(times),
        "acked": len(load.acks),
        "unknown_outcome": load.unknown,
        "lost_acked": len(lost),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 kills with short pauses (about a minute)")
    ap.add_argument("--kills", type=int, default=None)
    args = ap.parse_args()
    kills = args.kills or (10 if args.quick else 20)
    settle = 1.5 if args.quick else 3.0
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as d:
        cluster = LocalCluster(Path(d), 3)
        cluster.start()
        try:
            result = asyncio.run(measure(cluster, kills, settle))
        finally:
            cluster.stop()
    print(
        f"failover over {result['kills']} kills: p50 {result['failover_p50_ms']:.0f} ms, "
        f"max {result['failover_max_ms']:.0f} ms; {result['acked']} appends acknowledged, "
        f"{result['lost_acked']} lost, {result['unknown_outcome']} of unknown outcome"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
