"""The harness's polls find a new master through the slaves, before the nameservers know it.

A poll whose master died used to ask a nameserver for the route and fail until the new master
had registered; under full load those lookups took hundreds of milliseconds. Now a poll with
no master known asks a member of the group (a slave answers a master-only pull with NOT_MASTER
naming the master) and goes on to the master it names within the same poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from jepsen.systems.broker import BrokerQueueClient
from jepsen.systems.clients import Definite
from tests.client_fake_broker import FakeCluster

TOPIC = "PollT"


@pytest.fixture()
def cluster() -> Iterator[FakeCluster]:
    c = FakeCluster({"broker-p": 3})
    c.add_topic(TOPIC, 1)
    try:
        yield c
    finally:
        c.close()


def test_poll_finds_the_new_master_through_a_slave(cluster: FakeCluster) -> None:
    group = cluster.groups["broker-p"]
    names = {n.addr: f"n{n.index}" for n in group.nodes}

    async def main() -> None:
        client = BrokerQueueClient([cluster.namesrv_addr], names, TOPIC, timeout=2.0)
        try:
            assert await client.poll(0, 0, 10) == []
            assert client.node == "n0"

            async def switch() -> None:  # n0 dies, n2 leads; nobody re-registers yet
                await group.nodes[0].kill()
                group.master = 2

            cluster.call(switch())
            with pytest.raises(Definite):  # the in-flight view: the dead master refuses
                await client.poll(0, 0, 10)
            # the nameservers list no master now; a slave (or n2 itself) is asked and names n2
            for _ in range(3):
                assert await client.poll(0, 0, 10) == []
                assert client.node == "n2"
            regs = [r for n in group.nodes[1:] for r in n.requests if r[0] == "PULL"]
            assert regs, "no member was asked"
        finally:
            await client.close()

    asyncio.run(main())
