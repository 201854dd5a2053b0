"""Producer: RocketMQ's send API on a DLedger-style broker group.

The Producer checks and stamps messages and builds each request once (batch bodies with
RocketMQ's batch encoding, reused across retries); what happens to a request after that (queue and
master choice, retries, backoff, what each failure means) is ``client.send_attempts``. A sync
send tries ``1 + retries`` times within ``send_timeout_s`` in total.

Hot-path notes: no task per message (async sends complete from the response callback and
only a retry spawns a task), one header dict per request. Heartbeats (every 30 s to each
master the route cache knows, as RocketMQ's MQClientInstance sends them) run in their own task
and add nothing to a send.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

import client.broker_api as B
from client.errors import BrokerError, ClientStateError, MessageInvalidError
from client.instance import ClientInstance
from client.message_props import PROPERTY_DELAY, PROPERTY_TIMER_DELIVER_MS
from client.route import MessageQueue
from client.send_attempts import (
    BatchSendResult,
    Parse,
    SendAttempts,
    SendCallback,
    SendResult,
    batch_result,
    message_result,
)
from remoting.codes import RequestCode
from remoting.exceptions import RemotingError
from remoting.message import (
    PROPERTY_UNIQ_KEY,
    Message,
    MessageFormatError,
    UniqueIdGenerator,
    encode_message_batch,
    properties_to_bytes,
)
from remoting.protocol import HeaderValue, RemotingCommand
from remoting.topic import topic_name_error

log = logging.getLogger("client.producer")
R = TypeVar("R")

DEFAULT_SEND_TIMEOUT_S = 3.0
DEFAULT_RETRIES = 2
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_CHECKED_TOPICS = 1024
"""Valid topic names a producer remembers having checked (cleared when full)."""
DEFAULT_HEARTBEAT_INTERVAL_S = 30.0
"""RocketMQ's heartbeatBrokerInterval; the first heartbeat goes 1 s after start."""
UNREGISTER_TIMEOUT_S = 1.0
_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND_BATCH = int(RequestCode.SEND_BATCH_MESSAGE)
_DEFAULT_TOPIC_QUEUES = str(B.DEFAULT_TOPIC_QUEUES)
_BATCH_PROPERTIES = "WAIT\x01true\x02"
"""A Java MessageBatch's own properties: waitStoreMsgOK, the default (every message waits)."""


_UNIQ = PROPERTY_UNIQ_KEY
_DELAY = PROPERTY_DELAY
_TIMER = PROPERTY_TIMER_DELIVER_MS


