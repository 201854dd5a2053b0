"""What the ``delay``, ``txn``, ``retry`` and ``order`` workloads share: the client they drive, the
queues they spread over, reads that record what each delivered message says, and final phases.

Each workload judges one of the broker's held-message semantics (``docs/history.md`` has their
history formats and anomalies). They run where the ``queue`` workload runs (a broker backend:
``queues``, ``topic`` and, with several groups, ``broker_names``), on the same test topic, and
reach the brokers only through the client the backend hands out, whose extra methods
:class:`SemanticsClient` lists (the broker system's ``BrokerQueueClient`` has them).

A read (``poll``, and ``drain`` in the final phase) records per message the entry
``[offset, value, store_ms, attempt]``: its queue offset, its value, the store time of the copy
delivered (a released delay or a retry is a new record, stamped when it was made) and how often
it was tried before (RocketMQ's ``reconsumeTimes``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, cast

from jepsen.systems.base import Unsupported
from jepsen.systems.clients import ClientSource
from jepsen.workloads.base import RunContext, Workload, attempt
from jepsen.workloads.queue import queue_key

#: a final drain is tried this often (each a new operation) before the workload gives up on it
DRAIN_TRIES = 10
#: how often the final phase asks the group how many messages it still holds
HELD_POLL_S = 0.5


#: a queue of one broker group: (topic, queue id)
Queue = tuple[str, int]


class Timing(Protocol):
    """The group's configuration the workloads judge it by (``BrokerTiming``)."""

    delay_levels_ms: tuple[int, ...]
    transaction_timeout_s: float
    transaction_check_interval_s: float
    lock_max_live_s: float


class Delivered(Protocol):
    """One delivered message (``Received``)."""

    offset: int
    value: Any
    store_ms: int
    attempt: int

    def entry(self) -> list[Any]: ...


class TxnOutcome(Protocol):
    """What became of a transactional send (``TxnResult``)."""

    decided: bool
    broker_name: str
    queue_id: int
    status: str
    end_error: str


class OrderlyConsumer(Protocol):
    """An orderly consumer the client made (``HarnessOrderlyConsumer``)."""

    client_id: str

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...


class SemanticsClient(Protocol):
    """The client the semantics workloads drive: the queue client plus the held-message calls.

    Errors as everywhere (``jepsen.systems.clients``): ``Definite`` when the call certainly did
    nothing, ``Indefinite`` (or anything else) when it may have.
    """

    node: str | None
    timing: Timing
    retry_topic: str
    dlq_topic: str

    async def send(self, queue_id: int, value: int) -> int: ...

    async def send_delayed(
        self, queue_id: int, value: int, *, level: int | None = None, deliver_ms: int | None = None
    ) -> None: ...

    async def pull_received(
        self, queue_id: int, start: int, limit: int, *, topic: str | None = None
    ) -> list[Delivered]: ...

    async def drain_received(self, queue_id: int, *, topic: str | None = None) -> list[Delivered]: ...

    async def send_back(self, received: Any, *, max_reconsume_times: int, delay_level: int) -> None: ...

    async def route_queues(self) -> list[tuple[str, int]]: ...

    async def held_counts(self) -> dict[str, int]: ...

    def set_transaction_checker(self, on_check: Callable[[Any, str], str]) -> None: ...

    async def answer_checks(self) -> None: ...

    async def send_transactional(
        self, value: int, outcome: str, on_half: Callable[[], str]
    ) -> TxnOutcome: ...

    def orderly_consumer(
        self,
        listener: Callable[[str, str, int, list[Any]], bool | Awaitable[bool]],
        *,
        on_lock: Callable[[str, list[Queue], Callable[[], Awaitable[list[Queue]]]], Awaitable[list[Queue]]],
        on_unlock: Callable[[str, list[Queue], Callable[[], Awaitable[None]]], Awaitable[None]],
        batch_size: int = 8,
    ) -> OrderlyConsumer:
        """An orderly consumer in the order workload's group: ``listener(broker name, topic, queue
        id, batch)``; ``on_lock``/``on_unlock`` get each request's broker name and queues (topic,
        queue id: its group's retry topic's queues come along) and make it."""
        ...

    async def close(self) -> None: ...


def wall_ms() -> int:
    """The wall clock in ms, as brokers stamp and schedule messages (``time.time``)."""
    return int(time.time() * 1000)


