"""Where a message is stored when it is not to be seen at once, and the records the master
makes when it is: RocketMQ's placement rules, pure functions over properties and records.

- A message with ``DELAY`` (a level, 1..N of ``messageDelayLevel``) or one of RocketMQ 5's
  timer properties (``TIMER_DELIVER_MS``, ``TIMER_DELAY_SEC``, ``TIMER_DELAY_MS``) is stored
  in a schedule queue with its real topic and queue in ``REAL_TOPIC``/``REAL_QID`` and the
  time it is due in ``TIMER_OUT_MS``, decided once by the master that stores it (so every
  broker agrees when it is due, whatever its own configuration or clock).
- A transactional message (``TRAN_MSG=true``) is stored as a half message, likewise.
- When due or committed, the master makes the record for the real queue from the held one
  (``release``); a consumer's send-back makes a retry record (``retry``) that is itself
  scheduled, or a dead letter past the group's limit.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from remoting.message import (
    PROPERTY_DELAY,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TRAN_MSG,
    STORED_HEADER_SIZE,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_COMPRESSED,
    SYSFLAG_STOREHOST_V6,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    Message,
    MessageFormatError,
    build_stored_record,
    decode_stored_messages,
    host_to_bytes,
    properties_from_bytes,
    properties_to_bytes,
)

from .system_topics import HALF_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC, dlq_topic, retry_topic

_TIMER_PROPERTIES = (PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS)
HELD_MARKERS = tuple(
    f"{name}\x01".encode() for name in (PROPERTY_DELAY, PROPERTY_TRAN_MSG, *_TIMER_PROPERTIES)
)
"""Bytes that appear in a message's properties text when it might have to be held: a plain
message has none of them, so the send path looks no further (a few substring searches)."""


class PlacementError(MessageFormatError):
    """A property that says when or how to deliver a message is malformed; says which."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a record goes: topic, queue and the properties it is stored with."""

    topic: str
    queue_id: int
    properties: dict[str, str]


def might_be_held(props: bytes) -> bool:
    """Whether a properties text names any of HELD_MARKERS (the TIMER_ prefix covers three):
    on the path of every send, so three substring searches and no generator."""
    return b"DELAY\x01" in props or b"TRAN_MSG\x01" in props or b"TIMER_" in props


def _number(props: dict[str, str], name: str) -> int | None:
    text = props.get(name)
    if text is None:
        return None
    text = text.strip()
    if not text.lstrip("-").isdigit() or len(text) > 19:
        raise PlacementError(f"property {name} must be an integer, got {text[:40]!r}")
    return int(text)


def schedule(
    topic: str,
    queue_id: int,
    props: dict[str, str],
    now_ms: int,
    levels_ms: tuple[int, ...],
    max_timer_ms: int,
) -> Placement | None:
    """The schedule queue of a delayed message (None: deliver at once). A level above the
    highest is the highest (as RocketMQ clamps it); 0 or less is no delay; a delivery time in
    the past is due at once; one further ahead than ``max_timer_ms`` is refused."""
    level = _number(props, PROPERTY_DELAY)
    deliver_at = _number(props, PROPERTY_TIMER_DELIVER_MS)
    delay_s, delay_ms = _number(props, PROPERTY_TIMER_DELAY_SEC), _number(props, PROPERTY_TIMER_DELAY_MS)
    if deliver_at is None and delay_s is not None:
        deliver_at = now_ms + delay_s * 1000
    if deliver_at is None and delay_ms is not None:
        deliver_at = now_ms + delay_ms
    out = {k: v for k, v in props.items() if k not in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID)}
    out[PROPERTY_REAL_TOPIC], out[PROPERTY_REAL_QUEUE_ID] = topic, str(queue_id)
    if deliver_at is not None:
        if deliver_at - now_ms > max_timer_ms:
            raise PlacementError(
                f"delivery time {deliver_at} is {(deliver_at - now_ms) / 1000:.0f} s ahead, "
                f"more than the broker's max_timer_delay_s ({max_timer_ms / 1000:.0f} s)"
            )
        out[PROPERTY_TIMER_OUT_MS] = str(max(deliver_at, now_ms))
        return Placement(TIMER_TOPIC, 0, out)
    if level is None or level <= 0:
        return None
    level = min(level, len(levels_ms))
    out[PROPERTY_DELAY] = str(level)
    out[PROPERTY_TIMER_OUT_MS] = str(now_ms + levels_ms[level - 1])
    return Placement(SCHEDULE_TOPIC, level - 1, out)


