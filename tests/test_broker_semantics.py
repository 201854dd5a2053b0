"""RocketMQ's message semantics on a real broker group (two nameservers, three brokers), with
raw requests as RocketMQ's clients send them: delayed messages (levels and delivery times),
transactions (commit, rollback, checks, discard), retries and dead letters, queue locks and
SQL92 filters, each also across a kill of the master. Delays are configured short so the
tests run in seconds."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.localgroup import LocalBrokerGroup
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.message import (
    Message,
    decode_stored_messages,
    encode_message_batch,
    parse_offset_msg_id,
    properties_to_bytes,
)
from remoting.protocol import SERIALIZE_JSON

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TOPIC = "SemTopic"
LEVELS = "300ms 600ms 900ms 1200ms 1500ms 2s 3s"  # levels 1..7
PULL_ALL = 0x4  # sysFlag: subscription in the request


@pytest.fixture
def group(tmp_path: Path) -> Iterator[LocalBrokerGroup]:
    g = LocalBrokerGroup(
        tmp_path,
        topics=(f"{TOPIC}:2",),
        settings={
            "register_interval_s": 10,
            "message_delay_level": LEVELS,
            "transaction_timeout_s": 0.5,
            "transaction_check_interval_s": 0.5,
            "transaction_check_max": 3,
            "lock_max_live_s": 2.0,
        },
    )
    g.start()
    try:
        yield g
    finally:
        g.stop()


def send(topic: str, body: bytes, queue_id: int = 0, group: str = "pg", **props: str) -> RemotingCommand:
    headers = {"producerGroup": group, "topic": topic, "queueId": queue_id}
    if props:
        headers["properties"] = properties_to_bytes(props).decode()
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, headers, body)


class Group:
    """The group's master, followed across failovers, and pulls of whole queues."""

    def __init__(self, g: LocalBrokerGroup, client: RemotingClient) -> None:
        self.g, self.client = g, client
        self.master = ""

    async def find_master(self, exclude: set[str] | None = None) -> str:
        self.master = await self.g.wait_for_master(60, exclude=exclude)
        return self.master

    @property
    def addr(self) -> str:
        return self.g.broker_addr[self.master]

    async def call(self, req: RemotingCommand, timeout: float = 10.0) -> RemotingCommand:
        return await self.client.invoke_sync(self.addr, req, timeout)

    async def ok(self, req: RemotingCommand) -> RemotingCommand:
        r = await self.call(req)
        assert r.code == ResponseCode.SUCCESS, r
        return r

    async def pull(self, topic: str, queue_id: int = 0, expr: str = "*", kind: str = "TAG") -> list[Message]:
        """Every message of a queue from offset 0 (empty if the queue has none)."""
        out: list[Message] = []
        offset = 0
        for _ in range(100):
            req = RemotingCommand.request(
                RequestCode.PULL_MESSAGE,
                {
                    "consumerGroup": "puller",
                    "topic": topic,
                    "queueId": queue_id,
                    "queueOffset": offset,
                    "maxMsgNums": 64,
                    "sysFlag": PULL_ALL,
                    "subscription": expr,
                    "expressionType": kind,
                },
            )
            r = await self.call(req)
            if r.code == ResponseCode.SUCCESS:
                out += decode_stored_messages(r.body)
            elif r.code not in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
                if r.code == ResponseCode.TOPIC_NOT_EXIST:
                    return out
                raise AssertionError(r)
            nxt = r.header_int("nextBeginOffset", offset)
            if r.code == ResponseCode.PULL_NOT_FOUND or nxt == offset:
                return out
            offset = nxt
        return out

    async def bodies(self, topic: str, queue_id: int = 0) -> list[bytes]:
        return [m.body for m in await self.pull(topic, queue_id)]


async def until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def run(g: LocalBrokerGroup, scenario: Any) -> None:
    async def main() -> None:
        async with RemotingClient() as client:
            grp = Group(g, client)
            await grp.find_master()
            await scenario(grp)

    asyncio.run(asyncio.wait_for(main(), 240))
    logs = "".join((g.base_dir / g.name_of(n) / "broker.log").read_text(errors="replace") for n in g.node_ids)
    assert "Traceback" not in logs


