"""The broker state's held messages and locks, entry by entry, with no I/O: scheduled messages
until due, half messages until their transaction ends, send-backs taken once, queue locks
with expiry. Every case is applied twice, to two states, which must agree (replicas)."""

from __future__ import annotations

import pytest

from broker import codec
from broker.meta import lock_op, txn_end_op, unlock_op
from broker.state import BrokerState
from broker.system_topics import HALF_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC
from remoting.message import make_position, properties_to_bytes

STORE_MS = 1_000_000


def record(topic: str, body: bytes, queue_id: int = 0, store_ms: int = STORE_MS, **props: str) -> bytes:
    raw = properties_to_bytes(props)
    return codec.build_stored_record(
        topic.encode(), queue_id, body, raw, 0, 0, 1, b"\x00" * 8, store_ms, b"\x00" * 8
    )


class Replicas:
    """Two broker states fed the same entries, checked to hold the same promises."""

    def __init__(self) -> None:
        self.states = (BrokerState(), BrokerState())
        self.index = 0

    def apply(self, *payloads: bytes) -> int:
        """Apply payloads as the next entries; the index of the first."""
        first = self.index + 1
        for state in self.states:
            state.apply(list(enumerate(payloads, first)))
        self.index += len(payloads)
        a, b = self.states
        assert a.schedule.pending == b.schedule.pending and a.halves.pending == b.halves.pending
        assert a.locks.held == b.locks.held and a.stats() == b.stats()
        return first

    @property
    def state(self) -> BrokerState:
        return self.states[0]

    def queue(self, topic: str, queue_id: int = 0) -> list[int]:
        cq = self.state.queue(topic, queue_id)
        return [] if cq is None else list(cq.positions)


def test_a_scheduled_message_is_held_then_delivered_exactly_once() -> None:
    r = Replicas()
    i = r.apply(
        record(SCHEDULE_TOPIC, b"later", queue_id=2, REAL_TOPIC="T", REAL_QID="1", TIMER_OUT_MS="1005000")
    )
    held = make_position(i, 0)
    assert r.state.schedule.pending == {held: 1_005_000}
    assert r.state.schedule.take_due(1_004_999, 10) == []
    taken = r.state.schedule.take_due(1_005_000, 10)
    assert taken == [(1_005_000, held)]
    copy = record("T", b"later", queue_id=1, REAL_TOPIC="T", REAL_QID="1")
    origin = codec.ORIGIN_SCHEDULED + held.to_bytes(8, "big")
    d = r.apply(codec.encode_derived([(origin, copy)]))
    assert r.queue("T", 1) == [make_position(d, 0)] and not r.state.schedule.pending
    placed = r.state.placement(d, codec.encode_derived([(origin, copy)]))
    assert placed[0].queue_offset == 0
    again = r.apply(codec.encode_derived([(origin, copy)]))  # a new master proposed it too
    assert r.queue("T", 1) == [make_position(d, 0)]
    assert r.state.placement(again, codec.encode_derived([(origin, copy)]))[0].queue_offset == -1
    assert r.state.delay_offsets(18) == {3: 1}


def test_due_times_order_delivery_and_unparseable_ones_are_due_at_once() -> None:
    r = Replicas()
    first = r.apply(
        record(TIMER_TOPIC, b"b", TIMER_OUT_MS="3000"),
        record(TIMER_TOPIC, b"a", TIMER_OUT_MS="2000"),
        record(TIMER_TOPIC, b"c", TIMER_OUT_MS="not-a-time", store_ms=2500),
    )
    positions = [make_position(first + k, 0) for k in range(3)]
    taken = r.state.schedule.take_due(10_000, 2)
    assert taken == [(2000, positions[1]), (2500, positions[2])]
    r.state.schedule.give_back(taken[:1])  # its delivery was not committed: due again
    assert r.state.schedule.take_due(10_000, 10) == [(2000, positions[1]), (3000, positions[0])]


