"""Broker metadata that travels through the ledger: topic configs and consumer offsets.

RocketMQ syncs these to slaves every few seconds, so a failover can roll consumers back
and lose topic changes. Here each change is a ledger entry (a record of type 2, JSON), so
every broker of the group applies the same changes in the same order and a new master
starts with exactly the committed state.

A committed entry is applied by every replica, on every restart, forever: one that the
state machine cannot apply must be refused the same way everywhere and skipped, never
raise. So a record is parsed here into a typed operation, every field checked for type
and range, with its nesting depth bounded before ``json`` sees it (Python's recursion
limit would otherwise decide, and that depends on the caller's stack). Anything else is a
``MetaError`` that says what is wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from remoting.jsonbody import json_depth_exceeds

RECORD_META = 2

MAX_META_DEPTH = 8  # nesting of a metadata document (a snapshot needs 3)
MAX_NAME_CHARS = 1024  # a topic or group name in a metadata record (topics allow 127)
MAX_QUEUE_NUMS = 1024  # read/write queues of one topic (UPDATE_AND_CREATE_TOPIC's bound)
_MAX_OFFSET = (1 << 63) - 1
_MAX_QUEUE_ID = (1 << 31) - 1


class MetaError(ValueError):
    """A metadata record that no replica can apply; the message says what and where."""


@dataclass(frozen=True, slots=True)
class TopicOp:
    name: str
    read: int
    write: int
    perm: int
    order: bool = False


@dataclass(frozen=True, slots=True)
class OffsetOp:
    group: str
    topic: str
    queue: int
    offset: int
    forward: bool = False  # a commit riding on a pull: never moves an offset back


@dataclass(frozen=True, slots=True)
class SnapshotOp:
    topics: tuple[TopicOp, ...]
    offsets: tuple[OffsetOp, ...]


@dataclass(frozen=True, slots=True)
class TxnEndOp:
    """A half message's transaction ended without its message being stored: rolled back by its
    producer, or discarded after too many unanswered checks (a commit is a derived entry)."""

    half: int  # the half message's position
    action: str  # "rollback" or "discard"


@dataclass(frozen=True, slots=True)
class LockOp:
    """A consumer's LOCK_BATCH_MQ (``expires`` set) or UNLOCK_BATCH_MQ (``expires`` 0), with the
    master's clock at proposal: every broker grants the same locks whatever its own clock."""

    group: str
    client: str
    queues: tuple[tuple[str, int], ...]
    now: int
    expires: int


@dataclass(frozen=True, slots=True)
class BrokerAddrOp:
    """Members' broker addresses (node id -> host:port), replicated so that every broker of a
    group whose membership changes at run time can name any member's broker address (the
    master's, to a client that asked a slave; a removed member's, to unregister it). ``set``
    adds or moves entries; ``drop`` forgets ids. See ``broker.membership``."""

    set: tuple[tuple[str, str], ...]
    drop: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PopPick:
    """What a POP takes from one queue: the offsets the master chose (expired in-flight ones and
    new ones) and how far its cursor may move (past messages the consumer's filter skipped).
    ``start`` is the group's cursor in the queue as the master saw it, or where a group that
    never popped the queue begins (its init mode): stated in every POP, so that a replay whose
    first entries retention removed starts the cursor where it was."""

    queue: int
    start: int
    cursor_to: int
    offsets: tuple[int, ...]
    floor: int = 0  # the queue's min offset at the master: what lies below was removed by retention


@dataclass(frozen=True, slots=True)
class PopOp:
    """A POP_MESSAGE: the master's clock at proposal, the invisible time asked, the in-flight
    bound (the master's ``max_pop_inflight``) and per queue what it takes; see ``broker.pop``."""

    group: str
    topic: str
    now: int
    invisible: int
    limit: int
    picks: tuple[PopPick, ...]