def test_delayed_messages_arrive_when_due_exactly_once_across_a_failover(group: LocalBrokerGroup) -> None:
    async def scenario(grp: Group) -> None:
        sent_at = time.time()
        await grp.ok(send(TOPIC, b"level-2", DELAY="2"))  # 600 ms
        await grp.ok(send(TOPIC, b"timer", TIMER_DELIVER_MS=str(int((sent_at + 0.9) * 1000))))
        await grp.ok(send(TOPIC, b"level-0 is no delay", DELAY="0"))
        assert await grp.bodies(TOPIC) == [b"level-0 is no delay"]  # the others are held
        far = await grp.call(send(TOPIC, b"x", TIMER_DELIVER_MS=str(int((sent_at + 10 * 86400) * 1000))))
        assert far.code == ResponseCode.MESSAGE_ILLEGAL and "max_timer_delay_s" in far.remark
        bad = await grp.call(send(TOPIC, b"x", DELAY="soon"))
        assert bad.code == ResponseCode.MESSAGE_ILLEGAL and "DELAY" in bad.remark
        got = await until(
            lambda: _when(grp.pull(TOPIC), lambda ms: len(ms) == 3), 10, "both delayed messages delivered"
        )
        delivered = {m.body: m.store_ms / 1000 - sent_at for m in got}
        assert 0.55 <= delivered[b"level-2"] < 3 and 0.85 <= delivered[b"timer"] < 3, delivered
        held = next(m for m in got if m.body == b"level-2")
        assert held.properties.get("REAL_TOPIC") == TOPIC and "TIMER_OUT_MS" not in held.properties
        offsets = json.loads(
            bytes((await grp.ok(RemotingCommand.request(RequestCode.GET_ALL_DELAY_OFFSET))).body)
        )
        assert offsets["offsetTable"]["2"] == 1

        # 40 messages due in 1.2 s, and the master killed at once: each delivered exactly once
        bodies = {f"due-{i}".encode() for i in range(40)}
        for body in sorted(bodies):
            await grp.ok(send(TOPIC, body, queue_id=1, DELAY="4"))
        old = grp.master
        grp.g.kill_broker(old)
        await grp.find_master(exclude={old})
        got = await until(
            lambda: _when(grp.bodies(TOPIC, 1), lambda bs: len(bs) >= 40), 20, "delayed sends after failover"
        )
        await asyncio.sleep(1.5)  # (and no second copy later)
        again = await grp.bodies(TOPIC, 1)
        assert sorted(again) == sorted(bodies), (len(again), len(set(again)))

    run(group, scenario)


async def _when(fetch: Any, ok: Any) -> Any:
    value = await fetch
    return value if ok(value) else None


def end_tx(position: int, kind: int, group: str = "pg", from_check: bool = False) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.END_TRANSACTION,
        {
            "producerGroup": group,
            "tranStateTableOffset": 0,
            "commitLogOffset": position,
            "commitOrRollback": kind,
            "fromTransactionCheck": from_check,
            "msgId": "",
        },
    )


def test_transactions_commit_once_roll_back_for_good_and_are_checked(group: LocalBrokerGroup) -> None:
    async def scenario(grp: Group) -> None:
        halves = {}
        for name in ("commit", "rollback", "checked", "forgotten"):
            r = await grp.ok(send(TOPIC, name.encode(), TRAN_MSG="true", PGROUP="pg"))
            halves[name] = parse_offset_msg_id(r.header_str("msgId"))[1]
        assert await grp.bodies(TOPIC) == []  # half messages are invisible
        await grp.ok(end_tx(halves["commit"], 8))
        twice = await grp.call(end_tx(halves["commit"], 8))
        assert twice.code == ResponseCode.SYSTEM_ERROR and "no pending half message" in twice.remark
        await grp.ok(end_tx(halves["rollback"], 12))
        wrong = await grp.call(end_tx(halves["checked"], 8, group="other"))
        assert wrong.code == ResponseCode.SYSTEM_ERROR and "producer group" in wrong.remark
        assert await grp.bodies(TOPIC) == [b"commit"]

        # A producer of group pg, heard from by heartbeat: the broker asks it about "checked"
        # (and "forgotten") once they are older than the transaction timeout.
        checks: list[RemotingCommand] = []
        producer = RemotingClient()
        producer.register_processor(RequestCode.CHECK_TRANSACTION_STATE, lambda conn, req: checks.append(req))
        async with producer:
            hb = {"clientID": "tx-producer", "producerDataSet": [{"groupName": "pg"}], "consumerDataSet": []}
            r = await producer.invoke_sync(
                grp.addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=json.dumps(hb).encode()), 5
            )
            assert r.code == ResponseCode.SUCCESS
            await until(
                lambda: _ready(len({c.header_int("commitLogOffset") for c in checks}) >= 2), 10, "checks"
            )
            asked = next(c for c in checks if c.header_int("commitLogOffset") == halves["checked"])
            (shown,) = decode_stored_messages(asked.body)
            assert shown.topic == TOPIC and shown.body == b"checked"  # shown in its real topic
            await producer.invoke_sync(grp.addr, end_tx(halves["checked"], 8, from_check=True), 5)
        assert sorted(await grp.bodies(TOPIC)) == [b"checked", b"commit"]
        # "forgotten" is never answered: discarded after transaction_check_max checks
        await until(lambda: _halves(grp, 0), 15, "the unanswered half message discarded")
        late = await grp.call(end_tx(halves["forgotten"], 8))
        assert late.code == ResponseCode.SYSTEM_ERROR

        # across a failover: a half prepared before the kill is committed on the new master, once
        r = await grp.ok(send(TOPIC, b"survivor", TRAN_MSG="true", PGROUP="pg"))
        position = parse_offset_msg_id(r.header_str("msgId"))[1]
        old = grp.master
        grp.g.kill_broker(old)
        await grp.find_master(exclude={old})
        await grp.ok(end_tx(position, 8))
        assert sorted(await grp.bodies(TOPIC)) == [b"checked", b"commit", b"survivor"]

    run(group, scenario)


