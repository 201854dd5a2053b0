"""Membership changes in the Raft core, each rule in the smallest scenario that shows it.

The simulator (tests/test_raft_sim.py, ``membership="always"``) drives random changes under
faults; these tests pin the rules one by one: configurations in effect on append and
reverted by truncation, one change at a time after the leader's own entry committed,
learners outside every quorum, catch-up before promotion, the reachable-majority check, a
removed leader handing over once its removal commits, removed nodes ignored, and the
configuration carried by InstallBase and kept across restarts.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest

from ledger.codec import KIND_CONFIG, Entry
from ledger.membership import (
    ADD,
    MAX_REMOVED,
    PROMOTE,
    REMOVE,
    Membership,
    MembershipChange,
    MembershipError,
)
from ledger.memlog import MemoryLog
from ledger.messages import (
    AppendRequest,
    AppendResponse,
    InstallBase,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    decode_message,
    encode_message,
)
from ledger.raft import NotLeader, RaftConfig, RaftCore, Role

E = 8  # election ticks


def group(*voters: str, learners: Iterable[str] = ()) -> Membership:
    return Membership({v: f"{v}:1" for v in voters}, {v: f"{v}:1" for v in learners})


class Net:
    """Cores wired together in memory: every message is delivered, every write durable at once.

    ``down`` nodes receive nothing; ``cut`` holds directed links that drop everything.
    """

    def __init__(self, bootstrap: Membership, **cfg: object) -> None:
        self.cfg = cfg
        self.cores: dict[str, RaftCore] = {}
        self.down: set[str] = set()
        self.cut: set[tuple[str, str]] = set()
        self.sent: list[Message] = []
        for nid in bootstrap.ids:
            self.add(nid, bootstrap)

    def add(self, nid: str, bootstrap: Membership, log: MemoryLog | None = None) -> RaftCore:
        core = RaftCore(
            nid,
            bootstrap,
            log if log is not None else MemoryLog(),
            config=RaftConfig(election_ticks=E, **self.cfg),  # type: ignore[arg-type]
            rng=random.Random(len(self.cores)),
        )
        self.cores[nid] = core
        return core

    def __getitem__(self, nid: str) -> RaftCore:
        return self.cores[nid]

    def run(self, limit: int = 200) -> None:
        """Deliver until nothing is left to say."""
        for _ in range(limit):
            moved = False
            for nid, core in self.cores.items():
                if nid in self.down:
                    continue
                rd = core.ready()
                core.on_durable(core.log.sync())
                rd2 = core.ready()
                for m in rd.messages + rd2.messages:
                    moved = True
                    self.sent.append(m)
                    if m.dst in self.cores and m.dst not in self.down and (m.src, m.dst) not in self.cut:
                        self.cores[m.dst].step(decode_message(encode_message(m)))
            if not moved:
                return
        raise AssertionError("the cores kept talking")

    def tick(self, times: int = 1) -> None:
        for _ in range(times):
            for nid, core in self.cores.items():
                if nid not in self.down:
                    core.tick()
            self.run()

    def elect(self, nid: str) -> RaftCore:
        core = self.cores[nid]
        core.campaign()
        self.run()
        assert core.role is Role.LEADER
        return core

    def change(self, leader: str, op: str, node: str, address: str = "") -> int:
        index, _ = self.cores[leader].propose_membership(MembershipChange(op, node, address))
        self.run()
        return index

    def propose(self, leader: str, *payloads: bytes) -> int:
        first, _ = self.cores[leader].propose(list(payloads))
        self.run()
        return first + len(payloads) - 1


# ---------------------------------------------------------------------- the configuration itself


def test_a_configuration_round_trips_and_keeps_its_order() -> None:
    m = Membership({"b": "h2:2", "a": "h1:1"}, {"c": "h3:3"}, removed=["x"])
    back = Membership.decode(m.encode())
    assert back == m and list(back.voters) == ["b", "a"] and back.removed == ("x",)
    assert Membership.from_json(m.to_json()) == m
    assert m.quorum == 2 and m.ids == ("b", "a", "c") and m.address("c") == "h3:3"


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (b"not json", "unreadable"),
        (b"[]", "JSON object"),
        (b'{"voters": [["a", "h:1"], ["a", "h:2"]]}', "listed twice"),
        (b'{"voters": [["a", "h:1"]], "learners": [["a", "h:2"]]}', "both voter and learner"),
        (b'{"voters": [["a=b", "h:1"]]}', "must not contain"),
        (b'{"voters": [["", "h:1"]]}', "non-empty"),
        (b'{"voters": [["a", 7]]}', "address"),
        (b'{"voters": "a"}', "list of [id, address]"),
        (b'{"voters": [], "removed": "a"}', "removed"),
        (b"x" * (70 << 10), "exceeds"),
    ],
)
def test_a_malformed_configuration_is_refused_with_a_reason(payload: bytes, words: str) -> None:
    with pytest.raises(MembershipError) as info:
        Membership.decode(payload)
    assert words in str(info.value)


def test_changes_apply_one_server_at_a_time_and_refuse_what_does_not_fit() -> None:
    m = group("a", "b", "c")
    m = MembershipChange(ADD, "d", "d:1").apply(m)
    assert list(m.learners) == ["d"] and m.quorum == 2
    with pytest.raises(MembershipError, match="already a learner"):
        MembershipChange(ADD, "d", "d:9").apply(m)
    with pytest.raises(MembershipError, match="already belongs to member 'a'"):
        MembershipChange(ADD, "e", "a:1").apply(m)
    with pytest.raises(MembershipError, match="not a learner"):
        MembershipChange(PROMOTE, "zz").apply(m)
    m = MembershipChange(PROMOTE, "d").apply(m)
    assert list(m.voters) == ["a", "b", "c", "d"] and m.quorum == 3
    m = MembershipChange(REMOVE, "a").apply(m)
    assert list(m.voters) == ["b", "c", "d"] and m.removed == ("a",)
    with pytest.raises(MembershipError, match="not a member"):
        MembershipChange(REMOVE, "a").apply(m)
    back = MembershipChange(ADD, "a", "a:2").apply(m)
    assert back.removed == () and back.learners == {"a": "a:2"}  # added back: no longer removed
    with pytest.raises(MembershipError, match="last voter"):
        MembershipChange(REMOVE, "x").apply(group("x"))
    with pytest.raises(MembershipError, match="needs its address"):
        MembershipChange(ADD, "e")
    with pytest.raises(MembershipError, match="unknown membership change"):
        MembershipChange("demote", "a")


def test_a_configuration_remembers_a_bounded_number_of_removed_ids() -> None:
    m = Membership({"a": "a:1"}, removed=[f"x{i}" for i in range(MAX_REMOVED + 10)])
    assert len(m.removed) == MAX_REMOVED and m.removed[-1] == f"x{MAX_REMOVED + 9}"


# ---------------------------------------------------------------------- proposing changes


def test_a_leader_changes_nothing_before_an_entry_of_its_term_is_committed() -> None:
    """Ongaro's fix: a new leader may hold an uncommitted configuration of an older term."""
    net = Net(group("n1", "n2", "n3"))
    net.down = {"n2", "n3"}
    leader = net["n1"]
    leader.term = 1
    leader.campaign()
    for p in ("n2", "n3"):  # votes arrive, but nothing the leader sends gets through
        leader.step(VoteResponse(2, p, "n1", True, True))
        leader.step(VoteResponse(2, p, "n1", True, False))
    assert leader.role is Role.LEADER and leader.commit < leader.noop_index
    with pytest.raises(MembershipError) as info:
        leader.propose_membership(MembershipChange(ADD, "n4", "n4:1"))
    assert info.value.retryable and "not committed an entry of its term" in str(info.value)


