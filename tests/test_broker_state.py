"""The broker's state machine alone: committed entries in, consume queues, offsets, topics,
de-duplication and key index out. No ledger, no sockets, no event loop."""

from __future__ import annotations

import pytest

from broker import codec
from broker.meta import offset_op, topic_op
from broker.state import BrokerState, Stored
from remoting.message import make_position, properties_to_bytes


def record(
    body: bytes, queue_id: int = 0, pid: str = "", seq: int = 0, topic: bytes = b"T", **props: str
) -> bytes:
    """A RocketMQ stored record; ``pid``/``seq`` become its UNIQ_KEY (the de-duplication key)."""
    if pid:
        props["UNIQ_KEY"] = f"{pid}-{seq}"
    raw = properties_to_bytes(props)
    return codec.build_stored_record(topic, queue_id, body, raw, 0, 0, 1, b"\x00" * 8, 2, b"\x00" * 8)


def encode_batch_entry(records: list[bytes]) -> bytes:
    """A batch entry: the records back to back, as RocketMQ's commit log holds a batch."""
    return b"".join(records)


def broken_record(body: bytes) -> bytes:
    """A record whose size is right but whose body length runs past its topic and properties."""
    raw = bytearray(record(body))
    raw[84:88] = (len(body) + 50).to_bytes(4, "big")
    return bytes(raw)


def applied(state: BrokerState, *payloads: bytes) -> list[list[Stored]]:
    """Apply payloads as the next entries; the placement of each.

    Also checks that a hint (the queue a master sent to) never changes a placement, whether
    it names the right queue, another one or none that exists, and that ``record_count``
    agrees with ``entry_records``.
    """
    first = state.applied + 1
    entries = list(enumerate(payloads, first))
    state.apply(entries)
    placed = [state.placement(i, p) for i, p in entries]
    hints = [(t.encode(), q) for t, q in state.queues] + [(b"no-such-topic", 0)]
    for hint in hints:
        assert [state.placement(i, p, hint) for i, p in entries] == placed, f"hint {hint}"
    for p in payloads:
        try:
            n = len(codec.entry_records(p))
        except codec.CodecError:
            with pytest.raises(codec.CodecError):
                codec.record_count(p)
        else:
            assert codec.record_count(p) == n
    return placed


def test_messages_get_queue_offsets_and_duplicates_point_at_the_copy_that_stands():
    state = BrokerState()
    applied(state, topic_op("T", 2, 2, 6), offset_op("g", "T", 1, 5))
    assert state.topics["T"].write_queue_nums == 2 and state.offsets[("g", "T", 1)] == 5
    assert state.data_version.counter == 1, "a topic change bumps the data version"
    (a,), (b,), (c,), (p,) = applied(
        state, record(b"a"), record(b"b", 1), record(b"c"), record(b"p", 0, "pid", 7)
    )
    assert [(x.queue_offset, x.duplicate) for x in (a, b, c, p)] == [
        (0, False),
        (0, False),
        (1, False),
        (2, False),
    ]
    assert p.ledger_index == 6 and p.position == make_position(6)
    ((again,),) = applied(state, record(b"p-retry", 0, "pid", 7))
    assert again == Stored(2, p.position, True), "a retried send is answered with the original's offset"
    assert state.offsets_of("T", 0) == (0, 3)
    assert state.dispatched_messages == 4 and state.applied == 7


def test_a_batch_entry_is_placed_slot_by_slot_even_with_duplicates_and_broken_records():
    state = BrokerState()
    applied(state, topic_op("T", 2, 2, 6), record(b"p1", 0, "pid", 1))
    broken = broken_record(b"zz")  # lengths no longer add up
    mixed = [
        record(b"a", 0, "pid", 2),
        record(b"b", 1),
        record(b"p1-again", 0, "pid", 1),
        broken,
        record(b"c", 1, "other", 1),
        record(b"p2-again", 0, "pid", 2),
    ]
    (r,) = applied(state, encode_batch_entry(mixed))
    assert [(x.queue_offset, x.duplicate) for x in r] == [
        (1, False),
        (0, False),
        (0, True),
        (-1, False),
        (1, False),
        (1, True),
    ]
    assert r[2].position == make_position(2) and r[5].position == make_position(3, 0)
    assert list(state.queue("T", 0).positions) == [make_position(2), make_position(3, 0)]
    assert list(state.queue("T", 1).positions) == [make_position(3, 1), make_position(3, 4)]


