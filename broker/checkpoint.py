"""Checkpoints of the broker's state machine, so a restarted broker replays only the log's tail.

``BrokerState`` is derived from committed entries alone, so after a restart the broker could
rebuild it by replaying the whole retained log, but at full rate that is seconds of CPU during
which the broker lags and its group fails over slowly. Like RocketMQ's consume queue files
plus checkpoint file (or etcd's snapshot), a checkpoint holds the state as it was after
applying ledger index A; a restart loads it and applies only entries after A.

File layout (all integers little-endian)::

    magic "LMQCKPT\\0" | version u16 | reserved u16 | header length u32 | blob length u64
    | header (JSON, UTF-8) | blob (raw array bytes) | xxh64 of everything before, u64

The header holds the small tables as JSON lists of plain values, and for each large column
(consume queue positions, sizes and tag codes, the de-duplication table, taken keys, the
schedule) an (offset, byte length) reference into the blob. No pickle: decoding checks the
checksum, then the version, then every value's type and every reference's bounds, and raises
``CheckpointError`` naming what was wrong. A broker that gets one logs it and replays the
whole log instead, so a bad file costs time, never a wrong state.

Writing is split so the event loop stays free: ``capture`` copies the state (array copies and
lists of plain values, a few ms for a million queued messages) on the loop, ``render`` turns
that copy into bytes and ``write_file`` stores it atomically, both in a worker thread.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain
from pathlib import Path
from typing import Any

import xxhash

from remoting.topic import DataVersion, TopicConfig, topic_entry_json

from .consume_queue import ConsumeQueue
from .pop import Granted, InFlight, PopQueue, PopStates
from .schedule import Half, QueueLocks, Schedule, TakenKeys
from .state import BrokerState
from .system_topics import queue_kind

MAGIC = b"LMQCKPT\x00"
VERSION = 1
_PREFIX = struct.Struct("<8sHHIQ")  # magic, version, reserved, header length, blob length
_DIGEST = struct.Struct("<Q")
MAX_CHECKPOINT_BYTES = 8 << 30  # a larger file is refused unread (no broker state comes near it)
MAX_HEADER_BYTES = 2 << 30  # the JSON part's bound
CHECKPOINT_FILE = "broker-state.ckpt"  # in the broker's data dir, beside ledger/
_LITTLE = sys.byteorder == "little"
_TMP_IDS = itertools.count()


# Every attribute of a BrokerState, as ``capture`` and ``decode`` handle it: written, or
# rebuilt from what is written (the queue cache from the queues, the topic entries from the
# topics). A test compares this with a fresh BrokerState's, so a new attribute cannot be
# forgotten here (it would come back empty after a restart).
STATE_ATTRIBUTES = frozenset(
    {
        "_delay_cursors",
        "_queue_cache",
        "_resolved_before_base",
        "_topic_entries",
        "_ttl_due",
        "applied",
        "broker_addrs",
        "data_version",
        "dedup_ttl_ms",
        "dedup_window",
        "dispatched_messages",
        "halves",
        "keys",
        "lock_outcomes",
        "locks",
        "offsets",
        "pop_outcomes",
        "pops",
        "queues",
        "replay_base",
        "schedule",
        "send_backs",
        "skipped_entries",
        "topics",
        "uniq",
    }
)


class CheckpointError(Exception):
    """A checkpoint that cannot be loaded: corrupt, truncated, of another version or another group."""


# ---------------------------------------------------------------------- capture (on the loop)


@dataclass(slots=True)
class Image:
    """A copy of a ``BrokerState`` that the state's further applying cannot change."""

    meta: dict[str, Any]
    scalars: dict[str, Any]
    tables: dict[str, Any]
    queues: list[tuple[str, int, int, int, array[int], array[int], array[int]]]
    uniq_keys: list[bytes]
    uniq_places: list[tuple[int, int, int]]  # (queue offset, position, store ms) of each key
    byte_lists: dict[str, list[bytes]] = field(default_factory=dict)
    schedule: list[tuple[int, int]] = field(default_factory=list)


def _granted(g: Granted) -> list[int]:
    return [g.queue, g.offset, g.pop_time, g.deadline, g.times]


