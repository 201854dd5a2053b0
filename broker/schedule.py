"""The broker group's promises not yet kept, as pure state rebuilt by replaying the log:
scheduled messages until due, half messages until their transaction ends, consumer queue
locks until they expire, and the send-backs already taken.

Every broker of the group applies the same entries in the same order, so each holds the
same pending sets; only the master acts on them (``broker.delivery``), by proposing
entries whose application resolves them. Resolution is idempotent (a scheduled position
is delivered only while pending, a send-back key is taken once), so a master that fails
over between proposing and committing, and a new one that proposes again, still store
each derived message exactly once.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


class Schedule:
    """Scheduled messages (delay levels and RocketMQ 5 delivery times) by position, until due."""

    def __init__(self) -> None:
        self.pending: dict[int, int] = {}  # position -> due (ms since the epoch)
        self._heap: list[tuple[int, int]] = []  # (due, position); stale entries dropped lazily

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, position: int, due_ms: int) -> None:
        self.pending[position] = due_ms
        heapq.heappush(self._heap, (due_ms, position))

    def resolve(self, position: int) -> bool:
        """Whether ``position`` was pending (it no longer is)."""
        if self.pending.pop(position, None) is None:
            return False
        if len(self._heap) > 2 * len(self.pending) + 1024:  # followers never take: keep the heap small
            self._heap = [(due, pos) for pos, due in self.pending.items()]
            heapq.heapify(self._heap)
        return True

    def take_due(self, now_ms: int, limit: int) -> list[tuple[int, int]]:
        """Up to ``limit`` pending (due, position) due at ``now_ms``, earliest first, taken off
        the heap: the caller proposes their delivery and gives back what it could not."""
        heap, pending = self._heap, self.pending
        out: list[tuple[int, int]] = []
        while heap and len(out) < limit and heap[0][0] <= now_ms:
            due, position = heapq.heappop(heap)
            if pending.get(position) == due:
                out.append((due, position))
        return out

    def give_back(self, items: Iterable[tuple[int, int]]) -> None:
        """Return taken (due, position) pairs whose delivery was not proposed or not committed."""
        for due, position in items:
            if self.pending.get(position) == due:
                heapq.heappush(self._heap, (due, position))

    def next_due(self) -> int | None:
        """The earliest due time on the heap (stale tops dropped), None if nothing is scheduled."""
        heap, pending = self._heap, self.pending
        while heap and pending.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None


@dataclass(frozen=True, slots=True)
class Half:
    """A half (prepared) message: whose transaction it is and when it was stored."""

    producer_group: str
    store_ms: int
    immunity_ms: int = 0  # CHECK_IMMUNITY_TIME_IN_SECONDS: no check before this long


class HalfMessages:
    """Half messages by position, until committed, rolled back or discarded."""

    def __init__(self) -> None:
        self.pending: dict[int, Half] = {}

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, position: int, half: Half) -> None:
        self.pending[position] = half

    def resolve(self, position: int) -> bool:
        return self.pending.pop(position, None) is not None


class QueueLocks:
    """RocketMQ's rebalance locks: (group, topic, queue id) -> the client holding it until
    when, kept in the order they were last granted. Bounded: past ``max_locks`` expired
    locks are dropped (oldest granted first) and new ones refused while none has expired."""

    def __init__(self, max_locks: int = 100_000) -> None:
        self.max_locks = max_locks
        self.held: OrderedDict[tuple[str, str, int], tuple[str, int]] = OrderedDict()

    def holder(self, group: str, topic: str, queue_id: int, now_ms: int) -> str | None:
        held = self.held.get((group, topic, queue_id))
        return held[0] if held is not None and held[1] > now_ms else None

    def lock(
        self, group: str, client: str, queues: Iterable[tuple[str, int]], now_ms: int, expires_ms: int
    ) -> frozenset[tuple[str, int]]:
        """Grant ``client`` every queue free, expired or already its own; the ones it holds now."""
        granted: set[tuple[str, int]] = set()
        held = self.held
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            current = held.get(key)
            if current is not None and current[0] != client and current[1] > now_ms:
                continue  # another client's, still live
            if current is None and len(held) >= self.max_locks:
                self._drop_expired(now_ms)
                if len(held) >= self.max_locks:
                    continue
            held[key] = (client, expires_ms)
            held.move_to_end(key)
            granted.add((topic, queue_id))
        return frozenset(granted)

    def unlock(self, group: str, client: str, queues: Iterable[tuple[str, int]]) -> None:
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            current = self.held.get(key)
            if current is not None and current[0] == client:
                del self.held[key]

    def _drop_expired(self, now_ms: int) -> None:
        """Drop expired locks from the oldest granted on: every lock lives equally long, so
        the oldest grants expire first and the walk stops at the first live one."""
        held = self.held
        while held and next(iter(held.values()))[1] <= now_ms:
            held.popitem(last=False)


class TakenKeys:
    """Origin keys already resolved (consumers' send-backs), the last ``window`` of them: a
    client retrying a send-back whose answer it lost stores it once."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._keys: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def take(self, key: bytes) -> bool:
        """Whether ``key`` was new (it is taken now)."""
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self.window:
            self._keys.popitem(last=False)
        return True
