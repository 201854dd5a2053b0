"""Producer against the real nameserver and fake broker groups: routing, retries, idempotence, errors."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Awaitable, Iterator
from typing import TypeVar

import pytest
from client_fake_broker import FakeCluster

from client import (
    BatchSendResult,
    Message,
    MessageInvalidError,
    MessageQueue,
    NoNameServerError,
    Producer,
    RouteNotFoundError,
    SendFailedError,
    SendOutcomeUnknownError,
    SendResult,
    SendStatus,
)
from remoting.message import parse_offset_msg_id, properties_from_bytes

pytestmark = pytest.mark.timeout(60)
T = TypeVar("T")
_topics = itertools.count(1)


def run(coro: Awaitable[T], timeout: float = 20.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def dead_addr() -> str:
    """An address nobody listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[FakeCluster]:
    c = FakeCluster({"broker-a": 3, "broker-b": 1}, nameservers=2)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def topic(cluster: FakeCluster) -> str:
    """A fresh topic on broker-a only (the 3-node group), 4 queues."""
    for g in cluster.groups.values():
        g.reset_scripts()
        g.hints = True
    name = f"TP{next(_topics)}"
    cluster.add_topic(name, 4, ["broker-a"])
    return name


def group_a(cluster: FakeCluster):  # noqa: ANN201 - test helper
    return cluster.groups["broker-a"]


async def producer(cluster: FakeCluster, **kw: object) -> Producer:
    p = Producer("pg", cluster.namesrv_addr, **kw)  # type: ignore[arg-type]
    await p.start()
    return p


# --- routing -----------------------------------------------------------------------------------------
def test_send_round_robin_over_queues(cluster: FakeCluster, topic: str) -> None:
    async def go() -> list[SendResult]:
        p = await producer(cluster)
        try:
            return [await p.send(Message(topic, f"m{i}".encode(), tags="t", keys=["k"])) for i in range(8)]
        finally:
            await p.shutdown()

    results = run(go())
    assert sorted(r.queue_id for r in results) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(r.broker_name == "broker-a" and r.tries == 1 and not r.duplicate for r in results)
    host, position = parse_offset_msg_id(results[0].msg_id)  # RocketMQ's offset message id
    assert host in {n.addr for n in group_a(cluster).nodes} and position >= 1
    assert group_a(cluster).count(topic) == 8


def test_two_groups_share_load(cluster: FakeCluster) -> None:
    name = f"TP{next(_topics)}"
    cluster.add_topic(name, 2)

    async def go() -> list[SendResult]:
        p = await producer(cluster)
        try:
            return [await p.send(Message(name, b"x")) for _ in range(8)]
        finally:
            await p.shutdown()

    results = run(go())
    assert {r.broker_name for r in results} == {"broker-a", "broker-b"}
    assert sum(1 for r in results if r.broker_name == "broker-b") == 4


def test_no_nameserver_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)

    async def go() -> None:
        p = Producer("pg")
        await p.start()
        try:
            await p.send(Message("Any", b"x"))
        finally:
            await p.shutdown()

    with pytest.raises(NoNameServerError, match="no nameserver address"):
        run(go())


def test_no_route_info(cluster: FakeCluster) -> None:
    async def go() -> None:
        p = await producer(cluster)
        try:
            await p.send(Message("NoSuchTopic", b"x"))
        finally:
            await p.shutdown()

    with pytest.raises(RouteNotFoundError, match="no route info for topic NoSuchTopic"):
        run(go())


def test_dead_first_nameserver_is_skipped(cluster: FakeCluster, topic: str) -> None:
    async def go() -> SendResult:
        p = Producer("pg", f"{dead_addr()};{cluster.namesrv_addr}")
        p.instance.namesrv._index = 0  # start with the dead one
        await p.start()
        try:
            return await p.send(Message(topic, b"x"))
        finally:
            await p.shutdown()

    assert run(go()).broker_name == "broker-a"


def test_invalid_messages_are_refused_before_sending(cluster: FakeCluster, topic: str) -> None:
    async def go(msg: Message) -> None:
        p = await producer(cluster, max_message_bytes=10)
        try:
            await p.send(msg)
        finally:
            await p.shutdown()

    with pytest.raises(MessageInvalidError, match="empty"):
        run(go(Message(topic, b"")))
    with pytest.raises(MessageInvalidError, match="over the 10-byte limit"):
        run(go(Message(topic, b"x" * 11)))
    with pytest.raises(MessageInvalidError, match="topic"):
        run(go(Message("bad topic!", b"x")))
    assert not group_a(cluster).nodes[0].sends()


