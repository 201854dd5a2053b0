"""RocketMQ 5's POP consumption requests with RocketMQ's codes, headers and bodies: POP_MESSAGE,
ACK_MESSAGE, BATCH_ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME.

The master chooses what a POP takes from its applied state (expired in-flight messages
first, then new ones past the cursor that match the request's filter) and proposes it as one
entry; the answer is what that entry's application granted (``broker.pop``), so two POPs
racing for one message, or a POP racing a failover, never hand it out twice. Acks and
invisible-time changes are entries too, judged at the master's clock carried in them.

Handles are RocketMQ's: the response headers ``popTime``, ``invisibleTime``, ``reviveQid``
(always 0 here), ``startOffsetInfo`` and ``msgOffsetInfo`` from which a RocketMQ client builds
each message's ``POP_CK`` extra info (``ExtraInfoUtil``: ck offset, pop time, invisible time,
revive queue, retry flag, broker name, queue id, queue offset, space-separated). An ACK or
CHANGE_MESSAGE_INVISIBLETIME names that extra info and the queue offset.

An orderly POP (``order=true``, a 5.x FIFO consumer group) has at most one message of a
queue in flight for the group: while it is invisible nothing after it is delivered; the next
message of the queue (and so of every message group it holds) only once it is acked, or,
once its invisible time is over, it comes again first. Its picks and entry are made one at
a time per (group, topic) on the master.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import random
import struct
import time
from typing import TYPE_CHECKING, Any

from ledger.embed import EmbedError, LedgerBusy, NotLeaderError
from remoting.codes import RequestCode, ResponseCode
from remoting.exceptions import RemotingCommandError
from remoting.jsonbody import loads_bounded
from remoting.message import (
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    MessageFormatError,
    java_string_hash,
    properties_from_bytes,
    serve_records,
    stored_record_fields,
)
from remoting.protocol import RemotingCommand
from remoting.topic import PERM_READ

from . import codec, derive
from .meta import (
    MAX_INVISIBLE_MS,
    MAX_NAME_CHARS,
    MAX_POP_OFFSETS,
    PopPick,
    ack_op,
    dead_op,
    invisible_op,
    pop_op,
)
from .pop import Granted, PopQueue
from .requests import INT32_MAX, INT32_MIN, MAX_TIMESTAMP_MS, RequestContext
from .sql_filter import Filter as SqlFilter
from .sql_filter import SqlFilterError, compile_filter

if TYPE_CHECKING:
    from remoting.connection import RemotingConnection

MAX_POP_BATCH = 32  # messages one POP may ask for (RocketMQ's broker refuses more)
MAX_POP_BYTES = 4 << 20  # message bytes one POP answers with (at least one message)
POP_SCAN_LIMIT = 16_000  # consume-queue entries one filtered POP looks at per queue
MAX_BURY_PER_POP = 32  # deliveries past their retries one POP stores as dead letters per queue
MAX_BATCH_ACK_BODY = 1 << 20  # a BATCH_ACK_MESSAGE body
MAX_BATCH_ACKS = 1024  # BatchAck items in one BATCH_ACK_MESSAGE
MAX_POP_ROUNDS = 8  # entries one POP request may append (each past filtered-out messages at least)
#: (group, topic) pairs with orderly POPs under way at once on a master (each holds a lock)
MAX_ORDER_LOCKS = 10_000
INIT_MODE_MIN, INIT_MODE_MAX = 0, 1  # RocketMQ's ConsumeInitMode: a new group starts at min or max
NORMAL_TOPIC_FLAG = "0"  # ExtraInfoUtil: "1" would name the group's POP retry topic
_I32 = struct.Struct(">i")


def _tag_hashes(expr: str) -> frozenset[int] | None:
    """Tag hashes a TAG expression ("TagA || TagB") selects; None for all."""
    tags = {t.strip() for t in expr.split("||")} - {""}
    if not tags or "*" in tags:
        return None
    return frozenset(java_string_hash(t) & 0xFFFFFFFF for t in tags)


def _reconsume_at(rec: bytes | memoryview) -> int:
    """Where a stored record keeps its reconsume count (after the two hosts, which may be IPv6)."""
    (sysflag,) = _I32.unpack_from(rec, 36)
    born = 20 if sysflag & SYSFLAG_BORNHOST_V6 else 8
    store = 20 if sysflag & SYSFLAG_STOREHOST_V6 else 8
    return 48 + born + 8 + store


def parse_extra_info(text: str) -> tuple[int, int, str, int]:
    """(ck offset, pop time, broker name, queue id) of a ``POP_CK`` extra info; RemotingCommandError
    when it is not one."""
    fields = text.split(" ")
    if len(fields) < 7:
        raise RemotingCommandError(
            f"extraInfo {text[:120]!r} is not a POP_CK (7 or 8 space-separated fields)"
        )
    try:
        ck, pop_time, queue_id = int(fields[0]), int(fields[1]), int(fields[6])
    except ValueError:
        raise RemotingCommandError(
            f"extraInfo {text[:120]!r}: offset, pop time and queue id must be numbers"
        ) from None
    if not (0 <= ck <= MAX_TIMESTAMP_MS and 0 <= pop_time <= MAX_TIMESTAMP_MS and 0 <= queue_id <= INT32_MAX):
        raise RemotingCommandError(f"extraInfo {text[:120]!r}: a number is out of range")
    if fields[4] != NORMAL_TOPIC_FLAG:
        raise RemotingCommandError(
            f"extraInfo {text[:120]!r} names a POP retry topic, which ledgermq has not"
        )
    return ck, pop_time, fields[5], queue_id


def _check_group(group: str) -> None:
    """A consumer group a POP entry may name (the log's bound on names), else RemotingCommandError."""
    if not 0 < len(group) <= MAX_NAME_CHARS:
        raise RemotingCommandError(f"consumerGroup must be 1..{MAX_NAME_CHARS} characters, got {len(group)}")


def _batch_field(item: dict[str, Any], short: str, long: str) -> Any:
    """A BatchAck field by its JSON name or its alternate (RocketMQ's fastjson accepts both)."""
    return item.get(short, item.get(long))


def parse_batch_ack(doc: Any, broker_name: str) -> dict[tuple[str, str, int], list[tuple[int, int]]]:
    """RocketMQ's BatchAckMessageRequestBody (``brokerName``, ``acks``: BatchAck with consumer
    group, topic, retry flag, start offset, queue id, pop time and a base64 java.util.BitSet of
    the offsets acked, relative to the start) as handles per (group, topic, queue); a
    RemotingCommandError says what is wrong."""
    what = "BATCH_ACK_MESSAGE body"
    if not isinstance(doc, dict) or not isinstance(doc.get("acks"), list):
        raise RemotingCommandError(f"{what} must be an object with a list 'acks'")
    if doc.get("brokerName", broker_name) != broker_name:
        raise RemotingCommandError(
            f"{what} names broker {str(doc.get('brokerName'))[:80]!r}, not {broker_name!r}"
        )
    acks = doc["acks"]
    if len(acks) > MAX_BATCH_ACKS:
        raise RemotingCommandError(f"{what}: {len(acks)} acks, at most {MAX_BATCH_ACKS}")
    out: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
    for i, item in enumerate(acks):
        if not isinstance(item, dict):
            raise RemotingCommandError(f"{what}: acks[{i}] is not an object")
        group, topic = _batch_field(item, "c", "consumerGroup"), _batch_field(item, "t", "topic")
        start, qid = _batch_field(item, "so", "startOffset"), _batch_field(item, "q", "queueId")
        pop_time, bits = _batch_field(item, "pt", "popTime"), _batch_field(item, "b", "bitSet")
        if not (isinstance(group, str) and group and isinstance(topic, str) and topic):
            raise RemotingCommandError(f"{what}: acks[{i}] needs a consumer group (c) and a topic (t)")
        _check_group(group)
        if str(_batch_field(item, "r", "retry") or "0") != NORMAL_TOPIC_FLAG:
            raise RemotingCommandError(f"{what}: acks[{i}] names a POP retry topic, which ledgermq has not")
        for name, value, hi in (
            ("so", start, MAX_TIMESTAMP_MS),
            ("q", qid, INT32_MAX),
            ("pt", pop_time, MAX_TIMESTAMP_MS),
        ):
            if type(value) is not int or not 0 <= value <= hi:
                raise RemotingCommandError(f"{what}: acks[{i}].{name} must be an integer in 0..{hi}")
        try:
            raw = (
                base64.b64decode(bits or "", validate=True) if isinstance(bits, str) or bits is None else None
            )
        except (binascii.Error, ValueError):
            raw = None
        if raw is None or len(raw) * 8 > MAX_POP_OFFSETS:
            raise RemotingCommandError(
                f"{what}: acks[{i}].b must be a base64 bit set of at most {MAX_POP_OFFSETS} bits"
            )
        offsets = [start + 8 * k + j for k, byte in enumerate(raw) for j in range(8) if byte >> j & 1]
        handles = out.setdefault((group, topic, qid), [])
        handles.extend((o, pop_time) for o in offsets if o <= MAX_TIMESTAMP_MS)
    return out


class PopProcessors:
    """POP_MESSAGE, ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME."""

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.broker = ctx.broker
        self.store = ctx.store
        self.config = ctx.config
        self.suspended = 0  # POPs long-polling now (at most max_suspended_pulls)
        #: orderly POPs' pick-and-apply, one at a time per (group, topic), with how many hold or wait
        self._order_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._order_users: dict[tuple[str, str], int] = {}

    def handlers(self) -> dict[int, Any]:
        return {
            RequestCode.POP_MESSAGE: self.pop,
            RequestCode.ACK_MESSAGE: self.ack,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME: self.change_invisible_time,
            RequestCode.BATCH_ACK_MESSAGE: self.batch_ack,
        }

    # ------------------------------------------------------------------ helpers

    def _refusal(self, req: RemotingCommand, exc: EmbedError) -> RemotingCommand:
        if isinstance(exc, NotLeaderError):
            return self.ctx.not_master(req)
        if isinstance(exc, LedgerBusy):
            return req.make_response(ResponseCode.SYSTEM_BUSY, f"not applied: {exc}")
        return req.make_response(ResponseCode.SYSTEM_ERROR, f"outcome unknown: {exc}")

    async def _apply(self, req: RemotingCommand, entry: bytes) -> list[Any] | RemotingCommand:
        """Append one POP entry; its outcome once applied, or the refusal to answer with."""
        try:
            results = await self.store.append_async([entry])
        except EmbedError as exc:
            return self._refusal(req, exc)
        return self.store.state.pop_outcomes.get(results[-1].ledger_index, [])

    def _queue_check(self, req: RemotingCommand, topic: str, queue_id: int) -> RemotingCommand | None:
        tc = self.store.topics.get(topic)
        if tc is None:
            return req.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic {topic!r} does not exist on broker {self.config.broker_name}",
            )
        if not tc.perm & PERM_READ:
            return req.make_response(
                ResponseCode.NO_PERMISSION, f"topic {topic!r} is not readable (perm {tc.perm})"
            )
        if queue_id >= tc.read_queue_nums:
            return req.make_response(
                ResponseCode.INVALID_PARAMETER,
                f"queue id {queue_id} is outside 0..{tc.read_queue_nums - 1} of topic {topic!r}",
            )
        return None

    # ------------------------------------------------------------------ POP_MESSAGE

    async def pop(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """POP_MESSAGE (200050): up to ``maxMsgNums`` messages of one queue (``queueId`` >= 0) or
        of every readable queue of the topic, each invisible to the group for ``invisibleTime``
        ms unless acked; held up to ``pollTime`` ms (at most ``long_poll_max_ms``) when there
        is nothing, then POLLING_TIMEOUT."""
        group, topic = req.header_str("consumerGroup"), req.header_str("topic")
        queue_id = max(-1, req.header_int("queueId", -1, min_value=INT32_MIN, max_value=INT32_MAX))
        max_nums = req.header_int("maxMsgNums", min_value=1, max_value=MAX_POP_BATCH)
        invisible = req.header_int("invisibleTime", min_value=1, max_value=MAX_INVISIBLE_MS)
        poll_ms = min(
            req.header_int("pollTime", 0, min_value=0, max_value=MAX_TIMESTAMP_MS),
            self.config.long_poll_max_ms,
        )
        init_mode = req.header_int(
            "initMode", INIT_MODE_MIN, min_value=INIT_MODE_MIN, max_value=INIT_MODE_MAX
        )
        _check_group(group)
        order = req.header_bool("order", False)
        if order and len(self._order_locks) >= MAX_ORDER_LOCKS and (group, topic) not in self._order_locks:
            return req.make_response(
                ResponseCode.SYSTEM_BUSY, f"orderly POPs of {MAX_ORDER_LOCKS} (group, topic) are under way"
            )
        if not self.broker.is_master:
            return self.ctx.not_master(req)
        bad = self._queue_check(req, topic, queue_id)
        if bad is not None:
            return bad
        matcher = self._matcher(req)
        if isinstance(matcher, RemotingCommand):
            return matcher
        nums = self.store.topics[topic].read_queue_nums
        if queue_id >= 0:
            queues = [queue_id]
        else:
            first = random.randrange(max(nums, 1))
            queues = [(first + i) % nums for i in range(nums)]
        if not queues:
            return req.make_response(ResponseCode.POLLING_TIMEOUT, f"topic {topic!r} has no readable queue")
        deadline = time.monotonic() + poll_ms / 1000
        appends = 0
        while True:  # bounded: MAX_POP_ROUNDS appends, and waits until the deadline
            now_ms = int(time.time() * 1000)
            buried = await self._bury(req, group, topic, queues, now_ms)
            if buried is not None:
                return buried
            if order:
                # picks and their entry as one step per (group, topic): two orderly POPs must not
                # both see a queue free and both take its next message
                outcome, busy = await self._orderly_round(
                    req, group, topic, queues, init_mode, max_nums, invisible, matcher, appends
                )
                if outcome is not None:
                    appends += 1
                    if isinstance(outcome, RemotingCommand):
                        return outcome
                    if outcome:
                        return self._found(req, group, topic, queues, invisible, outcome)
                    continue
                picks: list[PopPick] = []
            else:
                picks, busy = self._picks(group, topic, queues, init_mode, max_nums, now_ms, matcher)
            if picks and appends < MAX_POP_ROUNDS:
                appends += 1
                entry = pop_op(group, topic, now_ms, invisible, self.config.max_pop_inflight, picks)
                outcome = await self._apply(req, entry)
                if isinstance(outcome, RemotingCommand):
                    return outcome
                if outcome:
                    return self._found(req, group, topic, queues, invisible, outcome)
                continue  # only moved past filtered-out messages, or lost a race: look again
            if busy:
                return req.make_response(ResponseCode.SYSTEM_BUSY, busy)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self.suspended >= self.config.max_suspended_pulls:
                return req.make_response(ResponseCode.POLLING_FULL, "long polls at max_suspended_pulls")
            await self._wait(group, topic, queues, remaining, now_ms)
            if not self.broker.is_master:
                return self.ctx.not_master(req)
        return req.make_response(
            ResponseCode.POLLING_TIMEOUT, "NO_MESSAGE_IN_QUEUE", self._rest(group, topic, queues)
        )

    async def _orderly_round(
        self,
        req: RemotingCommand,
        group: str,
        topic: str,
        queues: list[int],
        init_mode: int,
        max_nums: int,
        invisible: int,
        matcher: Any,
        appends: int,
    ) -> tuple[list[Any] | RemotingCommand | None, str]:
        """One orderly pick-and-apply under the (group, topic) lock: the outcome (None when
        there was nothing to take, or the round bound is spent) and why the consumer waits."""
        key = (group, topic)
        lock = self._order_locks.get(key)
        if lock is None:
            lock = self._order_locks[key] = asyncio.Lock()
        self._order_users[key] = self._order_users.get(key, 0) + 1
        try:
            async with lock:
                now_ms = int(time.time() * 1000)
                picks, busy = self._picks(
                    group, topic, queues, init_mode, max_nums, now_ms, matcher, order=True
                )
                if not picks or appends >= MAX_POP_ROUNDS:
                    return None, busy
                entry = pop_op(group, topic, now_ms, invisible, self.config.max_pop_inflight, picks)
                return await self._apply(req, entry), busy
        finally:
            self._order_users[key] -= 1
            if not self._order_users[key]:
                del self._order_users[key]
                del self._order_locks[key]

    def _matcher(self, req: RemotingCommand) -> frozenset[int] | SqlFilter | None | RemotingCommand:
        """The request's filter: tag hashes, a compiled SQL92 filter, None for all, or the refusal."""
        kind, exp = req.header_str("expType", "TAG").upper(), req.header_str("exp", "*")
        if kind == "TAG":
            return _tag_hashes(exp)
        if kind != "SQL92":
            return req.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"unknown expType {kind[:40]!r}")
        if not self.config.enable_property_filter:
            return req.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"broker {self.config.broker_name} does not filter by SQL92 (enable_property_filter is off)",
            )
        try:
            return compile_filter(exp)
        except SqlFilterError as exc:
            return req.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"SQL92 expression: {exc}")

    def _start(self, group: str, topic: str, queue_id: int, init_mode: int, lo: int, hi: int) -> int:
        """Where a group that never popped this queue starts: its committed consumer offset if it
        has one, else the queue's min (initMode 0) or max (initMode 1) offset."""
        committed = self.store.offsets.get((group, topic, queue_id))
        if committed is not None:
            return min(max(committed, lo), hi)
        return lo if init_mode == INIT_MODE_MIN else hi

    def _picks(
        self,
        group: str,
        topic: str,
        queues: list[int],
        init_mode: int,
        max_nums: int,
        now_ms: int,
        matcher: Any,
        *,
        order: bool = False,
    ) -> tuple[list[PopPick], str]:
        """What to propose: per queue the expired in-flight offsets, then new ones matching the
        filter (a queue the group never popped gets a pick anyway, so that where it starts is
        fixed in the log: initMode 1 must not move with the queue's end); and, when there is
        nothing to take, why the consumer waits in vain (told rather than left to poll)."""
        picks: list[PopPick] = []
        want = max_nums
        busy = ""
        limit = self.config.max_pop_inflight
        pops = self.store.state.pops
        for qid in queues:
            if want <= 0:
                break
            lo, hi = self.store.offsets_of(topic, qid)
            pq = pops.get(group, topic, qid)
            if pq is None and len(pops) >= pops.max_queues:
                busy = f"the broker group's POP state holds {pops.max_queues} (group, topic, queue): no new one starts"
                continue
            start = self._start(group, topic, qid, init_mode, lo, hi)
            cursor = pq.cursor if pq is not None else start
            offsets = []
            if pq is not None:
                # a first delivery and max_reconsume_times retries, as a push consumer's send-back
                # gives (past them, dead-lettered by _bury)
                last = self.config.max_reconsume_times + 1
                offsets = [o for o in pq.expired(now_ms, want) if o >= lo and pq.inflight[o].times < last]
            room = limit - (len(pq.inflight) if pq is not None else 0)
            if order:
                # orderly: one message of a queue in flight at a time; while it is invisible
                # nothing after it is delivered, once its invisible time is over it comes again
                if pq is not None and pq.inflight:
                    if any(e.deadline > now_ms for e in pq.inflight.values()):
                        continue
                    offsets = sorted(
                        o
                        for o in pq.expired(now_ms, len(pq.inflight))
                        if o >= lo and pq.inflight[o].times < last
                    )[:1]
                    room = 0
                else:
                    room = min(room, 1)
            new, cursor_to = self._new_offsets(
                topic, qid, max(cursor, lo), min(want - len(offsets), room), matcher
            )
            cursor_to = max(cursor_to, min(lo, hi)) if cursor < lo else cursor_to
            if room <= 0 and not offsets and cursor < hi:
                busy = (
                    f"group {group!r} holds max_pop_inflight={limit} messages of {topic!r} un-acked in a "
                    "queue with more to give: ack some, or wait for invisible times to pass"
                )
            gone = pq is not None and any(o < lo for o in pq.inflight)
            if offsets or new or cursor_to > cursor or gone or pq is None:
                picks.append(PopPick(qid, cursor, cursor_to, tuple(offsets + new), lo))
                want -= len(offsets) + len(new)
        return picks, "" if picks else busy

    def _new_offsets(
        self, topic: str, qid: int, offset: int, count: int, matcher: Any
    ) -> tuple[list[int], int]:
        """Up to ``count`` offsets from ``offset`` matching the filter; and the offset the scan
        stopped at (everything before it was taken or does not match)."""
        cq = self.store.queue(topic, qid)
        if cq is None or count <= 0 or offset >= cq.max_offset:
            return [], offset
        if matcher is None:
            hits = cq.slice(offset, count)
            return [h[0] for h in hits], hits[-1][0] + 1 if hits else offset
        if isinstance(matcher, frozenset):
            hits, scanned_to = cq.scan(offset, count, matcher, POP_SCAN_LIMIT)
            return [h[0] for h in hits], scanned_to
        out: list[int] = []
        end = min(cq.max_offset, offset + POP_SCAN_LIMIT)
        at = offset
        while at < end and len(out) < count:
            chunk = cq.slice(at, min(256, end - at))
            read = self.store.read_records(chunk, 1 << 62)
            for qoff, _, rec in read:
                at = qoff + 1
                try:
                    props = properties_from_bytes(bytes(stored_record_fields(rec)[4]))
                except (MessageFormatError, ValueError):
                    continue  # an undecodable record matches nothing
                if matcher.matches(props):
                    out.append(qoff)
                    if len(out) >= count:
                        break
            if len(read) < len(chunk):
                break  # removed by retention meanwhile
        return out, at

    async def _bury(
        self, req: RemotingCommand, group: str, topic: str, queues: list[int], now_ms: int
    ) -> RemotingCommand | None:
        """Store expired deliveries popped ``max_reconsume_times`` + 1 times as dead letters in
        ``%DLQ%<group>`` (RocketMQ 5's POP does so at revive), and drop them from the table;
        None, or the refusal to answer with. The dead letter's origin names the message, its
        pop count and the group, so a master that fails over between the two entries and a new
        one that buries it again store it once."""
        last = self.config.max_reconsume_times + 1
        for qid in queues:
            pq = self.store.state.pops.get(group, topic, qid)
            cq = self.store.queue(topic, qid)
            if pq is None or cq is None:
                continue
            due = [(o, e) for o, e in pq.inflight.items() if e.deadline <= now_ms and e.times >= last]
            pairs: list[tuple[bytes, bytes]] = []
            handles: list[tuple[int, int]] = []
            for offset, entry in due[:MAX_BURY_PER_POP]:
                i = offset - cq.base
                found = self.store.record_at(cq.positions[i]) if 0 <= i < len(cq.positions) else None
                if found is None:
                    continue  # removed by retention: the next POP's floor drops it
                position = cq.positions[i]
                try:
                    msg = derive.decode_held(found[1])
                except MessageFormatError:
                    continue
                place = derive.retry(
                    msg, group, -1, self.config.max_reconsume_times, "", now_ms, self.config.delay_levels_ms
                )
                self.ctx.ensure_topic(place.topic, 1, time.monotonic())
                # the reconsume count its last delivery carried, as a send-back's dead letter has
                reconsumed = msg.reconsume_times + entry.times - 1
                rec = derive.record(
                    msg,
                    place,
                    sys_flag=msg.sys_flag,
                    reconsume_times=min(reconsumed, INT32_MAX),
                    store_ms=now_ms,
                    store_host=self.ctx.store_host,
                )
                origin = (
                    codec.ORIGIN_SEND_BACK
                    + position.to_bytes(8, "big")
                    + min(reconsumed, INT32_MAX).to_bytes(4, "big")
                    + group.encode()
                )
                pairs.append((origin, rec))
                handles.append((offset, entry.pop_time))
            if pairs:
                # one entry per dead letter (a message may be as large as an entry allows)
                entries = [codec.encode_derived([pair]) for pair in pairs]
                entries.append(dead_op(group, topic, qid, now_ms, handles))
                try:
                    await self.store.append_async(entries)
                except EmbedError as exc:
                    return self._refusal(req, exc)
        return None

    async def _wait(self, group: str, topic: str, queues: list[int], remaining: float, now_ms: int) -> None:
        """Until a message arrives in one of the queues, an in-flight one's invisible time passes,
        or ``remaining`` seconds pass."""
        for qid in queues:
            pq = self.store.state.pops.get(group, topic, qid)
            due = pq.next_deadline() if pq is not None else None
            if due is not None:
                remaining = min(remaining, max(due - now_ms, 1) / 1000)
        self.suspended += 1
        waits = [asyncio.ensure_future(self.store.wait_for_message(topic, q, remaining)) for q in queues]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.suspended -= 1
            for w in waits:
                w.cancel()

    def _wake(self, topic: str, qid: int) -> None:
        """POPs long-polling the queue look again: an invisible time just shortened may now end
        before the deadline their wait was computed from (a 5.x consumer's retry backoff)."""
        for fut in self.store.waiters.pop((topic, qid), ()):
            if not fut.done():
                fut.set_result(None)

    def _rest(self, group: str, topic: str, queues: list[int]) -> dict[str, Any]:
        """restNum: messages past the group's cursors in the queues asked (RocketMQ's hint)."""
        rest = 0
        for qid in queues:
            lo, hi = self.store.offsets_of(topic, qid)
            pq: PopQueue | None = self.store.state.pops.get(group, topic, qid)
            rest += max(0, hi - max(pq.cursor if pq is not None else hi, lo))
        return {"restNum": rest, "popTime": int(time.time() * 1000), "invisibleTime": 0, "reviveQid": 0}

    def _found(
        self,
        req: RemotingCommand,
        group: str,
        topic: str,
        queues: list[int],
        invisible: int,
        granted: list[Granted],
    ) -> RemotingCommand:
        """The answer to a POP from what its entry granted: the messages (re-popped ones with their
        reconsume count raised) and the headers their handles are built from."""
        by_queue: dict[int, list[Granted]] = {}
        for g in granted:
            by_queue.setdefault(g.queue, []).append(g)
        found: list[tuple[int, int, bytes | memoryview]] = []
        start_info, msg_info = [], []
        for qid, items in by_queue.items():
            cq = self.store.queue(topic, qid)
            if cq is None:
                continue
            hits = []
            for g in items:
                i = g.offset - cq.base
                if 0 <= i < len(cq.positions):
                    hits.append((g.offset, cq.positions[i], cq.sizes[i]))
            read = self.store.read_records(hits, MAX_POP_BYTES)
            if not read:
                continue
            times = {g.offset: g.times for g in items}
            for qoff, position, rec in read:
                extra = times[qoff] - 1
                if extra:
                    patched = bytearray(rec)
                    at = _reconsume_at(patched)
                    _I32.pack_into(patched, at, min(_I32.unpack_from(patched, at)[0] + extra, INT32_MAX))
                    rec = patched
                found.append((qoff, position, rec))
            start_info.append(f"{NORMAL_TOPIC_FLAG} {qid} {min(q for q, _, _ in read)}")
            msg_info.append(f"{NORMAL_TOPIC_FLAG} {qid} " + ",".join(str(q) for q, _, _ in read))
        # (a granted message retention removed meanwhile is not served; it comes back when its
        # invisible time passes, and is then passed over as below the queue's min offset)
        headers = self._rest(group, topic, queues)
        headers.update(
            popTime=granted[0].pop_time,
            invisibleTime=invisible,
            startOffsetInfo=";".join(start_info),
            msgOffsetInfo=";".join(msg_info),
        )
        if not found:
            return req.make_response(ResponseCode.POLLING_TIMEOUT, "NO_MESSAGE_IN_QUEUE", headers)
        return req.make_response(headers=headers, body=serve_records(found), remark="FOUND")

    # ------------------------------------------------------------------ ACK and invisible time

    def _handle(self, req: RemotingCommand) -> tuple[str, str, int, int, int] | RemotingCommand:
        """(group, topic, queue id, offset, pop time) an ACK or CHANGE_MESSAGE_INVISIBLETIME
        names, or the refusal: RocketMQ answers NO_MESSAGE for an offset outside the queue."""
        group, topic = req.header_str("consumerGroup"), req.header_str("topic")
        queue_id = req.header_int("queueId", min_value=0, max_value=INT32_MAX)
        offset = req.header_int("offset", min_value=0, max_value=MAX_TIMESTAMP_MS)
        _ck, pop_time, broker_name, extra_qid = parse_extra_info(req.header_str("extraInfo"))
        _check_group(group)
        if broker_name != self.config.broker_name or extra_qid != queue_id:
            return req.make_response(
                ResponseCode.INVALID_PARAMETER,
                f"extraInfo names broker {broker_name!r} queue {extra_qid}, not {self.config.broker_name!r} "
                f"queue {queue_id}",
            )
        if not self.broker.is_master:
            return self.ctx.not_master(req)
        bad = self._queue_check(req, topic, queue_id)
        if bad is not None:
            return bad
        lo, hi = self.store.offsets_of(topic, queue_id)
        if not lo <= offset < hi:
            return req.make_response(
                ResponseCode.NO_MESSAGE, f"offset {offset} is outside [{lo}, {hi}) of {topic}:{queue_id}"
            )
        return group, topic, queue_id, offset, pop_time

    async def ack(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """ACK_MESSAGE (200051): the message is consumed; never delivered to the group again.
        A stale handle (the message popped again since, or its invisible time changed) or an
        expired one is refused with NO_MESSAGE, the remark says which; a repeated ack succeeds."""
        handle = self._handle(req)
        if isinstance(handle, RemotingCommand):
            return handle
        group, topic, qid, offset, pop_time = handle
        outcome = await self._apply(
            req, ack_op(group, topic, qid, int(time.time() * 1000), [(offset, pop_time)])
        )
        if isinstance(outcome, RemotingCommand):
            return outcome
        reason = outcome[0] if outcome else "not applied"
        if reason:
            return req.make_response(
                ResponseCode.NO_MESSAGE, f"handle {offset}@{pop_time} of {topic}:{qid}: {reason}"
            )
        self._wake(topic, qid)  # an orderly POP waits for this ack to take the queue's next message
        return req.make_response()

    async def change_invisible_time(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """CHANGE_MESSAGE_INVISIBLETIME (200053): keep the message invisible for ``invisibleTime``
        ms from now; answers the new handle's ``popTime``/``invisibleTime`` (the old one is stale)."""
        invisible = req.header_int("invisibleTime", min_value=1, max_value=MAX_INVISIBLE_MS)
        handle = self._handle(req)
        if isinstance(handle, RemotingCommand):
            return handle
        group, topic, qid, offset, pop_time = handle
        entry = invisible_op(group, topic, qid, int(time.time() * 1000), (offset, pop_time), invisible)
        outcome = await self._apply(req, entry)
        if isinstance(outcome, RemotingCommand):
            return outcome
        result = outcome[0] if outcome else "not applied"
        if not isinstance(result, Granted):
            return req.make_response(
                ResponseCode.NO_MESSAGE, f"handle {offset}@{pop_time} of {topic}:{qid}: {result}"
            )
        self._wake(topic, qid)
        return req.make_response(
            headers={"popTime": result.pop_time, "invisibleTime": invisible, "reviveQid": 0}
        )

    async def batch_ack(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """BATCH_ACK_MESSAGE (200151): many handles of one pop time each, as bit sets over a start
        offset (RocketMQ 5 clients batch their acks so). SUCCESS when every handle was taken,
        else NO_MESSAGE saying how many were not and why the first was not."""
        if len(req.body) > MAX_BATCH_ACK_BODY:
            raise RemotingCommandError(
                f"BATCH_ACK_MESSAGE body of {len(req.body)} bytes is over {MAX_BATCH_ACK_BODY}"
            )
        doc = loads_bounded(bytes(req.body) or b"{}", "BATCH_ACK_MESSAGE body")
        by_queue = parse_batch_ack(doc, self.config.broker_name)
        if not self.broker.is_master:
            return self.ctx.not_master(req)
        now_ms = int(time.time() * 1000)
        entries: list[bytes] = []
        refused: list[str] = []
        for (group, topic, qid), handles in by_queue.items():
            bad = self._queue_check(req, topic, qid)
            if bad is not None:
                refused += [bad.remark] * len(handles)
                continue
            for at in range(0, len(handles), MAX_POP_OFFSETS):
                entries.append(ack_op(group, topic, qid, now_ms, handles[at : at + MAX_POP_OFFSETS]))
        if entries:
            try:
                results = await self.store.append_async(entries)
            except EmbedError as exc:
                return self._refusal(req, exc)
            outcomes = self.store.state.pop_outcomes
            for stored in results:
                refused += [r for r in outcomes.get(stored.ledger_index, ["not applied"]) if r]
            for _group, topic, qid in by_queue:
                self._wake(topic, qid)
        if refused:
            return req.make_response(
                ResponseCode.NO_MESSAGE,
                f"{len(refused)} of the handles were not acked; the first: {refused[0]}",
            )
        return req.make_response()
