"""The ``delay`` workload: delayed messages must come neither early nor (outside faults) late,
and every acknowledged one must come exactly once.

Each worker sends unique integers to its queue of the test topic, half with a RocketMQ 4 delay
level (``DELAY``), half with a RocketMQ 5 delivery time (``TIMER_DELIVER_MS``) a little ahead,
and polls its queue; once healed, the group is given time to deliver what it still holds and
every queue is drained. ``docs/history.md`` ("Workload delay") has the history format and the
anomalies the ``delay`` checker names: ``delivered-early``, ``delivered-late``, ``lost``,
``duplicate``.

The due time is decided by the master that stores a message (its clock at the store plus the
delay), which the client only knows to lie between its send's invoke and completion plus the
delay: a send records the wall clock at its invoke (``wall-ms``) and the delay it asked for
(``delay-ms``), and the history's own clock does the rest.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jepsen.workloads.base import attempt
from jepsen.workloads.semantics import SemanticsClient, SemanticsWorkload, client_cache, closing, wall_ms

#: the longest delay a send asks for: delays expire within the run (and the levels RocketMQ's
#: default table has up to it, 1 s and 5 s, are still used where it runs, as in the docker group)
MAX_DELAY_MS = 5000
#: delivery times are drawn on this grid, in ms
DELIVER_STEP_MS = 50
#: how long, beyond the longest delay, the final phase waits for the group to deliver what it holds
SETTLE_S = 30.0


class DelayWorkload(SemanticsWorkload):
    """Delayed sends (levels and delivery times) to each worker's queue, polled back."""

    name = "delay"
    checker = "delay"
    wraps = "delay"

    async def worker(self, w: int) -> None:
        h, ctx = self.ctx.history, self.ctx
        group, queue_id = self.slot(w)
        key = self.key(group, queue_id)
        proc = h.new_process()
        client = self.client(group)
        pos = 0
        me = asyncio.current_task()
        try:
            while not ctx.done():
                await ctx.pace(w)
                if ctx.done():
                    break
                if ctx.rng.random() < self.act_ratio:
                    typ = await self._send(proc, client, key, queue_id, me)
                else:
                    got = await self.read(proc, client, key, queue_id, pos, task=me)
                    typ = "ok" if got is not None else "fail"
                    if got:
                        pos = got[-1].offset + 1
                if typ == "info":
                    proc = h.new_process()
                    await client.close()
                    client = self.client(group)
        finally:
            await client.close()

    def _choose(self, client: SemanticsClient) -> dict[str, Any]:
        """A level or a delivery time, and the delay in ms it asks for."""
        rng = self.ctx.rng
        levels = [i + 1 for i, ms in enumerate(client.timing.delay_levels_ms) if ms <= MAX_DELAY_MS]
        if levels and rng.random() < 0.5:
            level = rng.choice(levels)
            return {"level": level, "delay-ms": client.timing.delay_levels_ms[level - 1]}
        return {"delay-ms": rng.randrange(0, MAX_DELAY_MS + 1, DELIVER_STEP_MS)}

    async def _send(
        self, proc: int, client: SemanticsClient, key: str, queue_id: int, me: asyncio.Task[Any] | None
    ) -> str:
        h = self.ctx.history
        v = next(self.values)
        how = self._choose(client)
        now = wall_ms()  # before the invoke: no store can have happened before it
        if "level" in how:
            args: dict[str, Any] = {
                "value": v,
                "level": how["level"],
                "delay-ms": how["delay-ms"],
                "wall-ms": now,
            }
            action = client.send_delayed(queue_id, v, level=how["level"])
        else:
            deliver = now + how["delay-ms"]
            args = {"value": v, "deliver-ms": deliver, "delay-ms": how["delay-ms"], "wall-ms": now}
            action = client.send_delayed(queue_id, v, deliver_ms=deliver)
        h.invoke(proc, "send-delayed", args, key=key)
        typ, _, err = await attempt(self.ctx, action, task=me)
        h.complete(proc, typ, "send-delayed", {"value": v}, key=key, error=err, node=client.node)
        return typ

    async def final(self) -> None:
        """Once the group holds no delayed message (or the longest delay and more have passed),
        drain every queue."""
        clients, get = client_cache(self)
        try:
            await self.wait_held(get(self.groups[0]), "scheduled", MAX_DELAY_MS / 1000 + SETTLE_S)
            await self.drain([(g, q, None) for g, q in self.slots], get)
        finally:
            await closing(clients)