# --- retries -------------------------------------------------------------------------------------------
def test_not_master_with_hint_goes_to_new_master(cluster: FakeCluster, topic: str) -> None:
    g = group_a(cluster)

    async def go() -> SendResult:
        p = await producer(cluster)
        try:
            await p.fetch_publish_queues(topic)  # route cached: master is node 0
            cluster.call(_set_master_silently(g, 1))  # node 1 leads, nameserver not told yet
            return await p.send(Message(topic, b"x"))
        finally:
            await p.shutdown()

    try:
        result = run(go())
        assert result.tries == 2
        assert result.broker_addr == g.nodes[1].addr
        assert len(g.nodes[0].sends()) == 1 and len(g.nodes[1].sends()) == 1
    finally:
        cluster.call(g.failover(0))


async def _set_master_silently(g, index: int) -> None:  # noqa: ANN001
    g.master = index


def test_retry_avoids_the_broker_that_failed(cluster: FakeCluster) -> None:
    name = f"TP{next(_topics)}"
    cluster.add_topic(name, 1)
    a, b = cluster.groups["broker-a"], cluster.groups["broker-b"]
    for g in (a, b):
        g.reset_scripts()
    a.nodes[0].script[:] = ["unavailable"] * 10  # broker-a refuses everything

    async def go() -> list[SendResult]:
        p = await producer(cluster, retry_backoff_s=5.0)  # a backoff would blow the timeout
        try:
            return [await p.send(Message(name, b"x")) for _ in range(6)]
        finally:
            await p.shutdown()

    results = run(go())
    assert all(r.broker_name == "broker-b" for r in results)
    retried = sum(1 for r in results if r.tries == 2)
    assert retried >= 1 and all(r.tries <= 2 for r in results)
    # each refusal was followed by a try on broker-b; after one, the client may also have
    # forgotten broker-a's master (SERVICE_NOT_AVAILABLE: its group has no leader) while the
    # route refresh it started is under way, so a later try on broker-a fails without a send
    assert 1 <= len(a.nodes[0].sends()) <= retried


def test_definite_failures_exhaust_retries(cluster: FakeCluster, topic: str) -> None:
    g = group_a(cluster)
    g.nodes[0].script[:] = ["busy"] * 3

    async def go() -> None:
        p = await producer(cluster, retry_backoff_s=0.01)
        try:
            await p.send(Message(topic, b"x"))
        finally:
            await p.shutdown()

    with pytest.raises(SendFailedError, match=r"send failed after 3 tries to brokers \[broker-a@") as info:
        run(go())
    assert info.value.tries == 3 and not info.value.outcome_unknown
    assert g.count(topic) == 0


def test_illegal_message_is_not_retried(cluster: FakeCluster, topic: str) -> None:
    g = group_a(cluster)
    g.nodes[0].script[:] = ["illegal"]

    async def go() -> None:
        p = await producer(cluster)
        try:
            await p.send(Message(topic, b"x"))
        finally:
            await p.shutdown()

    with pytest.raises(SendFailedError, match="not retryable") as info:
        run(go())
    assert info.value.tries == 1 and info.value.code == 13


def test_failover_during_sends(cluster: FakeCluster, topic: str) -> None:
    """Master killed, group elects for a while, new master registers: sends come through."""
    g = group_a(cluster)

    async def go() -> SendResult:
        p = await producer(cluster, retries=8, retry_backoff_s=0.05, send_timeout_s=5.0)
        try:
            await p.send(Message(topic, b"before"))
            await asyncio.to_thread(cluster.call, g.nodes[0].kill())
            await asyncio.to_thread(cluster.call, g.failover(None))  # electing: no master in the route
            await asyncio.sleep(0.05)  # the kill happened before the next send, not during it
            loop = asyncio.get_running_loop()
            loop.call_later(
                0.3, lambda: asyncio.ensure_future(asyncio.to_thread(cluster.call, g.failover(2)))
            )
            return await p.send(Message(topic, b"after"))
        finally:
            await p.shutdown()

    try:
        result = run(go())
        assert result.broker_addr == g.nodes[2].addr and result.tries > 1
        assert g.count(topic) == 2
    finally:
        cluster.call(_restart_node(g, 0))


def test_a_slave_names_the_new_master_before_the_nameservers_do(cluster: FakeCluster, topic: str) -> None:
    """Master killed and a new one elected but not registered yet: the producer asks a slave,
    which names the new master, and sends there; the redirect costs no try (one retry is enough:
    the refused connection to the dead master is the only try spent)."""
    g = group_a(cluster)

    async def go() -> SendResult:
        p = await producer(cluster, retries=1, retry_backoff_s=0.05, send_timeout_s=5.0)
        try:
            await p.send(Message(topic, b"before"))
            await asyncio.to_thread(cluster.call, g.nodes[0].kill())
            g.master = 2  # elected; the nameservers have not heard of it (no registration)
            await asyncio.sleep(0.05)  # the kill happened before the next send, not during it
            return await p.send(Message(topic, b"after"))
        finally:
            await p.shutdown()

    try:
        result = run(go())
        assert result.broker_addr == g.nodes[2].addr
        assert g.count(topic) == 2
    finally:
        cluster.call(_restart_node(g, 0))


