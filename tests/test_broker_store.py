"""The broker's message store (the shell around broker.state) over a real single-member embedded ledger
(in process, real files and fsync). The state machine alone is tested in test_broker_state.py."""

from __future__ import annotations

import asyncio

import pytest

from broker import codec
from broker.consume_queue import ConsumeQueue
from broker.message_store import MessageStore
from broker.meta import offset_op, topic_op
from common.process import free_port
from ledger.config import NodeConfig
from ledger.embed import EmbeddedLedger
from remoting.message import (
    MessageFormatError,
    decode_stored_messages,
    host_to_bytes,
    make_position,
    offset_msg_id,
    parse_offset_msg_id,
    properties_to_bytes,
    split_position,
)


def record(
    body: bytes, queue_id: int = 0, pid: str = "", seq: int = 0, topic: bytes = b"T", **props: str
) -> bytes:
    """A RocketMQ stored record; ``pid``/``seq`` become its UNIQ_KEY (the de-duplication key)."""
    if pid:
        props["UNIQ_KEY"] = f"{pid}-{seq}"
    raw = properties_to_bytes(props)
    return codec.build_stored_record(topic, queue_id, body, raw, 0, 0, 1, b"\x00" * 8, 2, b"\x00" * 8)


def encode_batch_entry(records: list[bytes]) -> bytes:
    """A batch entry: the records back to back, as RocketMQ's commit log holds a batch."""
    return b"".join(records)


def broken_record(body: bytes) -> bytes:
    """A record whose size is right but whose body length runs past its topic and properties."""
    raw = bytearray(record(body))
    raw[84:88] = (len(body) + 50).to_bytes(4, "big")
    return bytes(raw)


def node_config(tmp_path, **extra) -> NodeConfig:
    addr = f"127.0.0.1:{free_port()}"
    cfg = NodeConfig(
        id="n1", listen=addr, peers=[f"n1={addr}"], data_dir=str(tmp_path / "n1"), tick_ms=5, **extra
    )
    cfg.validate()
    return cfg


async def started(cfg: NodeConfig) -> tuple[EmbeddedLedger, MessageStore]:
    node = EmbeddedLedger(cfg)
    store = MessageStore(node, "broker-a")
    await node.start()
    for _ in range(400):
        if node.leader_ready:
            await store.caught_up()
            return node, store
        await asyncio.sleep(0.01)
    raise AssertionError("single-member group did not elect itself")


def test_dispatch_offsets_dedup_and_replay(tmp_path):
    cfg = node_config(tmp_path)

    async def first_life() -> None:
        node, store = await started(cfg)
        await store.append_async([topic_op("T", 2, 2, 6), offset_op("g", "T", 1, 5)])
        r = await store.append_async([record(b"a"), record(b"b", 1), record(b"c"), record(b"p", 0, "pid", 7)])
        assert [(x.queue_offset, x.duplicate) for x in r] == [(0, False), (0, False), (1, False), (2, False)]
        again = await store.append_async([record(b"p-retry", 0, "pid", 7)])
        assert (
            again[0].duplicate and again[0].queue_offset == 2 and again[0].ledger_index == r[3].ledger_index
        )
        assert store.offsets_of("T", 0) == (0, 3)
        await node.stop()

    async def second_life() -> None:
        node, store = await started(cfg)
        await store.caught_up()
        assert store.topics["T"].write_queue_nums == 2
        assert store.offsets[("g", "T", 1)] == 5
        cq = store.queue("T", 0)
        assert cq is not None and cq.max_offset == 3, (
            "the retried duplicate must not be replayed into the queue"
        )
        bodies = [
            decode_stored_messages(rec)[0].body for _, _, rec in store.read_records(cq.slice(0, 10), 1 << 20)
        ]
        assert bodies == [b"a", b"c", b"p"]
        await node.stop()

    asyncio.run(first_life())
    asyncio.run(second_life())


