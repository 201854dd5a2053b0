"""The broker's message store over a real single-member ledger (in process, real files and fsync)."""

from __future__ import annotations

import asyncio

from broker.message_store import MessageStore
from broker.meta import offset_op, topic_op
from ledger.config import NodeConfig
from ledger.localcluster import free_port
from ledger.node import LedgerNode
from remoting.message import encode_record


def node_config(tmp_path, **extra) -> NodeConfig:
    addr = f"127.0.0.1:{free_port()}"
    cfg = NodeConfig(id="n1", listen=addr, peers=[f"n1={addr}"], data_dir=str(tmp_path / "n1"), tick_ms=5, **extra)
    cfg.validate()
    return cfg


def record(body: bytes, queue_id: int = 0, pid: str = "", seq: int = 0) -> bytes:
    return encode_record(b"T", queue_id, body, b"", 0, 1, 2, pid.encode(), seq)


async def started(cfg: NodeConfig) -> tuple[LedgerNode, MessageStore]:
    node = LedgerNode(cfg)
    store = MessageStore(node, "broker-a")
    await node.start()
    for _ in range(400):
        if node.leader_ready:
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
        assert again[0].duplicate and again[0].queue_offset == 2 and again[0].ledger_index == r[3].ledger_index
        assert store.offsets_of("T", 0) == (0, 3)
        await node.stop()

    async def second_life() -> None:
        node, store = await started(cfg)
        store.dispatch()
        assert store.topics["T"].write_queue_nums == 2
        assert store.offsets[("g", "T", 1)] == 5
        cq = store.queue("T", 0)
        assert cq is not None and cq.max_offset == 3, "the retried duplicate must not be replayed into the queue"
        bodies = [bytes(rec[-1:]) for _, _, rec in store.read_records(cq.slice(0, 10), 1 << 20)]
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
        first = node.store.apply_retention(node.commit_index)
        assert first > 3, "retention should have removed the segments holding the topic and offset records"
        await node.stop()

    async def second_life() -> None:
        node, store = await started(cfg)
        store.dispatch()
        assert "T" in store.topics and store.topics["T"].read_queue_nums == 4
        assert store.offsets[("g", "T", 3)] == 42
        await node.stop()

    asyncio.run(first_life())
    asyncio.run(second_life())
