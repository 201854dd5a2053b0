"""Workloads: what clients do during a run, recorded as history operations.

A workload is one class (see :class:`Workload`): ``worker`` runs one logical client
until the run's deadline, ``final`` runs once every fault is healed (drains, final
reads). Each operation is written as an invoke, then exactly one completion:

* ``ok`` — the adapter returned;
* ``fail`` — it raised ``Definite`` (or a read failed: reads change nothing);
* ``info`` — it raised anything else or timed out; the worker then continues under a
  fresh process id and a fresh client (connections reopened), as Jepsen does.

Adding the ``queue`` workload (producers/consumers through the broker clients) is one
class: subclass :class:`Workload` with ``name = "queue"`` and ``checker = "log"`` (a queue
is a log per ``key``: record ``send``/``poll``/``drain`` per queue exactly as
:class:`LogWorkload` does, with ``key`` = ``"<topic>/<queue id>"`` and offsets = consume
queue offsets), take its client from a backend method such as ``queue_client()``, and add
it to :data:`WORKLOADS`.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from jepsen.history import History
from jepsen.systems.clients import Definite, LogClient, RegisterClient, RegisterReplica
from jepsen.workloads.op_deadlines import OpDeadlines

T = TypeVar("T")


class ClientSource(Protocol):
    """Where a workload gets its clients: a backend, or (in a worker process) its endpoints."""

    system: str

    def log_client(self) -> LogClient: ...

    def register_client(self, replica: RegisterReplica) -> RegisterClient: ...

    def queue_client(self) -> Any: ...


@dataclass
class RunContext:
    """What workers share: the recorder, the clock, the deadline and the pace."""

    history: History
    rng: random.Random
    deadline: float  # event-loop time at which workers stop starting operations
    rate: float  # operations per second over all workers (math.inf: closed loop, no pause)
    clients: int
    op_timeout: float = 10.0
    #: seconds a final drain may take: it reads the whole log back, which at full rate is
    #: millions of pairs, far more than one operation's ``op_timeout`` allows
    drain_timeout: float = 120.0
    send_batch: int = 1  # queue workload: up to this many concurrent sends go as one batch
    send_ratio: float = 0.75  # log/queue workloads: the share of operations that are sends
    poll_max: int = 50  # log/queue workloads: pairs a poll asks for
    #: this process's first client among all processes' (a worker's clients count from it), so
    #: that the queue workload spreads every process's clients over all its keys together
    client_offset: int = 0
    #: values sent, unique across the whole history: each recording process draws from its own
    #: arithmetic progression (shard s of n: s, s + n, ...; never 0)
    values: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    wrap_log_client: Callable[[LogClient], LogClient] | None = None
    wrap_register_client: Callable[[RegisterClient], RegisterClient] | None = None
    _deadlines: OpDeadlines | None = field(default=None, repr=False)

    def op_deadlines(self) -> OpDeadlines:
        """The operations' timeouts (made on first use, inside the event loop that runs them)."""
        if self._deadlines is None:
            self._deadlines = OpDeadlines(self.op_timeout)
        return self._deadlines

    def done(self) -> bool:
        # time.monotonic() is the event loop's clock, without looking the loop up on every operation
        return self.stop.is_set() or time.monotonic() >= self.deadline

    async def pace(self, w: int) -> None:
        """Sleep so that all workers together start about ``rate`` operations per second."""
        if self.rate == math.inf:
            return  # closed loop: the next operation starts as soon as the last completed
        mean = self.clients / self.rate if self.rate > 0 else 0.0
        if mean > 0:
            delay = self.rng.uniform(0.5 * mean, 1.5 * mean)
            delay = min(delay, max(0.0, self.deadline - asyncio.get_running_loop().time()))
            if delay > 0:
                try:
                    await asyncio.wait_for(self.stop.wait(), delay)
                except TimeoutError:
                    pass


async def attempt(
    ctx: RunContext,
    action: Awaitable[T],
    *,
    read_only: bool = False,
    task: asyncio.Task[Any] | None = None,
    timeout: float | None = None,
) -> tuple[str, T | None, str | None]:
    """Run one operation: ``(type, result, error)`` with type ok/fail/info.

    Its timeout is the context's ``OpDeadlines`` (one sweeper for all clients), not
    ``asyncio.timeout`` or ``wait_for``: both cost a timer, the latter a task too, per
    operation, a visible share of a full-rate worker's CPU. ``task``: the caller's own task,
    if it has it at hand (finding it costs a system call; see OpDeadlines.begin).
    ``timeout``: a rare operation's own limit instead (a final drain), with its own timer.
    """
    if timeout is not None:
        try:
            async with asyncio.timeout(timeout):
                try:
                    return "ok", await action, None
                except Exception as exc:  # noqa: BLE001 - sorted by _failure
                    return _failure(exc, read_only)
        except TimeoutError:
            return ("fail" if read_only else "info"), None, f"timed out after {timeout}s"
    deadlines = ctx.op_deadlines()
    task = deadlines.begin(task)
    try:
        result = await action
    except asyncio.CancelledError:
        if not deadlines.expired(task):
            raise
        return ("fail" if read_only else "info"), None, f"timed out after {ctx.op_timeout}s"
    except Exception as exc:  # noqa: BLE001 - sorted by _failure
        return _failure(exc, read_only)
    finally:
        deadlines.end(task)
    return "ok", result, None


