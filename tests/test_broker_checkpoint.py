"""Broker state checkpoints (broker.checkpoint): a state loaded from a checkpoint at index A and
fed the entries after A equals the state that applied every entry; a damaged file is refused
with a clear reason and the store falls back to a full replay."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path

import pytest

from broker import checkpoint, codec
from broker.checkpoint import CheckpointError
from broker.config import BrokerConfig
from broker.localgroup import LocalBrokerGroup
from broker.message_store import MessageStore
from broker.meta import (
    PopPick,
    ack_op,
    broker_addrs_op,
    lock_op,
    offset_op,
    pop_op,
    snapshot_op,
    topic_op,
    txn_end_op,
    unlock_op,
)
from broker.state import BrokerState
from broker.system_topics import HALF_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC
from common.process import free_port
from common.settings import ConfigError
from ledger.config import NodeConfig
from ledger.embed import EmbeddedLedger
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.message import decode_stored_messages, encode_message_batch, make_position, properties_to_bytes

STORE_MS = 1_000_000


def record(topic: str, body: bytes, queue_id: int = 0, store_ms: int = STORE_MS, **props: str) -> bytes:
    raw = properties_to_bytes(props)
    return codec.build_stored_record(
        topic.encode(), queue_id, body, raw, 0, 0, 1, b"\x00" * 8, store_ms, b"\x00" * 8
    )


def workload(seed: int, entries: int) -> list[bytes]:
    """A realistic mix of committed payloads: sends (some duplicated), uniform batches, keyed
    and tagged messages, delayed and half messages with their deliveries and commits,
    send-backs, offsets, topics, locks, POPs and acks, broker addresses and undecodable junk."""
    rnd = random.Random(seed)
    out: list[bytes] = []
    uniqs: list[str] = []
    held: list[int] = []  # positions of scheduled messages
    halves: list[int] = []
    ms = STORE_MS
    while len(out) < entries:
        index = len(out) + 1
        ms += rnd.randrange(0, 50)
        kind = rnd.random()
        topic = f"T{rnd.randrange(3)}"
        qid = rnd.randrange(4)
        if kind < 0.30:
            u = f"U{index:08d}"
            uniqs.append(u)
            out.append(record(topic, b"m" * rnd.randrange(1, 40), qid, ms, UNIQ_KEY=u))
        elif kind < 0.40:  # a uniform batch (the bulk path)
            recs = [record(topic, b"b" * 8, qid, ms, UNIQ_KEY=f"B{index:08d}{j:03d}") for j in range(20)]
            out.append(b"".join(recs))
        elif kind < 0.45:  # a mixed batch with keys and tags
            recs = [
                record(topic, b"k", qid, ms, UNIQ_KEY=f"K{index:08d}{j}", KEYS=f"key{j % 3}", TAGS=f"tag{j}")
                for j in range(3)
            ]
            out.append(b"".join(recs))
        elif kind < 0.50 and uniqs:  # a producer's retry
            out.append(record(topic, b"dup", qid, ms, UNIQ_KEY=rnd.choice(uniqs)))
        elif kind < 0.55:
            out.append(
                record(
                    SCHEDULE_TOPIC,
                    b"later",
                    rnd.randrange(3),
                    ms,
                    REAL_TOPIC=topic,
                    TIMER_OUT_MS=str(ms + 500),
                )
            )
            held.append(make_position(index, 0))
        elif kind < 0.57:
            out.append(record(TIMER_TOPIC, b"timer", 0, ms, TIMER_OUT_MS=str(ms + 100)))
            held.append(make_position(index, 0))
        elif kind < 0.60 and held:  # a delivery (sometimes twice: a new master proposed it too)
            pos = rnd.choice(held)
            origin = codec.ORIGIN_SCHEDULED + pos.to_bytes(8, "big")
            out.append(codec.encode_derived([(origin, record(topic, b"due", qid, ms))]))
        elif kind < 0.63:
            out.append(record(HALF_TOPIC, b"tx", 0, ms, REAL_TOPIC=topic, TRAN_MSG="true", PGROUP="pg"))
            halves.append(make_position(index, 0))
        elif kind < 0.66 and halves:
            pos = halves.pop(rnd.randrange(len(halves)))
            if rnd.random() < 0.5:
                out.append(txn_end_op(pos, "rollback"))
            else:
                origin = codec.ORIGIN_HALF + pos.to_bytes(8, "big")
                out.append(codec.encode_derived([(origin, record(topic, b"committed", qid, ms))]))
        elif kind < 0.68:
            key = codec.ORIGIN_SEND_BACK + rnd.randrange(50).to_bytes(8, "big") + b"\x00\x00\x00\x00cg"
            out.append(codec.encode_derived([(key, record(f"%RETRY%cg{qid}", b"back", 0, ms))]))
        elif kind < 0.74:
            out.append(offset_op(f"g{qid}", topic, qid, rnd.randrange(100), forward=rnd.random() < 0.5))
        elif kind < 0.76:
            out.append(topic_op(topic, 4, 4, 6, order=rnd.random() < 0.3))
        elif kind < 0.79:
            out.append(lock_op(f"g{qid}", f"c{rnd.randrange(3)}", [(topic, qid)], ms, ms + 1000))
        elif kind < 0.80:
            out.append(unlock_op(f"g{qid}", f"c{rnd.randrange(3)}", [(topic, qid)], ms))
        elif kind < 0.86:
            start = rnd.randrange(10)
            offsets = tuple(range(start, start + rnd.randrange(1, 4)))
            out.append(pop_op("pg", topic, ms, 300, 10, [PopPick(qid, 0, offsets[-1] + 1, offsets)]))
        elif kind < 0.90:
            out.append(ack_op("pg", topic, qid, ms, [(rnd.randrange(10), ms - rnd.randrange(200))]))
        elif kind < 0.92:
            out.append(broker_addrs_op({f"n{rnd.randrange(3)}": f"127.0.0.1:{10911 + rnd.randrange(3)}"}))
        elif kind < 0.93:
            out.append(
                snapshot_op({topic: {"read": 4, "write": 4, "perm": 6, "order": False}}, [["g", topic, 0, 7]])
            )
        elif kind < 0.94:
            out.append(b"\x7fjunk")  # an unknown record type: skipped
        elif kind < 0.95:
            out.append(b"")  # a leader's no-op
        else:
            out.append(record(topic, b"plain", qid, ms))  # no UNIQ_KEY
    return out


def apply_all(
    entries: list[bytes], first: int = 1, state: BrokerState | None = None, chunk: int = 7
) -> BrokerState:
    state = state or BrokerState(dedup_window=500, dedup_ttl_s=5.0)
    indexed = list(enumerate(entries, first))
    for i in range(0, len(indexed), chunk):
        state.apply(indexed[i : i + chunk])
    return state


def test_a_checkpoint_plus_the_tail_equals_the_whole_replay() -> None:
    entries = workload(7, 1500)
    whole = apply_all(entries, chunk=1)
    reference = checkpoint.encode(whole)
    assert whole.dispatched_messages > 2000 and whole.schedule.pending and whole.pops.queues
    assert whole.uniq and whole.send_backs._keys and whole.locks.held and whole.skipped_entries
    assert list(dict.keys(whole.uniq)) == list(whole.uniq)  # what capture's fast read relies on
    for cut in (1, 100, 555, 1000, 1499, 1500):
        head = apply_all(entries[:cut], chunk=13)
        data = checkpoint.encode(head)
        loaded = checkpoint.decode(data).state
        assert checkpoint.encode(loaded) == data  # canonical: decode then encode gives the same bytes
        assert loaded.applied == cut
        rest = apply_all(entries[cut:], first=cut + 1, state=loaded, chunk=5)
        assert checkpoint.encode(rest) == reference, f"cut at {cut}"
        assert rest.stats() == whole.stats()


def test_every_attribute_of_the_state_is_checkpointed() -> None:
    assert set(vars(BrokerState())) == checkpoint.STATE_ATTRIBUTES


def test_a_loaded_state_answers_placements_and_due_times_as_the_replayed_one() -> None:
    entries = workload(11, 600)
    whole = apply_all(entries)
    loaded = checkpoint.decode(checkpoint.encode(apply_all(entries[:400]))).state
    apply_all(entries[400:], first=401, state=loaded)
    for index in range(1, 601):
        assert loaded.placement(index, entries[index - 1]) == whole.placement(index, entries[index - 1])
    assert loaded.schedule.take_due(STORE_MS * 10, 10_000) == whole.schedule.take_due(STORE_MS * 10, 10_000)
    assert loaded.delay_offsets(18) == whole.delay_offsets(18)
    assert loaded.topic_config_wrapper() == whole.topic_config_wrapper()


def _sample() -> bytes:
    return checkpoint.encode(apply_all(workload(3, 300)), {"broker_name": "b"})


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda d: d[: len(d) // 2], "truncated"),
        (lambda d: d[:10], "truncated"),
        (lambda d: b"", "truncated"),
        (lambda d: d[:100] + bytes([d[100] ^ 0x10]) + d[101:], "checksum"),
        (lambda d: d[:-9] + bytes([d[-9] ^ 1]) + d[-8:], "checksum"),
        (lambda d: b"garbage!" * 64, "not a broker checkpoint"),
        (lambda d: d + b"x", "overlong"),
    ],
)
def test_a_damaged_checkpoint_is_refused_with_its_reason(damage, reason: str) -> None:  # noqa: ANN001
    with pytest.raises(CheckpointError, match=reason):
        checkpoint.decode(damage(_sample()))


def _reseal(body: bytes) -> bytes:
    """A file with a valid checksum over ``body``: what a writer of another version would make."""
    import xxhash

    return body + xxhash.xxh64_intdigest(body).to_bytes(8, "little")


def test_another_version_and_well_sealed_nonsense_are_refused() -> None:
    data = _sample()
    other = data[:8] + (99).to_bytes(2, "little") + data[10:-8]
    with pytest.raises(CheckpointError, match="version 99"):
        checkpoint.decode(_reseal(other))
    # a header that is valid JSON of the wrong shape, under a correct checksum
    import json
    import struct

    for header in ({"meta": {}, "scalars": {"applied": "x"}}, [], {"meta": {}, "scalars": {}}):
        head = json.dumps(header).encode()
        body = struct.pack("<8sHHIQ", checkpoint.MAGIC, checkpoint.VERSION, 0, len(head), 0) + head
        with pytest.raises(CheckpointError):
            checkpoint.decode(_reseal(body))
    # a column reference past the blob
    head, _ = checkpoint.split(data)
    head["queues"][0][4] = [0, 1 << 40]
    raw = json.dumps(head).encode()
    blob = data[24 + int.from_bytes(data[12:16], "little") : -8]
    body = struct.pack("<8sHHIQ", checkpoint.MAGIC, checkpoint.VERSION, 0, len(raw), len(blob)) + raw + blob
    with pytest.raises(CheckpointError, match="run past"):
        checkpoint.decode(_reseal(body))


def test_write_is_atomic_and_read_refuses_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / checkpoint.CHECKPOINT_FILE
    data = _sample()
    checkpoint.write_file(path, data)
    assert path.read_bytes() == data and not list(tmp_path.glob("*.tmp"))
    assert checkpoint.read_file(path).meta == {"broker_name": "b"}
    with pytest.raises(CheckpointError, match="unreadable"):
        checkpoint.read_file(tmp_path / "nope")
    stale = tmp_path / f"{checkpoint.CHECKPOINT_FILE}.123.0.tmp"  # a crash mid-write
    stale.write_bytes(data[:10])
    assert checkpoint.remove_stale(path) == [stale] and path.exists()


# ---------------------------------------------------------------------- the store over a real ledger


def node_config(tmp_path: Path) -> NodeConfig:
    addr = f"127.0.0.1:{free_port()}"
    cfg = NodeConfig(id="n1", listen=addr, peers=[f"n1={addr}"], data_dir=str(tmp_path / "n1"), tick_ms=5)
    cfg.validate()
    return cfg


async def started(cfg: NodeConfig, ckpt: Path | None, broker_name: str = "broker-a") -> MessageStore:
    store = MessageStore(EmbeddedLedger(cfg), broker_name, checkpoint_path=ckpt, checkpoint_min_entries=5)
    await store.ledger.start()
    for _ in range(STARTUP_POLLS):
        if store.ledger.leader_ready:
            await store.caught_up()
            return store
        await asyncio.sleep(0.01)
    await store.ledger.stop()
    raise AssertionError("single-member group did not elect itself")


STARTUP_POLLS = 500
TAIL = 10


def first_life(tmp_path: Path) -> tuple[NodeConfig, Path, int]:
    """A store that checkpointed after 60 entries of the mix, then applied TAIL more: (config,
    checkpoint path, the checkpoint's index)."""
    cfg = node_config(tmp_path)
    path = tmp_path / checkpoint.CHECKPOINT_FILE
    entries = workload(5, 60 + TAIL)

    async def run() -> int:
        store = await started(cfg, path)
        try:
            await store.append_async(entries[:60])
            assert await store.write_checkpoint()
            assert not await store.write_checkpoint()  # nothing new: not written again
            index = store.stats()["checkpoint_index"]
            await store.append_async(entries[60:])
            return index
        finally:
            await store.ledger.stop()

    return cfg, path, asyncio.run(run())


def restarted(cfg: NodeConfig, path: Path | None, broker_name: str = "broker-a") -> tuple[dict, bytes]:
    """(stats, canonical state) of a store started again on the same ledger files."""

    async def run() -> tuple[dict, bytes]:
        store = await started(cfg, path, broker_name)
        try:
            state = checkpoint.encode(store.state)
            assert state == replay(store.ledger, store.state.applied)
            return store.stats(), state
        finally:
            await store.ledger.stop()

    return asyncio.run(run())


def replay(ledger: EmbeddedLedger, upto: int) -> bytes:
    """The canonical state of a whole replay of ``ledger`` through ``upto``, for comparison."""
    state = BrokerState()
    for _ in range(upto):
        if state.applied >= upto:
            break
        state.apply(ledger.read_payloads(state.applied + 1, upto))
    return checkpoint.encode(state)


def test_a_restarted_store_loads_its_checkpoint_and_applies_only_the_tail(tmp_path: Path) -> None:
    cfg, path, index = first_life(tmp_path)
    stats, state = restarted(cfg, path)
    assert stats["checkpoint_loads"] == 1 and stats["checkpoint_load_failures"] == 0
    assert stats["checkpoint_loaded_index"] == index > 60
    assert 0 < stats["replayed_entries"] <= TAIL + 2  # the tail and the new term's no-op
    assert stats["applied_index"] > index + TAIL  # (and the state equals a whole replay: restarted)


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda d: d[:100] + bytes([d[100] ^ 4]) + d[101:], "checksum"),
        (lambda d: d[: len(d) - 50], "truncated"),
        (lambda d: b"\x00" * 40, "not a broker checkpoint"),
        (lambda d: _reseal(d[:8] + (2).to_bytes(2, "little") + d[10:-8]), "version 2"),
    ],
)
def test_a_damaged_checkpoint_falls_back_to_a_whole_replay(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    damage,  # noqa: ANN001
    reason: str,
) -> None:
    cfg, path, _ = first_life(tmp_path)
    path.write_bytes(damage(path.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="broker.store"):
        stats, _ = restarted(cfg, path)
    assert stats["checkpoint_loads"] == 0 and stats["checkpoint_load_failures"] == 1
    assert stats["replayed_entries"] == stats["applied_index"]  # the whole log
    failed = [r for r in caplog.records if r.getMessage().startswith("checkpoint not loaded")]
    assert failed and failed[0].path == str(path) and reason in failed[0].reason


def test_a_checkpoint_of_another_group_or_log_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, path, _ = first_life(tmp_path)
    good = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="broker.store"):
        stats, _ = restarted(cfg, path, broker_name="broker-b")
    assert stats["checkpoint_load_failures"] == 1
    assert any("broker-a" in getattr(r, "reason", "") for r in caplog.records)
    # the same group name, but the entry it ends at has another term here: another log
    loaded = checkpoint.decode(good)
    path.write_bytes(checkpoint.encode(loaded.state, {**loaded.meta, "term": loaded.meta["term"] + 7}))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="broker.store"):
        stats, _ = restarted(cfg, path)
    assert stats["checkpoint_load_failures"] == 1
    assert stats["replayed_entries"] == stats["applied_index"]
    assert any(r.getMessage().startswith("checkpoint is of another log") for r in caplog.records)


