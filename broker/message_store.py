"""The broker's message store: the asyncio shell around the pure state machine.

The ledger IS the commit log (RocketMQ's DLedgerCommitLog); ``broker.state.BrokerState``
says what committed entries mean. This shell feeds it committed entries from the embedded
ledger, a bounded slice per event-loop turn, wakes long polls and topic listeners from
what each slice changed, answers appends once their entries are applied, and reads
records back for pulls and queries. The ledger is used only through ``ledger.embed``.

A restarted broker starts from its last checkpoint (``broker.checkpoint``: the state as
it was after some applied index A, written every ``checkpoint_interval_s`` beside ledger/)
when there is a valid one, and replays only the entries after A; without one it replays the
whole retained log. A restarted broker, or one that was partitioned away, may still be
far behind its commit index; applying the whole backlog in one go would hold the event
loop for seconds, during which the node neither votes nor answers its leader. So nothing here applies more than
one slice per loop turn: whoever needs state applied through some index (an append being
answered, a pull after its read barrier, a new master) waits for it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ledger.embed import AppendFailed, EmbeddedLedger, EmbedError, NotLeaderError, Proposal
from remoting.topic import TopicConfig, TopicConfigWrapper

from . import checkpoint, codec
from .checkpoint import CheckpointError
from .codec import SLOT_BITS, CodecError, Record
from .consume_queue import ConsumeQueue
from .state import DEFAULT_DEDUP_TTL_S, DEFAULT_DEDUP_WINDOW, BrokerState, Effects, Stored

__all__ = ["MessageStore", "Stored"]

log = logging.getLogger("broker.store")

DEFAULT_APPLY_SLICE_BYTES = 1 << 20  # committed entries applied per event-loop turn
# ... and at most this many of them: small entries (topic creations, offset commits) cost
# per entry, and a burst of thousands committed together held the loop for tens of ms
APPLY_SLICE_ENTRIES = 512
MAX_COALESCED_PAYLOADS = 4096  # entries of appends proposed together; more are proposed at once
# An append this large (a producer's batch) is proposed at once, with whatever was queued
# before it: it is already one large write, and holding it to the end of the turn would make
# every batch of the turn wait for all of them, so that they move through the group in
# lockstep (one proposal in flight, the pipeline idle during each fsync). Smaller appends (the
# unbatched sends of one socket read) are coalesced up to MAX_COALESCED_BYTES.
LARGE_APPEND_BYTES = 64 << 10
MAX_COALESCED_BYTES = 4 << 20
SLOT_MASK = (1 << SLOT_BITS) - 1
SPLIT_CACHE_ENTRIES = 16  # batch entries kept split for pulls that walk them a slice at a time
# Committed entries not yet applied beyond which this broker's ledger member lets its peers
# stand for leader first (EmbeddedLedger.set_lagging): a restarted broker replays its whole
# retained log, and one elected meanwhile becomes master only once that is applied. 0: never.
DEFAULT_YIELD_LAG_ENTRIES = APPLY_SLICE_ENTRIES // 4  # a few ms of applying small entries, ~50 ms of batches
# A checkpoint is written only once this many entries were applied since the last one.
DEFAULT_CHECKPOINT_MIN_ENTRIES = 1000

AppendDone = Callable[[list[Stored] | None, EmbedError | None], None]
_Queued = tuple[list[bytes], AppendDone, "tuple[bytes, int] | None"]  # an append waiting for the turn's end


class MessageStore:
    def __init__(
        self,
        ledger: EmbeddedLedger,
        broker_name: str,
        dedup_window: int = DEFAULT_DEDUP_WINDOW,
        apply_slice_bytes: int = DEFAULT_APPLY_SLICE_BYTES,
        dedup_ttl_s: float = DEFAULT_DEDUP_TTL_S,
        yield_lag_entries: int = DEFAULT_YIELD_LAG_ENTRIES,
        checkpoint_path: Path | None = None,
        checkpoint_min_entries: int = DEFAULT_CHECKPOINT_MIN_ENTRIES,
    ) -> None:
        if yield_lag_entries < 0:
            raise ValueError(f"yield_lag_entries must not be negative, got {yield_lag_entries}")
        if checkpoint_min_entries < 1:
            raise ValueError(f"checkpoint_min_entries must be at least 1, got {checkpoint_min_entries}")
        self.ledger = ledger
        self.yield_lag_entries = yield_lag_entries
        self._lagging = False  # what this store last told its ledger member (see _apply_slice)
        self.max_apply_lag = 0  # the most committed entries seen waiting to be applied (stats)
        self.broker_name = broker_name
        self.apply_slice_bytes = apply_slice_bytes
        self._dedup = (dedup_window, dedup_ttl_s)
        self.state = BrokerState(dedup_window, applied=ledger.first_index - 1, dedup_ttl_s=dedup_ttl_s)
        # checkpoints (broker.checkpoint): where, what was loaded and written (stats)
        self.checkpoint_path = checkpoint_path
        self.checkpoint_min_entries = checkpoint_min_entries
        self._verify: tuple[int, int | None] | None = None  # (index, term) the loaded checkpoint names
        self._writing = False
        self.ckpt: dict[str, Any] = {
            "index": 0,  # the applied index of the last checkpoint written or loaded
            "loaded_index": 0,
            "loads": 0,
            "load_failures": 0,
            "load_ms": 0.0,
            "writes": 0,
            "write_failures": 0,
            "capture_ms": 0.0,  # the copy made on the event loop
            "write_ms": 0.0,  # encoding and writing, in a worker thread
            "bytes": 0,
        }
        if checkpoint_path is not None:
            self._load_checkpoint(checkpoint_path)
        self._start_applied = self.state.applied
        self.waiters: dict[tuple[str, int], list[asyncio.Future[None]]] = {}
        self.topic_listeners: list[Callable[[], None]] = []
        # (index, tie-breaker, callback): run once the state has applied that index
        self._applied_waiters: list[tuple[int, int, Callable[[], None]]] = []
        self._tie = itertools.count()
        self._split_cache: OrderedDict[int, Sequence[Record]] = OrderedDict()
        self._slice_scheduled = False
        # appends of this event-loop turn, proposed together at its end (see append)
        self._queued: list[_Queued] = []
        self._queued_payloads = 0
        self._queued_bytes = 0
        ledger.on_commit(self._on_commit)

    # ------------------------------------------------------------------ state, as the processors see it

    @property
    def applied(self) -> int:
        return self.state.applied

    @property
    def topics(self) -> dict[str, TopicConfig]:
        return self.state.topics

    @property
    def offsets(self) -> dict[tuple[str, str, int], int]:
        return self.state.offsets

    @property
    def dispatched_messages(self) -> int:
        return self.state.dispatched_messages

    # ------------------------------------------------------------------ checkpoints

    def _load_checkpoint(self, path: Path) -> None:
        """Start from the checkpoint at ``path`` if there is a valid one of this broker group;
        any other file is logged with its reason and left for the next write to replace."""
        checkpoint.remove_stale(path)
        if not path.exists():
            return
        t0 = time.perf_counter()
        try:
            loaded = checkpoint.read_file(path)
            self._check_loaded(loaded)
        except Exception as exc:  # noqa: BLE001 - CheckpointError, or a case no check foresaw
            reason = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
            self.ckpt["load_failures"] += 1
            log.warning(
                "checkpoint not loaded: replaying the whole retained log",
                extra={"path": str(path), "reason": reason},
            )
            return
        state = loaded.state
        term = loaded.meta.get("term")
        self._verify = (state.applied, term if type(term) is int else None)
        first = self.ledger.first_index
        if state.applied + 1 < first:  # retention removed entries after it: as a replay would
            state.skip_to(first - 1)
        self.state = state
        self.ckpt.update(
            index=state.applied,
            loaded_index=state.applied,
            loads=1,
            load_ms=(time.perf_counter() - t0) * 1000,
        )
        log.info(
            "checkpoint loaded",
            extra={
                "path": str(path),
                "applied": state.applied,
                "first_index": first,
                "ms": round(self.ckpt["load_ms"], 1),
            },
        )

    def _check_loaded(self, loaded: checkpoint.Loaded) -> None:
        """Refuse a checkpoint of another broker group or made with other de-duplication
        settings (a replay with these settings would derive another state)."""
        meta, state = loaded.meta, loaded.state
        if meta.get("broker_name") != self.broker_name:
            raise CheckpointError(
                f"written by broker group {meta.get('broker_name')!r}, this is {self.broker_name!r}"
            )
        window, ttl_s = self._dedup
        if state.dedup_window != window or state.dedup_ttl_ms != int(ttl_s * 1000):
            raise CheckpointError(
                f"written with dedup_window {state.dedup_window} and dedup_ttl_ms {state.dedup_ttl_ms}, "
                f"configured now {window} and {int(ttl_s * 1000)}"
            )

    def _verify_loaded(self) -> None:
        """Once the entry a loaded checkpoint ends at is committed here, check it has the term
        the checkpoint recorded (Raft's log matching: same index and term, same log up to it).
        A mismatch means the checkpoint came from another log: back to a whole replay."""
        assert self._verify is not None
        index, term = self._verify
        ledger = self.ledger
        if index > ledger.commit_index:
            return  # not committed here yet: applying waits for it anyway
        self._verify = None
        if term is None or index < ledger.first_index:
            return  # nothing to compare with (retention removed it)
        entries = ledger.read(index, index)
        if entries and entries[0].index == index and entries[0].term == term:
            return
        found = entries[0].term if entries else None
        self.ckpt["load_failures"] += 1
        log.error(
            "checkpoint is of another log: replaying the whole retained log",
            extra={"path": str(self.checkpoint_path), "index": index, "term": term, "log_term": found},
        )
        window, ttl_s = self._dedup
        self.state = BrokerState(window, applied=ledger.first_index - 1, dedup_ttl_s=ttl_s)
        self._start_applied = self.state.applied

    async def write_checkpoint(self, force: bool = False) -> bool:
        """Checkpoint the applied state if ``checkpoint_min_entries`` were applied since the last
        (or ``force``): copied on the loop, encoded and written atomically in a worker thread."""
        path = self.checkpoint_path
        state = self.state
        applied = state.applied
        if path is None or self._writing or self._verify is not None or applied < 1:
            return False
        if applied - self.ckpt["index"] < (1 if force else self.checkpoint_min_entries):
            return False
        try:
            term: int | None = (
                self.ledger.read(applied, applied)[0].term if applied >= self.ledger.first_index else None
            )
        except (EmbedError, IndexError):
            term = None
        self._writing = True
        try:
            t0 = time.perf_counter()
            image = checkpoint.capture(
                state, {"broker_name": self.broker_name, "node_id": self.ledger.node_id, "term": term}
            )
            t1 = time.perf_counter()

            def encode_and_write() -> int:
                parts = checkpoint.render_parts(image)
                checkpoint.write_file(path, parts)
                return sum(map(len, parts))

            size = await asyncio.to_thread(encode_and_write)
        except (OSError, ValueError) as exc:
            self.ckpt["write_failures"] += 1
            log.warning("checkpoint not written", extra={"path": str(path), "error": str(exc)})
            return False
        finally:
            self._writing = False
        self.ckpt.update(
            index=applied,
            writes=self.ckpt["writes"] + 1,
            capture_ms=round((t1 - t0) * 1000, 2),
            write_ms=round((time.perf_counter() - t1) * 1000, 1),
            bytes=size,
        )
        return True

    async def run_checkpoints(self, interval_s: float) -> None:
        """Write a checkpoint every ``interval_s`` (when enough was applied) until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            await self.write_checkpoint()

    # ------------------------------------------------------------------ applying committed entries

    def _on_commit(self, commit: int) -> None:
        """Commit listener: apply a slice now, unless one is already due on a later loop turn."""
        if not self._slice_scheduled:
            self._apply_slice()

    def _scheduled_slice(self) -> None:
        self._slice_scheduled = False
        self._apply_slice()

    def _apply_slice(self) -> None:
        """Apply up to ``apply_slice_bytes`` of committed entries; schedule the rest for the next turn."""
        if self._verify is not None:
            self._verify_loaded()
        ledger, state = self.ledger, self.state
        commit = ledger.commit_index
        if state.applied < commit:
            first = ledger.first_index
            if state.applied + 1 < first:  # retention ran ahead (or the log was reset to a snapshot)
                state.skip_to(first - 1)
            upto = min(commit, state.applied + APPLY_SLICE_ENTRIES)
            self._publish(state.apply(ledger.read_payloads(state.applied + 1, upto, self.apply_slice_bytes)))
        lag = ledger.commit_index - state.applied
        if lag > 0 and not self._slice_scheduled:
            self._slice_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_slice)
        if lag > self.max_apply_lag:
            self.max_apply_lag = lag
        lagging = 0 < self.yield_lag_entries < lag
        if lagging is not self._lagging:
            self._lagging = lagging
            ledger.set_lagging(lagging)
            log.info("apply backlog", extra={"lagging": lagging, "entries": lag, "applied": state.applied})

    def _publish(self, effects: Effects) -> None:
        for key in effects.queues:
            for fut in self.waiters.pop(key, ()):
                if not fut.done():
                    fut.set_result(None)
        if effects.topics_changed:
            for fn in self.topic_listeners:
                fn()
        waiting = self._applied_waiters
        applied = self.state.applied
        while waiting and waiting[0][0] <= applied:
            heapq.heappop(waiting)[2]()

    def when_applied(self, index: int, fn: Callable[[], None]) -> None:
        """Call ``fn`` once the state has applied ``index``: now if it has, else from a later slice."""
        if self.state.applied >= index:
            fn()
            return
        heapq.heappush(self._applied_waiters, (index, next(self._tie), fn))
        if not self._slice_scheduled:
            self._apply_slice()

    async def applied_through(self, index: int) -> None:
        """Wait until the state has applied ``index`` (one slice per loop turn meanwhile)."""
        if self.state.applied >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.when_applied(index, lambda: fut.done() or fut.set_result(None))
        await fut

    async def caught_up(self) -> None:
        """Wait until everything committed when called is applied (a restarted broker's replay)."""
        await self.applied_through(self.ledger.commit_index)

    # ------------------------------------------------------------------ writes (master only)

    def batch_entries(self, records: Sequence[bytes]) -> list[bytes]:
        """Pack a producer batch's records into as few ledger entries as the entry size allows."""
        return codec.pack_entries(records, self.ledger.max_entry_bytes)

    def append(
        self, payloads: Sequence[bytes], done: AppendDone, hint: tuple[bytes, int] | None = None
    ) -> None:
        """Append entries; ``done(results, None)`` once committed and applied, else ``done(None, error)``.

        ``results`` has one item per message record (a batch entry gives one per slot) and
        one per metadata record, in log order. ``hint``, the (raw topic, queue id) the
        messages were sent to, lets the answer find their queue without parsing them again
        (``BrokerState.placement``). Raises ``NotLeaderError`` at once if this broker's
        ledger member does not lead; if it stops leading before the entries are proposed,
        ``done`` gets the ``NotLeaderError``.

        Appends made in one event-loop turn (the sends of one read from a socket, say) are
        proposed together at the end of the turn: each keeps its own entries, in order, but
        the ledger takes one proposal (one log write, one acknowledgement) for all of them,
        which is most of the cost of an unbatched send.
        """
        ledger = self.ledger
        if not ledger.is_leader:
            raise NotLeaderError(
                f"{ledger.node_id} does not lead its ledger group", ledger.leader_id, ledger.leader_address
            )
        if not isinstance(payloads, list):
            payloads = list(payloads)
        if not payloads:
            raise ValueError("append needs at least one payload")
        queued = self._queued
        queued.append((payloads, done, hint))
        self._queued_payloads += len(payloads)
        size = sum(map(len, payloads))
        self._queued_bytes += size
        if (
            size >= LARGE_APPEND_BYTES
            or self._queued_payloads >= MAX_COALESCED_PAYLOADS
            or self._queued_bytes >= MAX_COALESCED_BYTES
        ):
            self._propose_queued()
        elif len(queued) == 1:
            asyncio.get_running_loop().call_soon(self._propose_queued)

    def _propose_queued(self) -> None:
        """Propose the appends queued this turn as one proposal; answer each from its share."""
        queued, self._queued, self._queued_payloads, self._queued_bytes = self._queued, [], 0, 0
        if not queued:
            return
        if len(queued) == 1:
            all_payloads = queued[0][0]
        else:
            all_payloads = [p for payloads, _, _ in queued for p in payloads]

        def committed(proposal: Proposal, error: EmbedError | None) -> None:
            if error is not None:
                self._fail_queued(queued, error)
                return
            if self.state.applied >= proposal.last_index:  # the usual case once a slice has run
                self._answer(queued, proposal)
            else:
                self.when_applied(proposal.last_index, lambda: self._answer(queued, proposal))

        try:
            self.ledger.propose(all_payloads, committed)
        except EmbedError as exc:  # leadership lost since the appends were queued
            self._fail_queued(queued, exc)
        except Exception as exc:  # the proposal was refused: none of its entries is in the log
            log.exception("proposal refused", extra={"entries": len(all_payloads)})
            self._fail_queued(queued, AppendFailed(f"proposal refused: {type(exc).__name__}: {exc}"))

    def _answer(self, queued: list[_Queued], proposal: Proposal) -> None:
        """Answer each queued append with the placements of its share of ``proposal``."""
        first, term = proposal.first_index, proposal.term
        for payloads, done, hint in queued:
            last = first + len(payloads) - 1
            try:
                done(self._placements(Proposal(first, last, term), payloads, hint), None)
            except Exception:  # one answer's failure must not lose the others'
                log.exception("append callback failed", extra={"first": first, "last": last})
            first = last + 1

    @staticmethod
    def _fail_queued(queued: list[_Queued], error: EmbedError) -> None:
        for _, done, _ in queued:
            try:
                done(None, error)
            except Exception:
                log.exception("append callback failed", extra={"error": str(error)})

    def _placements(
        self, proposal: Proposal, payloads: list[bytes], hint: tuple[bytes, int] | None
    ) -> list[Stored]:
        placement = self.state.placement
        if len(payloads) == 1:
            return placement(proposal.first_index, payloads[0], hint)
        out: list[Stored] = []
        for index, data in zip(proposal.indexes, payloads, strict=True):
            out.extend(placement(index, data, hint))
        return out

    async def append_async(self, payloads: Sequence[bytes]) -> list[Stored]:
        fut: asyncio.Future[list[Stored]] = asyncio.get_running_loop().create_future()

        def done(results: list[Stored] | None, exc: Exception | None) -> None:
            if not fut.done():
                fut.set_exception(exc) if exc else fut.set_result(results or [])

        self.append(payloads, done)
        return await fut

    def snapshot_record(self) -> bytes:
        return self.state.snapshot_record()

    # ------------------------------------------------------------------ reads

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.state.queue(topic, queue_id)

    def offsets_of(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min offset, max offset) of a queue; (0, 0) for a queue with no messages yet."""
        return self.state.offsets_of(topic, queue_id, self.ledger.first_index)

    def _entry_records(self, index: int) -> Sequence[Record] | None:
        """The records of entry ``index``, or None if that entry is gone or holds no messages."""
        records = self._split_cache.get(index)
        if records is None:
            if index < self.ledger.first_index or index > self.state.applied:
                return None
            entries = self.ledger.read(index, index)
            if not entries:
                return None
            try:
                records = codec.entry_records(entries[0].payload)
            except CodecError:
                return None
            if len(records) > 1:  # pulls walk a batch entry a slice at a time: keep the last few split
                self._split_cache[index] = records
                if len(self._split_cache) > SPLIT_CACHE_ENTRIES:
                    self._split_cache.popitem(last=False)
        return records

    def _record(self, position: int) -> Record | None:
        """The record at a position, or None if that entry is gone or holds no message there."""
        records = self._entry_records(position >> SLOT_BITS)
        slot = position & SLOT_MASK
        return records[slot] if records is not None and slot < len(records) else None

    def read_records(
        self, hits: Sequence[tuple[int, int, int]], max_bytes: int
    ) -> list[tuple[int, int, Record]]:
        """(queue offset, position, record) for the given consume-queue hits, up to ``max_bytes``
        (but at least one). Hits of one entry (a batch) share one lookup of its records."""
        out: list[tuple[int, int, Record]] = []
        append = out.append
        total = 0
        index = -1
        records: Sequence[Record] | None = None
        for qoff, position, size in hits:
            total += size
            if out and total > max_bytes:
                break
            if position >> SLOT_BITS != index:
                index = position >> SLOT_BITS
                records = self._entry_records(index)
            slot = position & SLOT_MASK
            if records is None or slot >= len(records):
                break
            append((qoff, position, records[slot]))
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

    def first_position(self) -> int | None:
        """The lowest position any consume queue still holds (the oldest message), None if none."""
        first = self.ledger.first_index << SLOT_BITS
        lowest: int | None = None
        for cq in self.state.queues.values():
            if cq.positions and cq.positions[0] < first:
                cq.trim_before(first)  # retention removed its head (as offsets_of would find)
            if cq.positions and (lowest is None or cq.positions[0] < lowest):
                lowest = cq.positions[0]
        return lowest

    def stored_record(self, position: int) -> Record | None:
        """The record stored at ``position``, if there is one (no queue lookup)."""
        return self._record(position)

    def record_at(self, position: int) -> tuple[int, Record] | None:
        """(queue offset, record) of the message stored at ``position``, if there is one."""
        data = self._record(position)
        if data is None:
            return None
        try:
            topic, queue_id = codec.record_queue(data)
        except CodecError:
            return None
        return self.state.queue_offset_of(topic, queue_id, position), data

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        """When the message at ``offset`` of a queue was stored (ms), None if it is not readable."""
        cq = self.state.queue(topic, queue_id)
        if cq is None or not cq.min_offset <= offset < cq.max_offset:
            return None
        rec = self._record(cq.positions[offset - cq.base])
        if rec is None:
            return None
        try:
            return codec.record_store_ms(rec)
        except CodecError:
            return None

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset of a queue stored at or after ``timestamp_ms`` (binary search over
        store times, which grow with the offset); the max offset if there is none."""
        lo, hi = self.offsets_of(topic, queue_id)
        while lo < hi:
            mid = (lo + hi) // 2
            stamp = self.store_time_at(topic, queue_id, mid)
            if stamp is not None and stamp < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def positions_by_key(self, topic: str, key: str) -> list[int]:
        return self.state.positions_by_key(topic, key)

    def topic_config_wrapper(self) -> TopicConfigWrapper:
        return self.state.topic_config_wrapper()

    def stats(self) -> dict[str, Any]:
        return {
            **self.state.stats(),
            "apply_lag": self.ledger.commit_index - self.state.applied,
            "max_apply_lag": self.max_apply_lag,
            "replayed_entries": self.state.applied - self._start_applied,  # applied since this store started
            **{f"checkpoint_{k}": v for k, v in self.ckpt.items()},
            "time_ms": int(time.time() * 1000),
        }