def test_a_half_message_is_invisible_until_committed_and_a_rollback_is_final() -> None:
    r = Replicas()
    i = r.apply(
        record(HALF_TOPIC, b"tx1", REAL_TOPIC="T", REAL_QID="0", TRAN_MSG="true", PGROUP="pg"),
        record(HALF_TOPIC, b"tx2", REAL_TOPIC="T", REAL_QID="0", TRAN_MSG="true", PGROUP="pg"),
        record(HALF_TOPIC, b"tx3", PGROUP="pg", CHECK_IMMUNITY_TIME_IN_SECONDS="30"),
    )
    h1, h2, h3 = (make_position(i + k, 0) for k in range(3))
    assert set(r.state.halves.pending) == {h1, h2, h3} and r.queue("T") == []
    assert (
        r.state.halves.pending[h1].producer_group == "pg" and r.state.halves.pending[h3].immunity_ms == 30_000
    )
    commit = codec.encode_derived([(codec.ORIGIN_HALF + h1.to_bytes(8, "big"), record("T", b"tx1"))])
    c = r.apply(commit, txn_end_op(h2, "rollback"), txn_end_op(h3, "discard"))
    assert r.queue("T") == [make_position(c, 0)] and not r.state.halves.pending
    late = codec.encode_derived([(codec.ORIGIN_HALF + h2.to_bytes(8, "big"), record("T", b"tx2"))])
    r.apply(late, commit)  # a commit after the rollback, and the commit again: nothing stored
    assert r.queue("T") == [make_position(c, 0)]


def test_a_send_back_is_taken_once_and_held_for_its_delay() -> None:
    r = Replicas()
    key = codec.ORIGIN_SEND_BACK + (42).to_bytes(8, "big") + (0).to_bytes(4, "big") + b"cg"
    retry = record(SCHEDULE_TOPIC, b"m", queue_id=2, REAL_TOPIC="%RETRY%cg", TIMER_OUT_MS="2000")
    first = r.apply(codec.encode_derived([(key, retry)]), codec.encode_derived([(key, retry)]))
    assert r.state.schedule.pending == {make_position(first, 0): 2000}


def test_queue_locks_expire_by_the_masters_clock_in_the_entry() -> None:
    r = Replicas()
    q = [("T", 0), ("T", 1)]
    a = r.apply(lock_op("cg", "c1", q, now_ms=1000, expires_ms=61_000))
    b = r.apply(lock_op("cg", "c2", [("T", 1), ("T", 2)], now_ms=2000, expires_ms=62_000))
    assert r.state.lock_outcomes[a] == {("T", 0), ("T", 1)} and r.state.lock_outcomes[b] == {("T", 2)}
    c = r.apply(lock_op("cg", "c2", [("T", 1)], now_ms=61_000, expires_ms=121_000))  # c1's expired
    assert r.state.lock_outcomes[c] == {("T", 1)}
    r.apply(
        unlock_op("cg", "c1", [("T", 0)], now_ms=61_001), unlock_op("cg", "c1", [("T", 1)], now_ms=61_001)
    )
    assert r.state.locks.holder("cg", "T", 0, 61_002) is None
    assert r.state.locks.holder("cg", "T", 1, 61_002) == "c2"  # not c1's to unlock any more
    other = r.apply(lock_op("other-group", "c1", [("T", 1)], now_ms=61_003, expires_ms=121_003))
    assert r.state.lock_outcomes[other] == {("T", 1)}  # locks are per consumer group


def test_a_derived_record_from_before_the_retained_log_is_stored_once() -> None:
    """After retention, a replay meets deliveries whose scheduled message it never saw: the
    first is stored, a second of the same origin is not."""
    state = BrokerState(applied=100)
    origin = codec.ORIGIN_SCHEDULED + make_position(50, 0).to_bytes(8, "big")
    entry = codec.encode_derived([(origin, record("T", b"x"))])
    state.apply([(101, entry), (102, entry)])
    assert list(state.queue("T", 0).positions) == [make_position(101, 0)]


@pytest.mark.parametrize(
    "entry",
    [
        b"\x03",
        b"\x03\x00\x02\x00\x01S",  # two origins announced, one given
        codec.encode_derived([(b"S" + b"\x00" * 8, record("T", b"x"))])[:-3],  # record cut short
    ],
)
def test_a_malformed_derived_entry_is_skipped(entry: bytes) -> None:
    state = BrokerState()
    state.apply([(1, entry), (2, record("T", b"after"))])
    assert state.skipped_entries == 1 and list(state.queue("T", 0).positions) == [make_position(2, 0)]