def capture(state: BrokerState, meta: dict[str, Any] | None = None) -> Image:
    """Copy everything ``state`` holds into plain values and fresh arrays (run on the loop)."""
    dv = state.data_version
    scalars = {
        "applied": state.applied,
        "dedup_window": state.dedup_window,
        "dedup_ttl_ms": state.dedup_ttl_ms,
        "ttl_due": state._ttl_due,
        "dispatched_messages": state.dispatched_messages,
        "skipped_entries": state.skipped_entries,
        "replay_base": state.replay_base,
        "data_version": [dv.timestamp, dv.counter],
        "locks_max": state.locks.max_locks,
        "send_backs_window": state.send_backs.window,
        "resolved_window": state._resolved_before_base.window,
        "pops_max_queues": state.pops.max_queues,
    }
    tables = {
        "topics": [
            [t.topic_name, t.read_queue_nums, t.write_queue_nums, t.perm, t.order]
            for t in state.topics.values()
        ],
        "offsets": [[g, t, q, o] for (g, t, q), o in state.offsets.items()],
        "keys": [[t, k, list(v)] for (t, k), v in state.keys.items()],
        "halves": [[p, h.producer_group, h.store_ms, h.immunity_ms] for p, h in state.halves.pending.items()],
        "locks": [[g, t, q, c, e] for (g, t, q), (c, e) in state.locks.held.items()],
        "lock_outcomes": [
            [i, sorted([t, q] for t, q in granted)] for i, granted in state.lock_outcomes.items()
        ],
        "pop_outcomes": [
            [i, [o if isinstance(o, str) else _granted(o) for o in out]]
            for i, out in state.pop_outcomes.items()
        ],
        "pops": [
            [
                g,
                t,
                q,
                pq.cursor,
                pq.last_pop_time,
                [[o, e.pop_time, e.deadline, e.times] for o, e in pq.inflight.items()],
            ]
            for (g, t, q), pq in state.pops.queues.items()
        ],
        "delay_cursors": [[k, v] for k, v in state._delay_cursors.items()],
        "broker_addrs": [[k, v] for k, v in state.broker_addrs.items()],
    }
    queues = [
        (cq.topic, cq.queue_id, cq.kind, cq.base, cq.positions[:], cq.sizes[:], cq.tags[:])
        for cq in state.queues.values()
    ]
    return Image(
        meta=dict(meta or {}),
        scalars=scalars,
        tables=tables,
        queues=queues,
        # Keys and values as two lists of the table's own objects (no tuple made per key), read
        # through the plain dict underneath: 5-10x faster than walking the OrderedDict's links.
        # Same order, as the table only appends new keys and pops at its ends (no move_to_end).
        uniq_keys=list(dict.keys(state.uniq)),
        uniq_places=list(dict.values(state.uniq)),
        byte_lists={
            "send_backs": list(state.send_backs._keys),
            "resolved": list(state._resolved_before_base._keys),
        },
        schedule=list(state.schedule.pending.items()),
    )


# ---------------------------------------------------------------------- render (in a thread)


class _Blob:
    """The binary part, built column by column; each column is referenced as [offset, bytes]."""

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = 0

    def add(self, data: bytes | memoryview) -> list[int]:
        ref = [self.size, len(data)]
        self.parts.append(data)
        self.size += len(data)
        return ref

    def column(self, typecode: str, values: Any) -> list[int]:
        a = values if isinstance(values, array) else array(typecode, values)
        if not _LITTLE:
            a = array(typecode, a)
            a.byteswap()
        return self.add(memoryview(a).cast("B"))  # the image's own copy: no second one

    def byte_list(self, items: list[bytes]) -> list[list[int]]:
        return [self.column("I", map(len, items)), self.add(b"".join(items))]


def render(image: Image) -> bytes:
    """The checkpoint file's bytes for ``image`` (deterministic: same state, same bytes)."""
    return b"".join(render_parts(image))


def render_parts(image: Image) -> list[bytes | memoryview]:
    """``render``'s bytes as the buffers they are made of (the image's arrays among them),
    which ``write_file`` writes one after the other: a large state is not copied again."""
    blob = _Blob()
    queues = [
        [topic, qid, kind, base, blob.column("q", pos), blob.column("I", sizes), blob.column("I", tags)]
        for topic, qid, kind, base, pos, sizes, tags in image.queues
    ]
    # (queue offset, position, store ms) of every key, interleaved: one pass in C
    uniq = blob.byte_list(image.uniq_keys) + [blob.column("q", chain.from_iterable(image.uniq_places))]
    header = {
        "meta": image.meta,
        "scalars": image.scalars,
        "tables": image.tables,
        "queues": queues,
        "uniq": uniq,
        "byte_lists": {name: blob.byte_list(items) for name, items in sorted(image.byte_lists.items())},
        "schedule": [
            blob.column("q", (p for p, _ in image.schedule)),
            blob.column("q", (d for _, d in image.schedule)),
        ],
    }
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    parts = [_PREFIX.pack(MAGIC, VERSION, 0, len(head), blob.size) + head, *blob.parts]
    digest = xxhash.xxh64()
    for part in parts:
        digest.update(part)
    parts.append(_DIGEST.pack(digest.intdigest()))
    return parts


