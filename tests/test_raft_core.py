"""Targeted tests of the Raft core, driven by hand-crafted messages.

The simulator (tests/test_raft_sim.py) finds bugs by brute force; these tests pin down
each protocol rule on its own, in the smallest scenario that shows it, so a regression
names the rule it broke. Every core here is deterministic (seeded rng, MemoryLog, no I/O).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from ledger.codec import KIND_NOOP, Entry
from ledger.memlog import MemoryLog
from ledger.messages import (
    AppendRequest,
    AppendResponse,
    InstallBase,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from ledger.raft import PROBE, REPLICATE, NotLeader, RaftConfig, RaftCore, Ready, Role

MEMBERS = ("n1", "n2", "n3")
E = 8  # election ticks used throughout


def mklog(terms: Sequence[int], synced: bool = True) -> MemoryLog:
    """A log whose entry ``i`` (1-based) has term ``terms[i-1]`` and payload ``e<i>``."""
    log = MemoryLog()
    log.append([Entry(i + 1, t, f"e{i + 1}".encode()) for i, t in enumerate(terms)])
    if synced:
        log.sync()
    return log


def mkcore(
    node_id: str = "n1",
    terms: Sequence[int] = (),
    *,
    term: int = 0,
    voted_for: str | None = None,
    log: MemoryLog | None = None,
    **cfg: object,
) -> RaftCore:
    config = RaftConfig(election_ticks=E, **cfg)  # type: ignore[arg-type]
    return RaftCore(
        node_id,
        MEMBERS,
        log if log is not None else mklog(terms),
        term=term,
        voted_for=voted_for,
        config=config,
        rng=random.Random(7),
    )


def of(rd: Ready, kind: type, dst: str | None = None) -> list:
    return [m for m in rd.messages if isinstance(m, kind) and (dst is None or m.dst == dst)]


def elect(core: RaftCore) -> Ready:
    """Make ``core`` leader with votes from every peer; returns the merged Ready of the way there."""
    core.campaign()
    merged = Ready()
    for _ in range(3):
        rd = core.ready()
        merged.messages += rd.messages
        merged.role_changes += rd.role_changes
        if rd.hard_state is not None:
            merged.hard_state = rd.hard_state
        if core.role is Role.LEADER:
            break
        pre = core.role is Role.PRE_CANDIDATE
        for p in core.peers:
            core.step(VoteResponse(core.term + 1 if pre else core.term, p, core.id, True, pre))
    assert core.role is Role.LEADER
    rd = core.ready()
    merged.messages += rd.messages
    if rd.hard_state is not None:
        merged.hard_state = rd.hard_state
    return merged


def ack_all(leader: RaftCore, msgs: Sequence[Message], peers: Sequence[str] | None = None) -> None:
    """Answer appends as followers whose logs match the leader and are synced."""
    for m in msgs:
        if isinstance(m, AppendRequest) and (peers is None or m.dst in peers):
            match = m.prev_index + len(m.entries)
            leader.step(AppendResponse(m.term, m.dst, m.src, True, match, seq=m.seq))


def commit_noop(leader: RaftCore, rd: Ready) -> Ready:
    """Replicate and commit the new leader's no-op; returns the Ready that reports it."""
    leader.on_durable(leader.log.last_index)
    ack_all(leader, rd.messages)
    out = leader.ready()
    assert leader.commit >= leader.noop_index
    return out


def heartbeat_round(leader: RaftCore, peers: Sequence[str]) -> Ready:
    """Tick until heartbeats go out and answer them from ``peers``.

    Returns one Ready holding everything the leader emitted: the heartbeats (and whatever
    the tick caused) followed by what the answers caused.
    """
    for _ in range(leader.config.heartbeat_ticks):
        leader.tick()
    rd = leader.ready()
    ack_all(leader, rd.messages, peers)
    after = leader.ready()
    rd.messages += after.messages
    rd.read_states += after.read_states
    rd.commit_index = after.commit_index if after.commit_index is not None else rd.commit_index
    return rd


# ---------------------------------------------------------------------- elections


def test_prevote_keeps_a_partitioned_node_from_inflating_terms() -> None:
    """An isolated node keeps campaigning, but only with pre-votes, so its term never grows.

    Without PreVote it would return with a huge term and depose a healthy leader.
    """
    lonely = mkcore("n3", [1, 1], term=1)
    sent: list[Message] = []
    for _ in range(20 * E):  # many election timeouts with nobody answering
        lonely.tick()
        rd = lonely.ready()
        assert rd.hard_state is None, "a pre-vote must not persist a new term"
        sent += rd.messages
    assert lonely.term == 1
    requests = of(Ready(messages=sent), VoteRequest)
    assert len(requests) >= 2 * 15 and all(m.pre_vote and m.term == 2 for m in requests)

    # It rejoins: the leader (in its lease) ignores it and stays leader, term unchanged.
    leader = mkcore("n1", [1, 1], term=0)
    elect(leader)
    term = leader.term
    assert term == 1
    leader.step(requests[-1])
    assert (leader.role, leader.term) == (Role.LEADER, term)
    assert not of(leader.ready(), VoteResponse)

    # A follower whose leader went quiet still refuses: the rejoining log is behind.
    follower = mkcore("n2", [1, 1, 2], term=2)
    follower.step(VoteRequest(3, "n3", "n2", 2, 1, pre_vote=True))
    (resp,) = of(follower.ready(), VoteResponse)
    assert not resp.granted and follower.term == 2


