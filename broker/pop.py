"""RocketMQ 5's POP consumption as replicated state: per (group, topic, queue) a cursor and a
bounded table of in-flight offsets, each invisible until a deadline the master decided.

RocketMQ keeps this in check-point and ack messages of a revive topic that a background
service replays; a failover there can redeliver acked messages or forget un-acked ones until
the revive catches up. Here every POP, ACK and CHANGE_MESSAGE_INVISIBLETIME is a metadata
entry of the group's log (``broker.meta`` PopOp and PopAckOp), applied by every broker in
the same order with the master's clock carried in the entry, so every broker holds the same
table and a new master serves it at once: an un-acked message becomes visible again after
its invisible time, an acked one is never served again.

A handle (RocketMQ's receipt handle, the ``POP_CK`` extra info) is the pair (queue offset,
pop time). Pop times are strictly increasing per queue (``max(now, last + 1)``), so a handle
names one delivery: once the message is popped again or its invisible time changed, the old
handle is refused. Offsets below the cursor and not in flight are acknowledged (or were
skipped by the consumer's filter), so the state is the cursor plus at most ``limit``
in-flight entries per queue, and at most ``max_queues`` queues.

Nothing here raises on an entry's content: an offset the entry may not take is left out of
the outcome, which the master answers with.
"""

from __future__ import annotations

from dataclasses import dataclass

from .meta import MAX_POP_INFLIGHT_CAP, PopAckOp, PopOp

MAX_POP_QUEUES = 100_000  # (group, topic, queue) a broker group keeps POP state for


@dataclass(slots=True)
class InFlight:
    """One popped, not yet acknowledged message of a queue."""

    pop_time: int  # the handle's pop time: the delivery it names
    deadline: int  # invisible until (ms since the epoch, the master's clock)
    times: int  # how often it was popped (its reconsume count is times - 1)


@dataclass(frozen=True, slots=True)
class Granted:
    """A delivery an entry made: the message at ``offset`` under handle (offset, pop_time)."""

    queue: int
    offset: int
    pop_time: int
    deadline: int
    times: int


class PopQueue:
    """A group's POP progress in one queue."""

    __slots__ = ("cursor", "inflight", "last_pop_time")

    def __init__(self, cursor: int) -> None:
        self.cursor = cursor  # offsets below it were popped (or skipped by the filter)
        self.inflight: dict[int, InFlight] = {}  # offset -> delivery, in the order first popped
        self.last_pop_time = 0

    def expired(self, now_ms: int, limit: int) -> list[int]:
        """Up to ``limit`` in-flight offsets whose invisible time has passed at ``now_ms``."""
        out = []
        for offset, entry in self.inflight.items():
            if entry.deadline <= now_ms:
                out.append(offset)
                if len(out) >= limit:
                    break
        return out

    def next_deadline(self) -> int | None:
        """The earliest invisible-until of the in-flight messages, None when there are none."""
        return min((e.deadline for e in self.inflight.values()), default=None)


# Why a handle was refused; "" when it was taken.
NOT_POPPED = "never popped"
STALE = "stale: the message was popped again, or its invisible time changed, since this handle"
EXPIRED = "expired: its invisible time passed, so the message is visible again"


