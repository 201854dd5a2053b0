"""Broker requests and their answers (RocketMQ's MQClientAPIImpl), shared by producer, consumers and admin.

Header names live here only, so the client and the broker protocol description agree in one
place. Sends go through ``invoke_tracked``, which knows whether the request left this
process: an error before that point means "not stored", after it "outcome unknown".
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from client.errors import BrokerError
from remoting.client import RemotingClient
from remoting.codes import RequestCode, ResponseCode
from remoting.connection import RemotingConnection, ResponseCallback
from remoting.exceptions import RemotingCommandError, RemotingError
from remoting.headers import SEND_V2_NAMES
from remoting.jsonbody import Fields, dump_body, load_body
from remoting.message import Message, decode_stored_messages, java_string_hash
from remoting.protocol import HeaderValue, RemotingCommand

# --- header names (the broker protocol) ------------------------------------------------------
PRODUCER_GROUP = "producerGroup"
CONSUMER_GROUP = "consumerGroup"
CLIENT_ID = "clientID"
TOPIC = "topic"
QUEUE_ID = "queueId"
QUEUE_OFFSET = "queueOffset"
BORN_TIMESTAMP = "bornTimestamp"
FLAG = "flag"
PROPERTIES = "properties"
MSG_ID = "msgId"
LEDGER_INDEX = "ledgerIndex"
DUPLICATE = "duplicate"
MASTER_ADDR = "masterAddr"
MAX_MSG_NUMS = "maxMsgNums"
SUSPEND_TIMEOUT_MILLIS = "suspendTimeoutMillis"
COMMIT_OFFSET = "commitOffset"
SUBSCRIPTION = "subscription"
NEXT_BEGIN_OFFSET = "nextBeginOffset"
MIN_OFFSET = "minOffset"
MAX_OFFSET = "maxOffset"
BROKER_NAME = "brokerName"
OFFSET = "offset"
READ_QUEUE_NUMS = "readQueueNums"
WRITE_QUEUE_NUMS = "writeQueueNums"
PERM = "perm"
KEY = "key"
MAX_NUM = "maxNum"
SYS_FLAG = "sysFlag"
SUB_VERSION = "subVersion"
EXPRESSION_TYPE = "expressionType"
SUGGEST_WHICH_BROKER_ID = "suggestWhichBrokerId"
DEFAULT_TOPIC = "defaultTopic"
DEFAULT_TOPIC_QUEUE_NUMS = "defaultTopicQueueNums"
RECONSUME_TIMES = "reconsumeTimes"
BATCH = "batch"
DEFAULT_TOPIC_NAME = "TBW102"
"""RocketMQ's template topic: brokers that auto-create topics serve it."""
DEFAULT_TOPIC_QUEUES = 4
UNIT_MODE = "unitMode"
TOPIC_FILTER_TYPE = "topicFilterType"
TOPIC_SYS_FLAG = "topicSysFlag"
ORDER = "order"
SINGLE_TAG = "SINGLE_TAG"
"""RocketMQ's TopicFilterType for every topic a 4.x client creates."""
MAX_RECONSUME_TIMES = "maxReconsumeTimes"
TRANSACTION_ID = "transactionId"
# CONSUMER_SEND_MSG_BACK (36): ConsumerSendMsgBackRequestHeader
GROUP = "group"
DELAY_LEVEL = "delayLevel"
ORIGIN_MSG_ID = "originMsgId"
ORIGIN_TOPIC = "originTopic"
# END_TRANSACTION (37): EndTransactionRequestHeader; CHECK_TRANSACTION_STATE (39) shares the offsets
TRAN_STATE_TABLE_OFFSET = "tranStateTableOffset"
COMMIT_LOG_OFFSET = "commitLogOffset"
COMMIT_OR_ROLLBACK = "commitOrRollback"
FROM_TRANSACTION_CHECK = "fromTransactionCheck"
OFFSET_MSG_ID = "offsetMsgId"
# EndTransactionRequestHeader.commitOrRollback (MessageSysFlag's transaction types)
TRANSACTION_NOT_TYPE = 0
TRANSACTION_COMMIT_TYPE = 0x2 << 2
TRANSACTION_ROLLBACK_TYPE = 0x3 << 2
TRANSACTION_PREPARED_TYPE = 0x1 << 2
"""The sysFlag bit a producer sets on a half message (MessageSysFlag.TRANSACTION_PREPARED_TYPE)."""

# SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320): SendMessageRequestHeaderV2's one-letter
# names, what a Java 4.9 producer sends and an Apache broker reads for these codes.
V2_PRODUCER_GROUP = SEND_V2_NAMES[PRODUCER_GROUP]
V2_TOPIC = SEND_V2_NAMES[TOPIC]
V2_DEFAULT_TOPIC = SEND_V2_NAMES[DEFAULT_TOPIC]
V2_DEFAULT_TOPIC_QUEUE_NUMS = SEND_V2_NAMES[DEFAULT_TOPIC_QUEUE_NUMS]
V2_QUEUE_ID = SEND_V2_NAMES[QUEUE_ID]
V2_SYS_FLAG = SEND_V2_NAMES[SYS_FLAG]
V2_BORN_TIMESTAMP = SEND_V2_NAMES[BORN_TIMESTAMP]
V2_FLAG = SEND_V2_NAMES[FLAG]
V2_PROPERTIES = SEND_V2_NAMES[PROPERTIES]
V2_RECONSUME_TIMES = SEND_V2_NAMES[RECONSUME_TIMES]
V2_UNIT_MODE = SEND_V2_NAMES[UNIT_MODE]
V2_BATCH = SEND_V2_NAMES[BATCH]
V2_MAX_RECONSUME_TIMES = SEND_V2_NAMES[MAX_RECONSUME_TIMES]
V2_CODES = frozenset((int(RequestCode.SEND_MESSAGE_V2), int(RequestCode.SEND_BATCH_MESSAGE)))
"""Request codes whose headers use the V2 names."""
JAVA_FALSE = "false"
JAVA_TRUE = "true"
"""Booleans as Java's String.valueOf writes them (as strings: the encoder's fast path)."""


def queue_id_header(code: int) -> str:
    """The header naming the queue in a send request with this code (``e`` in V2 headers)."""
    return V2_QUEUE_ID if code in V2_CODES else QUEUE_ID


# PULL_MESSAGE sysFlag bits (RocketMQ's PullSysFlag)
PULL_FLAG_COMMIT_OFFSET = 0x1
"""commitOffset carries an offset to store; without this bit the broker ignores it."""
PULL_FLAG_SUSPEND = 0x2
"""The broker may hold the pull up to suspendTimeoutMillis (long polling)."""
PULL_FLAG_SUBSCRIPTION = 0x4
"""The subscription header is the filter to use (else the one from the group's heartbeat)."""
EXPRESSION_TAG = "TAG"
EXPRESSION_SQL92 = "SQL92"