class SemanticsWorkload(Workload):
    """The queues of the test topic over every broker group, clients, reads and final drains."""

    #: the share of a worker's operations that are its own kind (sends, transactions); the rest read
    act_ratio = 0.6
    #: entries a poll asks for
    poll_max = 20

    def __init__(self, backend: ClientSource, ctx: RunContext) -> None:
        super().__init__(backend, ctx)
        queues, topic = getattr(backend, "queues", None), getattr(backend, "topic", None)
        if not queues or not topic:
            raise Unsupported(f"the {self.name} workload needs a broker backend, not {backend.system}")
        self.topic = str(topic)
        names = [str(n) for n in getattr(backend, "broker_names", None) or []]
        #: with several broker groups each has its own queue 0: keys name the group too
        self.groups: list[str | None] = list(names) or [None]
        self.multi = bool(names)
        self.slots = [(g, q) for g in self.groups for q in range(int(queues))]
        self.values: Iterator[int] = ctx.values
        self.drained: dict[str, int] = {}
        self.held: dict[str, Any] = {}

    # --- clients and keys ---------------------------------------------------------------------

    def client(self, group: str | None = None) -> SemanticsClient:
        c = self.backend.queue_client(group)
        if not hasattr(c, "pull_received"):
            raise Unsupported(
                f"the {self.name} workload needs the broker's own client, not {type(c).__name__}"
            )
        wrap = self.ctx.wrapper(self.wraps)
        return cast(SemanticsClient, wrap(c) if wrap else c)

    def key(self, group: str | None, queue_id: int, topic: str | None = None) -> str:
        return queue_key(topic or self.topic, group if self.multi else None, queue_id)

    def slot(self, w: int) -> tuple[str | None, int]:
        """The queue worker ``w`` (counted over every process of the run) works on."""
        return self.slots[(w + self.ctx.client_offset) % len(self.slots)]

    # --- reads --------------------------------------------------------------------------------

    async def read(
        self,
        proc: int,
        client: SemanticsClient,
        key: str,
        queue_id: int,
        start: int,
        *,
        topic: str | None = None,
        task: asyncio.Task[Any] | None = None,
    ) -> list[Delivered] | None:
        """One ``poll`` of ``key`` from ``start``: the messages read, None if it failed."""
        h = self.ctx.history
        h.invoke(proc, "poll", {"from": start, "max": self.poll_max}, key=key)
        typ, got, err = await attempt(
            self.ctx,
            client.pull_received(queue_id, start, self.poll_max, topic=topic),
            read_only=True,
            task=task,
        )
        value = [r.entry() for r in got] if typ == "ok" and got is not None else None
        h.complete(proc, typ, "poll", value, key=key, error=err, node=client.node)
        return got if typ == "ok" else None

    async def drain(
        self,
        targets: list[tuple[str | None, int, str | None]],
        client_for: Callable[[str | None], SemanticsClient],
    ) -> None:
        """Drain every (group, queue, topic) once, retrying each (as new operations) until one succeeds."""
        h = self.ctx.history
        for group, queue_id, topic in targets:
            key = self.key(group, queue_id, topic)
            client = client_for(group)
            proc = h.new_process()
            for _ in range(DRAIN_TRIES):
                h.invoke(proc, "drain", {"from": 0, "max": None}, key=key)
                typ, got, err = await attempt(
                    self.ctx,
                    client.drain_received(queue_id, topic=topic),
                    read_only=True,
                    timeout=self.ctx.drain_timeout,
                )
                value = [r.entry() for r in got] if typ == "ok" and got is not None else None
                h.complete(proc, typ, "drain", value, key=key, error=err, node=client.node)
                if typ == "ok":
                    self.drained[key] = len(value or [])
                    break
                await asyncio.sleep(1.0)

    async def wait_held(self, client: SemanticsClient, what: str, bound_s: float) -> None:
        """Wait until the group holds no ``what`` (``scheduled`` or ``halves``), at most ``bound_s``.

        What a final drain judges must have had its chance: a delay due, a retry delivered, a
        transaction checked. The group says how many it still holds; past the bound the drain
        goes ahead and the checker reports what never came.
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        left: int | None = None
        while loop.time() - start < bound_s:
            try:
                left = (await asyncio.wait_for(client.held_counts(), 10.0)).get(what)
            except Exception:  # noqa: BLE001 - no master at the moment: ask again
                left = None
            if left == 0:
                break
            await asyncio.sleep(HELD_POLL_S)
        self.held[what] = {"left": left, "waited_s": round(loop.time() - start, 3)}

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"drained": dict(self.drained), "drained_total": sum(self.drained.values())}
        if self.held:
            out["held_at_drain"] = dict(self.held)
        return out


async def closing(clients: dict[str | None, SemanticsClient]) -> None:
    """Close every client of a final phase."""
    for c in clients.values():
        try:
            await c.close()
        except Exception:  # noqa: BLE001 - a client that cannot close cleanly changes no verdict
            pass


def client_cache(
    workload: SemanticsWorkload,
) -> tuple[dict[str | None, SemanticsClient], Callable[[str | None], SemanticsClient]]:
    """One client per group for a final phase, made on first use."""
    clients: dict[str | None, SemanticsClient] = {}

    def get(group: str | None) -> SemanticsClient:
        if group not in clients:
            clients[group] = workload.client(group)
        return clients[group]

    return clients, get
