"""Consume queues: per topic-queue indexes into the commit log, built by the dispatcher.

RocketMQ keeps (commit log offset, size, tag hash) per queue offset; ours keeps the
message's position (ledger index and slot, see remoting.message) and the tag hash.
Entries are appended in commit order, so positions increase with the queue offset, which
lets retention and lookups use binary search.
"""

from __future__ import annotations

import bisect
from array import array


class ConsumeQueue:
    __slots__ = ("topic", "queue_id", "positions", "tags", "base")

    def __init__(self, topic: str, queue_id: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.positions = array("q")  # position of each message, by queue offset - base
        self.tags = array("I")
        self.base = 0  # queue offset of positions[0] (grows when retention trims the head)

    def append(self, position: int, tag_hash: int) -> int:
        """Add a message; returns its queue offset."""
        self.positions.append(position)
        self.tags.append(tag_hash)
        return self.base + len(self.positions) - 1

    @property
    def min_offset(self) -> int:
        return self.base

    @property
    def max_offset(self) -> int:
        """The offset the next message will get (RocketMQ's max offset)."""
        return self.base + len(self.positions)

    def slice(self, offset: int, max_nums: int) -> list[tuple[int, int, int]]:
        """(queue offset, position, tag hash) for up to ``max_nums`` messages from ``offset``."""
        lo = offset - self.base
        hi = min(len(self.positions), lo + max_nums)
        return [(self.base + i, self.positions[i], self.tags[i]) for i in range(max(lo, 0), hi)]

    def trim_before(self, first_position: int) -> None:
        """Forget messages whose ledger entries retention removed."""
        cut = bisect.bisect_left(self.positions, first_position)
        if cut:
            del self.positions[:cut]
            del self.tags[:cut]
            self.base += cut

    def offset_of_position(self, position: int) -> int | None:
        i = bisect.bisect_left(self.positions, position)
        if i < len(self.positions) and self.positions[i] == position:
            return self.base + i
        return None
