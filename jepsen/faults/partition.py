"""Partitions, following Jepsen's grudges: which directed links to cut, and the faults that cut them.

With three nodes several shapes coincide: ``bridge`` and the symmetric form of
``partition-majorities-ring`` both cut one pair; the directed ring (the default where links
are directed) makes each node drop traffic from one neighbour, so every node sees a
different majority. Where one connection carries both directions (``directed_links`` is
False) every cut is made symmetric.

With several broker groups, ``partition-leader`` cuts each targeted group's leader off from
its group; the other shapes are drawn over every targeted node, across groups, and cut only
the links within a group that the line crosses: groups never talk to each other.
"""

from __future__ import annotations

import random
from abc import abstractmethod
from typing import Any

from jepsen.faults.base import Fault, FaultContext, Scope, leader_info, uncut
from jepsen.net.proxy import Link
from jepsen.systems.base import Backend

# ------------------------------------------------------------------ shapes


def cut_between(groups: list[list[str]]) -> set[Link]:
    """Every directed link between nodes of different groups."""
    where = {n: i for i, g in enumerate(groups) for n in g}
    return {(a, b) for a in where for b in where if where[a] != where[b]}


def majorities_ring(nodes: list[str], rng: random.Random, directed: bool) -> set[Link]:
    """Every node sees a majority, no two the same majority (Jepsen's ``majorities-ring``).

    Directed (Jepsen's algorithm): lay the nodes on a shuffled ring; the node in the middle
    of each window of ``m`` consecutive nodes drops traffic from everyone outside it.
    Symmetric: keep links within ring distance ``ceil((m-1)/2)``; for three nodes that
    keeps everything, so one random pair is cut instead.
    """
    ring = list(nodes)
    rng.shuffle(ring)
    n, m = len(ring), len(ring) // 2 + 1
    cut: set[Link] = set()
    if directed:
        for i in range(n):
            window = [ring[(i + j) % n] for j in range(m)]
            center = window[m // 2]
            cut |= {(src, center) for src in ring if src not in window}
        return cut
    d = -(-(m - 1) // 2)
    for i, a in enumerate(ring):
        for j, b in enumerate(ring):
            if a != b and min((i - j) % n, (j - i) % n) > d:
                cut.add((a, b))
    if not cut:
        a, b = ring[0], ring[1]
        cut = {(a, b), (b, a)}
    return cut


def bridge(nodes: list[str], rng: random.Random) -> tuple[set[Link], str]:
    """Two halves that cannot talk, and one node that talks to both."""
    order = list(nodes)
    rng.shuffle(order)
    middle, rest = order[0], order[1:]
    half = len(rest) // 2
    return cut_between([rest[:half], rest[half:]]), middle


# ------------------------------------------------------------------ the faults


def _cut(backend: Backend, links: set[Link]) -> None:
    """Cut exactly ``links`` (the backend's reply is not the event's value)."""
    backend.set_cut(links)


class Partition(Fault):
    """Cut peer links along a shape drawn over the targeted nodes; heal every link to stop."""

    breaks = "start-partition"
    heals = "stop-partition"

    def __init__(self) -> None:
        self.nodes: list[str] = []
        self.scope_info: dict[str, Any] = {}

    @abstractmethod
    async def draw(self, ctx: FaultContext, scope: Scope) -> tuple[set[Link], dict[str, Any]]:
        """The links to cut and what the event says about the shape."""

    async def start(self, ctx: FaultContext, scope: Scope) -> None:
        b = ctx.backend
        value: dict[str, Any] = {"fault": self.name, **scope.info}
        cut, shape = await self.draw(ctx, scope)
        value.update(shape)
        if not b.directed_links:
            cut |= {(y, x) for x, y in cut}
        cut = ctx.within_groups(cut)  # a line drawn across groups cuts each group along it
        value["cut"] = sorted([a, c] for a, c in cut)
        value["nodes"] = sorted({x for link in cut for x in link})
        await ctx.op("start-partition", value, lambda: _cut(b, cut))
        self.nodes, self.scope_info = value["nodes"], scope.info

    async def stop(self, ctx: FaultContext) -> None:
        b = ctx.backend
        value = {"fault": self.name, "nodes": self.nodes, **self.scope_info}
        await ctx.op("stop-partition", value, lambda: uncut(b))


class PartitionLeader(Partition):
    """Cut each targeted group's leader off from the rest of its group."""

    name = "partition-leader"

    async def draw(self, ctx: FaultContext, scope: Scope) -> tuple[set[Link], dict[str, Any]]:
        leaders, known = await ctx.leaders_or_random(scope.groups)
        sides = [[[ld], [n for n in g if n != ld]] for ld, g in zip(leaders, scope.groups, strict=True)]
        cut: set[Link] = set().union(*(cut_between(side) for side in sides))
        return cut, {"groups": sides[0] if len(sides) == 1 else sides, **leader_info(known)}


class PartitionRandomHalves(Partition):
    """Split the targeted nodes into two random halves that cannot talk."""

    name = "partition-random-halves"

    async def draw(self, ctx: FaultContext, scope: Scope) -> tuple[set[Link], dict[str, Any]]:
        order = list(scope.nodes)
        ctx.rng.shuffle(order)
        groups = [sorted(order[: len(order) // 2]), sorted(order[len(order) // 2 :])]
        return cut_between(groups), {"groups": groups}


class PartitionMajoritiesRing(Partition):
    """Every node sees a majority, no two the same majority (Jepsen's majorities ring)."""

    name = "partition-majorities-ring"

    async def draw(self, ctx: FaultContext, scope: Scope) -> tuple[set[Link], dict[str, Any]]:
        directed = ctx.backend.directed_links
        return majorities_ring(scope.nodes, ctx.rng, directed), {"directed": directed}


class Bridge(Partition):
    """Two halves that cannot talk, and one node that talks to both."""

    name = "bridge"

    async def draw(self, ctx: FaultContext, scope: Scope) -> tuple[set[Link], dict[str, Any]]:
        cut, middle = bridge(scope.nodes, ctx.rng)
        return cut, {"bridge": middle}
