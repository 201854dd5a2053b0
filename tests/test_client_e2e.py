"""The real clients against a real broker group: produce and consume through a master kill."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from broker.localgroup import LocalBrokerGroup
from client.consumer import PullConsumer
from client.errors import SendOutcomeUnknownError
from client.producer import Producer
from client.push_consumer import PushConsumer
from remoting.message import Message

pytestmark = pytest.mark.slow
TOPIC = "TopicTest"


@pytest.fixture
def group(tmp_path):
    g = LocalBrokerGroup(tmp_path, settings={"register_interval_s": 10})
    g.start()
    try:
        yield g
    finally:
        g.stop()


def test_produce_and_consume_through_a_master_kill(group):
    async def scenario() -> dict[bytes, tuple[int, int]]:
        master = await group.wait_for_master()
        acked: dict[bytes, tuple[int, int]] = {}
        unknown: list[bytes] = []
        received: list[bytes] = []

        def listener(msgs, queue) -> None:  # noqa: ANN001
            received.extend(m.body for m in msgs)

        ns = group.namesrv_addrs
        push = PushConsumer("e2e-push", ns, TOPIC, listener, suspend_ms=1000, rebalance_interval_s=1)
        async with Producer(
            "e2e", ns, idempotent=True, send_timeout_s=20, retries=40, retry_backoff_s=0.02
        ) as p:
            await push.start()
            stop = False

            async def produce(w: int) -> None:
                n = 0
                while not stop:
                    body = f"w{w}-{n}".encode()
                    n += 1
                    try:
                        r = await p.send(Message(TOPIC, body, keys=[body.decode()]))
                    except SendOutcomeUnknownError:
                        unknown.append(body)
                        continue
                    acked[body] = (r.queue_id, r.queue_offset)

            tasks = [asyncio.create_task(produce(w)) for w in range(4)]
            await asyncio.sleep(1.5)
            before = len(acked)
            group.kill_broker(master)
            await group.wait_for_master(exclude={master})
            deadline = time.monotonic() + 20
            while len(acked) < before + 50 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            stop = True
            await asyncio.gather(*tasks)
            assert before > 0 and len(acked) >= before + 50, (before, len(acked))

            # The push consumer eventually sees every acknowledged message.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not set(acked) <= set(received):
                await asyncio.sleep(0.2)
            await push.shutdown()
        missing = set(acked) - set(received)
        assert not missing, (
            f"push consumer missed {len(missing)} acknowledged messages, e.g. {sorted(missing)[:3]}"
        )

        # A pull consumer reads each queue from 0: every ack is at its acknowledged offset, once.
        async with PullConsumer("e2e-pull", ns) as consumer:
            seen: dict[bytes, tuple[int, int]] = {}
            for q in await consumer.fetch_queues(TOPIC):
                offset = 0
                for _ in range(10_000):
                    r = await consumer.pull(q, offset, 256)
                    if not r.messages:
                        break
                    for m in r.messages:
                        assert m.body not in seen, f"{m.body!r} stored twice"
                        seen[m.body] = (q.queue_id, m.queue_offset)
                    offset = r.next_begin_offset
        moved = {b: v for b, v in acked.items() if seen.get(b) != v}
        assert not moved, f"{len(moved)} acknowledged messages lost or moved, e.g. {list(moved.items())[:3]}"
        return acked

    acked = asyncio.run(scenario())

    # The admin CLI finds a message by key through the nameservers.
    body = next(iter(acked)).decode()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "client.admin",
            "-n",
            group.namesrv_addr_str,
            "query-msg-by-key",
            "-t",
            TOPIC,
            "-k",
            body,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert body in out.stdout