async def _restart_node(g, index: int) -> None:  # noqa: ANN001
    from client_fake_broker import FakeNode

    g.nodes[index] = FakeNode(g, index)
    await g.nodes[index].start()
    await g.failover(0)


# --- unknown outcomes and idempotence ---------------------------------------------------------------------
def test_replication_timeout_is_unknown_and_not_retried(cluster: FakeCluster, topic: str) -> None:
    g = group_a(cluster)
    g.nodes[0].script[:] = ["repl_timeout"]

    async def go() -> None:
        p = await producer(cluster)
        try:
            await p.send(Message(topic, b"x"))
        finally:
            await p.shutdown()

    with pytest.raises(SendOutcomeUnknownError, match="may or may not have been stored") as info:
        run(go())
    assert info.value.outcome_unknown and info.value.tries == 1
    assert g.count(topic) == 1  # it was in fact stored: "unknown" was the honest answer


def test_stored_without_replication_is_a_result_with_its_status_not_a_retry(
    cluster: FakeCluster, topic: str
) -> None:
    g = group_a(cluster)
    g.nodes[0].script[:] = ["flush_slave_timeout", "flush_slave_timeout"]

    async def go() -> tuple[SendResult, BatchSendResult]:
        p = await producer(cluster)
        try:
            return await p.send(Message(topic, b"x")), await p.send_batch([Message(topic, b"y")] * 3)
        finally:
            await p.shutdown()

    single, batch = run(go())
    # RocketMQ's master stored them: a retry would store them twice
    assert single.status is SendStatus.FLUSH_SLAVE_TIMEOUT and single.tries == 1 and single.queue_offset >= 0
    assert batch.status is SendStatus.FLUSH_SLAVE_TIMEOUT and batch.tries == 1 and len(batch.offsets) == 3
    assert g.count(topic) == 4


def test_idempotent_retry_after_replication_timeout_stores_once(cluster: FakeCluster, topic: str) -> None:
    g = group_a(cluster)
    g.nodes[0].script[:] = ["repl_timeout"]

    async def go() -> tuple[SendResult, Message]:
        p = await producer(cluster, idempotent=True)
        try:
            msg = Message(topic, b"x")
            return await p.send(msg), msg
        finally:
            await p.shutdown()

    result, msg = run(go())
    assert result.duplicate and result.tries == 2
    sends = g.nodes[0].sends()
    assert len(sends) == 2
    assert uniq_key(sends[0]) == uniq_key(sends[1]) == msg.unique_key != ""
    assert msg.seq == result.seq == 1 and msg.producer_id == result.producer_id
    assert sends[0]["queueId"] == sends[1]["queueId"]  # pinned to the same queue
    assert g.count(topic) == 1


def test_idempotent_retry_after_connection_loss_follows_failover(cluster: FakeCluster, topic: str) -> None:
    """Stored on the old master, connection dropped, new master elected: the retry is a duplicate."""
    g = group_a(cluster)
    g.nodes[0].script[:] = ["drop_then_master:1"]  # nameserver not told: NOT_MASTER hints lead the way

    async def go() -> SendResult:
        p = await producer(cluster, idempotent=True, retries=5, retry_backoff_s=0.02)
        try:
            return await p.send(Message(topic, b"x"))
        finally:
            await p.shutdown()

    try:
        result = run(go())
        assert result.duplicate and result.broker_addr == g.nodes[1].addr
        assert g.count(topic) == 1
        keys = {uniq_key(h) for n in g.nodes for h in n.sends()}
        assert len(keys) == 1
    finally:
        cluster.call(g.failover(0))


def test_resending_the_same_message_object_is_deduplicated(cluster: FakeCluster, topic: str) -> None:
    g = group_a(cluster)
    g.nodes[0].script[:] = ["hang"]

    async def go() -> tuple[SendResult, str]:
        p = await producer(cluster, idempotent=True, send_timeout_s=0.3)
        try:
            msg = Message(topic, b"x")
            first = await p.send(msg)  # noqa: F841 - raises
        except SendOutcomeUnknownError as exc:
            second = await p.send(msg, timeout_s=3.0)
            return second, str(exc)
        finally:
            await p.shutdown()
        raise AssertionError("expected an unknown outcome")

    second, error = run(go())
    assert "send outcome unknown after 1 try" in error
    assert second.duplicate and second.seq == 1
    assert g.count(topic) == 1