def test_without_prevote_an_isolated_node_inflates_its_term() -> None:
    """The control for the test above: the same isolation with PreVote off bumps the term."""
    lonely = mkcore("n3", [1, 1], term=1, pre_vote=False)
    for _ in range(4 * E):
        lonely.tick()
        lonely.ready()
    assert lonely.term >= 3


def test_check_quorum_makes_an_isolated_leader_step_down() -> None:
    leader = mkcore("n1", [1], term=1)
    elect(leader)
    leader.read_index("r1")  # waits for the no-op, which never commits
    leader.ready()
    ctx_dropped: list[object] = []
    for _ in range(2 * E + 1):
        leader.tick()
        rd = leader.ready()
        ctx_dropped += rd.dropped_reads
        if leader.role is not Role.LEADER:
            break
    assert leader.role is Role.FOLLOWER and leader.leader is None
    assert any(r[0] is Role.FOLLOWER for r in rd.role_changes)
    assert ctx_dropped == ["r1"]


def test_check_quorum_keeps_a_leader_that_hears_from_a_quorum() -> None:
    leader = mkcore("n1", [1], term=1)
    rd = elect(leader)
    commit_noop(leader, rd)
    for _ in range(5 * E):
        heartbeat_round(leader, ["n2"])  # one follower is enough for a quorum of three
    assert leader.role is Role.LEADER


def test_leader_stickiness_ignores_a_disruptive_candidate() -> None:
    """A follower that heard from its leader within an election timeout ignores a higher term."""
    f = mkcore("n2", [1], term=1)
    f.step(AppendRequest(1, "n1", "n2", 1, 1, 0, []))
    f.ready()
    f.step(VoteRequest(2, "n3", "n2", 5, 2))  # better log, higher term: would win without stickiness
    rd = f.ready()
    assert f.term == 1 and not rd.messages and rd.hard_state is None and f.leader == "n1"

    # A transfer (after TimeoutNow) is allowed to disrupt on purpose.
    f.step(VoteRequest(2, "n3", "n2", 5, 2, transfer=True))
    rd = f.ready()
    (resp,) = of(rd, VoteResponse)
    assert resp.granted and rd.hard_state == (2, "n3")


def test_leader_stickiness_ends_with_the_lease() -> None:
    f = mkcore("n2", [1], term=1)
    f.step(AppendRequest(1, "n1", "n2", 1, 1, 0, []))
    f.ready()
    for _ in range(E):
        f.tick()
        f.ready()
    f.step(VoteRequest(2, "n3", "n2", 5, 2))
    rd = f.ready()
    (resp,) = of(rd, VoteResponse)
    assert resp.granted and f.term == 2


def test_hard_state_is_in_the_same_ready_as_the_vote() -> None:
    """The runtime persists Ready.hard_state before sending; the vote must travel with it."""
    f = mkcore("n2", [1], term=1)
    f.step(VoteRequest(3, "n3", "n2", 1, 1))
    rd = f.ready()
    (resp,) = of(rd, VoteResponse)
    assert resp.granted and resp.term == 3
    assert rd.hard_state == (3, "n3")

    # A rejected candidate with a higher term still moves our term: that is persisted too.
    g = mkcore("n2", [1, 2], term=2)
    g.step(VoteRequest(4, "n3", "n2", 1, 1))
    rd = g.ready()
    (resp,) = of(rd, VoteResponse)
    assert not resp.granted and rd.hard_state == (4, None)

    # A candidate persists its own vote with its vote requests.
    c = mkcore("n1", [1], term=1, pre_vote=False)
    c.campaign()
    rd = c.ready()
    assert rd.hard_state == (2, "n1") and len(of(rd, VoteRequest)) == 2


def test_a_node_votes_once_per_term() -> None:
    f = mkcore("n2", [1], term=1)
    f.step(VoteRequest(2, "n3", "n2", 1, 1))
    f.ready()
    f.step(VoteRequest(2, "n1", "n2", 9, 1))
    (resp,) = of(f.ready(), VoteResponse)
    assert not resp.granted and f.voted_for == "n3"


# ---------------------------------------------------------------------- leader duties


def test_new_leader_appends_a_noop_and_reports_leader_ready_once() -> None:
    leader = mkcore("n1", [1, 1], term=1)
    rd = elect(leader)
    noop = leader.log.entries(leader.log.last_index, leader.log.last_index)[0]
    assert (noop.index, noop.term, noop.kind) == (3, leader.term, KIND_NOOP)
    assert leader.noop_index == 3 and rd.leader_ready is None
    leader.on_durable(3)
    assert leader.ready().leader_ready is None, "the leader alone is not a quorum"
    ack_all(leader, rd.messages, ["n2"])
    rd2 = leader.ready()
    assert rd2.leader_ready == leader.term and rd2.commit_index == 3
    ack_all(leader, rd.messages, ["n3"])
    leader.propose([b"x"])
    assert leader.ready().leader_ready is None


