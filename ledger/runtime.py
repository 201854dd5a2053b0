"""The one runtime around the Raft core, free of I/O: production and simulation both drive it.

``RaftCore`` decides; this runtime carries out its ``Ready`` (the etcd/raft contract) over
three injected interfaces, so the asyncio node (``ledger.node``) and the deterministic
simulator (``ledger.sim``) run exactly this code and differ only in their disk, network
and clock (the TigerBeetle way: the simulator proves production code, not a copy):

1. Persist the hard state (term, vote) before any message of the same Ready leaves: a
   vote or a campaign must survive a crash before anyone can rely on it.
2. Tell the membership listeners when the configuration in effect changed (the node
   opens connections to new members before anything is sent to them), then send the
   messages.
3. Report role changes, then the new commit index to the commit listeners, then settle
   pending appends (so an acknowledged append has been delivered to the state machine),
   then leader readiness and the answers to reads.
4. Group commit: while the log holds entries the core has not seen durable, one fsync is
   in flight. It starts before step 3, so the disk works while the listeners apply and
   answer (an fsync vouches only for what was written before it, so the order is free).
   When it finishes the disk reports what is durable, the core learns it, and the next
   fsync covers everything written meanwhile. Whether an fsync may vouch for entries
   rewritten after it started is the disk's business (``Disk.start_sync``), so
   that rule lives in one place per disk: ``LogStore`` in production, and the simulated
   disk models the physics (an fsync covers the writes made before it started).

Pending appends: a proposal is acknowledged only when its last index is committed with the
term it was proposed in. A leader that loses its leadership keeps its pending appends: if
the same (index, term) commits the client still gets its acknowledgement, if a different
entry commits there it gets a definite failure, and only the append timeout (measured on
the injected clock) or a shutdown leaves the outcome unknown.

Listeners are called in registration order; one that raises is logged and the rest of the
Ready is still delivered (a broker bug must not leave the node's own bookkeeping behind).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .membership import Membership, MembershipChange
from .messages import Message
from .raft import LogView, NotLeader, RaftCore, Ready, Role
from .wire import FAILED, UNKNOWN_OUTCOME

__all__ = [
    "AppendCallback",
    "Busy",
    "Clock",
    "DEFAULT_DISK_RETRY_S",
    "Disk",
    "DurableLog",
    "LedgerRuntime",
    "Network",
    "ReadCallback",
]

log = logging.getLogger("ledger.runtime")

#: ``cb(code, first index, term, message)``: code 0 when committed, else ``wire.FAILED``
#: (definitely not committed) or ``wire.UNKNOWN_OUTCOME`` (timeout or shutdown).
AppendCallback = Callable[[int, int, int, str], None]
#: ``cb(read index, None)`` once reads up to the index are linearizable, or ``cb(0, error)``.
ReadCallback = Callable[[int, Exception | None], None]
SyncDone = Callable[[int, BaseException | None], None]
#: Seconds between probes of a disk that refused a write (``LedgerRuntime.disk_retry_s``).
DEFAULT_DISK_RETRY_S = 1.0


class DurableLog(LogView, Protocol):
    """The log as the runtime sees it: the core's view plus the durable index."""

    durable_index: int


class Disk(Protocol):
    """Where the log and the hard state live."""

    log: DurableLog

    def save_hard_state(self, term: int, voted_for: str | None) -> None:
        """Durably record (term, vote) before returning; raise if that is impossible."""

    def writable(self) -> bool:
        """After a failed write: whether the disk takes writes again (e.g. space was freed)."""

    def start_sync(self, done: SyncDone) -> None:
        """Start one fsync of what is written now; later call ``done(durable index, error)``.

        ``done`` runs on the runtime's thread, once. The durable index it reports must not
        cover entries written after the fsync started (e.g. rewritten after a truncation).
        """


