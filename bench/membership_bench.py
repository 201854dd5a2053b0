"""Membership changes of a 3-process ledger group on loopback: what they cost and what they keep.

    python bench/membership_bench.py [--quick] [--preload-mb MB] [--seconds S] [--changes N]

Measures, each on the group as ``ledger start`` runs it (peer authentication on):

- catch-up: a node started with ``join`` is added as a learner to a group whose log holds
  ``--preload-mb`` of 1 KiB entries; MB/s from the add until it holds the leader's log;
- commit latency of a change once the learner has caught up (promote, then remove and add
  back), in milliseconds and in heartbeats (``tick_ms`` x ``heartbeat_ticks``);
- throughput under a steady load (``--concurrency`` batches of ``--batch`` in flight) before,
  while a fresh node catches up as a learner (its MB/s under load too), while membership
  changes commit back to back for ``--seconds`` (promote, remove, add back, ...: "during a
  change"; in windows alternating with quiet ones, compared with those), and after the node
  it replaces is removed;
- ``--changes`` membership changes (add, promote, remove, in turn) under load with the leader
  SIGKILLed (and restarted) every few changes; every acknowledged append is then read back
  from every member: ``lost_acks`` must be 0.

Prints figures as it goes and ends with one JSON line: catchup_mb_per_s, catchup_mb,
change_commit_ms_p50, change_commit_heartbeats_p50, change_commit_heartbeats_max,
entries_per_s_before, entries_per_s_during_catchup, catchup_under_load_mb_per_s,
entries_per_s_during, entries_per_s_between, changes_during, entries_per_s_after,
during_vs_before_pct (during vs between),
catchup_vs_before_pct, changes, leader_kills, acked, lost_acks, errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ledger.client import LedgerClient
from ledger.loadgen import AppendLoad, missing_acks
from ledger.localcluster import LocalCluster
from ledger.localjoin import start_joining_node
from ledger.wire import LedgerError

ENTRY = b"x" * 1024
TICK_MS = 50  # NodeConfig's defaults: one heartbeat per tick
HEARTBEAT_MS = TICK_MS * 1
ROUNDS = 4  # alternating windows with and without changes


class Meter:
    """A steady batched append load that counts acknowledged entries per time window."""

    def __init__(self, addresses: list[str], concurrency: int, batch: int) -> None:
        self.addresses = addresses
        self.concurrency = concurrency
        self.batch = batch
        self.done: list[tuple[float, int]] = []  # (time, entries) of each acknowledged batch
        self.errors = 0
        self._stop = False

    def stop(self) -> None:
        self._stop = True

    async def run(self) -> None:
        payloads = [ENTRY] * self.batch
        async with LedgerClient(self.addresses, timeout=20) as client:

            async def worker() -> None:
                while not self._stop:
                    try:
                        await client.append_batch(payloads)
                    except LedgerError:
                        self.errors += 1
                        await asyncio.sleep(0.01)
                        continue
                    self.done.append((time.perf_counter(), self.batch))

            await asyncio.gather(*(worker() for _ in range(self.concurrency)))

    def rate(self, t0: float, t1: float) -> float:
        n = sum(k for t, k in self.done if t0 <= t < t1)
        return n / max(t1 - t0, 1e-9)


async def preload(addresses: list[str], mb: float) -> None:
    """Fill the log with ``mb`` MB of 1 KiB entries as fast as the group takes them."""
    target = int(mb * (1 << 20) / len(ENTRY))
    sent = 0
    async with LedgerClient(addresses, timeout=30) as client:

        async def worker() -> None:
            nonlocal sent
            while sent < target:
                sent += 256
                await client.append_batch([ENTRY] * 256)

        await asyncio.gather(*(worker() for _ in range(16)))


async def wait_caught_up(client: LedgerClient, nid: str, index: int, timeout: float = 300.0) -> float:
    """Poll the leader's progress until ``nid`` holds the log up to ``index``; returns when."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        try:
            doc = await client.members()
        except LedgerError:
            await asyncio.sleep(0.05)
            continue
        if doc.get("progress", {}).get(nid, {}).get("match", 0) >= index:
            return time.perf_counter()
        await asyncio.sleep(0.005)
    raise TimeoutError(f"{nid} did not catch up to {index} within {timeout}s")


async def timed_change(client: LedgerClient, op: str, nid: str, address: str = "") -> float:
    t0 = time.perf_counter()
    if op == "add":
        await client.add_learner(nid, address)
    elif op == "promote":
        await client.promote(nid, wait_s=60)
    else:
        await client.remove_member(nid)
    return (time.perf_counter() - t0) * 1000