def test_figure8_only_current_term_entries_commit_by_counting() -> None:
    """Raft figure 8: an old-term entry on a majority is not committed until a current-term one is."""
    log = mklog([1, 2])
    leader = mkcore("n1", log=log, term=3, voted_for="n1")
    elect(leader)  # term 4, no-op at index 3
    assert leader.term == 4 and leader.log.last_index == 3
    # n2 holds index 2 (term 2) durably: old entry now on a majority (n1 + n2).
    leader.step(AppendResponse(4, "n2", "n1", True, 2))
    rd = leader.ready()
    assert leader.commit == 0 and rd.commit_index is None
    # The no-op (term 4) reaches a majority: it and everything before it commit together.
    leader.on_durable(3)
    leader.step(AppendResponse(4, "n2", "n1", True, 3))
    assert leader.ready().commit_index == 3


def test_leader_counts_itself_only_up_to_its_durable_index() -> None:
    """The leader's own unsynced copy is no copy: with one follower ack there is no quorum yet."""
    leader = mkcore("n1", [1], term=1)
    elect(leader)
    leader.step(AppendResponse(leader.term, "n2", "n1", True, 2))
    assert leader.ready().commit_index is None and leader.durable == 1
    leader.on_durable(2)
    assert leader.ready().commit_index == 2


# ---------------------------------------------------------------------- replication


def test_follower_acknowledges_only_durable_entries() -> None:
    f = mkcore("n2", [], term=1, log=MemoryLog())
    entries = [Entry(i, 1, b"p") for i in (1, 2, 3)]
    f.step(AppendRequest(1, "n1", "n2", 0, 0, 0, entries, seq=4))
    rd = f.ready()
    assert not [m for m in of(rd, AppendResponse) if m.success and m.match_index > 0]
    f.step(AppendRequest(1, "n1", "n2", 3, 1, 0, [], seq=4))  # a heartbeat meanwhile
    for m in of(f.ready(), AppendResponse):
        assert m.match_index == 0, "a heartbeat answer must not vouch for unsynced entries"
    f.log.sync()
    f.on_durable(2)
    (ack,) = of(f.ready(), AppendResponse)
    assert ack.success and ack.match_index == 2
    f.on_durable(3)
    (ack,) = of(f.ready(), AppendResponse)
    assert ack.match_index == 3 and ack.seq == 4


def test_fast_backtracking_skips_a_whole_conflicting_term() -> None:
    """The hint lets the leader jump over the follower's term-4 suffix in one round trip."""
    leader = mkcore("n1", [1, 1, 1, 5, 5, 5, 5, 5, 5, 5], term=5, voted_for="n1")
    rd = elect(leader)  # term 6, no-op at 11
    follower = mkcore("n2", [1, 1, 1, 4, 4, 4, 4], term=5)
    probe = of(rd, AppendRequest, "n2")[0]
    assert probe.prev_index == 10
    follower.step(probe)
    (rej,) = of(follower.ready(), AppendResponse)
    assert not rej.success and (rej.reject_index, rej.hint_index, rej.hint_term) == (10, 7, 4)
    leader.step(rej)
    (probe2,) = of(leader.ready(), AppendRequest, "n2")
    assert (probe2.prev_index, probe2.prev_term) == (3, 1), "one step back per entry would give 9"
    follower.step(probe2)
    follower.on_durable(follower.log.last_index)
    rd = follower.ready()
    follower.log.sync()
    acks = [m for m in of(rd, AppendResponse) if m.success]
    assert acks and acks[-1].match_index == 11
    assert follower.log.entries(1, 11) == leader.log.entries(1, 11)


def test_follower_never_truncates_below_its_commit() -> None:
    """A stale append whose entries are already committed here is skipped, not applied."""
    f = mkcore("n2", [1, 1, 2], term=2)
    f.step(AppendRequest(2, "n1", "n2", 3, 2, 3, []))
    f.ready()
    assert f.commit == 3
    f.step(AppendRequest(2, "n1", "n2", 1, 1, 3, [Entry(2, 1, b"e2"), Entry(3, 2, b"e3")]))
    rd = f.ready()
    assert f.log.last_index == 3 and any(m.success for m in of(rd, AppendResponse))


def test_install_base_brings_back_a_follower_behind_the_leaders_first_index() -> None:
    leader = mkcore("n1", [1] * 10, term=1)
    rd = elect(leader)
    ack_all(leader, rd.messages, ["n3"])
    leader.on_durable(leader.log.last_index)
    leader.ready()
    assert leader.commit == 11
    leader.log.compact(8)  # retention: entries 1..7 are gone
    follower = mkcore("n2", [], term=1, log=MemoryLog())
    # The follower rejects until the leader realises it needs entries it no longer has.
    leader.tick()
    msgs = leader.ready().messages
    install: list[InstallBase] = []
    for _ in range(6):
        for m in [m for m in msgs if m.dst == "n2"]:
            follower.step(m)
        install += of(Ready(messages=msgs), InstallBase, "n2")
        if install:
            break
        for m in follower.ready().messages:
            leader.step(m)
        msgs = leader.ready().messages
    assert install and (install[0].base_index, install[0].base_term) == (7, 1)
    rd = follower.ready()
    assert follower.log.first_index == 8 and follower.commit == 7 and rd.commit_index == 7
    (ack,) = [m for m in of(rd, AppendResponse) if m.success]
    assert ack.match_index == 7
    leader.step(ack)
    (app,) = of(leader.ready(), AppendRequest, "n2")
    assert app.prev_index == 7 and [e.index for e in app.entries] == [8, 9, 10, 11]


