"""The broker as a system under test: nameservers and broker groups of local processes, and its client adapter.

Two nameservers and three brokers run as local processes; the brokers' ledger links go
through the harness's cuttable proxies, so partitions split the Raft group while clients
still reach every broker. :class:`LocalBrokerGroupsBackend` runs several groups
(``--groups``) behind the same nameservers; the topic then has its queues on every group.

The client adapter, :class:`BrokerQueueClient`, speaks through the project's Producer (not
idempotent, so a duplicate can only come from the system, never from a retry of ours; an
unknown outcome is ``info``) and pulls from the master only, with ``requireMaster``: a
master confirms its leadership (ReadIndex) before answering, so a poll that comes back
short really reached the committed end. With ``rocketmq`` it speaks only what any
RocketMQ 4.x broker reads, which is how the ``rocketmq`` and ``rocketmq-rust`` systems and
the docker group reach their brokers too.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from broker.localgroup import LocalBrokerGroup, LocalBrokerGroups
from client.broker_api import (
    EXPRESSION_TAG,
    EXPRESSION_TYPE,
    PULL_FLAG_SUBSCRIPTION,
    SUB_VERSION,
    SUBSCRIPTION,
    SYS_FLAG,
    PullStatus,
    parse_pull_response,
    pull_request,
)
from client.broker_api import call as broker_call
from client.consumer import PullConsumer
from client.errors import BrokerError, ClientError, SendOutcomeUnknownError
from client.instance import ClientInstance
from client.message_props import dlq_topic, retry_topic, set_delay_level, set_deliver_time_ms
from client.producer import Producer
from client.route import MessageQueue
from client.send_attempts import SendStatus
from common.ports import DEFAULT_HOST_BASE, PortPlan
from jepsen.net.proxy import Link, LinkProxy
from jepsen.systems.base import ProcessBackend, Unsupported, write_cluster_secret
from jepsen.systems.broker_membership import BrokerMembership
from jepsen.systems.broker_semantics import (
    RETRY_GROUP,
    SEMANTICS_SETTINGS,
    BrokerTiming,
    HarnessOrderlyConsumer,
    LockHook,
    OnCheck,
    OnHalf,
    OrderlyListener,
    Received,
    TransactionSide,
    TxnResult,
    UnlockHook,
)
from jepsen.systems.clients import Definite, Indefinite, LogClient, Pair, decode_value
from jepsen.systems.credentials import Credentials
from jepsen.systems.rocketmq_compat import rocketmq_instance
from remoting import RemotingClient, ResponseCode
from remoting.codes import RequestCode
from remoting.exceptions import RemotingError
from remoting.jsonbody import loads_bounded
from remoting.message import Message

SYSTEM = "broker"
#: the workloads of the group's held-message semantics (delays, transactions, retries, ordered
#: consumption), besides the queue workload; the docker group runs them too
SEMANTICS_WORKLOADS = ("delay", "txn", "retry", "order")

TOPIC = "JepsenQueue"
#: pulls one poll may make to gather its ``limit`` (brokers cap each pull, see ``BrokerQueueClient.poll``)
MAX_PULLS_PER_POLL = 64
#: pairs per poll of a drain: at RocketMQ's 32 messages a pull, all MAX_PULLS_PER_POLL pulls
#: (a poll never stops short of its limit before the queue's end); at ledgermq's 1024, two
DRAIN_POLL = 32 * MAX_PULLS_PER_POLL
MAX_DRAIN_POLLS = 100_000  # a drain's bound in polls (its time is bounded by --drain-timeout)
# A pull answered NOT_MASTER naming the master (a slave asked while no master was known, or a
# deposed one) goes on to the master it named, up to this many times per pull, rather than
# failing the poll and leaving the next one to find it.
MAX_PULL_REDIRECTS = 2


class _Redirected(Definite):
    """A pull answered NOT_MASTER naming another broker as the master (certainly not served)."""

    def __init__(self, message: str, master: str) -> None:
        super().__init__(message)
        self.master = master


#: a master's answers to a pull of a queue that exists: each came past its leadership check
_PULL_ANSWERS = (
    ResponseCode.SUCCESS,
    ResponseCode.PULL_NOT_FOUND,
    ResponseCode.PULL_RETRY_IMMEDIATELY,
    ResponseCode.PULL_OFFSET_MOVED,
)


class _ProxiedBrokerGroup(LocalBrokerGroup):
    """A broker group whose ledger nodes reach each other through the link proxy."""

    proxy: LinkProxy | None = None
    pool: tuple[str, ...] = ()  # every broker the run may start (the proxy fronts their links)

    def peer_ledger_addr(self, nid: str, peer: str) -> str:
        assert self.proxy is not None, "start the link proxy before writing configs"
        return self.proxy.address(nid, peer)

    def node_settings(self, nid: str) -> dict[str, Any]:
        """``ledger_dial``: every other broker of the pool through its link's proxy, so one
        added later (the configuration carries where it listens) is still dialled through the
        link a partition cuts, and so are the first members by a broker that joined."""
        assert self.proxy is not None, "start the link proxy before writing configs"
        return {
            "ledger_dial": [
                f"{p}={self.proxy.address(nid, p)}" for p in self.pool or self.node_ids if p != nid
            ]
        }


def broker_status(info: dict[str, Any] | None) -> dict[str, Any] | None:
    """A broker's runtime info as the harness's status (leader = its ledger node leads and it is master)."""
    if info is None:
        return None
    led = info.get("ledger", {})
    return {
        "role": led.get("role"),
        "term": led.get("term"),
        "leader": led.get("leader"),
        "ready": bool(led.get("leader_ready")) and info.get("role") == "MASTER",
        "commit_index": led.get("commit_index"),
    }


class _BrokerProcessBackend(ProcessBackend):
    """What the one-group and the several-group local broker backends share: their ``group``
    (a LocalBrokerGroup or LocalBrokerGroups behind the link proxy) starts, places and
    restarts the brokers, and names their peer and listen addresses."""

    group: _ProxiedBrokerGroup | _ProxiedBrokerGroups

    def peer_addresses(self) -> dict[str, str]:
        return dict(self.group.ledger_addr)

    def launch(self) -> None:
        self.group.proxy = self.proxy
        self.group.start()

    def listen_addresses(self) -> list[str]:
        return self.group.listen_addresses()

    def spawn(self, nid: str) -> None:
        self.group.start_broker(nid)

    def shared_queue_client(self, broker_name: str | None = None) -> BrokerQueueClient:
        """A queue client on this process's shared instance (see SharedInstance)."""
        if getattr(self, "_shared", None) is None:
            self._shared = SharedInstance(self.group.namesrv_addrs)
        return self.queue_client(broker_name, self._shared)

    async def close_shared_clients(self) -> None:
        """Close the shared instance's connections (the workload's teardown)."""
        shared = getattr(self, "_shared", None)
        if shared is not None:
            await shared.close()

    def forge_targets(self) -> dict[str, Any]:
        return {
            "ledger": dict(self.group.ledger_addr),
            "secured": bool(
                self.group.settings.get("cluster_secret") or self.group.settings.get("cluster_secret_file")
            ),
            "admin": [self.group.broker_addr[n] for n in self.nodes],
            "acl": bool(self.group.settings.get("acl_enable")),
        }


