"""The broker's message store: the ledger IS the commit log (RocketMQ's DLedgerCommitLog).

A message is encoded once and appended as one ledger entry, or, sent in a producer's
batch, as one slot of the batch's single ledger entry. Everything else is derived
by the dispatcher from committed entries in log order, identically on every broker of the
group: consume queues, queue offsets, consumer offsets, topic configs, the idempotent
producers' de-duplication table and the key index. After a restart the dispatcher replays
the retained log, so nothing derived needs its own durability.

Because queue offsets are assigned at dispatch, a message's offset is known once its
entry is committed; a send is answered then, with the offset.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ledger.codec import KIND_NOOP
from ledger.node import LedgerNode
from ledger.wire import LedgerError
from remoting.message import (
    BATCH_ENTRY_HEADER_SIZE,
    BATCH_SLOT_OVERHEAD,
    MAX_BATCH_SLOTS,
    REC_HEADER_SIZE,
    RECORD_BATCH,
    RECORD_MESSAGE,
    SLOT_BITS,
    MessageFormatError,
    encode_batch_entry,
    read_record_header,
    split_batch_entry,
    unpack_record_header,
)
from remoting.topic import DataVersion, TopicConfig, TopicConfigWrapper

from .consume_queue import ConsumeQueue
from .meta import RECORD_META, decode_meta, snapshot_op

log = logging.getLogger("broker.store")

FLAG_HAS_KEYS = 1  # record flag: properties carry KEYS, index them


@dataclass(slots=True)
class Stored:
    """Where a message ended up; ``duplicate`` means an earlier copy with the same (producer, seq) stands."""

    queue_offset: int
    position: int  # ledger index << 16 | slot (remoting.message.make_position)
    duplicate: bool = False

    @property
    def ledger_index(self) -> int:
        return self.position >> SLOT_BITS


class MessageStore:
    def __init__(self, node: LedgerNode, broker_name: str, dedup_window: int = 100_000) -> None:
        self.node = node
        self.broker_name = broker_name
        self.dedup_window = dedup_window
        self.applied = node.store.first_index - 1
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._queue_cache: dict[tuple[bytes, int], ConsumeQueue] = {}  # keyed by raw topic bytes
        self.topics: dict[str, TopicConfig] = {}
        self.data_version = DataVersion()
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.producers: dict[str, OrderedDict[int, Stored]] = {}
        self.keys: dict[tuple[str, str], list[int]] = {}
        self.waiters: dict[tuple[str, int], list[asyncio.Future[None]]] = {}
        # ledger index -> what dispatch found in that entry, for appends waiting on it
        self._watch: dict[int, list[Stored]] = {}
        self._split_cache: OrderedDict[int, list[memoryview]] = OrderedDict()
        self.topic_listeners: list[Callable[[], None]] = []
        self.dispatched_messages = 0
        self._catch_up_scheduled = False
        node.commit_listeners.append(self._on_commit)

    # ------------------------------------------------------------------ dispatch

    def _on_commit(self, commit: int) -> None:
        """Commit listener: dispatch a bounded slice now and the rest on later loop turns.

        A restarted broker learns a commit index far ahead of what it has dispatched and
        replays its whole retained log; done in one go, that would hold the event loop for
        seconds, during which the node neither votes nor answers its leader. Callers that
        need everything dispatched (a commit being answered, a master's pull) call
        ``dispatch()`` themselves.
        """
        if self._catch_up_scheduled:
            return
        self.dispatch(commit, max_chunks=1, chunk_bytes=1 << 20)
        if self.applied < self.node.commit_index:
            self._catch_up_scheduled = True
            asyncio.get_running_loop().call_soon(self._catch_up)

    def _catch_up(self) -> None:
        self._catch_up_scheduled = False
        self._on_commit(self.node.commit_index)

    def dispatch(self, commit: int | None = None, max_chunks: int | None = None, chunk_bytes: int = 4 << 20) -> None:
        """Apply committed entries up to ``commit`` (default: the node's commit index).

        ``max_chunks`` bounds the work to that many reads of up to ``chunk_bytes`` of entries.
        """
        target = self.node.commit_index if commit is None else min(commit, self.node.commit_index)
        store = self.node.store
        topics_changed = False
        touched: set[tuple[str, int]] = set()
        chunks = 0
        while self.applied < target and (max_chunks is None or chunks < max_chunks):
            chunks += 1
            lo = self.applied + 1
            if lo < store.first_index:  # retention ran ahead (or InstallBase reset the log)
                self.applied = store.first_index - 1
                continue
            watch = self._watch
            for e in store.entries(lo, target, chunk_bytes):
                if e.kind != KIND_NOOP and e.data:
                    kind = e.data[0]
                    found = watch.get(e.index)
                    if kind == RECORD_MESSAGE:
                        self._apply_records(e.index << SLOT_BITS, (e.data,), touched, found)
                    elif kind == RECORD_BATCH:
                        self._apply_batch(e.index, e.data, touched, found)
                    elif kind == RECORD_META:
                        topics_changed |= self._apply_meta(e.index, e.data, found)
                    else:
                        log.error("skipping ledger entry of unknown record type", extra={"index": e.index, "type": kind})
                self.applied = e.index
        for key in touched:
            for fut in self.waiters.pop(key, ()):
                if not fut.done():
                    fut.set_result(None)
        if topics_changed:
            for fn in self.topic_listeners:
                fn()

    def _apply_batch(
        self, index: int, data: bytes | memoryview, touched: set[tuple[str, int]], found: list[Stored] | None
    ) -> None:
        try:
            records = split_batch_entry(data)
        except MessageFormatError as exc:
            log.error("undecodable batch entry", extra={"index": index, "error": str(exc)})
            return
        self._apply_records(index << SLOT_BITS, records, touched, found)

    def _apply_records(
        self,
        base: int,
        records: Sequence[bytes | memoryview],
        touched: set[tuple[str, int]],
        found: list[Stored] | None,
    ) -> None:
        """Dispatch the records of one entry (slot i at position ``base | i``).

        Every broker runs this for every message, so it is written for speed: the records
        of a batch share topic, queue and producer, which are looked up once per change
        rather than once per record; a ``Stored`` is made only when someone needs it.
        """
        unpack = unpack_record_header
        last_key: tuple[bytes, int] | None = None
        last_pid_raw: bytes | None = None
        pid = ""
        cq: ConsumeQueue | None = None
        seen: OrderedDict[int, Stored] | None = None
        dispatched = 0
        for slot, data in enumerate(records):
            position = base | slot
            try:
                _, flags, qid, th, _, _, seq, tl, pl, prl, bl = unpack(data)
                size = len(data)
                if REC_HEADER_SIZE + tl + pl + prl + bl != size:
                    raise ValueError("record lengths do not add up to its size")
                key = (bytes(data[REC_HEADER_SIZE : REC_HEADER_SIZE + tl]), qid)
                if key != last_key:
                    cq = self._queue_cache.get(key) or self._new_queue(key)
                    last_key = key
                    touched.add((cq.topic, qid))
                if pl:
                    pid_raw = bytes(data[REC_HEADER_SIZE + tl : REC_HEADER_SIZE + tl + pl])
                    if pid_raw != last_pid_raw:
                        pid, last_pid_raw, seen = pid_raw.decode(), pid_raw, None
                else:
                    pid, last_pid_raw = "", None
            except (ValueError, struct.error, UnicodeDecodeError) as exc:
                log.error("undecodable message record", extra={"position": position, "error": str(exc)})
                if found is not None:
                    found.append(Stored(-1, position))
                last_key = last_pid_raw = None
                continue
            assert cq is not None
            dedup = bool(pid and seq)
            if dedup:
                if seen is None:
                    seen = self.producers.get(pid)
                    if seen is None:
                        seen = self.producers[pid] = OrderedDict()
                prior = seen.get(seq)
                if prior is not None:
                    if found is not None:
                        found.append(Stored(prior.queue_offset, prior.position, True))
                    continue
            positions = cq.positions
            positions.append(position)
            cq.sizes.append(size)
            cq.tags.append(th)
            dispatched += 1
            if found is not None or dedup:
                result = Stored(cq.base + len(positions) - 1, position)
                if found is not None:
                    found.append(result)
                if dedup:
                    assert seen is not None
                    seen[seq] = result
                    if len(seen) > self.dedup_window:
                        seen.popitem(last=False)
            if flags & FLAG_HAS_KEYS:
                off = REC_HEADER_SIZE + tl + pl
                self._index_keys(cq.topic, position, data[off : off + prl])
        self.dispatched_messages += dispatched

    def _new_queue(self, key: tuple[bytes, int]) -> ConsumeQueue:
        """The consume queue for (raw topic, queue id), created on its first message."""
        tb, qid = key
        name = (tb.decode(), qid)
        cq = self.queues.get(name)
        if cq is None:
            cq = self.queues[name] = ConsumeQueue(name[0], qid)
        self._queue_cache[key] = cq
        return cq

    def _index_keys(self, topic: str, position: int, props: bytes | memoryview) -> None:
        from remoting.message import PROPERTY_KEYS, decode_properties

        try:
            keys = decode_properties(props).get(PROPERTY_KEYS, "")
        except ValueError:
            return
        for k in keys.split():
            lst = self.keys.setdefault((topic, k), [])
            lst.append(position)
            if len(lst) > 64:
                del lst[0]

    def _apply_meta(self, index: int, data: bytes | memoryview, found: list[Stored] | None) -> bool:
        try:
            doc = decode_meta(data)
            op = doc["op"]
            if op == "offset":
                key = (str(doc["group"]), str(doc["topic"]), int(doc["queue"]))
                self.offsets[key] = int(doc["offset"])
            elif op == "topic":
                self.topics[doc["name"]] = TopicConfig(
                    doc["name"], int(doc["read"]), int(doc["write"]), int(doc["perm"]), order=bool(doc.get("order"))
                )
                # Derived from the log position, so every broker computes the same version.
                self.data_version = DataVersion(index, self.data_version.counter + 1)
                return True
            elif op == "snapshot":
                for name, t in doc["topics"].items():
                    self.topics[name] = TopicConfig(
                        name, int(t["read"]), int(t["write"]), int(t["perm"]), order=bool(t.get("order"))
                    )
                for g, t, q, o in doc["offsets"]:
                    self.offsets[(str(g), str(t), int(q))] = int(o)
                self.data_version = DataVersion(index, self.data_version.counter + 1)
                return True
            else:
                log.error("unknown metadata op", extra={"index": index, "op": op})
        except (ValueError, KeyError, TypeError) as exc:
            log.error("bad metadata record", extra={"index": index, "error": str(exc)})
        if found is not None:
            found.append(Stored(-1, index << SLOT_BITS))
        return False

    # ------------------------------------------------------------------ writes (master only)

    def batch_entries(self, records: Sequence[bytes]) -> list[bytes]:
        """Pack a producer batch's records into as few ledger entries as the entry size allows.

        A record that fits no batch entry goes alone, as a plain record entry.
        """
        limit = self.node.config.max_entry_bytes - BATCH_ENTRY_HEADER_SIZE
        out: list[bytes] = []
        chunk: list[bytes] = []
        size = 0

        def flush() -> None:
            if chunk:
                out.append(chunk[0] if len(chunk) == 1 else encode_batch_entry(chunk))
                chunk.clear()

        for rec in records:
            need = len(rec) + BATCH_SLOT_OVERHEAD
            if chunk and (size + need > limit or len(chunk) == MAX_BATCH_SLOTS - 1):
                flush()
                size = 0
            chunk.append(rec)
            size += need
        flush()
        return out

    def append(self, payloads: Sequence[bytes], done: Callable[[list[Stored] | None, Exception | None], None]) -> None:
        """Append entries; ``done(results, None)`` once committed and dispatched, else ``done(None, error)``.

        ``results`` has one item per message record (a batch entry gives one per slot) and
        one per metadata record, in log order. Raises ``NotLeader`` at once if this
        broker's node does not lead.
        """
        watch = self._watch
        first = self.node.store.last_index + 1  # where the proposal below will land
        indexes = range(first, first + len(payloads))

        def committed(code: int, at: int, term: int, message: str) -> None:
            if code != 0:
                for i in indexes:
                    watch.pop(i, None)
                done(None, LedgerError(code, message))
                return
            self.dispatch()
            results: list[Stored] = []
            for i in indexes:
                results.extend(watch.pop(i, None) or (Stored(-1, i << SLOT_BITS),))
            done(results, None)

        for i in indexes:
            watch[i] = []
        try:
            self.node.propose(payloads, committed)
        except Exception:
            for i in indexes:
                watch.pop(i, None)
            raise

    async def append_async(self, payloads: Sequence[bytes]) -> list[Stored]:
        fut: asyncio.Future[list[Stored]] = asyncio.get_running_loop().create_future()

        def done(results: list[Stored] | None, exc: Exception | None) -> None:
            if not fut.done():
                fut.set_exception(exc) if exc else fut.set_result(results or [])

        self.append(payloads, done)
        return await fut

    def snapshot_record(self) -> bytes:
        topics = {
            n: {"read": t.read_queue_nums, "write": t.write_queue_nums, "perm": t.perm, "order": t.order}
            for n, t in self.topics.items()
        }
        offsets = [[g, t, q, o] for (g, t, q), o in self.offsets.items()]
        return snapshot_op(topics, offsets)

    # ------------------------------------------------------------------ reads

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def offsets_of(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min offset, max offset) of a queue; (0, 0) for a queue with no messages yet."""
        self._trim(topic, queue_id)
        cq = self.queues.get((topic, queue_id))
        return (cq.min_offset, cq.max_offset) if cq else (0, 0)

    def _trim(self, topic: str, queue_id: int) -> None:
        cq = self.queues.get((topic, queue_id))
        first = self.node.store.first_index << SLOT_BITS
        if cq is not None and cq.positions and cq.positions[0] < first:
            cq.trim_before(first)

    def _record(self, position: int) -> bytes | memoryview | None:
        """The record at a position, or None if that entry is gone or holds no message there."""
        index, slot = position >> SLOT_BITS, position & (MAX_BATCH_SLOTS - 1)
        records = self._split_cache.get(index)
        if records is None:
            if index < self.node.store.first_index:
                return None
            entries = self.node.store.entries(index, index)
            if not entries:
                return None
            data = entries[0].data
            if not data:
                return None
            if data[0] == RECORD_MESSAGE:
                return data if slot == 0 else None
            if data[0] != RECORD_BATCH:
                return None
            try:
                records = split_batch_entry(data)
            except MessageFormatError:
                return None
            # pulls walk a batch entry a slice at a time: keep the last few split
            self._split_cache[index] = records
            if len(self._split_cache) > 16:
                self._split_cache.popitem(last=False)
        return records[slot] if slot < len(records) else None

    def read_records(
        self, hits: Sequence[tuple[int, int, int]], max_bytes: int
    ) -> list[tuple[int, int, bytes | memoryview]]:
        """(queue offset, position, record) for the given consume-queue hits, up to ``max_bytes``
        (but at least one)."""
        out: list[tuple[int, int, bytes | memoryview]] = []
        total = 0
        for qoff, position, size in hits:
            total += size
            if out and total > max_bytes:
                break
            rec = self._record(position)
            if rec is None:
                break
            out.append((qoff, position, rec))
        return out

    async def wait_for_message(self, topic: str, queue_id: int, timeout: float) -> None:
        """Long polling: return when the queue gets a new message or ``timeout`` passes."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.setdefault((topic, queue_id), []).append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            lst = self.waiters.get((topic, queue_id))
            if lst and fut in lst:
                lst.remove(fut)

    def record_at(self, position: int) -> tuple[int, bytes | memoryview] | None:
        """(queue offset, record) of the message stored at ``position``, if there is one."""
        if position >> SLOT_BITS > self.applied:
            return None
        data = self._record(position)
        if data is None:
            return None
        try:
            h = read_record_header(data)
        except MessageFormatError:
            return None
        cq = self.queues.get((h.topic, h.queue_id))
        qoff = cq.offset_of_position(position) if cq else None
        return (qoff if qoff is not None else -1, data)

    def positions_by_key(self, topic: str, key: str) -> list[int]:
        return list(self.keys.get((topic, key), ()))

    def topic_config_wrapper(self) -> TopicConfigWrapper:
        return TopicConfigWrapper(dict(self.topics), self.data_version)

    def stats(self) -> dict[str, Any]:
        return {
            "applied_index": self.applied,
            "dispatched_messages": self.dispatched_messages,
            "topics": len(self.topics),
            "queues": {f"{t}:{q}": cq.max_offset for (t, q), cq in sorted(self.queues.items())},
            "consumer_offsets": len(self.offsets),
            "idempotent_producers": len(self.producers),
            "time_ms": int(time.time() * 1000),
        }