def test_install_base_ack_resumes_appends_from_replicate_state() -> None:
    """Regression (sim seed 23): a REPLICATE follower left behind the base got InstallBase forever.

    With a one-batch window the leader's ``next`` for n2 lags its log; n3 alone lets the
    leader commit, retention passes n2's ``next``, and n2's answer to the InstallBase must
    lead to appends from the base on.
    """
    leader = mkcore("n1", [1], term=1, max_inflight=1, max_append_bytes=100)
    elect(leader)  # term 2, no-op at 2
    leader.on_durable(2)
    leader.step(AppendResponse(2, "n2", "n1", True, 2))  # n2: REPLICATE, next 3
    leader.step(AppendResponse(2, "n3", "n1", True, 2))
    leader.ready()
    leader.propose([b"p" * 10 for _ in range(10)])  # 3..12, one entry per append
    rd = leader.ready()
    (first,) = of(rd, AppendRequest, "n2")
    assert [e.index for e in first.entries] == [3]
    leader.on_durable(12)
    leader.step(AppendResponse(2, "n3", "n1", True, 12))
    leader.ready()
    assert leader.commit == 12
    leader.log.compact(10)  # base 9, past n2's next
    leader.step(AppendResponse(2, "n2", "n1", True, 3, seq=first.seq))
    (ib,) = of(leader.ready(), InstallBase, "n2")
    assert ib.base_index == 9
    leader.step(AppendResponse(2, "n2", "n1", True, 9, seq=ib.seq))
    out = leader.ready()
    assert not of(out, InstallBase, "n2")
    (app,) = of(out, AppendRequest, "n2")
    assert app.prev_index == 9 and [e.index for e in app.entries] == [10]


def test_a_stale_success_does_not_release_the_window_of_a_probing_follower() -> None:
    """Regression (sim seed 4225, a message storm): only an ack that raises the match ends PROBE.

    A reordering network delivers a pipeline's appends out of order: the follower rejects
    the one that overtook its predecessor and the leader falls back to probing. A late or
    duplicated success that proves nothing new (its match is not above the known one) used
    to flip the follower back to REPLICATE and resend the whole window, whose own reordering
    caused the next rejection: about 120k messages in a 2.6 s run, the follower never caught up.
    """
    leader = mkcore("n1", [1], term=1, max_inflight=8, max_append_bytes=100)
    commit_noop(leader, elect(leader))  # term 2, no-op at 2; n2 and n3 REPLICATE with match 2
    leader.ready()
    leader.propose([b"p" * 10 for _ in range(6)])  # 3..8, one entry per append
    window = of(leader.ready(), AppendRequest, "n2")
    assert [m.prev_index for m in window] == [2, 3, 4, 5, 6, 7]
    pr = leader.progress["n2"]
    # The append at prev 3 overtook the one at prev 2: n2 (log ending at 2) rejects it.
    leader.step(AppendResponse(2, "n2", "n1", False, 0, 3, 2, 2, window[1].seq))
    (probe,) = of(leader.ready(), AppendRequest, "n2")
    assert pr.state == PROBE and probe.prev_index == 2
    # A duplicate of n2's old acknowledgement of the no-op arrives late: nothing new.
    leader.step(AppendResponse(2, "n2", "n1", True, 2, seq=window[0].seq))
    assert pr.state == PROBE
    assert not of(leader.ready(), AppendRequest, "n2"), "a stale ack released the window again"
    # The answer to the probe (entry 3 durable on n2) resumes the pipeline after it.
    leader.step(AppendResponse(2, "n2", "n1", True, 3, seq=probe.seq))
    resumed = of(leader.ready(), AppendRequest, "n2")
    assert pr.state == REPLICATE and pr.match == 3
    assert [m.prev_index for m in resumed] == [3, 4, 5, 6, 7]


def test_stale_install_base_does_not_rewind_a_follower() -> None:
    """Regression (sim seed 106): a delayed InstallBase below our commit reset the log backwards."""
    f = mkcore("n2", [], term=1, log=MemoryLog())
    f.step(InstallBase(1, "n1", "n2", 10, 1, 500, seq=1))
    f.step(AppendRequest(1, "n1", "n2", 10, 1, 12, [Entry(11, 1, b"a"), Entry(12, 1, b"b")]))
    f.log.sync()
    f.on_durable(12)
    f.ready()
    assert f.commit == 12
    f.step(InstallBase(1, "n1", "n2", 6, 1, 300, seq=1))  # delayed duplicate from earlier
    rd = f.ready()
    assert f.log.last_index == 12 and f.commit <= f.log.last_index
    assert all(m.match_index in (0, 12) or not m.success for m in of(rd, AppendResponse))


# ---------------------------------------------------------------------- leadership transfer


