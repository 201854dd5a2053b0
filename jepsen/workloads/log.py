"""The ``log`` workload: unique integers appended to one log, polled back, drained at the end.

Values are unique across the whole history and offsets are the log's positions, so the
``log`` checker can judge order, loss and duplication from the history alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from jepsen.systems.clients import ClientSource, LogClient, Pair
from jepsen.workloads.base import RunContext, Workload, attempt

#: drains tried (each from offset 0, as new operations) before the final phase gives up on a key
DRAIN_ATTEMPTS = 10


async def drain_pages(client: LogClient, page: int) -> AsyncIterator[list[Pair]]:
    """The whole log as consecutive pages of ``page`` pairs, the last one shorter (possibly
    empty). A client with ``drain_pages`` hands each over as it reads it; any other drains the
    whole log at once and is cut here (the history's shape is the same, its memory is not)."""
    own = getattr(client, "drain_pages", None)
    if own is not None:
        async for p in own(page):
            yield p
        return
    for p in pages_of(await client.drain(), page):
        yield p


def pages_of(pairs: list[Pair], page: int) -> Iterator[list[Pair]]:
    """``pairs`` cut into pages of ``page``, ending with a shorter (possibly empty) one."""
    for i in range(0, len(pairs) + 1, page):
        yield pairs[i : i + page]


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
        """Drain the whole log once, in pages, retrying from offset 0 (as new operations) until
        one drain reaches the end."""
        h = self.ctx.history
        proc = h.new_process()
        client = self.client()
        try:
            for _ in range(DRAIN_ATTEMPTS):
                typ, n = await self._drain(client, proc)
                if typ == "ok":
                    self.drained = n
                    return
                if typ == "info":  # that process id may not be used again
                    proc = h.new_process()
                await asyncio.sleep(1.0)
        finally:
            await client.close()

    async def _drain(self, client: LogClient, proc: int) -> tuple[str, int]:
        """One drain of the log as ``drain`` events of ``ctx.drain_page`` pairs each, every page
        recorded as soon as it is read (docs/history.md, "Drain pages"): the first asks from
        offset 0, each next one from just past the last offset before it, and the drain ends
        with a page shorter than the page size (possibly empty), which claims the end.

        Returns the outcome of the last page and the pairs read. The pages together may take
        ``ctx.drain_timeout`` seconds; a page that fails ends this drain (the next starts
        again from 0, so that one process's pages from offset 0 on are one whole drain).
        """
        h, key, ctx = self.ctx.history, self.key, self.ctx
        page = ctx.drain_page
        if page < 1:
            raise ValueError(f"drain page of {page} pairs for {key}: it must be at least 1")
        pages = drain_pages(client, page)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ctx.drain_timeout
        start, n = 0, 0
        try:
            while True:
                h.invoke(proc, "drain", {"from": start, "max": page}, key=key)
                typ, pairs, err = await attempt(
                    ctx, anext(pages), read_only=True, timeout=max(0.0, deadline - loop.time())
                )
                # (offset, value) tuples encode as the contract's [offset, value] pairs: no copy of a page
                value = pairs if typ == "ok" and pairs is not None else None
                h.complete(proc, typ, "drain", value, key=key, error=err, node=client.node)
                if value is None:
                    return typ, n
                n += len(value)
                if len(value) < page:
                    return typ, n
                start = value[-1][0] + 1
        finally:
            await pages.aclose()

    def summary(self) -> dict[str, Any]:
        return {"drained": self.drained}
