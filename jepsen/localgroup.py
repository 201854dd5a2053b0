"""Two nameservers and one 3-broker group as real processes on 127.0.0.x, for tests, benchmarks and the harness.

Brokers b1..b3 run on 127.0.0.1..3, each with a main port, the fast port (main - 2) and
a ledger port; nameservers ns1/ns2 run on 127.0.0.1 and 127.0.0.2. Processes are named
so the harness can kill, pause and restart them by PID.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.process import ProcessSet, free_port, write_toml
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


class LocalBrokerGroup(ProcessSet):
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
            d = self.base_dir / self.name_of(nid)
            d.mkdir(parents=True, exist_ok=True)
            conf = {
                "broker_name": self.broker_name,
                "node_id": nid,
                "group": group,
                "namesrv_addr": self.namesrv_addrs,
                "data_dir": str(d / "data"),
                "listen_host": self.broker_addr[nid].rsplit(":", 1)[0],
                "topics": self.topics,
                **self.settings,
            }
            write_toml(d / "broker.toml", conf)

    def start(self) -> None:
        self.write_configs()
        for ns in self.namesrv_ids:
            self.start_namesrv(ns)
        for nid in self.node_ids:
            self.start_broker(nid)

    def start_namesrv(self, ns: str) -> None:
        host, port = self.ns_addr[ns].rsplit(":", 1)
        argv = [self.python, "-m", "namesrv", "--listen-host", host, "--listen-port", port, "--node-name", ns]
        self.spawn(ns, argv, self.base_dir / ns / "namesrv.log")

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
