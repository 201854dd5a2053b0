"""What every fault shares: the ``Fault`` shape, and the context it acts and records through.

A fault is one small object (Jepsen's reified nemeses): ``start`` breaks something,
``stop`` heals what that start broke, ``describe`` says what it is and which history
operations it records. It acts only through the system's primitives on the backend
(kill, pause, cut, shape, fill a disk, damage a stopped node's files), and every action is
one recorded nemesis operation (:meth:`FaultContext.op`): an ``info`` start event and an
``info`` end event with the same ``f``, whose ``value`` names the fault, the nodes and what
was done. A new fault is one class (in the module of its kind) and one line in ``registry``.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from jepsen.history import History
from jepsen.net.proxy import Link
from jepsen.systems.base import Backend

#: ``--fault-scope``: with several broker groups, a fault hits one group chosen at random
#: (``one``) or every group at once (``all``)
FAULT_SCOPES = ("one", "all")
#: seconds a fault looks for a group's leader before it takes a random member instead
LEADER_WAIT_S = 3.0


@dataclass(frozen=True)
class Description:
    """What a fault is, for people and for checking the harness against the checker.

    ``breaks``: the ``f`` of its breaking operation (a nemesis event in the history);
    ``heals``: the ``f`` of the operation that heals it (None: it heals nothing, it is over
    when its own operation ends).
    """

    name: str
    summary: str
    breaks: str
    heals: str | None


@dataclass(frozen=True)
class Scope:
    """The nodes one start of a fault hits: each targeted group's members, and what the
    events say about the groups (nothing when there is one group)."""

    groups: list[list[str]]
    info: dict[str, Any]

    @property
    def nodes(self) -> list[str]:
        return [n for g in self.groups for n in g]


def each(fn: Callable[[str], Any], nodes: list[str]) -> None:
    """One primitive on several nodes, in order (off the event loop, inside one operation)."""
    for n in nodes:
        fn(n)


def leader_info(known: list[str | None]) -> dict[str, Any]:
    """The ``leader`` field of an event: one group's known leader, or every group's."""
    return {"leader": known[0]} if len(known) == 1 else {"leader": known}


#: what a backend's ``set_shape`` reply adds to the end event
SHAPE_REPLY_KEYS = ("shaped", "unapplied")


def with_reply(value: dict[str, Any], reply: Any) -> dict[str, Any]:
    """The nemesis event's value with what the backend says it did (links shaped, nodes not)."""
    if not isinstance(reply, dict):
        return value
    return {**value, **{k: reply[k] for k in SHAPE_REPLY_KEYS if k in reply}}


def unshape(backend: Backend, value: dict[str, Any]) -> dict[str, Any]:
    """Heal every delayed or lossy link; the end event's value."""
    return with_reply(value, backend.set_shape(set(), delay_ms=0, jitter_ms=0, drop=0, seed=0))


def uncut(backend: Backend) -> None:
    """Heal every cut link."""
    backend.set_cut(set())