def test_log_quiet() -> None:
    logging.getLogger("broker.state").setLevel(logging.CRITICAL)  # junk entries log on purpose


# ---------------------------------------------------------------------- a real broker group

GROUP_TOPIC = "TopicTest"
GROUP_POLL_S = 0.1
GROUP_POLLS = 600  # 60 s at most for any one wait


def _send(body: bytes, queue_id: int, uniq: str) -> RemotingCommand:
    headers = {
        "producerGroup": "pg",
        "topic": GROUP_TOPIC,
        "queueId": queue_id,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": properties_to_bytes({"UNIQ_KEY": uniq}).decode(),
    }
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, headers, body)


def _batch(bodies: list[bytes], queue_id: int) -> RemotingCommand:
    headers = {"producerGroup": "pg", "topic": GROUP_TOPIC, "queueId": queue_id, "bornTimestamp": 1}
    return RemotingCommand.request(
        RequestCode.SEND_BATCH_MESSAGE, headers, encode_message_batch([(0, b, b"") for b in bodies])
    )


async def _pull_all(client: RemotingClient, addr: str, queue_id: int) -> list[tuple[int, str, bytes]]:
    """(queue offset, message id, body) of every message of a queue, as ``addr`` serves them."""
    out: list[tuple[int, str, bytes]] = []
    offset = 0
    for _ in range(GROUP_POLLS):
        headers = {
            "consumerGroup": "cg",
            "topic": GROUP_TOPIC,
            "queueId": queue_id,
            "queueOffset": offset,
            "maxMsgNums": 256,
            "suspendTimeoutMillis": 0,
        }
        resp = await client.invoke_sync(addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, headers), 10)
        if resp.code == ResponseCode.PULL_NOT_FOUND:
            return out
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        out += [(m.queue_offset, m.msg_id, m.body) for m in decode_stored_messages(resp.body)]
        offset = resp.header_int("nextBeginOffset")
    raise AssertionError("pull loop did not reach the end")


