"""One logical send across its attempts: what each failure means, and the results.

Kept apart from the Producer so the rules are in one place and readable on their own:
which answers certainly mean "not stored" (retry, maybe elsewhere), which mean "maybe
stored" (stop, unless idempotent: then retry on the same queue with the same seq), and how
the final error reads. The sync loop and the async response callbacks share this object.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

from client import broker_api as B
from client.broker_api import NotSentError
from client.errors import (
    ClientError,
    MessageInvalidError,
    NoNameServerError,
    RouteNotFoundError,
    SendError,
    SendFailedError,
    SendOutcomeUnknownError,
)
from client.route import MessageQueue, RouteTable
from remoting.codes import ResponseCode, response_code_name
from remoting.exceptions import FrameEncodeError, RemotingConnectionClosedError, RemotingError
from remoting.protocol import RemotingCommand


class SendStatus(Enum):
    SEND_OK = "SEND_OK"


@dataclass(slots=True)
class SendResult:
    """Where one message was stored. ``duplicate``: an earlier attempt with the same seq had stored it."""

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

# Response codes that certainly mean "not stored" and are worth another try, and whether to
# back off before it (the group is busy or electing) and re-read the route.
RETRY_CODES: dict[int, tuple[bool, bool]] = {
    ResponseCode.NOT_MASTER: (True, True),
    ResponseCode.SERVICE_NOT_AVAILABLE: (True, True),
    ResponseCode.SYSTEM_BUSY: (True, False),
    ResponseCode.TOPIC_NOT_EXIST: (False, True),
    ResponseCode.NO_PERMISSION: (False, True),
    ResponseCode.SLAVE_NOT_AVAILABLE: (True, True),
    ResponseCode.BODY_CRC_MISMATCH: (False, False),
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
# Anything else that is not SUCCESS (REPLICATION_TIMEOUT, SYSTEM_ERROR, FLUSH_*_TIMEOUT, codes
# we do not know) may have been stored: treated as outcome unknown.


class SendAttempts(Generic[R]):
    """State of one logical send across its attempts; shared by the sync loop and async callbacks."""

    __slots__ = (
        "routes",
        "idempotent",
        "topic",
        "request",
        "parse",
        "deadline",
        "max_attempts",
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
    )

    def __init__(
        self,
        routes: RouteTable,
        idempotent: bool,
        topic: str,
        request: RemotingCommand,
        parse: Callable[[RemotingCommand, MessageQueue, str, int], R],
        timeout_s: float,
        max_attempts: int,
        queue: MessageQueue | None,
        queue_id: int | None,
    ) -> None:
        self.routes = routes
        self.idempotent = idempotent
        self.topic = topic
        self.request = request
        self.parse = parse
        self.deadline = time.monotonic() + timeout_s
        self.max_attempts = max_attempts
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

    @property
    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def exhausted(self) -> bool:
        return self.attempts >= self.max_attempts or self.remaining <= 0

    # --- outcomes of one attempt ------------------------------------------------------------------
    def answered(self, response: RemotingCommand) -> R | None:
        """The broker answered: the result, or None to try again; raises when giving up."""
        code = response.code
        mq = self.mq
        assert mq is not None
        if code == ResponseCode.SUCCESS:
            return self.parse(response, mq, self.addr, self.attempts)
        self.last_code = code
        self.last_error = ClientError(f"{response_code_name(code)} from {self.addr}: {response.remark}")
        routes = self.routes
        if code in RETRY_CODES:
            backoff, refresh = RETRY_CODES[code]
            if code == ResponseCode.NOT_MASTER:
                hint = response.header_str(B.MASTER_ADDR, "") if response.headers else ""
                if hint and hint != self.addr:
                    routes.note_master(mq.broker_name, hint)
                    backoff = refresh = False  # go straight to the master it named
                else:
                    routes.forget_master(mq.broker_name, self.addr)
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
        self.routes.forget_master(self.mq.broker_name, self.addr)
        self.failed_here(True, True)

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
