"""``apache.rocketmq.v2.MessagingService``: each RPC checked, turned into ledgermq calls
(``proxy.backend``) and answered with RocketMQ 5's status codes.

Every refusal is a status in the answer, as RocketMQ's proxy gives it (the 5.x clients read
``status.code``): a bad request gets its specific code (ILLEGAL_TOPIC, INVALID_RECEIPT_HANDLE,
MESSAGE_BODY_TOO_LARGE, ...), an unreachable group PROXY_TIMEOUT, anything unexpected
INTERNAL_SERVER_ERROR with the reason logged, never a traceback to the client. RPCs the proxy
does not serve (PullMessage, offsets, RecallMessage, lite topics) answer gRPC UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from broker.meta import MAX_INVISIBLE_MS
from client.errors import MessageInvalidError, SendError, SendFailedError, SendOutcomeUnknownError
from client.send_attempts import SendStatus
from remoting.acl import PUB, SUB, Account
from remoting.message import Message
from remoting.topic import topic_name_error

from .auth import Authenticator, AuthError
from .backend import Backend, BackendError
from .convert import BadRequest, TxRef, parse_handle, parse_tx, to_remoting, to_v2
from .protocol import pb, sgrpc, spb

log = logging.getLogger("proxy.service")
T = TypeVar("T")

#: messages one ReceiveMessage may ask for (the broker's POP bound)
MAX_RECEIVE_BATCH = 32
MIN_INVISIBLE_MS = 1_000
DEFAULT_INVISIBLE_MS = 30_000
DEFAULT_LONG_POLL_MS = 20_000
#: the longest long poll a ReceiveMessage may ask for (RocketMQ 5 proxy's grpcClientConsumerMaxLongPollingTimeoutMillis)
MAX_LONG_POLL_MS = 30_000
#: what the client's own deadline must leave the proxy to answer a long poll in
LONG_POLL_ANSWER_MS = 1_000
#: messages one SendMessage may carry, and entries one AckMessage
MAX_SEND_BATCH = 64
MAX_ACK_ENTRIES = 1024
#: commands (settings answers, orphaned-transaction checks) a Telemetry stream may have unsent
MAX_TELEMETRY_OUTBOX = 64
#: producers' Telemetry streams kept for orphaned-transaction checks
MAX_PRODUCER_STREAMS = 10_000
#: RocketMQ's retry delays (1s 5s 10s 30s 1m .. 10m 20m 30m 1h 2h), the waits before redeliveries
RETRY_DELAYS_S = (1, 5, 10, 30, *(60 * m for m in range(1, 11)), 1200, 1800, 3600, 7200)
#: deliveries a consumer is told a message gets before it is a dead letter: a broker's POP
#: delivers a message once and ``max_reconsume_times`` times more (default 16), then stores it
#: in %DLQ%
DEFAULT_MAX_DELIVERY_ATTEMPTS = 17
GROUP_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789%_-")
MAX_GROUP_CHARS = 255
ACCEPTED_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION")


@dataclass(frozen=True)
class ServiceConfig:
    """What the proxy tells clients and how large a message may be."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS
    advertised: str = ""  # host:port put in routes when a request names none
    #: consumer groups that consume in order (RocketMQ 5's FIFO groups: orderly POP on the brokers)
    fifo_groups: frozenset[str] = frozenset()


def _status(code: str = "OK", message: str = "OK") -> Any:
    return pb.Status(code=pb.Code.Value(code), message=message[:1000])


def _group_error(name: str) -> str:
    if not name:
        return "the consumer group is empty"
    if len(name) > MAX_GROUP_CHARS or not set(name) <= GROUP_CHARS:
        return f"consumer group {name[:60]!r}: 1..{MAX_GROUP_CHARS} of letters, digits, %, _ and -"
    return ""


def _ms(duration: Any) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


