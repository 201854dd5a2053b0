"""Raft's persistent term and vote, saved atomically before any vote or append is answered.

Losing either one lets a node vote twice in a term or forget a newer term after a
restart, which breaks election safety; so every change is written to a temporary file,
fsynced, renamed over the old file and the directory fsynced before ``save`` returns.

The file is one line of JSON (readable when debugging a cluster) carrying an xxh3 checksum
of its fields, so a damaged file is refused with its path instead of being half-believed.
"""

from __future__ import annotations

import json
import os

import xxhash

from .store import CorruptLogError, write_file_atomically

__all__ = ["HardState", "HardStateError"]

_VERSION = 1


class HardStateError(CorruptLogError):
    """The hard-state file is unreadable; ``path`` names it. Subclasses ``CorruptLogError`` so one handler fits both."""


def _checksum(term: int, voted_for: str | None) -> str:
    return xxhash.xxh3_64_hexdigest(json.dumps([_VERSION, term, voted_for], separators=(",", ":")).encode())


class HardState:
    """Current term and vote of one node, as last durably saved."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.term = 0
        self.voted_for: str | None = None
        self._load()

    def _load(self) -> None:
        # A leftover "<path>.tmp" from a crash mid-save is ignored: the rename never happened,
        # so the previous state is still the one that counts.
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return
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
            raise HardStateError(
                self.path, 0, f"unreadable hard state ({exc.__class__.__name__}: {exc})"
            ) from None
        if not ok:
            raise HardStateError(self.path, 0, "hard state has missing or ill-typed fields")
        if checksum != _checksum(term, voted_for):
            raise HardStateError(self.path, 0, "hard state checksum mismatch")
        self.term = term
        self.voted_for = voted_for

    @property
    def exists(self) -> bool:
        """Whether the file is on disk (a node that never changed term has none until ``create``)."""
        return os.path.exists(self.path)

    def create(self) -> None:
        """Write the current state even if unchanged: a fresh node's file exists from its first
        start, so a missing file later means it was lost (see ``LedgerNode``), not "never voted"."""
        doc = {
            "version": _VERSION,
            "term": self.term,
            "voted_for": self.voted_for,
            "checksum": _checksum(self.term, self.voted_for),
        }
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        write_file_atomically(self.path, json.dumps(doc, separators=(",", ":")).encode() + b"\n")

    def save(self, term: int, voted_for: str | None) -> None:
        """Durably record (term, vote); returns only after the data and the rename are on disk.

        Refuses changes Raft never makes (a smaller term, a second vote in one term), since
        persisting one would quietly break election safety.
        """
        if term == self.term and voted_for == self.voted_for:
            return
        if term < self.term:
            raise ValueError(f"term may not go back from {self.term} to {term}")
        if term == self.term and self.voted_for is not None:
            raise ValueError(
                f"already voted for {self.voted_for!r} in term {term}; cannot change to {voted_for!r}"
            )
        doc = {
            "version": _VERSION,
            "term": term,
            "voted_for": voted_for,
            "checksum": _checksum(term, voted_for),
        }
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        write_file_atomically(self.path, json.dumps(doc, separators=(",", ":")).encode() + b"\n")
        self.term = term
        self.voted_for = voted_for

    def __repr__(self) -> str:
        return f"HardState({self.path!r}, term={self.term}, voted_for={self.voted_for!r})"
