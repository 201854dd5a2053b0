"""The ``order`` workload: each queue is consumed in the order it was stored, by one consumer at a
time, under the queue locks orderly consumers take on the group's master.

Each worker is an ordered producer (unique integers, one send at a time, to its queue) and an
orderly consumer of the whole topic in one group (``PushConsumer(orderly=True)``): the consumers
share the queues out among themselves, lock each on its group's master before consuming it,
renew the locks and give them up when a queue moves to another consumer. Every delivered batch
is a ``consume`` operation (the consumer fails a batch holding a value divisible by 10 on its
first try, so the queue is held back and retried in place), every lock and unlock request an
operation with its outcome. Once healed, every queue is drained. ``docs/history.md`` ("Workload
order") has the history format and the anomalies the ``order`` checker names: ``order-broken``,
``two-consumers-one-queue``, ``lost``, ``duplicate``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from jepsen.systems.clients import Definite
from jepsen.workloads.base import attempt
from jepsen.workloads.semantics import (
    Delivered,
    OrderlyConsumer,
    Queue,
    SemanticsClient,
    SemanticsWorkload,
    client_cache,
    closing,
)

#: messages a consumer is handed at once
BATCH = 8
#: a batch holding a value divisible by this is failed on its first try
FAIL_EVERY = 10
#: tries to start a consumer before the worker goes on as a producer only
START_TRIES = 5


class OrderWorkload(SemanticsWorkload):
    """Ordered producers and orderly consumers of one group, every lock in the history."""

    name = "order"
    checker = "order"
    wraps = "order"

    async def worker(self, w: int) -> None:
        h, ctx = self.ctx.history, self.ctx
        group, queue_id = self.slot(w)
        key = self.key(group, queue_id)
        proc = h.new_process()
        client = self.client(group)
        consumer: OrderlyConsumer | None = None
        me = asyncio.current_task()
        try:
            consumer = await self._consumer(client)
            while not ctx.done():
                await ctx.pace(w)
                if ctx.done():
                    break
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
                if typ == "info":
                    # the client stays (its consumer lives in it; the producer reconnects by itself)
                    proc = h.new_process()
        finally:
            if consumer is not None:
                try:
                    await consumer.shutdown()  # gives its locks up (recorded)
                except Exception:  # noqa: BLE001 - its locks then expire on the broker
                    pass
            await client.close()

    async def _consumer(self, client: SemanticsClient) -> OrderlyConsumer | None:
        """An orderly consumer whose deliveries, locks and unlocks are recorded."""
        h = self.ctx.history
        live_ms = int(client.timing.lock_max_live_s * 1000)
        procs: dict[str, int] = {}
        holder: list[str] = []

        def listener(broker_name: str, topic: str, queue_id: int, batch: list[Delivered]) -> bool:
            key = self.key(broker_name, queue_id, topic)
            proc = procs.get(key)
            if proc is None:
                proc = procs[key] = h.new_process()
            args = {"consumer": holder[0], "messages": [m.entry() for m in batch]}
            h.invoke(proc, "consume", args, key=key)
            refuse = any(m.attempt == 0 and fails_first(m.value) for m in batch)
            if refuse:
                h.complete(
                    proc, "fail", "consume", None, key=key, error="the consumer asked to try the batch again"
                )
                return False
            h.complete(proc, "ok", "consume", None, key=key)
            return True

        async def on_lock(
            broker_name: str, queues: list[Queue], request: Callable[[], Awaitable[list[Queue]]]
        ) -> list[Queue]:
            keys = [self.key(broker_name, q, topic) for topic, q in queues]
            proc = h.new_process()
            h.invoke(proc, "lock", {"consumer": holder[0], "queues": keys, "live-ms": live_ms})
            try:
                granted = await request()
            except Definite as exc:
                h.complete(proc, "fail", "lock", None, error=str(exc)[:300])
                raise
            except BaseException as exc:
                h.complete(proc, "info", "lock", None, error=f"{type(exc).__name__}: {exc}"[:300])
                raise
            h.complete(
                proc, "ok", "lock", {"granted": [self.key(broker_name, q, topic) for topic, q in granted]}
            )
            return granted

        async def on_unlock(
            broker_name: str, queues: list[Queue], request: Callable[[], Awaitable[None]]
        ) -> None:
            keys = [self.key(broker_name, q, topic) for topic, q in queues]
            proc = h.new_process()
            h.invoke(proc, "unlock", {"consumer": holder[0], "queues": keys})
            try:
                await request()
            except Definite as exc:
                h.complete(proc, "fail", "unlock", None, error=str(exc)[:300])
                raise
            except BaseException as exc:
                h.complete(proc, "info", "unlock", None, error=f"{type(exc).__name__}: {exc}"[:300])
                raise
            h.complete(proc, "ok", "unlock", None)

        consumer = client.orderly_consumer(listener, on_lock=on_lock, on_unlock=on_unlock, batch_size=BATCH)
        holder.append(consumer.client_id)
        for _ in range(START_TRIES):
            try:
                await consumer.start()
                return consumer
            except Exception:  # noqa: BLE001 - no route yet, no master: again
                await asyncio.sleep(1.0)
        return None

    async def final(self) -> None:
        """Drain every queue."""
        clients, get = client_cache(self)
        try:
            await self.drain([(g, q, None) for g, q in self.slots], get)
        finally:
            await closing(clients)


def fails_first(value: Any) -> bool:
    """Whether the consumer fails a batch holding ``value`` on its first try."""
    return isinstance(value, int) and not isinstance(value, bool) and value % FAIL_EVERY == 0