class Network(Protocol):
    def send(self, m: Message) -> None:
        """Queue ``m`` for its destination; may drop it (Raft retransmits what matters)."""


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds (virtual in the simulator)."""


class _Pending:
    """One proposal awaiting commitment."""

    __slots__ = ("last", "term", "started", "cb", "count")

    def __init__(self, last: int, term: int, started: float, cb: AppendCallback, count: int) -> None:
        self.last = last
        self.term = term
        self.started = started
        self.cb = cb
        self.count = count


class Busy(Exception):
    """Too many appends await commit: this one was refused, certainly not appended (back-pressure)."""


class LedgerRuntime:
    """Drives one ``RaftCore`` over a disk, a network and a clock; see the module docstring.

    ``wake`` asks the shell to call ``process()`` soon (the asyncio node coalesces calls
    with ``call_soon``, the simulator right after the current event). Every input calls
    it, including those a listener makes from inside ``process()``, which handles one
    Ready. ``on_fatal(reason)`` is told when the disk fails: the runtime stops
    processing rather than acknowledge what may not be durable.
    """

    def __init__(
        self,
        core: RaftCore,
        disk: Disk,
        network: Network,
        clock: Clock,
        *,
        append_timeout_s: float,
        wake: Callable[[], None],
        on_fatal: Callable[[str], None] | None = None,
        observe_append: Callable[[float], None] | None = None,
        disk_retry_s: float = DEFAULT_DISK_RETRY_S,
        max_pending: int = 65536,
    ) -> None:
        self.core = core
        self.disk = disk
        self.network = network
        self.clock = clock
        self.append_timeout_s = append_timeout_s
        self.wake = wake
        self.on_fatal = on_fatal
        self.observe_append = observe_append
        self.pending: deque[_Pending] = deque()
        self.max_pending = max_pending  # appends awaiting commit; more are refused with Busy
        self.role_listeners: list[Callable[[Role, int, str | None], None]] = []
        self.commit_listeners: list[Callable[[int], None]] = []
        self.leader_ready_listeners: list[Callable[[int], None]] = []
        # Told the configuration in effect whenever it changes (appended, reverted, installed),
        # before any message of that Ready is sent.
        self.membership_listeners: list[Callable[[Membership], None]] = []
        #: told the member's id when one says the group removed this node (``RaftCore.removed_by``)
        self.removed_listeners: list[Callable[[str], None]] = []
        self.ready_term = 0
        self.syncing = False
        self.failed: str | None = None
        self.disk_retry_s = disk_retry_s
        self.disk_fault: str | None = None  # why the disk refused a write; None when healthy
        self.disk_fault_listeners: list[Callable[[str | None], None]] = []
        self._disk_retry_at = 0.0
        self.hard_state_unsaved = False  # a save failed: send nothing until it succeeds

    # ------------------------------------------------------------------ inputs

    def step(self, m: Message) -> None:
        try:
            self.core.step(m)
        except OSError as exc:  # a follower's append hit a full or failing disk
            self.disk_failed(exc)
        self.wake()

    def tick(self) -> None:
        try:
            self.core.tick()
        except OSError as exc:  # a lone voter elected itself and its no-op hit a full disk
            self.disk_failed(exc)
        self.expire_pending()
        if self.disk_fault is not None and self.clock.now() >= self._disk_retry_at:
            self._retry_disk()
        self.wake()

    def peer_unreachable(self, peer: str) -> None:
        """The shell saw ``peer``'s connection reset or refused (see ``RaftCore.peer_unreachable``)."""
        if self.failed is not None:
            return
        try:
            self.core.peer_unreachable(peer)
        except OSError as exc:  # see tick
            self.disk_failed(exc)
        self.wake()

    def departed_dialed(self, peer: str) -> None:
        """A member the group removed dialled us (see ``RaftCore.answer_departed``)."""
        if self.failed is not None:
            return
        self.core.answer_departed(peer)
        self.wake()

    def peer_reachable(self, peer: str) -> None:
        """The shell connected to ``peer`` (see ``RaftCore.peer_reachable``)."""
        if self.failed is not None:
            return
        self.core.peer_reachable(peer)
        self.wake()

    def propose(self, payloads: Sequence[bytes], cb: AppendCallback) -> tuple[int, int]:
        """Append ``payloads``; returns (first index, term) at once, ``cb`` fires when settled.

        Raises ``NotLeader`` when this node cannot take the append.
        """
        if self.disk_fault is not None:
            raise NotLeader(self.core.leader, f"disk fault: {self.disk_fault}")
        if len(self.pending) >= self.max_pending:
            raise Busy(
                f"{len(self.pending)} appends await commit (max_pending_appends = {self.max_pending}); "
                "nothing was appended, try again shortly"
            )
        try:
            first, term = self.core.propose(payloads)
        except OSError as exc:
            self.disk_failed(exc)
            self.wake()
            raise NotLeader(self.core.leader, f"disk fault: {self.disk_fault}") from exc
        n = len(payloads)
        self.pending.append(_Pending(first + n - 1, term, self.clock.now(), cb, n))
        self.wake()
        return first, term

    def propose_membership(self, change: MembershipChange, cb: AppendCallback) -> tuple[int, int]:
        """Append a configuration entry (``RaftCore.propose_membership``); ``cb`` fires when it
        settles, exactly as for an append. Raises ``NotLeader`` or ``MembershipError`` at once."""
        if self.disk_fault is not None:
            raise NotLeader(self.core.leader, f"disk fault: {self.disk_fault}")
        try:
            index, term = self.core.propose_membership(change)
        except OSError as exc:
            self.disk_failed(exc)
            self.wake()
            raise NotLeader(self.core.leader, f"disk fault: {self.disk_fault}") from exc
        self.pending.append(_Pending(index, term, self.clock.now(), cb, 1))
        self.wake()
        return index, term

    def adopt_bootstrap(self, membership: Membership) -> bool:
        """A joining node learned the group's configuration (``RaftCore.adopt_bootstrap``)."""
        adopted = self.core.adopt_bootstrap(membership)
        self.wake()
        return adopted

    def read_index(self, cb: ReadCallback) -> None:
        """ReadIndex: ``cb(index, None)`` once reads up to ``index`` are linearizable here."""
        self.core.read_index(cb)
        self.wake()

    def transfer_leadership(self, target: str) -> None:
        self.core.transfer_leadership(target)
        self.wake()

    def set_lagging(self, lagging: bool) -> None:
        """See ``RaftCore.set_lagging``: the application is far behind the commit index."""
        self.core.set_lagging(lagging)

    @property
    def leader_ready(self) -> bool:
        """This node leads and the no-op of its term is committed."""
        core = self.core
        return core.role is Role.LEADER and self.ready_term == core.term

    # ------------------------------------------------------------------ the Ready contract

    def process(self) -> None:
        """Carry out one Ready: persist and send, keep the group commit going, then deliver.

        The fsync starts before the listeners run, so the disk works while they apply and
        answer. Listeners that propose or read do it through this runtime, which wakes it
        again: what they write joins the next fsync.
        """
        if self.failed is not None:
            return
        rd = self.core.ready()
        if not self.persist_then_send(rd):
            return
        self.maybe_sync()
        self.deliver(rd)

    def persist_then_send(self, rd: Ready) -> bool:
        """Steps 1 and 2; False (and the runtime stops) when the hard state cannot be saved."""
        if rd.hard_state is not None:
            try:
                self.disk.save_hard_state(*rd.hard_state)
                self.hard_state_unsaved = False
            except OSError as exc:
                # A full or failing disk: no message may leave while the core's term or vote
                # is ahead of the disk (found by the simulator). The core keeps the state in
                # memory; it is saved before the node votes or leads again (``_retry_disk``).
                self.hard_state_unsaved = True
                self.disk_failed(exc)
            except Exception as exc:
                self.fail(f"cannot persist term and vote: {exc!r}")
                return False
        if rd.membership is not None:
            for fn in self.membership_listeners:
                _call(fn, rd.membership)
        if self.hard_state_unsaved:
            return True  # mute: silence is a refusal, and Raft retransmits the rest
        send = self.network.send
        for m in rd.messages:
            send(m)
        return True

    def deliver(self, rd: Ready) -> None:
        """Step 3: listeners and callbacks, each isolated from the others' failures."""
        for role, term, leader in rd.role_changes:
            for fn in self.role_listeners:
                _call(fn, role, term, leader)
        if rd.removed_by is not None:
            log.warning(
                "this node was removed from the group (member %s holds the committed change): it no "
                "longer stands for election; shut it down, or add it back (with an empty data "
                "directory and join)",
                rd.removed_by,
                extra={"removed_by": rd.removed_by},
            )
            for fn in self.removed_listeners:
                _call(fn, rd.removed_by)
        if rd.commit_index is not None:
            for fn in self.commit_listeners:
                _call(fn, rd.commit_index)
            self.settle_pending(rd.commit_index)
        if rd.leader_ready is not None and self._still_leading(rd.leader_ready):
            self.ready_term = rd.leader_ready
            for fn in self.leader_ready_listeners:
                _call(fn, rd.leader_ready)
        for cb, index in rd.read_states:
            _call(cb, index, None)
        if rd.dropped_reads:
            lost = NotLeader(self.core.leader, "leadership lost before the read was confirmed")
            for cb in rd.dropped_reads:
                _call(cb, 0, lost)

    def _still_leading(self, term: int) -> bool:
        """A Ready batches inputs: readiness of a term this node already left is stale.

        (Found by the simulator: a leader's no-op committed and a higher term deposed it in
        the same batch; announcing readiness after the step-down made an embedder a master.)
        """
        core = self.core
        return core.role is Role.LEADER and core.term == term

    # ------------------------------------------------------------------ pending appends

    def settle_pending(self, commit: int) -> None:
        """Acknowledge appends committed with their own term; fail those another entry replaced."""
        pending = self.pending
        if not pending:
            return
        term_at = self.disk.log.term_at
        now = self.clock.now()
        while pending and pending[0].last <= commit:
            p = pending.popleft()
            try:
                same = term_at(p.last) == p.term
            except IndexError:  # already removed by retention: its term cannot be checked
                same = False
            if same:
                if self.observe_append is not None:
                    self.observe_append(now - p.started)
                _call(p.cb, 0, p.last - p.count + 1, p.term, "")
            else:
                _call(p.cb, FAILED, 0, 0, f"entry {p.last} was overwritten by a newer leader")

    def expire_pending(self) -> None:
        """Appends older than the timeout get an unknown outcome (they may still commit)."""
        pending = self.pending
        if not pending:
            return
        deadline = self.clock.now() - self.append_timeout_s
        while pending and pending[0].started < deadline:
            p = pending.popleft()
            _call(p.cb, UNKNOWN_OUTCOME, 0, 0, "not committed within the append timeout; it may still be")

    def fail_pending(self, code: int, message: str) -> None:
        while self.pending:
            _call(self.pending.popleft().cb, code, 0, 0, message)

    # ------------------------------------------------------------------ group commit

    def maybe_sync(self) -> None:
        """Start an fsync if none is in flight and the log holds entries not yet durable."""
        if self.syncing or self.failed is not None:
            return
        if self.disk.log.last_index <= self.core.durable:
            return
        self.syncing = True
        self.disk.start_sync(self.synced)

    def synced(self, durable: int, error: BaseException | None) -> None:
        """The fsync in flight finished: tell the core, carry out what that unlocks, go again."""
        self.syncing = False
        if error is not None:
            self.fail(f"fsync failed; not acknowledging undurable entries: {error!r}")
            return
        if self.failed is not None:
            return
        self.report_durable(durable)
        self.process()

    def report_durable(self, durable: int) -> None:
        self.core.on_durable(durable)

    # ------------------------------------------------------------------ disk faults

    def disk_failed(self, exc: BaseException) -> None:
        """The disk refused a write: stop leading (hand over), stop voting, retry the disk later.

        Pending appends get an unknown outcome: a follower may still commit what was sent.
        (A failed fsync is different: the kernel may have dropped the pages, so only a
        restart that re-reads the files is safe; that stays fatal, see ``synced``.)
        """
        reason = f"{type(exc).__name__}: {exc}"
        first = self.disk_fault is None
        self.disk_fault = reason
        self._disk_retry_at = self.clock.now() + self.disk_retry_s
        self.core.set_disk_fault(True)
        self.fail_pending(UNKNOWN_OUTCOME, f"disk fault: {reason}")
        if first:
            log.error("disk fault: not leading or voting until writes succeed again", extra={"error": reason})
            for fn in self.disk_fault_listeners:
                _call(fn, reason)

    def _retry_disk(self) -> None:
        try:
            ok = self.disk.writable()
        except Exception as exc:  # noqa: BLE001 - still failing: try again later
            log.debug("disk still failing", extra={"error": repr(exc)})
            ok = False
        if ok:
            try:  # a term or vote whose save failed is saved before the node votes or leads again
                self.disk.save_hard_state(self.core.term, self.core.voted_for)
                self.hard_state_unsaved = False
            except OSError:
                ok = False
        if not ok:
            self._disk_retry_at = self.clock.now() + self.disk_retry_s
            return
        self.disk_fault = None
        self.core.set_disk_fault(False)
        log.warning("disk takes writes again: resuming")
        for fn in self.disk_fault_listeners:
            _call(fn, None)

    # ------------------------------------------------------------------ stopping

    def stop(self, reason: str) -> None:
        """Stop for good (a shutdown): no more Ready, no new fsync; pending appends become unknown."""
        if self.failed is None:
            self.failed = reason
        self.fail_pending(UNKNOWN_OUTCOME, reason)

    def fail(self, reason: str) -> None:
        if self.failed is not None:
            return
        self.failed = reason
        log.critical("ledger runtime stopped: %s", reason)
        if self.on_fatal is not None:
            self.on_fatal(reason)


def _call(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("ledger listener failed", extra={"listener": getattr(fn, "__qualname__", repr(fn))})