def test_system_error_counts_as_unknown(cluster: FakeCluster, topic: str) -> None:
    g = group_a(cluster)
    g.nodes[0].script[:] = ["system_error"]

    async def go() -> None:
        p = await producer(cluster)
        try:
            await p.send(Message(topic, b"x"))
        finally:
            await p.shutdown()

    with pytest.raises(SendOutcomeUnknownError):
        run(go())


# --- batch, async, oneway ------------------------------------------------------------------------------------
def test_batch_to_one_queue(cluster: FakeCluster, topic: str) -> None:
    g = group_a(cluster)

    async def go():  # noqa: ANN202
        p = await producer(cluster)
        try:
            msgs = [Message(topic, f"b{i}".encode(), tags="t" if i % 2 else None) for i in range(100)]
            return await p.send_batch(msgs, queue_id=2), msgs
        finally:
            await p.shutdown()

    result, msgs = run(go())
    assert result.queue_id == 2 and result.offsets == list(range(100)) and result.duplicates == 0
    assert [m.queue_offset for m in msgs] == list(range(100))
    assert len(g.messages(topic, 2)) == 100


def test_idempotent_batch_retry_is_deduplicated(cluster: FakeCluster, topic: str) -> None:
    g = group_a(cluster)
    g.nodes[0].script[:] = ["repl_timeout"]

    async def go():  # noqa: ANN202
        p = await producer(cluster, idempotent=True)
        try:
            return await p.send_batch([Message(topic, f"b{i}".encode()) for i in range(50)])
        finally:
            await p.shutdown()

    result = run(go())
    assert result.duplicates == 50 and result.tries == 2
    assert g.count(topic) == 50
    sends = g.nodes[0].sends()
    assert len(sends) == 2 and sends[0]["queueId"] == sends[1]["queueId"]


def test_batch_must_be_one_topic(cluster: FakeCluster, topic: str) -> None:
    async def go() -> None:
        p = await producer(cluster)
        try:
            await p.send_batch([Message(topic, b"x"), Message("Other", b"y")])
        finally:
            await p.shutdown()

    with pytest.raises(MessageInvalidError, match="one topic"):
        run(go())


def test_send_async_callbacks_and_retry(cluster: FakeCluster, topic: str) -> None:
    g = group_a(cluster)
    g.nodes[0].script[:] = [None, "busy", None]  # type: ignore[list-item]

    async def go() -> list[tuple[SendResult | None, BaseException | None]]:
        p = await producer(cluster, retry_backoff_s=0.01)
        got: list[tuple[SendResult | None, BaseException | None]] = []
        done = asyncio.Event()

        def cb(result: SendResult | None, error: BaseException | None) -> None:
            got.append((result, error))
            if len(got) == 50:
                done.set()

        try:
            for i in range(50):
                await p.send_async(Message(topic, f"a{i}".encode()), cb)
            await asyncio.wait_for(done.wait(), 5)
            return got
        finally:
            await p.shutdown()

    got = run(go())
    assert all(err is None for _r, err in got)
    assert sum(1 for r, _e in got if r is not None and r.tries == 2) == 1
    assert g.count(topic) == 50


def test_send_async_unknown_goes_to_callback(cluster: FakeCluster, topic: str) -> None:
    g = group_a(cluster)
    g.nodes[0].script[:] = ["repl_timeout"]

    async def go() -> BaseException | None:
        p = await producer(cluster)
        fut: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        try:
            await p.send_async(Message(topic, b"x"), lambda r, e: fut.set_result(e))
            return await asyncio.wait_for(fut, 5)
        finally:
            await p.shutdown()

    assert isinstance(run(go()), SendOutcomeUnknownError)


def test_send_oneway_and_explicit_queue(cluster: FakeCluster, topic: str) -> None:
    g = group_a(cluster)

    async def go() -> None:
        p = await producer(cluster)
        try:
            await p.send_oneway(Message(topic, b"o"), queue=MessageQueue(topic, "broker-a", 3))
            for _ in range(100):
                if g.count(topic):
                    break
                await asyncio.sleep(0.01)
        finally:
            await p.shutdown()

    run(go())
    assert len(g.messages(topic, 3)) == 1


def uniq_key(headers: dict) -> str:
    """The UNIQ_KEY property of a recorded SEND_MESSAGE (the broker's de-duplication key)."""
    return properties_from_bytes(str(headers["properties"]).encode())["UNIQ_KEY"]
