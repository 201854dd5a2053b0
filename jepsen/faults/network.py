"""Shaped peer links: every link within the targeted groups delayed (``slow-network``) or lossy (``lossy-network``).

Both are recorded as ``start-partition``/``stop-partition`` with the shape in the value (the
delay, the loss and the seed the backend draws its choices from, so a run can be replayed).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from jepsen.faults.base import Fault, FaultContext, Scope, unshape, with_reply
from jepsen.systems.base import Backend

#: ``slow-network``: every peer link delayed this much, plus uniform jitter
SLOW_DELAY_MS = 150.0
SLOW_JITTER_MS = 50.0
#: ``lossy-network``: probability that a chunk or a new connection on a peer link is lost
LOSS_PROBABILITY = 0.05


class Shape(Fault):
    """Delay or drop traffic on every peer link of the targeted groups; heal every link to stop."""

    breaks = "start-partition"
    heals = "stop-partition"
    #: the shape: ``delay_ms``, ``jitter_ms`` and ``drop``
    shape: ClassVar[dict[str, float]]

    def __init__(self) -> None:
        self.healed: dict[str, Any] = {}

    @classmethod
    @abstractmethod
    def able(cls, backend: Backend) -> bool:
        """Whether the backend can apply this shape."""

    @classmethod
    def refusal(cls, backend: Backend) -> str | None:
        return None if cls.able(backend) else backend.shape_refusal(cls.name)

    async def start(self, ctx: FaultContext, scope: Scope) -> None:
        b = ctx.backend
        links = {(a, c) for g in scope.groups for a in g for c in g if a != c}
        shape = dict(self.shape)
        seed = ctx.rng.randrange(1 << 31)
        nodes = sorted(scope.nodes)
        value = {"fault": self.name, "nodes": nodes, **shape, "seed": seed, **scope.info}
        await ctx.op(
            "start-partition", value, lambda: with_reply(value, b.set_shape(links, **shape, seed=seed))
        )
        self.healed = {"fault": self.name, "nodes": nodes, **scope.info}

    async def stop(self, ctx: FaultContext) -> None:
        b, value = ctx.backend, self.healed
        await ctx.op("stop-partition", value, lambda: unshape(b, value))


class SlowNetwork(Shape):
    """Delay every peer link of the targeted groups (with jitter), keeping its throughput."""

    name = "slow-network"
    shape = {"delay_ms": SLOW_DELAY_MS, "jitter_ms": SLOW_JITTER_MS, "drop": 0.0}

    @classmethod
    def able(cls, backend: Backend) -> bool:
        return backend.supports_delay


class LossyNetwork(Shape):
    """Lose a share of the chunks and new connections on every peer link of the targeted groups."""

    name = "lossy-network"
    shape = {"delay_ms": 0.0, "jitter_ms": 0.0, "drop": LOSS_PROBABILITY}

    @classmethod
    def able(cls, backend: Backend) -> bool:
        return backend.supports_loss
