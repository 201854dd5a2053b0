"""Producer and consumer throughput through a 3-broker group, and the master switch time.

Two nameservers and three brokers run as local processes. Measured with the project's
own Producer and PullConsumer, 1 KiB messages:
- batched sends (``send_batch`` of --batch messages, --concurrency in flight) and unbatched
  sends (``send``, --unbatched-concurrency in flight): msgs/s, p50/p99 per request;
- consumer throughput: pulling everything back from every queue;
- master switch: SIGKILL the master under a steady send load, time from the kill to the
  first acknowledged send, and the broker's own leader-to-master switch time;
- CPU cost: for each throughput phase, the CPU time the group's processes (brokers and
  nameservers) and the client spent per message. On a shared machine throughput swings with
  everyone else's load; CPU time per message swings far less, so compare it first.

    python bench/broker_bench.py [--quick]
    python bench/broker_bench.py --quick --acl-compare [--rounds 3]

``--acl-compare`` measures only the send phases, alternating a group with ACL off and one
with ACL on (every request signed by the client and verified by the broker), --rounds times,
and reports the medians and the cost of ACL in CPU per message and in msgs/s.

Ends with one JSON line: send_batched_msgs_per_s, send_batched_p99_ms, send_msgs_per_s,
send_p99_ms, consume_msgs_per_s, switch_p50_ms, switch_max_ms, internal_switch_p50_ms, kills,
and {send_batched,send,consume}_{server,client}_cpu_us_per_msg.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.localgroup import LocalBrokerGroup
from client.consumer import PullConsumer
from client.instance import ClientInstance
from client.producer import Producer
from remoting import RemotingClient
from remoting.acl import RequestSigner
from remoting.message import Message

TOPIC = "BenchTopic"
QUEUES = 8
BODY = b"m" * 1024


def group_cpu_s(group: LocalBrokerGroup) -> float:
    """CPU seconds (user + system) the group's running processes have used so far."""
    total = 0
    for name in group.procs:
        pid = group.pid(name)
        if pid is None:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def measured(group: LocalBrokerGroup, phase: Any) -> dict[str, float]:
    """Run a phase (returns a dict with "messages"); add the CPU microseconds per message it cost."""
    server0, client0 = group_cpu_s(group), time.process_time()
    out = asyncio.run(phase)
    n = max(out["messages"], 1)
    out["server_cpu_us_per_msg"] = 1e6 * (group_cpu_s(group) - server0) / n
    out["client_cpu_us_per_msg"] = 1e6 * (time.process_time() - client0) / n
    return out


def pct(values: list[float], q: float) -> float:
    s = sorted(values) or [float("nan")]
    return s[min(len(s) - 1, int(len(s) * q))]


async def send_load(
    ns: list[str], seconds: float, concurrency: int, batch: int, creds: tuple[str, str] | None = None
) -> dict[str, float]:
    lat: list[float] = []
    sent = 0
    errors = 0
    instance = None if creds is None else ClientInstance(ns, access_key=creds[0], secret_key=creds[1])
    async with Producer("bench-producer", ns, send_timeout_s=10, instance=instance) as producer:
        await producer.send(Message(TOPIC, b"warm-up"))
        end = time.perf_counter() + seconds

        async def worker(w: int) -> None:
            nonlocal sent, errors
            q = w % QUEUES
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                try:
                    if batch > 1:
                        await producer.send_batch([Message(TOPIC, BODY) for _ in range(batch)], queue_id=q)
                    else:
                        await producer.send(Message(TOPIC, BODY))
                except Exception:  # noqa: BLE001 - counted and reported
                    errors += 1
                    continue
                lat.append(time.perf_counter() - t0)
                sent += batch

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - start
    if instance is not None:
        await instance.close()
    return {
        "messages": sent,
        "msgs_per_s": sent / elapsed,
        "p50_ms": 1000 * pct(lat, 0.5),
        "p99_ms": 1000 * pct(lat, 0.99),
        "errors": errors,
    }


async def consume_all(ns: list[str]) -> dict[str, float]:
    total = 0
    async with PullConsumer("bench-consumer", ns) as consumer:
        queues = await consumer.fetch_queues(TOPIC)
        start = time.perf_counter()

        async def drain(q) -> int:  # noqa: ANN001 - a client MessageQueue
            offset, n = 0, 0
            for _ in range(1_000_000):
                r = await consumer.pull(q, offset, 512)
                if not r.messages:
                    return n
                n += len(r.messages)
                offset = r.next_begin_offset
            return n

        for n in await asyncio.gather(*(drain(q) for q in queues)):
            total += n
        elapsed = time.perf_counter() - start
    return {"msgs_per_s": total / elapsed, "messages": total}


