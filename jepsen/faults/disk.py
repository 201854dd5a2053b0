"""Faults on a node's disk: a corrupt log tail, lost data, and a full disk.

``corrupt-tail`` and the ``lose-data`` family stop a follower, damage its ledger files and
restart it (recorded as ``kill``, ``corrupt``, ``restart``); the restart's end event says
whether the node recovered: for a corrupt tail whether its log says it cut the torn tail,
for lost data whether it committed again what the group had committed before it was
stopped. ``disk-full`` fills a node's small disk to the last byte while it runs.
"""

from __future__ import annotations

import asyncio
import time
from abc import abstractmethod
from typing import Any

from jepsen.faults.base import Fault, FaultContext, Scope, leader_info
from jepsen.systems.base import Backend

#: ``lose-data``'s default way (see ``systems.base.LOSE_DATA_WAYS``): the one the ledger heals
#: today; the others find bugs until storage healing is complete
LOSE_DATA_DEFAULT = "truncate-log"
#: seconds a node that lost data has, after its restart, to commit what the group had committed
CATCH_UP_S = 3.0
#: polls (every 0.1 s) of a corrupted node's log for the line saying it cut the torn tail
TAIL_RECOVERY_POLLS = 50


class DamageStopped(Fault):
    """Stop a follower, damage its ledger files, restart it and see whether it recovers."""

    breaks = "kill"
    heals = "restart"
    single_group = True

    def __init__(self) -> None:
        self.target = ""
        self.info: Any = None
        self.commit_before = 0

    @abstractmethod
    def damage_value(self, ctx: FaultContext) -> dict[str, Any]:
        """What the ``corrupt`` event says about the damage, besides the node and the fault."""

    @abstractmethod
    def damage(self, ctx: FaultContext, target: str) -> dict[str, Any]:
        """Damage the stopped ``target``'s files (off the loop); what was done."""

    @abstractmethod
    def restart_and_verify(self, ctx: FaultContext) -> Any:
        """Restart the node (off the loop) and say whether it recovered: the restart's end value."""

    async def start(self, ctx: FaultContext, scope: Scope) -> None:
        b = ctx.backend
        nodes = scope.nodes
        leader = await ctx.leader(nodes)
        target = ctx.rng.choice([n for n in nodes if n != leader])
        self.target = target
        self.commit_before = await ctx.top_commit(nodes)
        value = {"nodes": [target], "fault": self.name, "leader": leader, **scope.info}
        await ctx.op("kill", value, lambda: b.kill(target))
        damaged = {"nodes": [target], "fault": self.name, **self.damage_value(ctx)}
        self.info = await ctx.op("corrupt", damaged, lambda: self.damage(ctx, target))
        if isinstance(self.info, dict):
            ctx.corruptions.append(dict(self.info))

    async def stop(self, ctx: FaultContext) -> None:
        await ctx.op(
            "restart", {"nodes": [self.target], "fault": self.name}, lambda: self.restart_and_verify(ctx)
        )


class CorruptTail(DamageStopped):
    """Flip bytes in the last entry of a stopped follower's newest segment: a torn tail to cut and fetch again."""

    name = "corrupt-tail"

    @classmethod
    def refusal(cls, backend: Backend) -> str | None:
        return (
            None
            if backend.supports_corruption
            else f"{backend.system} does not support the corrupt-tail nemesis"
        )

    def damage_value(self, ctx: FaultContext) -> dict[str, Any]:
        return {}

    def damage(self, ctx: FaultContext, target: str) -> dict[str, Any]:
        return ctx.backend.corrupt_tail(target, ctx.rng)

    def restart_and_verify(self, ctx: FaultContext) -> Any:
        b, target, info = ctx.backend, self.target, self.info
        b.restart(target)
        seen = None
        if info and "skipped" not in info:
            for _ in range(TAIL_RECOVERY_POLLS):  # up to ~5 s for the node to recover and say so
                seen = b.tail_recovered(target)
                if seen:
                    break
                time.sleep(0.1)
            if ctx.corruptions:
                ctx.corruptions[-1]["tail-truncated"] = seen
        return {"nodes": [target], "fault": self.name, "tail-truncated": seen}