def _answer(response_type: Any) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Turn what a unary RPC raises into its answer's status: BadRequest and BackendError with
    their codes, AuthError UNAUTHORIZED/FORBIDDEN, anything else INTERNAL_SERVER_ERROR (logged)."""

    def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def rpc(self: MessagingService, request: Any, context: Any) -> Any:
            if request is None:
                return response_type(status=_status("BAD_REQUEST", MALFORMED))
            try:
                account = self.auth.check(context.invocation_metadata())
                return await fn(self, request, context, account)
            except (BadRequest, BackendError, AuthError) as exc:
                return response_type(status=_status(exc.code, str(exc)))
            except Exception as exc:  # noqa: BLE001 - an answer, never a traceback to the client
                log.exception("%s failed", fn.__name__)
                return response_type(status=_status("INTERNAL_SERVER_ERROR", f"{type(exc).__name__}: {exc}"))

        return rpc

    return wrap


class MessagingService(sgrpc.MessagingServiceServicer):
    """The RPCs RocketMQ 5's clients use; the rest answer UNIMPLEMENTED (the generated base)."""

    def __init__(self, backend: Backend, config: ServiceConfig, auth: Authenticator) -> None:
        self.backend = backend
        self.config = config
        self.auth = auth
        #: open Telemetry streams of producers: their outbox -> the topics they publish
        self.producers: dict[asyncio.Queue[Any], frozenset[str]] = {}
        self.orphans_dropped = 0
        backend.on_check = self.recover_orphan

    def recover_orphan(self, msg: Message, tx: TxRef) -> None:
        """A broker asks about a half message no EndTransaction settled: ask a producer that
        publishes its topic (over its Telemetry stream) to check it; it answers EndTransaction
        from SOURCE_SERVER_CHECK. None connected: the broker asks again later."""
        streams = [q for q, topics in self.producers.items() if msg.topic in topics] or list(self.producers)
        if not streams:
            self.orphans_dropped += 1
            return
        outbox = streams[self.orphans_dropped % len(streams)]
        command = spb.RecoverOrphanedTransactionCommand(
            message=to_v2(msg, pb, "", 0), transaction_id=tx.text()
        )
        try:
            outbox.put_nowait(spb.TelemetryCommand(recover_orphaned_transaction_command=command))
        except asyncio.QueueFull:
            self.orphans_dropped += 1

    # --- routes ---------------------------------------------------------------------------------
    def _endpoints(self, request_endpoints: Any) -> Any:
        """Where clients reach this proxy: the address they used, else the advertised one."""
        if request_endpoints.addresses:
            return request_endpoints
        host, _, port = self.config.advertised.rpartition(":")
        out = pb.Endpoints(scheme=pb.AddressScheme.IPv4)
        out.addresses.add(host=host, port=int(port))
        return out

    def _topic(self, resource: Any) -> str:
        problem = topic_name_error(resource.name)
        if problem:
            raise BadRequest("ILLEGAL_TOPIC", f"topic: {problem}")
        return resource.name

    def _group(self, resource: Any) -> str:
        problem = _group_error(resource.name)
        if problem:
            raise BadRequest("ILLEGAL_CONSUMER_GROUP", problem)
        return resource.name

    @_answer(spb.QueryRouteResponse)
    async def QueryRoute(self, request: Any, context: Any, account: Account | None) -> Any:
        """Every queue of the topic, each on its broker group reached through this proxy (cluster mode)."""
        topic = self._topic(request.topic)
        route = await self.backend.route(topic)
        endpoints = self._endpoints(request.endpoints)
        named = {bd.broker_name for bd in route.broker_datas if bd.broker_addrs}
        out = spb.QueryRouteResponse(status=_status())
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            if qd.broker_name not in named:
                continue
            broker = pb.Broker(name=qd.broker_name, id=0, endpoints=endpoints)
            for qid in range(max(qd.read_queue_nums, qd.write_queue_nums)):
                readable = qid < qd.read_queue_nums and qd.perm & 4
                writable = qid < qd.write_queue_nums and qd.perm & 2
                perm = (
                    "READ_WRITE"
                    if readable and writable
                    else "READ"
                    if readable
                    else "WRITE"
                    if writable
                    else "NONE"
                )
                mq = out.message_queues.add(id=qid, permission=pb.Permission.Value(perm), broker=broker)
                mq.topic.CopyFrom(request.topic)
                mq.accept_message_types.extend(pb.MessageType.Value(t) for t in ACCEPTED_TYPES)
        if not out.message_queues:
            return spb.QueryRouteResponse(
                status=_status("TOPIC_NOT_FOUND", f"no broker group serves {topic!r}")
            )
        return out

    @_answer(spb.QueryAssignmentResponse)
    async def QueryAssignment(self, request: Any, context: Any, account: Account | None) -> Any:
        """For push consumers: one assignment per readable broker group (its every queue, as a POP
        of queue -1 takes them), as RocketMQ 5's proxy assigns."""
        topic = self._topic(request.topic)
        self._group(request.group)
        route = await self.backend.route(topic)
        endpoints = self._endpoints(request.endpoints)
        out = spb.QueryAssignmentResponse(status=_status())
        named = {bd.broker_name for bd in route.broker_datas if bd.broker_addrs}
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            if qd.broker_name in named and qd.read_queue_nums > 0 and qd.perm & 4:
                broker = pb.Broker(name=qd.broker_name, id=0, endpoints=endpoints)
                mq = pb.MessageQueue(id=-1, permission=pb.Permission.READ_WRITE, broker=broker)
                mq.topic.CopyFrom(request.topic)
                mq.accept_message_types.extend(pb.MessageType.Value(t) for t in ACCEPTED_TYPES)
                out.assignments.add(message_queue=mq)
        if not out.assignments:
            return spb.QueryAssignmentResponse(
                status=_status("TOPIC_NOT_FOUND", f"no readable queue of {topic!r}")
            )
        return out

    # --- clients --------------------------------------------------------------------------------
    @_answer(spb.HeartbeatResponse)
    async def Heartbeat(self, request: Any, context: Any, account: Account | None) -> Any:
        if request.HasField("group") and request.group.name:
            self._group(request.group)
        return spb.HeartbeatResponse(status=_status())

    @_answer(spb.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: Any, context: Any, account: Account | None) -> Any:
        return spb.NotifyClientTerminationResponse(status=_status())

    def settings_for(self, theirs: Any) -> Any:
        """The server's settings for a client's: its own, with the proxy's limits and retry policy."""
        out = pb.Settings()
        out.CopyFrom(theirs)
        out.metric.on = False
        out.metric.ClearField("endpoints")
        backoff = out.backoff_policy
        backoff.Clear()
        if theirs.HasField("subscription"):
            # a failed message waits RocketMQ's retry delays before its next delivery (what
            # RocketMQ 5's proxy tells push consumers; they take only a customized backoff)
            backoff.max_attempts = self.config.max_delivery_attempts
            for seconds in RETRY_DELAYS_S:
                backoff.customized_backoff.next.add().FromSeconds(seconds)
            sub = out.subscription
            sub.fifo = sub.group.name in self.config.fifo_groups
            sub.receive_batch_size = MAX_RECEIVE_BATCH
            if not sub.HasField("long_polling_timeout"):
                sub.long_polling_timeout.FromMilliseconds(DEFAULT_LONG_POLL_MS)
        else:
            backoff.max_attempts = 3
            backoff.exponential_backoff.initial.FromMilliseconds(10)
            backoff.exponential_backoff.max.FromMilliseconds(1000)
            backoff.exponential_backoff.multiplier = 2
            out.publishing.max_body_size = self.config.max_body_bytes
            out.publishing.validate_message_type = True
        return out

    async def Telemetry(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        """The settings handshake: each settings command is answered with the server's settings
        (a 5.x producer or consumer waits for them before it starts)."""
        try:
            self.auth.check(context.invocation_metadata())
        except AuthError as exc:
            yield spb.TelemetryCommand(status=_status(exc.code, str(exc)))
            return
        outbox: asyncio.Queue[Any] = asyncio.Queue(MAX_TELEMETRY_OUTBOX)

        async def read() -> None:
            try:
                async for cmd in request_iterator:
                    if cmd is None:
                        await outbox.put(spb.TelemetryCommand(status=_status("BAD_REQUEST", MALFORMED)))
                    elif cmd.HasField("settings"):
                        answer = spb.TelemetryCommand(
                            status=_status(), settings=self.settings_for(cmd.settings)
                        )
                        await outbox.put(answer)
                        theirs = cmd.settings
                        if theirs.client_type == pb.ClientType.PRODUCER and (
                            outbox in self.producers or len(self.producers) < MAX_PRODUCER_STREAMS
                        ):
                            self.producers[outbox] = frozenset(t.name for t in theirs.publishing.topics)
            except Exception as exc:  # noqa: BLE001 - the client went away
                log.debug("telemetry stream ended: %s", exc)
            finally:
                await outbox.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await outbox.get()) is not None:
                yield item
        finally:
            self.producers.pop(outbox, None)
            reader.cancel()

    # --- sends ----------------------------------------------------------------------------------
    @_answer(spb.SendMessageResponse)
    async def SendMessage(self, request: Any, context: Any, account: Account | None) -> Any:
        if not request.messages:
            raise BadRequest("BAD_REQUEST", "no message to send")
        if len(request.messages) > MAX_SEND_BATCH:
            raise BadRequest("BAD_REQUEST", f"at most {MAX_SEND_BATCH} messages per SendMessage")
        out = spb.SendMessageResponse()
        first_error: Any = None
        now_ms = int(time.time() * 1000)
        for msg in request.messages:
            entry = out.entries.add()
            try:
                topic = self._topic(msg.topic)
                self.auth.allow_topic(account, topic, PUB)
                await self.backend.route(topic)  # an unknown topic: TOPIC_NOT_FOUND, not auto-created
                outgoing = to_remoting(msg, self.config.max_body_bytes, now_ms, pb.MessageType)
                entry.message_id = msg.system_properties.message_id
                if outgoing.kind == "TRANSACTION":
                    result, tx = await self.backend.send_half(outgoing.message)
                    entry.transaction_id = tx.text()
                else:
                    result = await self.backend.send(outgoing.message, outgoing.group)
                entry.offset = result.queue_offset
                entry.status.CopyFrom(_send_status(result.status))
            except (BadRequest, BackendError, AuthError) as exc:
                entry.status.CopyFrom(_status(exc.code, str(exc)))
            except MessageInvalidError as exc:
                entry.status.CopyFrom(_status("BAD_REQUEST", str(exc)))
            except (SendOutcomeUnknownError, SendFailedError, SendError) as exc:
                entry.status.CopyFrom(_status("PROXY_TIMEOUT", str(exc)))
            if entry.status.code != pb.Code.OK and first_error is None:
                first_error = entry.status
        out.status.CopyFrom(first_error if first_error is not None else _status())
        return out

    @_answer(spb.EndTransactionResponse)
    async def EndTransaction(self, request: Any, context: Any, account: Account | None) -> Any:
        topic = self._topic(request.topic)
        self.auth.allow_topic(account, topic, PUB)
        tx = parse_tx(request.transaction_id)
        resolution = pb.TransactionResolution.Name(request.resolution)
        if resolution not in ("COMMIT", "ROLLBACK"):
            raise BadRequest(
                "BAD_REQUEST", f"transaction resolution must be COMMIT or ROLLBACK, got {resolution}"
            )
        from_check = request.source == pb.TransactionSource.SOURCE_SERVER_CHECK
        await self.backend.end_transaction(tx, topic, request.message_id, resolution == "COMMIT", from_check)
        return spb.EndTransactionResponse(status=_status())

    # --- consumption ----------------------------------------------------------------------------
    def _receive_args(self, request: Any, context: Any) -> tuple[str, str, int, int, int, str, str]:
        group = self._group(request.group)
        topic = self._topic(request.message_queue.topic)
        batch = request.batch_size or 1
        if not 0 < batch <= MAX_RECEIVE_BATCH:
            raise BadRequest("BAD_REQUEST", f"batch_size must be 1..{MAX_RECEIVE_BATCH}, got {batch}")
        invisible = (
            _ms(request.invisible_duration)
            if request.HasField("invisible_duration")
            else DEFAULT_INVISIBLE_MS
        )
        if not MIN_INVISIBLE_MS <= invisible <= MAX_INVISIBLE_MS:
            raise BadRequest(
                "ILLEGAL_INVISIBLE_TIME",
                f"invisible duration must be {MIN_INVISIBLE_MS}..{MAX_INVISIBLE_MS} ms",
            )
        poll = (
            _ms(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else DEFAULT_LONG_POLL_MS
        )
        if not 0 <= poll <= MAX_LONG_POLL_MS:
            raise BadRequest("ILLEGAL_POLLING_TIME", f"long polling timeout must be 0..{MAX_LONG_POLL_MS} ms")
        left = context.time_remaining()
        if left is not None:
            poll = max(0, min(poll, int(left * 1000) - LONG_POLL_ANSWER_MS))
        kind = (
            pb.FilterType.Name(request.filter_expression.type)
            if request.HasField("filter_expression")
            else "TAG"
        )
        exp = request.filter_expression.expression.strip() or "*"
        if kind == "SQL":
            kind = "SQL92"
        elif kind in ("TAG", "FILTER_TYPE_UNSPECIFIED"):
            kind = "TAG"
        return group, topic, batch, invisible, poll, kind, exp

    async def _broker_for(self, request: Any, topic: str) -> str:
        name = request.message_queue.broker.name
        route = await self.backend.route(topic)
        names = sorted(q.broker_name for q in route.queue_datas if q.read_queue_nums > 0)
        if not names:
            raise BackendError("TOPIC_NOT_FOUND", f"no readable queue of {topic!r}")
        if not name:
            return names[int(time.monotonic() * 1000) % len(names)]
        if name not in names:
            raise BadRequest(
                "BAD_REQUEST", f"broker group {name[:60]!r} serves no readable queue of {topic!r}"
            )
        return name

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """POP from the named broker group's queues of the topic, held up to the long polling
        timeout: a status, the delivery timestamp, then each message with its receipt handle."""
        try:
            if request is None:
                raise BadRequest("BAD_REQUEST", MALFORMED)
            account = self.auth.check(context.invocation_metadata())
            group, topic, batch, invisible, poll, kind, exp = self._receive_args(request, context)
            self.auth.allow_topic(account, topic, SUB)
            self.auth.allow_group(account, group)
            broker = await self._broker_for(request, topic)
            popped = await self.backend.pop(
                broker,
                group,
                topic,
                max_nums=batch,
                invisible_ms=invisible,
                poll_ms=poll,
                exp_type=kind,
                exp=exp,
                order=group in self.config.fifo_groups,
            )
        except (BadRequest, BackendError, AuthError) as exc:
            yield spb.ReceiveMessageResponse(status=_status(exc.code, str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - an answer, never a traceback to the client
            log.exception("ReceiveMessage failed")
            yield spb.ReceiveMessageResponse(
                status=_status("INTERNAL_SERVER_ERROR", f"{type(exc).__name__}: {exc}")
            )
            return
        if not popped.messages:
            yield spb.ReceiveMessageResponse(status=_status("MESSAGE_NOT_FOUND", "no new message"))
            return
        yield spb.ReceiveMessageResponse(status=_status())
        # when the proxy hands them over (RocketMQ 5's proxy sends it; push consumers require it)
        delivered = spb.ReceiveMessageResponse()
        delivered.delivery_timestamp.FromMilliseconds(int(time.time() * 1000))
        yield delivered
        for m, handle in popped.messages:
            yield spb.ReceiveMessageResponse(message=to_v2(m, pb, handle.text(), popped.invisible_ms))

    @_answer(spb.AckMessageResponse)
    async def AckMessage(self, request: Any, context: Any, account: Account | None) -> Any:
        group = self._group(request.group)
        topic = self._topic(request.topic)
        self.auth.allow_topic(account, topic, SUB)
        self.auth.allow_group(account, group)
        if not request.entries or len(request.entries) > MAX_ACK_ENTRIES:
            raise BadRequest("BAD_REQUEST", f"an ack names 1..{MAX_ACK_ENTRIES} entries")
        out = spb.AckMessageResponse()

        async def one(entry: Any) -> Any:
            result = spb.AckMessageResultEntry(
                message_id=entry.message_id, receipt_handle=entry.receipt_handle
            )
            try:
                await self.backend.ack(group, topic, parse_handle(entry.receipt_handle))
                result.status.CopyFrom(_status())
            except (BadRequest, BackendError) as exc:
                result.status.CopyFrom(_status(exc.code, str(exc)))
            return result

        results = await asyncio.gather(*(one(e) for e in request.entries))
        out.entries.extend(results)
        codes = {r.status.code for r in results}
        if codes == {pb.Code.OK}:
            out.status.CopyFrom(_status())
        elif len(results) == 1:
            out.status.CopyFrom(results[0].status)
        else:
            out.status.CopyFrom(_status("MULTIPLE_RESULTS", "some entries were not acked: see each entry"))
        return out

    @_answer(spb.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request: Any, context: Any, account: Account | None) -> Any:
        group = self._group(request.group)
        topic = self._topic(request.topic)
        self.auth.allow_topic(account, topic, SUB)
        self.auth.allow_group(account, group)
        invisible = _ms(request.invisible_duration)
        if not MIN_INVISIBLE_MS <= invisible <= MAX_INVISIBLE_MS:
            raise BadRequest(
                "ILLEGAL_INVISIBLE_TIME",
                f"invisible duration must be {MIN_INVISIBLE_MS}..{MAX_INVISIBLE_MS} ms",
            )
        handle = await self.backend.change_invisible(
            group, topic, parse_handle(request.receipt_handle), invisible
        )
        return spb.ChangeInvisibleDurationResponse(status=_status(), receipt_handle=handle.text())

    @_answer(spb.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(
        self, request: Any, context: Any, account: Account | None
    ) -> Any:
        """A consumer gave up on a message (its delivery attempts spent): store it in the
        group's dead-letter topic ``%DLQ%<group>`` and ack it."""
        group = self._group(request.group)
        topic = self._topic(request.topic)
        self.auth.allow_topic(account, topic, SUB)
        self.auth.allow_group(account, group)
        handle = parse_handle(request.receipt_handle)
        attempts = max(request.max_delivery_attempts, 1)
        await self.backend.to_dead_letters(group, topic, handle, request.message_id, attempts)
        return spb.ForwardMessageToDeadLetterQueueResponse(status=_status())


#: RPCs of the v2 service the proxy does not serve: answered UNIMPLEMENTED, saying why
NOT_SERVED = {
    "PullMessage": "pull consumers with offsets are not served; use a simple or push consumer",
    "UpdateOffset": "offsets of pull consumers are not served",
    "GetOffset": "offsets of pull consumers are not served",
    "QueryOffset": "offsets of pull consumers are not served",
    "RecallMessage": "recalling a delayed message is not supported",
    "SyncLiteSubscription": "lite topics are not supported",
}


def _not_served(name: str, why: str) -> Callable[..., Awaitable[None]]:
    async def rpc(self: MessagingService, request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name}: {why}")

    rpc.__name__ = name
    return rpc


for _name, _why in NOT_SERVED.items():
    setattr(MessagingService, _name, _not_served(_name, _why))


def _send_status(status: SendStatus) -> Any:
    if status is SendStatus.SEND_OK:
        return _status()
    if status is SendStatus.FLUSH_DISK_TIMEOUT:
        return _status(
            "MASTER_PERSISTENCE_TIMEOUT", "stored, but its flush to disk was not confirmed in time"
        )
    return _status(
        "SLAVE_PERSISTENCE_TIMEOUT", f"stored, but not confirmed on a replica in time ({status.value})"
    )


MALFORMED = "the request is not a valid protobuf message of its type"


def _tolerant(cls: Any) -> Callable[[bytes], Any]:
    """A request deserializer that gives None for bytes that do not parse, so the RPC answers
    BAD_REQUEST itself (gRPC would log the parse error with a traceback and answer UNKNOWN)."""

    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError:
            return None

    return parse


def add_to_server(server: grpc.aio.Server, service: MessagingService) -> None:
    """Every RPC of the service description, with tolerant request parsing."""
    desc = spb.DESCRIPTOR.services_by_name["MessagingService"]
    handlers = {}
    for method in desc.methods:
        request_cls = getattr(spb, method.input_type.name, None) or getattr(pb, method.input_type.name)
        response_cls = getattr(spb, method.output_type.name, None) or getattr(pb, method.output_type.name)
        kind = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = kind(
            getattr(service, method.name),
            request_deserializer=_tolerant(request_cls),
            response_serializer=response_cls.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(desc.full_name, handlers),))
