"""The narrow API a process embedding a ledger node (the broker) uses, and nothing else.

A broker keeps its commit log in the ledger: it proposes payloads on the leader, applies
committed entries in log order on every member, confirms leadership before answering a
read that must be linearizable, and follows role changes. Everything it needs is here, in
domain terms; it never touches the store, the Raft core or the peer/client wire codes.

``EmbeddedLedger(config)`` (``config`` is a ``ledger.config.NodeConfig``)

Life cycle
    ``await start()``, ``await stop()``; ``node_id``, ``members`` (id -> address),
    ``max_entry_bytes`` (the largest payload one entry may hold).

Appending (leader only)
    ``propose(payloads, done=None) -> Proposal``: appends at once and returns where the
    payloads went (``first_index``, ``last_index``, ``term``), so the caller knows the
    positions before they commit (no guessing the next index). ``done(proposal, error)``
    fires exactly once: ``error is None`` only when these very entries (same index and
    term) are committed, i.e. durable on a quorum; it runs after the ``on_commit``
    listeners have seen the commit index that covers them. Raises ``NotLeaderError`` at
    once when this member cannot take the append.
    ``await append(payloads) -> Proposal``: the same, waiting for the outcome.
    Errors: ``AppendFailed`` (definitely not committed: another leader's entry won the
    index), ``OutcomeUnknown`` (timeout or shutdown: it may still commit; an embedding
    state machine learns the truth from the committed stream).

Committed entries, in order, with positions
    ``commit_index``, ``first_index`` (entries below it were removed by retention),
    ``read(lo, hi, max_bytes=None) -> list[CommittedEntry]``: committed entries ``lo..hi``
    (fewer if over ``max_bytes`` or not committed yet); ``EntriesCompacted`` if ``lo``
    is below ``first_index``. ``read_payloads`` (same arguments) gives the same entries as
    ``(index, payload)`` pairs, for a state machine applying every entry.
    ``cursor(start_index) -> CommitCursor``: a replaying reader; ``cursor.poll(max_bytes)``
    returns the next committed entries (possibly none) and ``async for batch in cursor``
    waits for them. Entries retention removed are skipped (``cursor.skipped`` counts them).
    ``on_commit(fn)``: ``fn(commit_index)`` after every advance of the commit index.
    ``CommittedEntry`` is ``(index, term, payload, noop)``; ``noop`` marks the empty
    entry a new leader commits first and membership changes (state machines skip them;
    their indexes still count; a change's payload is then empty, see ``membership``).

Reads
    ``await read_barrier(timeout_s) -> int``: ReadIndex. Returns an index such that every
    read of state applied up to it is linearizable; raises ``NotLeaderError`` if this
    member is not (or stops being) the leader and ``BarrierTimeout`` after ``timeout_s``.

Leadership and readiness
    ``on_role(fn)``: ``fn(RoleChange)`` on every role change (``role``, ``term``,
    ``leader_id``, ``leader_address``). ``on_leader_ready(fn)``: ``fn(term)`` once this
    member leads and its first entry of the term (the no-op) is committed, i.e. it holds
    every committed entry and may serve as master. ``is_leader``, ``leader_ready``,
    ``leader_id``, ``leader_address``.

Membership (single-server changes through the log; see ``ledger.membership``)
    ``membership -> MembershipView``: the configuration in effect on this member
    (``voters`` and ``learners``, each id -> address, ``index`` of its entry, 0 for the
    config file's, ``committed``); ``members`` is ``voters`` and ``learners`` together.
    ``on_membership(fn)``: ``fn(MembershipView)`` whenever it changes (a change appended,
    reverted, or installed with a snapshot), on every member: a broker follows it.
    On the leader: ``await add_learner(node_id, address)``, ``await promote(node_id,
    wait_s=0)`` (``wait_s`` > 0 retries while the learner catches up), ``await
    remove_member(node_id)``; each returns the ``MembershipView`` committed with the change.
    Errors: ``NotLeaderError``; ``MembershipRefused`` (``retryable`` when the same request
    may succeed shortly: another change in progress, a learner still catching up, a new
    leader; otherwise it needs another request: the id exists, the change would leave no
    reachable majority, ...); ``AppendFailed``/``OutcomeUnknown`` as for appends.
    ``member_progress() -> dict``: on the leader, each member's match and lag.

Status and metrics
    ``status() -> dict`` (JSON-friendly), ``metrics_registry`` (a Prometheus registry the
    embedder may add its own gauges to), ``serve_metrics(host, port)``,
    ``run_retention() -> int`` (apply the retention limits now; returns the first index).

Listeners run on the event loop thread, in registration order; one that raises is
logged and does not stop the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .codec import KIND_NORMAL, Entry
from .config import NodeConfig
from .membership import ADD, PROMOTE, REMOVE, Membership, MembershipChange, MembershipError
from .node import LedgerNode
from .raft import NotLeader, Role
from .runtime import Busy
from .wire import FAILED

__all__ = [
    "AppendFailed",
    "BarrierTimeout",
    "CommitCursor",
    "CommittedEntry",
    "EmbedError",
    "EmbeddedLedger",
    "EntriesCompacted",
    "LedgerBusy",
    "MembershipRefused",
    "MembershipView",
    "NotLeaderError",
    "OutcomeUnknown",
    "Proposal",
    "Role",
    "RoleChange",
]

log = logging.getLogger("ledger.embed")


# ---------------------------------------------------------------------- errors


class EmbedError(Exception):
    """Base of every error this API raises or reports."""


class NotLeaderError(EmbedError):
    """This member cannot serve the request; ``leader_id``/``leader_address`` name who can (or None)."""

    def __init__(self, message: str, leader_id: str | None, leader_address: str | None) -> None:
        super().__init__(message)
        self.leader_id = leader_id
        self.leader_address = leader_address


class AppendFailed(EmbedError):
    """The proposal was definitely not committed (a newer leader committed another entry there)."""


class LedgerBusy(EmbedError):
    """Too many appends await commit (``max_pending_appends``): refused, certainly not appended."""


class OutcomeUnknown(EmbedError):
    """The proposal's fate is not known (timeout, shutdown): it may still be committed."""


