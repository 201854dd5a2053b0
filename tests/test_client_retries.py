"""Concurrent consumption's retries, delayed messages and SQL92 subscriptions against the fake broker:
the exact requests (CONSUMER_SEND_MSG_BACK, retry copies, CHECK_CLIENT_CONFIG, heartbeats, pulls)
and what the listener sees."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from bounded import runner, until
from client_fake_broker import FakeCluster, FakeGroup

from client import (
    BrokerError,
    ConsumeStatus,
    ExpressionType,
    Message,
    MessageInvalidError,
    MessageQueue,
    Producer,
    PushConsumer,
    dlq_topic,
    retry_topic,
    set_delay_level,
    set_deliver_time_ms,
)
from client.message_props import delay_level, deliver_time_ms
from remoting.message import properties_from_bytes

pytestmark = pytest.mark.timeout(60)
_names = itertools.count(1)


run = runner(20.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[FakeCluster]:
    c = FakeCluster({"broker-r": 2})
    try:
        yield c
    finally:
        c.close()


def group_r(cluster: FakeCluster) -> FakeGroup:
    return cluster.groups["broker-r"]


@pytest.fixture
def topic(cluster: FakeCluster) -> str:
    g = group_r(cluster)
    g.reset_scripts()
    for n in g.nodes:
        n.back_script.clear()
    g.sql92, g.sql92_parse_fails = True, False
    name = f"TR{next(_names)}"
    cluster.add_topic(name, 2)
    return name


def master(cluster: FakeCluster) -> Any:
    node = group_r(cluster).master_node
    assert node is not None
    return node


def requests(cluster: FakeCluster, kind: str) -> list[dict[str, Any]]:
    return [h for node in group_r(cluster).nodes for k, h in node.requests if k == kind]


async def send(cluster: FakeCluster, topic: str, msgs: list[Message], queue_id: int = 0) -> None:
    async with Producer("fill", cluster.namesrv_addr) as p:
        for m in msgs:
            await p.send(m, queue_id)


def consumer(cluster: FakeCluster, group: str, topic: str, listener: Any, **kw: Any) -> PushConsumer:
    opts: dict[str, Any] = dict(
        suspend_ms=200, rebalance_interval_s=0.2, heartbeat_interval_s=0.2, reconsume_delay_s=0.05
    )
    opts.update(kw)
    return PushConsumer(group, cluster.namesrv_addr, topic, listener, **opts)


# --- concurrent consumption: send-back -----------------------------------------------------------------
def test_failed_message_is_sent_back_and_comes_back_from_the_retry_topic(
    cluster: FakeCluster, topic: str
) -> None:
    seen: list[tuple[bytes, str, int, str]] = []

    def on(msgs: list[Message], q: MessageQueue) -> ConsumeStatus:
        for m in msgs:
            seen.append((m.body, m.topic, m.reconsume_times, q.topic))
        if any(m.body == b"bad" and m.reconsume_times == 0 for m in msgs):
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    group = f"g-back-{topic}"

    async def go() -> PushConsumer:
        await send(cluster, topic, [Message(topic, b"ok-1"), Message(topic, b"bad"), Message(topic, b"ok-2")])
        c = consumer(cluster, group, topic, on, batch_size=1)
        await c.start()
        try:
            assert await until(lambda: (b"bad", topic, 1, retry_topic(group)) in seen)
            assert await until(lambda: group_r(cluster).state.offsets.get((group, topic, 0)) == 3)
        finally:
            await c.shutdown()
        return c

    c = run(go())
    backs = requests(cluster, "SEND_BACK")
    assert len(backs) == 1
    original = next(
        e for e in group_r(cluster).messages(topic, 0) if e.props.get("UNIQ_KEY") and b"bad" in e.record
    )
    assert backs[0] == {
        "offset": str(original.index),
        "group": group,
        "delayLevel": "0",
        "originMsgId": original.props["UNIQ_KEY"],
        "originTopic": topic,
        "unitMode": "false",
        "maxReconsumeTimes": "16",
    }
    # once from the topic, once from the retry topic (not retried here)
    assert sorted(b for b, *_ in seen) == [b"bad", b"bad", b"ok-1", b"ok-2"]
    # the retry topic was subscribed automatically, with "*"
    hb = [h for h in requests(cluster, "HEARTBEAT") if h["consumerDataSet"]]
    subs = {s["topic"]: s for s in hb[-1]["consumerDataSet"][0]["subscriptionDataSet"]}
    assert set(subs) == {topic, retry_topic(group)}
    assert subs[retry_topic(group)]["subString"] == "*" and subs[topic]["expressionType"] == "TAG"
    assert c.allocated_retry_queues == [] and c.max_reconsume_times == 16


def test_send_back_refused_falls_back_to_a_retry_copy(cluster: FakeCluster, topic: str) -> None:
    seen: list[Message] = []
    fail_first = [True]

    def on(msgs: list[Message], q: MessageQueue) -> ConsumeStatus:
        seen.extend(msgs)
        if fail_first[0]:
            fail_first[0] = False
            raise RuntimeError("listener failure")
        return ConsumeStatus.CONSUME_SUCCESS

    group = f"g-copy-{topic}"
    master(cluster).back_script.append("refuse")

    async def go() -> None:
        await send(
            cluster, topic, [Message(topic, b"payload", tags="TagA", keys=["k1"], properties={"user": "v"})]
        )
        c = consumer(cluster, group, topic, on, max_reconsume_times=5)
        await c.start()
        try:
            assert await until(lambda: len(seen) >= 2)
            assert await until(lambda: group_r(cluster).state.offsets.get((group, topic, 0)) == 1)
        finally:
            await c.shutdown()

    run(go())
    original, again = seen[0], seen[1]
    assert len(requests(cluster, "SEND_BACK")) == 1
    copies = [h for h in requests(cluster, "SEND") if h["topic"] == retry_topic(group)]
    assert len(copies) == 1
    h = copies[0]
    assert h["reconsumeTimes"] == "1" and h["maxReconsumeTimes"] == "5" and h["sysFlag"] == "0"
    props = properties_from_bytes(h["properties"].encode())
    assert props["RETRY_TOPIC"] == topic
    assert props["ORIGIN_MESSAGE_ID"] == original.properties["UNIQ_KEY"]
    assert (
        props["DELAY"] == "3" and props["user"] == "v" and props["TAGS"] == "TagA" and props["KEYS"] == "k1"
    )
    assert props["UNIQ_KEY"] != original.properties["UNIQ_KEY"]  # a new message of its own
    assert "RECONSUME_TIME" not in props and "MAX_RECONSUME_TIMES" not in props and "TRAN_MSG" not in props
    # back from %RETRY% with its own topic, tag, keys and the try count
    assert (again.topic, again.body, again.tags, again.keys, again.reconsume_times) == (
        topic,
        b"payload",
        "TagA",
        ["k1"],
        1,
    )


def test_message_neither_broker_took_is_retried_here(cluster: FakeCluster, topic: str) -> None:
    calls: list[int] = []

    def on(msgs: list[Message], q: MessageQueue) -> bool:
        calls.append(msgs[0].reconsume_times)
        return len(calls) > 1

    group = f"g-local-{topic}"
    master(cluster).back_script.append("refuse")

    async def go() -> None:
        await send(cluster, topic, [Message(topic, b"x")])
        c = consumer(cluster, group, topic, on)
        await c.start()
        try:
            master(cluster).script.append("illegal")  # the retry copy is refused too
            assert await until(lambda: len(calls) >= 2)
            assert await until(lambda: group_r(cluster).state.offsets.get((group, topic, 0)) == 1)
        finally:
            await c.shutdown()

    run(go())
    assert calls[:2] == [0, 1]  # tried again here, counted as a reconsume
    assert group_r(cluster).messages(retry_topic(group), 0) == []


def test_dead_letter_after_max_reconsume_times(cluster: FakeCluster, topic: str) -> None:
    tries: list[int] = []

    def on(msgs: list[Message], q: MessageQueue) -> ConsumeStatus:
        tries.extend(m.reconsume_times for m in msgs)
        return ConsumeStatus.RECONSUME_LATER

    group = f"g-dlq-{topic}"

    async def go() -> None:
        await send(cluster, topic, [Message(topic, b"poison")])
        c = consumer(cluster, group, topic, on, max_reconsume_times=2)
        await c.start()
        try:
            assert await until(lambda: len(group_r(cluster).messages(dlq_topic(group), 0)) == 1)
            await asyncio.sleep(0.3)
        finally:
            await c.shutdown()

    run(go())
    assert tries == [0, 1, 2]
    assert [h["maxReconsumeTimes"] for h in requests(cluster, "SEND_BACK")] == ["2", "2", "2"]
    dead = group_r(cluster).messages(dlq_topic(group), 0)[0]
    assert dead.props["RETRY_TOPIC"] == topic and b"poison" in dead.record


# --- delayed messages ------------------------------------------------------------------------------------
def test_delay_level_and_delivery_time_properties(cluster: FakeCluster, topic: str) -> None:
    m = set_delay_level(Message(topic, b"later"), 3)
    assert m.properties["DELAY"] == "3" and delay_level(m) == 3
    t = set_deliver_time_ms(Message(topic, b"at"), 1_900_000_000_000)
    assert t.properties["TIMER_DELIVER_MS"] == "1900000000000" and deliver_time_ms(t) == 1_900_000_000_000
    assert delay_level(set_delay_level(Message(topic, b"x", properties={"DELAY": "2"}), 0)) == 0
    for bad in (19, -1, True, "3"):
        with pytest.raises(MessageInvalidError, match="delay level"):
            set_delay_level(Message(topic, b"x"), bad)  # type: ignore[arg-type]
    with pytest.raises(MessageInvalidError, match="delivery time"):
        set_deliver_time_ms(Message(topic, b"x"), -5)

    async def go() -> None:
        async with Producer("pg-delay", cluster.namesrv_addr) as p:
            await p.send(m, 0)
            await p.send(t, 1)
            for delayed in (
                set_delay_level(Message(topic, b"b"), 1),
                set_deliver_time_ms(Message(topic, b"c"), 5),
            ):
                with pytest.raises(MessageInvalidError, match="batch message 1 asks for a delayed delivery"):
                    await p.send_batch([Message(topic, b"a"), delayed], 0)

    sent_before = len(requests(cluster, "BATCH"))
    run(go())
    assert len(requests(cluster, "BATCH")) == sent_before  # refused before anything was sent
    props = [properties_from_bytes(h["properties"].encode()) for h in requests(cluster, "SEND")]
    assert props[-2]["DELAY"] == "3" and props[-1]["TIMER_DELIVER_MS"] == "1900000000000"


# --- SQL92 subscriptions --------------------------------------------------------------------------------
def test_sql92_subscription_checked_heartbeated_and_pulled(cluster: FakeCluster, topic: str) -> None:
    got: list[bytes] = []
    group = f"g-sql-{topic}"
    expr = "a > 5 AND TAGS IN ('x', 'y')"

    async def go() -> None:
        await send(
            cluster,
            topic,
            [
                Message(topic, b"m1", tags="x", properties={"a": "7"}),
                Message(topic, b"m2", tags="y", properties={"a": "3"}),
                Message(topic, b"m3", tags="y", properties={"a": "9"}),
                Message(topic, b"m4", tags="z", properties={"a": "9"}),
            ],
        )
        c = consumer(
            cluster,
            group,
            topic,
            lambda msgs, q: got.extend(m.body for m in msgs),
            subscription=expr,
            expression_type=ExpressionType.SQL92,
        )
        await c.start()
        try:
            assert await until(lambda: len(got) >= 2)
            await asyncio.sleep(0.2)
        finally:
            await c.shutdown()

    run(go())
    assert sorted(got) == [b"m1", b"m3"]  # the broker's filter; no tag filter here on top of it
    checks = requests(cluster, "CHECK_CLIENT")
    assert len(checks) == 1
    check = checks[0]
    assert check["group"] == group and check["clientId"] and check["_headers"] == {}
    assert check["subscriptionData"] == {
        "classFilterMode": False,
        "topic": topic,
        "subString": expr,
        "tagsSet": [],
        "codeSet": [],
        "subVersion": 0,
        "expressionType": "SQL92",
    }
    hb = [
        h
        for h in requests(cluster, "HEARTBEAT")
        if h["consumerDataSet"] and h["consumerDataSet"][0]["groupName"] == group
    ]
    subs = {s["topic"]: s for s in hb[-1]["consumerDataSet"][0]["subscriptionDataSet"]}
    assert subs[topic]["expressionType"] == "SQL92" and subs[topic]["subString"] == expr
    assert subs[retry_topic(group)]["expressionType"] == "TAG"
    pulls = [h for h in requests(cluster, "PULL") if h["consumerGroup"] == group and h["topic"] == topic]
    assert pulls and all(h["expressionType"] == "SQL92" and h["subscription"] == expr for h in pulls)
    assert all(int(h["sysFlag"]) & 0x4 for h in pulls)


def test_sql92_subscription_refused(cluster: FakeCluster, topic: str) -> None:
    with pytest.raises(ValueError, match="does not compile"):
        PushConsumer(
            "g", cluster.namesrv_addr, topic, lambda m, q: None, subscription="a >", expression_type="SQL92"
        )
    with pytest.raises(ValueError):
        PushConsumer("g", cluster.namesrv_addr, topic, lambda m, q: None, expression_type="CLASS")

    async def start(expect: str) -> None:
        c = consumer(
            cluster,
            f"g-refused-{topic}",
            topic,
            lambda m, q: None,
            subscription="a > 1",
            expression_type="SQL92",
        )
        with pytest.raises(BrokerError, match=expect) as info:
            await c.start()
        assert "SQL92 subscription 'a > 1'" in str(info.value) and topic in str(info.value)
        assert c.allocated_queues == []
        await c.shutdown()

    group_r(cluster).sql92_parse_fails = True
    run(start("SUBSCRIPTION_PARSE_FAILED"))
    group_r(cluster).sql92_parse_fails = False
    group_r(cluster).sql92 = False
    run(start("does not support consumer to filter message by SQL92"))
