"""A real broker group (2 nameservers, 3 brokers on 127.0.0.x): sends, pulls, failover, bad input."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from broker.localgroup import LocalBrokerGroup
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.exceptions import RemotingError
from remoting.message import decode_stored_messages, encode_message_batch, properties_to_bytes

pytestmark = pytest.mark.slow
TOPIC = "TopicTest"


def send_req(body: bytes, queue_id: int = 0, pid: str = "", seq: int = 0, topic: str = TOPIC, **props: str):
    headers = {
        "producerGroup": "pg",
        "topic": topic,
        "queueId": queue_id,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": properties_to_bytes(
            {**props, **({"UNIQ_KEY": f"{pid}-{seq}"} if pid else {})}
        ).decode(),
    }
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, headers, body)


def batch_req(bodies: list[bytes], queue_id: int, topic: str = TOPIC) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.SEND_BATCH_MESSAGE,
        {
            "producerGroup": "pg",
            "topic": topic,
            "queueId": queue_id,
            "bornTimestamp": int(time.time() * 1000),
        },
        encode_message_batch([(0, body, b"") for body in bodies]),
    )


def pull_req(
    queue_id: int,
    offset: int,
    max_nums: int = 32,
    suspend_ms: int = 0,
    topic: str = TOPIC,
    subscription: str = "",
):
    headers = {
        "consumerGroup": "cg",
        "topic": topic,
        "queueId": queue_id,
        "queueOffset": offset,
        "maxMsgNums": max_nums,
        "suspendTimeoutMillis": suspend_ms,
    }
    if subscription:
        headers["subscription"] = subscription
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, headers)


async def pull_all(client: RemotingClient, addr: str, queue_id: int) -> list:
    out = []
    offset = 0
    for _ in range(10_000):
        resp = await client.invoke_sync(addr, pull_req(queue_id, offset, 256), 10)
        if resp.code == ResponseCode.PULL_NOT_FOUND:
            return out
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        msgs = decode_stored_messages(resp.body, verify_crc=True)
        out.extend(msgs)
        offset = resp.header_int("nextBeginOffset")
    raise AssertionError("pull loop did not reach the end")


@pytest.fixture
def group(tmp_path):
    g = LocalBrokerGroup(tmp_path, settings={"register_interval_s": 10, "max_message_bytes": 1 << 20})
    g.start()
    try:
        yield g
    finally:
        g.stop()


def batch_offsets(resp: RemotingCommand, n: int) -> list[int]:
    """The offsets of a batch send's answer: every one in the body when de-duplication left
    gaps, else (RocketMQ's answer) consecutive from the header's first."""
    if resp.body:
        return json.loads(bytes(resp.body))["offsets"]
    first = resp.header_int("queueOffset")
    return list(range(first, first + n))


def test_failover_keeps_every_acknowledged_message_offsets_and_dedup(group):
    async def scenario() -> None:
        master = await group.wait_for_master()
        addr = group.broker_addr[master]
        acked: dict[bytes, tuple[int, int]] = {}
        async with RemotingClient() as client:
            # Consumer offsets go through the ledger too.
            resp = await client.invoke_sync(
                addr,
                RemotingCommand.request(
                    RequestCode.UPDATE_CONSUMER_OFFSET,
                    {"consumerGroup": "cg", "topic": TOPIC, "queueId": 2, "commitOffset": 7},
                ),
                5,
            )
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            first = await client.invoke_sync(addr, send_req(b"idem", 1, pid="p-1", seq=42), 5)
            assert first.code == ResponseCode.SUCCESS and not first.header_bool("duplicate", False)

            stop = False

            async def producer(q: int) -> None:
                n = 0
                target = addr
                brokers = list(group.broker_addr.values())
                batched = q >= 2  # queues 2 and 3 get batches of 8: one ledger entry each
                while not stop:
                    body = f"q{q}-{n}".encode()
                    bodies = [body + f".{i}".encode() for i in range(8)] if batched else [body]
                    req = batch_req(bodies, q) if batched else send_req(body, q)
                    try:
                        resp = await client.invoke_sync(target, req, 3)
                    except Exception:  # noqa: BLE001 - connection reset by the kill: outcome unknown
                        target = brokers[(brokers.index(target) + 1) % len(brokers)]
                        await asyncio.sleep(0.05)
                        n += 1
                        continue
                    if resp.code == ResponseCode.SUCCESS:
                        offsets = (
                            batch_offsets(resp, len(bodies)) if batched else [resp.header_int("queueOffset")]
                        )
                        assert len(offsets) == len(bodies)
                        for b, off in zip(bodies, offsets, strict=True):
                            acked[b] = (q, off)
                    elif resp.code == ResponseCode.NOT_MASTER and resp.headers.get("masterAddr"):
                        target = str(resp.headers["masterAddr"])
                    else:
                        await asyncio.sleep(0.05)
                    n += 1

            tasks = [asyncio.create_task(producer(q)) for q in range(4)]
            await asyncio.sleep(1.5)
            before = len(acked)
            group.kill_broker(master)
            new_master = await group.wait_for_master(exclude={master})
            new_addr = group.broker_addr[new_master]
            # Keep sending until the new master has acknowledged some messages of its own.
            deadline = time.monotonic() + 15
            while len(acked) < before + 20 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            stop = True
            await asyncio.gather(*tasks)
            assert before > 0 and len(acked) >= before + 20, (before, len(acked))
            assert {q for q, _ in acked.values()} == {0, 1, 2, 3}, (
                "single and batched sends were both acknowledged"
            )

            # The nameservers route the topic to the new master (broker id 0).
            for ns in group.namesrv_addrs:
                route = await client.invoke_sync(
                    ns, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}), 5
                )
                addrs = json.loads(bytes(route.body))["brokerDatas"][0]["brokerAddrs"]
                assert addrs.get("0") == new_addr, addrs

            # Every acknowledged message is there, at the offset it was acknowledged with.
            stored: dict[bytes, tuple[int, int]] = {}
            for q in range(4):
                for m in await pull_all(client, new_addr, q):
                    assert m.body not in stored, f"duplicate {m.body!r}"
                    stored[m.body] = (q, m.queue_offset)
            lost = {b: v for b, v in acked.items() if stored.get(b) != v}
            assert not lost, f"{len(lost)} acknowledged messages lost or moved, e.g. {list(lost.items())[:3]}"

            # The committed consumer offset survived the failover.
            resp = await client.invoke_sync(
                new_addr,
                RemotingCommand.request(
                    RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "cg", "topic": TOPIC, "queueId": 2}
                ),
                5,
            )
            assert resp.code == ResponseCode.SUCCESS and resp.header_int("offset") == 7

            # A retried idempotent send is stored once, even on the new master.
            again = await client.invoke_sync(new_addr, send_req(b"idem", 1, pid="p-1", seq=42), 5)
            assert again.code == ResponseCode.SUCCESS and again.header_bool("duplicate")
            assert again.header_int("queueOffset") == first.header_int("queueOffset")
            assert again.header_str("msgId") == first.header_str("msgId")

    asyncio.run(scenario())


def test_long_polling_batch_and_queries(group):
    async def scenario() -> None:
        master = await group.wait_for_master()
        addr = group.broker_addr[master]
        async with RemotingClient() as client:
            t0 = time.monotonic()
            empty = await client.invoke_sync(addr, pull_req(3, 0, suspend_ms=400), 5)
            assert empty.code == ResponseCode.PULL_NOT_FOUND
            assert time.monotonic() - t0 >= 0.35, "the broker did not hold the pull"

            waiting = asyncio.create_task(client.invoke_sync(addr, pull_req(3, 0, suspend_ms=10_000), 15))
            await asyncio.sleep(0.3)
            assert not waiting.done(), "a pull on an empty queue returned without waiting"
            items = [
                (0, f"m{i}".encode(), properties_to_bytes({"KEYS": f"key-{i}", "UNIQ_KEY": f"batcher-{i}"}))
                for i in range(5)
            ]
            batch = RemotingCommand.request(
                RequestCode.SEND_BATCH_MESSAGE,
                {"producerGroup": "pg", "topic": TOPIC, "queueId": 3},
                encode_message_batch(items),
            )
            resp = await client.invoke_sync(addr, batch, 5)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            # consecutive offsets: RocketMQ's answer, the first offset and the ids in the header
            assert not resp.body and resp.header_int("queueOffset") == 0
            msg_ids = resp.header_str("msgId").split(",")
            assert len(msg_ids) == 5
            woke = await asyncio.wait_for(waiting, 5)
            assert woke.code == ResponseCode.SUCCESS
            assert [m.body for m in decode_stored_messages(woke.body)] == [b"m0", b"m1", b"m2", b"m3", b"m4"]

            # Re-sending the same batch (same UNIQ_KEYs, as a RocketMQ client's retry) stores nothing new.
            resp = await client.invoke_sync(addr, batch, 5)
            doc = json.loads(bytes(resp.body))
            assert doc["duplicates"] == 5 and doc["offsets"] == [0, 1, 2, 3, 4]
            assert resp.header_str("msgId").split(",") == msg_ids

            by_id = await client.invoke_sync(
                addr, RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"msgId": msg_ids[2]}), 5
            )
            assert [m.body for m in decode_stored_messages(by_id.body)] == [b"m2"]
            by_key = await client.invoke_sync(
                addr, RemotingCommand.request(RequestCode.QUERY_MESSAGE, {"topic": TOPIC, "key": "key-4"}), 5
            )
            assert [m.body for m in decode_stored_messages(by_key.body)] == [b"m4"]
            moved = await client.invoke_sync(addr, pull_req(3, 99), 5)
            assert moved.code == ResponseCode.PULL_OFFSET_MOVED and moved.header_int("nextBeginOffset") == 5

            # Tag filtering on the broker: skipped messages are never read, and the next offset
            # moves past them so the consumer does not ask again.
            for i, tag in enumerate("ABABCA"):
                resp = await client.invoke_sync(addr, send_req(f"t{i}".encode(), 2, TAGS=tag), 5)
                assert resp.code == ResponseCode.SUCCESS, resp.remark

            async def filtered(offset: int, sub: str, max_nums: int = 32) -> tuple[int, list[int], int]:
                r = await client.invoke_sync(addr, pull_req(2, offset, max_nums, subscription=sub), 5)
                msgs = decode_stored_messages(r.body) if r.code == ResponseCode.SUCCESS else []
                return r.code, [m.queue_offset for m in msgs], r.header_int("nextBeginOffset")

            assert await filtered(0, "A", 2) == (ResponseCode.SUCCESS, [0, 2], 3)
            assert await filtered(3, "A") == (ResponseCode.SUCCESS, [5], 6)
            assert await filtered(0, "A || C") == (ResponseCode.SUCCESS, [0, 2, 4, 5], 6)
            assert await filtered(0, "*") == (ResponseCode.SUCCESS, [0, 1, 2, 3, 4, 5], 6)
            assert await filtered(0, "D") == (ResponseCode.PULL_NOT_FOUND, [], 6)

    asyncio.run(scenario())


def test_bad_input_gets_clear_errors_and_the_broker_keeps_serving(group):
    async def scenario() -> None:
        master = await group.wait_for_master()
        addr = group.broker_addr[master]
        host, port = addr.rsplit(":", 1)
        async with RemotingClient() as client:
            cases = [
                (
                    send_req(b"x", topic="NoSuchTopic", queue_id=7),
                    ResponseCode.MESSAGE_ILLEGAL,
                    "outside 0..3",
                ),
                (send_req(b"x", topic="bad topic!"), ResponseCode.MESSAGE_ILLEGAL, "bad topic"),
                (send_req(b"x", queue_id=99), ResponseCode.MESSAGE_ILLEGAL, "queue id 99"),
                (
                    send_req(b"x" * ((1 << 20) + 1)),
                    ResponseCode.MESSAGE_ILLEGAL,
                    "exceeds the limit of 1048576",
                ),
                (
                    RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": TOPIC}, b"x"),
                    ResponseCode.BAD_REQUEST,
                    "queueId",
                ),
                (RemotingCommand.request(9999), ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "not supported"),
            ]
            for req, code, words in cases:
                resp = await client.invoke_sync(addr, req, 10)
                assert resp.code == code, (code, resp.code, resp.remark)
                assert words in resp.remark, resp.remark
            # A garbage frame closes only that connection.
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n")
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
            ok = await client.invoke_sync(addr, send_req(b"still fine", 0), 5)
            assert ok.code == ResponseCode.SUCCESS, ok.remark
            # A slave refuses sends and names the master.
            slave = next(n for n in group.node_ids if n != master)
            deadline = time.monotonic() + 20
            while True:  # (a slave opens its RocketMQ port once it has caught up: under load, later)
                try:
                    resp = await client.invoke_sync(group.broker_addr[slave], send_req(b"x"), 5)
                    break
                except (OSError, RemotingError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            assert resp.code == ResponseCode.NOT_MASTER and addr in resp.remark

    asyncio.run(scenario())