def test_one_change_at_a_time() -> None:
    net = Net(group("n1", "n2", "n3"))
    net.elect("n1")
    net.cut = {("n1", "n2"), ("n1", "n3")}  # the first change cannot commit
    net["n1"].propose_membership(MembershipChange(ADD, "n4", "n4:1"))
    with pytest.raises(MembershipError) as info:
        net["n1"].propose_membership(MembershipChange(ADD, "n5", "n5:1"))
    assert info.value.retryable and "one change at a time" in str(info.value)
    net.cut = set()
    net.tick()  # the heartbeat carries the entry; it commits
    assert net["n1"].commit >= net["n1"].config_index
    net["n1"].propose_membership(MembershipChange(ADD, "n5", "n5:1"))  # now it may


def test_not_leader_and_unknown_transfer_targets_are_refused() -> None:
    net = Net(group("n1", "n2", "n3", learners=["n4"]))
    net.add("n4", group("n1", "n2", "n3", learners=["n4"]))
    net.elect("n1")
    with pytest.raises(NotLeader):
        net["n2"].propose_membership(MembershipChange(REMOVE, "n3"))
    with pytest.raises(ValueError, match="a learner"):
        net["n1"].transfer_leadership("n4")


# ---------------------------------------------------------------------- learners


def test_a_learner_receives_the_log_but_neither_votes_in_counts_nor_campaigns() -> None:
    net = Net(group("n1", "n2", "n3"))
    leader = net.elect("n1")
    index = net.propose(leader.id, b"a", b"b")
    net.add("n4", group("n1", "n2", "n3"))  # joins outside the group, knowing its configuration
    net.change("n1", ADD, "n4", "n4:1")
    net.tick(2)
    learner = net["n4"]
    assert learner.log.last_index == leader.log.last_index and learner.commit == leader.commit
    assert not learner.is_voter and learner.membership.learners == {"n4": "n4:1"}

    # With both other voters gone the learner's acknowledgement does not commit anything.
    net.down = {"n2", "n3"}
    top = leader.propose([b"only the learner has this"])[0]
    net.run()
    assert learner.log.last_index == top and leader.commit < top > index

    # It never campaigns, however long it hears nothing.
    net.down = {"n1", "n2", "n3"}
    before = len(net.sent)
    net.tick(10 * E)
    assert not [m for m in net.sent[before:] if isinstance(m, VoteRequest) and m.src == "n4"]
    assert learner.role is Role.FOLLOWER and learner.leader is None  # the lease lapsed: it votes again