def test_a_resent_batch_whose_head_is_duplicate_places_its_new_tail_correctly():
    state = BrokerState()
    recs = [record(f"m{i}".encode(), 0, "pid", i + 1) for i in range(5)]
    (first,) = applied(state, encode_batch_entry(recs))
    (again,) = applied(state, encode_batch_entry([*recs[3:], record(b"m5", 0, "pid", 6)]))
    assert [(x.queue_offset, x.duplicate) for x in first] == [(i, False) for i in range(5)]
    assert [(x.queue_offset, x.duplicate) for x in again] == [(3, True), (4, True), (5, False)]
    assert again[0].position == first[3].position and again[2].position == make_position(2, 2)


def test_corrupt_entries_metadata_and_noops_place_nothing_and_do_not_stop_the_rest():
    state = BrokerState()
    good = encode_batch_entry([record(b"a"), record(b"b")])
    bad_meta = bytes((codec.KIND_META,)) + b"{not json"
    corrupt, meta, ok, broken_meta = applied(state, good[:-3], topic_op("T", 1, 1, 6), good, bad_meta)
    assert corrupt == [Stored(-1, make_position(1))]
    assert meta == [Stored(-1, make_position(2))]
    assert [x.queue_offset for x in ok] == [0, 1]
    assert broken_meta == [Stored(-1, make_position(4))]
    effects = state.apply([(5, b""), (6, b"\x09unknown")])  # a leader's no-op, an unknown record type
    assert state.applied == 6 and not effects.queues and not effects.topics_changed
    assert state.queue("T", 0).max_offset == 2


def test_effects_name_the_queues_that_got_messages_and_topic_changes():
    state = BrokerState()
    e1 = state.apply([(1, topic_op("T", 4, 4, 6))])
    assert e1.topics_changed and not e1.queues
    e2 = state.apply(
        [(2, record(b"x", 3)), (3, encode_batch_entry([record(b"y", 1), record(b"z", 1, topic=b"U")]))]
    )
    assert e2.queues == {("T", 3), ("T", 1), ("U", 1)} and not e2.topics_changed
    e3 = state.apply([(4, offset_op("g", "T", 3, 1))])
    assert not e3.topics_changed and not e3.queues, "an offset commit wakes nobody"


def test_apply_refuses_an_entry_twice_and_placement_of_an_entry_not_applied_yet():
    state = BrokerState()
    state.apply([(1, record(b"a"))])
    with pytest.raises(ValueError, match="applied twice"):
        state.apply([(1, record(b"a"))])
    with pytest.raises(ValueError, match="not applied yet"):
        state.placement(2, record(b"b"))
    state.skip_to(10)  # retention removed entries the state never saw
    state.apply([(11, record(b"b"))])
    assert state.queue("T", 0).max_offset == 2


def test_dedup_window_forgets_the_oldest_unique_keys():
    state = BrokerState(dedup_window=3)
    applied(state, *(record(b"m", 0, "pid", s) for s in range(1, 6)))
    assert list(state.uniq) == [b"pid-3", b"pid-4", b"pid-5"]
    ((old,),) = applied(state, record(b"m", 0, "pid", 1))
    assert not old.duplicate and old.queue_offset == 5, "outside the window a resend is stored again"
    ((recent,),) = applied(state, record(b"m", 0, "pid", 5))
    assert recent.duplicate and recent.queue_offset == 4
    with pytest.raises(ValueError, match="dedup_window"):
        BrokerState(dedup_window=0)


