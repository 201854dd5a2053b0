"""``broker local-cluster``: a nameserver and N 3-broker groups as local processes, RocketMQ's
quick start for ledgermq.

Everything listens on loopback. The first line printed is ``namesrv=HOST:PORT`` (what a
RocketMQ application's ``namesrvAddr`` should be set to), then ``proxy=HOST:PORT`` (the
RocketMQ 5 gRPC proxy, ``proxy``, for 5.x clients' endpoints: port 8081 when free), then one
line per broker group once it has a master the nameserver routes to. SIGTERM or Ctrl-C stops every process
(by PID, through ``common.localgroup``) and the command exits. The node specs (configs,
commands, ports) are ``broker.localgroup``'s, shared with the tests and the harness.

Each process's PID is in ``<dir>/namesrv/namesrv.pid`` and ``<dir>/<group>/<node>/broker.pid``,
so that fault scripts (``jepsen run --system rocketmq --kill-cmd ...``) can kill one broker as
an operator would. Once every group is ready, a broker that dies is reported and the rest keep
running (failover is the point); a broker started again by such a script is that script's to
stop. A death before the cluster is ready (a bad config, a port taken) still stops everything.

A broker that dies is also a machine to replace: the command writes a fresh broker's config
(the next node id, new ports, ``join = true``) and prints the three commands that replace
the dead one: take it out of the group, start the new broker, add it (it catches up and
serves as a slave; the nameserver's routes follow). The new broker is the caller's to stop.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from common.cluster_secret import write_cluster_secret
from common.localgroup import LocalGroup, free_port_pair, stop_requested
from common.process import free_port
from remoting import RemotingClient, RemotingCommand, RequestCode

from .localgroup import GROUP_SIZE, broker_argv, broker_config, check_groups, group_name, namesrv_argv

HOST = "127.0.0.1"
#: seconds the command waits for every group's master before it warns (it keeps running)
READY_TIMEOUT_S = 60.0
#: seconds between two looks at the processes and the nameserver's routes
POLL_S = 0.5
#: seconds the nameserver may take to answer the cluster-info request
CLUSTER_INFO_TIMEOUT_S = 2.0
#: the RocketMQ 5 gRPC proxy's port (RocketMQ's default); any free one when it is taken
PROXY_PORT = 8081


@dataclass(frozen=True)
class Replacement:
    """A fresh broker planned to replace ``dead`` in group ``group``: its id, addresses and config."""

    group: str
    dead: str
    node: str
    broker_addr: str
    ledger_addr: str
    config: Path

    def commands(self, namesrv_addr: str, secret_file: Path) -> list[str]:
        """What an operator runs, in order: remove the dead member, start the new one, add it."""
        admin = f"ledgermq-admin -n {namesrv_addr}"
        secret = f"--cluster-secret-file {shlex.quote(str(secret_file))}"
        return [
            f"{admin} member-remove -b {self.group} {secret} {self.dead}",
            f"broker --config {shlex.quote(str(self.config))} &",
            f"{admin} member-add -b {self.group} {secret} {self.node}={self.broker_addr}",
        ]


class LocalCluster(LocalGroup):
    """A nameserver and ``groups`` broker groups of three brokers each, under ``base_dir``."""

    def __init__(
        self,
        base_dir: str | Path,
        *,
        groups: int = 1,
        namesrv_port: int = 0,
        cluster_name: str = "DefaultCluster",
        python: str = sys.executable,
        proxy_port: int | None = None,
    ) -> None:
        """``proxy_port``: also start the RocketMQ 5 gRPC proxy (``proxy``) there (0: any free
        port); None: no proxy."""
        check_groups(groups)
        super().__init__(base_dir)
        self.python = python
        self.cluster_name = cluster_name
        self.namesrv_addr = f"{HOST}:{namesrv_port or free_port(HOST)}"
        self.groups = [group_name(i) for i in range(groups)]
        self.brokers: dict[str, dict[str, tuple[str, str]]] = {}  # group -> node -> (broker, ledger)
        self.replaced: dict[str, Replacement] = {}  # "group/node" that died -> its planned replacement
        self.proxy_addr = "" if proxy_port is None else f"{HOST}:{proxy_port or free_port(HOST)}"
        for name in self.groups:
            self.brokers[name] = {
                f"n{k + 1}": (f"{HOST}:{free_port_pair(HOST)}", f"{HOST}:{free_port(HOST)}")
                for k in range(GROUP_SIZE)
            }

    @property
    def secret_file(self) -> Path:
        """The cluster secret: every ledger peer proves it, and every broker to the nameserver."""
        return self.base_dir / "cluster.secret"

    def write_configs(self) -> None:
        write_cluster_secret(self.secret_file)
        for name, members in self.brokers.items():
            peers = [f"{nid}={baddr}@{laddr}" for nid, (baddr, laddr) in members.items()]
            for nid in members:
                self._write_broker_config(name, nid, peers)

    def _write_broker_config(self, name: str, nid: str, peers: list[str], join: bool = False) -> Path:
        settings = {
            "cluster_name": self.cluster_name,
            "cluster_secret_file": str(self.secret_file),
            **({"join": True} if join else {}),
        }
        return broker_config(
            self.base_dir / name / nid,
            broker_name=name,
            node_id=nid,
            group=peers,
            namesrv_addrs=[self.namesrv_addr],
            listen_host=HOST,
            settings=settings,
        )

    def plan_replacement(self, name: str, dead: str) -> Replacement:
        """A fresh broker to replace ``dead`` of group ``name``: the next node id, new ports, and a
        config with ``join = true`` listing the members still standing (and itself)."""
        members = self.brokers[name]
        gone = {r.dead for r in self.replaced.values() if r.group == name} | {dead}
        nid = f"n{max(int(n[1:]) for n in members) + 1}"
        baddr, laddr = f"{HOST}:{free_port_pair(HOST)}", f"{HOST}:{free_port(HOST)}"
        members[nid] = (baddr, laddr)
        peers = [f"{n}={b}@{le}" for n, (b, le) in members.items() if n not in gone]
        path = self._write_broker_config(name, nid, peers, join=True)
        plan = Replacement(name, dead, nid, baddr, laddr, path)
        self.replaced[f"{name}/{dead}"] = plan
        return plan

    def start_nodes(self) -> None:
        """The nameserver, then every broker; each one's PID in a file beside its log."""
        argv = namesrv_argv(self.python, self.namesrv_addr, str(self.secret_file))
        self.spawn("namesrv", argv, self.base_dir / "namesrv" / "namesrv.log")
        self.write_pid("namesrv", self.base_dir / "namesrv" / "namesrv.pid")
        for name, members in self.brokers.items():
            for nid in members:
                d = self.base_dir / name / nid
                self.spawn(f"{name}/{nid}", broker_argv(self.python, d / "broker.toml"), d / "broker.log")
                self.write_pid(f"{name}/{nid}", d / "broker.pid")
        if self.proxy_addr:
            argv = [self.python, "-m", "proxy", "--namesrv", self.namesrv_addr, "--listen", self.proxy_addr]
            self.spawn("proxy", argv, self.base_dir / "proxy" / "proxy.log")
            self.write_pid("proxy", self.base_dir / "proxy" / "proxy.pid")

    async def masters(self) -> dict[str, str]:
        """Broker group -> master address, as the nameserver routes them."""
        async with RemotingClient() as client:
            try:
                resp = await client.invoke_sync(
                    self.namesrv_addr,
                    RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO),
                    CLUSTER_INFO_TIMEOUT_S,
                )
            except Exception:  # noqa: BLE001 - not up yet: no masters
                return {}
        if not resp.is_success:
            return {}
        table = json.loads(bytes(resp.body)).get("brokerAddrTable", {})
        return {
            name: bd["brokerAddrs"]["0"] for name, bd in table.items() if "0" in bd.get("brokerAddrs", {})
        }


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _report_exit(cluster: LocalCluster, name: str) -> None:
    """A broker that died once the cluster was ready: failover is the point, so the rest keep
    running; it is also a machine to replace, so print how, with a fresh broker."""
    _say(f"{name} exited (status {cluster.procs[name].returncode}); the others keep running")
    group, _, node = name.partition("/")
    if group in cluster.brokers:
        plan = cluster.plan_replacement(group, node)
        lines = plan.commands(cluster.namesrv_addr, cluster.secret_file)
        _say(f"to replace {name} with a fresh broker {group}/{plan.node}:\n  " + "\n  ".join(lines))