def is_delayed(props: dict[str, str]) -> bool:
    """Whether the properties ask for a delay (a level above 0 or a timer property)."""
    level = _number(props, PROPERTY_DELAY)
    return (level is not None and level > 0) or any(name in props for name in _TIMER_PROPERTIES)


def is_transactional(props: dict[str, str]) -> bool:
    return props.get(PROPERTY_TRAN_MSG, "").lower() == "true"


def half(topic: str, queue_id: int, props: dict[str, str], producer_group: str) -> Placement:
    """The half queue, with the real topic, queue and producer group in its properties."""
    out = dict(props)
    out[PROPERTY_REAL_TOPIC], out[PROPERTY_REAL_QUEUE_ID] = topic, str(queue_id)
    if producer_group and not out.get(PROPERTY_PRODUCER_GROUP):
        out[PROPERTY_PRODUCER_GROUP] = producer_group
    return Placement(HALF_TOPIC, 0, out)


def decode_held(record: bytes | memoryview) -> Message:
    """The one message in a held record (MessageFormatError if it is not one)."""
    (msg,) = decode_stored_messages(bytes(record), max_messages=1)
    return msg


def real_queue(msg: Message) -> tuple[str, int]:
    """The topic and queue a held message names (PlacementError if it names none)."""
    return _real_queue(msg.properties, msg.msg_id)


def _real_queue(props: dict[str, str], which: str) -> tuple[str, int]:
    topic, qid = props.get(PROPERTY_REAL_TOPIC, ""), props.get(PROPERTY_REAL_QUEUE_ID, "")
    if not topic or not qid.isdigit():
        raise PlacementError(f"held message {which} names no real topic and queue")
    return topic, int(qid)


def record(
    msg: Message,
    place: Placement,
    *,
    sys_flag: int,
    reconsume_times: int,
    store_ms: int,
    store_host: bytes,
) -> bytes:
    """A stored record of ``msg``'s body, flag and born fields, placed as ``place`` says."""
    try:
        born_host = host_to_bytes(msg.born_host) if msg.born_host else b"\x00" * 8
    except MessageFormatError:
        born_host = b"\x00" * 8
    if len(born_host) != 8:
        born_host = b"\x00" * 8
    if not msg.decode_error:  # the body was inflated when decoded: stored as it is now
        sys_flag &= ~SYSFLAG_COMPRESSED
    return build_stored_record(
        place.topic.encode(),
        place.queue_id,
        msg.body,
        properties_to_bytes(place.properties),
        msg.flag,
        sys_flag,
        msg.born_ms,
        born_host,
        store_ms,
        store_host,
        reconsume_times,
    )


def release(msg: Message, now_ms: int, levels_ms: tuple[int, ...], max_timer_ms: int) -> Placement:
    """Where a held message goes when due or committed: its real queue, without the
    properties that held it; a committed half that also carries a delay is scheduled next."""
    return _release(msg.all_properties(), msg.msg_id, now_ms, levels_ms, max_timer_ms)


def _release(
    props: dict[str, str], which: str, now_ms: int, levels_ms: tuple[int, ...], max_timer_ms: int
) -> Placement:
    topic, qid = _real_queue(props, which)
    if props.pop(PROPERTY_TIMER_OUT_MS, None) is not None:  # due: no delay any more
        props.pop(PROPERTY_DELAY, None)
        for name in _TIMER_PROPERTIES:
            props.pop(name, None)
    else:  # a committed half: its delay starts now
        held = schedule(topic, qid, props, now_ms, levels_ms, max_timer_ms)
        if held is not None:
            return held
    return Placement(topic, qid, props)


