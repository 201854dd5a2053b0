"""Nemeses: faults started and stopped on a schedule, recorded, and always healed.

Schedule: ``interval`` seconds of calm, then one fault held for ``interval`` seconds,
then calm again, cycling through the requested faults in order, until the run's
deadline; whatever is still broken then is healed. Every primitive action is one
nemesis operation in the history — an ``info`` start event and an ``info`` end event
with the same ``f`` (``kill``, ``restart``, ``pause``, ``resume``, ``start-partition``,
``stop-partition``, ``corrupt``) — whose ``value`` names the nodes and, for partitions,
the directed links cut. The same lines go to ``nemesis.log`` for people.

Partitions follow Jepsen's grudges. With three nodes several coincide: ``bridge`` and
the symmetric form of ``partition-majorities-ring`` both cut one pair; the directed
ring (the default where links are directed) makes each node drop traffic from one
neighbour, so every node sees a different majority.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .backends import Backend, Unsupported
from .history import History
from .proxy import Link

FAULTS = (
    "kill-leader", "kill-random", "kill-majority", "pause-leader", "pause-random", "partition-leader",
    "partition-random-halves", "partition-majorities-ring", "bridge", "restart-all", "corrupt-tail",
)


# ------------------------------------------------------------------ partition shapes


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


def _each(fn: Callable[[str], Any], nodes: list[str]) -> None:
    for n in nodes:
        fn(n)


def _quiet(fn: Callable[[Any], Any], arg: Any) -> None:
    fn(arg)


# ------------------------------------------------------------------ the nemesis


class Nemesis:
    def __init__(self, backend: Backend, history: History, faults: list[str], interval: float,
                 rng: random.Random, log_path: Path | None = None) -> None:
        unknown = [f for f in faults if f not in FAULTS]
        if unknown:
            raise ValueError(f"unknown nemesis {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
        if "corrupt-tail" in faults and not backend.supports_corruption:
            raise Unsupported(f"{backend.system} does not support the corrupt-tail nemesis")
        self.backend = backend
        self.history = history
        self.faults = list(faults)
        self.interval = interval
        self.rng = rng
        self.log_path = log_path
        self.current: str | None = None  # the fault in force, for the progress bar
        self._undo: Callable[[], Any] | None = None
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []
        self.corruptions: list[dict[str, Any]] = []
        self._lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ recording

    def _log(self, text: str) -> None:
        if self.log_path is not None:
            stamp = time.strftime("%H:%M:%S")
            with open(self.log_path, "a", encoding="utf-8") as fh:
                fh.write(f"{stamp} t={self.history.now_ns() / 1e9:8.3f}s {text}\n")

    async def op(self, f: str, value: Any, action: Callable[[], Any]) -> Any:
        """One recorded nemesis operation: start event, the action (off the loop), end event."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one nemesis operation at a time, even while healing
            self.history.nemesis_start(f, value)
            self._log(f"start {f} {value}")
            try:
                result = await asyncio.to_thread(action)
            except Exception as exc:  # noqa: BLE001 - recorded; the run goes on and heals
                self.history.nemesis_end(f, value, error=f"{type(exc).__name__}: {exc}")
                self._log(f"FAILED {f} {value}: {exc}")
                self.errors.append(f"{f} {value}: {exc}")
                return None
            end_value = result if isinstance(result, dict) else value
            self.history.nemesis_end(f, end_value)
            self._log(f"end   {f} {end_value}")
            self.counts[f] += 1
            return result

    # ------------------------------------------------------------------ targets

    async def _leader(self) -> str | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 3.0
        while loop.time() < deadline:
            nid = await self.backend.leader()
            if nid is not None:
                return nid
            await asyncio.sleep(0.1)
        return None

    async def _leader_or_random(self) -> tuple[str, bool]:
        nid = await self._leader()
        return (nid, True) if nid is not None else (self.rng.choice(self.backend.nodes), False)

    # ------------------------------------------------------------------ faults

    async def start_fault(self, name: str) -> None:
        b, nodes, rng = self.backend, self.backend.nodes, self.rng
        self.current = name
        if name in ("kill-leader", "kill-random", "kill-majority", "restart-all"):
            if name == "kill-leader":
                leader, known = await self._leader_or_random()
                targets, extra = [leader], {"leader": leader if known else None}
            elif name == "kill-random":
                targets, extra = [rng.choice(nodes)], {}
            elif name == "kill-majority":
                targets, extra = sorted(rng.sample(nodes, len(nodes) // 2 + 1)), {}
            else:
                targets, extra = list(nodes), {}
            await self.op("kill", {"nodes": targets, "fault": name, **extra}, lambda: _each(b.kill, targets))
            self._undo = lambda: self.op("restart", {"nodes": targets, "fault": name},
                                         lambda: _each(b.restart, targets))
        elif name in ("pause-leader", "pause-random"):
            if name == "pause-leader":
                target, known = await self._leader_or_random()
                extra = {"leader": target if known else None}
            else:
                target, extra = rng.choice(nodes), {}
            await self.op("pause", {"nodes": [target], "fault": name, **extra}, lambda: b.pause(target))
            self._undo = lambda: self.op("resume", {"nodes": [target], "fault": name}, lambda: b.resume(target))
        elif name.startswith("partition") or name == "bridge":
            value: dict[str, Any] = {"fault": name}
            if name == "partition-leader":
                leader, known = await self._leader_or_random()
                others = [n for n in nodes if n != leader]
                cut = cut_between([[leader], others])
                value.update(groups=[[leader], others], leader=leader if known else None)
            elif name == "partition-random-halves":
                order = list(nodes)
                rng.shuffle(order)
                groups = [sorted(order[: len(order) // 2]), sorted(order[len(order) // 2 :])]
                cut = cut_between(groups)
                value.update(groups=groups)
            elif name == "partition-majorities-ring":
                cut = majorities_ring(nodes, rng, b.directed_links)
                value.update(directed=b.directed_links)
            else:
                cut, middle = bridge(nodes, rng)
                value.update(bridge=middle)
            if not b.directed_links:
                cut |= {(y, x) for x, y in cut}
            value["cut"] = sorted([a, c] for a, c in cut)
            value["nodes"] = sorted({x for link in cut for x in link})
            await self.op("start-partition", value, lambda: _quiet(b.set_cut, cut))
            self._undo = lambda: self.op("stop-partition", {"fault": name, "nodes": value["nodes"]},
                                         lambda: _quiet(b.set_cut, set()))
        elif name == "corrupt-tail":
            leader = await self._leader()
            target = rng.choice([n for n in nodes if n != leader])
            await self.op("kill", {"nodes": [target], "fault": name, "leader": leader}, lambda: b.kill(target))
            info = await self.op("corrupt", {"nodes": [target], "fault": name}, lambda: b.corrupt_tail(target, rng))
            if isinstance(info, dict):
                self.corruptions.append(dict(info))

            async def undo() -> None:
                def restart_and_verify() -> dict[str, Any]:
                    b.restart(target)
                    seen = None
                    if info and "skipped" not in info:
                        for _ in range(50):  # up to ~5 s for the node to recover and say so
                            seen = b.tail_recovered(target)
                            if seen:
                                break
                            time.sleep(0.1)
                        if self.corruptions:
                            self.corruptions[-1]["tail-truncated"] = seen
                    return {"nodes": [target], "fault": name, "tail-truncated": seen}

                await self.op("restart", {"nodes": [target], "fault": name}, restart_and_verify)

            self._undo = undo
        else:  # pragma: no cover - names are validated in __init__
            raise ValueError(name)

    async def stop_fault(self) -> None:
        undo, self._undo = self._undo, None
        if undo is not None:
            await undo()
        self.current = None

    async def heal_all(self) -> None:
        """End the fault in force, then undo anything still broken (always called at the end)."""
        await self.stop_fault()
        b = self.backend
        for n in sorted(b.paused):
            await self.op("resume", {"nodes": [n], "fault": "heal"}, lambda n=n: b.resume(n))
        if b.killed:
            dead = sorted(b.killed)
            await self.op("restart", {"nodes": dead, "fault": "heal"}, lambda: _each(b.restart, dead))
        if b.cut:
            await self.op("stop-partition", {"nodes": sorted({x for link in b.cut for x in link}), "fault": "heal"},
                          lambda: _quiet(b.set_cut, set()))
        self.current = None

    async def run(self, deadline: float) -> None:
        """Inject faults until the loop time ``deadline``; always leaves everything healed."""
        loop = asyncio.get_running_loop()

        async def calm(seconds: float) -> None:
            await asyncio.sleep(max(0.0, min(seconds, deadline - loop.time())))

        try:
            await calm(self.interval)
            i = 0
            while self.faults and loop.time() + self.interval <= deadline:
                await self.start_fault(self.faults[i % len(self.faults)])
                i += 1
                await calm(self.interval)
                await self.stop_fault()
                await calm(self.interval)
        finally:
            await asyncio.shield(self.heal_all())

    def summary(self) -> dict[str, Any]:
        return {"ops": dict(self.counts), "errors": self.errors, "corruptions": self.corruptions}
