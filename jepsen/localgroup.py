"""Two nameservers and one 3-broker group (or several: ``LocalBrokerGroups``) as real processes on
127.0.0.x, for tests, benchmarks and the harness.

Brokers b1..b3 run on 127.0.0.1..3, each with a main port, the fast port (main - 2) and
a ledger port; nameservers ns1/ns2 run on 127.0.0.1 and 127.0.0.2. Processes are named
so the harness can kill, pause and restart them by PID.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from broker.localcluster import MAX_GROUPS, group_name
from common.cluster_secret import write_cluster_secret
from common.process import ProcessSet, free_port, write_toml
from jepsen.ports import PortPlan
from remoting import RemotingClient, RemotingCommand, RequestCode


def free_port_pair(host: str) -> int:
    """A port p such that p and p - 2 (RocketMQ's fast channel) were both free."""
    for _ in range(200):
        p = free_port(host)
        if p > 1026:
            try:
                import socket

                with socket.socket() as s:
                    s.bind((host, p - 2))
                return p
            except OSError:
                continue
    raise RuntimeError(f"no free port pair on {host}")


class _BrokerProcesses(ProcessSet, ABC):
    """What every local broker layout shares: start-up order, nameservers, broker config files.

    Subclasses set ``namesrv_ids``, ``ns_addr``, ``node_ids``, ``broker_addr``, ``ledger_addr``,
    ``topics``, ``settings`` and ``python``, and provide ``namesrv_addrs``, ``write_configs``
    and ``start_broker``.
    """

    namesrv_ids: list[str]
    ns_addr: dict[str, str]
    node_ids: list[str]
    broker_addr: dict[str, str]
    ledger_addr: dict[str, str]
    topics: Any
    settings: dict[str, Any]
    python: str

    @property
    @abstractmethod
    def namesrv_addrs(self) -> list[str]: ...

    def listen_addresses(self) -> list[str]:
        """Every ``host:port`` these processes will listen on (nameservers; each broker's main,
        fast and ledger ports): picked free but not yet bound, so nothing else may take one."""
        addrs = list(self.ns_addr.values()) + list(self.ledger_addr.values())
        for addr in self.broker_addr.values():
            host, port = addr.rsplit(":", 1)
            addrs += [addr, f"{host}:{int(port) - 2}"]
        return addrs

    @abstractmethod
    def write_configs(self) -> None: ...

    @abstractmethod
    def start_broker(self, nid: str) -> None: ...

    def start(self) -> None:
        self.write_configs()
        for ns in self.namesrv_ids:
            self.start_namesrv(ns)
        for nid in self.node_ids:
            self.start_broker(nid)

    def cluster_secret_file(self) -> str:
        """The file of the cluster secret the brokers and nameservers share: the one the
        settings name, the inline one written out, or a fresh one (brokers need one)."""
        named = self.settings.get("cluster_secret_file")
        if named:
            return str(named)
        path = self.base_dir / "cluster.secret"
        inline = self.settings.pop("cluster_secret", "")
        if inline:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(str(inline) + "\n", encoding="utf-8")
            path.chmod(0o600)
        elif not path.exists():
            write_cluster_secret(path)
        self.settings["cluster_secret_file"] = str(path)
        return str(path)

    def start_namesrv(self, ns: str) -> None:
        host, port = self.ns_addr[ns].rsplit(":", 1)
        argv = [self.python, "-m", "namesrv", "--listen-host", host, "--listen-port", port, "--node-name", ns]
        argv += ["--cluster-secret-file", self.cluster_secret_file()]
        self.spawn(ns, argv, self.base_dir / ns / "namesrv.log")

    def _write_broker_config(
        self, d: Path, broker_name: str, node_id: str, group: list[str], listen_host: str
    ) -> None:
        d.mkdir(parents=True, exist_ok=True)
        self.cluster_secret_file()
        conf = {
            "broker_name": broker_name,
            "node_id": node_id,
            "group": group,
            "namesrv_addr": self.namesrv_addrs,
            "data_dir": str(d / "data"),
            "listen_host": listen_host,
            "topics": self.topics,
            **self.settings,
        }
        write_toml(d / "broker.toml", conf)


class LocalBrokerGroup(_BrokerProcesses):
    def __init__(
        self,
        base_dir: str | Path,
        *,
        brokers: int = 3,
        nameservers: int = 2,
        broker_name: str = "broker-a",
        topics: tuple[str, ...] = ("TopicTest:4",),
        settings: Mapping[str, Any] | None = None,
        python: str = sys.executable,
    ) -> None:
        super().__init__(base_dir)
        self.python = python
        self.broker_name = broker_name
        self.topics = list(topics)
        self.settings = dict(settings or {})
        self.namesrv_ids = [f"ns{i + 1}" for i in range(nameservers)]
        self.ns_addr = {
            ns: f"127.0.0.{i + 1}:{free_port(f'127.0.0.{i + 1}')}" for i, ns in enumerate(self.namesrv_ids)
        }
        self.node_ids = [f"n{i + 1}" for i in range(brokers)]
        self.broker_addr: dict[str, str] = {}
        self.ledger_addr: dict[str, str] = {}
        for i, nid in enumerate(self.node_ids):
            host = f"127.0.0.{i + 1}"
            self.broker_addr[nid] = f"{host}:{free_port_pair(host)}"
            self.ledger_addr[nid] = f"{host}:{free_port(host)}"

    @property
    def namesrv_addrs(self) -> list[str]:
        return [self.ns_addr[n] for n in self.namesrv_ids]

    @property
    def namesrv_addr_str(self) -> str:
        return ";".join(self.namesrv_addrs)

    def name_of(self, node_id: str) -> str:
        return f"broker-{node_id}"

    def peer_ledger_addr(self, nid: str, peer: str) -> str:
        """Where ``nid`` dials ``peer``'s ledger node (the harness routes this through a proxy)."""
        return self.ledger_addr[peer]

    def write_configs(self) -> None:
        for nid in self.node_ids:
            group = [
                f"{n}={self.broker_addr[n]}@{self.ledger_addr[n] if n == nid else self.peer_ledger_addr(nid, n)}"
                for n in self.node_ids
            ]
            host = self.broker_addr[nid].rsplit(":", 1)[0]
            self._write_broker_config(self.base_dir / self.name_of(nid), self.broker_name, nid, group, host)

    def start_broker(self, nid: str) -> None:
        d = self.base_dir / self.name_of(nid)
        argv = [self.python, "-m", "broker", "--config", str(d / "broker.toml")]
        self.spawn(self.name_of(nid), argv, d / "broker.log")

    def kill_broker(self, nid: str, sig: int = 9) -> None:
        self.kill(self.name_of(nid), sig)

    def __enter__(self) -> LocalBrokerGroup:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def runtime_info(self, client: RemotingClient, nid: str) -> dict[str, Any] | None:
        try:
            resp = await client.invoke_sync(
                self.broker_addr[nid], RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 1.0
            )
        except Exception:  # noqa: BLE001 - a broker that is down or starting
            return None
        return json.loads(bytes(resp.body)) if resp.is_success else None

    async def wait_for_master(
        self, timeout: float = 30.0, exclude: set[str] | None = None, topic: str | None = None
    ) -> str:
        """Wait until a broker is master, its topics exist and a nameserver routes to it; returns its node id."""
        deadline = time.monotonic() + timeout
        topic = topic or (self.topics[0].split(":")[0] if self.topics else None)
        async with RemotingClient() as client:
            while time.monotonic() < deadline:
                for nid in self.node_ids:
                    if exclude and nid in exclude or not self.is_running(self.name_of(nid)):
                        continue
                    info = await self.runtime_info(client, nid)
                    if not info or info.get("role") != "MASTER":
                        continue
                    if topic is None or await self._routed(client, topic, self.broker_addr[nid]):
                        return nid
                await asyncio.sleep(0.1)
        raise TimeoutError(f"no master routed by the nameservers within {timeout}s; logs in {self.base_dir}")

    async def _routed(self, client: RemotingClient, topic: str, addr: str) -> bool:
        for ns in self.namesrv_addrs:
            try:
                resp = await client.invoke_sync(
                    ns, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), 1.0
                )
            except Exception:  # noqa: BLE001
                continue
            if resp.is_success and addr in bytes(resp.body).decode(errors="replace"):
                return True
        return False