def test_key_index_and_snapshot_replay_into_a_fresh_state():
    state = BrokerState()
    ((k1,), (k2,)) = applied(state, record(b"a", KEYS="order-1 order-2"), record(b"b", KEYS="order-2"))
    applied(state, topic_op("T", 4, 4, 6), offset_op("g", "T", 3, 42))
    assert state.positions_by_key("T", "order-2") == [k1.position, k2.position]
    assert state.positions_by_key("T", "order-1") == [k1.position]
    assert state.positions_by_key("U", "order-1") == []
    fresh = BrokerState(applied=100)  # as after retention removed everything but a checkpoint
    fresh.apply([(101, state.snapshot_record())])
    assert fresh.topics["T"].read_queue_nums == 4 and fresh.offsets[("g", "T", 3)] == 42
    assert fresh.data_version.timestamp == 101
    assert fresh.topic_config_wrapper().topic_config_table.keys() == {"T"}


def test_offsets_of_forgets_messages_retention_removed():
    state = BrokerState()
    applied(state, *(record(bytes([65 + i])) for i in range(6)))
    assert state.offsets_of("T", 0) == (0, 6)
    assert state.offsets_of("T", 0, first_index=4) == (3, 6)
    assert state.queue_offset_of("T", 0, make_position(5)) == 4
    assert state.queue_offset_of("T", 0, make_position(2)) == -1
    assert state.offsets_of("T", 9) == (0, 0)


def _stored(
    body: bytes, store_ms: int, key: str, topic: bytes = b"T", queue_id: int = 0, **props: str
) -> bytes:
    """A stored record with a chosen store time (the de-duplication TTL's clock) and UNIQ_KEY."""
    raw = properties_to_bytes({"UNIQ_KEY": key, **props})
    return codec.build_stored_record(topic, queue_id, body, raw, 0, 0, 1, b"\x00" * 8, store_ms, b"\x00" * 8)


def test_dedup_keys_expire_by_the_records_store_time():
    state = BrokerState(dedup_window=1000, dedup_ttl_s=60)
    applied(state, _stored(b"a", 1_000, "k-a"), _stored(b"b", 30_000, "k-b"))
    ((dup,),) = applied(state, _stored(b"a", 50_000, "k-a"))
    assert dup.duplicate, "within the TTL a resend is de-duplicated"
    # 70 s: k-a (stored at 1 s) is older than 60 s and forgotten; k-b (30 s) is not.
    applied(state, _stored(b"c", 70_000, "k-c"))
    assert list(state.uniq) == [b"k-b", b"k-c"]
    ((again,),) = applied(state, _stored(b"a", 71_000, "k-a"))
    assert not again.duplicate and again.queue_offset == 3, "past the TTL a resend is stored again"
    # A new master whose clock lags the last one's does not bring forgotten keys back.
    applied(state, _stored(b"d", 65_000, "k-d"))
    assert b"k-a" in state.uniq and b"k-b" in state.uniq
    with pytest.raises(ValueError, match="dedup_ttl_s"):
        BrokerState(dedup_ttl_s=-1)


