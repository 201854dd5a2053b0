"""Operation timeouts for thousands of concurrent clients: one sweeper, not a timer per operation.

Why: ``asyncio.timeout`` around every operation makes a Timeout object and a timer handle,
pushes it on the loop's heap and cancels it again; at ``--rate max`` (about 17k operations
a second per worker process) a worker's profile showed 12% of its CPU there. Jepsen's
operation timeout is seconds long and needs no millisecond precision, so here each
operation only notes its deadline in a dict, and one task per event loop looks at the
dict every ``resolution`` seconds and cancels the operations past theirs. An operation
can therefore run up to one resolution past its timeout.

Cancellation is told apart the way ``asyncio.timeout`` does it: the sweeper records which
tasks it cancelled, and ``expired`` (called where the CancelledError is caught) says
whether this one is ours and no other cancellation (a shutdown) is also pending.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

MAX_RESOLUTION_S: Final = 0.1  # how late, at most, a timed-out operation is cancelled


class OpDeadlines:
    """Deadlines of the operations running on one event loop (see the module docstring)."""

    def __init__(self, timeout_s: float, resolution_s: float | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError(f"operation timeout must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.resolution_s = resolution_s or min(MAX_RESOLUTION_S, timeout_s / 10)
        # task -> (deadline on the loop's clock, the task's cancelling() count when it began)
        self._running: dict[asyncio.Task[Any], tuple[float, int]] = {}
        self._cancelled: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.expired_total = 0

    def begin(self, task: asyncio.Task[Any] | None = None) -> asyncio.Task[Any]:
        """``task`` (the caller's own, default the current one) starts an operation; pair with
        ``end`` in a ``finally``. Callers that run many operations pass their task: looking it
        up costs a getpid() system call each time (asyncio's fork check)."""
        if task is None:
            task = asyncio.current_task()
            if task is None:
                raise RuntimeError("OpDeadlines.begin must run inside a task")
        loop = task.get_loop()
        self._running[task] = (loop.time() + self.timeout_s, task.cancelling())
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep())
        return task

    def end(self, task: asyncio.Task[Any]) -> None:
        self._running.pop(task, None)
        self._cancelled.discard(task)

    def expired(self, task: asyncio.Task[Any]) -> bool:
        """After a CancelledError in ``task``'s operation: True when the sweeper cancelled it
        for its deadline and nothing else asked to cancel it (then the error is swallowed and
        the operation timed out); False means re-raise."""
        entry = self._running.get(task)
        if entry is None or task not in self._cancelled:
            return False
        self._cancelled.discard(task)
        return task.uncancel() <= entry[1]

    def expire_due(self, now: float) -> int:
        """Cancel every running operation whose deadline is at or before ``now``; how many."""
        due = [
            task
            for task, (deadline, _) in self._running.items()
            if deadline <= now and task not in self._cancelled and not task.done()
        ]
        for task in due:
            self._cancelled.add(task)
            task.cancel()
        self.expired_total += len(due)
        return len(due)

    async def _sweep(self) -> None:
        """Cancel operations past their deadline; ends once no operation is running (the next
        ``begin`` starts another), so nothing outlives the workload."""
        loop = asyncio.get_running_loop()
        try:
            while self._running:
                await asyncio.sleep(self.resolution_s)
                self.expire_due(loop.time())
        finally:
            self._sweeper = None
