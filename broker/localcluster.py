"""``broker local-cluster``: a nameserver and N 3-broker groups as local processes, RocketMQ's
quick start for ledgermq.

Everything listens on loopback. The first line printed is ``namesrv=HOST:PORT`` (what a
RocketMQ application's ``namesrvAddr`` should be set to), then one line per broker group
once it has a master the nameserver routes to. SIGTERM or Ctrl-C stops every process
(by PID, through ``common.process.ProcessSet``) and the command exits.

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
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.cluster_secret import write_cluster_secret
from common.process import ProcessSet, free_port, write_toml
from remoting import RemotingClient, RemotingCommand, RequestCode

GROUP_SIZE = 3
MAX_GROUPS = 26
HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
POLL_S = 0.5


def _free_port_pair(host: str) -> int:
    """A port p with p and p - 2 free (RocketMQ's fast channel listens on port - 2)."""
    for _ in range(200):
        port = free_port(host)
        if port <= 1026:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port - 2))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port pair on {host}")


def group_name(i: int) -> str:
    """broker-a, broker-b, ... as in RocketMQ's examples."""
    return f"broker-{chr(ord('a') + i)}"


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


class LocalCluster(ProcessSet):
    """A nameserver and ``groups`` broker groups of three brokers each, under ``base_dir``."""

    def __init__(
        self,
        base_dir: str | Path,
        *,
        groups: int = 1,
        namesrv_port: int = 0,
        cluster_name: str = "DefaultCluster",
        python: str = sys.executable,
    ) -> None:
        if not 1 <= groups <= MAX_GROUPS:
            raise ValueError(f"--groups must be 1..{MAX_GROUPS}, got {groups}")
        super().__init__(base_dir)
        self.python = python
        self.cluster_name = cluster_name
        self.namesrv_addr = f"{HOST}:{namesrv_port or free_port(HOST)}"
        self.groups = [group_name(i) for i in range(groups)]
        self.brokers: dict[str, dict[str, tuple[str, str]]] = {}  # group -> node -> (broker, ledger)
        self.replaced: dict[str, Replacement] = {}  # "group/node" that died -> its planned replacement
        for name in self.groups:
            self.brokers[name] = {
                f"n{k + 1}": (f"{HOST}:{_free_port_pair(HOST)}", f"{HOST}:{free_port(HOST)}")
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
        d = self.base_dir / name / nid
        d.mkdir(parents=True, exist_ok=True)
        conf: dict[str, Any] = {
            "cluster_name": self.cluster_name,
            "broker_name": name,
            "node_id": nid,
            "group": peers,
            "namesrv_addr": [self.namesrv_addr],
            "data_dir": str(d / "data"),
            "listen_host": HOST,
            "cluster_secret_file": str(self.secret_file),
            **({"join": True} if join else {}),
        }
        path = d / "broker.toml"
        write_toml(path, conf)
        path.chmod(0o600)
        return path

    def plan_replacement(self, name: str, dead: str) -> Replacement:
        """A fresh broker to replace ``dead`` of group ``name``: the next node id, new ports, and a
        config with ``join = true`` listing the members still standing (and itself)."""
        members = self.brokers[name]
        gone = {r.dead for r in self.replaced.values() if r.group == name} | {dead}
        nid = f"n{max(int(n[1:]) for n in members) + 1}"
        baddr, laddr = f"{HOST}:{_free_port_pair(HOST)}", f"{HOST}:{free_port(HOST)}"
        members[nid] = (baddr, laddr)
        peers = [f"{n}={b}@{le}" for n, (b, le) in members.items() if n not in gone]
        path = self._write_broker_config(name, nid, peers, join=True)
        plan = Replacement(name, dead, nid, baddr, laddr, path)
        self.replaced[f"{name}/{dead}"] = plan
        return plan

    def start(self) -> None:
        self.write_configs()
        host, port = self.namesrv_addr.rsplit(":", 1)
        self.spawn(
            "namesrv",
            [self.python, "-m", "namesrv", "--listen-host", host, "--listen-port", port]
            + ["--cluster-secret-file", str(self.secret_file)],
            self.base_dir / "namesrv" / "namesrv.log",
        )
        self._write_pid("namesrv", self.base_dir / "namesrv" / "namesrv.pid")
        for name, members in self.brokers.items():
            for nid in members:
                d = self.base_dir / name / nid
                self.spawn(
                    f"{name}/{nid}",
                    [self.python, "-m", "broker", "--config", str(d / "broker.toml")],
                    d / "broker.log",
                )
                self._write_pid(f"{name}/{nid}", d / "broker.pid")

    def _write_pid(self, name: str, path: Path) -> None:
        """The process's PID in ``path`` (written whole, then renamed: a reader never sees half)."""
        pid = self.pid(name)
        if pid is None:
            return
        tmp = path.with_suffix(".pid.tmp")
        tmp.write_text(f"{pid}\n", encoding="ascii")
        tmp.replace(path)

    def dead(self) -> list[str]:
        """Processes that exited on their own."""
        return [name for name, proc in self.procs.items() if proc.poll() is not None]

    async def masters(self) -> dict[str, str]:
        """Broker group -> master address, as the nameserver routes them."""
        async with RemotingClient() as client:
            try:
                resp = await client.invoke_sync(
                    self.namesrv_addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), 2.0
                )
            except Exception:  # noqa: BLE001 - not up yet: no masters
                return {}
        if not resp.is_success:
            return {}
        table = json.loads(bytes(resp.body)).get("brokerAddrTable", {})
        return {
            name: bd["brokerAddrs"]["0"] for name, bd in table.items() if "0" in bd.get("brokerAddrs", {})
        }


