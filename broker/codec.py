"""What a broker's ledger entries hold: the one module that knows how records are encoded.

A ledger entry written by a broker is either RocketMQ-encoded messages or a metadata record
(``broker.meta``). A message entry is one stored message record or several back to back
(a producer's batch), exactly as RocketMQ's commit log lays them out
(``remoting.message``: total size, magic code 0xDAA320A7, body CRC, queue id, ...), so a
pull serves the bytes of the log; only the queue offset and the physical offset, which
are known once the entry is applied, are filled in when a record is served.

A message's *position* (its physical offset, and with the store host its message id) is
its ledger index and its slot in the entry: ``index << SLOT_BITS | slot``, the same on
every broker of the group, so ids survive failovers.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from remoting.message import (
    MAX_BATCH_SLOTS,
    MESSAGE_MAGIC_CODE,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    SLOT_BITS,
    STORED_HEADER_SIZE,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    MessageFormatError,
    build_stored_record,
    java_string_hash,
    make_position,
    properties_from_bytes,
    property_value,
    split_position,
    stored_record_fields,
)

from .meta import RECORD_META

KIND_MESSAGE = 1
KIND_META = RECORD_META
KIND_DERIVED = 3  # records the broker made from earlier ones, each with its origin (see encode_derived)
ORIGIN_SCHEDULED = b"S"  # + the scheduled message's position: it came due
ORIGIN_HALF = b"T"  # + the half message's position: its transaction committed
ORIGIN_SEND_BACK = b"R"  # + position, reconsume times, group: a consumer sent it back
MAX_ORIGIN_BYTES = 1024
KEYS_PER_INDEX_ENTRY = 64  # positions remembered per (topic, key)
TAG_CACHE_ENTRIES = 4096  # tag -> Java hash, so the dispatcher hashes each distinct tag once

CodecError = MessageFormatError
Record = bytes | memoryview

MAGIC = MESSAGE_MAGIC_CODE.to_bytes(4, "big", signed=True)
"""Bytes 4..8 of a message entry (a stored record's magic code); no metadata record starts so."""
_MAGIC = MAGIC
_SIZE_MAGIC = struct.Struct(">I4s")  # a stored record's total size and magic code
_TAGS = PROPERTY_TAGS.encode()
_KEYS_PROBE = PROPERTY_KEYS.encode() + b"\x01"
_UNIQ = PROPERTY_UNIQ_KEY.encode()
_tag_codes: dict[bytes, int] = {}

__all__ = [
    "KIND_MESSAGE",
    "MAGIC",
    "KIND_META",
    "KIND_DERIVED",
    "encode_derived",
    "derived_parts",
    "SLOT_BITS",
    "CodecError",
    "build_stored_record",
    "entry_kind",
    "entry_records",
    "make_position",
    "pack_entries",
    "entry_store_ms",
    "properties_in_place",
    "parse_record",
    "record_count",
    "record_keys",
    "record_queue",
    "record_store_ms",
    "split_position",
    "tag_code",
]


def entry_kind(data: Record) -> int:
    """KIND_MESSAGE for RocketMQ records, else the metadata type byte (0 for an empty entry)."""
    if len(data) >= 8 and data[4:8] == _MAGIC:
        return KIND_MESSAGE
    return data[0] if data else 0


def encode_derived(items: Sequence[tuple[bytes, bytes]]) -> bytes:
    """A derived entry: (origin, record) pairs the broker made from earlier entries (a scheduled
    message come due, a committed half message, a consumer's send-back). Each origin names
    what its record resolves; applying it is a no-op when that was resolved already (the
    old master proposed it, the new one again), so each record is stored exactly once.

    Layout: kind byte, record count (u16), each origin (u16 length, bytes), then the records
    back to back as in a message entry; slots are numbered as in a message entry."""
    if not 0 < len(items) < MAX_BATCH_SLOTS:
        raise ValueError(f"a derived entry holds 1..{MAX_BATCH_SLOTS - 1} records, got {len(items)}")
    parts = [bytes((KIND_DERIVED,)), len(items).to_bytes(2, "big")]
    for origin, _ in items:
        if not 0 < len(origin) <= MAX_ORIGIN_BYTES:
            raise ValueError(f"an origin key must be 1..{MAX_ORIGIN_BYTES} bytes")
        parts += [len(origin).to_bytes(2, "big"), origin]
    parts += [record for _, record in items]
    return b"".join(parts)


def derived_parts(data: Record) -> tuple[list[bytes], list[Record]]:
    """(origins, records) of a derived entry; CodecError if it is malformed."""
    n = len(data)
    if n < 3 or data[0] != KIND_DERIVED:
        raise CodecError("not a derived entry")
    count = int.from_bytes(data[1:3], "big")
    off = 3
    origins: list[bytes] = []
    for _ in range(count):
        if off + 2 > n:
            raise CodecError("derived entry: truncated origin list")
        length = int.from_bytes(data[off : off + 2], "big")
        origins.append(bytes(data[off + 2 : off + 2 + length]))
        off += 2 + length
    records = _records_from(memoryview(data), off, n)
    if len(records) != count or not all(origins):
        raise CodecError(f"derived entry: {len(origins)} origins for {len(records)} records")
    return origins, records


def _records_from(data: memoryview, off: int, n: int) -> list[Record]:
    """Records back to back in ``data[off:n]``; CodecError at the first that does not fit."""
    out: list[Record] = []
    unpack = _SIZE_MAGIC.unpack_from
    while off < n:
        if n - off < 8:
            raise CodecError(f"message entry: truncated record at byte {off}")
        size, magic = unpack(data, off)
        if size < 8 or off + size > n or magic != _MAGIC:
            raise CodecError(f"message entry: bad record of size {size} at byte {off}")
        out.append(data[off : off + size])
        off += size
    return out


def entry_records(data: Record) -> Sequence[Record]:
    """The records of a message or derived entry, slot by slot (views, nothing copied);
    CodecError if it is malformed."""
    n = len(data)
    if n >= 8 and int.from_bytes(data[0:4], "big") == n and data[4:8] == _MAGIC:
        return (data,)  # the common case: one message
    kind = entry_kind(data)
    if kind == KIND_DERIVED:
        return derived_parts(data)[1]
    if kind != KIND_MESSAGE:
        raise CodecError(f"ledger entry of type {entry_kind(data)} holds no message records")
    return _records_from(memoryview(data), 0, n)


def record_count(data: Record) -> int:
    """How many records a message entry holds, as ``len(entry_records(data))`` but without
    making a view per record (an answer to a batch send only needs the count); CodecError
    on the same entries."""
    n = len(data)
    if n >= 8 and int.from_bytes(data[0:4], "big") == n and data[4:8] == _MAGIC:
        return 1
    if entry_kind(data) == KIND_DERIVED:
        return len(derived_parts(data)[1])
    if entry_kind(data) != KIND_MESSAGE:
        raise CodecError(f"ledger entry of type {entry_kind(data)} holds no message records")
    count = 0
    off = 0
    while off < n:
        if n - off < 8:
            raise CodecError(f"message entry: truncated record at byte {off}")
        size = int.from_bytes(data[off : off + 4], "big")
        if size < 8 or off + size > n or data[off + 4 : off + 8] != _MAGIC:
            raise CodecError(f"message entry: bad record of size {size} at byte {off}")
        count += 1
        off += size
    return count


def tag_code(tags: bytes | None) -> int:
    """RocketMQ's tags code (Java ``String.hashCode`` of the TAGS property), 0 without tags,
    as an unsigned 32-bit value for the consume queue's array."""
    if not tags:
        return 0
    code = _tag_codes.get(tags)
    if code is None:
        code = java_string_hash(tags.decode("utf-8", "replace")) & 0xFFFFFFFF
        if len(_tag_codes) >= TAG_CACHE_ENTRIES:
            _tag_codes.clear()
        _tag_codes[tags] = code
    return code


_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
_TAGS_PROBE = _TAGS + b"\x01"
_UNIQ_PROBE = _UNIQ + b"\x01"


def _prop(rec: bytes, probe: bytes, start: int, end: int) -> bytes | None:
    """The value of one property in ``rec[start:end]`` (``key\x01value\x02`` text), found in place."""
    i = rec.find(probe, start, end)
    while i > start and rec[i - 1] != 2:
        i = rec.find(probe, i + 1, end)
    if i < 0:
        return None
    i += len(probe)
    j = rec.find(b"\x02", i, end)
    return rec[i : end if j < 0 else j]


def parse_record(rec: Record) -> tuple[bytes, int, int, bytes | None, bytes | None]:
    """(raw topic, queue id, tags code, UNIQ_KEY or None, properties if they carry KEYS).

    The dispatcher's hot path, run for every message on every broker: a few fixed-offset
    reads, the topic, and two properties looked up in place. Raises CodecError when the
    record's lengths do not add up.
    """
    if type(rec) is not bytes:
        rec = bytes(rec)
    n = len(rec)
    if n < STORED_HEADER_SIZE + 3 or int.from_bytes(rec[36:40], "big") & _V6 or rec[4:8] != _MAGIC:
        qid, _store, _sys, topic, props_view, _body = stored_record_fields(rec)  # IPv6 hosts, or broken
        props = bytes(props_view)
        tags = property_value(props, _TAGS) if props else None
        uniq = property_value(props, _UNIQ) if props else None
        return topic, qid, tag_code(tags), uniq, props if props and _KEYS_PROBE in props else None
    p = STORED_HEADER_SIZE + int.from_bytes(rec[84:88], "big", signed=True)
    if p >= n:
        raise CodecError(f"stored record of {n} bytes: body length runs past its end")
    tlen = rec[p]
    topic = rec[p + 1 : p + 1 + tlen]
    p += 1 + tlen
    if p + 2 > n or p + 2 + (rec[p] << 8 | rec[p + 1]) != n:
        raise CodecError(f"stored record lengths do not add up to its {n} bytes")
    p += 2
    qid = int.from_bytes(rec[12:16], "big", signed=True)
    if p == n:
        return topic, qid, 0, None, None
    tags = _prop(rec, _TAGS_PROBE, p, n)
    uniq = _prop(rec, _UNIQ_PROBE, p, n)
    keyed = rec[p:] if rec.find(_KEYS_PROBE, p) >= 0 else None
    return topic, qid, tag_code(tags), uniq, keyed


RECORD_FIXED = struct.Struct(">i4s4xi20xi16xq20xi")
"""A stored record's total size, magic code, queue id, sys flag, store time (IPv4 hosts) and
body length, in one unpack."""
V6_FLAGS = _V6
UNIQ_PROBE = _UNIQ_PROBE


def entry_store_ms(data: bytes) -> int:
    """When the master stored the first record of a message entry (ms since the epoch)."""
    at = 68 if int.from_bytes(data[36:40], "big") & SYSFLAG_BORNHOST_V6 else 56  # after the born host
    return int.from_bytes(data[at : at + 8], "big", signed=True)


def properties_in_place(data: bytes, start: int, end: int) -> tuple[int, bytes | None, bytes | None]:
    """(tags code, UNIQ_KEY or None, the properties if they carry KEYS) of the properties
    text ``data[start:end]``, looked up in place."""
    tags = _prop(data, _TAGS_PROBE, start, end)
    uniq = _prop(data, _UNIQ_PROBE, start, end)
    keyed = data[start:end] if data.find(_KEYS_PROBE, start, end) >= 0 else None
    return tag_code(tags), uniq, keyed


def record_keys(props: Record) -> list[str]:
    """The message keys in a record's properties (none if they do not decode)."""
    try:
        return properties_from_bytes(props).get(PROPERTY_KEYS, "").split()
    except ValueError:
        return []


def record_queue(rec: Record) -> tuple[str, int]:
    """(topic, queue id) of a record; CodecError if it is not a well-formed message record."""
    qid, _store, _sys, topic, _props, _body = stored_record_fields(rec)
    return topic.decode(), qid


def record_store_ms(rec: Record) -> int:
    """When the master stored the record (ms since the epoch)."""
    return stored_record_fields(rec)[1]


def pack_entries(records: Sequence[bytes], max_entry_bytes: int) -> list[bytes]:
    """Pack a producer batch's records into as few ledger entries as the entry size allows
    (records back to back, at most MAX_BATCH_SLOTS - 1 per entry)."""
    out: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    for rec in records:
        if chunk and (size + len(rec) > max_entry_bytes or len(chunk) == MAX_BATCH_SLOTS - 1):
            out.append(b"".join(chunk))
            chunk = []
            size = 0
        chunk.append(rec)
        size += len(rec)
    if chunk:
        out.append(b"".join(chunk))
    return out