def test_metadata_checkpoint_survives_retention(tmp_path):
    cfg = node_config(tmp_path, segment_bytes=4096, retention_bytes=8192)

    async def first_life() -> None:
        node, store = await started(cfg)
        await store.append_async([topic_op("T", 4, 4, 6), offset_op("g", "T", 3, 42)])
        for i in range(40):  # several segments' worth of messages
            await store.append_async([record(b"x" * 200 + str(i).encode())])
        await store.append_async([store.snapshot_record()])
        await store.append_async([record(b"last")])
        first = node.run_retention()
        assert first > 3, "retention should have removed the segments holding the topic and offset records"
        await node.stop()

    async def second_life() -> None:
        node, store = await started(cfg)
        await store.caught_up()
        assert "T" in store.topics and store.topics["T"].read_queue_nums == 4
        assert store.offsets[("g", "T", 3)] == 42
        await node.stop()

    asyncio.run(first_life())
    asyncio.run(second_life())


def test_batch_is_one_entry_and_each_message_has_its_own_position(tmp_path):
    cfg = node_config(tmp_path)

    async def first_life() -> None:
        node, store = await started(cfg)
        await store.append_async([topic_op("T", 1, 1, 6)])
        recs = [record(f"m{i}".encode(), 0, "pid", i + 1) for i in range(5)]
        entries = store.batch_entries(recs)
        assert len(entries) == 1 and len(codec.entry_records(entries[0])) == 5
        before = node.commit_index
        r = await store.append_async(entries)
        assert node.commit_index == before + 1, "a producer batch must be one ledger entry"
        assert [x.queue_offset for x in r] == [0, 1, 2, 3, 4]
        assert [split_position(x.position) for x in r] == [(before + 1, s) for s in range(5)]
        # a resent batch (the producer's retry after an unknown outcome) is de-duplicated item by item
        again = await store.append_async(store.batch_entries([*recs[3:], record(b"m5", 0, "pid", 6)]))
        assert [(x.queue_offset, x.duplicate) for x in again] == [(3, True), (4, True), (5, False)]
        assert again[0].position == r[3].position
        cq = store.queue("T", 0)
        assert cq is not None
        # a pull that starts mid-batch and crosses into the next entry
        got = store.read_records(cq.slice(2, 3), 1 << 20)
        assert [(q, decode_stored_messages(rec)[0].body) for q, _, rec in got] == [
            (2, b"m2"),
            (3, b"m3"),
            (4, b"m4"),
        ]
        qoff, rec = store.record_at(r[4].position) or (None, b"")
        assert qoff == 4 and decode_stored_messages(rec)[0].body == b"m4"
        assert store.record_at(make_position(before + 1, 99)) is None, "a slot past the batch holds nothing"
        await node.stop()

    async def second_life() -> None:
        node, store = await started(cfg)
        await store.caught_up()
        cq = store.queue("T", 0)
        assert cq is not None and cq.max_offset == 6
        bodies = [
            decode_stored_messages(rec)[0].body for _, _, rec in store.read_records(cq.slice(0, 10), 1 << 20)
        ]
        assert bodies == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
        await node.stop()

    asyncio.run(first_life())
    asyncio.run(second_life())


def test_batch_larger_than_an_entry_is_split(tmp_path):
    cfg = node_config(tmp_path, max_entry_bytes=64 << 10)

    async def run() -> None:
        node, store = await started(cfg)
        await store.append_async([topic_op("T", 1, 1, 6)])
        recs = [record(bytes([65 + i % 26]) * 10_000) for i in range(20)]
        entries = store.batch_entries(recs)
        assert len(entries) == 4 and all(len(e) <= cfg.max_entry_bytes for e in entries)
        r = await store.append_async(entries)
        assert [x.queue_offset for x in r] == list(range(20))
        cq = store.queue("T", 0)
        assert cq is not None
        assert [
            decode_stored_messages(rec)[0].body for _, _, rec in store.read_records(cq.slice(0, 20), 1 << 20)
        ] == [bytes([65 + i % 26]) * 10_000 for i in range(20)]
        await node.stop()

    asyncio.run(run())


