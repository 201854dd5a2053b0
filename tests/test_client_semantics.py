"""RocketMQ's message semantics with our clients against a real broker group (three brokers, two
nameservers): retries and dead letters, delayed delivery, transactions, orderly consumption, SQL92.

Delay levels are shortened (100 ms steps) and transaction checks made frequent, so each scenario
takes seconds; everything else is the brokers' real behaviour."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from bounded import runner
from bounded import until as bounded_until
from click.testing import CliRunner

from broker.localgroup import LocalBrokerGroup
from client import (
    BrokerError,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionProducer,
    dlq_topic,
    retry_topic,
    set_delay_level,
    set_deliver_time_ms,
)
from client.admin import main as admin_main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TOPIC, ORDERED, TX = "Semantics", "Ordered", "TxTopic"
LEVELS = "100ms 200ms 300ms 400ms 500ms 600ms 700ms 800ms 900ms 1s 1s 1s 1s 1s 1s 1s 1s 2s"
"""Delay levels 1..18, short: level 3 (a first retry) is 300 ms, level 18 is 2 s."""


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBrokerGroup]:
    g = LocalBrokerGroup(
        tmp_path_factory.mktemp("semantics"),
        topics=(f"{TOPIC}:2", f"{ORDERED}:4", f"{TX}:2"),
        settings={
            "register_interval_s": 10,
            "message_delay_level": LEVELS,
            "transaction_timeout_s": 1.0,
            "transaction_check_interval_s": 1.0,
        },
    )
    g.start()
    try:
        asyncio.run(g.wait_for_master(timeout=60))
        yield g
    finally:
        g.stop()


run = runner(120.0)


async def until(check: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    return await bounded_until(check, timeout_s, 0.05)


async def read_all(ns: list[str], topic: str) -> list[Message]:
    """Every message of ``topic`` (each queue from its start), e.g. a retry or dead-letter topic."""
    out: list[Message] = []
    async with PullConsumer("semantics-reader", ns) as c:
        try:
            queues = await c.fetch_queues(topic)
        except Exception:  # noqa: BLE001 - not created yet
            return out
        for q in queues:
            offset = await c.min_offset(q)
            for _ in range(1000):
                r = await c.pull(q, offset, 64)
                if not r.messages:
                    break
                out.extend(r.messages)
                offset = r.next_begin_offset
    return out


def consumer(ns: list[str], group: str, topic: str, listener: Any, **kw: Any) -> PushConsumer:
    opts: dict[str, Any] = dict(suspend_ms=1000, rebalance_interval_s=1, heartbeat_interval_s=1)
    opts.update(kw)
    return PushConsumer(group, ns, topic, listener, **opts)


def test_failing_message_comes_back_from_retry_then_lands_in_dlq(group: LocalBrokerGroup) -> None:
    ns = group.namesrv_addrs
    tries: list[tuple[str, int, str]] = []
    ok: list[bytes] = []

    def on(msgs: list[Message], q: MessageQueue) -> ConsumeStatus:
        for m in msgs:
            if m.body == b"poison":
                tries.append((m.topic, m.reconsume_times, q.topic))
                return ConsumeStatus.RECONSUME_LATER
            ok.append(m.body)
        return ConsumeStatus.CONSUME_SUCCESS

    async def go() -> list[Message]:
        c = consumer(ns, "sem-retry", TOPIC, on, batch_size=1, max_reconsume_times=2)
        await c.start()
        try:
            async with Producer("sem-p", ns) as p:
                for body in (b"fine-1", b"poison", b"fine-2"):
                    await p.send(Message(TOPIC, body, keys=[body.decode()]), 0)
            assert await until(lambda: len(tries) >= 3 and {b"fine-1", b"fine-2"} <= set(ok))
            assert await until(lambda: False, 1.5) is False  # no fourth try
        finally:
            await c.shutdown()
        return await read_all(ns, dlq_topic("sem-retry"))

    dead = run(go())
    assert [t[1] for t in tries] == [0, 1, 2]
    assert tries[0][2] == TOPIC and all(t[0] == TOPIC and t[2] == retry_topic("sem-retry") for t in tries[1:])
    assert [m.body for m in dead] == [b"poison"]
    assert dead[0].properties.get("RETRY_TOPIC") == TOPIC


def test_delayed_messages_arrive_after_their_delay(group: LocalBrokerGroup) -> None:
    ns = group.namesrv_addrs
    arrived: dict[bytes, float] = {}

    async def go() -> dict[bytes, float]:
        c = consumer(
            ns, "sem-delay", TOPIC, lambda msgs, q: arrived.update((m.body, time.time()) for m in msgs)
        )
        c.consume_from = c.consume_from.LAST_OFFSET
        await c.start()
        await c.wait_assigned()
        try:
            async with Producer("sem-p", ns) as p:
                sent = time.time()
                await p.send(set_delay_level(Message(TOPIC, b"level-18"), 18))  # 2 s
                await p.send(set_deliver_time_ms(Message(TOPIC, b"timer"), int((sent + 1.5) * 1000)))
                await p.send(Message(TOPIC, b"now"))
            assert await until(lambda: {b"level-18", b"timer", b"now"} <= set(arrived))
        finally:
            await c.shutdown()
        return {k: v - sent for k, v in arrived.items()}

    after = run(go())
    assert after[b"now"] < 1.0
    assert 1.9 <= after[b"level-18"] < 10 and 1.4 <= after[b"timer"] < 10


def test_transactions_commit_roll_back_and_get_checked(group: LocalBrokerGroup) -> None:
    ns = group.namesrv_addrs
    checked: list[bytes] = []
    got: list[bytes] = []

    def check(m: Message) -> LocalTransactionState:
        checked.append(m.body)
        return LocalTransactionState.COMMIT_MESSAGE

    async def go() -> list[Any]:
        c = consumer(ns, "sem-tx", TX, lambda msgs, q: got.extend(m.body for m in msgs))
        await c.start()
        try:
            async with TransactionProducer("sem-txp", ns, check_local=check) as p:
                results = [
                    await p.send_in_transaction(
                        Message(TX, b"commit"), lambda m, a: LocalTransactionState.COMMIT_MESSAGE
                    ),
                    await p.send_in_transaction(
                        Message(TX, b"rollback"), lambda m, a: LocalTransactionState.ROLLBACK_MESSAGE
                    ),
                    await p.send_in_transaction(
                        Message(TX, b"unknown"), lambda m, a: LocalTransactionState.UNKNOW
                    ),
                ]
                assert await until(lambda: {b"commit", b"unknown"} <= set(got))
            await asyncio.sleep(1.0)
        finally:
            await c.shutdown()
        return results

    results = run(go())
    assert [r.end_error for r in results] == ["", "", ""]
    assert sorted(got) == [b"commit", b"unknown"]  # the rolled back one never shows
    assert checked.count(b"unknown") >= 1 and b"commit" not in checked and b"rollback" not in checked


def test_orderly_consumer_sees_each_queue_in_order(group: LocalBrokerGroup) -> None:
    ns = group.namesrv_addrs
    seen: dict[int, list[int]] = {}
    failed_once: set[int] = set()

    def on(msgs: list[Message], q: MessageQueue) -> ConsumeStatus:
        n = int(msgs[0].body.split(b"-")[1])
        if n == 3 and q.queue_id not in failed_once:  # a failure holds its queue back, in place
            failed_once.add(q.queue_id)
            return ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        seen.setdefault(q.queue_id, []).append(n)
        return ConsumeStatus.CONSUME_SUCCESS

    async def go() -> None:
        a = consumer(ns, "sem-orderly", ORDERED, on, orderly=True, batch_size=1, reconsume_delay_s=0.1)
        b = consumer(ns, "sem-orderly", ORDERED, on, orderly=True, batch_size=1, reconsume_delay_s=0.1)
        await a.start()
        await b.start()
        try:
            assert await until(lambda: len(a.allocated_queues) == 2 and len(b.allocated_queues) == 2)
            assert not set(a.locked_queues()) & set(b.locked_queues())
            async with Producer("sem-p", ns) as p:
                for i in range(10):
                    for qid in range(4):
                        await p.send(Message(ORDERED, f"{qid}-{i}".encode()), qid)
            assert await until(lambda: all(len(seen.get(q, [])) == 10 for q in range(4)))
        finally:
            await b.shutdown()
            await a.shutdown()

    run(go())
    assert all(seen[q] == list(range(10)) for q in range(4)), seen


def test_sql92_subscription_is_filtered_by_the_broker(group: LocalBrokerGroup) -> None:
    ns = group.namesrv_addrs
    got: list[bytes] = []

    async def go() -> None:
        c = consumer(
            ns,
            "sem-sql",
            TOPIC,
            lambda msgs, q: got.extend(m.body for m in msgs),
            subscription="a > 5",
            expression_type="SQL92",
        )
        c.consume_from = c.consume_from.LAST_OFFSET
        await c.start()
        await c.wait_assigned()
        try:
            async with Producer("sem-p", ns) as p:
                for body, a in ((b"big", "9"), (b"small", "1"), (b"none", None)):
                    await p.send(Message(TOPIC, body, properties={"a": a} if a else {}))
            assert await until(lambda: b"big" in got)
            await asyncio.sleep(1.0)
        finally:
            await c.shutdown()

    run(go())
    assert got == [b"big"]


def test_sql92_subscription_the_broker_cannot_parse_fails_start(
    group: LocalBrokerGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # past the client's own compile check, so that the broker's CHECK_CLIENT_CONFIG answer is tested
    monkeypatch.setattr("client.push_consumer.compile_filter", lambda text: None)

    async def go() -> None:
        c = consumer(
            group.namesrv_addrs,
            "sem-sql-x",
            TOPIC,
            lambda m, q: None,
            subscription="a >",
            expression_type="SQL92",
        )
        with pytest.raises(BrokerError, match="SUBSCRIPTION_PARSE_FAILED") as info:
            await c.start()
        assert "SQL92 subscription 'a >' of group sem-sql-x to topic Semantics refused" in str(info.value)
        await c.shutdown()

    run(go())


def test_admin_commands_read_the_brokers_figures(group: LocalBrokerGroup) -> None:
    """retry-messages, delay-offsets and transaction-status against real brokers; a dead letter
    made with a pull consumer's send-back at delay level -1 (straight to %DLQ%)."""
    ns = group.namesrv_addrs

    async def prepare() -> None:
        async with Producer("sem-p", ns) as p:
            await p.send(Message(TOPIC, b"to-dlq"), 1)
            await p.send(set_delay_level(Message(TOPIC, b"delayed"), 1), 1)
        async with PullConsumer("sem-admin", ns) as c:
            q = next(q for q in await c.fetch_queues(TOPIC) if q.queue_id == 1)
            r = await c.pull(q, 0, 1000)
            msg = next(m for m in r.messages if m.body == b"to-dlq")
            await c.send_message_back(msg, q.broker_name, delay_level=-1)
        await asyncio.sleep(1.0)  # level 1 is 100 ms here

    run(prepare())
    runner = CliRunner()

    def cli(*args: str) -> str:
        r = runner.invoke(admin_main, ["-n", group.namesrv_addr_str, *args], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.output

    dead = cli("retry-messages", "-g", "sem-admin", "--dlq").splitlines()
    assert dead[1].split()[3] == TOPIC and dead[1].split()[-1] == "to-dlq" and dead[2] == "1 message(s)"
    delays = cli("delay-offsets").splitlines()
    assert delays[0].split()[:3] == ["#Broker", "#Level", "#Delivered"]
    rows = {int(line.split()[1]): line.split() for line in delays[1:]}
    assert int(rows[1][2]) >= 1 and rows[1][4] == "0"  # level 1: delivered, none waiting
    status = cli("transaction-status")
    assert re.search(r"^pending_half_messages\s+: \d+$", status, re.M)
    assert re.search(r"^scheduled_messages\s+: \d+$", status, re.M)
    assert re.search(r"^transactions\.checks_sent\s+: \d+$", status, re.M)
