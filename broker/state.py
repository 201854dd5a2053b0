"""The broker's state machine: what committed ledger entries mean, with no I/O at all.

The ledger IS the commit log (RocketMQ's DLedgerCommitLog). Everything else a broker knows
is derived from committed entries in log order, identically on every broker of the group:
consume queues and queue offsets, consumer offsets, topic configs, the idempotent
producers' de-duplication table and the key index. ``apply`` takes committed entries and
returns what changed (``Effects``), so the broker shell can wake long polls and
re-register; it never reads the ledger, starts a task or touches a socket, which is what
lets tests drive it entry by entry. After a restart the shell loads the last checkpoint
of this state (``broker.checkpoint``, which reads these attributes; a new one must be added
there too, or tests/test_broker_checkpoint.py fails) and replays the
log after it, or replays the whole retained log into a fresh state; nothing here needs its
own durability.

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
from itertools import islice, repeat
from typing import Any

from remoting.message import (
    PROPERTY_CHECK_IMMUNITY_TIME,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TIMER_OUT_MS,
    MessageFormatError,
    properties_from_bytes,
    stored_record_fields,
)
from remoting.topic import DataVersion, TopicConfig, TopicConfigWrapper, topic_entry_json

from . import codec
from .codec import KIND_DERIVED, KIND_META, SLOT_BITS, CodecError, Record
from .consume_queue import ConsumeQueue
from .meta import (
    BrokerAddrOp,
    LockOp,
    MetaError,
    OffsetOp,
    PopAckOp,
    PopOp,
    SnapshotOp,
    TopicOp,
    TxnEndOp,
    parse_meta,
    snapshot_op,
)
from .pop import Granted, PopStates
from .schedule import Half, HalfMessages, QueueLocks, Schedule, TakenKeys
from .system_topics import HALF, SCHEDULE_TOPIC, SCHEDULED, queue_kind

log = logging.getLogger("broker.state")

DEFAULT_DEDUP_WINDOW = 100_000  # message unique keys (UNIQ_KEY) remembered for de-duplication
DEFAULT_DEDUP_TTL_S = 600.0
MAX_LISTED_QUEUES = 1024  # queues a status answer lists by name
MAX_POP_OUTCOMES = 4096  # POP/ack entries whose outcomes are kept for their answers (> a slice's entries)
MAX_BROKER_ADDR_TABLE = 256  # members' broker addresses kept (broker.membership); the oldest go first
MAX_LOCK_OUTCOMES = 4096  # lock entries whose grants are kept for their answers  # ... and for at most this long (by the records' store time); 0: no limit


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

    def __init__(
        self,
        dedup_window: int = DEFAULT_DEDUP_WINDOW,
        applied: int = 0,
        dedup_ttl_s: float = DEFAULT_DEDUP_TTL_S,
    ) -> None:
        if dedup_window < 1:
            raise ValueError(f"dedup_window must be at least 1, got {dedup_window}")
        if dedup_ttl_s < 0:
            raise ValueError(f"dedup_ttl_s must not be negative, got {dedup_ttl_s}")
        self.dedup_window = dedup_window
        self.applied = applied  # the last ledger index applied
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._queue_cache: dict[tuple[bytes, int], ConsumeQueue] = {}  # keyed by raw topic bytes
        self.topics: dict[str, TopicConfig] = {}
        self._topic_entries: dict[str, bytes] = {}  # each topic's REGISTER_BROKER entry, kept encoded
        self.data_version = DataVersion()
        self.offsets: dict[tuple[str, str, int], int] = {}
        # UNIQ_KEY -> where it was stored: a producer's retry of a send whose answer it never
        # saw (RocketMQ clients keep the key across retries) is stored once.
        # -> (queue offset, position, store ms), oldest first
        self.uniq: OrderedDict[bytes, tuple[int, int, int]] = OrderedDict()
        self.dedup_ttl_ms = int(dedup_ttl_s * 1000)
        self._ttl_due = 0  # store time from which _forget_keys may find expired keys
        self.keys: dict[tuple[str, str], list[int]] = {}
        self.dispatched_messages = 0
        self.skipped_entries = 0  # committed entries no replica could apply (logged, passed over)
        # promises the group keeps later (broker.schedule): every broker holds the same ones
        self.schedule = Schedule()
        self.halves = HalfMessages()
        self.locks = QueueLocks()
        self.send_backs = TakenKeys(dedup_window)
        self.lock_outcomes: OrderedDict[int, frozenset[tuple[str, int]]] = OrderedDict()  # by entry index
        self.pops = PopStates()  # RocketMQ 5's POP consumption (broker.pop)
        self.pop_outcomes: OrderedDict[int, list[Any]] = OrderedDict()  # by entry index, for the answers
        # The first index this state replayed (entries before it were removed by retention): a
        # derived record resolving something from before it is stored the first time it is met.
        self.replay_base = applied + 1
        self._resolved_before_base = TakenKeys(dedup_window)
        self._delay_cursors: dict[
            int, int
        ] = {}  # schedule queue id -> offset before which all were delivered
        # members' broker addresses as the log says them (BrokerAddrOp; broker.membership)
        self.broker_addrs: dict[str, str] = {}

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
        unpack = codec.RECORD_FIXED.unpack_from
        uniq_probe = codec.UNIQ_PROBE
        uniq_at = len(uniq_probe)
        head = codec.STORED_HEADER_SIZE
        v6 = codec.V6_FLAGS
        magic_code = codec.MAGIC
        uniq_seen = self.uniq
        window = self.dedup_window
        bfind, bstartswith = bytes.find, bytes.startswith
        last: tuple[bytes, int, ConsumeQueue] | None = None  # (raw topic, queue id, queue) of the last record
        dispatched = 0
        try:
            for index, data in entries:
                if index <= self.applied:
                    raise ValueError(f"entry {index} applied twice (applied through {self.applied})")
                if len(data) < 8 or data[4:8] != magic_code:  # not codec.KIND_MESSAGE
                    if data:
                        kind = data[0]
                        if kind == KIND_META:
                            effects.topics_changed |= self._apply_meta(index, data)
                        elif kind == KIND_DERIVED:
                            self._apply_derived(index, data, touched)
                        else:
                            self._skip(index, f"unknown record type {kind}")
                    self.applied = index
                    continue
                if type(data) is not bytes:
                    data = bytes(data)
                n = len(data)
                base = index << SLOT_BITS
                hit = [] if last is None else [last[2]]  # queues this entry's records went to
                added = 0
                keyed_any = False
                try:
                    if int.from_bytes(data[:4], "big") < n and self._dispatch_uniform(index, data, touched):
                        self.applied = index  # a batch, in bulk (a single record is cheaper as below)
                        continue
                    # Record by record, in place: the topic compared rather than copied when it
                    # repeats, a UNIQ_KEY alone (what producers send) taken without parsing.
                    store_ms = 0
                    slot = -1
                    off = 0
                    while off < n:
                        slot += 1
                        if n - off < head + 3:
                            if n - off >= 8 and data[off + 4 : off + 8] == magic_code:
                                size = int.from_bytes(data[off : off + 4], "big")
                                if head > size and off + size <= n:
                                    self._undecodable(
                                        base | slot, f"stored record of {size} bytes is truncated"
                                    )
                                    off += size
                                    continue
                            dispatched -= self._undo_entry(
                                index, base, hit, keyed_any, added, f"truncated record at byte {off}"
                            )
                            added = 0
                            last = None
                            break
                        size, magic, qid, sysflag, store_ms, blen = unpack(data, off)
                        end = off + size
                        if size < 8 or end > n or magic != magic_code:
                            dispatched -= self._undo_entry(
                                index, base, hit, keyed_any, added, f"bad record of size {size} at byte {off}"
                            )
                            added = 0
                            last = None
                            break
                        if sysflag & v6:  # IPv6 hosts: the general parser
                            try:
                                topic, qid, th, uniq, keyed = codec.parse_record(data[off:end])
                                store_ms = codec.record_store_ms(data[off:end])
                            except CodecError as exc:
                                self._undecodable(base | slot, str(exc))
                                off = end
                                continue
                        else:
                            p = off + head + blen
                            if blen < 0 or p + 3 > end:
                                self._undecodable(
                                    base | slot,
                                    f"stored record at byte {off}: body length {blen} runs past its end",
                                )
                                off = end
                                continue
                            tlen = data[p]
                            if (
                                last is not None
                                and last[1] == qid
                                and len(last[0]) == tlen
                                and bstartswith(data, last[0], p + 1)
                            ):
                                topic = last[0]
                            else:
                                topic = data[p + 1 : p + 1 + tlen]
                            p += 1 + tlen
                            if p + 2 > end or p + 2 + (data[p] << 8 | data[p + 1]) != end:
                                self._undecodable(
                                    base | slot,
                                    f"stored record at byte {off}: lengths do not add up to its {size} bytes",
                                )
                                off = end
                                continue
                            p += 2
                            keyed = None
                            th = 0
                            if p == end:
                                uniq = None
                            elif bstartswith(data, uniq_probe, p) and bfind(data, b"\x02", p, end) == end - 1:
                                uniq = data[p + uniq_at : end - 1]
                            else:
                                th, uniq, keyed = codec.properties_in_place(data, p, end)
                        off = end
                        if last is None or last[1] != qid or last[0] is not topic and last[0] != topic:
                            try:
                                cq = self._queue_cache.get((topic, qid)) or self._new_queue((topic, qid))
                            except UnicodeDecodeError as exc:
                                self._undecodable(base | slot, f"undecodable topic: {exc}")
                                last = None
                                continue
                            last = (topic, qid, cq)
                            touched.add((cq.topic, qid))
                            hit.append(cq)
                        else:
                            cq = last[2]
                        if uniq is not None and uniq in uniq_seen:
                            continue
                        position = base | slot
                        positions = cq.positions
                        positions.append(position)
                        cq.sizes.append(size)
                        cq.tags.append(th)
                        dispatched += 1
                        if cq.kind:  # scheduled or half: held until due or committed
                            self._hold(cq, position, data[end - size : end], store_ms)
                        if uniq is not None:
                            uniq_seen[uniq] = (cq.base + len(positions) - 1, position, store_ms)
                            added += 1
                        if keyed is not None:
                            self._index_keys(cq.topic, position, keyed)
                            keyed_any = True
                    if added and (len(uniq_seen) > window or store_ms >= self._ttl_due):
                        self._forget_keys(store_ms)
                except Exception as exc:  # noqa: BLE001 - a record no check foresaw must not wedge the group
                    dispatched -= self._undo_entry(
                        index, base, hit, keyed_any, added, f"cannot apply: {type(exc).__name__}: {exc}"
                    )
                    self.skipped_entries += 1
                    last = None
                self.applied = index
        finally:
            self.dispatched_messages += dispatched
        return effects

    def _dispatch_uniform(self, index: int, data: bytes, touched: set[tuple[str, int]]) -> bool:
        """The common entry, dispatched in bulk: a producer's batch (or a single send) whose
        records all go to one queue, each with a new UNIQ_KEY and no other property (or all
        with none). False, with nothing changed, for any other entry: ``_dispatch`` then
        takes it record by record."""
        n = len(data)
        head = codec.STORED_HEADER_SIZE
        if n < head + 3:
            return False
        unpack = codec.RECORD_FIXED.unpack_from
        size, magic, qid, sysflag, store_ms, blen = unpack(data, 0)
        p = head + blen
        if magic != codec.MAGIC or sysflag & codec.V6_FLAGS or blen < 0 or p + 3 > size or size > n:
            return False
        tlen = data[p]
        topic = data[p + 1 : p + 1 + tlen]
        probe = codec.UNIQ_PROBE
        at = len(probe)
        sizes: list[int] = []
        uniqs: list[bytes] = []
        with_keys = None  # whether the records carry UNIQ_KEYs (decided by the first)
        plen = size - head - blen - 1 - tlen - 2  # (the first record's; checked by the walk otherwise)
        k = n // size
        if k * size == n and k >= _STRIDED_MIN and plen >= 0 and (plen == 0 or plen > at):
            # All the same size, as a producer's batch of equal bodies usually is: compare the
            # fields that must agree byte by byte across records, each as one strided slice.
            tail = p + 1 + tlen + 2  # where the properties start
            ranges = _STRIDED_FIELDS + ((p, tail + (at if plen else 0)),)
            if plen:
                ranges += ((size - 1, size),)  # every record's properties end with \x02
            if not _equal_across(data, size, k, ranges) or plen and not data.startswith(probe, tail):
                return False
            if plen:
                uniqs = [data[o : o + plen - at - 1] for o in range(tail + at, n, size)]
                joined = b"".join(uniqs)
                if b"\x01" in joined or b"\x02" in joined:  # more than a UNIQ_KEY
                    return False
            with_keys = plen > 0
            sizes = [size] * k
            n = 0  # (skip the record walk below)
        startswith = data.startswith
        find = data.find
        off = 0
        while off < n:
            if n - off < head + 3:
                return False
            size, magic, q, sysflag, ms, blen = unpack(data, off)
            end = off + size
            p = off + head + blen
            if (
                end > n
                or magic != codec.MAGIC
                or q != qid
                or ms != store_ms
                or sysflag & codec.V6_FLAGS
                or blen < 0
                or p + 3 + tlen > end
                or data[p] != tlen
                or not startswith(topic, p + 1)
            ):
                return False
            p += 1 + tlen
            if p + 2 + (data[p] << 8 | data[p + 1]) != end:
                return False
            p += 2
            if p == end:
                if with_keys:
                    return False
                with_keys = False
            elif with_keys is not False and startswith(probe, p) and find(b"\x02", p, end) == end - 1:
                with_keys = True
                uniqs.append(data[p + at : end - 1])
            else:
                return False
            sizes.append(size)
            off = end
        k = len(sizes)
        uniq_seen = self.uniq
        if with_keys and (len(set(uniqs)) != k or not uniq_seen.keys().isdisjoint(uniqs)):
            return False  # a duplicate among them: record by record
        try:
            cq = self._queue_cache.get((topic, qid)) or self._new_queue((topic, qid))
        except UnicodeDecodeError:
            return False
        if cq.kind:
            return False  # scheduled or half messages: record by record, to hold each
        base = index << SLOT_BITS  # slots 0..k-1 are base + slot
        first = cq.base + len(cq.positions)
        cq.positions.extend(range(base, base + k))
        cq.sizes.extend(sizes)
        cq.tags.frombytes(bytes(k * cq.tags.itemsize))  # no tags: code 0
        touched.add((cq.topic, qid))
        self.dispatched_messages += k
        if with_keys:
            places = zip(range(first, first + k), range(base, base + k), repeat(store_ms, k), strict=True)
            uniq_seen.update(zip(uniqs, places, strict=True))
            if len(uniq_seen) > self.dedup_window or store_ms >= self._ttl_due:
                self._forget_keys(store_ms)
        return True

    def _undo_entry(
        self, index: int, base: int, hit: list[ConsumeQueue], keyed_any: bool, added: int, error: str
    ) -> int:
        """Take back what an entry whose record boundaries turned out broken had dispatched
        (then none of its slots can be trusted, so none of its records is stored); returns
        how many records that was."""
        log.error("undecodable message entry", extra={"index": index, "error": f"message entry: {error}"})
        taken = 0
        for cq in hit:
            positions = cq.positions
            keep = bisect.bisect_left(positions, base)
            taken += len(positions) - keep
            del positions[keep:], cq.sizes[keep:], cq.tags[keep:]
        for _ in range(added):
            self.uniq.popitem(last=True)
        self._ttl_due = 0  # (recomputed at the next entry with keys)
        if keyed_any:
            for lst in self.keys.values():
                while lst and lst[-1] >= base:
                    lst.pop()
        return taken

    def _forget_keys(self, store_ms: int) -> None:
        """Keep the de-duplication table within ``dedup_window`` keys, none stored more than
        ``dedup_ttl_ms`` before ``store_ms``. Run after each entry that added keys, with the
        store time the master wrote into it, so every broker forgets the same keys at the
        same entry and de-duplicates identically."""
        uniq = self.uniq
        for _ in range(len(uniq) - self.dedup_window):
            uniq.popitem(last=False)
        if self.dedup_ttl_ms:
            horizon = store_ms - self.dedup_ttl_ms
            values = uniq.values()
            while uniq and next(iter(values))[2] < horizon:
                uniq.popitem(last=False)
            # the store time at which the oldest key left expires: no need to look before it
            self._ttl_due = next(iter(values))[2] + self.dedup_ttl_ms if uniq else 0
        else:
            self._ttl_due = 1 << 62

    def _undecodable(self, position: int, error: str) -> None:
        log.error("undecodable message record", extra={"position": position, "error": error})

    def skip_to(self, index: int) -> None:
        """The ledger no longer holds entries up to ``index`` (retention, or a snapshot installed)."""
        self.applied = max(self.applied, index)
        self.replay_base = max(self.replay_base, index + 1)

    def _new_queue(self, key: tuple[bytes, int]) -> ConsumeQueue:
        """The consume queue for (raw topic, queue id), created on its first message."""
        tb, qid = key
        name = (tb.decode(), qid)
        cq = self.queues.get(name)
        if cq is None:
            cq = self.queues[name] = ConsumeQueue(name[0], qid, queue_kind(name[0]))
        self._queue_cache[key] = cq
        return cq

    def _index_keys(self, topic: str, position: int, props: Record) -> None:
        for k in codec.record_keys(props):
            lst = self.keys.setdefault((topic, k), [])
            lst.append(position)
            if len(lst) > codec.KEYS_PER_INDEX_ENTRY:
                del lst[0]

    def _apply_meta(self, index: int, data: Record) -> bool:
        """Apply a metadata record; True if the topic table changed. A record no replica can
        apply (``MetaError``) is skipped, the same way on every broker of the group."""
        try:
            op = parse_meta(data)
        except MetaError as exc:
            self._skip(index, str(exc))
            return False
        if type(op) is TxnEndOp:
            self._resolve(codec.ORIGIN_HALF + op.half.to_bytes(8, "big"))
            return False
        if type(op) is LockOp:
            if op.expires:
                granted = self.locks.lock(op.group, op.client, op.queues, op.now, op.expires)
                self.lock_outcomes[index] = granted
                if len(self.lock_outcomes) > MAX_LOCK_OUTCOMES:
                    self.lock_outcomes.popitem(last=False)
            else:
                self.locks.unlock(op.group, op.client, op.queues)
            return False
        if type(op) is BrokerAddrOp:
            self._set_broker_addrs(op)
            return False
        if type(op) is PopOp or type(op) is PopAckOp:
            outcome: list[Granted] | list[str | Granted] = (
                self.pops.pop(op) if type(op) is PopOp else self.pops.ack(op)
            )
            self.pop_outcomes[index] = outcome
            if len(self.pop_outcomes) > MAX_POP_OUTCOMES:
                self.pop_outcomes.popitem(last=False)
            for key, offset in self.pops.progress(op):
                self.offsets[key] = offset
            return False
        if type(op) is OffsetOp:
            key = (op.group, op.topic, op.queue)
            offset = op.offset
            if op.forward:  # a commit piggy-backed on a pull never moves an offset back
                offset = max(offset, self.offsets.get(key, offset))
            self.offsets[key] = offset
            return False
        if type(op) is TopicOp:
            self._set_topic(op)
        else:
            assert type(op) is SnapshotOp
            for t in op.topics:
                self._set_topic(t)
            for o in op.offsets:
                self.offsets[(o.group, o.topic, o.queue)] = o.offset
        # Derived from the log position, so every broker computes the same version.
        self.data_version = DataVersion(index, self.data_version.counter + 1)
        return True

    # ------------------------------------------------------------------ held and derived messages

    def _hold(self, cq: ConsumeQueue, position: int, record: bytes, store_ms: int) -> None:
        """A message stored where it waits (a schedule or half queue): remember it pending."""
        try:
            props = properties_from_bytes(bytes(stored_record_fields(record)[4]))
        except (MessageFormatError, ValueError):
            props = {}
        if cq.kind == SCHEDULED:
            due = props.get(PROPERTY_TIMER_OUT_MS, "")
            self.schedule.add(position, int(due) if due.isdigit() and len(due) < 19 else store_ms)
        elif cq.kind == HALF:
            immunity = props.get(PROPERTY_CHECK_IMMUNITY_TIME, "")
            immunity_ms = int(immunity) * 1000 if immunity.isdigit() and len(immunity) < 10 else 0
            self.halves.add(position, Half(props.get(PROPERTY_PRODUCER_GROUP, ""), store_ms, immunity_ms))

    def _resolve(self, origin: bytes) -> bool:
        """Whether the promise ``origin`` names was still open; it is kept (closed) now."""
        kind, rest = origin[:1], origin[1:]
        if kind == codec.ORIGIN_SEND_BACK:
            return self.send_backs.take(rest)
        if len(rest) != 8 or kind not in (codec.ORIGIN_SCHEDULED, codec.ORIGIN_HALF):
            return False
        position = int.from_bytes(rest, "big")
        if position >> SLOT_BITS < self.replay_base:  # held before the retained log: unknown here
            return self._resolved_before_base.take(origin)
        if kind == codec.ORIGIN_SCHEDULED:
            return self.schedule.resolve(position)
        return self.halves.resolve(position)

    def _apply_derived(self, index: int, data: Record, touched: set[tuple[str, int]]) -> None:
        """Store each record of a derived entry whose origin was still open; the others' slots
        stay empty (the old master proposed them too, or the transaction ended otherwise)."""
        try:
            origins, records = codec.derived_parts(data)
        except CodecError as exc:
            self._skip(index, f"derived entry: {exc}")
            return
        base = index << SLOT_BITS
        for slot, (origin, record) in enumerate(zip(origins, records, strict=True)):
            if self._resolve(origin):
                self._dispatch_record(base | slot, record, touched)

    def _dispatch_record(self, position: int, record: Record, touched: set[tuple[str, int]]) -> None:
        """One record into its queue by the general parser (derived records: not on the hot path,
        and never de-duplicated by UNIQ_KEY, which they share with the message they came from)."""
        try:
            raw = bytes(record)
            topic, qid, tags, _uniq, keyed = codec.parse_record(raw)
            cq = self._queue_cache.get((topic, qid)) or self._new_queue((topic, qid))
        except (CodecError, UnicodeDecodeError) as exc:
            self._undecodable(position, str(exc))
            return
        cq.positions.append(position)
        cq.sizes.append(len(raw))
        cq.tags.append(tags)
        touched.add((cq.topic, qid))
        self.dispatched_messages += 1
        if keyed is not None:
            self._index_keys(cq.topic, position, keyed)
        if cq.kind:
            self._hold(cq, position, raw, codec.record_store_ms(raw))

    def delay_offsets(self, levels: int) -> dict[int, int]:
        """RocketMQ's delay offset table: per delay level, the offset of its schedule queue
        before which every message has been delivered."""
        out: dict[int, int] = {}
        pending = self.schedule.pending
        for level in range(1, levels + 1):
            cq = self.queues.get((SCHEDULE_TOPIC, level - 1))
            if cq is None:
                continue
            offset = max(self._delay_cursors.get(level, 0), cq.base)
            while offset < cq.max_offset and cq.positions[offset - cq.base] not in pending:
                offset += 1
            self._delay_cursors[level] = out[level] = offset
        return out

    def _set_broker_addrs(self, op: BrokerAddrOp) -> None:
        """Drops, then sets (a set entry moves to the end); past the bound the oldest entries go,
        the same ones on every broker (log order decides)."""
        table = self.broker_addrs
        for nid in op.drop:
            table.pop(nid, None)
        for nid, addr in op.set:
            table.pop(nid, None)
            table[nid] = addr
        while len(table) > MAX_BROKER_ADDR_TABLE:
            del table[next(iter(table))]

    def _set_topic(self, op: TopicOp) -> None:
        tc = self.topics[op.name] = TopicConfig(op.name, op.read, op.write, op.perm, order=op.order)
        self._topic_entries[op.name] = topic_entry_json(tc)

    def _skip(self, index: int, error: str) -> None:
        """A committed entry this state machine cannot apply: counted, logged, passed over."""
        self.skipped_entries += 1
        log.error(
            "skipping a committed entry that cannot be applied",
            extra={"index": index, "error": error, "skipped_so_far": self.skipped_entries},
        )

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
        derived = codec.entry_kind(data) == KIND_DERIVED
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
            # a derived record shares its UNIQ_KEY with the message it came from: an empty slot
            # there means its origin was resolved before, not that a copy stands elsewhere
            prior = self.uniq.get(uniq) if uniq is not None and not derived else None
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
        return TopicConfigWrapper(dict(self.topics), self.data_version, tuple(self._topic_entries.values()))

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
            # the max offset of each queue, the first MAX_LISTED_QUEUES created (a status answer
            # must stay small whatever the topic count: admin tools poll it)
            "queues": {
                f"{t}:{q}": cq.max_offset for (t, q), cq in islice(self.queues.items(), MAX_LISTED_QUEUES)
            },
            "queue_count": len(self.queues),
            "consumer_offsets": len(self.offsets),
            "dedup_keys": len(self.uniq),
            "skipped_entries": self.skipped_entries,
            "scheduled_messages": len(self.schedule),
            "pending_half_messages": len(self.halves),
            "queue_locks": len(self.locks.held),
            "pop_queues": len(self.pops),
        }


# Byte ranges of a stored record that every record of a uniform batch shares: size and magic
# code, queue id and flag, sys flag, store time, body length (the topic and properties are
# added per entry).
_STRIDED_FIELDS = ((0, 8), (12, 20), (36, 40), (56, 64), (84, 88))
_STRIDED_MIN = 16  # records in an entry before comparing by strides beats walking them


def _equal_across(data: bytes, size: int, k: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    """Whether each byte in ``ranges`` of the first ``size``-byte record is the same in all
    ``k`` records of ``data``: one strided slice per byte, in C, instead of a loop per record."""
    for lo, hi in ranges:
        for j in range(lo, hi):
            if data[j::size] != data[j : j + 1] * k:
                return False
    return True


def _find(positions: Sequence[int], position: int) -> int:
    """Where ``position`` is, or would be, in a queue's increasing positions. An append is
    answered right after its entry is applied, so it is usually at the tail: checked first."""
    last = len(positions) - 1
    if last >= 0 and positions[last] == position:
        return last
    return bisect.bisect_left(positions, position)
