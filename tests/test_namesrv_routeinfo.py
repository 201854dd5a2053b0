"""Route table semantics (RocketMQ RouteInfoManager), without sockets or clocks."""

from __future__ import annotations

import pytest

from namesrv.kvconfig import KVConfigError, KVConfigManager
from namesrv.routeinfo import RouteInfoManager
from remoting.topic import PERM_READ, PERM_READ_WRITE, DataVersion, TopicConfig, TopicConfigWrapper

pytestmark = pytest.mark.timeout(30)

EXPIRY = 120.0


def topics(*names: str, version: int = 1, queues: int = 4) -> TopicConfigWrapper:
    return TopicConfigWrapper({n: TopicConfig(n, queues, queues) for n in names}, DataVersion(1000, version))


def register(
    rim: RouteInfoManager,
    addr: str,
    broker_id: int,
    tc: TopicConfigWrapper | None = None,
    *,
    name: str = "broker-a",
    cluster: str = "c1",
    channel: object | None = None,
    now: float = 0.0,
    ha: str = "",
):
    return rim.register_broker(cluster, addr, name, broker_id, ha, tc, channel, now)


def test_first_master_registration_fills_every_table() -> None:
    rim = RouteInfoManager()
    result = register(rim, "10.0.0.1:10911", 0, topics("orders", "audit"))
    assert result.first_registration and result.topics_updated and result.master_addr is None
    assert rim.cluster_addr_table == {"c1": {"broker-a"}}
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: "10.0.0.1:10911"}
    assert set(rim.topic_queue_table) == {"orders", "audit"}
    qd = rim.topic_queue_table["orders"]["broker-a"]
    assert (qd.read_queue_nums, qd.write_queue_nums, qd.perm) == (4, 4, PERM_READ_WRITE)
    assert rim.broker_live_table["10.0.0.1:10911"].data_version == DataVersion(1000, 1)


def test_route_lookup_has_queue_data_and_all_addresses() -> None:
    rim = RouteInfoManager()
    register(rim, "a:1", 0, topics("orders"))
    register(rim, "b:1", 1, topics("orders"))
    register(rim, "c:1", 0, topics("orders"), name="broker-b")
    route = rim.pickup_topic_route_data("orders")
    assert route is not None
    assert sorted(q.broker_name for q in route.queue_datas) == ["broker-a", "broker-b"]
    addrs = {b.broker_name: b.broker_addrs for b in route.broker_datas}
    assert addrs == {"broker-a": {0: "a:1", 1: "b:1"}, "broker-b": {0: "c:1"}}
    assert rim.pickup_topic_route_data("nope") is None
    # the route is a copy: mutating it does not touch the table
    route.broker_datas[0].broker_addrs.clear()
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: "a:1", 1: "b:1"}


def test_slave_learns_its_master_and_does_not_write_topics() -> None:
    rim = RouteInfoManager()
    register(rim, "m:1", 0, topics("orders"), ha="m:10912")
    result = register(rim, "s:1", 1, topics("orders", "slave-only"))
    assert result.master_addr == "m:1" and result.ha_server_addr == "m:10912"
    assert not result.topics_updated
    assert "slave-only" not in rim.topic_queue_table


def test_slave_without_live_master_gets_no_master_address() -> None:
    rim = RouteInfoManager()
    result = register(rim, "s:1", 1, topics("orders"))
    assert result.master_addr is None
    assert rim.pickup_topic_route_data("orders") is None  # nothing written by a slave


def test_topics_are_rewritten_only_when_the_data_version_changes() -> None:
    rim = RouteInfoManager()
    register(rim, "m:1", 0, topics("orders", version=1, queues=4))
    again = register(rim, "m:1", 0, topics("orders", "new", version=1, queues=8))
    assert not again.topics_updated and not again.first_registration
    assert "new" not in rim.topic_queue_table
    assert rim.topic_queue_table["orders"]["broker-a"].write_queue_nums == 4
    changed = register(rim, "m:1", 0, topics("orders", "new", version=2, queues=8))
    assert changed.topics_updated
    assert rim.topic_queue_table["new"]["broker-a"].write_queue_nums == 8
    assert rim.topic_queue_table["orders"]["broker-a"].write_queue_nums == 8
    # without the option, topics the master dropped stay routable (RocketMQ 4 behaviour)
    register(rim, "m:1", 0, topics("new", version=3))
    assert "orders" in rim.topic_queue_table