_HELD_HEAD = struct.Struct(">iiiiiqqiq8sq8siqi")  # a stored record's header, IPv4 hosts
_HELD_V6_OR_COMPRESSED = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6 | SYSFLAG_COMPRESSED


def released_record(
    held: bytes | memoryview,
    now_ms: int,
    levels_ms: tuple[int, ...],
    max_timer_ms: int,
    store_host: bytes,
    which: str,
) -> tuple[Placement, bytes] | None:
    """``release`` and ``record`` of a held record in one step, read in place: what a master
    does for every due message, so it skips decoding the whole message. None for a record
    with IPv6 hosts or a compressed body (``decode_held``, ``release`` and ``record`` take
    those); MessageFormatError if the record's lengths do not add up."""
    n = len(held)
    if n < STORED_HEADER_SIZE + 3:
        raise MessageFormatError(f"held record of {n} bytes is truncated")
    (_, _, _, _, flag, _, _, sys_flag, born_ms, born_host, _, _, reconsume, _, blen) = _HELD_HEAD.unpack_from(
        held
    )
    if sys_flag & _HELD_V6_OR_COMPRESSED:
        return None
    p = STORED_HEADER_SIZE + blen
    if blen < 0 or p + 3 > n:
        raise MessageFormatError(f"held record: body length {blen} runs past its {n} bytes")
    p += 1 + held[p]
    if p + 2 > n:
        raise MessageFormatError("held record: topic runs past its end")
    plen = held[p] << 8 | held[p + 1]
    if p + 2 + plen != n:
        raise MessageFormatError(f"held record: lengths do not add up to its {n} bytes")
    props = properties_from_bytes(held[p + 2 : n], "held record's properties")
    place = _release(props, which, now_ms, levels_ms, max_timer_ms)
    body = held[STORED_HEADER_SIZE : STORED_HEADER_SIZE + blen]
    rec = build_stored_record(
        place.topic.encode(),
        place.queue_id,
        body,
        properties_to_bytes(place.properties),
        flag,
        sys_flag,
        born_ms,
        born_host,
        now_ms,
        store_host,
        reconsume,
    )
    return place, rec


def committed_sys_flag(sys_flag: int) -> int:
    return (sys_flag & ~SYSFLAG_TRANSACTION_MASK) | SYSFLAG_TRANSACTION_COMMIT


def retry(
    msg: Message,
    group: str,
    delay_level: int,
    max_reconsume: int,
    origin_msg_id: str,
    now_ms: int,
    levels_ms: tuple[int, ...],
) -> Placement:
    """RocketMQ's send-back: a dead letter (``%DLQ%<group>``) once the message was consumed
    ``max_reconsume`` times or when asked (level < 0), else a retry for ``%RETRY%<group>``
    scheduled at level ``delay_level`` (0: 3 + times consumed, RocketMQ's back-off)."""
    props = msg.all_properties()
    if not props.get(PROPERTY_RETRY_TOPIC):
        props[PROPERTY_RETRY_TOPIC] = msg.topic
    if not props.get(PROPERTY_ORIGIN_MESSAGE_ID):
        props[PROPERTY_ORIGIN_MESSAGE_ID] = origin_msg_id or msg.unique_key or msg.msg_id
    for name in (PROPERTY_DELAY, PROPERTY_TIMER_OUT_MS, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID):
        props.pop(name, None)
    if delay_level < 0 or msg.reconsume_times >= max_reconsume:
        return Placement(dlq_topic(group), 0, props)
    level = delay_level if delay_level > 0 else 3 + msg.reconsume_times
    props[PROPERTY_DELAY] = str(level)
    held = schedule(retry_topic(group), 0, props, now_ms, levels_ms, 0)
    assert held is not None
    return held
