"""Requests about messages a broker group holds for later, with RocketMQ 4.x's codes and
headers: a consumer sending a message back for a retry (CONSUMER_SEND_MSG_BACK), a producer
ending a transaction (END_TRANSACTION), orderly consumers locking queues (LOCK_BATCH_MQ,
UNLOCK_BATCH_MQ), the delay schedule's progress (GET_ALL_DELAY_OFFSET) and a consumer's
subscription check (CHECK_CLIENT_CONFIG). The RocketMQ 5 POP codes ``broker.pop_processors``
does not serve (PEEK_MESSAGE, NOTIFICATION, POLLING_INFO) are refused by name.

Each change goes through the ledger as an entry whose application is idempotent (see
``broker.schedule``), and each answer is given once that entry is applied, so what a
client is told survives a failover.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from remoting.codes import POP_REQUEST_NAMES, RequestCode, ResponseCode, request_code_name
from remoting.exceptions import RemotingCommandError
from remoting.jsonbody import loads_bounded
from remoting.message import PROPERTY_REAL_TOPIC, MessageFormatError
from remoting.protocol import RemotingCommand

from . import codec, derive
from .meta import MAX_LOCK_QUEUES, lock_op, txn_end_op, unlock_op
from .requests import INT32_MAX, RequestContext, Response
from .sql_filter import SqlFilterError, compile_filter
from .system_topics import DLQ_PREFIX, RETRY_PREFIX

if TYPE_CHECKING:
    from remoting.connection import RemotingConnection

TRANSACTION_NOT_TYPE = 0
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
_MAX_BODY = 1 << 20  # a lock or client-check request's JSON body


class HeldMessageProcessors:
    """Send-backs, transaction ends, queue locks, delay offsets, subscription checks."""

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.broker = ctx.broker
        self.store = ctx.store
        self.config = ctx.config

    def handlers(self) -> dict[int, Any]:
        table: dict[int, Any] = {
            RequestCode.CONSUMER_SEND_MSG_BACK: self.send_back,
            RequestCode.END_TRANSACTION: self.end_transaction,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch,
            RequestCode.GET_ALL_DELAY_OFFSET: self.delay_offsets,
            RequestCode.CHECK_CLIENT_CONFIG: self.check_client_config,
        }
        table.update({code: self.pop_refused for code in POP_REQUEST_NAMES})
        return table

    def topic_resolvers(self) -> dict[int, Any]:
        """For the ACL: the topic a request acts on, read from the message it names."""
        return {
            RequestCode.CONSUMER_SEND_MSG_BACK: self._sent_back_topic,
            RequestCode.END_TRANSACTION: self._transaction_topic,
        }

    def _named_message(self, req: RemotingCommand, header: str) -> Any:
        try:
            found = self.store.record_at(req.header_int(header, min_value=0))
            return None if found is None else derive.decode_held(found[1])
        except (RemotingCommandError, MessageFormatError):
            return None

    def _sent_back_topic(self, req: RemotingCommand) -> str | None:
        msg = self._named_message(req, "offset")  # SUB on the message's own topic is needed
        return None if msg is None else msg.topic

    def _transaction_topic(self, req: RemotingCommand) -> str | None:
        msg = self._named_message(req, "commitLogOffset")  # PUB on the half message's real topic
        return None if msg is None else msg.properties.get(PROPERTY_REAL_TOPIC) or msg.topic

    # ------------------------------------------------------------------ retries

    def send_back(self, conn: RemotingConnection, req: RemotingCommand) -> Response:
        """CONSUMER_SEND_MSG_BACK (36): a consumer failed the message at ``offset``; store it for
        ``%RETRY%<group>`` after its delay, or in ``%DLQ%<group>`` past the group's retries. A
        send-back repeated (its answer lost) is stored once: its origin names the message, the
        group and how often it was consumed."""
        if not self.broker.is_master:
            return self.ctx.not_master(req)
        group = req.header_str("group")
        position = req.header_int("offset", min_value=0)
        level = req.header_int("delayLevel", 0, min_value=-1, max_value=INT32_MAX)
        max_times = req.header_int(
            "maxReconsumeTimes", self.config.max_reconsume_times, min_value=0, max_value=INT32_MAX
        )
        if not group or group.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            raise RemotingCommandError(f"CONSUMER_SEND_MSG_BACK: bad group {group[:80]!r}")
        found = self.store.record_at(position)
        if found is None:
            return req.make_response(
                ResponseCode.SYSTEM_ERROR, f"no message at offset {position} to send back"
            )
        try:
            msg = derive.decode_held(found[1])
        except MessageFormatError as exc:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"message at offset {position}: {exc}")
        now_ms = int(time.time() * 1000)
        place = derive.retry(
            msg,
            group,
            level,
            max_times,
            req.header_str("originMsgId", ""),
            now_ms,
            self.config.delay_levels_ms,
        )
        # the retry topic (where the retry goes when due) or the dead-letter topic, readable and
        # writable (RocketMQ makes dead letters write-only; ours can be drained by a consumer)
        self.ctx.ensure_topic(place.properties.get(PROPERTY_REAL_TOPIC, place.topic), 1, time.monotonic())
        rec = derive.record(
            msg,
            place,
            sys_flag=msg.sys_flag,
            reconsume_times=msg.reconsume_times + 1,
            store_ms=now_ms,
            store_host=self.ctx.store_host,
        )
        origin = (
            codec.ORIGIN_SEND_BACK
            + position.to_bytes(8, "big")
            + msg.reconsume_times.to_bytes(4, "big")
            + group.encode()
        )
        return self.ctx.append(req, [codec.encode_derived([(origin, rec)])], lambda r: req.make_response())

    # ------------------------------------------------------------------ transactions

    def end_transaction(self, conn: RemotingConnection, req: RemotingCommand) -> Response:
        """END_TRANSACTION (37): commit stores the half message in its real queue (once, however
        often it is committed); rollback drops it; "unknown" leaves it to the checks."""
        if not self.broker.is_master:
            return self.ctx.not_master(req)
        kind = req.header_int("commitOrRollback", min_value=0, max_value=INT32_MAX)
        position = req.header_int("commitLogOffset", min_value=0)
        if kind == TRANSACTION_NOT_TYPE:
            return req.make_response()  # the producer does not know yet: the checks will ask again
        if kind not in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE):
            raise RemotingCommandError(f"END_TRANSACTION: commitOrRollback {kind} is not 0, 8 or 12")
        half = self.store.state.halves.pending.get(position)
        if half is None:
            return req.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"no pending half message at commit log offset {position} (ended already, or never prepared)",
            )
        group = req.header_str("producerGroup", "")
        if half.producer_group and group and group != half.producer_group:
            return req.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"half message at {position} belongs to producer group {half.producer_group!r}, not {group!r}",
            )
        if kind == TRANSACTION_ROLLBACK_TYPE:
            return self.ctx.append(req, [txn_end_op(position, "rollback")], lambda r: req.make_response())
        found = self.store.record_at(position)
        if found is None:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"half message at {position} is unreadable")
        now_ms = int(time.time() * 1000)
        try:
            msg = derive.decode_held(found[1])
            place = derive.release(
                msg, now_ms, self.config.delay_levels_ms, int(self.config.max_timer_delay_s * 1000)
            )
        except MessageFormatError as exc:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"half message at {position}: {exc}")
        rec = derive.record(
            msg,
            place,
            sys_flag=derive.committed_sys_flag(msg.sys_flag),
            reconsume_times=msg.reconsume_times,
            store_ms=now_ms,
            store_host=self.ctx.store_host,
        )
        origin = codec.ORIGIN_HALF + position.to_bytes(8, "big")
        return self.ctx.append(req, [codec.encode_derived([(origin, rec)])], lambda r: req.make_response())

    # ------------------------------------------------------------------ orderly consumers' locks

    def _lock_request(self, req: RemotingCommand) -> tuple[str, str, list[tuple[str, int]]]:
        """(group, client id, [(topic, queue id)] of this broker group) of a lock request body."""
        what = f"{'LOCK' if req.code == RequestCode.LOCK_BATCH_MQ else 'UNLOCK'}_BATCH_MQ body"
        if len(req.body) > _MAX_BODY:
            raise RemotingCommandError(f"{what} of {len(req.body)} bytes is over {_MAX_BODY}")
        doc = loads_bounded(bytes(req.body) or b"{}", what)
        if not isinstance(doc, dict):
            raise RemotingCommandError(f"{what} must be a JSON object")
        group, client, mqs = doc.get("consumerGroup"), doc.get("clientId"), doc.get("mqSet") or []
        if not isinstance(group, str) or not group or not isinstance(client, str) or not client:
            raise RemotingCommandError(f"{what} needs consumerGroup and clientId")
        if not isinstance(mqs, list) or len(mqs) > MAX_LOCK_QUEUES:
            raise RemotingCommandError(f"{what}: mqSet must be a list of at most {MAX_LOCK_QUEUES} queues")
        queues = []
        for mq in mqs:
            if not isinstance(mq, dict) or mq.get("brokerName") != self.config.broker_name:
                continue  # another broker group's queue: that group locks it
            topic, qid = mq.get("topic"), mq.get("queueId")
            if isinstance(topic, str) and topic and type(qid) is int and 0 <= qid <= INT32_MAX:
                queues.append((topic, qid))
        return group, client, queues

    def lock_batch(self, conn: RemotingConnection, req: RemotingCommand) -> Response:
        """LOCK_BATCH_MQ (41): lock the queues for the client (or renew its locks) for
        ``lock_max_live_s``; answers the queues it holds (RocketMQ's lockOKMQSet)."""
        if not self.broker.is_master:
            return self.ctx.not_master(req)
        group, client, queues = self._lock_request(req)
        now_ms = int(time.time() * 1000)
        entry = lock_op(group, client, queues, now_ms, now_ms + int(self.config.lock_max_live_s * 1000))
        name = self.config.broker_name

        def reply(results: list[Any]) -> RemotingCommand:
            granted = self.store.state.lock_outcomes.get(results[-1].ledger_index, frozenset())
            mqs = [{"topic": t, "brokerName": name, "queueId": q} for t, q in sorted(granted)]
            return req.make_response(body=json.dumps({"lockOKMQSet": mqs}).encode())

        return self.ctx.append(req, [entry], reply)

    def unlock_batch(self, conn: RemotingConnection, req: RemotingCommand) -> Response:
        """UNLOCK_BATCH_MQ (42): release the client's locks on the queues."""
        if not self.broker.is_master:
            return self.ctx.not_master(req)
        group, client, queues = self._lock_request(req)
        entry = unlock_op(group, client, queues, int(time.time() * 1000))
        return self.ctx.append(req, [entry], lambda r: req.make_response())

    # ------------------------------------------------------------------ status and checks

    def delay_offsets(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """GET_ALL_DELAY_OFFSET (45): RocketMQ's delayOffset.json, per level the offset of its
        schedule queue before which everything was delivered."""
        table = self.store.state.delay_offsets(len(self.config.delay_levels_ms))
        return req.make_response(
            body=json.dumps({"offsetTable": {str(k): v for k, v in table.items()}}).encode()
        )

    def check_client_config(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """CHECK_CLIENT_CONFIG (46): a consumer checks its subscription before it starts; a
        SQL92 expression that does not compile is SUBSCRIPTION_PARSE_FAILED."""
        if len(req.body) > _MAX_BODY:
            raise RemotingCommandError(
                f"CHECK_CLIENT_CONFIG body of {len(req.body)} bytes is over {_MAX_BODY}"
            )
        doc = loads_bounded(bytes(req.body) or b"{}", "CHECK_CLIENT_CONFIG body")
        sub = doc.get("subscriptionData") if isinstance(doc, dict) else None
        if not isinstance(sub, dict):
            return req.make_response()
        kind = str(sub.get("expressionType") or "TAG").upper()
        if kind == "TAG":
            return req.make_response()
        if kind != "SQL92":
            return req.make_response(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"unknown expression type {kind[:40]!r}"
            )
        if not self.config.enable_property_filter:
            return req.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"broker {self.config.broker_name} does not filter by SQL92 (enable_property_filter is off)",
            )
        try:
            compile_filter(sub.get("subString"))
        except SqlFilterError as exc:
            return req.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"SQL92 subscription: {exc}")
        return req.make_response()

    def pop_refused(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            f"{request_code_name(req.code)} ({req.code}) is not served by ledgermq; POP_MESSAGE, ACK_MESSAGE "
            "and CHANGE_MESSAGE_INVISIBLETIME are, as are pull and push consumers",
        )
