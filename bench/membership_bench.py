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

With ``--broker-changes N`` (24 by default, 8 with ``--quick``; 0 skips it), the same on a
broker group (2 nameservers, 3 brokers) under a producer's load: each change through
``ledgermq-admin``'s client (a fresh broker on new ports added, then promoted, the newest
non-master voter removed and wiped), the master SIGKILLed and restarted every
``--kill-every`` changes; every acknowledged message is then pulled from every member:
``broker_lost_acks`` must be 0; ``broker_sends_per_s_during_vs_between_pct`` compares the
send rate while a change is in flight (add, promote, remove) with the rate between changes,
and ``broker_catchup_vs_between_pct`` the rate while a learner catches up (start-ups of the
new brokers and failovers are left out of both). A change commits in about 10 ms, one or two
commit rounds each slowed by the configuration record's durable write, too short a window to
carry a rate: ``broker_change_seconds_vs_between_pct`` takes the second from each change's
start, and ``broker_add_to_promote_vs_between_pct`` the whole first half of a replacement (add,
catch-up, promotion). ``--learner-catchup-mb-per-s`` sets the brokers' catch-up throttle
(default: the broker's; 0: none, as before it existed), to compare the two in alternating runs;
``--ledger-catchup-mb-per-s`` the ledger group's (default 0, the ledger's own default).

Prints figures as it goes and ends with one JSON line: catchup_mb_per_s, catchup_mb,
change_commit_ms_p50, change_commit_heartbeats_p50, change_commit_heartbeats_max,
entries_per_s_before, entries_per_s_during_catchup, catchup_under_load_mb_per_s,
entries_per_s_during, entries_per_s_between, changes_during, entries_per_s_after,
during_vs_before_pct (during vs between),
catchup_vs_before_pct, changes, leader_kills, acked, lost_acks, errors, and broker_changes,
broker_master_kills, broker_acked, broker_lost_acks, broker_send_errors,
broker_sends_per_s_during, broker_sends_per_s_between, broker_sends_per_s_during_vs_between_pct,
broker_sends_per_s_during_catchup, broker_catchup_vs_between_pct, broker_sends_per_s_add_to_promote,
broker_add_to_promote_vs_between_pct, broker_add_to_promote_s, broker_sends_per_s_change_seconds,
broker_change_seconds_vs_between_pct, broker_change_ms_p50.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.localgroup import LocalBrokerGroup
from client.admin_api import AdminClient, MembershipRefusedError
from client.errors import ClientError
from client.producer import Producer
from jepsen.systems.broker_membership import start_joining_broker
from ledger.client import LedgerClient
from ledger.loadgen import AppendLoad, missing_acks
from ledger.localcluster import LocalCluster
from ledger.localjoin import start_joining_node
from ledger.wire import LedgerError
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.message import Message, decode_stored_messages

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
            while time.monotonic() < deadline:
                try:
                    if (await client.status(address))["commit_index"] >= top:
                        break
                except LedgerError:  # a leader restarted just before the end may still be starting
                    pass
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


BROKER_TOPIC = "MembershipBench"
BROKER_QUEUES = 4


async def _broker_master(g: LocalBrokerGroup, adm: AdminClient) -> str | None:
    """The node id of the group's master as the nameservers route it (None while there is none)."""
    bd = (await adm.cluster_info()).broker_addr_table.get(g.broker_name)
    addr = bd.broker_addrs.get(0) if bd else None
    return next((n for n, a in g.broker_addr.items() if a == addr), None)


async def _answers(client: RemotingClient, addr: str) -> bool:
    """Whether the broker at ``addr`` answers (it has started)."""
    try:
        req = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        return (await client.invoke_sync(addr, req, 1.0)).code == ResponseCode.SUCCESS
    except Exception:  # noqa: BLE001 - not listening yet
        return False