class LoseData(DamageStopped):
    """Lose a stopped follower's data the run's way (by default a truncated newest segment)."""

    name = "lose-data"
    #: the way this fault damages the node (None: the run's ``lose_data`` choice)
    how: str | None = None

    @classmethod
    def refusal(cls, backend: Backend) -> str | None:
        return (
            None
            if backend.supports_corruption
            else f"{backend.system} does not support the lose-data nemesis"
        )

    def way(self, ctx: FaultContext) -> str:
        return self.how or ctx.lose_data

    def damage_value(self, ctx: FaultContext) -> dict[str, Any]:
        return {"how": self.way(ctx)}

    def damage(self, ctx: FaultContext, target: str) -> dict[str, Any]:
        return ctx.backend.lose_data(target, self.way(ctx), ctx.rng)

    def restart_and_verify(self, ctx: FaultContext) -> Any:
        ctx.backend.restart(self.target)
        return self._caught_up(ctx)  # awaited on the loop: it polls the node's status

    async def _caught_up(self, ctx: FaultContext) -> dict[str, Any]:
        """Whether the node commits again what the group had committed before it was stopped,
        within ``CATCH_UP_S`` (a node stuck below it is the storage-healing bug the run must show,
        not hide)."""
        target, commit_before = self.target, self.commit_before
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_S
        commit = None
        while True:
            st = await ctx.backend._status_bounded(target)
            commit = int(st.get("commit_index") or 0) if st else None
            if (commit is not None and commit >= commit_before) or loop.time() >= deadline:
                break
            await asyncio.sleep(0.1)
        caught = commit is not None and commit >= commit_before
        ctx.log(
            f"{self.name}: {target} commit {commit} vs {commit_before} before the fault: caught up {caught}"
        )
        return {
            "nodes": [target],
            "fault": self.name,
            "caught-up": caught,
            "commit_index": commit,
            "commit_before": commit_before,
        }


class LoseDataWipe(LoseData):
    """Delete a stopped follower's whole ledger directory, its vote included."""

    name = "lose-data-wipe"
    how = "wipe"


class LoseDataTruncate(LoseData):
    """Cut a stopped follower's newest segment to a random shorter length."""

    name = "lose-data-truncate"
    how = "truncate-log"


class LoseDataEmpty(LoseData):
    """Empty every segment of a stopped follower's log."""

    name = "lose-data-empty"
    how = "empty-log"


class LoseDataHardstate(LoseData):
    """Delete a stopped follower's term and vote file."""

    name = "lose-data-hardstate"
    how = "hardstate"


class DiskFull(Fault):
    """Fill each targeted group's leader's small disk to the last byte while it runs; free it to heal."""

    name = "disk-full"
    breaks = "fill-disk"
    heals = "free-disk"

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.filled: set[str] = set()  # nodes whose small disk holds a filler now

    @classmethod
    def refusal(cls, backend: Backend) -> str | None:
        return backend.small_disk_refusal()

    async def prepare(self, ctx: FaultContext) -> None:
        """Move each node's ledger onto a small tmpfs, one node at a time (a recorded kill and
        restart, ``disk-full-setup``), unless the backend laid its nodes out on small disks from
        the start (docker)."""
        b = ctx.backend
        if b.small_disks_from_start:
            ctx.log("disk-full: every node has been on its small disk since the start")
            return
        for n in b.nodes:
            value = {"fault": "disk-full-setup", "nodes": [n]}
            await ctx.op("kill", value, lambda n=n: b.kill(n))

            def mount_and_restart(n: str = n, value: dict[str, Any] = value) -> dict[str, Any]:
                info = b.mount_small_disk(n)
                b.restart(n)
                return {**value, "mount": info}

            await ctx.op("restart", value, mount_and_restart)
            group = next((m for m in b.node_groups().values() if n in m), None)
            await ctx.leader(group)  # the group has a leader again before the next node goes

    async def start(self, ctx: FaultContext, scope: Scope) -> None:
        b = ctx.backend
        filled, known = await ctx.leaders_or_random(scope.groups)
        value = {"fault": self.name, "nodes": filled, **leader_info(known), **scope.info}
        self.filled.update(filled)
        self.targets = filled

        def fill() -> dict[str, Any]:
            if len(filled) == 1:
                return {**value, **b.fill_disk(filled[0])}
            return {**value, "filled": {n: b.fill_disk(n) for n in filled}}

        await ctx.op("fill-disk", value, fill)

    async def stop(self, ctx: FaultContext) -> None:
        for n in self.targets:
            await self._free(ctx, n, self.name)

    async def heal(self, ctx: FaultContext) -> None:
        for n in sorted(self.filled):
            await self._free(ctx, n, "heal")

    async def _free(self, ctx: FaultContext, target: str, fault: str) -> None:
        b = ctx.backend
        self.filled.discard(target)
        value = {"fault": fault, "nodes": [target]}
        await ctx.op("free-disk", value, lambda: {**value, **b.free_disk(target)})
