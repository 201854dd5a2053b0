"""Messages as producers send them, as the commit log stores them and as consumers pull them,
in Apache RocketMQ's formats (``MessageDecoder``), so RocketMQ clients and ours read the same bytes:

* properties: ``key \x01 value \x02`` repeated (``MessageDecoder.messageProperties2String``);
* the stored message record, as the commit log holds it and PULL bodies carry it, one after
  another (big endian)::

      i32 total size | i32 magic 0xDAA320A7 | i32 body CRC (CRC32 & 0x7FFFFFFF) | i32 queue id |
      i32 flag | i64 queue offset | i64 physical offset | i32 sys flag | i64 born ms |
      born host (4-byte IPv4 + i32 port; 16-byte IPv6 if sys flag bit 4) | i64 store ms |
      store host (likewise, sys flag bit 5) | i32 reconsume times | i64 prepared tx offset |
      i32 body len | body | u8 topic len | topic | i16 properties len | properties

* a SEND_BATCH_MESSAGE body: ``i32 total size | i32 magic (0) | i32 body CRC (0) | i32 flag |
  i32 body len | body | i16 properties len | properties`` per message
  (``MessageDecoder.encodeMessage``);
* the offset message id: 32 upper-case hex digits of store host (IPv4 + port) and physical
  offset (56 for an IPv6 host), which ``VIEW_MESSAGE_BY_ID`` resolves.

A ledgermq broker's physical offset is a message's *position*: its ledger index and its slot
in the entry (``index << 16 | slot``), the same on every member of the group.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import struct
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from zlib_ng.zlib_ng import crc32  # zlib's CRC-32, SIMD-accelerated: 5x faster on 1 KiB bodies

SLOT_BITS = 16
MAX_BATCH_SLOTS = 1 << SLOT_BITS
_SLOT_MASK = MAX_BATCH_SLOTS - 1

PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"


class MessageFormatError(ValueError):
    """A record or batch could not be decoded; says what and at which offset."""


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
    # RocketMQ's stored-record fields (filled in when decoded from a RocketMQ pull body):
    sys_flag: int = 0
    body_crc: int = 0
    physical_offset: int = -1
    born_host: str = ""
    store_host: str = ""
    reconsume_times: int = 0
    prepared_tx_offset: int = 0
    offset_msg_id: str = ""
    store_size: int = 0
    # Set when a pulled record's body could not be decoded (a compressed flag on a body that
    # does not inflate, or inflates past MAX_INFLATED_BODY_BYTES): the body is then the stored
    # bytes as they are, and the messages around it are delivered as usual.
    decode_error: str = ""

    @property
    def unique_key(self) -> str:
        """The producer-assigned id (RocketMQ's UNIQ_KEY property), '' when absent."""
        return self.properties.get(PROPERTY_UNIQ_KEY, "")

    def all_properties(self) -> dict[str, str]:
        props = dict(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            props[PROPERTY_KEYS] = " ".join(self.keys)
        return props


def make_position(ledger_index: int, slot: int = 0) -> int:
    """Where a message is: its ledger entry and its slot in that entry."""
    return ledger_index << SLOT_BITS | slot


def split_position(position: int) -> tuple[int, int]:
    """(ledger index, slot) of a position."""
    return position >> SLOT_BITS, position & _SLOT_MASK


# ======================================================================================
# RocketMQ's formats
# ======================================================================================
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_WAIT = "WAIT"
PROPERTY_DELAY = "DELAY"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_TRAN_MSG = "TRAN_MSG"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"  # where a scheduled or half message goes when due / committed
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_PRODUCER_GROUP = "PGROUP"  # a transactional message's producer group (checks go to it)
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"  # a retried message's original topic
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_CHECK_IMMUNITY_TIME = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # RocketMQ 5: deliver at this time (ms since the epoch)
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"  # ... or this long after the send
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"  # when a scheduled message is due, as the broker decided it

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7: one-byte topic length
MESSAGE_MAGIC_CODE_V2 = -626843477  # 0xDAA320AB: two-byte topic length (5.x, topics > 127 bytes)

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_PREPARED = 0x1 << 2
SYSFLAG_TRANSACTION_COMMIT = 0x2 << 2
SYSFLAG_TRANSACTION_ROLLBACK = 0x3 << 2
SYSFLAG_TRANSACTION_MASK = 0x3 << 2
SYSFLAG_BORNHOST_V6 = 0x1 << 4
SYSFLAG_STOREHOST_V6 = 0x1 << 5
SYSFLAG_COMPRESSION_TYPE_MASK = 0x7 << 8
SYSFLAG_COMPRESSION_ZLIB = 0x3 << 8

MAX_INFLATED_BODY_BYTES = 64 << 20
"""The most a compressed body may inflate to: brokers refuse larger at send, consumers do not
inflate past it (a small zlib stream can expand a thousandfold)."""
_INFLATE_CHUNK = 1 << 20


def inflate_body(
    body: bytes | memoryview, limit: int = MAX_INFLATED_BODY_BYTES, *, keep: bool = True
) -> bytes:
    """A compressed (zlib) message body inflated; MessageFormatError if it is not a whole
    zlib stream or would pass ``limit`` bytes. ``keep=False`` only checks it (the output is
    dropped chunk by chunk, so checking costs no memory beyond a chunk)."""
    d = zlib.decompressobj()
    parts: list[bytes] = []
    total = 0
    data = bytes(body)
    try:
        while True:
            chunk = d.decompress(data, _INFLATE_CHUNK)
            total += len(chunk)
            if total > limit:
                raise MessageFormatError(f"compressed body inflates past {limit} bytes")
            if keep:
                parts.append(chunk)
            data = d.unconsumed_tail
            if d.eof or not (data or chunk):
                break
        if not d.eof or d.unused_data:
            raise MessageFormatError("compressed body is not one whole zlib stream")
    except zlib.error as exc:
        raise MessageFormatError(f"compressed body does not inflate: {exc}") from None
    return b"".join(parts)


MAX_PULL_FRAME_BYTES = 16 << 20
"""The body a client accepts in one response: RocketMQ's default frameMaxLength (16 MiB), so a
pull answer carrying one message of the broker's largest size always fits."""
MAX_RECORD_OVERHEAD = 64 << 10
"""What a stored record may add to its body: header, topic and properties (at most 32 KiB)."""

MAX_PROPERTIES_BYTES = 0x7FFF
"""RocketMQ writes the properties length as a Java short."""
MAX_TOPIC_BYTES = 127
"""A one-byte topic length (magic code V1), as RocketMQ 4.x stores it."""

# Stored record, IPv4 hosts: everything up to the body length, then body, topic, properties.
STORED_HEADER = struct.Struct(">iiiiiqqiq8sq8siqi")
STORED_HEADER_SIZE = STORED_HEADER.size  # 88
STORED_QUEUE_OFFSET_AT = 20
STORED_PHYSICAL_OFFSET_AT = 28
STORED_STORE_TIMESTAMP_AT = 56
STORED_STORE_HOST_AT = 64
_STORED_FIXED = struct.Struct(">iiiiiqqiq")  # through born timestamp: 48 bytes
_I32BE = struct.Struct(">i")
_I16BE = struct.Struct(">h")
_I64BE = struct.Struct(">q")
_HOST4 = struct.Struct(">4si")
_BATCH_HEAD = struct.Struct(">iiiii")  # total size, magic, body CRC, flag, body len
BATCH_ITEM_OVERHEAD = _BATCH_HEAD.size + 2


def body_crc(body: bytes | memoryview) -> int:
    """RocketMQ's body CRC: CRC32 masked to a non-negative Java int (``UtilAll.crc32``)."""
    return crc32(body) & 0x7FFFFFFF


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (RocketMQ's tags code and subscription code set use it)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def properties_to_bytes(props: Mapping[str, str]) -> bytes:
    """``key\x01value\x02`` per property; refuses names or values holding the separators."""
    if not props:
        return b""
    pairs = [
        (key, value if type(value) is str else str(value))
        for key, value in props.items()
        if value is not None
    ]
    text = "".join([f"{key}\x01{value}\x02" for key, value in pairs])
    # Each pair adds exactly one of each separator; any extra came from a name or a value.
    if text.count("\x01") != len(pairs) or text.count("\x02") != len(pairs) or any(not k for k, _ in pairs):
        bad = next(k for k, v in pairs if not k or any(c in k or c in v for c in "\x01\x02"))
        raise MessageFormatError(
            f"property {bad!r}: names must be non-empty and neither name nor value may contain "
            "the characters \\x01 or \\x02"
        )
    raw = text.encode()
    if len(raw) > MAX_PROPERTIES_BYTES:
        raise MessageFormatError(f"properties of {len(raw)} bytes exceed RocketMQ's {MAX_PROPERTIES_BYTES}")
    return raw


def properties_from_bytes(raw: bytes | memoryview, where: str = "properties") -> dict[str, str]:
    """Parse ``key\x01value\x02`` text; an item without a separator is refused, naming where."""
    if not raw:
        return {}
    try:
        text = str(raw, "utf-8")
    except UnicodeDecodeError as exc:
        raise MessageFormatError(f"{where}: not UTF-8: {exc}") from None
    props: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        if not item:
            continue
        key, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if not sep or not key:
            raise MessageFormatError(f"{where}: item {item[:40]!r} is not name\\x01value")
        props[key] = value
    return props


def host_to_bytes(host: str) -> bytes:
    """``"ip:port"`` -> RocketMQ's socket-address bytes (4- or 16-byte address, then i32 port)."""
    addr, sep, port = host.rpartition(":")
    try:
        if not sep:
            raise ValueError("no port")
        ip = ipaddress.ip_address(addr.strip("[]"))
        return ip.packed + _I32BE.pack(int(port))
    except (ValueError, struct.error) as exc:
        raise MessageFormatError(f"host {host!r} is not ip:port ({exc})") from None


def host_from_bytes(raw: bytes | memoryview) -> str:
    ip = ipaddress.ip_address(bytes(raw[:-4]))
    (port,) = _I32BE.unpack_from(raw, len(raw) - 4)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def offset_msg_id(store_host: bytes, physical_offset: int) -> str:
    """RocketMQ's offset message id: hex of the store host bytes and the physical offset."""
    return (bytes(store_host) + _I64BE.pack(physical_offset)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """(store host "ip:port", physical offset) of an offset message id (32 or 56 hex digits)."""
    if len(msg_id) not in (32, 56):
        raise MessageFormatError(f"message id {msg_id!r}: expected 32 or 56 hex digits, got {len(msg_id)}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise MessageFormatError(f"message id {msg_id!r} is not hexadecimal") from None
    (offset,) = _I64BE.unpack_from(raw, len(raw) - 8)
    return host_from_bytes(raw[:-8]), offset


def encode_stored_message(
    *,
    topic: str,
    body: bytes | memoryview,
    properties: bytes,
    queue_id: int,
    flag: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    sys_flag: int = 0,
    born_ms: int = 0,
    born_host: bytes = b"\x00" * 8,
    store_ms: int = 0,
    store_host: bytes = b"\x00" * 8,
    reconsume_times: int = 0,
    prepared_tx_offset: int = 0,
    crc: int | None = None,
) -> bytes:
    """One stored message record, as RocketMQ's commit log holds it and PULL bodies carry it."""
    raw_topic = topic.encode()
    if not 0 < len(raw_topic) <= MAX_TOPIC_BYTES:
        raise MessageFormatError(f"topic {topic!r}: 1..{MAX_TOPIC_BYTES} bytes in a stored record")
    if len(properties) > MAX_PROPERTIES_BYTES:
        raise MessageFormatError(f"properties of {len(properties)} bytes exceed {MAX_PROPERTIES_BYTES}")
    v6_born, v6_store = len(born_host) == 20, len(store_host) == 20
    if len(born_host) not in (8, 20) or len(store_host) not in (8, 20):
        raise MessageFormatError("hosts must be 8 (IPv4) or 20 (IPv6) bytes")
    sys_flag = sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    sys_flag |= (SYSFLAG_BORNHOST_V6 if v6_born else 0) | (SYSFLAG_STOREHOST_V6 if v6_store else 0)
    size = STORED_HEADER_SIZE + (12 if v6_born else 0) + (12 if v6_store else 0)
    size += len(body) + 1 + len(raw_topic) + 2 + len(properties)
    parts = [
        _STORED_FIXED.pack(
            size,
            MESSAGE_MAGIC_CODE,
            body_crc(body) if crc is None else crc,
            queue_id,
            flag,
            queue_offset,
            physical_offset,
            sys_flag,
            born_ms,
        ),
        born_host,
        _I64BE.pack(store_ms),
        store_host,
        struct.pack(">iqi", reconsume_times, prepared_tx_offset, len(body)),
        body,
        bytes((len(raw_topic),)),
        raw_topic,
        _I16BE.pack(len(properties)),
        properties,
    ]
    return b"".join(parts)


_HOSTS: dict[bytes, str] = {}  # socket-address bytes -> "ip:port" (a handful of brokers and clients)
_HOSTS_MAX = 4096


def _host(raw: bytes) -> str:
    text = _HOSTS.get(raw)
    if text is None:
        text = host_from_bytes(raw)
        if len(_HOSTS) < _HOSTS_MAX:
            _HOSTS[raw] = text
    return text


_HOST_IDS: dict[bytes, str] = {}  # store-host bytes -> their upper-case hex (offset message ids)
_PHYS_AT = STORED_PHYSICAL_OFFSET_AT
_V6_HOSTS = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6


def _host_id(raw: bytes) -> str:
    text = raw.hex().upper()
    if len(_HOST_IDS) < _HOSTS_MAX:
        _HOST_IDS[raw] = text
    return text


_TOPICS: dict[bytes, str] = {}  # raw topic -> name, for decoding pulls without a decode per message
_TOPICS_MAX = 4096
_UNIQ_ONLY_PREFIX = b"UNIQ_KEY\x01"
_UNIQ_ONLY_LEN = len(_UNIQ_ONLY_PREFIX) + 32 + 1  # a RocketMQ client id: 32 hex digits


def decode_stored_messages(
    data: bytes | memoryview, *, verify_crc: bool = False, max_messages: int = 1 << 20
) -> list[Message]:
    """Every stored record in ``data`` (a PULL body) as Messages; MessageFormatError says where it broke.

    Tags and keys come out of the properties into their own fields (as on the send side);
    a compressed body (sys flag bit 0, zlib) is inflated. ``msg_id`` is the offset message id.
    """
    b = data if type(data) is bytes else bytes(data)
    n = len(b)
    off = 0
    out: list[Message] = []
    unpack4 = _RECORD_HEAD4.unpack_from
    head4 = _RECORD_HEAD4.size
    hosts, host_ids = _HOSTS, _HOST_IDS
    while off < n:
        if len(out) >= max_messages:
            raise MessageFormatError(f"pull body holds more than {max_messages} messages")
        if n - off < head4:
            if n - off < _STORED_FIXED.size:
                raise MessageFormatError(f"stored message {len(out)} at byte {off}: truncated header")
            size = sysflag = -1  # shorter than an IPv4 header: the general parser says what is wrong
        else:
            (
                size,
                magic,
                crc,
                qid,
                flag,
                qoff,
                phys,
                sysflag,
                born,
                born_host,
                store_ms,
                store_host,
                reconsume,
                prepared,
                blen,
            ) = unpack4(b, off)  # read as IPv4 at once; the checks below send anything else aside
        if sysflag < 0 or sysflag & _V6_HOSTS or size < STORED_HEADER_SIZE + 3 or off + size > n:
            msg = _decode_stored_slow(b, off, len(out), verify_crc)
            out.append(msg)
            off += msg.store_size
            continue
        end = off + size
        p = off + STORED_HEADER_SIZE
        if magic != MESSAGE_MAGIC_CODE:
            if magic == MESSAGE_MAGIC_CODE_V2:
                out.append(_decode_stored_slow(b, off, len(out), verify_crc))
                off = end
                continue
            raise MessageFormatError(
                f"stored message {len(out)} at byte {off}: bad magic code {magic & 0xFFFFFFFF:#010x}"
            )
        if blen < 0 or p + blen + 3 > end:
            raise MessageFormatError(
                f"stored message {len(out)} at byte {off}: body length {blen} runs past the record"
            )
        body = b[p : p + blen]
        p += blen
        if verify_crc and crc32(body) & 0x7FFFFFFF != crc:
            raise MessageFormatError(f"stored message {len(out)} at byte {off}: body CRC mismatch")
        tlen = b[p]
        raw_topic = b[p + 1 : p + 1 + tlen]
        topic = _TOPICS.get(raw_topic)
        if topic is None:
            topic = raw_topic.decode()
            if len(_TOPICS) < _TOPICS_MAX:
                _TOPICS[raw_topic] = topic
        p += 1 + tlen
        plen = b[p] << 8 | b[p + 1] if p + 1 < end else -1
        p += 2
        if plen < 0 or p + plen != end:
            raise MessageFormatError(
                f"stored message {len(out)} at byte {off}: properties length {plen} does not end the record"
            )
        if (
            plen == _UNIQ_ONLY_LEN
            and b.startswith(_UNIQ_ONLY_PREFIX, p)
            and b[end - 1] == 2
            and (uniq := b[p + len(_UNIQ_ONLY_PREFIX) : end - 1]).isalnum()
        ):
            # What producers send for a message without tags, keys or properties: its id alone.
            props = {PROPERTY_UNIQ_KEY: uniq.decode("ascii")}
        elif plen:
            props = properties_from_bytes(b[p:end], f"stored message {len(out)} at byte {off}: properties")
        else:
            props = {}
        decode_error = ""
        if sysflag & SYSFLAG_COMPRESSED:
            try:
                body = inflate_body(body)
            except MessageFormatError as exc:
                decode_error = f"stored message {len(out)} at byte {off}: {exc}"
        tags = props.pop(PROPERTY_TAGS, None)
        keys = props.pop(PROPERTY_KEYS, "")
        # the offset message id: store host in hex (cached per host), then the offset's 16 digits,
        # which are the record's own big-endian bytes at STORED_PHYSICAL_OFFSET_AT
        msg_id = (host_ids.get(store_host) or _host_id(store_host)) + b[
            off + _PHYS_AT : off + _PHYS_AT + 8
        ].hex().upper()
        out.append(
            Message(
                topic,
                body,
                tags,
                keys.split() if keys else [],
                props,
                flag,
                qid,
                qoff,
                -1,
                born,
                store_ms,
                "",
                0,
                msg_id,
                sysflag,
                crc,
                phys,
                hosts.get(born_host) or _host(born_host),
                hosts.get(store_host) or _host(store_host),
                reconsume,
                prepared,
                msg_id,
                size,
                decode_error,
            )
        )
        off = end
    return out


def _decode_stored_slow(b: bytes, off: int, count: int, verify_crc: bool) -> Message:
    """One record the fast path does not take (IPv6 hosts, a two-byte topic length, or damage)."""
    where = f"stored message {count} at byte {off}"
    n = len(b)
    size, magic, crc, qid, flag, qoff, phys, sysflag, born = _STORED_FIXED.unpack_from(b, off)
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        raise MessageFormatError(f"{where}: bad magic code {magic & 0xFFFFFFFF:#010x}")
    if size < STORED_HEADER_SIZE or off + size > n:
        raise MessageFormatError(f"{where}: size {size} runs past the {n}-byte body")
    rec = memoryview(b)[off : off + size]
    try:
        p = _STORED_FIXED.size
        hl = 20 if sysflag & SYSFLAG_BORNHOST_V6 else 8
        born_host = bytes(rec[p : p + hl])
        p += hl
        (store_ms,) = _I64BE.unpack_from(rec, p)
        p += 8
        sl = 20 if sysflag & SYSFLAG_STOREHOST_V6 else 8
        store_host = bytes(rec[p : p + sl])
        p += sl
        reconsume, prepared, blen = struct.unpack_from(">iqi", rec, p)
        p += 16
        if blen < 0 or p + blen > size:
            raise MessageFormatError(f"{where}: body length {blen} runs past the record")
        body = bytes(rec[p : p + blen])
        p += blen
        if verify_crc and body_crc(body) != crc:
            raise MessageFormatError(f"{where}: body CRC mismatch")
        if magic == MESSAGE_MAGIC_CODE:
            tlen = rec[p]
            p += 1
        else:
            (tlen,) = _I16BE.unpack_from(rec, p)
            p += 2
        topic = str(rec[p : p + tlen], "utf-8")
        p += tlen
        (plen,) = _I16BE.unpack_from(rec, p)
        p += 2
        if plen < 0 or p + plen != size:
            raise MessageFormatError(f"{where}: properties length {plen} does not end the record")
        props = properties_from_bytes(rec[p : p + plen], f"{where}: properties")
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, MessageFormatError):
            raise
        raise MessageFormatError(f"{where}: {exc}") from None
    decode_error = ""
    if sysflag & SYSFLAG_COMPRESSED:
        try:
            body = inflate_body(body)
        except MessageFormatError as exc:
            decode_error = f"{where}: {exc}"
    tags = props.pop(PROPERTY_TAGS, None)
    keys = props.pop(PROPERTY_KEYS, "")
    msg_id = offset_msg_id(store_host, phys)
    msg = Message(
        topic=topic,
        body=body,
        tags=tags,
        keys=keys.split() if keys else [],
        properties=props,
        flag=flag,
        queue_id=qid,
        queue_offset=qoff,
        born_ms=born,
        store_ms=store_ms,
        msg_id=msg_id,
        sys_flag=sysflag,
        body_crc=crc,
        physical_offset=phys,
        born_host=host_from_bytes(born_host),
        store_host=host_from_bytes(store_host),
        reconsume_times=reconsume,
        prepared_tx_offset=prepared,
        offset_msg_id=msg_id,
        decode_error=decode_error,
    )
    msg.store_size = size
    return msg


def encode_message_batch(items: Iterable[tuple[int, bytes | memoryview, bytes]]) -> bytes:
    """(flag, body, encoded properties) per message -> a SEND_BATCH_MESSAGE body."""
    parts: list[bytes | memoryview] = []
    pack = _BATCH_HEAD.pack
    for flag, body, props in items:
        if len(props) > MAX_PROPERTIES_BYTES:
            raise MessageFormatError(f"properties of {len(props)} bytes exceed {MAX_PROPERTIES_BYTES}")
        parts.append(pack(BATCH_ITEM_OVERHEAD + len(body) + len(props), 0, 0, flag, len(body)))
        parts.append(body)
        parts.append(_I16BE.pack(len(props)))
        parts.append(props)
    return b"".join(parts)


def decode_message_batch(
    data: bytes | memoryview, max_body: int, max_messages: int = MAX_BATCH_SLOTS - 1
) -> list[tuple[int, memoryview, memoryview]]:
    """A SEND_BATCH_MESSAGE body -> (flag, body, properties) views; MessageFormatError names the item.

    Run for every message of every batch a broker takes, so the per-item work is a header
    unpack and two views; the item's description is only formatted when it is refused.
    """
    mv = memoryview(data)
    n = len(mv)
    off = 0
    out: list[tuple[int, memoryview, memoryview]] = []
    append = out.append
    unpack = _BATCH_HEAD.unpack_from
    head = _BATCH_HEAD.size
    unpack_plen = _I16BE.unpack_from
    while off < n:
        if len(out) >= max_messages:
            raise MessageFormatError(f"batch holds more than {max_messages} messages")
        if n - off < BATCH_ITEM_OVERHEAD:
            raise MessageFormatError(f"batch message {len(out)} at byte {off}: truncated header")
        size, _magic, _crc, flag, blen = unpack(mv, off)
        p = off + head
        end = p + blen
        if blen < 0 or blen > max_body or end + 2 > n:
            where = f"batch message {len(out)} at byte {off}"
            if blen < 0 or blen > max_body:
                raise MessageFormatError(f"{where}: body of {blen} bytes exceeds the limit of {max_body}")
            raise MessageFormatError(f"{where}: body runs past the end")
        (plen,) = unpack_plen(mv, end)
        p = end + 2
        stop = p + plen
        if plen < 0 or stop > n or size != stop - off:
            where = f"batch message {len(out)} at byte {off}"
            if plen < 0 or stop > n:
                raise MessageFormatError(f"{where}: properties run past the end")
            raise MessageFormatError(f"{where}: total size {size} does not match its parts ({stop - off})")
        append((flag, mv[off + head : end], mv[p:stop]))
        off = stop
    if not out:
        raise MessageFormatError("empty batch")
    return out


class UniqueIdGenerator:
    """RocketMQ's client message ids (``MessageClientIDSetter``): 32 hex digits of
    IPv4 (4) + pid (2) + a per-process random (4) + ms since the month began (4) + counter (2).

    The producer puts one in each message's UNIQ_KEY property; consumers see it as msgId.
    """

    def __init__(self, ip: str = "127.0.0.1") -> None:
        try:
            packed = ipaddress.IPv4Address(ip).packed
        except ValueError:
            packed = b"\x7f\x00\x00\x01"
        self._prefix = (packed + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)).hex().upper()
        self._counter = itertools.count(1)  # next() on a count is atomic under the GIL
        now = time.gmtime()
        self._month_start_ms = int(time.mktime((now.tm_year, now.tm_mon, 1, 0, 0, 0, 0, 0, -1)) * 1000)

    def many(self, count: int, now_ms: int) -> list[str]:
        """``count`` new ids stamped ``now_ms``, for a producer's batch: the prefix and time
        part are formatted once, and the counters taken in one step (atomic under the GIL)."""
        head = f"{self._prefix}{(now_ms - self._month_start_ms) & 0xFFFFFFFF:08X}"
        return [f"{head}{c & 0xFFFF:04X}" for c in itertools.islice(self._counter, count)]

    def next(self, now_ms: int | None = None) -> str:
        """A new id; ``now_ms`` saves a clock read when the caller has one."""
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        return (
            f"{self._prefix}{(ms - self._month_start_ms) & 0xFFFFFFFF:08X}{next(self._counter) & 0xFFFF:04X}"
        )


_RECORD_HEAD4 = struct.Struct(">iiiiiqqiq8sq8siqi")  # IPv4 born and store hosts (STORED_HEADER)
_TOPIC_LEN = [bytes((n,)) for n in range(256)]
_QOFF_PHYS = struct.Struct(">qq")


def build_stored_record(
    topic: bytes,
    queue_id: int,
    body: bytes | memoryview,
    properties: bytes | memoryview,
    flag: int,
    sys_flag: int,
    born_ms: int,
    born_host: bytes,
    store_ms: int,
    store_host: bytes,
    reconsume_times: int = 0,
) -> bytes:
    """A stored record with queue offset and physical offset 0 (a broker fills them in when
    serving it, see ``serve_records``); the hot-path twin of ``encode_stored_message``.

    ``topic`` is at most 127 bytes and the hosts are 8-byte IPv4 socket addresses.
    """
    blen, plen = len(body), len(properties)
    size = STORED_HEADER_SIZE + blen + 1 + len(topic) + 2 + plen
    head = _RECORD_HEAD4.pack(
        size,
        MESSAGE_MAGIC_CODE,
        crc32(body) & 0x7FFFFFFF,
        queue_id,
        flag,
        0,
        0,
        sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6),
        born_ms,
        born_host,
        store_ms,
        store_host,
        reconsume_times,
        0,
        blen,
    )
    return b"".join((head, body, _TOPIC_LEN[len(topic)], topic, _I16BE.pack(plen), properties))


def serve_records(found: Sequence[tuple[int, int, bytes | memoryview]]) -> bytearray:
    """(queue offset, physical offset, stored record) -> a PULL body: the records as stored,
    back to back, with their queue and physical offsets filled in."""
    out = bytearray().join([rec for _, _, rec in found])
    pack_into = _QOFF_PHYS.pack_into
    at = STORED_QUEUE_OFFSET_AT
    for qoff, phys, rec in found:
        pack_into(out, at, qoff, phys)
        at += len(rec)
    return out


def stored_record_fields(rec: bytes | memoryview) -> tuple[int, int, int, bytes, memoryview, memoryview]:
    """(queue id, store ms, sys flag, topic, properties, body) of one stored record, checked.

    For a broker's dispatcher and read path; MessageFormatError when the lengths do not add up.
    """
    mv = memoryview(rec)
    n = len(mv)
    try:
        size, magic, _crc, qid, _flag = _I32x5.unpack_from(mv, 0)
        (sysflag,) = _I32BE.unpack_from(mv, 36)
        p = 48 + (20 if sysflag & SYSFLAG_BORNHOST_V6 else 8)
        (store_ms,) = _I64BE.unpack_from(mv, p)
        p += 8 + (20 if sysflag & SYSFLAG_STOREHOST_V6 else 8) + 12
        (blen,) = _I32BE.unpack_from(mv, p)
        p += 4
        body = mv[p : p + blen]
        p += blen
        if magic == MESSAGE_MAGIC_CODE:
            tlen = mv[p]
            p += 1
        elif magic == MESSAGE_MAGIC_CODE_V2:
            (tlen,) = _I16BE.unpack_from(mv, p)
            p += 2
        else:
            raise MessageFormatError(f"bad magic code {magic & 0xFFFFFFFF:#010x}")
        topic = bytes(mv[p : p + tlen])
        p += tlen
        (plen,) = _I16BE.unpack_from(mv, p)
        p += 2
    except (struct.error, IndexError):
        raise MessageFormatError(f"stored record of {n} bytes is truncated") from None
    if size != n or blen < 0 or plen < 0 or p + plen != n:
        raise MessageFormatError(f"stored record lengths do not add up to its {n} bytes")
    return qid, store_ms, sysflag, topic, mv[p : p + plen], body


_I32x5 = struct.Struct(">iiiii")


def property_value(props: bytes, name: bytes) -> bytes | None:
    """One property's raw value from ``key\\x01value\\x02`` bytes, without parsing the rest."""
    probe = name + b"\x01"
    i = props.find(probe)
    while i > 0 and props[i - 1] != 2:
        i = props.find(probe, i + 1)
    if i < 0:
        return None
    start = i + len(probe)
    end = props.find(b"\x02", start)
    return props[start:] if end < 0 else props[start:end]