class NotSentError(Exception):
    """Internal: the request never left this process (connect failure, closed connection, no time)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


async def _connection_for(remoting: RemotingClient, addr: str, deadline: float) -> RemotingConnection:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise NotSentError(TimeoutError(f"no time left to send to {addr}"))
    try:
        conn = await remoting.get_connection(addr, remaining)
        if not conn.writable:
            await asyncio.wait_for(conn.wait_writable(), max(deadline - time.monotonic(), 0))
    except TimeoutError:
        raise NotSentError(TimeoutError(f"send buffer to {addr} stayed full; request not sent")) from None
    except RemotingError as exc:
        raise NotSentError(exc) from None
    return conn


async def invoke_tracked(
    remoting: RemotingClient, addr: str, request: RemotingCommand, timeout_s: float
) -> RemotingCommand:
    """Like RemotingClient.invoke_sync, but failures before the write raise NotSentError.

    Any RemotingError raised afterwards (timeout, connection closed, refused response frame)
    means the broker may have processed the request.
    """
    deadline = time.monotonic() + timeout_s
    conn = remoting.ready_connection(addr) or await _connection_for(remoting, addr, deadline)
    try:
        future = conn.invoke(request, deadline - time.monotonic(), call_timeout_s=timeout_s)
    except RemotingError as exc:  # FrameEncodeError, closed connection, no time left: nothing written
        raise NotSentError(exc) from None
    assert future is not None
    return await future


async def invoke_tracked_async(
    remoting: RemotingClient,
    addr: str,
    request: RemotingCommand,
    timeout_s: float,
    callback: ResponseCallback,
) -> None:
    """Write the request and return; ``callback`` gets the answer. NotSentError if it was never written."""
    deadline = time.monotonic() + timeout_s
    conn = remoting.ready_connection(addr) or await _connection_for(remoting, addr, deadline)
    try:
        conn.invoke(request, deadline - time.monotonic(), callback, call_timeout_s=timeout_s)
    except RemotingError as exc:
        raise NotSentError(exc) from None


async def invoke_tracked_oneway(
    remoting: RemotingClient, addr: str, request: RemotingCommand, timeout_s: float
) -> None:
    conn = await _connection_for(remoting, addr, time.monotonic() + timeout_s)
    try:
        conn.invoke_oneway(request)
    except RemotingError as exc:
        raise NotSentError(exc) from None


# --- pull ---------------------------------------------------------------------------------------
class PullStatus(Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(slots=True)
class PullResult:
    """One pull: messages from ``offset`` on, and where to continue (``next_begin_offset``)."""

    status: PullStatus
    messages: list[Message] = field(default_factory=list)
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    broker_addr: str = ""
    suggest_which_broker_id: int = 0
    """The member the broker suggests for the next pull of this queue (0 = master)."""


def pull_request(
    group: str,
    topic: str,
    queue_id: int,
    offset: int,
    max_nums: int,
    suspend_ms: int,
    commit_offset: int | None = None,
    subscription: str | None = None,
    expression_type: str = EXPRESSION_TAG,
) -> RemotingCommand:
    """A RocketMQ PULL_MESSAGE request; ``sysFlag`` says which of the optional parts count.

    ``commitOffset`` and ``subVersion`` are always sent (0 when unused, as the Java client
    does): PullMessageRequestHeader requires them, so an Apache broker refuses a pull without.
    The subscription is always sent too ("*" when None), with its sysFlag bit, as RocketMQ's
    pull consumer does: a RocketMQ broker refuses a pull without one from a group whose
    consumers never sent it a heartbeat (SUBSCRIPTION_NOT_EXIST). ``expression_type`` says
    how the broker reads it (TAG, or SQL92 for a property filter).
    """
    sys_flag = 0
    headers: dict[str, HeaderValue] = {
        CONSUMER_GROUP: group,
        TOPIC: topic,
        QUEUE_ID: queue_id,
        QUEUE_OFFSET: offset,
        MAX_MSG_NUMS: max_nums,
        SUSPEND_TIMEOUT_MILLIS: suspend_ms,
        COMMIT_OFFSET: 0 if commit_offset is None else commit_offset,
        SUB_VERSION: 0,
    }
    if commit_offset is not None:
        sys_flag |= PULL_FLAG_COMMIT_OFFSET
    if suspend_ms > 0:
        sys_flag |= PULL_FLAG_SUSPEND
    headers[SUBSCRIPTION] = (
        subscription if subscription and subscription.strip() else "*"
    )  # other tags skipped
    headers[EXPRESSION_TYPE] = expression_type
    sys_flag |= PULL_FLAG_SUBSCRIPTION
    headers[SYS_FLAG] = sys_flag
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, headers)


def decode_pull_messages(body: bytes | memoryview, broker_name: str) -> list[Message]:
    """The messages of a PULL body: RocketMQ's stored records (as any RocketMQ broker sends)."""
    return decode_stored_messages(body)


_PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