def test_corrupt_batch_entry_is_skipped_and_the_rest_dispatched(tmp_path):
    cfg = node_config(tmp_path)

    async def run() -> None:
        node, store = await started(cfg)
        await store.append_async([topic_op("T", 1, 1, 6)])
        good = encode_batch_entry([record(b"a"), record(b"b")])
        bad = good[:-3]  # the last record runs past the end of the entry
        r = await store.append_async([bad, good])
        assert [x.queue_offset for x in r] == [-1, 0, 1], "the corrupt entry stores nothing"
        cq = store.queue("T", 0)
        assert cq is not None and cq.max_offset == 2
        await node.stop()

    asyncio.run(run())


def test_batch_entry_codec_rejects_malformed_input():
    recs = [record(b"x"), record(b"yy")]
    entry = encode_batch_entry(recs)
    assert [bytes(v) for v in codec.entry_records(entry)] == recs
    assert codec.entry_kind(entry) == codec.KIND_MESSAGE
    for broken, what in (
        (entry + b"z", "truncated record"),
        (entry[:-1], "bad record of size"),
        (entry[:4] + b"\x00" * 4 + entry[8:], "holds no message records"),
    ):
        with pytest.raises(MessageFormatError, match=what):
            codec.entry_records(broken)
    host = host_to_bytes("127.0.0.1:10911")
    assert parse_offset_msg_id(offset_msg_id(host, make_position(7, 3))) == (
        "127.0.0.1:10911",
        make_position(7, 3),
    )


def test_a_long_dispatch_backlog_is_worked_off_in_slices(tmp_path):
    """A restarted broker replays its log without holding the event loop (votes, heartbeats)."""
    cfg = node_config(tmp_path)

    async def run() -> None:
        node, store = await started(cfg)
        await store.append_async([topic_op("T", 1, 1, 6)])
        for i in range(8):  # 8 entries of ~512 KiB: several dispatch slices' worth
            await store.append_async(
                store.batch_entries([record(bytes([65 + i]) * 4096) for _ in range(128)])
            )
        replay = MessageStore(node, "broker-a")  # derived state from scratch, as after a restart
        replay._on_commit(node.commit_index)
        assert replay.applied < node.commit_index, (
            "one commit notification must not replay everything at once"
        )
        for _ in range(100):
            if replay.applied >= node.commit_index:
                break
            await asyncio.sleep(0)
        assert replay.applied == node.commit_index
        cq, fresh = store.queue("T", 0), replay.queue("T", 0)
        assert cq is not None and fresh is not None
        assert list(fresh.positions) == list(cq.positions) and fresh.max_offset == 8 * 128
        await node.stop()

    asyncio.run(run())


def test_a_replaying_store_tells_its_ledger_member_to_let_peers_stand_first(tmp_path):
    """While more committed entries than ``yield_lag_entries`` wait to be applied, the ledger
    member defers its candidacy (a master elected meanwhile would wait for the whole replay);
    once applied it stands as usual again."""
    cfg = node_config(tmp_path)

    async def run() -> None:
        node, store = await started(cfg)
        await store.append_async([topic_op("T", 1, 1, 6)])
        for i in range(40):  # 40 small entries: a backlog of more than the 8 the replay allows
            await store.append_async([record(bytes([65 + i % 26]) * 64)])
        core = node._node.core
        assert not core.lagging  # the live store applies as it commits
        replay = MessageStore(node, "broker-a", yield_lag_entries=8)  # a restart's replay
        seen = []
        real = node.set_lagging
        node.set_lagging = lambda lagging: (seen.append(lagging), real(lagging))  # type: ignore[method-assign]
        replay.apply_slice_bytes = 4096  # a few entries per loop turn
        replay._on_commit(node.commit_index)
        assert core.lagging and seen == [True]
        for _ in range(200):
            if replay.applied >= node.commit_index:
                break
            await asyncio.sleep(0)
        assert replay.applied == node.commit_index
        assert not core.lagging and seen == [True, False]
        assert replay.stats()["max_apply_lag"] > 8 and replay.stats()["apply_lag"] == 0
        with pytest.raises(ValueError, match="yield_lag_entries"):
            MessageStore(node, "broker-a", yield_lag_entries=-1)
        await node.stop()

    asyncio.run(run())


