"""Messages as producers send them, as the commit log stores them and as consumers pull them.

A message is stored as a *record*: a fixed header (the fields the dispatcher needs to
build consume queues without parsing anything else), then topic, producer id, properties
(a small JSON map: tags, keys, user properties) and body. A message sent alone is one
ledger entry holding its record; a producer's batch is one ledger entry holding all its
records (a *batch entry*), so the Raft log pays its per-entry costs (header, checksum,
index, fsync bookkeeping, replication framing) once per batch rather than per message.
A message's *position* is its ledger index and its slot in the entry
(``index << 16 | slot``; slot 0 for a message stored alone); consume queues, message ids
and the key index all use positions. Pull responses carry the stored records unchanged,
each prefixed with where it was found, so no message is re-encoded between the commit
log and the consumer.

Record layout (little endian)::

    u8 type=1 | u8 flags | u16 queue id | u32 tag hash | u64 born ms | u64 store ms |
    u64 producer seq | u16 topic len | u16 producer id len | u32 properties len | u32 body len |
    topic | producer id | properties (JSON) | body

Batch entries are ``u8 type=3 | u8 0 | u16 count`` then ``count`` times ``u32 record len | record``.

Batch bodies (SEND_BATCH_MESSAGE) repeat ``u32 flag | u64 born ms | u64 seq | u32 props len |
u32 body len | props | body``. Pull bodies repeat ``u32 record len | u64 queue offset |
u64 position | record``.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

RECORD_MESSAGE = 1
RECORD_BATCH = 3
SLOT_BITS = 16
MAX_BATCH_SLOTS = 1 << SLOT_BITS
_SLOT_MASK = MAX_BATCH_SLOTS - 1
_BATCH_ENTRY = struct.Struct("<BxH")
_U32 = struct.Struct("<I")
BATCH_ENTRY_HEADER_SIZE = _BATCH_ENTRY.size
BATCH_SLOT_OVERHEAD = _U32.size
_REC = struct.Struct("<BBHIQQQHHII")
REC_HEADER_SIZE = _REC.size
_BATCH_ITEM = struct.Struct("<IQQII")
_PULL_ITEM = struct.Struct("<IQQ")

PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"


class MessageFormatError(ValueError):
    """A record or batch could not be decoded; says what and at which offset."""


def tag_hash(tags: str | None) -> int:
    """The 32-bit tag hash stored in consume queues (crc32 keeps it stable across processes)."""
    return zlib.crc32(tags.encode()) if tags else 0


@dataclass(slots=True)
class Message:
    topic: str
    body: bytes
    tags: str | None = None
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    # Filled in by the broker / on pull:
    queue_id: int = -1
    queue_offset: int = -1
    ledger_index: int = -1
    born_ms: int = 0
    store_ms: int = 0
    producer_id: str = ""
    seq: int = 0
    msg_id: str = ""

    def all_properties(self) -> dict[str, str]:
        props = dict(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            props[PROPERTY_KEYS] = " ".join(self.keys)
        return props


def encode_properties(props: dict[str, str]) -> bytes:
    return json.dumps(props, separators=(",", ":")).encode() if props else b""


def decode_properties(raw: bytes | memoryview, where: str = "properties") -> dict[str, str]:
    if not raw:
        return {}
    try:
        props = json.loads(bytes(raw))
    except ValueError as exc:
        raise MessageFormatError(f"{where}: not JSON: {exc}") from None
    if not isinstance(props, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in props.items()
    ):
        raise MessageFormatError(f"{where}: must be a JSON object of strings")
    return props


def encode_record(
    topic: bytes,
    queue_id: int,
    body: bytes | memoryview,
    props: bytes,
    tag_hash_value: int,
    born_ms: int,
    store_ms: int,
    producer_id: bytes = b"",
    seq: int = 0,
    flags: int = 0,
) -> bytes:
    head = _REC.pack(
        RECORD_MESSAGE,
        flags,
        queue_id,
        tag_hash_value,
        born_ms,
        store_ms,
        seq,
        len(topic),
        len(producer_id),
        len(props),
        len(body),
    )
    return b"".join((head, topic, producer_id, props, body))


@dataclass(slots=True)
class RecordHeader:
    """What the dispatcher reads from a record without decoding properties or body."""

    queue_id: int
    tag_hash: int
    born_ms: int
    store_ms: int
    seq: int
    topic: str
    producer_id: str
    props_off: int
    props_len: int
    body_off: int
    body_len: int
    flags: int


def unpack_record_header(rec: bytes | memoryview) -> tuple[int, int, int, int, int, int, int, int, int, int, int]:
    """The raw header fields (type, flags, queue id, tag hash, born, store, seq, topic len,
    producer id len, properties len, body len); the dispatcher's allocation-free path."""
    return _REC.unpack_from(rec, 0)


