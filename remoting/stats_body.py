"""Bodies of RocketMQ's admin statistics, as its brokers write them and its tools read them.

GET_TOPIC_STATS_INFO (202) answers a ``TopicStatsTable`` and GET_CONSUME_STATS (208) a
``ConsumeStats``. Both hold a map keyed by ``MessageQueue`` objects, which RocketMQ's fastjson
writes with the key object itself in the key position (not valid JSON)::

    {"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"lastUpdateTimestamp":0,...}}}

``mqadmin topicStatus`` and ``consumerProgress`` parse exactly that, so our broker writes it
and our admin client reads it with a small bounded parser (the standard ``json`` module only
takes string keys); a key given as a string holding that object (RocketMQ-Rust's spelling)
is read too. Fields are written in fastjson's order (sorted by name). GET_BROKER_RUNTIME_INFO
answers a ``KVTable``: ``{"table": {name: string value}}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from remoting.exceptions import RemotingCommandError
from remoting.jsonbody import loads_bounded

MAX_NESTING = 16
"""Deepest object/array nesting the parser follows (these bodies need 4)."""
MAX_BODY_CHARS = 16 << 20
"""Longest stats body the parser reads (a table of every queue of a large broker fits)."""

_scalar = json.JSONDecoder().raw_decode
_WS = " \t\n\r"


@dataclass(frozen=True, slots=True, order=True)
class QueueKey:
    """RocketMQ's MessageQueue as these tables key it (sorted as mqadmin prints them)."""

    topic: str
    broker_name: str
    queue_id: int


@dataclass(slots=True)
class TopicOffset:
    """One queue of GET_TOPIC_STATS_INFO: its offsets and when its last message was stored (ms, 0 = none)."""

    min_offset: int
    max_offset: int
    last_update_timestamp: int = 0


@dataclass(slots=True)
class QueueConsumeOffset:
    """One queue of GET_CONSUME_STATS (RocketMQ's OffsetWrapper): how far the broker is, how
    far the group committed, and when the last message the group consumed was stored (ms)."""

    broker_offset: int
    consumer_offset: int
    last_timestamp: int = 0

    @property
    def diff(self) -> int:
        return self.broker_offset - self.consumer_offset


@dataclass(slots=True)
class ConsumeStats:
    offsets: dict[QueueKey, QueueConsumeOffset]
    consume_tps: float = 0.0

    @property
    def diff_total(self) -> int:
        return sum(o.diff for o in self.offsets.values())


# --- writing --------------------------------------------------------------------------------------
def _queue_key_json(q: QueueKey) -> str:
    return json.dumps(
        {"brokerName": q.broker_name, "queueId": q.queue_id, "topic": q.topic}, separators=(",", ":")
    )


def _object_keyed(entries: Iterable[tuple[QueueKey, dict[str, Any]]]) -> str:
    parts = [
        _queue_key_json(q) + ":" + json.dumps(v, separators=(",", ":"), sort_keys=True)
        for q, v in sorted(entries)
    ]
    return "{" + ",".join(parts) + "}"


def encode_topic_stats(table: dict[QueueKey, TopicOffset]) -> bytes:
    entries = (
        (
            q,
            {
                "lastUpdateTimestamp": o.last_update_timestamp,
                "maxOffset": o.max_offset,
                "minOffset": o.min_offset,
            },
        )
        for q, o in table.items()
    )
    return ('{"offsetTable":' + _object_keyed(entries) + "}").encode()


def encode_consume_stats(stats: ConsumeStats) -> bytes:
    entries = (
        (
            q,
            {
                "brokerOffset": o.broker_offset,
                "consumerOffset": o.consumer_offset,
                "lastTimestamp": o.last_timestamp,
            },
        )
        for q, o in stats.offsets.items()
    )
    tps = stats.consume_tps if math.isfinite(stats.consume_tps) else 0.0
    return ('{"consumeTps":' + repr(float(tps)) + ',"offsetTable":' + _object_keyed(entries) + "}").encode()


# --- reading --------------------------------------------------------------------------------------
class _Pairs(list[tuple[Any, Any]]):
    """An object with at least one non-string key, as its (key, value) pairs."""


