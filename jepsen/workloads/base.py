"""What every workload shares: the run context, one operation's outcome, and the ``Workload`` shape.

A workload is one class (see :class:`Workload`): ``worker`` runs one logical client
until the run's deadline, ``final`` runs once every fault is healed (drains, final
reads). Each operation is written as an invoke, then exactly one completion:

* ``ok`` — the adapter returned;
* ``fail`` — it raised ``Definite`` (or a read failed: reads change nothing);
* ``info`` — it raised anything else or timed out; the worker then continues under a
  fresh process id and a fresh client (connections reopened), as Jepsen does.

A new workload is one module with its ``Workload`` subclass (its ``name``, the ``checker``
model that judges it, the client interface it ``wraps``) and one line in ``registry``.
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
from typing import Any, TypeVar

from jepsen.history import History
from jepsen.systems.clients import ClientSource, Definite, LogClient, RegisterClient
from jepsen.workloads.op_deadlines import OpDeadlines

T = TypeVar("T")

#: pairs per ``drain`` event by default (``--drain-page``): a page of (offset, value) pairs is a
#: few MB in memory and about 1 MB of JSON; docs/history.md ("Drain pages") has the page rule
DRAIN_PAGE = 65_536


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
    #: pairs per ``drain`` event: a final drain is recorded page by page as it is read, so the
    #: recording process holds one page per key being drained, never the whole log
    drain_page: int = DRAIN_PAGE
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
    #: the semantics workloads' broken adapters, one per workload (``Workload.wraps``)
    wrap_delay_client: Callable[[Any], Any] | None = None
    wrap_txn_client: Callable[[Any], Any] | None = None
    wrap_retry_client: Callable[[Any], Any] | None = None
    wrap_order_client: Callable[[Any], Any] | None = None
    _deadlines: OpDeadlines | None = field(default=None, repr=False)

    def wrapper(self, wraps: str) -> Callable[[Any], Any] | None:
        """The broken adapter that wraps the ``wraps`` clients of this run, if any (the
        controller and each worker set it as ``wrap_<wraps>_client``)."""
        return getattr(self, f"wrap_{wraps}_client", None)

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
    #: the client interface the workload drives (``log`` or ``register``): a broken adapter
    #: for the harness's self-test must wrap this one
    wraps: str = "log"
    #: whether ``--send-batch`` can coalesce its sends
    batches_sends: bool = False

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
