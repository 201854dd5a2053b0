"""One logical send, from its first attempt to its result: the producer's retry state machine.

Everything a send does after the Producer has built its request is here, in one place:
choosing a queue and its master (RocketMQ's selectOneMessageQueue, avoiding the group that
just failed), backing off while a group elects, sending, and deciding what each answer means:
- certainly not stored (never sent, NOT_MASTER, SERVICE_NOT_AVAILABLE, SYSTEM_BUSY...): retry,
  on another group when there is one; NOT_MASTER with a ``masterAddr`` goes straight there;
- maybe stored (timeout or lost connection after sending, REPLICATION_TIMEOUT, SYSTEM_ERROR):
  a plain producer stops with SendOutcomeUnknownError; an idempotent one retries with the same
  UNIQ_KEY on the same group and queue, because only that group's de-duplication
  table can recognise the first attempt;
- certainly not stored and bound to fail again (MESSAGE_ILLEGAL...): stop with SendFailedError.
``run`` drives it to the end (sync sends, batches); ``start`` makes the first attempt from a
response callback, with no task per message, and only a retry runs ``run`` in a task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

import client.broker_api as B
from client.broker_api import NotSentError, invoke_tracked, invoke_tracked_async, invoke_tracked_oneway
from client.errors import (
    ClientError,
    MessageInvalidError,
    NoBrokerAvailableError,
    NoNameServerError,
    RouteNotFoundError,
    SendError,
    SendFailedError,
    SendOutcomeUnknownError,
)
from client.route import MessageQueue, RouteTable, TopicPublishInfo
from remoting.client import RemotingClient
from remoting.codes import ResponseCode, response_code_name
from remoting.exceptions import (
    FrameEncodeError,
    RemotingCommandError,
    RemotingConnectionClosedError,
    RemotingError,
)
from remoting.jsonbody import Fields, load_body
from remoting.message import Message
from remoting.protocol import RemotingCommand

log = logging.getLogger("client.producer")

# Retries during a master switch back off exponentially, but not beyond 0.1 s: a group
# elects a new master in about half a second, and a longer sleep holds sends back after it
# is ready (with a 1 s cap, a switch done at 630 ms was first seen by the producer at 1.26 s).
# Each retry without a master costs one route lookup, which a nameserver answers in microseconds.
MAX_BACKOFF_S = 0.1
# A group's new leader applies what was committed before it serves as master; meanwhile it
# answers NOT_MASTER naming itself; a slave that knows no leader yet answers
# SERVICE_NOT_AVAILABLE. Both last tens of milliseconds: ask again after this, growing by it
# with each such answer, rather than after the election-sized back-off.
SWITCH_RETRY_S = 0.005
# Answers that only point elsewhere (a slave naming the master, a leader about to become
# master) store nothing and cost one round trip: up to this many of them per send do not count
# as tries. A bound, so brokers pointing at each other cannot keep a send going.
MAX_FREE_REDIRECTS = 8
# Asking a slave where its master is takes a small pull that only a master may answer
# (``requireMaster``), not the message itself: a full batch (up to 128 KiB) sent to a slave
# only to be refused cost the group's new leader CPU just while it was taking over.
ASK_GROUP = "ledgermq-master-lookup"
ASK_TIMEOUT_S = 1.0
# A pull's answers when the broker served it (found, not found, offset moved, retry).
SERVED_PULL_CODES = frozenset(
    {
        ResponseCode.SUCCESS,
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
        ResponseCode.PULL_OFFSET_MOVED,
    }
)


class SendStatus(Enum):
    """RocketMQ's send statuses: anything but SEND_OK means the master stored the message but
    could not confirm its flush to disk or its copy on a slave in time (it may still be lost
    if the master fails now)."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(slots=True)
class SendResult:
    """Where one message was stored. ``msg_id`` is RocketMQ's offset message id (the one
    VIEW_MESSAGE_BY_ID resolves); ``duplicate``: an earlier attempt with the same UNIQ_KEY had
    stored it."""

    status: SendStatus
    msg_id: str
    queue_id: int
    queue_offset: int
    duplicate: bool = False
    broker_name: str = ""
    ledger_index: int = -1
    broker_addr: str = ""
    producer_id: str = ""
    seq: int = 0
    tries: int = 1


