"""Consume queues: per topic-queue indexes into the commit log, built by the dispatcher.

Like RocketMQ's (commit log offset, size, tag hash) units, ours keep each message's
position (ledger index and slot, see remoting.message), its record size and its tag hash,
in three compact arrays. Entries are appended in commit order, so positions increase with
the queue offset, which lets retention and lookups use binary search. The tag hashes let a
pull skip messages a subscription does not want without reading them.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Container


class ConsumeQueue:
    __slots__ = ("topic", "queue_id", "positions", "sizes", "tags", "base", "kind")

    def __init__(self, topic: str, queue_id: int, kind: int = 0) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.kind = kind  # broker.system_topics: PLAIN, or what else a message here means
        self.positions = array("q")  # position of each message, by queue offset - base
        self.sizes = array("I")  # record size in bytes
        self.tags = array("I")  # tags code: Java String.hashCode of TAGS, unsigned (broker.codec.tag_code)
        self.base = 0  # queue offset of positions[0] (grows when retention trims the head)

    @property
    def min_offset(self) -> int:
        return self.base

    @property
    def max_offset(self) -> int:
        """The offset the next message will get (RocketMQ's max offset)."""
        return self.base + len(self.positions)

    def slice(self, offset: int, max_nums: int) -> list[tuple[int, int, int]]:
        """(queue offset, position, size) for up to ``max_nums`` messages from ``offset``."""
        lo = max(offset - self.base, 0)
        hi = min(len(self.positions), lo + max_nums)
        base, pos, sizes = self.base, self.positions, self.sizes
        return [(base + i, pos[i], sizes[i]) for i in range(lo, hi)]

    def scan(
        self, offset: int, max_nums: int, tag_hashes: Container[int], scan_limit: int
    ) -> tuple[list[tuple[int, int, int]], int]:
        """Like ``slice``, but only messages whose tag hash is in ``tag_hashes``, looking at
        no more than ``scan_limit`` entries; also returns the offset the scan stopped at
        (every entry before it either was returned or did not match)."""
        lo = max(offset - self.base, 0)
        end = min(len(self.positions), lo + scan_limit)
        tags, pos, sizes, base = self.tags, self.positions, self.sizes, self.base
        out: list[tuple[int, int, int]] = []
        i = lo
        while i < end:
            if tags[i] in tag_hashes:
                out.append((base + i, pos[i], sizes[i]))
                if len(out) >= max_nums:
                    return out, base + i + 1
            i += 1
        return out, base + end

    def trim_before(self, first_position: int) -> None:
        """Forget messages whose ledger entries retention removed."""
        cut = bisect.bisect_left(self.positions, first_position)
        if cut:
            del self.positions[:cut]
            del self.sizes[:cut]
            del self.tags[:cut]
            self.base += cut

    def offset_of_position(self, position: int) -> int | None:
        i = bisect.bisect_left(self.positions, position)
        if i < len(self.positions) and self.positions[i] == position:
            return self.base + i
        return None
