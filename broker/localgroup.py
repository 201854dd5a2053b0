"""Nameservers and broker groups as real processes on 127.0.0.x: the broker's node specs for
``common.localgroup``, used by tests, benchmarks, the harness and ``broker local-cluster``.

What a broker node needs is here and nowhere else: its config file (``broker_config``), the
commands of a nameserver and a broker, the port layout (main port, fast channel at main - 2,
ledger port) and the group names. ``LocalBrokerGroup`` is one 3-broker group behind two
nameservers; ``LocalBrokerGroups`` is several groups behind the same nameservers. Processes
are named so the harness can kill, pause and restart them by PID.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from common.localgroup import LocalGroup, free_port_pair, secret_file_setting
from common.ports import PortPlan
from common.process import free_port, write_toml
from remoting import RemotingClient, RemotingCommand, RequestCode

#: brokers per group (a Raft group of three, as in RocketMQ's DLedger examples)
GROUP_SIZE = 3
#: broker groups one launcher stands up at most (they are named broker-a .. broker-z)
MAX_GROUPS = 26
#: ports one broker takes from a plan: fast channel (main - 2), ledger, main
PORTS_PER_BROKER = 3
#: seconds between two rounds of status requests while waiting for a master
MASTER_POLL_S = 0.1
#: seconds one status or route request may take while waiting for a master
STATUS_TIMEOUT_S = 1.0


def group_name(i: int) -> str:
    """broker-a, broker-b, ... as in RocketMQ's examples."""
    return f"broker-{chr(ord('a') + i)}"


def check_groups(groups: int) -> None:
    """ValueError naming the option when ``groups`` is outside 1..MAX_GROUPS."""
    if not 1 <= groups <= MAX_GROUPS:
        raise ValueError(f"--groups must be 1..{MAX_GROUPS}, got {groups}")


def broker_config(
    d: Path,
    *,
    broker_name: str,
    node_id: str,
    group: Sequence[str],
    namesrv_addrs: Sequence[str],
    listen_host: str,
    settings: Mapping[str, Any],
) -> Path:
    """Write broker ``node_id``'s ``broker.toml`` in ``d`` (owner-readable only: it names the
    cluster secret's file) and return its path. ``group`` is its members as
    ``id=broker_addr@ledger_addr``; ``settings`` (cluster secret, topics, timings, ``join``)
    come last and win."""
    d.mkdir(parents=True, exist_ok=True)
    conf = {
        "broker_name": broker_name,
        "node_id": node_id,
        "group": list(group),
        "namesrv_addr": list(namesrv_addrs),
        "data_dir": str(d / "data"),
        "listen_host": listen_host,
        **settings,
    }
    path = d / "broker.toml"
    write_toml(path, conf)
    path.chmod(0o600)
    return path


def namesrv_argv(python: str, addr: str, secret_file: str, node_name: str | None = None) -> list[str]:
    """The command of a nameserver listening on ``addr`` that requires the cluster secret."""
    host, port = addr.rsplit(":", 1)
    argv = [python, "-m", "namesrv", "--listen-host", host, "--listen-port", port]
    if node_name:
        argv += ["--node-name", node_name]
    return argv + ["--cluster-secret-file", secret_file]


def broker_argv(python: str, config: Path) -> list[str]:
    """The command of a broker started from its config file."""
    return [python, "-m", "broker", "--config", str(config)]


def listen_addresses(namesrvs: Sequence[str], brokers: Sequence[str], ledgers: Sequence[str]) -> list[str]:
    """Every ``host:port`` such processes listen on: nameservers, each broker's main and fast
    ports, its ledger port."""
    addrs = list(namesrvs) + list(ledgers)
    for addr in brokers:
        host, port = addr.rsplit(":", 1)
        addrs += [addr, f"{host}:{int(port) - 2}"]
    return addrs


async def runtime_info(client: RemotingClient, addr: str) -> dict[str, Any] | None:
    """A broker's runtime info (role, offsets), or None while it is down or starting."""
    try:
        resp = await client.invoke_sync(
            addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), STATUS_TIMEOUT_S
        )
    except Exception:  # noqa: BLE001 - a broker that is down or starting
        return None
    return json.loads(bytes(resp.body)) if resp.is_success else None