async def switch_times(group: LocalBrokerGroup, kills: int) -> dict[str, float]:
    times: list[float] = []
    internal: list[float] = []
    async with Producer(
        "bench-failover", group.namesrv_addrs, send_timeout_s=20, retries=50, retry_backoff_s=0.02
    ) as p:
        for _ in range(kills):
            master = await group.wait_for_master(60)
            for _ in range(20):
                await p.send(Message(TOPIC, b"before"))
            killed_at = time.monotonic()
            group.kill_broker(master)
            while True:
                try:
                    await p.send(Message(TOPIC, b"after"))
                    break
                except Exception:  # noqa: BLE001 - keep trying until the new master answers
                    if time.monotonic() - killed_at > 30:
                        raise
            times.append(1000 * (time.monotonic() - killed_at))
            new_master = await group.wait_for_master(30, exclude={master})
            async with RemotingClient() as rc:
                info = await group.runtime_info(rc, new_master)
            if info and info.get("switchTimesMs"):
                internal.append(info["switchTimesMs"][-1])
            print(f"  killed master {master}: first send acknowledged after {times[-1]:.0f} ms", flush=True)
            group.start_broker(master)
            await asyncio.sleep(2.0)
    return {
        "switch_p50_ms": statistics.median(times),
        "switch_max_ms": max(times),
        "internal_switch_p50_ms": statistics.median(internal) if internal else float("nan"),
        "kills": len(times),
    }


ACL_ACCOUNTS = """
[[accounts]]
access_key = "bench-admin"
secret_key = "bench-admin-secret"
admin = true
"""
BENCH_CREDS = ("bench-admin", "bench-admin-secret")


async def wait_master_signed(group: LocalBrokerGroup, timeout: float = 60.0) -> None:
    """Like LocalBrokerGroup.wait_for_master, with signed requests (a broker with ACL on refuses others)."""
    deadline = time.monotonic() + timeout
    async with RemotingClient(rpc_hook=RequestSigner(*BENCH_CREDS)) as rc:
        while time.monotonic() < deadline:
            for nid in group.node_ids:
                info = await group.runtime_info(rc, nid)
                if (
                    info
                    and info.get("role") == "MASTER"
                    and await group._routed(rc, TOPIC, group.broker_addr[nid])
                ):
                    return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"no master within {timeout}s")