class MembershipRefused(EmbedError):
    """The leader refused a membership change; ``retryable`` when the same request may succeed shortly."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class BarrierTimeout(EmbedError):
    """The read barrier was not confirmed within its timeout."""


class EntriesCompacted(EmbedError):
    """The requested entries were removed by retention; ``first_index`` is the first one kept."""

    def __init__(self, index: int, first_index: int) -> None:
        super().__init__(f"index {index} was removed by retention; first index is {first_index}")
        self.first_index = first_index


# ---------------------------------------------------------------------- values


@dataclass(slots=True)
class CommittedEntry:
    """One committed log entry; ``payload`` may be a memoryview into the log's cache (read-only).

    Not frozen (treat it as read-only): one is made per entry read, and a frozen dataclass's
    constructor costs ten times as much."""

    index: int
    term: int
    payload: bytes | memoryview
    noop: bool = False


@dataclass(slots=True)
class Proposal:
    """Where a proposal went: entries ``first_index..last_index``, appended in ``term`` (read-only;
    not frozen because one is made per append)."""

    first_index: int
    last_index: int
    term: int

    @property
    def indexes(self) -> range:
        return range(self.first_index, self.last_index + 1)


@dataclass(frozen=True, slots=True)
class RoleChange:
    role: Role
    term: int
    leader_id: str | None
    leader_address: str | None


@dataclass(frozen=True, slots=True)
class MembershipView:
    """A configuration: ``voters`` and ``learners`` (id -> address), from the entry at ``index``
    (0: the config file's), ``committed`` when that entry is; ``removed``: the ids the group
    removed (latest last), so a member can tell "removed" from "not added yet"."""

    voters: dict[str, str]
    learners: dict[str, str]
    index: int
    committed: bool
    removed: tuple[str, ...] = ()

    @property
    def members(self) -> dict[str, str]:
        return {**self.voters, **self.learners}


ProposalDone = Callable[[Proposal, EmbedError | None], None]

#: Polling interval of ``promote(wait_s=...)`` while the learner catches up.
PROMOTE_RETRY_S = 0.1


def _committed(e: Entry) -> CommittedEntry:
    if e.kind == KIND_NORMAL:
        return CommittedEntry(e.index, e.term, e.data, False)
    return CommittedEntry(e.index, e.term, b"", True)  # a no-op or a configuration: nothing to apply


# ---------------------------------------------------------------------- the API


class EmbeddedLedger:
    """A ledger member living inside another process; see the module docstring for the API."""

    def __init__(self, config: NodeConfig) -> None:
        self._node = LedgerNode(config)
        self._commit_fns: list[Callable[[int], None]] = []
        self._role_fns: list[Callable[[RoleChange], None]] = []
        self._ready_fns: list[Callable[[int], None]] = []
        self._membership_fns: list[Callable[[MembershipView], None]] = []
        self._removed_fns: list[Callable[[str], None]] = []
        self._waiters: set[asyncio.Event] = set()
        self._stopped = False
        self._node.commit_listeners.append(self._on_commit)
        self._node.role_listeners.append(self._on_role)
        self._node.leader_ready_listeners.append(self._on_leader_ready)
        self._node.membership_listeners.append(self._on_membership)
        self._node.runtime.removed_listeners.append(self._on_removed)

    # -- life cycle and identity

    async def start(self) -> None:
        await self._node.start()

    async def stop(self) -> None:
        self._stopped = True
        await self._node.stop()
        for ev in self._waiters:
            ev.set()

    @property
    def node_id(self) -> str:
        return self._node.config.id

    @property
    def members(self) -> dict[str, str]:
        """Every member of the configuration in effect (voters and learners), id -> address."""
        return self._node.membership.addresses()

    @property
    def max_entry_bytes(self) -> int:
        return self._node.config.max_entry_bytes

    # -- appending

    def propose(self, payloads: Sequence[bytes], done: ProposalDone | None = None) -> Proposal:
        """Append ``payloads`` as consecutive entries; see the module docstring."""
        if not payloads:
            raise ValueError("propose needs at least one payload")
        holder: list[Proposal] = []
        outcome: list[EmbedError | None] = []

        def finished(code: int, first: int, term: int, message: str) -> None:
            outcome.append(None if code == 0 else self._append_error(code, message))
            if holder and done is not None:
                self._call(done, holder[0], outcome[0])

        try:
            first, term = self._node.propose(payloads, finished)
        except NotLeader as exc:
            raise self._not_leader(exc) from None
        except Busy as exc:
            raise LedgerBusy(str(exc)) from None
        proposal = Proposal(first, first + len(payloads) - 1, term)
        holder.append(proposal)
        if outcome and done is not None:  # answered inside propose: report it now
            self._call(done, proposal, outcome[0])
        return proposal

    async def append(self, payloads: Sequence[bytes]) -> Proposal:
        """Propose and wait until committed; raises the error ``done`` would report."""
        fut: asyncio.Future[Proposal] = asyncio.get_running_loop().create_future()

        def done(p: Proposal, err: EmbedError | None) -> None:
            if not fut.done():
                fut.set_exception(err) if err else fut.set_result(p)

        self.propose(payloads, done)
        return await fut

    @staticmethod
    def _append_error(code: int, message: str) -> EmbedError:
        return AppendFailed(message) if code == FAILED else OutcomeUnknown(message)

    # -- committed entries

    @property
    def commit_index(self) -> int:
        return self._node.commit_index

    @property
    def first_index(self) -> int:
        return self._node.store.first_index

    def read(self, lo: int, hi: int, max_bytes: int | None = None) -> list[CommittedEntry]:
        """Committed entries ``lo..hi`` inclusive (at least one if any is committed, within ``max_bytes``)."""
        first = self._node.store.first_index
        if lo < first:
            raise EntriesCompacted(lo, first)
        return [_committed(e) for e in self._node.committed_entries(lo, hi, max_bytes)]

    def read_payloads(
        self, lo: int, hi: int, max_bytes: int | None = None
    ) -> list[tuple[int, bytes | memoryview]]:
        """The (index, payload) pairs of what ``read`` returns: what a state machine applies,
        without an object per entry (a broker applies every committed entry this way)."""
        first = self._node.store.first_index
        if lo < first:
            raise EntriesCompacted(lo, first)
        # A configuration's payload is not the state machine's: it gets an empty one, as a no-op has.
        return [
            (e.index, e.data if not e.kind else b"") for e in self._node.committed_entries(lo, hi, max_bytes)
        ]

    def cursor(self, start_index: int) -> CommitCursor:
        """A reader of committed entries from ``start_index`` on (replay, then follow)."""
        return CommitCursor(self, start_index)

    def on_commit(self, fn: Callable[[int], None]) -> None:
        self._commit_fns.append(fn)

    # -- reads

    async def read_barrier(self, timeout_s: float) -> int:
        """ReadIndex with a timeout; see the module docstring."""
        # A callback and a timer rather than asyncio.wait_for: no task per read (a broker runs one per pull).
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()

        def done(index: int, exc: Exception | None) -> None:
            if fut.done():
                return
            if exc is None:
                fut.set_result(index)
            elif isinstance(exc, NotLeader):
                fut.set_exception(self._not_leader(exc))
            else:  # leadership lost before the read was confirmed
                fut.set_exception(NotLeaderError(str(exc), self.leader_id, self.leader_address))

        def expire() -> None:
            if not fut.done():
                fut.set_exception(BarrierTimeout(f"read barrier not confirmed within {timeout_s} s"))

        try:
            self._node.request_read_index(done)
        except NotLeader as exc:
            raise self._not_leader(exc) from None
        timer = loop.call_later(timeout_s, expire)
        try:
            return await fut
        finally:
            timer.cancel()

    # -- leadership

    @property
    def is_leader(self) -> bool:
        return self._node.is_leader

    @property
    def leader_ready(self) -> bool:
        return self._node.leader_ready

    @property
    def leader_id(self) -> str | None:
        return self._node.core.leader

    @property
    def leader_address(self) -> str | None:
        return self._node.leader_address()

    def set_lagging(self, lagging: bool) -> None:
        """Say whether the state machine is far behind ``commit_index`` (a restarted replica
        replaying its log): while it is, this member lets its peers stand for leader first
        (``RaftCore.set_lagging``). It still votes, and stands itself if no peer does."""
        self._node.set_lagging(lagging)

    def on_role(self, fn: Callable[[RoleChange], None]) -> None:
        self._role_fns.append(fn)

    def on_leader_ready(self, fn: Callable[[int], None]) -> None:
        self._ready_fns.append(fn)

    # -- membership

    @property
    def membership(self) -> MembershipView:
        core = self._node.core
        return self._view(core.config_index, core.membership)

    def _view(self, index: int, m: Membership) -> MembershipView:
        return MembershipView(
            dict(m.voters), dict(m.learners), index, index <= self._node.core.commit, m.removed
        )

    def on_membership(self, fn: Callable[[MembershipView], None]) -> None:
        self._membership_fns.append(fn)

    @property
    def removed_by(self) -> str | None:
        """A member that told this node the group removed it (it was down or cut off when the
        change was made, so its own log does not hold it), else None: it no longer campaigns."""
        return self._node.core.removed_by

    def on_removed(self, fn: Callable[[str], None]) -> None:
        """``fn(member_id)`` when a member tells this node the group removed it."""
        self._removed_fns.append(fn)

    def member_progress(self) -> dict[str, Any]:
        """On the leader: each member's ``match``, ``lag`` (entries behind), ``active``; else empty."""
        return dict(self._node.core.membership_status().get("progress", {}))

    async def add_learner(self, node_id: str, address: str) -> MembershipView:
        """Add ``node_id`` (reachable at ``address``) as a learner; waits until the change commits."""
        return await self._change(MembershipChange(ADD, node_id, address))

    async def promote(self, node_id: str, wait_s: float = 0.0) -> MembershipView:
        """Make learner ``node_id`` a voter; with ``wait_s`` > 0, retry while it is still catching up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            try:
                return await self._change(MembershipChange(PROMOTE, node_id))
            except MembershipRefused as exc:
                if not exc.retryable or loop.time() + PROMOTE_RETRY_S > deadline:
                    raise
            await asyncio.sleep(PROMOTE_RETRY_S)

    async def remove_member(self, node_id: str) -> MembershipView:
        """Remove voter or learner ``node_id``; the leader itself steps down once this commits."""
        return await self._change(MembershipChange(REMOVE, node_id))

    async def _change(self, change: MembershipChange) -> MembershipView:
        fut: asyncio.Future[MembershipView] = asyncio.get_running_loop().create_future()
        core = self._node.core

        def done(code: int, index: int, term: int, message: str) -> None:
            if fut.done():
                return
            if code == 0:
                fut.set_result(self._view(index, core.config_at(index)[2]))
            else:
                fut.set_exception(self._append_error(code, message))

        try:
            self._node.propose_membership(change, done)
        except NotLeader as exc:
            raise self._not_leader(exc) from None
        except MembershipError as exc:
            raise MembershipRefused(str(exc), exc.retryable) from None
        return await fut

    # -- status and housekeeping

    def status(self) -> dict[str, Any]:
        return self._node.status()

    @property
    def metrics_registry(self) -> Any:
        return self._node.metrics.registry

    def serve_metrics(self, host: str, port: int) -> None:
        self._node.metrics.serve(host, port)

    def run_retention(self) -> int:
        """Apply the configured retention limits now (below the commit index); returns the first index."""
        return self._node.store.apply_retention(self._node.commit_index)

    # -- internals

    def _not_leader(self, exc: NotLeader) -> NotLeaderError:
        leader = exc.leader
        addr = self._node.addresses.get(leader) if leader else None
        return NotLeaderError(str(exc), leader, addr)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("ledger listener failed", extra={"listener": getattr(fn, "__qualname__", repr(fn))})

    def _on_commit(self, commit: int) -> None:
        for ev in self._waiters:
            ev.set()
        for fn in self._commit_fns:
            self._call(fn, commit)

    def _on_role(self, role: Role, term: int, leader: str | None) -> None:
        change = RoleChange(role, term, leader, self._node.addresses.get(leader) if leader else None)
        for fn in self._role_fns:
            self._call(fn, change)
        if role is not Role.LEADER:
            for ev in self._waiters:
                ev.set()

    def _on_leader_ready(self, term: int) -> None:
        for fn in self._ready_fns:
            self._call(fn, term)

    def _on_membership(self, m: Membership) -> None:
        view = self._view(self._node.core.config_index, m)
        for fn in self._membership_fns:
            self._call(fn, view)

    def _on_removed(self, member: str) -> None:
        for fn in self._removed_fns:
            self._call(fn, member)


class CommitCursor:
    """Reads committed entries in order from a start index: replay first, then follow commits.

    ``poll`` never blocks (a broker applies a bounded slice per loop turn); iterating with
    ``async for`` waits for the next commit when caught up. Entries removed by retention
    before the cursor reached them are skipped and counted in ``skipped``.
    """

    def __init__(self, ledger: EmbeddedLedger, start_index: int) -> None:
        if start_index < 1:
            raise ValueError(f"a cursor starts at index 1 or later, not {start_index}")
        self._ledger = ledger
        self.next_index = start_index
        self.skipped = 0

    @property
    def caught_up(self) -> bool:
        return self.next_index > self._ledger.commit_index

    def poll(self, max_bytes: int = 4 << 20) -> list[CommittedEntry]:
        """The next committed entries (at least one if any is committed, else none)."""
        ledger = self._ledger
        first = ledger.first_index
        if self.next_index < first:
            self.skipped += first - self.next_index
            self.next_index = first
        if self.next_index > ledger.commit_index:
            return []
        batch = ledger.read(self.next_index, ledger.commit_index, max_bytes)
        if batch:
            self.next_index = batch[-1].index + 1
        return batch

    def __aiter__(self) -> AsyncIterator[list[CommittedEntry]]:
        return self.follow()

    async def follow(self, max_bytes: int = 4 << 20) -> AsyncIterator[list[CommittedEntry]]:
        """Yield batches of committed entries as they commit; ends when the ledger stops."""
        ledger = self._ledger
        ev = asyncio.Event()
        ledger._waiters.add(ev)
        try:
            while not ledger._stopped:
                ev.clear()
                batch = self.poll(max_bytes)
                if batch:
                    yield batch
                    continue
                await ev.wait()
        finally:
            ledger._waiters.discard(ev)