class BrokerProcesses(LocalGroup):
    """What every local broker layout shares: start-up order, nameservers, broker config files.

    Subclasses set ``namesrv_ids``, ``ns_addr``, ``node_ids``, ``broker_addr``, ``ledger_addr``,
    ``topics``, ``settings`` and ``python``, and provide ``write_configs`` and ``start_broker``.
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
    def namesrv_addrs(self) -> list[str]:
        return [self.ns_addr[n] for n in self.namesrv_ids]

    def listen_addresses(self) -> list[str]:
        """Every ``host:port`` these processes will listen on: picked free but not yet bound,
        so nothing else may take one."""
        return listen_addresses(
            list(self.ns_addr.values()), list(self.broker_addr.values()), list(self.ledger_addr.values())
        )

    def peer_ledger_addr(self, nid: str, peer: str) -> str:
        """Where ``nid`` dials ``peer``'s ledger node (the harness routes this through a proxy)."""
        return self.ledger_addr[peer]

    def node_settings(self, nid: str) -> dict[str, Any]:
        """Settings of broker ``nid``'s own beside the group's (none here; a harness adds
        ``ledger_dial`` so that members added later are dialled through its proxies too)."""
        return {}

    @abstractmethod
    def start_broker(self, nid: str) -> None: ...

    def start_nodes(self) -> None:
        for ns in self.namesrv_ids:
            self.start_namesrv(ns)
        for nid in self.node_ids:
            self.start_broker(nid)

    def cluster_secret_file(self) -> str:
        """The file of the cluster secret the brokers and nameservers share: the one the
        settings name, the inline one written out, or a fresh one (brokers need one)."""
        return secret_file_setting(self.settings, self.base_dir / "cluster.secret")

    def start_namesrv(self, ns: str) -> None:
        argv = namesrv_argv(self.python, self.ns_addr[ns], self.cluster_secret_file(), node_name=ns)
        self.spawn(ns, argv, self.base_dir / ns / "namesrv.log")

    def _write_broker_config(
        self,
        d: Path,
        broker_name: str,
        node_id: str,
        group: list[str],
        listen_host: str,
        own: Mapping[str, Any] | None = None,
    ) -> None:
        self.cluster_secret_file()
        broker_config(
            d,
            broker_name=broker_name,
            node_id=node_id,
            group=group,
            namesrv_addrs=self.namesrv_addrs,
            listen_host=listen_host,
            settings={"topics": self.topics, **self.settings, **(own or {})},
        )

    async def runtime_info(self, client: RemotingClient, nid: str) -> dict[str, Any] | None:
        return await runtime_info(client, self.broker_addr[nid])


class LocalBrokerGroup(BrokerProcesses):
    """Brokers n1..nN of one group on 127.0.0.1..N (main, fast and ledger ports each), and
    nameservers ns1, ns2 on 127.0.0.1 and 127.0.0.2; a broker's process is ``broker-nK``."""

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
    def namesrv_addr_str(self) -> str:
        return ";".join(self.namesrv_addrs)

    def name_of(self, node_id: str) -> str:
        return f"broker-{node_id}"

    def write_configs(self) -> None:
        for nid in self.node_ids:
            group = [
                f"{n}={self.broker_addr[n]}@{self.ledger_addr[n] if n == nid else self.peer_ledger_addr(nid, n)}"
                for n in self.node_ids
            ]
            host = self.broker_addr[nid].rsplit(":", 1)[0]
            self._write_broker_config(
                self.base_dir / self.name_of(nid), self.broker_name, nid, group, host, self.node_settings(nid)
            )

    def start_broker(self, nid: str) -> None:
        d = self.base_dir / self.name_of(nid)
        self.spawn(self.name_of(nid), broker_argv(self.python, d / "broker.toml"), d / "broker.log")

    def kill_broker(self, nid: str, sig: int = 9) -> None:
        self.kill(self.name_of(nid), sig)

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
                await asyncio.sleep(MASTER_POLL_S)
        raise TimeoutError(f"no master routed by the nameservers within {timeout}s; logs in {self.base_dir}")

    async def _routed(self, client: RemotingClient, topic: str, addr: str) -> bool:
        for ns in self.namesrv_addrs:
            try:
                resp = await client.invoke_sync(
                    ns,
                    RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}),
                    STATUS_TIMEOUT_S,
                )
            except Exception:  # noqa: BLE001
                continue
            if resp.is_success and addr in bytes(resp.body).decode(errors="replace"):
                return True
        return False


class LocalBrokerGroups(BrokerProcesses):
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
        check_groups(groups)
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
                self.plan_broker(nid, k)
        self.node_ids = [nid for name in self.broker_names for nid in self.members[name]]

    def plan_broker(self, nid: str, k: int) -> None:
        """Addresses for broker ``nid`` on the plan's host ``k``: a block of fast channel,
        ledger and main port."""
        host = self.ports.host(k)
        fast = self.ports.block(host, PORTS_PER_BROKER)
        self.ledger_addr[nid] = f"{host}:{fast + 1}"
        self.broker_addr[nid] = f"{host}:{fast + 2}"

    def group_of(self, nid: str) -> str:
        """The broker name of the group ``nid`` belongs to."""
        return nid.split("/", 1)[0]

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
                self._write_broker_config(
                    self.node_dir(nid), name, nid.split("/", 1)[1], peers, host, self.node_settings(nid)
                )

    def start_broker(self, nid: str) -> None:
        d = self.node_dir(nid)
        self.spawn(nid, broker_argv(self.python, d / "broker.toml"), d / "broker.log")
