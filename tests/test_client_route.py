"""Route cache, queue choice and nameserver rotation (no brokers needed except where noted)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Iterator
from typing import TypeVar

import pytest
from client_fake_broker import FakeCluster

from client import NamesrvClient, NoNameServerError, RouteNotFoundError, parse_namesrv_addrs
from client.errors import NameServerUnavailableError, NoBrokerAvailableError
from client.route import (
    MessageQueue,
    RouteTable,
    TopicPublishInfo,
    _Entry,
    publish_queues,
    subscribe_queues,
)
from namesrv.config import NamesrvConfig
from namesrv.controller import NamesrvController
from remoting import RemotingClient
from remoting.route import BrokerData, QueueData, TopicRouteData

pytestmark = pytest.mark.timeout(60)
T = TypeVar("T")


def run(coro: Awaitable[T], timeout: float = 20.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def dead_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def route() -> TopicRouteData:
    return TopicRouteData(
        [QueueData("a", 2, 2, 6), QueueData("b", 2, 2, 6), QueueData("c", 2, 2, 4), QueueData("d", 2, 2, 6)],
        [
            BrokerData("C", "a", {0: "h:1", 1: "h:2"}),
            BrokerData("C", "b", {0: "h:3"}),
            BrokerData("C", "c", {0: "h:4"}),
            BrokerData("C", "d", {1: "h:5"}),  # no master: electing
        ],
    )


# --- pure -----------------------------------------------------------------------------------------------
def test_parse_namesrv_addrs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_namesrv_addrs("h1:9876; h2:9877;;h1:9876") == ["h1:9876", "h2:9877"]
    assert parse_namesrv_addrs(["h1:1", "h2:2"]) == ["h1:1", "h2:2"]
    monkeypatch.setenv("NAMESRV_ADDR", "e:1;e:2")
    assert parse_namesrv_addrs(None) == ["e:1", "e:2"]
    assert parse_namesrv_addrs(None, use_env=False) == []
    with pytest.raises(ValueError, match="bad nameserver address 'nohost'"):
        parse_namesrv_addrs("nohost")


def test_publish_queues_need_write_perm_and_a_master() -> None:
    r = route()
    masters = {bd.broker_name for bd in r.broker_datas if bd.master_addr}
    qs = publish_queues("T", r, masters)
    assert sorted({q.broker_name for q in qs}) == ["a", "b"]  # c is read-only, d has no master
    assert len(qs) == 4
    assert sorted({q.broker_name for q in subscribe_queues("T", r)}) == ["a", "b", "c", "d"]


def test_select_queue_round_robin_and_avoid() -> None:
    qs = [MessageQueue("T", b, i) for b in ("a", "b") for i in range(2)]
    info = TopicPublishInfo("T", route(), qs)
    picks = [info.select_queue() for _ in range(400)]
    assert Counter(picks) == {q: 100 for q in qs}
    assert all(info.select_queue("a").broker_name == "b" for _ in range(20))
    only_a = TopicPublishInfo("T", route(), qs[:2])
    assert only_a.select_queue("a").broker_name == "a"  # nothing else: the failed one beats none
    assert info.select_by_queue_id(1).queue_id == 1
    with pytest.raises(NoBrokerAvailableError, match="no writable queue 7"):
        info.select_by_queue_id(7)
    with pytest.raises(NoBrokerAvailableError, match="no writable queue with a master"):
        TopicPublishInfo("T", route(), []).select_queue()


def test_master_hints_and_forgetting() -> None:
    table = RouteTable(NamesrvClient([], RemotingClient()))
    table.update_brokers({"a": BrokerData("C", "a", {0: "h:1", 1: "h:2"})})
    assert table.master_addr("a") == "h:1"
    assert table.broker_addrs("a") == ["h:1", "h:2"]
    table.note_master("a", "h:2")
    assert table.master_addr("a") == "h:2" and table.broker_addrs("a") == ["h:2", "h:1"]
    table.forget_master("a", "h:2")
    assert table.master_addr("a") == "h:1"
    table.forget_master("a", "h:1")
    assert table.master_addr("a") is None and table.broker_addrs("a") == ["h:2"]


# --- against nameservers -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster() -> Iterator[FakeCluster]:
    c = FakeCluster({"broker-r": 1})
    c.add_topic("RouteT", 2)
    try:
        yield c
    finally:
        c.close()


def test_no_nameserver_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)

    async def go() -> None:
        async with RemotingClient() as rc:
            await NamesrvClient(None, rc).get_topic_route("T")

    with pytest.raises(NoNameServerError, match="no nameserver address"):
        run(go())


def test_rotation_skips_dead_and_empty_nameservers(cluster: FakeCluster) -> None:
    """A dead nameserver and a freshly restarted (empty) one are both passed over."""
    empty = NamesrvController(NamesrvConfig(listen_host="127.0.0.1", listen_port=0))
    cluster.call(empty.start())
    try:

        async def go() -> tuple[TopicRouteData, str]:
            async with RemotingClient() as rc:
                ns = NamesrvClient([dead_addr(), empty.address, cluster.namesrv_addr], rc, timeout_s=1.0)
                ns._index = 0
                r = await ns.get_topic_route("RouteT")
                return r, ns.addrs[ns._index]

        r, sticky = run(go())
        assert r.broker_datas[0].broker_name == "broker-r"
        assert sticky == cluster.namesrv_addr  # the next call starts with the one that answered
    finally:
        cluster.call(empty.shutdown())


def test_route_not_found_and_unavailable(cluster: FakeCluster) -> None:
    async def missing() -> None:
        async with RemotingClient() as rc:
            await NamesrvClient(cluster.namesrv_addr, rc).get_topic_route("Nope")

    with pytest.raises(RouteNotFoundError, match="no route info for topic Nope"):
        run(missing())

    async def dead() -> None:
        async with RemotingClient() as rc:
            await NamesrvClient([dead_addr(), dead_addr()], rc, timeout_s=0.5).get_topic_route("T")

    with pytest.raises(NameServerUnavailableError, match="no nameserver answered"):
        run(dead())


def test_route_table_caches_and_shares_fetches(cluster: FakeCluster) -> None:
    async def go() -> tuple[int, int]:
        async with RemotingClient() as rc:
            table = RouteTable(NamesrvClient(cluster.namesrv_addr, rc), ttl_s=60)
            before = cluster.namesrvs[0].processor.stats.route_found
            infos = await asyncio.gather(*(table.publish_info("RouteT") for _ in range(20)))
            assert all(i is infos[0] for i in infos) and len(infos[0].queues) == 2
            await table.publish_info("RouteT")
            once = cluster.namesrvs[0].processor.stats.route_found - before
            table.invalidate("RouteT")
            await table.publish_info("RouteT")
            return once, cluster.namesrvs[0].processor.stats.route_found - before

    once, twice = run(go())
    assert (once, twice) == (1, 2)


def test_masterless_groups_are_chosen_last() -> None:
    qs = [MessageQueue("T", b, i) for b in ("a", "d") for i in range(2)]
    info = TopicPublishInfo("T", route(), qs, frozenset({"d"}))
    assert all(info.select_queue().broker_name == "a" for _ in range(20))
    assert info.select_by_queue_id(1).queue_id == 1  # a pinned id still reaches either group
    only_d = TopicPublishInfo("T", route(), qs[2:], frozenset({"d"}))
    assert only_d.select_queue().broker_name == "d"  # nothing else: ask d's slaves
    both = TopicPublishInfo("T", route(), qs, frozenset({"a", "d"}))
    assert all(both.select_queue("a").broker_name == "d" for _ in range(20))


def test_a_failed_master_is_not_taken_from_a_stale_route() -> None:
    table = RouteTable(NamesrvClient([], RemotingClient()))
    table.update_brokers({"a": BrokerData("C", "a", {0: "h:1", 2: "h:2", 3: "h:3"})})
    table.forget_master("a", "h:1")
    # the nameservers still list h:1 as master until they notice: not used, a slave is asked
    table.update_brokers({"a": BrokerData("C", "a", {0: "h:1", 2: "h:2", 3: "h:3"})})
    assert table.master_addr("a") is None
    assert table.recently_failed("a", "h:1") and not table.recently_failed("a", "h:2")
    assert {table.member_to_ask("a") for _ in range(40)} == {"h:2", "h:3"}
    assert table.member_to_ask("a", "h:2") == "h:3"
    table.note_master("a", "h:3")  # a slave named the new master
    assert table.master_addr("a") == "h:3"
    table.note_master("a", "h:1")  # restarted and elected again: no longer taken for dead
    assert table.master_addr("a") == "h:1"
    assert table.member_to_ask("b") is None


def test_forgetting_a_master_refreshes_the_route_behind_the_sends(cluster: FakeCluster) -> None:
    """A failed master's route stays usable (its slaves can be asked at once) while the
    nameservers are asked again in the background; a refresh that fails marks it stale."""

    async def go() -> None:
        async with RemotingClient() as rc:
            table = RouteTable(NamesrvClient(cluster.namesrv_addr, rc), ttl_s=60)
            info = await table.publish_info("RouteT")
            master = table.master_addr("broker-r")
            assert master is not None
            before = cluster.namesrvs[0].processor.stats.route_found
            table.forget_master("broker-r", master)
            assert table.fresh_publish_info("RouteT") is info  # no nameserver round trip first
            assert table.master_addr("broker-r") is None  # the route still lists it: not taken
            for _ in range(200):  # the refresh goes on behind (bounded wait)
                if cluster.namesrvs[0].processor.stats.route_found > before:
                    break
                await asyncio.sleep(0.01)
            assert cluster.namesrvs[0].processor.stats.route_found == before + 1
            table.forget_master(
                "broker-r", master
            )  # again, while one may still be in flight: one more at most
            await asyncio.sleep(0.2)
            assert cluster.namesrvs[0].processor.stats.route_found <= before + 2

        async with RemotingClient() as rc:  # nameservers unreachable: the refresh fails
            dead = socket.socket()
            dead.bind(("127.0.0.1", 0))
            port = dead.getsockname()[1]
            dead.close()
            table = RouteTable(NamesrvClient(f"127.0.0.1:{port}", rc, timeout_s=0.5), ttl_s=60)
            table.update_brokers({"a": BrokerData("C", "a", {0: "h:1", 1: "h:2"})})
            table._topics["T"] = _cached_route("T")
            table.forget_master("a", "h:1")
            assert table.fresh_publish_info("T") is not None
            for _ in range(200):
                if table.fresh_publish_info("T") is None:
                    break
                await asyncio.sleep(0.01)
            assert table.fresh_publish_info("T") is None  # stale: the next lookup asks again

    run(go())


def _cached_route(topic: str) -> _Entry:
    """A cached route of ``topic`` on group ``a`` (two queues), as a fetch would leave it."""
    r = TopicRouteData([QueueData("a", 2, 2, 6)], [BrokerData("C", "a", {0: "h:1", 1: "h:2"})])
    return _Entry(r, time.monotonic(), TopicPublishInfo(topic, r, publish_queues(topic, r, {"a"})))
