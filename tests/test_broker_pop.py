"""RocketMQ 5's POP consumption: the replicated state entry by entry (two replicas fed the same
entries must agree), and a real 3-broker group answering POP_MESSAGE, ACK_MESSAGE and
CHANGE_MESSAGE_INVISIBLETIME as RocketMQ clients send them: pop, ack, a message whose
invisible time passes popped again, and a kill of the master after which un-acked messages
come back and acked ones do not."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.localgroup import LocalBrokerGroup
from broker.meta import PopPick, ack_op, dead_op, encode_meta, invisible_op, pop_op
from broker.pop import EXPIRED, NOT_POPPED, STALE, Granted, PopStates
from broker.pop_processors import parse_batch_ack
from broker.state import BrokerState
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.exceptions import RemotingCommandError
from remoting.message import Message, decode_stored_messages, properties_to_bytes

G, T = "cg", "PopTopic"


class Replicas:
    """Two broker states fed the same entries; their POP tables must be equal after each."""

    def __init__(self) -> None:
        self.states = (BrokerState(), BrokerState())
        self.index = 0

    def apply(self, payload: bytes) -> Any:
        """Apply one entry to both; its outcome (what the master answers from)."""
        self.index += 1
        for state in self.states:
            state.apply([(self.index, payload)])
        a, b = self.states
        assert _table(a.pops) == _table(b.pops)
        assert a.pop_outcomes.get(self.index) == b.pop_outcomes.get(self.index)
        return a.pop_outcomes.get(self.index)

    @property
    def pops(self) -> PopStates:
        return self.states[0].pops


def _table(pops: PopStates) -> dict[Any, Any]:
    return {k: (q.cursor, q.last_pop_time, dict(q.inflight)) for k, q in pops.queues.items()}


def pop(
    now: int, *picks: tuple[int, int, int, tuple[int, ...]], invisible: int = 1000, limit: int = 100
) -> bytes:
    return pop_op(G, T, now, invisible, limit, [PopPick(*p) for p in picks])


def test_pop_takes_new_offsets_once_and_moves_the_cursor() -> None:
    r = Replicas()
    got = r.apply(pop(10_000, (0, 0, 3, (0, 1, 2))))
    assert [(g.offset, g.pop_time, g.deadline, g.times) for g in got] == [
        (0, 10_000, 11_000, 1),
        (1, 10_000, 11_000, 1),
        (2, 10_000, 11_000, 1),
    ]
    q = r.pops.get(G, T, 0)
    assert q is not None and q.cursor == 3 and sorted(q.inflight) == [0, 1, 2]
    # a second POP proposed from the same view (a race): nothing it names is free any more
    assert r.apply(pop(10_001, (0, 0, 3, (0, 1, 2)))) == []
    # a POP of another queue and a new group start where their picks say
    got = r.apply(pop(10_002, (1, 5, 7, (5, 6))))
    assert [g.offset for g in got] == [5, 6] and r.pops.get(G, T, 1).cursor == 7  # type: ignore[union-attr]


def test_filtered_out_offsets_are_passed_over_and_the_bound_stops_the_cursor() -> None:
    r = Replicas()
    got = r.apply(pop(1, (0, 0, 10, (2, 7))))  # 0-1, 3-6, 8-9 did not match the filter
    assert [g.offset for g in got] == [2, 7] and r.pops.get(G, T, 0).cursor == 10  # type: ignore[union-attr]
    # at most `limit` in flight: the cursor stops at the first new offset refused for the bound
    got = r.apply(pop(2, (0, 0, 15, (10, 11, 12, 13, 14)), limit=4))
    q = r.pops.get(G, T, 0)
    assert [g.offset for g in got] == [10, 11] and q is not None and q.cursor == 12
    assert len(q.inflight) == 4


def test_ack_removes_a_delivery_repeats_succeed_and_bad_handles_are_refused() -> None:
    r = Replicas()
    r.apply(pop(1000, (0, 0, 3, (0, 1, 2))))
    assert r.apply(ack_op(G, T, 0, 1500, [(0, 1000)])) == [""]
    assert r.apply(ack_op(G, T, 0, 1600, [(0, 1000)])) == [""]  # its answer lost: the retry succeeds
    assert r.apply(ack_op(G, T, 0, 1600, [(1, 999)])) == [STALE]  # not the delivery in flight
    assert r.apply(ack_op(G, T, 0, 1600, [(5, 1000)])) == [NOT_POPPED]
    assert r.apply(ack_op(G, T, 0, 2000, [(1, 1000)])) == [EXPIRED]  # invisible until 2000 only
    assert r.apply(ack_op("other", T, 0, 1600, [(1, 1000)])) == [NOT_POPPED]
    q = r.pops.get(G, T, 0)
    assert q is not None and sorted(q.inflight) == [1, 2]
    assert r.states[0].offsets[(G, T, 0)] == 1  # the group's progress: everything below is acked
    r.apply(ack_op(G, T, 0, 1700, [(1, 1000), (2, 1000)]))
    assert r.states[0].offsets[(G, T, 0)] == 3 and r.states[1].offsets == r.states[0].offsets


def test_an_expired_delivery_is_popped_again_under_a_new_handle() -> None:
    r = Replicas()
    r.apply(pop(1000, (0, 0, 2, (0, 1))))
    assert r.apply(pop(1999, (0, 0, 2, (0,)))) == []  # still invisible
    got = r.apply(pop(2000, (0, 0, 2, (0,))))
    assert got == [Granted(0, 0, 2000, 3000, 2)]  # popped twice: reconsumed once
    assert r.apply(ack_op(G, T, 0, 2100, [(0, 1000)])) == [STALE]  # the first consumer's handle
    assert r.apply(ack_op(G, T, 0, 2100, [(0, 2000)])) == [""]
    # pop times increase per queue even when the master's clock does not (a new master's may lag)
    got = r.apply(pop(500, (0, 0, 3, (1, 2)), invisible=10))
    assert [g.pop_time for g in got] == [2001] and got[0].offset == 2  # 1 is invisible until 2000
    assert r.apply(pop(500, (0, 0, 3, ()))) == []  # a pick that takes nothing changes nothing


def test_change_invisible_time_gives_a_new_handle_and_stales_the_old() -> None:
    r = Replicas()
    r.apply(pop(1000, (0, 0, 1, (0,))))
    (moved,) = r.apply(invisible_op(G, T, 0, 1500, (0, 1000), 5000))
    assert moved == Granted(0, 0, 1500, 6500, 1)
    assert r.apply(ack_op(G, T, 0, 1600, [(0, 1000)])) == [STALE]
    assert r.apply(pop(6000, (0, 0, 1, (0,)))) == []  # not visible before its new deadline
    assert r.apply(invisible_op(G, T, 0, 7000, (0, 1500), 5000)) == [EXPIRED]
    assert r.apply(invisible_op(G, T, 0, 1600, (3, 1500), 5000)) == [NOT_POPPED]
    assert r.apply(ack_op(G, T, 0, 6400, [(0, 1500)])) == [""]
    assert r.apply(invisible_op(G, T, 0, 6400, (0, 1500), 5000)) == ["acknowledged"]


def test_in_flight_messages_removed_by_retention_are_dropped() -> None:
    r = Replicas()
    r.apply(pop(1000, (0, 0, 4, (0, 1, 2, 3))))
    r.apply(ack_op(G, T, 0, 1100, [(1, 1000)]))
    # the queue's min offset is now 3: 0 and 2 can never be delivered again
    assert r.apply(pop_op(G, T, 1200, 1000, 100, [PopPick(0, 4, 4, (), floor=3)])) == []
    q = r.pops.get(G, T, 0)
    assert q is not None and sorted(q.inflight) == [3] and q.cursor == 4
    # a floor past the cursor moves it: the messages below were removed unread
    r.apply(pop_op(G, T, 1300, 1000, 100, [PopPick(0, 4, 4, (), floor=9)]))
    assert q.cursor == 9 and q.inflight == {}


def test_a_dead_lettered_delivery_is_dropped_only_once_expired() -> None:
    r = Replicas()
    r.apply(pop(1000, (0, 0, 2, (0, 1))))
    assert r.apply(dead_op(G, T, 0, 1500, [(0, 1000)])) == ["not expired"]
    assert r.apply(dead_op(G, T, 0, 2000, [(0, 1000), (1, 999)])) == ["", STALE]
    q = r.pops.get(G, T, 0)
    assert q is not None and sorted(q.inflight) == [1] and q.cursor == 2


def test_batch_ack_bodies_are_read_as_rocketmq_writes_them() -> None:
    body = {
        "brokerName": "b",
        "acks": [
            {"c": "g", "t": "T", "r": "0", "so": 10, "q": 1, "rq": 0, "pt": 7, "it": 1000, "b": "BQE="},
            {"consumerGroup": "g", "topic": "T", "startOffset": 20, "queueId": 1, "popTime": 8},
        ],
    }
    # BitSet.toByteArray: bit i of byte k is offset start + 8k + i ("BQE=" is 0x05 0x01)
    assert parse_batch_ack(body, "b") == {("g", "T", 1): [(10, 7), (12, 7), (18, 7)]}
    bad = [
        ({"acks": 3}, "list 'acks'"),
        ({"brokerName": "other", "acks": []}, "other"),
        ({"acks": [{"c": "g", "t": "T", "so": -1, "q": 0, "pt": 1}]}, "so"),
        ({"acks": [{"c": "g", "t": "T", "so": 0, "q": 0, "pt": 1, "r": "1"}]}, "retry"),
        ({"acks": [{"c": "g", "t": "T", "so": 0, "q": 0, "pt": 1, "b": "!!"}]}, "base64"),
        ({"acks": [{"c": "g", "t": "T", "so": 0, "q": 0, "pt": 1, "b": "A" * 400}]}, "bits"),
        ({"acks": [{"t": "T", "so": 0, "q": 0, "pt": 1}]}, "consumer group"),
    ]
    for doc, words in bad:
        with pytest.raises(RemotingCommandError, match=words):
            parse_batch_ack(doc, "b")


def test_the_table_of_queues_is_bounded() -> None:
    pops = PopStates(max_queues=2)
    from broker.meta import PopOp

    for qid in range(3):
        pops.pop(PopOp(G, T, 1, 10, 10, (PopPick(qid, 0, 1, (0,)),)))
    assert len(pops) == 2 and pops.get(G, T, 2) is None and pops.inflight_count() == 2


@pytest.mark.parametrize(
    "doc",
    [
        {
            "op": "pop",
            "group": G,
            "topic": T,
            "now": 1,
            "invisible": 0,
            "limit": 1,
            "picks": [[0, 0, 0, 1, [0]]],
        },
        {"op": "pop", "group": G, "topic": T, "now": 1, "invisible": 1, "limit": 1, "picks": []},
        {
            "op": "pop",
            "group": G,
            "topic": T,
            "now": 1,
            "invisible": 1,
            "limit": 1,
            "picks": [[0, 0, 0, 1, [-1]]],
        },
        {
            "op": "pop",
            "group": G,
            "topic": T,
            "now": 1,
            "invisible": 1,
            "limit": 10**9,
            "picks": [[0, 0, 0, 1, []]],
        },
        {"op": "pop", "group": G, "topic": T, "now": 1, "invisible": 1, "limit": 1, "picks": [[0, 0, 1, []]]},
        {"op": "ack", "group": G, "topic": T, "queue": 0, "now": 1, "handles": [[0]]},
        {"op": "ack", "group": G, "topic": T, "queue": 0, "now": 1, "handles": []},
        {"op": "ack", "group": "", "topic": T, "queue": 0, "now": 1, "handles": [[0, 1]]},
        {
            "op": "invisible",
            "group": G,
            "topic": T,
            "queue": 0,
            "now": 1,
            "handles": [[0, 1], [1, 1]],
            "invisible": 5,
        },
    ],
)
def test_a_malformed_pop_record_is_skipped_by_every_replica(doc: dict[str, Any]) -> None:
    r = Replicas()
    r.apply(pop(1, (0, 0, 1, (0,))))
    before = _table(r.pops)
    op = doc.pop("op")
    assert r.apply(encode_meta(op, **doc)) is None
    assert _table(r.pops) == before and all(s.skipped_entries == 1 for s in r.states)


# ---------------------------------------------------------------------- a real group


@pytest.fixture
def group(tmp_path: Path) -> Iterator[LocalBrokerGroup]:
    g = LocalBrokerGroup(
        tmp_path,
        topics=(f"{T}:2",),
        settings={"register_interval_s": 10, "max_pop_inflight": 4, "max_reconsume_times": 3},
    )
    g.start()
    try:
        yield g
    finally:
        g.stop()


class Popper:
    """Raw POP requests to the group's master, followed across a failover."""

    def __init__(self, g: LocalBrokerGroup, client: RemotingClient) -> None:
        self.g, self.client, self.master = g, client, ""

    async def find_master(self, exclude: set[str] | None = None) -> None:
        self.master = await self.g.wait_for_master(60, exclude=exclude)

    async def call(
        self, code: int, headers: dict[str, Any], body: bytes = b"", timeout: float = 15
    ) -> RemotingCommand:
        return await self.client.invoke_sync(
            self.g.broker_addr[self.master], RemotingCommand.request(code, headers, body), timeout
        )

    async def send(self, body: bytes, queue_id: int = 0, tags: str = "", topic: str = T) -> None:
        headers: dict[str, Any] = {"producerGroup": "pg", "topic": topic, "queueId": queue_id}
        if tags:
            headers["properties"] = properties_to_bytes({"TAGS": tags}).decode()
        r = await self.call(RequestCode.SEND_MESSAGE, headers, body)
        assert r.code == ResponseCode.SUCCESS, r

    async def pop(
        self, n: int, invisible_ms: int, poll_ms: int = 0, queue_id: int = 0, **more: Any
    ) -> tuple[RemotingCommand, list[tuple[Message, str]]]:
        """The answer and each message with the POP_CK a RocketMQ client builds from it."""
        r = await self.call(
            RequestCode.POP_MESSAGE,
            {
                "consumerGroup": G,
                "topic": T,
                "queueId": queue_id,
                "maxMsgNums": n,
                "invisibleTime": invisible_ms,
                "pollTime": poll_ms,
                "bornTime": int(time.time() * 1000),
                "initMode": 0,
                **more,
            },
        )
        if r.code != ResponseCode.SUCCESS:
            return r, []
        starts = {}
        for part in r.header_str("startOffsetInfo").split(";"):
            flag, qid, start = part.split(" ")
            assert flag == "0"
            starts[int(qid)] = int(start)
        out = []
        for m in decode_stored_messages(r.body):
            ck = (
                f"{starts[m.queue_id]} {r.header_int('popTime')} {r.header_int('invisibleTime')} "
                f"{r.header_int('reviveQid')} 0 {self.g.broker_name} {m.queue_id} {m.queue_offset}"
            )
            out.append((m, ck))
        return r, out

    async def ack(self, m: Message, ck: str) -> RemotingCommand:
        return await self.call(
            RequestCode.ACK_MESSAGE,
            {
                "consumerGroup": G,
                "topic": T,
                "queueId": m.queue_id,
                "extraInfo": ck,
                "offset": m.queue_offset,
            },
        )