async def _held_messages(client: RemotingClient, addr: str) -> dict[tuple[int, int], bytes]:
    """Every message of the bench topic ``addr`` serves: (queue, offset) -> body."""
    out: dict[tuple[int, int], bytes] = {}
    for q in range(BROKER_QUEUES):
        offset = 0
        for _ in range(100_000):
            headers = {
                "consumerGroup": "bench",
                "topic": BROKER_TOPIC,
                "queueId": q,
                "queueOffset": offset,
                "maxMsgNums": 1024,
                "suspendTimeoutMillis": 0,
            }
            req = RemotingCommand.request(RequestCode.PULL_MESSAGE, headers)
            resp = await client.invoke_sync(addr, req, 10)
            if resp.code != ResponseCode.SUCCESS:
                break
            for m in decode_stored_messages(resp.body):
                out[(q, m.queue_offset)] = bytes(m.body)
            offset = resp.header_int("nextBeginOffset")
    return out


async def broker_changes_under_faults(base: Path, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """``--broker-changes`` changes of a broker group under a producer's load, through the
    admin client as an operator makes them, the master killed every ``--kill-every`` changes."""
    settings: dict[str, Any] = {"register_interval_s": 10}
    if args.learner_catchup_mb_per_s is not None:
        settings["learner_catchup_mb_per_s"] = args.learner_catchup_mb_per_s
    g = LocalBrokerGroup(base, topics=(f"{BROKER_TOPIC}:{BROKER_QUEUES}",), settings=settings)
    g.start()
    try:
        await g.wait_for_master(30)
        secret = Path(g.cluster_secret_file()).read_bytes().rstrip(b"\r\n")
        producer = Producer("membership-bench", g.namesrv_addrs, send_timeout_s=5, retries=2)
        await producer.start()
        acked: list[tuple[float, int, int, bytes]] = []  # (time, queue, offset, body)
        errors = 0
        stopping = False
        counter = iter(range(10**12))

        async def send() -> None:
            nonlocal errors
            while not stopping:
                body = f"m{next(counter)}".encode()
                try:
                    r = await producer.send(Message(BROKER_TOPIC, body))
                except ClientError:
                    errors += 1
                    await asyncio.sleep(0.02)
                    continue
                acked.append((time.perf_counter(), r.queue_id, r.queue_offset, body))

        senders = [asyncio.create_task(send()) for _ in range(args.concurrency)]
        in_change: list[tuple[float, float]] = []  # a configuration change in flight
        by_kind: dict[str, list[tuple[float, float]]] = {"add": [], "promote": [], "remove": []}
        catchup: list[tuple[float, float]] = []  # a learner catching up (from its add to lag <= 64)
        aside: list[tuple[float, float]] = []  # a broker starting, a master killed (until 2 s after)
        # a replacement's first half as an operator sees it: from the add through the learner's
        # catch-up to its promotion (left out when a master kill fell inside it); the changes
        # alone commit in milliseconds, too short a window to carry a send rate
        replacing: list[tuple[float, float]] = []
        learner_t0: float | None = None
        done = kills = next_host = 0
        voters = set(g.node_ids)
        learner: str | None = None
        async with AdminClient(g.namesrv_addrs, timeout_s=5) as adm, RemotingClient() as rc:
            await asyncio.sleep(1.0)
            for _ in range(args.broker_changes * 5):  # bounded: refusals and lost changes are retried
                if done >= args.broker_changes:
                    break
                try:
                    if learner is None and len(voters) <= 3:
                        nid = f"n{4 + next_host}"
                        host = f"127.0.0.{4 + next_host % 200}"
                        next_host += 1
                        s0 = time.perf_counter()
                        baddr, laddr = start_joining_broker(g, nid, host)
                        for _ in range(300):  # up to 30 s for the process to answer
                            if await _answers(rc, baddr):
                                break
                            await asyncio.sleep(0.1)
                        aside.append((s0, time.perf_counter()))
                        t0 = time.perf_counter()
                        await adm.add_member(g.broker_name, nid, baddr, laddr, secret=secret, promote=False)
                        in_change.append((t0, time.perf_counter()))
                        by_kind["add"].append(in_change[-1])
                        learner, learner_t0 = nid, t0
                        c0 = time.perf_counter()
                        for _ in range(1200):  # up to 60 s to catch up
                            lag = (await adm.group_members(g.broker_name))["learners"].get(nid, {}).get("lag")
                            if lag is not None and lag <= 64:
                                break
                            await asyncio.sleep(0.05)
                        catchup.append((c0, time.perf_counter()))
                    elif learner is not None:
                        t0 = time.perf_counter()
                        await adm.promote_member(g.broker_name, learner, secret=secret, wait_s=60)
                        in_change.append((t0, time.perf_counter()))
                        by_kind["promote"].append(in_change[-1])
                        if learner_t0 is not None:
                            replacing.append((learner_t0, in_change[-1][1]))
                        voters.add(learner)
                        learner = learner_t0 = None
                    else:
                        master = await _broker_master(g, adm)
                        victim = max((v for v in voters if v != master), key=lambda v: int(v[1:]))
                        t0 = time.perf_counter()
                        await adm.remove_member(g.broker_name, victim, secret=secret)
                        in_change.append((t0, time.perf_counter()))
                        by_kind["remove"].append(in_change[-1])
                        voters.discard(victim)
                        g.kill_broker(victim)
                        shutil.rmtree(g.base_dir / g.name_of(victim) / "data", ignore_errors=True)
                    done += 1
                except (MembershipRefusedError, ClientError) as exc:
                    print(f"change failed ({exc}); retrying", flush=True)
                    await asyncio.sleep(0.5)
                    continue
                if done // args.kill_every > kills:
                    master = await _broker_master(g, adm)
                    if master is not None:
                        k0 = time.perf_counter()
                        learner_t0 = None  # this replacement's window would hold a failover
                        g.kill_broker(master)
                        kills += 1
                        await asyncio.sleep(1.0)
                        g.start_broker(master)  # back with its log, still a member
                        await asyncio.sleep(2.0)
                        aside.append((k0, time.perf_counter()))
                await asyncio.sleep(0.5)
            stopping = True
            await asyncio.gather(*senders)
            await producer.shutdown(grace_s=0.5)
            members = await adm.group_members(g.broker_name)
        lost_total = 0
        want = {(q, o): b for _, q, o, b in acked}
        async with RemotingClient() as rc:
            for nid, m in members["voters"].items():
                deadline = time.monotonic() + 60
                while True:
                    held = await _held_messages(rc, m["brokerAddr"])
                    lost = [k for k, b in want.items() if held.get(k) != b]
                    if not lost or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.5)
                if lost:
                    print(f"{nid}: {len(lost)} acknowledged messages missing, e.g. {lost[:3]}", flush=True)
                lost_total += len(lost)
        # send rates while a change is in flight, while a learner catches up, and in between
        # (broker start-ups and failovers left out of all three)
        t_first = in_change[0][0] if in_change else 0.0
        t_last = acked[-1][0] if acked else t_first

        def rate(windows: list[tuple[float, float]]) -> float:
            span = sum(b - a for a, b in windows)
            n = sum(1 for t, *_ in acked if any(a <= t < b for a, b in windows))
            return n / span if span > 0 else 0.0

        windows = sorted(in_change + catchup + aside + replacing)
        gaps, edge = [], t_first
        for a, b in windows:
            if a > edge:
                gaps.append((edge, a))
            edge = max(edge, b)
        gaps.append((edge, t_last))
        during, between, catching = rate(in_change), rate(gaps), rate(catchup)
        out["broker_changes"] = done
        out["broker_master_kills"] = kills
        out["broker_acked"] = len(acked)
        out["broker_lost_acks"] = lost_total
        out["broker_send_errors"] = errors
        out["broker_sends_per_s_during"] = round(during)
        out["broker_sends_per_s_between"] = round(between)
        out["broker_sends_per_s_during_vs_between_pct"] = (
            round(100 * (during / between - 1), 1) if between else None
        )
        out["broker_sends_per_s_by_change"] = {k: round(rate(w)) for k, w in by_kind.items()}
        out["broker_sends_per_s_during_catchup"] = round(catching)
        replacing_rate = rate(replacing)
        # the second from each change's start (an add's includes the start of its catch-up),
        # unless a broker start-up or a failover falls in it: a rate over a change's own ~10 ms
        # is one or two commit rounds, each slowed by the configuration's own durable write
        seconds = [(a, a + 1.0) for a, _ in in_change if not any(x < a + 1.0 and a < y for x, y in aside)]
        merged: list[tuple[float, float]] = []
        for a, b in sorted(seconds):  # two changes within a second share it
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        change_seconds = rate(merged)
        out["broker_sends_per_s_change_seconds"] = round(change_seconds)
        out["broker_change_seconds_vs_between_pct"] = (
            round(100 * (change_seconds / between - 1), 1) if between else None
        )
        out["broker_sends_per_s_add_to_promote"] = round(replacing_rate)
        out["broker_add_to_promote_vs_between_pct"] = (
            round(100 * (replacing_rate / between - 1), 1) if between else None
        )
        out["broker_add_to_promote_s"] = round(sum(b - a for a, b in replacing), 2)
        out["broker_catchup_vs_between_pct"] = round(100 * (catching / between - 1), 1) if between else None
        spans = [b - a for a, b in in_change]
        out["broker_change_ms_p50"] = round(1000 * statistics.median(spans), 1) if spans else None
        print(
            f"broker group: {done} changes under load with {kills} master kills: {len(acked)} sends "
            f"acknowledged ({errors} failed), {lost_total} lost; {during:,.0f} sends/s during changes vs "
            f"{between:,.0f} between; {catching:,.0f} while a learner catches up; {replacing_rate:,.0f} "
            f"from an add to its promotion; change p50 "
            f"{out['broker_change_ms_p50']} ms",
            flush=True,
        )
    finally:
        g.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller log, shorter windows, fewer changes")
    ap.add_argument("--preload-mb", type=float, default=None, help="log size before the first add (MB)")
    ap.add_argument("--seconds", type=float, default=None, help="throughput window before and after")
    ap.add_argument("--changes", type=int, default=None, help="changes under load with leader kills")
    ap.add_argument("--kill-every", type=int, default=4, help="kill the leader every N changes")
    ap.add_argument("--broker-changes", type=int, default=None, help="changes of a broker group (0: skip)")
    ap.add_argument(
        "--learner-catchup-mb-per-s",
        type=float,
        default=None,
        help="the brokers' learner catch-up throttle (default: the broker's; 0: none, as before it)",
    )
    ap.add_argument(
        "--ledger-catchup-mb-per-s",
        type=float,
        default=0.0,
        help="the ledger group's learner catch-up throttle (default 0: none, the ledger's default)",
    )
    ap.add_argument("--ledger", action=argparse.BooleanOptionalAction, default=True, help="the ledger part")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    args.preload_mb = args.preload_mb or (64.0 if args.quick else 256.0)
    args.seconds = args.seconds or (3.0 if args.quick else 6.0)
    args.changes = args.changes if args.changes is not None else (8 if args.quick else 24)
    args.broker_changes = (
        args.broker_changes if args.broker_changes is not None else (8 if args.quick else 24)
    )
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="membership-bench-") as d:
        if args.ledger:
            throttle = {"learner_catchup_mb_per_s": args.ledger_catchup_mb_per_s}
            out["ledger_catchup_throttle_mb_per_s"] = args.ledger_catchup_mb_per_s
            cluster = LocalCluster(Path(d), 3, settings=throttle)
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
        if args.broker_changes:
            asyncio.run(broker_changes_under_faults(Path(d) / "brokers", args, out))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