def encode(state: BrokerState, meta: dict[str, Any] | None = None) -> bytes:
    """``render(capture(state, meta))``: what tests and benches compare states by."""
    return render(capture(state, meta))


# ---------------------------------------------------------------------- decode


def _int(v: Any, what: str, lo: int = -(1 << 63), hi: int = (1 << 63) - 1) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise CheckpointError(
            f"{what}: expected an integer in [{lo}, {hi}], got {type(v).__name__} {v!r:.40}"
        )
    return v


def _str(v: Any, what: str) -> str:
    if type(v) is not str:
        raise CheckpointError(f"{what}: expected a string, got {type(v).__name__}")
    return v


def _list(v: Any, what: str, n: int | None = None) -> list[Any]:
    if type(v) is not list or (n is not None and len(v) != n):
        size = "" if n is None else f" of {n}"
        raise CheckpointError(f"{what}: expected a list{size}, got {type(v).__name__} {v!r:.40}")
    return v


def _dict(v: Any, what: str) -> dict[str, Any]:
    if type(v) is not dict:
        raise CheckpointError(f"{what}: expected an object, got {type(v).__name__}")
    return v


class _BlobReader:
    def __init__(self, blob: memoryview) -> None:
        self.blob = blob

    def raw(self, ref: Any, what: str) -> memoryview:
        off, n = _list(ref, what, 2)
        _int(off, what + " offset", 0)
        _int(n, what + " length", 0)
        if off + n > len(self.blob):
            raise CheckpointError(f"{what}: bytes {off}..{off + n} run past the blob's {len(self.blob)}")
        return self.blob[off : off + n]

    def column(self, typecode: str, ref: Any, what: str) -> array[int]:
        a = array(typecode)
        raw = self.raw(ref, what)
        if len(raw) % a.itemsize:
            raise CheckpointError(f"{what}: {len(raw)} bytes is no whole number of {a.itemsize}-byte items")
        a.frombytes(raw)
        if not _LITTLE:
            a.byteswap()
        return a

    def byte_list(self, refs: Any, what: str) -> list[bytes]:
        lens_ref, data_ref = _list(refs, what, 2)
        lengths = self.column("I", lens_ref, what + " lengths")
        data = bytes(self.raw(data_ref, what + " bytes"))
        if sum(lengths) != len(data):
            raise CheckpointError(f"{what}: item lengths add up to {sum(lengths)}, not {len(data)}")
        ends = list(accumulate(lengths))
        return [data[e - n : e] for e, n in zip(ends, lengths, strict=True)]


@dataclass(slots=True)
class Loaded:
    """A decoded checkpoint: the state after applying ``state.applied`` and what it was written with."""

    state: BrokerState
    meta: dict[str, Any]


def split(data: bytes) -> tuple[dict[str, Any], memoryview]:
    """(header, blob) of a checkpoint file's bytes, after checking its length, checksum and version."""
    if len(data) < _PREFIX.size + _DIGEST.size:
        raise CheckpointError(f"truncated: {len(data)} bytes is shorter than the fixed header")
    magic, version, _, head_len, blob_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointError(f"not a broker checkpoint (magic {magic!r})")
    expected = _PREFIX.size + head_len + blob_len + _DIGEST.size
    if head_len > MAX_HEADER_BYTES or expected != len(data):
        raise CheckpointError(f"truncated or overlong: {len(data)} bytes, the header says {expected}")
    (digest,) = _DIGEST.unpack_from(data, len(data) - _DIGEST.size)
    if xxhash.xxh64_intdigest(memoryview(data)[: -_DIGEST.size]) != digest:
        raise CheckpointError("checksum mismatch (the file is corrupt)")
    if version != VERSION:
        raise CheckpointError(f"version {version}, this broker reads version {VERSION}")
    start = _PREFIX.size
    try:
        header = json.loads(bytes(data[start : start + head_len]))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"header is no valid JSON: {exc}") from None
    return _dict(header, "header"), memoryview(data)[start + head_len : start + head_len + blob_len]


def decode(data: bytes) -> Loaded:
    """The state a checkpoint holds; ``CheckpointError`` (never another exception) if it cannot."""
    try:
        return _decode(data)
    except CheckpointError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, MemoryError) as exc:
        raise CheckpointError(f"malformed: {type(exc).__name__}: {exc}") from None


