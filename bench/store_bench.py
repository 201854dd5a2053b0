"""Micro benchmark of the segmented log store: what one node's disk path can sustain.

Phases, all on 1 KiB entries in a fresh directory:

* batched: append a batch, sync, repeat (the group-commit loop at its simplest);
* pipelined: the runtime's shape, the fsync of batch n running on a worker thread while
  batch n+1 is appended on the main thread;
* latency: one entry, append + sync, many times (the floor a lone client sees);
* read: cold reads from the files (cache disabled) and recovery time of the written log.

Usage: ``python bench/store_bench.py [--quick] [--dir PATH]``. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ledger.codec import Entry  # noqa: E402
from ledger.store import LogStore  # noqa: E402


def make_batches(first: int, count: int, batch: int, size: int) -> list[list[Entry]]:
    """Entries are built before timing: the benchmark measures the store, not payload creation."""
    payload = os.urandom(size)
    out = []
    for lo in range(first, first + count, batch):
        out.append([Entry(i, 1, payload) for i in range(lo, min(lo + batch, first + count))])
    return out


def batched(store: LogStore, batches: list[list[Entry]]) -> dict[str, float]:
    append_s = 0.0
    t0 = time.perf_counter()
    for b in batches:
        a = time.perf_counter()
        store.append(b)
        append_s += time.perf_counter() - a
        store.sync()
    wall = time.perf_counter() - t0
    n = sum(map(len, batches))
    return {"wall": wall, "entries": n, "append_s": append_s, "syncs": len(batches)}


def pipelined(store: LogStore, batches: list[list[Entry]]) -> dict[str, float]:
    """One sync job in flight at a time, overlapped with the next append, as the runtime does it."""
    job = None
    worker: threading.Thread | None = None
    syncs = 0
    t0 = time.perf_counter()
    for b in batches:
        store.append(b)
        if worker is not None and not worker.is_alive():
            worker.join()
            store.complete_sync(job)  # type: ignore[arg-type]
            worker = None
        if worker is None:
            job = store.prepare_sync()
            worker = threading.Thread(target=job.run)
            worker.start()
            syncs += 1
    if worker is not None:
        worker.join()
        store.complete_sync(job)  # type: ignore[arg-type]
    store.sync()
    wall = time.perf_counter() - t0
    assert store.durable_index == store.last_index
    return {"wall": wall, "entries": sum(map(len, batches)), "syncs": syncs}


def latency(store: LogStore, samples: int, size: int) -> list[float]:
    payload = os.urandom(size)
    out = []
    for _ in range(samples):
        e = Entry(store.last_index + 1, 1, payload)
        t = time.perf_counter()
        store.append([e])
        store.sync()
        out.append((time.perf_counter() - t) * 1000)
    return out


def cold_read(directory: Path, segment_bytes: int, batch_bytes: int) -> tuple[float, float, int]:
    t = time.perf_counter()
    store = LogStore(directory, segment_bytes=segment_bytes, cache_bytes=0)
    recovery = time.perf_counter() - t
    n = 0
    t = time.perf_counter()
    index = store.first_index
    while index <= store.last_index:
        got = store.entries(index, store.last_index, max_bytes=batch_bytes)
        n += len(got)
        index = got[-1].index + 1
    read = time.perf_counter() - t
    store.close()
    return recovery, read, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smaller run (about 10-20 s)")
    ap.add_argument("--dir", help="where to write (default: a temporary directory, removed afterwards)")
    ap.add_argument("--entry-bytes", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--segment-bytes", type=int, default=64 << 20)
    args = ap.parse_args()

    entries = 60_000 if args.quick else 300_000
    samples = 200 if args.quick else 1000
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="store_bench."))
    size = args.entry_bytes
    try:
        store = LogStore(root / "log", segment_bytes=args.segment_bytes)
        r1 = batched(store, make_batches(1, entries, args.batch, size))
        r2 = pipelined(store, make_batches(store.last_index + 1, entries, args.batch, size))
        lat = latency(store, samples, size)
        store.close()
        recovery, read_s, nread = cold_read(root / "log", args.segment_bytes, 1 << 20)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)

    enc = size + 44
    eps = r1["entries"] / r1["wall"]
    peps = r2["entries"] / r2["wall"]
    lat.sort()
    p50, p99 = statistics.median(lat), lat[int(len(lat) * 0.99) - 1]
    print(f"dir: {root} (1 KiB = {size} B payload, {enc} B encoded; batch {args.batch})")
    print(
        f"batched   : {eps:,.0f} entries/s, {eps * enc / 1e6:,.1f} MB/s, {r1['syncs'] / r1['wall']:,.0f} syncs/s, "
        f"append alone {r1['append_s'] / r1['entries'] * 1e6:.2f} us/entry"
    )
    print(
        f"pipelined : {peps:,.0f} entries/s, {peps * enc / 1e6:,.1f} MB/s, {r2['syncs'] / r2['wall']:,.0f} syncs/s"
    )
    print(f"latency   : append+sync of 1 entry p50 {p50:.3f} ms, p99 {p99:.3f} ms ({samples} samples)")
    print(
        f"cold read : {nread / read_s:,.0f} entries/s verified from files; recovery of {nread:,} entries {recovery:.3f} s"
    )
    result = {
        "append_entries_per_s": round(eps),
        "append_us_per_entry": round(r1["append_s"] / r1["entries"] * 1e6, 3),
        "mb_per_s": round(eps * enc / 1e6, 1),
        "fsyncs_per_s": round(r1["syncs"] / r1["wall"], 1),
        "pipelined_entries_per_s": round(peps),
        "p50_sync_ms": round(p50, 3),
        "p99_sync_ms": round(p99, 3),
        "read_entries_per_s": round(nread / read_s),
        "recovery_s": round(recovery, 3),
        "quick": args.quick,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
