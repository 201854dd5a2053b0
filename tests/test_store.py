"""The segmented log store against real files: layout, recovery, corruption, truncation, retention, sync."""

from __future__ import annotations

import gc
import json
import logging
import os
import random
import threading
from pathlib import Path

import pytest

import ledger.store as store_mod
from ledger.codec import HEADER_SIZE, Entry, decode_entries
from ledger.hardstate import HardState, HardStateError
from ledger.store import CorruptLogError, LogStore

SEG = 4096


def make(index: int, term: int, size: int | None = None, rng: random.Random | None = None) -> Entry:
    rng = rng or random.Random(index)
    n = rng.randrange(10, 300) if size is None else size
    return Entry(index, term, rng.randbytes(n))


def fill(store: LogStore, count: int, term: int = 1, batch: int = 16) -> list[Entry]:
    """Append ``count`` entries in batches and sync, returning copies for later comparison."""
    out = []
    while count > 0:
        k = min(batch, count)
        first = store.last_index + 1
        es = [make(i, term) for i in range(first, first + k)]
        store.append(es)
        out.extend(Entry(e.index, e.term, bytes(e.data), e.kind) for e in es)
        count -= k
    store.sync()
    return out


def seg_files(d: Path) -> list[Path]:
    return sorted(d.glob("*.seg"))


def open_store(d: Path, **kw) -> LogStore:
    kw.setdefault("segment_bytes", SEG)
    kw.setdefault("cache_bytes", 0)  # most tests want reads to hit the files
    return LogStore(d, **kw)


def file_offset(d: Path, entry: Entry) -> tuple[Path, int]:
    """The segment holding ``entry`` and its byte offset there."""
    seg = [p for p in seg_files(d) if int(p.stem) <= entry.pos][-1]
    return seg, entry.pos - int(seg.stem)


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


# ---------------------------------------------------------------------- layout and round trip


