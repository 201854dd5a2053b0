"""The ``log`` workload: unique integers appended to one log, polled back, drained at the end.

Values are unique across the whole history and offsets are the log's positions, so the
``log`` checker can judge order, loss and duplication from the history alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jepsen.systems.clients import ClientSource, LogClient
from jepsen.workloads.base import RunContext, Workload, attempt


class LogWorkload(Workload):
    """Unique integers appended to one log, with polls from each worker's own position."""

    name = "log"
    checker = "log"
    key = "0"

    def __init__(self, backend: ClientSource, ctx: RunContext) -> None:
        super().__init__(backend, ctx)
        self.send_ratio = ctx.send_ratio
        self.poll_max = ctx.poll_max
        self._values = ctx.values
        self.drained: int | None = None  # pairs the final drain read (a count: the pairs are in the history)

    def client(self) -> LogClient:
        c = self.backend.log_client()
        return self.ctx.wrap_log_client(c) if self.ctx.wrap_log_client else c

    async def worker(self, w: int) -> None:
        h, ctx, key = self.ctx.history, self.ctx, self.key
        proc = h.new_process()
        client = self.client()
        pos = 0
        me = asyncio.current_task()  # once: attempt would look it up per operation
        try:
            while not ctx.done():
                await ctx.pace(w)
                if ctx.done():
                    break
                if ctx.rng.random() < self.send_ratio:
                    v = next(self._values)
                    h.invoke(proc, "send", v, key=key)
                    typ, off, err = await attempt(ctx, client.send(v), task=me)
                    h.complete(
                        proc,
                        typ,
                        "send",
                        v,
                        key=key,
                        offset=off if typ == "ok" else None,
                        error=err,
                        node=client.node,
                    )
                else:
                    h.invoke(proc, "poll", {"from": pos, "max": self.poll_max}, key=key)
                    typ, pairs, err = await attempt(
                        ctx, client.poll(pos, self.poll_max), read_only=True, task=me
                    )
                    value = [[o, v] for o, v in pairs] if typ == "ok" and pairs is not None else None
                    h.complete(proc, typ, "poll", value, key=key, error=err, node=client.node)
                    if value:
                        pos = value[-1][0] + 1
                if typ == "info":
                    proc = h.new_process()
                    await client.close()
                    client = self.client()
        finally:
            await client.close()

    async def final(self) -> None:
        """Drain the whole log once, retrying (as new operations) until one succeeds."""
        h, key = self.ctx.history, self.key
        proc = h.new_process()
        client = self.client()
        try:
            for _ in range(10):
                h.invoke(proc, "drain", {"from": 0, "max": None}, key=key)
                typ, pairs, err = await attempt(
                    self.ctx, client.drain(), read_only=True, timeout=self.ctx.drain_timeout
                )
                # (offset, value) tuples encode as the contract's [offset, value] pairs: no copy of a long drain
                value = pairs if typ == "ok" and pairs is not None else None
                h.complete(proc, typ, "drain", value, key=key, error=err, node=client.node)
                if typ == "ok":
                    self.drained = len(value or [])
                    return
                await asyncio.sleep(1.0)
        finally:
            await client.close()

    def summary(self) -> dict[str, Any]:
        return {"drained": self.drained}
