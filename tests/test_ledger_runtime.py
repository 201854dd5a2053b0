"""The sans-I/O runtime (``ledger.runtime``) over hand-driven disk, network and clock fakes.

The simulator runs the same runtime under faults; these tests pin its individual rules:
persist before send, the acknowledgement rule after a leadership loss, expiry on the
injected clock, group commit with one fsync in flight, isolated listeners, and stopping
when the disk fails.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from ledger.codec import Entry
from ledger.memlog import MemoryLog
from ledger.messages import AppendRequest, AppendResponse, Message, VoteRequest, VoteResponse
from ledger.raft import RaftConfig, RaftCore, Role
from ledger.runtime import Busy, LedgerRuntime
from ledger.wire import FAILED, UNKNOWN_OUTCOME

MEMBERS = ("n1", "n2", "n3")


class FakeDisk:
    def __init__(self, events: list[tuple], log: MemoryLog | None = None) -> None:
        self.log = log or MemoryLog()
        self.events = events
        self.syncs: list[Callable[[int, BaseException | None], None]] = []
        self.broken = False

    def save_hard_state(self, term: int, voted_for: str | None) -> None:
        if self.broken:
            raise OSError("disk full")
        self.events.append(("save", term, voted_for))

    def writable(self) -> bool:
        return not self.broken

    def start_sync(self, done: Callable[[int, BaseException | None], None]) -> None:
        self.syncs.append(done)

    def finish_sync(self) -> None:
        """Complete the oldest fsync in flight, covering everything written now."""
        self.syncs.pop(0)(self.log.sync(), None)


class FakeNetwork:
    def __init__(self, events: list[tuple]) -> None:
        self.events = events
        self.sent: list[Message] = []

    def send(self, m: Message) -> None:
        self.events.append(("send", type(m).__name__, m.term))
        self.sent.append(m)


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def now(self) -> float:
        return self.t


class Harness:
    """One runtime whose ``wake`` is honoured at once (as far as the core has work)."""

    def __init__(self, node_id: str = "n1", log: MemoryLog | None = None, term: int = 0) -> None:
        self.events: list[tuple] = []
        self.disk = FakeDisk(self.events, log)
        self.net = FakeNetwork(self.events)
        self.clock = FakeClock()
        self.fatal: list[str] = []
        core = RaftCore(
            node_id,
            MEMBERS,
            self.disk.log,
            term=term,
            config=RaftConfig(election_ticks=8, pre_vote=False),
            rng=random.Random(3),
            durable_index=self.disk.log.durable_index,
        )
        self.woken = 0
        self.rt = LedgerRuntime(
            core,
            self.disk,
            self.net,
            self.clock,
            append_timeout_s=5.0,
            wake=self._wake,
            on_fatal=self.fatal.append,
        )
        self.core = core

    def _wake(self) -> None:
        self.woken += 1

    def run(self) -> None:
        for _ in range(20):
            if not self.core.has_ready:
                return
            self.rt.process()
        raise AssertionError("the runtime kept producing work")

    def elect(self) -> None:
        self.core.campaign()
        self.run()
        for p in ("n2", "n3"):
            self.rt.step(VoteResponse(self.core.term, p, "n1", True))
        self.run()
        assert self.core.role is Role.LEADER
        self.disk.finish_sync()  # the no-op
        for p in ("n2", "n3"):
            self.rt.step(AppendResponse(self.core.term, p, "n1", True, self.core.log.last_index))
        self.run()
        assert self.rt.leader_ready


def test_hard_state_is_saved_before_any_message_of_the_same_ready_leaves() -> None:
    h = Harness()
    h.core.campaign()
    h.rt.process()
    kinds = [e[0] for e in h.events]
    assert kinds[0] == "save" and h.events[0][1:] == (1, "n1")
    assert kinds.count("send") == 2 and all(k == "send" for k in kinds[1:])
    assert all(isinstance(m, VoteRequest) and m.term == 1 for m in h.net.sent)


def test_a_disk_that_cannot_save_the_vote_sends_nothing_and_demotes_until_it_heals() -> None:
    h = Harness()
    h.disk.broken = True
    h.core.campaign()
    h.rt.process()
    assert h.net.sent == [] and not h.fatal and h.rt.disk_fault and "disk full" in h.rt.disk_fault
    assert h.core.role is Role.FOLLOWER and h.core.disk_fault
    for _ in range(40):  # never campaigns while the disk refuses writes
        h.rt.tick()
        h.run()
    assert h.net.sent == [] and h.core.term == 1
    h.disk.broken = False
    h.clock.t += 2.0
    h.rt.tick()
    assert h.rt.disk_fault is None and not h.core.disk_fault
    assert ("save", 1, "n1") in h.events  # the unsaved vote is saved before anything else


def test_group_commit_keeps_one_fsync_in_flight_and_the_next_covers_the_rest() -> None:
    h = Harness()
    h.elect()
    acks: list[tuple] = []
    h.rt.propose([b"a"], lambda *a: acks.append(a))
    h.run()
    assert len(h.disk.syncs) == 1
    h.rt.propose([b"b", b"c"], lambda *a: acks.append(a))
    h.run()
    assert len(h.disk.syncs) == 1, "a second fsync must wait for the first"
    last = h.core.log.last_index
    h.disk.finish_sync()  # MemoryLog.sync covers a..c
    assert h.core.durable == last and not h.disk.syncs


def _leader_with_pending(payload: bytes) -> tuple[Harness, list[tuple], int, int]:
    h = Harness()
    h.elect()
    acks: list[tuple] = []
    first, term = h.rt.propose([payload], lambda *a: acks.append(a))
    h.run()
    h.disk.finish_sync()
    return h, acks, first, term


def test_a_deposed_leader_still_acknowledges_its_entry_if_the_next_leader_commits_it() -> None:
    h, acks, index, term = _leader_with_pending(b"keep")
    new_term = term + 1
    # n2 won term+1 with n1's entry in its log; it commits it (and its own no-op after it).
    entries = [Entry(index + 1, new_term, b"", 1)]
    h.rt.step(AppendRequest(new_term, "n2", "n1", index, term, index + 1, entries))
    h.run()
    assert h.core.role is Role.FOLLOWER and h.core.commit == index + 1
    assert acks == [(0, index, term, "")]


def test_a_deposed_leader_fails_its_entry_if_another_one_commits_at_that_index() -> None:
    h, acks, index, term = _leader_with_pending(b"lost")
    new_term = term + 1
    replacement = [Entry(index, new_term, b"", 1)]
    h.rt.step(AppendRequest(new_term, "n2", "n1", index - 1, term, index, replacement))
    h.run()
    assert h.core.role is Role.FOLLOWER and h.core.commit == index
    assert len(acks) == 1 and acks[0][0] == FAILED and "overwritten" in acks[0][3]


def test_pending_appends_expire_on_the_injected_clock_with_an_unknown_outcome() -> None:
    h = Harness()
    h.elect()
    acks: list[tuple] = []
    h.rt.propose([b"slow"], lambda *a: acks.append(a))
    h.run()
    h.clock.t += 4.9
    h.rt.tick()
    assert acks == []
    h.clock.t += 0.2
    h.rt.tick()
    assert len(acks) == 1 and acks[0][0] == UNKNOWN_OUTCOME


def test_a_raising_listener_does_not_drop_the_rest_of_the_ready() -> None:
    h = Harness()
    seen: list[str] = []

    def bad(*args: object) -> None:
        seen.append("bad")
        raise RuntimeError("listener bug")

    h.rt.role_listeners.append(bad)
    h.rt.role_listeners.append(lambda *a: seen.append("role"))
    h.rt.commit_listeners.append(bad)
    h.rt.commit_listeners.append(lambda c: seen.append(f"commit {c}"))
    h.rt.leader_ready_listeners.append(lambda t: seen.append(f"ready {t}"))
    h.elect()
    acks: list[tuple] = []
    first, _ = h.rt.propose([b"x"], lambda *a: acks.append(a))
    h.run()
    h.disk.finish_sync()
    for p in ("n2", "n3"):
        h.rt.step(AppendResponse(h.core.term, p, "n1", True, first))
    h.run()
    assert "role" in seen and "ready 1" in seen and f"commit {first}" in seen
    assert acks and acks[0][0] == 0, "the acknowledgement after a failing listener still went out"


def test_appends_past_max_pending_are_refused_busy_with_nothing_appended() -> None:
    h = Harness()
    h.rt.max_pending = 2
    h.elect()
    acks: list[tuple] = []
    for payload in (b"a", b"b"):
        h.rt.propose([payload], lambda *a: acks.append(a))
    last = h.core.log.last_index
    with pytest.raises(Busy, match="max_pending_appends = 2"):
        h.rt.propose([b"c"], lambda *a: acks.append(a))
    assert h.core.log.last_index == last and len(h.rt.pending) == 2
    h.run()
    h.disk.finish_sync()
    for p in ("n2", "n3"):
        h.rt.step(AppendResponse(h.core.term, p, "n1", True, last))
    h.run()
    assert [a[0] for a in acks] == [0, 0] and not h.rt.pending
    h.rt.propose([b"c"], lambda *a: acks.append(a))  # room again once they committed
    assert h.core.log.last_index == last + 1


def test_a_membership_change_settles_like_an_append_and_listeners_hear_of_it_before_any_send() -> None:
    from ledger.membership import ADD, MembershipChange, MembershipError

    h = Harness()
    h.elect()
    h.rt.membership_listeners.append(lambda m: h.events.append(("membership", tuple(m.ids))))
    settled: list[tuple] = []
    index, term = h.rt.propose_membership(MembershipChange(ADD, "n4", "n4:1"), lambda *a: settled.append(a))
    h.events.clear()
    h.run()
    kinds = [e[0] for e in h.events]
    assert kinds[0] == "membership" and h.events[0][1] == ("n1", "n2", "n3", "n4")
    assert "send" in kinds and {m.dst for m in h.net.sent if m.term == term} >= {"n4"}  # the learner too
    with pytest.raises(MembershipError):  # one change at a time
        h.rt.propose_membership(MembershipChange(ADD, "n5", "n5:1"), lambda *a: None)
    h.disk.finish_sync()
    for p in ("n2", "n3"):
        h.rt.step(AppendResponse(term, p, "n1", True, index))
    h.run()
    assert settled == [(0, index, term, "")]