def test_round_trip_across_rollovers(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    want = fill(s, 300, term=1)
    big = Entry(301, 2, b"B" * (SEG * 2))  # larger than a segment: gets one of its own
    s.append([big])
    want.append(Entry(301, 2, big.data))
    want += fill(s, 40, term=3, batch=40)
    assert s.last_index == 341 and s.last_term == 3
    got = s.entries(1, 10_000)
    assert got == want
    assert all(e.raw is not None and e.pos >= 0 for e in got)
    files = seg_files(tmp_path)
    assert len(files) > 5
    starts = [int(p.stem) for p in files]
    by_pos = {e.pos: e for e in got}
    assert all(start in by_pos for start in starts), "every segment is named by its first entry's position"
    sizes = {p: p.stat().st_size for p in files}
    oversized = [p for p in files if sizes[p] > SEG]
    assert [int(p.stem) for p in oversized] == [got[300].pos] and sizes[oversized[0]] == big.size
    assert sum(sizes.values()) == s.size_bytes() == s.next_pos()
    for p in files:  # a segment is whole entries only, and its index agrees
        es = decode_entries(p.read_bytes())
        assert (p.with_suffix(".idx")).stat().st_size == 24 * len(es)
    s.close()


def test_entries_ranges_and_max_bytes(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 100)
    assert s.entries(101, 200) == []
    assert [e.index for e in s.entries(95, 1000)] == list(range(95, 101))
    with pytest.raises(IndexError):
        s.entries(0, 5)
    one = s.entries(10, 50, max_bytes=1)
    assert [e.index for e in one] == [10], "at least one entry even when it alone exceeds max_bytes"
    budget = sum(e.size for e in s.entries(10, 19))
    assert [e.index for e in s.entries(10, 50, max_bytes=budget)] == list(range(10, 20))
    assert [e.index for e in s.entries(10, 50, max_bytes=budget + 1)] == list(range(10, 20))
    s.close()


def test_tail_cache_serves_recent_entries_without_disk(tmp_path: Path) -> None:
    s = open_store(tmp_path, cache_bytes=2000)
    fill(s, 200)
    es = [make(i, 2, size=100) for i in range(201, 211)]
    s.append(es)
    got = s.entries(201, 210)
    assert all(a is b for a, b in zip(got, es, strict=True)), (
        "fresh entries come from the cache, not a re-read"
    )
    assert s.entries(1, 3)[0].index == 1  # old ones still readable from the files
    mixed = s.entries(150, 210)
    assert [e.index for e in mixed] == list(range(150, 211))
    s.close()


def test_append_rejects_gaps_and_decreasing_terms(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 3, term=2)
    with pytest.raises(ValueError):
        s.append([make(5, 2)])
    with pytest.raises(ValueError):
        s.append([make(4, 2), make(6, 2)])
    with pytest.raises(ValueError):
        s.append([make(4, 1)])
    with pytest.raises(ValueError):
        s.append([make(4, 3), make(5, 2)])
    assert s.last_index == 3 and s.next_pos() == s.size_bytes()
    s.append([make(4, 2)])
    assert s.last_index == 4
    s.close()


def test_follower_writes_leader_bytes_verbatim(tmp_path: Path) -> None:
    leader = open_store(tmp_path / "a")
    fill(leader, 120)
    follower = open_store(tmp_path / "b")
    sent = leader.entries(1, 120)
    follower.append(sent)
    follower.sync()
    a = [p.read_bytes() for p in seg_files(tmp_path / "a")]
    b = [p.read_bytes() for p in seg_files(tmp_path / "b")]
    assert a == b and [p.name for p in seg_files(tmp_path / "a")] == [
        p.name for p in seg_files(tmp_path / "b")
    ]
    leader.close()
    follower.close()


# ---------------------------------------------------------------------- restart and recovery


def test_reopen_preserves_everything(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    want = fill(s, 150, term=1) + fill(s, 150, term=4)
    state = (s.first_index, s.last_index, s.last_term, s.next_pos(), s.size_bytes())
    terms = [s.term_at(i) for i in range(0, 301)]
    s.close()
    r = open_store(tmp_path)
    assert (r.first_index, r.last_index, r.last_term, r.next_pos(), r.size_bytes()) == state
    assert r.durable_index == r.last_index
    assert [r.term_at(i) for i in range(0, 301)] == terms
    assert r.entries(1, 300) == want
    more = fill(r, 20, term=5)
    r.close()
    r = open_store(tmp_path)
    assert r.entries(1, 320) == want + more
    r.close()


def test_missing_or_bad_index_is_rebuilt(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    want = fill(s, 200)
    s.close()
    idx = sorted(tmp_path.glob("*.idx"))
    idx[0].unlink()  # missing
    idx[1].write_bytes(idx[1].read_bytes()[:-24])  # short
    raw = bytearray(idx[2].read_bytes())
    raw[8:16] = (7).to_bytes(8, "little")  # first record claims term 7: inconsistent with the data
    idx[2].write_bytes(bytes(raw))
    r = open_store(tmp_path)
    assert r.entries(1, 200) == want
    assert [r.term_at(i) for i in range(1, 201)] == [1] * 200
    assert idx[0].exists() and idx[1].stat().st_size % 24 == 0
    r.close()
    r = open_store(tmp_path)
    assert r.entries(1, 200) == want
    r.close()


def test_index_lying_about_a_term_is_caught_on_read(tmp_path: Path) -> None:
    s = open_store(tmp_path, segment_bytes=1 << 20)
    fill(s, 10, term=1)
    fill(s, 10, term=2)
    fill(s, 1, term=3)  # rolls nothing; add a second segment so the first one is sealed
    s.append([make(22, 3, size=(1 << 20))])
    s.sync()
    s.close()
    idx = sorted(tmp_path.glob("*.idx"))[0]
    raw = bytearray(idx.read_bytes())
    rec = 10  # entry 11: term 2 on disk; the index now says 1 (still monotonic, so recovery trusts it)
    raw[rec * 24 + 8 : rec * 24 + 16] = (1).to_bytes(8, "little")
    idx.write_bytes(bytes(raw))
    r = open_store(tmp_path, segment_bytes=1 << 20)
    with pytest.raises(CorruptLogError) as info:
        r.entries(11, 11)
    assert info.value.path == str(seg_files(tmp_path)[0]) and "mismatch" in info.value.reason
    r.close()


def _cut_last_entry(tmp_path: Path, how: str) -> tuple[list[Entry], Path, int]:
    s = open_store(tmp_path)
    want = fill(s, 60)
    last = s.entries(60, 60)[0]
    s.close()
    path, off = file_offset(tmp_path, last)
    size = path.stat().st_size
    if how == "mid-header":
        os.truncate(path, off + 10)
    elif how == "mid-body":
        os.truncate(path, off + HEADER_SIZE + 3)
    elif how == "garbage":
        with open(path, "ab") as f:
            f.write(random.Random(1).randbytes(777))
        return want, path, size
    elif how == "zeros":
        with open(path, "ab") as f:
            f.write(bytes(5000))
        return want, path, size
    return want[:-1], path, off


@pytest.mark.parametrize("how", ["mid-header", "mid-body", "garbage", "zeros"])
def test_torn_tail_is_truncated(tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture) -> None:
    want, path, good_end = _cut_last_entry(tmp_path, how)
    with caplog.at_level(logging.WARNING, logger="ledger.store"):
        r = open_store(tmp_path)
    assert r.last_index == len(want)
    assert r.entries(1, 1000) == want
    assert path.stat().st_size == good_end
    assert any(str(path) in rec.getMessage() and str(good_end) in rec.getMessage() for rec in caplog.records)
    fill(r, 5, term=2)  # the log continues cleanly after the cut
    r.close()
    r = open_store(tmp_path)
    assert r.last_index == len(want) + 5 and r.last_term == 2
    r.close()


def test_bit_flip_in_last_entry_is_a_torn_tail(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    want = fill(s, 50)
    last = s.entries(50, 50)[0]
    s.close()
    path, off = file_offset(tmp_path, last)
    flip(path, off + HEADER_SIZE + 5)
    r = open_store(tmp_path)
    assert r.last_index == 49 and r.entries(1, 49) == want[:49]
    assert path.stat().st_size == off
    r.close()


@pytest.mark.parametrize("where", ["body", "size-field"])
def test_bit_flip_mid_log_on_recovery_names_file_and_offset(tmp_path: Path, where: str) -> None:
    s = open_store(tmp_path, segment_bytes=1 << 20)  # one segment, so recovery scans it all
    fill(s, 80)
    victim = s.entries(40, 40)[0]
    s.close()
    path, off = file_offset(tmp_path, victim)
    flip(path, off + (HEADER_SIZE + 1 if where == "body" else 5))
    before = path.read_bytes()
    with pytest.raises(CorruptLogError) as info:
        open_store(tmp_path, segment_bytes=1 << 20)
    assert info.value.path == str(path) and info.value.offset == off
    assert f"{path} at offset {off}" in str(info.value)
    assert path.read_bytes() == before, "corruption must not be 'repaired' by truncation"


def test_bit_flip_in_earlier_segment_is_reported_on_read(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 200)
    victim = s.entries(5, 5)[0]
    s.close()
    path, off = file_offset(tmp_path, victim)
    assert path != seg_files(tmp_path)[-1]
    flip(path, off + HEADER_SIZE + 2)
    r = open_store(tmp_path)  # earlier segments are trusted via their index on recovery
    assert r.entries(1, 4)[-1].index == 4
    with pytest.raises(CorruptLogError) as info:
        r.entries(1, 10)
    assert info.value.path == str(path) and info.value.offset == off and "checksum" in info.value.reason
    r.close()
    assert not path.with_suffix(".idx").exists(), "the index that hid the damage must not be trusted again"
    r = open_store(tmp_path, salvage=True)  # the restart's scan finds it and keeps the prefix
    assert r.lost_from == 5 and r.last_index == 4 and r.entries(1, 4)[-1].index == 4
    r.close()


def test_damaged_earlier_segment_without_index_fails_recovery(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 200)
    victim = s.entries(5, 5)[0]
    s.close()
    path, off = file_offset(tmp_path, victim)
    flip(path, off + HEADER_SIZE + 2)
    path.with_suffix(".idx").unlink()  # forces a scan, which must not skip the bad entry
    with pytest.raises(CorruptLogError) as info:
        open_store(tmp_path)
    assert info.value.path == str(path) and info.value.offset == off


def test_torn_earlier_segment_or_missing_segment_is_corruption(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 200)
    s.close()
    files = seg_files(tmp_path)
    files[2].unlink()
    files[2].with_suffix(".idx").unlink()
    with pytest.raises(CorruptLogError) as info:
        open_store(tmp_path)
    assert info.value.path == str(files[3]) and "missing" in info.value.reason
    os.truncate(files[1], files[1].stat().st_size - 7)
    with pytest.raises(CorruptLogError) as info:
        open_store(tmp_path)
    assert info.value.path == str(files[1])


@pytest.mark.parametrize("damage", ["bit-flip", "zeroed-hole"])
def test_salvage_keeps_the_prefix_before_mid_log_damage(tmp_path: Path, damage: str) -> None:
    s = open_store(tmp_path, segment_bytes=1 << 20)
    want = fill(s, 80)
    victim = s.entries(40, 40)[0]
    s.close()
    path, off = file_offset(tmp_path, victim)
    if damage == "bit-flip":
        flip(path, off + HEADER_SIZE + 1)
    else:  # a power loss left a page-sized run of zeros inside data written before it
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(bytes(300))
    r = open_store(tmp_path, segment_bytes=1 << 20, salvage=True)
    assert r.lost_from == 40 and str(path) in r.lost_reason
    assert r.lost_claim == (80, 1), "the valid entries past the damage say how far the log reached"
    assert r.last_index == 39 and r.entries(1, 39) == want[:39]
    assert path.stat().st_size == off
    fill(r, 3, term=2)  # the repaired log takes the leader's entries again
    r.close()
    r = open_store(tmp_path, segment_bytes=1 << 20)  # the loss is remembered until the node refetched
    assert r.lost_from == 40 and r.lost_claim == (80, 1) and r.last_index == 42
    assert r.entries(1, 39) == want[:39]
    r.forget_damage()
    r.close()
    r = open_store(tmp_path, segment_bytes=1 << 20)
    assert r.lost_from is None and r.last_index == 42
    r.close()


@pytest.mark.parametrize("how", ["emptied", "cut-short"])
def test_a_log_ending_before_its_durable_mark_knows_it_lost_entries(tmp_path: Path, how: str) -> None:
    s = open_store(tmp_path, mark_interval_s=0.0)  # every sync records what it made durable
    want = fill(s, 60)
    s.close()
    files = seg_files(tmp_path)
    if how == "emptied":
        for p in [*files, *tmp_path.glob("*.idx")]:
            os.truncate(p, 0)
    else:  # cut on an entry boundary: recovery alone sees a clean, shorter log
        for p in files[1:]:
            p.unlink()
            p.with_suffix(".idx").unlink()
    r = open_store(tmp_path, salvage=True)  # as a node opens it
    assert r.lost_claim == (60, 1) and r.lost_from == r.last_index + 1 and r.last_index < 60
    assert r.entries(1, r.last_index) == want[: r.last_index]
    r.close()
    r = open_store(tmp_path, salvage=True)  # still known after a restart, until the node caught up
    assert r.lost_claim == (60, 1)
    fill(r, 60 - r.last_index)
    r.forget_damage()
    r.close()
    r = open_store(tmp_path)
    assert r.lost_claim is None and r.lost_from is None, "a log that reached the mark again is whole"
    r.close()


def test_a_mark_that_cannot_be_written_does_not_fail_the_sync(tmp_path: Path, caplog) -> None:
    """A full disk can refuse the mark a sync writes after its fsyncs: the entries are durable
    all the same, so the sync succeeds (it had stopped the node, which a full disk should only
    demote), and the mark is owed again; once it can be written, it is."""
    from ledger.store import MARK_NAME

    s = open_store(tmp_path, mark_interval_s=0.0)
    blocker = tmp_path / MARK_NAME
    blocker.mkdir()  # the mark's name taken by a non-empty directory: its rename fails
    (blocker / "x").write_bytes(b"x")
    with caplog.at_level("WARNING", logger="ledger.store"):
        fill(s, 20)
    assert s.durable_index == 20
    assert "could not record the durable mark" in caplog.text
    fill(s, 5)  # the store still takes writes and syncs
    assert s.durable_index == 25
    (blocker / "x").unlink()
    blocker.rmdir()
    fill(s, 5)
    assert blocker.is_file(), "the owed mark was written once it could be"
    s.close()
    r = open_store(tmp_path, salvage=True)
    assert r.last_index == 30 and r.lost_claim is None
    r.close()


def test_without_a_mark_a_short_log_is_a_short_log(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 60)
    s.close()
    for p in seg_files(tmp_path)[1:]:
        p.unlink()
    r = open_store(tmp_path)
    assert r.lost_claim is None and r.lost_from is None and r.last_index < 60
    r.close()


#: Losses after the last durable mark, and what a restart makes of them (the residual window the
#: store's docstring states): True when the store knows it lost entries it had made durable.
MARK_WINDOW = {
    "cut-before-mark": True,  # the log ends before the mark: detected
    "cut-after-mark": False,  # only entries synced after the last mark: a clean, shorter log
    "torn-after-mark": False,  # the last entry, synced after the mark, damaged: a torn write
    "cut-after-clean-stop": True,  # a clean stop marks everything durable: detected
    "cut-after-quiet-mark": True,  # the log went quiet for an interval: its owed mark is written
    "cut-and-mark-deleted": False,  # the mark lost with the entries: nothing to compare with
}


@pytest.mark.parametrize("case", sorted(MARK_WINDOW))
def test_what_the_durable_mark_can_and_cannot_tell(tmp_path: Path, case: str) -> None:
    """A mark is written by at most one sync per interval (here: the first), so entries made
    durable after it and then lost look exactly like writes a crash cut short. This pins the
    window down, so that narrowing or widening it is a visible change."""
    s = open_store(tmp_path, segment_bytes=1 << 20, mark_interval_s=3600.0)
    want = fill(s, 20)  # the first sync records the mark (20, 1)
    want += fill(s, 20)  # durable, but no mark for another hour
    assert s.durable_index == 40
    cut_at = 10 if case == "cut-before-mark" else 31
    victim = s.entries(cut_at, cut_at)[0]
    last = s.entries(40, 40)[0]
    assert not s.mark_due(), "a mark is owed only once the interval has passed"
    if case == "cut-after-clean-stop":
        s.mark_durable()
    elif case == "cut-after-quiet-mark":
        s.mark_interval_s = 0.0  # as if the interval passed with no sync to carry a mark
        assert s.mark_due()
        store_mod.write_file_atomically(*s.prepare_mark())  # what the node's tick does
        assert not s.mark_due(), "one mark per quiet spell, not one per tick"
    s.close()  # otherwise a crash: nothing more is written
    seg, off = file_offset(tmp_path, victim)
    if case == "torn-after-mark":
        seg, off = file_offset(tmp_path, last)
        flip(seg, off + HEADER_SIZE + 1)
    else:
        os.truncate(seg, off)
    if case == "cut-and-mark-deleted":
        (tmp_path / store_mod.MARK_NAME).unlink()
    r = open_store(tmp_path, segment_bytes=1 << 20, salvage=True)  # as a node opens it
    try:
        assert r.last_index < 40 and r.entries(1, r.last_index) == want[: r.last_index]
        if MARK_WINDOW[case]:
            assert r.lost_from == r.last_index + 1 and r.lost_claim is not None, r
            assert r.lost_claim == ((20, 1) if case == "cut-before-mark" else (40, 1)), r.lost_claim
        else:
            assert r.lost_from is None and r.lost_claim is None, (
                f"{case} was detected after all: {r.lost_claim}"
            )
    finally:
        r.close()


def test_salvage_cuts_a_damaged_earlier_segment_and_drops_later_ones(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    want = fill(s, 200)
    victim = s.entries(30, 30)[0]
    s.close()
    path, off = file_offset(tmp_path, victim)
    flip(path, off + HEADER_SIZE + 2)
    path.with_suffix(".idx").unlink()  # forces the scan that finds the damage
    r = open_store(tmp_path, salvage=True)
    assert r.lost_from == 30 and r.last_index == 29 and r.entries(1, 29) == want[:29]
    assert r.lost_claim == (200, 1)
    assert seg_files(tmp_path)[-1] == path and path.with_suffix(".idx").exists()
    fill(r, 5, term=2)
    r.close()
    r = open_store(tmp_path)
    assert r.last_index == 34 and r.entries(1, 29) == want[:29]
    r.close()


def test_salvage_after_a_missing_segment_keeps_what_precedes_it(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    want = fill(s, 200)
    s.close()
    files = seg_files(tmp_path)
    files[2].unlink()
    r = open_store(tmp_path, salvage=True)
    assert r.next_pos() == int(files[2].stem), "everything before the gap is kept"
    assert r.lost_from == r.last_index + 1 and r.entries(1, 1000) == want[: r.last_index]
    assert seg_files(tmp_path) == files[:2] and r.lost_claim == (200, 1)
    r.close()


# ---------------------------------------------------------------------- truncation and reset


def test_truncate_suffix_then_new_terms_then_reopen(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    want = fill(s, 200, term=1)
    nsegs = len(seg_files(tmp_path))
    s.truncate_suffix(60)
    assert (s.last_index, s.last_term, s.durable_index) == (59, 1, 59)
    assert len(seg_files(tmp_path)) < nsegs
    assert s.next_pos() == sum(p.stat().st_size for p in seg_files(tmp_path))
    with pytest.raises(IndexError):
        s.term_at(60)
    new = fill(s, 30, term=3)
    assert s.entries(1, 89) == want[:59] + new
    s.close()
    r = open_store(tmp_path)
    assert r.last_index == 89 and r.last_term == 3 and r.term_at(59) == 1 and r.term_at(60) == 3
    assert r.entries(1, 89) == want[:59] + new
    with pytest.raises(ValueError):
        r.truncate_suffix(0)
    r.close()


def test_truncate_at_segment_boundary_and_within_cache(tmp_path: Path) -> None:
    s = open_store(tmp_path, cache_bytes=1 << 20)
    fill(s, 200)
    boundary = int(seg_files(tmp_path)[3].stem)
    first_of_seg = next(e.index for e in s.entries(1, 200) if e.pos == boundary)
    s.truncate_suffix(first_of_seg)
    assert s.next_pos() == boundary and s.last_index == first_of_seg - 1
    s.append([make(first_of_seg, 2, size=50)])
    assert s.entries(first_of_seg, first_of_seg)[0].term == 2
    s.sync()
    s.close()
    r = open_store(tmp_path)
    assert r.last_index == first_of_seg and r.term_at(first_of_seg) == 2
    r.close()


def test_reset_then_reopen(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 100)
    s.reset(500, 7, 1_000_000)
    assert (s.first_index, s.last_index, s.last_term, s.durable_index) == (501, 500, 7, 500)
    assert s.term_at(500) == 7 and s.next_pos() == 1_000_000 and s.size_bytes() == 0
    assert seg_files(tmp_path) == []
    with pytest.raises(IndexError):
        s.term_at(499)
    s.close()
    r = open_store(tmp_path)
    assert (r.first_index, r.last_index, r.last_term, r.next_pos()) == (501, 500, 7, 1_000_000)
    assert r.entries(501, 600) == []
    new = [make(i, 8) for i in range(501, 521)]
    r.append(new)
    r.sync()
    assert seg_files(tmp_path)[0].name == f"{1_000_000:020d}.seg"
    r.close()
    r = open_store(tmp_path)
    assert r.last_index == 520 and r.term_at(500) == 7 and r.entries(501, 520) == new
    with pytest.raises(IndexError):
        r.entries(500, 510)
    r.close()


# ---------------------------------------------------------------------- retention


def test_retention_by_size(tmp_path: Path) -> None:
    s = open_store(tmp_path, retention_bytes=3 * SEG)
    want = fill(s, 300)
    files = seg_files(tmp_path)
    total = sum(p.stat().st_size for p in files)
    assert s.apply_retention(1) == 1, "nothing is below upto_index=1"
    first = s.apply_retention(100)
    assert 1 < first <= 100
    seg0 = s._segs[0]
    assert s.size_bytes() <= 3 * SEG or seg0.last_index >= 100, "stopped for a reason"
    assert s.size_bytes() == total - seg0.start == sum(p.stat().st_size for p in seg_files(tmp_path))
    assert s.term_at(first - 1) == 1 and s.first_index == first
    with pytest.raises(IndexError):
        s.entries(first - 1, first)
    remaining = seg_files(tmp_path)
    assert remaining == files[len(files) - len(remaining) :]
    assert s.entries(first, first)[0].pos == int(remaining[0].stem) and s.size_bytes() > 3 * SEG - SEG
    first = s.apply_retention(10_000)  # everything is old enough, but the last segment stays
    assert s.size_bytes() <= 3 * SEG and s.last_index == 300 and len(seg_files(tmp_path)) >= 1
    s.close()
    r = open_store(tmp_path, retention_bytes=3 * SEG)
    assert r.first_index == first and r.entries(first, 300) == want[first - 1 :]
    assert r.term_at(first - 1) == 1
    r.close()


def test_retention_by_age(tmp_path: Path) -> None:
    s = open_store(tmp_path, retention_seconds=3600)
    fill(s, 200)
    files = seg_files(tmp_path)
    now = files[-1].stat().st_mtime
    assert s.apply_retention(1000, now=now) == 1
    for p in files[:3]:
        os.utime(p, (now - 7200, now - 7200))
    first = s.apply_retention(1000, now=now)
    assert seg_files(tmp_path) == files[3:]
    assert s.entries(first, first)[0].pos == int(files[3].stem)
    s.close()
    r = open_store(tmp_path)
    assert r.first_index == first and r.last_index == 200
    r.close()


def test_recovery_finishes_interrupted_retention(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = open_store(tmp_path, retention_bytes=1)
    fill(s, 200)
    files = seg_files(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(LogStore, "_delete_segment", lambda self, seg: None)  # crash after the base is saved
        first = s.apply_retention(120)
    assert first > 1 and seg_files(tmp_path) == files
    s.close()
    r = open_store(tmp_path)
    assert r.first_index == first and r.last_index == 200
    assert seg_files(tmp_path)[0].stem == f"{r.entries(first, first)[0].pos:020d}"
    r.close()


# ---------------------------------------------------------------------- term_at


def test_term_at_edges(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    assert (s.first_index, s.last_index, s.last_term, s.durable_index, s.next_pos()) == (1, 0, 0, 0, 0)
    assert s.term_at(0) == 0
    for bad in (-1, 1):
        with pytest.raises(IndexError):
            s.term_at(bad)
    s.append([make(1, 2), make(2, 2), make(3, 5)])
    assert [s.term_at(i) for i in range(4)] == [0, 2, 2, 5]
    with pytest.raises(IndexError):
        s.term_at(4)
    s.close()


# ---------------------------------------------------------------------- sync


def test_sync_job_in_thread_while_appending(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 10)
    s.append([make(11, 1), make(12, 1)])
    assert s.durable_index == 10, "append alone never claims durability"
    job = s.prepare_sync()
    assert job.target == 12
    t = threading.Thread(target=job.run)
    t.start()
    for i in range(13, 120):  # keep appending, rolling segments, while the job runs
        s.append([make(i, 1)])
    t.join()
    assert s.complete_sync(job) == 12 == s.durable_index
    assert s.sync() == 119 == s.durable_index
    s.close()


def test_durable_index_advances_only_in_job_order(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    s.append([make(1, 1)])
    j1 = s.prepare_sync()
    s.append([make(2, 1)])
    j2 = s.prepare_sync()
    j2.run()
    assert s.complete_sync(j2) == 0, "j1's writes are not flushed yet"
    j1.run()
    assert s.complete_sync(j1) == 2
    s.close()


def test_truncation_clips_jobs_in_flight(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 5)
    s.append([make(6, 1), make(7, 1)])
    job = s.prepare_sync()
    s.truncate_suffix(6)
    s.append([make(6, 2)])
    job.run()
    assert s.complete_sync(job) == 5, "the job never flushed the new entry 6"
    assert s.sync() == 6
    s.close()


def test_sync_flushes_rolled_segments_and_skips_clean_files(tmp_path: Path, monkeypatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(store_mod, "_datasync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")))
    s = open_store(tmp_path)
    s.append([make(1, 1, size=SEG // 2)])
    s.sync()
    assert [Path(p).name for p in synced] == ["00000000000000000000.seg", tmp_path.name]
    synced.clear()
    s.sync()
    assert synced == [], "no new writes, no fsync"
    s.append([make(2, 1, size=SEG // 2)])  # rolls: segment 0 must still be flushed with its index
    s.sync()
    second = f"{HEADER_SIZE + SEG // 2:020d}.seg"
    want = ["00000000000000000000.seg", "00000000000000000000.idx", second, tmp_path.name]
    assert sorted(Path(p).name for p in synced) == sorted(want)
    s.close()


def test_failed_fsync_poisons_the_store(tmp_path: Path, monkeypatch) -> None:
    s = open_store(tmp_path)
    s.append([make(1, 1)])

    def boom(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(store_mod, "_datasync", boom)
    with pytest.raises(OSError):
        s.sync()
    assert s.durable_index == 0
    monkeypatch.undo()
    with pytest.raises(OSError, match="restart"):
        s.append([make(2, 1)])
    s.close()


@pytest.mark.parametrize("fail_at", [1, 2, 3])
def test_a_failed_write_leaves_the_log_as_it_was_and_writable(
    tmp_path: Path, monkeypatch, fail_at: int
) -> None:
    """A full disk (ENOSPC) mid-batch, also across a segment roll: the partial batch is cut off,
    the store takes writes once space is back, and a restart reads exactly the good entries.
    (Before: the first failed write poisoned the store until a restart.)"""
    s = open_store(tmp_path, segment_bytes=600)
    fill(s, 3)
    s.sync()
    real = os.pwrite
    calls = {"n": 0}

    def full(fd: int, data, offset: int) -> int:  # noqa: ANN001 - bytes or memoryview
        calls["n"] += 1
        if calls["n"] >= fail_at:
            raise OSError(28, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(store_mod.os, "pwrite", full)
    with pytest.raises(OSError, match="No space"):
        s.append([make(4 + i, 1, size=200) for i in range(4)])
    monkeypatch.setattr(store_mod.os, "pwrite", real)
    assert s.last_index == 3
    more = [make(4 + i, 2, size=150) for i in range(5)]
    s.append(more)
    s.sync()
    assert [e.data for e in s.entries(4, 8)] == [e.data for e in more]
    s.close()
    s = open_store(tmp_path, segment_bytes=600)
    assert s.last_index == 8 and [e.term for e in s.entries(1, 8)] == [1, 1, 1, 2, 2, 2, 2, 2]
    s.close()


# ---------------------------------------------------------------------- hard state


def test_hardstate_save_reload_and_skip_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "state" / "hardstate"
    hs = HardState(path)
    assert (hs.term, hs.voted_for) == (0, None)
    hs.save(3, "n2")
    ino = path.stat().st_ino
    hs.save(3, "n2")
    assert path.stat().st_ino == ino, "an unchanged state is not rewritten"
    again = HardState(path)
    assert (again.term, again.voted_for) == (3, "n2")
    again.save(4, None)
    assert path.stat().st_ino != ino, "each save replaces the file by rename"
    assert (HardState(path).term, HardState(path).voted_for) == (4, None)
    with pytest.raises(ValueError):
        again.save(3, None)
    again.save(4, "n1")
    with pytest.raises(ValueError):
        again.save(4, "n3")


def test_hardstate_ignores_leftover_tmp(tmp_path: Path) -> None:
    path = tmp_path / "hardstate"
    HardState(path).save(5, "n1")
    Path(str(path) + ".tmp").write_bytes(b'{"garbage')  # a crash mid-save leaves this behind
    hs = HardState(path)
    assert (hs.term, hs.voted_for) == (5, "n1")
    hs.save(6, None)
    assert HardState(path).term == 6


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "retyped"])
def test_corrupt_hardstate_is_a_clear_error(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "hardstate"
    HardState(path).save(9, "node-a")
    raw = path.read_bytes()
    if damage == "flip":
        path.write_bytes(raw.replace(b"node-a", b"node-b"))
    elif damage == "truncate":
        path.write_bytes(raw[:10])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        doc = json.loads(raw)
        doc["term"] = "9"
        path.write_bytes(json.dumps(doc).encode())
    with pytest.raises(HardStateError) as info:
        HardState(path)
    assert info.value.path == str(path) and str(path) in str(info.value)
    assert isinstance(info.value, CorruptLogError)


def test_corrupt_base_file_is_reported(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    s.reset(10, 2, 4096)
    s.close()
    flip(tmp_path / "base", 9)
    with pytest.raises(CorruptLogError) as info:
        open_store(tmp_path)
    assert info.value.path == str(tmp_path / "base")


# ---------------------------------------------------------------------- fds and a randomized model check


def _open_fds() -> int:
    """This process's open fds, once garbage that holds some (sockets and pipes in reference
    cycles left by earlier tests in the same process) is collected: not the store's to count."""
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


def test_fds_stay_bounded_and_reset_during_a_job_is_safe(tmp_path: Path) -> None:
    before = _open_fds()
    s = open_store(tmp_path)
    fill(s, 600)
    assert len(seg_files(tmp_path)) > 20
    for lo in range(1, 601, 7):  # reads across every segment
        s.entries(lo, lo + 3)
    assert _open_fds() - before <= 2 * store_mod._MAX_OPEN + 2
    s.append([make(601, 1)])
    job = s.prepare_sync()
    s.reset(1000, 3, 10**6)  # the job's fds must survive until it completes
    job.run()
    assert s.complete_sync(job) == 1000
    s.close()
    assert _open_fds() == before


def test_random_operations_match_a_simple_model(tmp_path: Path) -> None:
    rng = random.Random(7)
    model: list[Entry] = []  # entries after the base
    base_index = base_term = 0
    s = open_store(tmp_path, segment_bytes=2048, retention_bytes=6000)
    term = 1
    for step in range(400):
        op = rng.random()
        last = base_index + len(model)
        if op < 0.55:
            n = rng.randrange(1, 12)
            if rng.random() < 0.1:
                term += 1
            es = [make(last + 1 + k, term, rng=rng) for k in range(n)]
            s.append(es)
            model += [Entry(e.index, e.term, bytes(e.data)) for e in es]
        elif op < 0.65 and model:
            cut = rng.randrange(base_index + 1, last + 1)
            s.truncate_suffix(cut)
            del model[cut - base_index - 1 :]
        elif op < 0.75:
            s.sync()
            assert s.durable_index == s.last_index
        elif op < 0.82:
            upto = rng.randrange(base_index, last + 2)
            first = s.apply_retention(upto)
            assert first <= max(upto, base_index + 1)
            dropped = first - 1 - base_index
            if dropped:
                base_term = model[dropped - 1].term
                base_index = first - 1
                del model[:dropped]
        elif op < 0.84:
            base_index, base_term = last + rng.randrange(0, 50), term
            s.reset(base_index, base_term, s.next_pos() + rng.randrange(0, 5000))
            model = []
        elif op < 0.92:
            s.sync()
            s.close()
            s = open_store(tmp_path, segment_bytes=2048, retention_bytes=6000)
        assert (s.first_index, s.last_index) == (base_index + 1, base_index + len(model)), step
        assert s.term_at(base_index) == base_term
        if model:
            lo = rng.randrange(s.first_index, s.last_index + 1)
            assert s.entries(lo, s.last_index) == model[lo - base_index - 1 :], step
            assert s.last_term == model[-1].term
    s.close()


# ---------------------------------------------------------------------- membership configurations


def _config(store: LogStore, term: int, text: str) -> Entry:
    """Record and append a configuration entry the way the Raft core does."""
    from ledger.codec import KIND_CONFIG

    index = store.last_index + 1
    data = text.encode()
    store.save_config(index, term, data)
    e = Entry(index, term, data, KIND_CONFIG)
    store.append([e])
    return e


def test_configuration_records_survive_a_reopen_and_follow_the_log(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 10)
    a = _config(s, 1, "A")
    fill(s, 5)
    b = _config(s, 1, "B")
    s.sync()
    assert s.config_records() == [(a.index, 1, b"A"), (b.index, 1, b"B")]
    s.close()
    r = open_store(tmp_path)
    assert r.config_records() == [(a.index, 1, b"A"), (b.index, 1, b"B")]
    # A truncation drops the record at once; the file still has it, but the log no longer does.
    r.truncate_suffix(b.index)
    assert r.config_records() == [(a.index, 1, b"A")]
    r.append([make(b.index, 2)])  # another leader's entry at that index
    r.sync()
    r.close()
    r = open_store(tmp_path)
    assert r.config_records() == [(a.index, 1, b"A")]
    r.close()


def test_a_record_whose_entry_never_made_it_to_disk_is_ignored(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 10)
    s.save_config(11, 1, b"never appended")  # a crash right after the record
    s.close()
    r = open_store(tmp_path)
    assert r.config_records() == [] and r.last_index == 10
    r.close()


def test_reset_keeps_the_configuration_at_the_base(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 10)
    _config(s, 1, "old")
    s.sync()
    s.reset(500, 7, 1_000_000, (480, 6, b"leader's"))
    assert s.config_records() == [(480, 6, b"leader's")]
    s.close()
    r = open_store(tmp_path)
    assert r.config_records() == [(480, 6, b"leader's")] and r.first_index == 501 and r.term_at(500) == 7
    r.close()


def test_retention_moves_the_configuration_into_the_base(tmp_path: Path) -> None:
    s = open_store(tmp_path, retention_bytes=1)
    fill(s, 50)
    a = _config(s, 1, "A")
    fill(s, 150)
    b = _config(s, 1, "B")
    fill(s, 10)
    first = s.apply_retention(a.index + 60)
    assert a.index < first <= b.index
    assert s.config_records() == [(a.index, 1, b"A"), (b.index, 1, b"B")]
    s.close()
    r = open_store(tmp_path, retention_bytes=1)
    assert r.config_records() == [(a.index, 1, b"A"), (b.index, 1, b"B")]
    first = r.apply_retention(r.last_index)
    assert first > b.index and r.config_records() == [(b.index, 1, b"B")]
    r.close()
    r = open_store(tmp_path)
    assert r.config_records() == [(b.index, 1, b"B")]
    r.close()


def test_a_base_file_without_a_configuration_is_still_read(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    s.reset(40, 3, 5000)  # no configuration: the old, shorter base format
    s.close()
    assert (tmp_path / "base").stat().st_size == store_mod._BASE.size
    r = open_store(tmp_path)
    assert r.first_index == 41 and r.config_records() == []
    r.close()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_members_file_is_a_clear_error(tmp_path: Path, damage: str) -> None:
    s = open_store(tmp_path)
    fill(s, 5)
    _config(s, 1, "A")
    s.sync()
    s.close()
    path = tmp_path / store_mod.MEMBERS_NAME
    if damage == "flip":
        flip(path, 10)
    else:
        path.write_bytes(path.read_bytes()[:7])
    with pytest.raises(CorruptLogError) as info:
        open_store(tmp_path)
    assert info.value.path == str(path) and "members file" in str(info.value)


def test_a_damaged_base_with_a_configuration_is_a_clear_error(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    s.reset(40, 3, 5000, (30, 2, b"cfg"))
    s.close()
    flip(tmp_path / "base", 50)
    with pytest.raises(CorruptLogError) as info:
        open_store(tmp_path)
    assert info.value.path == str(tmp_path / "base")


def test_records_are_written_by_the_sync_job_not_on_the_event_loop(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 5)
    a = _config(s, 1, "A")
    path = tmp_path / store_mod.MEMBERS_NAME
    assert not path.exists()  # nothing written on the caller's thread
    job = s.prepare_sync()
    assert job.members is not None
    job.run()  # the records first, then the data
    s.complete_sync(job)
    assert path.exists() and s.durable_index == a.index
    s.close()
    assert open_store(tmp_path).config_records() == [(a.index, 1, b"A")]


def test_a_process_crash_before_the_record_was_written_still_finds_the_entry(tmp_path: Path) -> None:
    """A killed process leaves its writes in the page cache: the entry is there, its record is
    not. The last segment is scanned on every open, so the entry's configuration is found."""
    s = open_store(tmp_path)
    fill(s, 5)
    a = _config(s, 1, "A")  # appended, never synced, never closed: the process dies here
    assert not (tmp_path / store_mod.MEMBERS_NAME).exists()
    r = open_store(tmp_path)
    assert r.last_index == a.index and r.config_records() == [(a.index, 1, b"A")]
    r.close()
    del s


def test_a_segment_is_never_sealed_with_an_unwritten_record(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    fill(s, 5)
    a = _config(s, 1, "A")
    path = tmp_path / store_mod.MEMBERS_NAME
    assert not path.exists()
    before = len(seg_files(tmp_path))
    while len(seg_files(tmp_path)) == before:  # no sync: only the roll can have written it
        s.append([make(s.last_index + 1, 1)])
    assert path.exists()
    r = open_store(tmp_path)
    assert r.config_records() == [(a.index, 1, b"A")]
    r.close()
    del s