class Producer:
    """Sends messages to topics; async API (``await start()``, ``await send(msg)``, ``await shutdown()``).

    Every message gets a RocketMQ unique id (its UNIQ_KEY property), which the broker group
    de-duplicates on, so a retry within one send is stored at most once. ``idempotent=True``
    also keeps a message's key (and this producer's id and a sequence number) on the Message
    object, so resending the same object after SendOutcomeUnknownError is de-duplicated too,
    and makes retries after an unknown outcome safe.
    """

    def __init__(
        self,
        group: str,
        namesrv_addrs: str | Sequence[str] | None = None,
        *,
        idempotent: bool = False,
        send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        retries_async: int | None = None,
        retry_backoff_s: float = 0.05,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_async_in_flight: int = 20_000,
        producer_id: str | None = None,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        instance: ClientInstance | None = None,
    ) -> None:
        """``heartbeat_interval_s``: how often the producer names its group to every master it
        knows (a broker sends CHECK_TRANSACTION_STATE only to a connection that did)."""
        if not group or not isinstance(group, str):
            raise ValueError("producer group must be a non-empty string")
        if retries < 0 or send_timeout_s <= 0 or max_async_in_flight < 1 or heartbeat_interval_s <= 0:
            raise ValueError(
                "retries must be >= 0, send_timeout_s and heartbeat_interval_s > 0, max_async_in_flight >= 1"
            )
        self.group = group
        self.idempotent = idempotent
        self.send_timeout_s = send_timeout_s
        self.retries = retries
        self.retries_async = retries if retries_async is None else retries_async
        self.retry_backoff_s = retry_backoff_s
        self.max_message_bytes = max_message_bytes
        self.max_async_in_flight = max_async_in_flight
        # A fresh id per producer object: sequence numbers restart at 1, so an id must never be reused.
        self.producer_id = producer_id or f"{group}-{uuid.uuid4().hex}"
        self._seq = itertools.count(1)
        self._unique_ids = UniqueIdGenerator()
        self._own_instance = instance is None
        self.instance = instance or ClientInstance(namesrv_addrs, name=f"producer-{group}")
        self._running = False
        self._async_slots: asyncio.Semaphore | None = None
        self._async_in_flight = 0
        self._async_idle: asyncio.Event | None = None
        self._retry_tasks: set[asyncio.Task[Any]] = set()
        self._checked_topics: set[str] = set()  # valid topic names seen (checked once, not per message)
        self.heartbeat_interval_s = heartbeat_interval_s
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._heartbeated: set[str] = set()  # masters that took a heartbeat (told at shutdown)

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.instance.closed:
            raise ClientStateError("producer was shut down; create a new one")
        self._async_slots = asyncio.Semaphore(self.max_async_in_flight)
        self._async_idle = asyncio.Event()
        self._async_idle.set()
        self._running = True
        if self._heartbeat_task is None:
            self._heartbeat_task = asyncio.get_running_loop().create_task(
                self._heartbeat_loop(), name=f"producer-heartbeat-{self.group}"
            )

    async def shutdown(self, grace_s: float = 3.0) -> None:
        """Stop accepting sends, give async sends ``grace_s`` to complete, close connections we own."""
        if not self._running and self.instance.closed:
            return
        self._running = False
        if self._async_idle is not None and self._async_in_flight:
            try:
                await asyncio.wait_for(self._async_idle.wait(), grace_s)
            except TimeoutError:
                log.warning("shutdown with async sends in flight", extra={"in_flight": self._async_in_flight})
        for task in list(self._retry_tasks):
            task.cancel()
        if self._retry_tasks:
            await asyncio.gather(*self._retry_tasks, return_exceptions=True)
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            await asyncio.gather(self._heartbeat_task, return_exceptions=True)
            self._heartbeat_task = None
        await self._unregister()
        if self._own_instance:
            await self.instance.close()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def _check_running(self) -> None:
        if not self._running:
            raise ClientStateError(f"producer {self.group} is not running; call start() first")

    # --- heartbeats ------------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        await asyncio.sleep(min(1.0, self.heartbeat_interval_s))
        while self._running:
            try:
                await self.heartbeat()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a heartbeat must never end the loop
                log.warning("producer heartbeat failed", extra={"group": self.group, "error": str(exc)})
            await asyncio.sleep(self.heartbeat_interval_s)

    def _master_addrs(self) -> list[str]:
        routes = self.instance.routes
        return sorted({a for name in routes.broker_names() if (a := routes.master_addr(name))})

    async def heartbeat(self, addrs: Sequence[str] | None = None) -> list[str]:
        """Name this producer group to ``addrs`` (default: every master the route cache knows);
        returns the addresses that took it. Failures are logged, not raised."""
        targets = self._master_addrs() if addrs is None else list(addrs)
        if not targets:
            return []
        body = B.heartbeat_doc(self.instance.client_id, [], [self.group])

        async def one(addr: str) -> str | None:
            try:
                await B.call(
                    self.instance.remoting,
                    addr,
                    RequestCode.HEART_BEAT,
                    body=body,
                    timeout_s=self.send_timeout_s,
                    what="producer heartbeat",
                )
            except (RemotingError, BrokerError) as exc:
                log.debug("producer heartbeat failed", extra={"broker": addr, "error": str(exc)})
                return None
            self._heartbeated.add(addr)
            return addr

        return [a for a in await asyncio.gather(*(one(a) for a in targets)) if a is not None]

    async def _unregister(self) -> None:
        """UNREGISTER_CLIENT with this producer group to the masters that took its heartbeats
        (RocketMQ's unregisterProducer), so they stop choosing this connection for checks."""
        addrs, self._heartbeated = sorted(self._heartbeated), set()
        if not addrs or self.instance.closed:
            return
        headers: dict[str, HeaderValue] = {B.CLIENT_ID: self.instance.client_id, B.PRODUCER_GROUP: self.group}

        async def one(addr: str) -> None:
            try:
                await self.instance.remoting.invoke_sync(
                    addr,
                    RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, headers),
                    UNREGISTER_TIMEOUT_S,
                )
            except RemotingError:
                pass

        await asyncio.gather(*(one(a) for a in addrs))

    async def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        """The writable queues of ``topic`` (refreshing the route), e.g. to pick queues per key."""
        return list((await self.instance.routes.publish_info(topic, force=True)).queues)

    # --- message preparation ----------------------------------------------------------------------
    def _check(self, msg: Message) -> None:
        if not isinstance(msg, Message):
            raise MessageInvalidError(f"expected a remoting.message.Message, got {type(msg).__name__}")
        topic = msg.topic
        if topic.__class__ is not str or topic not in self._checked_topics:
            problem = topic_name_error(topic)
            if problem:
                raise MessageInvalidError(f"message topic: {problem}")
            if len(self._checked_topics) >= MAX_CHECKED_TOPICS:
                self._checked_topics.clear()
            self._checked_topics.add(topic)
        body = msg.body
        if not isinstance(body, bytes | bytearray | memoryview):
            raise MessageInvalidError(f"message body must be bytes, got {type(body).__name__}")
        if not body:
            raise MessageInvalidError("message body is empty")
        if len(body) > self.max_message_bytes:
            raise MessageInvalidError(
                f"message body is {len(body)} bytes, over the {self.max_message_bytes}-byte limit"
            )

    def _stamp(self, msg: Message, now_ms: int) -> None:
        """Give the message its UNIQ_KEY (idempotent: once, with a (producer id, seq); a resent
        object keeps them, so it is de-duplicated; otherwise a new key per send)."""
        if self.idempotent:
            if msg.producer_id != self.producer_id or msg.seq <= 0 or PROPERTY_UNIQ_KEY not in msg.properties:
                msg.producer_id = self.producer_id
                msg.seq = next(self._seq)
                msg.born_ms = now_ms
                msg.properties[PROPERTY_UNIQ_KEY] = self._unique_ids.next(now_ms)
            elif not msg.born_ms:
                msg.born_ms = now_ms
        else:
            msg.born_ms = now_ms
            msg.properties[PROPERTY_UNIQ_KEY] = self._unique_ids.next(now_ms)

    @staticmethod
    def _props(msg: Message) -> bytes:
        if msg.tags is None and not msg.keys and len(msg.properties) == 1:
            key = msg.properties.get(PROPERTY_UNIQ_KEY)  # the common case: nothing but the id
            if key is not None and key.isalnum():
                return b"UNIQ_KEY\x01" + key.encode() + b"\x02"
        try:
            return properties_to_bytes(msg.all_properties())
        except MessageFormatError as exc:
            raise MessageInvalidError(str(exc)) from None

    @staticmethod
    def _props_text(msg: Message) -> str:
        """The properties as the header's string (the common case built as text, not re-decoded)."""
        if msg.tags is None and not msg.keys and len(msg.properties) == 1:
            key = msg.properties.get(PROPERTY_UNIQ_KEY)
            if key is not None and key.isalnum():
                return "UNIQ_KEY\x01" + key + "\x02"
        try:
            return properties_to_bytes(msg.all_properties()).decode()
        except MessageFormatError as exc:
            raise MessageInvalidError(str(exc)) from None

    def _message_request(self, msg: Message) -> RemotingCommand:
        self._check(msg)
        self._stamp(msg, int(time.time() * 1000))
        # SEND_MESSAGE_V2 with every field a Java 4.9 producer sends, in its order, so an Apache
        # broker takes it as it is (maxReconsumeTimes only goes with retry topics). Booleans
        # and constants as strings: the binary encoder writes those without a conversion.
        headers: dict[str, HeaderValue] = {
            B.V2_PRODUCER_GROUP: self.group,
            B.V2_TOPIC: msg.topic,
            B.V2_DEFAULT_TOPIC: B.DEFAULT_TOPIC_NAME,
            B.V2_DEFAULT_TOPIC_QUEUE_NUMS: _DEFAULT_TOPIC_QUEUES,
            B.V2_QUEUE_ID: 0,
            B.V2_SYS_FLAG: "0",
            B.V2_BORN_TIMESTAMP: msg.born_ms,
            B.V2_FLAG: msg.flag or "0",  # the usual 0 as text: a repeated field costs least
            B.V2_PROPERTIES: self._props_text(msg),
            B.V2_RECONSUME_TIMES: "0",
            B.V2_UNIT_MODE: B.JAVA_FALSE,
            B.V2_BATCH: B.JAVA_FALSE,
        }
        return RemotingCommand(_SEND_V2, headers, bytes(msg.body))

    def _attempts(
        self,
        topic: str,
        request: RemotingCommand,
        parse: Parse[R],
        timeout_s: float | None,
        retries: int,
        queue: MessageQueue | None,
        queue_id: int | None,
    ) -> SendAttempts[R]:
        return SendAttempts(
            self.instance.routes,
            self.instance.remoting,
            topic,
            request,
            parse,
            idempotent=self.idempotent,
            timeout_s=self.send_timeout_s if timeout_s is None else timeout_s,
            max_attempts=1 + retries,
            backoff_s=self.retry_backoff_s,
            queue=queue,
            queue_id=queue_id,
        )

    # --- sync -------------------------------------------------------------------------------------------
    async def send(
        self,
        msg: Message,
        queue_id: int | None = None,
        *,
        queue: MessageQueue | None = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        """Send and wait until the broker group has committed it (or raise a SendError).

        ``queue`` pins the send (and its retries) to one queue; ``queue_id`` picks that id on
        any group having it. SendOutcomeUnknownError means it may have been stored.

        Idempotent producers: sending the same Message object again reuses its (producer id,
        seq), so the group stores it at most once; set ``msg.seq = 0`` to send it as a new message.
        """
        self._check_running()
        request = self._message_request(msg)
        parse = message_result(msg, self.idempotent)
        return await self._attempts(msg.topic, request, parse, timeout_s, self.retries, queue, queue_id).run()

    async def send_retry_copy(
        self, msg: Message, reconsume_times: int, max_reconsume_times: int, *, timeout_s: float | None = None
    ) -> SendResult:
        """Send ``msg`` (a copy addressed to ``%RETRY%<group>``) with the send header's
        reconsumeTimes and maxReconsumeTimes, as RocketMQ's producer sends a retry topic's message
        (it moves RECONSUME_TIME and MAX_RECONSUME_TIMES from the properties into the header):
        the broker stores it in the dead-letter topic once ``reconsume_times`` reaches the maximum.
        What a consumer falls back to when CONSUMER_SEND_MSG_BACK fails."""
        self._check_running()
        request = self._message_request(msg)
        request.headers[B.V2_RECONSUME_TIMES] = str(reconsume_times)
        request.headers[B.V2_MAX_RECONSUME_TIMES] = str(max_reconsume_times)
        parse = message_result(msg, self.idempotent)
        return await self._attempts(msg.topic, request, parse, timeout_s, self.retries, None, None).run()

    # --- batch -------------------------------------------------------------------------------------------
    async def send_batch(
        self,
        msgs: Sequence[Message],
        queue_id: int | None = None,
        *,
        queue: MessageQueue | None = None,
        timeout_s: float | None = None,
    ) -> BatchSendResult:
        """Send messages of one topic as one request to one queue; they get consecutive offsets.

        All or nothing from the broker's side: one answer covers the whole batch.
        """
        self._check_running()
        request = self._batch_request(msgs)
        parse = batch_result(msgs)
        topic = str(request.headers[B.V2_TOPIC])
        return await self._attempts(topic, request, parse, timeout_s, self.retries, queue, queue_id).run()

    def _batch_request(self, msgs: Sequence[Message]) -> RemotingCommand:
        """The SEND_BATCH_MESSAGE request of ``msgs`` (checked and stamped), built once for all tries."""
        if not msgs:
            raise MessageInvalidError("batch is empty")
        first = msgs[0]
        self._check(first)
        topic = first.topic
        now_ms = int(time.time() * 1000)
        items: list[tuple[int, bytes, bytes]] = []
        append = items.append
        stamp, props = self._stamp, self._props
        limit_msg = self.max_message_bytes
        # New ids for the whole batch at once, unless the producer keeps ids across resends.
        ids = iter(()) if self.idempotent else iter(self._unique_ids.many(len(msgs), now_ms))
        # The topic was checked once above; per message only what can differ (kept cheap: this
        # loop runs for every message at tens of thousands a second).
        for m in msgs:
            if m.__class__ is not Message or m.topic != topic:
                if isinstance(m, Message) and m.topic != topic:
                    raise MessageInvalidError(f"a batch goes to one topic; got {topic!r} and {m.topic!r}")
                self._check(m)
            body = m.body
            if body.__class__ is not bytes or not body or len(body) > limit_msg:
                self._check(m)
                body = bytes(body)
            mp = m.properties
            key = next(ids, None)
            if key is not None and m.tags is None and not m.keys and (not mp or len(mp) == 1 and _UNIQ in mp):
                # The common message, nothing but its new id: (what _stamp and _props do, inline)
                m.born_ms = now_ms
                mp[_UNIQ] = key
                append((m.flag, body, b"UNIQ_KEY\x01" + key.encode() + b"\x02"))
                continue
            if _DELAY in mp or _TIMER in mp:  # (the common message above never gets here)
                raise MessageInvalidError(
                    f"batch message {len(items)} asks for a delayed delivery ({_DELAY} or {_TIMER}): "
                    "RocketMQ does not delay messages of a batch; send it on its own"
                )
            if key is not None:
                m.born_ms = now_ms
                mp[_UNIQ] = key
            else:
                stamp(m, now_ms)
            append((m.flag, body, props(m)))
        body = encode_message_batch(items)
        limit = self.instance.remoting.config.max_body_bytes
        if len(body) > limit:
            raise MessageInvalidError(
                f"batch of {len(msgs)} messages is {len(body)} bytes, over the {limit}-byte request limit; split it"
            )
        # What a Java 4.9 producer sends with a batch, except the batch's own UNIQ_KEY: brokers
        # that merge batch properties into each message would give every message that one key.
        headers: dict[str, HeaderValue] = {
            B.V2_PRODUCER_GROUP: self.group,
            B.V2_TOPIC: topic,
            B.V2_DEFAULT_TOPIC: B.DEFAULT_TOPIC_NAME,
            B.V2_DEFAULT_TOPIC_QUEUE_NUMS: _DEFAULT_TOPIC_QUEUES,
            B.V2_QUEUE_ID: 0,
            B.V2_SYS_FLAG: "0",
            B.V2_BORN_TIMESTAMP: now_ms,
            B.V2_FLAG: "0",
            B.V2_PROPERTIES: _BATCH_PROPERTIES,
            B.V2_RECONSUME_TIMES: "0",
            B.V2_UNIT_MODE: B.JAVA_FALSE,
            B.V2_BATCH: B.JAVA_TRUE,
        }
        return RemotingCommand(_SEND_BATCH, headers, body)

    # --- async ------------------------------------------------------------------------------------------
    async def send_async(
        self,
        msg: Message,
        callback: SendCallback,
        queue_id: int | None = None,
        *,
        queue: MessageQueue | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Write the message and return; ``callback(result, error)`` runs once when it is settled.

        Raises only for an invalid message or a producer that is not running; every other
        failure goes to the callback. Waits when ``max_async_in_flight`` sends are unanswered.
        """
        self._check_running()
        request = self._message_request(msg)
        parse = message_result(msg, self.idempotent)
        send = self._attempts(msg.topic, request, parse, timeout_s, self.retries_async, queue, queue_id)
        slots = self._async_slots
        assert slots is not None and self._async_idle is not None
        await slots.acquire()
        self._async_in_flight += 1
        self._async_idle.clear()
        done = False

        def finish(result: SendResult | None, error: BaseException | None) -> None:
            nonlocal done
            if done:
                return
            done = True
            slots.release()
            self._async_in_flight -= 1
            if not self._async_in_flight and self._async_idle is not None:
                self._async_idle.set()
            try:
                callback(result, error)
            except Exception:
                log.exception("send callback raised", extra={"topic": msg.topic})

        await send.start(finish, self._retry_tasks)

    # --- oneway ------------------------------------------------------------------------------------------
    async def send_oneway(
        self, msg: Message, queue_id: int | None = None, *, queue: MessageQueue | None = None
    ) -> None:
        """Fire and forget: no answer, no retry, so no way to know whether it was stored.

        Raises route errors (no nameserver, no route) and SendFailedError when it could not be written.
        """
        self._check_running()
        request = self._message_request(msg)
        send = self._attempts(msg.topic, request, lambda *a: None, None, 0, queue, queue_id)
        await send.oneway(self.send_timeout_s)