@dataclass(frozen=True, slots=True)
class PopAckOp:
    """ACK_MESSAGE (one handle) or CHANGE_MESSAGE_INVISIBLETIME (``invisible`` set, one
    handle): handles are (offset, pop time) pairs of one queue, judged at the master's ``now``."""

    group: str
    topic: str
    queue: int
    now: int
    handles: tuple[tuple[int, int], ...]
    invisible: int = 0  # > 0: change the invisible time instead of acknowledging
    dead: bool = False  # dead-lettered: drop expired deliveries (their handles as the master saw them)


MetaOp = TopicOp | OffsetOp | SnapshotOp | TxnEndOp | LockOp | BrokerAddrOp | PopOp | PopAckOp
TXN_ACTIONS = ("rollback", "discard")
MAX_LOCK_QUEUES = 1024  # queues one lock request may name
MAX_BROKER_ADDRS = 64  # entries one broker-address record may set or drop (the ledger's MAX_MEMBERS)
MAX_POP_INFLIGHT_CAP = 65_536  # the most any max_pop_inflight may say (state stays bounded)
MAX_POP_PICKS = 1024  # queues one POP record may take from (a topic's queue bound)
MAX_POP_OFFSETS = 1024  # offsets one POP record may take from a queue, or one ack record name
MAX_INVISIBLE_MS = 12 * 3600 * 1000  # the longest invisible time (RocketMQ 5's proxy bound)
MAX_ADDR_CHARS = 255  # a broker host:port (the ledger's bound on a member address)
_MEMBER_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


def encode_meta(op: str, **fields: Any) -> bytes:
    return bytes((RECORD_META,)) + json.dumps({"op": op, **fields}, separators=(",", ":")).encode()


def _refuse_constant(name: str) -> Any:
    raise MetaError(f"non-finite number {name} in a metadata record")