def test_transfer_waits_for_the_target_then_sends_timeout_now() -> None:
    leader = mkcore("n1", [1, 1], term=1)
    rd = elect(leader)
    commit_noop(leader, rd)
    leader.propose([b"a", b"b"])
    rd = leader.ready()
    leader.transfer_leadership("n2")
    assert not of(leader.ready(), TimeoutNow)
    with pytest.raises(NotLeader):
        leader.propose([b"blocked"])
    ack_all(leader, rd.messages, ["n2"])
    (tn,) = of(leader.ready(), TimeoutNow)
    assert tn.dst == "n2" and tn.term == leader.term

    # The target campaigns at once, without pre-vote, and voters ignore stickiness for it.
    target = mkcore("n2", [1, 1], term=1)
    target.step(AppendRequest(1, "n1", "n2", 2, 1, 2, []))
    target.ready()
    target.step(TimeoutNow(1, "n1", "n2"))
    rd = target.ready()
    assert target.role is Role.CANDIDATE and target.term == 2
    reqs = of(rd, VoteRequest)
    assert len(reqs) == 2 and all(r.transfer and not r.pre_vote for r in reqs)
    voter = mkcore("n3", [1, 1], term=1)
    voter.step(AppendRequest(1, "n1", "n3", 2, 1, 2, []))
    voter.ready()
    voter.step(reqs[0] if reqs[0].dst == "n3" else reqs[1])
    (vote,) = of(voter.ready(), VoteResponse)
    assert vote.granted


def test_timeout_now_from_a_non_leader_is_ignored() -> None:
    f = mkcore("n2", [1], term=1)
    f.step(AppendRequest(1, "n1", "n2", 1, 1, 1, []))
    f.ready()
    f.step(TimeoutNow(1, "n3", "n2"))
    assert f.role is Role.FOLLOWER and f.term == 1


def test_transfer_aborts_after_an_election_timeout() -> None:
    leader = mkcore("n1", [1], term=1)
    rd = elect(leader)
    commit_noop(leader, rd)
    leader.propose([b"a"])
    leader.ready()
    leader.transfer_leadership("n2")  # n2 never catches up
    for _ in range(E):
        heartbeat_round(leader, ["n3"])
    assert leader.role is Role.LEADER and leader.transfer_target is None
    first, _ = leader.propose([b"accepted again"])
    assert first == leader.log.last_index
    assert not [m for m in leader.ready().messages if isinstance(m, TimeoutNow)]


def test_preferred_leader_gets_leadership_once_caught_up() -> None:
    leader = mkcore("n1", [1], term=1, preferred_leader="n2")
    rd = elect(leader)
    commit_noop(leader, rd)
    sent: list[Message] = []
    for _ in range(E + 1):
        rd = heartbeat_round(leader, ["n2", "n3"])
        sent += rd.messages
    tns = [m for m in sent if isinstance(m, TimeoutNow)]
    assert [m.dst for m in tns] == ["n2"]


def test_an_unreachable_preferred_leader_does_not_block_writes() -> None:
    """A preferred leader that stopped answering must not keep the leader in a transfer.

    Regression: the transfer was retried at every election timeout, in the same tick the
    previous one timed out, so proposals were refused for as long as the target was down.
    """
    leader = mkcore("n1", [1], term=1, preferred_leader="n2")
    rd = elect(leader)
    commit_noop(leader, rd)
    refused = 0
    for _ in range(4 * E):
        try:
            leader.propose([b"more"])
        except NotLeader:
            refused += 1
        heartbeat_round(leader, ["n3"])  # n2 has gone silent
    assert leader.role is Role.LEADER
    assert refused <= E + 1, f"{refused} of {4 * E} proposals refused while n2 was unreachable"


def test_a_preferred_leader_that_cannot_catch_up_does_not_block_writes() -> None:
    """n2 answers heartbeats (so it looks alive) but its disk is stalled: its match never moves.

    The transfer starts because n2 lags by less than 1024 entries, waits for a catch-up that
    never comes, aborts after an election timeout and starts again at once. A fix (e.g. back
    off after an aborted transfer, or require the target to be caught up) turns this green.
    """
    leader = mkcore("n1", [1], term=1, preferred_leader="n2")
    rd = elect(leader)
    commit_noop(leader, rd)
    refused = 0
    for _ in range(10 * E):
        try:
            leader.propose([b"more"])
        except NotLeader:
            refused += 1
        leader.tick()
        for m in of(leader.ready(), AppendRequest):
            match = m.prev_index + len(m.entries) if m.dst == "n3" else 2
            leader.step(AppendResponse(m.term, m.dst, "n1", True, match, seq=m.seq))
        leader.on_durable(leader.log.last_index)
        leader.ready()
    assert leader.role is Role.LEADER
    assert refused <= 3 * E, f"{refused} of {10 * E} proposals refused"


# ---------------------------------------------------------------------- ReadIndex


def test_read_index_waits_for_the_noop_to_commit() -> None:
    leader = mkcore("n1", [1, 1, 1], term=1)
    rd = elect(leader)
    leader.read_index("r1")
    for _ in range(2):  # heartbeats answered: leadership confirmed, but the no-op is not committed
        leader.tick()
        for m in of(leader.ready(), AppendRequest):
            if not m.entries:
                leader.step(AppendResponse(m.term, m.dst, "n1", True, m.prev_index, seq=m.seq))
    assert not leader.ready().read_states and leader.commit < leader.noop_index
    out = commit_noop(leader, rd)
    assert not out.read_states, "the read needs a round started after it was registered"
    ack_all(leader, out.messages)
    (state,) = leader.ready().read_states
    assert state == ("r1", leader.noop_index)


