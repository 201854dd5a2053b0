"""``--system rocketmq``: the queue workload against a RocketMQ-protocol cluster someone else runs.

The harness starts nothing here: the user names a nameserver (``--namesrv``) of a cluster
they already have (Apache RocketMQ with DLedger, ``broker local-cluster``, ...), and the
clients speak plain RocketMQ 4.x remoting to it: JSON headers (what every RocketMQ server
reads) and no ledgermq-only CRC field (``rocketmq_compat``); the requests themselves are
already what a Java 4.9 client sends (every header field RocketMQ's header classes require,
pulls carrying their subscription).
The run uses a fresh topic, created on one broker group's master, so that its
queues hold only this run's messages and the ``log`` checker can judge them.

Faults are only what the user allows. Without hooks the nemesis is ``none``. With
``--nodes`` and command hooks (``--kill-cmd``, ``--restart-cmd``, ``--pause-cmd``,
``--resume-cmd``) the nemesis runs the user's command for each node it targets, as Jepsen's
``db`` protocol would over ssh: ``{node}`` becomes the node's name, ``{addr}`` its broker
address, ``{host}`` the host part of it (or the name), and the same values are in the
environment as ``JEPSEN_NODE``, ``JEPSEN_NODE_ADDR`` and ``JEPSEN_NODE_HOST``. Every hook's
command line, exit status and output go to ``cluster/hooks.log``; a hook that fails or runs
past its time limit is recorded in the history as a failed nemesis operation. Partitions and
log corruption need control of the network and disks of nodes we did not start, so they are
refused up front.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client.admin_api import AdminClient
from client.errors import ClientError
from common.settings import ConfigError, parse_host_port
from jepsen.net.proxy import Link
from jepsen.systems.base import Backend, Unsupported
from jepsen.systems.broker import BrokerQueueClient, queue_spec
from jepsen.systems.clients import LogClient
from jepsen.systems.rocketmq_compat import rocketmq_instance
from remoting.exceptions import RemotingError

SYSTEM = "rocketmq"
#: seconds a user's hook may run before it is killed and recorded as failed
HOOK_TIMEOUT_S = 60.0
#: bytes of a hook's output quoted in an error (all of it is in hooks.log)
HOOK_OUTPUT_QUOTE = 400
#: seconds to wait for the nameserver to route the fresh topic after creating it
TOPIC_READY_TIMEOUT_S = 30.0
#: seconds one nameserver or broker call may take while setting up or watching
CALL_TIMEOUT_S = 3.0
DEFAULT_QUEUES = 2
MAX_QUEUES = 64
NODE_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,128}$")

KILL_FAULTS = ("kill-leader", "kill-random", "kill-majority", "restart-all")
PAUSE_FAULTS = ("pause-leader", "pause-random")


@dataclass(frozen=True)
class ExternalNode:
    """A node of the user's cluster: the name hooks get, and optionally its broker address."""

    name: str
    addr: str | None = None

    @property
    def host(self) -> str:
        return self.addr.rsplit(":", 1)[0] if self.addr else self.name