class FaultContext:
    """What a fault acts and records through: the backend, the history, the run's seeded
    choices, and the fault scope. One per run, shared by the run's faults and its schedule."""

    def __init__(
        self,
        backend: Backend,
        history: History,
        rng: random.Random,
        log_path: Path | None = None,
        *,
        lose_data: str,
        fault_scope: str = "one",
    ) -> None:
        self.backend = backend
        self.history = history
        self.rng = rng
        self.log_path = log_path
        self.lose_data = lose_data  # the way the plain ``lose-data`` fault damages a node
        self.fault_scope = fault_scope
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []
        self.corruptions: list[dict[str, Any]] = []
        self._lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ recording

    def log(self, text: str) -> None:
        """A line in ``nemesis.log`` (for people), on the history's clock."""
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
            self.log(f"start {f} {value}")
            try:
                result = await asyncio.to_thread(action)
                if inspect.isawaitable(result):  # a follow-up that needs the loop (status polls)
                    result = await result
            except asyncio.CancelledError:
                # The run is stopping mid-fault (its load ended or a worker failed). The action's
                # thread cannot be stopped, so its outcome is unknown; the fault is closed in the
                # history all the same, or the heal that follows could not be recorded.
                self.history.nemesis_end(f, value, error="cancelled: outcome unknown")
                self.log(f"CANCELLED {f} {value}")
                raise
            except Exception as exc:  # noqa: BLE001 - recorded; the run goes on and heals
                self.history.nemesis_end(f, value, error=f"{type(exc).__name__}: {exc}")
                self.log(f"FAILED {f} {value}: {exc}")
                self.errors.append(f"{f} {value}: {exc}")
                return None
            end_value = result if isinstance(result, dict) else value
            self.history.nemesis_end(f, end_value)
            self.log(f"end   {f} {end_value}")
            self.counts[f] += 1
            return result

    # ------------------------------------------------------------------ targets

    async def leader(self, among: list[str] | None = None) -> str | None:
        """The leader of ``among`` (one group's nodes; every node when there is one group)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LEADER_WAIT_S
        several = len(self.backend.node_groups()) > 1
        while loop.time() < deadline:
            nid = await (
                self.backend.leader(among) if several and among is not None else self.backend.leader()
            )
            if nid is not None:
                return nid
            await asyncio.sleep(0.1)
        return None

    async def leader_or_random(self, among: list[str] | None = None) -> tuple[str, bool]:
        nid = await self.leader(among)
        return (nid, True) if nid is not None else (self.rng.choice(among or self.backend.nodes), False)

    async def leaders_or_random(self, groups: list[list[str]]) -> tuple[list[str], list[str | None]]:
        """One target per group: its leader, or a random member if none is known; and the
        leaders known (None where the target was drawn at random)."""
        picks = [await self.leader_or_random(g) for g in groups]
        return [t for t, _ in picks], [t if known else None for t, known in picks]

    def scope(self, single_group: bool) -> Scope:
        """The node groups a fault hits: one chosen at random, or all with ``--fault-scope all``
        (unless the fault acts on one node's files or one peer: ``single_group``)."""
        groups = self.backend.node_groups()
        if len(groups) <= 1:
            return Scope([list(self.backend.nodes)], {})
        names = sorted(groups)
        if self.fault_scope == "one" or single_group:
            names = [self.rng.choice(names)]
        return Scope([list(groups[g]) for g in names], {"broker_groups": names})

    def within_groups(self, cut: set[Link]) -> set[Link]:
        """The links of ``cut`` that exist: between members of one group (groups never talk)."""
        where = {n: g for g, members in self.backend.node_groups().items() for n in members}
        return {(a, c) for a, c in cut if where.get(a) == where.get(c)}

    async def top_commit(self, among: list[str]) -> int:
        """The highest commit index any node of ``among`` (one group) reports now (0 if none answers)."""
        return max(
            (
                int(st.get("commit_index") or 0)
                for nid, st in (await self.backend.statuses()).items()
                if st and nid in among
            ),
            default=0,
        )


class Fault(ABC):
    """One kind of fault; an instance serves one run (it remembers what its last start broke).

    ``name`` is its ``--nemesis`` name; ``breaks``/``heals`` the ``f`` of the operations it
    records; ``single_group``: it acts on one node's files or one peer, so with several
    broker groups it always picks one group.
    """

    name: ClassVar[str]
    breaks: ClassVar[str]
    heals: ClassVar[str | None]
    single_group: ClassVar[bool] = False

    @classmethod
    def describe(cls) -> Description:
        """What this fault is (the first line of its docstring) and the operations it records."""
        summary = (cls.__doc__ or cls.name).strip().splitlines()[0]
        return Description(cls.name, summary, cls.breaks, cls.heals)

    @classmethod
    def refusal(cls, backend: Backend) -> str | None:
        """Why ``backend`` cannot have this fault (None: it can)."""
        return None

    async def prepare(self, ctx: FaultContext) -> None:
        """Set-up before the run's first fault (most need none)."""
        return None

    @abstractmethod
    async def start(self, ctx: FaultContext, scope: Scope) -> None:
        """Break something on ``scope``'s nodes, recorded."""

    @abstractmethod
    async def stop(self, ctx: FaultContext) -> None:
        """Heal what the last ``start`` broke, recorded."""

    async def heal(self, ctx: FaultContext) -> None:
        """At the end of the run: heal what a ``stop`` left (the backend's generic healing of
        killed, paused, cut and shaped nodes follows). Most faults leave nothing of their own."""
        return None
