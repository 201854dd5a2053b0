"""Each group's membership over time, from the history's membership nemesis events alone.

The ``membership`` nemesis records every change as one nemesis operation: a start event and
an end event with the same ``f`` (``member-add`` or ``member-remove``), ``value`` naming the
``nodes`` and the ``variant`` (``readd``, ``replace``, ``grow``, ``heal``); the end event of a
change that succeeded also holds the configuration it committed (``voters``, ``learners``), a
failed one holds the start's value and an ``error``. Reading only those events means
``jepsen analyze`` of an old run shows its membership too, and that the Spark path needs
nothing from the frames: the report computes this in-process from the nemesis events the
plots already bring back (there are few), with no job of its own.

The history does not record a group's first members, so they are inferred from the first
change that recorded a configuration: its voters and learners without the nodes it added
(or with those it removed). Changes before it that failed are assumed to have changed
nothing; ``initial_from`` says what the first members rest on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: the ``f`` of a membership change
CHANGE_FS = ("member-add", "member-remove")


@dataclass(frozen=True, slots=True)
class Change:
    """One membership change: times in ns of the history's clock, ``ok`` None if it never ended."""

    group: str
    f: str
    nodes: tuple[str, ...]
    variant: str | None
    start: int
    end: int | None
    ok: bool | None
    voters: tuple[str, ...] | None = None
    learners: tuple[str, ...] | None = None
    error: str | None = None


@dataclass(slots=True)
class GroupMembership:
    """One group's first members (when they can be inferred) and its changes in time order."""

    group: str
    initial: tuple[str, ...] | None = None
    initial_from: str = "unknown: no change recorded a configuration"
    changes: list[Change] = field(default_factory=list)

    def intervals(self, t_start: int, t_end: int) -> list[tuple[int, int, tuple[str, ...] | None]]:
        """(from, to, voters) spans from ``t_start`` to ``t_end``: the voters in force from each
        change's end to the next one's; None after a failed change (the members are not known)."""
        out: list[tuple[int, int, tuple[str, ...] | None]] = []
        t, voters = t_start, self.initial
        for c in self.changes:
            if c.end is None:
                continue
            out.append((t, c.end, voters))
            t, voters = c.end, (c.voters if c.ok else None)
        out.append((t, max(t, t_end), voters))
        return out


def _value(v: Any) -> dict[str, Any]:
    """An event's value as a dict (the Spark frames carry it as JSON text); anything else is empty."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return {}
    return v if isinstance(v, dict) else {}


def _names(v: Any) -> tuple[str, ...]:
    return tuple(str(n) for n in v) if isinstance(v, list | tuple) else ()


def group_of(node: str) -> str:
    """The broker group of a node id (``broker-a/n2``), "" when the run has one group."""
    return node.split("/", 1)[0] if "/" in node else ""


def changes(events: Iterable[Sequence[Any]]) -> list[Change]:
    """Membership changes from nemesis events ``(f, time, value[, error])`` in history order.

    The nemesis runs one operation at a time, so a change's end event is the next event with
    its ``f``; a change still open when another membership event starts never ended.
    """
    out: list[Change] = []
    open_: tuple[str, int, dict[str, Any]] | None = None

    def close(end: int | None, value: dict[str, Any], error: str | None) -> None:
        assert open_ is not None
        f, start, inv = open_
        nodes = _names(inv.get("nodes"))
        voters = _names(value["voters"]) if "voters" in value else None
        ok = None if end is None else (error is None and voters is not None)
        out.append(
            Change(
                group=group_of(nodes[0]) if nodes else "",
                f=f,
                nodes=nodes,
                variant=inv.get("variant") if isinstance(inv.get("variant"), str) else None,
                start=start,
                end=end,
                ok=ok,
                voters=voters,
                learners=_names(value.get("learners")) if voters is not None else None,
                error=error,
            )
        )

    for ev in events:
        f, t = ev[0], ev[1]
        if f not in CHANGE_FS or t is None:
            continue
        value = _value(ev[2])
        error = ev[3] if len(ev) > 3 and ev[3] is not None else None
        if open_ is not None and open_[0] == f:
            close(int(t), value, str(error) if error is not None else None)
            open_ = None
            continue
        if open_ is not None:
            close(None, {}, None)
        open_ = (f, int(t), value)
    if open_ is not None:
        close(None, {}, None)
    return out


def _before(c: Change) -> tuple[str, ...]:
    """The members before an ok change, from the configuration it left."""
    after = set(c.voters or ()) | set(c.learners or ())
    members = after - set(c.nodes) if c.f == "member-add" else after | set(c.nodes)
    return tuple(sorted(members))


def by_group(events: Iterable[Sequence[Any]]) -> list[GroupMembership]:
    """Each group's membership over time, groups in name order (see the module docstring)."""
    groups: dict[str, GroupMembership] = {}
    for c in changes(events):
        groups.setdefault(c.group, GroupMembership(c.group)).changes.append(c)
    for g in groups.values():
        first = next((c for c in g.changes if c.ok), None)
        if first is not None:
            g.initial = _before(first)
            g.initial_from = f"inferred from the first committed change ({first.f} {', '.join(first.nodes)})"
    return [groups[k] for k in sorted(groups)]
