"""RocketMQ's message formats byte for byte: properties, stored records, batches, message ids,
and the request headers our clients send (SendMessageRequestHeaderV2, pulls, topic creation).

The expected bytes are built field by field from RocketMQ's documented layouts
(``MessageDecoder``, ``RocketMQSerializable``), independently of the encoder under test.
"""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from client.admin_api import create_topic_headers
from client.broker_api import pull_request
from client.errors import MessageInvalidError
from client.producer import Producer
from remoting.codes import RequestCode
from remoting.headers import SEND_V2_FULL_NAMES, SEND_V2_NAMES
from remoting.message import (
    MESSAGE_MAGIC_CODE,
    SYSFLAG_COMPRESSED,
    Message,
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
from remoting.protocol import SERIALIZE_JSON, FrameDecoder, RemotingCommand, encode_command


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
        (lambda r: r[:60], "runs past"),  # past the fixed part, short of an IPv4 header
    ],
)
def test_malformed_records_name_where(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    record = hand_built_record(b"hello", b"T", b"a\x01b\x02")
    with pytest.raises(MessageFormatError, match=reason):
        decode_stored_messages(mutate(record), verify_crc=True)


def test_ipv6_and_ipv4_records_mixed_in_one_pull_body() -> None:
    """The fast path reads every record as IPv4 first; an IPv6 one must still go to the general parser."""
    from remoting.message import (
        SYSFLAG_BORNHOST_V6,
        SYSFLAG_STOREHOST_V6,
        encode_stored_message,
        host_to_bytes,
    )

    v6, v4 = host_to_bytes("[::1]:9876"), host_to_bytes("127.0.0.1:10911")
    six = encode_stored_message(
        topic="T",
        body=b"six",
        properties=b"",
        queue_id=1,
        sys_flag=SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6,
        born_host=v6,
        store_host=v6,
        physical_offset=7,
    )
    four = encode_stored_message(
        topic="T", body=b"four", properties=b"", queue_id=1, store_host=v4, physical_offset=-2
    )
    got = decode_stored_messages(six + four + six)
    assert [m.body for m in got] == [b"six", b"four", b"six"]
    assert got[0].store_host == "[::1]:9876" and got[1].store_host == "127.0.0.1:10911"
    assert got[1].msg_id == offset_msg_id(v4, -2) and got[2].msg_id == offset_msg_id(v6, 7)


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


# --- SendMessageRequestHeaderV2 (codes 310 and 320) and the other request headers ---------------------
# Fields of RocketMQ's SendMessageRequestHeaderV2 with the SendMessageRequestHeader field each one
# stands for (createSendMessageRequestHeaderV1), in declaration order; "n" (brokerName) is 5.x's.
ROCKETMQ_V2_FIELDS = [
    ("a", "producerGroup"),
    ("b", "topic"),
    ("c", "defaultTopic"),
    ("d", "defaultTopicQueueNums"),
    ("e", "queueId"),
    ("f", "sysFlag"),
    ("g", "bornTimestamp"),
    ("h", "flag"),
    ("i", "properties"),
    ("j", "reconsumeTimes"),
    ("k", "unitMode"),
    ("l", "maxReconsumeTimes"),
    ("m", "batch"),
    ("n", "brokerName"),
]
V2_REQUIRED = set("abcdefgh")  # its @CFNotNull fields


def rocketmq_frame(code: int, opaque: int, fields: list[tuple[str, str]], body: bytes) -> bytes:
    """A request as RocketMQSerializable writes it, built from the documented layout: i16 code,
    u8 language (PYTHON = 3), i16 version (V4_9_4 = 401), i32 opaque, i32 flag, i32 remark length,
    i32 extFields length, then (u16 name length, name, i32 value length, value) per field."""
    ext = b"".join(
        struct.pack(">H", len(k)) + k.encode() + struct.pack(">i", len(v.encode())) + v.encode()
        for k, v in fields
    )
    header = (
        struct.pack(">hBhii", code, 3, 401, opaque, 0)
        + struct.pack(">i", 0)
        + struct.pack(">i", len(ext))
        + ext
    )
    return (
        struct.pack(">i", 4 + len(header) + len(body))
        + struct.pack(">i", 1 << 24 | len(header))
        + header
        + body
    )


def decoded(frame: bytes) -> RemotingCommand:
    (cmd,) = FrameDecoder().feed(frame)
    assert isinstance(cmd, RemotingCommand)
    return cmd


def test_v2_names_are_those_of_rocketmqs_header_class_at_both_ends() -> None:
    from remoting.headers import spelled_out_send_headers

    assert list(SEND_V2_NAMES.items()) == [(full, short) for short, full in ROCKETMQ_V2_FIELDS]
    assert SEND_V2_FULL_NAMES == dict(ROCKETMQ_V2_FIELDS)
    every_short = {short: short for short in SEND_V2_FULL_NAMES}
    # the broker reads what we send
    assert spelled_out_send_headers(310, every_short) == {full: short for short, full in ROCKETMQ_V2_FIELDS}


def test_producer_send_request_is_a_java_producers_send_message_v2_byte_for_byte() -> None:
    producer = Producer("pg-codec", "127.0.0.1:9876")
    msg = Message("TopicCodec", b"hello", flag=7)
    req = producer._message_request(msg)
    req.opaque = 42
    assert req.code == RequestCode.SEND_MESSAGE_V2
    props = "UNIQ_KEY\x01" + msg.properties["UNIQ_KEY"] + "\x02"
    # what DefaultMQProducerImpl puts in a plain send, in the order its HashMap iterates the names
    java = [
        ("a", "pg-codec"),
        ("b", "TopicCodec"),
        ("c", "TBW102"),
        ("d", "4"),
        ("e", "0"),
        ("f", "0"),
        ("g", str(msg.born_ms)),
        ("h", "7"),
        ("i", props),
        ("j", "0"),
        ("k", "false"),
        ("m", "false"),
    ]
    want = rocketmq_frame(310, 42, java, b"hello")
    assert encode_command(req, crc=False) == want
    assert encode_command(req, crc=False) == want  # again: the cached repeated fields are the same bytes
    # a retry to another queue, another group's producer: changed values are written afresh
    req.headers["e"] = 3
    other = Producer("pg-other", "127.0.0.1:9876")._message_request(Message("TopicCodec", b"hello"))
    other.opaque = 43
    assert encode_command(req, crc=False) == rocketmq_frame(
        310, 42, [*java[:4], ("e", "3"), *java[5:]], b"hello"
    )
    got = decoded(encode_command(other, crc=False)).headers
    assert got["a"] == "pg-other" and got["h"] == "0" and got["b"] == "TopicCodec"
    # with our CRC: the same fields, then the CRC extField (checked and removed by the receiver)
    with_crc = encode_command(req)
    crc_field = (
        b"\x00\x0clmqBodyCrc32"
        + struct.pack(">i", len(str(zlib.crc32(b"hello"))))
        + b"%d" % zlib.crc32(b"hello")
    )
    assert with_crc.endswith(crc_field + b"hello")
    assert list(decoded(with_crc).headers) == [k for k, _ in java]


def test_producer_batch_request_decoded_field_by_field() -> None:
    producer = Producer("pg-batch", "127.0.0.1:9876")
    msgs = [Message("TopicBatch", b"one", tags="TagA"), Message("TopicBatch", b"two", keys=["k2"])]
    req = producer._batch_request(msgs)
    assert req.code == RequestCode.SEND_BATCH_MESSAGE
    h = decoded(encode_command(req, crc=False)).headers
    assert V2_REQUIRED <= set(h) and "topic" not in h and "queueId" not in h
    assert h == {
        "a": "pg-batch",
        "b": "TopicBatch",
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "0",
        "g": str(msgs[0].born_ms),
        "h": "0",
        "i": "WAIT\x01true\x02",  # the batch's own properties; each message carries its own UNIQ_KEY
        "j": "0",
        "k": "false",
        "m": "true",
    }
    stored = decode_message_batch(bytes(req.body), 1 << 20)
    assert [body for _flag, body, _props in stored] == [b"one", b"two"]
    props = [properties_from_bytes(p) for _flag, _body, p in stored]
    assert props[0]["TAGS"] == "TagA" and props[1]["KEYS"] == "k2"
    assert props[0]["UNIQ_KEY"] != props[1]["UNIQ_KEY"]


def test_json_send_v2_header_carries_strings_only() -> None:
    req = Producer("pg-json", "127.0.0.1:9876")._message_request(Message("TopicJson", b"x"))
    frame = encode_command(req, crc=False, serialize_type=SERIALIZE_JSON)
    (hlen,) = struct.unpack(">i", frame[4:8])
    doc = json.loads(frame[8 : 8 + hlen])
    assert doc["code"] == 310 and doc["serializeTypeCurrentRPC"] == "JSON"
    assert set(doc["extFields"]) == set("abcdefghijkm")
    assert all(isinstance(v, str) for v in doc["extFields"].values())


def test_pull_and_create_topic_requests_carry_every_required_field() -> None:
    # PullMessageRequestHeader's @CFNotNull fields, also when nothing is committed or filtered
    pull = pull_request("cg", "T", 1, 5, 32, 0)
    assert {
        "consumerGroup",
        "topic",
        "queueId",
        "queueOffset",
        "maxMsgNums",
        "sysFlag",
        "commitOffset",
        "suspendTimeoutMillis",
        "subVersion",
    } <= set(pull.headers)
    # the subscription goes with every pull, "*" by default, with its sysFlag bit (as a Java pull consumer)
    assert pull.headers["sysFlag"] == 0x4 and pull.headers["commitOffset"] == 0
    assert (pull.headers["subscription"], pull.headers["expressionType"]) == ("*", "TAG")
    tagged = pull_request("cg", "T", 1, 5, 32, 1000, commit_offset=4, subscription="TagA || TagB")
    assert tagged.headers["sysFlag"] == 0x1 | 0x2 | 0x4 and tagged.headers["subscription"] == "TagA || TagB"
    # CreateTopicRequestHeader as mqadmin's updateTopic fills it
    headers = create_topic_headers("T", 8, 4, 6)
    got = decoded(encode_command(RemotingCommand(17, headers), crc=False)).headers
    assert got == {
        "topic": "T",
        "defaultTopic": "TBW102",
        "readQueueNums": "8",
        "writeQueueNums": "4",
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0",
        "order": "false",
    }


def test_producer_checks_every_topic_before_building_a_request() -> None:
    producer = Producer("pg-check", "127.0.0.1:9876")
    producer._message_request(Message("GoodTopic", b"x"))  # remembered as checked
    for bad, reason in (
        (["GoodTopic"], "non-empty string"),
        ("bad topic", "may only contain"),
        ("", "non-empty"),
    ):
        msg = Message("GoodTopic", b"x")
        msg.topic = bad  # type: ignore[assignment]
        with pytest.raises(MessageInvalidError, match=reason):
            producer._message_request(msg)