def test_a_learner_is_promoted_only_once_caught_up() -> None:
    net = Net(group("n1", "n2", "n3"), max_promote_lag=5)
    leader = net.elect("n1")
    for i in range(20):
        leader.propose([b"x%d" % i])
    net.run()
    net.add("n4", group("n1", "n2", "n3"))
    net.cut = {("n1", "n4")}  # it is added but hears nothing yet
    net.change("n1", ADD, "n4", "n4:1")
    with pytest.raises(MembershipError) as info:
        leader.propose_membership(MembershipChange(PROMOTE, "n4"))
    assert info.value.retryable and "has not caught up" in str(info.value)
    net.cut = set()
    net.tick(2)
    index = net.change("n1", PROMOTE, "n4")
    assert leader.commit >= index and net["n4"].is_voter and leader.quorum == 3


def test_a_learner_that_never_answered_is_not_promoted_however_short_the_log() -> None:
    """A new member's progress starts active (a grace period before it is judged), and with a
    log shorter than max_promote_lag it looked caught up: a learner whose process had not even
    started was promoted, and the group lost its majority. It must hold its own addition first."""
    net = Net(group("n1", "n2", "n3"))
    leader = net.elect("n1")
    net.propose("n1", b"a few entries")
    net.change("n1", ADD, "ghost", "nowhere:1")  # never answers
    with pytest.raises(MembershipError) as info:
        leader.propose_membership(MembershipChange(PROMOTE, "ghost"))
    assert info.value.retryable and "has not answered" in str(info.value)
    net.add("n4", group("n1", "n2", "n3"))
    net.cut = {("n1", "n4")}
    net.change("n1", ADD, "n4", "n4:1")
    with pytest.raises(MembershipError):
        leader.propose_membership(MembershipChange(PROMOTE, "n4"))
    net.cut = set()
    net.tick(2)
    index = net.change("n1", PROMOTE, "n4")  # now it holds the log: promoted
    assert leader.commit >= index and net["n4"].is_voter


def test_adding_an_unreachable_node_never_blocks_the_group() -> None:
    net = Net(group("n1", "n2", "n3"))
    leader = net.elect("n1")
    index = net.change("n1", ADD, "ghost", "nowhere:1")  # no such node answers
    assert leader.commit >= index
    top = net.propose("n1", b"still writing")
    assert leader.commit >= top


# ---------------------------------------------------------------------- in effect on append, reverted by truncation