def test_batches_dispatched_in_bulk_match_record_by_record(monkeypatch):
    """The bulk path for uniform batches and the record-by-record path agree on every entry
    shape: uniform batches, unequal bodies, tags, keys, two queues, duplicates within a
    batch and of earlier entries, no properties, a truncated entry."""
    n = iter(range(1_000_000))

    def batch(
        k: int,
        *,
        size: int = 64,
        vary: bool = False,
        dup: str | None = None,
        late: bool = False,
        **props: str,
    ) -> bytes:
        recs = []
        for i in range(k):
            body = b"x" * (size + (i % 3 if vary else 0))
            key = dup if dup and i == k - 1 else f"K{next(n):031d}"
            recs.append(_stored(body, 1_000 + (i if late else 0), key, **props))
        return encode_batch_entry(recs)

    plain = encode_batch_entry(
        [codec.build_stored_record(b"T", 1, b"p", b"", 0, 0, 1, b"\0" * 8, 5, b"\0" * 8)] * 3
    )
    first = batch(5)
    resend_key = codec.parse_record(codec.entry_records(first)[2])[3].decode()
    twenty = batch(20)
    recent_key = codec.parse_record(codec.entry_records(twenty)[3])[3].decode()
    two_queues = encode_batch_entry([_stored(b"q", 9, f"Q{i:031d}", queue_id=i % 2) for i in range(4)])
    entries = [
        first,
        batch(7, vary=True),
        batch(4, TAGS="tagA"),
        batch(3, KEYS="order-1"),
        two_queues,
        batch(6, dup=resend_key),  # the last record repeats one of the first entry
        encode_batch_entry([_stored(b"z", 1, "DUP"), _stored(b"z", 1, "DUP")]),  # within one batch
        plain,
        batch(5)[:-7],  # truncated: nothing of it is stored
        batch(128, size=1024),
        batch(4, late=True),  # store times differ within the batch
        # 16 records and more are compared by strides: the same shapes again
        twenty,
        batch(20, late=True),
        batch(20, TAGS="tagA"),
        batch(20, dup=recent_key),  # repeats a key of ``twenty``
        encode_batch_entry([_stored(b"s" * 8, 7, f"S{i % 19:031d}") for i in range(20)]),  # a repeat
        encode_batch_entry(
            [codec.build_stored_record(b"T", 2, b"p", b"", 0, 0, 1, b"\0" * 8, 5, b"\0" * 8)] * 20
        ),
    ]
    bulk = BrokerState(dedup_window=200)
    taken = []
    uniform = BrokerState._dispatch_uniform

    def spy(self: BrokerState, index: int, data: bytes, touched: set) -> bool:
        took = uniform(self, index, data, touched)
        taken.append(took)
        return took

    monkeypatch.setattr(BrokerState, "_dispatch_uniform", spy)
    placed_bulk = applied(bulk, *entries)
    # in bulk: equal and unequal bodies, no properties; the rest record by record
    assert taken[:11] == [True, True, False, False, False, False, False, True, False, True, False]
    assert taken[-6:] == [True, False, False, False, False, True]
    one_by_one = BrokerState(dedup_window=200)
    monkeypatch.setattr(BrokerState, "_dispatch_uniform", lambda self, index, data, touched: False)
    placed_one = applied(one_by_one, *entries)
    assert placed_bulk == placed_one
    for key, cq in bulk.queues.items():
        other = one_by_one.queues[key]
        assert (list(cq.positions), list(cq.sizes), list(cq.tags)) == (
            list(other.positions),
            list(other.sizes),
            list(other.tags),
        ), key
    assert bulk.queues.keys() == one_by_one.queues.keys()
    assert list(bulk.uniq.items()) == list(one_by_one.uniq.items()) and len(bulk.uniq) == 200
    assert bulk.keys == one_by_one.keys and bulk.dispatched_messages == one_by_one.dispatched_messages
    # 286 records in all; the resends of earlier keys and the repeats within a batch are not stored
    assert bulk.dispatched_messages == 286 - 4 and placed_bulk[8] == [Stored(-1, make_position(9))]