def parse_pull_response(response: RemotingCommand, addr: str, broker_name: str, offset: int) -> PullResult:
    status = _PULL_STATUS.get(response.code)  # type: ignore[call-overload]
    if status is None:
        raise BrokerError(response.code, response.remark, addr, "pull")
    try:
        name = response.header_str(BROKER_NAME, broker_name) or broker_name
        result = PullResult(
            status,
            [],
            response.header_int(NEXT_BEGIN_OFFSET, offset),
            response.header_int(MIN_OFFSET, 0),
            response.header_int(MAX_OFFSET, 0),
            addr,
            response.header_int(SUGGEST_WHICH_BROKER_ID, 0),
        )
        if status is PullStatus.FOUND:
            result.messages = decode_pull_messages(response.body, name)
            if not result.messages:
                result.status = PullStatus.NO_NEW_MSG
    except (RemotingCommandError, ValueError) as exc:
        raise BrokerError(response.code, f"malformed pull response: {exc}", addr, "pull") from None
    return result


# --- small request helpers ------------------------------------------------------------------------
async def call(
    remoting: RemotingClient,
    addr: str,
    code: int,
    headers: dict[str, HeaderValue] | None = None,
    body: bytes = b"",
    *,
    timeout_s: float = 3.0,
    what: str = "",
    ok_codes: tuple[int, ...] = (ResponseCode.SUCCESS,),
) -> RemotingCommand:
    """One request; BrokerError for any answer outside ``ok_codes`` (RemotingError passes through)."""
    response = await remoting.invoke_sync(addr, RemotingCommand.request(code, headers, body), timeout_s)
    if response.code not in ok_codes:
        raise BrokerError(response.code, response.remark, addr, what)
    return response


def json_body(response: RemotingCommand, addr: str, what: str) -> Any:
    try:
        return load_body(response.body, what)
    except RemotingCommandError as exc:
        raise BrokerError(response.code, f"malformed body: {exc}", addr, what) from None


def subscription_data(
    topic: str, expression: str = "*", expression_type: str = EXPRESSION_TAG
) -> dict[str, Any]:
    """RocketMQ's SubscriptionData as ``FilterAPI.build`` makes it: for TAG the tags and their
    Java hash codes (the broker's consume queue filter), for SQL92 the expression alone."""
    if expression_type == EXPRESSION_TAG:
        sub = expression if expression and expression.strip() else "*"
        tags = [] if sub.strip() == "*" else [t.strip() for t in sub.split("||") if t.strip()]
    else:
        sub, tags = expression, []
    return {
        "classFilterMode": False,
        "topic": topic,
        "subString": sub,
        "tagsSet": tags,
        "codeSet": [java_string_hash(t) for t in tags],
        "subVersion": 0,
        "expressionType": expression_type,
    }


def consumer_data(
    group: str,
    subscriptions: list[dict[str, Any]],
    *,
    consume_type: str = "CONSUME_PASSIVELY",
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET",
) -> dict[str, Any]:
    """One ``consumerDataSet`` entry of a heartbeat (CONSUME_PASSIVELY is RocketMQ's push consumer)."""
    return {
        "groupName": group,
        "consumeType": consume_type,
        "messageModel": "CLUSTERING",
        "consumeFromWhere": consume_from_where,
        "subscriptionDataSet": subscriptions,
        "unitMode": False,
    }


def heartbeat_doc(client_id: str, consumers: list[dict[str, Any]], producer_groups: list[str]) -> bytes:
    """RocketMQ's HeartbeatData: the client id, its consumers' data and its producers' groups (a
    broker sends CHECK_TRANSACTION_STATE to a connection that named the half message's group)."""
    doc: dict[str, Any] = {
        "clientID": client_id,
        "producerDataSet": [{"groupName": g} for g in producer_groups],
        "consumerDataSet": consumers,
    }
    return dump_body(doc)


def heartbeat_body(
    client_id: str,
    consumer_group: str | None,
    producer_group: str | None,
    topics: list[str],
    subscription: str = "*",
    *,
    consume_type: str = "CONSUME_PASSIVELY",
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET",
) -> bytes:
    """A heartbeat of at most one consumer group (``topics`` each with the same TAG
    ``subscription``) and one producer group."""
    consumers = []
    if consumer_group:
        subs = [subscription_data(topic, subscription) for topic in topics]
        consumers.append(
            consumer_data(
                consumer_group, subs, consume_type=consume_type, consume_from_where=consume_from_where
            )
        )
    return heartbeat_doc(client_id, consumers, [producer_group] if producer_group else [])


