"""The ``retry`` workload: a message a consumer fails comes back for another try, and after its
last one lands in the dead-letter topic; one it consumed never comes back.

Each worker sends unique integers to its queue and consumes it, and its group's retry topic
(``%RETRY%jepsen-retry``): it fails a message while it was tried fewer than ``value % 4`` times
(so values fail 0..3 times, decided by the value and the try alone, alike in every process),
and a failure is a send-back (CONSUMER_SEND_MSG_BACK) with ``MAX_RECONSUME`` tries allowed, so
a value failing three times must end in ``%DLQ%jepsen-retry``. A success is recorded as an
``ack``. Once healed, the group is given time to deliver the retries it holds, and the queues,
retry and dead-letter topics are drained. ``docs/history.md`` ("Workload retry") has the history
format and the anomalies the ``retry`` checker names: ``never-redelivered``,
``redelivered-after-success``, ``past-max-not-in-dlq``, ``dlq-and-success``, ``lost``,
``duplicate``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jepsen.workloads.base import attempt
from jepsen.workloads.semantics import (
    Delivered,
    SemanticsClient,
    SemanticsWorkload,
    client_cache,
    closing,
)

#: tries a message gets before the dead-letter topic (RocketMQ's maxReconsumeTimes), small so
#: that short runs take messages all the way there
MAX_RECONSUME = 2
#: a value fails while it was tried fewer than ``value % FAILS_MOD`` times
FAILS_MOD = 4
#: the send-back's delay level: the shortest, so retries come back within the run
RETRY_LEVEL = 1
#: how long, beyond the shortest level's delay, the final phase waits for the retries the group holds
SETTLE_S = 30.0


def fails(value: Any) -> int:
    """How often the consumer fails ``value`` before consuming it."""
    return value % FAILS_MOD if isinstance(value, int) and not isinstance(value, bool) else 0


class RetryWorkload(SemanticsWorkload):
    """Sends to each worker's queue; consumers that fail values by rule and send them back."""

    name = "retry"
    checker = "retry"
    wraps = "retry"

    def retry_key(self, client: SemanticsClient, group: str | None) -> str:
        return self.key(group, 0, client.retry_topic)

    async def worker(self, w: int) -> None:
        h, ctx = self.ctx.history, self.ctx
        group, queue_id = self.slot(w)
        key = self.key(group, queue_id)
        proc = h.new_process()
        client = self.client(group)
        pos = {"main": 0, "retry": 0}
        me = asyncio.current_task()
        try:
            while not ctx.done():
                await ctx.pace(w)
                if ctx.done():
                    break
                r = ctx.rng.random()
                if r < 0.5:
                    v = next(self.values)
                    h.invoke(proc, "send", v, key=key)
                    typ, off, err = await attempt(ctx, client.send(queue_id, v), task=me)
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
                    which = "main" if r < 0.75 else "retry"
                    topic = None if which == "main" else client.retry_topic
                    read_key = key if which == "main" else self.retry_key(client, group)
                    qid = queue_id if which == "main" else 0
                    got = await self.read(proc, client, read_key, qid, pos[which], topic=topic, task=me)
                    typ = "ok" if got is not None else "fail"
                    if got:
                        pos[which] = got[-1].offset + 1
                        proc, typ = await self._consume(proc, client, read_key, got, me)
                if typ == "info":
                    proc = h.new_process()
                    await client.close()
                    client = self.client(group)
        finally:
            await client.close()

    async def _consume(
        self, proc: int, client: SemanticsClient, key: str, got: list[Delivered], me: asyncio.Task[Any] | None
    ) -> tuple[int, str]:
        """Fail or consume each message read, in order: a send-back or an ack each."""
        h = self.ctx.history
        outcome = "ok"
        for m in got:
            if m.attempt < fails(m.value):
                args = {
                    "value": m.value,
                    "attempt": m.attempt,
                    "offset": m.offset,
                    "max": MAX_RECONSUME,
                    "level": RETRY_LEVEL,
                }
                h.invoke(proc, "send-back", args, key=key)
                typ, _, err = await attempt(
                    self.ctx,
                    client.send_back(m, max_reconsume_times=MAX_RECONSUME, delay_level=RETRY_LEVEL),
                    task=me,
                )
                h.complete(proc, typ, "send-back", args, key=key, error=err, node=client.node)
                if typ == "info":  # the rest go on under a fresh process; the caller renews the client
                    proc, outcome = h.new_process(), "info"
            else:
                args = {"value": m.value, "attempt": m.attempt, "offset": m.offset}
                h.invoke(proc, "ack", args, key=key)
                h.complete(proc, "ok", "ack", args, key=key)
        return proc, outcome

    async def final(self) -> None:
        """Once the group holds no retry not yet due (or long enough), drain the queues, the
        retry topic and the dead-letter topic of every group."""
        clients, get = client_cache(self)
        try:
            first = get(self.groups[0])
            levels = first.timing.delay_levels_ms
            await self.wait_held(first, "scheduled", levels[RETRY_LEVEL - 1] / 1000 + SETTLE_S)
            targets: list[tuple[str | None, int, str | None]] = [(g, q, None) for g, q in self.slots]
            targets += [(g, 0, first.retry_topic) for g in self.groups]
            targets += [(g, 0, first.dlq_topic) for g in self.groups]
            await self.drain(targets, get)
        finally:
            await closing(clients)
