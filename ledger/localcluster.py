"""A ledger group of real OS processes on loopback addresses (127.0.0.x), for tests, benchmarks and users.

Each node gets its own address, port, data directory, config file and log file; the
cluster can SIGKILL, SIGSTOP/SIGCONT and restart nodes by PID, and always cleans up every
process it started.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import ssl
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.process import ProcessSet, free_port, write_toml
from common.tls import client_context

from .client import LedgerClient


class LocalCluster(ProcessSet):
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
        self.base_dir.mkdir(parents=True, exist_ok=True)
        path = self.base_dir / "cluster.secret"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        return path

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

    def write_configs(self) -> None:
        peers = [f"{n}={self.address(n)}" for n in self.ids]
        for nid in self.ids:
            d = self.base_dir / nid
            d.mkdir(parents=True, exist_ok=True)
            conf = {
                "id": nid,
                "listen": self.address(nid),
                "peers": peers,
                "data_dir": str(d / "data"),
                **self.settings,
            }
            write_toml(self.config_path(nid), conf)

    def start(self) -> None:
        self.write_configs()
        for nid in self.ids:
            self.start_node(nid)

    def start_node(self, nid: str) -> None:
        argv = [self.python, "-m", "ledger", "start", "--config", str(self.config_path(nid))]
        self.spawn(nid, argv, self.base_dir / nid / "node.log")

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def wait_for_leader(self, timeout: float = 20.0, exclude: set[str] | None = None) -> str:
        """Poll every running node until one reports being a ready leader; returns its id."""
        deadline = time.monotonic() + timeout
        async with LedgerClient(
            self.addresses,
            timeout=2,
            attempt_timeout=0.5,
            ssl=self.client_ssl,
            secret=self.client_secret,
            accepted_secrets=self.client_accepted_secrets,
        ) as client:
            while time.monotonic() < deadline:
                for nid in self.ids:
                    if not self.is_running(nid) or nid in self.paused or (exclude and nid in exclude):
                        continue
                    try:
                        st = await client.status(self.address(nid))
                    except Exception:  # noqa: BLE001 - a node still starting up is normal here
                        continue
                    if st.get("role") == "leader" and st.get("leader_ready"):
                        return nid
                await asyncio.sleep(0.05)
        raise TimeoutError(f"no leader among {self.ids} within {timeout}s; logs in {self.base_dir}")