def test_read_index_needs_a_round_started_after_the_read() -> None:
    """Answers to heartbeats sent before the read must not confirm it (stale-leader reads)."""
    leader = mkcore("n1", [1], term=1)
    rd = elect(leader)
    commit_noop(leader, rd)
    leader.tick()
    before = leader.ready().messages  # heartbeats already in flight
    leader.read_index("r1")
    round_msgs = leader.ready().messages
    ack_all(leader, before)  # late answers to the old heartbeats
    assert not leader.ready().read_states
    ack_all(leader, round_msgs, ["n3"])
    (state,) = leader.ready().read_states
    assert state == ("r1", leader.commit)


def test_read_index_on_a_follower_is_refused() -> None:
    f = mkcore("n2", [1], term=1)
    f.step(AppendRequest(1, "n1", "n2", 1, 1, 1, []))
    f.ready()
    with pytest.raises(NotLeader) as exc:
        f.read_index("r")
    assert exc.value.leader == "n1"


def test_reads_pending_when_leadership_is_lost_are_dropped() -> None:
    leader = mkcore("n1", [1], term=1)
    rd = elect(leader)
    commit_noop(leader, rd)
    leader.read_index("r1")
    leader.ready()
    leader.step(AppendRequest(leader.term + 1, "n2", "n1", 2, 1, 2, []))
    rd = leader.ready()
    assert rd.dropped_reads == ["r1"] and not rd.read_states


def test_follower_echoes_only_its_current_leaders_read_seq() -> None:
    """Regression (sim seed 46): a seq remembered from a previous leader confirmed reads it should not."""
    f = mkcore("n2", [1], term=1, log=mklog([1]))
    f.step(AppendRequest(1, "n1", "n2", 1, 1, 1, [], seq=50))  # old leader with a large read seq
    f.ready()
    f.step(AppendRequest(2, "n3", "n2", 1, 1, 1, [Entry(2, 2, b"")], seq=3))  # new leader
    f.ready()
    f.log.sync()
    f.on_durable(2)
    (ack,) = of(f.ready(), AppendResponse)
    assert ack.dst == "n3" and ack.match_index == 2 and ack.seq == 3


def test_invariants_refuse_to_truncate_committed_entries_or_go_back_in_term() -> None:
    """The always-on edge checks: a bug that would break safety stops the node instead."""
    from ledger.invariants import InvariantError

    core = mkcore("n2", [1, 1, 1], term=1)
    core.step(AppendRequest(1, "n1", "n2", 3, 1, 2, []))
    assert core.commit == 2
    with pytest.raises(InvariantError, match="committed"):
        core._truncate(2)
    core._truncate(3)  # above the commit index is fine
    assert core.log.last_index == 2
    with pytest.raises(InvariantError, match="term would go back"):
        core._become_follower(0, None)


# ---------------------------------------------------------------------- leader lost (OS notice)


def follower_of(node_id: str, leader: str = "n1", term: int = 2) -> RaftCore:
    """A follower in ``term`` that has just heard from ``leader``."""
    core = mkcore(node_id, [1], term=term)
    core.step(AppendRequest(term, leader, node_id, 1, 1, 1, [], 0))
    core.ready()
    assert core.role is Role.FOLLOWER and core.leader == leader
    return core


def test_leader_connection_lost_starts_a_prevote_at_once() -> None:
    core = follower_of("n2")  # n2 is the first survivor of n1 by member order
    core.peer_unreachable("n1")
    rd = core.ready()
    assert core.role is Role.PRE_CANDIDATE and core.term == 2  # a pre-vote never bumps the term
    reqs = of(rd, VoteRequest)
    assert {m.dst for m in reqs} == {"n1", "n3"} and all(m.pre_vote and m.term == 3 for m in reqs)


def test_other_survivors_wait_a_few_ticks_then_campaign() -> None:
    core = follower_of("n3")  # second survivor: must not split the vote with n2
    core.peer_unreachable("n1")
    assert core.role is Role.FOLLOWER and not of(core.ready(), VoteRequest)
    assert core.leader is None
    for _ in range(2):
        core.tick()
    assert core.role is Role.PRE_CANDIDATE  # well before the election timeout (E = 8 ticks)


def test_a_survivor_that_lost_the_leader_grants_the_prevote() -> None:
    voter = follower_of("n3")
    voter.peer_unreachable("n1")
    voter.ready()
    voter.step(VoteRequest(3, "n2", "n3", 1, 1, True, False))
    (resp,) = of(voter.ready(), VoteResponse)
    assert resp.granted and resp.pre_vote