def test_delete_topic_with_broker_registration_option() -> None:
    rim = RouteInfoManager(delete_topic_with_broker_registration=True)
    register(rim, "m:1", 0, topics("orders", "audit", version=1))
    register(rim, "m:1", 0, topics("audit", version=2))
    assert set(rim.topic_queue_table) == {"audit"}


def test_master_switch_same_address_new_id_replaces_the_stale_entry() -> None:
    rim = RouteInfoManager()
    register(rim, "n1:1", 0, topics("orders"))
    register(rim, "n2:1", 1, topics("orders"))
    # DLedger: n2 won the election and re-registers as master from the same address
    result = register(rim, "n2:1", 0, topics("orders"))
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: "n2:1"}
    assert not result.first_registration  # id 0 had an address before (n1)
    # the old master comes back as a slave with a new id
    back = register(rim, "n1:1", 2, topics("orders"))
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: "n2:1", 2: "n1:1"}
    assert back.master_addr == "n2:1"
    route = rim.pickup_topic_route_data("orders")
    assert route is not None and route.broker_datas[0].broker_addrs == {0: "n2:1", 2: "n1:1"}


def test_old_master_demoted_first_leaves_group_without_master_until_new_one_registers() -> None:
    rim = RouteInfoManager()
    register(rim, "n1:1", 0, topics("orders"))
    register(rim, "n2:1", 1, topics("orders"))
    register(rim, "n1:1", 2, topics("orders"))  # n1 became follower before n2 registered as leader
    assert rim.broker_addr_table["broker-a"].broker_addrs == {1: "n2:1", 2: "n1:1"}
    route = rim.pickup_topic_route_data("orders")
    assert route is not None and route.broker_datas[0].master_addr is None
    register(rim, "n2:1", 0, topics("orders"))
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: "n2:1", 2: "n1:1"}


def test_expiry_removes_silent_brokers_only() -> None:
    rim = RouteInfoManager()
    register(rim, "m:1", 0, topics("orders"), now=0.0)
    register(rim, "s:1", 1, topics("orders"), now=0.0)
    register(rim, "s:1", 1, topics("orders"), now=100.0)  # the slave keeps registering
    assert rim.scan_not_active_broker(now=120.0, expiry_s=EXPIRY) == []  # exactly at the expiry: kept
    expired = rim.scan_not_active_broker(now=121.0, expiry_s=EXPIRY)
    assert [e.broker_addr for e in expired] == ["m:1"]
    assert rim.broker_addr_table["broker-a"].broker_addrs == {1: "s:1"}
    # the group still has an address, so its topic stays routable (consumers can read the slave)
    route = rim.pickup_topic_route_data("orders")
    assert route is not None and route.broker_datas[0].select_broker_addr() == "s:1"
    expired = rim.scan_not_active_broker(now=300.0, expiry_s=EXPIRY)
    assert [e.broker_addr for e in expired] == ["s:1"]
    assert rim.topic_queue_table == {} and rim.broker_addr_table == {} and rim.cluster_addr_table == {}


def test_version_query_refresh_keeps_a_broker_alive() -> None:
    rim = RouteInfoManager()
    register(rim, "m:1", 0, topics("orders"), now=0.0)
    rim.update_broker_info_update_timestamp("m:1", 110.0)
    assert rim.scan_not_active_broker(now=200.0, expiry_s=EXPIRY) == []


def test_removing_one_group_keeps_the_topic_for_the_other() -> None:
    rim = RouteInfoManager()
    register(rim, "a:1", 0, topics("orders"), name="broker-a")
    register(rim, "b:1", 0, topics("orders"), name="broker-b", now=50.0)
    rim.scan_not_active_broker(now=130.0, expiry_s=EXPIRY)
    route = rim.pickup_topic_route_data("orders")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["broker-b"]
    assert rim.cluster_addr_table == {"c1": {"broker-b"}}