#: brokers per group in ``LocalBrokerGroups`` (a Raft group of three, as in RocketMQ's DLedger examples)
GROUP_SIZE = 3
#: ports one broker takes from a plan: fast channel (main - 2), ledger, main
PORTS_PER_BROKER = 3


class LocalBrokerGroups(_BrokerProcesses):
    """Nameservers and ``groups`` 3-broker groups as local processes, all behind the same nameservers.

    Groups are named as ``broker local-cluster`` names them (``broker-a``, ``broker-b``, ...);
    a broker's node id is ``<group>/<n>`` (``broker-b/n2``), which is also its process name
    and directory, so every place the harness names a node also says which group it is in.
    Broker ``nK`` of every group runs on the plan's host ``K`` (127.0.0.1..3 by default), the
    nameservers on hosts 0 and 1; ports come from the ``PortPlan`` (``--port-base``) or the OS.
    """

    def __init__(
        self,
        base_dir: str | Path,
        *,
        groups: int,
        nameservers: int = 2,
        topics: tuple[str, ...] = ("TopicTest:4",),
        settings: Mapping[str, Any] | None = None,
        ports: PortPlan | None = None,
        python: str = sys.executable,
    ) -> None:
        if not 1 <= groups <= MAX_GROUPS:
            raise ValueError(f"--groups must be 1..{MAX_GROUPS}, got {groups}")
        super().__init__(base_dir)
        self.python = python
        self.topics = list(topics)
        self.settings = dict(settings or {})
        self.ports = ports or PortPlan()
        self.broker_names = [group_name(i) for i in range(groups)]
        self.namesrv_ids = [f"ns{i + 1}" for i in range(nameservers)]
        self.ns_addr: dict[str, str] = {}
        for i, ns in enumerate(self.namesrv_ids):
            host = self.ports.host(i)
            self.ns_addr[ns] = f"{host}:{self.ports.port(host)}"
        self.members: dict[str, list[str]] = {}
        self.broker_addr: dict[str, str] = {}
        self.ledger_addr: dict[str, str] = {}
        for name in self.broker_names:
            self.members[name] = [f"{name}/n{k + 1}" for k in range(GROUP_SIZE)]
            for k, nid in enumerate(self.members[name]):
                host = self.ports.host(k)
                fast = self.ports.block(host, PORTS_PER_BROKER)
                self.ledger_addr[nid] = f"{host}:{fast + 1}"
                self.broker_addr[nid] = f"{host}:{fast + 2}"
        self.node_ids = [nid for name in self.broker_names for nid in self.members[name]]

    @property
    def namesrv_addrs(self) -> list[str]:
        return [self.ns_addr[n] for n in self.namesrv_ids]

    def group_of(self, nid: str) -> str:
        """The broker name of the group ``nid`` belongs to."""
        return nid.split("/", 1)[0]

    def peer_ledger_addr(self, nid: str, peer: str) -> str:
        """Where ``nid`` dials ``peer``'s ledger node (the harness routes this through a proxy)."""
        return self.ledger_addr[peer]

    def node_dir(self, nid: str) -> Path:
        return self.base_dir / nid

    def write_configs(self) -> None:
        for name in self.broker_names:
            for nid in self.members[name]:
                peers = [
                    f"{p.split('/', 1)[1]}={self.broker_addr[p]}@"
                    f"{self.ledger_addr[p] if p == nid else self.peer_ledger_addr(nid, p)}"
                    for p in self.members[name]
                ]
                host = self.broker_addr[nid].rsplit(":", 1)[0]
                self._write_broker_config(self.node_dir(nid), name, nid.split("/", 1)[1], peers, host)

    def start_broker(self, nid: str) -> None:
        d = self.node_dir(nid)
        self.spawn(nid, [self.python, "-m", "broker", "--config", str(d / "broker.toml")], d / "broker.log")

    async def runtime_info(self, client: RemotingClient, nid: str) -> dict[str, Any] | None:
        try:
            resp = await client.invoke_sync(
                self.broker_addr[nid], RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 1.0
            )
        except Exception:  # noqa: BLE001 - a broker that is down or starting
            return None
        return json.loads(bytes(resp.body)) if resp.is_success else None
