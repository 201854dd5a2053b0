"""``--system ledgermq-proxy``: the queue workload through RocketMQ 5's gRPC proxy (``proxy``).

The group is the broker system's (two nameservers, a 3-broker group behind the link proxy,
the same nemeses: kills, pauses, partitions of brokers), plus ``proxies`` gRPC proxy
processes in front of it, started after the brokers and stopped with them by PID. The
workload's clients are 5.x clients (``proxy_client``): SendMessage to store, ReceiveMessage and
AckMessage to consume, so a run judges the brokers' POP state (what is invisible, what was
acked) through failovers as well as the log. Faults hit brokers only: the proxies are
stateless and follow masters themselves, which is what the run shows.

Each history key ``JepsenQueue/<q>`` is its own one-queue topic ``JepsenQueue-q<q>``
(``proxy_client.queue_topic``): a 5.x consumer receives from a whole topic, so a topic of
one queue is what lets a receive read one key.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from common.process import free_port
from jepsen.systems.base import Unsupported
from jepsen.systems.broker import TOPIC, LocalBrokerBackend
from jepsen.systems.clients import LogClient
from jepsen.systems.proxy_client import ProxyQueueClient, queue_topic

SYSTEM = "ledgermq-proxy"
HOST = "127.0.0.1"
DEFAULT_PROXIES = 2
MAX_PROXIES = 8
#: seconds a proxy process may take to print ``proxy=HOST:PORT``
PROXY_START_TIMEOUT_S = 60.0
#: seconds one QueryRoute may take while waiting for the proxies to route the run's topics
ROUTE_CALL_TIMEOUT_S = 3.0


class ProxyBrokerBackend(LocalBrokerBackend):
    """The local broker group plus gRPC proxies; clients talk to the proxies only."""

    system = SYSTEM

    def __init__(
        self,
        base_dir: Path,
        queues: int = 2,
        settings: dict[str, Any] | None = None,
        proxies: int = DEFAULT_PROXIES,
        groups: int | None = None,
        host_base: str | None = None,
        port_base: int | None = None,
    ) -> None:
        if int(groups or 1) != 1 or host_base is not None or port_base is not None:
            raise Unsupported(f"--system {SYSTEM} runs one broker group on ports the OS picks")
        if not 1 <= proxies <= MAX_PROXIES:
            raise Unsupported(f"{SYSTEM}: 1..{MAX_PROXIES} proxies, got {proxies}")
        super().__init__(base_dir, queues=queues, settings=settings)
        self.group.topics = [f"{queue_topic(TOPIC, q)}:1" for q in range(queues)]
        self.proxy_count = proxies
        #: proxy process name -> host:port its clients dial
        self.proxy_addrs: dict[str, str] = {}
        self._shared_proxy_client: ProxyQueueClient | None = None

    # ------------------------------------------------------------------ processes
    def launch(self) -> None:
        super().launch()
        for i in range(1, self.proxy_count + 1):
            name = f"grpc-proxy-{i}"
            addr = f"{HOST}:{free_port(HOST)}"
            argv = [
                sys.executable,
                "-m",
                "proxy",
                "--namesrv",
                ";".join(self.group.namesrv_addrs),
                "--listen",
                addr,
            ]
            self.group.spawn(name, argv, self.base_dir / name / "proxy.log")
            self.proxy_addrs[name] = addr
        deadline = time.monotonic() + PROXY_START_TIMEOUT_S
        for name in self.proxy_addrs:
            log = self.base_dir / name / "proxy.log"
            while "proxy=" not in (log.read_text(errors="replace") if log.exists() else ""):
                if not self.group.is_running(name):
                    raise RuntimeError(f"{name} exited at start; see {log}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} did not serve within {PROXY_START_TIMEOUT_S:g}s; see {log}")
                time.sleep(0.1)

    async def wait_for_leader(self, timeout: float = 30.0) -> str:
        """A ready master, and every proxy routing every topic of the run (a send before that
        would be refused TOPIC_NOT_FOUND)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        leader = await super().wait_for_leader(timeout)
        await self._wait_routed(deadline)
        return leader

    async def _wait_routed(self, deadline: float) -> None:
        import grpc

        from proxy.protocol import pb, sgrpc, spb

        loop = asyncio.get_running_loop()
        topics = [queue_topic(TOPIC, q) for q in range(self.queues)]
        for name, addr in self.proxy_addrs.items():
            async with grpc.aio.insecure_channel(addr) as channel:
                stub = sgrpc.MessagingServiceStub(channel)
                pending = list(topics)
                last = "not asked yet"
                while pending:
                    try:
                        resp = await stub.QueryRoute(
                            spb.QueryRouteRequest(topic=pb.Resource(name=pending[0])),
                            timeout=ROUTE_CALL_TIMEOUT_S,
                        )
                        if resp.status.code == pb.Code.OK:
                            pending.pop(0)
                            continue
                        last = f"{pb.Code.Name(resp.status.code)}: {resp.status.message}"
                    except grpc.aio.AioRpcError as exc:
                        last = f"{exc.code().name}: {exc.details()}"
                    if loop.time() > deadline:
                        raise TimeoutError(f"{name} did not route {pending[0]}: {last}")
                    await asyncio.sleep(0.2)

    # ------------------------------------------------------------------ clients and files
    def log_client(self) -> LogClient:
        raise Unsupported(f"--system {SYSTEM} runs the queue workload")

    def queue_client(self, broker_name: str | None = None, shared: Any = None) -> ProxyQueueClient:  # type: ignore[override]
        return ProxyQueueClient(self.proxy_addrs, self.topic, self.client_timeout)

    def shared_queue_client(self, broker_name: str | None = None) -> ProxyQueueClient:  # type: ignore[override]
        if self._shared_proxy_client is None:
            self._shared_proxy_client = self.queue_client()
        return self._shared_proxy_client

    async def close_shared_clients(self) -> None:
        shared, self._shared_proxy_client = self._shared_proxy_client, None
        if shared is not None:
            await shared.close_all()

    def client_spec(self) -> dict[str, Any]:
        return {
            "system": SYSTEM,
            "proxies": dict(self.proxy_addrs),
            "topic": self.topic,
            "queues": self.queues,
            "timeout": self.client_timeout,
        }

    def log_files(self) -> dict[str, Path]:
        files = super().log_files()
        files.update({name: self.base_dir / name / "proxy.log" for name in self.proxy_addrs})
        return files


