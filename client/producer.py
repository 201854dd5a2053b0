"""Producer: RocketMQ's send path on a DLedger-style broker group.

Per send: find the topic's publish info (cached route, refreshed from a nameserver), pick a
queue round-robin avoiding the broker group that just failed, send to its master. A sync send
tries ``1 + retries`` times within ``send_timeout_s`` in total; NOT_MASTER with a ``masterAddr``
goes straight to the new master.

What may be retried depends on what the failure says about the message:
- certainly not stored (never sent, NOT_MASTER, SERVICE_NOT_AVAILABLE, SYSTEM_BUSY...): retry,
  on another group when there is one;
- maybe stored (timeout or lost connection after sending, REPLICATION_TIMEOUT, SYSTEM_ERROR):
  a plain producer stops and raises SendOutcomeUnknownError; an idempotent producer retries
  with the same (producer id, seq) to the same group and queue, because only that group's
  de-duplication table can recognise the first attempt.

Hot-path notes: no task per message (async sends complete from the response callback and
only a retry spawns a task), one header dict per request, batch bodies built once with
``encode_batch`` and reused across retries.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from client import broker_api as B
from client.broker_api import NotSentError, invoke_tracked, invoke_tracked_async, invoke_tracked_oneway
from client.errors import (
    ClientError,
    ClientStateError,
    MessageInvalidError,
    NoBrokerAvailableError,
    SendFailedError,
    SendOutcomeUnknownError,
)
from client.instance import ClientInstance
from client.route import MessageQueue
from client.send_attempts import BatchSendResult, SendAttempts, SendCallback, SendResult, SendStatus
from remoting.codes import RequestCode
from remoting.exceptions import (
    FrameEncodeError,
    RemotingCommandError,
    RemotingError,
)
from remoting.jsonbody import Fields, load_body
from remoting.message import Message, encode_batch, encode_properties, make_msg_id, make_position
from remoting.protocol import HeaderValue, RemotingCommand
from remoting.topic import topic_name_error

log = logging.getLogger("client.producer")
R = TypeVar("R")

DEFAULT_SEND_TIMEOUT_S = 3.0
DEFAULT_RETRIES = 2
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Retries during a master switch back off exponentially, but not beyond 0.1 s: a group
# elects a new master in about half a second, and a longer sleep holds sends back after it
# is ready (with a 1 s cap, a switch done at 630 ms was first seen by the producer at 1.26 s).
# Each retry without a master costs one route lookup, which a nameserver answers in microseconds.
MAX_BACKOFF_S = 0.1


class Producer:
    """Sends messages to topics; async API (``await start()``, ``await send(msg)``, ``await shutdown()``).

    ``idempotent=True`` stamps each message with this producer's id and a sequence number
    (kept on the Message object, so resending the same object after SendOutcomeUnknownError is
    de-duplicated too) and makes retries after an unknown outcome safe.
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
        instance: ClientInstance | None = None,
    ) -> None:
        if not group or not isinstance(group, str):
            raise ValueError("producer group must be a non-empty string")
        if retries < 0 or send_timeout_s <= 0 or max_async_in_flight < 1:
            raise ValueError("retries must be >= 0, send_timeout_s > 0 and max_async_in_flight >= 1")
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
        self._own_instance = instance is None
        self.instance = instance or ClientInstance(namesrv_addrs, name=f"producer-{group}")
        self._running = False
        self._async_slots: asyncio.Semaphore | None = None
        self._async_in_flight = 0
        self._async_idle: asyncio.Event | None = None
        self._retry_tasks: set[asyncio.Task[Any]] = set()

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.instance.closed:
            raise ClientStateError("producer was shut down; create a new one")
        self._async_slots = asyncio.Semaphore(self.max_async_in_flight)
        self._async_idle = asyncio.Event()
        self._async_idle.set()
        self._running = True

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

    async def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        """The writable queues of ``topic`` (refreshing the route), e.g. to pick queues per key."""
        return list((await self.instance.routes.publish_info(topic, force=True)).queues)

    # --- message preparation ----------------------------------------------------------------------
    def _check(self, msg: Message) -> None:
        if not isinstance(msg, Message):
            raise MessageInvalidError(f"expected a remoting.message.Message, got {type(msg).__name__}")
        problem = topic_name_error(msg.topic)
        if problem:
            raise MessageInvalidError(f"message topic: {problem}")
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
        """Give the message its (producer id, seq) once; a resent object keeps them, so it is de-duplicated."""
        if self.idempotent:
            if msg.producer_id != self.producer_id or msg.seq <= 0:
                msg.producer_id = self.producer_id
                msg.seq = next(self._seq)
                msg.born_ms = now_ms
            elif not msg.born_ms:
                msg.born_ms = now_ms
        else:
            msg.born_ms = now_ms

    @staticmethod
    def _props(msg: Message) -> bytes:
        if not (msg.properties or msg.tags or msg.keys):
            return b""
        return encode_properties(msg.all_properties())

    def _message_request(self, msg: Message) -> RemotingCommand:
        self._check(msg)
        self._stamp(msg, int(time.time() * 1000))
        headers: dict[str, HeaderValue] = {
            B.PRODUCER_GROUP: self.group,
            B.TOPIC: msg.topic,
            B.QUEUE_ID: 0,
            B.BORN_TIMESTAMP: msg.born_ms,
            B.FLAG: msg.flag,
            B.PROPERTIES: self._props(msg).decode(),
        }
        if self.idempotent:
            headers[B.PRODUCER_ID] = self.producer_id
            headers[B.SEQ] = msg.seq
        return RemotingCommand(int(RequestCode.SEND_MESSAGE), headers, bytes(msg.body))

    def _parse_send(self, msg: Message) -> Callable[[RemotingCommand, MessageQueue, str, int], SendResult]:
        def parse(response: RemotingCommand, mq: MessageQueue, addr: str, tries: int) -> SendResult:
            h = response.headers
            try:
                index = response.header_int(B.LEDGER_INDEX, -1)
                result = SendResult(
                    SendStatus.SEND_OK,
                    str(h.get(B.MSG_ID) or (make_msg_id(mq.broker_name, make_position(index)) if index >= 0 else "")),
                    response.header_int(B.QUEUE_ID, mq.queue_id),
                    response.header_int(B.QUEUE_OFFSET, -1),
                    response.header_bool(B.DUPLICATE, False),
                    mq.broker_name,
                    index,
                    addr,
                    msg.producer_id if self.idempotent else "",
                    msg.seq if self.idempotent else 0,
                    tries,
                )
            except RemotingCommandError as exc:  # stored, but the answer is odd: say so, do not fail it
                log.warning("malformed send response", extra={"broker": addr, "error": str(exc)})
                result = SendResult(SendStatus.SEND_OK, "", mq.queue_id, -1, False, mq.broker_name, -1, addr)
            msg.queue_id = result.queue_id
            msg.queue_offset = result.queue_offset
            msg.ledger_index = result.ledger_index
            msg.msg_id = result.msg_id
            return result

        return parse

    # --- the retry engine ---------------------------------------------------------------------------
    def _new_send(
        self,
        topic: str,
        request: RemotingCommand,
        parse: Callable[[RemotingCommand, MessageQueue, str, int], R],
        timeout_s: float | None,
        retries: int,
        queue: MessageQueue | None,
        queue_id: int | None,
    ) -> SendAttempts[R]:
        if queue is not None and queue.topic != topic:
            raise MessageInvalidError(f"queue {queue} is not a queue of topic {topic}")
        return SendAttempts(
            self.instance.routes,
            self.idempotent,
            topic,
            request,
            parse,
            self.send_timeout_s if timeout_s is None else timeout_s,
            1 + retries,
            queue,
            queue_id,
        )

    async def _choose(self, send: SendAttempts[Any]) -> tuple[MessageQueue, str]:
        """Queue and master address for the next attempt (RocketMQ's selectOneMessageQueue)."""
        routes = self.instance.routes
        publish = await routes.publish_info(send.topic, force=send.refresh)
        send.refresh = False
        if send.pinned is not None:
            mq = send.pinned
        elif send.queue_id is not None:
            mq = publish.select_by_queue_id(send.queue_id)
        else:
            mq = publish.select_queue(send.avoid_broker)
        addr = routes.master_addr(mq.broker_name)
        if addr is None:
            raise NoBrokerAvailableError(f"broker group {mq.broker_name} has no master at the moment")
        return mq, addr

    async def _pause(self, send: SendAttempts[Any]) -> None:
        """Back off before retrying a group that is electing or busy, unless another group can take it."""
        if not send.wait:
            return
        send.wait = False
        if send.pinned is None and send.avoid_broker is not None:
            publish = self.instance.routes.cached_publish_info(send.topic)
            if publish is not None and len(publish.broker_names()) > 1:
                return  # the next attempt goes to another group: no reason to wait
        delay = min(self.retry_backoff_s * (2**send.backoffs), MAX_BACKOFF_S, max(send.remaining, 0))
        send.backoffs += 1
        if delay > 0:
            await asyncio.sleep(delay)

    async def _run(self, send: SendAttempts[R]) -> R:
        """Attempts until success, a definite failure with no tries left, or an unknown outcome we may not retry."""
        remoting = self.instance.remoting
        while True:
            if send.exhausted():
                raise send.final_error()
            await self._pause(send)
            if send.remaining <= 0:
                raise send.final_error()
            try:
                mq, addr = await self._choose(send)
            except ClientError as exc:
                send.no_route(exc)
                continue
            send.mq, send.addr = mq, addr
            send.attempts += 1
            send.tried.append(f"{mq.broker_name}@{addr}")
            send.request.headers[B.QUEUE_ID] = mq.queue_id
            try:
                response = await invoke_tracked(remoting, addr, send.request, send.remaining)
            except NotSentError as exc:
                send.not_sent(exc)
                continue
            except RemotingError as exc:
                send.lost(exc)
                continue
            result = send.answered(response)
            if result is not None:
                return result

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
        send = self._new_send(
            msg.topic, request, self._parse_send(msg), timeout_s, self.retries, queue, queue_id
        )
        return await self._run(send)

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
        if not msgs:
            raise MessageInvalidError("batch is empty")
        first = msgs[0]
        self._check(first)
        topic = first.topic
        now_ms = int(time.time() * 1000)
        items: list[tuple[int, int, int, bytes, bytes]] = []
        append = items.append
        stamp, props = self._stamp, self._props
        idempotent, limit_msg = self.idempotent, self.max_message_bytes
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
            stamp(m, now_ms)
            append((m.flag, m.born_ms, m.seq if idempotent else 0, props(m), body))
        body = encode_batch(items)
        limit = self.instance.remoting.config.max_body_bytes
        if len(body) > limit:
            raise MessageInvalidError(
                f"batch of {len(msgs)} messages is {len(body)} bytes, over the {limit}-byte request limit; split it"
            )
        headers: dict[str, HeaderValue] = {B.PRODUCER_GROUP: self.group, B.TOPIC: topic, B.QUEUE_ID: 0}
        if self.idempotent:
            headers[B.PRODUCER_ID] = self.producer_id
        request = RemotingCommand(int(RequestCode.SEND_BATCH_MESSAGE), headers, body)
        n = len(msgs)

        def parse(response: RemotingCommand, mq: MessageQueue, addr: str, tries: int) -> BatchSendResult:
            result = BatchSendResult(
                SendStatus.SEND_OK, mq.broker_name, mq.queue_id, broker_addr=addr, tries=tries
            )
            try:
                f = Fields(load_body(response.body, "batch send response"), "batch send response")
                result.queue_id = f.get_int("queueId", mq.queue_id)
                result.offsets = [int(o) for o in f.get_list("offsets", [])]
                result.msg_ids = [str(i) for i in f.get_list("msgIds", [])]
                result.duplicates = f.get_int("duplicates", 0)
            except (RemotingCommandError, TypeError, ValueError) as exc:
                log.warning("malformed batch send response", extra={"broker": addr, "error": str(exc)})
                return result
            if len(result.offsets) == n:
                for i, m in enumerate(msgs):
                    m.queue_id = result.queue_id
                    m.queue_offset = result.offsets[i]
                    if len(result.msg_ids) == n:
                        m.msg_id = result.msg_ids[i]
            return result

        send = self._new_send(topic, request, parse, timeout_s, self.retries, queue, queue_id)
        return await self._run(send)

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
        send = self._new_send(
            msg.topic, request, self._parse_send(msg), timeout_s, self.retries_async, queue, queue_id
        )
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

        def retry_in_task() -> None:
            task = asyncio.ensure_future(self._run(send))
            self._retry_tasks.add(task)

            def settled(t: asyncio.Task[SendResult]) -> None:
                self._retry_tasks.discard(t)
                if t.cancelled():
                    # Shut down mid-retry: an attempt may have been in flight, so do not claim "not stored".
                    finish(
                        None,
                        SendOutcomeUnknownError(
                            f"send to topic {send.topic} was cancelled by shutdown during a retry; "
                            f"it may or may not have been stored (tries: {send.tried})",
                            topic=send.topic,
                            tries=send.attempts,
                            brokers=send.tried,
                        ),
                    )
                elif t.exception() is not None:
                    finish(None, t.exception())
                else:
                    finish(t.result(), None)

            task.add_done_callback(settled)

        def on_response(response: RemotingCommand | None, error: BaseException | None) -> None:
            try:
                if response is not None:
                    result = send.answered(response)
                    if result is not None:
                        finish(result, None)
                        return
                else:
                    send.lost(error if isinstance(error, RemotingError) else RemotingError(str(error)))
            except Exception as exc:  # the engine gave up
                finish(None, exc)
                return
            retry_in_task()

        try:
            try:
                mq, addr = await self._choose(send)
            except ClientError as exc:
                send.no_route(exc)  # raises if there is no point in retrying
                retry_in_task()
                return
            send.mq, send.addr = mq, addr
            send.attempts = 1
            send.tried.append(f"{mq.broker_name}@{addr}")
            request.headers[B.QUEUE_ID] = mq.queue_id
            try:
                await invoke_tracked_async(self.instance.remoting, addr, request, send.remaining, on_response)
            except NotSentError as exc:
                send.not_sent(exc)  # raises for a message that can never be sent
                retry_in_task()
        except ClientError as exc:
            finish(None, exc)
        except BaseException as exc:  # cancelled while writing: still settle the callback once
            finish(None, exc)
            raise

    # --- oneway ------------------------------------------------------------------------------------------
    async def send_oneway(
        self, msg: Message, queue_id: int | None = None, *, queue: MessageQueue | None = None
    ) -> None:
        """Fire and forget: no answer, no retry, so no way to know whether it was stored.

        Raises route errors (no nameserver, no route) and SendFailedError when it could not be written.
        """
        self._check_running()
        request = self._message_request(msg)
        send = self._new_send(msg.topic, request, lambda *a: None, None, 0, queue, queue_id)
        mq, addr = await self._choose(send)
        request.headers[B.QUEUE_ID] = mq.queue_id
        try:
            await invoke_tracked_oneway(self.instance.remoting, addr, request, self.send_timeout_s)
        except NotSentError as exc:
            if isinstance(exc.cause, FrameEncodeError):
                raise MessageInvalidError(f"cannot send to topic {msg.topic}: {exc.cause}") from None
            self.instance.routes.forget_master(mq.broker_name, addr)
            raise SendFailedError(
                f"oneway send to broker {mq.broker_name}@{addr} failed: {exc.cause}",
                topic=msg.topic,
                tries=1,
                brokers=[f"{mq.broker_name}@{addr}"],
            ) from None
