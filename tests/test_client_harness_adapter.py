"""The harness's queue client builds its producer, consumer and connections on first use: the
workload replaces a client after every indefinite operation, so a master kill at full rate
replaces about 2,000 of them at once, and building each one up front held the worker's loop."""

from __future__ import annotations

import asyncio

from jepsen.systems.broker import BrokerQueueClient
from jepsen.systems.broker_semantics import BrokerTiming
from jepsen.systems.credentials import Credentials

NAMESRV = ["127.0.0.1:9"]  # never dialled: nothing here sends


def test_a_new_queue_client_holds_nothing_until_used() -> None:
    c = BrokerQueueClient(NAMESRV, {}, "T", timing=BrokerTiming())
    assert c._producer is None and c._consumer is None and c._instance_value is None
    asyncio.run(c.close())  # an unused client has nothing to close
    producer = c.producer
    assert c.producer is producer and c._consumer is None  # a poll-less client never builds a consumer
    consumer = c.consumer
    assert c.consumer is consumer
    assert producer.instance is not consumer.instance  # without credentials each owns its own


def test_signing_clients_share_one_instance_built_on_first_use() -> None:
    c = BrokerQueueClient(NAMESRV, {}, "T", timing=BrokerTiming(), credentials=Credentials("ak", "sk-secret"))
    assert c._instance_value is None
    assert c.producer.instance is c.consumer.instance is c._instance_value
    assert c._instance_value is not None and c._instance_value.signer is not None

    async def close() -> None:
        await c.close()

    asyncio.run(close())
    assert c._instance_value.closed