def test_a_flaky_link_cannot_depose_a_healthy_leader() -> None:
    """n2 lost its link to n1, but n3 still hears from n1: n3 refuses, no term is spent."""
    n2 = follower_of("n2")
    n3 = follower_of("n3")
    n2.peer_unreachable("n1")
    (req,) = of(n2.ready(), VoteRequest, "n3")
    n3.step(req)
    answers = of(n3.ready(), VoteResponse)
    assert not any(r.granted for r in answers)  # ignored (leader stickiness) or refused
    for r in answers:
        n2.step(r)
    n2.tick()
    assert n2.role is not Role.CANDIDATE
    assert n2.term == 2 and n3.term == 2 and n3.term == 2 and n3.leader == "n1"
    # The leader's next heartbeat brings n2 back as its follower.
    n2.step(AppendRequest(2, "n1", "n2", 1, 1, 1, [], 0))
    assert n2.role is Role.FOLLOWER and n2.leader == "n1" and n2.term == 2


def test_leader_lost_notice_about_a_non_leader_or_without_prevote_is_ignored() -> None:
    core = follower_of("n2")
    core.peer_unreachable("n3")
    assert core.leader == "n1" and core.role is Role.FOLLOWER
    plain = mkcore("n2", [1], term=2, pre_vote=False)
    plain.step(AppendRequest(2, "n1", "n2", 1, 1, 1, [], 0))
    plain.ready()
    plain.peer_unreachable("n1")
    assert plain.leader == "n1" and plain.role is Role.FOLLOWER and plain.term == 2


def test_two_survivors_elect_a_leader_without_a_timeout() -> None:
    n2, n3 = follower_of("n2"), follower_of("n3")
    n3.peer_unreachable("n1")
    n3.ready()
    n2.peer_unreachable("n1")
    cores = {"n2": n2, "n3": n3}
    for _ in range(10):  # deliver messages between the survivors until quiet (n1 is dead)
        msgs = [m for c in cores.values() for m in c.ready().messages if m.dst in cores]
        if not msgs:
            break
        for m in msgs:
            cores[m.dst].step(m)
        for c in cores.values():
            c.on_durable(c.log.last_index)
    assert n2.role is Role.LEADER and n2.term == 3 and n3.leader == "n2"


def test_a_lagging_first_survivor_lets_the_other_stand_and_votes_for_it() -> None:
    """n2 would campaign first by member order, but its application is replaying a backlog:
    n3 (second by order) stands instead and wins with n2's vote; n2 never becomes a candidate."""
    n2, n3 = follower_of("n2"), follower_of("n3")
    n2.set_lagging(True)
    n2.peer_unreachable("n1")
    n3.peer_unreachable("n1")
    assert n2.role is Role.FOLLOWER and not of(n2.ready(), VoteRequest)
    cores = {"n2": n2, "n3": n3}
    for _ in range(20):  # tick both and deliver until n3 leads (n1 is dead)
        for c in cores.values():
            c.tick()
        for _ in range(5):
            msgs = [m for c in cores.values() for m in c.ready().messages if m.dst in cores]
            for m in msgs:
                cores[m.dst].step(m)
            for c in cores.values():
                c.on_durable(c.log.last_index)
        if n3.role is Role.LEADER:
            break
    assert n3.role is Role.LEADER and n2.leader == "n3"
    assert n2.role is Role.FOLLOWER and n2.term == n3.term


def test_a_lagging_node_still_stands_when_no_peer_does() -> None:
    """Liveness: alone (its peers dead), a lagging node still campaigns, after the others' turns."""

    def ticks_to_stand(core: RaftCore) -> int:
        ticks = 0
        while core.role is Role.FOLLOWER and ticks < 100:
            core.tick()
            ticks += 1
        assert core.role is Role.PRE_CANDIDATE
        return ticks

    core = follower_of("n2")
    core.set_lagging(True)
    core.peer_unreachable("n1")
    other = follower_of("n3")  # second survivor, not lagging: stands after 2 ticks
    other.peer_unreachable("n1")
    behind = follower_of("n3")  # second survivor, lagging too: stands after n2
    behind.set_lagging(True)
    behind.peer_unreachable("n1")
    n2, n3, n3_lagging = ticks_to_stand(core), ticks_to_stand(other), ticks_to_stand(behind)
    assert n3 < n2 < n3_lagging
    plain = follower_of("n2")
    plain.peer_unreachable("n1")
    assert plain.role is Role.PRE_CANDIDATE  # not lagging: at once
    core.set_lagging(False)
    assert not core.lagging


def test_a_prevote_ignored_under_the_lease_is_granted_once_the_leader_is_lost() -> None:
    """n2 noticed first and asked n3 while n3 still heard from n1: n3 answers when it notices too."""
    n3 = follower_of("n3")
    n3.step(VoteRequest(3, "n2", "n3", 1, 1, True, False))
    assert not of(n3.ready(), VoteResponse)  # leader stickiness: not answered yet
    n3.peer_unreachable("n1")
    rd = of(n3.ready(), VoteResponse, "n2")
    assert len(rd) == 1 and rd[0].granted and rd[0].pre_vote and rd[0].term == 3
    assert n3.role is Role.FOLLOWER and n3.term == 2  # it does not compete with n2


def test_a_deferred_prevote_from_the_lost_leader_or_an_old_term_is_not_granted() -> None:
    n3 = follower_of("n3", leader="n2", term=4)
    n3.step(VoteRequest(4, "n1", "n3", 1, 1, True, False))  # older than term + 1: refused outright
    n3.ready()
    n3.step(VoteRequest(5, "n2", "n3", 1, 1, True, False))  # ignored under the lease, from n2 itself
    n3.ready()
    n3.peer_unreachable("n2")
    assert not [m for m in of(n3.ready(), VoteResponse) if m.granted]