async def _store_stats(group: LocalBrokerGroup, client: RemotingClient, nid: str) -> dict | None:
    info = await group.runtime_info(client, nid)
    return None if info is None else info["store"]


@pytest.mark.slow
def test_a_restarted_broker_of_a_group_replays_only_the_tail_and_serves_the_same(tmp_path: Path) -> None:
    settings = {"checkpoint_interval_s": 0.3, "checkpoint_min_entries": 5, "register_interval_s": 10}
    group = LocalBrokerGroup(tmp_path, settings=settings)
    group.start()

    async def scenario() -> None:
        master = await group.wait_for_master()
        addr = group.broker_addr[master]
        follower = next(n for n in group.node_ids if n != master)
        async with RemotingClient() as client:
            offset = RemotingCommand.request(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": "cg", "topic": GROUP_TOPIC, "queueId": 2, "commitOffset": 7},
            )
            assert (await client.invoke_sync(addr, offset, 5)).code == ResponseCode.SUCCESS
            for i in range(120):
                resp = await client.invoke_sync(
                    addr, _batch([b"b%d-%d" % (i, j) for j in range(16)], i % 4), 10
                )
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            applied = (await _store_stats(group, client, master))["applied_index"]
            for _ in range(GROUP_POLLS):  # the follower checkpoints what it applied
                stats = await _store_stats(group, client, follower)
                if stats and stats["checkpoint_index"] >= applied:
                    break
                await asyncio.sleep(GROUP_POLL_S)
            else:
                raise AssertionError(f"{follower} wrote no checkpoint through {applied}")
            group.kill_broker(follower)  # SIGKILL: no checkpoint at shutdown
            for i in range(5):
                resp = await client.invoke_sync(addr, _send(b"tail%d" % i, i % 4, f"tail-{i}"), 10)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            applied = (await _store_stats(group, client, master))["applied_index"]
            group.start_broker(follower)
            for _ in range(GROUP_POLLS):
                stats = await _store_stats(group, client, follower)
                if stats and stats["applied_index"] >= applied:
                    break
                await asyncio.sleep(GROUP_POLL_S)
            else:
                raise AssertionError(f"restarted {follower} did not catch up to {applied}")
            assert stats["checkpoint_loads"] == 1 and stats["checkpoint_load_failures"] == 0
            assert stats["replayed_entries"] <= 20 < 120 <= stats["checkpoint_loaded_index"], stats
            follower_addr = group.broker_addr[follower]
            for qid in range(4):
                served = await _pull_all(client, follower_addr, qid)
                assert served == await _pull_all(client, addr, qid)
                assert len(served) == 30 * 16 + (2 if qid == 0 else 1)
            query = RemotingCommand.request(
                RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "cg", "topic": GROUP_TOPIC, "queueId": 2}
            )
            resp = await client.invoke_sync(follower_addr, query, 5)
            assert resp.code == ResponseCode.SUCCESS and resp.header_int("offset") == 7

    try:
        asyncio.run(scenario())
    finally:
        group.stop()


def _config(tmp_path: Path, **kw: object) -> BrokerConfig:
    cfg = BrokerConfig(
        broker_name="broker-a",
        node_id="n1",
        group=["n1=127.0.0.1:10911@127.0.0.1:20911"],
        namesrv_addr=["127.0.0.1:9876"],
        data_dir=str(tmp_path),
        cluster_secret="s" * 32,
        **kw,  # type: ignore[arg-type]
    )
    cfg.validate()
    return cfg


def test_the_checkpoint_settings_are_validated_and_0_turns_it_off(tmp_path: Path) -> None:
    assert _config(tmp_path).checkpoint_path == tmp_path / checkpoint.CHECKPOINT_FILE
    assert _config(tmp_path, checkpoint_interval_s=0).checkpoint_path is None
    with pytest.raises(ConfigError, match="checkpoint_interval_s"):
        _config(tmp_path, checkpoint_interval_s=-1)
    with pytest.raises(ConfigError, match="checkpoint_min_entries"):
        _config(tmp_path, checkpoint_min_entries=0)