def test_a_configuration_is_in_effect_on_append_and_reverted_by_truncation() -> None:
    follower = RaftCore("n2", group("n1", "n2", "n3"), MemoryLog(), config=RaftConfig(election_ticks=E))
    with_n4 = group("n1", "n2", "n3", learners=["n4"])
    noop = Entry(1, 1, b"")
    # The leader of term 1 sends a change; it is in effect here at once, committed or not.
    follower.step(AppendRequest(1, "n1", "n2", 0, 0, 0, [noop, Entry(2, 1, with_n4.encode(), KIND_CONFIG)]))
    rd = follower.ready()
    assert follower.membership == with_n4 and rd.membership == with_n4 and follower.commit == 0
    assert "n4" in follower.peers and follower.is_voter
    # The leader of term 2 never had it: its entry at index 2 replaces the change, which goes.
    follower.step(AppendRequest(2, "n3", "n2", 1, 1, 1, [Entry(2, 2, b"other")]))
    rd = follower.ready()
    assert follower.log.term_at(2) == 2 and follower.config_index == 0
    assert follower.membership == group("n1", "n2", "n3") and rd.membership == follower.membership
    assert "n4" not in follower.peers


# ---------------------------------------------------------------------- removal


def test_removing_a_voter_refused_when_the_rest_that_answer_are_no_majority() -> None:
    net = Net(group("n1", "n2", "n3"))
    leader = net.elect("n1")
    net.down = {"n3"}
    for _ in range(2 * E + 1):  # n3 stays silent for whole election timeouts
        net.tick()
    with pytest.raises(MembershipError) as info:
        leader.propose_membership(MembershipChange(REMOVE, "n2"))
    assert not info.value.retryable and "only 1 answered lately" in str(info.value)
    index = net.change("n1", REMOVE, "n3")  # removing the silent one is fine
    assert leader.commit >= index and leader.quorum == 2


def test_a_removed_leader_steps_down_once_the_change_commits_and_hands_over() -> None:
    net = Net(group("n1", "n2", "n3"))
    leader = net.elect("n1")
    net.tick()
    index, _ = leader.propose_membership(MembershipChange(REMOVE, "n1"))
    assert leader.role is Role.LEADER and not leader.is_voter  # still leads until it commits
    net.run()
    assert leader.role is Role.FOLLOWER and leader.commit >= index
    assert any(isinstance(m, TimeoutNow) and m.src == "n1" for m in net.sent)
    new = next(c for c in (net["n2"], net["n3"]) if c.role is Role.LEADER)
    assert new.term > leader.term - 1
    assert new.membership.voters.keys() == {"n2", "n3"} and new.membership.removed == ("n1",)
    # It never campaigns again.
    before = len(net.sent)
    net.down = {new.id}
    net.tick(5 * E)
    assert not [m for m in net.sent[before:] if isinstance(m, VoteRequest) and m.src == "n1"]


def test_a_removed_node_is_ignored_and_told_it_is_out() -> None:
    net = Net(group("n1", "n2", "n3"))
    leader = net.elect("n1")
    net.tick()
    index = net.change("n1", REMOVE, "n3")
    removed = net["n3"]
    assert removed.config_index == index and not removed.is_voter  # the leader sent it its removal
    assert "n3" not in leader.progress and not leader.leaving
    # Its vote requests (whatever their term) move nobody's term: a member holding the committed
    # removal answers only that it was removed (granting nothing), at its own term.
    net.tick(3)  # the followers learn the removal committed
    assert net["n2"].commit >= index
    for member in (net["n1"], net["n2"]):
        term = member.term
        member.step(VoteRequest(term + 5, "n3", member.id, 10**6, 10**6))
        rd = member.ready()
        assert member.term == term
        assert [(type(m), m.granted, m.removed, m.term) for m in rd.messages] == [
            (VoteResponse, False, True, term)
        ]


