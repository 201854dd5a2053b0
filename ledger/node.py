"""The asyncio shell of a ledger node: sockets, the fsync thread and the ticker around the runtime.

Everything Raft-specific a node does with its inputs (persist before send, pending
appends and their acknowledgement rule, group commit, listeners) is in
``ledger.runtime.LedgerRuntime``, the same code the simulator drives. This module only
connects it to the world: ``StoreDisk`` (the segmented store, the hard-state file, one
fsync at a time on a dedicated thread so the loop keeps receiving while the disk works:
appends pile up in the page cache and the next fsync covers them all), the peer outboxes,
a monotonic clock, a fixed-cadence ticker, and the client protocol.

An append is answered only when its index is committed, i.e. durable on a quorum; a
leader that loses its leadership still answers its pending appends once their fate is
known, and only a timeout leaves the outcome unknown (a Jepsen history's ``info``).

Membership: the peers this node dials and accepts follow the configuration in effect
(``ledger.membership``), and the addresses of new members come from the configuration
entries themselves. A node started with ``join`` asks the group for its configuration and
waits, outside it, to be added as a learner (``ledger member add``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.settings import parse_host_port

from .codec import Entry
from .config import NodeConfig
from .hardstate import HardState, after_lost_hard_state
from .membership import Membership, MembershipChange, MembershipError
from .messages import Message
from .metrics import NodeMetrics
from .raft import NotLeader, RaftCore, Role
from .runtime import AppendCallback, Busy, LedgerRuntime, SyncDone
from .store import CorruptLogError, LogStore, SyncJob, fsync_dir, write_file_atomically
from .transport import FrameProtocol, Listener, PeerOutbox
from .wire import (
    BAD_REQUEST,
    BUSY,
    NOT_LEADER,
    OP_APPEND,
    OP_MEMBER,
    OP_READ,
    OP_STATUS,
    OP_TRANSFER,
    UNAVAILABLE,
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

#: Written in the data directory at a node's first start: later, a missing hard state is a loss.
FIRST_START_MARKER = "initialized"
#: Beside the hard state, a term the node never goes past without moving it (``ledger.hardstate``).
TERM_BOUND_NAME = "term-bound"
#: Present while a node that lost its hard state refuses to vote (see ``_detect_lost_hard_state``).
RECOVERY_MARKER = "recovering"
#: After a refused write, the disk is probed with this much data (and an fsync) every
#: ``LedgerRuntime.disk_retry_s`` before the node leads or votes again.
DISK_PROBE_BYTES = 1 << 20
DISK_PROBE_NAME = "disk-probe.tmp"
#: Seconds between a joining node's rounds of asking the group for its configuration.
JOIN_RETRY_S = 0.5


class StoreDisk:
    """The runtime's disk in production: the segmented store, the hard-state file and the fsync thread.

    One fsync runs at a time on a dedicated thread, so the loop keeps receiving while the
    disk works; ``LogStore.complete_sync`` says what it made durable (never an entry
    rewritten after it started).
    """

    def __init__(self, store: LogStore, hardstate: HardState, node_id: str, metrics: NodeMetrics) -> None:
        self.log = store
        self.hardstate = hardstate
        self.metrics = metrics
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"fsync-{node_id}")
        self._loop: asyncio.AbstractEventLoop | None = None
        self.in_flight = False
        self.mark_in_flight = False

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def save_hard_state(self, term: int, voted_for: str | None) -> None:
        self.hardstate.save(term, voted_for)  # fsynced before any message of the Ready leaves

    def writable(self) -> bool:
        """Probe a disk that refused a write: can it take ``DISK_PROBE_BYTES`` and an fsync now?

        A store poisoned by a failed fsync or a failed rollback stays unwritable: only a
        restart that re-reads the files is safe then.
        """
        if self.log.failed:
            return False
        probe = Path(self.log.directory) / DISK_PROBE_NAME
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, bytes(DISK_PROBE_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
            return True
        except OSError:
            return False
        finally:
            try:
                os.unlink(probe)
            except OSError:
                pass

    def maybe_mark(self) -> None:
        """On a tick: a quiet log whose newest durable entries are unmarked gets its mark now
        (``LogStore.mark_due``), on the fsync thread, so a job queued meanwhile waits for it
        as it would for a mark of its own: at most one mark per interval either way."""
        if self.in_flight or self.mark_in_flight or self._loop is None or not self.log.mark_due():
            return
        path, data = self.log.prepare_mark()
        self.mark_in_flight = True
        self._loop.run_in_executor(self._pool, write_file_atomically, path, data).add_done_callback(
            self._mark_written
        )

    def _mark_written(self, fut: asyncio.Future[None]) -> None:
        self.mark_in_flight = False
        exc = fut.exception()
        if exc is not None:
            self.log.mark_failed()
            log.warning("could not record the durable mark: %s", exc, extra={"path": self.log.directory})

    def start_sync(self, done: SyncDone) -> None:
        """Capture what is written now and fsync it on the thread, at once: a job deferred to
        the next loop turn waited behind everything that turn held (on a master, a whole
        read of send requests), and every acknowledgement waited with it."""
        loop = self._loop
        assert loop is not None, "start_sync before the node started"
        self.in_flight = True
        try:
            job = self.log.prepare_sync()
        except Exception as exc:
            self.in_flight = False
            loop.call_soon(done, 0, exc)  # ``done`` runs later, never inside the caller's step
            return
        t0 = time.perf_counter()
        loop.run_in_executor(self._pool, job.run).add_done_callback(
            lambda fut: self._finished(fut, job, t0, done)
        )

    def _finished(self, fut: asyncio.Future[None], job: SyncJob, t0: float, done: SyncDone) -> None:
        self.metrics.fsync_seconds.observe(time.perf_counter() - t0)
        fut.exception()  # retrieved here; complete_sync re-raises it once the job's files are released
        self.in_flight = False
        try:
            durable = self.log.complete_sync(job)
        except Exception as exc:
            done(0, exc)
            return
        done(durable, None)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        try:
            self.log.mark_durable()  # a clean stop: losses while down are told from torn writes
        except OSError as exc:
            log.warning(
                "could not record the durable mark at stop: %s", exc, extra={"path": self.log.directory}
            )
        self.log.close()


class _Outboxes:
    """The runtime's network in production: one ``PeerOutbox`` per peer, made on first use
    for a peer whose address is known (a member the configuration just added)."""

    def __init__(self, make: Callable[[str], PeerOutbox | None]) -> None:
        self.boxes: dict[str, PeerOutbox] = {}
        self.make = make

    def send(self, m: Message) -> None:
        box = self.boxes.get(m.dst)
        if box is None:
            box = self.make(m.dst)
            if box is None:
                return  # no address for it (yet): dropped, as on a link that is down
        box.send(m)


class _MonotonicClock:
    def now(self) -> float:
        return time.perf_counter()


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
            salvage=True,  # a damaged log keeps its valid prefix; the node recovers the rest from peers
            mark_interval_s=config.durable_mark_interval_s,  # see NodeConfig
        )
        self.hardstate = HardState(data / "hardstate", data / TERM_BOUND_NAME)
        self._recovery_marker = data / RECOVERY_MARKER
        self.log_damage_found = self.store.lost_from  # first index a salvage at this start dropped
        recovering = self._detect_lost_hard_state(data)
        # The configuration file's peers bootstrap the group; a joining node starts outside any
        # configuration and learns the group's from it (``_join``). The log's always wins.
        bootstrap = Membership({}) if config.join else Membership(config.members)
        self.core = RaftCore(
            config.id,
            bootstrap,
            self.store,
            # A node was in at least the term of its last entry; after a lost hard state this
            # keeps it from taking appends from leaders older than what its own log shows.
            term=max(self.hardstate.term, self.store.last_term),
            voted_for=self.hardstate.voted_for,
            config=config.raft_config(),
            rng=random.Random(),
            durable_index=self.store.last_index,
            recovering=recovering,
            log_claim=self.store.lost_claim,
        )
        self.metrics = NodeMetrics(config.id)
        self.disk = StoreDisk(self.store, self.hardstate, config.id, self.metrics)
        # Every address ever named by a configuration (or the file): the leader a follower
        # still follows may already be outside the configuration it appended.
        self.addresses: dict[str, str] = dict(config.members)
        self.addresses.update(self.core.membership.addresses())
        self._network = _Outboxes(self._make_outbox)
        self.outboxes = self._network.boxes
        self._listener: Listener | None = None
        self.fatal_reason: str | None = None
        self.runtime = LedgerRuntime(
            self.core,
            self.disk,
            self._network,
            _MonotonicClock(),
            append_timeout_s=config.append_timeout_s,
            wake=self._schedule,
            on_fatal=self._on_fatal,
            observe_append=self.metrics.append_seconds.observe,
            max_pending=config.max_pending_appends,
        )
        # The embedding surface: listeners are the runtime's, called in registration order.
        self.role_listeners = self.runtime.role_listeners
        self.commit_listeners = self.runtime.commit_listeners
        self.leader_ready_listeners = self.runtime.leader_ready_listeners
        self.membership_listeners = self.runtime.membership_listeners
        self.role_listeners.append(self._on_role_change)
        self.membership_listeners.append(self._on_membership)
        self.commit_listeners.append(self.metrics.commit_index.set)
        self.leader_ready_listeners.append(self._on_leader_ready)
        self.runtime.disk_fault_listeners.append(
            lambda reason: self.metrics.disk_fault.set(0 if reason is None else 1)
        )
        self._scheduled = False
        # Cleared (markers removed) once the core neither recovers nor defends a lost log.
        self._recovery_pending = self.core.recovering or self.store.lost_from is not None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = asyncio.Event()

    def _detect_lost_hard_state(self, data: Path) -> bool:
        """Whether this node lost its term and vote, or log entries, while it had state: then it starts recovering.

        Log damage is found by the store (``LogStore.lost_from``, durable in its own marker
        until ``forget_damage``): the node may have acknowledged what it dropped. When the
        store saw how far the damaged log reached (``lost_claim``) the core keeps voting as if
        it still held that log; only without that claim does the node refuse every vote.

        A missing hard-state file is normal only on a node's very first start, so that start
        writes one (and a marker) at once. Later, a missing file next to a log or the marker
        means it was lost: the node may have voted in any term up to its term bound, so it
        restarts in that term with its vote spent (``after_lost_hard_state``) and votes as
        usual in later terms. Only when the bound is lost too does it refuse every vote until a
        leader has brought it up to date; that recovering state survives a restart (its own
        marker file), since the first save of a term would recreate the hard state.
        """
        first_start = data / FIRST_START_MARKER
        had_state = first_start.exists() or self.store.last_index > 0 or self.store.first_index > 1
        lost_state = not self.hardstate.exists and had_state
        # Damage with a known claim (the last entry the damaged part still showed) only
        # constrains votes (RaftCore.log_claim); without one the node refuses them all.
        lost_log = self.store.lost_from is not None and self.store.lost_claim is None
        refuse_votes = lost_log
        self.hard_state_lost: int | None = None  # the term it restarted in after losing its hard state
        if lost_state:
            term, vote, refuse_votes = after_lost_hard_state(
                self.hardstate.bound, self.store.last_term, self.config.id
            )
            refuse_votes = refuse_votes or lost_log
            self.hard_state_lost = term
            log.warning(
                "hard state lost while the node had data: restarting in term %d %s",
                term,
                "refusing votes until a leader brings it up to date"
                if vote is None
                else "(its term bound) with its vote spent",
                extra={"path": self.hardstate.path, "term": term, "term_bound": self.hardstate.bound},
            )
        recovering = self._recovery_marker.exists() or refuse_votes
        if recovering:
            write_file_atomically(self._recovery_marker, b"lost data; votes refused until caught up\n")
            log.warning(
                "%s: refusing to vote until a leader brings it up to date",
                "log damaged" if lost_log else "hard state and term bound lost",
                extra={
                    "path": self.hardstate.path,
                    "last_index": self.store.last_index,
                    "lost_from": self.store.lost_from,
                },
            )
        if lost_state and (term > 0 or vote is not None):
            # Saved (after the recovery marker, if any) so that every message it sends is
            # covered by a persisted term, as Raft requires, and its spent vote survives a crash.
            self.hardstate.save(term, vote)
        elif not self.hardstate.exists:
            self.hardstate.create()
        else:
            self.hardstate.ensure_bound()  # a directory from before term bounds, or a lost bound
        if not first_start.exists():
            write_file_atomically(first_start, b"ledger node data directory\n")
        return recovering

    def _clear_recovery(self) -> None:
        """The core left recovery (a leader caught it up): votes are safe again, across restarts too."""
        self.store.forget_damage()
        try:
            self._recovery_marker.unlink()
        except FileNotFoundError:
            return
        fsync_dir(self._recovery_marker.parent)
        log.info("recovered: caught up with the leader, voting again", extra={"term": self.core.term})

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        self.disk.attach(self._loop)
        self._listener = Listener(cfg, self._on_message, self._client_handler)
        self._listener.on_departed = self.runtime.departed_dialed
        self._leaving_dropped = self.core.leaving_dropped
        self._reconcile_peers()
        self._server = await self._listener.start()
        self._tasks.append(self._loop.create_task(self._ticker()))
        if cfg.join and self.core.config_index == 0 and not self.core.membership.ids:
            self._tasks.append(self._loop.create_task(self._join()))
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
        self.runtime.stop("node shutting down")
        while self.disk.in_flight or self.disk.mark_in_flight:
            await asyncio.sleep(0.005)
        self.disk.close()
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
            self.runtime.tick()
            self.disk.maybe_mark()
            if self.core.leaving_dropped != self._leaving_dropped:  # stop talking to a removed peer
                self._leaving_dropped = self.core.leaving_dropped
                self._reconcile_peers()
            if self._recovery_pending and not self.core.recovering and self.core.log_claim is None:
                self._recovery_pending = False
                self._clear_recovery()
            next_at += interval
            now = loop.time()
            if now > next_at + interval:  # more than a tick behind: drop the missed ones
                next_at = now + interval

    def _on_message(self, m: Message) -> None:
        self.runtime.step(m)

    def _schedule(self) -> None:
        """The runtime's ``wake``: handle its Ready once per loop turn, however many inputs arrived."""
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._process)

    def _process(self) -> None:
        self._scheduled = False
        try:
            self.runtime.process()
        except CorruptLogError as exc:  # a leader read a damaged entry to replicate it
            self._log_damaged(exc)

    def _log_damaged(self, exc: CorruptLogError) -> None:
        """Damage found while running: stop, so the restart's recovery salvages the log and the
        node re-fetches the rest from its peers (the store already dropped the index it trusted)."""
        self.runtime.fail(f"log damaged, restart to repair it from the peers: {exc}")

    def _on_fatal(self, reason: str) -> None:
        self.fatal_reason = self.fatal_reason or reason
        log.critical("stopping the node: %s", reason)
        if self._loop is not None:
            self._loop.create_task(self.stop())

    def _on_role_change(self, role: Role, term: int, leader: str | None) -> None:
        self.metrics.set_role(role, term)
        log.info("role change", extra={"role": role.value, "term": term, "leader": leader})
        if self.core.contacts() != set(self.outboxes):
            self._reconcile_peers()  # a new leader outside our configuration, or one gone

    # ------------------------------------------------------------------ membership and peers

    def _make_outbox(self, peer: str) -> PeerOutbox | None:
        """The outbox to ``peer`` (made now if its address is known), or None."""
        box = self.outboxes.get(peer)
        if box is not None:
            return box
        # ``dial``: a relay on the way to it (it wins over any address a configuration carries)
        addr = self.config.dial_overrides.get(peer) or self.addresses.get(peer)
        if addr is None or self._loop is None or peer == self.config.id:
            return None
        try:
            where = parse_host_port("peers", addr)
        except ValueError as exc:  # an address a configuration carried but nobody can dial
            log.error("cannot dial member %s: %s", peer, exc, extra={"peer_id": peer})
            return None
        box = PeerOutbox.for_member(
            self.config,
            peer,
            where,
            on_lost=self.runtime.peer_unreachable,
            on_connected=self.runtime.peer_reachable,
        )
        self.outboxes[peer] = box
        return box

    def _on_membership(self, m: Membership) -> None:
        """The configuration in effect changed: learn the new addresses, then re-fit the peers."""
        for peer, addr in m.addresses().items():
            old = self.addresses.get(peer)
            if old != addr and addr:
                self.addresses[peer] = addr
                if peer in self.config.dial_overrides:
                    continue  # dialled through its override whatever the configuration says
                box = self.outboxes.pop(peer, None)
                if box is not None:  # the id came back at another address: dial that one
                    box.close()
        log.info(
            "membership",
            extra={
                "index": self.core.config_index,
                "voters": list(m.voters),
                "learners": list(m.learners),
                "voter": self.core.is_voter,
            },
        )
        self._reconcile_peers()

    def _reconcile_peers(self) -> None:
        """Dial whom the core must talk to, hang up on the rest, accept connections to match."""
        if self._loop is None:
            return
        core = self.core
        wanted = core.contacts()
        member = core.membership.is_member(self.config.id)
        for peer in list(self.outboxes):
            if peer not in wanted:
                self.outboxes.pop(peer).close()
        for peer in sorted(wanted):
            if peer not in self.outboxes:
                box = self._make_outbox(peer)
                if box is not None and member:
                    box._ensure_connecting()  # members connect eagerly; others only to answer
        if self._listener is not None:
            self._listener.set_members(wanted, open_to_all=not member, departed=core.departed)

    async def _join(self) -> None:
        """Ask the group (``join`` addresses) for its configuration until one answers, and adopt it.

        The node then waits outside the group, reachable by its members, for a leader to add
        it as a learner and send it the log. Gives up (and stops the node) after
        ``join_timeout_s``, or at once when the group lists this id as a voter: a node with an
        empty log must not take over a voter's identity (it may have voted as that voter).
        """
        from .client import LedgerClient  # the client protocol: the group's status

        cfg = self.config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cfg.join_timeout_s
        last_error = "no answer yet"
        async with LedgerClient(
            cfg.join,
            timeout=2.0,
            attempt_timeout=1.0,
            ssl=cfg.client_ssl,
            secret=cfg.secret or None,
            accepted_secrets=cfg.accepted_secrets,
        ) as client:
            while loop.time() < deadline:
                if self.core.config_index != 0 or self.core.membership.ids:
                    return  # a leader already sent us a configuration
                best: tuple[int, Membership] | None = None
                for addr in cfg.join:
                    try:
                        st = await client.status(addr)
                        doc = st["membership"]
                        found = (int(doc["index"]), Membership.from_json(doc))
                    except (LedgerError, OSError, TimeoutError, KeyError, TypeError, ValueError) as exc:
                        last_error = f"{addr}: {exc}"
                        continue
                    if best is None or found[0] > best[0]:
                        best = found
                if best is not None:
                    self._adopt_group(best[1])
                    return
                await asyncio.sleep(JOIN_RETRY_S)
        self._on_fatal(
            f"cannot join: no node of {cfg.join} answered within {cfg.join_timeout_s:g} s ({last_error})"
        )

    def _adopt_group(self, m: Membership) -> None:
        me = self.config.id
        if me in m.voters:
            self._on_fatal(
                f"cannot join: the group already has a voter {me!r} (at {m.voters[me]}); a node with an "
                f"empty log must not take its place: remove {me} first (ledger member remove) or use another id"
            )
            return
        if me in m.learners:
            # Added before it started: it will not vote before a leader has caught it up.
            self.core.recovering = True
        if self.runtime.adopt_bootstrap(m):
            log.info(
                "joining: learned the group's configuration; waiting to be added as a learner"
                if me not in m.learners
                else "joining: already a learner of the group; catching up",
                extra={"voters": list(m.voters), "learners": list(m.learners)},
            )

    def _on_leader_ready(self, term: int) -> None:
        log.info("leader ready", extra={"term": term, "commit_index": self.core.commit})

    # ------------------------------------------------------------------ local API (embedding)

    @property
    def commit_index(self) -> int:
        return self.core.commit

    @property
    def is_leader(self) -> bool:
        return self.core.role is Role.LEADER

    @property
    def leader_ready(self) -> bool:
        return self.runtime.leader_ready

    @property
    def pending(self) -> int:
        """Appends waiting for commitment."""
        return len(self.runtime.pending)

    def leader_address(self) -> str | None:
        leader = self.core.leader
        return self.addresses.get(leader) if leader else None

    @property
    def membership(self) -> Membership:
        """The configuration in effect on this node (the latest in its log)."""
        return self.core.membership

    def propose_membership(self, change: MembershipChange, cb: AppendCallback) -> tuple[int, int]:
        """Propose a membership change on the leader; returns (index, term) at once, and
        ``cb(code, index, term, message)`` fires once it commits or fails (as for ``propose``).

        Raises ``NotLeader``, or ``MembershipError`` (``retryable`` when waiting may help) when
        the change is refused; see ``ledger.membership``.
        """
        return self.runtime.propose_membership(change, cb)

    async def change_membership(self, change: MembershipChange) -> dict[str, Any]:
        """Propose ``change`` and wait until it is committed; returns the new configuration."""
        assert self._loop is not None
        fut: asyncio.Future[dict[str, Any]] = self._loop.create_future()

        def done(code: int, index: int, term: int, message: str) -> None:
            if fut.done():
                return
            if code == 0:
                fut.set_result({"index": index, "term": term, **self.core.config_at(index)[2].to_json()})
            else:
                fut.set_exception(LedgerError(code, message))

        self.propose_membership(change, done)
        return await fut

    def propose(self, payloads: Sequence[bytes], cb: AppendCallback) -> tuple[int, int]:
        """Append payloads; returns (first index, term) at once, and ``cb(code, first_index, term,
        message)`` fires once they commit or fail.

        Raises ``NotLeader`` at once when this node cannot accept the append.
        """
        return self.runtime.propose(payloads, cb)

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
        self.runtime.read_index(cb)

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
        try:
            return self.store.entries(lo, hi, max_bytes)
        except CorruptLogError as exc:
            self._log_damaged(exc)
            raise

    def transfer_leadership(self, target: str) -> None:
        self.runtime.transfer_leadership(target)

    def set_lagging(self, lagging: bool) -> None:
        self.runtime.set_lagging(lagging)

    def status(self) -> dict[str, Any]:
        st = self.core.status()
        st.update(
            address=self.config.listen,
            members=self.core.membership.addresses(),
            leader_address=self.leader_address(),
            leader_ready=self.leader_ready,
            pending_appends=self.pending,
            disk_fault_reason=self.runtime.disk_fault,
            log_bytes=self.store.size_bytes(),
            log_lost_from=self.store.lost_from,
            log_damage_found=self.log_damage_found,
            hard_state_lost=self.hard_state_lost,
            term_bound=self.hardstate.bound,
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
                elif req.op == OP_MEMBER:
                    self._serve_member(proto, rid, req.change)
            except NotLeader as exc:
                addr = self.addresses.get(exc.leader) if exc.leader else None
                proto.send(error(rid, NOT_LEADER, str(exc), exc.leader, addr))
            except Busy as exc:
                proto.send(error(rid, BUSY, str(exc)))
            except MembershipError as exc:
                proto.send(error(rid, BUSY if exc.retryable else BAD_REQUEST, str(exc)))
            except (ValueError, IndexError) as exc:
                proto.send(error(rid, BAD_REQUEST, str(exc)))

        return handle

    def _serve_member(self, proto: FrameProtocol, rid: int, change: MembershipChange | None) -> None:
        """List the members (the leader's view, with each one's progress) or change them."""
        core = self.core
        if core.role is not Role.LEADER:
            raise NotLeader(core.leader)
        if change is None:
            proto.send(ok_json(rid, {"leader": self.config.id, **core.membership_status()}))
            return
        if change.address:
            parse_host_port("address", change.address)  # a ConfigError (ValueError): bad request

        def settled(code: int, index: int, term: int, message: str) -> None:
            if code == 0:
                m = core.config_at(index)[2]
                proto.send(
                    ok_json(rid, {"index": index, "term": term, "change": change.describe(), **m.to_json()})
                )
            else:
                proto.send(error(rid, code, message, core.leader, self.leader_address()))

        index, _ = self.propose_membership(change, settled)
        log.info("membership change proposed", extra={"change": change.describe(), "index": index})

    def _serve_read(
        self, proto: FrameProtocol, rid: int, lo: int, hi: int, max_bytes: int, lin: bool
    ) -> None:
        def reply(index: int, exc: Exception | None) -> None:
            if exc is not None:
                leader = getattr(exc, "leader", None)
                proto.send(error(rid, NOT_LEADER, str(exc), leader, self.leader_address()))
                return
            first = self.store.first_index
            if lo < first:
                proto.send(
                    error(rid, BAD_REQUEST, f"index {lo} was removed by retention; first index is {first}")
                )
                return
            cap = self.config.max_read_bytes  # max_bytes=0 means 'the default', never 'everything'
            try:
                entries = self.committed_entries(lo, hi, min(max_bytes or cap, cap))
            except CorruptLogError as exc:
                proto.send(
                    error(rid, UNAVAILABLE, f"node {self.config.id} is stopping to repair its log: {exc}")
                )
                return
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
