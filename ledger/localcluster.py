"""A ledger group of real OS processes on loopback addresses (127.0.0.x), for tests, benchmarks and users.

Each node gets its own address, port, data directory, config file and log file; the
cluster can SIGKILL, SIGSTOP/SIGCONT and restart nodes by PID, and always cleans up every
process it started.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .client import LedgerClient


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def toml_value(v: Any) -> str:
    """Render a simple value (str, bool, number, list of those) as TOML."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


def write_toml(path: Path, settings: Mapping[str, Any], section: str | None = None) -> None:
    lines = [f"[{section}]"] if section else []
    lines += [f"{k} = {toml_value(v)}" for k, v in settings.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


class ProcessSet:
    """Named child processes started, signalled and reaped by PID; ``stop()`` always reaps all."""

    def __init__(self, base_dir: str | Path) -> None:
        self.base_dir = Path(base_dir)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: set[str] = set()

    def spawn(self, name: str, argv: list[str], log_path: Path) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            return
        log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.procs[name] = subprocess.Popen(
                argv, stdout=logf, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
            )
        finally:
            logf.close()
        self.paused.discard(name)

    def pid(self, name: str) -> int | None:
        proc = self.procs.get(name)
        return proc.pid if proc is not None and proc.poll() is None else None

    def is_running(self, name: str) -> bool:
        return self.pid(name) is not None

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        if name in self.paused and sig != signal.SIGCONT:
            proc.send_signal(signal.SIGCONT)
        proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            self.paused.discard(name)

    def pause(self, name: str) -> None:
        pid = self.pid(name)
        if pid is not None:
            os.kill(pid, signal.SIGSTOP)
            self.paused.add(name)

    def resume(self, name: str) -> None:
        pid = self.pid(name)
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        self.paused.discard(name)

    def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after a grace period) and reap them."""
        for name in list(self.procs):
            if name in self.paused:
                self.resume(name)
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.paused.clear()


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
        self.python = python

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
        async with LedgerClient(self.addresses, timeout=2, attempt_timeout=0.5) as client:
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
