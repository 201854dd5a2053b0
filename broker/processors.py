"""Request processors of a broker: send, pull, offsets, topics, queries, status, heartbeats.

Sends, offset commits and topic updates are accepted only by the master; they return a
future that the ledger commit completes, so no task is created per send. Every refusal
carries a response code and a remark that says what was wrong and where.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ledger.raft import NotLeader
from ledger.wire import FAILED, LedgerError
from remoting.codes import RequestCode, ResponseCode
from remoting.exceptions import RemotingCommandError
from remoting.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    MessageFormatError,
    batch_to_records,
    decode_properties,
    encode_pull_body,
    encode_record,
    make_msg_id,
    parse_msg_id,
    split_position,
    tag_hash,
)
from remoting.protocol import RemotingCommand
from remoting.topic import PERM_READ, PERM_WRITE, topic_name_error

from .message_store import FLAG_HAS_KEYS, Stored
from .meta import offset_op, topic_op

if TYPE_CHECKING:
    from remoting.connection import RemotingConnection

    from .controller import BrokerController

Response = RemotingCommand | asyncio.Future[RemotingCommand] | None

FILTER_SCAN_LIMIT = 16_000  # consume-queue entries one filtered pull looks at (RocketMQ's default)


def subscription_tag_hashes(expr: str) -> frozenset[int] | None:
    """Tag hashes a subscription expression ("TagA || TagB") selects; None for all ("*" or empty).

    The broker filters on hashes only; a client that cares about hash collisions matches the
    tags themselves as well (the push consumer does).
    """
    tags = {t.strip() for t in expr.split("||")}
    tags.discard("")
    if not tags or "*" in tags:
        return None
    return frozenset(tag_hash(t) for t in tags)


class Processors:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self.store = broker.store
        self.config = broker.config
        self.consumers: dict[str, dict[str, float]] = {}  # group -> client id -> last heartbeat

    def register(self, server: Any, *, pulls: bool) -> None:
        table: dict[int, Callable[[RemotingConnection, RemotingCommand], Any]] = {
            RequestCode.SEND_MESSAGE: self.send,
            RequestCode.SEND_BATCH_MESSAGE: self.send_batch,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_offset,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.all_topics,
            RequestCode.GET_MAX_OFFSET: self.max_offset,
            RequestCode.GET_MIN_OFFSET: self.min_offset,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.runtime_info,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_by_id,
            RequestCode.QUERY_MESSAGE: self.query_by_key,
            RequestCode.HEART_BEAT: self.heartbeat,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
        }
        if pulls:
            table[RequestCode.PULL_MESSAGE] = self.pull
        for code, fn in table.items():
            server.register_processor(code, fn)

    # ------------------------------------------------------------------ helpers

    def _not_master(self, req: RemotingCommand) -> RemotingCommand:
        master = self.broker.master_address()
        remark = f"broker {self.config.broker_addr} is not the master of {self.config.broker_name}; " + (
            f"the master is {master}" if master else "no master is elected yet"
        )
        code = ResponseCode.NOT_MASTER if master or self.broker.node.core.leader else ResponseCode.SERVICE_NOT_AVAILABLE
        return req.make_response(code, remark, {"masterAddr": master} if master else None)

    def _check_topic(self, req: RemotingCommand, topic: str, queue_id: int, perm: int) -> RemotingCommand | None:
        problem = topic_name_error(topic)
        if problem:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, f"topic {topic!r}: {problem}")
        tc = self.store.topics.get(topic)
        if tc is None:
            return req.make_response(
                ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist on broker {self.config.broker_name}"
            )
        if not tc.perm & perm:
            return req.make_response(ResponseCode.NO_PERMISSION, f"topic {topic!r} does not allow this (perm {tc.perm})")
        nums = tc.write_queue_nums if perm == PERM_WRITE else tc.read_queue_nums
        if not 0 <= queue_id < max(nums, 1):
            return req.make_response(
                ResponseCode.MESSAGE_ILLEGAL, f"queue id {queue_id} is outside 0..{nums - 1} of topic {topic!r}"
            )
        return None

    def _append(
        self, req: RemotingCommand, payloads: list[bytes], reply: Callable[[list[Stored]], RemotingCommand]
    ) -> Response:
        fut: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()

        def done(results: list[Stored] | None, exc: Exception | None) -> None:
            if fut.done():
                return
            if exc is None:
                fut.set_result(reply(results or []))
                return
            code = exc.code if isinstance(exc, LedgerError) else FAILED
            if code == FAILED:
                fut.set_result(req.make_response(ResponseCode.SYSTEM_ERROR, f"not stored: {exc}"))
            else:
                fut.set_result(req.make_response(ResponseCode.REPLICATION_TIMEOUT, f"outcome unknown: {exc}"))

        try:
            self.store.append(payloads, done)
        except NotLeader:
            return self._not_master(req)
        return fut

    # ------------------------------------------------------------------ sends

    def _send_target(self, req: RemotingCommand) -> tuple[str, int] | RemotingCommand:
        """(topic, queue id) of a send this broker may take, or the refusal to answer with."""
        if not self.broker.is_master:
            return self._not_master(req)
        topic = req.header_str("topic")
        queue_id = req.header_int("queueId")
        return self._check_topic(req, topic, queue_id, PERM_WRITE) or (topic, queue_id)

    def send(self, conn: RemotingConnection, req: RemotingCommand) -> Response:
        target = self._send_target(req)
        if isinstance(target, RemotingCommand):
            return target
        topic, queue_id = target
        body = req.body
        if len(body) > self.config.max_message_bytes:
            return req.make_response(
                ResponseCode.MESSAGE_ILLEGAL,
                f"message body of {len(body)} bytes exceeds the limit of {self.config.max_message_bytes}",
            )
        props_text = req.header_str("properties", "")
        try:
            props = decode_properties(props_text.encode(), "header 'properties'")
        except MessageFormatError as exc:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, str(exc))
        pid = req.header_str("producerId", "")
        seq = req.header_int("seq", 0)
        flags = FLAG_HAS_KEYS if props.get(PROPERTY_KEYS) else 0
        record = encode_record(
            topic.encode(),
            queue_id,
            bytes(body),
            props_text.encode(),
            tag_hash(props.get(PROPERTY_TAGS)),
            req.header_int("bornTimestamp", 0),
            int(time.time() * 1000),
            pid.encode(),
            seq,
            flags,
        )
        name = self.config.broker_name

        def reply(results: list[Stored]) -> RemotingCommand:
            r = results[0]
            return req.make_response(
                headers={
                    "msgId": make_msg_id(name, r.position),
                    "queueId": queue_id,
                    "queueOffset": r.queue_offset,
                    "ledgerIndex": r.ledger_index,
                    "duplicate": r.duplicate,
                }
            )

        return self._append(req, [record], reply)

    def send_batch(self, conn: RemotingConnection, req: RemotingCommand) -> Response:
        target = self._send_target(req)
        if isinstance(target, RemotingCommand):
            return target
        topic, queue_id = target
        if len(req.body) > self.config.max_batch_bytes:
            return req.make_response(
                ResponseCode.MESSAGE_ILLEGAL,
                f"batch of {len(req.body)} bytes exceeds the limit of {self.config.max_batch_bytes}",
            )
        def tag_and_flags(props: bytes, i: int) -> tuple[int, int]:
            decoded = decode_properties(props, f"batch item {i} properties")
            return tag_hash(decoded.get(PROPERTY_TAGS)), FLAG_HAS_KEYS if decoded.get(PROPERTY_KEYS) else 0

        try:
            records = batch_to_records(
                req.body,
                topic.encode(),
                queue_id,
                req.header_str("producerId", "").encode(),
                int(time.time() * 1000),
                self.config.max_message_bytes,
                tag_and_flags,
            )
        except MessageFormatError as exc:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, str(exc))
        name = self.config.broker_name

        def reply(results: list[Stored]) -> RemotingCommand:
            doc = {
                "queueId": queue_id,
                "offsets": [r.queue_offset for r in results],
                "msgIds": [make_msg_id(name, r.position) for r in results],
                "duplicates": sum(1 for r in results if r.duplicate),
            }
            return req.make_response(body=json.dumps(doc, separators=(",", ":")).encode())

        # the whole batch is one ledger entry (or a few, if it is larger than an entry may be)
        return self._append(req, self.store.batch_entries(records), reply)

    # ------------------------------------------------------------------ pulls

    async def pull(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        topic = req.header_str("topic")
        queue_id = req.header_int("queueId")
        offset = req.header_int("queueOffset")
        max_nums = max(1, min(req.header_int("maxMsgNums", 32), 1024))
        suspend_ms = max(0, min(req.header_int("suspendTimeoutMillis", 0), self.config.long_poll_max_ms))
        bad = self._check_topic(req, topic, queue_id, PERM_READ)
        if bad is not None:
            return bad
        wanted = subscription_tag_hashes(req.header_str("subscription", ""))
        if not self.broker.is_master and (
            not self.config.slave_read_enable or req.header_bool("requireMaster", False)
        ):
            # requireMaster: the caller needs a linearizable answer, which only a master gives.
            return self._not_master(req)
        commit = req.header_int("commitOffset", -1)
        group = req.header_str("consumerGroup", "")
        if commit >= 0 and group and self.broker.is_master:
            try:
                self.store.append([offset_op(group, topic, queue_id, commit)], lambda r, e: None)
            except NotLeader:
                pass
        deadline = time.monotonic() + suspend_ms / 1000
        while True:
            if self.broker.is_master and self.config.pull_read_index:
                # Confirm leadership first: a deposed master must not claim the end of a queue.
                try:
                    await self.broker.node.read_index()
                except (NotLeader, LedgerError):
                    return self._not_master(req)
                self.store.dispatch()
            lo, hi = self.store.offsets_of(topic, queue_id)
            headers = {"minOffset": lo, "maxOffset": hi, "brokerName": self.config.broker_name}
            if offset < lo or offset > hi:
                headers["nextBeginOffset"] = lo if offset < lo else hi
                return req.make_response(
                    ResponseCode.PULL_OFFSET_MOVED, f"offset {offset} is outside [{lo}, {hi}]", headers
                )
            if offset < hi:
                cq = self.store.queue(topic, queue_id)
                assert cq is not None
                if wanted is None:
                    hits, scanned_to = cq.slice(offset, max_nums), hi
                else:
                    hits, scanned_to = cq.scan(offset, max_nums, wanted, FILTER_SCAN_LIMIT)
                if hits:
                    found = self.store.read_records(hits, 4 << 20)
                    if not found:
                        headers["nextBeginOffset"] = offset
                    elif wanted is not None and len(found) == len(hits):
                        headers["nextBeginOffset"] = scanned_to  # past the filtered-out tail too
                    else:
                        headers["nextBeginOffset"] = found[-1][0] + 1
                    return req.make_response(headers=headers, body=encode_pull_body(found))
                offset = scanned_to  # nothing here matches the subscription
                if offset < hi:
                    headers["nextBeginOffset"] = offset
                    return req.make_response(
                        ResponseCode.PULL_RETRY_IMMEDIATELY, "no message matches the subscription yet", headers
                    )
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                headers["nextBeginOffset"] = offset
                return req.make_response(ResponseCode.PULL_NOT_FOUND, "no new message", headers)
            await self.store.wait_for_message(topic, queue_id, remaining)

    # ------------------------------------------------------------------ offsets and topics

    def query_offset(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        key = (req.header_str("consumerGroup"), req.header_str("topic"), req.header_int("queueId"))
        off = self.store.offsets.get(key)
        if off is None:
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
                ResponseCode.MESSAGE_ILLEGAL, f"bad queue numbers ({read}/{write}, 1..1024) or perm ({perm}, 0..7)"
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

    # ------------------------------------------------------------------ queries and status

    def view_by_id(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        try:
            name, position = parse_msg_id(req.header_str("msgId"))
        except MessageFormatError as exc:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, str(exc))
        if name != self.config.broker_name:
            return req.make_response(ResponseCode.QUERY_NOT_FOUND, f"message id names broker {name!r}, not this one")
        found = self.store.record_at(position)
        if found is None:
            index, slot = split_position(position)
            return req.make_response(ResponseCode.QUERY_NOT_FOUND, f"no message at ledger index {index} slot {slot}")
        return req.make_response(body=encode_pull_body([(found[0], position, found[1])]))

    def query_by_key(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        topic, key = req.header_str("topic"), req.header_str("key")
        max_num = max(1, min(req.header_int("maxNum", 32), 64))
        out = []
        for position in self.store.positions_by_key(topic, key)[-max_num:]:
            found = self.store.record_at(position)
            if found is not None:
                out.append((found[0], position, found[1]))
        if not out:
            return req.make_response(ResponseCode.QUERY_NOT_FOUND, f"no message with key {key!r} in topic {topic!r}")
        return req.make_response(body=encode_pull_body(out))

    def runtime_info(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(body=json.dumps(self.broker.runtime_info()).encode())

    def heartbeat(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        try:
            doc = json.loads(bytes(req.body) or b"{}")
        except ValueError as exc:
            raise RemotingCommandError(f"HEART_BEAT body is not JSON: {exc}") from None
        client_id = str(doc.get("clientID") or conn.remote_addr)
        group = doc.get("consumerGroup")
        if group:
            self.consumers.setdefault(str(group), {})[client_id] = time.monotonic()
        return req.make_response()

    def consumer_list(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        group = req.header_str("consumerGroup")
        now = time.monotonic()
        seen = self.consumers.get(group, {})
        for cid in [c for c, t in seen.items() if now - t > 30]:
            del seen[cid]
        return req.make_response(body=json.dumps({"consumerIdList": sorted(seen)}).encode())