class ProxyEndpoints:
    """The run's 5.x clients rebuilt in a worker process from ``client_spec``."""

    system = SYSTEM

    def __init__(self, spec: dict[str, Any]) -> None:
        self.proxies = {str(k): str(v) for k, v in dict(spec["proxies"]).items()}
        if not self.proxies:
            raise ValueError("no proxies in the client spec")
        self.topic = str(spec["topic"])
        self.queues = int(spec["queues"])
        self.client_timeout = float(spec["timeout"])
        self._shared: ProxyQueueClient | None = None

    def queue_client(self, broker_name: str | None = None) -> ProxyQueueClient:
        return ProxyQueueClient(self.proxies, self.topic, self.client_timeout)

    def shared_queue_client(self, broker_name: str | None = None) -> ProxyQueueClient:
        if self._shared is None:
            self._shared = self.queue_client()
        return self._shared

    async def close_shared_clients(self) -> None:
        shared, self._shared = self._shared, None
        if shared is not None:
            await shared.close_all()

    def log_client(self) -> LogClient:
        raise Unsupported(f"--system {SYSTEM} runs the queue workload")

    def register_replica(self) -> Any:
        raise Unsupported(f"--system {SYSTEM} runs the queue workload")

    def register_client(self, replica: Any) -> Any:
        raise Unsupported(f"--system {SYSTEM} runs the queue workload")
