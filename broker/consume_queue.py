"""Consume queues: per topic-queue indexes into the commit log, built by the dispatcher.

RocketMQ keeps (commit log offset, size, tag hash) per queue offset; ours keeps the ledger
index and the tag hash. Entries are appended in commit order, so ledger indexes increase
with the queue offset, which lets retention and lookups use binary search.
"""

from __future__ import annotations

import bisect
from array import array


class ConsumeQueue:
    __slots__ = ("topic", "queue_id", "indexes", "tags", "base")

    def __init__(self, topic: str, queue_id: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.indexes = array("q")  # ledger index of each message, by queue offset - base
        self.tags = array("I")
        self.base = 0  # queue offset of indexes[0] (grows when retention trims the head)

    def append(self, ledger_index: int, tag_hash: int) -> int:
        """Add a message; returns its queue offset."""
        self.indexes.append(ledger_index)
        self.tags.append(tag_hash)
        return self.base + len(self.indexes) - 1

    @property
    def min_offset(self) -> int:
        return self.base

    @property
    def max_offset(self) -> int:
        """The offset the next message will get (RocketMQ's max offset)."""
        return self.base + len(self.indexes)

    def slice(self, offset: int, max_nums: int) -> list[tuple[int, int, int]]:
        """(queue offset, ledger index, tag hash) for up to ``max_nums`` messages from ``offset``."""
        lo = offset - self.base
        hi = min(len(self.indexes), lo + max_nums)
        return [(self.base + i, self.indexes[i], self.tags[i]) for i in range(max(lo, 0), hi)]

    def trim_before_index(self, first_index: int) -> None:
        """Forget messages whose ledger entries retention removed."""
        cut = bisect.bisect_left(self.indexes, first_index)
        if cut:
            del self.indexes[:cut]
            del self.tags[:cut]
            self.base += cut

    def offset_of_index(self, ledger_index: int) -> int | None:
        i = bisect.bisect_left(self.indexes, ledger_index)
        if i < len(self.indexes) and self.indexes[i] == ledger_index:
            return self.base + i
        return None