class LocalBrokerBackend(BrokerMembership, _BrokerProcessBackend):
    """Two nameservers and a 3-broker group of local processes; faults hit the brokers."""

    system = SYSTEM
    client_timeout = 4.0
    topic = TOPIC
    supports_corruption = True

    def __init__(self, base_dir: Path, queues: int = 2, settings: dict[str, Any] | None = None) -> None:
        self.queues = queues
        settings = {"register_interval_s": 10, **SEMANTICS_SETTINGS, **(settings or {})}
        if "cluster_secret" not in settings and "cluster_secret_file" not in settings:
            # the brokers' ledger peers authenticate each other, as in production
            settings["cluster_secret_file"] = str(write_cluster_secret(Path(base_dir)))
        self.timing = BrokerTiming.from_settings(settings)
        self.group = _ProxiedBrokerGroup(Path(base_dir), topics=(f"{TOPIC}:{queues}",), settings=settings)
        super().__init__(base_dir, self.group)
        self.nodes = list(self.group.node_ids)
        self._rc = self.loop_client(RemotingClient)

    def process_name(self, nid: str) -> str:
        return self.group.name_of(nid)

    def ledger_dir(self, nid: str) -> Path | None:
        return self.base_dir / self.group.name_of(nid) / "data" / "ledger"

    async def status(self, nid: str) -> dict[str, Any] | None:
        return broker_status(await self.group.runtime_info(self._rc.get(), nid))

    def log_client(self) -> LogClient:
        raise Unsupported(
            "the broker backend runs the queue workload (the log workload talks to bare ledger nodes)"
        )

    def queue_client(
        self, broker_name: str | None = None, shared: SharedInstance | None = None
    ) -> BrokerQueueClient:
        names = {self.group.broker_addr[n]: n for n in self.nodes}
        return BrokerQueueClient(
            self.group.namesrv_addrs,
            names,
            self.topic,
            timeout=self.client_timeout,
            broker_name=broker_name,
            timing=self.timing,
            shared=shared,
        )

    def client_spec(self) -> dict[str, Any]:
        return queue_spec(self, {self.group.broker_addr[n]: n for n in self.nodes}, self.group.namesrv_addrs)

    def log_files(self) -> dict[str, Path]:
        files = {n: self.base_dir / self.group.name_of(n) / "broker.log" for n in self.nodes}
        files.update({ns: self.base_dir / ns / "namesrv.log" for ns in self.group.namesrv_ids})
        return files

    def cleanup_data(self) -> None:
        for n in self.nodes:
            shutil.rmtree(self.base_dir / self.group.name_of(n) / "data", ignore_errors=True)


