"""Between RocketMQ 5's messages (``apache.rocketmq.v2.Message``) and ledgermq's stored ones, and
the proxy's opaque tokens: receipt handles and transaction ids.

Both tokens carry everything needed to act on them later, so the proxy keeps no state:

- a receipt handle is the broker's ``POP_CK`` extra info (``ck popTime invisibleTime reviveQid
  retryFlag brokerName queueId offset``), what an ACK_MESSAGE or CHANGE_MESSAGE_INVISIBLETIME
  names, and the message's commit-log position (what a dead-letter forward copies); the broker
  decides whether it is still good (``broker.pop``);
- a transaction id names where the half message was stored (broker group, queue offset,
  commit-log offset) and the broker's own transaction id, what END_TRANSACTION needs.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from remoting.message import (
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRAN_MSG,
    PROPERTY_UNIQ_KEY,
    Message,
)

#: RocketMQ's FIFO key: messages of one group go to one queue, in order (MessageConst.PROPERTY_SHARDING_KEY)
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
#: properties RocketMQ reserves (MessageConst.STRING_HASH_SET): not user properties either way
SYSTEM_PROPERTIES = frozenset(
    {
        "TAGS",
        "KEYS",
        "UNIQ_KEY",
        "WAIT",
        "DELAY",
        "RETRY_TOPIC",
        "REAL_TOPIC",
        "REAL_QID",
        "TRAN_MSG",
        "PGROUP",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "BUYER_ID",
        "ORIGIN_MESSAGE_ID",
        "TRANSFER_FLAG",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        "RECONSUME_TIME",
        "MSG_REGION",
        "TRACE_ON",
        "MAX_RECONSUME_TIMES",
        "CONSUME_START_TIME",
        "POP_CK",
        "POP_CK_OFFSET",
        "1ST_POP_TIME",
        "TRAN_PREPARED_QUEUE_OFFSET",
        "DUP_INFO",
        "EXTEND_UNIQ_INFO",
        "INSTANCE_ID",
        "CORRELATION_ID",
        "REPLY_TO_CLIENT",
        "TTL",
        "ARRIVE_TIME",
        "MSG_TYPE",
        "CLUSTER",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "TIMER_DELIVER_MS",
        "TIMER_DELAY_SEC",
        "TIMER_DELAY_MS",
        "TIMER_OUT_MS",
        "TIMER_ENQUEUE_MS",
        "TIMER_DEQUEUE_MS",
        "TIMER_ROLL_TIMES",
        "TIMER_DEL_UNIQKEY",
        "__transactionId__",
        "__SHARDINGKEY",
        "__STARTDELIVERTIME",
    }
)
MAX_TAG_CHARS = 255
MAX_KEY_CHARS = 255
MAX_MESSAGE_GROUP_CHARS = 255
#: the most a delivery timestamp may lie ahead (RocketMQ 5's timerMaxDelaySec default: 3 days)
MAX_DELAY_MS = 3 * 24 * 3600 * 1000
MAX_HANDLE_CHARS = 512
HANDLE_FIELDS = 9  # POP_CK's 8 fields and the message's commit-log position
TX_SEPARATOR = "|"


class BadRequest(ValueError):
    """A request the proxy refuses: ``code`` is the v2 status code's name, the text says why."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code


# ---------------------------------------------------------------------- messages in


@dataclass(slots=True)
class Outgoing:
    """A 5.x message to send: the ledgermq message and how it must be sent."""

    message: Message
    kind: str  # NORMAL, FIFO, DELAY or TRANSACTION
    group: str  # FIFO message group, "" otherwise


def _text(value: str, what: str, limit: int, code: str) -> str:
    if len(value) > limit or any(c in value for c in "\x00\x01\x02\t\n\r|") or value != value.strip():
        raise BadRequest(
            code, f"{what} {value[:60]!r}: at most {limit} characters, no control characters or '|'"
        )
    return value


