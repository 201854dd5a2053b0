"""RocketMQ's message properties and system topics behind retries, delays and transactions.

The names are RocketMQ's (``MessageConst``, ``MixAll``): a broker reads them from a
message's properties, so a message written here means the same to an Apache broker as to a
ledgermq one. ``Message`` stays a plain dataclass; these helpers read and write its
``properties`` (the one place a RocketMQ message carries such settings).
"""

from __future__ import annotations

from enum import StrEnum

from client.errors import MessageInvalidError
from remoting.message import Message

# --- property names (MessageConst) ------------------------------------------------------------
PROPERTY_DELAY = "DELAY"
"""RocketMQ 4's delay level (1..18; 0 or absent: no delay)."""
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
"""RocketMQ 5's delivery time: milliseconds since the epoch."""
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
"""The topic a message sent back for a retry was first consumed from."""
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"

# --- system topics (MixAll) --------------------------------------------------------------------
RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"
CLIENT_INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
"""The producer group RocketMQ's clients send retry copies with (MixAll.CLIENT_INNER_PRODUCER_GROUP)."""

MAX_DELAY_LEVEL = 18
"""RocketMQ's default messageDelayLevel has 18 levels: 1s 5s 10s 30s 1m 2m ... 2h."""
DEFAULT_MAX_RECONSUME_TIMES = 16
"""A concurrent consumer's retries before a message goes to the dead-letter topic."""
ORDERLY_MAX_RECONSUME_TIMES = 2**31 - 1
"""An orderly consumer retries a message forever unless told otherwise (Java's Integer.MAX_VALUE)."""


class ExpressionType(StrEnum):
    """How a subscription's expression is read (RocketMQ's ExpressionType)."""

    TAG = "TAG"
    SQL92 = "SQL92"


def retry_topic(group: str) -> str:
    """``%RETRY%<group>``: where a group's failed messages wait for their next try."""
    return RETRY_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """``%DLQ%<group>``: where a group's messages end after their last try."""
    return DLQ_TOPIC_PREFIX + group


def set_delay_level(msg: Message, level: int) -> Message:
    """Deliver ``msg`` after RocketMQ's delay ``level`` (1..18; 0 clears it); returns ``msg``.

    The broker holds the message in its schedule topic and delivers it when the level's
    time has passed (1 s, 5 s, 10 s, 30 s, 1 min, ... 2 h with the default levels).
    """
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= MAX_DELAY_LEVEL:
        raise MessageInvalidError(f"delay level must be an integer in 0..{MAX_DELAY_LEVEL}, got {level!r}")
    if level:
        msg.properties[PROPERTY_DELAY] = str(level)
    else:
        msg.properties.pop(PROPERTY_DELAY, None)
    return msg


def set_deliver_time_ms(msg: Message, deliver_ms: int) -> Message:
    """Deliver ``msg`` at ``deliver_ms`` (ms since the epoch; RocketMQ 5's timer); 0 clears it."""
    if isinstance(deliver_ms, bool) or not isinstance(deliver_ms, int) or deliver_ms < 0:
        raise MessageInvalidError(f"delivery time must be milliseconds since the epoch, got {deliver_ms!r}")
    if deliver_ms:
        msg.properties[PROPERTY_TIMER_DELIVER_MS] = str(deliver_ms)
    else:
        msg.properties.pop(PROPERTY_TIMER_DELIVER_MS, None)
    return msg


def delay_level(msg: Message) -> int:
    """The delay level ``msg`` carries (0: none)."""
    value = msg.properties.get(PROPERTY_DELAY, "")
    return int(value) if value.isdigit() else 0


def deliver_time_ms(msg: Message) -> int:
    """The delivery time ``msg`` carries (0: none)."""
    value = msg.properties.get(PROPERTY_TIMER_DELIVER_MS, "")
    return int(value) if value.isdigit() else 0


def is_delayed(msg: Message) -> bool:
    """Whether ``msg`` asks for a later delivery (either way)."""
    props = msg.properties
    return PROPERTY_DELAY in props or PROPERTY_TIMER_DELIVER_MS in props


def client_message_id(msg: Message) -> str:
    """A pulled message's id as RocketMQ's clients name it (``MessageClientExt.getMsgId``): the
    producer's UNIQ_KEY, else the offset message id."""
    return msg.properties.get(PROPERTY_UNIQ_KEY) or msg.msg_id


def origin_message_id(msg: Message) -> str:
    """The id a retry copy names its original by: its ORIGIN_MESSAGE_ID if it is itself a copy,
    else its client message id (MessageAccessor.getOriginMessageId, then getMsgId)."""
    return msg.properties.get(PROPERTY_ORIGIN_MESSAGE_ID) or client_message_id(msg)


__all__ = [
    "CLIENT_INNER_PRODUCER_GROUP",
    "DEFAULT_MAX_RECONSUME_TIMES",
    "DLQ_TOPIC_PREFIX",
    "ExpressionType",
    "MAX_DELAY_LEVEL",
    "ORDERLY_MAX_RECONSUME_TIMES",
    "PROPERTY_DELAY",
    "PROPERTY_MAX_RECONSUME_TIMES",
    "PROPERTY_ORIGIN_MESSAGE_ID",
    "PROPERTY_PRODUCER_GROUP",
    "PROPERTY_REAL_QUEUE_ID",
    "PROPERTY_REAL_TOPIC",
    "PROPERTY_RECONSUME_TIME",
    "PROPERTY_RETRY_TOPIC",
    "PROPERTY_TIMER_DELIVER_MS",
    "PROPERTY_TRANSACTION_PREPARED",
    "RETRY_TOPIC_PREFIX",
    "client_message_id",
    "delay_level",
    "deliver_time_ms",
    "dlq_topic",
    "is_delayed",
    "origin_message_id",
    "retry_topic",
    "set_delay_level",
    "set_deliver_time_ms",
]
