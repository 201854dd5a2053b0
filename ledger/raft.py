"""The Raft consensus core: a deterministic state machine with no sockets, clocks or threads.

Inputs are messages (``step``), logical clock ticks (``tick``), proposals, read requests and
durability notices (``on_durable``); outputs are collected in a ``Ready`` that the runtime
takes after every input: messages to send, the hard state to persist before sending them,
the new commit index, role changes and confirmed reads. Time and randomness come from the
caller (ticks and an injected ``random.Random``), so a whole cluster can be simulated from
a seed and a failing seed replays exactly (the etcd/raft and sans-I/O style).

The log is injected (the real segmented store, or an in-memory log in simulations). The
core appends and truncates it directly, which is only page-cache work for the real store;
durability is the runtime's job: it fsyncs in batches (group commit) and reports the
durable index back. A leader counts itself toward a quorum only up to its durable index,
and a follower acknowledges only durable entries, so an acknowledged entry is on disk on a
quorum of nodes.

Implemented: randomized election timeouts, PreVote, CheckQuorum with leader stickiness,
commitment only of current-term entries (a no-op at election), pipelined and batched
appends with a per-follower in-flight window, fast back-tracking by conflict term,
leadership transfer (TimeoutNow) and a preferred leader, ReadIndex, and a log-only
InstallBase for followers behind the leader's retention horizon.

Membership changes (``ledger.membership``, where the safety argument is): single-server
changes through the log (add a learner, promote a learner, remove a member), each in
effect once appended and reverted when a truncation removes it, one at a time and only
after the leader has committed an entry of its term. Learners receive the log but neither
vote nor count toward commit, reads or CheckQuorum; a leader that removed itself steps down
(handing over at once) when the change commits; vote requests from removed members are
ignored, or, once the removal is committed, answered "removed" (``answer_departed``): a node
removed while it was down then stops campaigning (``removed_by``) instead of asking forever.
A learner's catch-up may be throttled (``learner_bytes_per_tick``): the leader reads, encodes
and sends the whole missing log otherwise as fast as the learner acknowledges it, taking the
CPU (its own and the learner's) that its clients' appends need while a change is under way.

Beyond the paper, for failover and healing: the shell reports a peer connection reset or
refused (``peer_unreachable``: a follower that lost its leader pre-votes at once, ranked so
survivors do not split the vote) and re-established (``peer_reachable``: an unanswered vote
request is resent); a leader lowers a follower's match when the follower reports a shorter
log (it lost data); a node that lost its hard state starts ``recovering`` (no votes, no
campaign until a leader caught it up); and a disk fault (``set_disk_fault``) hands over
leadership and stops voting until the disk takes writes again.
"""

from __future__ import annotations

import enum
import operator
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .codec import HEADER_SIZE as ENTRY_HEADER_BYTES
from .codec import KIND_CONFIG, KIND_NOOP, KIND_NORMAL, Entry
from .invariants import InvariantError
from .membership import PROMOTE, Membership, MembershipChange, MembershipError
from .messages import (
    AppendRequest,
    AppendResponse,
    InstallBase,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class NotLeader(Exception):
    """This node cannot serve the request; ``leader`` is its best guess of who can (or None)."""

    def __init__(self, leader: str | None, reason: str = "not leader") -> None:
        super().__init__(f"{reason}; leader is {leader or 'unknown'}")
        self.leader = leader


class LogView(Protocol):
    """What the core needs of a log; ``ledger.store.LogStore`` and ``ledger.memlog.MemoryLog`` provide it."""

    first_index: int
    last_index: int
    last_term: int

    def term_at(self, index: int) -> int: ...
    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]: ...
    def append(self, entries: Sequence[Entry]) -> None: ...
    def truncate_suffix(self, index: int) -> None: ...
    def reset(
        self, base_index: int, base_term: int, base_pos: int, base_config: ConfigRecord | None = None
    ) -> None: ...
    def save_config(self, index: int, term: int, data: bytes) -> None: ...
    def config_records(self) -> list[ConfigRecord]: ...
    def next_pos(self) -> int: ...


#: (index, term, encoded ``Membership``): a configuration entry, or the configuration at a log's base.
ConfigRecord = tuple[int, int, bytes]
#: (index, term, membership, encoded): one configuration the core knows of; index 0 is the bootstrap.
ConfigAt = tuple[int, int, Membership, bytes]

_kind_of = operator.attrgetter("kind")
_data_of = operator.attrgetter("data")


@dataclass
class RaftConfig:
    """Timing is in ticks; the runtime decides how long a tick is (default 50 ms)."""

    election_ticks: int = 8
    heartbeat_ticks: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    max_inflight: int = 32
    max_append_bytes: int = 1 << 20
    preferred_leader: str | None = None
    # A learner is promoted only when its log is at most this many entries behind the leader's.
    max_promote_lag: int = 1024
    # The most log bytes (entries with their headers) sent to one learner (or removed peer) per
    # tick; 0: no limit. Voters are never throttled: the quorum and a failover need them current.
    learner_bytes_per_tick: int = 0

    def validate(self) -> None:
        if self.election_ticks < 2:
            raise ValueError("election_ticks must be at least 2")
        if not 1 <= self.heartbeat_ticks < self.election_ticks:
            raise ValueError("heartbeat_ticks must be at least 1 and below election_ticks")
        if self.max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
        if self.max_promote_lag < 0:
            raise ValueError("max_promote_lag must not be negative")
        if self.learner_bytes_per_tick < 0:
            raise ValueError("learner_bytes_per_tick must not be negative")


PROBE, REPLICATE = 0, 1


class Progress:
    """The leader's view of one follower (etcd's Progress, simplified)."""

    __slots__ = (
        "match",
        "next",
        "state",
        "inflight",
        "probe_sent",
        "active",
        "was_active",
        "acked_seq",
        "joined_at",
        "budget",
    )

    def __init__(self, next_index: int) -> None:
        self.match = 0
        self.next = next_index
        self.state = PROBE
        self.inflight: deque[int] = deque()  # last index of each append still unacknowledged
        self.probe_sent = False
        self.active = False  # answered during the current election timeout
        self.was_active = False  # answered during the previous one
        self.acked_seq = 0
        # the index of the configuration that added this member (0: a member at election):
        # until it holds that entry it has never answered, whatever ``active`` says
        self.joined_at = 0
        # bytes it may still be sent this tick when its catch-up is throttled (a learner)
        self.budget = 0

    @property
    def answering(self) -> bool:
        """Heard from lately, and at least once since it was added."""
        return (self.active or self.was_active) and self.match >= self.joined_at

    def become_probe(self) -> None:
        self.state = PROBE
        self.inflight.clear()
        self.probe_sent = False

    def become_replicate(self) -> None:
        self.state = REPLICATE
        self.next = max(self.next, self.match + 1)
        self.inflight.clear()
        self.probe_sent = False