def _failure(exc: Exception, read_only: bool) -> tuple[str, None, str]:
    """An operation's exception as its outcome: fail when it surely did nothing, else info
    (a read that did nothing either way is a fail)."""
    if isinstance(exc, Definite):
        return "fail", None, str(exc)[:300]
    if isinstance(exc, TimeoutError):  # the client's own timeout, shorter than ours
        return ("fail" if read_only else "info"), None, f"TimeoutError: {exc}"[:300]
    return ("fail" if read_only else "info"), None, f"{type(exc).__name__}: {exc}"[:300]


class Workload(ABC):
    """One kind of client behaviour and the checker model that judges it."""

    name: str = "?"
    checker: str = "?"  # the checker's workload (model) name

    def __init__(self, backend: ClientSource, ctx: RunContext) -> None:
        self.backend = backend
        self.ctx = ctx

    @abstractmethod
    async def worker(self, w: int) -> None:
        """Run one logical client until ``ctx.done()``."""

    async def final(self) -> None:
        """After every fault is healed: drains and final reads (none by default)."""
        return None

    async def close(self) -> None:
        """Release what the workload shares between its clients (a worker's last step)."""
        return None

    def summary(self) -> dict[str, Any]:
        return {}


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


class RegisterWorkload(Workload):
    """Read / write / compare-and-set on a few keys, checked for linearizability per key."""

    name = "register"
    checker = "register"

    def __init__(self, backend: ClientSource, ctx: RunContext, keys: int = 3, values: int = 5) -> None:
        super().__init__(backend, ctx)
        self.keys = [f"r{i}" for i in range(keys)]
        self.values = values
        self.replicas: list[RegisterReplica] = []

    def client(self, replica: RegisterReplica) -> RegisterClient:
        c = self.backend.register_client(replica)
        return self.ctx.wrap_register_client(c) if self.ctx.wrap_register_client else c

    async def _one(self, proc: int, client: RegisterClient, f: str, key: str) -> str:
        h, ctx, rng = self.ctx.history, self.ctx, self.ctx.rng
        if f == "read":
            h.invoke(proc, "read", None, key=key)
            typ, val, err = await attempt(ctx, client.read(key))
            h.complete(proc, typ, "read", val if typ == "ok" else None, key=key, error=err, node=client.node)
        elif f == "write":
            v = rng.randrange(self.values)
            h.invoke(proc, "write", v, key=key)
            typ, _, err = await attempt(ctx, client.write(key, v))
            h.complete(proc, typ, "write", v, key=key, error=err, node=client.node)
        else:
            old, new = rng.randrange(self.values), rng.randrange(self.values)
            h.invoke(proc, "cas", [old, new], key=key)
            typ, applied, err = await attempt(ctx, client.cas(key, old, new))
            if typ == "ok" and not applied:
                typ, err = "fail", "current value differs from the expected one"
            h.complete(proc, typ, "cas", [old, new], key=key, error=err, node=client.node)
        return typ

    async def worker(self, w: int) -> None:
        h, ctx = self.ctx.history, self.ctx
        replica = RegisterReplica()
        self.replicas.append(replica)
        proc = h.new_process()
        client = self.client(replica)
        try:
            while not ctx.done():
                await ctx.pace(w)
                if ctx.done():
                    break
                f = ctx.rng.choices(("read", "write", "cas"), (0.4, 0.3, 0.3))[0]
                typ = await self._one(proc, client, f, ctx.rng.choice(self.keys))
                if typ == "info":
                    proc = h.new_process()
                    await client.close()
                    client = self.client(replica)
        finally:
            await client.close()

    async def final(self) -> None:
        """One read per key once healed: the final state, linearized with everything else."""
        replica = RegisterReplica()
        self.replicas.append(replica)
        client = self.client(replica)
        try:
            for key in self.keys:
                for _ in range(5):
                    proc = self.ctx.history.new_process()
                    if await self._one(proc, client, "read", key) == "ok":
                        break
                    await asyncio.sleep(0.5)
        finally:
            await client.close()

    def summary(self) -> dict[str, Any]:
        mism = [m for r in self.replicas for m in r.ack_mismatches]
        return {"ack_mismatches": len(mism), "ack_mismatch_examples": mism[:5]}


WORKLOADS: dict[str, type[Workload]] = {
    "log": LogWorkload,
    "register": RegisterWorkload,
}
