"""The asyncio runtime of a ledger node: drives the Raft core with the network, clock and disk.

One event loop does everything except fsync, which runs on a dedicated thread so the loop
keeps receiving while the disk works. That thread is the group commit: while one fsync is
in progress, appends pile up in the page cache, and the next fsync covers them all. An
append is answered only when its index is committed, i.e. durable on a quorum.

A leader that loses its leadership keeps its pending appends: if the new leader commits
the same entry (same index and term) the client still gets its acknowledgement, and if a
different entry is committed at that index the client gets a definite failure. Only a
timeout leaves the outcome unknown, which is what a Jepsen history calls ``info``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .codec import Entry
from .config import NodeConfig
from .hardstate import HardState
from .messages import Message
from .metrics import NodeMetrics
from .raft import NotLeader, RaftCore, Role
from .settings import parse_host_port
from .store import LogStore
from .transport import FrameProtocol, InboundProtocol, PeerOutbox
from .wire import (
    BAD_REQUEST,
    FAILED,
    NOT_LEADER,
    OP_APPEND,
    OP_READ,
    OP_STATUS,
    OP_TRANSFER,
    UNKNOWN_OUTCOME,
    LedgerError,
    WireError,
    decode_request,
    error,
    ok_append,
    ok_entries,
    ok_json,
    request_id_of,
)

log = logging.getLogger("ledger.node")

AppendCallback = Callable[[int, int, int, str], None]  # (code, first index, term, message)


class _TrackedLog:
    """The store as the core sees it, remembering truncations that race with an fsync.

    An fsync started before a follower truncated its log must not vouch for the entries
    written after the truncation point, so the runtime credits it only below that point.
    """

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self.floor: int | None = None

    @property
    def first_index(self) -> int:
        return self.store.first_index

    @property
    def last_index(self) -> int:
        return self.store.last_index

    @property
    def last_term(self) -> int:
        return self.store.last_term

    def term_at(self, index: int) -> int:
        return self.store.term_at(index)

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        return self.store.entries(lo, hi, max_bytes)

    def append(self, entries: Sequence[Entry]) -> None:
        self.store.append(entries)

    def truncate_suffix(self, index: int) -> None:
        self.floor = index if self.floor is None else min(self.floor, index)
        self.store.truncate_suffix(index)

    def reset(self, base_index: int, base_term: int, base_pos: int) -> None:
        self.floor = base_index + 1 if self.floor is None else min(self.floor, base_index + 1)
        self.store.reset(base_index, base_term, base_pos)


class LedgerNode:
    """A member of a ledger group, embeddable in a broker process or run alone by the CLI."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        data = Path(config.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.store = LogStore(
            data / "log",
            segment_bytes=config.segment_bytes,
            retention_bytes=config.retention_bytes or None,
            retention_seconds=config.retention_hours * 3600 or None,
        )
        self.hardstate = HardState(data / "hardstate")
        self.log = _TrackedLog(self.store)
        self.core = RaftCore(
            config.id,
            list(config.members),
            self.log,
            term=self.hardstate.term,
            voted_for=self.hardstate.voted_for,
            config=config.raft_config(),
            rng=random.Random(),
            durable_index=self.store.last_index,
        )
        self.metrics = NodeMetrics(config.id)
        self.outboxes: dict[str, PeerOutbox] = {}
        self.pending: deque[tuple[int, int, float, AppendCallback, int]] = deque()
        self.role_listeners: list[Callable[[Role, int, str | None], None]] = []
        self.leader_ready_listeners: list[Callable[[int], None]] = []
        self.commit_listeners: list[Callable[[int], None]] = []
        self._scheduled = False
        self._syncing = False
        self._server: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._sync_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"fsync-{config.id}")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = asyncio.Event()
        self._ready_term = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        for peer, addr in cfg.members.items():
            if peer != cfg.id:
                self.outboxes[peer] = PeerOutbox(cfg.id, peer, parse_host_port("peers", addr), cfg.max_frame_bytes)
        host, port = parse_host_port("listen", cfg.listen)
        members = set(cfg.members)
        self._server = await self._loop.create_server(
            lambda: InboundProtocol(cfg.max_frame_bytes, self._on_message, self._client_handler, members),
            host,
            port,
            reuse_address=True,
        )
        for box in self.outboxes.values():
            box._ensure_connecting()
        self._tasks.append(self._loop.create_task(self._ticker()))
        if cfg.retention_bytes or cfg.retention_hours:
            self._tasks.append(self._loop.create_task(self._retention()))
        if cfg.metrics_port:
            self.metrics.serve(cfg.metrics_host, cfg.metrics_port)
        log.info(
            "ledger node started",
            extra={
                "listen": cfg.listen,
                "term": self.core.term,
                "last_index": self.store.last_index,
                "first_index": self.store.first_index,
            },
        )

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for box in self.outboxes.values():
            box.close()
        if self._server is not None:
            self._server.close()
        self._fail_pending(UNKNOWN_OUTCOME, "node shutting down")
        while self._syncing:
            await asyncio.sleep(0.005)
        self._sync_pool.shutdown(wait=True)
        self.store.close()
        self._stopped.set()
        log.info("ledger node stopped")

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # ------------------------------------------------------------------ driving the core

    async def _ticker(self) -> None:
        """Tick on a fixed cadence, so a busy loop does not stretch every tick by its own delay.

        A follower that counts slow ticks thinks it heard from its (dead) leader more recently
        than it did, and refuses the pre-votes that would replace it. Ticks missed in a long
        stall are dropped, not fired in a burst: the messages queued meanwhile (heartbeats
        among them) must be read before the clock may call an election.
        """
        interval = self.config.tick_ms / 1000
        loop = asyncio.get_running_loop()
        next_at = loop.time() + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            self.core.tick()
            self._expire_pending()
            self._schedule()
            next_at += interval
            now = loop.time()
            if now > next_at + interval:  # more than a tick behind: drop the missed ones
                next_at = now + interval

    def _on_message(self, m: Message) -> None:
        self.core.step(m)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._process)

    def _process(self) -> None:
        self._scheduled = False
        core = self.core
        rd = core.ready()
        if rd.hard_state is not None:
            try:
                self.hardstate.save(*rd.hard_state)  # fsynced before any vote leaves this node
            except Exception:
                log.critical("cannot persist term and vote; stopping", exc_info=True)
                assert self._loop is not None
                self._loop.create_task(self.stop())
                return
        outboxes = self.outboxes
        for m in rd.messages:
            outboxes[m.dst].send(m)
        for role, term, leader in rd.role_changes:
            self._on_role_change(role, term, leader)
        if rd.commit_index is not None:
            self._on_commit(rd.commit_index)
        if rd.leader_ready is not None:
            self._ready_term = rd.leader_ready
            log.info("leader ready", extra={"term": rd.leader_ready, "commit_index": core.commit})
            for fn in self.leader_ready_listeners:
                fn(rd.leader_ready)
        for ctx, index in rd.read_states:
            ctx(index, None)
        for ctx in rd.dropped_reads:
            ctx(0, NotLeader(core.leader, "leadership lost before the read was confirmed"))
        if not self._syncing and self.store.last_index > core.durable:
            self._syncing = True
            assert self._loop is not None
            self._loop.create_task(self._sync())

    async def _sync(self) -> None:
        """Group commit: fsync whatever is written, report it, repeat while more arrived."""
        loop = asyncio.get_running_loop()
        store = self.store
        try:
            while store.last_index > self.core.durable:
                self.log.floor = None
                job = store.prepare_sync()
                t0 = time.perf_counter()
                await loop.run_in_executor(self._sync_pool, job.run)
                self.metrics.fsync_seconds.observe(time.perf_counter() - t0)
                store.complete_sync(job)
                durable = job.target
                if self.log.floor is not None:
                    durable = min(durable, self.log.floor - 1)
                self.core.on_durable(durable)
                self._process()
        except Exception:
            log.exception("fsync failed; stopping the node rather than acknowledging undurable entries")
            loop.create_task(self.stop())
        finally:
            self._syncing = False

    def _on_role_change(self, role: Role, term: int, leader: str | None) -> None:
        self.metrics.set_role(role, term)
        log.info("role change", extra={"role": role.value, "term": term, "leader": leader})
        for fn in self.role_listeners:
            fn(role, term, leader)

    def _on_commit(self, commit: int) -> None:
        self.metrics.commit_index.set(commit)
        pending = self.pending
        if pending:
            store = self.store
            now = time.perf_counter()
            while pending and pending[0][0] <= commit:
                last, term, t0, cb, count = pending.popleft()
                try:
                    same = store.term_at(last) == term
                except IndexError:
                    same = False
                if same:
                    self.metrics.append_seconds.observe(now - t0)
                    cb(0, last - count + 1, term, "")
                else:
                    cb(FAILED, 0, 0, f"entry {last} was overwritten by a newer leader")
        for fn in self.commit_listeners:
            fn(commit)

    def _expire_pending(self) -> None:
        pending = self.pending
        if not pending:
            return
        deadline = time.perf_counter() - self.config.append_timeout_s
        while pending and pending[0][2] < deadline:
            _, _, _, cb, _ = pending.popleft()
            cb(UNKNOWN_OUTCOME, 0, 0, "not committed within the append timeout; it may still be")

    def _fail_pending(self, code: int, message: str) -> None:
        while self.pending:
            _, _, _, cb, _ = self.pending.popleft()
            cb(code, 0, 0, message)

    # ------------------------------------------------------------------ local API (embedding)

    @property
    def commit_index(self) -> int:
        return self.core.commit

    @property
    def is_leader(self) -> bool:
        return self.core.role is Role.LEADER

    @property
    def leader_ready(self) -> bool:
        return self.is_leader and self._ready_term == self.core.term

    def leader_address(self) -> str | None:
        leader = self.core.leader
        return self.config.members.get(leader) if leader else None

    def propose(self, payloads: Sequence[bytes], cb: AppendCallback) -> None:
        """Append payloads; ``cb(code, first_index, term, message)`` fires once they commit or fail.

        Raises ``NotLeader`` at once when this node cannot accept the append.
        """
        first, term = self.core.propose(payloads)
        self.pending.append((first + len(payloads) - 1, term, time.perf_counter(), cb, len(payloads)))
        self._schedule()

    async def append(self, payloads: Sequence[bytes]) -> tuple[int, int]:
        """Append and wait for commitment; returns (first index, term)."""
        assert self._loop is not None
        fut: asyncio.Future[tuple[int, int]] = self._loop.create_future()

        def done(code: int, first: int, term: int, message: str) -> None:
            if fut.done():
                return
            if code == 0:
                fut.set_result((first, term))
            else:
                fut.set_exception(LedgerError(code, message))

        self.propose(payloads, done)
        return await fut

    def request_read_index(self, cb: Callable[[int, Exception | None], None]) -> None:
        """ReadIndex: ``cb(index, None)`` once reads up to ``index`` are linearizable here."""
        self.core.read_index(cb)
        self._schedule()

    async def read_index(self) -> int:
        assert self._loop is not None
        fut: asyncio.Future[int] = self._loop.create_future()

        def done(index: int, exc: Exception | None) -> None:
            if not fut.done():
                fut.set_exception(exc) if exc else fut.set_result(index)

        self.request_read_index(done)
        return await fut

    def committed_entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Committed entries lo..hi inclusive (fewer if not committed yet or over ``max_bytes``)."""
        hi = min(hi, self.core.commit)
        if lo > hi:
            return []
        return self.store.entries(lo, hi, max_bytes)

    def transfer_leadership(self, target: str) -> None:
        self.core.transfer_leadership(target)
        self._schedule()

    def status(self) -> dict[str, Any]:
        st = self.core.status()
        st.update(
            address=self.config.listen,
            members=self.config.members,
            leader_address=self.leader_address(),
            leader_ready=self.leader_ready,
            pending_appends=len(self.pending),
            log_bytes=self.store.size_bytes(),
        )
        return st

    # ------------------------------------------------------------------ client connections

    def _client_handler(self, proto: FrameProtocol) -> Callable[[bytes], None]:
        max_entry = self.config.max_entry_bytes

        def handle(body: bytes) -> None:
            try:
                req = decode_request(body, max_entry)
            except LedgerError as exc:
                proto.send(error(request_id_of(body), exc.code, exc.message))
                return
            except WireError as exc:
                proto.abort(f"malformed client request: {exc}")
                return
            rid = req.req_id
            try:
                if req.op == OP_APPEND:
                    assert req.payloads is not None

                    def appended(code: int, first: int, term: int, message: str) -> None:
                        if code == 0:
                            proto.send(ok_append(rid, first, term, len(req.payloads or ())))
                        else:
                            proto.send(error(rid, code, message, self.core.leader, self.leader_address()))

                    self.propose(req.payloads, appended)
                elif req.op == OP_READ:
                    self._serve_read(proto, rid, req.lo, req.hi, req.max_bytes, req.linearizable)
                elif req.op == OP_STATUS:
                    proto.send(ok_json(rid, self.status()))
                elif req.op == OP_TRANSFER:
                    self.transfer_leadership(req.target)
                    proto.send(ok_json(rid, {"transferring_to": req.target}))
            except NotLeader as exc:
                addr = self.config.members.get(exc.leader) if exc.leader else None
                proto.send(error(rid, NOT_LEADER, str(exc), exc.leader, addr))
            except (ValueError, IndexError) as exc:
                proto.send(error(rid, BAD_REQUEST, str(exc)))

        return handle

    def _serve_read(self, proto: FrameProtocol, rid: int, lo: int, hi: int, max_bytes: int, lin: bool) -> None:
        def reply(index: int, exc: Exception | None) -> None:
            if exc is not None:
                leader = getattr(exc, "leader", None)
                proto.send(error(rid, NOT_LEADER, str(exc), leader, self.leader_address()))
                return
            first = self.store.first_index
            if lo < first:
                proto.send(error(rid, BAD_REQUEST, f"index {lo} was removed by retention; first index is {first}"))
                return
            entries = self.committed_entries(lo, hi, max_bytes or None)
            proto.send(ok_entries(rid, b"".join(e.raw for e in entries)))  # type: ignore[misc]

        if lo < 1 or hi < lo:
            proto.send(error(rid, BAD_REQUEST, f"bad read range {lo}..{hi}"))
        elif lin:
            self.request_read_index(reply)
        else:
            reply(self.core.commit, None)

    # ------------------------------------------------------------------ housekeeping

    async def _retention(self) -> None:
        while True:
            await asyncio.sleep(30)
            first = self.store.apply_retention(self.core.commit)
            self.metrics.first_index.set(first)
