"""A fake broker group for client tests: just enough of the broker protocol, plus fault scripts.

The real nameserver (in-process) hands out routes; fake broker nodes register with it through
the real BrokerOuterAPI, so the clients see exactly what they would in production. A group's
nodes share one store (standing in for the replicated ledger), so a failover keeps every
stored message, offset and de-duplication entry, as DLedger would.

Everything server-side runs on its own event loop in a background thread (``ServerThread``),
so tests drive clients with ``asyncio.run`` and the CLI with click's CliRunner.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from broker.registration import BrokerIdentity, BrokerOuterAPI
from broker.sql_filter import SqlFilterError, compile_filter
from namesrv.config import NamesrvConfig
from namesrv.controller import NamesrvController
from remoting import RemotingCommand, RemotingServer, RequestCode, ResponseCode
from remoting.headers import SEND_V2_FULL_NAMES
from remoting.jsonbody import dump_body, load_body
from remoting.message import (
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    build_stored_record,
    decode_message_batch,
    decode_stored_messages,
    encode_stored_message,
    host_to_bytes,
    offset_msg_id,
    parse_offset_msg_id,
    properties_from_bytes,
    properties_to_bytes,
    serve_records,
)
from remoting.topic import DataVersion, TopicConfig, TopicConfigWrapper

T = TypeVar("T")


class ServerThread:
    """An event loop in a daemon thread; ``call`` runs a coroutine there and returns its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-cluster", daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.call(cancel_rest(), 5)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            if not self.thread.is_alive():
                self.loop.close()


@dataclass
class Stored:
    index: int
    record: bytes
    keys: list[str]
    props: dict[str, str] = field(default_factory=dict)
    topic: str = ""
    queue_id: int = 0
    queue_offset: int = 0


HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"


@dataclass
class GroupState:
    """What the group's ledger would hold."""

    topics: dict[str, TopicConfig] = field(default_factory=dict)
    queues: dict[tuple[str, int], list[Stored]] = field(default_factory=dict)
    by_index: dict[int, Stored] = field(default_factory=dict)
    next_index: int = 1
    dedup: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # UNIQ_KEY -> (qid, offset, index)
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    consumers: dict[str, dict[str, float]] = field(default_factory=dict)
    version: DataVersion = field(default_factory=DataVersion)
    # producer group -> client id -> (connection, node): where CHECK_TRANSACTION_STATE goes
    producers: dict[str, dict[str, tuple[Any, FakeNode]]] = field(default_factory=dict)
    halves: dict[int, str] = field(
        default_factory=dict
    )  # half message index -> "pending"/"commit"/"rollback"
    locks: dict[tuple[str, str, str, int], tuple[str, float]] = field(default_factory=dict)
    delay_offsets: dict[int, int] = field(default_factory=dict)
    store_stats: dict[str, Any] = field(default_factory=dict)


