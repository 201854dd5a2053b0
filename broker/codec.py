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
    "SLOT_BITS",
    "CodecError",
    "build_stored_record",
    "entry_kind",
    "entry_records",
    "make_position",
    "pack_entries",
    "parse_entry",
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


def entry_records(data: Record) -> Sequence[Record]:
    """The records of a message entry, slot by slot (views, nothing copied); CodecError if it
    is malformed."""
    n = len(data)
    if n >= 8 and int.from_bytes(data[0:4], "big") == n and data[4:8] == _MAGIC:
        return (data,)  # the common case: one message
    if entry_kind(data) != KIND_MESSAGE:
        raise CodecError(f"ledger entry of type {entry_kind(data)} holds no message records")
    data = memoryview(data)
    out: list[Record] = []
    append = out.append
    unpack = _SIZE_MAGIC.unpack_from
    off = 0
    while off < n:
        if n - off < 8:
            raise CodecError(f"message entry: truncated record at byte {off}")
        size, magic = unpack(data, off)
        if size < 8 or off + size > n or magic != _MAGIC:
            raise CodecError(f"message entry: bad record of size {size} at byte {off}")
        append(data[off : off + size])
        off += size
    return out


def record_count(data: Record) -> int:
    """How many records a message entry holds, as ``len(entry_records(data))`` but without
    making a view per record (an answer to a batch send only needs the count); CodecError
    on the same entries."""
    n = len(data)
    if n >= 8 and int.from_bytes(data[0:4], "big") == n and data[4:8] == _MAGIC:
        return 1
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


_FIXED = struct.Struct(">i4s4xi20xi44xi")  # total size, magic, queue id, sys flag, body length
Parsed = tuple[bytes, int, int, bytes | None, bytes | None, int]
"""(raw topic, queue id, tags code, UNIQ_KEY, properties if keyed, record size)."""


def parse_entry(data: Record) -> list[Parsed | CodecError]:
    """Every record of a message entry parsed in one pass over the entry (no per-record copy):
    the dispatcher's hot path, run for every message on every broker. A record whose own
    lengths do not add up is a CodecError in its slot; CodecError is raised when the entry's
    record boundaries themselves are broken (then no slot can be trusted)."""
    if type(data) is not bytes:
        data = bytes(data)
    n = len(data)
    if n < 8 or data[4:8] != _MAGIC:  # not KIND_MESSAGE
        raise CodecError(f"ledger entry of type {entry_kind(data)} holds no message records")
    out: list[Parsed | CodecError] = []
    unpack = _FIXED.unpack_from
    find = data.find
    off = 0
    while off < n:
        if n - off < STORED_HEADER_SIZE + 3:
            if n - off >= 8 and data[off + 4 : off + 8] == _MAGIC:
                size = int.from_bytes(data[off : off + 4], "big")
                if STORED_HEADER_SIZE > size and off + size <= n:
                    out.append(CodecError(f"stored record of {size} bytes is truncated"))
                    off += size
                    continue
            raise CodecError(f"message entry: truncated record at byte {off}")
        size, magic, qid, sysflag, blen = unpack(data, off)
        end = off + size
        if size < 8 or end > n or magic != _MAGIC:
            raise CodecError(f"message entry: bad record of size {size} at byte {off}")
        if sysflag & _V6:
            try:
                topic, qid, code, uniq, keyed = parse_record(data[off:end])
            except CodecError as exc:
                out.append(exc)
            else:
                out.append((topic, qid, code, uniq, keyed, size))
            off = end
            continue
        p = off + STORED_HEADER_SIZE + blen
        if blen < 0 or p + 3 > end:
            out.append(CodecError(f"stored record at byte {off}: body length {blen} runs past its end"))
            off = end
            continue
        tlen = data[p]
        topic = data[p + 1 : p + 1 + tlen]
        p += 1 + tlen
        if p + 2 > end or p + 2 + (data[p] << 8 | data[p + 1]) != end:
            out.append(CodecError(f"stored record at byte {off}: lengths do not add up to its {size} bytes"))
            off = end
            continue
        p += 2
        if p == end:
            out.append((topic, qid, 0, None, None, size))
        elif data.startswith(_UNIQ_PROBE, p) and find(b"\x02", p, end) == end - 1:
            # Only a UNIQ_KEY: what producers send when a message has no tags, keys or properties.
            out.append((topic, qid, 0, data[p + len(_UNIQ_PROBE) : end - 1], None, size))
        else:
            tags = _prop(data, _TAGS_PROBE, p, end)
            uniq = _prop(data, _UNIQ_PROBE, p, end)
            keyed = data[p:end] if find(_KEYS_PROBE, p, end) >= 0 else None
            out.append((topic, qid, tag_code(tags), uniq, keyed, size))
        off = end
    return out


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