def _decode(data: bytes) -> Loaded:
    header, blob_view = split(data)
    blob = _BlobReader(blob_view)
    meta = _dict(header.get("meta"), "meta")
    sc = _dict(header.get("scalars"), "scalars")
    tb = _dict(header.get("tables"), "tables")
    state = BrokerState(
        dedup_window=_int(sc.get("dedup_window"), "dedup_window", 1),
        applied=_int(sc.get("applied"), "applied", 0),
    )
    state.dedup_ttl_ms = _int(sc.get("dedup_ttl_ms"), "dedup_ttl_ms", 0)
    state._ttl_due = _int(sc.get("ttl_due"), "ttl_due")
    state.dispatched_messages = _int(sc.get("dispatched_messages"), "dispatched_messages", 0)
    state.skipped_entries = _int(sc.get("skipped_entries"), "skipped_entries", 0)
    state.replay_base = _int(sc.get("replay_base"), "replay_base", 0)
    ts, counter = _list(sc.get("data_version"), "data_version", 2)
    state.data_version = DataVersion(_int(ts, "data_version"), _int(counter, "data_version"))
    state.locks = QueueLocks(_int(sc.get("locks_max"), "locks_max", 1))
    state.send_backs = TakenKeys(_int(sc.get("send_backs_window"), "send_backs_window", 1))
    state._resolved_before_base = TakenKeys(_int(sc.get("resolved_window"), "resolved_window", 1))
    state.pops = PopStates(_int(sc.get("pops_max_queues"), "pops_max_queues", 1))

    for i, row in enumerate(_list(tb.get("topics"), "topics")):
        name, read, write, perm, order = _list(row, f"topic {i}", 5)
        if type(order) is not bool:
            raise CheckpointError(f"topic {i}: order must be a boolean")
        tc = TopicConfig(
            _str(name, "topic name"),
            _int(read, "read queues", 0),
            _int(write, "write queues", 0),
            _int(perm, "perm"),
            order=order,
        )
        state.topics[name] = tc
        state._topic_entries[name] = topic_entry_json(tc)
    for row in _list(tb.get("offsets"), "offsets"):
        g, t, q, o = _list(row, "offset", 4)
        state.offsets[(_str(g, "offset group"), _str(t, "offset topic"), _int(q, "offset queue"))] = _int(
            o, "offset"
        )
    for row in _list(tb.get("keys"), "keys"):
        t, k, positions = _list(row, "key index entry", 3)
        state.keys[(_str(t, "key topic"), _str(k, "key"))] = [
            _int(p, "key position") for p in _list(positions, "key positions")
        ]
    for row in _list(tb.get("halves"), "halves"):
        p, group, store_ms, immunity = _list(row, "half message", 4)
        state.halves.add(
            _int(p, "half position"),
            Half(_str(group, "half group"), _int(store_ms, "half"), _int(immunity, "half")),
        )
    for row in _list(tb.get("locks"), "locks"):
        g, t, q, c, e = _list(row, "queue lock", 5)
        state.locks.held[(_str(g, "lock"), _str(t, "lock"), _int(q, "lock"))] = (
            _str(c, "lock"),
            _int(e, "lock"),
        )
    for row in _list(tb.get("lock_outcomes"), "lock_outcomes"):
        i, granted = _list(row, "lock outcome", 2)
        state.lock_outcomes[_int(i, "lock outcome index")] = frozenset(
            (_str(t, "lock outcome"), _int(q, "lock outcome"))
            for t, q in (_list(x, "lock outcome queue", 2) for x in _list(granted, "lock outcome"))
        )
    for row in _list(tb.get("pop_outcomes"), "pop_outcomes"):
        i, items = _list(row, "pop outcome", 2)
        out: list[Any] = []
        for x in _list(items, "pop outcome"):
            if type(x) is str:
                out.append(x)
            else:
                out.append(Granted(*(_int(v, "pop outcome") for v in _list(x, "pop grant", 5))))
        state.pop_outcomes[_int(i, "pop outcome index")] = out
    for row in _list(tb.get("pops"), "pops"):
        g, t, q, cursor, last, inflight = _list(row, "pop queue", 6)
        pq = PopQueue(_int(cursor, "pop cursor"))
        pq.last_pop_time = _int(last, "pop time")
        for e in _list(inflight, "pop in-flight"):
            o, pop_time, deadline, times = (_int(v, "pop in-flight") for v in _list(e, "pop in-flight", 4))
            pq.inflight[o] = InFlight(pop_time, deadline, times)
        state.pops.queues[(_str(g, "pop group"), _str(t, "pop topic"), _int(q, "pop queue"))] = pq
    for row in _list(tb.get("delay_cursors"), "delay_cursors"):
        level, offset = _list(row, "delay cursor", 2)
        state._delay_cursors[_int(level, "delay level")] = _int(offset, "delay cursor")
    for row in _list(tb.get("broker_addrs"), "broker_addrs"):
        nid, addr = _list(row, "broker addr", 2)
        state.broker_addrs[_str(nid, "broker addr")] = _str(addr, "broker addr")

    for i, row in enumerate(_list(header.get("queues"), "queues")):
        topic, qid, kind, base, pos_ref, sizes_ref, tags_ref = _list(row, f"queue {i}", 7)
        topic, qid = _str(topic, f"queue {i} topic"), _int(qid, f"queue {i} id", 0, (1 << 31) - 1)
        cq = ConsumeQueue(topic, qid, _int(kind, f"queue {topic}:{qid} kind"))
        if cq.kind != queue_kind(topic):
            raise CheckpointError(f"queue {topic}:{qid}: kind {cq.kind}, its topic's is {queue_kind(topic)}")
        cq.base = _int(base, f"queue {topic}:{qid} base", 0)
        cq.positions = blob.column("q", pos_ref, f"queue {topic}:{qid} positions")
        cq.sizes = blob.column("I", sizes_ref, f"queue {topic}:{qid} sizes")
        cq.tags = blob.column("I", tags_ref, f"queue {topic}:{qid} tags")
        if not len(cq.positions) == len(cq.sizes) == len(cq.tags):
            raise CheckpointError(f"queue {topic}:{qid}: positions, sizes and tags differ in length")
        if (topic, qid) in state.queues:
            raise CheckpointError(f"queue {topic}:{qid} twice")
        state.queues[(topic, qid)] = cq
        state._queue_cache[(topic.encode(), qid)] = cq

    keys_ref, data_ref, places_ref = _list(header.get("uniq"), "uniq", 3)
    keys = blob.byte_list([keys_ref, data_ref], "uniq keys")
    places = blob.column("q", places_ref, "uniq places")
    if len(places) != 3 * len(keys):
        raise CheckpointError(f"uniq: {len(keys)} keys but {len(places)} place values (3 per key)")
    state.uniq = OrderedDict(
        zip(keys, zip(places[0::3], places[1::3], places[2::3], strict=True), strict=True)
    )
    if len(state.uniq) != len(keys):
        raise CheckpointError("uniq: a key twice")

    lists = _dict(header.get("byte_lists"), "byte_lists")
    for name, target in (("send_backs", state.send_backs), ("resolved", state._resolved_before_base)):
        items = blob.byte_list(lists.get(name), name)
        target._keys = OrderedDict.fromkeys(items)
    positions_ref, due_ref = _list(header.get("schedule"), "schedule", 2)
    positions = blob.column("q", positions_ref, "schedule positions")
    dues = blob.column("q", due_ref, "schedule due times")
    if len(positions) != len(dues):
        raise CheckpointError("schedule: positions and due times differ in length")
    state.schedule = Schedule()
    for p, d in zip(positions, dues, strict=True):
        state.schedule.add(p, d)
    return Loaded(state, meta)


