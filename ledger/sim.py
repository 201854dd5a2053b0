"""Deterministic simulation of a whole ledger cluster, to prove or break the Raft core.

Everything a run does comes from one ``random.Random(seed)``: the fault profile, each
node's configuration and its own core rng, message delays, drops, duplicates and
partitions, crashes and restarts, fsync timing, client proposals and reads. The nodes are
real ``RaftCore`` instances over ``MemoryLog`` (whose ``crash()`` loses what was never
synced); only the network, disk timing and clock are simulated. Events run from a heap
ordered by (virtual time, sequence number) and nothing iterates a hash-ordered set, so a
seed replays exactly, independent of ``PYTHONHASHSEED`` (the FoundationDB / TigerBeetle
approach: find a failing seed with a cheap search, then replay it under a debugger).

A run has two phases. In the *fault* phase the swarm profile drawn for the seed decides
which faults are on (crashes, partitions, drops, duplicates, long delays, pauses, slow
disks, leadership transfers, retention). In the *heal* phase the network is clean and
disks are fast, and the run must reach, within a bound of ticks (plus time linear in the
replication backlog), a leader whose no-op is committed, a fresh proposal committed on
every running node and a confirmed read: that is the liveness check. Half the seeds first
keep a minority crashed (often the preferred leader), so a quorum must make progress on
its own, and then restart it and require it to catch up.

``SimOptions.mutation`` makes the simulated runtime (or the voters) break one rule on
purpose; the tests use it to show that each checker can actually fail.

Invariants (``Checker``) are checked as events happen, in periodic sweeps and at the end:
election safety, the persist-before-send contract, log matching, leader completeness,
state machine safety, quorum durability of committed entries, acknowledged writes
surviving, linearizable ReadIndex, and liveness after healing.

Run ``python -m ledger.sim --seeds 500`` to hunt (failing seeds are printed), and
``python -m ledger.sim --seed 42 --trace`` to replay one with every event printed.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .memlog import MemoryLog
from .messages import (
    InstallBase,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    decode_message,
    encode_message,
)
from .raft import NotLeader, RaftConfig, RaftCore, Role

# Event kinds, kept as small ints: the heap holds (time, seq, kind, node, payload).
_TICK, _DELIVER, _SYNC_START, _SYNC_DONE, _CHAOS, _CLIENT, _RESTART, _NET_HEAL = range(8)

#: Deliberate mistakes the simulator can be told to make, to prove its checkers catch them:
#: forget_vote - the vote is not persisted (lost on a crash); naive_async_sync - an fsync is
#: credited up to where it started even if the log was truncated meanwhile; ack_on_append - a
#: follower acknowledges before fsync; vote_any_log - voters skip the up-to-date check;
#: local_reads - a leader answers reads from its commit index without a quorum round;
#: no_durable_notice - the runtime never reports fsyncs to the core (nothing can commit).
MUTATIONS = (
    "none",
    "forget_vote",
    "naive_async_sync",
    "ack_on_append",
    "vote_any_log",
    "local_reads",
    "no_durable_notice",
)


class InvariantViolation(AssertionError):
    """A safety or liveness property failed; the message names the property and the evidence."""


@dataclass
class SimOptions:
    """What a run looks like; the seed decides the rest. Keep defaults in sync with the tests."""

    nodes: int = 3
    fault_ticks: int = 260  # virtual duration of the fault phase, in (nominal) ticks
    heal_ticks: int = 150  # liveness bound: the heal phase must finish within this many ticks
    tick_ms: int = 10  # nominal tick length in virtual milliseconds
    wire: bool = True  # round-trip every message through the binary codec
    sweep_every: int = 400  # events between full invariant sweeps (log matching, durability)
    events_per_node_tick: int = 50  # event budget; runs need about 5, far more means a message storm
    mutation: str = "none"  # see MUTATIONS: deliberately break the runtime (checker self-test)
    trace: bool = False  # print every event as it happens (for replaying a seed)

    def replay_command(self, seed: int) -> str:
        """The shell command that replays ``seed`` with these options."""
        defaults = SimOptions()
        parts = ["python -m ledger.sim", f"--seed {seed}", f"--nodes {self.nodes}"]
        if self.fault_ticks != defaults.fault_ticks:
            parts.append(f"--fault-ticks {self.fault_ticks}")
        if self.heal_ticks != defaults.heal_ticks:
            parts.append(f"--heal-ticks {self.heal_ticks}")
        if not self.wire:
            parts.append("--no-wire")
        if self.mutation != "none":
            parts.append(f"--mutation {self.mutation}")
        parts.append("--trace")
        return " ".join(parts)


@dataclass
class Profile:
    """The swarm-testing profile of one seed: which faults are on and how hard they hit.

    Turning whole fault classes off at random (swarm testing) finds more bugs than running
    every fault at a low rate, because some bugs need long quiet stretches of one fault.
    """

    crashes: bool
    partitions: bool
    pauses: bool
    slow_disk: bool
    transfers: bool
    compaction: bool
    reads: bool
    async_sync: bool  # fsync reported later than it started, as ledger.node does it
    p_drop: float
    p_dup: float
    p_reorder: float
    p_long_delay: float
    chaos_every_ms: int
    client_every_ms: int

    @classmethod
    def draw(cls, rng: random.Random) -> Profile:
        return cls(
            crashes=rng.random() < 0.7,
            partitions=rng.random() < 0.6,
            pauses=rng.random() < 0.3,
            slow_disk=rng.random() < 0.5,
            transfers=rng.random() < 0.4,
            compaction=rng.random() < 0.5,
            reads=rng.random() < 0.8,
            async_sync=rng.random() < 0.5,
            p_drop=rng.choice((0.0, 0.0, 0.02, 0.1, 0.25)),
            p_dup=rng.choice((0.0, 0.0, 0.02, 0.1)),
            p_reorder=rng.choice((0.0, 0.05, 0.2)),
            p_long_delay=rng.choice((0.0, 0.0, 0.01, 0.03)),
            chaos_every_ms=rng.randint(15, 80),
            client_every_ms=rng.randint(2, 15),
        )


class SimLog(MemoryLog):
    """A ``MemoryLog`` that remembers the lowest truncation since the last fsync started.

    This mirrors ``ledger.node._TrackedLog``: an fsync that started before a truncation
    may only vouch for entries below the truncation point.
    """

    def __init__(self) -> None:
        super().__init__()
        self.floor: int | None = None
        self.truncations = 0

    def truncate_suffix(self, index: int) -> None:
        self.floor = index if self.floor is None else min(self.floor, index)
        self.truncations += 1
        super().truncate_suffix(index)

    def reset(self, base_index: int, base_term: int, base_pos: int) -> None:
        self.floor = base_index + 1 if self.floor is None else min(self.floor, base_index + 1)
        super().reset(base_index, base_term, base_pos)

    def sync_to(self, index: int) -> None:
        """An fsync that started earlier completes: only what it covered becomes durable.

        ``MemoryLog.sync()`` makes everything durable at once; a real fsync covers the writes
        made before it started, so entries rewritten after a truncation are not covered.
        """
        self.durable_index = max(self.durable_index, min(index, self.last_index))


@dataclass
class SimNode:
    """One simulated server: a durable log and hard state, and a core while it is up."""

    id: str
    index: int  # position in Simulation.nodes
    config: RaftConfig
    tick_period: int
    log: SimLog = field(default_factory=SimLog)
    hard_state: tuple[int, str | None] = (0, None)
    core: RaftCore | None = None
    incarnation: int = 0
    paused_until: int = 0
    slow_disk_until: int = 0
    syncing: bool = False  # an fsync is in progress
    sync_scheduled: bool = False  # an fsync will start soon
    sync_target: int = 0  # last index written when the fsync in progress started
    validated: int = 0  # highest commit index whose entries the checker has read on this node
    proposals: deque[tuple[int, int, bytes]] = field(default_factory=deque)  # (index, term, payload)
    reads: list[Any] = field(default_factory=list)  # read contexts issued here and not yet answered

    @property
    def up(self) -> bool:
        return self.core is not None


@dataclass
class Stats:
    """What a run exercised, so tests can assert the simulation is not vacuous."""

    events: int = 0
    messages: int = 0
    elections: int = 0
    crashes: int = 0
    commits: int = 0
    acked_writes: int = 0
    reads_ok: int = 0
    reads_dropped: int = 0
    transfers: int = 0
    timeout_now: int = 0
    install_base: int = 0
    truncations: int = 0
    compactions: int = 0
    max_term: int = 0
    max_commit: int = 0


@dataclass
class SimResult:
    seed: int
    options: SimOptions
    ok: bool
    error: str | None
    stats: Stats
    wall_seconds: float

    def describe(self) -> str:
        if self.ok:
            return f"seed {self.seed}: ok ({self.stats.events} events, commit {self.stats.max_commit})"
        return f"seed {self.seed}: FAILED: {self.error}\n  replay: {self.options.replay_command(self.seed)}"


class Checker:
    """The invariants, fed by the simulator as Ready outputs are applied.

    Committed means reported via ``Ready.commit_index`` on any node; the entries are read
    from that node's log at the moment it reports, which is exactly what a state machine
    applying the log would see.
    """

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.quorum = len(sim.nodes) // 2 + 1
        self.leaders: dict[int, str] = {}  # term -> the one node that led it
        self.committed: dict[int, tuple[int, int | None, bytes | None]] = {}  # index -> (term, kind, data)
        self.commit_term: dict[int, int] = {}  # index -> lowest term of a node reporting it committed
        self.max_committed = 0  # highest index in ``committed`` whose entry was seen in full
        self.max_commit_reported = 0
        self.acked: dict[int, tuple[int, bytes]] = {}  # index -> (term, payload) acknowledged to a client
        self.reads: dict[Any, tuple[str, int, int]] = {}  # ctx -> (node, commit bound at issue, time)
        self.confirmed: dict[Any, int] = {}  # ctx -> read index, for reads answered so far

    def fail(self, what: str) -> None:
        raise InvariantViolation(f"[t={self.sim.now}] {what}")

    # -- contract between the core and its runtime

    def on_send(self, node: SimNode, m: Message) -> None:
        """Persist-before-send: no message may rely on a term or vote that is not yet durable."""
        term, voted = node.hard_state
        if isinstance(m, VoteRequest) and m.pre_vote:
            if m.term != term + 1:
                self.fail(f"{node.id} pre-vote for term {m.term} while its persisted term is {term}")
            return
        if isinstance(m, VoteResponse) and m.pre_vote:
            return  # a granted pre-vote carries the candidate's next term, never persisted
        if m.term > term:
            self.fail(f"{node.id} sent {type(m).__name__} at term {m.term} with persisted term {term}")
        if isinstance(m, VoteResponse) and m.granted and (term, voted) != (m.term, m.dst):
            self.fail(f"{node.id} granted a vote to {m.dst} in term {m.term} but persisted {(term, voted)}")
        if isinstance(m, VoteRequest) and (term, voted) != (m.term, m.src):
            self.fail(f"{node.id} campaigns in term {m.term} but persisted {(term, voted)}")

    # -- election safety and leader completeness

    def on_role(self, node: SimNode, role: Role, term: int) -> None:
        if role is not Role.LEADER:
            return
        prev = self.leaders.setdefault(term, node.id)
        if prev != node.id:
            self.fail(f"election safety: {prev} and {node.id} both lead term {term}")
        self.sim.stats.elections += 1
        self.check_leader_has_committed(node, term)

    def check_leader_has_committed(self, node: SimNode, term: int) -> None:
        """Leader completeness: a leader of term T holds every entry committed in a term below T.

        Only terms below T: a leader elected late from delayed votes of an old term need not
        hold what newer terms committed meanwhile (Raft's property is about higher terms).
        """
        log = node.log
        base = log.base_index
        commit_term = self.commit_term
        for index, (eterm, _, _) in self.committed.items():
            if commit_term[index] >= term or index < base:
                continue  # committed in this term or later, or retained no longer (committed)
            have = log.term_at(index) if index <= log.last_index else None
            if have != eterm:
                self.fail(
                    f"leader completeness: {node.id} leads term {term} but holds term {have} at "
                    f"index {index}, committed (in term {commit_term[index]}) with term {eterm}"
                )

    # -- state machine safety and durability of acknowledged writes

    def on_commit(self, node: SimNode, commit: int) -> None:
        log = node.log
        stats = self.sim.stats
        assert node.core is not None
        if commit > log.last_index:
            self.fail(f"{node.id} reports commit {commit} beyond its last index {log.last_index}")
        lo = node.validated + 1
        if commit < lo:
            return
        # The reporter's term bounds the term the entries were committed in from above: a
        # follower learns its commit index from a leader of its own term.
        reporter_term = node.core.term
        if lo <= log.base_index:
            # Installed or retained away: only the base entry's term is still known here.
            self._record(node, log.base_index, log.base_term, None, None, reporter_term)
            lo = log.base_index + 1
        for e in log.entries(lo, commit) if lo <= commit else ():
            self._record(node, e.index, e.term, e.kind, bytes(e.data), reporter_term)
        node.validated = commit
        stats.commits += 1
        if commit > self.max_commit_reported:
            self.max_commit_reported = commit
            stats.max_commit = commit
        self._ack_proposals(node, commit)

    def _record(
        self, node: SimNode, index: int, term: int, kind: int | None, data: bytes | None, cterm: int
    ) -> None:
        have = self.committed.get(index)
        if have is None:
            self.committed[index] = (term, kind, data)
            self.commit_term[index] = cterm
            if data is not None and index > self.max_committed:
                self.max_committed = index
            self._check_current_leaders(index, term, cterm)
            return
        if have[0] != term or (
            data is not None and have[2] is not None and (have[1], have[2]) != (kind, data)
        ):
            self.fail(
                f"state machine safety: {node.id} commits index {index} as term {term} kind {kind} "
                f"data {data!r}, but it was committed as term {have[0]} kind {have[1]} data {have[2]!r}"
            )
        if have[2] is None and data is not None:
            self.committed[index] = (term, kind, data)
            self.max_committed = max(self.max_committed, index)
        if cterm < self.commit_term[index]:
            self.commit_term[index] = cterm
            self._check_current_leaders(index, term, cterm)

    def _check_current_leaders(self, index: int, term: int, cterm: int) -> None:
        """Leader completeness, forwards: an entry committed in term C is in every leader above C."""
        for other in self.sim.nodes:
            core = other.core
            if core is None or core.role is not Role.LEADER or core.term <= cterm:
                continue
            log = other.log
            if index > log.base_index and (index > log.last_index or log.term_at(index) != term):
                self.fail(
                    f"leader completeness: index {index} (term {term}) committed in term {cterm} but "
                    f"missing from {other.id}, leader of term {core.term}"
                )

    def _ack_proposals(self, node: SimNode, commit: int) -> None:
        """A leader acknowledges a proposal once its commit index covers it in its own term."""
        core = node.core
        if core is None or core.role is not Role.LEADER:
            node.proposals.clear()
            return
        log = node.log
        while node.proposals and node.proposals[0][0] <= commit:
            index, term, payload = node.proposals.popleft()
            if index < log.first_index or log.term_at(index) != term:
                continue  # not ours any more: the client gets an error, not an acknowledgement
            self.acked[index] = (term, payload)
            self.sim.stats.acked_writes += 1

    # -- linearizable reads

    def on_read_issued(self, node: SimNode, ctx: Any) -> None:
        self.reads[ctx] = (node.id, self.max_commit_reported, self.sim.now)

    def on_read_state(self, node: SimNode, ctx: Any, index: int) -> None:
        issued = self.reads.pop(ctx, None)
        if issued is None:
            self.fail(f"{node.id} confirmed read {ctx!r} twice or never issued it")
            return
        where, bound, at = issued
        if where != node.id:
            self.fail(f"read {ctx!r} issued at {where} confirmed by {node.id}")
        if index < bound:
            self.fail(
                f"linearizability: read {ctx!r} issued at t={at} on {node.id} got read index {index}, "
                f"but commit index {bound} had been reported before it was issued"
            )
        self.confirmed[ctx] = index
        self.sim.stats.reads_ok += 1

    def on_read_dropped(self, node: SimNode, ctx: Any) -> None:
        if self.reads.pop(ctx, None) is None:
            self.fail(f"{node.id} dropped read {ctx!r} that is not pending")
        self.sim.stats.reads_dropped += 1

    # -- sweeps over all logs

    def sweep(self) -> None:
        self.check_log_matching()
        self.check_quorum_durable()

    def check_log_matching(self) -> None:
        """If two logs hold an entry with the same index and term, they agree up to there."""
        nodes = self.sim.nodes
        for i, a in enumerate(nodes):
            for b in nodes[i + 1 :]:
                la, lb = a.log, b.log
                lo = max(la.first_index, lb.first_index)
                hi = min(la.last_index, lb.last_index)
                top = hi
                while top >= lo and la.term_at(top) != lb.term_at(top):
                    top -= 1
                if top < lo:
                    continue
                ea, eb = la.entries(lo, top), lb.entries(lo, top)
                if ea != eb:
                    bad = next(x for x, y in zip(ea, eb, strict=True) if x != y)
                    self.fail(
                        f"log matching: {a.id} and {b.id} agree on index {top} term {la.term_at(top)} "
                        f"but differ at index {bad.index}"
                    )

    def check_quorum_durable(self) -> None:
        """Every committed entry is durable (survives a crash) on a quorum of nodes."""
        top = self.max_committed
        if top == 0:
            return
        term = self.committed[top][0]
        holders = []
        for n in self.sim.nodes:
            log = n.log
            if log.base_index >= top:
                holders.append(n.id)  # retention/InstallBase only ever drops committed entries
            elif log.durable_index >= top and log.last_index >= top and log.term_at(top) == term:
                holders.append(n.id)
        if len(holders) < self.quorum:
            self.fail(
                f"durability: committed index {top} (term {term}) is durable only on {holders}, "
                f"fewer than a quorum of {self.quorum}"
            )

    def check_final(self) -> None:
        """After healing: every acknowledged write is in every node's log, in place."""
        for n in self.sim.nodes:
            log = n.log
            for index, (term, payload) in self.acked.items():
                if index < log.first_index:
                    continue
                if index > log.last_index:
                    self.fail(f"acknowledged write at {index} missing on {n.id} (last {log.last_index})")
                e = log.entries(index, index)[0]
                if e.term != term or bytes(e.data) != payload:
                    self.fail(
                        f"acknowledged write lost: index {index} term {term} {payload!r} is "
                        f"term {e.term} {bytes(e.data)!r} on {n.id}"
                    )


class Simulation:
    """One seeded run of a cluster. ``run()`` returns normally or raises ``InvariantViolation``."""

    def __init__(self, seed: int, options: SimOptions | None = None) -> None:
        self.seed = seed
        self.opts = options or SimOptions()
        if self.opts.mutation not in MUTATIONS:
            raise ValueError(f"unknown mutation {self.opts.mutation!r}; one of {MUTATIONS}")
        self.rng = random.Random(seed)
        rng = self.rng
        self.profile = Profile.draw(rng)
        self.now = 0
        self.stats = Stats()
        self._queue: list[tuple[int, int, int, int, Any]] = []
        self._seq = 0
        self.blocked: set[tuple[str, str]] = set()  # directed links that drop everything
        self.healing = False
        self.trace_tail: deque[str] = deque(maxlen=60)
        ids = [f"n{i + 1}" for i in range(self.opts.nodes)]
        preferred = rng.choice(ids) if rng.random() < 0.2 else None
        election = rng.randint(5, 10)
        self.nodes: list[SimNode] = []
        for nid in ids:
            cfg = RaftConfig(
                election_ticks=election,
                heartbeat_ticks=rng.choice((1, 1, 2)),
                pre_vote=rng.random() < 0.85,
                check_quorum=rng.random() < 0.85,
                max_inflight=rng.choice((1, 2, 8, 32)),
                max_append_bytes=rng.choice((200, 1000, 1 << 20)),
                preferred_leader=preferred,
            )
            period = self.opts.tick_ms + rng.choice((-1, 0, 0, 1))  # clock drift between nodes
            self.nodes.append(SimNode(nid, len(self.nodes), cfg, period))
        self.by_id = {n.id: n for n in self.nodes}
        self.ids = ids
        self.checker = Checker(self)
        self._next_payload = 0
        self._next_read = 0

    # ------------------------------------------------------------------ event queue

    def _push(self, at: int, kind: int, node: int = -1, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, kind, node, payload))

    def _trace(self, text: str) -> None:
        line = f"t={self.now} {text}"
        self.trace_tail.append(line)
        if self.opts.trace:
            print(line)

    # ------------------------------------------------------------------ node lifecycle

    def _start(self, idx: int) -> None:
        n = self.nodes[idx]
        term, voted = n.hard_state
        n.core = RaftCore(
            n.id,
            self.ids,
            n.log,
            term=term,
            voted_for=voted,
            config=n.config,
            rng=random.Random(self.rng.getrandbits(64)),
            durable_index=n.log.durable_index,
        )
        if self.opts.mutation == "vote_any_log":
            n.core._log_up_to_date = lambda last_index, last_term: True  # type: ignore[method-assign]
        n.validated = n.core.commit
        n.syncing = n.sync_scheduled = False
        n.log.floor = None
        self._push(self.now + self.rng.randint(1, n.tick_period), _TICK, idx, n.incarnation)
        self._want_sync(idx)

    def _crash(self, idx: int) -> None:
        n = self.nodes[idx]
        if n.core is None:
            return
        self._trace(f"CRASH {n.id} (durable {n.log.durable_index} of {n.log.last_index})")
        for ctx in n.reads:
            self.checker.reads.pop(ctx, None)
        n.reads.clear()
        n.core = None
        n.incarnation += 1
        n.proposals.clear()
        n.log.crash()
        if self.opts.mutation == "forget_vote":
            n.hard_state = (n.hard_state[0], None)
        self.stats.crashes += 1
        self.checker.check_quorum_durable()

    # ------------------------------------------------------------------ applying Ready

    def _drain(self, n: SimNode) -> None:
        """Apply everything the core asks for, in the runtime's order (persist, send, apply)."""
        core = n.core
        assert core is not None
        for _ in range(8):
            if not core.has_ready:
                break
            rd = core.ready()
            if rd.hard_state is not None:
                n.hard_state = rd.hard_state  # fsynced before any of rd.messages leaves
            for m in rd.messages:
                self.checker.on_send(n, m)
                self._send(m)
            for role, term, leader in rd.role_changes:
                self._trace(f"{n.id} becomes {role.value} term {term} leader {leader}")
                self.stats.max_term = max(self.stats.max_term, term)
                if role is not Role.LEADER:
                    n.proposals.clear()
                self.checker.on_role(n, role, term)
            if rd.commit_index is not None:
                self.checker.on_commit(n, rd.commit_index)
            for ctx, index in rd.read_states:
                if ctx in n.reads:
                    n.reads.remove(ctx)
                self.checker.on_read_state(n, ctx, index)
            for ctx in rd.dropped_reads:
                if ctx in n.reads:
                    n.reads.remove(ctx)
                self.checker.on_read_dropped(n, ctx)
            if self.opts.mutation == "ack_on_append" and core.role is not Role.LEADER:
                core.on_durable(n.log.last_index)  # a runtime that acknowledges before fsync
        if core.has_ready:
            raise InvariantViolation(f"{n.id}: core still has work after 8 ready() rounds")
        self._want_sync(n.index)

    # ------------------------------------------------------------------ network

    def _send(self, m: Message) -> None:
        stats = self.stats
        stats.messages += 1
        if isinstance(m, InstallBase):
            stats.install_base += 1
        elif isinstance(m, TimeoutNow):
            stats.timeout_now += 1
        rng = self.rng
        if not self.healing:
            if (m.src, m.dst) in self.blocked:
                return
            if rng.random() < self.profile.p_drop:
                return
        copies = 2 if not self.healing and rng.random() < self.profile.p_dup else 1
        payload: Any = encode_message(m) if self.opts.wire else m
        dst = self.ids.index(m.dst)
        for _ in range(copies):
            self._push(self.now + self._delay(), _DELIVER, dst, payload)

    def _delay(self) -> int:
        rng = self.rng
        p = self.profile
        if self.healing:
            return rng.randint(1, 3)
        r = rng.random()
        if r < p.p_long_delay:
            return rng.randint(60, 400)
        if r < p.p_long_delay + p.p_reorder:
            return rng.randint(1, 40)
        return rng.randint(1, 4)

    # ------------------------------------------------------------------ events

    def _on_tick(self, idx: int, inc: int) -> None:
        n = self.nodes[idx]
        if n.core is None or inc != n.incarnation:
            return
        self._push(self.now + n.tick_period + self.rng.choice((0, 0, 0, 1)), _TICK, idx, inc)
        if self.now < n.paused_until:
            return
        n.core.tick()
        self._drain(n)

    def _on_deliver(self, idx: int, payload: Any) -> None:
        n = self.nodes[idx]
        if n.core is None:
            return
        if self.now < n.paused_until:
            self._push(n.paused_until + self.rng.randint(0, 2), _DELIVER, idx, payload)
            return
        m = decode_message(payload) if self.opts.wire else payload
        if self.opts.trace:
            self._trace(f"deliver {m!r}")
        n.core.step(m)
        self._drain(n)

    def _want_sync(self, idx: int) -> None:
        """Group commit, as ledger.node does it: one fsync at a time, started when the log grew."""
        n = self.nodes[idx]
        core = n.core
        if core is None or n.syncing or n.sync_scheduled or n.log.last_index <= core.durable:
            return
        n.sync_scheduled = True
        self._push(self.now + self.rng.randint(0, 2), _SYNC_START, idx, n.incarnation)

    def _on_sync_start(self, idx: int, inc: int) -> None:
        n = self.nodes[idx]
        if n.core is None or inc != n.incarnation:
            return
        n.sync_scheduled = False
        if n.log.last_index <= n.core.durable:
            return
        n.syncing = True
        n.sync_target = n.log.last_index
        n.log.floor = None
        if self.now < n.slow_disk_until:
            latency = self.rng.randint(20, 300)  # a stalled disk: acknowledgements wait long
        else:
            latency = self.rng.randint(0, 3) if self.healing else self.rng.choice((0, 1, 2, 5, 10))
        self._push(self.now + latency, _SYNC_DONE, idx, inc)

    def _on_sync_done(self, idx: int, inc: int) -> None:
        n = self.nodes[idx]
        if n.core is None or inc != n.incarnation:
            return
        log = n.log
        if self.profile.async_sync or self.opts.mutation == "naive_async_sync":
            # The fsync covered what was written when it started, minus anything truncated since
            # (ledger.node's rule); the naive mutation forgets the truncation.
            covered = n.sync_target if log.floor is None else min(n.sync_target, log.floor - 1)
            log.sync_to(covered)
            durable = n.sync_target if self.opts.mutation == "naive_async_sync" else covered
        else:
            log.sync()
            durable = log.durable_index
        n.syncing = False
        if self.opts.trace:
            self._trace(f"{n.id} durable {durable}")
        if self.opts.mutation == "no_durable_notice":
            return
        n.core.on_durable(durable)
        self._drain(n)

    def _leaders(self) -> list[SimNode]:
        return [n for n in self.nodes if n.core is not None and n.core.role is Role.LEADER]

    def _on_client(self) -> None:
        if self.healing:
            return  # the heal phase proposes only its own marker
        rng = self.rng
        self._push(self.now + rng.randint(1, self.profile.client_every_ms), _CLIENT)
        leaders = self._leaders()
        n = rng.choice(leaders) if leaders and rng.random() < 0.95 else rng.choice(self.nodes)
        if n.core is None or self.now < n.paused_until:
            return
        if self.profile.reads and rng.random() < 0.25:
            self._issue_read(n)
        else:
            self._propose(n, rng.randint(1, 3))

    def _propose(self, n: SimNode, count: int) -> int | None:
        core = n.core
        assert core is not None
        payloads = []
        for _ in range(count):
            self._next_payload += 1
            payloads.append(f"v{self.seed}-{self._next_payload}".encode() + b"x" * self.rng.randint(0, 40))
        try:
            first, term = core.propose(payloads)
        except NotLeader:
            return None
        for i, p in enumerate(payloads):
            n.proposals.append((first + i, term, p))
        self._drain(n)
        return first + count - 1

    def _issue_read(self, n: SimNode) -> Any:
        core = n.core
        assert core is not None
        self._next_read += 1
        ctx = f"r{self._next_read}"
        if self.opts.mutation == "local_reads":
            if core.role is not Role.LEADER:
                return None
            self.checker.on_read_issued(n, ctx)
            self.checker.on_read_state(n, ctx, core.commit)
            return ctx
        try:
            core.read_index(ctx)
        except NotLeader:
            return None
        n.reads.append(ctx)
        self.checker.on_read_issued(n, ctx)
        self._drain(n)
        return ctx

    def _on_chaos(self) -> None:
        rng = self.rng
        p = self.profile
        self._push(self.now + rng.randint(1, p.chaos_every_ms), _CHAOS)
        actions: list[str] = []
        if p.crashes:
            actions += ["crash", "crash"]
        if p.partitions:
            actions += ["partition", "isolate_leader", "one_way"]
        if p.pauses:
            actions.append("pause")
        if p.slow_disk:
            actions.append("slow_disk")
        if p.transfers:
            actions += ["transfer", "transfer"]
        if p.compaction:
            actions += ["compact", "compact"]
        if not actions:
            return
        action = rng.choice(actions)
        tick = self.opts.tick_ms
        up = [i for i, n in enumerate(self.nodes) if n.core is not None]
        if action == "crash" and up:
            idx = rng.choice(up)
            self._crash(idx)
            self._push(self.now + rng.randint(1, 60) * tick, _RESTART, idx)
        elif action in ("partition", "isolate_leader", "one_way"):
            self._partition(action)
            self._push(self.now + rng.randint(5, 80) * tick, _NET_HEAL)
        elif action == "pause" and up:
            n = self.nodes[rng.choice(up)]
            n.paused_until = self.now + rng.randint(2, 30) * tick
            self._trace(f"PAUSE {n.id} until {n.paused_until}")
        elif action == "slow_disk" and up:
            n = self.nodes[rng.choice(up)]
            n.slow_disk_until = self.now + rng.randint(5, 50) * tick
        elif action == "transfer":
            leaders = self._leaders()
            if leaders:
                n = rng.choice(leaders)
                target = rng.choice([i for i in self.ids if i != n.id])
                assert n.core is not None
                self._trace(f"TRANSFER {n.id} -> {target}")
                n.core.transfer_leadership(target)
                self.stats.transfers += 1
                self._drain(n)
        elif action == "compact" and up:
            n = self.nodes[rng.choice(up)]
            assert n.core is not None
            limit = min(n.core.commit, n.log.durable_index)  # retention drops old, settled data
            if limit > n.log.first_index:
                upto = rng.randint(n.log.first_index + 1, limit)
                self._trace(f"COMPACT {n.id} below {upto}")
                n.log.compact(upto)
                self.stats.compactions += 1

    def _partition(self, kind: str) -> None:
        rng = self.rng
        ids = self.ids
        if kind == "one_way":
            for _ in range(rng.randint(1, len(ids))):
                a, b = rng.sample(ids, 2)
                self.blocked.add((a, b))
            self._trace("ONE-WAY cuts")
            return
        if kind == "isolate_leader" and self._leaders():
            side = [rng.choice(self._leaders()).id]
        else:
            side = rng.sample(ids, rng.randint(1, len(ids) // 2))
        for a in side:
            for b in ids:
                if b not in side:
                    self.blocked.add((a, b))
                    self.blocked.add((b, a))
        self._trace(f"PARTITION {side} | rest")

    # ------------------------------------------------------------------ main loop

    def _dispatch(self, kind: int, idx: int, payload: Any) -> None:
        if kind == _DELIVER:
            self._on_deliver(idx, payload)
        elif kind == _TICK:
            self._on_tick(idx, payload)
        elif kind == _SYNC_START:
            self._on_sync_start(idx, payload)
        elif kind == _SYNC_DONE:
            self._on_sync_done(idx, payload)
        elif kind == _CLIENT:
            self._on_client()
        elif kind == _CHAOS:
            if not self.healing:
                self._on_chaos()
        elif kind == _RESTART:
            if self.nodes[idx].core is None and not self.healing:  # healing restarts by itself
                self._trace(f"RESTART {self.nodes[idx].id}")
                self._start(idx)
        elif kind == _NET_HEAL:
            self.blocked.clear()

    def _run_until(self, deadline: int, done: Any = None) -> bool:
        """Process events up to ``deadline``; stop early (returning True) once ``done()`` holds."""
        queue = self._queue
        sweep_every = self.opts.sweep_every
        stats = self.stats
        opts = self.opts
        max_events = opts.events_per_node_tick * opts.nodes * (opts.fault_ticks + 3 * opts.heal_ticks)
        while queue and queue[0][0] <= deadline:
            at, _, kind, idx, payload = heapq.heappop(queue)
            self.now = at
            stats.events += 1
            if stats.events > max_events:
                raise InvariantViolation(
                    f"[t={self.now}] liveness: more than {max_events} events; a message storm? "
                    f"({stats.messages} messages sent, {stats.install_base} of them InstallBase)"
                )
            self._dispatch(kind, idx, payload)
            if stats.events % sweep_every == 0:
                self.checker.sweep()
            if done is not None and done():
                return True
        self.now = max(self.now, deadline)
        return False

    def run(self) -> Stats:
        opts = self.opts
        for i in range(len(self.nodes)):
            self._start(i)
        self._push(self.rng.randint(1, 30), _CLIENT)
        self._push(self.rng.randint(20, 200), _CHAOS)
        self._run_until(opts.fault_ticks * opts.tick_ms)
        self.checker.sweep()
        self._heal()
        self.checker.sweep()
        self.checker.check_final()
        self.stats.truncations = sum(n.log.truncations for n in self.nodes)
        return self.stats

    def _heal(self) -> None:
        """Stop all faults and require progress within a bound (the liveness check).

        Half the seeds keep a random minority crashed at first: a quorum that is up and
        connected must make progress on its own (no waiting on a dead preferred leader or
        transfer target), and then the restarted minority must catch up too.
        """
        self.healing = True
        rng = self.rng
        nodes = self.nodes
        keep_down: list[int] = []
        if rng.random() < 0.5:
            keep_down = rng.sample(range(len(nodes)), rng.randint(1, (len(nodes) - 1) // 2))
            preferred = nodes[0].config.preferred_leader
            if preferred is not None and rng.random() < 0.7:
                keep_down[0] = self.ids.index(preferred)  # the node everyone wants to hand over to
                keep_down = list(dict.fromkeys(keep_down))
        self._trace(f"HEAL, keeping {[nodes[i].id for i in keep_down]} down")
        self.blocked.clear()
        for i, n in enumerate(nodes):
            n.paused_until = 0
            n.slow_disk_until = 0
            if i in keep_down:
                self._crash(i)
            elif n.core is None:
                self._start(i)
        self._await_progress("after healing" + (" with a minority down" if keep_down else ""))
        if keep_down:
            for i in keep_down:
                self._start(i)
            self._await_progress("after restarting the minority")

    def _await_progress(self, when: str) -> None:
        """A leader with a committed no-op, a new write committed on every up node, a read confirmed."""
        deadline = self.now + self.opts.heal_ticks * self.opts.tick_ms + self._catch_up_allowance()
        state: dict[str, Any] = {"marker": None, "read": None, "stage": "write"}

        def done() -> bool:
            live = [n for n in self._leaders() if n.core is not None and n.core.commit >= n.core.noop_index]
            if not live:
                return False
            leader = max(live, key=lambda n: n.core.term if n.core else 0)
            core = leader.core
            assert core is not None
            if state["stage"] == "write":
                marker = state["marker"]
                if marker is None or marker[0] != leader.id or marker[2] != core.term:
                    index = self._propose(leader, 1)
                    state["marker"] = None if index is None else (leader.id, index, core.term)
                    return False
                _, index, term = marker
                if all(n.core is None or n.core.commit >= index for n in self.nodes):
                    if self.checker.committed.get(index, (None,))[0] != term:
                        self.fail_liveness(f"marker {index} committed with another term")
                    state["stage"] = "read"
                return False
            read = state["read"]
            if read is not None:
                if read in self.checker.confirmed:
                    return True
                if read in self.checker.reads:
                    return False  # still pending somewhere
            state["read"] = self._issue_read(leader)  # first read, or the last one was dropped
            return False

        if not self._run_until(deadline, done):
            leaders = [(n.id, n.core.term) for n in self._leaders() if n.core]
            status = [n.core.status() for n in self.nodes if n.core]
            self.fail_liveness(
                f"no progress within {self.opts.heal_ticks} ticks {when} "
                f"(stage {state['stage']}, leaders {leaders}, nodes {status})"
            )

    def _catch_up_allowance(self) -> int:
        """Virtual ms to replicate the backlog at the slowest configured pipeline, with slack.

        A new leader commits nothing until a quorum holds its whole log, so the liveness bound
        must grow with the backlog; it stays a bound (linear in the work), not a timeout.
        """
        lasts = [n.log.last_index for n in self.nodes]
        backlog = max(lasts) - min(lasts)
        per_round = min(n.config.max_inflight * max(1, n.config.max_append_bytes // 110) for n in self.nodes)
        rounds = -(-backlog // per_round)
        return rounds * 20

    def fail_liveness(self, what: str) -> None:
        raise InvariantViolation(f"[t={self.now}] liveness: {what}")


def run_seed(seed: int, options: SimOptions | None = None) -> SimResult:
    """Run one seed and report instead of raising, with the tail of the event trace on failure."""
    opts = options or SimOptions()
    started = time.perf_counter()
    sim = Simulation(seed, opts)
    error = None
    try:
        sim.run()
    except InvariantViolation as exc:
        error = str(exc) + "\n  last events:\n    " + "\n    ".join(sim.trace_tail)
    except Exception as exc:  # a crash inside the core is a finding too; keep the seed
        error = f"{type(exc).__name__} in the core or simulator at t={sim.now}: {exc}"
        import traceback

        error += "\n" + "".join(traceback.format_exception(exc)[-6:])
    return SimResult(seed, opts, error is None, error, sim.stats, time.perf_counter() - started)


def run_seeds(seeds: Sequence[int], options: SimOptions | None = None) -> list[SimResult]:
    return [run_seed(s, options) for s in seeds]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ledger.sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run (from --start)")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--seed", type=int, help="run exactly this seed (replay)")
    parser.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    parser.add_argument("--fault-ticks", type=int, default=SimOptions.fault_ticks)
    parser.add_argument("--heal-ticks", type=int, default=SimOptions.heal_ticks)
    parser.add_argument("--no-wire", action="store_true", help="pass message objects, skip the codec")
    parser.add_argument("--mutation", default="none", choices=MUTATIONS)
    parser.add_argument("--trace", action="store_true", help="print every event (with --seed)")
    args = parser.parse_args(argv)
    opts = SimOptions(
        nodes=args.nodes,
        fault_ticks=args.fault_ticks,
        heal_ticks=args.heal_ticks,
        wire=not args.no_wire,
        mutation=args.mutation,
        trace=args.trace and args.seed is not None,
    )
    seeds = [args.seed] if args.seed is not None else list(range(args.start, args.start + args.seeds))
    failed = []
    started = time.perf_counter()
    for s in seeds:
        res = run_seed(s, opts)
        if not res.ok:
            failed.append(s)
            print(res.describe(), flush=True)
        elif args.seed is not None:
            print(res.describe())
    took = time.perf_counter() - started
    print(f"{len(seeds)} seeds, {len(failed)} failed, {took:.1f}s; failing seeds: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