@dataclass
class Ready:
    """Everything the runtime must do after an input, in this order.

    1. persist ``hard_state`` (fsync) if set, 2. send ``messages``, 3. apply up to
    ``commit_index``, 4. deliver role changes, confirmed reads and failed reads.
    """

    hard_state: tuple[int, str | None] | None = None
    messages: list[Message] = field(default_factory=list)
    commit_index: int | None = None
    role_changes: list[tuple[Role, int, str | None]] = field(default_factory=list)
    leader_ready: int | None = None  # a term: this node leads and its no-op is committed
    read_states: list[tuple[Any, int]] = field(default_factory=list)  # (ctx, index to wait for)
    dropped_reads: list[Any] = field(default_factory=list)
    # The configuration in effect changed (appended, reverted by a truncation, installed):
    # the runtime tells its membership listeners before any message of this Ready leaves.
    membership: Membership | None = None
    # A member told this node that the group removed it (``RaftCore.removed_by``): its id.
    removed_by: str | None = None

    def __bool__(self) -> bool:
        return bool(
            self.membership is not None
            or self.removed_by is not None
            or self.hard_state is not None
            or self.messages
            or self.commit_index is not None
            or self.role_changes
            or self.leader_ready is not None
            or self.read_states
            or self.dropped_reads
        )