def test_consume_queue_scan_filters_by_tag_hash_and_bounds_its_work():
    cq = ConsumeQueue("T", 0)
    for i, tag in enumerate("ABABCAAB"):  # as the state machine fills it: position, size, tag hash
        cq.positions.append(make_position(10 + i))
        cq.sizes.append(100 + i)
        cq.tags.append(codec.tag_code(tag.encode()))
    a, c = codec.tag_code(b"A"), codec.tag_code(b"C")
    assert cq.scan(0, 32, {a}, 100) == (
        [
            (0, make_position(10), 100),
            (2, make_position(12), 102),
            (5, make_position(15), 105),
            (6, make_position(16), 106),
        ],
        8,
    )
    assert cq.scan(0, 2, {a, c}, 100)[1] == 3, "stops right after the last hit it returns"
    assert cq.scan(1, 32, {c}, 2) == ([], 3), "looks at no more than the scan limit"
    cq.trim_before(make_position(13))
    assert cq.min_offset == 3 and cq.slice(0, 2) == [(3, make_position(13), 103), (4, make_position(14), 104)]
    assert cq.offset_of_position(make_position(17)) == 7 and cq.offset_of_position(make_position(12)) is None


def test_batch_entry_with_mixed_records_is_dispatched_record_by_record(tmp_path):
    """Dispatch looks topic, queue and producer up once per change: a change mid-batch, a
    record without a producer between two with one, and a broken record must all be right."""
    cfg = node_config(tmp_path)

    async def run() -> None:
        node, store = await started(cfg)
        await store.append_async([topic_op("T", 2, 2, 6)])
        await store.append_async([record(b"p1", 0, "pid", 1)])
        broken = broken_record(b"zz")  # lengths no longer add up
        mixed = [
            record(b"a", 0, "pid", 2),
            record(b"b", 1),
            record(b"p1-again", 0, "pid", 1),
            broken,
            record(b"c", 1, "other", 1),
            record(b"p2-again", 0, "pid", 2),
        ]
        r = await store.append_async([encode_batch_entry(mixed)])
        assert [(x.queue_offset, x.duplicate) for x in r] == [
            (1, False),
            (0, False),
            (0, True),
            (-1, False),
            (1, False),
            (1, True),
        ]
        q0, q1 = store.queue("T", 0), store.queue("T", 1)
        assert q0 is not None and q1 is not None
        assert [
            decode_stored_messages(rec)[0].body for _, _, rec in store.read_records(q0.slice(0, 9), 1 << 20)
        ] == [
            b"p1",
            b"a",
        ]
        assert [
            decode_stored_messages(rec)[0].body for _, _, rec in store.read_records(q1.slice(0, 9), 1 << 20)
        ] == [
            b"b",
            b"c",
        ]
        assert store.dispatched_messages == 4
        await node.stop()

    asyncio.run(run())


def test_waiting_for_a_backlog_to_be_applied_lets_the_event_loop_run(tmp_path):
    """What a new master waits for (everything committed applied) arrives a slice per loop turn."""
    cfg = node_config(tmp_path)

    async def run() -> None:
        node, store = await started(cfg)
        await store.append_async([topic_op("T", 1, 1, 6)])
        for i in range(6):
            await store.append_async(
                store.batch_entries([record(bytes([65 + i]) * 4096) for _ in range(128)])
            )
        replay = MessageStore(node, "broker-a")  # derived state from scratch, as after a restart
        turns = 0

        async def other_work() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.get_running_loop().create_task(other_work())
        ready: list[int] = []
        replay.when_applied(node.commit_index, lambda: ready.append(replay.applied))
        assert not ready, "a backlog is not applied in one go"
        await asyncio.wait_for(replay.caught_up(), 10)
        task.cancel()
        assert ready == [node.commit_index] and turns >= 3, "other work ran between the slices"
        assert replay.queue("T", 0).max_offset == 6 * 128
        await node.stop()

    asyncio.run(run())