def read_record_header(rec: bytes | memoryview) -> RecordHeader:
    if len(rec) < REC_HEADER_SIZE:
        raise MessageFormatError(f"record of {len(rec)} bytes is shorter than its header")
    typ, flags, qid, th, born, store, seq, tl, pl, prl, bl = _REC.unpack_from(rec, 0)
    if typ != RECORD_MESSAGE:
        raise MessageFormatError(f"not a message record (type {typ})")
    off = REC_HEADER_SIZE
    if off + tl + pl + prl + bl != len(rec):
        raise MessageFormatError("record lengths do not add up to its size")
    topic = bytes(rec[off : off + tl]).decode()
    off += tl
    pid = bytes(rec[off : off + pl]).decode()
    off += pl
    return RecordHeader(qid, th, born, store, seq, topic, pid, off, prl, off + prl, bl, flags)


def decode_record(rec: bytes | memoryview) -> Message:
    h = read_record_header(rec)
    props = decode_properties(rec[h.props_off : h.props_off + h.props_len])
    tags = props.pop(PROPERTY_TAGS, None)
    keys = props.pop(PROPERTY_KEYS, "")
    return Message(
        topic=h.topic,
        body=bytes(rec[h.body_off : h.body_off + h.body_len]),
        tags=tags,
        keys=keys.split() if keys else [],
        properties=props,
        flag=h.flags,
        queue_id=h.queue_id,
        born_ms=h.born_ms,
        store_ms=h.store_ms,
        producer_id=h.producer_id,
        seq=h.seq,
    )


@dataclass(slots=True)
class BatchItem:
    flag: int
    born_ms: int
    seq: int
    props: bytes
    body: bytes


def encode_batch(items: Iterable[tuple[int, int, int, bytes, bytes]]) -> bytes:
    """Items are (flag, born ms, seq, encoded properties, body)."""
    parts: list[bytes] = []
    for flag, born, seq, props, body in items:
        parts.append(_BATCH_ITEM.pack(flag, born, seq, len(props), len(body)))
        parts.append(props)
        parts.append(body)
    return b"".join(parts)


def decode_batch(body: bytes | memoryview, max_message: int) -> list[BatchItem]:
    mv = memoryview(body)
    n = len(mv)
    off = 0
    out: list[BatchItem] = []
    while off < n:
        if n - off < _BATCH_ITEM.size:
            raise MessageFormatError(f"batch item {len(out)}: truncated header at offset {off}")
        flag, born, seq, pl, bl = _BATCH_ITEM.unpack_from(mv, off)
        off += _BATCH_ITEM.size
        if bl > max_message:
            raise MessageFormatError(
                f"batch item {len(out)}: body of {bl} bytes exceeds the limit of {max_message}"
            )
        if off + pl + bl > n:
            raise MessageFormatError(f"batch item {len(out)}: truncated at offset {off}")
        out.append(BatchItem(flag, born, seq, bytes(mv[off : off + pl]), bytes(mv[off + pl : off + pl + bl])))
        off += pl + bl
    if not out:
        raise MessageFormatError("empty batch")
    return out


def batch_to_records(
    body: bytes | memoryview,
    topic: bytes,
    queue_id: int,
    producer_id: bytes,
    store_ms: int,
    max_message: int,
    tag_and_flags: Callable[[bytes, int], tuple[int, int]],
) -> list[bytes]:
    """Turn a SEND_BATCH_MESSAGE body straight into stored records (the broker's hot path).

    One pass, no intermediate objects; ``tag_and_flags(props, item number)`` is consulted only
    for items that carry properties and returns (tag hash, record flags).
    """
    mv = memoryview(body)
    n = len(mv)
    off = 0
    out: list[bytes] = []
    unpack = _BATCH_ITEM.unpack_from
    pack = _REC.pack
    tl, pl = len(topic), len(producer_id)
    while off < n:
        if n - off < _BATCH_ITEM.size:
            raise MessageFormatError(f"batch item {len(out)}: truncated header at offset {off}")
        flag, born, seq, prl, bl = unpack(mv, off)
        off += _BATCH_ITEM.size
        if bl > max_message:
            raise MessageFormatError(f"batch item {len(out)}: body of {bl} bytes exceeds the limit of {max_message}")
        end = off + prl + bl
        if end > n:
            raise MessageFormatError(f"batch item {len(out)}: truncated at offset {off}")
        props = mv[off : off + prl]
        th, flags = tag_and_flags(bytes(props), len(out)) if prl else (0, 0)
        head = pack(RECORD_MESSAGE, flags, queue_id, th, born, store_ms, seq, tl, pl, prl, bl)
        out.append(b"".join((head, topic, producer_id, mv[off:end])))
        off = end
    if not out:
        raise MessageFormatError("empty batch")
    return out


