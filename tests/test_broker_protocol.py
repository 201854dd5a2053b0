"""A real broker group answering RocketMQ's requests as RocketMQ's broker does: pull sysFlag
(commit, suspend, subscription), SEND_MESSAGE_V2, topic auto-creation, search by timestamp,
view by id, heartbeat / consumer list / UNREGISTER_CLIENT, JSON requests, unknown codes."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from broker.localgroup import LocalBrokerGroup
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.message import (
    decode_stored_messages,
    java_string_hash,
    parse_offset_msg_id,
    properties_to_bytes,
)
from remoting.protocol import SERIALIZE_JSON

pytestmark = pytest.mark.slow
TOPIC = "ProtoTopic"
COMMIT, SUSPEND, SUBSCRIPTION = 0x1, 0x2, 0x4


@pytest.fixture
def group(tmp_path):
    g = LocalBrokerGroup(tmp_path, topics=(f"{TOPIC}:2",), settings={"register_interval_s": 10})
    g.start()
    try:
        yield g
    finally:
        g.stop()


def send_v2(topic: str, body: bytes, queue_id: int = 0, **props: str) -> RemotingCommand:
    """SEND_MESSAGE_V2 with SendMessageRequestHeaderV2's one-letter names, as the Java client sends it."""
    headers = {
        "a": "pg",
        "b": topic,
        "c": "TBW102",
        "d": 4,
        "e": queue_id,
        "f": 0,
        "g": int(time.time() * 1000),
        "h": 0,
        "i": properties_to_bytes(props).decode(),
        "j": 0,
        "k": False,
        "m": False,
    }
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, headers, body)


def pull(queue_id: int, offset: int, sys_flag: int, commit: int = 0, suspend_ms: int = 0, sub: str = "*"):
    return RemotingCommand.request(
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": "cg",
            "topic": TOPIC,
            "queueId": queue_id,
            "queueOffset": offset,
            "maxMsgNums": 32,
            "sysFlag": sys_flag,
            "commitOffset": commit,  # always present, as RocketMQ's clients send it
            "suspendTimeoutMillis": suspend_ms,
            "subscription": sub,
            "subVersion": 0,
            "expressionType": "TAG",
        },
    )


