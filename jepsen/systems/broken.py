"""Deliberately broken client adapters: the harness's self-test of the checker.

``jepsen run --broken-adapter NAME`` wraps every client of the run in one of these. Each
breaks a promise a sound system keeps, so a run with it must come out invalid: a checker
that calls it valid misses exactly that anomaly. Each adapter wraps one kind of client
(``wraps``: the log interface, which the log and queue workloads drive, the register
interface, or the broker client of one of the ``delay``, ``txn``, ``retry`` and ``order``
workloads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jepsen.systems.clients import LogClient, Pair
from jepsen.systems.ledger import LedgerRegisterClient


class AckUnsentLogClient:
    """A broken adapter for the harness's own tests: acknowledges some sends it never made.

    Every ``every``-th send returns ``ok`` with a plausible offset without touching the
    system, the way a client that acks before replicating would. A sound checker must find
    those values missing from the final drain (``lost-write``).
    """

    def __init__(self, inner: LogClient, every: int = 5) -> None:
        self.inner = inner
        self.every = every
        self.count = 0
        self.last_offset = 1

    @property
    def node(self) -> str | None:
        return self.inner.node

    async def send(self, value: int) -> int:
        self.count += 1
        if self.count % self.every == 0:
            return self.last_offset + 1
        offset = await self.inner.send(value)
        self.last_offset = max(self.last_offset, offset)
        return offset

    async def poll(self, start: int, limit: int) -> list[Pair]:
        return await self.inner.poll(start, limit)

    async def drain(self) -> list[Pair]:
        return await self.inner.drain()

    async def close(self) -> None:
        await self.inner.close()


class LocalReadRegisterClient:
    """A broken adapter for the harness's own tests: reads from the client's own replica.

    Writes and cas go through the log, but a read returns whatever this client last
    replayed, without ordering the read in the log: a stale read as soon as another
    client wrote since. The linearizability checker must reject the history.
    """

    def __init__(self, inner: LedgerRegisterClient) -> None:
        self.inner = inner

    @property
    def node(self) -> str | None:
        return self.inner.node

    async def read(self, key: str) -> Any:
        return self.inner.replica.state.get(key)

    async def write(self, key: str, value: Any) -> None:
        await self.inner.write(key, value)

    async def cas(self, key: str, old: Any, new: Any) -> bool:
        return await self.inner.cas(key, old, new)

    async def close(self) -> None:
        await self.inner.close()


class _Inner:
    """A semantics client (``BrokerQueueClient``) doing everything as the one it wraps, but for
    the one call a broken adapter below overrides."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class UndelayedClient(_Inner):
    """delay: sends every message at once, as if the client dropped its delay property.

    The history still says the delay the workload asked for, so the checker must find the
    messages seen before they were due (``delivered-early``).
    """

    async def send_delayed(
        self, queue_id: int, value: int, *, level: int | None = None, deliver_ms: int | None = None
    ) -> None:
        await self.inner.send(queue_id, value)


class CommitRollbacksClient(_Inner):
    """txn: ends with a commit every transaction the workload decides to roll back.

    The history records the rollback the workload decided, so the committed message must be
    found where a rolled back one may never be (``rolled-back-visible``).
    """

    async def send_transactional(self, value: int, outcome: str, on_half: Callable[[], str]) -> Any:
        def commit_instead() -> str:
            decision = on_half()
            return "commit" if decision == "rollback" else decision

        return await self.inner.send_transactional(value, outcome, commit_instead)


class UnsentSendBacksClient(_Inner):
    """retry: acknowledges the consumer's send-backs without making them.

    A failed message then never comes back from the retry topic (``never-redelivered``).
    """

    async def send_back(self, received: Any, *, max_reconsume_times: int, delay_level: int) -> None:
        return None


class SkipMessagesClient(_Inner):
    """order: its orderly consumers skip a message now and then, yet count the batch as consumed.

    Every third delivery loses its first message, so a later message of the queue is consumed
    while an earlier one never is (``order-broken``).
    """

    def orderly_consumer(
        self, listener: Callable[..., Any], *, on_lock: Any, on_unlock: Any, batch_size: int = 8
    ) -> Any:
        seen = [0]

        def skipping(broker_name: str, topic: str, queue_id: int, batch: list[Any]) -> Any:
            seen[0] += 1
            if seen[0] % 3 == 0 and batch:
                batch = batch[1:]
            return listener(broker_name, topic, queue_id, batch)

        return self.inner.orderly_consumer(
            skipping, on_lock=on_lock, on_unlock=on_unlock, batch_size=batch_size
        )


@dataclass(frozen=True)
class BrokenAdapter:
    """One broken adapter: the client interface it wraps (``log`` or ``register``) and how."""

    wraps: str
    wrap: Callable[[Any], Any]


#: every broken adapter by its ``--broken-adapter`` name
BROKEN_ADAPTERS: dict[str, BrokenAdapter] = {
    "ack-unsent": BrokenAdapter("log", AckUnsentLogClient),
    "local-reads": BrokenAdapter("register", LocalReadRegisterClient),
    "undelayed": BrokenAdapter("delay", UndelayedClient),
    "commit-rollbacks": BrokenAdapter("txn", CommitRollbacksClient),
    "unsent-send-backs": BrokenAdapter("retry", UnsentSendBacksClient),
    "skip-messages": BrokenAdapter("order", SkipMessagesClient),
}


def adapters_for(wraps: str) -> dict[str, BrokenAdapter]:
    """The broken adapters that wrap the ``wraps`` interface, by name."""
    return {name: a for name, a in BROKEN_ADAPTERS.items() if a.wraps == wraps}