def to_remoting(msg: Any, max_body: int, now_ms: int, message_types: Any) -> Outgoing:
    """A v2 ``Message`` as the ledgermq message to store; BadRequest says what is wrong with it."""
    sysp = msg.system_properties
    topic = msg.topic.name
    body = bytes(msg.body)
    if not body:
        raise BadRequest("MESSAGE_BODY_EMPTY", "message body is empty")
    if len(body) > max_body:
        raise BadRequest(
            "MESSAGE_BODY_TOO_LARGE", f"message body is {len(body)} bytes, over the limit of {max_body}"
        )
    if sysp.body_encoding == 2:  # GZIP: the 5.x clients send bodies as they are; store it so
        raise BadRequest("BAD_REQUEST", "GZIP-encoded bodies are not accepted; send the body as it is")
    props: dict[str, str] = {}
    for key, value in msg.user_properties.items():
        if key in SYSTEM_PROPERTIES or not key or any(c in key + value for c in "\x01\x02"):
            raise BadRequest(
                "ILLEGAL_MESSAGE_PROPERTY_KEY", f"user property {key[:60]!r} is reserved or malformed"
            )
        props[key] = value
    message_id = sysp.message_id
    if not message_id or len(message_id) > 128 or not message_id.isalnum():
        raise BadRequest(
            "ILLEGAL_MESSAGE_ID", f"message id {message_id[:60]!r} must be 1..128 letters and digits"
        )
    props[PROPERTY_UNIQ_KEY] = message_id
    tags = _text(sysp.tag, "tag", MAX_TAG_CHARS, "ILLEGAL_MESSAGE_TAG") if sysp.tag else None
    if tags is not None and ("||" in tags or "*" == tags):
        raise BadRequest("ILLEGAL_MESSAGE_TAG", f"tag {tags!r} may not be '*' nor contain '||'")
    keys = [_text(k, "key", MAX_KEY_CHARS, "ILLEGAL_MESSAGE_KEY") for k in sysp.keys]
    if any(" " in k or not k for k in keys):
        raise BadRequest("ILLEGAL_MESSAGE_KEY", "message keys may not be empty nor contain spaces")
    kind = message_types.Name(sysp.message_type) if sysp.message_type else "NORMAL"
    group = ""
    if sysp.HasField("message_group"):
        group = _text(sysp.message_group, "message group", MAX_MESSAGE_GROUP_CHARS, "ILLEGAL_MESSAGE_GROUP")
    has_delivery = sysp.HasField("delivery_timestamp")
    conflict = {
        "NORMAL": bool(group) or has_delivery,
        "FIFO": not group or has_delivery,
        "DELAY": bool(group) or not has_delivery,
        "TRANSACTION": bool(group) or has_delivery,
    }
    if kind not in conflict:
        raise BadRequest(
            "UNSUPPORTED", f"message type {kind} is not supported (NORMAL, FIFO, DELAY, TRANSACTION)"
        )
    if conflict[kind]:
        raise BadRequest(
            "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE",
            f"a {kind} message {'needs' if kind in ('FIFO', 'DELAY') else 'may not have'} "
            f"{'a message group' if kind == 'FIFO' else 'a delivery timestamp' if kind == 'DELAY' else 'a message group or delivery timestamp'}",
        )
    if group:
        props[PROPERTY_SHARDING_KEY] = group
    if has_delivery:
        at = sysp.delivery_timestamp.seconds * 1000 + sysp.delivery_timestamp.nanos // 1_000_000
        if at > now_ms + MAX_DELAY_MS:
            raise BadRequest(
                "ILLEGAL_DELIVERY_TIME",
                f"delivery timestamp is more than {MAX_DELAY_MS // 3_600_000} h ahead",
            )
        if at > now_ms:
            props[PROPERTY_TIMER_DELIVER_MS] = str(at)
    born = sysp.born_timestamp.seconds * 1000 + sysp.born_timestamp.nanos // 1_000_000
    out = Message(topic, body, tags=tags, keys=keys, properties=props, born_ms=born or now_ms)
    return Outgoing(out, kind, group)


# ---------------------------------------------------------------------- messages out

_TYPE_BY_PROPERTY = (
    (PROPERTY_SHARDING_KEY, "FIFO"),
    (PROPERTY_TIMER_DELIVER_MS, "DELAY"),
    (PROPERTY_DELAY, "DELAY"),
)


def _timestamp(ts: Any, ms: int) -> None:
    ts.seconds, ts.nanos = divmod(ms, 1000)
    ts.nanos *= 1_000_000


