"""Queue allocation among a consumer group's members (RocketMQ's AllocateMessageQueueAveragely).

Every member computes the same answer from the same sorted inputs, so no coordinator is
needed: the broker only has to tell each member who else is in the group.
"""

from __future__ import annotations

from collections.abc import Sequence

from client.route import MessageQueue


def allocate_average(
    current_id: str, queues: Sequence[MessageQueue], consumer_ids: Sequence[str]
) -> list[MessageQueue]:
    """The contiguous share of ``queues`` that belongs to ``current_id``.

    With 8 queues and 3 consumers the shares are 3, 3, 2. A consumer missing from
    ``consumer_ids`` gets nothing, like RocketMQ (callers add themselves first if they know
    the broker simply has not seen their heartbeat yet).
    """
    mqs = sorted(set(queues))
    cids = sorted(set(consumer_ids))
    if not mqs or current_id not in cids:
        return []
    index = cids.index(current_id)
    n, c = len(mqs), len(cids)
    mod = n % c
    if n <= c:
        average = 1
    elif mod > 0 and index < mod:
        average = n // c + 1
    else:
        average = n // c
    start = index * average if mod > 0 and index < mod else index * average + mod
    count = min(average, n - start)
    return [mqs[(start + i) % n] for i in range(max(count, 0))]
