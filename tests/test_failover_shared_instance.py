"""The queue workload's clients of one process share one client instance (routes, connections).

After a leader kill under full load about 2,000 harness clients are replaced at once; with an
instance each, each one asked a nameserver for the route on its first poll. These tests check
the sharing itself: who shares, who does not, and that closing a client leaves the shared
instance open while closing the process's clients closes it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jepsen.systems.broker import QueueEndpoints
from jepsen.workloads.queue import queue_client


def _spec(**extra: Any) -> dict[str, Any]:
    return {
        "system": "broker",
        "namesrv": ["127.0.0.1:1"],
        "names": {"127.0.0.1:2": "n1"},
        "topic": "T",
        "queues": 2,
        "timeout": 1.0,
        "broker_name": None,
        **extra,
    }


def test_queue_clients_of_a_process_share_one_instance() -> None:
    async def main() -> None:
        ep = QueueEndpoints(_spec())
        a, b = queue_client(ep, None), queue_client(ep, "broker-b")
        shared = a.consumer.instance
        assert b.consumer.instance is shared and a.producer.instance is shared
        assert b.producer.instance.routes is shared.routes  # one route table: one lookup per process
        assert ep.queue_client().consumer.instance is not shared  # the plain client keeps its own
        await a.close()  # a replaced client (after an indefinite operation) leaves it open
        assert not shared.closed
        await ep.close_shared_clients()
        assert shared.closed
        c = queue_client(ep, None)  # a later client gets a fresh one
        assert c.consumer.instance is not shared and not c.consumer.instance.closed
        await ep.close_shared_clients()
        assert c.consumer.instance.closed

    asyncio.run(main())


def test_each_event_loop_gets_its_own_shared_instance() -> None:
    ep = QueueEndpoints(_spec())

    async def one() -> Any:
        return queue_client(ep, None).consumer.instance

    first = asyncio.run(one())
    second = asyncio.run(one())
    assert first is not second  # an instance belongs to the loop that built it


def test_rocketmq_clients_do_not_share() -> None:
    async def main() -> None:
        ep = QueueEndpoints(_spec(rocketmq=True))
        a, b = queue_client(ep, None), queue_client(ep, None)
        assert a.shared is None and a.consumer.instance is not b.consumer.instance
        await a.close()
        await b.close()
        await ep.close_shared_clients()

    asyncio.run(main())