# ---------------------------------------------------------------------- files


def write_file(path: Path, data: bytes | Sequence[bytes | memoryview]) -> None:
    """Store ``data`` (bytes, or buffers one after the other) at ``path`` atomically: a
    temporary file, fsync, rename, fsync the directory."""
    # a name of its own: a write still running in a thread after its task was cancelled (at
    # shutdown) must not share a file with the next one; the last rename wins, whole either way
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{next(_TMP_IDS)}.tmp")
    with open(tmp, "wb") as f:
        if isinstance(data, bytes):
            f.write(data)
        else:
            f.writelines(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale(path: Path) -> list[Path]:
    """Remove temporary files a crash left beside ``path`` (never read: only renames publish)."""
    gone = []
    for tmp in path.parent.glob(f"{path.name}.*.tmp"):
        try:
            tmp.unlink()
            gone.append(tmp)
        except OSError:
            pass
    return gone


def read_file(path: Path) -> Loaded:
    """Decode the checkpoint at ``path``; ``CheckpointError`` if it is unreadable or invalid."""
    try:
        size = path.stat().st_size
        if size > MAX_CHECKPOINT_BYTES:
            raise CheckpointError(
                f"{size} bytes is more than the {MAX_CHECKPOINT_BYTES} a checkpoint may have"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"unreadable: {exc}") from None
    return decode(data)


__all__ = [
    "CHECKPOINT_FILE",
    "CheckpointError",
    "Image",
    "Loaded",
    "capture",
    "decode",
    "encode",
    "read_file",
    "remove_stale",
    "render",
    "render_parts",
    "write_file",
]
