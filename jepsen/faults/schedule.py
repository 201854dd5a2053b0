"""The nemesis: the run's faults started and stopped on a schedule, recorded, and always healed.

Schedule: ``interval`` seconds of calm, then one fault held for ``interval`` seconds,
then calm again, cycling through the requested faults in order, until the run's
deadline; whatever is still broken then is healed. Every primitive action is one
nemesis operation in the history — an ``info`` start event and an ``info`` end event
with the same ``f`` (``kill``, ``restart``, ``pause``, ``resume``, ``start-partition``,
``stop-partition``, ``corrupt``, ``fill-disk``, ``free-disk``, ``forge-peer``) — whose
``value`` names the fault, the nodes and what was done. The same lines go to
``nemesis.log`` for people. What each fault does is its own (``faults.registry`` names
them all); the schedule only picks the groups it hits.

Several broker groups (``jepsen run --groups``): each fault hits one group chosen at random,
or with ``fault_scope="all"`` every group at once; its events name the groups
(``broker_groups``). Faults on one node's files or one peer (corrupt-tail, lose-data,
forge-peer) always pick one group.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from jepsen.faults.base import FAULT_SCOPES, Fault, FaultContext, each, uncut, unshape
from jepsen.faults.disk import LOSE_DATA_DEFAULT
from jepsen.faults.registry import FAULTS, check_faults, unknown_faults
from jepsen.history import History
from jepsen.systems.base import LOSE_DATA_WAYS, Backend


class Nemesis:
    """The run's faults on their schedule (see the module docstring)."""

    def __init__(
        self,
        backend: Backend,
        history: History,
        faults: list[str],
        interval: float,
        rng: random.Random,
        log_path: Path | None = None,
        lose_data: str = LOSE_DATA_DEFAULT,
        fault_scope: str = "one",
    ) -> None:
        if fault_scope not in FAULT_SCOPES:
            raise ValueError(f"unknown fault scope {fault_scope!r}; choose from {', '.join(FAULT_SCOPES)}")
        unknown = unknown_faults(faults)
        if unknown:
            raise ValueError(f"unknown nemesis {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
        check_faults(faults, backend)
        if lose_data not in LOSE_DATA_WAYS:
            raise ValueError(
                f"unknown lose-data variant {lose_data!r}; choose from {', '.join(LOSE_DATA_WAYS)}"
            )
        self.ctx = FaultContext(backend, history, rng, log_path, lose_data=lose_data, fault_scope=fault_scope)
        self.backend = backend
        self.faults = list(faults)
        self.interval = interval
        #: one object per fault named, kept for the run (each remembers what its last start broke)
        self._faults: dict[str, Fault] = {name: FAULTS[name]() for name in dict.fromkeys(faults)}
        self._active: Fault | None = None
        self.current: str | None = None  # the fault in force, for the progress bar

    async def start_fault(self, name: str) -> None:
        """Start the fault ``name`` on the groups it is drawn to hit."""
        fault = self._faults.get(name)
        if fault is None:
            fault = self._faults[name] = FAULTS[name]()
        scope = self.ctx.scope(fault.single_group)
        self.current = name
        await fault.start(self.ctx, scope)
        self._active = fault

    async def stop_fault(self) -> None:
        """Heal what the fault in force broke."""
        active, self._active = self._active, None
        if active is not None:
            await active.stop(self.ctx)
        self.current = None

    async def prepare(self) -> None:
        """Set-up some faults need before the first one (``disk-full``'s small disks)."""
        for fault in self._faults.values():
            await fault.prepare(self.ctx)

    async def heal_all(self) -> None:
        """End the fault in force, then undo anything still broken (always called at the end)."""
        await self.stop_fault()
        ctx, b = self.ctx, self.backend
        for fault in self._faults.values():
            await fault.heal(ctx)
        for n in sorted(b.paused):
            await ctx.op("resume", {"nodes": [n], "fault": "heal"}, lambda n=n: b.resume(n))
        if b.killed:
            dead = sorted(b.killed)
            await ctx.op("restart", {"nodes": dead, "fault": "heal"}, lambda: each(b.restart, dead))
        if b.shaped:
            healed = {"nodes": sorted({x for link in b.shaped for x in link}), "fault": "heal"}
            await ctx.op("stop-partition", healed, lambda: unshape(b, healed))
        if b.cut:
            cut = {"nodes": sorted({x for link in b.cut for x in link}), "fault": "heal"}
            await ctx.op("stop-partition", cut, lambda: uncut(b))
        self.current = None

    async def run(self, deadline: float) -> None:
        """Inject faults until the loop time ``deadline``; always leaves everything healed."""
        loop = asyncio.get_running_loop()

        async def calm(seconds: float) -> None:
            await asyncio.sleep(max(0.0, min(seconds, deadline - loop.time())))

        try:
            await self.prepare()
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
        ctx = self.ctx
        return {"ops": dict(ctx.counts), "errors": ctx.errors, "corruptions": ctx.corruptions}
