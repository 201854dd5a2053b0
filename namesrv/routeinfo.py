"""The nameserver's route table, with RocketMQ RouteInfoManager semantics.

Pure data and rules: no sockets, no clock (callers pass ``now``), no locks. Every method runs
to completion on the nameserver's event loop, so the tables are never seen half-updated and
RocketMQ's read-write lock is unnecessary. ``channel`` is whatever object identifies a
broker's connection; here it is only compared by identity.

Tables (as in RocketMQ):
- cluster_addr_table:  cluster -> broker names
- broker_addr_table:   broker name -> BrokerData {broker id -> address}; id 0 is the master
- topic_queue_table:   topic -> broker name -> QueueData
- broker_live_table:   broker address -> BrokerLiveInfo (last update, data version, channel)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from remoting.route import MASTER_ID, BrokerData, ClusterInfo, QueueData, TopicRouteData
from remoting.topic import PERM_WRITE, DataVersion, TopicConfig

log = logging.getLogger("namesrv.routeinfo")


class TopicConfigSource(Protocol):
    """A broker's topic table and its version; ``topic_config_table`` may parse lazily and raise."""

    @property
    def data_version(self) -> DataVersion: ...

    @property
    def topic_config_table(self) -> Mapping[str, TopicConfig]: ...


@dataclass(slots=True)
class BrokerLiveInfo:
    """What the nameserver knows about one live broker process, keyed by its address."""

    broker_addr: str
    cluster: str
    broker_name: str
    broker_id: int
    last_update: float
    data_version: DataVersion
    channel: object | None
    ha_server_addr: str = ""


@dataclass(frozen=True, slots=True)
class RegisterResult:
    """What a registering broker learns: its group's master (for a slave) and whether this was new."""

    master_addr: str | None
    ha_server_addr: str | None
    first_registration: bool
    topics_updated: bool


