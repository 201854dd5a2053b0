"""The broker's state machine: what committed ledger entries mean, with no I/O at all.

The ledger IS the commit log (RocketMQ's DLedgerCommitLog). Everything else a broker knows
is derived from committed entries in log order, identically on every broker of the group:
consume queues and queue offsets, consumer offsets, topic configs, the idempotent
producers' de-duplication table and the key index. ``apply`` takes committed entries and
returns what changed (``Effects``), so the broker shell can wake long polls and
re-register; it never reads the ledger, starts a task or touches a socket, which is what
lets tests drive it entry by entry. After a restart the shell replays the retained log
into a fresh state, so nothing here needs its own durability.

Because queue offsets are assigned here, a message's offset is known once its entry is
applied; ``placement`` answers "where did the records of entry i land" from the state
itself, so a send is answered with its offsets without any table of appends in flight.
"""

from __future__ import annotations

import bisect
import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from remoting.topic import DataVersion, TopicConfig, TopicConfigWrapper

from . import codec
from .codec import KIND_META, SLOT_BITS, CodecError, Record
from .consume_queue import ConsumeQueue
from .meta import decode_meta, snapshot_op

log = logging.getLogger("broker.state")

DEFAULT_DEDUP_WINDOW = 100_000  # message unique keys (UNIQ_KEY) remembered for de-duplication


@dataclass(slots=True)
class Stored:
    """Where a message ended up; ``duplicate`` means an earlier copy with the same UNIQ_KEY stands."""

    queue_offset: int
    position: int  # ledger index << 16 | slot (codec.make_position)
    duplicate: bool = False

    @property
    def ledger_index(self) -> int:
        return self.position >> SLOT_BITS


@dataclass(slots=True)
class Effects:
    """What one ``apply`` changed that someone outside the state machine waits on."""

    queues: set[tuple[str, int]] = field(default_factory=set)  # (topic, queue id) that got messages
    topics_changed: bool = False  # the topic table (and its data version) changed

    def merge(self, other: Effects) -> None:
        self.queues |= other.queues
        self.topics_changed |= other.topics_changed