def test_a_node_removed_while_it_was_down_is_told_so_and_stops_campaigning() -> None:
    net = Net(group("n1", "n2", "n3"))
    leader = net.elect("n1")
    net.tick()
    net.down = {"n3"}
    index = net.change("n1", REMOVE, "n3")
    net.tick(2 * E + 1)  # committed, and the leader stopped sending to the silent n3
    assert leader.commit >= index and "n3" not in leader.progress and not leader.leaving
    removed = net["n3"]
    assert removed.is_voter and removed.config_index == 0  # back up on its old configuration
    term = leader.term
    net.down = set()
    before = len(net.sent)
    net.tick(4 * E)
    asks = [m for m in net.sent[before:] if isinstance(m, VoteRequest) and m.src == "n3"]
    told = [m for m in net.sent[before:] if isinstance(m, VoteResponse) and m.dst == "n3"]
    assert asks and all(m.pre_vote for m in asks)  # asked once (a pre-vote) ...
    assert told and all(m.removed and not m.granted for m in told)  # ... and was told it is out
    assert removed.removed_by in ("n1", "n2") and removed.status()["removed_by"] == removed.removed_by
    assert removed.role is Role.FOLLOWER
    last_ask = max(net.sent.index(m) for m in asks)
    assert last_ask < net.sent.index(told[0]) + len(asks) + 2  # no campaign after the answer
    before = len(net.sent)
    net.tick(6 * E)
    assert not [m for m in net.sent[before:] if isinstance(m, VoteRequest) and m.src == "n3"]
    assert leader.role is Role.LEADER and leader.term == term  # the group was never disturbed
    # Added back under the same id: the leader replicates to it, and it is a member again.
    net.change("n1", ADD, "n3", "n3:1")
    net.tick(2)
    assert removed.removed_by is None and removed.membership.learners.keys() == {"n3"}


def test_a_removal_not_committed_at_the_member_asked_is_not_told() -> None:
    """A removal a member holds but has not seen committed may still be truncated away: the
    node would then be a voter that never stands, so nothing is said."""
    net = Net(group("n1", "n2", "n3"))
    leader = net.elect("n1")
    net.tick()
    net.down = {"n2", "n3"}
    leader.propose_membership(MembershipChange(REMOVE, "n3"))
    net.run()
    assert "n3" in leader.departed and leader.commit < leader.config_index
    leader.step(VoteRequest(leader.term + 1, "n3", "n1", 10**6, 10**6, True))
    assert not leader.ready().messages


def test_a_node_removed_by_an_uncommitted_change_still_stands_for_election() -> None:
    """A leader that removed itself and lost leadership before the change committed may hold the
    longest log; the voters still on the old configuration refuse everyone else, so it must stand
    (pre-vote first, even with pre-vote off) and be elected by the new configuration's voters."""
    net = Net(group("n1", "n2"), pre_vote=False)
    old = net.elect("n1")
    net.tick()
    net.cut = {("n1", "n2")}
    index, _ = old.propose_membership(MembershipChange(REMOVE, "n1"))
    net.run()
    # n1 loses its leadership (CheckQuorum) without n2 ever holding the change.
    net.tick(2 * E + 1)
    assert old.role is Role.FOLLOWER and net["n2"].config_index == 0
    net.cut = set()
    before = len(net.sent)
    for _ in range(20 * E):
        net.tick()
        if any(c.role is Role.LEADER for c in net.cores.values()) and net["n2"].commit >= index:
            break
    pre = [m for m in net.sent[before:] if isinstance(m, VoteRequest) and m.src == "n1"]
    assert pre and pre[0].pre_vote
    # The change committed (through n1's leadership or n2's), and n2 is the one voter left.
    assert net["n2"].commit >= index and net["n2"].membership.voters.keys() == {"n2"}
    net.tick(3 * E)
    assert net["n2"].role is Role.LEADER and old.role is Role.FOLLOWER


def test_the_leader_keeps_a_removed_follower_informed_until_it_holds_its_removal() -> None:
    net = Net(group("n1", "n2", "n3"))
    leader = net.elect("n1")
    net.tick()
    net.cut = {("n1", "n3")}
    index = net.change("n1", REMOVE, "n3")
    assert leader.commit >= index and leader.leaving == {"n3": index}  # committed, n3 still uninformed
    net.cut = set()
    net.tick()
    assert not leader.leaving and net["n3"].config_index == index


def test_a_silent_removed_follower_is_dropped_after_an_election_timeout() -> None:
    net = Net(group("n1", "n2", "n3"))
    leader = net.elect("n1")
    net.tick()
    net.down = {"n3"}
    index = net.change("n1", REMOVE, "n3")
    assert leader.commit >= index and "n3" in leader.leaving
    net.tick(2 * E + 1)
    assert not leader.leaving and "n3" not in leader.progress


# ---------------------------------------------------------------------- votes


def test_a_candidate_counts_only_the_votes_of_its_voters() -> None:
    net = Net(group("n1", "n2", "n3", learners=["n4"]))
    cand = net["n1"]
    cand.campaign()
    cand.ready()
    for p in ("n4", "zz"):  # a learner and a stranger grant: no quorum yet
        cand.step(VoteResponse(cand.term + 1, p, "n1", True, True))
    assert cand.role is Role.PRE_CANDIDATE
    cand.step(VoteResponse(cand.term + 1, "n2", "n1", True, True))
    assert cand.role is Role.CANDIDATE


