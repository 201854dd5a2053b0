"""The clients a broker knows from their heartbeats: consumers by group (with what they
subscribe to, for rebalancing and filtering) and producers by group (for transaction checks).

Heartbeats come from the network, so the table is bounded three ways, each a setting: how
many (group, client) entries, how many bytes their subscriptions take together, and how
many subscriptions one entry may carry. Every operation is O(1) amortised: entries are
kept in the order they were last seen, so expiry pops the oldest until one is fresh, and a
full table refuses a newcomer without looking at the others. (It once rescanned every
entry on each refusal: 20,000 heartbeats with fresh client ids stalled the master's event
loop for seconds and cost it its leadership.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

CLIENT_EXPIRY_S: Final = 30.0  # a client without a heartbeat this long no longer counts in rebalancing
ENTRY_OVERHEAD_BYTES: Final = 256  # what an entry costs beyond its subscriptions' text (ids, fields)

CONSUMER: Final = 0
PRODUCER: Final = 1


@dataclass(slots=True)
class ClientInfo:
    """A client that sent a heartbeat: when, what it subscribed to (topic -> expression), and
    what RocketMQ's admin tools show of it (``GET_CONSUMER_CONNECTION_LIST``)."""

    seen: float
    subscriptions: dict[str, str] = field(default_factory=dict)
    addr: str = ""
    language: str = ""
    version: int = 0
    consume_type: str = ""
    message_model: str = ""
    consume_from_where: str = ""
    size: int = ENTRY_OVERHEAD_BYTES
    sql_topics: frozenset[str] = frozenset()  # topics whose expression is SQL92 (the rest: tags)


def subscriptions_size(subscriptions: Mapping[str, str]) -> int:
    """The bytes an entry's subscriptions are charged against the table's budget."""
    return ENTRY_OVERHEAD_BYTES + sum(len(t) + len(e) + 64 for t, e in subscriptions.items())


class ClientTable:
    """Consumers and producers by group, bounded in entries and bytes, expiring oldest first."""

    def __init__(self, max_entries: int, max_bytes: int, expiry_s: float = CLIENT_EXPIRY_S) -> None:
        if max_entries < 1 or max_bytes < ENTRY_OVERHEAD_BYTES:
            raise ValueError("a client table needs room for at least one entry")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.expiry_s = expiry_s
        self.consumers: dict[str, dict[str, ClientInfo]] = {}  # group -> client id -> info
        # group -> client id -> (last heartbeat, the connection it came on: transaction checks go there)
        self.producers: dict[str, dict[str, tuple[float, Any]]] = {}
        # (kind, group, client id) -> last heartbeat, least recently seen first
        self._seen: OrderedDict[tuple[int, str, str], float] = OrderedDict()
        self.bytes = 0
        self.refused = 0

    def __len__(self) -> int:
        return len(self._seen)

    def expire(self, now: float) -> int:
        """Drop entries silent for twice the expiry (and groups left empty); how many went."""
        horizon = now - self.expiry_s * 2
        seen = self._seen
        dropped = 0
        while seen:
            key, at = next(iter(seen.items()))
            if at >= horizon:
                break
            self._drop(key)
            dropped += 1
        return dropped

    def touch_consumer(self, group: str, client_id: str, info: ClientInfo) -> bool:
        """Record a consumer's heartbeat; False (nothing changed) when the table is full."""
        key = (CONSUMER, group, client_id)
        clients = self.consumers.get(group)
        old = clients.get(client_id) if clients is not None else None
        grow = info.size - (old.size if old is not None else 0)
        if not self._room(key, old is None, grow, info.seen):
            return False
        self.bytes += grow
        self.consumers.setdefault(group, {})[client_id] = info
        self._mark(key, info.seen)
        return True

    def touch_producer(self, group: str, client_id: str, now: float, conn: Any = None) -> bool:
        """Record a producer's heartbeat (and its connection); False (nothing changed) when full."""
        key = (PRODUCER, group, client_id)
        clients = self.producers.get(group)
        new = clients is None or client_id not in clients
        if not self._room(key, new, ENTRY_OVERHEAD_BYTES if new else 0, now):
            return False
        if new:
            self.bytes += ENTRY_OVERHEAD_BYTES
        self.producers.setdefault(group, {})[client_id] = (now, conn)
        self._mark(key, now)
        return True

    def remove_consumer(self, group: str, client_id: str) -> None:
        self._drop((CONSUMER, group, client_id))

    def remove_producer(self, group: str, client_id: str) -> None:
        self._drop((PRODUCER, group, client_id))

    def live_consumers(self, group: str, now: float) -> Iterator[tuple[str, ClientInfo]]:
        """(client id, info) of the group's consumers heard from within the expiry."""
        for cid, info in self.consumers.get(group, {}).items():
            if now - info.seen <= self.expiry_s:
                yield cid, info

    def live_producer_connections(self, group: str, now: float) -> list[Any]:
        """Open connections of the group's producers heard from within the expiry, newest first."""
        clients = self.producers.get(group, {})
        live = [
            (at, i, conn)
            for i, (at, conn) in enumerate(clients.values())
            if now - at <= self.expiry_s and conn is not None and not getattr(conn, "closing", True)
        ]
        return [conn for _, _, conn in sorted(live, reverse=True)]

    # ------------------------------------------------------------------ internals

    def _room(self, key: tuple[int, str, str], new: bool, grow: int, now: float) -> bool:
        if (new and len(self._seen) >= self.max_entries) or self.bytes + grow > self.max_bytes:
            self.expire(now)  # pops only what has expired: O(1) amortised
            if (new and len(self._seen) >= self.max_entries) or self.bytes + grow > self.max_bytes:
                self.refused += 1
                return False
        return True

    def _mark(self, key: tuple[int, str, str], now: float) -> None:
        self._seen[key] = now
        self._seen.move_to_end(key)

    def _drop(self, key: tuple[int, str, str]) -> None:
        if self._seen.pop(key, None) is None:
            return
        kind, group, client_id = key
        if kind == CONSUMER:
            clients = self.consumers.get(group, {})
            info = clients.pop(client_id, None)
            self.bytes -= info.size if info is not None else 0
            if not clients:
                self.consumers.pop(group, None)
        else:
            clients_p = self.producers.get(group, {})
            if clients_p.pop(client_id, None) is not None:
                self.bytes -= ENTRY_OVERHEAD_BYTES
            if not clients_p:
                self.producers.pop(group, None)
