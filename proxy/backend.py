"""The proxy's side toward ledgermq: routes from the nameservers, sends through ledgermq's own
producer, and POP, ACK and CHANGE_MESSAGE_INVISIBLETIME to each group's master, followed across
failovers.

Everything comes from ``client`` (route cache, remoting connections, the producer and its retry
rules); this module only adds what a 4.x client has no call for: sending a message under the id
its 5.x producer gave it, half messages whose END_TRANSACTION comes in a later request, and
master calls for the POP family that follow NOT_MASTER hints and dead masters as a send does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import client.broker_api as B
from client.errors import ClientError
from client.instance import ClientInstance
from client.producer import Producer
from client.route import MessageQueue
from client.send_attempts import SendResult, message_result
from remoting.codes import RequestCode, ResponseCode
from remoting.connection import RemotingConnection
from remoting.exceptions import RemotingError
from remoting.message import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_KEY,
    Message,
    MessageFormatError,
    decode_stored_messages,
    parse_offset_msg_id,
)
from remoting.protocol import RemotingCommand
from remoting.route import TopicRouteData

from .convert import Handle, TxRef, half_properties

log = logging.getLogger("proxy.backend")

#: tries of one master call (each after a dead master or a NOT_MASTER), within its deadline
MAX_MASTER_TRIES = 8
#: pause before asking again when a group has no master the proxy can reach (an election runs)
NO_MASTER_PAUSE_S = 0.05
#: time a broker may take beyond a POP's long poll to answer it
POP_ANSWER_MARGIN_S = 3.0
#: END_TRANSACTION verdicts (RocketMQ's MessageSysFlag)
COMMIT, ROLLBACK = 0x2 << 2, 0x3 << 2
TRANSACTION_PRODUCER_GROUP = "ledgermq-proxy-tx"
#: how often the proxy names its producer group to every master (a new master after a failover
#: sends transaction checks only once it has)
PRODUCER_HEARTBEAT_S = 10.0


class BackendError(Exception):
    """A broker or nameserver refused or could not be reached; ``code`` is the v2 status code's name."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code


class ProxyProducer(Producer):
    """ledgermq's producer, sending each message under the id its 5.x client gave it (so a
    client's retry of a send whose answer was lost is de-duplicated by the broker group),
    and half messages whose verdict comes later."""

    def _keep_id(self, msg: Message) -> None:
        # Producer._stamp keeps a message's UNIQ_KEY when it carries this producer's id and a
        # sequence number: the key is the 5.x message id, already in the properties.
        msg.producer_id, msg.seq = self.producer_id, 1

    async def send_keeping_id(self, msg: Message, queue: MessageQueue | None, timeout_s: float) -> SendResult:
        self._check_running()
        self._keep_id(msg)
        request = self._message_request(msg)
        parse = message_result(msg, True)
        return await self._attempts(msg.topic, request, parse, timeout_s, self.retries, queue, None).run()

    async def send_half(self, msg: Message, timeout_s: float) -> tuple[SendResult, str]:
        """Store ``msg`` as a half message; where it went and the broker's transaction id."""
        self._check_running()
        half_properties(msg, self.group)
        self._keep_id(msg)
        request = self._message_request(msg)
        request.headers[B.V2_SYS_FLAG] = str(B.TRANSACTION_PREPARED_TYPE)
        plain = message_result(msg, True)
        tx_ids: list[str] = []

        def parse(response: RemotingCommand, mq: MessageQueue, addr: str, tries: int) -> SendResult:
            tx_ids.append(response.header_str(B.TRANSACTION_ID, ""))
            return plain(response, mq, addr, tries)

        result = await self._attempts(msg.topic, request, parse, timeout_s, self.retries, None, None).run()
        if result.broker_addr and result.broker_addr not in self._heartbeated:
            # the broker checks an unsettled half only with a connection that named its group
            await self.heartbeat([result.broker_addr])
        return result, (tx_ids[-1] if tx_ids else "") or msg.properties.get(PROPERTY_UNIQ_KEY, "")


@dataclass(slots=True)
class Popped:
    """Messages one POP gave, each with its receipt handle."""

    messages: list[tuple[Message, Handle]]
    invisible_ms: int