async def replacement(cluster: LocalCluster, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Catch-up speed, change latency, throughput before/during/after replacing a member."""
    async with LedgerClient(cluster.addresses, timeout=30) as client:
        t0 = time.perf_counter()
        await preload(cluster.addresses, args.preload_mb)
        print(f"preloaded {args.preload_mb} MB in {time.perf_counter() - t0:.1f} s", flush=True)

        # Catch-up of a learner, on an idle group: the log as it is, shipped from the leader.
        doc = await client.members()
        leader = doc["leader"]
        st = await client.status(cluster.address(leader))
        last, size = st["last_index"], st["log_bytes"]
        address = start_joining_node(cluster, "n4")
        await asyncio.sleep(0.3)  # it listens and learns the group
        t_add = time.perf_counter()
        await client.add_learner("n4", address)
        t_done = await wait_caught_up(client, "n4", last)
        out["catchup_mb"] = round(size / (1 << 20), 1)
        out["catchup_mb_per_s"] = round(size / (1 << 20) / (t_done - t_add), 1)
        print(
            f"catch-up: {out['catchup_mb']} MB in {t_done - t_add:.2f} s = {out['catchup_mb_per_s']} MB/s",
            flush=True,
        )

        # Commit latency of changes once caught up (no load): promote, remove, add back, promote.
        latencies = [await timed_change(client, "promote", "n4")]
        latencies.append(await timed_change(client, "remove", "n4"))
        cluster.kill("n4")
        address = start_joining_node(cluster, "n5")
        await asyncio.sleep(0.3)
        latencies.append(await timed_change(client, "add", "n5", address))
        await wait_caught_up(client, "n5", (await client.status(cluster.address(leader)))["last_index"])
        latencies.append(await timed_change(client, "promote", "n5"))
        out["change_commit_ms_p50"] = round(statistics.median(latencies), 2)
        out["change_commit_heartbeats_p50"] = round(statistics.median(latencies) / HEARTBEAT_MS, 2)
        out["change_commit_heartbeats_max"] = round(max(latencies) / HEARTBEAT_MS, 2)
        print(f"change commit latency after catch-up: {[round(x, 1) for x in latencies]} ms", flush=True)

        # Throughput under a steady load: before; while a fresh node catches up as a learner;
        # while membership changes commit one after another (the learner promoted, removed,
        # added back, promoted, ...); after the node it replaces is removed.
        meter = Meter(cluster.addresses, args.concurrency, args.batch)
        task = asyncio.create_task(meter.run())
        await asyncio.sleep(1.0)  # warm-up
        b0 = time.perf_counter()
        await asyncio.sleep(args.seconds)
        b1 = time.perf_counter()
        victim = next(n for n in ("n1", "n2", "n3") if n != leader)
        address = start_joining_node(cluster, "n6")
        await asyncio.sleep(0.3)
        c0 = time.perf_counter()
        st = await client.status(cluster.address(leader))
        await client.add_learner("n6", address)
        c1 = await wait_caught_up(client, "n6", st["last_index"])
        out["catchup_under_load_mb_per_s"] = round(st["log_bytes"] / (1 << 20) / (c1 - c0), 1)
        # Windows with changes committing back to back alternate with quiet ones, so drift in
        # the machine's load (others' work, the page cache) hits both alike.
        cycle = ["promote", "remove", "add"]
        changes = 0
        quiet = busy = 0.0
        quiet_n = busy_n = 0
        window = args.seconds / ROUNDS
        for _ in range(ROUNDS):
            q0 = time.perf_counter()
            await asyncio.sleep(window)
            q1 = time.perf_counter()
            quiet += q1 - q0
            quiet_n += sum(k for t, k in meter.done if q0 <= t < q1)
            while time.perf_counter() - q1 < window:
                await timed_change(client, cycle[changes % 3], "n6", address)
                changes += 1
            d1 = time.perf_counter()
            busy += d1 - q1
            busy_n += sum(k for t, k in meter.done if q1 <= t < d1)
            while changes % 3:  # end each round with n6 a voter again
                await timed_change(client, cycle[changes % 3], "n6", address)
                changes += 1
        await client.remove_member(victim)
        cluster.kill(victim)
        a0 = time.perf_counter()
        await asyncio.sleep(args.seconds)
        a1 = time.perf_counter()
        meter.stop()
        await task
        before, catchup = meter.rate(b0, b1), meter.rate(c0, c1)
        during, steady, after = busy_n / busy, quiet_n / quiet, meter.rate(a0, a1)
        out["entries_per_s_before"] = round(before)
        out["entries_per_s_during_catchup"] = round(catchup)
        out["entries_per_s_during"] = round(during)
        out["entries_per_s_between"] = round(steady)
        out["changes_during"] = changes
        out["entries_per_s_after"] = round(after)
        out["during_vs_before_pct"] = round(100 * (during / steady - 1), 1)
        out["catchup_vs_before_pct"] = round(100 * (catchup / before - 1), 1)
        out["errors"] = out.get("errors", 0) + meter.errors
        print(
            f"throughput: before {before:,.0f} | while a learner catches up {catchup:,.0f} "
            f"({out['catchup_vs_before_pct']:+.1f}%, {out['catchup_under_load_mb_per_s']} MB/s) | during "
            f"{changes} changes in {busy:.1f} s {during:,.0f} vs {steady:,.0f} in the quiet windows between "
            f"({out['during_vs_before_pct']:+.1f}%) | after {after:,.0f} entries/s",
            flush=True,
        )


async def changes_under_faults(cluster: LocalCluster, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """``--changes`` changes under load, killing the leader every ``--kill-every`` changes."""
    load = AppendLoad(cluster.addresses, workers=8, batch=4, attempt_timeout=2.0)
    task = asyncio.create_task(load.run())
    next_id = 7
    done = kills = 0
    learner: str | None = None
    async with LedgerClient(cluster.addresses, timeout=30) as client:
        while done < args.changes:
            try:
                doc = await client.members()
                if learner is None and len(doc["voters"]) <= 3:
                    nid = f"n{next_id}"
                    next_id += 1
                    address = start_joining_node(cluster, nid)
                    client.addresses.append(address)
                    await asyncio.sleep(0.3)
                    await client.add_learner(nid, address)
                    learner = nid
                elif learner is not None:
                    await client.promote(learner, wait_s=120)
                    learner = None
                else:
                    # The newest voter that does not lead: the first members stay, so the load's
                    # client (which knows only their addresses) always finds the group.
                    victim = max((v for v in doc["voters"] if v != doc["leader"]), key=lambda v: int(v[1:]))
                    await client.remove_member(victim)
                    cluster.kill(victim)
            except LedgerError as exc:  # a change lost with a leader: look again and go on
                print(f"change failed ({exc}); retrying", flush=True)
                await asyncio.sleep(0.5)
                continue
            done += 1
            if done % args.kill_every == 0:
                leader = (await client.members())["leader"]
                cluster.kill(leader)
                kills += 1
                await asyncio.sleep(1.0)
                cluster.start_node(leader)  # it comes back with its log (still a member)
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        load.stop()
        await task
        doc = await client.members()
        top = max(a.index for a in load.acks)
        lost_total = 0
        for nid in doc["voters"]:
            address = doc["voters"][nid]
            deadline = time.monotonic() + 60
            while (await client.status(address))["commit_index"] < top and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            lost = await missing_acks(client, load.acks, address)
            lost_total += len(lost)
    out["changes"] = done
    out["leader_kills"] = kills
    out["acked"] = len(load.acks)
    out["lost_acks"] = lost_total
    out["unknown_outcomes"] = load.unknown
    print(
        f"{done} changes under load with {kills} leader kills: {len(load.acks)} appends acknowledged, "
        f"{lost_total} lost",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller log, shorter windows, fewer changes")
    ap.add_argument("--preload-mb", type=float, default=None, help="log size before the first add (MB)")
    ap.add_argument("--seconds", type=float, default=None, help="throughput window before and after")
    ap.add_argument("--changes", type=int, default=None, help="changes under load with leader kills")
    ap.add_argument("--kill-every", type=int, default=4, help="kill the leader every N changes")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    args.preload_mb = args.preload_mb or (64.0 if args.quick else 256.0)
    args.seconds = args.seconds or (3.0 if args.quick else 6.0)
    args.changes = args.changes if args.changes is not None else (8 if args.quick else 24)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="membership-bench-") as d:
        cluster = LocalCluster(Path(d), 3)
        cluster.start()
        try:
            asyncio.run(cluster.wait_for_leader(30))
            asyncio.run(replacement(cluster, args, out))
        finally:
            cluster.stop()
        cluster = LocalCluster(Path(d) / "changes", 3)
        cluster.start()
        try:
            asyncio.run(cluster.wait_for_leader(30))
            if args.changes:
                asyncio.run(changes_under_faults(cluster, args, out))
        finally:
            cluster.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