class RouteInfoManager:
    """Route table of one nameserver; see the module docstring for the tables."""

    def __init__(self, *, delete_topic_with_broker_registration: bool = False) -> None:
        self.delete_topic_with_broker_registration = delete_topic_with_broker_registration
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}
        self.generation = 0
        """Bumped on every change a route or cluster-info answer could show; lets callers cache answers."""

    # --- registration ---------------------------------------------------------------------
    def register_broker(
        self,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str,
        topic_config: TopicConfigSource | None,
        channel: object | None,
        now: float,
    ) -> RegisterResult:
        """Add or refresh a broker; a master also publishes its topics when they changed or it is new.

        Decides first and mutates after: reading ``topic_config.topic_config_table`` may parse
        (and refuse) the broker's body, which must not leave the tables half-updated. A
        re-registration with an unchanged data version never parses the topic table at all.
        """
        broker_data = self.broker_addr_table.get(broker_name)
        first = broker_data is None or broker_id not in broker_data.broker_addrs
        data_version = topic_config.data_version if topic_config is not None else DataVersion()
        new_topics: Mapping[str, TopicConfig] | None = None
        if topic_config is not None and broker_id == MASTER_ID:
            if first or self.is_broker_topic_config_changed(broker_addr, data_version):
                new_topics = topic_config.topic_config_table  # may raise: nothing changed yet

        names = self.cluster_addr_table.setdefault(cluster, set())
        if broker_name not in names:
            names.add(broker_name)
            self.generation += 1
        if broker_data is None:
            broker_data = BrokerData(cluster, broker_name, {})
            self.broker_addr_table[broker_name] = broker_data
        elif broker_data.cluster != cluster:
            # The group moved to another cluster: keep each broker name in exactly one cluster.
            old = self.cluster_addr_table.get(broker_data.cluster)
            if old is not None:
                old.discard(broker_name)
                if not old:
                    del self.cluster_addr_table[broker_data.cluster]
            broker_data.cluster = cluster
            self.generation += 1
        addrs = broker_data.broker_addrs
        # One address, one entry: a slave promoted to master (DLedger role change) re-registers
        # from the same address with id 0, and its old slave entry must go.
        for stale_id in [i for i, a in addrs.items() if a == broker_addr and i != broker_id]:
            del addrs[stale_id]
            self.generation += 1
            log.info(
                "replaced broker entry with same address and another id",
                extra={
                    "broker_name": broker_name,
                    "broker_addr": broker_addr,
                    "old_id": stale_id,
                    "new_id": broker_id,
                },
            )
        old_addr = addrs.get(broker_id)
        if old_addr != broker_addr:
            addrs[broker_id] = broker_addr
            self.generation += 1
        if old_addr is not None and old_addr != broker_addr:
            log.info(
                "broker id moved to a new address",
                extra={
                    "broker_name": broker_name,
                    "broker_id": broker_id,
                    "old_addr": old_addr,
                    "new_addr": broker_addr,
                },
            )

        if new_topics is not None:
            for tc in new_topics.values():
                self._create_and_update_queue_data(broker_name, tc)
            if self.delete_topic_with_broker_registration:
                self._remove_topics_not_in(broker_name, new_topics.keys())

        prev = self.broker_live_table.get(broker_addr)
        self.broker_live_table[broker_addr] = BrokerLiveInfo(
            broker_addr, cluster, broker_name, broker_id, now, data_version, channel, ha_server_addr
        )
        if prev is None:
            log.info(
                "new broker registered",
                extra={
                    "cluster": cluster,
                    "broker_name": broker_name,
                    "broker_id": broker_id,
                    "broker_addr": broker_addr,
                },
            )

        master_addr = ha_addr = None
        if broker_id != MASTER_ID:
            master = addrs.get(MASTER_ID)
            if master is not None:
                live = self.broker_live_table.get(master)
                if live is not None:
                    master_addr, ha_addr = master, live.ha_server_addr or None
        return RegisterResult(master_addr, ha_addr, first, new_topics is not None)

    def _create_and_update_queue_data(self, broker_name: str, tc: TopicConfig) -> None:
        qd = QueueData(broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag)
        by_broker = self.topic_queue_table.setdefault(tc.topic_name, {})
        old = by_broker.get(broker_name)
        if old != qd:
            by_broker[broker_name] = qd
            self.generation += 1
            log.info(
                "topic queue data %s" % ("created" if old is None else "changed"),
                extra={"topic": tc.topic_name, "broker_name": broker_name, "queue_data": repr(qd)},
            )

    def _remove_topics_not_in(self, broker_name: str, keep: object) -> None:
        keep_set = set(keep)  # type: ignore[call-overload]
        for topic in [
            t for t, by in self.topic_queue_table.items() if broker_name in by and t not in keep_set
        ]:
            self._remove_queue_data(topic, broker_name)

    def unregister_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> bool:
        """Remove one broker process; its group's topics go when the group has no address left."""
        live = self.broker_live_table.pop(broker_addr, None)
        broker_data = self.broker_addr_table.get(broker_name)
        removed_addr = None
        if broker_data is not None:
            if broker_data.broker_addrs.get(broker_id) == broker_addr:
                removed_addr = broker_data.broker_addrs.pop(broker_id)
                self.generation += 1
            if not broker_data.broker_addrs:
                self._remove_broker_name(broker_name)
        log.info(
            "broker unregistered",
            extra={
                "cluster": cluster,
                "broker_name": broker_name,
                "broker_id": broker_id,
                "broker_addr": broker_addr,
                "was_live": live is not None,
                "was_in_table": removed_addr is not None,
            },
        )
        return live is not None or removed_addr is not None

    # --- liveness ------------------------------------------------------------------------
    def is_broker_topic_config_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        live = self.broker_live_table.get(broker_addr)
        return live is None or live.data_version != data_version

    def query_broker_topic_config(self, broker_addr: str) -> DataVersion | None:
        live = self.broker_live_table.get(broker_addr)
        return live.data_version if live is not None else None

    def update_broker_info_update_timestamp(self, broker_addr: str, now: float) -> None:
        live = self.broker_live_table.get(broker_addr)
        if live is not None:
            live.last_update = now

    def scan_not_active_broker(self, now: float, expiry_s: float) -> list[BrokerLiveInfo]:
        """Drop brokers silent for longer than ``expiry_s``; return them so their channels can be closed."""
        expired = [info for info in self.broker_live_table.values() if now - info.last_update > expiry_s]
        for info in expired:
            log.warning(
                "broker expired: no registration within the expiry",
                extra={
                    "broker_addr": info.broker_addr,
                    "broker_name": info.broker_name,
                    "silent_s": round(now - info.last_update, 3),
                    "expiry_s": expiry_s,
                },
            )
            self.remove_broker_addr(info.broker_addr)
        return expired

    def on_channel_destroy(self, channel: object) -> list[str]:
        """A connection closed: remove every broker that registered over it; return their addresses."""
        addrs = [a for a, info in self.broker_live_table.items() if info.channel is channel]
        for addr in addrs:
            log.info("broker connection closed; removing broker", extra={"broker_addr": addr})
            self.remove_broker_addr(addr)
        return addrs

    def remove_broker_addr(self, broker_addr: str) -> None:
        """Forget an address everywhere; groups left empty lose their cluster entry and topic routes."""
        self.broker_live_table.pop(broker_addr, None)
        for name, broker_data in list(self.broker_addr_table.items()):
            addrs = broker_data.broker_addrs
            for broker_id in [i for i, a in addrs.items() if a == broker_addr]:
                del addrs[broker_id]
                self.generation += 1
            if not addrs:
                self._remove_broker_name(name)

    def _remove_broker_name(self, broker_name: str) -> None:
        self.broker_addr_table.pop(broker_name, None)
        self.generation += 1
        for cluster, names in list(self.cluster_addr_table.items()):
            if broker_name in names:
                names.discard(broker_name)
                if not names:
                    del self.cluster_addr_table[cluster]
        for topic in [t for t, by in self.topic_queue_table.items() if broker_name in by]:
            self._remove_queue_data(topic, broker_name)
        log.info("broker group removed with its topic routes", extra={"broker_name": broker_name})

    def _remove_queue_data(self, topic: str, broker_name: str) -> None:
        by_broker = self.topic_queue_table.get(topic)
        if by_broker is None:
            return
        by_broker.pop(broker_name, None)
        self.generation += 1
        if not by_broker:
            del self.topic_queue_table[topic]
            log.info("topic removed: no broker group serves it any more", extra={"topic": topic})

    # --- queries -----------------------------------------------------------------------
    def pickup_topic_route_data(self, topic: str) -> TopicRouteData | None:
        """Queue data and broker addresses for ``topic``; None when no live group serves it."""
        by_broker = self.topic_queue_table.get(topic)
        if not by_broker:
            return None
        broker_datas = []
        for name in by_broker:
            bd = self.broker_addr_table.get(name)
            if bd is not None:
                broker_datas.append(bd.copy())
        if not broker_datas:
            return None
        return TopicRouteData(list(by_broker.values()), broker_datas)

    def get_all_cluster_info(self) -> ClusterInfo:
        return ClusterInfo(
            {name: bd.copy() for name, bd in self.broker_addr_table.items()},
            {cluster: set(names) for cluster, names in self.cluster_addr_table.items()},
        )

    def get_all_topic_list(self) -> list[str]:
        return sorted(self.topic_queue_table)

    def get_topics_by_cluster(self, cluster: str) -> list[str] | None:
        names = self.cluster_addr_table.get(cluster)
        if names is None:
            return None
        return sorted(t for t, by in self.topic_queue_table.items() if not names.isdisjoint(by))

    def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """Admin delete; with ``cluster`` only that cluster's groups stop serving the topic."""
        by_broker = self.topic_queue_table.get(topic)
        if by_broker is None:
            return False
        if cluster is None:
            del self.topic_queue_table[topic]
            self.generation += 1
            return True
        names = self.cluster_addr_table.get(cluster, set())
        removed = False
        for name in [n for n in by_broker if n in names]:
            self._remove_queue_data(topic, name)
            removed = True
        return removed

    def set_write_perm_of_broker(self, broker_name: str, writable: bool) -> int:
        """Wipe (or restore) the write permission of a group's queues; returns how many topics changed."""
        changed = 0
        for by_broker in self.topic_queue_table.values():
            qd = by_broker.get(broker_name)
            if qd is None:
                continue
            perm = qd.perm | PERM_WRITE if writable else qd.perm & ~PERM_WRITE
            if perm != qd.perm:
                by_broker[broker_name] = QueueData(
                    qd.broker_name, qd.read_queue_nums, qd.write_queue_nums, perm, qd.topic_sys_flag
                )
                changed += 1
                self.generation += 1
        return changed

    def counts(self) -> dict[str, int]:
        """Table sizes, for metrics."""
        return {
            "clusters": len(self.cluster_addr_table),
            "broker_groups": len(self.broker_addr_table),
            "brokers_live": len(self.broker_live_table),
            "topics": len(self.topic_queue_table),
        }
