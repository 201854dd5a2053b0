"""A ledger group of real OS processes on loopback addresses (127.0.0.x), for tests, benchmarks and users.

Each node gets its own address, port, data directory, config file and log file; the
cluster can SIGKILL, SIGSTOP/SIGCONT and restart nodes by PID, and always cleans up every
process it started. Starting, stopping and signals are ``common.localgroup``'s; this module
holds only what a ledger node needs (its config, its command, what "ready" means).
"""

from __future__ import annotations

import ssl
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.cluster_secret import write_cluster_secret
from common.localgroup import LocalGroup, poll_until
from common.process import free_port, write_toml
from common.tls import client_context

from .client import LedgerClient

#: seconds between two rounds of status requests while waiting for a leader
LEADER_POLL_S = 0.05


class LocalCluster(LocalGroup):
    """``n`` ledger nodes n1..nN, each on its own loopback host unless ``distinct_hosts`` is off."""

    def __init__(
        self,
        base_dir: str | Path,
        n: int = 3,
        *,
        settings: Mapping[str, Any] | None = None,
        distinct_hosts: bool = True,
        python: str = sys.executable,
    ) -> None:
        super().__init__(base_dir)
        self.ids = [f"n{i + 1}" for i in range(n)]
        self.hosts = {
            nid: (f"127.0.0.{i + 1}" if distinct_hosts else "127.0.0.1") for i, nid in enumerate(self.ids)
        }
        self.ports = {nid: free_port(self.hosts[nid]) for nid in self.ids}
        self.settings = dict(settings or {})
        if "cluster_secret" not in self.settings and "cluster_secret_file" not in self.settings:
            self.settings["cluster_secret_file"] = str(self.write_secret())
        self.python = python
        # Further secrets this class's own clients accept (a group in the middle of a rotation).
        self.client_accepted_secrets: tuple[bytes, ...] = ()

    def write_secret(self) -> Path:
        """A fresh random cluster secret in ``base_dir/cluster.secret``, readable by its owner only.

        Every group this class starts authenticates its peers; pass ``cluster_secret=""`` in
        ``settings`` to run one without (benchmarks comparing the cost do).
        """
        return write_cluster_secret(self.base_dir / "cluster.secret")

    @property
    def client_secret(self) -> bytes | None:
        """The group's cluster secret, for clients of nodes that require ``client_auth``."""
        if self.settings.get("cluster_secret"):
            return str(self.settings["cluster_secret"]).encode()
        if self.settings.get("cluster_secret_file"):
            return Path(str(self.settings["cluster_secret_file"])).read_bytes().rstrip(b"\r\n")
        return None

    @property
    def client_ssl(self) -> ssl.SSLContext | None:
        """A client TLS context trusting the group's CA when the settings turn TLS on, else None."""
        ca = self.settings.get("tls_ca_file")
        return client_context(str(ca)) if ca else None

    def address(self, nid: str) -> str:
        return f"{self.hosts[nid]}:{self.ports[nid]}"

    @property
    def addresses(self) -> list[str]:
        return [self.address(n) for n in self.ids]

    def config_path(self, nid: str) -> Path:
        return self.base_dir / nid / "node.toml"

    def peer_address(self, nid: str, peer: str) -> str:
        """Where ``nid`` dials ``peer`` (the harness routes this through its link proxy)."""
        return self.address(peer)

    def node_settings(self, nid: str) -> dict[str, Any]:
        """Settings of ``nid``'s own beside the group's (none here; a harness adds ``dial``)."""
        return {}

    def write_configs(self) -> None:
        for nid in self.ids:
            d = self.base_dir / nid
            d.mkdir(parents=True, exist_ok=True)
            peers = [f"{p}={self.address(p) if p == nid else self.peer_address(nid, p)}" for p in self.ids]
            conf = {
                "id": nid,
                "listen": self.address(nid),
                "peers": peers,
                "data_dir": str(d / "data"),
                **self.settings,
                **self.node_settings(nid),
            }
            write_toml(self.config_path(nid), conf)

    def start_nodes(self) -> None:
        for nid in self.ids:
            self.start_node(nid)

    def start_node(self, nid: str) -> None:
        argv = [self.python, "-m", "ledger", "start", "--config", str(self.config_path(nid))]
        self.spawn(nid, argv, self.base_dir / nid / "node.log")

    async def wait_for_leader(self, timeout: float = 20.0, exclude: set[str] | None = None) -> str:
        """Poll every running node until one reports being a ready leader; returns its id."""
        async with LedgerClient(
            self.addresses,
            timeout=2,
            attempt_timeout=0.5,
            ssl=self.client_ssl,
            secret=self.client_secret,
            accepted_secrets=self.client_accepted_secrets,
        ) as client:

            async def ready_leader() -> str | None:
                for nid in self.ids:
                    if not self.is_running(nid) or nid in self.paused or (exclude and nid in exclude):
                        continue
                    try:
                        st = await client.status(self.address(nid))
                    except Exception:  # noqa: BLE001 - a node still starting up is normal here
                        continue
                    if st.get("role") == "leader" and st.get("leader_ready"):
                        return nid
                return None

            failure = f"no leader among {self.ids} within {timeout}s; logs in {self.base_dir}"
            return await poll_until(ready_leader, timeout, LEADER_POLL_S, failure)