class Backend:
    """One ClientInstance (routes, connections) shared by every gRPC client of the proxy."""

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        *,
        route_ttl_s: float = 3.0,
        send_timeout_s: float = 3.0,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        """``route_ttl_s``: how stale a route may be. Short, because the proxy follows masters
        for every client behind it (a failed call refreshes at once anyway)."""
        self.instance = ClientInstance(
            namesrv_addrs,
            route_ttl_s=route_ttl_s,
            name="ledgermq-proxy",
            access_key=access_key,
            secret_key=secret_key,
        )
        self.send_timeout_s = send_timeout_s
        self.producer = ProxyProducer(
            TRANSACTION_PRODUCER_GROUP,
            instance=self.instance,
            idempotent=True,
            send_timeout_s=send_timeout_s,
            retry_backoff_s=0.02,
            heartbeat_interval_s=PRODUCER_HEARTBEAT_S,
        )

        #: where the brokers' transaction checks go (the service forwards them to a 5.x producer)
        self.on_check: Callable[[Message, TxRef], None] | None = None
        self._unregister_checker = self.instance.register_transaction_checker(
            TRANSACTION_PRODUCER_GROUP, self._on_check
        )

    async def start(self) -> None:
        await self.producer.start()

    def _on_check(self, conn: RemotingConnection, request: RemotingCommand, msg: Message) -> None:
        """CHECK_TRANSACTION_STATE for a half message the proxy stored: which broker group asked
        (by the connection's address, else the message's store host), the offsets END_TRANSACTION
        needs, and the message as its producer sent it (real topic restored)."""
        try:
            log_offset = request.header_int(B.COMMIT_LOG_OFFSET)
            queue_offset = request.header_int(B.TRAN_STATE_TABLE_OFFSET)
        except RemotingError:
            return
        broker = ""
        for name, bd in self.instance.routes.known_brokers().items():
            if conn.remote_addr in bd.broker_addrs.values() or msg.store_host in bd.broker_addrs.values():
                broker = name
                break
        real = msg.properties.get(PROPERTY_REAL_TOPIC)
        if real:
            msg.topic = real
        if broker and self.on_check is not None:
            tx_id = request.header_str(B.TRANSACTION_ID, "") or msg.properties.get(PROPERTY_UNIQ_KEY, "")
            self.on_check(msg, TxRef(broker, queue_offset, log_offset, TRANSACTION_PRODUCER_GROUP, tx_id))

    async def close(self) -> None:
        self._unregister_checker()
        await self.producer.shutdown(grace_s=1.0)
        await self.instance.close()

    # --- routes -------------------------------------------------------------------------------------
    async def route(self, topic: str) -> TopicRouteData:
        """The topic's route (cached up to the TTL); BackendError TOPIC_NOT_FOUND when no group serves it."""
        try:
            return await self.instance.routes.route(topic)
        except ClientError as exc:
            code = "TOPIC_NOT_FOUND" if type(exc).__name__ == "RouteNotFoundError" else "PROXY_TIMEOUT"
            raise BackendError(code, str(exc)) from None

    # --- sends --------------------------------------------------------------------------------------
    async def send(self, msg: Message, group: str) -> SendResult:
        """Store ``msg``; a FIFO message (``group``) goes to the queue its group hashes to."""
        queue = None
        if group:
            publish = await self.instance.routes.publish_info(msg.topic)
            queues = sorted(publish.queues)
            if queues:
                queue = queues[_java_hash(group) % len(queues)]
        return await self.producer.send_keeping_id(msg, queue, self.send_timeout_s)

    async def send_half(self, msg: Message) -> tuple[SendResult, TxRef]:
        result, broker_tx = await self.producer.send_half(msg, self.send_timeout_s)
        try:
            _host, log_offset = parse_offset_msg_id(result.msg_id)
        except MessageFormatError as exc:
            raise BackendError("INTERNAL_ERROR", f"the half message's id is unusable: {exc}") from None
        return result, TxRef(
            result.broker_name, result.queue_offset, log_offset, self.producer.group, broker_tx
        )

    async def end_transaction(
        self, tx: TxRef, topic: str, message_id: str, commit: bool, from_check: bool
    ) -> None:
        headers = B.end_transaction_headers(
            tx.producer_group,
            tx.queue_offset,
            tx.commit_log_offset,
            COMMIT if commit else ROLLBACK,
            message_id,
            tx.broker_tx_id or None,
            from_check=from_check,
        )
        resp = await self.master_call(
            tx.broker,
            topic,
            lambda: RemotingCommand.request(RequestCode.END_TRANSACTION, headers),
            self.send_timeout_s,
        )
        if resp.code != ResponseCode.SUCCESS:
            raise BackendError(_code_of(resp.code), f"END_TRANSACTION: {resp.remark}")

    # --- POP family ---------------------------------------------------------------------------------
    async def pop(
        self,
        broker: str,
        group: str,
        topic: str,
        *,
        max_nums: int,
        invisible_ms: int,
        poll_ms: int,
        exp_type: str,
        exp: str,
        order: bool = False,
    ) -> Popped:
        """POP_MESSAGE from every queue of ``topic`` on ``broker`` (as RocketMQ 5's proxy pops);
        an empty Popped when nothing came within ``poll_ms``."""
        await self.route(topic)
        headers = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": -1,
            "maxMsgNums": max_nums,
            "invisibleTime": invisible_ms,
            "pollTime": poll_ms,
            "bornTime": int(time.time() * 1000),
            "initMode": 0,
            "expType": exp_type,
            "exp": exp,
            "order": order,
        }
        resp = await self.master_call(
            broker,
            topic,
            lambda: RemotingCommand.request(RequestCode.POP_MESSAGE, headers),
            poll_ms / 1000 + POP_ANSWER_MARGIN_S,
        )
        if resp.code in (ResponseCode.POLLING_TIMEOUT, ResponseCode.PULL_NOT_FOUND):
            return Popped([], invisible_ms)
        if resp.code != ResponseCode.SUCCESS:
            raise BackendError(_code_of(resp.code), f"POP from {broker}: {resp.remark}")
        starts: dict[int, int] = {}
        try:
            for part in resp.header_str("startOffsetInfo").split(";"):
                _flag, qid, start = part.split(" ")
                starts[int(qid)] = int(start)
            pop_time = resp.header_int("popTime")
            invisible = resp.header_int("invisibleTime")
            msgs = decode_stored_messages(resp.body)
        except (ValueError, RemotingError) as exc:
            raise BackendError("INTERNAL_ERROR", f"POP answer from {broker} is malformed: {exc}") from None
        out = [
            (
                m,
                Handle(
                    starts.get(m.queue_id, m.queue_offset),
                    pop_time,
                    invisible,
                    broker,
                    m.queue_id,
                    m.queue_offset,
                    _position(m),
                ),
            )
            for m in msgs
        ]
        return Popped(out, invisible)

    def _handle_headers(self, group: str, topic: str, h: Handle) -> dict[str, object]:
        return {
            "consumerGroup": group,
            "topic": topic,
            "queueId": h.queue_id,
            "extraInfo": h.extra_info(),
            "offset": h.offset,
        }

    async def ack(self, group: str, topic: str, h: Handle) -> None:
        headers = self._handle_headers(group, topic, h)
        resp = await self.master_call(
            h.broker,
            topic,
            lambda: RemotingCommand.request(RequestCode.ACK_MESSAGE, headers),
            self.send_timeout_s,
        )
        if resp.code != ResponseCode.SUCCESS:
            raise BackendError(_code_of(resp.code, handle=True), resp.remark)

    async def change_invisible(self, group: str, topic: str, h: Handle, invisible_ms: int) -> Handle:
        headers = self._handle_headers(group, topic, h)
        headers["invisibleTime"] = invisible_ms
        resp = await self.master_call(
            h.broker,
            topic,
            lambda: RemotingCommand.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, headers),
            self.send_timeout_s,
        )
        if resp.code != ResponseCode.SUCCESS:
            raise BackendError(_code_of(resp.code, handle=True), resp.remark)
        return Handle(
            h.ck, resp.header_int("popTime"), invisible_ms, h.broker, h.queue_id, h.offset, h.position
        )

    async def to_dead_letters(
        self, group: str, topic: str, h: Handle, message_id: str, max_attempts: int
    ) -> None:
        """Store the delivered message in ``%DLQ%<group>`` (CONSUMER_SEND_MSG_BACK, delay level -1),
        then ack it: a 5.x consumer gives up on it (ForwardMessageToDeadLetterQueue)."""
        if h.position < 0:
            raise BackendError("INVALID_RECEIPT_HANDLE", "the receipt handle names no stored message")
        headers = {
            "offset": h.position,
            "group": group,
            "delayLevel": -1,
            "originMsgId": message_id,
            "originTopic": topic,
            "unitMode": "false",
            "maxReconsumeTimes": max_attempts,
        }
        resp = await self.master_call(
            h.broker,
            topic,
            lambda: RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, headers),
            self.send_timeout_s,
        )
        if resp.code != ResponseCode.SUCCESS:
            raise BackendError(_code_of(resp.code), f"dead-letter forward: {resp.remark}")
        await self.ack(group, topic, h)

    # --- master calls -------------------------------------------------------------------------------
    async def master_call(
        self, broker: str, topic: str, make: Callable[[], RemotingCommand], timeout_s: float
    ) -> RemotingCommand:
        """``make()``'s request to ``broker``'s master, following NOT_MASTER hints and moving off
        a master that does not answer (a slave is asked where the new one is) until a master
        answers, ``MAX_MASTER_TRIES`` tries or the deadline; BackendError when none did."""
        routes = self.instance.routes
        deadline = time.monotonic() + timeout_s + self.send_timeout_s
        last, error = "", "no master known"
        for _ in range(MAX_MASTER_TRIES):
            addr = routes.master_addr(broker)
            if addr is None:
                try:
                    await routes.route(topic, force=True)
                except ClientError as exc:
                    error = str(exc)
                addr = routes.master_addr(broker) or routes.member_to_ask(broker, avoid=last)
            if addr is None:
                await asyncio.sleep(NO_MASTER_PAUSE_S)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                resp = await self.instance.remoting.invoke_sync(addr, make(), min(timeout_s, remaining))
            except RemotingError as exc:
                error = f"{addr}: {exc}"
                routes.forget_master(broker, addr)
                last = addr
                continue
            if resp.code == ResponseCode.NOT_MASTER:
                hint = resp.header_str(B.MASTER_ADDR, "")
                error = f"{addr} is not {broker}'s master"
                if hint and hint != addr:
                    routes.note_master(broker, hint)
                else:
                    routes.forget_master(broker, addr)
                    await asyncio.sleep(NO_MASTER_PAUSE_S)
                last = addr
                continue
            return resp
        raise BackendError("PROXY_TIMEOUT", f"broker group {broker!r} answered no call: {error}")


