"""A ledger node that lost its hard-state file must never vote twice in a term (storage healing).

Real files throughout: ``HardState`` and its term bound on disk, and a ``LedgerNode`` (its
store, hard state and core, not started) driven by hand-crafted peer messages, so each step
of the scenario is exact.

Before term bounds, a node that lost its hard state restarted in the term of its last entry
with no vote and refused votes only until some leader had caught it up. A stale leader (of a
term older than one the node had voted in) could do that, and the node then voted again in
the term it had already voted in: two leaders in one term.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ledger.codec import Entry
from ledger.config import NodeConfig
from ledger.hardstate import TERM_BOUND_STEP, HardState, after_lost_hard_state, term_bound_after
from ledger.messages import AppendRequest, AppendResponse, Message, VoteRequest, VoteResponse
from ledger.node import RECOVERY_MARKER, TERM_BOUND_NAME, LedgerNode


def _config(tmp_path: Path) -> NodeConfig:
    cfg = NodeConfig(
        id="n1",
        listen="127.0.0.1:1",  # never started: no socket is opened
        peers=["n1=127.0.0.1:1", "n2=127.0.0.1:2", "n3=127.0.0.1:3"],
        data_dir=str(tmp_path / "n1"),
    )
    cfg.validate()
    return cfg


def _drain(node: LedgerNode) -> list[Message]:
    """What the runtime would do with one Ready: persist the hard state, fsync, then send."""
    rd = node.core.ready()
    if rd.hard_state is not None:
        node.hardstate.save(*rd.hard_state)
    node.store.sync()
    node.core.on_durable(node.store.last_index)
    return rd.messages + node.core.ready().messages


def _votes(messages: list[Message], dst: str) -> list[VoteResponse]:
    return [m for m in messages if isinstance(m, VoteResponse) and m.dst == dst and not m.pre_vote]


def test_a_stale_leader_cannot_reopen_a_term_the_node_voted_in_before_losing_its_hard_state(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path)
    node = LedgerNode(cfg)
    try:
        # n2 leads term 1 and replicates two entries; n3 (cut off from n2) campaigns in term 2
        # and gets n1's vote: n3 + n1 are a quorum, so n3 leads term 2.
        node.core.step(AppendRequest(1, "n2", "n1", 0, 0, 0, [Entry(1, 1, b"a"), Entry(2, 1, b"b")]))
        _drain(node)
        assert node.store.last_index == 2 and node.store.last_term == 1
        node.core.step(VoteRequest(2, "n3", "n1", 2, 1, False, True))
        granted = _votes(_drain(node), "n3")
        assert granted and granted[0].granted and granted[0].term == 2
        assert (node.hardstate.term, node.hardstate.voted_for) == (2, "n3")
    finally:
        node.disk.close()

    (tmp_path / "n1" / "hardstate").unlink()  # lost; the log (last term 1) is intact
    node = LedgerNode(cfg)
    try:
        # The stale leader of term 1 catches n1 up (it has not heard of term 2), then campaigns
        # in term 2. Its vote request may arrive after a leadership transfer, so stickiness
        # does not protect n1 either.
        node.core.step(AppendRequest(1, "n2", "n1", 2, 1, 2, []))
        out = _drain(node)
        node.core.step(VoteRequest(2, "n2", "n1", 2, 1, False, True))
        out += _drain(node)
        double = [v for v in _votes(out, "n2") if v.granted and v.term <= 2]
        assert not double, f"n1 voted for n2 in term {double[0].term}, after voting for n3 in term 2"
        # It told the stale leader about a newer term, so that leader steps down.
        assert any(isinstance(m, AppendResponse) and m.term >= 2 and not m.success for m in out), out
        st = node.status()
        assert st["hard_state_lost"] is not None and st["hard_state_lost"] >= 2, st
        assert not st["recovering"] and st["term_bound"] >= st["term"], st
        assert not (tmp_path / "n1" / RECOVERY_MARKER).exists()

        # In a term it never saw it votes as usual: it is not just refusing everything.
        later = node.core.term + 1
        node.core.step(VoteRequest(later, "n2", "n1", 2, 1, False, True))
        assert [v.granted for v in _votes(_drain(node), "n2")] == [True]
        assert (node.hardstate.term, node.hardstate.voted_for) == (later, "n2")
    finally:
        node.disk.close()

    node = LedgerNode(cfg)  # an ordinary restart now: the restored state was saved
    try:
        assert node.status()["hard_state_lost"] is None and node.core.voted_for == "n2"
    finally:
        node.disk.close()


def test_the_term_bound_stays_ahead_of_every_saved_term(tmp_path: Path) -> None:
    """The bound is written only when a term would pass it (one write per TERM_BOUND_STEP
    elections), always before the state it covers, and survives the hard state's loss."""
    bound_path = tmp_path / "term-bound"
    hs = HardState(tmp_path / "hardstate", bound_path)
    assert hs.bound is None and not bound_path.exists()
    hs.create()
    assert hs.bound == TERM_BOUND_STEP
    writes = 0
    for term in range(1, 5 * TERM_BOUND_STEP):
        before = hs.bound
        hs.save(term, "n2" if term % 2 else None)
        writes += hs.bound != before
        assert hs.bound is not None and hs.bound >= term
        assert HardState(tmp_path / "hardstate", bound_path).bound == hs.bound  # durable
    assert writes == 4, f"the bound moved {writes} times in {5 * TERM_BOUND_STEP - 1} terms"
    (tmp_path / "hardstate").unlink()
    again = HardState(tmp_path / "hardstate", bound_path)
    assert again.term == 0 and again.bound == hs.bound
    term, vote, recovering = after_lost_hard_state(again.bound, 3, "n1")
    assert (term, vote, recovering) == (hs.bound, "n1", False)
    assert term >= hs.term  # never below a term it saved


def test_a_damaged_term_bound_is_ignored_and_rewritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bound_path = tmp_path / "term-bound"
    hs = HardState(tmp_path / "hardstate", bound_path)
    hs.save(3, "n3")
    bound_path.write_bytes(b'{"version":1,"term":99,"voted_for":null,"checksum":"0"}\n')
    with caplog.at_level(logging.WARNING, logger="ledger.hardstate"):
        damaged = HardState(tmp_path / "hardstate", bound_path)
    assert damaged.bound is None and "checksum mismatch" in caplog.text and str(bound_path) in caplog.text
    damaged.ensure_bound()
    assert HardState(tmp_path / "hardstate", bound_path).bound == term_bound_after(3, None)


def test_losing_the_term_bound_too_falls_back_to_refusing_votes(tmp_path: Path) -> None:
    """Without the bound the node cannot know which terms it voted in: it refuses every vote
    until a leader has caught it up (the residual window the bound closes when present)."""
    cfg = _config(tmp_path)
    node = LedgerNode(cfg)
    try:
        node.core.step(AppendRequest(1, "n2", "n1", 0, 0, 0, [Entry(1, 1, b"a")]))
        _drain(node)
    finally:
        node.disk.close()
    (tmp_path / "n1" / "hardstate").unlink()
    (tmp_path / "n1" / TERM_BOUND_NAME).unlink()
    node = LedgerNode(cfg)
    try:
        st = node.status()
        assert st["recovering"] and st["voted_for"] is None and st["hard_state_lost"] == 1, st
        node.core.step(VoteRequest(5, "n3", "n1", 1, 1, False, True))
        assert [v.granted for v in _votes(_drain(node), "n3")] == [False]
    finally:
        node.disk.close()