async def _ready(value: bool) -> bool:
    return value


async def _halves(grp: Group, expected: int) -> bool:
    info = await grp.g.runtime_info(grp.client, grp.master)
    return info is not None and info["store"]["pending_half_messages"] == expected


def send_back(position: int, group: str, max_times: int = 2, level: int = 0) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.CONSUMER_SEND_MSG_BACK,
        {
            "offset": position,
            "group": group,
            "delayLevel": level,
            "originMsgId": "",
            "originTopic": TOPIC,
            "unitMode": False,
            "maxReconsumeTimes": max_times,
        },
    )


def test_a_failed_message_is_retried_then_dead_lettered(group: LocalBrokerGroup) -> None:
    async def scenario(grp: Group) -> None:
        await grp.ok(send(TOPIC, b"fails", KEYS="k1"))
        (msg,) = await grp.pull(TOPIC)
        await grp.ok(send_back(msg.physical_offset, "cg"))
        await grp.ok(send_back(msg.physical_offset, "cg"))  # the answer was lost: sent again, stored once
        # reconsume 0 -> level 3 (900 ms) in %RETRY%cg
        retries = await until(lambda: _when(grp.pull("%RETRY%cg"), bool), 10, "the retry")
        assert len(retries) == 1
        retry = retries[0]
        assert retry.body == b"fails" and retry.reconsume_times == 1 and retry.keys == ["k1"]
        assert retry.properties["RETRY_TOPIC"] == TOPIC and retry.properties["ORIGIN_MESSAGE_ID"]
        await grp.ok(send_back(retry.physical_offset, "cg"))
        second = await until(
            lambda: _when(grp.pull("%RETRY%cg"), lambda ms: len(ms) == 2), 10, "the second retry"
        )
        assert second[1].reconsume_times == 2
        await grp.ok(send_back(second[1].physical_offset, "cg"))  # consumed twice: max 2 -> DLQ
        dead = await until(lambda: _when(grp.pull("%DLQ%cg"), bool), 10, "the dead letter")
        assert [m.body for m in dead] == [b"fails"] and dead[0].properties["RETRY_TOPIC"] == TOPIC
        await grp.ok(send_back(msg.physical_offset, "other", level=-1))  # straight to the DLQ
        assert [m.body for m in await until(lambda: _when(grp.pull("%DLQ%other"), bool), 10, "DLQ")] == [
            b"fails"
        ]
        missing = await grp.call(send_back(123 << 16, "cg"))
        assert missing.code == ResponseCode.SYSTEM_ERROR and "no message at offset" in missing.remark
        # a client's own retry copy (its fallback when a send-back fails) past its limit: DLQ
        copy = send("%RETRY%cg2", b"copy", RETRY_TOPIC=TOPIC)
        copy.headers.update({"reconsumeTimes": 3, "maxReconsumeTimes": 3})
        await grp.ok(copy)
        assert [m.body for m in await until(lambda: _when(grp.pull("%DLQ%cg2"), bool), 10, "DLQ")] == [
            b"copy"
        ]

        # a send-back acknowledged just before the master dies is retried by the new master
        await grp.ok(send(TOPIC, b"survives", queue_id=1))
        (msg,) = await grp.pull(TOPIC, 1)
        await grp.ok(send_back(msg.physical_offset, "cg3"))
        old = grp.master
        grp.g.kill_broker(old)
        await grp.find_master(exclude={old})
        retried = await until(lambda: _when(grp.pull("%RETRY%cg3"), bool), 15, "the retry after failover")
        await asyncio.sleep(1.0)
        assert [m.body for m in await grp.pull("%RETRY%cg3")] == [b"survives"] == [m.body for m in retried]

    run(group, scenario)


