"""Orderly consumption against the fake broker: LOCK_BATCH_MQ / UNLOCK_BATCH_MQ bodies, relocking,
lost locks, strict per-queue order, local retries and the way to the dead-letter topic."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from bounded import runner, until
from client_fake_broker import FakeCluster, FakeGroup

from client import ConsumeStatus, Message, MessageQueue, Producer, PushConsumer, dlq_topic, retry_topic
from remoting.message import properties_from_bytes

pytestmark = pytest.mark.timeout(60)
_names = itertools.count(1)


run = runner(30.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[FakeCluster]:
    c = FakeCluster({"broker-o": 1})
    try:
        yield c
    finally:
        c.close()


def group_o(cluster: FakeCluster) -> FakeGroup:
    return cluster.groups["broker-o"]


@pytest.fixture
def topic(cluster: FakeCluster) -> str:
    g = group_o(cluster)
    g.reset_scripts()
    for n in g.nodes:
        n.back_script.clear()
    name = f"TO{next(_names)}"
    cluster.add_topic(name, 4)
    return name


def requests(cluster: FakeCluster, kind: str) -> list[dict[str, Any]]:
    return [h for node in group_o(cluster).nodes for k, h in node.requests if k == kind]


async def fill(cluster: FakeCluster, topic: str, per_queue: int) -> None:
    async with Producer("fill", cluster.namesrv_addr) as p:
        for qid in range(4):
            for i in range(per_queue):
                await p.send(Message(topic, f"{qid}-{i}".encode()), qid)


def orderly(cluster: FakeCluster, group: str, topic: str, listener: Any, **kw: Any) -> PushConsumer:
    opts: dict[str, Any] = dict(
        orderly=True,
        suspend_ms=200,
        rebalance_interval_s=0.2,
        heartbeat_interval_s=0.2,
        reconsume_delay_s=0.05,
        lock_retry_delay_s=0.1,
    )
    opts.update(kw)
    return PushConsumer(group, cluster.namesrv_addr, topic, listener, **opts)


def test_locks_then_consumes_each_queue_in_order_and_unlocks_at_shutdown(
    cluster: FakeCluster, topic: str
) -> None:
    group = f"go-{topic}"
    seen: dict[int, list[int]] = {}
    in_flight: set[int] = set()
    overlap: list[int] = []

    async def on(msgs: list[Message], q: MessageQueue) -> ConsumeStatus:
        if q.queue_id in in_flight:
            overlap.append(q.queue_id)
        in_flight.add(q.queue_id)
        await asyncio.sleep(0.001)
        seen.setdefault(q.queue_id, []).extend(int(m.body.split(b"-")[1]) for m in msgs)
        in_flight.discard(q.queue_id)
        return ConsumeStatus.CONSUME_SUCCESS

    async def go() -> str:
        await fill(cluster, topic, 5)
        c = orderly(cluster, group, topic, on, batch_size=2, lock_interval_s=0.2, lock_max_live_s=1.0)
        await c.start()
        try:
            assert await until(lambda: all(len(seen.get(q, [])) == 5 for q in range(4)))
            assert len(c.allocated_queues) == 4 and len(c.allocated_retry_queues) == 1
            assert c.locked_queues() == sorted(c.allocated_queues + c.allocated_retry_queues)
            n = len(requests(cluster, "LOCK"))
            assert await until(lambda: len(requests(cluster, "LOCK")) >= n + 2)  # renewed every 0.2 s
        finally:
            await c.shutdown()
        return c.client_id

    client_id = run(go())
    assert all(seen[q] == list(range(5)) for q in range(4)) and not overlap
    first = requests(cluster, "LOCK")[0]
    assert first == {
        "consumerGroup": group,
        "clientId": client_id,
        "onlyThisBroker": False,
        "mqSet": [{"topic": retry_topic(group), "brokerName": "broker-o", "queueId": 0}]
        + [{"topic": topic, "brokerName": "broker-o", "queueId": i} for i in range(4)],
    }
    renewals = [r for r in requests(cluster, "LOCK")[1:] if len(r["mqSet"]) >= 4]
    assert renewals and {mq["queueId"] for mq in renewals[-1]["mqSet"] if mq["topic"] == topic} == {
        0,
        1,
        2,
        3,
    }
    unlocks = requests(cluster, "UNLOCK")
    assert unlocks[-1]["_oneway"] is False and unlocks[-1]["clientId"] == client_id
    assert {mq["queueId"] for mq in unlocks[-1]["mqSet"] if mq["topic"] == topic} == {0, 1, 2, 3}
    assert not [k for k in group_o(cluster).state.locks if k[0] == group]  # all given back


def test_failed_batch_is_retried_in_place_then_dead_lettered(cluster: FakeCluster, topic: str) -> None:
    group = f"go-{topic}"
    calls: list[tuple[bytes, int]] = []

    def on(msgs: list[Message], q: MessageQueue) -> ConsumeStatus:
        calls.extend((m.body, m.reconsume_times) for m in msgs)
        if any(m.body == b"0-1" for m in msgs):
            return ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeStatus.CONSUME_SUCCESS

    async def go() -> None:
        await fill(cluster, topic, 3)
        c = orderly(cluster, group, topic, on, batch_size=1, max_reconsume_times=2)
        await c.start()
        try:
            assert await until(lambda: (b"0-2", 0) in calls)
            assert await until(lambda: group_o(cluster).state.offsets.get((group, topic, 0)) == 3, 3)
        finally:
            await c.shutdown()

    run(go())
    q0 = [c for c in calls if c[0].startswith(b"0-")]
    # in place: 0-1 three times (tries 0, 1, 2) before 0-2, never after it
    assert q0 == [(b"0-0", 0), (b"0-1", 0), (b"0-1", 1), (b"0-1", 2), (b"0-2", 0)]
    backs = requests(cluster, "SEND_BACK")
    assert len(backs) == 1 and backs[0]["delayLevel"] == "-1" and backs[0]["maxReconsumeTimes"] == "2"
    assert backs[0]["originTopic"] == topic and backs[0]["group"] == group
    dead = group_o(cluster).messages(dlq_topic(group), 0)
    assert len(dead) == 1 and b"0-1" in dead[0].record


def test_dead_letter_falls_back_to_a_copy_as_java_orderly_sends_it(cluster: FakeCluster, topic: str) -> None:
    group = f"go-{topic}"
    calls: list[int] = []
    node = group_o(cluster).master_node
    assert node is not None
    node.back_script.append("refuse")

    def on(msgs: list[Message], q: MessageQueue) -> ConsumeStatus:
        calls.append(msgs[0].reconsume_times)
        return ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

    async def go() -> None:
        async with Producer("fill", cluster.namesrv_addr) as p:
            await p.send(Message(topic, b"poison"), 0)
        c = orderly(cluster, group, topic, on, max_reconsume_times=1)
        await c.start()
        try:
            assert await until(lambda: len(group_o(cluster).messages(dlq_topic(group), 0)) == 1)
            assert await until(lambda: group_o(cluster).state.offsets.get((group, topic, 0)) == 1, 3)
        finally:
            await c.shutdown()

    run(go())
    assert calls == [0, 1]
    copy = [h for h in requests(cluster, "SEND") if h["topic"] == retry_topic(group)][-1]
    assert copy["reconsumeTimes"] == "1" and copy["maxReconsumeTimes"] == "1"  # the broker's DLQ rule
    props = properties_from_bytes(copy["properties"].encode())
    assert props["RETRY_TOPIC"] == topic and props["DELAY"] == "4"


def test_a_queue_locked_by_another_member_waits_and_a_lost_lock_stops_consumption(
    cluster: FakeCluster, topic: str
) -> None:
    group = f"go-{topic}"
    got: list[bytes] = []
    g = group_o(cluster)
    q0 = (group, topic, "broker-o", 0)

    async def go() -> None:
        g.state.locks[q0] = ("intruder", time.monotonic())
        c = orderly(
            cluster,
            group,
            topic,
            lambda msgs, q: got.extend(m.body for m in msgs),
            lock_interval_s=0.2,
            lock_max_live_s=0.4,
        )
        await c.start()
        try:
            await until(lambda: len(c.allocated_queues) == 3)
            assert MessageQueue(topic, "broker-o", 0) not in c.allocated_queues
            await fill(cluster, topic, 1)
            assert await until(lambda: sorted(got) == [b"1-0", b"2-0", b"3-0"])
            del g.state.locks[q0]  # released: the next rebalance locks and starts it
            assert await until(lambda: b"0-0" in got)
            # now someone else takes queue 1: its lock is refused at the next renewal
            g.state.locks[(group, topic, "broker-o", 1)] = ("intruder", time.monotonic())
            q1 = MessageQueue(topic, "broker-o", 1)
            assert await until(lambda: q1 not in c.locked_queues())
            async with Producer("fill", cluster.namesrv_addr) as p:
                await p.send(Message(topic, b"1-late"), 1)
            await asyncio.sleep(0.5)
            assert b"1-late" not in got  # not consumed without the lock
            del g.state.locks[(group, topic, "broker-o", 1)]
            assert await until(lambda: b"1-late" in got)
        finally:
            await c.shutdown()

    run(go())


def test_rebalance_unlocks_given_up_queues_oneway(cluster: FakeCluster, topic: str) -> None:
    group = f"go-{topic}"

    async def go() -> tuple[PushConsumer, PushConsumer, list[MessageQueue]]:
        a = orderly(cluster, group, topic, lambda m, q: None)
        b = orderly(cluster, group, topic, lambda m, q: None)
        await a.start()
        try:
            assert await until(lambda: len(a.allocated_queues) == 4)
            await b.start()
            try:
                assert await until(lambda: len(a.allocated_queues) == 2 and len(b.allocated_queues) == 2)
                assert not set(a.locked_queues()) & set(b.locked_queues())
                taken = b.allocated_queues
            finally:
                await b.shutdown()
        finally:
            await a.shutdown()
        return a, b, taken

    a, b, taken = run(go())
    oneway = [u for u in requests(cluster, "UNLOCK") if u["_oneway"] and u["clientId"] == a.client_id]
    assert oneway and {mq["queueId"] for u in oneway for mq in u["mqSet"] if mq["topic"] == topic} == {
        q.queue_id for q in taken
    }
    b_locks = [r for r in requests(cluster, "LOCK") if r["clientId"] == b.client_id]
    assert b_locks and all(r["consumerGroup"] == group for r in b_locks)


def test_a_lock_counts_from_its_request_not_from_its_slow_answer(cluster: FakeCluster, topic: str) -> None:
    """The broker starts a lock's expiry when it grants it, before its answer travels back: the
    consumer must not think it holds the lock for longer than the broker does."""
    group = f"gs-{topic}"
    asked: list[float] = []

    async def on(msgs: list[Message], q: MessageQueue) -> ConsumeStatus:
        return ConsumeStatus.CONSUME_SUCCESS

    async def go() -> list[float]:
        c = orderly(cluster, group, topic, on, lock_interval_s=30.0, lock_max_live_s=60.0)
        real_lock = c._lock

        async def slow_lock(queues: Any) -> set[MessageQueue]:
            asked.append(time.monotonic())
            granted = await real_lock(queues)
            await asyncio.sleep(0.3)  # the answer is slow to arrive
            return granted

        c._lock = slow_lock  # type: ignore[method-assign]
        await c.start()
        try:
            assert await until(lambda: len(c.locked_queues()) == 5)
            return [pq.lock_granted for pq in c._queues.values()]
        finally:
            await c.shutdown()

    granted = run(go())
    assert asked and len(granted) == 5
    assert all(g <= asked[0] + 0.05 for g in granted), (granted, asked[0])