class _ProxiedBrokerGroups(LocalBrokerGroups):
    """Several broker groups whose ledger nodes reach their own group's peers through the link proxy."""

    proxy: LinkProxy | None = None
    pool: tuple[str, ...] = ()  # every broker the run may start (the proxy fronts their group's links)

    def peer_ledger_addr(self, nid: str, peer: str) -> str:
        assert self.proxy is not None, "start the link proxy before writing configs"
        return self.proxy.address(nid, peer)

    def node_settings(self, nid: str) -> dict[str, Any]:
        """``ledger_dial``: every other broker of ``nid``'s group in the pool through its link's
        proxy (the ledger names them by their id within the group)."""
        assert self.proxy is not None, "start the link proxy before writing configs"
        mine = [p for p in self.pool or self.node_ids if self.group_of(p) == self.group_of(nid) and p != nid]
        return {"ledger_dial": [f"{p.split('/', 1)[1]}={self.proxy.address(nid, p)}" for p in mine]}


class LocalBrokerGroupsBackend(BrokerMembership, _BrokerProcessBackend):
    """Two nameservers and ``groups`` 3-broker groups of local processes (``--groups``, ``--port-base``).

    Nodes are named ``<broker name>/<node>`` (``broker-b/n2``), so the history's ``node``
    field and every nemesis event say which group they concern. The test topic is created
    on every group, so its queues, and with them the history's keys
    (``<topic>/<broker name>/<queue>``), spread over all groups. Only the members of one
    group talk to each other, so the link proxy carries (and a partition cuts) links within
    groups; a partition drawn across groups cuts each group along the line it draws.
    """

    system = SYSTEM
    client_timeout = 4.0
    topic = TOPIC
    supports_corruption = True

    def __init__(
        self,
        base_dir: Path,
        queues: int = 2,
        settings: dict[str, Any] | None = None,
        *,
        groups: int = 1,
        ports: PortPlan | None = None,
    ) -> None:
        self.queues = queues
        settings = {"register_interval_s": 10, **SEMANTICS_SETTINGS, **(settings or {})}
        if "cluster_secret" not in settings and "cluster_secret_file" not in settings:
            settings["cluster_secret_file"] = str(write_cluster_secret(Path(base_dir)))
        self.timing = BrokerTiming.from_settings(settings)
        self.group = _ProxiedBrokerGroups(
            Path(base_dir), groups=groups, topics=(f"{TOPIC}:{queues}",), settings=settings, ports=ports
        )
        super().__init__(base_dir, self.group)
        self.nodes = list(self.group.node_ids)
        self.broker_names = list(self.group.broker_names)
        self._links: list[Link] = [
            (a, b) for members in self.group.members.values() for a in members for b in members if a != b
        ]
        # planned now, with the brokers' ports, so that the whole run's range is known up front
        self._link_ports: dict[Link, int] | None = (
            {
                (a, b): self.group.ports.port(self.group.ledger_addr[b].rsplit(":", 1)[0])
                for a, b in self._links
            }
            if self.group.ports.port_base is not None
            else None
        )
        self._rc = self.loop_client(RemotingClient)

    @property
    def port_span(self) -> tuple[int, int] | None:
        """The ports this run takes from ``--port-base`` (first, last), None without one."""
        return self.group.ports.span

    def node_groups(self) -> dict[str, list[str]]:
        return {name: list(members) for name, members in self.group.members.items()}

    def proxy_links(self) -> list[Link] | None:
        return list(self._links)

    def proxy_ports(self) -> dict[Link, int] | None:
        return self._link_ports

    def ledger_dir(self, nid: str) -> Path | None:
        return self.group.node_dir(nid) / "data" / "ledger"

    async def status(self, nid: str) -> dict[str, Any] | None:
        st = broker_status(await self.group.runtime_info(self._rc.get(), nid))
        if st is not None and st.get("leader"):  # the ledger names its peers within the group
            st["leader"] = f"{self.group.group_of(nid)}/{st['leader']}"
        return st

    async def wait_for_leader(self, timeout: float = 30.0) -> str:
        """Every group has a ready master (the run needs all its queues); returns them, comma-separated."""
        return await self.wait_for_every_leader(timeout)

    def log_client(self) -> LogClient:
        raise Unsupported("the broker backend runs the queue workload")

    def queue_client(
        self, broker_name: str | None = None, shared: SharedInstance | None = None
    ) -> BrokerQueueClient:
        names = {self.group.broker_addr[n]: n for n in self.nodes}
        return BrokerQueueClient(
            self.group.namesrv_addrs,
            names,
            self.topic,
            timeout=self.client_timeout,
            broker_name=broker_name,
            timing=self.timing,
            shared=shared,
        )

    def client_spec(self) -> dict[str, Any]:
        spec = queue_spec(self, {self.group.broker_addr[n]: n for n in self.nodes}, self.group.namesrv_addrs)
        spec["broker_names"] = list(self.broker_names)
        return spec

    def log_files(self) -> dict[str, Path]:
        files = {n: self.group.node_dir(n) / "broker.log" for n in self.nodes}
        files.update({ns: self.base_dir / ns / "namesrv.log" for ns in self.group.namesrv_ids})
        return files

    def cleanup_data(self) -> None:
        for n in self.nodes:
            shutil.rmtree(self.group.node_dir(n) / "data", ignore_errors=True)


