"""The one way every server CLI runs its asyncio main: on uvloop where it is installed."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def run_main(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion on uvloop (asyncio's own loop if uvloop cannot be imported)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but stay usable without it
        return asyncio.run(coro)
    return uvloop.run(coro)
