"""A group of local server processes on loopback: what every launcher in the project shares.

``ledger local-cluster``, ``broker local-cluster``, the harness's local backends, tests and
benchmarks all stand up real processes the same way: write each node's config, start the
nodes in order, wait until the group answers, and stop every process by PID however the
caller leaves. ``LocalGroup`` is that skeleton; a package keeps only its own node specs
(``ledger.localcluster``, ``broker.localgroup``), so there is one launcher, not one per layer.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self, TypeVar

from common.cluster_secret import write_cluster_secret
from common.process import ProcessSet, free_port

T = TypeVar("T")

#: picks ``free_port_pair`` makes before it gives up
PORT_PAIR_TRIES = 200
#: the lowest main port ``free_port_pair`` hands out (its pair, port - 2, stays above 1024)
MIN_PAIR_PORT = 1027
#: the signals that stop a foreground launcher (``local-cluster`` commands)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def free_port_pair(host: str) -> int:
    """A port p such that p and p - 2 were both free: RocketMQ brokers listen on both (the
    fast channel sits at main - 2), so a broker's main port is always picked this way."""
    for _ in range(PORT_PAIR_TRIES):
        port = free_port(host)
        if port < MIN_PAIR_PORT:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port - 2))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port pair on {host}")


def secret_file_setting(settings: MutableMapping[str, Any], path: Path) -> str:
    """The cluster-secret file a group's servers share, recorded in ``settings``.

    The file ``settings`` already names; else the inline secret written out to ``path`` (and
    dropped from ``settings``, so no config carries it in clear); else the secret already in
    ``path``; else a fresh one there. Every file is readable by its owner only.
    """
    named = settings.get("cluster_secret_file")
    if named:
        return str(named)
    inline = settings.pop("cluster_secret", "")
    if inline:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(inline) + "\n", encoding="utf-8")
        path.chmod(0o600)
    elif not path.exists():
        write_cluster_secret(path)
    settings["cluster_secret_file"] = str(path)
    return str(path)


def write_pid_file(path: Path, pid: int) -> None:
    """``pid`` in ``path``, written whole then renamed, so a fault script never reads half."""
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(f"{pid}\n", encoding="ascii")
    tmp.replace(path)


async def poll_until(
    check: Callable[[], Awaitable[T | None]], timeout: float, poll_s: float, failure: str
) -> T:
    """Call ``check`` every ``poll_s`` seconds until it returns something other than None (that
    is returned) or ``timeout`` seconds pass: then TimeoutError with ``failure`` in it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await check()
        if found is not None:
            return found
        await asyncio.sleep(poll_s)
    raise TimeoutError(failure)


@contextmanager
def stop_requested() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT while the block runs; the old handlers come back after.

    A foreground launcher waits on it and then stops its group by PID: a handler that only
    notes the signal (rather than the default, which kills this process at once) is what keeps
    a SIGTERM from orphaning the nodes.
    """
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class LocalGroup(ProcessSet, ABC):
    """Named server processes under ``base_dir``: configs written, then nodes started in order;
    a ``with`` block stops (and reaps) every one of them, whatever happened inside."""

    @abstractmethod
    def write_configs(self) -> None:
        """Every node's config file (and any file they share, such as the cluster secret)."""

    @abstractmethod
    def start_nodes(self) -> None:
        """Spawn the nodes, in the order the servers need (nameservers before brokers)."""

    def start(self) -> None:
        self.write_configs()
        self.start_nodes()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def dead(self) -> list[str]:
        """Processes that exited on their own (or were killed) and were not started again."""
        return [name for name, proc in self.procs.items() if proc.poll() is not None]

    def write_pid(self, name: str, path: Path) -> None:
        """Process ``name``'s PID in ``path`` (nothing if it is not running)."""
        pid = self.pid(name)
        if pid is not None:
            write_pid_file(path, pid)