def to_v2(m: Message, pb: Any, receipt_handle: str, invisible_ms: int) -> Any:
    """A stored message as the v2 ``Message`` a consumer receives."""
    out = pb.Message()
    out.topic.name = m.topic
    out.body = bytes(m.body)
    props = m.properties
    for key, value in props.items():
        if key not in SYSTEM_PROPERTIES:
            out.user_properties[key] = value
    sysp = out.system_properties
    if m.tags:
        sysp.tag = m.tags
    sysp.keys.extend(m.keys or (props.get(PROPERTY_KEYS, "").split() if PROPERTY_KEYS in props else []))
    sysp.message_id = props.get(PROPERTY_UNIQ_KEY) or m.msg_id or m.offset_msg_id
    sysp.body_digest.type = pb.DigestType.CRC32
    sysp.body_digest.checksum = format(zlib.crc32(out.body) & 0xFFFFFFFF, "08X")
    sysp.body_encoding = pb.Encoding.IDENTITY
    kind = "TRANSACTION" if props.get(PROPERTY_TRAN_MSG) == "true" else "NORMAL"
    for prop, name in _TYPE_BY_PROPERTY:
        if prop in props:
            kind = name
            break
    sysp.message_type = pb.MessageType.Value(kind)
    _timestamp(sysp.born_timestamp, m.born_ms)
    sysp.born_host = m.born_host or ""
    _timestamp(sysp.store_timestamp, m.store_ms)
    sysp.store_host = m.store_host or ""
    deliver = props.get(PROPERTY_TIMER_DELIVER_MS, "")
    if deliver.isdigit():
        _timestamp(sysp.delivery_timestamp, int(deliver))
    sysp.receipt_handle = receipt_handle
    sysp.queue_id = max(m.queue_id, 0)
    sysp.queue_offset = max(m.queue_offset, 0)
    sysp.invisible_duration.seconds, rest = divmod(invisible_ms, 1000)
    sysp.invisible_duration.nanos = rest * 1_000_000
    sysp.delivery_attempt = m.reconsume_times + 1
    if PROPERTY_SHARDING_KEY in props:
        sysp.message_group = props[PROPERTY_SHARDING_KEY]
    return out


# ---------------------------------------------------------------------- receipt handles


@dataclass(frozen=True, slots=True)
class Handle:
    """A receipt handle: one delivery of the message at ``offset`` of ``broker``'s ``queue_id``
    (stored at commit-log position ``position``, what a dead-letter forward copies)."""

    ck: int
    pop_time: int
    invisible_ms: int
    broker: str
    queue_id: int
    offset: int
    position: int = -1

    def extra_info(self) -> str:
        """The broker's POP_CK extra info an ACK or CHANGE_MESSAGE_INVISIBLETIME names."""
        return (
            f"{self.ck} {self.pop_time} {self.invisible_ms} 0 0 {self.broker} {self.queue_id} {self.offset}"
        )

    def text(self) -> str:
        return f"{self.extra_info()} {self.position}"


def parse_handle(text: str) -> Handle:
    """A receipt handle the proxy gave out; BadRequest(INVALID_RECEIPT_HANDLE) for anything else."""
    fields = text.split(" ")
    if len(text) > MAX_HANDLE_CHARS or len(fields) != HANDLE_FIELDS:
        raise BadRequest(
            "INVALID_RECEIPT_HANDLE", f"receipt handle {text[:80]!r} is not one this proxy gave out"
        )
    try:
        ck, pop_time, invisible, qid, offset, position = (int(fields[i]) for i in (0, 1, 2, 6, 7, 8))
    except ValueError:
        raise BadRequest("INVALID_RECEIPT_HANDLE", f"receipt handle {text[:80]!r} is malformed") from None
    if min(ck, pop_time, invisible, qid, offset) < 0 or position < -1 or fields[4] != "0" or not fields[5]:
        raise BadRequest("INVALID_RECEIPT_HANDLE", f"receipt handle {text[:80]!r} is malformed")
    return Handle(ck, pop_time, invisible, fields[5], qid, offset, position)


# ---------------------------------------------------------------------- transaction ids


@dataclass(frozen=True, slots=True)
class TxRef:
    """Where a half message was stored, as END_TRANSACTION names it."""

    broker: str
    queue_offset: int
    commit_log_offset: int
    producer_group: str
    broker_tx_id: str

    def text(self) -> str:
        return TX_SEPARATOR.join(
            (
                self.broker,
                str(self.queue_offset),
                str(self.commit_log_offset),
                self.producer_group,
                self.broker_tx_id,
            )
        )


def parse_tx(text: str) -> TxRef:
    """A transaction id this proxy gave out; BadRequest(INVALID_TRANSACTION_ID) for anything else."""
    parts = text.split(TX_SEPARATOR)
    if len(text) > 1024 or len(parts) != 5 or not parts[0] or not parts[3]:
        raise BadRequest(
            "INVALID_TRANSACTION_ID", f"transaction id {text[:80]!r} is not one this proxy gave out"
        )
    try:
        queue_offset, log_offset = int(parts[1]), int(parts[2])
    except ValueError:
        raise BadRequest("INVALID_TRANSACTION_ID", f"transaction id {text[:80]!r} is malformed") from None
    if queue_offset < 0 or log_offset < 0:
        raise BadRequest("INVALID_TRANSACTION_ID", f"transaction id {text[:80]!r} is malformed")
    return TxRef(parts[0], queue_offset, log_offset, parts[3], parts[4])


def half_properties(msg: Message, producer_group: str) -> None:
    """Mark ``msg`` a half message of ``producer_group`` (TRAN_MSG, PGROUP)."""
    msg.properties[PROPERTY_TRAN_MSG] = "true"
    msg.properties[PROPERTY_PRODUCER_GROUP] = producer_group