class FakeNode:
    """One broker process of a group. ``script`` holds actions for the next SEND requests it gets."""

    def __init__(self, group: FakeGroup, index: int) -> None:
        self.group = group
        self.index = index
        self.server = RemotingServer("127.0.0.1", 0, name=f"{group.name}-{index}")
        self.outer = BrokerOuterAPI(group.namesrv_addrs)
        self.script: list[str] = []
        self.back_script: list[str] = []  # CONSUMER_SEND_MSG_BACK: "refuse" answers SYSTEM_ERROR
        self.end_script: list[str] = []  # END_TRANSACTION: "not_master" / "refuse"
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.alive = False
        for code, handler in {
            RequestCode.SEND_MESSAGE: self.send,
            RequestCode.SEND_MESSAGE_V2: self.send,
            RequestCode.SEND_BATCH_MESSAGE: self.send_batch,
            RequestCode.PULL_MESSAGE: self.pull,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_offset,
            RequestCode.GET_MAX_OFFSET: self.max_offset,
            RequestCode.GET_MIN_OFFSET: self.min_offset,
            RequestCode.HEART_BEAT: self.heartbeat,
            RequestCode.UNREGISTER_CLIENT: self.unregister,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.all_topics,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.runtime_info,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message,
            RequestCode.QUERY_MESSAGE: self.query_message,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.send_back,
            RequestCode.END_TRANSACTION: self.end_transaction,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch,
            RequestCode.GET_ALL_DELAY_OFFSET: self.delay_offsets,
            RequestCode.CHECK_CLIENT_CONFIG: self.check_client_config,
        }.items():
            self.server.register_processor(code, handler)

    # --- identity ---------------------------------------------------------------------------------
    @property
    def addr(self) -> str:
        return self.server.address

    @property
    def is_master(self) -> bool:
        return self.group.master == self.index

    @property
    def broker_id(self) -> int:
        return 0 if self.is_master else self.index + 1

    @property
    def state(self) -> GroupState:
        return self.group.state

    def sends(self) -> list[dict[str, Any]]:
        return [h for kind, h in self.requests if kind in ("SEND", "BATCH")]

    async def start(self) -> None:
        await self.server.start()
        self.alive = True

    async def register(self) -> None:
        identity = BrokerIdentity(self.group.cluster, self.group.name, self.addr, self.broker_id)
        wrapper = TopicConfigWrapper(dict(self.state.topics), self.state.version)
        await self.outer.register_broker_all(identity, wrapper, timeout_s=3.0)

    async def kill(self) -> None:
        """Stop serving and drop the nameserver connection (the nameserver forgets us at once)."""
        self.alive = False
        await self.server.stop(grace_s=0.5)
        await self.outer.close()
        self.outer = BrokerOuterAPI(self.group.namesrv_addrs)

    # --- helpers ----------------------------------------------------------------------------------------
    def _not_master(self, req: RemotingCommand) -> RemotingCommand:
        master = self.group.master_node
        headers = (
            {"masterAddr": master.addr} if master is not None and master.alive and self.group.hints else {}
        )
        where = f"; master is {master.addr}" if headers else ""
        return req.make_response(ResponseCode.NOT_MASTER, f"{self.addr} is not master{where}", headers)

    def _store(
        self,
        topic: str,
        qid: int,
        flag: int,
        born: int,
        props: bytes | dict[str, str],
        body: bytes,
        sys_flag: int = 0,
        reconsume_times: int = 0,
    ) -> tuple[int, int, bool]:
        """Store a RocketMQ record; its UNIQ_KEY property is the de-duplication key."""
        st = self.state
        p = dict(props) if isinstance(props, dict) else properties_from_bytes(props)
        uniq = p.get(PROPERTY_UNIQ_KEY)
        if uniq:
            hit = st.dedup.get(uniq)
            if hit is not None:
                return hit[1], hit[2], True
        index = st.next_index
        st.next_index += 1
        host = host_to_bytes(self.addr)
        rec = build_stored_record(
            topic.encode(),
            qid,
            body,
            properties_to_bytes(p),
            flag,
            sys_flag,
            born,
            host,
            int(time.time() * 1000),
            host,
            reconsume_times,
        )
        entries = st.queues.setdefault((topic, qid), [])
        stored = Stored(index, rec, p.get(PROPERTY_KEYS, "").split(), p, topic, qid, len(entries))
        entries.append(stored)
        st.by_index[index] = stored
        offset = len(entries) - 1
        if uniq:
            st.dedup[uniq] = (qid, offset, index)
        self.group.notify()
        return offset, index, False

    def _msg_id(self, index: int) -> str:
        rec = self.state.by_index[index].record
        return offset_msg_id(bytes(rec[64:72]), index)

    def _check_queue(self, req: RemotingCommand, topic: str, qid: int) -> RemotingCommand | None:
        tc = self.state.topics.get(topic)
        if tc is None:
            return req.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} not exist")
        if not 0 <= qid < tc.write_queue_nums:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, f"queue id {qid} out of range")
        return None

    async def _fault(
        self, req: RemotingCommand, action: str | None, conn: Any
    ) -> RemotingCommand | None | str:
        """Apply a scripted fault; returns a response, None for "no reply", or "store" to go on."""
        if action is None:
            return "store"
        if action == "not_master":
            return self._not_master(req)
        if action == "busy":
            return req.make_response(ResponseCode.SYSTEM_BUSY, "busy")
        if action == "unavailable":
            return req.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, "no leader yet")
        if action == "illegal":
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, "message illegal")
        if action == "repl_timeout_nostore":
            return req.make_response(ResponseCode.REPLICATION_TIMEOUT, "not committed in time")
        return "store"

    # --- sends ------------------------------------------------------------------------------------------
    @staticmethod
    def _full_names(req: RemotingCommand) -> RemotingCommand:
        """A V2 send (310/320) with SendMessageRequestHeader's full names, as RocketMQ's broker reads it."""
        if "b" not in req.headers:
            return req
        full = {SEND_V2_FULL_NAMES.get(k, k): v for k, v in req.headers.items()}
        return RemotingCommand(
            req.code, full, req.body, opaque=req.opaque, flags=req.flags, serialize_type=req.serialize_type
        )

    async def send(self, conn: Any, req: RemotingCommand) -> RemotingCommand | None:
        req = self._full_names(req)
        h = dict(req.headers)
        self.requests.append(("SEND", h))
        action = self.script.pop(0) if self.script else None
        if not self.is_master:
            return self._not_master(req)
        fault = await self._fault(req, action, conn)
        if fault != "store":
            return fault  # type: ignore[return-value]
        topic, qid = req.header_str("topic"), req.header_int("queueId")
        bad = self._check_queue(req, topic, qid)
        if bad is not None:
            return bad
        props = properties_from_bytes(req.header_str("properties", "").encode())
        sys_flag = req.header_int("sysFlag", 0)
        reconsume = req.header_int("reconsumeTimes", 0)
        if topic.startswith(RETRY_PREFIX) and reconsume >= req.header_int("maxReconsumeTimes", 16):
            # RocketMQ's handleRetryAndDLQ: a retry copy tried often enough goes to the DLQ
            topic, qid = DLQ_PREFIX + topic[len(RETRY_PREFIX) :], 0
            await self.group.ensure_topic(topic)
            props.pop("DELAY", None)
        half = bool(sys_flag & 0x4)
        if half:  # RocketMQ's half message: kept aside under its real topic and queue
            props["REAL_TOPIC"], props["REAL_QID"] = topic, str(qid)
            topic, qid = HALF_TOPIC, 0
        offset, index, dup = self._store(
            topic,
            qid,
            req.header_int("flag", 0),
            req.header_int("bornTimestamp"),
            props,
            bytes(req.body),
            sys_flag,
            reconsume,
        )
        if half:
            self.state.halves.setdefault(index, "pending")
        return self._after_store(
            req,
            action,
            conn,
            req.make_response(
                headers={
                    "msgId": self._msg_id(index),
                    "queueId": qid,
                    "queueOffset": offset,
                    "ledgerIndex": index,
                    "duplicate": dup,
                }
            ),
        )

    def _after_store(
        self, req: RemotingCommand, action: str | None, conn: Any, ok: RemotingCommand
    ) -> RemotingCommand | None:
        if action == "repl_timeout":
            return req.make_response(ResponseCode.REPLICATION_TIMEOUT, "stored but not committed in time")
        if action == "system_error":
            return req.make_response(ResponseCode.SYSTEM_ERROR, "boom after append")
        if action == "flush_slave_timeout":  # RocketMQ's SYNC_MASTER: stored, its slave copy not confirmed
            ok.code = ResponseCode.FLUSH_SLAVE_TIMEOUT
            ok.remark = "wait for slave flush timeout"
            return ok
        if action and action.startswith("drop"):
            # "drop": store, then lose the connection; "drop_then_master:N": and node N takes over.
            if ":" in action:
                self.group.master = int(action.split(":")[1])
            conn.abort("scripted drop")
            return None
        if action == "hang":
            return None
        return ok

    async def send_batch(self, conn: Any, req: RemotingCommand) -> RemotingCommand | None:
        req = self._full_names(req)
        h = dict(req.headers)
        self.requests.append(("BATCH", h))
        action = self.script.pop(0) if self.script else None
        if not self.is_master:
            return self._not_master(req)
        fault = await self._fault(req, action, conn)
        if fault != "store":
            return fault  # type: ignore[return-value]
        topic, qid = req.header_str("topic"), req.header_int("queueId")
        bad = self._check_queue(req, topic, qid)
        if bad is not None:
            return bad
        born = req.header_int("bornTimestamp", 0)
        offsets, ids, dups = [], [], 0
        for flag, body, props in decode_message_batch(req.body, 4 << 20):
            offset, index, dup = self._store(topic, qid, flag, born, bytes(props), bytes(body))
            offsets.append(offset)
            ids.append(self._msg_id(index))
            dups += dup
        headers = {"msgId": ",".join(ids), "queueId": qid, "queueOffset": offsets[0] if offsets else -1}
        if not dups and offsets and offsets[-1] - offsets[0] == len(offsets) - 1:  # as the broker answers
            return self._after_store(req, action, conn, req.make_response(headers=headers))
        body = dump_body({"queueId": qid, "offsets": offsets, "duplicates": dups})
        return self._after_store(req, action, conn, req.make_response(headers=headers, body=body))

    # --- reads -----------------------------------------------------------------------------------------
    def _range(self, topic: str, qid: int) -> tuple[int, int]:
        return 0, len(self.state.queues.get((topic, qid), []))

    async def pull(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        h = dict(req.headers)
        self.requests.append(("PULL", h))
        topic, qid = req.header_str("topic"), req.header_int("queueId")
        offset, max_nums = req.header_int("queueOffset"), req.header_int("maxMsgNums")
        group = req.header_str("consumerGroup")
        if req.header_bool("requireMaster", False) and not self.is_master:
            return self._not_master(req)  # as a ledgermq slave answers a pull only a master may serve
        commit = req.header_int("commitOffset", None)
        if req.header_int("sysFlag", 1) & 1 and commit is not None and self.is_master:
            self.state.offsets[(group, topic, qid)] = commit
        deadline = time.monotonic() + req.header_int("suspendTimeoutMillis", 0) / 1000
        while True:
            lo, hi = self._range(topic, qid)
            headers = {"minOffset": lo, "maxOffset": hi, "brokerName": self.group.name}
            if offset < lo or offset > hi:
                return req.make_response(
                    ResponseCode.PULL_OFFSET_MOVED,
                    "offset moved",
                    {**headers, "nextBeginOffset": max(lo, min(offset, hi))},
                )
            if offset < hi:
                entries = self.state.queues[(topic, qid)][offset : offset + max_nums]
                found = [(offset + i, e) for i, e in enumerate(entries)]
                if req.header_str("expressionType", "TAG") == "SQL92":
                    f = compile_filter(req.header_str("subscription"))
                    found = [(o, e) for o, e in found if f.matches(e.props)]
                body = serve_records([(o, e.index, e.record) for o, e in found])
                return req.make_response(
                    headers={**headers, "nextBeginOffset": offset + len(entries)}, body=body
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return req.make_response(
                    ResponseCode.PULL_NOT_FOUND, "no new message", {**headers, "nextBeginOffset": offset}
                )
            await self.group.wait_new(remaining)

    def query_offset(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        key = (req.header_str("consumerGroup"), req.header_str("topic"), req.header_int("queueId"))
        if key not in self.state.offsets:
            return req.make_response(ResponseCode.QUERY_NOT_FOUND, "no offset")
        return req.make_response(headers={"offset": self.state.offsets[key]})

    def update_offset(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        self.requests.append(("COMMIT", dict(req.headers)))
        if not self.is_master:
            return self._not_master(req)
        key = (req.header_str("consumerGroup"), req.header_str("topic"), req.header_int("queueId"))
        self.state.offsets[key] = req.header_int("commitOffset")
        return req.make_response()

    def max_offset(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(
            headers={"offset": self._range(req.header_str("topic"), req.header_int("queueId"))[1]}
        )

    def min_offset(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(headers={"offset": 0})

    async def heartbeat(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        hb = load_body(req.body, "heartbeat")
        self.requests.append(("HEARTBEAT", hb))
        for producer in hb.get("producerDataSet") or []:
            self.state.producers.setdefault(producer["groupName"], {})[hb["clientID"]] = (conn, self)
        for consumer in hb.get("consumerDataSet") or []:
            group = consumer["groupName"]
            if self.is_master and self.group.create_retry_topics:
                await self.group.ensure_topic(RETRY_PREFIX + group)
            members = self.state.consumers.setdefault(group, {})
            new = hb["clientID"] not in members
            members[hb["clientID"]] = time.monotonic()
            if new and self.group.notify_ids_changed:
                # Like RocketMQ's broker: tell connected clients so they rebalance now.
                for c in self.server.connections:
                    if c is not conn and not c.closed:
                        c.invoke_oneway(
                            RemotingCommand.request(
                                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group}
                            )
                        )
        return req.make_response()

    def unregister(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        self.requests.append(("UNREGISTER", dict(req.headers)))
        client = req.header_str("clientID")
        self.state.consumers.get(req.header_str("consumerGroup", ""), {}).pop(client, None)
        self.state.producers.get(req.header_str("producerGroup", ""), {}).pop(client, None)
        return req.make_response()

    def consumer_list(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        now = time.monotonic()
        seen = self.state.consumers.get(req.header_str("consumerGroup"), {})
        ids = sorted(c for c, t in seen.items() if now - t < self.group.consumer_expiry_s)
        return req.make_response(body=dump_body({"consumerIdList": ids}))

    async def update_topic(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        if not self.is_master:
            return self._not_master(req)
        topic = req.header_str("topic")
        self.state.topics[topic] = TopicConfig(
            topic, req.header_int("readQueueNums"), req.header_int("writeQueueNums"), req.header_int("perm")
        )
        self.state.version = self.state.version.next()
        await self.group.register_all()
        return req.make_response()

    def all_topics(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(
            body=dump_body({"topicConfigTable": {n: t.to_json() for n, t in self.state.topics.items()}})
        )

    def runtime_info(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        info = {
            "brokerName": self.group.name,
            "brokerId": self.broker_id,
            "role": "MASTER" if self.is_master else "SLAVE",
            "ledger": {"term": 1, "commitIndex": self.state.next_index - 1},
            "topics": sorted(self.state.topics),
        }
        if self.state.store_stats:
            info["store"] = dict(self.state.store_stats)
        return req.make_response(body=dump_body(info))

    def view_message(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        if "offset" in req.headers:
            index = req.header_int("offset")
        else:
            _host, index = parse_offset_msg_id(req.header_str("msgId"))
        stored = self.state.by_index.get(index)
        if stored is None:
            return req.make_response(ResponseCode.QUERY_NOT_FOUND, "no such message")
        for (_t, _q), entries in self.state.queues.items():
            for off, e in enumerate(entries):
                if e is stored:
                    return req.make_response(body=serve_records([(off, e.index, e.record)]))
        return req.make_response(ResponseCode.QUERY_NOT_FOUND, "no such message")

    def query_message(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        topic, key, max_num = req.header_str("topic"), req.header_str("key"), req.header_int("maxNum")
        found = []
        for (t, _q), entries in sorted(self.state.queues.items()):
            if t != topic:
                continue
            found.extend((off, e.index, e.record) for off, e in enumerate(entries) if key in e.keys)
        if not found:
            return req.make_response(ResponseCode.QUERY_NOT_FOUND, "no message with that key")
        return req.make_response(body=serve_records(found[:max_num]))

    # --- retries, transactions, locks, delay offsets, client checks --------------------------------------
    def _record(self, index: int) -> Any:
        stored = self.state.by_index.get(index)
        if stored is None:
            return None, None
        return stored, decode_stored_messages(serve_records([(stored.queue_offset, index, stored.record)]))[0]

    async def send_back(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        """RocketMQ's consumerSendMsgBack: copy the stored message into %RETRY% or %DLQ%."""
        self.requests.append(("SEND_BACK", dict(req.headers)))
        if not self.is_master:
            return self._not_master(req)
        action = self.back_script.pop(0) if self.back_script else None
        if action == "refuse":
            return req.make_response(ResponseCode.SYSTEM_ERROR, "scripted send-back refusal")
        group = req.header_str("group")
        stored, msg = self._record(req.header_int("offset"))
        if stored is None:
            return req.make_response(ResponseCode.SYSTEM_ERROR, "look message by offset failed")
        props = dict(stored.props)
        props.setdefault("RETRY_TOPIC", msg.topic)
        props.setdefault("ORIGIN_MESSAGE_ID", props.get(PROPERTY_UNIQ_KEY) or msg.msg_id)
        props.pop(PROPERTY_UNIQ_KEY, None)  # a new message: keep it out of the de-dup table
        max_times = req.header_int("maxReconsumeTimes", 16)
        delay = req.header_int("delayLevel")
        if msg.reconsume_times >= max_times or delay < 0:
            topic = DLQ_PREFIX + group
        else:
            topic = RETRY_PREFIX + group
            props["DELAY"] = str(delay or 3 + msg.reconsume_times)
        await self.group.ensure_topic(topic)
        self._store(topic, 0, msg.flag, msg.born_ms, props, msg.body, 0, msg.reconsume_times + 1)
        return req.make_response()

    def end_transaction(self, conn: Any, req: RemotingCommand) -> RemotingCommand | None:
        self.requests.append(("END_TX", {**req.headers, "_remark": req.remark, "_oneway": req.is_oneway}))
        action = self.end_script.pop(0) if self.end_script else None
        if action == "not_master" or not self.is_master:
            return self._not_master(req)
        if action == "refuse":
            return req.make_response(ResponseCode.SYSTEM_ERROR, "scripted end refusal")
        index = req.header_int("commitLogOffset")
        verdict = req.header_int("commitOrRollback")
        if verdict == 0 or self.state.halves.get(index) != "pending":
            return None  # as RocketMQ: no answer for UNKNOW
        stored, msg = self._record(index)
        if verdict == 8:
            props = dict(stored.props)
            topic, qid = props.pop("REAL_TOPIC"), int(props.pop("REAL_QID"))
            props.pop("TRAN_MSG", None)
            props[PROPERTY_UNIQ_KEY] = props[PROPERTY_UNIQ_KEY] + "-commit"  # its own de-dup key here
            self._store(topic, qid, msg.flag, msg.born_ms, props, msg.body, 8)
            self.state.halves[index] = "commit"
        else:
            self.state.halves[index] = "rollback"
        return req.make_response()

    async def check_transaction(self, producer_group: str, index: int) -> bool:
        """Send CHECK_TRANSACTION_STATE for half message ``index`` to a producer of the group
        (as RocketMQ's broker: oneway, the half with its real topic as the body)."""
        conns = [c for c, node in self.state.producers.get(producer_group, {}).values() if node is self]
        stored, msg = self._record(index)
        if not conns or stored is None:
            return False
        props = dict(stored.props)
        body = encode_stored_message(
            topic=props["REAL_TOPIC"],
            body=msg.body,
            properties=properties_to_bytes(props),
            queue_id=int(props["REAL_QID"]),
            queue_offset=stored.queue_offset,
            physical_offset=index,
            sys_flag=msg.sys_flag,
            born_ms=msg.born_ms,
            store_host=host_to_bytes(self.addr),
        )
        headers = {
            "tranStateTableOffset": stored.queue_offset,
            "commitLogOffset": index,
            "msgId": props.get(PROPERTY_UNIQ_KEY, ""),
            "transactionId": props.get(PROPERTY_UNIQ_KEY, ""),
            "offsetMsgId": self._msg_id(index),
        }
        conns[-1].invoke_oneway(
            RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, headers, body, oneway=True)
        )
        return True

    def lock_batch(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        doc = load_body(req.body, "lock body")
        self.requests.append(("LOCK", doc))
        if not self.is_master:
            return self._not_master(req)
        now = time.monotonic()
        ok = []
        for mq in doc["mqSet"]:
            key = (doc["consumerGroup"], mq["topic"], mq["brokerName"], mq["queueId"])
            held = self.state.locks.get(key)
            if held is None or held[0] == doc["clientId"] or now - held[1] > self.group.lock_expiry_s:
                self.state.locks[key] = (doc["clientId"], now)
                ok.append(mq)
        return req.make_response(body=dump_body({"lockOKMQSet": ok}))

    def unlock_batch(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        doc = load_body(req.body, "unlock body")
        self.requests.append(("UNLOCK", {**doc, "_oneway": req.is_oneway}))
        for mq in doc["mqSet"]:
            key = (doc["consumerGroup"], mq["topic"], mq["brokerName"], mq["queueId"])
            if self.state.locks.get(key, ("",))[0] == doc["clientId"]:
                del self.state.locks[key]
        return req.make_response()

    def delay_offsets(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        # fastjson writes the Integer keys of DelayOffsetSerializeWrapper's table unquoted
        table = ",".join(f"{level}:{off}" for level, off in sorted(self.state.delay_offsets.items()))
        return req.make_response(body=('{"offsetTable":{' + table + "}}").encode())

    def check_client_config(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        doc = load_body(req.body, "check client body")
        self.requests.append(("CHECK_CLIENT", {**doc, "_headers": dict(req.headers)}))
        sub = doc["subscriptionData"]
        if sub.get("expressionType", "TAG") != "TAG":
            if self.group.sql92_parse_fails:
                return req.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, "scripted parse failure")
            if not self.group.sql92:
                return req.make_response(
                    ResponseCode.SYSTEM_ERROR,
                    "The broker does not support consumer to filter message by SQL92",
                )
            try:
                compile_filter(sub["subString"])
            except SqlFilterError as exc:
                return req.make_response(
                    ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"Parameters is invalid: {exc}"
                )
        return req.make_response()


class FakeGroup:
    """A broker group of ``size`` nodes sharing one store; node ``master`` answers writes."""

    def __init__(
        self, name: str, namesrv_addrs: list[str], size: int = 1, cluster: str = "FakeCluster"
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.namesrv_addrs = namesrv_addrs
        self.state = GroupState()
        self.master: int | None = 0
        self.hints = True
        self.consumer_expiry_s = 30.0
        self.notify_ids_changed = True
        self.create_retry_topics = True
        self.lock_expiry_s = 60.0  # RocketMQ's broker-side REBALANCE_LOCK_MAX_LIVE_TIME
        self.sql92 = True
        self.sql92_parse_fails = False
        self.nodes = [FakeNode(self, i) for i in range(size)]
        self._new = asyncio.Event()

    @property
    def master_node(self) -> FakeNode | None:
        return None if self.master is None else self.nodes[self.master]

    def notify(self) -> None:
        self._new.set()
        self._new = asyncio.Event()

    async def wait_new(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._new.wait(), timeout)
        except TimeoutError:
            pass

    async def start(self) -> None:
        for n in self.nodes:
            await n.start()
        await self.register_all()

    async def register_all(self) -> None:
        await asyncio.gather(*(n.register() for n in self.nodes if n.alive))

    async def ensure_topic(self, topic: str, queues: int = 1) -> None:
        """Create a system topic (retry, DLQ) on first use and register it, as a broker does."""
        if topic not in self.state.topics:
            await self.add_topic(topic, queues)

    async def add_topic(self, topic: str, queues: int = 4, perm: int = 6) -> None:
        self.state.topics[topic] = TopicConfig(topic, queues, queues, perm)
        self.state.version = self.state.version.next()
        await self.register_all()

    async def failover(self, new_master: int | None) -> None:
        """Change the master (None: electing) and re-register, as a DLedger role change does."""
        self.master = new_master
        self.state.version = self.state.version.next()
        await self.register_all()

    async def stop(self) -> None:
        for n in self.nodes:
            if n.alive:
                await n.kill()
            await n.outer.close()

    def messages(self, topic: str, qid: int) -> list[Stored]:
        return list(self.state.queues.get((topic, qid), []))

    def count(self, topic: str) -> int:
        return sum(len(v) for (t, _q), v in self.state.queues.items() if t == topic)

    def reset_scripts(self) -> None:
        for n in self.nodes:
            n.script.clear()
            n.requests.clear()


class FakeCluster:
    """One in-process nameserver (or two) and fake broker groups, on a ServerThread."""

    def __init__(self, groups: dict[str, int], nameservers: int = 1) -> None:
        self.thread = ServerThread()
        self.namesrvs: list[NamesrvController] = []
        self.groups: dict[str, FakeGroup] = {}

        async def boot() -> None:
            for _ in range(nameservers):
                ctl = NamesrvController(NamesrvConfig(listen_host="127.0.0.1", listen_port=0))
                await ctl.start()
                self.namesrvs.append(ctl)
            addrs = [c.address for c in self.namesrvs]
            for name, size in groups.items():
                g = FakeGroup(name, addrs, size)
                await g.start()
                self.groups[name] = g

        self.thread.call(boot())

    @property
    def namesrv_addr(self) -> str:
        return ";".join(c.address for c in self.namesrvs)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return self.thread.call(coro, timeout)

    def add_topic(self, topic: str, queues: int = 4, groups: list[str] | None = None) -> None:
        async def go() -> None:
            for name in groups or list(self.groups):
                await self.groups[name].add_topic(topic, queues)

        self.call(go())

    def close(self) -> None:
        async def down() -> None:
            for g in self.groups.values():
                await g.stop()
            for c in self.namesrvs:
                await c.shutdown()

        try:
            self.call(down())
        finally:
            self.thread.stop()
