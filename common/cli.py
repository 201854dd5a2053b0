"""The one way every server CLI runs its asyncio main: on uvloop where it is installed."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from common.gc_tuning import tune_gc


def run_main(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion on uvloop (asyncio's own loop if uvloop cannot be imported),
    with the collector tuned for a long-running server (common.gc_tuning)."""
    tune_gc()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but stay usable without it
        return asyncio.run(coro)
    return uvloop.run(coro)