def test_a_lagging_member_answers_a_candidate_it_never_heard_of() -> None:
    """A voter added by a configuration a member does not hold yet may need that member's vote."""
    lagging = RaftCore("n3", group("n1", "n2", "n3"), MemoryLog(), config=RaftConfig(election_ticks=E))
    lagging.step(VoteRequest(1, "n9", "n3", 5, 1))
    (resp,) = [m for m in lagging.ready().messages if isinstance(m, VoteResponse)]
    assert resp.granted and resp.dst == "n9"


# ---------------------------------------------------------------------- persistence and InstallBase


def test_the_configuration_from_the_log_wins_over_the_config_file_after_a_restart() -> None:
    net = Net(group("n1", "n2", "n3"))
    net.elect("n1")
    net.change("n1", ADD, "n4", "n4:1")
    log = net["n2"].log
    again = RaftCore("n2", group("n1", "n2", "n3"), log, config=RaftConfig(election_ticks=E))
    assert again.membership == net["n1"].membership and again.config_index == net["n1"].config_index
    # A crash that loses the (unsynced) configuration entry falls back to the previous one.
    fresh = MemoryLog()
    fresh.append(log.entries(1, log.last_index))
    fresh.sync()
    fresh.append([Entry(fresh.last_index + 1, 9, Membership({"z": "z:1"}).encode(), KIND_CONFIG)])
    fresh.crash()
    again = RaftCore("n2", group("n1", "n2", "n3"), fresh, config=RaftConfig(election_ticks=E))
    assert again.membership == net["n1"].membership


def test_install_base_carries_the_configuration_at_the_base() -> None:
    net = Net(group("n1", "n2", "n3"))
    leader = net.elect("n1")
    net.change("n1", ADD, "n4", "n4:1")
    for i in range(10):
        leader.propose([b"x%d" % i])
    net.run()
    leader.log.compact(leader.log.last_index)  # retention: n5 can only get the base
    joiner = net.add("n5", Membership({}))
    net.change("n1", ADD, "n5", "n5:1")
    net.tick(2)
    assert any(isinstance(m, InstallBase) and m.dst == "n5" and m.config for m in net.sent)
    assert joiner.membership == leader.membership and joiner.log.first_index == leader.log.first_index
    assert joiner.log.base_config is not None  # kept with the base: a restart still knows it
    again = RaftCore("n5", Membership({}), joiner.log, config=RaftConfig(election_ticks=E))
    assert again.membership == leader.membership


def test_install_base_from_an_older_node_without_a_configuration_still_installs() -> None:
    core = RaftCore("n2", group("n1", "n2", "n3"), MemoryLog(), config=RaftConfig(election_ticks=E))
    core.step(InstallBase(1, "n1", "n2", 50, 1, 5000))
    rd = core.ready()
    assert core.log.first_index == 51 and core.membership == group("n1", "n2", "n3")
    assert [m for m in rd.messages if isinstance(m, AppendResponse) and m.success]


def test_install_base_wire_format_stays_readable_both_ways() -> None:
    old = InstallBase(3, "n1", "n2", 50, 2, 999, 7)
    assert decode_message(encode_message(old)) == old
    new = InstallBase(3, "n1", "n2", 50, 2, 999, 7, 40, 2, group("n1").encode())
    assert decode_message(encode_message(new)) == new
    body = encode_message(new)
    legacy = decode_message(body[: len(encode_message(old))])  # what an older sender produces
    assert legacy.config == b"" and legacy.base_index == 50


def test_appends_carry_configurations_to_followers_in_one_batch() -> None:
    core = RaftCore("n2", group("n1", "n2", "n3"), MemoryLog(), config=RaftConfig(election_ticks=E))
    m1 = group("n1", "n2", "n3", learners=["n4"])
    m2 = group("n1", "n2", "n3", "n4")
    entries = [
        Entry(1, 1, b""),
        Entry(2, 1, m1.encode(), KIND_CONFIG),
        Entry(3, 1, b"x"),
        Entry(4, 1, m2.encode(), KIND_CONFIG),
    ]
    core.step(AppendRequest(1, "n1", "n2", 0, 0, 0, entries))
    rd = core.ready()
    assert core.membership == m2 and core.config_index == 4 and rd.membership == m2
    assert [c[0] for c in core.config_log] == [0, 2, 4]
    assert core.config_at(3)[2] == m1