def _report_masters(cluster: LocalCluster, reported: set[str]) -> None:
    """One line per group whose master the nameserver now routes to (each group once)."""
    for name, addr in sorted(asyncio.run(cluster.masters()).items()):
        if name not in reported:
            reported.add(name)
            members = ", ".join(b for b, _ in cluster.brokers[name].values())
            print(f"{name} master={addr} brokers={members}", flush=True)


def _watch(cluster: LocalCluster, base_dir: Path, stop: threading.Event) -> int:
    """Report masters until every group has one, then exits, until ``stop`` is set: 0, or 1 when
    a process died before the cluster was ready (or the nameserver died at any time)."""
    reported: set[str] = set()
    gone: set[str] = set()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        dead = cluster.dead()
        ready = len(reported) == len(cluster.groups)
        if "proxy" in dead and "proxy" not in gone:  # the 4.x side works without it
            gone.add("proxy")
            _say(f"the RocketMQ 5 proxy exited; see {base_dir / 'proxy' / 'proxy.log'}")
        dead = [d for d in dead if d != "proxy"]
        if dead and (not ready or "namesrv" in dead):
            _say(f"stopping: {', '.join(dead)} exited; logs under {base_dir}")
            return 1
        for name in sorted(set(dead) - gone):
            gone.add(name)
            _report_exit(cluster, name)
        if not ready:
            _report_masters(cluster, reported)
            if len(reported) == len(cluster.groups):
                print(
                    f"ready: {len(cluster.groups)} broker group(s); data and logs in {base_dir}", flush=True
                )
            elif time.monotonic() > deadline:
                print(f"warning: no master yet for {sorted(set(cluster.groups) - reported)}", file=sys.stderr)
                deadline = float("inf")
        if stop.wait(POLL_S):
            return 0


def _proxy_port() -> int:
    """PROXY_PORT when it is free, else 0 (any free port): a second local cluster still starts."""
    with socket.socket() as s:
        try:
            s.bind((HOST, PROXY_PORT))
        except OSError:
            return 0
    return PROXY_PORT


def run(base_dir: Path, groups: int, namesrv_port: int) -> int:
    """Start the cluster, print its addresses, and stop it all on SIGTERM or Ctrl-C."""
    cluster = LocalCluster(base_dir, groups=groups, namesrv_port=namesrv_port, proxy_port=_proxy_port())
    with stop_requested() as stop:
        try:
            cluster.start()
            print(f"namesrv={cluster.namesrv_addr}", flush=True)
            print(f"proxy={cluster.proxy_addr}", flush=True)
            return _watch(cluster, base_dir, stop)
        finally:
            cluster.stop()
            print("stopped", flush=True)
