"""The topics a broker keeps for itself, with RocketMQ's names, and what clients may do with them.

- ``SCHEDULE_TOPIC_XXXX``: delayed messages, queue ``level - 1`` per delay level, until due;
- ``rmq_sys_wheel_timer``: messages with RocketMQ 5's arbitrary delivery time, until due;
- ``RMQ_SYS_TRANS_HALF_TOPIC``: transactional (half) messages until committed or rolled back;
- ``%RETRY%<group>`` / ``%DLQ%<group>``: a consumer group's retries and dead letters.

A client must never store into the first three directly: a message there names its real
topic in a property, so a forged one would reach a topic its sender may not write to (the
ACL checks the topic a send names). RocketMQ refuses them the same way.
"""

from __future__ import annotations

from typing import Final

SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC: Final = "rmq_sys_wheel_timer"
HALF_TOPIC: Final = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_HALF_TOPIC: Final = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
RETRY_PREFIX: Final = "%RETRY%"
DLQ_PREFIX: Final = "%DLQ%"

NOT_SENDABLE: Final = frozenset({SCHEDULE_TOPIC, TIMER_TOPIC, HALF_TOPIC, OP_HALF_TOPIC})

# kinds of consume queue (ConsumeQueue.kind): what applying a message there also means
PLAIN: Final = 0
SCHEDULED: Final = 1  # due at its TIMER_OUT_MS: the schedule holds it
HALF: Final = 2  # a transaction's half: pending until committed or rolled back

DEFAULT_DELAY_LEVELS: Final = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MAX_DELAY_LEVELS: Final = 64


def queue_kind(topic: str) -> int:
    if topic == SCHEDULE_TOPIC or topic == TIMER_TOPIC:
        return SCHEDULED
    if topic == HALF_TOPIC:
        return HALF
    return PLAIN


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """RocketMQ's ``messageDelayLevel`` ("1s 5s 10s 30s 1m ..."; units ms, s, m, h, d) as the
    delay in ms of levels 1, 2, ...; ValueError naming the item that is not one."""
    levels: list[int] = []
    for item in text.split():
        for unit in ("ms", "s", "m", "h", "d"):
            number = item[: -len(unit)]
            if item.endswith(unit) and number.isdigit():
                levels.append(int(number) * _UNITS[unit])
                break
        else:
            raise ValueError(f"delay level {item!r} is not a number with a unit (ms, s, m, h, d)")
    if not 1 <= len(levels) <= MAX_DELAY_LEVELS:
        raise ValueError(f"between 1 and {MAX_DELAY_LEVELS} delay levels are needed, got {len(levels)}")
    return tuple(levels)
