"""Deterministic simulation of a whole ledger cluster, to prove or break the Raft core.

Everything a run does comes from one ``random.Random(seed)``: the fault profile, each
node's configuration and its own core rng, message delays, drops, duplicates and
partitions, crashes and restarts, fsync timing, client proposals and reads. Each node is
the production runtime (``ledger.runtime.LedgerRuntime`` around a real ``RaftCore``) over
a simulated disk (a ``MemoryLog`` whose ``crash()`` loses what was never synced and whose
fsyncs cover only what was written before they started), network and clock; the
simulator owns no copy of the runtime's rules (etcd's rafttest, TigerBeetle's VOPR). Events run from a heap
ordered by (virtual time, sequence number) and nothing iterates a hash-ordered set, so a
seed replays exactly, independent of ``PYTHONHASHSEED`` (the FoundationDB / TigerBeetle
approach: find a failing seed with a cheap search, then replay it under a debugger).

A run has two phases. In the *fault* phase the swarm profile drawn for the seed decides
which faults are on (crashes, partitions, drops, duplicates, long delays, pauses, slow
disks, leadership transfers, retention, membership changes). In the *heal* phase the network is clean and
disks are fast, and the run must reach, within a bound of ticks (plus time linear in the
replication backlog), a leader whose no-op is committed, a fresh proposal committed on
every running node and a confirmed read: that is the liveness check. Half the seeds first
keep a minority crashed (often the preferred leader), so a quorum must make progress on
its own, and then restart it and require it to catch up.

``SimOptions.mutation`` injects one fault on purpose into the production runtime (a
``FaultyRuntime`` subclass), the simulated disk or the voters; the tests use it to show
that each checker can actually fail.

Membership changes (``Profile.membership``; ``SimOptions.membership`` forces them on or off):
the leader is asked to add learners (fresh nodes, which start outside the group knowing its
configuration as ``ledger start --join`` does, or removed nodes coming back with their old
state), promote learners and remove members, itself included; removed nodes keep running
(they must not disturb the group) until they are retired for good.

Invariants (``Checker``) are checked as events happen, in periodic sweeps and at the end:
election safety, the persist-before-send contract, log matching, leader completeness,
state machine safety, quorum durability of committed entries (no majority of a configuration
that may elect a leader can be formed without a node holding them), the acknowledgement rule
(an append the runtime acknowledges is committed with its own term, durable on a quorum
and never lost), leader readiness, linearizable ReadIndex, liveness after healing, and for
membership: every node's configuration at a committed index is the one committed there,
every node's configuration in effect is the one its log says (a truncation reverts it), and
a node whose removal was committed never leads a later term.

Run ``python -m ledger.sim --seeds 500`` to hunt (failing seeds are printed), and
``python -m ledger.sim --seed 42 --trace`` to replay one with every event printed;
``--membership always`` runs membership changes in every seed.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .codec import KIND_CONFIG
from .config import NodeConfig
from .hardstate import after_lost_hard_state, term_bound_after
from .membership import ADD, PROMOTE, REMOVE, Membership, MembershipChange, MembershipError
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
from .raft import NotLeader, RaftConfig, RaftCore, Ready, Role
from .runtime import DEFAULT_DISK_RETRY_S, LedgerRuntime, ReadCallback, SyncDone
from .wire import FAILED

# Event kinds, kept as small ints: the heap holds (time, seq, kind, node, payload).
_TICK, _DELIVER, _SYNC_START, _SYNC_DONE, _CHAOS, _CLIENT, _RESTART, _NET_HEAL, _PEER_LOST, _PEER_UP = range(
    10
)

#: Deliberate faults the simulator can inject, to prove its checkers catch them. Into the
#: disk: forget_vote - the vote is not persisted (lost on a crash); naive_async_sync - an
#: fsync reports everything written when it started as durable, even entries rewritten after
#: a truncation. Into the production runtime (``FaultyRuntime``): ack_on_append - a follower
#: acknowledges before fsync; local_reads - a leader answers reads from its commit index
#: without a quorum round; no_durable_notice - fsyncs are never reported to the core (nothing
#: can commit); send_before_persist - messages leave before the hard state is saved. Into
#: the voters: vote_any_log - they skip the up-to-date check. Into storage damage:
#: forget_damage - a damaged node restarts on its valid prefix as if it never had the rest;
#: forget_lost_state - a node that lost its hard state ignores its term bound and votes at once
#: (it may vote twice in a term). Into membership changes (run with ``membership="always"``):
#: keep_removed_config - a truncation that removes a configuration entry keeps it in effect;
#: learners_count - a leader counts its learners' acknowledgements toward commitment.
MUTATIONS = (
    "none",
    "forget_vote",
    "naive_async_sync",
    "ack_on_append",
    "vote_any_log",
    "local_reads",
    "no_durable_notice",
    "send_before_persist",
    "forget_damage",
    "forget_lost_state",
    "keep_removed_config",
    "learners_count",
)


#: Ready rounds one event may cause across all nodes before the simulator calls it a loop.
_MAX_PROCESS_ROUNDS = 10_000

#: ``SimOptions.membership``: membership changes as the seed's profile says, always, or never.
MEMBERSHIP_MODES = ("swarm", "always", "never")
#: Nodes a run may add beyond ``SimOptions.nodes`` (fresh ids; removed ones may come back too).
MAX_ADDED_NODES = 4


def sim_address(node_id: str) -> str:
    """The address a simulated node is known by (messages are routed by id; configurations carry it)."""
    return f"{node_id}.sim:7000"


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
    membership: str = "swarm"  # see MEMBERSHIP_MODES
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
        if self.membership != defaults.membership:
            parts.append(f"--membership {self.membership}")
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
    storage_damage: bool  # crashes that also damage a node's log (see Simulation._damage)
    membership: bool  # membership changes (see Simulation._chaos_member)
    p_drop: float
    p_dup: float
    p_reorder: float
    p_long_delay: float
    chaos_every_ms: int
    client_every_ms: int

    @classmethod
    def draw(cls, rng: random.Random, seed: int = 0, membership: str = "swarm") -> Profile:
        # Drawn from a stream of its own, so seeds without the fault replay as they did before.
        damage = random.Random(f"storage-damage-{seed}").random() < 0.4
        members = random.Random(f"membership-{seed}").random() < 0.3
        return cls(
            storage_damage=damage,
            membership=membership == "always" or (membership == "swarm" and members),
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


@dataclass
class SimNode:
    """One simulated server: a durable log and hard state, and a core while it is up."""

    id: str
    index: int  # position in Simulation.nodes
    config: RaftConfig
    tick_period: int
    log: MemoryLog = field(default_factory=MemoryLog)
    hard_state: tuple[int, str | None] = (0, None)
    runtime: LedgerRuntime | None = None
    incarnation: int = 0
    paused_until: int = 0
    slow_disk_until: int = 0
    disk_full_until: int = 0  # writes (log appends, hard-state saves) fail with ENOSPC until then
    wake_pending: bool = False  # queued to process its Ready after this event (the node's call_soon)
    validated: int = 0  # highest commit index whose entries the checker has read on this node
    reads: list[Any] = field(default_factory=list)  # read names issued here and not yet answered
    # Storage damage: the (index, term) its log reached before (the store's damage marker,
    # kept until the core has caught up again) and the terms of the entries it lost.
    lost_claim: tuple[int, int] | None = None
    lost_terms: dict[int, int] = field(default_factory=dict)
    recovering: bool = False  # lost its hard state: the node's recovery marker, until caught up
    # The durable term bound beside the hard state (``ledger.hardstate``), as a first start writes it.
    term_bound: int | None = field(default_factory=lambda: term_bound_after(0, None))
    # The configuration it starts from while its log holds none: the config file's, or for a
    # node added later the group's at that time (what ``ledger start --join`` learns).
    bootstrap: Membership | None = None
    retired: bool = False  # removed from the group and shut down for good

    @property
    def core(self) -> RaftCore | None:
        return self.runtime.core if self.runtime is not None else None

    @property
    def up(self) -> bool:
        return self.runtime is not None


@dataclass
class Stats:
    """What a run exercised, so tests can assert the simulation is not vacuous."""

    events: int = 0
    messages: int = 0
    elections: int = 0
    crashes: int = 0
    commits: int = 0
    acked_writes: int = 0
    acked_by_deposed: int = 0  # acknowledged by a leader that had lost that term's leadership
    failed_writes: int = 0  # definite failures: another entry was committed at the index
    unknown_writes: int = 0  # timed out in the runtime's pending table
    reads_ok: int = 0
    reads_dropped: int = 0
    transfers: int = 0
    timeout_now: int = 0
    install_base: int = 0
    truncations: int = 0
    compactions: int = 0
    peer_lost: int = 0  # connection-lost notices delivered (a crash's, or a flaky link's)
    disk_full: int = 0  # episodes of a disk refusing writes
    damaged: int = 0  # crashes that cut a durable suffix off a node's log (storage damage)
    repaired: int = 0  # damaged nodes whose log was again as up to date as before
    lost_state: int = 0  # crashes that lost the hard state (term and vote)
    config_changes: int = 0  # membership changes a leader accepted (appended)
    config_refused: int = 0  # membership changes a leader refused (one at a time, catch-up, majority)
    config_committed: int = 0  # configuration entries seen committed
    nodes_added: int = 0  # fresh nodes started outside the group, to be added as learners
    readded: int = 0  # removed nodes added back (with their old log and hard state)
    removed_leaders: int = 0  # leaders that stepped down once their own removal committed
    retired: int = 0  # removed nodes shut down for good
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
    """The invariants, fed by the production runtime's own outputs: its network (every
    message sent), its listeners (roles, commits, readiness) and its callbacks (append
    acknowledgements, read answers), exactly what an embedding broker would see.

    Committed means reported to a commit listener on any node; the entries are read from
    that node's log at the moment it reports, which is what a state machine applying the
    log would see.
    """

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.leaders: dict[int, str] = {}  # term -> the one node that led it
        # Committed configurations by index (0: the one the group started with), in index order.
        self.configs: dict[int, Membership] = {0: sim.bootstrap}
        self.last_config = 0  # index of the latest committed configuration
        self._matched: dict[tuple[str, str], tuple[int, int, int]] = {}  # see check_log_matching
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
        """Persist-before-send: no message may rely on a term or vote that is not yet durable.

        One Ready may batch several inputs, so its hard state can be newer than some of its
        messages (etcd's contract too): a vote granted in an older term than the persisted
        one is safe, since this node can never vote in that term again.
        """
        term, voted = node.hard_state
        if isinstance(m, VoteRequest) and m.pre_vote:
            if m.term > term + 1:
                self.fail(f"{node.id} pre-vote for term {m.term} while its persisted term is {term}")
            return
        if isinstance(m, VoteResponse) and m.pre_vote:
            return  # a granted pre-vote carries the candidate's next term, never persisted
        if m.term > term:
            self.fail(f"{node.id} sent {type(m).__name__} at term {m.term} with persisted term {term}")
        if m.term < term:
            return
        if isinstance(m, VoteResponse) and m.granted and voted != m.dst:
            self.fail(f"{node.id} granted a vote to {m.dst} in term {m.term} but persisted {(term, voted)}")
        if isinstance(m, VoteRequest) and voted != m.src:
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
        latest = self.configs[self.last_config]
        if self.last_config and not latest.is_member(node.id):
            removed_in = self.commit_term[self.last_config]
            if removed_in < term:
                self.fail(
                    f"membership: {node.id} leads term {term} but was removed by entry {self.last_config}, "
                    f"committed in term {removed_in} ({latest})"
                )

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
        self.check_config_at_commit(node, commit)
        stats.commits += 1
        if commit > self.max_commit_reported:
            self.max_commit_reported = commit
            stats.max_commit = commit

    def _record(
        self, node: SimNode, index: int, term: int, kind: int | None, data: bytes | None, cterm: int
    ) -> None:
        have = self.committed.get(index)
        if have is None:
            self.committed[index] = (term, kind, data)
            self.commit_term[index] = cterm
            if data is not None and index > self.max_committed:
                self.max_committed = index
            if kind == KIND_CONFIG and data is not None:
                self._record_config(index, data)
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
            if kind == KIND_CONFIG:
                self._record_config(index, data)
        if cterm < self.commit_term[index]:
            self.commit_term[index] = cterm
            self._check_current_leaders(index, term, cterm)

    def _record_config(self, index: int, data: bytes) -> None:
        self.configs[index] = Membership.decode(data)
        self.sim.stats.config_committed += 1
        if index > self.last_config:
            self.last_config = index
        else:  # seen late (known only by its term until now): keep the dict in index order
            self.configs = dict(sorted(self.configs.items()))

    def committed_config_at(self, index: int) -> tuple[int, Membership]:
        """The committed configuration in effect at ``index`` (the latest at or below it)."""
        best = 0
        for i in self.configs:
            if i > index:
                break
            best = i
        return best, self.configs[best]

    def check_config_at_commit(self, node: SimNode, commit: int) -> None:
        """Configurations agree: a node's configuration at a committed index is the one committed there."""
        core = node.core
        assert core is not None
        index, _, mine, _ = core.config_at(commit)
        want_index, want = self.committed_config_at(commit)
        if index == 0 and want_index == 0:
            return  # both the bootstrap (a node added later bootstraps from the group's; see SimNode)
        if (index, mine) != (want_index, want):
            self.fail(
                f"membership: {node.id} at commit {commit} uses the configuration of entry {index} ({mine}), "
                f"but entry {want_index} ({want}) is the one committed there"
            )

    def check_config_follows_log(self, node: SimNode) -> None:
        """The configuration in effect is the latest in the log (else the base's, else the bootstrap):
        what a restart would find, and what a truncation must revert to."""
        core = node.core
        if core is None:
            return
        records = node.log.config_records()
        want = (records[-1][0], records[-1][2]) if records else None
        index, _, mine, data = core.config_log[-1]
        if want is None:
            if index != 0:
                self.fail(
                    f"membership: {node.id} uses entry {index} ({mine}) but its log holds no configuration"
                )
            return
        if (index, data) != want:
            self.fail(
                f"membership: {node.id} uses the configuration of entry {index} ({mine}) but its log's latest "
                f"is entry {want[0]} ({Membership.decode(want[1])})"
            )

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

    def on_ack(self, node: SimNode, first: int, term: int, payloads: Sequence[bytes]) -> None:
        """The runtime acknowledged an append: it must be committed with its own term, on a quorum."""
        for i, payload in enumerate(payloads):
            index = first + i
            have = self.committed.get(index)
            if have is None or have[0] != term or (have[2] is not None and have[2] != payload):
                self.fail(
                    f"acknowledged write not committed: {node.id} acknowledged index {index} term {term} "
                    f"{payload!r}, committed as {have}"
                )
            self.acked[index] = (term, payload)
        self.sim.stats.acked_writes += len(payloads)
        core = node.core
        if core is not None and (core.role is not Role.LEADER or core.term != term):
            self.sim.stats.acked_by_deposed += 1
        self.check_durable_on_quorum(first + len(payloads) - 1, term, "acknowledged")

    def on_leader_ready(self, node: SimNode, term: int) -> None:
        """Readiness is reported only by the leader of that term, once its no-op is committed."""
        core = node.core
        assert core is not None
        if core.role is not Role.LEADER or core.term != term or core.commit < core.noop_index:
            self.fail(
                f"{node.id} reported leader ready for term {term} as {core.role.value} of term "
                f"{core.term} with commit {core.commit} below its no-op {core.noop_index}"
            )

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
        for n in self.sim.nodes:
            self.check_config_follows_log(n)

    def check_log_matching(self) -> None:
        """If two logs hold an entry with the same index and term, they agree up to there.

        What an earlier sweep verified is not compared again while neither log removed or
        replaced an entry since (``MemoryLog.rewrites``): only appends, which sit above it.
        """
        nodes = self.sim.nodes
        verified = self._matched
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
                key = (a.id, b.id)
                seen = verified.get(key)
                if seen is not None and seen[1] == la.rewrites and seen[2] == lb.rewrites:
                    lo = max(lo, seen[0] + 1)
                verified[key] = (top, la.rewrites, lb.rewrites)
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
        if top:
            self.check_durable_on_quorum(top, self.committed[top][0], "committed")

    def check_durable_on_quorum(self, index: int, term: int, what: str) -> None:
        holders = []
        for n in self.sim.nodes:
            log = n.log
            if log.base_index >= index:
                holders.append(n.id)  # retention/InstallBase only ever drops committed entries
            elif log.durable_index >= index and log.last_index >= index and log.term_at(index) == term:
                holders.append(n.id)
            elif n.lost_terms.get(index) == term:
                holders.append(n.id)  # lost to damage but still defended: its votes need the entry
        for config in self.electing_configs():
            others = [v for v in config.voters if v not in holders]
            if len(others) >= config.quorum:
                self.fail(
                    f"durability: {what} index {index} (term {term}) is durable only on {holders}: "
                    f"{others} are a majority of the voters of {config} without it"
                )

    def electing_configs(self) -> list[Membership]:
        """The configurations a leader may be elected by now: the latest committed one, and any
        later one a leader holds (at most one pending change)."""
        configs = [self.configs[self.last_config]]
        for n in self.sim.nodes:
            core = n.core
            if core is not None and core.role is Role.LEADER and core.config_index > self.last_config:
                configs.append(core.membership)
        return configs

    def check_final(self) -> None:
        """After healing: every acknowledged write is in every member's log, in place."""
        group = self.configs[self.last_config]
        for n in self.sim.nodes:
            if not group.is_member(n.id) or n.retired:
                continue  # removed (or never added, or shut down for good): it may hold any prefix
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


class SimDisk:
    """The runtime's disk in a simulation: a ``MemoryLog`` and a hard state that survive crashes.

    An fsync starts a little after it is asked for and takes a while (long on a slow disk).
    With ``async_sync`` (or the naive fault) it covers the writes made before it started
    (``MemoryLog.sync_through``), as an fsync on a thread does; otherwise everything written
    when it completes.
    """

    def __init__(self, sim: Simulation, node: SimNode) -> None:
        self.sim = sim
        self.node = node
        self.log = node.log
        self.incarnation = node.incarnation

    def save_hard_state(self, term: int, voted_for: str | None) -> None:
        if self.sim.now < self.node.disk_full_until:
            raise OSError(28, "No space left on device (simulated)")
        bound = term_bound_after(term, self.node.term_bound)
        if bound is not None:
            self.node.term_bound = bound  # durable before the state it covers, as HardState.save does
        self.node.hard_state = (term, voted_for)

    def writable(self) -> bool:
        return self.sim.now >= self.node.disk_full_until

    def start_sync(self, done: SyncDone) -> None:
        sim = self.sim
        sim._push(sim.now + sim.rng.randint(0, 2), _SYNC_START, self.node.index, (self.incarnation, done))

    def begin(self, done: SyncDone) -> None:
        sim, n = self.sim, self.node
        mark, target = n.log.write_mark(), n.log.last_index
        if sim.now < n.slow_disk_until:
            latency = sim.rng.randint(20, 300)  # a stalled disk: acknowledgements wait long
        else:
            latency = sim.rng.randint(0, 3) if sim.healing else sim.rng.choice((0, 1, 2, 5, 10))
        sim._push(sim.now + latency, _SYNC_DONE, n.index, (self.incarnation, done, mark, target))

    def finish(self, done: SyncDone, mark: int, target: int) -> None:
        sim, log = self.sim, self.node.log
        naive = sim.opts.mutation == "naive_async_sync"
        if sim.profile.async_sync or naive:
            durable = log.sync_through(mark)
            if naive:
                durable = target  # the fault: vouch for everything written at the start
        else:
            durable = log.sync()
        sim._trace(f"{self.node.id} durable {durable}")
        done(durable, None)


class SimNetwork:
    """The runtime's network in a simulation: checks persist-before-send, then the simulated links."""

    def __init__(self, sim: Simulation, node: SimNode) -> None:
        self.sim = sim
        self.node = node

    def send(self, m: Message) -> None:
        self.sim.checker.on_send(self.node, m)
        self.sim._send(m)


class SimClock:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def now(self) -> float:
        return self.sim.now / 1000


class FaultyRuntime(LedgerRuntime):
    """The production runtime with one deliberate fault (``SimOptions.mutation``) or none."""

    def __init__(self, *args: Any, fault: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fault = fault

    def persist_then_send(self, rd: Ready) -> bool:
        if self.fault != "send_before_persist" or rd.hard_state is None:
            return super().persist_then_send(rd)
        for m in rd.messages:
            self.network.send(m)
        self.disk.save_hard_state(*rd.hard_state)
        return True

    def process(self) -> None:
        super().process()
        core = self.core
        if self.fault == "ack_on_append" and core.role is not Role.LEADER:
            core.on_durable(self.disk.log.last_index)  # acknowledges entries before their fsync
            if core.has_ready:
                self.wake()

    def read_index(self, cb: ReadCallback) -> None:
        if self.fault != "local_reads":
            return super().read_index(cb)
        if self.core.role is not Role.LEADER:
            raise NotLeader(self.core.leader)
        cb(self.core.commit, None)  # no quorum round: a deposed leader answers stale reads

    def report_durable(self, durable: int) -> None:
        if self.fault != "no_durable_notice":
            super().report_durable(durable)


def _break_membership(core: RaftCore, fault: str) -> None:
    """Install one of the membership mutations (see ``MUTATIONS``) into ``core``."""
    if fault == "keep_removed_config":
        truncate = core._truncate

        def truncate_keeping_config(index: int) -> None:
            kept = list(core.config_log)
            truncate(index)
            if core.config_log != kept:
                core.config_log = kept
                core._apply_membership(kept[-1][2])

        core._truncate = truncate_keeping_config  # type: ignore[method-assign]
    else:
        maybe_commit = core._maybe_commit

        def commit_counting_learners() -> None:
            voters = core._voter_progress
            core._voter_progress = [core.progress[p] for p in core.peers]
            try:
                maybe_commit()
            finally:
                core._voter_progress = voters

        core._maybe_commit = commit_counting_learners  # type: ignore[method-assign]


class Simulation:
    """One seeded run of a cluster. ``run()`` returns normally or raises ``InvariantViolation``."""

    def __init__(self, seed: int, options: SimOptions | None = None) -> None:
        self.seed = seed
        self.opts = options or SimOptions()
        if self.opts.mutation not in MUTATIONS:
            raise ValueError(f"unknown mutation {self.opts.mutation!r}; one of {MUTATIONS}")
        if self.opts.membership not in MEMBERSHIP_MODES:
            raise ValueError(f"unknown membership mode {self.opts.membership!r}; one of {MEMBERSHIP_MODES}")
        self.rng = random.Random(seed)
        rng = self.rng
        self.profile = Profile.draw(rng, seed, self.opts.membership)
        self.now = 0
        self.stats = Stats()
        self._queue: list[tuple[int, int, int, int, Any]] = []
        self._seq = 0
        self.blocked: set[tuple[str, str]] = set()  # directed links that drop everything
        self.healing = False
        self.trace_tail: deque[str] = deque(maxlen=60)
        self.violation: InvariantViolation | None = None  # raised inside a runtime callback
        self._woken: deque[int] = deque()  # nodes whose runtime asked to process its Ready
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
            node = SimNode(nid, len(self.nodes), cfg, period)
            node.log.append = self._full_disk_guard(node, node.log.append)  # type: ignore[method-assign]
            self.nodes.append(node)
        self.bootstrap = Membership({nid: sim_address(nid) for nid in ids})
        for node in self.nodes:
            node.bootstrap = self.bootstrap
        self.by_id = {n.id: n for n in self.nodes}
        self.ids = ids
        self.append_timeout_ms = rng.choice((300, 1000, 5000))  # pending appends expire after this
        # A faulted disk is probed as often, in ticks, as in production (1 s at 50 ms ticks: 20).
        # The simulator's ticks are 5x shorter, and a probe left at a production 1 s took 100 of
        # the 150 ticks the heal phase allows: a node whose disk came back at the heal stayed
        # mute most of that time and the quorum it was part of could not elect (seed 4747).
        self.disk_retry_s = DEFAULT_DISK_RETRY_S * self.opts.tick_ms / NodeConfig.tick_ms
        self.checker = Checker(self)
        self._next_payload = 0
        self._next_read = 0

    def _full_disk_guard(self, n: SimNode, append: Callable[..., None]) -> Callable[..., None]:
        """The simulated disk refuses appends while it is full, as ``LogStore`` does: nothing written."""

        def guarded(entries: Any) -> None:
            if self.now < n.disk_full_until and entries:
                raise OSError(28, "No space left on device (simulated)")
            append(entries)

        return guarded

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
        assert n.bootstrap is not None
        core = RaftCore(
            n.id,
            n.bootstrap,
            n.log,
            term=term,
            voted_for=voted,
            config=n.config,
            rng=random.Random(self.rng.getrandbits(64)),
            durable_index=n.log.durable_index,
            log_claim=None if self.opts.mutation == "forget_damage" else n.lost_claim,
            recovering=n.recovering,
        )
        if self.opts.mutation == "vote_any_log":
            core._log_up_to_date = lambda last_index, last_term: True  # type: ignore[method-assign]
        elif self.opts.mutation in ("keep_removed_config", "learners_count"):
            _break_membership(core, self.opts.mutation)
        rt = FaultyRuntime(
            core,
            SimDisk(self, n),
            SimNetwork(self, n),
            SimClock(self),
            append_timeout_s=self.append_timeout_ms / 1000,
            disk_retry_s=self.disk_retry_s,
            wake=lambda: self._wake(idx),
            fault=self.opts.mutation,
        )
        guard = self._guarded
        rt.role_listeners.append(guard(lambda role, term, leader: self._on_role(n, role, term, leader)))
        rt.commit_listeners.append(guard(lambda commit: self.checker.on_commit(n, commit)))
        rt.leader_ready_listeners.append(guard(lambda term: self.checker.on_leader_ready(n, term)))
        n.runtime = rt
        n.validated = core.commit
        n.wake_pending = False
        self._push(self.now + self.rng.randint(1, n.tick_period), _TICK, idx, n.incarnation)
        rt.maybe_sync()

    def _crash(self, idx: int) -> None:
        n = self.nodes[idx]
        if n.runtime is None:
            return
        self._trace(f"CRASH {n.id} (durable {n.log.durable_index} of {n.log.last_index})")
        for ctx in n.reads:
            self.checker.reads.pop(ctx, None)
        n.reads.clear()
        n.runtime = None  # its pending appends die with the process: their clients never hear
        n.incarnation += 1
        n.log.crash()
        if self.opts.mutation == "forget_vote":
            n.hard_state = (n.hard_state[0], None)
        self.stats.crashes += 1
        self.checker.check_quorum_durable()
        # The OS of each survivor sees its connections to the dead process reset, within a
        # few milliseconds, if the link still carries packets (a partition hides the crash).
        for j, other in enumerate(self.nodes):
            if j != idx and other.runtime is not None and (n.id, other.id) not in self.blocked:
                self._push(self.now + self.rng.randint(1, 5), _PEER_LOST, j, (n.id, other.incarnation))

    # ------------------------------------------------------------------ driving the runtime

    def _guarded(self, fn: Callable[..., None]) -> Callable[..., None]:
        """A checker callback for the runtime: the runtime isolates failing listeners (by
        design), so a violation is parked here and raised by the event loop right after."""

        def call(*args: Any) -> None:
            try:
                fn(*args)
            except InvariantViolation as exc:
                if self.violation is None:
                    self.violation = exc

        return call

    def _wake(self, idx: int) -> None:
        """The runtime's ``wake``: process its Ready once the current event is handled.

        That is what the asyncio node's ``call_soon`` does: every input of one loop turn
        is in before the Ready is taken. Woken nodes are processed in wake order.
        """
        n = self.nodes[idx]
        if not n.wake_pending:
            n.wake_pending = True
            self._woken.append(idx)

    def _process_woken(self) -> None:
        woken = self._woken
        rounds = 0
        while woken:
            n = self.nodes[woken.popleft()]
            n.wake_pending = False
            if n.runtime is not None:
                n.runtime.process()
            rounds += 1
            if rounds > _MAX_PROCESS_ROUNDS:
                raise InvariantViolation(f"[t={self.now}] runtimes kept waking each other: a Ready loop?")
        if self.violation is not None:
            raise self.violation

    def _on_role(self, n: SimNode, role: Role, term: int, leader: str | None) -> None:
        self._trace(f"{n.id} becomes {role.value} term {term} leader {leader}")
        core = n.core
        if (
            role is Role.FOLLOWER
            and core is not None
            and not core.is_voter
            and self.checker.leaders.get(term) == n.id
        ):
            self.stats.removed_leaders += 1  # led this term, then its own removal committed
        self.stats.max_term = max(self.stats.max_term, term)
        self.checker.on_role(n, role, term)

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
        if n.runtime is None or inc != n.incarnation:
            return
        self._push(self.now + n.tick_period + self.rng.choice((0, 0, 0, 1)), _TICK, idx, inc)
        if self.now < n.paused_until:
            return
        n.runtime.tick()
        if n.recovering and not n.runtime.core.recovering:
            self._trace(f"RECOVERED {n.id} (commit {n.runtime.core.commit})")
            n.recovering = False
        if n.lost_claim is not None and n.runtime.core.log_claim is None:
            self._trace(f"REPAIRED {n.id} (log {n.log.last_index}, durable {n.log.durable_index})")
            n.lost_claim = None  # the node clears its damage marker on a tick, too
            n.lost_terms = {}
            self.stats.repaired += 1

    def _on_peer_lost(self, idx: int, payload: tuple[str, int]) -> None:
        peer, inc = payload
        n = self.nodes[idx]
        if n.runtime is None or inc != n.incarnation or self.now < n.paused_until:
            return
        self._trace(f"PEER-LOST {n.id} lost {peer}")
        self.stats.peer_lost += 1
        n.runtime.peer_unreachable(peer)

    def _on_peer_up(self, idx: int, payload: tuple[str, int]) -> None:
        peer, inc = payload
        n = self.nodes[idx]
        if n.runtime is None or inc != n.incarnation or self.now < n.paused_until:
            return
        n.runtime.peer_reachable(peer)

    def _on_deliver(self, idx: int, payload: Any) -> None:
        n = self.nodes[idx]
        if n.runtime is None:
            return
        if self.now < n.paused_until:
            self._push(n.paused_until + self.rng.randint(0, 2), _DELIVER, idx, payload)
            return
        m = decode_message(payload) if self.opts.wire else payload
        if self.opts.trace:
            self._trace(f"deliver {m!r}")
        n.runtime.step(m)

    def _sim_disk(self, idx: int, inc: int) -> SimDisk | None:
        """The disk of the running incarnation of node ``idx`` (None if it crashed since)."""
        rt = self.nodes[idx].runtime
        if rt is None or inc != self.nodes[idx].incarnation:
            return None
        assert isinstance(rt.disk, SimDisk)
        return rt.disk

    def _on_sync_start(self, idx: int, payload: tuple[int, SyncDone]) -> None:
        inc, done = payload
        disk = self._sim_disk(idx, inc)
        if disk is not None:
            disk.begin(done)

    def _on_sync_done(self, idx: int, payload: tuple[int, SyncDone, int, int]) -> None:
        inc, done, mark, target = payload
        disk = self._sim_disk(idx, inc)
        if disk is not None:
            disk.finish(done, mark, target)

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
        """A client append through the runtime; the checker judges every acknowledgement."""
        rt = n.runtime
        assert rt is not None
        payloads = []
        for _ in range(count):
            self._next_payload += 1
            payloads.append(f"v{self.seed}-{self._next_payload}".encode() + b"x" * self.rng.randint(0, 40))

        def settled(code: int, first: int, term: int, message: str) -> None:
            if code == 0:
                self.checker.on_ack(n, first, term, payloads)
            elif code == FAILED:
                self.stats.failed_writes += 1
            else:
                self.stats.unknown_writes += 1

        try:
            first, _ = rt.propose(payloads, self._guarded(settled))
        except NotLeader:
            return None
        return first + count - 1

    def _issue_read(self, n: SimNode) -> Any:
        rt = n.runtime
        assert rt is not None
        self._next_read += 1
        ctx = f"r{self._next_read}"

        def answered(index: int, exc: Exception | None) -> None:
            if ctx in n.reads:
                n.reads.remove(ctx)
            if exc is None:
                self.checker.on_read_state(n, ctx, index)
            else:
                self.checker.on_read_dropped(n, ctx)

        self.checker.on_read_issued(n, ctx)
        n.reads.append(ctx)
        try:
            rt.read_index(self._guarded(answered))
        except NotLeader:
            n.reads.remove(ctx)
            self.checker.reads.pop(ctx, None)
            return None
        return ctx

    def _on_chaos(self) -> None:
        """Inject one fault, drawn from the classes the seed's swarm profile turned on."""
        rng = self.rng
        self._push(self.now + rng.randint(1, self.profile.chaos_every_ms), _CHAOS)
        actions = self._chaos_actions()
        if not actions:
            return
        action = rng.choice(actions)
        up = [i for i, n in enumerate(self.nodes) if n.core is not None]
        if action in ("partition", "isolate_leader", "one_way"):
            self._partition(action)
            self._push(self.now + rng.randint(5, 80) * self.opts.tick_ms, _NET_HEAL)
        elif action == "transfer":
            self._chaos_transfer()
        elif action == "member":
            self._chaos_member()
        elif up:
            self._chaos_on_node(action, rng.choice(up))

    def _chaos_actions(self) -> list[str]:
        """The weighted menu of faults (a class listed twice is drawn twice as often)."""
        p = self.profile
        actions: list[str] = []
        if p.crashes:
            actions += ["crash", "crash"]
            if p.storage_damage:
                actions += ["damage", "damage", "lose_state"]
        if p.partitions:
            actions += ["partition", "isolate_leader", "one_way"]
        if p.pauses:
            actions.append("pause")
        if p.slow_disk:
            actions += ["slow_disk", "disk_full"]
        if p.transfers:
            actions += ["transfer", "transfer"]
        if p.compaction:
            actions += ["compact", "compact"]
        if p.membership:
            actions += ["member", "member", "member"]
        return actions

    def _chaos_on_node(self, action: str, idx: int) -> None:
        """Crash, pause, slow down or compact the running node ``idx``."""
        rng = self.rng
        tick = self.opts.tick_ms
        n = self.nodes[idx]
        if action in ("crash", "damage", "lose_state"):
            self._crash(idx)
            if action == "damage":
                self._damage(n)
            elif action == "lose_state":
                self._lose_hard_state(n)
            self._push(self.now + rng.randint(1, 60) * tick, _RESTART, idx)
        elif action == "pause":
            n.paused_until = self.now + rng.randint(2, 30) * tick
            self._trace(f"PAUSE {n.id} until {n.paused_until}")
        elif action == "slow_disk":
            n.slow_disk_until = self.now + rng.randint(5, 50) * tick
        elif action == "disk_full":
            n.disk_full_until = self.now + rng.randint(5, 40) * tick
            self._trace(f"DISK-FULL {n.id} until {n.disk_full_until}")
            self.stats.disk_full += 1
        elif action == "compact":
            assert n.core is not None
            limit = min(n.core.commit, n.log.durable_index)  # retention drops old, settled data
            if limit > n.log.first_index:
                upto = rng.randint(n.log.first_index + 1, limit)
                self._trace(f"COMPACT {n.id} below {upto}")
                n.log.compact(upto)
                self.stats.compactions += 1

    def _damage(self, n: SimNode) -> None:
        """A crash that also damaged the log: what ``LogStore`` salvage leaves of it.

        The store keeps the prefix before the damage and records how far the log reached
        (the claim); the restarted core defends that claim in votes until it holds it again.
        One damaged node at a time (with f = 1 two could lose what a quorum acknowledged).
        """
        log = n.log
        if (
            any(o.lost_claim is not None or o.recovering for o in self.nodes)
            or log.last_index < log.first_index
            or not self._tolerates_one_fault()
        ):
            return
        cut = self.rng.randint(log.first_index, log.last_index)
        claim = (log.last_index, log.last_term)
        n.lost_terms = {i: log.term_at(i) for i in range(cut, log.last_index + 1)}
        n.lost_claim = claim
        log.truncate_suffix(cut)
        log.truncations -= 1  # damage, not a Raft truncation (Stats.truncations counts those)
        self.stats.damaged += 1
        self._trace(f"DAMAGE {n.id} log cut at {cut}, claim {claim}")

    def _lose_hard_state(self, n: SimNode) -> None:
        """A crash that also lost the hard-state file (not the term bound beside it): the node
        restarts as ``LedgerNode`` does (``after_lost_hard_state``), in its bound's term with its
        vote spent. One such node at a time, and not next to a damaged one."""
        if (
            any(o.recovering or o.lost_claim is not None for o in self.nodes)
            or not self._tolerates_one_fault()
        ):
            return
        mutation = self.opts.mutation
        bound = None if mutation == "forget_lost_state" else n.term_bound
        term, vote, recovering = after_lost_hard_state(bound, n.log.last_term, n.id)
        n.recovering = recovering and mutation != "forget_lost_state"
        n.hard_state = (term, vote)
        self.stats.lost_state += 1
        self._trace(f"LOSE-STATE {n.id} restarts in term {term} voted {vote} (bound {n.term_bound})")

    def _chaos_transfer(self) -> None:
        leaders = self._leaders()
        if not leaders:
            return
        rng = self.rng
        n = rng.choice(leaders)
        assert n.runtime is not None and n.core is not None
        if self.profile.membership:
            targets = n.core.voter_peers
            if not targets:
                return
            target = rng.choice(targets)
        else:
            target = rng.choice([i for i in self.ids if i != n.id])
        self._trace(f"TRANSFER {n.id} -> {target}")
        n.runtime.transfer_leadership(target)
        self.stats.transfers += 1

    # ------------------------------------------------------------------ membership changes

    def _chaos_member(self) -> None:
        """Ask a ready leader for one membership change: add a learner (a fresh node, or a removed
        one coming back), promote a learner, remove a member (itself included), or retire a node
        the group removed. The leader refuses what it must (one change at a time, catch-up,
        majority); the checkers judge what it accepts."""
        rng = self.rng
        leaders = [n for n in self._leaders() if n.runtime is not None and n.runtime.leader_ready]
        if not leaders or any(n.lost_claim is not None or n.recovering for n in self.nodes):
            return  # not while a node recovers: shrinking the group could leave it waiting on that node
        leader = rng.choice(leaders)
        core = leader.core
        assert core is not None and leader.runtime is not None
        m = core.membership
        outside = [n for n in self.nodes if not n.retired and not m.is_member(n.id)]
        menu = ["remove", "promote", "promote", "add", "retire"]
        action = rng.choice(menu)
        change: MembershipChange | None = None
        if action == "add":
            if outside and (rng.random() < 0.4 or len(self.nodes) >= self.opts.nodes + MAX_ADDED_NODES):
                back = rng.choice(outside)
                change = MembershipChange(ADD, back.id, sim_address(back.id))
                self.stats.readded += 1
            elif len(self.nodes) < self.opts.nodes + MAX_ADDED_NODES:
                fresh = self._spawn_node(m)
                change = MembershipChange(ADD, fresh.id, sim_address(fresh.id))
        elif action == "promote" and m.learners:
            change = MembershipChange(PROMOTE, rng.choice(list(m.learners)))
        elif action == "remove":
            change = MembershipChange(REMOVE, rng.choice(list(m.ids)))
        elif action == "retire":
            self._retire_one()
            return
        if change is None:
            return

        def settled(code: int, first: int, term: int, message: str) -> None:
            self._trace(f"MEMBER {change.describe()} at {first}: {'committed' if code == 0 else message}")

        try:
            index, _ = leader.runtime.propose_membership(change, self._guarded(settled))
        except MembershipError as exc:
            self._trace(f"MEMBER {change.describe()} refused by {leader.id}: {exc}")
            self.stats.config_refused += 1
            return
        except NotLeader:
            return
        self._trace(f"MEMBER {change.describe()} proposed by {leader.id} at {index}")
        self.stats.config_changes += 1

    def _configs_in_play(self) -> list[Membership]:
        """The latest committed configuration and every later one in any node's log."""
        checker = self.checker
        configs = [checker.configs[checker.last_config]]
        for n in self.nodes:
            for index, _, data in n.log.config_records():
                if index > checker.last_config:
                    configs.append(Membership.decode(data))
        return configs

    def _tolerates_one_fault(self) -> bool:
        """Whether every configuration in play has 3 voters or more: storage damage is modelled for
        f = 1 (a damaged voter of a 2-voter group may wait forever for entries only it had)."""
        return not self.profile.membership or all(len(c.voters) >= 3 for c in self._configs_in_play())

    def _spawn_node(self, group: Membership) -> SimNode:
        """A fresh node with a new id, started outside the group with the group's configuration."""
        rng = self.rng
        nid = f"n{len(self.nodes) + 1}"
        like = rng.choice(self.nodes).config
        cfg = RaftConfig(
            election_ticks=like.election_ticks,
            heartbeat_ticks=like.heartbeat_ticks,
            pre_vote=like.pre_vote,
            check_quorum=like.check_quorum,
            max_inflight=rng.choice((1, 2, 8, 32)),
            max_append_bytes=rng.choice((200, 1000, 1 << 20)),
            preferred_leader=like.preferred_leader,
        )
        node = SimNode(nid, len(self.nodes), cfg, self.opts.tick_ms + rng.choice((-1, 0, 0, 1)))
        node.log.append = self._full_disk_guard(node, node.log.append)  # type: ignore[method-assign]
        node.bootstrap = group
        self.nodes.append(node)
        self.ids.append(nid)
        self.by_id[nid] = node
        self.stats.nodes_added += 1
        self._trace(f"SPAWN {nid} outside {group}")
        self._start(node.index)
        return node

    def _retire_one(self) -> None:
        """Shut down for good a node the group removed (committed, and no leader's configuration has it)."""
        group = self.checker.configs[self.checker.last_config]
        pending = [n.core.membership for n in self._leaders() if n.core is not None]
        gone = [
            n
            for n in self.nodes
            if not n.retired
            and self.checker.last_config
            and not group.is_member(n.id)
            and not any(p.is_member(n.id) for p in pending)
            and n.lost_claim is None
            and not n.recovering
        ]
        if not gone:
            return
        n = self.rng.choice(gone)
        self._trace(f"RETIRE {n.id}")
        self._crash(n.index)
        n.retired = True
        self.stats.retired += 1

    def _partition(self, kind: str) -> None:
        rng = self.rng
        ids = self.ids
        if kind == "one_way":
            for _ in range(rng.randint(1, len(ids))):
                a, b = rng.sample(ids, 2)
                self.blocked.add((a, b))
            # A flaky link resets a connection between two nodes that still hear each other
            # otherwise: a spurious notice that must not depose a healthy leader.
            a, b = rng.sample(ids, 2)
            j = ids.index(b)
            self._push(self.now + rng.randint(1, 5), _PEER_LOST, j, (a, self.nodes[j].incarnation))
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
                    if rng.random() < 0.5:  # a cut link may reset its connection: a spurious notice
                        j = self.ids.index(b)
                        self._push(
                            self.now + rng.randint(1, 5), _PEER_LOST, j, (a, self.nodes[j].incarnation)
                        )
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
            if self.nodes[idx].core is None and not self.healing and not self.nodes[idx].retired:
                self._trace(f"RESTART {self.nodes[idx].id}")
                self._start(idx)
                # The others' outboxes reconnect to the restarted node soon after.
                for j, other in enumerate(self.nodes):
                    if j != idx and other.runtime is not None:
                        at = self.now + self.rng.randint(1, 20)
                        self._push(at, _PEER_UP, j, (self.nodes[idx].id, other.incarnation))
        elif kind == _NET_HEAL:
            self.blocked.clear()
        elif kind == _PEER_LOST:
            self._on_peer_lost(idx, payload)
        elif kind == _PEER_UP:
            self._on_peer_up(idx, payload)

    def _run_until(self, deadline: int, done: Any = None) -> bool:
        """Process events up to ``deadline``; stop early (returning True) once ``done()`` holds."""
        queue = self._queue
        sweep_every = self.opts.sweep_every
        stats = self.stats
        opts = self.opts
        per_node = opts.events_per_node_tick * (opts.fault_ticks + 3 * opts.heal_ticks)
        max_events = per_node * opts.nodes
        while queue and queue[0][0] <= deadline:
            at, _, kind, idx, payload = heapq.heappop(queue)
            self.now = at
            stats.events += 1
            if stats.events > max_events and stats.events > per_node * len(self.nodes):  # nodes were added
                raise InvariantViolation(
                    f"[t={self.now}] liveness: more than {max_events} events; a message storm? "
                    f"({stats.messages} messages sent, {stats.install_base} of them InstallBase)"
                )
            self._dispatch(kind, idx, payload)
            self._process_woken()
            if stats.events % sweep_every == 0:
                self.checker.sweep()
            if done is not None:
                if done():
                    return True
                self._process_woken()  # done() may have proposed or read
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
        transfer target), and then the restarted minority must catch up too. Not while a
        damaged node still defends its claim: that quorum may rightly wait for the entries.
        """
        self.healing = True
        rng = self.rng
        nodes = self.nodes
        keep_down: list[int] = []
        if self.profile.membership:
            self._retire_stray_candidates()
            keep_down = self._minority_to_keep_down()
        elif rng.random() < 0.5:
            keep_down = rng.sample(range(len(nodes)), rng.randint(1, (len(nodes) - 1) // 2))
            preferred = nodes[0].config.preferred_leader
            if preferred is not None and rng.random() < 0.7:
                keep_down[0] = self.ids.index(preferred)  # the node everyone wants to hand over to
                keep_down = list(dict.fromkeys(keep_down))
        if any(n.lost_claim is not None or n.recovering for n in nodes):
            # A damaged node still defending its claim refuses candidates without those entries:
            # a quorum that includes it may rightly wait for the node that holds them.
            keep_down = []
        self._trace(f"HEAL, keeping {[nodes[i].id for i in keep_down]} down")
        self.blocked.clear()
        for i, n in enumerate(nodes):
            n.paused_until = 0
            n.slow_disk_until = 0
            n.disk_full_until = 0
            if i in keep_down:
                self._crash(i)
            elif n.core is None and not n.retired:
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
            live = [n for n in self._leaders() if n.runtime is not None and n.runtime.leader_ready]
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
                group = core.membership  # removed nodes and strangers need not have it
                if all(n.core is None or n.core.commit >= index for n in self.nodes if group.is_member(n.id)):
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

    def _retire_stray_candidates(self) -> None:
        """Shut down the removed nodes that run without PreVote, as an operator would.

        Such a node may never have learned of its removal (it missed the entry, committed or
        not): it then still campaigns, and without a pre-vote its every candidacy moves the term
        of any member still on a configuration that knows it, and takes that member's vote,
        while the members that hold its removal ignore it and stay a term behind: they can lose
        every race for that vote. This only ever delays elections (liveness, never safety: the
        fault phase keeps such nodes running); PreVote, on by default, makes it harmless.
        """
        configs = self._configs_in_play()
        for n in self.nodes:
            if n.retired or n.config.pre_vote:
                continue
            removed = any(n.id in c.removed for c in configs) or not any(c.is_member(n.id) for c in configs)
            if not removed:
                continue
            left = [[v for v in c.voters if v != n.id and not self.by_id[v].retired] for c in configs]
            if all(len(up) >= c.quorum for up, c in zip(left, configs, strict=True)):
                self._trace(f"RETIRE {n.id} (removed, and campaigns without PreVote)")
                self._crash(n.index)
                n.retired = True
                self.stats.retired += 1

    def _minority_to_keep_down(self) -> list[int]:
        """With membership changes: a random minority of voters that leaves a majority of every
        configuration that may elect a leader (committed or pending) up, or nobody."""
        rng = self.rng
        if rng.random() >= 0.5:
            return []
        configs = self._configs_in_play()
        voters = list(configs[0].voters)
        down = rng.sample(voters, rng.randint(0, (len(voters) - 1) // 2))
        for config in configs:
            up = [v for v in config.voters if v not in down and not self.by_id[v].retired]
            if len(up) < config.quorum:
                return []
        return [self.ids.index(v) for v in down]

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
    parser.add_argument(
        "--membership",
        default="swarm",
        choices=MEMBERSHIP_MODES,
        help="membership changes: per seed, always, never",
    )
    parser.add_argument("--trace", action="store_true", help="print every event (with --seed)")
    args = parser.parse_args(argv)
    opts = SimOptions(
        nodes=args.nodes,
        fault_ticks=args.fault_ticks,
        heal_ticks=args.heal_ticks,
        wire=not args.no_wire,
        mutation=args.mutation,
        membership=args.membership,
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
