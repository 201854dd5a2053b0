"""Faults on processes: kill (SIGKILL, healed by a restart) and pause (SIGSTOP, healed by SIGCONT).

Each variant only chooses its targets; killing, pausing and healing them is shared.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from jepsen.faults.base import Fault, FaultContext, Scope, each, leader_info


async def _leaders(ctx: FaultContext, scope: Scope) -> tuple[list[str], dict[str, Any]]:
    """Each group's leader (a random member where none is known), and the leaders known."""
    targets, known = await ctx.leaders_or_random(scope.groups)
    return targets, leader_info(known)


def _one_random(ctx: FaultContext, scope: Scope) -> tuple[list[str], dict[str, Any]]:
    """One random member of each group."""
    return [ctx.rng.choice(g) for g in scope.groups], {}


class Kill(Fault):
    """Kill nodes with SIGKILL; restart them to heal."""

    breaks = "kill"
    heals = "restart"

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.scope_info: dict[str, Any] = {}

    @abstractmethod
    async def choose(self, ctx: FaultContext, scope: Scope) -> tuple[list[str], dict[str, Any]]:
        """The nodes to kill and what the kill event says about them."""

    async def start(self, ctx: FaultContext, scope: Scope) -> None:
        targets, extra = await self.choose(ctx, scope)
        extra.update(scope.info)
        value = {"nodes": targets, "fault": self.name, **extra}
        await ctx.op("kill", value, timed_kill(ctx, value, targets))
        self.targets, self.scope_info = targets, scope.info

    async def stop(self, ctx: FaultContext) -> None:
        b, targets = ctx.backend, self.targets
        value = {"nodes": targets, "fault": self.name, **self.scope_info}
        await ctx.op("restart", value, lambda: each(b.restart, targets))


def timed_kill(ctx: FaultContext, value: dict[str, Any], targets: list[str]) -> Callable[[], dict[str, Any]]:
    """The kill's action: SIGKILL each target (the backend reaps it) and say in the end event
    when the first signal went out (``signalled_s``, on the history's clock): the start event
    is written before the action runs, so a recovery measured from the start includes the
    way from the start to the signal, and this shows how long that was (a recovery breakdown
    needs it: bench/recovery_bench.py)."""
    history, kill = ctx.history, ctx.backend.kill

    def action() -> dict[str, Any]:
        signalled = history.now_ns()
        each(kill, targets)
        return {**value, "signalled_s": round(signalled / 1e9, 6)}

    return action


class KillLeader(Kill):
    """Kill each targeted group's leader (a random member where none is known)."""

    name = "kill-leader"

    async def choose(self, ctx: FaultContext, scope: Scope) -> tuple[list[str], dict[str, Any]]:
        return await _leaders(ctx, scope)


class KillRandom(Kill):
    """Kill one random member of each targeted group."""

    name = "kill-random"

    async def choose(self, ctx: FaultContext, scope: Scope) -> tuple[list[str], dict[str, Any]]:
        return _one_random(ctx, scope)


class KillMajority(Kill):
    """Kill a random majority of each targeted group: it cannot commit until they restart."""

    name = "kill-majority"

    async def choose(self, ctx: FaultContext, scope: Scope) -> tuple[list[str], dict[str, Any]]:
        rng = ctx.rng
        return sorted(n for g in scope.groups for n in rng.sample(g, len(g) // 2 + 1)), {}


class RestartAll(Kill):
    """Kill every node of the targeted groups at once, then start them all again."""

    name = "restart-all"

    async def choose(self, ctx: FaultContext, scope: Scope) -> tuple[list[str], dict[str, Any]]:
        return list(scope.nodes), {}


class Pause(Fault):
    """Pause nodes with SIGSTOP; resume them (SIGCONT) to heal."""

    breaks = "pause"
    heals = "resume"

    def __init__(self) -> None:
        self.paused: list[str] = []
        self.scope_info: dict[str, Any] = {}

    @abstractmethod
    async def choose(self, ctx: FaultContext, scope: Scope) -> tuple[list[str], dict[str, Any]]:
        """The nodes to pause and what the pause event says about them."""

    async def start(self, ctx: FaultContext, scope: Scope) -> None:
        paused, extra = await self.choose(ctx, scope)
        extra.update(scope.info)
        b = ctx.backend
        await ctx.op("pause", {"nodes": paused, "fault": self.name, **extra}, lambda: each(b.pause, paused))
        self.paused, self.scope_info = paused, scope.info

    async def stop(self, ctx: FaultContext) -> None:
        b, paused = ctx.backend, self.paused
        value = {"nodes": paused, "fault": self.name, **self.scope_info}
        await ctx.op("resume", value, lambda: each(b.resume, paused))


class PauseLeader(Pause):
    """Pause each targeted group's leader (a random member where none is known)."""

    name = "pause-leader"

    async def choose(self, ctx: FaultContext, scope: Scope) -> tuple[list[str], dict[str, Any]]:
        return await _leaders(ctx, scope)


class PauseRandom(Pause):
    """Pause one random member of each targeted group."""

    name = "pause-random"

    async def choose(self, ctx: FaultContext, scope: Scope) -> tuple[list[str], dict[str, Any]]:
        return _one_random(ctx, scope)
