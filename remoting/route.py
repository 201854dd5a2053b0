"""Route data as the nameserver hands it out: which brokers serve a topic, and where they are.

Shared by the nameserver (producing it), producers and consumers (reading it) and admin
tools; wire names are RocketMQ's (``queueDatas``, ``brokerDatas``, ``brokerAddrs``,
``enableActingMaster``, ``filterServerTable``: clients written for RocketMQ 5 fail without the
last two). ``brokerAddrs`` keys are written as quoted JSON strings (``{"0": ...}``), which
every RocketMQ client parses; Java's fastjson writes them unquoted (``{0: ...}``), and
``load_body`` accepts that too, so our clients can read a real RocketMQ nameserver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remoting.exceptions import RemotingCommandError
from remoting.jsonbody import Fields
from remoting.topic import MAX_QUEUE_NUMS

MASTER_ID = 0
"""Broker id of a broker group's master; any other id is a slave."""


@dataclass(frozen=True, slots=True)
class QueueData:
    """How one broker group serves one topic."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicSysFlag": self.topic_sys_flag,
        }

    @classmethod
    def from_json(cls, obj: Any, path: str) -> QueueData:
        f = Fields(obj, path)
        return cls(
            f.get_str("brokerName"),
            f.get_int("readQueueNums", lo=0, hi=MAX_QUEUE_NUMS),
            f.get_int("writeQueueNums", lo=0, hi=MAX_QUEUE_NUMS),
            f.get_int("perm", lo=0, hi=15),
            f.get_int("topicSysFlag", 0, lo=0),
        )


@dataclass(slots=True)
class BrokerData:
    """A broker group: its cluster, its name and the address of each member by broker id."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def select_broker_addr(self) -> str | None:
        """The master if there is one, else the lowest-id slave (for reads while the master is gone)."""
        if MASTER_ID in self.broker_addrs:
            return self.broker_addrs[MASTER_ID]
        return self.broker_addrs[min(self.broker_addrs)] if self.broker_addrs else None

    def copy(self) -> BrokerData:
        return BrokerData(self.cluster, self.broker_name, dict(self.broker_addrs))

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "brokerName": self.broker_name,
            "brokerAddrs": {str(k): v for k, v in sorted(self.broker_addrs.items())},
            "enableActingMaster": False,
        }

    @classmethod
    def from_json(cls, obj: Any, path: str) -> BrokerData:
        f = Fields(obj, path)
        addrs: dict[int, str] = {}
        for key, addr in f.get_obj("brokerAddrs", {}).items():
            try:
                broker_id = int(key)
            except ValueError:
                raise RemotingCommandError(f"{path}.brokerAddrs: key {key!r} is not a broker id") from None
            if not isinstance(addr, str) or not addr:
                raise RemotingCommandError(f"{path}.brokerAddrs.{key} must be a host:port string")
            addrs[broker_id] = addr
        return cls(f.get_str("cluster"), f.get_str("brokerName"), addrs)


@dataclass(slots=True)
class TopicRouteData:
    """Answer to GET_ROUTEINFO_BY_TOPIC."""

    queue_datas: list[QueueData] = field(default_factory=list)
    broker_datas: list[BrokerData] = field(default_factory=list)
    order_topic_conf: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "queueDatas": [q.to_json() for q in self.queue_datas],
            "brokerDatas": [b.to_json() for b in self.broker_datas],
            "filterServerTable": {},
        }
        if self.order_topic_conf is not None:
            doc["orderTopicConf"] = self.order_topic_conf
        return doc

    @classmethod
    def from_json(cls, obj: Any, path: str = "route") -> TopicRouteData:
        f = Fields(obj, path)
        queues = [
            QueueData.from_json(q, f"{path}.queueDatas[{i}]")
            for i, q in enumerate(f.get_list("queueDatas", []))
        ]
        brokers = [
            BrokerData.from_json(b, f"{path}.brokerDatas[{i}]")
            for i, b in enumerate(f.get_list("brokerDatas", []))
        ]
        return cls(queues, brokers, f.get_str("orderTopicConf", None, allow_empty=True))


@dataclass(slots=True)
class ClusterInfo:
    """Answer to GET_BROKER_CLUSTER_INFO: every broker group, and which groups each cluster has."""

    broker_addr_table: dict[str, BrokerData] = field(default_factory=dict)
    cluster_addr_table: dict[str, set[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerAddrTable": {name: bd.to_json() for name, bd in sorted(self.broker_addr_table.items())},
            "clusterAddrTable": {c: sorted(names) for c, names in sorted(self.cluster_addr_table.items())},
        }

    @classmethod
    def from_json(cls, obj: Any, path: str = "clusterInfo") -> ClusterInfo:
        f = Fields(obj, path)
        brokers = {
            name: BrokerData.from_json(raw, f"{path}.brokerAddrTable.{name}")
            for name, raw in f.get_obj("brokerAddrTable", {}).items()
        }
        clusters: dict[str, set[str]] = {}
        for cluster, names in f.get_obj("clusterAddrTable", {}).items():
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise RemotingCommandError(
                    f"{path}.clusterAddrTable.{cluster} must be a list of broker names"
                )
            clusters[cluster] = set(names)
        return cls(brokers, clusters)
