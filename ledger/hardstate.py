"""Raft's persistent term and vote, saved atomically before any vote or append is answered.

Losing either one lets a node vote twice in a term or forget a newer term after a
restart, which breaks election safety; so every change is written to a temporary file,
fsynced, renamed over the old file and the directory fsynced before ``save`` returns.

The file is one line of JSON (readable when debugging a cluster) carrying an xxh3 checksum
of its fields, so a damaged file is refused with its path instead of being half-believed.

A second file, the *term bound*, survives the loss of the first: before the term may pass
the bound, a new bound ``TERM_BOUND_STEP`` terms ahead is made durable. A node that lost its
hard state therefore knows a term it never went past, and restarts in that term with its vote
spent (``after_lost_hard_state``), so it can only vote in terms it never saw before the loss.
Without the bound it could not tell: catching up from a stale leader of an older term would
let it vote again in a term it had already voted in. Protocol-aware recovery asks exactly
this of a node that lost its metadata: never vote again in a term it may have voted in.
"""

from __future__ import annotations

import json
import logging
import os

import xxhash

from .store import CorruptLogError, write_file_atomically

__all__ = [
    "TERM_BOUND_STEP",
    "HardState",
    "HardStateError",
    "after_lost_hard_state",
    "term_bound_after",
]

log = logging.getLogger("ledger.hardstate")

_VERSION = 1

#: How far ahead of the term a new term bound is written: one extra file write per this many
#: term changes (elections), at the price of a node that lost its hard state restarting up to
#: this many terms ahead (its first reply deposes the leader once; terms are only numbers).
TERM_BOUND_STEP = 8


def term_bound_after(term: int, bound: int | None) -> int | None:
    """The bound to make durable before ``term`` is saved, or None while ``bound`` still covers it."""
    if bound is not None and term <= bound:
        return None
    return term + TERM_BOUND_STEP


def after_lost_hard_state(bound: int | None, last_term: int, node_id: str) -> tuple[int, str | None, bool]:
    """(term, vote, recovering) for a node that lost its hard state but not its term bound (or both).

    With the bound the node never was in a later term, so it restarts in the bound's term with
    its vote spent (on itself, which grants nothing to anyone): every vote it casts from now on
    is in a term it never voted in. Without it the node refuses every vote until a leader has
    caught it up (``RaftCore.recovering``), which still leaves a window: a stale leader can catch
    it up, after which it may vote in a term it had voted in before (the bound's reason to exist).
    """
    if bound is None:
        return last_term, None, True
    return max(bound, last_term), node_id, False


class HardStateError(CorruptLogError):
    """The hard-state file is unreadable; ``path`` names it. Subclasses ``CorruptLogError`` so one handler fits both."""


def _checksum(term: int, voted_for: str | None) -> str:
    return xxhash.xxh3_64_hexdigest(json.dumps([_VERSION, term, voted_for], separators=(",", ":")).encode())


def _encode(term: int, voted_for: str | None) -> bytes:
    doc = {"version": _VERSION, "term": term, "voted_for": voted_for, "checksum": _checksum(term, voted_for)}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def _decode(path: str, raw: bytes) -> tuple[int, str | None]:
    """(term, vote) of one file's bytes, or ``HardStateError`` naming ``path``."""
    try:
        doc = json.loads(raw)
        term, voted_for, checksum = doc["term"], doc["voted_for"], doc["checksum"]
        ok = (
            doc.get("version") == _VERSION
            and isinstance(term, int)
            and not isinstance(term, bool)
            and term >= 0
            and (voted_for is None or isinstance(voted_for, str))
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise HardStateError(path, 0, f"unreadable hard state ({exc.__class__.__name__}: {exc})") from None
    if not ok:
        raise HardStateError(path, 0, "hard state has missing or ill-typed fields")
    if checksum != _checksum(term, voted_for):
        raise HardStateError(path, 0, "hard state checksum mismatch")
    return term, voted_for


def _write(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    write_file_atomically(path, data)


class HardState:
    """Current term and vote of one node, as last durably saved, and the term bound beside them."""

    def __init__(self, path: str | os.PathLike, bound_path: str | os.PathLike | None = None) -> None:
        self.path = os.fspath(path)
        self.bound_path = None if bound_path is None else os.fspath(bound_path)
        self.term = 0
        self.voted_for: str | None = None
        self.bound: int | None = None  # no term bound file (or an unreadable one): see _load_bound
        self._load()
        self._load_bound()

    def _load(self) -> None:
        # A leftover "<path>.tmp" from a crash mid-save is ignored: the rename never happened,
        # so the previous state is still the one that counts.
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return
        self.term, self.voted_for = _decode(self.path, raw)

    def _load_bound(self) -> None:
        """A damaged bound is only a lost one: with the hard state intact it is rewritten at once
        (``ensure_bound``), and without it the node falls back to refusing votes."""
        if self.bound_path is None:
            return
        try:
            with open(self.bound_path, "rb") as f:
                raw = f.read(4096)
        except FileNotFoundError:
            return
        try:
            self.bound = _decode(self.bound_path, raw)[0]
        except HardStateError as exc:
            log.warning("ignoring term bound: %s", exc, extra={"path": self.bound_path})

    @property
    def exists(self) -> bool:
        """Whether the file is on disk (a node that never changed term has none until ``create``)."""
        return os.path.exists(self.path)

    def create(self) -> None:
        """Write the current state even if unchanged: a fresh node's file exists from its first
        start, so a missing file later means it was lost (see ``LedgerNode``), not "never voted"."""
        self.ensure_bound()
        _write(self.path, _encode(self.term, self.voted_for))

    def ensure_bound(self) -> None:
        """Make a term bound covering the current term durable, if there is none yet (a data
        directory from before bounds existed, or a lost or damaged bound next to a good state)."""
        self._raise_bound(self.term)

    def _raise_bound(self, term: int) -> None:
        if self.bound_path is None:
            return
        bound = term_bound_after(term, self.bound)
        if bound is not None:
            _write(self.bound_path, _encode(bound, None))  # durable before any state in ``term``
            self.bound = bound

    def save(self, term: int, voted_for: str | None) -> None:
        """Durably record (term, vote); returns only after the data and the rename are on disk.

        Refuses changes Raft never makes (a smaller term, a second vote in one term), since
        persisting one would quietly break election safety. A term past the bound first moves
        the bound (``TERM_BOUND_STEP`` ahead), so the bound is never below a saved term.
        """
        if term == self.term and voted_for == self.voted_for:
            return
        if term < self.term:
            raise ValueError(f"term may not go back from {self.term} to {term}")
        if term == self.term and self.voted_for is not None:
            raise ValueError(
                f"already voted for {self.voted_for!r} in term {term}; cannot change to {voted_for!r}"
            )
        self._raise_bound(term)
        _write(self.path, _encode(term, voted_for))
        self.term = term
        self.voted_for = voted_for

    def __repr__(self) -> str:
        return f"HardState({self.path!r}, term={self.term}, voted_for={self.voted_for!r}, bound={self.bound})"