# ---------------------------------------------------------------------- repairing a follower that lost data


def exchange(cores: dict[str, RaftCore], rounds: int = 20) -> None:
    """Deliver messages among ``cores`` (syncing every log) until they go quiet."""
    for _ in range(rounds):
        for c in cores.values():
            c.log.sync()
            c.on_durable(c.log.last_index)
        msgs = [m for c in cores.values() for m in c.ready().messages if m.dst in cores]
        if not msgs:
            return
        for m in msgs:
            cores[m.dst].step(m)


def test_leader_repairs_a_follower_whose_log_was_emptied() -> None:
    """Before the fix the leader ignored rejections at or below the old match: stuck at commit 0."""
    leader = mkcore("n1", [1, 1, 1], term=1)
    n2 = mkcore("n2", [1, 1, 1], term=1)
    n3 = mkcore("n3", [1, 1, 1], term=1)
    cores = {"n1": leader, "n2": n2, "n3": n3}
    rd = elect(leader)
    for m in rd.messages:
        cores[m.dst].step(m)
    exchange(cores)
    leader.propose([b"a", b"b"])
    exchange(cores)
    assert leader.commit == 6 and leader.progress["n2"].match == 6
    # n2 restarts with an emptied log (its segment was wiped); it remembers its term.
    n2 = mkcore("n2", [], term=leader.term)
    cores["n2"] = n2
    for _ in range(3):
        for _ in range(leader.config.heartbeat_ticks):
            leader.tick()  # a heartbeat reaches n2, which rejects it: it holds nothing
        exchange(cores)
    assert n2.log.last_index == 6 and n2.commit == 6
    assert n2.log.entries(1, 6) == leader.log.entries(1, 6)
    assert leader.progress["n2"].match == 6


def test_a_stale_rejection_above_the_followers_match_is_still_ignored() -> None:
    leader = mkcore("n1", [1, 1, 1], term=1)
    rd = elect(leader)
    commit_noop(leader, rd)
    pr = leader.progress["n2"]
    assert pr.match == 4
    leader.step(AppendResponse(leader.term, "n2", "n1", False, 0, 4, 4, leader.term, 0))
    assert pr.match == 4  # the follower's hint covers its match: nothing was lost


def test_a_vote_request_is_resent_to_a_peer_that_just_came_up() -> None:
    """The first copy went to a peer still restarting; the candidate must not wait a timeout."""
    core = follower_of("n2")
    core.peer_unreachable("n1")
    (first,) = of(core.ready(), VoteRequest, "n3")
    core.peer_reachable("n3")
    (again,) = of(core.ready(), VoteRequest, "n3")
    assert again == first
    core.step(VoteResponse(3, "n3", "n2", True, True))  # n3 grants: now a real candidate
    core.ready()
    core.step(VoteResponse(3, "n1", "n2", False, False))  # (a late refusal of the real vote)
    core.ready()
    core.peer_reachable("n1")  # n1 answered the real vote already: nothing to resend
    assert not of(core.ready(), VoteRequest)
    core.peer_reachable("n3")  # n3 answered only the pre-vote: resend the real request
    (real,) = of(core.ready(), VoteRequest, "n3")
    assert core.role is Role.CANDIDATE and not real.pre_vote and real.term == core.term == 3


def test_peer_reachable_does_nothing_for_a_follower_or_leader() -> None:
    core = follower_of("n2")
    core.peer_reachable("n3")
    assert not core.ready().messages


# ---------------------------------------------------------------------- lost hard state


def test_a_recovering_node_refuses_votes_and_never_campaigns() -> None:
    core = RaftCore("n2", MEMBERS, mklog([1, 1]), config=RaftConfig(election_ticks=E), recovering=True)
    for _ in range(4 * E):
        core.tick()
    assert core.role is Role.FOLLOWER and core.term == 0
    core.step(VoteRequest(3, "n1", "n2", 2, 1, True, False))
    core.step(VoteRequest(3, "n1", "n2", 2, 1, False, False))
    answers = of(core.ready(), VoteResponse)
    assert len(answers) == 2 and not any(a.granted for a in answers)
    assert core.voted_for is None and core.status()["recovering"]


def test_a_recovering_node_votes_again_once_a_leader_caught_it_up() -> None:
    core = RaftCore("n2", MEMBERS, mklog([1, 1]), config=RaftConfig(election_ticks=E), recovering=True)
    core.step(AppendRequest(3, "n1", "n2", 4, 3, 4, [], 0))  # a heartbeat beyond its log: rejected
    assert core.recovering and core.commit == 0
    core.step(AppendRequest(3, "n1", "n2", 2, 1, 4, [Entry(3, 3, b"x"), Entry(4, 3, b"y")], 0))
    assert core.commit == 4 and not core.recovering
    core.step(VoteRequest(4, "n3", "n2", 4, 3, False, True))  # (a transfer: past the leader's lease)
    assert any(m.granted for m in of(core.ready(), VoteResponse))