class BrokerState:
    """Consume queues, consumer offsets, topics, de-duplication and key index of one broker group."""

    def __init__(self, dedup_window: int = DEFAULT_DEDUP_WINDOW, applied: int = 0) -> None:
        if dedup_window < 1:
            raise ValueError(f"dedup_window must be at least 1, got {dedup_window}")
        self.dedup_window = dedup_window
        self.applied = applied  # the last ledger index applied
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._queue_cache: dict[tuple[bytes, int], ConsumeQueue] = {}  # keyed by raw topic bytes
        self.topics: dict[str, TopicConfig] = {}
        self.data_version = DataVersion()
        self.offsets: dict[tuple[str, str, int], int] = {}
        # UNIQ_KEY -> where it was stored: a producer's retry of a send whose answer it never
        # saw (RocketMQ clients keep the key across retries) is stored once.
        self.uniq: OrderedDict[bytes, tuple[int, int]] = OrderedDict()  # -> (queue offset, position)
        self.keys: dict[tuple[str, str], list[int]] = {}
        self.dispatched_messages = 0

    # ------------------------------------------------------------------ apply

    def apply(self, entries: Iterable[tuple[int, Record]]) -> Effects:
        """Apply committed (index, payload) entries, in log order, each exactly once.

        Entries at or below ``applied`` are refused (a replay bug, not bad data); an empty
        payload is a leader's no-op; a payload of unknown type is logged and skipped.

        Every broker runs this for every message, so it is written for speed: one loop over
        the records of all the entries (an unbatched send is an entry of one record, so
        per-entry set-up would cost as much as the record), the records of a run in one
        queue share its lookup, and a ``Stored`` is made only for de-duplication.
        """
        effects = Effects()
        touched = effects.queues
        parse = codec.parse_entry
        magic = codec.MAGIC
        queue_cache = self._queue_cache
        uniq_seen = self.uniq
        window = self.dedup_window
        last_key: tuple[bytes, int] | None = None
        cq: ConsumeQueue | None = None
        dispatched = 0
        try:
            for index, data in entries:
                if index <= self.applied:
                    raise ValueError(f"entry {index} applied twice (applied through {self.applied})")
                if len(data) >= 8 and data[4:8] == magic:  # codec.KIND_MESSAGE
                    try:
                        records = parse(data)
                    except CodecError as exc:
                        log.error("undecodable message entry", extra={"index": index, "error": str(exc)})
                        records = ()
                    base = index << SLOT_BITS
                    for slot, parsed in enumerate(records):
                        if type(parsed) is not tuple:
                            log.error(
                                "undecodable message record",
                                extra={"position": base | slot, "error": str(parsed)},
                            )
                            continue
                        topic_raw, qid, th, uniq, keyed, size = parsed
                        key = (topic_raw, qid)
                        if key != last_key:
                            try:
                                cq = queue_cache.get(key) or self._new_queue(key)
                            except UnicodeDecodeError as exc:
                                log.error(
                                    "undecodable topic", extra={"position": base | slot, "error": str(exc)}
                                )
                                last_key = None
                                continue
                            last_key = key
                            touched.add((cq.topic, qid))
                        assert cq is not None
                        if uniq is not None and uniq in uniq_seen:
                            continue
                        position = base | slot
                        positions = cq.positions
                        positions.append(position)
                        cq.sizes.append(size)
                        cq.tags.append(th)
                        dispatched += 1
                        if uniq is not None:
                            uniq_seen[uniq] = (cq.base + len(positions) - 1, position)
                            if len(uniq_seen) > window:
                                uniq_seen.popitem(last=False)
                        if keyed is not None:
                            self._index_keys(cq.topic, position, keyed)
                elif data:
                    kind = data[0]
                    if kind == KIND_META:
                        effects.topics_changed |= self._apply_meta(index, data)
                    else:
                        log.error(
                            "skipping ledger entry of unknown record type",
                            extra={"index": index, "type": kind},
                        )
                self.applied = index
        finally:
            self.dispatched_messages += dispatched
        return effects

    def skip_to(self, index: int) -> None:
        """The ledger no longer holds entries up to ``index`` (retention, or a snapshot installed)."""
        self.applied = max(self.applied, index)

    def _new_queue(self, key: tuple[bytes, int]) -> ConsumeQueue:
        """The consume queue for (raw topic, queue id), created on its first message."""
        tb, qid = key
        name = (tb.decode(), qid)
        cq = self.queues.get(name)
        if cq is None:
            cq = self.queues[name] = ConsumeQueue(name[0], qid)
        self._queue_cache[key] = cq
        return cq

    def _index_keys(self, topic: str, position: int, props: Record) -> None:
        for k in codec.record_keys(props):
            lst = self.keys.setdefault((topic, k), [])
            lst.append(position)
            if len(lst) > codec.KEYS_PER_INDEX_ENTRY:
                del lst[0]

    def _apply_meta(self, index: int, data: Record) -> bool:
        """Apply a metadata record; True if the topic table changed."""
        try:
            doc = decode_meta(data)
            op = doc["op"]
            if op == "offset":
                key = (str(doc["group"]), str(doc["topic"]), int(doc["queue"]))
                offset = int(doc["offset"])
                if doc.get("forward"):  # a commit piggy-backed on a pull never moves an offset back
                    offset = max(offset, self.offsets.get(key, offset))
                self.offsets[key] = offset
            elif op == "topic":
                self.topics[doc["name"]] = _topic_config(doc["name"], doc)
                # Derived from the log position, so every broker computes the same version.
                self.data_version = DataVersion(index, self.data_version.counter + 1)
                return True
            elif op == "snapshot":
                for name, t in doc["topics"].items():
                    self.topics[name] = _topic_config(name, t)
                for g, t, q, o in doc["offsets"]:
                    self.offsets[(str(g), str(t), int(q))] = int(o)
                self.data_version = DataVersion(index, self.data_version.counter + 1)
                return True
            else:
                log.error("unknown metadata op", extra={"index": index, "op": op})
        except (ValueError, KeyError, TypeError) as exc:
            log.error("bad metadata record", extra={"index": index, "error": str(exc)})
        return False

    # ------------------------------------------------------------------ outcomes of appends

    def placement(self, index: int, data: Record, hint: tuple[bytes, int] | None = None) -> list[Stored]:
        """Where the records of applied entry ``index`` (payload ``data``) landed, slot by slot.

        A record stored at its own position gets its queue offset; a de-duplicated one gets
        the offset and position of the copy that stands; an undecodable one, a metadata
        record or a corrupt batch entry gets queue offset -1. Derived from the consume
        queues and the de-duplication table, so the broker needs no record of what it
        proposed beyond the payloads themselves.

        ``hint`` is the (raw topic, queue id) the records were sent to, when the caller knows
        it (a master answering its own send): the queue is then looked up without parsing a
        record. It only saves work: a record is placed in the hinted queue only if that queue
        holds the record's own position, which no other record can have.
        """
        if index > self.applied:
            raise ValueError(f"entry {index} is not applied yet (applied through {self.applied})")
        base = index << SLOT_BITS
        cq: ConsumeQueue | None = None
        j = 0  # where in cq the next record of this entry would be, if it is there
        if hint is not None:
            cq = self._queue_cache.get(hint)
            if cq is not None:
                try:
                    count = codec.record_count(data)
                except CodecError:
                    return [Stored(-1, base)]
                positions = cq.positions
                j = _find(positions, base)
                # The common case, a send stored whole in its queue: positions base..base+count-1.
                if (
                    j + count <= len(positions)
                    and positions[j] == base
                    and positions[j + count - 1] == base + count - 1
                ):
                    first = cq.base + j
                    if count == 1:
                        return [Stored(first, base)]
                    return [Stored(first + slot, base | slot) for slot in range(count)]
        try:
            records = codec.entry_records(data)
        except CodecError:
            return [Stored(-1, base)]
        out: list[Stored] = []
        cursors: dict[int, int] = {}
        for slot, rec in enumerate(records):
            position = base | slot
            if cq is not None and j < len(cq.positions) and cq.positions[j] == position:
                out.append(Stored(cq.base + j, position))  # the common case: no parsing at all
                j += 1
                continue
            try:
                topic_raw, qid, _, uniq, _ = codec.parse_record(rec)
            except CodecError:
                out.append(Stored(-1, position))
                continue
            other = self._queue_cache.get((topic_raw, qid))  # every queue that got a message is here
            if other is not None and other is not cq:
                if cq is not None:
                    cursors[id(cq)] = j
                cq = other
                j = cursors.get(id(cq))
                if j is None:
                    j = _find(cq.positions, position)
            if cq is not None and j < len(cq.positions) and cq.positions[j] == position:
                out.append(Stored(cq.base + j, position))
                j += 1
                continue
            prior = self.uniq.get(uniq) if uniq is not None else None
            if prior is None:
                out.append(Stored(-1, position))
            else:
                out.append(Stored(prior[0], prior[1], prior[1] != position))
        return out or [Stored(-1, base)]

    # ------------------------------------------------------------------ reads

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def offsets_of(self, topic: str, queue_id: int, first_index: int = 0) -> tuple[int, int]:
        """(min offset, max offset) of a queue; (0, 0) for a queue with no messages yet.

        Messages in entries below ``first_index`` (removed by retention) are forgotten first.
        """
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            return (0, 0)
        first = first_index << SLOT_BITS
        if cq.positions and cq.positions[0] < first:
            cq.trim_before(first)
        return cq.min_offset, cq.max_offset

    def queue_offset_of(self, topic: str, queue_id: int, position: int) -> int:
        """The queue offset of the message at ``position``, or -1 if that queue does not hold it."""
        cq = self.queues.get((topic, queue_id))
        qoff = cq.offset_of_position(position) if cq else None
        return -1 if qoff is None else qoff

    def positions_by_key(self, topic: str, key: str) -> list[int]:
        return list(self.keys.get((topic, key), ()))

    def topic_config_wrapper(self) -> TopicConfigWrapper:
        return TopicConfigWrapper(dict(self.topics), self.data_version)

    def snapshot_record(self) -> bytes:
        """All topics and consumer offsets as one metadata record (a retention checkpoint)."""
        topics = {
            n: {"read": t.read_queue_nums, "write": t.write_queue_nums, "perm": t.perm, "order": t.order}
            for n, t in self.topics.items()
        }
        offsets = [[g, t, q, o] for (g, t, q), o in self.offsets.items()]
        return snapshot_op(topics, offsets)

    def stats(self) -> dict[str, Any]:
        return {
            "applied_index": self.applied,
            "dispatched_messages": self.dispatched_messages,
            "topics": len(self.topics),
            "queues": {f"{t}:{q}": cq.max_offset for (t, q), cq in sorted(self.queues.items())},
            "consumer_offsets": len(self.offsets),
            "dedup_keys": len(self.uniq),
        }


def _find(positions: Sequence[int], position: int) -> int:
    """Where ``position`` is, or would be, in a queue's increasing positions. An append is
    answered right after its entry is applied, so it is usually at the tail: checked first."""
    last = len(positions) - 1
    if last >= 0 and positions[last] == position:
        return last
    return bisect.bisect_left(positions, position)


def _topic_config(name: str, doc: dict[str, Any]) -> TopicConfig:
    return TopicConfig(
        name, int(doc["read"]), int(doc["write"]), int(doc["perm"]), order=bool(doc.get("order"))
    )