class RaftCore:
    """One member of a Raft group. See the module docstring for the contract."""

    def __init__(
        self,
        node_id: str,
        members: Sequence[str] | Membership,
        log: LogView,
        *,
        term: int = 0,
        voted_for: str | None = None,
        config: RaftConfig | None = None,
        rng: random.Random | None = None,
        durable_index: int | None = None,
        recovering: bool = False,
        log_claim: tuple[int, int] | None = None,
    ) -> None:
        self.id = node_id
        self.log = log
        self.config = config or RaftConfig()
        self.config.validate()
        self.rng = rng or random.Random()
        self.term = term
        self.voted_for = voted_for
        self.role = Role.FOLLOWER
        self.leader: str | None = None
        self.commit = log.first_index - 1  # everything before the retained log was committed
        self.durable = log.last_index if durable_index is None else durable_index
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.timeout = self._random_timeout()
        self.votes: dict[str, bool] = {}
        self.progress: dict[str, Progress] = {}
        self.noop_index = 0
        self.leader_ready_sent = False
        self.transfer_target: str | None = None
        self.transfer_elapsed = 0
        self.timeout_now_sent = False
        self.preferred_backoff = 0  # election timeouts to wait after an aborted preferred transfer
        self.preferred_wait = 0
        self.read_seq = 0
        self.pending_reads: deque[tuple[int, Any, int]] = deque()  # (seq, ctx, commit at request)
        self.reads_before_noop: list[Any] = []
        self.leader_match = 0  # follower: highest index known to match the current leader's log
        self.last_acked = 0  # follower: match index last reported to the leader
        self.last_seq = 0  # follower: seq of the latest accepted request
        self.deferred_prevote: VoteRequest | None = None  # refused under a lease; see peer_unreachable
        self.campaign_transfer = False  # the current candidacy was started by TimeoutNow
        # Lost its hard state but had data: it may have voted in any term up to now, so it
        # neither votes nor campaigns until a leader has brought it up to date (see _handle_append).
        self.recovering = recovering
        # Lost log entries it may have acknowledged (storage damage, the store's salvage): the
        # (index, term) its log reached before. Until it holds a log at least that up to date
        # again, it votes as if it still had it (so no candidate missing those entries gets
        # its vote) and does not campaign (its own log lacks them). See _check_claim.
        self.log_claim = log_claim
        # The disk refused a write: do not lead, campaign or vote until the runtime clears it.
        self.disk_fault = False
        # A member holding a committed configuration that removed this node said so (its id):
        # the node was removed while it was down or cut off and never received the change. It
        # no longer campaigns (it votes, as any node does) until a leader replicates to it
        # again, which only a configuration with this id back in it makes a leader do.
        self.removed_by: str | None = None
        # The application says its state machine is far behind this node's commit index (a
        # restarted broker replaying its log): it would serve only once that backlog is
        # applied, so it lets its peers stand first. It still votes, and still campaigns
        # (half an election timeout later than it would) if no peer takes over. See set_lagging.
        self.lagging = False
        self._ready = Ready()
        self._hs_dirty = False
        self._append_dirty = False
        self._read_round_needed = False
        self._leave_pending = False  # a leader not in its committed configuration hands over in ready()
        # Leader only: removed peers still sent the log until they hold their removal (id -> its index).
        self.leaving: dict[str, int] = {}
        self.leaving_dropped = 0  # how many removed peers the leader stopped informing
        # Leader, with a learner throttle: the log's byte position at the last tick (its growth
        # since then is added to each learner's budget, so a learner catches up under any load).
        self._catchup_pos = 0
        self._voter_progress: list[Progress] = []
        self._targets: list[str] = []  # leader only: whom to replicate to (peers, then leaving ones)
        bootstrap = members if isinstance(members, Membership) else Membership.of_ids(members)
        # Every configuration from the one at the log's base on (the bootstrap, index 0, when the
        # log never had one): the last is in effect; truncation pops, commit prunes below the base.
        self.config_log: list[ConfigAt] = [(0, 0, bootstrap, bootstrap.encode())]
        for index, cterm, data in log.config_records():  # in log order, the base's first
            self.config_log.append((index, cterm, Membership.decode(data), bytes(data)))
        self._prune_configs()
        self._apply_membership(self.config_log[-1][2], announce=False)
        if self.log_claim is not None:
            self._check_claim()  # a restart after catching up, before the claim was cleared

    # ------------------------------------------------------------------ inputs

    def tick(self) -> None:
        """Advance the logical clock by one tick."""
        if self.role is Role.LEADER:
            self._tick_leader()
        elif self.recovering or self.disk_fault or self.log_claim is not None:
            self.election_elapsed = 0  # waits for a leader (or its disk): it may not lead
        elif (not self.is_voter and not self._removal_pending()) or self.removed_by is not None:
            # A learner (or a node outside the group) never campaigns, but lets its leader's
            # lease lapse as a voter would, so it grants votes again once the leader is gone.
            self.election_elapsed += 1
            if self.election_elapsed >= self.timeout:
                self.election_elapsed = 0
                self.leader = None
        else:
            self.election_elapsed += 1
            if self.election_elapsed >= self.timeout + (
                self.config.election_ticks >> 1 if self.lagging else 0
            ):
                self.election_elapsed = 0
                self.campaign()

    def campaign(self, transfer: bool = False) -> None:
        """Start an election (a pre-vote first unless this is a transfer or pre-vote is off)."""
        if self.recovering or self.disk_fault or self.log_claim is not None:
            return
        if (not self.is_voter and not self._removal_pending()) or self.removed_by is not None:
            return
        if (self.config.pre_vote or not self.is_voter) and not transfer:
            # A node its pending removal left out always asks first (pre-vote moves no term):
            # most members already ignore it, and it must not disturb those that do not.
            self._become_pre_candidate()
        else:
            self._become_candidate(transfer)

    def peer_unreachable(self, peer: str) -> None:
        """The OS says ``peer`` is gone (its connection was reset or refused): if it was our
        leader, stop vouching for its lease and call a pre-vote without waiting for the
        election timeout.

        This is safe against a lone flaky link: a pre-vote is granted only by peers that
        have no leader or whose lease expired, so while a quorum still hears from a healthy
        leader the pre-vote fails and no term is disrupted. When the leader did die, every
        survivor hears of it within milliseconds; to avoid a split vote they do not all
        campaign at once: the first survivor by member order campaigns now, the others a
        few ticks later each (by then they have dropped the dead leader too and grant the
        first one's pre-vote). Without PreVote an early campaign would bump terms on a
        flaky link, so the notice is then ignored.
        """
        if peer != self.leader or self.role is not Role.FOLLOWER or not self.config.pre_vote:
            return
        self.leader = None
        self.election_elapsed = 0
        survivors = sorted(m for m in self.voters if m != peer)
        if self.id not in survivors:
            return  # a learner: nothing to campaign for
        rank = survivors.index(self.id)
        if self.lagging:  # after every survivor that is not lagging (in member order if all are)
            rank += len(survivors)
        deferred, self.deferred_prevote = self.deferred_prevote, None
        if deferred is not None and deferred.term == self.term + 1 and deferred.src != peer:
            # A survivor noticed first and asked while we still vouched for the leader: grant
            # it now (if its log qualifies) rather than compete with it and split the vote.
            self._handle_vote_request(deferred)
            rank = max(rank, 1)
        if rank == 0:
            self.campaign()
            return
        self.timeout = rank * max(2, self.config.election_ticks // 4)

    def answer_departed(self, peer: str, pre_vote: bool = True) -> None:
        """``peer`` asked for our vote (or dialled us) though the group removed it: if the
        configuration at our commit index says so, answer that it was removed (the answer moves
        no term and grants nothing), so that a node removed while it was down stops campaigning
        and says why. Unanswered while the removal is not committed here: it may still be
        truncated away, and the node would then be a voter that never stands."""
        if peer in self.departed and peer in self.config_at(self.commit)[2].removed:
            self._send(VoteResponse(self.term, self.id, peer, False, pre_vote, removed=True))

    def _learn_removed(self, src: str) -> None:
        """A member told us the group removed us (see ``answer_departed``): stop campaigning."""
        if self.role is Role.LEADER or self.removed_by is not None:
            return
        self.removed_by = src
        self._ready.removed_by = src
        if self.role is not Role.FOLLOWER:
            self._become_follower(self.term, None)

    def peer_reachable(self, peer: str) -> None:
        """A connection to ``peer`` was (re)established: resend our vote request if it has not answered.

        Its first copy was most likely dropped while the peer was down (a node restarting
        after an earlier failure), and waiting for the next election timeout to ask again is
        what made a failover with one node still starting take a second. Resending the same
        request is plain retransmission: it changes nothing a peer may rely on.
        """
        if peer not in self.voters or peer == self.id or peer in self.votes:
            return
        log = self.log
        if self.role is Role.PRE_CANDIDATE:
            self._send(VoteRequest(self.term + 1, self.id, peer, log.last_index, log.last_term, True, False))
        elif self.role is Role.CANDIDATE:
            self._send(
                VoteRequest(
                    self.term, self.id, peer, log.last_index, log.last_term, False, self.campaign_transfer
                )
            )

    def set_lagging(self, lagging: bool) -> None:
        """The application's state machine is (``True``) or is no longer far behind the commit index.

        A node that wins an election while its application is still applying a committed
        backlog serves nothing until it has applied it (a broker becomes master only then),
        which late in a long run was hundreds of ms after the election, and its busy event
        loop answered votes late enough to split them. While lagging, the node yields: when
        its leader's connection drops it takes its turn after every survivor's (as if ranked
        behind all of them, so two lagging survivors still go one after the other), and any
        election timeout is half an election timeout longer. It votes as before. This only
        delays its own candidacy, so safety is untouched, and it still stands if no peer
        does (liveness with the others down).
        """
        self.lagging = lagging

    def set_disk_fault(self, faulty: bool) -> None:
        """The runtime's disk failed a write (``True``) or takes writes again (``False``).

        A leader that cannot write cannot commit anything: it steps down at once so a
        healthy node takes over (its peers stop hearing heartbeats; with CheckQuorum they
        elect within an election timeout, faster when its connections reset). While the
        fault lasts the node neither campaigns nor votes, and ignores appends.
        """
        self.disk_fault = faulty
        if faulty and self.role is Role.LEADER:
            # Hand over at once to a follower holding our whole log (a leadership transfer
            # without the wait): it campaigns past its peers' leases, so no election timeout.
            self._hand_over()
        if faulty and self.role is not Role.FOLLOWER:
            self._become_follower(self.term, None)

    def propose(self, payloads: Sequence[bytes]) -> tuple[int, int]:
        """Append client payloads to the leader's log; returns (first index, term)."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        if self.transfer_target is not None:
            raise NotLeader(self.transfer_target, "leadership transfer in progress")
        first = self.log.last_index + 1
        term = self.term
        self.log.append([Entry(first + i, term, p, KIND_NORMAL) for i, p in enumerate(payloads)])
        if self.log.last_index != first + len(payloads) - 1:
            raise InvariantError(
                f"{self.id}: appending {len(payloads)} at {first} left the log ending at {self.log.last_index}"
            )
        self._append_dirty = True
        return first, term

    def propose_membership(self, change: MembershipChange) -> tuple[int, int]:
        """Append a configuration entry for ``change``; returns (index, term) like ``propose``.

        Refused (``MembershipError``, ``retryable`` when waiting may help) unless this
        leader has committed an entry of its term and the configuration in effect is
        committed (one change at a time; see ``ledger.membership``), the change applies
        to the current configuration, a promoted learner has caught up, and the voters of
        the new configuration that answered recently are a majority of it.
        """
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        if self.transfer_target is not None:
            raise NotLeader(self.transfer_target, "leadership transfer in progress")
        if self.commit < self.noop_index:
            raise MembershipError(
                "this leader has not committed an entry of its term yet; retry shortly", retryable=True
            )
        pending = self.config_log[-1][0]
        if pending > self.commit:
            raise MembershipError(
                f"another membership change (entry {pending}) is not committed yet: one change at a time",
                retryable=True,
            )
        new = change.apply(self.membership)
        if change.op == PROMOTE:
            self._check_caught_up(change.node_id)
        self._check_reachable_majority(new, change)
        index, term = self.log.last_index + 1, self.term
        data = new.encode()
        self.log.save_config(index, term, data)
        self.log.append([Entry(index, term, data, KIND_CONFIG)])
        if self.log.last_index != index:
            raise InvariantError(
                f"{self.id}: appending the configuration at {index} left {self.log.last_index}"
            )
        self._config_appended(index, term, new, data)
        self._append_dirty = True
        self._maybe_commit()  # a smaller quorum may commit at once what waited for a removed voter
        return index, term

    def _check_caught_up(self, learner: str) -> None:
        pr = self.progress.get(learner)
        last = self.log.last_index
        lag = last - (pr.match if pr is not None else 0)
        recent = pr is not None and pr.answering
        if not recent or lag > self.config.max_promote_lag:
            raise MembershipError(
                f"learner {learner!r} has not caught up: it holds the log up to "
                f"{pr.match if pr is not None else 0} of {last} ({lag} entries behind, at most "
                f"{self.config.max_promote_lag} allowed{'' if recent else '; and it has not answered lately'})",
                retryable=True,
            )

    def _check_reachable_majority(self, new: Membership, change: MembershipChange) -> None:
        reachable = []
        for v in new.voters:
            pr = self.progress.get(v)
            if v == self.id or (pr is not None and pr.answering):
                reachable.append(v)
        if len(reachable) < new.quorum:
            raise MembershipError(
                f"refusing '{change.describe()}': the new configuration's voters {list(new.voters)} need "
                f"{new.quorum} to commit anything, and only {len(reachable)} answered lately ({reachable})"
            )

    def adopt_bootstrap(self, membership: Membership) -> bool:
        """A joining node learned the group's configuration from a member (``ledger start --join``).

        It stands in for the bootstrap configuration until the log brings one; returns False
        (and changes nothing) when a configuration from the log is already in effect.
        """
        if len(self.config_log) != 1 or self.config_log[0][0] != 0:
            return False
        self.config_log = [(0, 0, membership, membership.encode())]
        self._apply_membership(membership)
        return True

    def read_index(self, ctx: Any) -> None:
        """Ask for a linearizable read point; answered in ``Ready.read_states`` as (ctx, index)."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        if self.commit < self.noop_index:
            self.reads_before_noop.append(ctx)
            return
        self._register_read(ctx)

    def transfer_leadership(self, target: str) -> None:
        """Hand leadership to ``target`` once it has caught up (DLedger's leadership transfer)."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        if target == self.id:
            return
        if target not in self.voter_peers:
            what = "a learner" if target in self.membership.learners else "not a member"
            raise ValueError(f"cannot transfer leadership to {target!r}: {what}")
        self.transfer_target = target
        self.transfer_elapsed = 0
        self.timeout_now_sent = False
        self._maybe_send_timeout_now()
        self._append_dirty = True

    def on_durable(self, index: int) -> None:
        """The runtime's fsync made the log durable up to ``index``."""
        index = min(index, self.log.last_index)
        if index <= self.durable:
            return
        self.durable = index  # never above the log's end (clipped) and never backwards (returned)
        if self.log_claim is not None:
            self._check_claim()
        if self.role is Role.LEADER:
            self._maybe_commit()
        else:
            self._ack_leader()

    def step(self, m: Message) -> None:
        """Handle one message from a peer."""
        if m.__class__ is VoteRequest and m.src in self.departed:
            # A node the group removed: its term never reaches us; told it is out if that is
            # committed here, else unanswered.
            self.answer_departed(m.src, m.pre_vote)
            return
        if m.__class__ is VoteResponse and m.removed:
            self._learn_removed(m.src)
            return
        if m.term > self.term:
            if isinstance(m, VoteRequest):
                in_lease = (
                    self.config.check_quorum
                    and self.leader is not None
                    and self.election_elapsed < self.config.election_ticks
                )
                if in_lease and not m.transfer:
                    if m.pre_vote:
                        self.deferred_prevote = m  # answered if we lose the leader soon (peer_unreachable)
                    return  # leader stickiness: a live leader is not disrupted by a stray candidate
            if isinstance(m, VoteRequest) and m.pre_vote:
                pass  # a pre-vote never changes our term
            elif isinstance(m, VoteResponse) and m.pre_vote and m.granted:
                pass
            else:
                leader = m.src if isinstance(m, AppendRequest | InstallBase) else None
                self._become_follower(m.term, leader)
        elif m.term < self.term:
            if isinstance(m, AppendRequest | InstallBase):
                # Tell a stale leader about the newer term so it steps down.
                self._send(AppendResponse(self.term, self.id, m.src, False, 0))
            elif isinstance(m, VoteRequest) and (m.pre_vote or self.departed):
                # A stale candidate learns our term from the refusal. Without removed members
                # every candidate hears every other's term anyway; with them, the terms a
                # removed node still pushes on some members never reach the members that
                # ignore it, and a candidate among those would stay behind forever.
                self._send(VoteResponse(self.term, self.id, m.src, False, m.pre_vote))
            return

        if self.disk_fault and isinstance(m, AppendRequest | InstallBase):
            self._accept_leader(m)  # know who leads (for redirects), write nothing until the disk is back
            return
        if isinstance(m, VoteRequest):
            self._handle_vote_request(m)
        elif isinstance(m, VoteResponse):
            self._handle_vote_response(m)
        elif isinstance(m, AppendRequest):
            self._handle_append(m)
        elif isinstance(m, AppendResponse):
            if self.role is Role.LEADER:
                self._handle_append_response(m)
        elif isinstance(m, InstallBase):
            self._handle_install_base(m)
        elif isinstance(m, TimeoutNow):
            if (
                self.role is not Role.LEADER
                and m.src == self.leader
                and self.is_voter
                and not (self.recovering or self.disk_fault or self.log_claim is not None)
            ):
                self._become_candidate(transfer=True)

    def ready(self) -> Ready:
        """Take what the runtime must do now; the core forgets it (no separate advance step)."""
        if self._leave_pending:
            self._leave_pending = False
            if self.role is Role.LEADER and not self.is_voter:
                self._step_down_removed()
        if self._read_round_needed and self.role is Role.LEADER:
            # A read round starts only after its reads were registered, so the quorum that
            # answers it proves this node still led at some moment after each read arrived.
            self._read_round_needed = False
            self.read_seq += 1
            self._broadcast_heartbeat()
        if self.role is Role.LEADER and self._append_dirty:
            self._append_dirty = False
            for peer in self._targets:
                self._send_appends(peer)
        rd = self._ready
        if self._hs_dirty:
            rd.hard_state = (self.term, self.voted_for)
            self._hs_dirty = False
        self._ready = Ready()
        return rd

    @property
    def has_ready(self) -> bool:
        return (
            bool(self._ready)
            or self._hs_dirty
            or (self.role is Role.LEADER and (self._append_dirty or self._read_round_needed))
        )

    # ------------------------------------------------------------------ roles

    def _random_timeout(self) -> int:
        e = self.config.election_ticks
        return e + self.rng.randrange(e)

    def _reset_timers(self) -> None:
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.timeout = self._random_timeout()

    def _set_role(self, role: Role) -> None:
        self.role = role
        self._ready.role_changes.append((role, self.term, self.leader))

    def _become_follower(self, term: int, leader: str | None) -> None:
        if term < self.term:
            raise InvariantError(f"{self.id}: term would go back from {self.term} to {term}")
        if term != self.term:
            self.term = term
            self.voted_for = None
            self._hs_dirty = True
        was_leader = self.role is Role.LEADER
        self.leader = leader
        self._reset_timers()
        self.leader_match = 0
        self.last_acked = 0
        # SIM-FIX (python -m ledger.sim --seed 46): ``last_seq`` is echoed to the leader by ``_ack_leader``;
        # a seq kept from a previous leader's numbering inflated the new leader's acked_seq,
        # which could confirm a read without a round started after it (stale read) and, as
        # the seed showed, left later reads pending forever once real seqs were lower.
        self.last_seq = 0
        if was_leader:
            self._abandon_leadership()
        self._set_role(Role.FOLLOWER)

    def _abandon_leadership(self) -> None:
        self.progress.clear()
        self.leaving.clear()
        self._voter_progress = []
        self._targets = []
        self.transfer_target = None
        dropped = [ctx for _, ctx, _ in self.pending_reads] + self.reads_before_noop
        self.pending_reads.clear()
        self.reads_before_noop = []
        self._read_round_needed = False
        self._ready.dropped_reads.extend(dropped)

    def _become_pre_candidate(self) -> None:
        self.leader = None
        self.votes = {self.id: True}
        self._reset_timers()
        if self.role is not Role.PRE_CANDIDATE:
            self._set_role(Role.PRE_CANDIDATE)
        if self._won(self.votes):
            self._become_candidate(False)
            return
        for peer in self.voter_peers:
            self._send(
                VoteRequest(
                    self.term + 1, self.id, peer, self.log.last_index, self.log.last_term, True, False
                )
            )

    def _become_candidate(self, transfer: bool) -> None:
        if self.role is Role.LEADER:
            self._abandon_leadership()
        self.term += 1
        self.voted_for = self.id
        self._hs_dirty = True
        self.leader = None
        self.campaign_transfer = transfer
        self.votes = {self.id: True}
        self._reset_timers()
        self._set_role(Role.CANDIDATE)
        if self._won(self.votes):
            self._become_leader()
            return
        for peer in self.voter_peers:
            self._send(
                VoteRequest(
                    self.term, self.id, peer, self.log.last_index, self.log.last_term, False, transfer
                )
            )

    def _become_leader(self) -> None:
        self.leader = self.id
        self._reset_timers()
        self.progress = {p: Progress(self.log.last_index + 1) for p in self.peers}
        for pr in self.progress.values():
            pr.active = True  # give every follower a full election timeout before CheckQuorum counts it
        self.leaving = {}
        self._catchup_pos = self.log.next_pos()
        self._voter_progress = [self.progress[p] for p in self.voter_peers]
        self._targets = list(self.peers)
        self.transfer_target = None
        self.pending_reads.clear()
        self.reads_before_noop = []
        self.leader_ready_sent = False
        self._set_role(Role.LEADER)
        self.noop_index = self.log.last_index + 1
        self.log.append([Entry(self.noop_index, self.term, b"", KIND_NOOP)])
        self._append_dirty = True
        self._broadcast_heartbeat()
        self._maybe_commit()

    def _won(self, votes: dict[str, bool]) -> bool:
        voters = self.voters
        return sum(1 for p, v in votes.items() if v and p in voters) >= self.quorum

    def _lost(self, votes: dict[str, bool]) -> bool:
        voters = self.voters
        return sum(1 for p, v in votes.items() if not v and p in voters) > len(voters) - self.quorum

    # ------------------------------------------------------------------ elections

    def _log_up_to_date(self, last_index: int, last_term: int) -> bool:
        my_term, my_index = self.log.last_term, self.log.last_index
        if self.log_claim is not None:  # defend what we may have acknowledged, not just what is left
            my_index, my_term = max((my_index, my_term), self.log_claim, key=lambda c: (c[1], c[0]))
        return last_term > my_term or (last_term == my_term and last_index >= my_index)

    def _check_claim(self) -> None:
        """Leave damage recovery once the durable log is at least as up to date as the claim.

        A log whose last entry has a newer term than the claim came from a leader of that term,
        which held every entry committed before it; one of the same term and at least its
        length holds the claimed entries themselves (log matching). Only durable entries
        count: a crash loses the rest without a trace, and the claim would be gone with them.
        """
        claim = self.log_claim
        if claim is None or self.durable < self.log.first_index - 1:
            return
        index, term = self.durable, self.log.term_at(self.durable)
        if term > claim[1] or (term == claim[1] and index >= claim[0]):
            self.log_claim = None

    def _handle_vote_request(self, m: VoteRequest) -> None:
        if self.recovering or self.disk_fault:
            self._send(VoteResponse(self.term, self.id, m.src, False, m.pre_vote))
            return
        if m.pre_vote:
            can_vote = m.term > self.term or self.voted_for in (None, m.src)
            in_lease = self.leader is not None and self.election_elapsed < self.config.election_ticks
            if m.transfer:
                in_lease = False
            granted = can_vote and not in_lease and self._log_up_to_date(m.last_index, m.last_term)
            self._send(VoteResponse(m.term if granted else self.term, self.id, m.src, granted, True))
            return
        can_vote = self.voted_for == m.src or (self.voted_for is None and self.leader is None)
        if can_vote and self._log_up_to_date(m.last_index, m.last_term):
            self.voted_for = m.src
            self._hs_dirty = True
            self.election_elapsed = 0
            self._send(VoteResponse(self.term, self.id, m.src, True, False))
        else:
            self._send(VoteResponse(self.term, self.id, m.src, False, False))

    def _handle_vote_response(self, m: VoteResponse) -> None:
        if m.pre_vote:
            if self.role is not Role.PRE_CANDIDATE or (m.granted and m.term != self.term + 1):
                return
            self.votes[m.src] = m.granted
            if self._won(self.votes):
                self._become_candidate(False)
            elif self._lost(self.votes):
                self._become_follower(self.term, None)
            return
        if self.role is not Role.CANDIDATE or m.term != self.term:
            return
        self.votes[m.src] = m.granted
        if self._won(self.votes):
            self._become_leader()
        elif self._lost(self.votes):
            self._become_follower(self.term, None)

    # ------------------------------------------------------------------ follower side

    def _accept_leader(self, m: AppendRequest | InstallBase) -> None:
        self.removed_by = None  # a leader replicates to us: we are in its configuration
        if self.role is not Role.FOLLOWER or self.leader != m.src:
            self._become_follower(m.term, m.src)
        self.election_elapsed = 0
        if m.seq > self.last_seq:
            self.last_seq = m.seq

    def _match_term(self, index: int, term: int) -> bool:
        log = self.log
        if index > log.last_index or index < log.first_index - 1:
            return False
        return log.term_at(index) == term

    def _handle_append(self, m: AppendRequest) -> None:
        self._accept_leader(m)
        log = self.log
        prev_index, prev_term, entries = m.prev_index, m.prev_term, m.entries
        if prev_index < self.commit:
            # Entries up to our commit index are in every later leader's log: skip them.
            skip = self.commit - prev_index
            if skip >= len(entries):
                self.leader_match = max(self.leader_match, prev_index + len(entries))
                self._respond_success(m)
                return
            entries = entries[skip:]
            prev_index = self.commit
            prev_term = log.term_at(prev_index)
        if not self._match_term(prev_index, prev_term):
            self._reject_append(m, prev_index, prev_term)
            return
        if entries:
            self._merge_entries(entries)
        last_new = prev_index + len(entries)
        if m.commit > self.commit:
            self._commit_to(min(m.commit, last_new))
        self.leader_match = max(self.leader_match, last_new)
        self._respond_success(m)
        if self.recovering and m.term > 0 and self.commit >= m.commit:
            self.recovering = False  # a leader brought us up to its commit: votes are safe again

    def _reject_append(self, m: AppendRequest, prev_index: int, prev_term: int) -> None:
        """Our log does not hold (prev_index, prev_term): hint where the leader should back off to.

        The hint is our last index whose term is at most ``prev_term`` (fast back-tracking
        by conflict term), so the leader skips a whole divergent term per round trip.
        """
        log = self.log
        hint = min(prev_index, log.last_index)
        floor = log.first_index - 1
        while hint > floor and log.term_at(hint) > prev_term:
            hint -= 1
        hint_term = log.term_at(hint) if hint >= floor else 0
        self._send(AppendResponse(self.term, self.id, m.src, False, 0, m.prev_index, hint, hint_term, m.seq))

    def _merge_entries(self, entries: Sequence[Entry]) -> None:
        """Append what we lack; skip what we already hold; truncate at the first conflict (above commit)."""
        log = self.log
        start = 0
        last = log.last_index
        if entries[0].index <= last:
            start = len(entries)
            for i, e in enumerate(entries):
                if e.index > last:
                    start = i
                    break
                if log.term_at(e.index) != e.term:
                    self._truncate(e.index)
                    start = i
                    break
        if start < len(entries):
            new = entries[start:] if start else entries
            if any(map(_kind_of, new)):  # only the no-op and configurations are not 0
                self._append_with_configs(new)
            else:
                log.append(new)

    def _append_with_configs(self, entries: Sequence[Entry]) -> None:
        """Append, recording any configuration first (durably, ``LogView.save_config``), then take them on."""
        configs = [
            (e.index, e.term, Membership.decode(e.data), bytes(e.data))
            for e in entries
            if e.kind == KIND_CONFIG
        ]
        for index, term, _, data in configs:
            self.log.save_config(index, term, data)
        self.log.append(entries)
        for index, term, m, data in configs:
            self._config_appended(index, term, m, data)

    def _respond_success(self, m: AppendRequest) -> None:
        """Answer with the durable part of what matches; ``on_durable`` reports the rest later."""
        match = min(self.leader_match, self.durable)
        if m.entries and match < m.prev_index + len(m.entries):
            return  # the fsync that covers these entries will send the acknowledgement
        self.last_acked = max(self.last_acked, match)
        self._send(AppendResponse(self.term, self.id, m.src, True, match, seq=m.seq))

    def _ack_leader(self) -> None:
        if self.leader is None or self.role is not Role.FOLLOWER:
            return
        match = min(self.leader_match, self.durable)
        if match > self.last_acked:
            self.last_acked = match
            self._send(AppendResponse(self.term, self.id, self.leader, True, match, seq=self.last_seq))

    def _truncate(self, index: int) -> None:
        if index <= self.commit:
            raise InvariantError(
                f"{self.id}: truncation at {index} would remove committed entries (commit {self.commit})"
            )
        self.log.truncate_suffix(index)
        self.durable = min(self.durable, index - 1)
        self.leader_match = min(self.leader_match, index - 1)
        self.last_acked = min(self.last_acked, index - 1)
        if self.config_log[-1][0] >= index:  # an uncommitted configuration went: the previous one is back
            while self.config_log[-1][0] >= index:
                self.config_log.pop()
            self._apply_membership(self.config_log[-1][2])

    def _handle_install_base(self, m: InstallBase) -> None:
        self._accept_leader(m)
        # SIM-FIX (python -m ledger.sim --seed 106): a delayed or duplicated InstallBase may name a base at
        # or below our commit index (e.g. below a base installed since). That prefix is
        # committed, hence already matches the leader: resetting to it would throw away
        # acknowledged entries and leave commit beyond the end of the log.
        if m.base_index > self.commit and not self._match_term(m.base_index, m.base_term):
            if self.role is not Role.FOLLOWER:
                raise InvariantError(f"{self.id}: a {self.role.value} may not reset its log")
            base_config = self._base_config_of(m)
            self.log.reset(
                m.base_index, m.base_term, m.base_pos, (base_config[0], base_config[1], base_config[3])
            )
            self.config_log = [base_config]
            if base_config[2] != self.membership:
                self._apply_membership(base_config[2])
            self.durable = m.base_index
            self.leader_match = m.base_index
            self.last_acked = 0
            self.commit = max(self.commit, m.base_index)
            self._ready.commit_index = self.commit
        else:
            self.leader_match = max(self.leader_match, m.base_index)
        match = min(self.leader_match, self.durable)
        self.last_acked = max(self.last_acked, match)
        self._send(AppendResponse(self.term, self.id, m.src, True, match, seq=m.seq))

    def _base_config_of(self, m: InstallBase) -> ConfigAt:
        """The configuration at an installed base: the leader's, or (from an older leader that
        does not send it) the latest one we know to be committed."""
        if not m.config:
            index, term, membership, data = self.config_at(self.commit)
            return index, term, membership, data
        if m.config_index > m.base_index:
            raise MembershipError(
                f"install base at {m.base_index} carries a configuration from {m.config_index}"
            )
        return m.config_index, m.config_term, Membership.decode(m.config), bytes(m.config)

    def _commit_to(self, index: int) -> None:
        if index > self.commit:
            if index > self.log.last_index:
                raise InvariantError(f"{self.id}: commit {index} beyond the last index {self.log.last_index}")
            self.commit = index
            self._ready.commit_index = index
            if len(self.config_log) > 1:
                self._prune_configs()

    # ------------------------------------------------------------------ membership

    def _apply_membership(self, m: Membership, announce: bool = True) -> None:
        """Put configuration ``m`` in effect for everything this node decides from now on."""
        self.membership = m
        self.voters = m.voters
        self.members = list(m.ids)
        self.peers = [p for p in m.ids if p != self.id]
        self.voter_peers = [p for p in m.voters if p != self.id]
        self.is_voter = self.id in m.voters
        self.quorum = m.quorum
        self._member_ids = frozenset(m.ids)
        # Removed from the group (the configuration remembers them). A node we never heard of may
        # be a member added by a configuration we do not hold yet: its vote may be what it needs.
        self.departed = frozenset(m.removed) - {self.id}
        if self.role is Role.LEADER:
            self._sync_progress()
        if announce:
            self._ready.membership = m

    def _sync_progress(self) -> None:
        """Leader: track new members; keep sending to removed ones until they hold their removal."""
        progress = self.progress
        for p in self.peers:
            if p not in progress:
                # Probe with the newest entry (the configuration adding it), not a heartbeat: it
                # learns its configuration, or tells where its log ends, in one round trip.
                pr = progress[p] = Progress(max(1, self.log.last_index))
                pr.active = True  # a full election timeout before it is judged (as at election)
                pr.joined_at = self.log.last_index  # ... but it counts as answering only once it acks
            self.leaving.pop(p, None)
        for p in list(progress):
            if p not in self._member_ids and p not in self.leaving:
                self.leaving[p] = self.config_log[-1][0]
        if self.transfer_target is not None and self.transfer_target not in self.voters:
            self.transfer_target = None
        self._voter_progress = [progress[p] for p in self.voter_peers]
        self._targets = self.peers + list(self.leaving)
        self._append_dirty = True

    def _drop_leaving(self, peer: str) -> None:
        self.leaving_dropped += 1  # the shell hangs up on it (``contacts`` shrank)
        del self.leaving[peer]
        del self.progress[peer]
        self._targets = self.peers + list(self.leaving)

    def _config_appended(self, index: int, term: int, m: Membership, data: bytes) -> None:
        self.config_log.append((index, term, m, data))
        self._apply_membership(m)

    def _prune_configs(self) -> None:
        """Forget configurations superseded at or below the log's base (they can never come back)."""
        floor = self.log.first_index - 1
        configs = self.config_log
        while len(configs) > 1 and configs[1][0] <= floor:
            configs.pop(0)

    def config_at(self, index: int) -> ConfigAt:
        """The configuration in effect at log index ``index`` (the latest entry at or below it)."""
        for c in reversed(self.config_log):
            if c[0] <= index:
                return c
        return self.config_log[0]

    @property
    def config_index(self) -> int:
        """Index of the configuration in effect (0: the bootstrap one, from the config file)."""
        return self.config_log[-1][0]

    def _removal_pending(self) -> bool:
        """Removed by the latest configuration, which is not known committed yet.

        Such a node still stands for election (counting, like everyone, only the votes of its
        latest configuration's voters): it may hold the longest log (a leader that removed
        itself and lost leadership before the change committed), and the voters still on the
        previous configuration would then refuse everyone else forever. Once it learns the
        change committed it never campaigns again.
        """
        configs = self.config_log
        return len(configs) > 1 and configs[-1][0] > self.commit and self.id in configs[-2][2].voters

    def contacts(self) -> set[str]:
        """Whom this node must be able to talk to now: its peers, removed peers a leader still
        informs, and the leader it follows (a removed leader still leads until its removal
        commits). A node outside its configuration talks to its leader only: it answers, and
        never campaigns."""
        if self.role is Role.LEADER:
            return set(self.peers) | set(self.leaving)
        out = set(self.peers) if self.id in self._member_ids else set()
        if self.leader is not None and self.leader != self.id:
            out.add(self.leader)
        return out

    def _hand_over(self) -> None:
        """Leader: send TimeoutNow to a voter holding our whole log, if there is one."""
        best = max(self.voter_peers, key=lambda p: self.progress[p].match, default=None)
        if best is not None and self.progress[best].match >= self.log.last_index:
            self._send(TimeoutNow(self.term, self.id, best))

    def _step_down_removed(self) -> None:
        """The configuration without us committed: tell the followers, hand over, step down."""
        self._broadcast_heartbeat()  # carries the commit index, so the followers learn it now
        self._hand_over()
        self._become_follower(self.term, None)

    # ------------------------------------------------------------------ leader side

    def _tick_leader(self) -> None:
        cfg = self.config
        if cfg.learner_bytes_per_tick:
            self._refill_catchup_budgets(cfg.learner_bytes_per_tick)
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.transfer_target is not None:
            self.transfer_elapsed += 1
            if self.transfer_elapsed >= cfg.election_ticks:
                # The target did not take over in time: keep leading. A preferred leader that
                # cannot catch up would otherwise be retried at once, refusing writes for good;
                # back off exponentially (in election timeouts) before trying it again.
                if self.transfer_target == cfg.preferred_leader:
                    self.preferred_backoff = min(max(2, 2 * self.preferred_backoff), 32)
                    self.preferred_wait = self.preferred_backoff
                self.transfer_target = None
        if self.election_elapsed >= cfg.election_ticks:
            self.election_elapsed = 0
            # SIM-FIX (tests/test_raft_core.py::test_an_unreachable_preferred_leader_does_not_block_writes):
            # remember who answered during the last election timeout, for CheckQuorum and for
            # the preferred-leader transfer. The flags are now cleared even without CheckQuorum,
            # so "active" always means "answered within the last election timeout".
            recently_active = {p for p, pr in self.progress.items() if pr.active}
            for pr in self.progress.values():
                pr.was_active = pr.active
                pr.active = False
            if cfg.check_quorum:
                active_voters = sum(1 for p in self.voter_peers if p in recently_active) + self.is_voter
                if active_voters < self.quorum:
                    self._become_follower(self.term, None)
                    return
            if self.leaving:
                # A removed peer that stayed silent a whole election timeout after its removal
                # committed is gone (shut down, or unreachable): stop sending to it.
                for p, index in list(self.leaving.items()):
                    if index <= self.commit and p not in recently_active:
                        self._drop_leaving(p)
            self._maybe_transfer_to_preferred(recently_active)
        if self.heartbeat_elapsed >= cfg.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            self._broadcast_heartbeat()

    def _maybe_transfer_to_preferred(self, recently_active: set[str]) -> None:
        pref = self.config.preferred_leader
        if (
            not pref
            or pref == self.id
            or pref not in self.progress
            or pref not in self.voters
            or self.transfer_target is not None
        ):
            return
        if self.preferred_wait > 0:
            self.preferred_wait -= 1
            return
        if pref not in recently_active:
            # SIM-FIX: a silent preferred leader keeps its old REPLICATE progress; transferring to
            # it blocked proposals for a whole election timeout, retried at every timeout (in
            # the very tick the previous attempt expired), i.e. writes stopped while it was down.
            return
        if self.commit < self.noop_index:
            return
        pr = self.progress[pref]
        if pr.state == REPLICATE and self.log.last_index - pr.match < 1024:
            self.transfer_leadership(pref)

    def _broadcast_heartbeat(self) -> None:
        for peer in self._targets:
            pr = self.progress[peer]
            pr.probe_sent = False
            prev = pr.next - 1
            if prev < self.log.first_index - 1:
                self._send_install_base(peer, pr)
                continue
            self._send(
                AppendRequest(
                    self.term, self.id, peer, prev, self.log.term_at(prev), self.commit, [], self.read_seq
                )
            )
        self._append_dirty = True

    def _send_install_base(self, peer: str, pr: Progress) -> None:
        log = self.log
        base = log.first_index - 1
        first = log.entries(log.first_index, log.first_index)
        base_pos = first[0].pos if first else -1
        if base_pos < 0:
            return
        # SIM-FIX (python -m ledger.sim --seed 23): a follower in REPLICATE keeps a ``next`` below the
        # base, and a successful answer in REPLICATE never raises ``next``, so the leader sent
        # InstallBase forever and never an entry. Probing makes the answer set next = base + 1.
        pr.become_probe()
        pr.probe_sent = True
        cindex, cterm, _, cdata = self.config_at(base)
        self._send(
            InstallBase(
                self.term,
                self.id,
                peer,
                base,
                log.term_at(base),
                base_pos,
                self.read_seq,
                cindex,
                cterm,
                cdata,
            )
        )

    def _refill_catchup_budgets(self, per_tick: int) -> None:
        """Leader, each tick: every throttled peer may be sent ``per_tick`` more bytes, plus what
        the log grew by since the last tick: the throttle bounds how fast a learner takes the
        backlog, and a learner whose leader takes more than ``per_tick`` from its clients still
        catches up. What it overdrew (at least one entry goes per batch) is paid back first; an
        unused tick is not saved."""
        pos = self.log.next_pos()
        refill = per_tick + max(0, pos - self._catchup_pos)
        self._catchup_pos = pos
        for peer in self._targets:
            if peer not in self.voters:
                pr = self.progress[peer]
                pr.budget = min(pr.budget + refill, refill)
                if pr.next <= self.log.last_index:
                    self._append_dirty = True

    def _send_appends(self, peer: str) -> None:
        """Send as much as the follower's window allows: one probe, or a pipeline of batches
        (for a learner, of its backlog no more bytes than its catch-up budget left this tick)."""
        pr = self.progress[peer]
        log = self.log
        last = log.last_index
        throttled = self.config.learner_bytes_per_tick > 0 and peer not in self.voters
        while pr.next <= last:
            if pr.state == PROBE:
                if pr.probe_sent:
                    return
            elif len(pr.inflight) >= self.config.max_inflight:
                return
            if pr.next < log.first_index:
                self._send_install_base(peer, pr)
                return
            # The backlog is metered; the last max_promote_lag entries are not, so a learner near
            # the end is kept there, promotable, however fast the log grows.
            metered = throttled and last - pr.next >= self.config.max_promote_lag
            if metered:
                if pr.budget <= 0:
                    return
                max_bytes = min(self.config.max_append_bytes, pr.budget)
            else:
                max_bytes = self.config.max_append_bytes
            prev = pr.next - 1
            entries = log.entries(pr.next, last, max_bytes)
            if metered:
                pr.budget -= sum(map(len, map(_data_of, entries))) + ENTRY_HEADER_BYTES * len(entries)
            self._send(
                AppendRequest(
                    self.term, self.id, peer, prev, log.term_at(prev), self.commit, entries, self.read_seq
                )
            )
            if pr.state == PROBE:
                pr.probe_sent = True
                return
            pr.next = entries[-1].index + 1
            pr.inflight.append(entries[-1].index)

    def _handle_append_response(self, m: AppendResponse) -> None:
        pr = self.progress.get(m.src)
        if pr is None:
            return
        pr.active = True
        if pr.acked_seq < m.seq <= self.read_seq:  # a seq this leader never sent proves nothing
            pr.acked_seq = m.seq
            if self.pending_reads:
                self._release_reads()
        if not m.success:
            if m.reject_index == 0:
                return
            if pr.state == PROBE and m.reject_index != pr.next - 1:
                return  # answer to an older probe
            if m.reject_index <= pr.match:
                if m.hint_index >= pr.match:
                    return  # stale rejection of something already acknowledged
                # The follower's log ends below what it acknowledged: it lost data (a truncated
                # or emptied segment, a wiped disk). Forget its match and repair it from its
                # hint; its next success re-establishes the match. (A delayed, stale rejection
                # lands here too: that only costs a probe, since match never counted twice.)
                pr.match = 0
                pr.next = max(1, min(m.hint_index + 1, m.reject_index))
                pr.become_probe()
                self._append_dirty = True
                return
            idx = min(m.hint_index, self.log.last_index)
            floor = self.log.first_index - 1
            while idx > floor and self.log.term_at(idx) > m.hint_term:
                idx -= 1
            pr.next = max(pr.match + 1, min(idx + 1, m.reject_index))
            pr.become_probe()
            self._append_dirty = True
            return
        advanced = m.match_index > pr.match
        if advanced:
            pr.match = m.match_index
            self._maybe_commit()
            leaving = self.leaving
            if leaving and m.src in leaving and pr.match >= leaving[m.src]:
                self._drop_leaving(m.src)  # it holds its removal: it knows it is out
                return
        if pr.state == PROBE:
            # SIM-FIX (python -m ledger.sim --seed 4225): only an acknowledgement that raises the
            # match proves anything new about the follower's log (etcd's MaybeUpdate). A late or
            # duplicated success from an abandoned pipeline used to flip PROBE to REPLICATE and
            # release a whole window again; on a network that reorders, the window's own
            # out-of-order rejections flipped it back, and every stale answer restarted the
            # cycle: 2595 stale successes in PROBE, 120k messages, a follower that never caught up.
            # The answer to a probe that carries entries does raise the match (a follower
            # acknowledges only once they are durable, ``_respond_success``); an empty one at
            # next - 1 == match has nothing new to prove, and the next entry-carrying probe does.
            if not advanced:
                return
            pr.next = max(pr.next, pr.match + 1)
            pr.become_replicate()
        else:
            inflight = pr.inflight
            while inflight and inflight[0] <= pr.match:
                inflight.popleft()
        pr.probe_sent = False
        self._append_dirty = True
        if self.transfer_target == m.src:
            self._maybe_send_timeout_now()

    def _maybe_send_timeout_now(self) -> None:
        target = self.transfer_target
        if target is None or self.timeout_now_sent or target not in self.progress:
            return
        if self.progress[target].match >= self.log.last_index:
            self.timeout_now_sent = True
            self._send(TimeoutNow(self.term, self.id, target))

    def _maybe_commit(self) -> None:
        matches = [pr.match for pr in self._voter_progress]
        if self.is_voter:  # a leader removing itself does not count itself (thesis 4.2.2)
            matches.append(self.durable)
        matches.sort(reverse=True)
        candidate = matches[self.quorum - 1]
        if self.durable > self.log.last_index:
            raise InvariantError(f"{self.id}: durable {self.durable} beyond the log's end")
        if candidate > self.commit and self.log.term_at(candidate) == self.term:
            self._commit_to(candidate)
            if not self.is_voter and self.commit >= self.config_log[-1][0]:
                self._leave_pending = True  # our removal committed: hand over in ready()
                self._append_dirty = True
            if not self.leader_ready_sent and self.commit >= self.noop_index:
                self.leader_ready_sent = True
                self._ready.leader_ready = self.term
                if self.reads_before_noop:
                    waiting, self.reads_before_noop = self.reads_before_noop, []
                    for ctx in waiting:
                        self._register_read(ctx)

    def _register_read(self, ctx: Any) -> None:
        if self.is_voter and not self.voter_peers:
            self._ready.read_states.append((ctx, self.commit))
            return
        self._read_round_needed = True
        self.pending_reads.append((self.read_seq + 1, ctx, self.commit))

    def _release_reads(self) -> None:
        seqs = [pr.acked_seq for pr in self._voter_progress]
        if self.is_voter:
            seqs.append(self.read_seq)
        seqs.sort(reverse=True)
        confirmed = seqs[self.quorum - 1]
        reads = self.pending_reads
        while reads and reads[0][0] <= confirmed:
            _, ctx, index = reads.popleft()
            self._ready.read_states.append((ctx, index))

    def _send(self, m: Message) -> None:
        self._ready.messages.append(m)

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role.value,
            "term": self.term,
            "leader": self.leader,
            "commit_index": self.commit,
            "last_index": self.log.last_index,
            "first_index": self.log.first_index,
            "durable_index": self.durable,
            "voted_for": self.voted_for,
            "recovering": self.recovering,
            "log_claim": self.log_claim,
            "disk_fault": self.disk_fault,
            "voter": self.is_voter,
            "removed_by": self.removed_by,
            "membership": self.membership_status(),
        }

    def membership_status(self) -> dict[str, Any]:
        """The configuration in effect (JSON-friendly), and on a leader each member's progress."""
        index, term, m, _ = self.config_log[-1]
        doc: dict[str, Any] = {
            "index": index,
            "term": term,
            "committed": index <= self.commit,
            **m.to_json(),
        }
        if self.role is Role.LEADER:
            last = self.log.last_index
            doc["progress"] = {
                p: {
                    "match": pr.match,
                    "lag": last - pr.match,
                    "active": pr.active or pr.was_active,
                    "state": "replicate" if pr.state == REPLICATE else "probe",
                    "leaving": p in self.leaving,
                }
                for p, pr in self.progress.items()
            }
        return doc
