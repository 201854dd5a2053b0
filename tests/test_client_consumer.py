"""Pull and push consumers against the real nameserver and fake broker groups."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Iterator
from typing import TypeVar

import pytest
from client_fake_broker import FakeCluster, FakeGroup

from client import (
    ConsumeStatus,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    allocate_average,
)
from remoting.message import parse_offset_msg_id

pytestmark = pytest.mark.timeout(60)
T = TypeVar("T")
_names = itertools.count(1)


def run(coro: Awaitable[T], timeout: float = 20.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


@pytest.fixture(scope="module")
def cluster() -> Iterator[FakeCluster]:
    c = FakeCluster({"broker-c": 3})
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def topic(cluster: FakeCluster) -> str:
    g = cluster.groups["broker-c"]
    g.reset_scripts()
    g.consumer_expiry_s = 30.0
    name = f"TC{next(_names)}"
    cluster.add_topic(name, 4)
    return name


def group_c(cluster: FakeCluster) -> FakeGroup:
    return cluster.groups["broker-c"]


async def fill(cluster: FakeCluster, topic: str, per_queue: int) -> None:
    p = Producer("fill", cluster.namesrv_addr)
    await p.start()
    try:
        for qid in range(4):
            await p.send_batch(
                [
                    Message(topic, f"{qid}-{i}".encode(), tags="even" if i % 2 == 0 else "odd")
                    for i in range(per_queue)
                ],
                qid,
            )
    finally:
        await p.shutdown()


# --- allocation ----------------------------------------------------------------------------------------
def test_allocate_average_matches_rocketmq() -> None:
    queues = [MessageQueue("T", "b", i) for i in range(8)]
    ids = ["c1", "c2", "c3"]
    shares = [allocate_average(c, queues, ids) for c in ids]
    assert [len(s) for s in shares] == [3, 3, 2]
    assert sorted(q for s in shares for q in s) == queues  # disjoint and complete
    assert allocate_average("c1", queues[:2], ids) == [queues[0]]
    assert allocate_average("c3", queues[:2], ids) == []
    assert allocate_average("stranger", queues, ids) == []


# --- pull consumer -------------------------------------------------------------------------------------
def test_pull_found_no_new_and_offset_moved(cluster: FakeCluster, topic: str) -> None:
    async def go() -> None:
        await fill(cluster, topic, 5)
        async with PullConsumer("g1", cluster.namesrv_addr) as c:
            queues = await c.fetch_queues(topic)
            assert [q.queue_id for q in queues] == [0, 1, 2, 3]
            q = queues[1]
            r = await c.pull(q, 0, 3)
            assert r.status is PullStatus.FOUND
            assert [m.body for m in r.messages] == [b"1-0", b"1-1", b"1-2"]
            assert [m.queue_offset for m in r.messages] == [0, 1, 2] and r.next_begin_offset == 3
            m = r.messages[0]
            assert m.tags == "even" and m.msg_id == m.offset_msg_id and len(m.msg_id) == 32
            assert parse_offset_msg_id(m.msg_id) == (m.store_host, m.physical_offset)
            r = await c.pull(q, 5, 3)
            assert r.status is PullStatus.NO_NEW_MSG and r.max_offset == 5
            r = await c.pull(q, 50, 3)
            assert r.status is PullStatus.OFFSET_ILLEGAL and r.next_begin_offset == 5
            assert await c.max_offset(q) == 5 and await c.min_offset(q) == 0

    run(go())


def test_long_poll_returns_when_a_message_arrives(cluster: FakeCluster, topic: str) -> None:
    async def go() -> float:
        async with PullConsumer("g1", cluster.namesrv_addr) as c:
            q = (await c.fetch_queues(topic))[0]
            started = time.monotonic()
            pull = asyncio.ensure_future(c.pull(q, 0, 8, suspend_ms=5000))
            await asyncio.sleep(0.2)
            await fill(cluster, topic, 1)
            r = await pull
            assert r.status is PullStatus.FOUND and r.messages[0].body == b"0-0"
            return time.monotonic() - started

    assert run(go()) < 2.0


def test_offsets_commit_and_query(cluster: FakeCluster, topic: str) -> None:
    async def go() -> None:
        async with PullConsumer("g-offsets", cluster.namesrv_addr) as c:
            q = (await c.fetch_queues(topic))[2]
            assert await c.query_offset(q) is None
            await c.commit_offset(q, 7)
            assert await c.query_offset(q) == 7
            await c.pull(q, 0, 1, commit_offset=9)  # piggybacked commit
            assert await c.query_offset(q) == 9

    run(go())
    assert group_c(cluster).state.offsets[("g-offsets", topic, 2)] == 9


def test_commit_follows_not_master_and_reads_survive_a_dead_master(cluster: FakeCluster, topic: str) -> None:
    g = group_c(cluster)

    async def go() -> None:
        await fill(cluster, topic, 2)
        async with PullConsumer("g-fo", cluster.namesrv_addr) as c:
            q = (await c.fetch_queues(topic))[0]
            await asyncio.to_thread(cluster.call, _silent_master(g, 1))
            await c.commit_offset(q, 1)  # node 0 says NOT_MASTER, names node 1
            assert any(kind == "COMMIT" for kind, _h in g.nodes[1].requests)
            await asyncio.to_thread(cluster.call, g.nodes[1].kill())
            await asyncio.sleep(0.05)
            r = await c.pull(q, 0, 8)  # node 1 (hinted master) is dead: a slave answers
            assert r.status is PullStatus.FOUND and len(r.messages) == 2

    try:
        run(go())
    finally:
        cluster.call(_revive(g, 1))


async def _silent_master(g: FakeGroup, index: int) -> None:
    g.master = index


async def _revive(g: FakeGroup, index: int) -> None:
    from client_fake_broker import FakeNode

    if not g.nodes[index].alive:
        g.nodes[index] = FakeNode(g, index)
        await g.nodes[index].start()
    await g.failover(0)


# --- push consumer -------------------------------------------------------------------------------------
def test_push_consumers_share_queues_and_commit(cluster: FakeCluster, topic: str) -> None:
    g = group_c(cluster)
    seen: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}

    def listener(name: str):  # noqa: ANN202
        def on(msgs: list[Message], q: MessageQueue) -> ConsumeStatus:
            seen[name].extend((q.queue_id, m.queue_offset) for m in msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        return on

    async def go() -> tuple[list[MessageQueue], list[MessageQueue]]:
        await fill(cluster, topic, 10)
        kw = dict(suspend_ms=300, rebalance_interval_s=0.2, heartbeat_interval_s=0.2, commit_interval_s=0.2)
        a = PushConsumer("g-push", cluster.namesrv_addr, topic, listener("a"), **kw)  # type: ignore[arg-type]
        b = PushConsumer("g-push", cluster.namesrv_addr, topic, listener("b"), **kw)  # type: ignore[arg-type]
        await a.start()
        await b.start()
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if len(a.allocated_queues) == 2 and len(b.allocated_queues) == 2:
                    break
                await asyncio.sleep(0.05)
            qa, qb = a.allocated_queues, b.allocated_queues
            await fill(cluster, topic, 10)  # more while both run
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and len(set(seen["a"]) | set(seen["b"])) < 80:
                await asyncio.sleep(0.05)
            return qa, qb
        finally:
            await a.shutdown()
            await b.shutdown()

    qa, qb = run(go())
    assert len(qa) == 2 and len(qb) == 2 and not set(qa) & set(qb)
    everything = set(seen["a"]) | set(seen["b"])
    assert everything == {(q, o) for q in range(4) for o in range(20)}
    for name in ("a", "b"):  # in order within each queue
        for qid in range(4):
            offs = [o for q, o in seen[name] if q == qid]
            assert offs == sorted(offs)
    assert all(g.state.offsets[("g-push", topic, qid)] == 20 for qid in range(4))


def test_orderly_push_redelivers_until_consumed_and_filters_tags(cluster: FakeCluster, topic: str) -> None:
    calls: list[list[int]] = []

    def on(msgs: list[Message], q: MessageQueue) -> ConsumeStatus:
        calls.append([m.queue_offset for m in msgs])
        if len(calls) == 1:
            raise RuntimeError("first delivery fails")
        if len(calls) == 2:
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    async def go() -> None:
        p = Producer("fill", cluster.namesrv_addr)
        await p.start()
        await p.send_batch(
            [Message(topic, f"{i}".encode(), tags="even" if i % 2 == 0 else "odd") for i in range(6)], 0
        )
        await p.shutdown()
        c = PushConsumer(  # orderly: a failed batch is retried here (concurrent sends it back)
            "g-redeliver",
            cluster.namesrv_addr,
            topic,
            on,
            subscription="even",
            orderly=True,
            suspend_ms=200,
            reconsume_delay_s=0.05,
        )
        await c.start()
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and len(calls) < 3:
                await asyncio.sleep(0.02)
        finally:
            await c.shutdown()

    run(go())
    assert calls[:3] == [[0, 2, 4]] * 3  # same batch until it was accepted, odd tags filtered
    assert group_c(cluster).state.offsets[("g-redeliver", topic, 0)] == 6


def test_push_consumer_resumes_from_committed_offset(cluster: FakeCluster, topic: str) -> None:
    got: list[bytes] = []

    async def go() -> None:
        await fill(cluster, topic, 3)
        async with PullConsumer("g-resume", cluster.namesrv_addr) as pc:
            for q in await pc.fetch_queues(topic):
                await pc.commit_offset(q, 2)
        c = PushConsumer(
            "g-resume",
            cluster.namesrv_addr,
            topic,
            lambda msgs, q: got.extend(m.body for m in msgs),
            suspend_ms=200,
        )
        await c.start()
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and len(got) < 4:
                await asyncio.sleep(0.02)
        finally:
            await c.shutdown()

    run(go())
    assert sorted(got) == [b"0-2", b"1-2", b"2-2", b"3-2"]


def test_leaving_member_hands_its_queues_over(cluster: FakeCluster, topic: str) -> None:
    """b unregisters on shutdown, so a takes all queues at its next rebalance (not after 30 s)."""
    got: list[bytes] = []

    async def go() -> tuple[int, int]:
        kw = dict(suspend_ms=200, rebalance_interval_s=0.1, heartbeat_interval_s=0.1)
        a = PushConsumer(
            "g-leave", cluster.namesrv_addr, topic, lambda m, q: got.extend(x.body for x in m), **kw
        )  # type: ignore[arg-type]
        b = PushConsumer("g-leave", cluster.namesrv_addr, topic, lambda m, q: None, **kw)  # type: ignore[arg-type]
        await a.start()
        await b.start()
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and len(a.allocated_queues) != 2:
                await asyncio.sleep(0.02)
            shared = len(a.allocated_queues)
            await b.shutdown()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and len(a.allocated_queues) != 4:
                await asyncio.sleep(0.02)
            await a.wait_assigned()
            await fill(cluster, topic, 1)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and len(got) < 4:
                await asyncio.sleep(0.02)
            return shared, len(a.allocated_queues)
        finally:
            await a.shutdown()

    assert run(go()) == (2, 4)
    assert sorted(got) == [b"0-0", b"1-0", b"2-0", b"3-0"]


def test_broker_notification_triggers_rebalance(cluster: FakeCluster, topic: str) -> None:
    """With periodic rebalancing far away, a's share shrinks only because the broker told it to."""

    async def go() -> tuple[int, int, float]:
        kw = dict(suspend_ms=200, rebalance_interval_s=60, heartbeat_interval_s=60)
        a = PushConsumer("g-notify", cluster.namesrv_addr, topic, lambda m, q: None, **kw)  # type: ignore[arg-type]
        b = PushConsumer("g-notify", cluster.namesrv_addr, topic, lambda m, q: None, **kw)  # type: ignore[arg-type]
        await a.start()
        alone = len(a.allocated_queues)
        started = time.monotonic()
        await b.start()
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and len(a.allocated_queues) != 2:
                await asyncio.sleep(0.02)
            return alone, len(a.allocated_queues), time.monotonic() - started
        finally:
            await b.shutdown()
            await a.shutdown()

    alone, shared, took = run(go())
    assert (alone, shared) == (4, 2) and took < 5
