"""Delayed delivery and transactions through a 3-broker group: how close to due, how fast.

Two nameservers and three brokers run as local processes. Measured with the project's own
Producer, TransactionProducer and PullConsumer:

- delayed delivery: for ``--seconds``, unbatched sends at up to ``--rate`` messages a second,
  each with RocketMQ 5's TIMER_DELIVER_MS 1.5 s ahead; every queue of the real topic is read
  meanwhile. Reported: the rate achieved, how late each message was stored in its real topic
  (store time minus due) and seen by the consumer (arrival minus due), p50/p99/max, and that
  every message arrived exactly once;
- with ``--due-rate R``: ``R * --seconds`` messages sent as fast as the client goes, their
  due times spaced so that they come due at R a second, ``--lead-s`` after the start. This
  measures the schedule's own pace when a client cannot send that fast (RocketMQ refuses
  delays in batches, so every delayed message is one send); messages acknowledged only
  after their due time are counted apart (``acked_after_due``);
- transactions: ``--transactions`` sequential send_in_transaction (half message, local
  transaction, END_TRANSACTION commit), p50/p99 of the whole round trip, and the commit's
  own share (END_TRANSACTION answered after the half's send).

    python bench/semantics_bench.py [--quick] [--rate N] [--seconds S] [--due-rate R --lead-s L]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.localgroup import LocalBrokerGroup
from client.consumer import PullConsumer
from client.message_props import set_deliver_time_ms
from client.producer import Producer
from client.transaction import LocalTransactionState, TransactionProducer
from remoting.message import Message

TOPIC = "DelayBench"
TX_TOPIC = "TxBench"
QUEUES = 8
AHEAD_MS = 1500


def pct(values: list[float], q: float) -> float:
    s = sorted(values) or [float("nan")]
    return s[min(len(s) - 1, int(len(s) * q))]


async def delayed_load(
    ns: list[str],
    seconds: float,
    rate: float,
    concurrency: int,
    due_rate: float | None = None,
    lead_s: float = 20.0,
) -> dict[str, Any]:
    sent: dict[str, int] = {}  # body -> due ms
    errors = 0
    acked_after_due = 0
    store_late: list[float] = []
    seen_late: list[float] = []
    seen: dict[str, int] = {}
    stop = asyncio.Event()

    async with (
        Producer("delay-bench", ns, send_timeout_s=10) as producer,
        PullConsumer("delay-bench", ns) as consumer,
    ):
        await producer.send(Message(TOPIC, b"warm-up"))
        queues = await consumer.fetch_queues(TOPIC)

        async def read(q: Any) -> None:
            offset = (await consumer.pull(q, 0, 1)).max_offset
            while not stop.is_set() or len(seen) < len(sent):
                r = await consumer.pull(q, offset, 256, 200)
                now = time.time() * 1000
                for m in r.messages:
                    body = m.body.decode()
                    due = sent.get(body)
                    if due is None:
                        continue
                    seen[body] = seen.get(body, 0) + 1
                    store_late.append(m.store_ms - due)
                    seen_late.append(now - due)
                offset = r.next_begin_offset
                if stop.is_set() and time.monotonic() > stop_deadline:
                    return

        stop_deadline = float("inf")
        readers = [asyncio.create_task(read(q)) for q in queues]
        start = time.monotonic()
        interval = concurrency / rate  # each worker's pace
        total = int(due_rate * seconds) if due_rate else 0
        first_due_ms = int(time.time() * 1000 + lead_s * 1000)
        counter = iter(range(total))

        def next_due() -> int | None:
            """The next message's due time, or None when the run's sends are done."""
            if not due_rate:
                return int(time.time() * 1000) + AHEAD_MS if time.monotonic() - start < seconds else None
            i = next(counter, None)
            return None if i is None else first_due_ms + int(i * 1000 / due_rate)

        async def worker(w: int) -> None:
            nonlocal errors, acked_after_due
            i = 0
            nxt = time.monotonic()
            while (due := next_due()) is not None:
                body = f"d-{w}-{i}"
                i += 1
                msg = Message(TOPIC, body.encode())
                set_deliver_time_ms(msg, due)
                sent[body] = due
                try:
                    await producer.send(msg)
                    acked_after_due += time.time() * 1000 > due
                except Exception:  # noqa: BLE001 - counted and reported
                    errors += 1
                    del sent[body]
                if not due_rate:
                    nxt += interval
                    await asyncio.sleep(max(0.0, nxt - time.monotonic()))

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.monotonic() - start
        stop.set()
        last_due_s = max(sent.values(), default=0) / 1000 - time.time()
        stop_deadline = time.monotonic() + max(AHEAD_MS / 1000, last_due_s) + 20
        await asyncio.gather(*readers)
    missing = len(sent) - len(seen)
    duplicated = sum(1 for n in seen.values() if n > 1)
    return {
        "sent": len(sent),
        "rate_msgs_per_s": round(len(sent) / elapsed, 1),
        "due_rate_msgs_per_s": due_rate or round(len(sent) / elapsed, 1),
        "acked_after_due": acked_after_due,
        "errors": errors,
        "missing": missing,
        "duplicated": duplicated,
        "store_late_p50_ms": round(pct(store_late, 0.5), 1),
        "store_late_p99_ms": round(pct(store_late, 0.99), 1),
        "store_late_max_ms": round(max(store_late, default=float("nan")), 1),
        "seen_late_p50_ms": round(pct(seen_late, 0.5), 1),
        "seen_late_p99_ms": round(pct(seen_late, 0.99), 1),
    }


async def transactions(ns: list[str], count: int) -> dict[str, Any]:
    rounds: list[float] = []
    commits = 0
    async with TransactionProducer(
        "tx-bench", ns, check_local=lambda m: LocalTransactionState.COMMIT_MESSAGE
    ) as producer:
        await producer.send(Message(TX_TOPIC, b"warm-up"))
        for i in range(count):
            t0 = time.perf_counter()
            r = await producer.send_in_transaction(
                Message(TX_TOPIC, f"tx-{i}".encode()), lambda m, a: LocalTransactionState.COMMIT_MESSAGE
            )
            rounds.append(1000 * (time.perf_counter() - t0))
            commits += not r.end_error
    return {
        "transactions": count,
        "committed": commits,
        "round_trip_p50_ms": round(pct(rounds, 0.5), 2),
        "round_trip_p99_ms": round(pct(rounds, 0.99), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 s of delayed sends, 200 transactions")
    ap.add_argument("--rate", type=float, default=10_000.0, help="delayed sends a second to aim for")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument(
        "--due-rate",
        type=float,
        default=None,
        help="send as fast as possible; messages come due at this rate",
    )
    ap.add_argument(
        "--lead-s", type=float, default=20.0, help="with --due-rate: when the first message is due"
    )
    ap.add_argument("--transactions", type=int, default=1000)
    args = ap.parse_args()
    seconds, count = (3.0, 200) if args.quick else (args.seconds, args.transactions)
    with tempfile.TemporaryDirectory(prefix="semantics-bench-") as tmp:
        g = LocalBrokerGroup(
            Path(tmp), topics=(f"{TOPIC}:{QUEUES}", f"{TX_TOPIC}:4"), settings={"register_interval_s": 10}
        )
        g.start()
        try:
            asyncio.run(g.wait_for_master(60))
            delay = asyncio.run(
                delayed_load(
                    g.namesrv_addrs, seconds, args.rate, args.concurrency, args.due_rate, args.lead_s
                )
            )
            print(f"delayed delivery: {json.dumps(delay)}", flush=True)
            tx = asyncio.run(transactions(g.namesrv_addrs, count))
            print(f"transactions: {json.dumps(tx)}", flush=True)
        finally:
            g.stop()
    print(
        json.dumps(
            {
                "bench": "semantics",
                **{f"delay_{k}": v for k, v in delay.items()},
                **{f"tx_{k}": v for k, v in tx.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
