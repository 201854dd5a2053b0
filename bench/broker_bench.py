"""Producer and consumer throughput through a 3-broker group, and the master switch time.

Two nameservers and three brokers run as local processes. Measured with the project's
own Producer and PullConsumer, 1 KiB messages:
- batched sends (``send_batch`` of --batch messages, --concurrency in flight) and unbatched
  sends (``send``, --unbatched-concurrency in flight): msgs/s, p50/p99 per request;
- consumer throughput: pulling everything back from every queue;
- master switch: SIGKILL the master under a steady send load, time from the kill to the
  first acknowledged send, and the broker's own leader-to-master switch time.

    python bench/broker_bench.py [--quick]

Ends with one JSON line: send_batched_msgs_per_s, send_batched_p99_ms, send_msgs_per_s,
send_p99_ms, consume_msgs_per_s, switch_p50_ms, switch_max_ms, internal_switch_p50_ms, kills.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from broker.localgroup import LocalBrokerGroup
from client.consumer import PullConsumer
from client.producer import Producer
from remoting import RemotingClient
from remoting.message import Message

TOPIC = "BenchTopic"
QUEUES = 8
BODY = b"m" * 1024


def pct(values: list[float], q: float) -> float:
    s = sorted(values) or [float("nan")]
    return s[min(len(s) - 1, int(len(s) * q))]


async def send_load(ns: list[str], seconds: float, concurrency: int, batch: int) -> dict[str, float]:
    lat: list[float] = []
    sent = 0
    errors = 0
    async with Producer("bench-producer", ns, send_timeout_s=10) as producer:
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
    return {"msgs_per_s": sent / elapsed, "p50_ms": 1000 * pct(lat, 0.5), "p99_ms": 1000 * pct(lat, 0.99), "errors": errors}


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
    async with Producer("bench-failover", group.namesrv_addrs, send_timeout_s=20, retries=50, retry_backoff_s=0.02) as p:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--unbatched-concurrency", type=int, default=256)
    ap.add_argument("--kills", type=int, default=None)
    args = ap.parse_args()
    seconds = args.seconds or (5.0 if args.quick else 10.0)
    kills = args.kills or (3 if args.quick else 10)
    with tempfile.TemporaryDirectory(prefix="broker-bench-") as d:
        group = LocalBrokerGroup(Path(d), topics=(f"{TOPIC}:{QUEUES}",))
        group.start()
        try:
            asyncio.run(group.wait_for_master(60))
            ns = group.namesrv_addrs
            batched = asyncio.run(send_load(ns, seconds, args.concurrency, args.batch))
            print(
                f"batched send: {batched['msgs_per_s']:,.0f} msgs/s (batch {args.batch} x {args.concurrency} in flight; "
                f"p50 {batched['p50_ms']:.1f} ms, p99 {batched['p99_ms']:.1f} ms per batch; {batched['errors']} errors)",
                flush=True,
            )
            single = asyncio.run(send_load(ns, seconds, args.unbatched_concurrency, 1))
            print(
                f"unbatched send: {single['msgs_per_s']:,.0f} msgs/s ({args.unbatched_concurrency} in flight; "
                f"p50 {single['p50_ms']:.1f} ms, p99 {single['p99_ms']:.1f} ms; {single['errors']} errors)",
                flush=True,
            )
            consumed = asyncio.run(consume_all(ns))
            print(f"consume: {consumed['msgs_per_s']:,.0f} msgs/s ({consumed['messages']:,} messages)", flush=True)
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
                "errors": batched["errors"] + single["errors"],
            }
        )
    )


if __name__ == "__main__":
    main()