def make_position(ledger_index: int, slot: int = 0) -> int:
    """Where a message is: its ledger entry and its slot in that entry."""
    return ledger_index << SLOT_BITS | slot


def split_position(position: int) -> tuple[int, int]:
    """(ledger index, slot) of a position."""
    return position >> SLOT_BITS, position & _SLOT_MASK


def encode_batch_entry(records: Sequence[bytes | memoryview]) -> bytes:
    """Several records as one ledger entry; at most MAX_BATCH_SLOTS - 1 of them."""
    if not 0 < len(records) < MAX_BATCH_SLOTS:
        raise ValueError(f"a batch entry holds 1..{MAX_BATCH_SLOTS - 1} records, not {len(records)}")
    parts: list[bytes | memoryview] = [_BATCH_ENTRY.pack(RECORD_BATCH, len(records))]
    pack = _U32.pack
    for rec in records:
        parts.append(pack(len(rec)))
        parts.append(rec)
    return b"".join(parts)


def split_batch_entry(data: bytes | memoryview) -> list[memoryview]:
    """The records of a batch entry, as views into it; raises MessageFormatError if it is malformed."""
    mv = memoryview(data)
    n = len(mv)
    if n < _BATCH_ENTRY.size:
        raise MessageFormatError(f"batch entry of {n} bytes is shorter than its header")
    typ, count = _BATCH_ENTRY.unpack_from(mv, 0)
    if typ != RECORD_BATCH:
        raise MessageFormatError(f"not a batch entry (type {typ})")
    off = _BATCH_ENTRY.size
    out: list[memoryview] = []
    unpack = _U32.unpack_from
    for slot in range(count):
        if off + 4 > n:
            raise MessageFormatError(f"batch entry: slot {slot} of {count} truncated at offset {off}")
        (rl,) = unpack(mv, off)
        off += 4
        if off + rl > n:
            raise MessageFormatError(f"batch entry: record in slot {slot} runs past the end at offset {off}")
        out.append(mv[off : off + rl])
        off += rl
    if off != n:
        raise MessageFormatError(f"batch entry: {n - off} stray bytes after its {count} records")
    return out


def encode_pull_body(found: Sequence[tuple[int, int, bytes | memoryview]]) -> bytes:
    """(queue offset, position, record) triples -> pull response body."""
    parts: list[bytes | memoryview] = []
    for qoff, position, rec in found:
        parts.append(_PULL_ITEM.pack(len(rec), qoff, position))
        parts.append(rec)
    return b"".join(parts)


def decode_pull_body(body: bytes | memoryview, broker_name: str = "") -> list[Message]:
    mv = memoryview(body)
    n = len(mv)
    off = 0
    out: list[Message] = []
    while off < n:
        if n - off < _PULL_ITEM.size:
            raise MessageFormatError(f"pull body: truncated item header at offset {off}")
        rl, qoff, position = _PULL_ITEM.unpack_from(mv, off)
        off += _PULL_ITEM.size
        if off + rl > n:
            raise MessageFormatError(f"pull body: truncated record at offset {off}")
        m = decode_record(mv[off : off + rl])
        m.queue_offset = qoff
        m.ledger_index = position >> SLOT_BITS
        m.msg_id = make_msg_id(broker_name, position) if broker_name else ""
        out.append(m)
        off += rl
    return out


def make_msg_id(broker_name: str, position: int) -> str:
    """Message ids name the broker group and the position: stable across failovers."""
    return f"{broker_name}:{position:020X}"


def parse_msg_id(msg_id: str) -> tuple[str, int]:
    """(broker name, position) of a message id."""
    name, sep, pos = msg_id.rpartition(":")
    try:
        if not sep or not name or not pos:
            raise ValueError
        return name, int(pos, 16)
    except ValueError:
        raise MessageFormatError(
            f"bad message id {msg_id!r}: expected <broker name>:<hex position>"
        ) from None
