"""Bounded waiting for tests: a coroutine run under a deadline, and polling for a condition
with a limit on time (and so on count). Every loop a test runs ends."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def run_bounded(coro: Awaitable[T], timeout: float) -> T:
    """``asyncio.run`` of ``coro``, failing with TimeoutError after ``timeout`` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def runner(default_timeout: float) -> Callable[..., T]:
    """A module's ``run(coro, timeout=...)`` with its own default deadline."""
    return functools.partial(_run, default_timeout)


def _run(default_timeout: float, coro: Awaitable[T], timeout: float | None = None) -> T:
    return run_bounded(coro, default_timeout if timeout is None else timeout)


async def until(check: Callable[[], bool], timeout_s: float = 5.0, step_s: float = 0.02) -> bool:
    """Whether ``check()`` came true within ``timeout_s`` (polled every ``step_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(step_s)
    return check()