def test_closed_channel_removes_the_brokers_registered_over_it() -> None:
    rim = RouteInfoManager()
    ch_m, ch_s, ch_new = object(), object(), object()
    register(rim, "m:1", 0, topics("orders"), channel=ch_m)
    register(rim, "s:1", 1, topics("orders"), channel=ch_s)
    assert rim.on_channel_destroy(ch_m) == ["m:1"]
    assert rim.broker_addr_table["broker-a"].broker_addrs == {1: "s:1"}
    # a broker that reconnected and re-registered on a new channel survives its old channel closing
    register(rim, "s:1", 1, topics("orders"), channel=ch_new)
    assert rim.on_channel_destroy(ch_s) == []
    assert "s:1" in rim.broker_live_table
    assert rim.on_channel_destroy(ch_new) == ["s:1"]
    assert rim.pickup_topic_route_data("orders") is None


def test_unregister_removes_only_a_matching_entry() -> None:
    rim = RouteInfoManager()
    register(rim, "new-master:1", 0, topics("orders"))
    # an old master that lost id 0 must not remove the new master when it unregisters
    assert rim.unregister_broker("c1", "old-master:1", "broker-a", 0) is False
    assert rim.broker_addr_table["broker-a"].broker_addrs == {0: "new-master:1"}
    assert rim.unregister_broker("c1", "new-master:1", "broker-a", 0) is True
    assert rim.broker_addr_table == {} and rim.topic_queue_table == {} and rim.broker_live_table == {}


def test_data_version_comparison() -> None:
    rim = RouteInfoManager()
    assert rim.is_broker_topic_config_changed("m:1", DataVersion(1, 1))  # unknown broker
    register(rim, "m:1", 0, topics("orders", version=5))
    assert not rim.is_broker_topic_config_changed("m:1", DataVersion(1000, 5))
    assert rim.is_broker_topic_config_changed("m:1", DataVersion(1000, 6))
    assert rim.is_broker_topic_config_changed("m:1", DataVersion(1001, 5))
    assert rim.query_broker_topic_config("m:1") == DataVersion(1000, 5)
    assert DataVersion(5, 1).next(now_ms=9) == DataVersion(9, 2)


def test_cluster_info_topics_by_cluster_and_admin_operations() -> None:
    rim = RouteInfoManager()
    register(rim, "a:1", 0, topics("orders", "audit"), name="broker-a", cluster="c1")
    register(rim, "b:1", 0, topics("orders", "metrics"), name="broker-b", cluster="c2")
    info = rim.get_all_cluster_info()
    assert info.cluster_addr_table == {"c1": {"broker-a"}, "c2": {"broker-b"}}
    assert info.broker_addr_table["broker-b"].broker_addrs == {0: "b:1"}
    assert rim.get_all_topic_list() == ["audit", "metrics", "orders"]
    assert rim.get_topics_by_cluster("c2") == ["metrics", "orders"]
    assert rim.get_topics_by_cluster("nope") is None
    assert rim.set_write_perm_of_broker("broker-a", False) == 2
    assert rim.topic_queue_table["orders"]["broker-a"].perm == PERM_READ
    assert rim.topic_queue_table["orders"]["broker-b"].perm == PERM_READ_WRITE
    assert rim.set_write_perm_of_broker("broker-a", True) == 2
    assert rim.delete_topic("orders", cluster="c1")
    assert list(rim.topic_queue_table["orders"]) == ["broker-b"]
    assert rim.delete_topic("orders") and not rim.delete_topic("orders")
    assert rim.counts() == {"clusters": 2, "broker_groups": 2, "brokers_live": 2, "topics": 2}


def test_group_moving_to_another_cluster_is_listed_once() -> None:
    rim = RouteInfoManager()
    register(rim, "a:1", 0, topics("orders"), cluster="old")
    register(rim, "a:1", 0, topics("orders"), cluster="new")
    assert rim.cluster_addr_table == {"new": {"broker-a"}}
    assert rim.broker_addr_table["broker-a"].cluster == "new"