@dataclass(slots=True)
class BatchSendResult:
    """Where a batch was stored: one queue, consecutive offsets in message order."""

    status: SendStatus
    broker_name: str
    queue_id: int
    offsets: list[int] = field(default_factory=list)
    msg_ids: list[str] = field(default_factory=list)
    duplicates: int = 0
    broker_addr: str = ""
    tries: int = 1


SendCallback = Callable[[SendResult | None, BaseException | None], None]
"""Called once per send_async with (result, None) or (None, error); errors follow the send rules."""

R = TypeVar("R")
Parse = Callable[[RemotingCommand, MessageQueue, str, int], R]
"""(SUCCESS response, queue, broker address, tries) -> the send's result."""

# Response codes that certainly mean "not stored" and are worth another try, and whether to
# back off before it (the group is busy or electing) and re-read the route.
RETRY_CODES: dict[int, tuple[bool, bool]] = {
    ResponseCode.NOT_MASTER: (True, True),
    ResponseCode.SERVICE_NOT_AVAILABLE: (True, True),
    ResponseCode.SYSTEM_BUSY: (True, False),
    ResponseCode.TOPIC_NOT_EXIST: (False, True),
    ResponseCode.NO_PERMISSION: (False, True),
    ResponseCode.BODY_CRC_MISMATCH: (False, False),
}
# Codes with which a RocketMQ master answers a send it STORED without confirming its flush or
# replication: a result with that status, not an error and not a retry (a retry would store
# the message twice), as RocketMQ's own client returns them.
STORED_CODES: dict[int, SendStatus] = {
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
# Codes that certainly mean "not stored" and would fail the same way again.
FATAL_CODES = frozenset(
    {
        ResponseCode.MESSAGE_ILLEGAL,
        ResponseCode.BAD_REQUEST,
        ResponseCode.FRAME_TOO_LARGE,
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        ResponseCode.VERSION_NOT_SUPPORTED,
    }
)
# Anything else that is not SUCCESS (REPLICATION_TIMEOUT, SYSTEM_ERROR, codes we do not know)
# may have been stored: treated as outcome unknown.


# --- results ----------------------------------------------------------------------------------------
def message_result(msg: Message, idempotent: bool) -> Parse[SendResult]:
    """How a SEND_MESSAGE answer becomes a SendResult (and fills in the message's stored fields)."""

    def parse(response: RemotingCommand, mq: MessageQueue, addr: str, tries: int) -> SendResult:
        h = response.headers
        try:
            index = response.header_int(B.LEDGER_INDEX, -1)
            result = SendResult(
                SendStatus.SEND_OK,
                str(h.get(B.MSG_ID) or ""),  # RocketMQ's offset message id (store host + position)
                response.header_int(B.QUEUE_ID, mq.queue_id),
                response.header_int(B.QUEUE_OFFSET, -1),
                response.header_bool(B.DUPLICATE, False),
                mq.broker_name,
                index,
                addr,
                msg.producer_id if idempotent else "",
                msg.seq if idempotent else 0,
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


def batch_result(msgs: Sequence[Message]) -> Parse[BatchSendResult]:
    """How a SEND_BATCH_MESSAGE answer becomes a BatchSendResult (and fills in the messages)."""
    n = len(msgs)

    def parse(response: RemotingCommand, mq: MessageQueue, addr: str, tries: int) -> BatchSendResult:
        result = BatchSendResult(
            SendStatus.SEND_OK, mq.broker_name, mq.queue_id, broker_addr=addr, tries=tries
        )
        try:
            # RocketMQ's answer: the first offset and the message ids, comma separated
            result.queue_id = response.header_int(B.QUEUE_ID, mq.queue_id)
            ids = response.header_str(B.MSG_ID, "")
            result.msg_ids = ids.split(",") if ids else []
            if response.body:  # a ledgermq broker whose de-duplication left gaps: every offset
                f = Fields(load_body(response.body, "batch send response"), "batch send response")
                result.queue_id = f.get_int("queueId", result.queue_id)
                result.offsets = [int(o) for o in f.get_list("offsets", [])]
                result.duplicates = f.get_int("duplicates", 0)
            else:
                first = response.header_int(B.QUEUE_OFFSET, -1)
                result.offsets = list(range(first, first + n)) if first >= 0 else []
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

    return parse


# --- the state machine -----------------------------------------------------------------------------
class SendAttempts(Generic[R]):
    """One logical send across its attempts; ``run`` or ``start`` drives it to its result or error."""

    __slots__ = (
        "routes",
        "remoting",
        "idempotent",
        "topic",
        "request",
        "parse",
        "deadline",
        "max_attempts",
        "backoff_s",
        "attempts",
        "tried",
        "unknown",
        "last_error",
        "last_code",
        "avoid_broker",
        "pinned",
        "queue_id",
        "refresh",
        "backoffs",
        "wait",
        "mq",
        "addr",
        "queue_header",
        "redirects",
        "asking",
        "switching",
        "pending",
    )

    def __init__(
        self,
        routes: RouteTable,
        remoting: RemotingClient,
        topic: str,
        request: RemotingCommand,
        parse: Parse[R],
        *,
        idempotent: bool,
        timeout_s: float,
        max_attempts: int,
        backoff_s: float,
        queue: MessageQueue | None = None,
        queue_id: int | None = None,
    ) -> None:
        if queue is not None and queue.topic != topic:
            raise MessageInvalidError(f"queue {queue} is not a queue of topic {topic}")
        self.routes = routes
        self.remoting = remoting
        self.idempotent = idempotent
        self.topic = topic
        self.request = request
        self.parse = parse
        self.deadline = time.monotonic() + timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.attempts = 0
        self.tried: list[str] = []
        self.unknown = False
        self.last_error: BaseException | None = None
        self.last_code: int | None = None
        self.avoid_broker: str | None = None
        self.pinned = queue
        self.queue_id = queue_id
        self.refresh = False
        self.backoffs = 0
        self.wait = False
        self.mq: MessageQueue | None = None
        self.addr = ""
        self.queue_header = B.queue_id_header(request.code)  # "e" in V2 headers
        self.redirects = 0  # answers that only named the master (not counted as tries)
        self.asking = False  # this attempt went to a slave, to learn the master
        self.switching = False  # the last answer said a master is coming: pause briefly
        # A leader still applying its backlog before it serves as master: asked (a small pull)
        # until it serves, not sent the whole request again each time
        self.pending = ""

    @property
    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def exhausted(self) -> bool:
        return self.attempts - self.redirects >= self.max_attempts or self.remaining <= 0

    # --- driving it ---------------------------------------------------------------------------------
    async def run(self) -> R:
        """Attempts until success, a definite failure with no tries left, or an unknown outcome we may not retry."""
        while True:
            if self.exhausted():
                raise self.final_error()
            if self.wait:
                await self._pause()
                if self.remaining <= 0:
                    raise self.final_error()
            try:
                addr = self._next_attempt_now() or await self._next_attempt()
            except ClientError as exc:
                self.no_route(exc)
                continue
            if self.asking:
                await self._ask(addr)
                continue
            try:
                response = await invoke_tracked(self.remoting, addr, self.request, self.remaining)
            except NotSentError as exc:
                self.not_sent(exc)
                continue
            except RemotingError as exc:
                self.lost(exc)
                continue
            result = self.answered(response)
            if result is not None:
                return result

    async def start(
        self, settle: Callable[[R | None, BaseException | None], None], tasks: set[asyncio.Task[Any]]
    ) -> None:
        """The first attempt, answered from the response callback; a retry continues in a task (kept in ``tasks``).

        ``settle(result, error)`` is called exactly once, also when the send is cancelled.
        """

        def retry_in_task() -> None:
            self._retry_in_task(settle, tasks)

        def on_response(response: RemotingCommand | None, error: BaseException | None) -> None:
            try:
                if response is not None:
                    result = self.answered(response)
                    if result is not None:
                        settle(result, None)
                        return
                else:
                    self.lost(error if isinstance(error, RemotingError) else RemotingError(str(error)))
            except Exception as exc:  # the state machine gave up
                settle(None, exc)
                return
            retry_in_task()

        try:
            try:
                addr = self._next_attempt_now() or await self._next_attempt()
            except ClientError as exc:
                self.no_route(exc)  # raises if there is no point in retrying
                retry_in_task()
                return
            if self.asking:  # no master known: ``run`` asks a slave first (this choice not counted)
                self.attempts -= 1
                self.tried.pop()
                retry_in_task()
                return
            try:
                await invoke_tracked_async(self.remoting, addr, self.request, self.remaining, on_response)
            except NotSentError as exc:
                self.not_sent(exc)  # raises for a message that can never be sent
                retry_in_task()
        except ClientError as exc:
            settle(None, exc)
        except BaseException as exc:  # cancelled while writing: still settle once
            settle(None, exc)
            raise

    def _retry_in_task(
        self, settle: Callable[[R | None, BaseException | None], None], tasks: set[asyncio.Task[Any]]
    ) -> None:
        """Continue an async send with ``run`` in a task; its end settles the send."""
        task = asyncio.ensure_future(self.run())
        tasks.add(task)

        def settled(t: asyncio.Task[R]) -> None:
            tasks.discard(t)
            if t.cancelled():
                # Shut down mid-retry: an attempt may have been in flight, so do not claim "not stored".
                settle(
                    None,
                    SendOutcomeUnknownError(
                        f"send to topic {self.topic} was cancelled by shutdown during a retry; "
                        f"it may or may not have been stored (tries: {self.tried})",
                        topic=self.topic,
                        tries=self.attempts,
                        brokers=self.tried,
                    ),
                )
            elif t.exception() is not None:
                settle(None, t.exception())
            else:
                settle(t.result(), None)

        task.add_done_callback(settled)

    async def oneway(self, timeout_s: float) -> None:
        """One attempt without an answer: raises route errors and SendFailedError if it could not be written."""
        mq, addr = await self._choose()
        self.request.headers[self.queue_header] = mq.queue_id
        try:
            await invoke_tracked_oneway(self.remoting, addr, self.request, timeout_s)
        except NotSentError as exc:
            if isinstance(exc.cause, FrameEncodeError):
                raise MessageInvalidError(f"cannot send to topic {self.topic}: {exc.cause}") from None
            self.routes.forget_master(mq.broker_name, addr)
            raise SendFailedError(
                f"oneway send to broker {mq.broker_name}@{addr} failed: {exc.cause}",
                topic=self.topic,
                tries=1,
                brokers=[f"{mq.broker_name}@{addr}"],
            ) from None

    def _next_attempt_now(self) -> str:
        """``_next_attempt`` without awaiting, when the topic's route is cached and fresh (nearly
        every send: an unbatched send's coroutine chain was a tenth of a producer's CPU);
        '' when the route must be fetched first."""
        if self.refresh:
            return ""
        publish = self.routes.fresh_publish_info(self.topic)
        if publish is None:
            return ""
        return self._attempt_at(*self._pick(publish))

    async def _next_attempt(self) -> str:
        """Choose where the next attempt goes and count it; returns the master's address."""
        return self._attempt_at(*(await self._choose()))

    def _attempt_at(self, mq: MessageQueue, addr: str) -> str:
        self.mq, self.addr = mq, addr
        self.attempts += 1
        self.tried.append(f"{mq.broker_name}@{addr}")
        self.request.headers[self.queue_header] = mq.queue_id
        return addr

    async def _choose(self) -> tuple[MessageQueue, str]:
        """Queue and master address for the next attempt (RocketMQ's selectOneMessageQueue)."""
        publish = await self.routes.publish_info(self.topic, force=self.refresh)
        self.refresh = False
        return self._pick(publish)

    def _pick(self, publish: TopicPublishInfo) -> tuple[MessageQueue, str]:
        if self.pinned is not None:
            mq = self.pinned
        elif self.queue_id is not None:
            mq = publish.select_by_queue_id(self.queue_id)
        else:
            mq = publish.select_queue(self.avoid_broker)
        addr = self.routes.master_addr(mq.broker_name)
        pending = self.pending
        if pending and (addr is None or addr == pending):
            self.asking = True
            return mq, pending
        self.asking = addr is None
        if addr is None:  # master dead or unknown: a slave knows the new one before the nameservers
            # another member than the one just asked, else that one again (a group listed with
            # one slave: it answers SERVICE_NOT_AVAILABLE until it knows the new leader)
            addr = self.routes.member_to_ask(mq.broker_name, self.addr) or self.routes.member_to_ask(
                mq.broker_name
            )
            if addr is None:
                raise NoBrokerAvailableError(f"broker group {mq.broker_name} has no master at the moment")
        return mq, addr

    async def _pause(self) -> None:
        """Back off before retrying a group that is electing or busy, unless another group can take it."""
        if not self.wait:
            return
        self.wait = False
        if self.switching:  # a master is being elected or is about to serve: a short pause
            self.switching = False
            await asyncio.sleep(min(SWITCH_RETRY_S * self.redirects, max(self.remaining, 0)))
            return
        if self.pinned is None and self.avoid_broker is not None:
            publish = self.routes.cached_publish_info(self.topic)
            if publish is not None and len(publish.broker_names()) > 1:
                return  # the next attempt goes to another group: no reason to wait
        delay = min(self.backoff_s * (2**self.backoffs), MAX_BACKOFF_S, max(self.remaining, 0))
        self.backoffs += 1
        if delay > 0:
            await asyncio.sleep(delay)

    async def _ask(self, addr: str) -> None:
        """Ask ``addr`` (a slave of a group with no known master) where its master is: a pull
        that only the master may answer, so a ledgermq slave answers NOT_MASTER naming it."""
        mq = self.mq
        assert mq is not None
        request = B.pull_request(ASK_GROUP, mq.topic, mq.queue_id, 0, 1, 0)
        request.headers["requireMaster"] = True
        try:
            response = await self.remoting.invoke_sync(
                addr, request, max(min(self.remaining, ASK_TIMEOUT_S), 0.001)
            )
        except RemotingError as exc:  # nothing was sent to be stored: try again after the back-off
            self.last_error = exc
            self.last_code = None
            self.failed_here(True, True)
            return
        code = response.code
        hint = response.header_str(B.MASTER_ADDR, "") if response.headers else ""
        if code == ResponseCode.NOT_MASTER and hint:
            if hint == addr:  # itself: the leader, master once its backlog is applied
                self.pending = addr
                self.redirected(switching=True)
                return
            self.pending = ""
            self.routes.note_master(mq.broker_name, hint)
            self.redirected()
            return
        if code == ResponseCode.SERVICE_NOT_AVAILABLE:
            self.last_code = code
            self.last_error = ClientError(f"{response_code_name(code)} from {addr}: {response.remark}")
            self.redirected(switching=True)  # no leader elected yet: ask again shortly
            return
        if code in SERVED_PULL_CODES and not self.routes.recently_failed(mq.broker_name, addr):
            # It served a pull only a master may serve: it is the master now. (A RocketMQ slave
            # ignores requireMaster and serves it too; once it has refused a send it is not
            # taken for the master again while that is fresh.)
            self.pending = ""
            self.routes.note_master(mq.broker_name, addr)
            self.redirected()
            return
        # Any other answer says nothing about the master: back off and ask the nameservers, as
        # without a slave to ask.
        self.last_code = code
        self.last_error = ClientError(f"{response_code_name(code)} from {addr}: {response.remark}")
        self.failed_here(True, True)

    # --- outcomes of one attempt ------------------------------------------------------------------
    def answered(self, response: RemotingCommand) -> R | None:
        """The broker answered: the result, or None to try again; raises when giving up."""
        code = response.code
        mq = self.mq
        assert mq is not None
        if code == ResponseCode.SUCCESS:
            return self.parse(response, mq, self.addr, self.attempts)
        status = STORED_CODES.get(code)
        if status is not None:
            result = self.parse(response, mq, self.addr, self.attempts)
            result.status = status  # type: ignore[attr-defined]
            return result
        self.last_code = code
        self.last_error = ClientError(f"{response_code_name(code)} from {self.addr}: {response.remark}")
        routes = self.routes
        if code in RETRY_CODES:
            backoff, refresh = RETRY_CODES[code]
            if code == ResponseCode.NOT_MASTER:
                hint = response.header_str(B.MASTER_ADDR, "") if response.headers else ""
                if hint and hint != self.addr:
                    routes.note_master(mq.broker_name, hint)
                    self.redirected()
                    return None  # go straight to the master it named
                if hint:  # the group's leader, still applying its backlog: ask it until it serves
                    self.pending = hint
                    self.redirected(switching=True)
                    return None
            elif code == ResponseCode.SERVICE_NOT_AVAILABLE and self.asking:
                self.redirected(switching=True)  # no leader elected yet: ask a slave again shortly
                return None
            if self.asking:  # a slave that knows a leader but not its address: back off
                if code == ResponseCode.NOT_MASTER:
                    routes.forget_master(mq.broker_name, self.addr)
            elif code in (ResponseCode.NOT_MASTER, ResponseCode.SERVICE_NOT_AVAILABLE):
                # A deposed master (cut off from its group, it does not know the new one): its
                # slaves may already know who won; ask one at once rather than back off and
                # wait for the nameservers.
                routes.forget_master(mq.broker_name, self.addr)
                if routes.member_to_ask(mq.broker_name, self.addr) is not None:
                    backoff = refresh = False
            self.failed_here(backoff, refresh)
            return None
        if code in FATAL_CODES:
            raise self.final_error(fatal=True)
        self.maybe_stored()
        return None

    def not_sent(self, exc: NotSentError) -> None:
        """The request never left: certainly not stored."""
        if isinstance(exc.cause, FrameEncodeError):
            raise MessageInvalidError(f"cannot send to topic {self.topic}: {exc.cause}") from None
        self.last_error = exc.cause
        self.last_code = None
        assert self.mq is not None
        routes = self.routes
        routes.forget_master(self.mq.broker_name, self.addr)
        # A dead master refuses connections: when a slave can be asked where the new one is, do
        # that at once rather than waiting for the nameservers to hear of the switch.
        ask = routes.member_to_ask(self.mq.broker_name, self.addr) is not None
        self.failed_here(not ask, not ask)

    def lost(self, exc: RemotingError) -> None:
        """Sent but no usable answer (timeout, connection closed, refused frame): maybe stored."""
        self.last_error = exc
        self.last_code = None
        if isinstance(exc, RemotingConnectionClosedError) and self.mq is not None:
            self.routes.forget_master(self.mq.broker_name, self.addr)
        self.maybe_stored()

    def no_route(self, exc: ClientError) -> None:
        """No queue or master to try now (mid-election, nameservers unreachable)."""
        if isinstance(exc, NoNameServerError) or (
            isinstance(exc, RouteNotFoundError) and self.attempts == 0 and not self.tried
        ):
            raise exc  # configuration error or unknown topic: nothing was sent, the message says it all
        self.attempts += 1
        self.tried.append(f"(no broker: {exc})")
        self.last_error = exc
        self.last_code = None
        self.refresh = True
        self.wait = True

    def redirected(self, *, switching: bool = False) -> None:
        """The answer named the master, or said the group is switching: certainly not stored, so
        not counted as a try (up to MAX_FREE_REDIRECTS). The next attempt goes to the master at
        once, or after a short pause while it switches (``switching``), not the back-off."""
        if self.redirects < MAX_FREE_REDIRECTS:
            self.redirects += 1
        self.refresh = False
        self.wait = self.switching = switching

    def failed_here(self, backoff: bool, refresh: bool) -> None:
        assert self.mq is not None
        if self.pinned is None:
            self.avoid_broker = self.mq.broker_name
        self.refresh = self.refresh or refresh
        self.wait = backoff

    def maybe_stored(self) -> None:
        self.unknown = True
        if not self.idempotent:
            raise self.final_error()
        # Only this group's de-dup table knows the first attempt: stay on its queue.
        self.pinned = self.mq
        self.refresh = True
        self.wait = False

    def final_error(self, *, fatal: bool = False) -> SendError:
        cause = f"; last error: {self.last_error}" if self.last_error is not None else ""
        brokers = "[" + ", ".join(self.tried) + "]"
        n = self.attempts
        tries = f"{n} {'try' if n == 1 else 'tries'}"
        if self.unknown:
            return SendOutcomeUnknownError(
                f"send outcome unknown after {tries} to brokers {brokers}: the message to topic "
                f"{self.topic} may or may not have been stored{cause}",
                topic=self.topic,
                tries=n,
                brokers=self.tried,
                code=self.last_code,
            )
        why = " (not retryable)" if fatal else ""
        return SendFailedError(
            f"send failed after {tries} to brokers {brokers}{why}: topic {self.topic}{cause}",
            topic=self.topic,
            tries=n,
            brokers=self.tried,
            code=self.last_code,
        )
