"""What the request processors and admin statistics need of the broker that serves them.

A Protocol, so the processors can be driven by the controller in production and by a small
stand-in in tests, and so that nothing below the controller imports it.
"""

from __future__ import annotations

from typing import Any, Protocol

from .config import BrokerConfig
from .message_store import MessageStore


class Broker(Protocol):
    """What the processors need of the broker that registers them (the controller)."""

    config: BrokerConfig

    @property
    def store(self) -> MessageStore: ...

    @property
    def is_master(self) -> bool: ...

    @property
    def leader_known(self) -> bool: ...

    def master_address(self) -> str | None: ...

    async def read_barrier(self) -> int: ...

    def runtime_info(self, lag_since: float = 0.0) -> dict[str, Any]: ...
