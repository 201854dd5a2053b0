"""Child processes and their config files: what tests, benchmarks, the harness and local clusters share.

``ProcessSet`` starts, signals and reaps children by PID, and ``stop()`` always reaps every
one, so nothing a test or a harness run starts outlives it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: ports ``free_port`` remembers having handed out (a cluster's ports are picked, released and
#: bound later by its processes: the OS may offer a released one again in the meantime)
RECENT_PORTS = 1024
#: picks ``free_port`` makes before it settles for a port it handed out before
FREE_PORT_TRIES = 64
_recent_ports: deque[tuple[str, int]] = deque(maxlen=RECENT_PORTS)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the OS picks it), and not one this process
    handed out recently, so that two nodes of one cluster are never given the same port."""
    for _ in range(FREE_PORT_TRIES):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if (host, port) not in _recent_ports:
            break
    _recent_ports.append((host, port))
    return port


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
