"""ledgermq clients (RocketMQ's client module): producer, pull and push consumers, admin.

Everything is asyncio::

    from client import Producer, PushConsumer, Message

    producer = Producer("my-group", "127.0.0.1:9876;127.0.0.1:9877", idempotent=True)
    await producer.start()
    result = await producer.send(Message("orders", b"hello", tags="new"))
    await producer.shutdown()

Errors from a send: ``SendOutcomeUnknownError`` means the message may have been stored;
any other exception means it was not (see ``client.errors``).

RocketMQ's message semantics, spoken as its Java 4.9 client speaks them:

- retries: ``PushConsumer(...)`` consumes concurrently; a failed message is sent back
  (CONSUMER_SEND_MSG_BACK) and comes again from ``%RETRY%<group>``, then ``%DLQ%<group>``
  after ``max_reconsume_times`` (16);
- ordered consumption: ``PushConsumer(..., orderly=True)`` locks its queues on the masters
  (LOCK_BATCH_MQ) and retries a failed batch in place;
- delays: ``set_delay_level(msg, 3)`` or ``set_deliver_time_ms(msg, ms)`` before ``send``;
- transactions: ``TransactionProducer(group, ns, check_local=...)`` and
  ``await producer.send_in_transaction(msg, execute_local, arg)``;
- SQL92 filters: ``PushConsumer(..., subscription="a > 5", expression_type="SQL92")``.
"""

from client.admin_api import AdminClient, QueueProgress, TopicUpdateResult
from client.broker_api import PullResult, PullStatus
from client.consumer import PullConsumer
from client.errors import (
    BrokerError,
    ClientError,
    ClientStateError,
    MessageInvalidError,
    NameServerUnavailableError,
    NoBrokerAvailableError,
    NoNameServerError,
    RouteNotFoundError,
    SendError,
    SendFailedError,
    SendOutcomeUnknownError,
)
from client.instance import ClientInstance
from client.message_props import (
    ExpressionType,
    dlq_topic,
    retry_topic,
    set_delay_level,
    set_deliver_time_ms,
)
from client.namesrv_client import NamesrvClient, parse_namesrv_addrs
from client.producer import Producer
from client.push_consumer import ConsumeFromWhere, ConsumeStatus, MessageListener, PushConsumer
from client.rebalance import allocate_average
from client.route import MessageQueue, RouteTable, TopicPublishInfo
from client.send_attempts import BatchSendResult, SendCallback, SendResult, SendStatus
from client.transaction import LocalTransactionState, TransactionProducer, TransactionSendResult
from remoting.message import Message

__all__ = [
    "AdminClient",
    "BatchSendResult",
    "BrokerError",
    "ClientError",
    "ClientInstance",
    "ClientStateError",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "ExpressionType",
    "LocalTransactionState",
    "Message",
    "MessageInvalidError",
    "MessageListener",
    "MessageQueue",
    "NameServerUnavailableError",
    "NamesrvClient",
    "NoBrokerAvailableError",
    "NoNameServerError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueProgress",
    "RouteNotFoundError",
    "RouteTable",
    "SendCallback",
    "SendError",
    "SendFailedError",
    "SendOutcomeUnknownError",
    "SendResult",
    "SendStatus",
    "TopicPublishInfo",
    "TopicUpdateResult",
    "TransactionProducer",
    "TransactionSendResult",
    "allocate_average",
    "dlq_topic",
    "parse_namesrv_addrs",
    "retry_topic",
    "set_delay_level",
    "set_deliver_time_ms",
]
