"""``--system rocketmq-rust``: the queue workload on RocketMQ-Rust, a RocketMQ no one here wrote.

The binaries are crates.io's ``rocketmq-namesrv`` and ``rocketmq-broker`` 1.0.0 (the Rust
implementation of RocketMQ), built once by ``scripts/build-rocketmq-rust.sh`` into a cache
folder outside the repository (``$LEDGERMQ_ROCKETMQ_RUST_DIR``, else
``~/.cache/ledgermq/rocketmq-rust``); the harness only runs them.

What it stands up. RocketMQ-Rust 1.0 has no DLedger commit log (its config converter refuses
every ``dledger`` key as "outside the Rust 1.0 scope"), so the best replication it offers
without a separate controller is RocketMQ's classic master/slave HA: one nameserver, a
``SYNC_MASTER`` (broker id 0) and two ``SLAVE`` brokers (ids 1, 2) of one broker group, each a
local process on its own loopback address with its own store and config file.
``inSyncReplicas=2`` makes the master answer a send only once one slave holds it (with
RocketMQ 5's default of 1, a ``SYNC_MASTER`` waits for no one), and ``SYNC_FLUSH`` makes it
flush before answering: RocketMQ-Rust 1.0 counts a replicated send only up to the master's
own *flushed* offset, so with ``ASYNC_FLUSH`` a lightly loaded master answered most sends
``FLUSH_SLAVE_TIMEOUT`` after 3 s (its flusher waits for 4 dirty pages), although the slaves
held them. Roles are fixed: when the master dies no slave takes over (that needs the
controller, ``enableControllerMode``, which the default build leaves out), so sends fail
until the master is back, and only what the master kept can be read after it.

Faults. kill/restart (SIGKILL, then the same binary on the same store) and pause/resume
(SIGSTOP/SIGCONT) hit brokers through the shared ``ProcessBackend``; the nameserver is
never a target. Partitions and ``slow-network``/``lossy-network`` act on the replication
links: each slave dials the master's HA port through the link proxy (its
``haMasterAddress`` is the proxy's address for that link), so cutting master<->slave stops
replication, and a ``SYNC_MASTER`` then answers sends ``FLUSH_SLAVE_TIMEOUT`` (stored on the
master, recorded as an unknown outcome). One TCP connection carries both directions, so
every cut is made symmetric. Not cut: clients to brokers and nameserver (as in every
backend here), brokers to the nameserver (registration), and a slave's metadata sync
(``SlaveSynchronize``) to the master's main port, which it learns from the nameserver.
There is no ``corrupt-tail``, ``lose-data``, ``disk-full`` or ``forge-peer`` here: the
harness does not know RocketMQ's store files well enough to damage them meaningfully.

Clients are ``--system rocketmq``'s (``rocketmq.RocketMQBackend``): plain RocketMQ 4.x
remoting (JSON headers, every required header field), a fresh topic created on the master,
polls from the master. That class also reads roles from the nameserver's routes, which is
how the harness tells the master here.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from client.admin_api import AdminClient
from client.errors import ClientError
from client.producer import Producer
from common.localgroup import free_port_pair
from common.process import ProcessSet, free_port, toml_value, write_toml
from jepsen.systems.base import ProcessBackend, Unsupported
from jepsen.systems.broker import BrokerQueueClient
from jepsen.systems.clients import LogClient
from jepsen.systems.rocketmq import ExternalNode, RocketMQBackend
from jepsen.systems.rocketmq_compat import rocketmq_instance
from remoting.exceptions import RemotingError
from remoting.message import Message

SYSTEM = "rocketmq-rust"
#: where the build script puts the binaries (``<dir>/bin``), unless this variable names another folder
DIR_ENV = "LEDGERMQ_ROCKETMQ_RUST_DIR"
DEFAULT_DIR = Path.home() / ".cache" / "ledgermq" / "rocketmq-rust"
BUILD_SCRIPT = "scripts/build-rocketmq-rust.sh"
NAMESRV_BIN = "rocketmq-namesrv-rust"
BROKER_BIN = "rocketmq-broker-rust"
CLUSTER = "RustCluster"
BROKER_NAME = "rust-a"
DEFAULT_SLAVES = 2
MAX_SLAVES = 4
#: replicas (master included) that must hold a message before the master answers a send
IN_SYNC_REPLICAS = 2
DEFAULT_QUEUES = 2
#: each broker's store files (RocketMQ's defaults: 1 GiB commit log files; an index file of
#: 5 million slots and 20 million entries, 400 MiB)
COMMIT_LOG_FILE_BYTES = 64 << 20
INDEX_HASH_SLOTS = 50_000
INDEX_ENTRIES = 200_000
#: seconds for the nameserver to listen and for every broker of the group to register
STARTUP_TIMEOUT_S = 60.0
#: seconds one nameserver call may take while waiting for the group
CALL_TIMEOUT_S = 2.0
#: seconds one start-up probe send may take (the master's own wait for a slave is 3 s)
WARMUP_SEND_TIMEOUT_S = 4.0
#: each broker on its own loopback address (127.0.0.1, .2, ...); its main port comes from
#: ``free_port_pair``, as a RocketMQ broker may also listen on that port minus 2 (the "VIP" channel)
HOST_PREFIX = "127.0.0."


def rust_dir() -> Path:
    """The cache folder the build script fills (``$LEDGERMQ_ROCKETMQ_RUST_DIR`` or the default)."""
    env = os.environ.get(DIR_ENV, "").strip()
    return Path(env).expanduser() if env else DEFAULT_DIR


def find_binaries(base: Path | None = None) -> dict[str, Path]:
    """The nameserver and broker binaries, or ``Unsupported`` saying how to build them."""
    bin_dir = (base or rust_dir()) / "bin"
    found = {name: bin_dir / name for name in (NAMESRV_BIN, BROKER_BIN)}
    missing = [name for name, p in found.items() if not (p.is_file() and os.access(p, os.X_OK))]
    if missing:
        raise Unsupported(
            f"--system {SYSTEM} needs {' and '.join(missing)} in {bin_dir}: build them once with "
            f"`{BUILD_SCRIPT}` (cargo, about 20 minutes on 2 cores), or point ${DIR_ENV} at a folder "
            "whose bin/ holds them"
        )
    return found


def broker_toml(broker: dict[str, Any], identity: dict[str, Any], store: dict[str, Any]) -> str:
    """The broker's canonical config: ``[broker]``, ``[broker.brokerIdentity]`` and ``[store]``.

    Not the Java-style properties file the broker also reads: its converter maps
    ``brokerRole`` to ``store.brokerRole`` only and leaves ``broker.brokerRole`` at
    ``ASYNC_MASTER``, so a slave configured that way never starts its HA client (seen with
    1.0.0: no replication, and a ``SYNC_MASTER`` answering every send ``FLUSH_SLAVE_TIMEOUT``).
    Here the role is written into both sections.
    """
    lines: list[str] = []
    for section, values in (("broker", broker), ("broker.brokerIdentity", identity), ("store", store)):
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)


def _wait_listening(addr: str, deadline: float) -> bool:
    host, port = addr.rsplit(":", 1)
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


class RocketMQRustBackend(ProcessBackend):
    """A RocketMQ-Rust nameserver and one master/slave broker group as local processes."""

    system = SYSTEM
    directed_links = False  # a slave's one HA connection carries both directions
    client_timeout = 4.0

    def __init__(
        self,
        base_dir: Path,
        *,
        slaves: int = DEFAULT_SLAVES,
        queues: int = DEFAULT_QUEUES,
        topic: str | None = None,
        bin_dir: Path | None = None,
    ) -> None:
        if not 1 <= slaves <= MAX_SLAVES:
            raise Unsupported(f"{SYSTEM}: 1..{MAX_SLAVES} slaves, not {slaves}")
        self.bins = find_binaries(bin_dir)
        super().__init__(base_dir, ProcessSet(base_dir))  # started, signalled and reaped by PID
        self.nodes = [f"n{i + 1}" for i in range(slaves + 1)]
        self.broker_id = {nid: i for i, nid in enumerate(self.nodes)}
        self.master = self.nodes[0]
        self.host = {nid: f"{HOST_PREFIX}{i + 1}" for i, nid in enumerate(self.nodes)}
        self.namesrv_addr = f"127.0.0.1:{free_port('127.0.0.1')}"
        self.broker_addr = {nid: f"{h}:{free_port_pair(h)}" for nid, h in self.host.items()}
        self.ha_addr = {nid: f"{h}:{free_port(h)}" for nid, h in self.host.items()}
        self.view = RocketMQBackend(
            self.base_dir,
            namesrv=self.namesrv_addr,
            nodes=[ExternalNode(nid, self.broker_addr[nid]) for nid in self.nodes],
            topic=topic,
            queues=queues,
            broker_name=BROKER_NAME,
        )
        self.topic = self.view.topic
        self.queues = queues

    # ------------------------------------------------------------------ files and processes

    def node_dir(self, nid: str) -> Path:
        return self.base_dir / nid

    def _env_argv(self, home: Path) -> list[str]:
        """Run through env(1): ROCKETMQ_HOME (both binaries require it) and HOME point into the
        run folder, so nothing is written to the user's home; exec keeps the binary's PID ours."""
        env_bin = shutil.which("env") or "/usr/bin/env"
        return [env_bin, f"HOME={home}", f"ROCKETMQ_HOME={home}", "RUST_BACKTRACE=1"]

    def write_configs(self) -> None:
        assert self.proxy is not None, "start the link proxy before writing configs"
        ns = self.base_dir / "namesrv"
        ns.mkdir(parents=True, exist_ok=True)
        write_toml(
            ns / "namesrv.toml",
            {
                "rocketmqHome": str(ns),
                "kvConfigPath": str(ns / "kvConfig.json"),
                "configStorePath": str(ns / "namesrv.properties"),
            },
        )
        for nid in self.nodes:
            d = self.node_dir(nid)
            d.mkdir(parents=True, exist_ok=True)
            host, port = self.broker_addr[nid].rsplit(":", 1)
            role = "SYNC_MASTER" if nid == self.master else "SLAVE"
            store: dict[str, Any] = {
                "brokerRole": role,
                "flushDiskType": "SYNC_FLUSH",
                "haListenPort": int(self.ha_addr[nid].rsplit(":", 1)[1]),
                "storePathRootDir": str(d / "store"),
                "storePathCommitLog": str(d / "store" / "commitlog"),
                "inSyncReplicas": IN_SYNC_REPLICAS,
                "totalReplicas": len(self.nodes),
                # RocketMQ's defaults allocate a 1 GiB commit log file and a 400 MiB index
                # file up front, 4 GiB a run: a test group needs far less
                "mappedFileSizeCommitLog": COMMIT_LOG_FILE_BYTES,
                "maxHashSlotNum": INDEX_HASH_SLOTS,
                "maxIndexNum": INDEX_ENTRIES,
            }
            if nid != self.master:
                store["haMasterAddress"] = self.proxy.address(nid, self.master)
            text = broker_toml(
                {
                    "namesrvAddr": self.namesrv_addr,
                    "listenPort": int(port),
                    "brokerIp1": host,
                    "brokerIp2": host,
                    "storePathRootDir": str(d / "store"),
                    "autoCreateTopicEnable": True,
                    "brokerRole": role,
                },
                {"brokerClusterName": CLUSTER, "brokerName": BROKER_NAME, "brokerId": self.broker_id[nid]},
                store,
            )
            (d / "broker.toml").write_text(text, encoding="utf-8")

    def start_namesrv(self) -> None:
        ns = self.base_dir / "namesrv"
        host, port = self.namesrv_addr.rsplit(":", 1)
        argv = [
            *self._env_argv(ns),
            str(self.bins[NAMESRV_BIN]),
            "-c",
            str(ns / "namesrv.toml"),
            "--rocketmqHome",
            str(ns),
            "--listenPort",
            port,
            "--bindAddress",
            host,
        ]
        self.procs.spawn("namesrv", argv, ns / "namesrv.log")

    def spawn(self, nid: str) -> None:
        d = self.node_dir(nid)
        argv = [*self._env_argv(d), str(self.bins[BROKER_BIN]), "-c", str(d / "broker.toml")]
        self.procs.spawn(nid, argv, d / "node.log")

    def peer_addresses(self) -> dict[str, str]:
        return dict(self.ha_addr)

    def listen_addresses(self) -> list[str]:
        fast = [f"{h}:{int(p) - 2}" for h, p in (a.rsplit(":", 1) for a in self.broker_addr.values())]
        return [self.namesrv_addr, *self.broker_addr.values(), *fast]

    def launch(self) -> None:
        self.write_configs()
        self.start_namesrv()
        if not _wait_listening(self.namesrv_addr, time.monotonic() + STARTUP_TIMEOUT_S):
            raise TimeoutError(
                f"{SYSTEM}: the nameserver did not listen on {self.namesrv_addr} within "
                f"{STARTUP_TIMEOUT_S:g}s; see {self.base_dir / 'namesrv' / 'namesrv.log'}"
            )
        for nid in self.nodes:
            self.spawn(nid)

    def start(self) -> None:
        super().start()  # the proxy, then the processes
        asyncio.run(self._wait_registered())
        self.view.start()  # the run's topic on the master, routed by the nameserver
        asyncio.run(self._wait_replicating())

    async def _wait_replicating(self) -> None:
        """Until the master acknowledges a send, which needs a slave's ack: for the first seconds
        after start-up it answers ``FLUSH_SLAVE_TIMEOUT``, and the run should begin on a working
        group. The probes go to a topic of their own, so the run's queues stay fresh."""
        instance = rocketmq_instance([self.namesrv_addr], "jepsen-rust-warmup")
        producer = Producer(
            "jepsen-warmup",
            [self.namesrv_addr],
            send_timeout_s=WARMUP_SEND_TIMEOUT_S,
            retries=0,
            instance=instance,
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        last = "no send tried"
        try:
            await producer.start()
            while time.monotonic() < deadline:
                try:
                    await producer.send(Message(f"{self.topic}-warmup", b"warm-up"))
                    return
                except ClientError as exc:
                    last = str(exc)
                await asyncio.sleep(0.2)
        finally:
            await producer.shutdown(grace_s=0.5)
            await instance.close()
        raise TimeoutError(
            f"{SYSTEM}: the master acknowledged no send within {STARTUP_TIMEOUT_S:g}s ({last}); "
            f"node logs under {self.base_dir}"
        )

    async def _wait_registered(self) -> None:
        """Until the nameserver routes every broker of the group (each has started and registered)."""
        instance = rocketmq_instance([self.namesrv_addr], "jepsen-rust-setup")
        admin = AdminClient([self.namesrv_addr], timeout_s=CALL_TIMEOUT_S, instance=instance)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        want = {self.broker_id[n]: self.broker_addr[n] for n in self.nodes}
        seen: dict[int, str] = {}
        last = "no answer yet"
        try:
            while time.monotonic() < deadline:
                dead = [n for n in self.nodes if not self.procs.is_running(n)]
                if dead:
                    raise TimeoutError(
                        f"{SYSTEM}: broker {dead[0]} exited during start-up; see {self.node_dir(dead[0]) / 'node.log'}"
                    )
                try:
                    groups = await admin.broker_groups()
                    bd = groups.get(BROKER_NAME)
                    seen = dict(bd.broker_addrs) if bd else {}
                    if seen == want:
                        return
                    last = f"routed {seen or 'nothing'}"
                except (ClientError, RemotingError, OSError) as exc:
                    last = str(exc)
                await asyncio.sleep(0.5)
        finally:
            await admin.close()
            await instance.close()
        raise TimeoutError(
            f"{SYSTEM}: within {STARTUP_TIMEOUT_S:g}s the nameserver did not route every broker of "
            f"{BROKER_NAME} (want {want}; {last}); node logs under {self.base_dir}"
        )

    # ------------------------------------------------------------------ roles, from the nameserver's routes

    async def status(self, nid: str) -> dict[str, Any] | None:
        if nid in self.killed or nid in self.paused:
            return None
        return await self.view.status(nid)

    async def statuses(self) -> dict[str, dict[str, Any] | None]:
        found = await self.view.statuses()
        # a killed master stays routed until the nameserver notices its closed connection
        return {n: None if n in self.killed or n in self.paused else found.get(n) for n in self.nodes}

    async def wait_for_leader(self, timeout: float = 30.0) -> str:
        return await self.view.wait_for_leader(timeout)

    # ------------------------------------------------------------------ clients and files

    def log_client(self) -> LogClient:
        raise Unsupported(f"--system {SYSTEM} runs the queue workload")

    def queue_client(self, broker_name: str | None = None) -> BrokerQueueClient:
        self.view.client_timeout = self.client_timeout
        return self.view.queue_client()

    def client_spec(self) -> dict[str, Any]:
        self.view.client_timeout = self.client_timeout
        return self.view.client_spec()

    def log_files(self) -> dict[str, Path]:
        files = {n: self.node_dir(n) / "node.log" for n in self.nodes}
        files["namesrv"] = self.base_dir / "namesrv" / "namesrv.log"
        return files

    def cleanup_data(self) -> None:
        for n in self.nodes:
            shutil.rmtree(self.node_dir(n) / "store", ignore_errors=True)
