"""TransactionProducer: RocketMQ's transactional messages (TransactionMQProducer).

A transactional send is three steps, as DefaultMQProducerImpl.sendMessageInTransaction takes them:

1. a *half* message: the message with properties TRAN_MSG=true and PGROUP=<producer group>
   and the TRANSACTION_PREPARED bit in the send header's sysFlag. The broker stores it where
   no consumer sees it;
2. the local transaction (``execute_local(msg, arg)``), whose answer is COMMIT_MESSAGE,
   ROLLBACK_MESSAGE or UNKNOW;
3. END_TRANSACTION to the master of the group that stored the half, naming it by its queue
   offset and its commit-log (physical) offset: commit makes it visible, rollback drops it.

When the verdict is UNKNOW or END_TRANSACTION was lost, the broker asks later: it sends
CHECK_TRANSACTION_STATE (with the half message as a stored record) on a connection whose
heartbeat named the producer group, and ``check_local(msg)`` answers it with another
END_TRANSACTION (``fromTransactionCheck=true``). Producers therefore heartbeat (see Producer).

END_TRANSACTION with a verdict is sent as a call, so its refusal is reported in the result
(``end_error``) rather than lost; an UNKNOW verdict is sent oneway, as Java's client sends all
of them, because an Apache broker does not answer that one.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import client.broker_api as B
from client.errors import ClientStateError, MessageInvalidError
from client.instance import ClientInstance
from client.message_props import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    is_delayed,
)
from client.producer import Producer
from client.route import MessageQueue
from client.send_attempts import SendResult, SendStatus, message_result
from remoting.codes import RequestCode, ResponseCode, response_code_name
from remoting.connection import RemotingConnection
from remoting.exceptions import RemotingError
from remoting.message import Message, MessageFormatError, parse_offset_msg_id
from remoting.protocol import RemotingCommand

log = logging.getLogger("client.transaction")

MAX_END_REDIRECTS = 3
"""END_TRANSACTION follows at most this many NOT_MASTER answers."""
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"


class LocalTransactionState(Enum):
    """A local transaction's outcome (RocketMQ's LocalTransactionState, spelling included)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"
    UNKNOWN = "UNKNOW"  # an alias: the same member


_COMMIT_OR_ROLLBACK = {
    LocalTransactionState.COMMIT_MESSAGE: B.TRANSACTION_COMMIT_TYPE,
    LocalTransactionState.ROLLBACK_MESSAGE: B.TRANSACTION_ROLLBACK_TYPE,
    LocalTransactionState.UNKNOW: B.TRANSACTION_NOT_TYPE,
}

StateResult = LocalTransactionState | None | Awaitable[LocalTransactionState | None]
ExecuteLocal = Callable[[Message, Any], StateResult]
"""Runs the local transaction for a stored half message; None counts as UNKNOW."""
CheckLocal = Callable[[Message], StateResult]
"""Tells the broker how a half message's transaction ended; None counts as UNKNOW."""


@dataclass(slots=True)
class TransactionSendResult:
    """What became of a transactional send: where the half message is, what the local
    transaction said, and whether the broker took the verdict (``end_error`` when it did not:
    the broker will then ask ``check_local``)."""

    send_result: SendResult
    local_state: LocalTransactionState
    msg_id: str
    """The message's UNIQ_KEY (what RocketMQ's SendResult.getMsgId gives)."""
    transaction_id: str
    end_error: str = ""
    local_error: BaseException | None = None

    @property
    def status(self) -> SendStatus:
        return self.send_result.status


def _state(value: object) -> LocalTransactionState:
    if value is None:
        return LocalTransactionState.UNKNOW
    if isinstance(value, LocalTransactionState):
        return value
    raise TypeError(f"a transaction listener must return a LocalTransactionState, got {value!r}")


async def _run_listener(fn: Callable[..., StateResult], *args: Any) -> LocalTransactionState:
    outcome = fn(*args)
    if inspect.isawaitable(outcome):
        outcome = await outcome
    return _state(outcome)