def local_broker_backend(
    base_dir: Path,
    *,
    groups: int | None = 1,
    host_base: str | None = None,
    port_base: int | None = None,
    **kw: Any,
) -> ProcessBackend:
    """The local broker backend for ``--groups``, ``--host-base`` and ``--port-base``: one group
    where the OS picks the ports unless asked for more."""
    groups = int(groups or 1)
    if groups == 1 and host_base is None and port_base is None:
        return LocalBrokerBackend(base_dir, **kw)
    ports = PortPlan(host_base or DEFAULT_HOST_BASE, port_base)
    return LocalBrokerGroupsBackend(base_dir, groups=groups, ports=ports, **kw)


def queue_spec(
    backend: Any, names: dict[str, str], namesrv: list[str], credentials_file: Path | None = None
) -> dict[str, Any]:
    """A broker backend's clients as plain JSON for worker processes.

    ``credentials_file`` (see :mod:`.credentials`): the ACL account the clients sign with, named
    by path so that the secret itself is not copied into every worker's spec.
    """
    spec: dict[str, Any] = {
        "system": "broker",
        "namesrv": list(namesrv),
        "names": names,
        "topic": backend.topic,
        "queues": backend.queues,
        "timeout": backend.client_timeout,
        "broker_name": getattr(backend, "broker_name", None),
    }
    timing = getattr(backend, "timing", None)
    if isinstance(timing, BrokerTiming):  # without it: the broker's defaults (the docker group's)
        spec["timing"] = timing.to_spec()
    if credentials_file is not None:
        spec["credentials_file"] = str(credentials_file)
    return spec


class QueueEndpoints:
    """The clients of a broker group, built from :func:`queue_spec` in a worker process."""

    system = SYSTEM

    def __init__(self, spec: dict[str, Any]) -> None:
        self.namesrv = [str(a) for a in spec["namesrv"]]
        self.names = {str(k): str(v) for k, v in spec["names"].items()}
        self.topic = str(spec["topic"])
        self.queues = int(spec["queues"])
        self.client_timeout = float(spec["timeout"])
        self.broker_name = str(spec["broker_name"]) if spec.get("broker_name") else None
        #: several broker groups: the workload's queues are spread over these
        self.broker_names = [str(b) for b in spec.get("broker_names") or []] or None
        self.rocketmq = bool(spec.get("rocketmq", False))
        if self.rocketmq:
            self.system = "rocketmq"
        cred = spec.get("credentials_file")
        self.credentials = Credentials.read(cred) if cred else None
        self.timing = BrokerTiming.from_spec(spec.get("timing"))
        self._shared = SharedInstance(self.namesrv, self.credentials)

    def queue_client(
        self, broker_name: str | None = None, shared: SharedInstance | None = None
    ) -> BrokerQueueClient:
        return BrokerQueueClient(
            self.namesrv,
            self.names,
            self.topic,
            timeout=self.client_timeout,
            broker_name=broker_name or self.broker_name,
            rocketmq=self.rocketmq,
            credentials=self.credentials,
            timing=self.timing,
            shared=shared,
        )

    def shared_queue_client(self, broker_name: str | None = None) -> BrokerQueueClient:
        """A queue client on this worker process's shared instance (see SharedInstance)."""
        return self.queue_client(broker_name, self._shared)

    async def close_shared_clients(self) -> None:
        await self._shared.close()

    def log_client(self) -> LogClient:
        raise Unsupported("a broker group runs the queue workload")

    def register_replica(self) -> Any:
        raise Unsupported("a broker group runs the queue workload")

    def register_client(self, replica: Any) -> Any:
        raise Unsupported("a broker group runs the queue workload")


class SharedInstance:
    """One ClientInstance that a harness process's queue clients share, built on first use.

    RocketMQ shares one MQClientInstance (connections, route table) among the producers and
    consumers of a JVM; the harness made one per client, so a process of 1,024 clients held
    1,024 route tables and connections. Under full load a leader kill then replaced about
    2,000 of them at once (an indefinite operation means a fresh client), and each one's
    first poll asked a nameserver for the route over a new connection: nameserver round trips
    of 100-400 ms were most of the time between the new master serving and the clients
    finding it. Shared, a process asks once, learns a dead or new master once (the dead-master
    mark and NOT_MASTER hints serve every client) and keeps its connections.

    Only the queue workload's sends and polls share it (``shared_queue_client``): orderly
    consumers and transaction producers need a client id of their own. An instance belongs to
    the event loop that built it; another loop (a later phase of a run) gets its own.
    """

    def __init__(self, namesrv: list[str], credentials: Credentials | None = None) -> None:
        self.namesrv = list(namesrv)
        self.credentials = credentials
        self._instance: ClientInstance | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> ClientInstance:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # built outside a loop: it binds to the loop that first uses it
            loop = self._loop
        if self._instance is None or self._instance.closed or self._loop is not loop:
            cred = self.credentials
            self._instance = ClientInstance(
                self.namesrv,
                name="jepsen",
                access_key=cred.access_key if cred is not None else None,
                secret_key=cred.secret_key if cred is not None else None,
            )
            self._loop = loop
        return self._instance

    async def close(self) -> None:
        """Close the instance of the running loop (one of another loop went with that loop)."""
        instance, self._instance = self._instance, None
        if instance is not None and self._loop is asyncio.get_running_loop():
            await instance.close()


