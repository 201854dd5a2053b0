"""Broker metadata that travels through the ledger: topic configs and consumer offsets.

RocketMQ syncs these to slaves every few seconds, so a failover can roll consumers back
and lose topic changes. Here each change is a ledger entry (a record of type 2, JSON), so
every broker of the group applies the same changes in the same order and a new master
starts with exactly the committed state.
"""

from __future__ import annotations

import json
from typing import Any

RECORD_META = 2


def encode_meta(op: str, **fields: Any) -> bytes:
    return bytes((RECORD_META,)) + json.dumps({"op": op, **fields}, separators=(",", ":")).encode()


def decode_meta(data: bytes | memoryview) -> dict[str, Any]:
    doc = json.loads(bytes(data[1:]))
    if not isinstance(doc, dict) or "op" not in doc:
        raise ValueError("metadata record without an op")
    return doc


def topic_op(name: str, read_queue_nums: int, write_queue_nums: int, perm: int, order: bool = False) -> bytes:
    return encode_meta(
        "topic", name=name, read=read_queue_nums, write=write_queue_nums, perm=perm, order=order
    )


def offset_op(group: str, topic: str, queue_id: int, offset: int, *, forward: bool = False) -> bytes:
    """A consumer offset; ``forward`` (a commit riding on a pull) never moves it backwards,
    while an explicit UPDATE_CONSUMER_OFFSET sets it to the value given (RocketMQ's reset)."""
    if forward:
        return encode_meta("offset", group=group, topic=topic, queue=queue_id, offset=offset, forward=True)
    return encode_meta("offset", group=group, topic=topic, queue=queue_id, offset=offset)


def snapshot_op(topics: dict[str, Any], offsets: list[list[Any]]) -> bytes:
    """All topics and consumer offsets at one point of the log.

    With ledger retention on, the segments holding the original topic and offset records
    are eventually deleted; a checkpoint appended more often than retention removes them
    keeps the replayed state complete after a restart.
    """
    return encode_meta("snapshot", topics=topics, offsets=offsets)