def lock_req(code: int, client: str, queues: list[int], group: str = "og") -> RemotingCommand:
    body = {
        "consumerGroup": group,
        "clientId": client,
        "onlyThisBroker": False,
        "mqSet": [{"topic": TOPIC, "brokerName": "broker-a", "queueId": q} for q in queues]
        + [{"topic": TOPIC, "brokerName": "some-other-group", "queueId": 9}],
    }
    return RemotingCommand.request(code, body=json.dumps(body).encode())


def test_queue_locks_are_exclusive_expire_and_survive_a_failover(group: LocalBrokerGroup) -> None:
    async def locked(grp: Group, client: str, queues: list[int]) -> list[int]:
        r = await grp.ok(lock_req(RequestCode.LOCK_BATCH_MQ, client, queues))
        return sorted(mq["queueId"] for mq in json.loads(bytes(r.body))["lockOKMQSet"])

    async def scenario(grp: Group) -> None:
        assert await locked(grp, "a", [0, 1]) == [0, 1]
        assert await locked(grp, "b", [0, 1]) == []
        await grp.ok(lock_req(RequestCode.UNLOCK_BATCH_MQ, "a", [1]))
        assert await locked(grp, "b", [0, 1]) == [1]
        old = grp.master
        grp.g.kill_broker(old)
        await grp.find_master(exclude={old})
        assert await locked(grp, "a", [0, 1]) == [0]  # a still holds 0, b holds 1, on the new master
        await asyncio.sleep(2.2)  # lock_max_live_s
        assert await locked(grp, "b", [0, 1]) == [0, 1]  # a's lock expired

    run(group, scenario)


def test_sql92_subscriptions_select_by_properties_and_malformed_ones_are_refused(
    group: LocalBrokerGroup,
) -> None:
    async def scenario(grp: Group) -> None:
        for i in range(10):
            await grp.ok(send(TOPIC, f"m{i}".encode(), a=str(i), TAGS="even" if i % 2 == 0 else "odd"))
        picked = await grp.pull(TOPIC, expr="a > 5 AND TAGS = 'even'", kind="SQL92")
        assert [m.body for m in picked] == [b"m6", b"m8"]
        bad = await grp.call(
            RemotingCommand.request(
                RequestCode.PULL_MESSAGE,
                {
                    "consumerGroup": "cg",
                    "topic": TOPIC,
                    "queueId": 0,
                    "queueOffset": 0,
                    "maxMsgNums": 8,
                    "sysFlag": PULL_ALL,
                    "subscription": "a >>> 5",
                    "expressionType": "SQL92",
                },
            )
        )
        assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, bad
        check = {
            "clientId": "c",
            "group": "cg",
            "subscriptionData": {"topic": TOPIC, "subString": "a IN (", "expressionType": "SQL92"},
        }
        r = await grp.call(
            RemotingCommand.request(RequestCode.CHECK_CLIENT_CONFIG, body=json.dumps(check).encode())
        )
        assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "column" in r.remark.lower()

    run(group, scenario)


def test_what_is_not_supported_is_refused_by_name(group: LocalBrokerGroup) -> None:
    async def scenario(grp: Group) -> None:
        forged = await grp.call(send("SCHEDULE_TOPIC_XXXX", b"x", REAL_TOPIC=TOPIC, TIMER_OUT_MS="0"))
        assert forged.code == ResponseCode.NO_PERMISSION and "the broker's own" in forged.remark
        batch = encode_message_batch(
            [
                (0, b"plain", properties_to_bytes({"a": "1"})),
                (0, b"late", properties_to_bytes({"DELAY": "2"})),
            ]
        )
        r = await grp.call(
            RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, {"topic": TOPIC, "queueId": 0}, batch)
        )
        assert r.code == ResponseCode.MESSAGE_ILLEGAL and "batch message 1" in r.remark, r
        assert await grp.bodies(TOPIC) == []  # nothing of the batch was stored
        peek = RemotingCommand.request(200052, {"consumerGroup": "cg", "topic": TOPIC})
        peek.serialize_type = SERIALIZE_JSON
        r = await grp.call(peek)
        assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "PEEK_MESSAGE" in r.remark

    run(group, scenario)