class BrokerQueueClient:
    """Producer and master-only pulls for one harness process.

    ``broker_name`` pins every send and poll to that broker group's queues (a cluster with
    several groups has a queue 0 on each; one history key must be one queue). ``rocketmq``
    speaks only what any RocketMQ 4.x broker reads: JSON headers, no ledgermq CRC extField,
    and pulls that carry their subscription (RocketMQ refuses a pull from a group it holds no
    subscription for). ``credentials``: sign every request with this ACL account (brokers with
    ACL on refuse unsigned ones); without them the LEDGERMQ_ACCESS_KEY/SECRET_KEY variables, if
    set, are used, as for any of our clients.

    The semantics workloads (``delay``, ``txn``, ``retry``, ``order``) use its second half:
    delayed sends, pulls of any topic that keep each message's store time and try count
    (:class:`~jepsen.systems.broker_semantics.Received`), send-backs, transactions, orderly
    consumers, and the group's count of held messages; ``timing`` is the group's configuration
    they judge it by.
    """

    def __init__(
        self,
        namesrv: list[str],
        names: dict[str, str],
        topic: str,
        *,
        timeout: float = 4.0,
        broker_name: str | None = None,
        rocketmq: bool = False,
        credentials: Credentials | None = None,
        timing: BrokerTiming | None = None,
        shared: SharedInstance | None = None,
    ) -> None:
        self.topic = topic
        self.namesrv = list(namesrv)
        self.shared = None if rocketmq else shared  # the process's instance (not ours to close)
        self.rocketmq = rocketmq
        self.timing = timing or BrokerTiming()
        self.credentials = credentials
        # Built on first use: the workload replaces a client after every indefinite operation
        # (a fresh process), so a kill under full load replaced ~2,000 of them at once, and
        # building each one's producer, consumer and connections up front (about 140 us) held
        # the worker's loop for hundreds of milliseconds just when the group came back.
        self._instance_made = False
        self._instance_value: ClientInstance | None = None
        self._producer: Producer | None = None
        self._consumer: PullConsumer | None = None
        self._producer_started = False
        self._consumer_started = False
        self.names = names
        self.timeout = timeout
        self.node: str | None = None
        self._broker_name: str | None = broker_name
        self._retry_consumer: PullConsumer | None = None
        self._txn: TransactionSide | None = None
        self._on_check: OnCheck | None = None
        self._orderly: list[HarnessOrderlyConsumer] = []

    @property
    def _instance(self) -> ClientInstance | None:
        """The client instance the producer and consumers share (None: each makes its own)."""
        if self.shared is not None:
            return self.shared.get()  # not kept in _instance_value: close() leaves it open
        if not self._instance_made:
            self._instance_made = True
            if self.rocketmq:
                self._instance_value = rocketmq_instance(self.namesrv, "jepsen-rocketmq")
            elif self.credentials is not None:  # one signing instance shared by the producer and the consumer
                cred = self.credentials
                self._instance_value = ClientInstance(
                    self.namesrv, name="jepsen", access_key=cred.access_key, secret_key=cred.secret_key
                )
        return self._instance_value

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                "jepsen",
                self.namesrv,
                send_timeout_s=self.timeout,
                retries=2,
                retry_backoff_s=0.05,
                instance=self._instance,
            )
        return self._producer

    @property
    def consumer(self) -> PullConsumer:
        if self._consumer is None:
            self._consumer = PullConsumer(
                "jepsen", self.namesrv, call_timeout_s=self.timeout, instance=self._instance
            )
        return self._consumer

    def target(self, queue_id: int) -> dict[str, Any]:
        """The send arguments that reach ``queue_id`` (of the pinned group, if there is one)."""
        if self._broker_name is None:
            return {"queue_id": queue_id}
        return {"queue": MessageQueue(self.topic, self._broker_name, queue_id)}

    async def _ensure(self) -> None:
        await self._ensure_producer()
        await self._ensure_consumer()

    async def _ensure_producer(self) -> None:
        if not self._producer_started:
            await self.producer.start()
            self._producer_started = True

    async def _ensure_consumer(self) -> None:
        if not self._consumer_started:
            await self.consumer.start()
            self._consumer_started = True

    async def send(self, queue_id: int, value: int) -> int:
        return (await self._send(Message(self.topic, str(value).encode()), queue_id)).queue_offset

    async def _send(self, msg: Message, queue_id: int) -> Any:
        """One message to ``queue_id``; the SendResult once it is stored and replicated."""
        await self._ensure_producer()
        try:
            r = await self.producer.send(msg, **self.target(queue_id))
        except SendOutcomeUnknownError as exc:
            raise Indefinite(str(exc)) from None
        except ClientError as exc:
            raise Definite(str(exc)) from None
        if r.status is not SendStatus.SEND_OK:  # stored, but neither flushed nor copied for sure
            raise Indefinite(f"stored with status {r.status.value} by {r.broker_addr}")
        self.node = self.names.get(r.broker_addr, r.broker_addr)
        return r

    async def send_batch(self, queue_id: int, values: list[int]) -> tuple[list[int], str | None]:
        """``values`` as one batch request to ``queue_id``: their offsets in order and the node
        that stored them, or one error for all of them."""
        try:
            await self._ensure_producer()
            msgs = [Message(self.topic, str(v).encode()) for v in values]
            r = await self.producer.send_batch(msgs, **self.target(queue_id))
        except SendOutcomeUnknownError as exc:
            raise Indefinite(str(exc)) from None
        except ClientError as exc:
            raise Definite(str(exc)) from None
        if len(r.offsets) != len(values):
            raise Indefinite(f"batch of {len(values)} answered with {len(r.offsets)} offsets")
        if r.status is not SendStatus.SEND_OK:  # stored, but neither flushed nor copied for sure
            raise Indefinite(f"batch stored with status {r.status.value} by {r.broker_addr}")
        return list(r.offsets), self.names.get(r.broker_addr, r.broker_addr)

    async def _master(self) -> tuple[str, str]:
        routes = self.consumer.instance.routes
        if self._broker_name is None:
            queues = await self.consumer.fetch_queues(self.topic)
            if not queues:
                raise Definite(f"no route for {self.topic}")
            self._broker_name = queues[0].broker_name
        addr = routes.master_addr(self._broker_name)
        if addr is None and not self.rocketmq:
            # No master known (it just failed): a ledgermq slave answers a master-only pull
            # with NOT_MASTER naming the master as soon as its ledger knows the leader, sooner
            # than the nameservers hear of the switch (a RocketMQ slave would serve the pull).
            addr = routes.member_to_ask(self._broker_name)
        if addr is None:
            await routes.route(self.topic, force=True)
            addr = routes.master_addr(self._broker_name)
        if addr is None:
            raise Definite(f"broker group {self._broker_name} has no master at the moment")
        return self._broker_name, addr

    async def poll(self, queue_id: int, start: int, limit: int) -> list[Pair]:
        """Up to ``limit`` pairs from ``start``; fewer only when the queue's end was reached.

        A RocketMQ broker answers one pull with at most its own cap (Apache RocketMQ's and
        RocketMQ-Rust's default: 32 messages), so a short pull does not mean the end of the
        queue: the pull's ``maxOffset`` does. Pulls go on until ``limit`` or that end (at
        most ``MAX_PULLS_PER_POLL``), so that a short poll means what the checker takes it to
        mean (the reader reached the end), for any broker.
        """
        got = await self._gather(queue_id, start, limit, self.topic)
        return [(m.queue_offset, decode_value(m.body)) for m in got]

    async def _gather(self, queue_id: int, start: int, limit: int, topic: str) -> list[Message]:
        """``poll``'s pulls of ``topic`` (see there), as messages."""
        out: list[Message] = []
        offset = start
        for _ in range(MAX_PULLS_PER_POLL):
            batch, end = await self._pull(queue_id, offset, limit - len(out), topic)
            out.extend(batch)
            if not batch or len(out) >= limit:
                break
            offset = batch[-1].queue_offset + 1
            if offset >= end:
                break
        return out

    async def _pull(self, queue_id: int, start: int, limit: int, topic: str) -> tuple[list[Message], int]:
        """One pull from the master: its messages and the queue's max offset as the broker reported it.

        A group's retry or dead-letter topic exists only once something was sent back: when the
        master says such a topic does not exist, a pull of the test topic from the same master
        (which confirms its leadership and applies what was committed first) makes that answer
        mean "empty"; a deposed master's word on it would not.
        """
        await self._ensure_consumer()
        name, addr = await self._master()
        for redirects in range(MAX_PULL_REDIRECTS + 1):
            try:
                resp = await self._pull_from(addr, name, topic, queue_id, start, limit)
                break
            except _Redirected as exc:
                if redirects == MAX_PULL_REDIRECTS:
                    raise
                addr = exc.master
        if resp.code == ResponseCode.TOPIC_NOT_EXIST and topic != self.topic:
            confirm = await self._pull_from(addr, name, self.topic, 0, 0, 1)
            if confirm.code in _PULL_ANSWERS:
                return [], 0
            raise Definite(f"{addr} said {topic} does not exist, then did not confirm it is the master")
        result = parse_pull_response(resp, addr, name, start)
        if result.status is PullStatus.OFFSET_ILLEGAL:
            raise Definite(f"offset {start} outside [{result.min_offset}, {result.max_offset}]")
        return result.messages, result.max_offset

    async def _pull_from(
        self, addr: str, name: str, topic: str, queue_id: int, start: int, limit: int
    ) -> Any:
        """The master's answer to one pull (NOT_MASTER and unreachable masters are Definite)."""
        req = pull_request("jepsen", topic, queue_id, start, limit, 0)
        if self.rocketmq:  # RocketMQ's broker wants the subscription with the pull ("*": every tag)
            req.headers[SUBSCRIPTION] = "*"
            req.headers[EXPRESSION_TYPE] = EXPRESSION_TAG
            req.headers[SUB_VERSION] = 0
            req.headers[SYS_FLAG] = int(req.headers.get(SYS_FLAG) or 0) | PULL_FLAG_SUBSCRIPTION
        req.headers["requireMaster"] = True  # ledgermq's ReadIndex check; RocketMQ ignores it
        self.node = self.names.get(addr, addr)
        try:
            resp = await self.consumer.instance.remoting.invoke_sync(addr, req, self.timeout)
        except RemotingError as exc:
            routes = self.consumer.instance.routes
            if routes.master_addr(name) == addr:  # not a slave we asked: the master we knew
                routes.forget_master(name, addr)
            raise Definite(f"pull from {addr}: {exc}") from None
        if resp.code in (ResponseCode.NOT_MASTER, ResponseCode.SERVICE_NOT_AVAILABLE):
            hint = str(resp.headers.get("masterAddr") or "")
            routes = self.consumer.instance.routes
            if hint and hint != addr and resp.code == ResponseCode.NOT_MASTER:
                routes.note_master(name, hint)
                raise _Redirected(f"{addr} is not the master, {hint} is: {resp.remark}", hint)
            # (a leader still applying its backlog names itself: it is about to serve, keep it)
            if hint != addr and routes.master_addr(name) == addr:  # the master we knew, not a slave asked
                routes.forget_master(name, addr)
            raise Definite(f"{addr} is not the master: {resp.remark}")
        return resp

    async def drain(self, queue_id: int) -> list[Pair]:
        """The whole queue from offset 0: the concatenation of :meth:`drain_pages`."""
        return [pair async for page in self.drain_pages(queue_id, DRAIN_POLL) for pair in page]

    async def drain_pages(self, queue_id: int, page: int) -> AsyncIterator[list[Pair]]:
        """``drain`` as consecutive pages of ``page`` pairs, each handed over as soon as it is
        read, the last one shorter (possibly empty: the end): its reader holds a page and one
        poll's messages, never the whole queue."""
        buf: list[Pair] = []
        async for batch in self._drain_polls(queue_id, self.topic):
            buf.extend((m.queue_offset, decode_value(m.body)) for m in batch)
            while len(buf) >= page:
                yield buf[:page]
                del buf[:page]
        yield buf

    async def _drain_polls(self, queue_id: int, topic: str) -> AsyncIterator[list[Message]]:
        """``topic``'s queue from offset 0, a poll of ``DRAIN_POLL`` at a time until a short one
        (the end): the one poll loop of every drain, bounded by ``MAX_DRAIN_POLLS``."""
        start = 0
        for _ in range(MAX_DRAIN_POLLS):
            batch = await self._gather(queue_id, start, DRAIN_POLL, topic)
            yield batch
            if len(batch) < DRAIN_POLL:
                return
            start = batch[-1].queue_offset + 1
        raise Indefinite(f"drain did not reach the end in {MAX_DRAIN_POLLS} polls of {DRAIN_POLL}")

    async def _drain(self, queue_id: int, topic: str) -> list[Message]:
        return [m async for batch in self._drain_polls(queue_id, topic) for m in batch]

    # --- the semantics workloads ------------------------------------------------------------

    @property
    def retry_topic(self) -> str:
        """Where the retry workload's sent-back messages come back (``%RETRY%<its group>``)."""
        return retry_topic(RETRY_GROUP)

    @property
    def dlq_topic(self) -> str:
        """Where the retry workload's messages end after their last try (``%DLQ%<its group>``)."""
        return dlq_topic(RETRY_GROUP)

    async def send_delayed(
        self, queue_id: int, value: int, *, level: int | None = None, deliver_ms: int | None = None
    ) -> None:
        """``value`` to ``queue_id``, to be delivered after delay ``level`` or at ``deliver_ms``
        (ms since the epoch, RocketMQ 5's timer)."""
        msg = Message(self.topic, str(value).encode())
        if level:
            set_delay_level(msg, level)
        if deliver_ms:
            set_deliver_time_ms(msg, deliver_ms)
        await self._send(msg, queue_id)

    async def pull_received(
        self, queue_id: int, start: int, limit: int, *, topic: str | None = None
    ) -> list[Received]:
        """``poll`` of ``topic`` (default: the test topic) that keeps what the semantics judge by."""
        return [Received.of(m) for m in await self._gather(queue_id, start, limit, topic or self.topic)]

    async def drain_received(self, queue_id: int, *, topic: str | None = None) -> list[Received]:
        """``drain`` of ``topic`` (default: the test topic) as ``pull_received`` sees messages."""
        return [Received.of(m) for m in await self._drain(queue_id, topic or self.topic)]

    async def send_back(self, received: Received, *, max_reconsume_times: int, delay_level: int) -> None:
        """CONSUMER_SEND_MSG_BACK of a pulled message for the retry group: a retry after
        ``delay_level``, or a dead letter once it was tried ``max_reconsume_times`` times."""
        if received.message is None:
            raise Definite("only a pulled message can be sent back")
        name, _ = await self._master()
        if self._retry_consumer is None:
            self._retry_consumer = PullConsumer(
                RETRY_GROUP, self.namesrv, call_timeout_s=self.timeout, instance=self._instance
            )
            await self._retry_consumer.start()
        try:
            await self._retry_consumer.send_message_back(
                received.message,
                name,
                delay_level=delay_level,
                max_reconsume_times=max_reconsume_times,
                timeout_s=self.timeout,
            )
        except BrokerError as exc:  # the master answered: it did not store the copy
            raise Definite(str(exc)) from None
        except (ClientError, RemotingError) as exc:  # unanswered: it may have
            raise Indefinite(f"{type(exc).__name__}: {exc}") from None

    async def route_queues(self) -> list[tuple[str, int]]:
        """Every readable queue of the topic as (broker name, queue id), as the nameservers
        route it: a transactional producer picks among all of them, not the backend's ``queues``."""
        await self._ensure_consumer()
        return sorted((q.broker_name, q.queue_id) for q in await self.consumer.fetch_queues(self.topic))

    async def held_counts(self) -> dict[str, int]:
        """Delayed messages not yet due (``scheduled``) and unresolved half messages
        (``halves``) over every group of the topic, as their masters report them."""
        await self._ensure_consumer()
        names = sorted({q.broker_name for q in await self.consumer.fetch_queues(self.topic)})
        routes = self.consumer.instance.routes
        out = {"scheduled": 0, "halves": 0}
        for name in names:
            addr = routes.master_addr(name)
            if addr is None:
                raise Definite(f"broker group {name} has no master at the moment")
            try:
                resp = await broker_call(
                    self.consumer.instance.remoting,
                    addr,
                    RequestCode.GET_BROKER_RUNTIME_INFO,
                    timeout_s=self.timeout,
                    what="runtime info",
                )
                info = loads_bounded(bytes(resp.body), "runtime info")
            except (ClientError, RemotingError) as exc:
                raise Definite(f"runtime info of {addr}: {exc}") from None
            store = info.get("store") if isinstance(info, dict) else None
            if not isinstance(store, dict):
                raise Definite(f"runtime info of {addr} has no store section")
            out["scheduled"] += int(store.get("scheduled_messages") or 0)
            out["halves"] += int(store.get("pending_half_messages") or 0)
        return out

    def set_transaction_checker(self, on_check: OnCheck) -> None:
        """Who answers the brokers' checks of this client's transactional producer group
        (before its first transactional send or ``answer_checks``)."""
        self._on_check = on_check

    def _transactions(self) -> TransactionSide:
        if self._txn is None:
            if self._on_check is None:
                raise Definite("set_transaction_checker first: a transactional producer must answer checks")
            self._txn = TransactionSide(
                self.namesrv, timeout=self.timeout, instance=self._instance, on_check=self._on_check
            )
        return self._txn

    async def answer_checks(self) -> None:
        """Start the transactional producer (it heartbeats, so the brokers ask it) without sending."""
        try:
            await self._transactions().start(self.topic)
        except ClientError as exc:
            raise Definite(str(exc)) from None

    async def send_transactional(self, value: int, outcome: str, on_half: OnHalf) -> TxnResult:
        """``value`` as a transactional message whose checks are answered from ``outcome``;
        ``on_half()`` (once the half is stored) decides how this send ends it."""
        try:
            return await self._transactions().send(self.topic, value, outcome, on_half)
        except SendOutcomeUnknownError as exc:
            raise Indefinite(str(exc)) from None
        except ClientError as exc:
            raise Definite(str(exc)) from None

    def orderly_consumer(
        self, listener: OrderlyListener, *, on_lock: LockHook, on_unlock: UnlockHook, batch_size: int = 8
    ) -> HarnessOrderlyConsumer:
        """An orderly consumer of the topic in the order workload's group (closed with the client)."""
        c = HarnessOrderlyConsumer(
            self.namesrv,
            self.topic,
            listener,
            on_lock=on_lock,
            on_unlock=on_unlock,
            timing=self.timing,
            instance=self._instance,
            batch_size=batch_size,
            timeout=self.timeout,
        )
        self._orderly.append(c)
        return c

    async def close(self) -> None:
        for c in self._orderly:
            await c.shutdown()
        self._orderly = []
        if self._txn is not None:
            await self._txn.close()
            self._txn = None
        if self._retry_consumer is not None:
            await self._retry_consumer.shutdown()
            self._retry_consumer = None
        if self._producer_started:
            await self.producer.shutdown(grace_s=0.5)
            self._producer_started = False
        if self._consumer_started:
            await self.consumer.shutdown()
            self._consumer_started = False
        if self._instance_value is not None:
            await self._instance_value.close()