def run(base_dir: Path, groups: int, namesrv_port: int) -> int:
    """Start the cluster, print its addresses, and stop it all on SIGTERM or Ctrl-C."""
    cluster = LocalCluster(base_dir, groups=groups, namesrv_port=namesrv_port)
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        cluster.start()
        print(f"namesrv={cluster.namesrv_addr}", flush=True)
        reported: set[str] = set()
        gone: set[str] = set()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not stopping:
            dead = cluster.dead()
            ready = len(reported) == len(cluster.groups)
            if dead and (not ready or "namesrv" in dead):
                print(
                    f"stopping: {', '.join(dead)} exited; logs under {base_dir}", file=sys.stderr, flush=True
                )
                return 1
            for name in sorted(set(dead) - gone):  # after ready: a killed broker is a failover test
                gone.add(name)
                code = cluster.procs[name].returncode
                print(f"{name} exited (status {code}); the others keep running", file=sys.stderr, flush=True)
                group, _, node = name.partition("/")
                if group in cluster.brokers:  # a machine to replace, if it does not come back
                    plan = cluster.plan_replacement(group, node)
                    lines = plan.commands(cluster.namesrv_addr, cluster.secret_file)
                    print(
                        f"to replace {name} with a fresh broker {group}/{plan.node}:\n  "
                        + "\n  ".join(lines),
                        file=sys.stderr,
                        flush=True,
                    )
            if len(reported) < len(cluster.groups):
                for name, addr in sorted(asyncio.run(cluster.masters()).items()):
                    if name not in reported:
                        reported.add(name)
                        members = ", ".join(b for b, _ in cluster.brokers[name].values())
                        print(f"{name} master={addr} brokers={members}", flush=True)
                if len(reported) == len(cluster.groups):
                    print(
                        f"ready: {len(cluster.groups)} broker group(s); data and logs in {base_dir}",
                        flush=True,
                    )
                elif time.monotonic() > deadline:
                    print(
                        f"warning: no master yet for {sorted(set(cluster.groups) - reported)}",
                        file=sys.stderr,
                    )
                    deadline = float("inf")
            time.sleep(POLL_S)
        return 0
    finally:
        cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print("stopped", flush=True)