# ---------------------------------------------------------------------- the learner's catch-up throttle


def test_a_learners_catch_up_is_throttled_per_tick_and_the_voters_are_not() -> None:
    """With ``learner_bytes_per_tick`` a learner is sent at most one tick's bytes (plus the one
    entry that overdraws it) per tick, however far behind; a lagging voter gets its whole window."""
    size = 1000 + 44  # a 1000-byte entry with its header
    net = Net(group("n1", "n2", "n3"), learner_bytes_per_tick=5 * size, max_promote_lag=5)
    leader = net.elect("n1")
    net.down = {"n3"}
    for i in range(100):
        leader.propose([b"%04d" % i + b"x" * 996])
    net.run()
    net.tick()  # the log's growth is given once, at the next tick: this backlog is before it
    net.add("n4", group("n1", "n2", "n3"))
    net.change("n1", ADD, "n4", "n4:1")
    learner, voter = net["n4"], net["n3"]
    net.down = set()
    held = []
    for _ in range(6):
        net.tick()
        held.append(learner.log.last_index)
    steps = [b - a for a, b in zip(held, held[1:], strict=False)]
    assert steps and all(1 <= s <= 6 for s in steps), held  # a tick's budget, never the window
    assert voter.log.last_index == leader.log.last_index  # the voter caught up at once
    net.tick(40)
    assert learner.log.last_index == leader.log.last_index  # and the learner gets there too
    assert [e.data for e in learner.log.entries(1, learner.log.last_index)] == [
        e.data for e in leader.log.entries(1, leader.log.last_index)
    ]


def test_without_a_throttle_a_learner_takes_the_log_as_fast_as_it_acknowledges() -> None:
    net = Net(group("n1", "n2", "n3"))
    leader = net.elect("n1")
    for i in range(100):
        leader.propose([b"%04d" % i + b"x" * 996])
    net.run()
    net.add("n4", group("n1", "n2", "n3"))
    net.change("n1", ADD, "n4", "n4:1")
    net.tick()
    assert net["n4"].log.last_index == leader.log.last_index


def test_a_throttled_learner_still_catches_up_while_the_log_grows_faster_than_the_throttle() -> None:
    """Each tick a learner is also given what the log grew by: under a load above the throttle
    its backlog still shrinks, by the throttle's share per tick."""
    size = 1000 + 44
    net = Net(group("n1", "n2", "n3"), learner_bytes_per_tick=2 * size, max_promote_lag=5)
    leader = net.elect("n1")
    for i in range(60):
        leader.propose([b"%04d" % i + b"x" * 996])
    net.run()
    net.add("n4", group("n1", "n2", "n3"))
    net.change("n1", ADD, "n4", "n4:1")
    lags = []
    for t in range(200):
        for k in range(5):  # five entries a tick: more than twice the throttle
            leader.propose([b"%04d" % (t * 5 + k) + b"y" * 996])
        net.tick()
        lags.append(leader.log.last_index - net["n4"].log.last_index)
        if lags[-1] == 0:
            break
    assert lags[-1] == 0, lags[::10]
    # caught up, it is kept there between ticks: the last max_promote_lag entries are not metered
    for t in range(5):
        leader.propose([b"z%d" % t])
        net.run()
        assert net["n4"].log.last_index == leader.log.last_index
    index = net.change("n1", PROMOTE, "n4")
    assert leader.commit >= index and net["n4"].is_voter


def test_the_removed_answer_is_a_trailing_flag_older_nodes_read_as_a_refusal() -> None:
    told = VoteResponse(7, "n1", "n3", False, True, removed=True)
    body = encode_message(told)
    assert decode_message(body) == told
    plain = decode_message(body[:-1])  # what a node without the flag reads: a refused pre-vote
    assert not plain.granted and not plain.removed and plain.term == 7  # type: ignore[union-attr]
    # a forged "granted and removed" is read as removed, never as a vote
    forged = decode_message(encode_message(VoteResponse(7, "n1", "n3", True, True, removed=True)))
    assert forged.removed and not forged.granted  # type: ignore[union-attr]