def _run(g: LocalBrokerGroup, scenario: Any) -> None:
    async def main() -> None:
        async with RemotingClient() as client:
            p = Popper(g, client)
            await p.find_master()
            await scenario(p)

    asyncio.run(asyncio.wait_for(main(), 240))
    logs = "".join((g.base_dir / g.name_of(n) / "broker.log").read_text(errors="replace") for n in g.node_ids)
    assert "Traceback" not in logs


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pop_ack_expiry_and_failover_on_a_real_group(group: LocalBrokerGroup) -> None:
    async def scenario(p: Popper) -> None:
        for i in range(6):
            await p.send(f"m{i}".encode())
        r, got = await p.pop(3, 60_000)
        assert r.code == ResponseCode.SUCCESS and [m.body for m, _ in got] == [b"m0", b"m1", b"m2"], r
        assert r.header_int("restNum") == 3 and all(m.reconsume_times == 0 for m, _ in got)
        for m, ck in got[:2]:
            assert (await p.ack(m, ck)).code == ResponseCode.SUCCESS
        assert (await p.ack(*got[0])).code == ResponseCode.SUCCESS  # a repeated ack
        m2, ck2 = got[2]
        # m2's invisible time cut to 1 s: a new handle; the old one is stale
        moved = await p.call(
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
            {
                "consumerGroup": G,
                "topic": T,
                "queueId": 0,
                "extraInfo": ck2,
                "offset": 2,
                "invisibleTime": 1000,
            },
        )
        assert moved.code == ResponseCode.SUCCESS and moved.header_int("popTime") > r.header_int("popTime"), (
            moved
        )
        stale = await p.ack(m2, ck2)
        assert stale.code == ResponseCode.NO_MESSAGE and "stale" in stale.remark, stale
        r, got = await p.pop(1, 1000)
        assert [m.body for m, _ in got] == [b"m3"]
        m3, ck3 = got[0]
        r, fresh = await p.pop(10, 2500)  # new messages are visible: no wait
        assert [(m.body, m.reconsume_times) for m, _ in fresh] == [(b"m4", 0), (b"m5", 0)], r
        # after 1 s m2 and m3 come back, reconsumed once (long polling wakes at the expiry)
        t0 = time.monotonic()
        got = []
        for _ in range(4):  # (they expire a few ms apart: one POP may come before the second)
            r, more = await p.pop(10, 2500, poll_ms=5000)
            assert r.code == ResponseCode.SUCCESS, r
            got += more
            if len(got) >= 2:
                break
        assert time.monotonic() - t0 < 4.5
        assert [(m.body, m.reconsume_times) for m, _ in got] == [(b"m2", 1), (b"m3", 1)], r
        got += fresh
        expired = await p.ack(m3, ck3)
        assert expired.code == ResponseCode.NO_MESSAGE and "stale" in expired.remark, expired
        held = {m.body: (m, ck) for m, ck in got}
        for body in (b"m2", b"m4"):
            assert (await p.ack(*held[body])).code == ResponseCode.SUCCESS
        bad = await p.ack(held[b"m3"][0], held[b"m3"][1].replace(" 0 broker-a ", " 1 broker-a "))
        assert bad.code == 1004 and "retry" in bad.remark, bad  # BAD_REQUEST, said why

        # kill the master: m3 and m5 (not acked) come back after their invisible time, no other
        old = p.master
        p.g.kill_broker(old)
        await p.find_master(exclude={old})
        back: list[tuple[bytes, int]] = []
        for _ in range(4):
            r, got = await p.pop(10, 60_000, poll_ms=6000)
            assert r.code in (ResponseCode.SUCCESS, ResponseCode.POLLING_TIMEOUT), r
            for m, ck in got:
                back.append((m.body, m.reconsume_times))
                assert (await p.ack(m, ck)).code == ResponseCode.SUCCESS
            if len(back) >= 2:
                break
        assert sorted(back) == [(b"m3", 2), (b"m5", 1)]
        r, got = await p.pop(10, 1000, poll_ms=1500)
        assert r.code == ResponseCode.POLLING_TIMEOUT and got == [], r

        # everything of queue 0 is acked: the group's consumer offset says so, as admin tools read it
        offset = await p.call(
            RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": G, "topic": T, "queueId": 0}
        )
        assert offset.code == ResponseCode.SUCCESS and offset.header_int("offset") == 6, offset

        # a POP held by long polling is answered when a message arrives; queueId -1: every queue
        waiting = asyncio.ensure_future(p.pop(4, 60_000, poll_ms=8000, queue_id=-1))
        await asyncio.sleep(0.3)
        await p.send(b"late", queue_id=1)
        r, got = await asyncio.wait_for(waiting, 6)
        assert [(m.body, m.queue_id) for m, _ in got] == [(b"late", 1)], r
        bad = await p.call(
            RequestCode.POP_MESSAGE,
            {
                "consumerGroup": G,
                "topic": T,
                "queueId": 7,
                "maxMsgNums": 1,
                "invisibleTime": 1000,
                "pollTime": 0,
                "bornTime": 0,
                "initMode": 0,
            },
        )
        assert bad.code == ResponseCode.INVALID_PARAMETER, bad
        bad = await p.call(
            RequestCode.POP_MESSAGE,
            {
                "consumerGroup": G,
                "topic": T,
                "queueId": 0,
                "maxMsgNums": 33,
                "invisibleTime": 1000,
                "pollTime": 0,
                "bornTime": 0,
                "initMode": 0,
            },
        )
        assert bad.code == 1004 and "maxMsgNums" in bad.remark, bad

        # a tag filter passes over what it does not select; max_pop_inflight=4 bounds queue 1
        await p.send(b"tag-a", queue_id=1, tags="a")
        await p.send(b"tag-b", queue_id=1, tags="b")
        r, got = await p.pop(4, 60_000, queue_id=1, expType="TAG", exp="b")
        assert [m.body for m, _ in got] == [b"tag-b"], r
        for i in range(3):
            await p.send(f"more-{i}".encode(), queue_id=1)
        r, got = await p.pop(4, 60_000, queue_id=1)
        assert [m.body for m, _ in got] == [b"more-0", b"more-1"], r  # "late", "tag-b" and these two
        busy, _ = await p.pop(4, 60_000, queue_id=1)
        assert busy.code == ResponseCode.SYSTEM_BUSY and "max_pop_inflight" in busy.remark, busy
        more0 = got[0]
        assert (await p.ack(*more0)).code == ResponseCode.SUCCESS
        r, got = await p.pop(4, 60_000, queue_id=1)
        assert [m.body for m, _ in got] == [b"more-2"], r  # tag-a was passed over for good

        # bad requests get a code and a reason, never a traceback
        m, ck = more0
        cases = [
            ({"extraInfo": "garbage"}, 1004, "extraInfo"),
            ({"offset": 999}, ResponseCode.NO_MESSAGE, "outside"),
            (
                {"extraInfo": ck.replace(f" {p.g.broker_name} ", " broker-z ")},
                ResponseCode.INVALID_PARAMETER,
                "broker-z",
            ),
            ({"topic": "NoSuchTopic"}, ResponseCode.TOPIC_NOT_EXIST, "NoSuchTopic"),
        ]
        for change, code, words in cases:
            headers = {
                "consumerGroup": G,
                "topic": T,
                "queueId": 1,
                "extraInfo": ck,
                "offset": m.queue_offset,
            }
            r = await p.call(RequestCode.ACK_MESSAGE, {**headers, **change})
            assert r.code == code and words in r.remark, (change, r)
        r, _ = await p.pop(1, 1000, expType="SQL92", exp="a IN (")
        assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, r
        r, _ = await p.pop(1, 0)
        assert r.code == 1004 and "invisibleTime" in r.remark, r
        r, _ = await p.pop(1, 1000, consumerGroup="g" * 2000)  # longer than the log's names
        assert r.code == 1004 and "consumerGroup" in r.remark, r
        # popped once and max_reconsume_times (3) times again, never acked: a dead letter in
        # %DLQ%<group> carrying the last delivery's reconsume count, as a push consumer's would
        await p.send(b"doomed", topic="PopDead")
        popped = []
        for _ in range(10):
            r, got = await p.pop(1, 300, poll_ms=2000, consumerGroup="dlq", topic="PopDead")
            popped += [(m.body, m.reconsume_times) for m, _ in got]
            if len(popped) >= 4:
                break
        assert popped == [(b"doomed", 0), (b"doomed", 1), (b"doomed", 2), (b"doomed", 3)], popped
        r, got = await p.pop(1, 300, poll_ms=1000, consumerGroup="dlq", topic="PopDead")
        assert r.code == ResponseCode.POLLING_TIMEOUT and got == [], r
        dead = []
        for _ in range(50):
            pulled = await p.call(
                RequestCode.PULL_MESSAGE,
                {
                    "consumerGroup": "x",
                    "topic": "%DLQ%dlq",
                    "queueId": 0,
                    "queueOffset": 0,
                    "maxMsgNums": 32,
                    "sysFlag": 0x4,
                    "subscription": "*",
                },
            )
            dead = decode_stored_messages(pulled.body) if pulled.code == ResponseCode.SUCCESS else []
            if dead:
                break
            await asyncio.sleep(0.1)
        assert [(m.body, m.reconsume_times, m.properties.get("RETRY_TOPIC")) for m in dead] == [
            (b"doomed", 3, "PopDead")
        ]

        # BATCH_ACK_MESSAGE: bit sets over a start offset, as RocketMQ 5 clients batch acks
        for i in range(3):
            await p.send(f"b{i}".encode(), topic="PopDead")
        r, got = await p.pop(4, 60_000, consumerGroup="batch", topic="PopDead")
        assert [(m.body, m.queue_offset) for m, _ in got] == [
            (b"doomed", 0),
            (b"b0", 1),
            (b"b1", 2),
            (b"b2", 3),
        ]
        pop_time = r.header_int("popTime")

        def batch(bits: bytes, pt: int) -> bytes:
            ack = {"c": "batch", "t": "PopDead", "r": "0", "so": 0, "q": 0, "rq": 0, "pt": pt, "it": 60_000}
            ack["b"] = base64.b64encode(bits).decode()
            return json.dumps({"brokerName": p.g.broker_name, "acks": [ack]}).encode()

        r = await p.call(RequestCode.BATCH_ACK_MESSAGE, {}, batch(b"\x0b", pop_time))  # offsets 0, 1, 3
        assert r.code == ResponseCode.SUCCESS, r
        r = await p.call(RequestCode.BATCH_ACK_MESSAGE, {}, batch(b"\x04", pop_time - 1))  # 2, stale
        assert r.code == ResponseCode.NO_MESSAGE and "1 of the handles" in r.remark, r
        r = await p.call(RequestCode.BATCH_ACK_MESSAGE, {}, b'{"acks": [{"c": "batch"}]}')
        assert r.code == 1004 and "topic" in r.remark, r
        r = await p.call(RequestCode.BATCH_ACK_MESSAGE, {}, batch(b"\x04", pop_time))
        assert r.code == ResponseCode.SUCCESS, r
        r, got = await p.pop(4, 60_000, consumerGroup="batch", topic="PopDead")
        assert r.code == ResponseCode.POLLING_TIMEOUT and got == [], r

        # initMode 1: a new group starts at the queue's end, fixed by its first POP
        r, got = await p.pop(4, 60_000, consumerGroup="latest", topic="PopDead", initMode=1)
        assert r.code == ResponseCode.POLLING_TIMEOUT and got == [], r
        await p.send(b"fresh", topic="PopDead")
        r, got = await p.pop(4, 60_000, consumerGroup="latest", topic="PopDead", initMode=1)
        assert [m.body for m, _ in got] == [b"fresh"], r

        # four consumers popping at once from every queue: each message goes to exactly one
        for i in range(40):
            await p.send(f"race-{i}".encode(), queue_id=i % 2, topic="PopRace")

        async def consumer() -> list[bytes]:
            mine: list[bytes] = []
            for _ in range(200):
                r, got = await p.pop(3, 60_000, queue_id=-1, consumerGroup="racers", topic="PopRace")
                if r.code == ResponseCode.POLLING_TIMEOUT:
                    return mine
                if r.code == ResponseCode.SYSTEM_BUSY:  # max_pop_inflight=4 reached by the others
                    await asyncio.sleep(0.02)
                    continue
                assert r.code == ResponseCode.SUCCESS, r
                for m, ck in got:
                    mine.append(m.body)
                    ack = await p.call(
                        RequestCode.ACK_MESSAGE,
                        {
                            "consumerGroup": "racers",
                            "topic": "PopRace",
                            "queueId": m.queue_id,
                            "extraInfo": ck,
                            "offset": m.queue_offset,
                        },
                    )
                    assert ack.code == ResponseCode.SUCCESS, ack
            return mine

        shares = await asyncio.gather(*(consumer() for _ in range(4)))
        everything = [b for share in shares for b in share]
        assert sorted(everything) == sorted(f"race-{i}".encode() for i in range(40))

        slave = next(n for n in p.g.node_ids if n not in (p.master, old))
        p.master = slave
        r, _ = await p.pop(1, 1000)
        assert r.code == ResponseCode.NOT_MASTER, r

    _run(group, scenario)