def parse_nodes(text: str) -> list[ExternalNode]:
    """``a,b,c`` or ``a=HOST:PORT,b=HOST:PORT``: the address lets the harness tell which node is
    the master (for kill-leader and the leader monitor); names alone are enough for hooks."""
    nodes: list[ExternalNode] = []
    for i, item in enumerate(x.strip() for x in text.split(",")):
        if not item:
            continue
        name, _, addr = item.partition("=")
        name, addr = name.strip(), addr.strip()
        if not NODE_NAME.match(name):
            raise Unsupported(
                f"--nodes item {i + 1} {item!r}: a node name is 1-128 letters, digits or ._@- "
                "(it is put into your hook commands as is)"
            )
        if addr:
            try:
                host, port = parse_host_port(f"--nodes item {i + 1} address", addr)
            except ConfigError as exc:
                raise Unsupported(str(exc)) from None
            addr = f"{host}:{port}"
        nodes.append(ExternalNode(name, addr or None))
    names = [n.name for n in nodes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise Unsupported(f"--nodes names {', '.join(dup)} more than once")
    return nodes


@dataclass(frozen=True)
class Hooks:
    """The user's commands for faults; ``{node}``, ``{addr}`` and ``{host}`` are filled in per node."""

    kill: str | None = None
    restart: str | None = None
    pause: str | None = None
    resume: str | None = None

    def allows(self) -> tuple[str, ...]:
        out: list[str] = []
        if self.kill and self.restart:
            out += KILL_FAULTS
        if self.pause and self.resume:
            out += PAUSE_FAULTS
        return tuple(out)


def check_faults(faults: tuple[str, ...], hooks: Hooks, nodes: list[ExternalNode]) -> list[str]:
    """Refuse faults the user did not give us the means for; returns warnings worth printing."""
    if hooks.kill and not hooks.restart or hooks.restart and not hooks.kill:
        raise Unsupported("--kill-cmd and --restart-cmd go together (every kill is healed by a restart)")
    if hooks.pause and not hooks.resume or hooks.resume and not hooks.pause:
        raise Unsupported("--pause-cmd and --resume-cmd go together (every pause is healed by a resume)")
    allowed = hooks.allows()
    for f in faults:
        if f in allowed:
            continue
        if f in KILL_FAULTS:
            raise Unsupported(
                f"--nemesis {f} on a cluster the harness did not start needs --kill-cmd and --restart-cmd"
            )
        if f in PAUSE_FAULTS:
            raise Unsupported(
                f"--nemesis {f} on a cluster the harness did not start needs --pause-cmd and --resume-cmd"
            )
        raise Unsupported(
            f"--nemesis {f} needs control of the network or disks of nodes the harness did not start; "
            f"with --system {SYSTEM} use {', '.join(allowed) or 'none (give --kill-cmd/--restart-cmd for kills)'}"
        )
    if faults and not nodes:
        raise Unsupported("faults through hooks need --nodes: the names your hook commands act on")
    warnings = []
    if any(f.endswith("-leader") for f in faults) and not any(n.addr for n in nodes):
        warnings.append(
            "--nodes has no broker addresses (name=HOST:PORT), so the master cannot be told apart: "
            "kill-leader and pause-leader pick a random node"
        )
    return warnings


class RocketMQBackend(Backend):
    """A RocketMQ-protocol cluster reached through its nameserver; faults only through the user's hooks."""

    system = SYSTEM
    client_timeout = 4.0

    def __init__(
        self,
        base_dir: Path,
        *,
        namesrv: str,
        nodes: list[ExternalNode] | None = None,
        hooks: Hooks | None = None,
        topic: str | None = None,
        queues: int = DEFAULT_QUEUES,
        broker_name: str | None = None,
    ) -> None:
        super().__init__(base_dir)
        self.namesrv = [a.strip() for a in namesrv.replace(",", ";").split(";") if a.strip()]
        if not self.namesrv:
            raise Unsupported(f"--system {SYSTEM} needs --namesrv HOST:PORT (the cluster's nameserver)")
        for a in self.namesrv:
            try:
                parse_host_port("--namesrv", a)
            except ConfigError as exc:
                raise Unsupported(str(exc)) from None
        if not 1 <= queues <= MAX_QUEUES:
            raise Unsupported(f"--queues must be 1..{MAX_QUEUES}, got {queues}")
        self.external = list(nodes or [])
        self.by_name = {n.name: n for n in self.external}
        self.nodes = [n.name for n in self.external]
        self.hooks = hooks or Hooks()
        self.topic = topic or f"JepsenQueue-{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}"
        self.queues = queues
        self.broker_name = broker_name
        self.hooks_log = self.base_dir / "hooks.log"
        self._admin: AdminClient | None = None
        self._admin_loop: asyncio.AbstractEventLoop | None = None
        #: RocketMQ's routes carry no Raft term, so the harness numbers the masters it sees:
        #: the epoch goes up by one each time the group's routed master changes
        self.epoch = 1
        self._last_master: str | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        asyncio.run(self._prepare())

    async def _prepare(self) -> None:
        """Pick a broker group, create the run's topic on its master, wait until it is routed."""
        instance = rocketmq_instance(self.namesrv, "jepsen-admin")
        admin = AdminClient(self.namesrv, timeout_s=CALL_TIMEOUT_S, instance=instance)
        try:
            try:
                groups = await admin.broker_groups()
            except (ClientError, RemotingError, OSError) as exc:
                raise TimeoutError(f"nameserver {';'.join(self.namesrv)} did not answer: {exc}") from None
            with_master = sorted(n for n, bd in groups.items() if bd.master_addr)
            if self.broker_name is None:
                if not with_master:
                    raise TimeoutError(
                        f"nameserver {';'.join(self.namesrv)} routes no broker group with a master "
                        f"(groups: {', '.join(sorted(groups)) or 'none'})"
                    )
                self.broker_name = with_master[0]
            elif self.broker_name not in with_master:
                raise Unsupported(
                    f"--broker-name {self.broker_name}: the nameserver knows groups with a master: "
                    f"{', '.join(with_master) or 'none'}"
                )
            master = groups[self.broker_name].master_addr
            assert master is not None
            if not await self._existing_queues(admin):  # never reconfigure a topic someone else made
                results = await admin.update_topic(
                    self.topic, read_queue_nums=self.queues, write_queue_nums=self.queues, broker_addr=master
                )
                bad = [r for r in results if not r.ok]
                if bad:
                    raise Unsupported(f"cannot create topic {self.topic} on {master}: {bad[0].error}")
                await self._wait_routed(admin)
            await self._check_fresh(admin)
            target = {
                "namesrv": self.namesrv,
                "broker_name": self.broker_name,
                "master": master,
                "topic": self.topic,
                "queues": self.queues,
            }
            (self.base_dir / "target.json").write_text(json.dumps(target, indent=2) + "\n", encoding="utf-8")
        finally:
            await admin.close()
            await instance.close()

    async def _existing_queues(self, admin: AdminClient) -> bool:
        """Whether the topic already exists on the run's group (with enough queues: else refused)."""
        try:
            route = await admin.topic_route(self.topic)
        except (ClientError, RemotingError):
            return False  # not routed: ours to create
        qd = [q for q in route.queue_datas if q.broker_name == self.broker_name]
        if not qd:
            return False
        have = min(qd[0].read_queue_nums, qd[0].write_queue_nums)
        if have < self.queues:
            raise Unsupported(
                f"topic {self.topic} exists on {self.broker_name} with {have} queues, fewer than --queues "
                f"{self.queues}; the harness does not reconfigure existing topics"
            )
        return True

    async def _wait_routed(self, admin: AdminClient) -> None:
        deadline = time.monotonic() + TOPIC_READY_TIMEOUT_S
        last = "no route yet"
        while time.monotonic() < deadline:
            try:
                route = await admin.topic_route(self.topic)
                qd = [q for q in route.queue_datas if q.broker_name == self.broker_name]
                if qd and min(qd[0].read_queue_nums, qd[0].write_queue_nums) >= self.queues:
                    return
                last = f"route has {qd[0].write_queue_nums if qd else 0} queues on {self.broker_name}"
            except (ClientError, RemotingError) as exc:
                last = str(exc)
            await asyncio.sleep(0.5)
        raise TimeoutError(f"topic {self.topic} was not routed within {TOPIC_READY_TIMEOUT_S:g}s: {last}")

    async def _check_fresh(self, admin: AdminClient) -> None:
        """The checker needs queues that hold only this run's messages."""
        from client.route import MessageQueue

        for q in range(self.queues):
            mq = MessageQueue(self.topic, self.broker_name or "", q)
            try:
                top = await admin.max_offset(mq)
            except (ClientError, RemotingError):
                return  # cannot tell: the checker will say if old messages show up
            if top > 0:
                raise Unsupported(
                    f"topic {self.topic} already holds {top} messages in queue {q}: give a new --topic "
                    "(the checker judges queues that hold only this run's messages)"
                )

    def stop(self) -> None:
        """Nothing to stop: the cluster is the user's (hooks run to completion one at a time)."""

    # ------------------------------------------------------------------ roles

    async def _admin_client(self) -> AdminClient:
        loop = asyncio.get_running_loop()
        if self._admin is None or self._admin_loop is not loop:
            instance = rocketmq_instance(self.namesrv, "jepsen-watch")
            self._admin = AdminClient(self.namesrv, timeout_s=1.0, instance=instance)
            self._admin_loop = loop
        return self._admin

    async def group_addrs(self) -> dict[int, str]:
        """Broker id -> address of the run's broker group, as the nameserver routes it now."""
        admin = await self._admin_client()
        groups = await admin.broker_groups()
        bd = groups.get(self.broker_name or "")
        addrs = dict(bd.broker_addrs) if bd else {}
        master = addrs.get(0)
        if master and master != self._last_master:
            if self._last_master is not None:
                self.epoch += 1
            self._last_master = master
        return addrs

    async def statuses(self) -> dict[str, dict[str, Any] | None]:
        try:
            addrs = await asyncio.wait_for(self.group_addrs(), CALL_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a nameserver we cannot reach: nothing known this round
            return dict.fromkeys(self.nodes)
        return {n: self._status_from(n, addrs) for n in self.nodes}

    def _status_from(self, nid: str, addrs: dict[int, str]) -> dict[str, Any] | None:
        node = self.by_name[nid]
        if node.addr is None:
            return {"role": None, "term": None, "leader": None}
        ids = [i for i, a in addrs.items() if a == node.addr]
        if not ids:
            return None  # not routed: down, or not a member of the run's group
        master = addrs.get(0)
        leader = next((n.name for n in self.external if n.addr == master), master)
        role = "leader" if ids[0] == 0 else "follower"
        return {"role": role, "term": self.epoch, "leader": leader}

    async def status(self, nid: str) -> dict[str, Any] | None:
        addrs = await self.group_addrs()
        return self._status_from(nid, addrs)

    async def wait_for_leader(self, timeout: float = 30.0) -> str:
        """Until the nameserver routes a master for the run's group; its node name (or address)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            try:
                addrs = await asyncio.wait_for(self.group_addrs(), CALL_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - keep asking until the deadline
                addrs = {}
            master = addrs.get(0)
            if master:
                return next((n.name for n in self.external if n.addr == master), master)
            await asyncio.sleep(0.25)
        raise TimeoutError(
            f"{SYSTEM}: the nameserver routed no master for {self.broker_name} within {timeout:g}s"
        )

    # ------------------------------------------------------------------ faults through hooks

    def _hook(self, what: str, template: str | None, nid: str) -> None:
        if template is None:
            raise Unsupported(f"no --{what}-cmd was given, so the harness cannot {what} {nid}")
        node = self.by_name.get(nid)
        if node is None:
            raise Unsupported(f"{nid} is not one of --nodes")
        values = {"{node}": node.name, "{addr}": node.addr or "", "{host}": node.host}
        cmd = template
        for key, val in values.items():
            cmd = cmd.replace(key, val)
        env = {
            **os.environ,
            "JEPSEN_NODE": node.name,
            "JEPSEN_NODE_ADDR": node.addr or "",
            "JEPSEN_NODE_HOST": node.host,
        }
        self.base_dir.mkdir(parents=True, exist_ok=True)
        with open(self.hooks_log, "ab") as log:
            log.write(f"{time.strftime('%H:%M:%S')} {what} {nid}: {cmd}\n".encode())
            log.flush()
            start = log.tell()
            try:
                # output to the log file, not a pipe: a hook that leaves a process running in
                # the background (a restarted node) must not keep us waiting for its output
                proc = subprocess.run(
                    ["/bin/sh", "-c", cmd],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    timeout=HOOK_TIMEOUT_S,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                log.write(f"  timed out after {HOOK_TIMEOUT_S:g}s\n".encode())
                raise RuntimeError(f"{what} hook for {nid} ran past {HOOK_TIMEOUT_S:g}s: {cmd}") from None
            log.write(f"  exit {proc.returncode}\n".encode())
        if proc.returncode != 0:
            with open(self.hooks_log, "rb") as fh:
                fh.seek(start)
                out = fh.read().decode(errors="replace").strip()
            raise RuntimeError(
                f"{what} hook for {nid} exited {proc.returncode}: {cmd}; output: {out[-HOOK_OUTPUT_QUOTE:]}"
            )

    def kill(self, nid: str) -> None:
        self._hook("kill", self.hooks.kill, nid)
        self.killed.add(nid)
        self.paused.discard(nid)

    def restart(self, nid: str) -> None:
        self._hook("restart", self.hooks.restart, nid)
        self.killed.discard(nid)

    def pause(self, nid: str) -> None:
        self._hook("pause", self.hooks.pause, nid)
        self.paused.add(nid)

    def resume(self, nid: str) -> None:
        self._hook("resume", self.hooks.resume, nid)
        self.paused.discard(nid)

    def set_cut(self, links: set[Link]) -> dict[str, Any]:
        if links:
            raise Unsupported(f"{SYSTEM}: the harness cannot cut links between nodes it did not start")
        return {}

    # ------------------------------------------------------------------ clients and files

    def log_client(self) -> LogClient:
        raise Unsupported(f"--system {SYSTEM} runs the queue workload")

    def queue_client(self, broker_name: str | None = None) -> BrokerQueueClient:
        names = {n.addr: n.name for n in self.external if n.addr}
        return BrokerQueueClient(
            self.namesrv,
            names,
            self.topic,
            timeout=self.client_timeout,
            broker_name=self.broker_name,
            rocketmq=True,
        )

    def client_spec(self) -> dict[str, Any]:
        spec = queue_spec(self, {n.addr: n.name for n in self.external if n.addr}, self.namesrv)
        spec.update(system=SYSTEM, broker_name=self.broker_name, rocketmq=True)
        return spec

    def log_files(self) -> dict[str, Path]:
        return {"hooks": self.hooks_log} if self.hooks_log.exists() else {}

    def cleanup_data(self) -> None:
        """The data is the user's cluster's: nothing of ours to delete."""
