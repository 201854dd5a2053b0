"""TransactionProducer and producer heartbeats against the fake broker: the half message, the
END_TRANSACTION headers, the broker's CHECK_TRANSACTION_STATE and its answers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from bounded import runner, until
from client_fake_broker import FakeCluster, FakeGroup

from client import (
    LocalTransactionState,
    Message,
    MessageInvalidError,
    Producer,
    TransactionProducer,
    set_delay_level,
)
from remoting.message import parse_offset_msg_id, properties_from_bytes

pytestmark = pytest.mark.timeout(60)
_names = itertools.count(1)
COMMIT, ROLLBACK, UNKNOW = (
    LocalTransactionState.COMMIT_MESSAGE,
    LocalTransactionState.ROLLBACK_MESSAGE,
    LocalTransactionState.UNKNOW,
)


run = runner(20.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[FakeCluster]:
    c = FakeCluster({"broker-t": 2})
    try:
        yield c
    finally:
        c.close()


def group_t(cluster: FakeCluster) -> FakeGroup:
    return cluster.groups["broker-t"]


@pytest.fixture
def topic(cluster: FakeCluster) -> str:
    g = group_t(cluster)
    g.reset_scripts()
    for n in g.nodes:
        n.end_script.clear()
    name = f"TT{next(_names)}"
    cluster.add_topic(name, 2)
    return name


def master(cluster: FakeCluster) -> Any:
    node = group_t(cluster).master_node
    assert node is not None
    return node


def requests(cluster: FakeCluster, kind: str) -> list[dict[str, Any]]:
    return [h for node in group_t(cluster).nodes for k, h in node.requests if k == kind]


def visible(cluster: FakeCluster, topic: str) -> list[bytes]:
    g = group_t(cluster)
    return [e.record for q in range(2) for e in g.messages(topic, q)]


def producer(
    cluster: FakeCluster, group: str, check: Any = lambda m: COMMIT, **kw: Any
) -> TransactionProducer:
    return TransactionProducer(group, cluster.namesrv_addr, check_local=check, **kw)


def test_commit_sends_half_then_end_transaction_as_java_does(cluster: FakeCluster, topic: str) -> None:
    group = f"tx-{topic}"
    local: list[tuple[bytes, Any]] = []

    async def go() -> Any:
        async with producer(cluster, group) as p:
            return await p.send_in_transaction(
                Message(topic, b"order-1", keys=["o1"]),
                lambda m, arg: local.append((m.body, arg)) or COMMIT,
                "arg",
            )

    r = run(go())
    assert local == [(b"order-1", "arg")]
    assert r.local_state is COMMIT and r.end_error == "" and r.local_error is None
    half = requests(cluster, "SEND")[-1]
    assert half["sysFlag"] == "4"  # MessageSysFlag.TRANSACTION_PREPARED_TYPE
    props = properties_from_bytes(half["properties"].encode())
    assert props["TRAN_MSG"] == "true" and props["PGROUP"] == group
    assert r.msg_id == props["UNIQ_KEY"] == r.transaction_id
    end = requests(cluster, "END_TX")[-1]
    _, commit_log_offset = parse_offset_msg_id(r.send_result.msg_id)
    assert {k: v for k, v in end.items() if not k.startswith("_")} == {
        "producerGroup": group,
        "tranStateTableOffset": str(r.send_result.queue_offset),
        "commitLogOffset": str(commit_log_offset),
        "commitOrRollback": "8",
        "fromTransactionCheck": "false",
        "msgId": r.msg_id,
        "transactionId": r.msg_id,
    }
    assert end["_oneway"] is False and end["_remark"] == ""
    assert len(visible(cluster, topic)) == 1 and b"order-1" in visible(cluster, topic)[0]
    # the group was named in a heartbeat to the master before it could be asked about the half
    hbs = [h for h in master(cluster).requests if h[0] == "HEARTBEAT" and h[1]["producerDataSet"]]
    assert (
        hbs and hbs[0][1]["producerDataSet"] == [{"groupName": group}] and hbs[0][1]["consumerDataSet"] == []
    )
    unregs = [h for h in requests(cluster, "UNREGISTER") if h.get("producerGroup") == group]
    assert unregs and unregs[0]["clientID"] == hbs[0][1]["clientID"]


def test_rollback_unknown_and_local_failure(cluster: FakeCluster, topic: str) -> None:
    group = f"tx-{topic}"

    def boom(m: Message, arg: Any) -> LocalTransactionState:
        raise RuntimeError("db down")

    async def go() -> list[Any]:
        async with producer(cluster, group) as p:
            rolled = await p.send_in_transaction(Message(topic, b"r"), lambda m, a: ROLLBACK)
            unknown = await p.send_in_transaction(Message(topic, b"u"), lambda m, a: None)

            async def later(m: Message, a: Any) -> LocalTransactionState:
                await asyncio.sleep(0)
                return UNKNOW

            async_unknown = await p.send_in_transaction(Message(topic, b"au"), later)
            failed = await p.send_in_transaction(Message(topic, b"f"), boom)
            with pytest.raises(MessageInvalidError, match="cannot be delayed"):
                await p.send_in_transaction(set_delay_level(Message(topic, b"d"), 2), lambda m, a: COMMIT)
            return [rolled, unknown, async_unknown, failed]

    rolled, unknown, async_unknown, failed = run(go())
    ends = requests(cluster, "END_TX")
    assert [e["commitOrRollback"] for e in ends] == ["12", "0", "0", "0"]
    assert [e["_oneway"] for e in ends] == [False, True, True, True]  # UNKNOW goes oneway, as Java's
    assert (
        rolled.local_state is ROLLBACK
        and unknown.local_state is UNKNOW
        and async_unknown.local_state is UNKNOW
    )
    assert failed.local_state is UNKNOW and isinstance(failed.local_error, RuntimeError)
    assert ends[-1]["_remark"].startswith("executeLocalTransactionBranch exception: RuntimeError('db down')")
    assert visible(cluster, topic) == []
    assert list(group_t(cluster).state.halves.values()).count("pending") >= 3


def test_broker_check_is_answered_from_check_local(cluster: FakeCluster, topic: str) -> None:
    group = f"tx-{topic}"
    checked: list[Message] = []

    def check(m: Message) -> LocalTransactionState:
        checked.append(m)
        return COMMIT if m.body == b"yes" else ROLLBACK

    async def go() -> list[Any]:
        async with producer(cluster, group, check) as p:
            results = [
                await p.send_in_transaction(Message(topic, b), lambda m, a: UNKNOW) for b in (b"yes", b"no")
            ]
            for r in results:
                index = parse_offset_msg_id(r.send_result.msg_id)[1]
                assert await asyncio.to_thread(cluster.call, master(cluster).check_transaction(group, index))
            assert await until(
                lambda: (
                    len([e for e in requests(cluster, "END_TX") if e["fromTransactionCheck"] == "true"]) == 2
                )
            )
            return results

    results = run(go())
    assert [m.body for m in checked] == [b"yes", b"no"]
    assert checked[0].topic == topic and checked[0].properties["PGROUP"] == group
    answers = [e for e in requests(cluster, "END_TX") if e["fromTransactionCheck"] == "true"]
    for r, answer, verdict in zip(results, answers, ("8", "12"), strict=True):
        assert {k: v for k, v in answer.items() if not k.startswith("_")} == {
            "producerGroup": group,
            "tranStateTableOffset": str(r.send_result.queue_offset),
            "commitLogOffset": str(parse_offset_msg_id(r.send_result.msg_id)[1]),
            "commitOrRollback": verdict,
            "fromTransactionCheck": "true",
            "msgId": r.msg_id,
            "transactionId": r.msg_id,
        }
        assert answer["_oneway"] is False
    assert len(visible(cluster, topic)) == 1 and b"yes" in visible(cluster, topic)[0]


def test_checks_are_bounded_and_refusals_reported(cluster: FakeCluster, topic: str) -> None:
    group = f"tx-{topic}"
    release = asyncio.Event()
    started: list[bytes] = []

    async def slow_check(m: Message) -> LocalTransactionState:
        started.append(m.body)
        await release.wait()
        return COMMIT

    async def go() -> tuple[Any, int, int]:
        async with producer(cluster, group, slow_check, max_pending_checks=1) as p:
            master(cluster).end_script.append("refuse")
            refused = await p.send_in_transaction(Message(topic, b"a"), lambda m, a: COMMIT)
            other = await p.send_in_transaction(Message(topic, b"b"), lambda m, a: UNKNOW)
            a_index = parse_offset_msg_id(refused.send_result.msg_id)[1]
            b_index = parse_offset_msg_id(other.send_result.msg_id)[1]
            for index in (a_index, a_index, b_index):  # a twice: one check per half at a time
                await asyncio.to_thread(cluster.call, master(cluster).check_transaction(group, index))
            assert await until(lambda: started == [b"a"] and p.checks_dropped == 1)
            dropped = p.checks_dropped
            release.set()
            assert await until(lambda: group_t(cluster).state.halves[a_index] == "commit")
            return refused, dropped, len(started)

    refused, dropped, checks = run(go())
    assert "END_TRANSACTION to" in refused.end_error and "SYSTEM_ERROR" in refused.end_error
    assert dropped == 1 and checks == 1


def test_plain_producer_heartbeats_its_group_to_known_masters(cluster: FakeCluster, topic: str) -> None:
    group = f"pg-{topic}"

    async def go() -> None:
        async with Producer(group, cluster.namesrv_addr, heartbeat_interval_s=0.1) as p:
            assert p.heartbeat_interval_s == 0.1
            await p.send(Message(topic, b"x"))
            assert await until(
                lambda: (
                    sum(
                        1
                        for k, h in master(cluster).requests
                        if k == "HEARTBEAT" and h["producerDataSet"] == [{"groupName": group}]
                    )
                    >= 2
                )
            )

    run(go())
    slave = next(n for n in group_t(cluster).nodes if not n.is_master)
    assert not [h for k, h in slave.requests if k == "HEARTBEAT"]  # masters only, as Java's producer
    assert [h for h in requests(cluster, "UNREGISTER") if h.get("producerGroup") == group]
    with pytest.raises(ValueError):
        Producer(group, cluster.namesrv_addr, heartbeat_interval_s=0)


def test_instance_ignores_checks_it_cannot_use_and_refuses_a_second_checker(cluster: FakeCluster) -> None:
    from client import ClientInstance
    from remoting.codes import RequestCode
    from remoting.message import encode_stored_message
    from remoting.protocol import RemotingCommand

    async def go() -> None:
        instance = ClientInstance(cluster.namesrv_addr)
        try:
            calls: list[Message] = []
            unregister = instance.register_transaction_checker("g1", lambda conn, req, msg: calls.append(msg))
            with pytest.raises(ValueError, match="already answers transaction checks"):
                instance.register_transaction_checker("g1", lambda conn, req, msg: None)

            def check(body: bytes) -> object:
                return instance._on_check_transaction(
                    SimpleNamespace(remote_addr="127.0.0.1:1"),  # type: ignore[arg-type]
                    RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, {}, body, oneway=True),
                )

            def half(group: str) -> bytes:
                props = f"PGROUP\x01{group}\x02".encode()
                return encode_stored_message(topic="T", body=b"x", properties=props, queue_id=0)

            assert check(b"garbage") is None and check(b"") is None and check(half("other")) is None
            assert calls == []
            assert check(half("g1")) is None and [m.properties["PGROUP"] for m in calls] == ["g1"]
            unregister()
            assert check(half("g1")) is None and len(calls) == 1
        finally:
            await instance.close()

    run(go())
