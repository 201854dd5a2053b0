"""RocketMQ's message formats byte for byte: properties, stored records, batches, message ids.

The expected bytes are built field by field from RocketMQ's documented layouts
(``MessageDecoder``), independently of the encoder under test.
"""

from __future__ import annotations

import struct
import zlib

import pytest

from remoting.message import (
    MESSAGE_MAGIC_CODE,
    SYSFLAG_COMPRESSED,
    MessageFormatError,
    UniqueIdGenerator,
    body_crc,
    decode_message_batch,
    decode_stored_messages,
    encode_message_batch,
    encode_stored_message,
    host_to_bytes,
    java_string_hash,
    offset_msg_id,
    parse_offset_msg_id,
    properties_from_bytes,
    properties_to_bytes,
)


def test_properties_are_name_value_pairs_with_control_separators() -> None:
    raw = properties_to_bytes({"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "AB"})
    assert raw == b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01AB\x02"
    assert properties_from_bytes(raw) == {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "AB"}
    assert properties_from_bytes(b"a\x01b") == {"a": "b"}  # a last separator is optional
    assert properties_from_bytes("k\x01\u00e9\x02".encode()) == {"k": "\u00e9"}
    assert properties_to_bytes({}) == b""


def test_bad_properties_are_refused_naming_the_item() -> None:
    with pytest.raises(MessageFormatError, match="item 'novalue' is not name"):
        properties_from_bytes(b"a\x01b\x02novalue\x02", "where")
    with pytest.raises(MessageFormatError, match="property 'x'"):
        properties_to_bytes({"x": "bad\x02value"})
    with pytest.raises(MessageFormatError, match="not UTF-8"):
        properties_from_bytes(b"\xff\x01x")


def test_java_string_hash() -> None:
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("") == 0
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("polygenelubricants") == -(2**31)


def test_host_bytes_and_offset_message_id() -> None:
    host = host_to_bytes("127.0.0.1:10911")
    assert host == bytes([127, 0, 0, 1]) + (10911).to_bytes(4, "big")
    msg_id = offset_msg_id(host, 0x1122334455667788)
    assert msg_id == "7F00000100002A9F1122334455667788"
    assert parse_offset_msg_id(msg_id) == ("127.0.0.1:10911", 0x1122334455667788)
    v6 = offset_msg_id(host_to_bytes("[::1]:9876"), 5)
    assert len(v6) == 56 and parse_offset_msg_id(v6) == ("[::1]:9876", 5)
    for bad in ("broker-a:0001", "ZZ" * 16):
        with pytest.raises(MessageFormatError, match="message id"):
            parse_offset_msg_id(bad)


def hand_built_record(
    body: bytes, topic: bytes, props: bytes, *, sysflag: int = 0, crc: int | None = None
) -> bytes:
    fields = (
        struct.pack(">i", MESSAGE_MAGIC_CODE)
        + struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF if crc is None else crc)
        + struct.pack(">i", 3)  # queue id
        + struct.pack(">i", 7)  # flag
        + struct.pack(">q", 42)  # queue offset
        + struct.pack(">q", 0x10000)  # physical offset
        + struct.pack(">i", sysflag)
        + struct.pack(">q", 1700000000000)  # born
        + bytes([10, 0, 0, 5]) + struct.pack(">i", 50000)  # born host
        + struct.pack(">q", 1700000000123)  # store
        + bytes([127, 0, 0, 1]) + struct.pack(">i", 10911)  # store host
        + struct.pack(">i", 2)  # reconsume times
        + struct.pack(">q", 0)  # prepared transaction offset
        + struct.pack(">i", len(body)) + body
        + bytes([len(topic)]) + topic
        + struct.pack(">h", len(props)) + props
    )  # fmt: skip
    return struct.pack(">i", 4 + len(fields)) + fields


def test_stored_record_layout() -> None:
    props = b"TAGS\x01TagA\x02KEYS\x01order-1\x02color\x01red\x02"
    expected = hand_built_record(b"hello", b"TopicTest", props)
    assert expected[4:8] == bytes.fromhex("DAA320A7")
    encoded = encode_stored_message(
        topic="TopicTest",
        body=b"hello",
        properties=props,
        queue_id=3,
        flag=7,
        queue_offset=42,
        physical_offset=0x10000,
        born_ms=1700000000000,
        born_host=host_to_bytes("10.0.0.5:50000"),
        store_ms=1700000000123,
        store_host=host_to_bytes("127.0.0.1:10911"),
        reconsume_times=2,
    )
    assert encoded == expected
    (msg,) = decode_stored_messages(expected + b"", verify_crc=True)
    assert (msg.topic, msg.body, msg.tags, msg.keys, msg.properties) == (
        "TopicTest",
        b"hello",
        "TagA",
        ["order-1"],
        {"color": "red"},
    )
    assert (msg.queue_id, msg.flag, msg.queue_offset, msg.physical_offset) == (3, 7, 42, 0x10000)
    assert (msg.born_host, msg.store_host, msg.reconsume_times) == ("10.0.0.5:50000", "127.0.0.1:10911", 2)
    assert msg.offset_msg_id == msg.msg_id == "7F00000100002A9F0000000000010000"
    assert msg.body_crc == body_crc(b"hello")


def test_pull_body_of_several_records_and_compressed_body() -> None:
    big = b"abc" * 1000
    data = hand_built_record(b"one", b"T", b"UNIQ_KEY\x01C0A80001\x02") + hand_built_record(
        zlib.compress(big), b"T", b"", sysflag=SYSFLAG_COMPRESSED
    )
    first, second = decode_stored_messages(data, verify_crc=True)
    assert first.body == b"one" and first.unique_key == "C0A80001" and len(first.msg_id) == 32
    assert second.body == big


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda r: r[:-3], "runs past"),
        (lambda r: r[:4] + b"\x00\x00\x00\x00" + r[8:], "bad magic code"),
        (lambda r: r[:8] + b"\x00\x00\x00\x01" + r[12:], "body CRC mismatch"),
        (lambda r: r[:30], "truncated header"),
    ],
)
def test_malformed_records_name_where(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    record = hand_built_record(b"hello", b"T", b"a\x01b\x02")
    with pytest.raises(MessageFormatError, match=reason):
        decode_stored_messages(mutate(record), verify_crc=True)


def test_batch_body_is_encode_message_per_message() -> None:
    props = b"TAGS\x01t\x02"
    one = (
        struct.pack(">i", 4 + 4 + 4 + 4 + 4 + 2 + 2 + len(props))  # total size
        + b"\x00" * 8  # magic code and body CRC are written as 0 by the client
        + struct.pack(">i", 1)  # flag
        + struct.pack(">i", 2) + b"hi"
        + struct.pack(">h", len(props)) + props
    )  # fmt: skip
    two = struct.pack(">iiiii", 22, 0, 0, 0, 0) + struct.pack(">h", 0)
    assert encode_message_batch([(1, b"hi", props), (0, b"", b"")]) == one + two
    items = decode_message_batch(one + two, max_body=1024)
    assert [(f, bytes(b), bytes(p)) for f, b, p in items] == [(1, b"hi", props), (0, b"", b"")]
    with pytest.raises(MessageFormatError, match="batch message 0 at byte 0: body of 2 bytes exceeds"):
        decode_message_batch(one, max_body=1)
    with pytest.raises(MessageFormatError, match="total size 99 does not match"):
        decode_message_batch(struct.pack(">i", 99) + one[4:], max_body=1024)
    with pytest.raises(MessageFormatError, match="empty batch"):
        decode_message_batch(b"", max_body=1)


def test_unique_ids_are_32_hex_and_distinct() -> None:
    gen = UniqueIdGenerator("192.168.0.1")
    ids = [gen.next() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(len(i) == 32 and i.startswith("C0A80001") for i in ids)
    int(ids[0], 16)
