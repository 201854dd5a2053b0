"""Always-on checks of the rules the ledger's safety rests on, at the core's and the store's edges.

Each check is a comparison or two where state changes (commit, term, truncation, append,
durability), written inline as ``if not (...): raise InvariantError(...)`` so that the
message is only formatted when a check fails: cheap enough to keep on in production, and
unlike ``assert`` statements not removed by ``python -O``. A failed check means a bug:
the node must stop rather than continue with a log or a state that breaks Raft's
guarantees.
"""

from __future__ import annotations

__all__ = ["InvariantError"]


class InvariantError(AssertionError):
    """A rule Raft's safety rests on was about to be broken; the message says which and where."""
