"""The broker's message store: the ledger IS the commit log (RocketMQ's DLedgerCommitLog).

A message is encoded once and appended as one ledger entry. Everything else is derived
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
from remoting.message import REC_HEADER_SIZE, RECORD_MESSAGE, read_record_header, unpack_record_header
from remoting.topic import DataVersion, TopicConfig, TopicConfigWrapper

from .consume_queue import ConsumeQueue
from .meta import RECORD_META, decode_meta, snapshot_op

log = logging.getLogger("broker.store")

FLAG_HAS_KEYS = 1  # record flag: properties carry KEYS, index them


@dataclass(slots=True)
class Stored:
    """Where a message ended up; ``duplicate`` means an earlier copy with the same (producer, seq) stands."""

    queue_offset: int
    ledger_index: int
    duplicate: bool = False


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
        self._watch: dict[int, Stored | None] = {}
        self.topic_listeners: list[Callable[[], None]] = []
        self.dispatched_messages = 0
        node.commit_listeners.append(self.dispatch)

    # ------------------------------------------------------------------ dispatch

    def dispatch(self, commit: int | None = None) -> None:
        """Apply committed entries up to ``commit`` (default: the node's commit index)."""
        target = self.node.commit_index if commit is None else min(commit, self.node.commit_index)
        store = self.node.store
        topics_changed = False
        touched: set[tuple[str, int]] = set()
        while self.applied < target:
            lo = self.applied + 1
            if lo < store.first_index:  # retention ran ahead (or InstallBase reset the log)
                self.applied = store.first_index - 1
                continue
            for e in store.entries(lo, target, 4 << 20):
                if e.kind != KIND_NOOP and e.data:
                    kind = e.data[0]
                    if kind == RECORD_MESSAGE:
                        self._apply_message(e.index, e.data, touched)
                    elif kind == RECORD_META:
                        topics_changed |= self._apply_meta(e.index, e.data)
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

    def _apply_message(self, index: int, data: bytes | memoryview, touched: set[tuple[str, int]]) -> None:
        try:
            _, flags, qid, th, _, _, seq, tl, pl, prl, bl = unpack_record_header(data)
            if REC_HEADER_SIZE + tl + pl + prl + bl != len(data):
                raise ValueError("record lengths do not add up to its size")
            tb = bytes(data[REC_HEADER_SIZE : REC_HEADER_SIZE + tl])
            cq = self._queue_cache.get((tb, qid))
            pid = bytes(data[REC_HEADER_SIZE + tl : REC_HEADER_SIZE + tl + pl]).decode() if pl else ""
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            log.error("undecodable message record", extra={"index": index, "error": str(exc)})
            return
        if pid and seq:
            seen = self.producers.get(pid)
            if seen is None:
                seen = self.producers[pid] = OrderedDict()
            prior = seen.get(seq)
            if prior is not None:
                if index in self._watch:
                    self._watch[index] = Stored(prior.queue_offset, prior.ledger_index, True)
                return
        if cq is None:
            key = (tb.decode(), qid)
            cq = self.queues.get(key)
            if cq is None:
                cq = self.queues[key] = ConsumeQueue(key[0], qid)
            self._queue_cache[(tb, qid)] = cq
        result = Stored(cq.append(index, th), index)
        self.dispatched_messages += 1
        touched.add((cq.topic, qid))
        if pid and seq:
            seen[seq] = result
            if len(seen) > self.dedup_window:
                seen.popitem(last=False)
        if flags & FLAG_HAS_KEYS:
            off = REC_HEADER_SIZE + tl + pl
            self._index_keys(cq.topic, index, data[off : off + prl])
        if index in self._watch:
            self._watch[index] = result

    def _index_keys(self, topic: str, index: int, props: bytes | memoryview) -> None:
        from remoting.message import PROPERTY_KEYS, decode_properties

        try:
            keys = decode_properties(props).get(PROPERTY_KEYS, "")
        except ValueError:
            return
        for k in keys.split():
            lst = self.keys.setdefault((topic, k), [])
            lst.append(index)
            if len(lst) > 64:
                del lst[0]

    def _apply_meta(self, index: int, data: bytes | memoryview) -> bool:
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
        if index in self._watch:
            self._watch[index] = Stored(-1, index)
        return False

    # ------------------------------------------------------------------ writes (master only)

    def append(self, payloads: Sequence[bytes], done: Callable[[list[Stored] | None, Exception | None], None]) -> None:
        """Append records; ``done(results, None)`` once committed and dispatched, else ``done(None, error)``.

        Raises ``NotLeader`` at once if this broker's node does not lead.
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
            done([watch.pop(i, None) or Stored(-1, i) for i in indexes], None)

        for i in indexes:
            watch[i] = None
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
        first = self.node.store.first_index
        if cq is not None and cq.indexes and cq.indexes[0] < first:
            cq.trim_before_index(first)

    def read_records(self, hits: Sequence[tuple[int, int, int]], max_bytes: int) -> list[tuple[int, int, bytes]]:
        """(queue offset, ledger index, record) for the given consume-queue hits, up to ``max_bytes``."""
        store = self.node.store
        out: list[tuple[int, int, bytes]] = []
        size = 0
        for qoff, index, _ in hits:
            entries = store.entries(index, index)
            if not entries:
                break
            data = entries[0].data
            size += len(data)
            if out and size > max_bytes:
                break
            out.append((qoff, index, data))
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

    def record_at(self, index: int) -> tuple[int, bytes] | None:
        """(queue offset, record) of the message stored at ledger ``index``, if it is one."""
        if index > self.applied or index < self.node.store.first_index:
            return None
        data = self.node.store.entries(index, index)[0].data
        if not data or data[0] != RECORD_MESSAGE:
            return None
        h = read_record_header(data)
        cq = self.queues.get((h.topic, h.queue_id))
        qoff = cq.offset_of_index(index) if cq else None
        return (qoff if qoff is not None else -1, data)

    def indexes_by_key(self, topic: str, key: str) -> list[int]:
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