def test_rocketmq_request_semantics(group: LocalBrokerGroup) -> None:
    async def scenario() -> None:
        master = await group.wait_for_master()
        addr = group.broker_addr[master]
        async with RemotingClient() as client:

            async def call(req: RemotingCommand, timeout: float = 5.0) -> RemotingCommand:
                return await client.invoke_sync(addr, req, timeout)

            async def stored_offset() -> int | None:
                r = await call(
                    RemotingCommand.request(
                        RequestCode.QUERY_CONSUMER_OFFSET,
                        {"consumerGroup": "cg", "topic": TOPIC, "queueId": 0},
                    )
                )
                return r.header_int("offset") if r.code == ResponseCode.SUCCESS else None

            before = int(time.time() * 1000)
            sent = []
            for i, tag in enumerate("ABAB"):
                r = await call(send_v2(TOPIC, f"v2-{i}".encode(), 0, TAGS=tag, KEYS=f"k{i}"))
                assert r.code == ResponseCode.SUCCESS, r.remark
                assert r.header_int("queueOffset") == i and len(r.header_str("msgId")) == 32
                sent.append(r)

            # sysFlag: commitOffset counts only with the commit bit, and never moves an offset back.
            await call(
                RemotingCommand.request(
                    RequestCode.UPDATE_CONSUMER_OFFSET,
                    {"consumerGroup": "cg", "topic": TOPIC, "queueId": 0, "commitOffset": 1},
                )
            )
            assert await stored_offset() == 1
            await call(pull(0, 0, 0, commit=3))  # no commit bit: ignored
            await call(pull(0, 0, COMMIT, commit=0))  # commit bit with 0: never backwards
            await asyncio.sleep(0.3)
            assert await stored_offset() == 1
            await call(pull(0, 0, COMMIT, commit=3))
            for _ in range(30):
                if await stored_offset() == 3:
                    break
                await asyncio.sleep(0.1)
            assert await stored_offset() == 3

            # Without the suspend bit an empty pull answers at once; with it, it waits.
            t0 = time.monotonic()
            r = await call(pull(0, 4, 0, suspend_ms=2000))
            assert r.code == ResponseCode.PULL_NOT_FOUND and time.monotonic() - t0 < 1.0
            t0 = time.monotonic()
            r = await call(pull(0, 4, SUSPEND, suspend_ms=600))
            assert r.code == ResponseCode.PULL_NOT_FOUND and time.monotonic() - t0 >= 0.5

            # The subscription bit filters by the request's expression (RocketMQ's tags code).
            r = await call(pull(0, 0, SUBSCRIPTION, sub="B"))
            assert [m.body for m in decode_stored_messages(r.body)] == [b"v2-1", b"v2-3"]
            assert r.header_int("suggestWhichBrokerId") == 0 and r.header_int("maxOffset") == 4
            # Without it, by the group's heartbeat subscription.
            heartbeat = {
                "clientID": "127.0.0.1@1",
                "producerDataSet": [],
                "consumerDataSet": [
                    {
                        "groupName": "cg",
                        "consumeType": "CONSUME_PASSIVELY",
                        "messageModel": "CLUSTERING",
                        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                        "subscriptionDataSet": [{"topic": TOPIC, "subString": "A", "expressionType": "TAG"}],
                        "unitMode": False,
                    }
                ],
            }
            r = await call(
                RemotingCommand.request(RequestCode.HEART_BEAT, body=json.dumps(heartbeat).encode())
            )
            assert r.code == ResponseCode.SUCCESS
            r = await call(pull(0, 0, 0))
            assert [m.body for m in decode_stored_messages(r.body)] == [b"v2-0", b"v2-2"]
            listed = await call(
                RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"})
            )
            assert json.loads(listed.body) == {"consumerIdList": ["127.0.0.1@1"]}
            # mqadmin consumerConnection: the group's clients and subscriptions.
            r = await call(
                RemotingCommand.request(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "cg"})
            )
            doc = json.loads(r.body)
            ((connection,),) = [doc["connectionSet"]]
            assert connection["clientId"] == "127.0.0.1@1" and connection["clientAddr"].startswith(
                "127.0.0.1:"
            )
            sub = doc["subscriptionTable"][TOPIC]
            assert sub["tagsSet"] == ["A"] and sub["codeSet"] == [java_string_hash("A")]
            assert doc["messageModel"] == "CLUSTERING" and doc["consumeType"] == "CONSUME_PASSIVELY"
            r = await call(
                RemotingCommand.request(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "nobody"})
            )
            assert r.code == ResponseCode.CONSUMER_NOT_ONLINE and "nobody" in r.remark
            # The group's first heartbeat created its retry topic, as RocketMQ's broker does.
            for _ in range(100):
                configs = await call(RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG))
                table = json.loads(configs.body)["topicConfigTable"]
                if "%RETRY%cg" in table:
                    break
                await asyncio.sleep(0.05)
            assert table["%RETRY%cg"]["readQueueNums"] == 1 and table["%RETRY%cg"]["writeQueueNums"] == 1
            await call(
                RemotingCommand.request(
                    RequestCode.UNREGISTER_CLIENT, {"clientID": "127.0.0.1@1", "consumerGroup": "cg"}
                )
            )
            listed = await call(
                RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"})
            )
            assert json.loads(listed.body) == {"consumerIdList": []}

            # View by id: RocketMQ's admin decodes the id and sends the physical offset.
            _host, position = parse_offset_msg_id(sent[2].header_str("msgId"))
            r = await call(RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": position}))
            (viewed,) = decode_stored_messages(r.body, verify_crc=True)
            assert (viewed.body, viewed.tags, viewed.keys, viewed.queue_offset) == (b"v2-2", "A", ["k2"], 2)
            assert viewed.msg_id == sent[2].header_str("msgId")

            # Search by timestamp and the earliest store time.
            r = await call(
                RemotingCommand.request(
                    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                    {"topic": TOPIC, "queueId": 0, "timestamp": before},
                )
            )
            assert r.header_int("offset") == 0
            r = await call(
                RemotingCommand.request(
                    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                    {"topic": TOPIC, "queueId": 0, "timestamp": int(time.time() * 1000) + 60_000},
                )
            )
            assert r.header_int("offset") == 4
            r = await call(
                RemotingCommand.request(
                    RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": TOPIC, "queueId": 0}
                )
            )
            assert before - 1000 <= r.header_int("timestamp") <= int(time.time() * 1000)

            # A topic nobody created is created by its first send (autoCreateTopicEnable).
            r = await call(send_v2("AutoCreated", b"first", 1))
            assert r.code == ResponseCode.SUCCESS, r.remark
            r = await call(send_v2("AutoCreated", b"second", 1))
            assert r.header_int("queueOffset") == 1
            # The client asks for 16 queues; like RocketMQ, the broker's default (4) caps it.
            wide = send_v2("AutoCreatedWide", b"w", 0)
            wide.headers["d"] = 16
            assert (await call(wide)).code == ResponseCode.SUCCESS
            configs = await call(RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG))
            assert json.loads(configs.body)["topicConfigTable"]["AutoCreatedWide"]["writeQueueNums"] == 4

            # Malformed properties are refused, naming what is wrong.
            bad = send_v2(TOPIC, b"bad", 0)
            bad.headers["i"] = "TAGS\x01a\x02novalue\x02"
            r = await call(bad)
            assert r.code == ResponseCode.MESSAGE_ILLEGAL and "'novalue' is not name" in r.remark

            # A JSON request is answered in JSON; unknown codes as RocketMQ does.
            req = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 0})
            req.serialize_type = SERIALIZE_JSON
            r = await call(req)
            assert r.serialize_type == SERIALIZE_JSON and r.header_int("offset") == 4
            r = await call(RemotingCommand.request(9999))
            assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED

    asyncio.run(asyncio.wait_for(scenario(), 120))
