"""Request processors of a broker: send, pull, offsets, topics, queries, status, heartbeats.

Sends, offset commits and topic updates are accepted only by the master; they return a
future that the ledger commit completes, so no task is created per send. Every refusal
carries a response code and a remark that says what was wrong and where.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ledger.embed import BarrierTimeout, NotLeaderError
from remoting.codes import RequestCode, ResponseCode
from remoting.exceptions import RemotingCommandError
from remoting.headers import uses_send_v2_names, v2_spelled_out
from remoting.message import (
    SYSFLAG_COMPRESSED,
    MessageFormatError,
    decode_message_batch,
    inflate_body,
    java_string_hash,
    parse_offset_msg_id,
    properties_from_bytes,
    properties_to_bytes,
    serve_records,
    stored_record_fields,
)
from remoting.protocol import RemotingCommand
from remoting.topic import PERM_READ, PERM_WRITE, topic_name_error

from . import codec, derive
from .admin_stats import AdminStats
from .consume_queue import ConsumeQueue
from .context import Broker
from .derive import might_be_held
from .heartbeats import SQL92, TAG, Heartbeats
from .held_processors import HeldMessageProcessors
from .message_store import Stored
from .meta import offset_op, topic_op
from .pop_processors import PopProcessors
from .requests import INT32_MAX, INT32_MIN, MAX_TIMESTAMP_MS, RequestContext, Response, host_bytes
from .sql_filter import Filter as SqlFilter
from .sql_filter import SqlFilterError, compile_filter
from .system_topics import NOT_SENDABLE, RETRY_PREFIX, dlq_topic

if TYPE_CHECKING:
    from remoting.connection import RemotingConnection


SQL_SCAN_CHUNK = 256  # records read at a time while evaluating a SQL92 subscription
FILTER_SCAN_LIMIT = 16_000  # consume-queue entries one filtered pull looks at (RocketMQ's default)
MAX_PULL_BYTES = 4 << 20  # message bytes one pull answers with (at least one message)
DEFAULT_TOPIC = "TBW102"  # RocketMQ's template topic: clients send to its brokers to auto-create topics
PERM_INHERIT = 1
log = logging.getLogger("broker.processors")


# PULL_MESSAGE sysFlag bits (RocketMQ's PullSysFlag)
PULL_COMMIT_OFFSET = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4


def subscription_tag_hashes(expr: str) -> frozenset[int] | None:
    """Tags codes (Java String.hashCode, as RocketMQ's consume queue keeps them) a subscription
    expression ("TagA || TagB") selects; None for all ("*" or empty).

    The broker filters on hashes only; a client that cares about hash collisions matches the
    tags themselves as well (RocketMQ's clients and our push consumer do).
    """
    tags = {t.strip() for t in expr.split("||")}
    tags.discard("")
    if not tags or "*" in tags:
        return None
    return frozenset(java_string_hash(t) & 0xFFFFFFFF for t in tags)


# what a stored record holds each send header in: a Java int or long
_SEND_INT_BOUNDS = (
    ("flag", INT32_MIN, INT32_MAX),
    ("sysFlag", 0, INT32_MAX),
    ("bornTimestamp", 0, MAX_TIMESTAMP_MS),
    ("reconsumeTimes", 0, INT32_MAX),
)


def _refuse_held_in_batch(items: list[tuple[int, Any, Any]]) -> None:
    """RocketMQ refuses delayed and transactional messages in a batch: they cannot share an
    entry's fate with the others (each is held on its own)."""
    for i, (_, _, props) in enumerate(items):
        if might_be_held(bytes(props)):
            fields = properties_from_bytes(bytes(props), f"batch message {i}: properties")
            if (
                derive.is_transactional(fields)
                or derive.schedule("t", 0, fields, 0, (1,), 1 << 62) is not None
            ):
                raise MessageFormatError(
                    f"batch message {i}: delayed or transactional messages cannot be sent in a batch"
                )


def _send_headers(req: RemotingCommand) -> RemotingCommand:
    """The request with SEND_MESSAGE_V2's one-letter header names spelled out; the layout is
    decided by ``remoting.headers.uses_send_v2_names``, as the ACL decides it."""
    if not uses_send_v2_names(req.code, req.headers):
        return req  # SEND_MESSAGE's full names
    return RemotingCommand(req.code, v2_spelled_out(req.headers))


class Processors:
    """Sends, pulls, offsets, topics and queries; heartbeats and admin statistics beside them."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store
        self.config = broker.config
        self.ctx = ctx = RequestContext(broker)
        self.clients = ctx.clients
        self.heartbeats = Heartbeats(ctx)
        self.held = HeldMessageProcessors(ctx)
        self.pops = PopProcessors(ctx)
        self._not_master, self._check_topic, self._append = ctx.not_master, ctx.check_topic, ctx.append
        self._msg_id, self._begin_creation, self._created = ctx.msg_id, ctx.begin_creation, ctx.created
        self.suspended_pulls = 0  # long polls being held (at most max_suspended_pulls)
        # one for both listeners (each registers its handlers; they share the rate samples)
        self.admin_stats = AdminStats(broker, self.clients, lambda: self.suspended_pulls)

    def register(self, server: Any, *, pulls: bool) -> None:
        table: dict[int, Callable[[RemotingConnection, RemotingCommand], Any]] = {
            RequestCode.SEND_MESSAGE: self.send,
            RequestCode.SEND_MESSAGE_V2: self.send,
            RequestCode.SEND_BATCH_MESSAGE: self.send_batch,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_offset,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.all_topics,
            RequestCode.GET_MAX_OFFSET: self.max_offset,
            RequestCode.GET_MIN_OFFSET: self.min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.earliest_store_time,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_by_id,
            RequestCode.QUERY_MESSAGE: self.query_by_key,
            RequestCode.HEART_BEAT: self.heartbeats.heartbeat,
            RequestCode.UNREGISTER_CLIENT: self.heartbeats.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.heartbeats.consumer_list,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.heartbeats.consumer_connections,
        }
        if pulls:
            table[RequestCode.PULL_MESSAGE] = self.pull
        table.update(self.held.handlers())  # send-backs, transactions, locks, delay offsets
        table.update(self.pops.handlers())  # RocketMQ 5's POP, ACK, CHANGE_MESSAGE_INVISIBLETIME
        table.update(self.admin_stats.handlers())  # topic/consume stats, runtime info with KVTable
        for code, fn in table.items():
            server.register_processor(code, fn)

    # ------------------------------------------------------------------ helpers

    # ------------------------------------------------------------------ sends

    def _send_target(
        self, req: RemotingCommand, h: RemotingCommand
    ) -> tuple[str, int, list[bytes]] | RemotingCommand:
        """(topic, queue id, metadata entries to append first) of a send this broker may take,
        or the refusal to answer with. A topic this broker does not know is created on its
        first send when ``auto_create_topic_enable`` is on (RocketMQ 4.x's default)."""
        if not self.broker.is_master:
            return self._not_master(req)
        topic = h.header_str("topic")
        if topic in NOT_SENDABLE:
            return req.make_response(
                ResponseCode.NO_PERMISSION, f"topic {topic!r} is the broker's own: clients cannot send to it"
            )
        queue_id = h.header_int("queueId", min_value=INT32_MIN, max_value=INT32_MAX)
        before: list[bytes] = []
        pending = 0
        if topic not in self.store.topics and self.config.auto_create_topic_enable:
            problem = topic_name_error(topic)
            if problem:
                return req.make_response(ResponseCode.MESSAGE_ILLEGAL, f"topic {topic!r}: {problem}")
            now = time.monotonic()
            pending, proposed_at = self.ctx.creating.get(topic, (0, 0.0))
            if not pending or now - proposed_at > self.config.send_timeout_s:
                # First send of a new topic (or the proposal of its config was lost): its config
                # goes into the same proposal, ahead of the message.
                if not pending:
                    # RocketMQ: the client's defaultTopicQueueNums, at most the template's (ours)
                    asked = h.header_int("defaultTopicQueueNums", self.config.default_queue_nums, min_value=1)
                    pending = max(1, min(asked, self.config.default_queue_nums))
                refusal = self._begin_creation(topic, pending, now)
                if refusal is not None:
                    return req.make_response(*refusal)
                before.append(topic_op(topic, pending, pending, PERM_READ | PERM_WRITE))
        if queue_id < 0:  # RocketMQ: the broker picks a queue
            tc = self.store.topics.get(topic)
            queue_id = random.randrange(tc.write_queue_nums if tc else max(pending, 1))
        bad = self._check_topic(req, topic, queue_id, PERM_WRITE, pending)
        return bad or (topic, queue_id, before)

    def send(self, conn: RemotingConnection, req: RemotingCommand) -> Response:
        """SEND_MESSAGE (10) and SEND_MESSAGE_V2 (310): one message, stored as RocketMQ stores it;
        with the ``batch`` header set (the C++ client's batches) a batch, as RocketMQ's broker does."""
        h = _send_headers(req)
        if str(h.headers.get("batch", "")).lower() in ("true", "1"):
            return self.send_batch(conn, req)
        body = req.body
        if len(body) > self.config.max_message_bytes:
            return req.make_response(
                ResponseCode.MESSAGE_ILLEGAL,
                f"message body of {len(body)} bytes exceeds the limit of {self.config.max_message_bytes}",
            )
        try:  # the cheap checks first: a refused send must cost less than a stored one
            flag, sys_flag = h.header_int("flag", 0), h.header_int("sysFlag", 0)
            born, reconsume = h.header_int("bornTimestamp", 0), h.header_int("reconsumeTimes", 0)
            if not (
                INT32_MIN <= flag <= INT32_MAX
                and 0 <= sys_flag <= INT32_MAX
                and 0 <= born <= MAX_TIMESTAMP_MS
                and 0 <= reconsume <= INT32_MAX
            ):  # one test on the path of every send; the refusal names the header
                for name, lo, hi in _SEND_INT_BOUNDS:
                    h.header_int(name, 0, min_value=lo, max_value=hi)
            if sys_flag & SYSFLAG_COMPRESSED:
                inflate_body(body, keep=False)
            props = h.header_str("properties", "").encode()
            if props and (props.count(b"\x01") != props.count(b"\x02") or not props.endswith(b"\x02")):
                properties_from_bytes(props, "header 'properties'")  # names what is wrong, or passes
        except (MessageFormatError, RemotingCommandError) as exc:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, str(exc))
        target = self._send_target(req, h)
        if isinstance(target, RemotingCommand):
            return target
        topic, queue_id, before = target
        now_ms = int(time.time() * 1000)
        stored_topic, stored_qid = topic, queue_id
        if topic.startswith(RETRY_PREFIX):  # a client's own retry copy: past its limit, a dead letter
            limit = h.header_int(
                "maxReconsumeTimes", self.config.max_reconsume_times, min_value=0, max_value=INT32_MAX
            )
            if reconsume >= limit:
                stored_topic, stored_qid = dlq_topic(topic[len(RETRY_PREFIX) :]), 0
                self.ctx.ensure_topic(stored_topic, 1, time.monotonic())
        # delayed or transactional: stored where it waits (derive.HELD_MARKERS, inline: every send)
        if b"DELAY\x01" in props or b"TRAN_MSG\x01" in props or b"TIMER_" in props:
            held = self._held_placement(req, h, topic, queue_id, props, now_ms)
            if isinstance(held, RemotingCommand):
                return held
            if held is not None:
                stored_topic, stored_qid, props = (
                    held.topic,
                    held.queue_id,
                    properties_to_bytes(held.properties),
                )
        topic_raw = stored_topic.encode()
        try:
            record = codec.build_stored_record(
                topic_raw,
                stored_qid,
                body,
                props,
                flag,
                sys_flag,
                born,
                host_bytes(conn.remote_addr),
                now_ms,
                self.ctx.store_host,
                reconsume,
            )
        except MessageFormatError as exc:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, str(exc))

        def reply(results: list[Stored]) -> RemotingCommand:
            self._created(topic)
            r = results[-1]
            return req.make_response(
                headers={
                    "msgId": self._msg_id(r),
                    "queueId": queue_id,
                    "queueOffset": r.queue_offset,
                    "ledgerIndex": r.ledger_index,
                    # only when true: absent reads as false, and every answer costs both ends
                    "duplicate": True if r.duplicate else None,
                }
            )

        return self._append(req, [*before, record], reply, (topic_raw, stored_qid))

    def _held_placement(
        self, req: RemotingCommand, h: RemotingCommand, topic: str, queue_id: int, props: bytes, now_ms: int
    ) -> derive.Placement | RemotingCommand | None:
        """Where a message that may have to wait is stored (None: at once, in its topic), or
        the refusal: a malformed delay, or a full schedule or half-message table."""
        try:
            fields = properties_from_bytes(props, "header 'properties'")
            if derive.is_transactional(fields):
                if len(self.store.state.halves) >= self.config.max_half_messages:
                    return req.make_response(
                        ResponseCode.SYSTEM_BUSY,
                        f"{self.config.max_half_messages} half messages pending (max_half_messages); try later",
                    )
                return derive.half(topic, queue_id, fields, h.header_str("producerGroup", ""))
            held = derive.schedule(
                topic,
                queue_id,
                fields,
                now_ms,
                self.config.delay_levels_ms,
                int(self.config.max_timer_delay_s * 1000),
            )
        except (MessageFormatError, derive.PlacementError) as exc:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, str(exc))
        if held is not None and len(self.store.state.schedule) >= self.config.max_scheduled_messages:
            return req.make_response(
                ResponseCode.SYSTEM_BUSY,
                f"{self.config.max_scheduled_messages} delayed messages pending (max_scheduled_messages); try later",
            )
        return held

    def send_batch(self, conn: RemotingConnection, req: RemotingCommand) -> Response:
        """SEND_BATCH_MESSAGE (320): RocketMQ's encoded messages; the batch is one ledger entry
        (or a few, if it is larger than an entry may be)."""
        h = _send_headers(req)
        body = req.body
        if len(body) > self.config.max_batch_bytes:
            return req.make_response(
                ResponseCode.MESSAGE_ILLEGAL,
                f"batch of {len(body)} bytes exceeds the limit of {self.config.max_batch_bytes}",
            )
        now = int(time.time() * 1000)
        try:  # the cheap checks first: a refused send must cost less than a stored one
            born = h.header_int("bornTimestamp", now, min_value=0, max_value=MAX_TIMESTAMP_MS)
            sys_flag = h.header_int("sysFlag", 0, min_value=0, max_value=INT32_MAX)
            items = decode_message_batch(body, self.config.max_message_bytes)
            if might_be_held(b"".join([props for _, _, props in items])):  # exact per message below
                _refuse_held_in_batch(items)
            if sys_flag & SYSFLAG_COMPRESSED:
                for i, (_, mbody, _) in enumerate(items):
                    try:
                        inflate_body(mbody, keep=False)
                    except MessageFormatError as exc:
                        raise MessageFormatError(f"batch message {i}: {exc}") from None
        except MessageFormatError as exc:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, str(exc))
        except (UnicodeDecodeError, RemotingCommandError) as exc:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, f"batch: {exc}")
        target = self._send_target(req, h)
        if isinstance(target, RemotingCommand):
            return target
        topic, queue_id, before = target
        topic_raw = topic.encode()
        born_host = host_bytes(conn.remote_addr)
        build = codec.build_stored_record
        host = self.ctx.store_host
        records = [
            build(topic_raw, queue_id, mbody, props, flag, sys_flag, born, born_host, now, host)
            for flag, mbody, props in items
        ]
        skip = len(before)

        def reply(results: list[Stored]) -> RemotingCommand:
            self._created(topic)
            results = results[skip:]
            headers = {
                "msgId": ",".join([self._msg_id(r) for r in results]),
                "queueId": queue_id,
                "queueOffset": results[0].queue_offset if results else -1,
            }
            offsets = [r.queue_offset for r in results]
            if offsets and offsets[0] >= 0 and offsets[-1] - offsets[0] == len(offsets) - 1:
                if not any(r.duplicate for r in results):
                    # consecutive offsets: RocketMQ's answer (the first offset and the ids) says all
                    return req.make_response(headers=headers)
            # de-duplication (or a record that could not be stored) left gaps: every offset
            doc = {
                "queueId": queue_id,
                "offsets": offsets,
                "duplicates": sum(1 for r in results if r.duplicate),
            }
            return req.make_response(headers=headers, body=json.dumps(doc, separators=(",", ":")).encode())

        return self._append(req, [*before, *self.store.batch_entries(records)], reply, (topic_raw, queue_id))

    # ------------------------------------------------------------------ pulls

    async def pull(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """PULL_MESSAGE with RocketMQ's sysFlag: commit the offset only with the commit bit (and
        never backwards), hold the pull only with the suspend bit, filter by the request's
        subscription only with the subscription bit (else by the group's heartbeat)."""
        topic = req.header_str("topic")
        queue_id = req.header_int("queueId")
        offset = req.header_int("queueOffset")
        max_nums = max(1, min(req.header_int("maxMsgNums", 32), 1024))
        suspend_ms = req.header_int("suspendTimeoutMillis", 0)
        sys_flag = req.header_int("sysFlag", -1)
        group = req.header_str("consumerGroup", "")
        if sys_flag < 0:  # ledgermq clients before sysFlag: each part counts when present
            sys_flag = (PULL_COMMIT_OFFSET if "commitOffset" in req.headers else 0) | (
                PULL_SUSPEND if suspend_ms > 0 else 0
            )
            sys_flag |= PULL_SUBSCRIPTION if "subscription" in req.headers else 0
        if not sys_flag & PULL_SUSPEND:
            suspend_ms = 0
        suspend_ms = max(0, min(suspend_ms, self.config.long_poll_max_ms))
        bad = self._check_topic(req, topic, queue_id, PERM_READ)
        if bad is not None:
            return bad
        if sys_flag & PULL_SUBSCRIPTION:
            expr, kind = req.header_str("subscription", "*"), req.header_str("expressionType", TAG).upper()
        else:
            expr, kind = self.heartbeats.group_subscription(group, topic)
        sql: SqlFilter | None = None
        wanted: frozenset[int] | None = None
        if kind == SQL92:
            refused = self._sql_refusal(req, expr)
            if isinstance(refused, RemotingCommand):
                return refused
            sql = refused
        else:
            wanted = subscription_tag_hashes(expr)
        if not self.broker.is_master and (
            not self.config.slave_read_enable or req.header_bool("requireMaster", False)
        ):
            # requireMaster: the caller needs a linearizable answer, which only a master gives.
            return self._not_master(req)
        if sys_flag & PULL_COMMIT_OFFSET and group and self.broker.is_master:
            commit = req.header_int("commitOffset", -1)
            if commit >= 0:
                try:
                    self.store.append(
                        [offset_op(group, topic, queue_id, commit, forward=True)], lambda r, e: None
                    )
                except NotLeaderError:
                    pass
        deadline = time.monotonic() + suspend_ms / 1000
        while True:
            if self.broker.is_master and self.config.pull_read_index:
                # Confirm leadership first: a deposed master must not claim the end of a queue.
                try:
                    index = await self.broker.read_barrier()
                except (NotLeaderError, BarrierTimeout):
                    return self._not_master(req)
                await self.store.applied_through(index)
            lo, hi = self.store.offsets_of(topic, queue_id)
            headers: dict[str, Any] = {
                "suggestWhichBrokerId": 0,
                "minOffset": lo,
                "maxOffset": hi,
                "brokerName": self.config.broker_name,
            }
            if offset < lo or offset > hi:
                headers["nextBeginOffset"] = lo if offset < lo else hi
                return req.make_response(
                    ResponseCode.PULL_OFFSET_MOVED, f"offset {offset} is outside [{lo}, {hi}]", headers
                )
            if offset < hi:
                cq = self.store.queue(topic, queue_id)
                assert cq is not None
                if sql is not None:
                    hits, scanned_to = self._sql_scan(cq, offset, max_nums, sql)
                elif wanted is None:
                    hits, scanned_to = cq.slice(offset, max_nums), hi
                else:
                    hits, scanned_to = cq.scan(offset, max_nums, wanted, FILTER_SCAN_LIMIT)
                if hits:
                    found = self.store.read_records(hits, MAX_PULL_BYTES)
                    if not found:
                        headers["nextBeginOffset"] = offset
                    elif (wanted is not None or sql is not None) and len(found) == len(hits):
                        headers["nextBeginOffset"] = scanned_to  # past the filtered-out tail too
                    else:
                        headers["nextBeginOffset"] = found[-1][0] + 1
                    return req.make_response(headers=headers, body=serve_records(found))
                offset = scanned_to  # nothing here matches the subscription
                if offset < hi:
                    headers["nextBeginOffset"] = offset
                    return req.make_response(
                        ResponseCode.PULL_RETRY_IMMEDIATELY,
                        "no message matches the subscription yet",
                        headers,
                    )
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                headers["nextBeginOffset"] = offset
                return req.make_response(ResponseCode.PULL_NOT_FOUND, "no new message", headers)
            if self.suspended_pulls >= self.config.max_suspended_pulls:
                headers["nextBeginOffset"] = offset  # answered at once: holding it would pass the cap
                return req.make_response(
                    ResponseCode.PULL_NOT_FOUND, "no new message (long polls at max_suspended_pulls)", headers
                )
            self.suspended_pulls += 1
            try:
                await self.store.wait_for_message(topic, queue_id, remaining)
            finally:
                self.suspended_pulls -= 1

    def _sql_refusal(self, req: RemotingCommand, expr: str) -> SqlFilter | RemotingCommand:
        """The compiled SQL92 subscription, or the refusal: filtering off, or a malformed one."""
        if not self.config.enable_property_filter:
            return req.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"broker {self.config.broker_name} does not filter by SQL92 (enable_property_filter is off)",
            )
        try:
            return compile_filter(expr)
        except SqlFilterError as exc:
            return req.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"SQL92 subscription: {exc}")

    def _sql_scan(
        self, cq: ConsumeQueue, offset: int, max_nums: int, sql: SqlFilter
    ) -> tuple[list[tuple[int, int, int]], int]:
        """Like ``ConsumeQueue.scan`` for a SQL92 subscription: each message's properties are
        read from its record (the consume queue keeps only tag hashes), FILTER_SCAN_LIMIT at most."""
        out: list[tuple[int, int, int]] = []
        end = min(cq.max_offset, offset + FILTER_SCAN_LIMIT)
        at = max(offset, cq.min_offset)
        while at < end:
            chunk = cq.slice(at, min(SQL_SCAN_CHUNK, end - at))
            read = self.store.read_records(chunk, 1 << 62)
            for hit, (_, _, rec) in zip(chunk, read, strict=False):
                at = hit[0] + 1
                try:
                    props = properties_from_bytes(bytes(stored_record_fields(rec)[4]))
                except (MessageFormatError, ValueError):
                    continue  # (an undecodable record matches nothing)
                if sql.matches(props):
                    out.append(hit)
                    if len(out) >= max_nums:
                        return out, at
            if len(read) < len(chunk):
                break  # removed by retention meanwhile
        return out, at

    # ------------------------------------------------------------------ offsets and topics

    def query_offset(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """The group's offset; for a group without one, 0 while the queue still holds its first
        message (RocketMQ 4.x: a new group starts at the beginning of a young queue)."""
        key = (req.header_str("consumerGroup"), req.header_str("topic"), req.header_int("queueId"))
        off = self.store.offsets.get(key)
        if off is None:
            lo, _hi = self.store.offsets_of(key[1], key[2])
            if lo == 0:
                return req.make_response(headers={"offset": 0})
            return req.make_response(ResponseCode.QUERY_NOT_FOUND, f"no offset committed for {key}")
        return req.make_response(headers={"offset": off})

    def update_offset(self, conn: RemotingConnection, req: RemotingCommand) -> Response:
        if not self.broker.is_master:
            return self._not_master(req)
        group = req.header_str("consumerGroup")
        topic = req.header_str("topic")
        queue_id = req.header_int("queueId")
        offset = req.header_int("commitOffset")
        if not group or offset < 0:
            raise RemotingCommandError("UPDATE_CONSUMER_OFFSET needs a consumerGroup and a commitOffset >= 0")
        return self._append(req, [offset_op(group, topic, queue_id, offset)], lambda r: req.make_response())

    def update_topic(self, conn: RemotingConnection, req: RemotingCommand) -> Response:
        if not self.broker.is_master:
            return self._not_master(req)
        topic = req.header_str("topic")
        problem = topic_name_error(topic)
        if problem:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, f"topic {topic!r}: {problem}")
        read = req.header_int("readQueueNums", self.config.default_queue_nums)
        write = req.header_int("writeQueueNums", self.config.default_queue_nums)
        perm = req.header_int("perm", PERM_READ | PERM_WRITE)
        if not (1 <= read <= 1024 and 1 <= write <= 1024 and 0 <= perm <= 7):
            return req.make_response(
                ResponseCode.MESSAGE_ILLEGAL,
                f"bad queue numbers ({read}/{write}, 1..1024) or perm ({perm}, 0..7)",
            )
        return self._append(req, [topic_op(topic, read, write, perm)], lambda r: req.make_response())

    def all_topics(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(body=json.dumps(self.store.topic_config_wrapper().to_json()).encode())

    def max_offset(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(
            headers={"offset": self.store.offsets_of(req.header_str("topic"), req.header_int("queueId"))[1]}
        )

    def min_offset(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(
            headers={"offset": self.store.offsets_of(req.header_str("topic"), req.header_int("queueId"))[0]}
        )

    def search_offset_by_timestamp(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """The first queue offset whose message was stored at or after ``timestamp`` (ms); the
        max offset if none was."""
        offset = self.store.offset_by_time(
            req.header_str("topic"), req.header_int("queueId"), req.header_int("timestamp")
        )
        return req.make_response(headers={"offset": offset})

    def earliest_store_time(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        topic, queue_id = req.header_str("topic"), req.header_int("queueId")
        stamp = self.store.store_time_at(topic, queue_id, self.store.offsets_of(topic, queue_id)[0])
        if stamp is None:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"queue {topic}:{queue_id} holds no message")
        return req.make_response(headers={"timestamp": stamp})

    # ------------------------------------------------------------------ queries and status

    @staticmethod
    def _viewed_position(req: RemotingCommand) -> int:
        """The physical offset VIEW_MESSAGE_BY_ID names: header ``offset`` (as RocketMQ's admin
        sends it after decoding the message id), or a whole ``msgId``."""
        if "offset" in req.headers:
            return req.header_int("offset", min_value=0)
        try:
            return parse_offset_msg_id(req.header_str("msgId"))[1]
        except MessageFormatError as exc:
            raise RemotingCommandError(str(exc)) from None

    def viewed_topic(self, req: RemotingCommand) -> str | None:
        """The topic of the message a VIEW_MESSAGE_BY_ID asks for (what ACL checks), None if
        there is no such message or the request is malformed (the processor then says so)."""
        try:
            found = self.store.record_at(self._viewed_position(req))
            return None if found is None else codec.record_queue(found[1])[0]
        except (RemotingCommandError, codec.CodecError, UnicodeDecodeError):
            return None

    def view_by_id(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """VIEW_MESSAGE_BY_ID (33): the message at a physical offset or message id."""
        try:
            position = self._viewed_position(req)
        except RemotingCommandError as exc:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, str(exc))
        found = self.store.record_at(position)
        if found is None:
            index, slot = codec.split_position(position)
            return req.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"no message at physical offset {position} (ledger index {index} slot {slot})",
            )
        return req.make_response(body=serve_records([(found[0], position, found[1])]))

    def query_by_key(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        topic, key = req.header_str("topic"), req.header_str("key")
        max_num = max(1, min(req.header_int("maxNum", 32), 64))
        out = []
        for position in self.store.positions_by_key(topic, key)[-max_num:]:
            found = self.store.record_at(position)
            if found is not None:
                out.append((found[0], position, found[1]))
        if not out:
            return req.make_response(
                ResponseCode.QUERY_NOT_FOUND, f"no message with key {key!r} in topic {topic!r}"
            )
        headers = {
            "indexLastUpdateTimestamp": int(time.time() * 1000),
            "indexLastUpdatePhyoffset": out[-1][1],
        }
        return req.make_response(headers=headers, body=serve_records(out))