class TransactionProducer(Producer):
    """A producer of transactional messages; also answers the broker's transaction checks.

    ``check_local(msg)`` answers CHECK_TRANSACTION_STATE for half messages of this producer
    group (sync or async). At most ``check_concurrency`` run at once and at most
    ``max_pending_checks`` wait (more are dropped: the broker asks again later); a half
    message already being checked is not checked twice at once. Every Producer option applies.
    """

    def __init__(
        self,
        group: str,
        namesrv_addrs: str | Sequence[str] | None = None,
        *,
        check_local: CheckLocal,
        check_concurrency: int = 1,
        max_pending_checks: int = 2000,
        instance: ClientInstance | None = None,
        **options: Any,
    ) -> None:
        """``check_concurrency`` defaults to 1, as RocketMQ's checkThreadPoolMinSize;
        ``max_pending_checks`` to RocketMQ's checkRequestHoldMax (2000)."""
        if not callable(check_local):
            raise ValueError("check_local must be a callable (msg) -> LocalTransactionState")
        if check_concurrency < 1 or max_pending_checks < 1:
            raise ValueError("check_concurrency and max_pending_checks must be >= 1")
        super().__init__(group, namesrv_addrs, instance=instance, **options)
        self.check_local = check_local
        self.check_concurrency = check_concurrency
        self.max_pending_checks = max_pending_checks
        self._check_slots: asyncio.Semaphore | None = None
        self._check_tasks: set[asyncio.Task[None]] = set()
        self._checking: set[int] = set()  # commit-log offsets of half messages being checked
        self._unregister_checker: Callable[[], None] | None = None
        self.checks_dropped = 0
        """Checks not run because ``max_pending_checks`` were already waiting."""

    async def start(self) -> None:
        """Start sending and answering checks; ValueError if another producer of this group
        already answers checks in the same ClientInstance."""
        if self._unregister_checker is None:
            self._unregister_checker = self.instance.register_transaction_checker(self.group, self._on_check)
        self._check_slots = asyncio.Semaphore(self.check_concurrency)
        await super().start()

    async def shutdown(self, grace_s: float = 3.0) -> None:
        """Stop answering checks (running ones are cancelled: the broker asks again), then as Producer."""
        if self._unregister_checker is not None:
            self._unregister_checker()
            self._unregister_checker = None
        for task in list(self._check_tasks):
            task.cancel()
        if self._check_tasks:
            await asyncio.gather(*self._check_tasks, return_exceptions=True)
        await super().shutdown(grace_s)

    # --- sending --------------------------------------------------------------------------------
    async def send_in_transaction(
        self,
        msg: Message,
        execute_local: ExecuteLocal,
        arg: Any = None,
        *,
        timeout_s: float | None = None,
    ) -> TransactionSendResult:
        """Send ``msg`` as a half message, run ``execute_local(msg, arg)``, then tell the broker
        to commit or roll it back. Send errors raise as for ``send`` (the local transaction has
        not run then); an exception from ``execute_local`` counts as UNKNOW (the broker will
        ask ``check_local``) and is kept in ``local_error``."""
        self._check_running()
        if is_delayed(msg):
            raise MessageInvalidError(
                "a transactional message cannot be delayed (DELAY or TIMER_DELIVER_MS): "
                "RocketMQ ignores the delay of a half message; send it without one"
            )
        msg.properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        msg.properties[PROPERTY_PRODUCER_GROUP] = self.group
        request = self._message_request(msg)
        request.headers[B.V2_SYS_FLAG] = str(B.TRANSACTION_PREPARED_TYPE)
        plain = message_result(msg, self.idempotent)
        transaction_ids: list[str] = []

        def parse(response: RemotingCommand, mq: MessageQueue, addr: str, tries: int) -> SendResult:
            transaction_ids.append(response.header_str(B.TRANSACTION_ID, ""))
            return plain(response, mq, addr, tries)

        send = self._attempts(msg.topic, request, parse, timeout_s, self.retries, None, None)
        result = await send.run()
        uniq = msg.properties.get(PROPERTY_UNIQ_KEY, "")
        transaction_id = (transaction_ids[-1] if transaction_ids else "") or uniq
        if result.broker_addr and result.broker_addr not in self._heartbeated:
            # The broker can only ask us about this half message once we named our group to it.
            await self.heartbeat([result.broker_addr])

        local_error: BaseException | None = None
        if result.status is SendStatus.SEND_OK:
            try:
                state = await _run_listener(execute_local, msg, arg)
            except Exception as exc:
                log.warning(
                    "local transaction raised; its state is UNKNOW until checked",
                    extra={"group": self.group, "msg_id": uniq, "error": repr(exc)},
                )
                state, local_error = LocalTransactionState.UNKNOW, exc
        else:
            # Stored, but its flush or replica is not confirmed: roll back, as RocketMQ does.
            state = LocalTransactionState.ROLLBACK_MESSAGE
        remark = f"executeLocalTransactionBranch exception: {local_error!r}" if local_error else ""
        end_error = await self._end(result, state, uniq, transaction_id, remark)
        return TransactionSendResult(result, state, uniq, transaction_id, end_error, local_error)

    async def _end(
        self, result: SendResult, state: LocalTransactionState, uniq: str, transaction_id: str, remark: str
    ) -> str:
        """END_TRANSACTION for a half message just stored; '' when the broker took it."""
        try:
            _host, commit_log_offset = parse_offset_msg_id(result.msg_id)
        except MessageFormatError as exc:
            return f"cannot end the transaction: the send answer's message id is unusable ({exc})"
        headers = B.end_transaction_headers(
            self.group,
            result.queue_offset,
            commit_log_offset,
            _COMMIT_OR_ROLLBACK[state],
            uniq,
            transaction_id,
            from_check=False,
        )
        routes = self.instance.routes
        addr = routes.master_addr(result.broker_name) or result.broker_addr
        error = ""
        for _ in range(MAX_END_REDIRECTS):
            request = RemotingCommand.request(RequestCode.END_TRANSACTION, headers)
            request.remark = remark
            try:
                if state is LocalTransactionState.UNKNOW:
                    await self.instance.remoting.invoke_oneway(addr, request, self.send_timeout_s)
                    return ""
                response = await self.instance.remoting.invoke_sync(addr, request, self.send_timeout_s)
            except RemotingError as exc:
                error = f"END_TRANSACTION to {addr}: {exc}"
                break
            if response.code == ResponseCode.SUCCESS:
                return ""
            error = f"END_TRANSACTION to {addr}: {response_code_name(response.code)} {response.remark}"
            hint = response.header_str(B.MASTER_ADDR, "") if response.code == ResponseCode.NOT_MASTER else ""
            if not hint or hint == addr:
                break
            routes.note_master(result.broker_name, hint)
            addr = hint
        log.warning(
            "END_TRANSACTION not taken; the broker will check the transaction later",
            extra={"group": self.group, "msg_id": uniq, "state": state.value, "error": error},
        )
        return error

    # --- checks from brokers --------------------------------------------------------------------------
    def _on_check(self, conn: RemotingConnection, request: RemotingCommand, msg: Message) -> None:
        """CHECK_TRANSACTION_STATE for one of our half messages: run ``check_local`` in a task."""
        if not self._running or self._check_slots is None:
            return
        try:
            commit_log_offset = request.header_int(B.COMMIT_LOG_OFFSET)
            queue_offset = request.header_int(B.TRAN_STATE_TABLE_OFFSET)
        except Exception as exc:
            log.warning("transaction check without offsets ignored", extra={"error": str(exc)})
            return
        if commit_log_offset in self._checking:
            return  # still answering the last check of this half message
        if len(self._check_tasks) >= self.max_pending_checks:
            self.checks_dropped += 1
            if self.checks_dropped % 1000 == 1:
                log.warning(
                    "transaction checks dropped: too many waiting (the broker asks again)",
                    extra={"group": self.group, "dropped": self.checks_dropped},
                )
            return
        real_topic = msg.properties.get(PROPERTY_REAL_TOPIC)
        if msg.topic == HALF_TOPIC and real_topic:  # the broker restores these; be sure
            msg.topic = real_topic
            qid = msg.properties.get(PROPERTY_REAL_QUEUE_ID, "")
            msg.queue_id = int(qid) if qid.isdigit() else msg.queue_id
        self._checking.add(commit_log_offset)
        task = asyncio.get_running_loop().create_task(
            self._answer_check(conn, request, msg, commit_log_offset, queue_offset),
            name=f"transaction-check-{self.group}",
        )
        self._check_tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._check_tasks.discard(t)
            self._checking.discard(commit_log_offset)

        task.add_done_callback(done)

    async def _answer_check(
        self,
        conn: RemotingConnection,
        request: RemotingCommand,
        msg: Message,
        commit_log_offset: int,
        queue_offset: int,
    ) -> None:
        slots = self._check_slots
        assert slots is not None
        async with slots:
            remark = ""
            try:
                state = await _run_listener(self.check_local, msg)
            except Exception as exc:
                log.warning(
                    "check_local raised; answering UNKNOW",
                    extra={"group": self.group, "msg_id": msg.unique_key, "error": repr(exc)},
                )
                state, remark = LocalTransactionState.UNKNOW, f"checkLocalTransactionState Exception: {exc!r}"
        msg_id = msg.unique_key or request.header_str(B.MSG_ID, "") or msg.msg_id
        headers = B.end_transaction_headers(
            self.group,
            queue_offset,
            commit_log_offset,
            _COMMIT_OR_ROLLBACK[state],
            msg_id,
            request.header_str(B.TRANSACTION_ID, "") or None,
            from_check=True,
        )
        answer = RemotingCommand.request(RequestCode.END_TRANSACTION, headers)
        answer.remark = remark
        try:
            if state is LocalTransactionState.UNKNOW:
                conn.invoke_oneway(answer)
                return
            future = conn.invoke(answer, self.send_timeout_s)
            assert future is not None
            response = await future
        except RemotingError as exc:
            log.warning(
                "transaction check answer not delivered (the broker asks again)",
                extra={"group": self.group, "msg_id": msg_id, "error": str(exc)},
            )
            return
        if response.code != ResponseCode.SUCCESS:
            log.warning(
                "transaction check answer refused",
                extra={
                    "group": self.group,
                    "msg_id": msg_id,
                    "code": response_code_name(response.code),
                    "remark": response.remark,
                },
            )

    def _check_running(self) -> None:
        if not self._running:
            raise ClientStateError(f"transaction producer {self.group} is not running; call start() first")


__all__ = [
    "CheckLocal",
    "ExecuteLocal",
    "LocalTransactionState",
    "TransactionProducer",
    "TransactionSendResult",
]