def decode_meta(data: bytes | memoryview) -> dict[str, Any]:
    """The JSON document of a metadata record, its depth bounded; MetaError if it is not one."""
    raw = bytes(data[1:])
    if json_depth_exceeds(raw, MAX_META_DEPTH):
        raise MetaError(f"metadata record nested deeper than {MAX_META_DEPTH} levels")
    try:
        doc = json.loads(raw, parse_constant=_refuse_constant)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise MetaError(f"metadata record is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("op"), str):
        raise MetaError("metadata record is not a JSON object with a string 'op'")
    return doc


def _field(doc: dict[str, Any], key: str, where: str) -> Any:
    try:
        return doc[key]
    except KeyError:
        raise MetaError(f"{where}: missing '{key}'") from None


def _name(doc: dict[str, Any], key: str, where: str) -> str:
    value = _field(doc, key, where)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise MetaError(f"{where}: '{key}' must be a string of 1..{MAX_NAME_CHARS} characters")
    return value


def _int(doc: dict[str, Any], key: str, lo: int, hi: int, where: str) -> int:
    value = _field(doc, key, where)
    if type(value) is not int or not lo <= value <= hi:
        raise MetaError(f"{where}: '{key}' must be an integer in {lo}..{hi}, got {str(value)[:40]}")
    return value


def _topic(name: str, doc: Any, where: str) -> TopicOp:
    if not isinstance(doc, dict):
        raise MetaError(f"{where}: a topic must be an object")
    order = doc.get("order", False)
    if not isinstance(order, bool):
        raise MetaError(f"{where}: 'order' must be true or false")
    return TopicOp(
        name,
        _int(doc, "read", 0, MAX_QUEUE_NUMS, where),
        _int(doc, "write", 0, MAX_QUEUE_NUMS, where),
        _int(doc, "perm", 0, 7, where),
        order,
    )


def _offset(doc: dict[str, Any], where: str) -> OffsetOp:
    forward = doc.get("forward", False)
    if not isinstance(forward, bool):
        raise MetaError(f"{where}: 'forward' must be true or false")
    return OffsetOp(
        _name(doc, "group", where),
        _name(doc, "topic", where),
        _int(doc, "queue", 0, _MAX_QUEUE_ID, where),
        _int(doc, "offset", 0, _MAX_OFFSET, where),
        forward,
    )


def parse_meta(data: bytes | memoryview) -> MetaOp:
    """A metadata record as a typed operation, every field checked; MetaError otherwise."""
    doc = decode_meta(data)
    op = doc["op"]
    if op == "offset":
        return _offset(doc, "offset record")
    if op == "topic":
        name = _name(doc, "name", "topic record")
        return _topic(name, doc, f"topic record {name!r}")
    if op == "snapshot":
        topics, offsets = _field(doc, "topics", "snapshot"), _field(doc, "offsets", "snapshot")
        if not isinstance(topics, dict) or not isinstance(offsets, list):
            raise MetaError("snapshot: 'topics' must be an object and 'offsets' a list")
        parsed_topics = []
        for name, t in topics.items():
            if not 0 < len(name) <= MAX_NAME_CHARS:
                raise MetaError(f"snapshot: topic name of {len(name)} characters")
            parsed_topics.append(_topic(name, t, f"snapshot topic {name[:80]!r}"))
        parsed_offsets = []
        for i, item in enumerate(offsets):
            if not isinstance(item, list) or len(item) != 4:
                raise MetaError(f"snapshot: offsets[{i}] must be [group, topic, queue, offset]")
            fields = dict(zip(("group", "topic", "queue", "offset"), item, strict=True))
            parsed_offsets.append(_offset(fields, f"snapshot offsets[{i}]"))
        return SnapshotOp(tuple(parsed_topics), tuple(parsed_offsets))
    if op == "txn":
        action = _field(doc, "action", "txn record")
        if action not in TXN_ACTIONS:
            raise MetaError(f"txn record: 'action' must be one of {TXN_ACTIONS}")
        return TxnEndOp(_int(doc, "half", 0, _MAX_OFFSET, "txn record"), action)
    if op in ("lock", "unlock"):
        where = f"{op} record"
        queues = _field(doc, "queues", where)
        if not isinstance(queues, list) or len(queues) > MAX_LOCK_QUEUES:
            raise MetaError(f"{where}: 'queues' must be a list of at most {MAX_LOCK_QUEUES} [topic, queue]")
        parsed = []
        for i, item in enumerate(queues):
            if not isinstance(item, list) or len(item) != 2:
                raise MetaError(f"{where}: queues[{i}] must be [topic, queue id]")
            fields = {"topic": item[0], "queue": item[1]}
            parsed.append((_name(fields, "topic", where), _int(fields, "queue", 0, _MAX_QUEUE_ID, where)))
        expires = _int(doc, "expires", 0, _MAX_OFFSET, where) if op == "lock" else 0
        return LockOp(
            _name(doc, "group", where),
            _name(doc, "client", where),
            tuple(parsed),
            _int(doc, "now", 0, _MAX_OFFSET, where),
            expires,
        )
    if op == "brokers":
        return _broker_addrs(doc)
    if op == "pop":
        return _pop(doc)
    if op in ("ack", "invisible", "dead"):
        return _pop_ack(doc, op)
    raise MetaError(f"unknown metadata op {op[:40]!r}")


def _member_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _MEMBER_ID.fullmatch(value):
        raise MetaError(
            f"{where}: member id {str(value)[:80]!r} must be a letter then up to 63 of A-Z a-z 0-9 _ -"
        )
    return value


def _host_port(value: Any, where: str) -> str:
    """A ``host:port`` string (IPv6 hosts in brackets), checked as far as every replica can agree."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ADDR_CHARS or not value.isprintable():
        raise MetaError(f"{where}: address must be printable text of 1..{MAX_ADDR_CHARS} characters")
    host, sep, port = value.rpartition(":")
    if (
        not sep
        or not host
        or not port.isdigit()
        or not 0 < int(port) < 65536
        or any(c in host for c in " /@,=")
    ):
        raise MetaError(f"{where}: address {value[:80]!r} is not host:port")
    return value


def _broker_addrs(doc: dict[str, Any]) -> BrokerAddrOp:
    where = "brokers record"
    entries, drop = doc.get("set", {}), doc.get("drop", [])
    if not isinstance(entries, dict) or len(entries) > MAX_BROKER_ADDRS:
        raise MetaError(f"{where}: 'set' must map at most {MAX_BROKER_ADDRS} member ids to host:port")
    if not isinstance(drop, list) or len(drop) > MAX_BROKER_ADDRS:
        raise MetaError(f"{where}: 'drop' must be a list of at most {MAX_BROKER_ADDRS} member ids")
    if not entries and not drop:
        raise MetaError(f"{where}: sets and drops nothing")
    pairs = tuple((_member_id(k, where), _host_port(v, f"{where} {k!r}")) for k, v in entries.items())
    return BrokerAddrOp(pairs, tuple(_member_id(d, where) for d in drop))


def _offsets(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_POP_OFFSETS:
        raise MetaError(f"{where}: offsets must be a list of at most {MAX_POP_OFFSETS}")
    if any(type(v) is not int or not 0 <= v <= _MAX_OFFSET for v in value):
        raise MetaError(f"{where}: an offset is not an integer in 0..{_MAX_OFFSET}")
    return tuple(value)


def _pop(doc: dict[str, Any]) -> PopOp:
    where = "pop record"
    picks = _field(doc, "picks", where)
    if not isinstance(picks, list) or not 0 < len(picks) <= MAX_POP_PICKS:
        raise MetaError(
            f"{where}: 'picks' must be a list of 1..{MAX_POP_PICKS} [queue, start, floor, cursor, offsets]"
        )
    parsed = []
    for i, item in enumerate(picks):
        if not isinstance(item, list) or len(item) != 5:
            raise MetaError(f"{where}: picks[{i}] must be [queue, start, floor, cursor, offsets]")
        fields = dict(zip(("queue", "start", "floor", "cursor"), item[:4], strict=True))
        at = f"{where} picks[{i}]"
        parsed.append(
            PopPick(
                _int(fields, "queue", 0, _MAX_QUEUE_ID, at),
                _int(fields, "start", 0, _MAX_OFFSET, at),
                _int(fields, "cursor", 0, _MAX_OFFSET, at),
                _offsets(item[4], at),
                _int(fields, "floor", 0, _MAX_OFFSET, at),
            )
        )
    return PopOp(
        _name(doc, "group", where),
        _name(doc, "topic", where),
        _int(doc, "now", 0, _MAX_OFFSET, where),
        _int(doc, "invisible", 1, MAX_INVISIBLE_MS, where),
        _int(doc, "limit", 1, MAX_POP_INFLIGHT_CAP, where),
        tuple(parsed),
    )


def _pop_ack(doc: dict[str, Any], op: str) -> PopAckOp:
    where = f"{op} record"
    handles = _field(doc, "handles", where)
    if not isinstance(handles, list) or not 0 < len(handles) <= MAX_POP_OFFSETS:
        raise MetaError(f"{where}: 'handles' must be a list of 1..{MAX_POP_OFFSETS} [offset, pop time]")
    parsed = []
    for i, item in enumerate(handles):
        if not isinstance(item, list) or len(item) != 2:
            raise MetaError(f"{where}: handles[{i}] must be [offset, pop time]")
        fields = {"offset": item[0], "pop_time": item[1]}
        parsed.append(
            (_int(fields, "offset", 0, _MAX_OFFSET, where), _int(fields, "pop_time", 0, _MAX_OFFSET, where))
        )
    invisible = _int(doc, "invisible", 1, MAX_INVISIBLE_MS, where) if op == "invisible" else 0
    if invisible and len(parsed) != 1:
        raise MetaError(f"{where}: changes the invisible time of exactly one handle")
    return PopAckOp(
        _name(doc, "group", where),
        _name(doc, "topic", where),
        _int(doc, "queue", 0, _MAX_QUEUE_ID, where),
        _int(doc, "now", 0, _MAX_OFFSET, where),
        tuple(parsed),
        invisible,
        op == "dead",
    )


def pop_op(group: str, topic: str, now_ms: int, invisible_ms: int, limit: int, picks: list[PopPick]) -> bytes:
    """A POP: per queue the offsets the master chose and how far the cursor may move."""
    return encode_meta(
        "pop",
        group=group,
        topic=topic,
        now=now_ms,
        invisible=invisible_ms,
        limit=limit,
        picks=[[p.queue, p.start, p.floor, p.cursor_to, list(p.offsets)] for p in picks],
    )


def ack_op(group: str, topic: str, queue_id: int, now_ms: int, handles: list[tuple[int, int]]) -> bytes:
    """Acknowledge (offset, pop time) handles of one queue."""
    return encode_meta(
        "ack", group=group, topic=topic, queue=queue_id, now=now_ms, handles=[list(h) for h in handles]
    )


def dead_op(group: str, topic: str, queue_id: int, now_ms: int, handles: list[tuple[int, int]]) -> bytes:
    """Drop expired deliveries whose messages were stored as dead letters (past their retries)."""
    return encode_meta(
        "dead", group=group, topic=topic, queue=queue_id, now=now_ms, handles=[list(h) for h in handles]
    )


def invisible_op(
    group: str, topic: str, queue_id: int, now_ms: int, handle: tuple[int, int], invisible_ms: int
) -> bytes:
    """Make one in-flight message invisible for ``invisible_ms`` from now, under a new handle."""
    return encode_meta(
        "invisible",
        group=group,
        topic=topic,
        queue=queue_id,
        now=now_ms,
        handles=[list(handle)],
        invisible=invisible_ms,
    )


def topic_op(name: str, read_queue_nums: int, write_queue_nums: int, perm: int, order: bool = False) -> bytes:
    return encode_meta(
        "topic", name=name, read=read_queue_nums, write=write_queue_nums, perm=perm, order=order
    )


def offset_op(group: str, topic: str, queue_id: int, offset: int, *, forward: bool = False) -> bytes:
    """A consumer offset; ``forward`` (a commit riding on a pull) never moves it backwards,
    while an explicit UPDATE_CONSUMER_OFFSET sets it to the value given (RocketMQ's reset)."""
    if forward:
        return encode_meta("offset", group=group, topic=topic, queue=queue_id, offset=offset, forward=True)
    return encode_meta("offset", group=group, topic=topic, queue=queue_id, offset=offset)


def txn_end_op(half_position: int, action: str) -> bytes:
    return encode_meta("txn", half=half_position, action=action)


def lock_op(group: str, client: str, queues: list[tuple[str, int]], now_ms: int, expires_ms: int) -> bytes:
    return encode_meta(
        "lock", group=group, client=client, queues=[list(q) for q in queues], now=now_ms, expires=expires_ms
    )


def unlock_op(group: str, client: str, queues: list[tuple[str, int]], now_ms: int) -> bytes:
    return encode_meta("unlock", group=group, client=client, queues=[list(q) for q in queues], now=now_ms)


def broker_addrs_op(entries: dict[str, str], drop: list[str] | tuple[str, ...] = ()) -> bytes:
    """Set members' broker addresses (node id -> host:port) and forget ``drop``."""
    return encode_meta("brokers", set=dict(entries), drop=list(drop))


def snapshot_op(topics: dict[str, Any], offsets: list[list[Any]]) -> bytes:
    """All topics and consumer offsets at one point of the log.

    With ledger retention on, the segments holding the original topic and offset records
    are eventually deleted; a checkpoint appended more often than retention removes them
    keeps the replayed state complete after a restart.
    """
    return encode_meta("snapshot", topics=topics, offsets=offsets)