# A committed entry the state machine cannot apply is skipped the same way on every replica;
# the group must go on applying what follows (these payloads once raised out of apply and
# wedged the group: every later send timed out and a restarted broker never led again).
UNAPPLIABLE_META = [
    b'\x02{"op":"snapshot","topics":[],"offsets":[]}',  # topics a list: AttributeError once
    b'\x02{"op":"offset","group":"g","topic":"T","queue":0,"offset":1e400}',  # inf: OverflowError
    b'\x02{"op":"offset","group":"g","topic":"T","queue":0,"offset":NaN}',
    b'\x02{"op":"offset","group":"g","topic":"T","queue":0,"offset":-5}',
    b'\x02{"op":"offset","group":"g","topic":"T","queue":0,"offset":' + b"9" * 4000 + b"}",
    b'\x02{"op":"offset","group":["g"],"topic":"T","queue":0,"offset":1}',
    b'\x02{"op":"topic","name":"X","read":"4","write":4,"perm":6}',
    b'\x02{"op":"topic","name":"X","read":4,"write":4,"perm":6,"order":"yes"}',
    b'\x02{"op":"snapshot","topics":{"X":{"read":1,"write":1,"perm":6}},"offsets":[["g","T",0]]}',
    b'\x02{"op":"snapshot","topics":{"X":[]},"offsets":[]}',
    b'\x02{"op":"rm -rf"}',
    b'\x02{"op":"offset","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # RecursionError once
    b"\x02" + b"{" * 5000,
    b"\x02\xff\xfe not utf-8",
    b"\x02[1, 2]",
    b"\x09unknown record type",
]


@pytest.mark.parametrize("payload", UNAPPLIABLE_META, ids=range(len(UNAPPLIABLE_META)))
def test_an_entry_no_replica_can_apply_is_skipped_and_the_group_goes_on(payload: bytes) -> None:
    state = BrokerState()
    applied(state, topic_op("T", 1, 1, 6))
    before = (dict(state.topics), dict(state.offsets), state.data_version)
    state.apply([(state.applied + 1, payload)])
    assert state.applied == 2 and state.skipped_entries == 1
    assert (dict(state.topics), dict(state.offsets), state.data_version) == before
    placed = applied(state, record(b"after", pid="p", seq=1), offset_op("g", "T", 0, 1))
    assert placed[0] == [Stored(0, make_position(3, 0))]
    assert state.offsets[("g", "T", 0)] == 1 and state.stats()["skipped_entries"] == 1


def test_the_metadata_the_broker_writes_still_applies() -> None:
    """The strict parser accepts every record the broker proposes, snapshots included."""
    state = BrokerState()
    applied(state, topic_op("T", 2, 3, 6, order=True), offset_op("g", "T", 1, 7))
    applied(state, offset_op("g", "T", 1, 3, forward=True))
    assert state.offsets[("g", "T", 1)] == 7
    other = BrokerState()
    applied(other, state.snapshot_record())
    assert other.topics == state.topics and other.offsets == state.offsets
    assert other.skipped_entries == 0 and other.topics["T"].order


def test_a_message_entry_that_breaks_apply_is_undone_and_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a record does that no check foresaw, its entry is taken back whole and the
    next entry applies: the state never stops on an entry's content."""
    state = BrokerState()
    real = codec.properties_in_place

    def explode(data: bytes, start: int, end: int) -> object:
        if b"BOOM" in data[start:end]:
            raise IndexError("a parser bug")
        return real(data, start, end)

    monkeypatch.setattr(codec, "properties_in_place", explode)
    good, bad = record(b"a", pid="p", seq=1, KEYS="k"), record(b"b", KEYS="BOOM")
    state.apply([(1, encode_batch_entry([good, bad]))])
    assert state.applied == 1 and state.skipped_entries == 1
    assert state.offsets_of("T", 0) == (0, 0) and not state.uniq and not state.positions_by_key("T", "k")
    placed = applied(state, record(b"c", pid="p", seq=1))
    assert placed == [[Stored(0, make_position(2, 0))]]


def test_the_registration_body_from_kept_entries_is_the_table_encoded_afresh() -> None:
    """The broker keeps each topic's registration entry encoded as topics change; the body it
    sends is byte for byte what encoding the whole table would give."""
    from remoting.jsonbody import dump_body

    state = BrokerState()
    applied(state, topic_op("T", 2, 3, 6, order=True), topic_op("U", 1, 1, 4), topic_op("T", 4, 4, 6))
    wrapper = state.topic_config_wrapper()
    assert wrapper.encoded_entries is not None and len(wrapper.encoded_entries) == 2
    assert wrapper.body() == dump_body(wrapper.to_json())
