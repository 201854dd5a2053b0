"""Admin statistics as RocketMQ's tools read them: GET_TOPIC_STATS_INFO (202), GET_CONSUME_STATS
(208) and the KVTable of GET_BROKER_RUNTIME_INFO (28), from a real broker group fed by our own
Producer (so its SEND_MESSAGE_V2 requests are what the group stored), through raw requests, the
AdminClient and ``ledgermq-admin``; and the fastjson bodies byte for byte."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from click.testing import CliRunner

from broker.localgroup import LocalBrokerGroup
from client.admin import main as admin_cli
from client.admin_api import AdminClient
from client.errors import ClientError
from client.producer import Producer
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.exceptions import RemotingCommandError
from remoting.message import Message
from remoting.stats_body import (
    MAX_NESTING,
    ConsumeStats,
    QueueConsumeOffset,
    QueueKey,
    TopicOffset,
    decode_consume_stats,
    decode_topic_stats,
    encode_consume_stats,
    encode_topic_stats,
    load_fastjson,
)

TOPIC = "StatsTopic"
GROUP = "stats-cg"


# --- bodies -------------------------------------------------------------------------------------------
def test_topic_stats_body_is_fastjsons_object_keyed_map() -> None:
    table = {
        QueueKey("T", "broker-a", 1): TopicOffset(0, 5, 1700000000123),
        QueueKey("T", "broker-a", 0): TopicOffset(2, 3, 0),
    }
    # fastjson: a MessageQueue key written as an object, bean fields sorted by name
    assert encode_topic_stats(table) == (
        b'{"offsetTable":{'
        b'{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"lastUpdateTimestamp":0,"maxOffset":3,"minOffset":2},'
        b'{"brokerName":"broker-a","queueId":1,"topic":"T"}:'
        b'{"lastUpdateTimestamp":1700000000123,"maxOffset":5,"minOffset":0}}}'
    )
    assert decode_topic_stats(encode_topic_stats(table)) == table


def test_consume_stats_body_round_trips_and_reads_java_spacing() -> None:
    stats = ConsumeStats({QueueKey("T", "b", 0): QueueConsumeOffset(10, 4, 1700000000000)}, 2.5)
    body = encode_consume_stats(stats)
    assert body == (
        b'{"consumeTps":2.5,"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:'
        b'{"brokerOffset":10,"consumerOffset":4,"lastTimestamp":1700000000000}}}'
    )
    back = decode_consume_stats(body)
    assert back.offsets == stats.offsets and back.consume_tps == 2.5 and back.diff_total == 6
    # whitespace, other key orders and fastjson's unquoted integer keys elsewhere are read too
    java = b' { "offsetTable" : { { "topic" : "T", "queueId" : 1, "brokerName" : "b" } : { "consumerOffset" : 1, "brokerOffset" : 1 } }, "consumeTps" : 0.0, "x" : {0 : "a"} } '
    got = decode_consume_stats(java)
    assert got.offsets == {QueueKey("T", "b", 1): QueueConsumeOffset(1, 1, 0)} and got.consume_tps == 0.0
    # RocketMQ-Rust writes the key as a string holding the MessageQueue object
    rust = b'{"offsetTable":{"{\\"topic\\":\\"T\\",\\"brokerName\\":\\"r\\",\\"queueId\\":2}":{"minOffset":1,"maxOffset":4,"lastUpdateTimestamp":9}}}'
    assert decode_topic_stats(rust) == {QueueKey("T", "r", 2): TopicOffset(1, 4, 9)}
    assert load_fastjson(b'{"brokerAddrs":{0:"a:1",1:"b:2"}}', "x") == {
        "brokerAddrs": [(0, "a:1"), (1, "b:2")]
    }


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "body is empty"),
        (b"\xff", "not UTF-8"),
        (b'{"offsetTable":{{"topic":"T"}:{}}}', "needs string topic and brokerName"),
        (b'{"offsetTable":{{"topic":"T","brokerName":"b","queueId":"0"}:{}}}', "queueId must be an integer"),
        (b'{"offsetTable":{"k":{}}}', "a key must be a MessageQueue object"),
        (b'{"offsetTable":[]}', "offsetTable must be a map"),
        (b'{"offsetTable":{}', "expected ',' or '}'"),
        (b'{"offsetTable":{}} x', "trailing data"),
        (b"[" * (MAX_NESTING + 1), "nested deeper"),
        (b'{"consumeTps":"fast"}', "consumeTps must be a number"),
    ],
)
def test_bad_stats_bodies_are_refused_saying_what_and_where(body: bytes, reason: str) -> None:
    with pytest.raises(RemotingCommandError, match=reason):
        decode_consume_stats(body)


# --- a broker group ---------------------------------------------------------------------------------
@pytest.fixture
def group(tmp_path):
    g = LocalBrokerGroup(
        tmp_path, brokers=1, nameservers=1, topics=(f"{TOPIC}:2",), settings={"register_interval_s": 10}
    )
    g.start()
    try:
        yield g
    finally:
        g.stop()


def test_stats_of_a_real_group_through_requests_admin_client_and_cli(group: LocalBrokerGroup) -> None:
    async def scenario() -> tuple[int, int]:
        master = await group.wait_for_master(60)
        addr = group.broker_addr[master]
        before = int(time.time() * 1000)
        producer = Producer("stats-pg", group.namesrv_addrs)
        await producer.start()
        try:
            for i in range(5):
                r = await producer.send(Message(TOPIC, f"m{i}".encode()), queue_id=0)
                assert r.queue_offset == i
            await producer.send_batch([Message(TOPIC, b"b0"), Message(TOPIC, b"b1")], queue_id=1)
        finally:
            await producer.shutdown()
        after = int(time.time() * 1000)

        async with RemotingClient() as client:

            async def call(code: int, headers: dict | None = None) -> RemotingCommand:
                return await client.invoke_sync(addr, RemotingCommand.request(code, headers), 5.0)

            # 202: per write queue, as RocketMQ's TopicStatsTable
            r = await call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC})
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert r.body.startswith(
                b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"StatsTopic"}:'
            )
            stats = decode_topic_stats(r.body)
            q0, q1 = QueueKey(TOPIC, "broker-a", 0), QueueKey(TOPIC, "broker-a", 1)
            assert sorted(stats) == [q0, q1]
            assert (stats[q0].min_offset, stats[q0].max_offset, stats[q1].max_offset) == (0, 5, 2)
            assert before <= stats[q0].last_update_timestamp <= after
            r = await call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "NoSuchTopic"})
            assert (
                r.code == ResponseCode.TOPIC_NOT_EXIST
                and "'NoSuchTopic' does not exist on broker broker-a" in r.remark
            )
            r = await call(RequestCode.GET_TOPIC_STATS_INFO, {})
            assert r.code != ResponseCode.SUCCESS and "topic" in r.remark

            # 208: the group committed 3 of queue 0
            r = await call(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 0, "commitOffset": 3},
            )
            assert r.code == ResponseCode.SUCCESS, r.remark
            for _ in range(50):  # applied by the ledger: bounded wait
                r = await call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": GROUP})
                if decode_consume_stats(r.body).offsets:
                    break
                await asyncio.sleep(0.1)
            consume = decode_consume_stats(r.body)
            assert consume.offsets[q0].broker_offset == 5 and consume.offsets[q0].consumer_offset == 3
            assert before <= consume.offsets[q0].last_timestamp <= after  # the store time of offset 2
            assert consume.offsets[q1] == QueueConsumeOffset(2, 0, 0) and consume.diff_total == 4
            r = await call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "nobody"})
            assert r.code == ResponseCode.SUCCESS and decode_consume_stats(r.body).offsets == {}
            assert "'nobody' has no consume stats on broker broker-a" in r.remark
            r = await call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": GROUP, "topic": "NoSuchTopic"})
            assert r.code == ResponseCode.TOPIC_NOT_EXIST and "NoSuchTopic" in r.remark

            # 28: our document, and RocketMQ's KVTable with string values
            r = await call(RequestCode.GET_BROKER_RUNTIME_INFO)
            info = json.loads(r.body)
            assert info["role"] == "MASTER"
            table = info["table"]
            assert all(isinstance(v, str) for v in table.values())
            assert len([float(x) for x in table["putTps"].split(" ")]) == 3
            assert len(table["getTransferedTps"].split(" ")) == 3
            assert int(table["msgPutTotalTodayNow"]) >= 7 and int(table["msgGetTotalTodayNow"]) >= 3
            assert before <= int(table["earliestMessageTimeStamp"]) <= after
            assert 0.0 <= float(table["commitLogDiskRatio"]) <= 1.0
            assert table["brokerVersionDesc"] == "V4_9_4"

        async with AdminClient(group.namesrv_addrs) as admin:
            assert (await admin.topic_stats(TOPIC))[q0].max_offset == 5
            by_topic = await admin.consume_stats(GROUP, TOPIC)
            assert by_topic.offsets[q0].consumer_offset == 3
            with pytest.raises(ClientError, match="consumer group nobody has no consume stats on any broker"):
                await admin.consume_stats("nobody")
            with pytest.raises(ClientError, match="NoSuchTopic"):
                await admin.topic_stats("NoSuchTopic")
        return before, after

    asyncio.run(asyncio.wait_for(scenario(), 120))

    runner = CliRunner()
    ns = group.namesrv_addr_str
    out = runner.invoke(admin_cli, ["-n", ns, "topic-status", "-t", TOPIC])
    assert out.exit_code == 0, out.output
    rows = [line.split() for line in out.output.splitlines()[1:]]
    assert [r[:4] for r in rows] == [["broker-a", "0", "0", "5"], ["broker-a", "1", "0", "2"]]
    out = runner.invoke(admin_cli, ["-n", ns, "consumer-progress", "-g", GROUP])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[1].split()[:6] == [TOPIC, "broker-a", "0", "5", "3", "2"]
    assert "Diff Total: 4" in out.output
    out = runner.invoke(admin_cli, ["-n", ns, "consumer-progress", "-g", "nobody"])
    assert out.exit_code == 1 and "consumer group nobody has no consume stats" in out.output
    assert "Traceback" not in out.output