# --- retries, transactions, queue locks -----------------------------------------------------------
def send_back_headers(
    msg: Message, group: str, delay_level: int, max_reconsume_times: int, origin_msg_id: str
) -> dict[str, HeaderValue]:
    """CONSUMER_SEND_MSG_BACK's ConsumerSendMsgBackRequestHeader as MQClientAPIImpl fills it:
    the message's commit-log (physical) offset, so the broker copies its stored record."""
    return {
        OFFSET: msg.physical_offset,
        GROUP: group,
        DELAY_LEVEL: delay_level,
        ORIGIN_MSG_ID: origin_msg_id,
        ORIGIN_TOPIC: msg.topic,
        UNIT_MODE: JAVA_FALSE,
        MAX_RECONSUME_TIMES: max_reconsume_times,
    }


def end_transaction_headers(
    producer_group: str,
    queue_offset: int,
    commit_log_offset: int,
    commit_or_rollback: int,
    msg_id: str,
    transaction_id: str | None,
    *,
    from_check: bool,
) -> dict[str, HeaderValue]:
    """END_TRANSACTION's EndTransactionRequestHeader (DefaultMQProducerImpl.endTransaction, or
    the answer to a check): the half message's queue offset and physical offset, and the verdict."""
    headers: dict[str, HeaderValue] = {
        PRODUCER_GROUP: producer_group,
        TRAN_STATE_TABLE_OFFSET: queue_offset,
        COMMIT_LOG_OFFSET: commit_log_offset,
        COMMIT_OR_ROLLBACK: commit_or_rollback,
        FROM_TRANSACTION_CHECK: JAVA_TRUE if from_check else JAVA_FALSE,
        MSG_ID: msg_id,
    }
    if transaction_id:
        headers[TRANSACTION_ID] = transaction_id
    return headers


def mq_json(queue: Any) -> dict[str, Any]:
    """A MessageQueue as RocketMQ's JSON bodies carry it."""
    return {"topic": queue.topic, "brokerName": queue.broker_name, "queueId": queue.queue_id}


def lock_batch_body(group: str, client_id: str, queues: list[Any]) -> bytes:
    """LOCK_BATCH_MQ's and UNLOCK_BATCH_MQ's body (LockBatchRequestBody / UnlockBatchRequestBody)."""
    return dump_body(
        {
            "consumerGroup": group,
            "clientId": client_id,
            "onlyThisBroker": False,
            "mqSet": [mq_json(q) for q in sorted(queues)],
        }
    )


def parse_locked_queues(response: RemotingCommand, addr: str) -> list[tuple[str, str, int]]:
    """LockBatchResponseBody's ``lockOKMQSet`` as (topic, broker name, queue id)."""
    what = "lock batch answer"
    try:
        doc = Fields(load_body(response.body or b"{}", what), what)
        out = []
        for i, item in enumerate(doc.get_list("lockOKMQSet", [])):
            f = Fields(item, f"{what}.lockOKMQSet[{i}]")
            out.append((f.get_str("topic"), f.get_str("brokerName"), f.get_int("queueId")))
    except RemotingCommandError as exc:
        raise BrokerError(response.code, f"malformed {what}: {exc}", addr, what) from None
    return out


def check_client_body(client_id: str, group: str, subscription: dict[str, Any]) -> bytes:
    """CHECK_CLIENT_CONFIG's CheckClientRequestBody (the broker compiles the subscription)."""
    return dump_body({"clientId": client_id, "group": group, "subscriptionData": subscription})


def parse_consumer_ids(response: RemotingCommand, addr: str) -> list[str]:
    try:
        ids = Fields(load_body(response.body, "consumer list"), "consumer list").get_list(
            "consumerIdList", []
        )
    except RemotingCommandError as exc:
        raise BrokerError(response.code, f"malformed consumer list: {exc}", addr, "consumer list") from None
    return sorted({str(i) for i in ids})