def _skip(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def _value(text: str, i: int, depth: int) -> tuple[Any, int]:
    i = _skip(text, i)
    if i >= len(text):
        raise ValueError("unexpected end")
    c = text[i]
    if c == "{" or c == "[":
        if depth >= MAX_NESTING:
            raise ValueError(f"nested deeper than {MAX_NESTING} at char {i}")
        return (_object if c == "{" else _array)(text, i + 1, depth + 1)
    return _scalar(text, i)


def _array(text: str, i: int, depth: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    i = _skip(text, i)
    if i < len(text) and text[i] == "]":
        return out, i + 1
    while True:
        value, i = _value(text, i, depth)
        out.append(value)
        i = _skip(text, i)
        if i < len(text) and text[i] == ",":
            i += 1
            continue
        if i < len(text) and text[i] == "]":
            return out, i + 1
        raise ValueError(f"expected ',' or ']' at char {i}")


def _object(text: str, i: int, depth: int) -> tuple[Any, int]:
    pairs: list[tuple[Any, Any]] = []
    i = _skip(text, i)
    if i < len(text) and text[i] == "}":
        return {}, i + 1
    while True:
        key, i = _value(text, i, depth)  # a string, a number (fastjson's integer keys) or an object
        i = _skip(text, i)
        if i >= len(text) or text[i] != ":":
            raise ValueError(f"expected ':' at char {i}")
        value, i = _value(text, i + 1, depth)
        pairs.append((key, value))
        i = _skip(text, i)
        if i < len(text) and text[i] == ",":
            i += 1
            continue
        if i < len(text) and text[i] == "}":
            i += 1
            break
        raise ValueError(f"expected ',' or '}}' at char {i}")
    if all(isinstance(k, str) for k, _ in pairs):
        return dict(pairs), i
    return _Pairs(pairs), i


def load_fastjson(body: bytes | bytearray | memoryview, what: str) -> Any:
    """Parse a fastjson body whose maps may have object keys; such a map comes back as a list
    of (key, value) pairs. RemotingCommandError names ``what`` and the place on failure."""
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RemotingCommandError(f"{what}: body is not UTF-8: {exc}") from None
    if not text.strip():
        raise RemotingCommandError(f"{what}: body is empty, expected JSON")
    if len(text) > MAX_BODY_CHARS:
        raise RemotingCommandError(f"{what}: body of {len(text)} chars is over the {MAX_BODY_CHARS} limit")
    try:
        doc, end = _value(text, 0, 0)
    except ValueError as exc:
        raise RemotingCommandError(f"{what}: body is not JSON as RocketMQ writes it: {exc}") from None
    if _skip(text, end) != len(text):
        raise RemotingCommandError(f"{what}: trailing data after the JSON value at char {end}")
    return doc


def _int(obj: dict[str, Any], name: str, where: str) -> int:
    value = obj.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RemotingCommandError(f"{where}.{name} must be an integer, got {value!r}")
    return value


def _queue_key(key: Any, where: str) -> QueueKey:
    if isinstance(key, str) and key.lstrip().startswith("{"):
        # RocketMQ-Rust (serde) writes the MessageQueue key as a string holding its JSON object
        try:
            key = loads_bounded(key, where)
        except RemotingCommandError:
            pass  # refused below, naming the key
    if not isinstance(key, dict):
        raise RemotingCommandError(f"{where}: a key must be a MessageQueue object, got {key!r}")
    topic, broker = key.get("topic"), key.get("brokerName")
    if not isinstance(topic, str) or not isinstance(broker, str):
        raise RemotingCommandError(f"{where}: MessageQueue needs string topic and brokerName, got {key!r}")
    return QueueKey(topic, broker, _int(key, "queueId", where))


def _offset_table(doc: Any, what: str) -> list[tuple[QueueKey, dict[str, Any]]]:
    if not isinstance(doc, dict):
        raise RemotingCommandError(f"{what}: body must be a JSON object")
    table = doc.get("offsetTable", {})
    where = f"{what}.offsetTable"
    pairs = table if isinstance(table, _Pairs) else list(table.items()) if isinstance(table, dict) else None
    if pairs is None:
        raise RemotingCommandError(f"{where} must be a map")
    out = []
    for key, value in pairs:
        q = _queue_key(key, where)
        if not isinstance(value, dict):
            raise RemotingCommandError(f"{where}[{q.topic}:{q.broker_name}:{q.queue_id}] must be an object")
        out.append((q, value))
    return out


def decode_topic_stats(body: bytes | bytearray | memoryview) -> dict[QueueKey, TopicOffset]:
    what = "topic stats"
    return {
        q: TopicOffset(
            _int(v, "minOffset", what), _int(v, "maxOffset", what), _int(v, "lastUpdateTimestamp", what)
        )
        for q, v in _offset_table(load_fastjson(body, what), what)
    }


def decode_consume_stats(body: bytes | bytearray | memoryview) -> ConsumeStats:
    what = "consume stats"
    doc = load_fastjson(body, what)
    offsets = {
        q: QueueConsumeOffset(
            _int(v, "brokerOffset", what), _int(v, "consumerOffset", what), _int(v, "lastTimestamp", what)
        )
        for q, v in _offset_table(doc, what)
    }
    tps = doc.get("consumeTps", 0.0)
    if isinstance(tps, bool) or not isinstance(tps, int | float):
        raise RemotingCommandError(f"{what}.consumeTps must be a number, got {tps!r}")
    return ConsumeStats(offsets, float(tps))
