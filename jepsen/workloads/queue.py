"""The ``queue`` workload: producers and consumers of a topic's queues, each queue judged as a log.

Each queue of the test topic is one history ``key`` (``"<topic>/<queue id>"``, or
``"<topic>/<broker name>/<queue id>"`` when the topic spans several broker groups, each with
its own queue 0) and its consume-queue offsets are the log offsets, so the ``log`` checker
judges it: on each queue the workload does what the ``log`` workload does on its one log.

With ``--send-batch N`` the sends that clients make to one queue at about the same time go
out together as one batch request (:class:`SendCoalescer`), which the broker stores as one
ledger entry: each is still its own operation in the history, and they share one outcome.
The workload reaches the brokers only through the :class:`~jepsen.systems.clients.QueueClient`
interface its client source hands out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from jepsen.systems.base import Unsupported
from jepsen.systems.clients import ClientSource, Definite, Indefinite, LogClient, Pair, QueueClient
from jepsen.workloads.base import RunContext, Workload
from jepsen.workloads.log import LogWorkload, pages_of


class SendCoalescer:
    """Sends to one queue that arrive within ``linger_s`` of each other go as one batch.

    Like a producer shared by many threads that batches their messages: each caller gets
    its own offset, or the batch's error (a definite failure or an unknown outcome).
    """

    def __init__(self, client: QueueClient, queue_id: int, max_batch: int, linger_s: float = 0.01) -> None:
        self.client = client
        self.queue_id = queue_id
        self.max_batch = max_batch
        self.linger_s = linger_s
        self._pending: list[tuple[int, asyncio.Future[tuple[int, str | None]]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.largest = 0
        # the loop, looked up once: asyncio.get_running_loop() costs a getpid() system call
        self._loop: asyncio.AbstractEventLoop | None = None

    async def send(self, value: int) -> tuple[int, str | None]:
        """(offset, node that stored it) once the batch holding ``value`` is acknowledged."""
        loop = self._loop or self._bind_loop()
        fut: asyncio.Future[tuple[int, str | None]] = loop.create_future()
        self._pending.append((value, fut))
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger_s, self._flush)
        return await fut

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            task = (self._loop or self._bind_loop()).create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[int, asyncio.Future[tuple[int, str | None]]]]) -> None:
        self.batches += 1
        self.largest = max(self.largest, len(batch))
        try:
            offsets, node = await self.client.send_batch(self.queue_id, [v for v, _ in batch])
            outcome: list[tuple[int, str | None]] | BaseException = [(off, node) for off in offsets]
        except (Definite, Indefinite) as exc:
            outcome = exc
        except Exception as exc:  # noqa: BLE001 - anything else: we cannot know whether it was stored
            outcome = Indefinite(f"{type(exc).__name__}: {exc}")
        for i, (_, fut) in enumerate(batch):
            if fut.done():
                continue
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome[i])

    async def close(self) -> None:
        self._flush()
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
        await self.client.close()


class _QueueLog:
    """One queue of a QueueClient, seen as the LogClient the log workload drives."""

    def __init__(self, client: QueueClient, queue_id: int, coalescer: SendCoalescer | None = None) -> None:
        self.client = client
        self.queue_id = queue_id
        self.coalescer = coalescer

    @property
    def node(self) -> str | None:
        return self.client.node

    async def send(self, value: int) -> int:
        if self.coalescer is None:
            return await self.client.send(self.queue_id, value)
        offset, self.client.node = await self.coalescer.send(value)
        return offset

    async def poll(self, start: int, limit: int) -> list[Pair]:
        return await self.client.poll(self.queue_id, start, limit)

    async def drain(self) -> list[Pair]:
        return await self.client.drain(self.queue_id)

    async def drain_pages(self, page: int) -> AsyncIterator[list[Pair]]:
        """The queue as ``drain``'s pages (``jepsen.workloads.log.drain_pages``): read page by
        page where the queue client can (``drain_pages``), else drained at once and cut."""
        own = getattr(self.client, "drain_pages", None)
        if own is None:
            for p in pages_of(await self.client.drain(self.queue_id), page):
                yield p
            return
        async for p in own(self.queue_id, page):
            yield p

    async def close(self) -> None:
        await self.client.close()


class _QueuePart(LogWorkload):
    """The log workload on one queue; values are drawn from a counter shared by all queues."""

    def __init__(
        self,
        backend: ClientSource,
        ctx: RunContext,
        queue_id: int,
        values: Iterator[int],
        coalescer: SendCoalescer | None = None,
        broker_name: str | None = None,
        *,
        topic: str,
    ) -> None:
        super().__init__(backend, ctx)
        self.queue_id = queue_id
        self.broker_name = broker_name
        self.key = queue_key(topic, broker_name, queue_id)
        self._values = values
        self.coalescer = coalescer

    def client(self) -> LogClient:
        c: LogClient = _QueueLog(queue_client(self.backend, self.broker_name), self.queue_id, self.coalescer)
        return self.ctx.wrap_log_client(c) if self.ctx.wrap_log_client else c


class QueueWorkload(Workload):
    """Producers send unique integers to the queues of a topic; consumers poll them back."""

    name = "queue"
    checker = "log"
    wraps = "log"  # each queue is driven through the log interface
    batches_sends = True

    def __init__(self, backend: ClientSource, ctx: RunContext) -> None:
        super().__init__(backend, ctx)
        queues, topic = getattr(backend, "queues", None), getattr(backend, "topic", None)
        if not queues or not topic:
            raise Unsupported(f"the queue workload needs a broker backend, not {backend.system}")
        values = ctx.values  # unique across the whole history, as docs/history.md requires
        # several broker groups: every group holds ``queues`` queues of the topic, one key each
        groups: list[str | None] = list(getattr(backend, "broker_names", None) or [None])
        slots = [(g, q) for g in groups for q in range(queues)]
        self.coalescers = (
            [SendCoalescer(queue_client(backend, g), q, ctx.send_batch) for g, q in slots]
            if ctx.send_batch > 1
            else []
        )
        self.parts = [
            _QueuePart(
                backend,
                ctx,
                q,
                values,
                self.coalescers[i] if self.coalescers else None,
                broker_name=g,
                topic=str(topic),
            )
            for i, (g, q) in enumerate(slots)
        ]

    async def worker(self, w: int) -> None:
        await self.parts[(w + self.ctx.client_offset) % len(self.parts)].worker(w)

    async def final(self) -> None:
        try:
            await asyncio.gather(*(p.final() for p in self.parts))
        finally:
            await self.close()

    async def close(self) -> None:
        try:
            for c in self.coalescers:
                await c.close()
        finally:
            close_shared = getattr(self.backend, "close_shared_clients", None)
            if close_shared is not None:
                await close_shared()

    def summary(self) -> dict[str, Any]:
        drained = {p.key: p.summary().get("drained") for p in self.parts}
        out: dict[str, Any] = {"drained": drained, "drained_total": sum(v or 0 for v in drained.values())}
        if any(p.broker_name for p in self.parts):
            by_group: dict[str, int] = {}
            for p in self.parts:
                by_group[str(p.broker_name)] = by_group.get(str(p.broker_name), 0) + (drained[p.key] or 0)
            out["drained_by_group"] = by_group
        if self.coalescers:
            out["send_batches"] = sum(c.batches for c in self.coalescers)
            out["largest_send_batch"] = max(c.largest for c in self.coalescers)
        return out


def queue_client(backend: ClientSource, broker_name: str | None) -> QueueClient:
    """A client of the backend's queues; on the process's shared client instance where the
    backend has one (``shared_queue_client``: one route table and set of connections per
    process, as RocketMQ's clients share one per JVM), else one of its own."""
    shared = getattr(backend, "shared_queue_client", None)
    return shared(broker_name) if shared is not None else backend.queue_client(broker_name)


def queue_key(topic: str, broker_name: str | None, queue_id: int) -> str:
    """A queue's history key: ``<topic>/<queue>``, or ``<topic>/<broker name>/<queue>`` when the
    topic spans several broker groups (each has its own queue 0)."""
    return f"{topic}/{broker_name}/{queue_id}" if broker_name else f"{topic}/{queue_id}"