def test_kv_config_persists_atomically_and_refuses_a_corrupt_file(tmp_path) -> None:
    path = tmp_path / "kv" / "kvConfig.json"
    kv = KVConfigManager(path)
    kv.put("ORDER_TOPIC_CONFIG", "orders", "broker-a:4;broker-b:4")
    kv.put("ns", "k", "v")
    assert kv.delete("ns", "k") and not kv.delete("ns", "k")
    again = KVConfigManager(path)
    again.load()
    assert again.table == {"ORDER_TOPIC_CONFIG": {"orders": "broker-a:4;broker-b:4"}}
    with pytest.raises(KVConfigError, match="namespace must be"):
        kv.put("", "k", "v")
    path.write_text("{not json")
    with pytest.raises(KVConfigError, match=f"kv config file {path}: cannot read"):
        KVConfigManager(path).load()
    path.write_text('{"configTable": {"ns": {"k": 1}}}')
    with pytest.raises(KVConfigError, match="must map strings to strings"):
        KVConfigManager(path).load()


def _answers(rim: RouteInfoManager) -> str:
    routes = {t: rim.pickup_topic_route_data(t) for t in ("orders", "audit", "new")}
    return repr({t: r.to_json() if r else None for t, r in routes.items()}) + repr(
        rim.get_all_cluster_info().to_json()
    )


def test_generation_changes_whenever_a_route_answer_would() -> None:
    """The processor caches encoded routes per generation; a missed bump would serve stale routes."""
    rim = RouteInfoManager(delete_topic_with_broker_registration=True)
    ch = object()
    steps = [
        lambda: register(rim, "a:1", 0, topics("orders", "audit")),
        lambda: register(rim, "a:1", 0, topics("orders", "audit")),  # unchanged
        lambda: register(rim, "b:1", 1, topics("orders")),
        lambda: register(rim, "b:1", 0, topics("orders", version=2)),  # master switch
        lambda: register(rim, "a:1", 2, topics("orders")),
        lambda: register(rim, "b:1", 0, topics("orders", "new", version=3, queues=2)),
        lambda: register(rim, "b:1", 0, topics("new", version=4, queues=2)),  # drops orders
        lambda: rim.set_write_perm_of_broker("broker-a", False),
        lambda: rim.set_write_perm_of_broker("broker-a", True),
        lambda: register(rim, "c:1", 0, topics("new"), name="broker-c", cluster="c2", channel=ch),
        lambda: register(rim, "c:1", 0, topics("new"), name="broker-c", cluster="c3", channel=ch),
        lambda: rim.delete_topic("new", cluster="c3"),
        lambda: rim.on_channel_destroy(ch),
        lambda: rim.unregister_broker("c1", "a:1", "broker-a", 2),
        lambda: rim.scan_not_active_broker(now=1000.0, expiry_s=EXPIRY),
        lambda: register(rim, "a:1", 0, topics("orders")),
        lambda: rim.delete_topic("orders"),
    ]
    before, gen = _answers(rim), rim.generation
    for i, step in enumerate(steps):
        step()
        after = _answers(rim)
        if after != before:
            assert rim.generation != gen, f"step {i} changed an answer without bumping the generation"
        before, gen = after, rim.generation
    assert rim.generation > 0


class _BadSource:
    """A topic table that fails when read, like a malformed registration body."""

    data_version = DataVersion(1000, 9)

    @property
    def topic_config_table(self):
        raise ValueError("bad topic table")


def test_a_refused_topic_table_leaves_the_tables_untouched() -> None:
    rim = RouteInfoManager()
    with pytest.raises(ValueError):
        register(rim, "m:1", 0, _BadSource())  # type: ignore[arg-type]
    assert rim.cluster_addr_table == {} and rim.broker_addr_table == {} and rim.broker_live_table == {}
    # a slave's table, or an unchanged master version, is never read at all
    register(rim, "s:1", 1, _BadSource())  # type: ignore[arg-type]
    register(rim, "m:1", 0, topics("orders", version=9))
    register(rim, "m:1", 0, _BadSource())  # type: ignore[arg-type]  # same version 1000/9
    assert set(rim.topic_queue_table) == {"orders"}
