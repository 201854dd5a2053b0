"""One pysyncobj node for the baseline measurements (run by the benchmarks, not by hand).

``python bench/pysyncobj_node.py SELF PEER,PEER [--load SECONDS --size N --inflight K]``
runs a node with a replicated append-only list; with ``--load`` it also appends entries of
``N`` bytes for ``SECONDS`` with ``K`` outstanding and prints one JSON line of results.
pysyncobj keeps its log in memory and never fsyncs: the baseline is given that advantage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from pysyncobj import SyncObj, SyncObjConf, replicated


class ReplicatedLog(SyncObj):
    def __init__(self, self_addr: str, peers: list[str]) -> None:
        super().__init__(self_addr, peers, SyncObjConf(commandsQueueSize=1_000_000))
        self.count = 0

    @replicated
    def append(self, data: bytes) -> int:
        self.count += 1
        return self.count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("self_addr")
    ap.add_argument("peers")
    ap.add_argument("--load", type=float, default=0.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--warmup", type=float, default=3.0)
    args = ap.parse_args()
    node = ReplicatedLog(args.self_addr, args.peers.split(","))
    if not args.load:
        while True:
            time.sleep(3600)
    deadline = time.monotonic() + 30
    while node._getLeader() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(args.warmup)
    sem = threading.Semaphore(args.inflight)
    lock = threading.Lock()
    latencies: list[float] = []
    errors = 0
    payload = b"x" * args.size

    def make_cb(t0: float):
        def cb(result, err) -> None:
            nonlocal errors
            with lock:
                if err == 0:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors += 1
            sem.release()

        return cb

    start = time.perf_counter()
    end = start + args.load
    while time.perf_counter() < end:
        if sem.acquire(timeout=0.5):
            node.append(payload, callback=make_cb(time.perf_counter()))
    elapsed = time.perf_counter() - start
    for _ in range(args.inflight):
        sem.acquire(timeout=5)
    lat = sorted(latencies)
    print(
        json.dumps(
            {
                "entries_per_s": len(lat) / elapsed,
                "p50_ms": 1000 * statistics.median(lat) if lat else None,
                "p99_ms": 1000 * lat[int(len(lat) * 0.99)] if lat else None,
                "errors": errors,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
