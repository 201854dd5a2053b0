"""``jepsen run --backend docker``: the queue workload on the docker-compose.yml group.

Faults go through Docker (``docker kill``, ``docker start``, ``docker pause``, iptables
inside the containers for partitions), via ``jepsen.docker.compose.ComposeGroup``. Each
run gets its own compose project, network prefix and published ports, so it never touches
a group a user already runs, and the group is torn down (volumes included) afterwards,
with every container's log saved beside the history.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from jepsen.docker.compose import (
    LAYOUT,
    TOPIC,
    ComposeGroup,
    docker_unavailable_reason,
    free_net_prefix,
    free_port,
)
from remoting import RemotingClient

from .backends import Backend, Unsupported
from .clients import LogClient
from .proxy import Link
from .queue import QueueClient, broker_status


class DockerBrokerBackend(Backend):
    system = "broker"
    client_timeout = 4.0
    topic = TOPIC

    def __init__(self, base_dir: Path, queues: int = 2) -> None:
        super().__init__(base_dir)
        self.queues = queues
        self.logs_dir = self.base_dir / "logs"
        self.group = ComposeGroup(
            f"jepsen{os.getpid()}t{int(time.time())}",
            net=free_net_prefix(),
            published_ports={name: free_port() for name in LAYOUT},
            log_dir=self.logs_dir,
        )
        self.nodes = list(self.group.node_ids)
        self._rc: RemotingClient | None = None
        self._rc_loop: asyncio.AbstractEventLoop | None = None
        self._up = False

    def start(self) -> None:
        reason = docker_unavailable_reason()
        if reason:
            raise Unsupported(f"--backend docker needs a Docker engine: {reason}")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._up = True
        self.group.up(build="always", log=lambda *a: None)  # test the code as it is now

    def stop(self) -> None:
        if self._up:
            self._up = False
            self.group.down(logs=self.logs_dir)

    async def status(self, nid: str) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        if self._rc is None or self._rc_loop is not loop:
            self._rc = RemotingClient()
            self._rc_loop = loop
        return broker_status(await self.group.runtime_info(self._rc, self.group.service_of(nid)))

    def kill(self, nid: str) -> None:
        self.group.kill(self.group.service_of(nid))
        self.killed.add(nid)
        self.paused.discard(nid)

    def restart(self, nid: str) -> None:
        self.group.restart(self.group.service_of(nid), wait_healthy=False)
        self.killed.discard(nid)

    def pause(self, nid: str) -> None:
        self.group.pause(self.group.service_of(nid))
        self.paused.add(nid)

    def resume(self, nid: str) -> None:
        self.group.unpause(self.group.service_of(nid))
        self.paused.discard(nid)

    def set_cut(self, links: set[Link]) -> dict[str, Any]:
        svc = self.group.service_of
        reply = self.group.cut({(svc(a), svc(b)) for a, b in links})
        self.cut = set(links)
        return reply

    def log_client(self) -> LogClient:
        raise Unsupported("the docker group runs brokers: use --workload queue")

    def queue_client(self) -> QueueClient:
        names = {self.group.broker_addr(self.group.service_of(n)): n for n in self.nodes}
        return QueueClient(self.group.namesrv_addrs, names, self.topic, timeout=self.client_timeout)

    def log_files(self) -> dict[str, Path]:
        return {n: self.logs_dir / f"{self.group.service_of(n)}.log" for n in self.nodes}

    def cleanup_data(self) -> None:
        """Nothing to do: ``down -v`` already removed the containers' volumes."""