def _position(m: Message) -> int:
    """A popped message's commit-log position (from its offset message id), -1 if unknown."""
    if m.physical_offset >= 0:
        return m.physical_offset
    try:
        return parse_offset_msg_id(m.msg_id or m.offset_msg_id)[1]
    except MessageFormatError:
        return -1


def _java_hash(text: str) -> int:
    """A non-negative, process-independent hash of a message group (Java's String.hashCode)."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h


#: remoting answers -> v2 status codes (RocketMQ 5's proxy maps them so)
_CODES = {
    int(ResponseCode.TOPIC_NOT_EXIST): "TOPIC_NOT_FOUND",
    int(ResponseCode.NO_PERMISSION): "FORBIDDEN",
    int(ResponseCode.SYSTEM_BUSY): "TOO_MANY_REQUESTS",
    int(ResponseCode.POLLING_FULL): "TOO_MANY_REQUESTS",
    int(ResponseCode.SUBSCRIPTION_PARSE_FAILED): "ILLEGAL_FILTER_EXPRESSION",
    int(ResponseCode.MESSAGE_ILLEGAL): "BAD_REQUEST",
    int(ResponseCode.INVALID_PARAMETER): "BAD_REQUEST",
    int(ResponseCode.REQUEST_CODE_NOT_SUPPORTED): "NOT_IMPLEMENTED",
}


def _code_of(code: int, *, handle: bool = False) -> str:
    """The v2 status code for a broker's refusal; NO_MESSAGE on a handle means it is stale or expired."""
    if handle and code in (ResponseCode.NO_MESSAGE, ResponseCode.INVALID_PARAMETER):
        return "INVALID_RECEIPT_HANDLE"
    return _CODES.get(int(code), "INTERNAL_SERVER_ERROR")