class PopStates:
    """Every (group, topic, queue)'s POP state of one broker group."""

    def __init__(self, max_queues: int = MAX_POP_QUEUES) -> None:
        self.max_queues = max_queues
        self.queues: dict[tuple[str, str, int], PopQueue] = {}

    def __len__(self) -> int:
        return len(self.queues)

    def inflight_count(self) -> int:
        return sum(len(q.inflight) for q in self.queues.values())

    def get(self, group: str, topic: str, queue_id: int) -> PopQueue | None:
        return self.queues.get((group, topic, queue_id))

    def progress(self, op: PopOp | PopAckOp) -> list[tuple[tuple[str, str, int], int]]:
        """The consumer offset of each queue ``op`` touched: below it every message is acked
        (the least in-flight offset, else the cursor), what admin tools show as the group's
        progress and lag (RocketMQ commits its POP offsets to the consumer offsets too)."""
        queues = [p.queue for p in op.picks] if isinstance(op, PopOp) else [op.queue]
        out = []
        for qid in queues:
            key = (op.group, op.topic, qid)
            pq = self.queues.get(key)
            if pq is not None:
                out.append((key, min(pq.inflight, default=pq.cursor)))
        return out

    def pop(self, op: PopOp) -> list[Granted]:
        """Apply a POP: grant each named offset still free to take, in order; the deliveries made.

        An in-flight offset is taken again only once expired at ``op.now`` (its pop count
        goes up); a new one only at or past the cursor, below ``cursor_to`` and while the
        queue holds fewer than ``op.limit`` in flight. In-flight offsets below ``floor`` (removed
        by retention) are dropped and the cursor moves to it at least. The cursor moves to ``cursor_to``, or
        to the first new offset refused for the bound (so nothing unserved is passed over).
        """
        limit = min(op.limit, MAX_POP_INFLIGHT_CAP)
        touched: list[PopQueue] = []
        for pick in op.picks:
            pq = self.queues.get((op.group, op.topic, pick.queue))
            if pq is None and len(self.queues) < self.max_queues:
                pq = self.queues[(op.group, op.topic, pick.queue)] = PopQueue(pick.start)
            if pq is not None:
                touched.append(pq)
        if not touched:
            return []
        pop_time = max(op.now, max(pq.last_pop_time for pq in touched) + 1)
        deadline = pop_time + op.invisible
        out: list[Granted] = []
        for pick in op.picks:
            pq = self.queues.get((op.group, op.topic, pick.queue))
            if pq is None:
                continue
            pq.last_pop_time = pop_time
            inflight = pq.inflight
            if pick.floor > pq.cursor or inflight and pick.floor > min(inflight):
                # retention removed what lies below the queue's min offset: nothing to deliver there
                for gone in [o for o in inflight if o < pick.floor]:
                    del inflight[gone]
                pq.cursor = max(pq.cursor, pick.floor)
            cursor_to = pick.cursor_to
            for offset in pick.offsets:
                entry = inflight.get(offset)
                if entry is not None:
                    if entry.deadline > op.now:
                        continue  # still invisible: another consumer holds it
                    entry.pop_time, entry.deadline = pop_time, deadline
                    entry.times += 1
                    out.append(Granted(pick.queue, offset, pop_time, deadline, entry.times))
                elif pq.cursor <= offset < cursor_to:
                    if len(inflight) >= limit:
                        cursor_to = min(cursor_to, offset)
                        continue
                    inflight[offset] = InFlight(pop_time, deadline, 1)
                    out.append(Granted(pick.queue, offset, pop_time, deadline, 1))
            pq.cursor = max(pq.cursor, cursor_to)
        return out

    def ack(self, op: PopAckOp) -> list[str | Granted]:
        """Apply an ACK (or, with ``op.invisible``, a CHANGE_MESSAGE_INVISIBLETIME): per handle
        "" if acknowledged (the new delivery if its invisible time changed), else why not; with
        ``op.dead`` an expired delivery is dropped (its message stored as a dead letter). An
        offset below the cursor and not in flight is acknowledged already: a repeated ack
        (its answer lost) succeeds."""
        pq = self.queues.get((op.group, op.topic, op.queue))
        out: list[str | Granted] = []
        for offset, pop_time in op.handles:
            entry = None if pq is None else pq.inflight.get(offset)
            if entry is None:
                acked = pq is not None and offset < pq.cursor and not op.invisible
                out.append(
                    "" if acked else NOT_POPPED if pq is None or offset >= pq.cursor else "acknowledged"
                )
                continue
            if entry.pop_time != pop_time:
                out.append(STALE)
            elif op.dead:
                assert pq is not None
                if entry.deadline <= op.now:
                    del pq.inflight[offset]
                out.append("" if entry.deadline <= op.now else "not expired")
            elif entry.deadline <= op.now:
                out.append(EXPIRED)
            elif op.invisible:
                assert pq is not None
                entry.pop_time = pq.last_pop_time = max(op.now, pq.last_pop_time + 1)
                entry.deadline = entry.pop_time + op.invisible
                out.append(Granted(op.queue, offset, entry.pop_time, entry.deadline, entry.times))
            else:
                assert pq is not None
                del pq.inflight[offset]
                out.append("")
        return out