def acl_compare(seconds: float, rounds: int, args: argparse.Namespace) -> None:
    """Send phases with ACL off and on, alternating in the same run; medians and the overhead."""
    results: dict[str, list[dict[str, float]]] = {
        "off_batched": [],
        "on_batched": [],
        "off_send": [],
        "on_send": [],
    }
    for r in range(rounds):
        for mode in ("off", "on"):
            with tempfile.TemporaryDirectory(prefix="broker-bench-acl-") as d:
                settings: dict[str, Any] = {}
                if mode == "on":
                    (Path(d) / "acl.toml").write_text(ACL_ACCOUNTS)
                    settings = {"acl_enable": True, "acl_file": str(Path(d) / "acl.toml")}
                    settings.update(access_key=BENCH_CREDS[0], secret_key=BENCH_CREDS[1])
                group = LocalBrokerGroup(Path(d), topics=(f"{TOPIC}:{QUEUES}",), settings=settings)
                group.start()
                try:
                    asyncio.run(wait_master_signed(group))
                    ns = group.namesrv_addrs
                    creds = BENCH_CREDS if mode == "on" else None
                    b = measured(group, send_load(ns, seconds, args.concurrency, args.batch, creds))
                    u = measured(group, send_load(ns, seconds, args.unbatched_concurrency, 1, creds))
                finally:
                    group.stop()
            results[f"{mode}_batched"].append(b)
            results[f"{mode}_send"].append(u)
            print(
                f"round {r + 1} ACL {mode}: batched {b['msgs_per_s']:,.0f} msgs/s "
                f"({b['server_cpu_us_per_msg']:.1f}+{b['client_cpu_us_per_msg']:.1f} us CPU/msg server+client, "
                f"{b['errors']} errors); unbatched {u['msgs_per_s']:,.0f} msgs/s "
                f"({u['server_cpu_us_per_msg']:.1f}+{u['client_cpu_us_per_msg']:.1f} us CPU/msg, {u['errors']} errors)",
                flush=True,
            )

    def med(key: str, field: str) -> float:
        return statistics.median(x[field] for x in results[key])

    out: dict[str, float] = {"rounds": rounds}
    for phase in ("batched", "send"):
        for field in ("msgs_per_s", "server_cpu_us_per_msg", "client_cpu_us_per_msg"):
            off, on = med(f"off_{phase}", field), med(f"on_{phase}", field)
            out[f"{phase}_{field}_acl_off"] = round(off, 2)
            out[f"{phase}_{field}_acl_on"] = round(on, 2)
        cpu_off = med(f"off_{phase}", "server_cpu_us_per_msg") + med(f"off_{phase}", "client_cpu_us_per_msg")
        cpu_on = med(f"on_{phase}", "server_cpu_us_per_msg") + med(f"on_{phase}", "client_cpu_us_per_msg")
        out[f"{phase}_acl_cpu_overhead_pct"] = round(100 * (cpu_on - cpu_off) / cpu_off, 1)
        rate_off, rate_on = med(f"off_{phase}", "msgs_per_s"), med(f"on_{phase}", "msgs_per_s")
        out[f"{phase}_acl_throughput_cost_pct"] = round(100 * (rate_off - rate_on) / rate_off, 1)
        print(
            f"ACL cost, {phase}: CPU per message {out[f'{phase}_acl_cpu_overhead_pct']:+.1f}% "
            f"({cpu_off:.1f} -> {cpu_on:.1f} us), throughput {-out[f'{phase}_acl_throughput_cost_pct']:+.1f}% "
            f"(medians of {rounds} rounds)",
            flush=True,
        )
    out["errors"] = sum(x["errors"] for v in results.values() for x in v)
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--unbatched-concurrency", type=int, default=256)
    ap.add_argument("--kills", type=int, default=None)
    ap.add_argument("--acl-compare", action="store_true", help="send phases with ACL off and on (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="off/on rounds of --acl-compare")
    args = ap.parse_args()
    seconds = args.seconds or (5.0 if args.quick else 10.0)
    if args.acl_compare:
        acl_compare(seconds, max(1, args.rounds), args)
        return
    kills = args.kills or (3 if args.quick else 10)
    with tempfile.TemporaryDirectory(prefix="broker-bench-") as d:
        group = LocalBrokerGroup(Path(d), topics=(f"{TOPIC}:{QUEUES}",))
        group.start()
        try:
            asyncio.run(group.wait_for_master(60))
            ns = group.namesrv_addrs
            batched = measured(group, send_load(ns, seconds, args.concurrency, args.batch))
            print(
                f"batched send: {batched['msgs_per_s']:,.0f} msgs/s (batch {args.batch} x {args.concurrency} in flight; "
                f"p50 {batched['p50_ms']:.1f} ms, p99 {batched['p99_ms']:.1f} ms per batch; {batched['errors']} errors)",
                flush=True,
            )
            single = measured(group, send_load(ns, seconds, args.unbatched_concurrency, 1))
            print(
                f"unbatched send: {single['msgs_per_s']:,.0f} msgs/s ({args.unbatched_concurrency} in flight; "
                f"p50 {single['p50_ms']:.1f} ms, p99 {single['p99_ms']:.1f} ms; {single['errors']} errors)",
                flush=True,
            )
            consumed = measured(group, consume_all(ns))
            print(
                f"consume: {consumed['msgs_per_s']:,.0f} msgs/s ({consumed['messages']:,} messages)",
                flush=True,
            )
            switch = asyncio.run(switch_times(group, kills))
            print(
                f"master switch over {switch['kills']} kills: p50 {switch['switch_p50_ms']:.0f} ms, "
                f"max {switch['switch_max_ms']:.0f} ms (kill -> first acknowledged send); broker-internal "
                f"leader->master p50 {switch['internal_switch_p50_ms']:.2f} ms",
                flush=True,
            )
        finally:
            group.stop()
    print(
        json.dumps(
            {
                "send_batched_msgs_per_s": round(batched["msgs_per_s"], 1),
                "send_batched_p50_ms": round(batched["p50_ms"], 2),
                "send_batched_p99_ms": round(batched["p99_ms"], 2),
                "send_msgs_per_s": round(single["msgs_per_s"], 1),
                "send_p99_ms": round(single["p99_ms"], 2),
                "consume_msgs_per_s": round(consumed["msgs_per_s"], 1),
                **{k: round(v, 2) for k, v in switch.items()},
                **{
                    f"{phase}_{side}_cpu_us_per_msg": round(r[f"{side}_cpu_us_per_msg"], 2)
                    for phase, r in (("send_batched", batched), ("send", single), ("consume", consumed))
                    for side in ("server", "client")
                },
                "errors": batched["errors"] + single["errors"],
            }
        )
    )


if __name__ == "__main__":
    main()
