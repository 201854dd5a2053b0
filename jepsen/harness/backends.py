"""Systems under test and their fault primitives: what the nemesis and the workloads act on.

A :class:`Backend` stands up a group, hands out client adapters, reports each node's
role/term/leader, and offers the fault primitives the nemesis composes: kill (SIGKILL),
restart, pause (SIGSTOP/SIGCONT), cutting directed links, and corrupting a stopped
node's log tail. The primitives are synchronous (they wait for processes to die) and the
nemesis runs them off the event loop.

Local partitions use per-link TCP proxies (``proxy.LinkProxy``): each node's config names
its peers by the proxy address of that link, so the harness can cut ``a -> b`` without
root. Network namespaces + iptables would model packet loss more closely, but need root
and ``CAP_NET_ADMIN``, which CI containers rarely grant; the proxies work everywhere and
are what the ``local`` backend uses. Client traffic never crosses a proxy.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from ledger.client import LedgerClient
from ledger.localcluster import LocalCluster, ProcessSet, write_toml

from .clients import LedgerLogClient, LedgerRegisterClient, LogClient, RegisterClient, RegisterReplica
from .proxy import Link, LinkProxy


class Unsupported(Exception):
    """The backend cannot perform this fault or workload."""


class Backend(ABC):
    """A group of nodes the harness can load and break."""

    system: str = "?"
    #: False when one TCP connection carries both directions between two nodes (pysyncobj):
    #: then only symmetric cuts are meaningful and the nemesis makes every cut symmetric.
    directed_links: bool = True
    supports_corruption: bool = False
    #: seconds a client spends on one operation (kept below the harness's operation timeout,
    #: so that the system's own definite answers arrive before the harness gives up)
    client_timeout: float = 4.0

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = Path(base_dir)
        self.nodes: list[str] = []
        self.killed: set[str] = set()
        self.paused: set[str] = set()
        self.cut: set[Link] = set()

    # ------------------------------------------------------------------ lifecycle

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None:
        """Stop every process this backend started (by PID) — safe to call twice."""

    @abstractmethod
    async def status(self, nid: str) -> dict[str, Any] | None:
        """``{"role", "term", "leader" (node id or None), "commit_index"}``, or None if unreachable."""

    async def statuses(self) -> dict[str, dict[str, Any] | None]:
        results = await asyncio.gather(*(self._status_bounded(n) for n in self.nodes))
        return dict(zip(self.nodes, results, strict=True))

    async def _status_bounded(self, nid: str) -> dict[str, Any] | None:
        if nid in self.killed or nid in self.paused:
            return None
        try:
            return await asyncio.wait_for(self.status(nid), 0.5)
        except Exception:  # noqa: BLE001 - an unreachable node is a normal state under faults
            return None

    async def leader(self) -> str | None:
        """The node that claims leadership in the highest term (None if no one does)."""
        best: tuple[int, str] | None = None
        for nid, st in (await self.statuses()).items():
            if st and st.get("role") == "leader" and st.get("ready", True):
                term = int(st.get("term") or 0)
                if best is None or term > best[0]:
                    best = (term, nid)
        return best[1] if best else None

    async def wait_for_leader(self, timeout: float = 30.0) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            nid = await self.leader()
            if nid is not None:
                return nid
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{self.system}: no leader within {timeout}s; node logs under {self.base_dir}")

    # ------------------------------------------------------------------ faults

    @abstractmethod
    def kill(self, nid: str) -> None: ...

    @abstractmethod
    def restart(self, nid: str) -> None: ...

    @abstractmethod
    def pause(self, nid: str) -> None: ...

    @abstractmethod
    def resume(self, nid: str) -> None: ...

    @abstractmethod
    def set_cut(self, links: set[Link]) -> dict[str, Any]:
        """Make exactly ``links`` (directed ``(src, dst)``) cut; all others carry traffic."""

    def corrupt_tail(self, nid: str, rng: random.Random) -> dict[str, Any]:
        raise Unsupported(f"{self.system} has no corrupt-tail fault")

    def tail_recovered(self, nid: str) -> bool | None:
        """Whether the node's log says it found and cut a corrupt tail (None: cannot tell)."""
        return None

    # ------------------------------------------------------------------ clients and files

    @abstractmethod
    def log_client(self) -> LogClient: ...

    def register_client(self, replica: RegisterReplica) -> RegisterClient:
        raise Unsupported(f"{self.system} has no register workload")

    def queue_client(self) -> Any:
        """Producer/consumer adapter for a ``queue`` workload: a backend whose nodes are brokers
        (not bare ledger nodes) provides it; see ``workloads`` for how the workload plugs in."""
        raise Unsupported(f"{self.system} has no queue workload (it runs no brokers)")

    @abstractmethod
    def log_files(self) -> dict[str, Path]:
        """Each node's log file."""

    @abstractmethod
    def cleanup_data(self) -> None:
        """Delete data directories (node logs stay); called after a valid run unless asked to keep."""


class ProcessBackend(Backend):
    """Nodes that are local processes of one ``ProcessSet`` and dial each other through one
    ``LinkProxy``: whatever the processes run, kill, restart, pause and cut work the same."""

    def __init__(self, base_dir: Path, procs: ProcessSet) -> None:
        super().__init__(base_dir)
        self.procs = procs
        self.proxy: LinkProxy | None = None

    @abstractmethod
    def peer_addresses(self) -> dict[str, str]:
        """Node id -> the address its peers dial, which the proxy fronts."""

    @abstractmethod
    def launch(self) -> None:
        """Start every process, once the proxy is up (their configs name its addresses)."""

    @abstractmethod
    def spawn(self, nid: str) -> None:
        """(Re)start one node's process."""

    def process_name(self, nid: str) -> str:
        """The node's name in the ProcessSet."""
        return nid

    def start(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.proxy = LinkProxy(self.peer_addresses(), log_path=self.base_dir / "proxy.log")
        self.launch()

    def stop(self) -> None:
        try:
            self.procs.stop()
            self.paused.clear()
        finally:
            if self.proxy is not None:
                self.proxy.close()

    def kill(self, nid: str) -> None:
        self.procs.kill(self.process_name(nid), signal.SIGKILL)
        self.killed.add(nid)
        self.paused.discard(nid)

    def restart(self, nid: str) -> None:
        self.spawn(nid)
        self.killed.discard(nid)

    def pause(self, nid: str) -> None:
        name = self.process_name(nid)
        if self.procs.is_running(name):
            self.procs.pause(name)
            self.paused.add(nid)

    def resume(self, nid: str) -> None:
        self.procs.resume(self.process_name(nid))
        self.paused.discard(nid)

    def set_cut(self, links: set[Link]) -> dict[str, Any]:
        assert self.proxy is not None
        if not self.directed_links:
            links = set(links) | {(b, a) for a, b in links}
        reply = self.proxy.set_cut(links)
        self.cut = set(links)
        return reply


class LocalLedgerBackend(ProcessBackend):
    """A 3-node ledger group of local processes (``ledger.localcluster``) behind link proxies."""

    system = "ledger"
    supports_corruption = True

    def __init__(self, base_dir: Path, n: int = 3, settings: dict[str, Any] | None = None) -> None:
        self.cluster = _ProxiedCluster(Path(base_dir), n, settings=settings)
        super().__init__(base_dir, self.cluster)
        self.nodes = list(self.cluster.ids)
        self._status_client: LedgerClient | None = None
        self._status_loop: asyncio.AbstractEventLoop | None = None

    def peer_addresses(self) -> dict[str, str]:
        return {n: self.cluster.address(n) for n in self.nodes}

    def launch(self) -> None:
        self.cluster.proxy = self.proxy
        self.cluster.start()

    def spawn(self, nid: str) -> None:
        self.cluster.start_node(nid)

    @property
    def direct(self) -> dict[str, str]:
        """Proxy address -> the real address of the node behind it."""
        assert self.proxy is not None
        return {addr: self.cluster.address(dst) for (_, dst), addr in self.proxy.addresses.items()}

    @property
    def names(self) -> dict[str, str]:
        """Any address a node can be reached or named by -> node id."""
        assert self.proxy is not None
        out = {self.cluster.address(n): n for n in self.nodes}
        out.update({addr: dst for (_, dst), addr in self.proxy.addresses.items()})
        return out

    async def status(self, nid: str) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        if self._status_client is None or self._status_loop is not loop:
            self._status_client = LedgerClient(self.cluster.addresses, timeout=0.5, attempt_timeout=0.5)
            self._status_loop = loop
        st = await self._status_client.status(self.cluster.address(nid))
        return {
            "role": st.get("role"),
            "term": st.get("term"),
            "leader": st.get("leader"),
            "ready": bool(st.get("leader_ready")),
            "commit_index": st.get("commit_index"),
        }

    def corrupt_tail(self, nid: str, rng: random.Random) -> dict[str, Any]:
        """Flip bytes at the end of the node's newest segment (the node must be stopped).

        The flipped bytes sit inside the last entry, so its checksum fails and nothing
        valid follows: the store must treat it as a torn tail, cut it at start-up and fetch
        the entry again from the leader.
        """
        if self.cluster.is_running(nid):
            raise RuntimeError(f"{nid} must be stopped before its log is corrupted")
        segs = sorted((self.base_dir / nid / "data" / "log").glob("*.seg"))
        segs = [s for s in segs if s.stat().st_size > 0]
        if not segs:
            return {"node": nid, "skipped": "no non-empty segment"}
        path = segs[-1]
        size = path.stat().st_size
        count = min(size, rng.randint(1, 8))
        offset = size - count
        with open(path, "r+b") as fh:
            fh.seek(offset)
            data = bytearray(fh.read(count))
            for i in range(len(data)):
                data[i] ^= 0xFF
            fh.seek(offset)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        self._log_mark = (self.base_dir / nid / "node.log").stat().st_size
        return {"node": nid, "file": str(path.relative_to(self.base_dir)), "offset": offset, "bytes": count}

    def tail_recovered(self, nid: str) -> bool | None:
        log_path = self.base_dir / nid / "node.log"
        mark = getattr(self, "_log_mark", 0)
        try:
            with open(log_path, "rb") as fh:
                fh.seek(mark)
                return b"truncating torn tail" in fh.read()
        except OSError:
            return None

    def log_client(self) -> LogClient:
        return LedgerLogClient(self.cluster.addresses, self.direct, self.names, timeout=self.client_timeout)

    def register_client(self, replica: RegisterReplica) -> RegisterClient:
        return LedgerRegisterClient(self.cluster.addresses, self.direct, self.names, replica,
                                    timeout=self.client_timeout)

    def log_files(self) -> dict[str, Path]:
        return {n: self.base_dir / n / "node.log" for n in self.nodes}

    def cleanup_data(self) -> None:
        for n in self.nodes:
            shutil.rmtree(self.base_dir / n / "data", ignore_errors=True)


class _ProxiedCluster(LocalCluster):
    """A ``LocalCluster`` whose nodes reach each other through the link proxy."""

    proxy: LinkProxy | None = None

    def write_configs(self) -> None:
        assert self.proxy is not None, "start the link proxy before writing configs"
        for nid in self.ids:
            d = self.base_dir / nid
            d.mkdir(parents=True, exist_ok=True)
            peers = [f"{p}={self.address(p) if p == nid else self.proxy.address(nid, p)}" for p in self.ids]
            conf = {"id": nid, "listen": self.address(nid), "peers": peers, "data_dir": str(d / "data"),
                    **self.settings}
            write_toml(self.config_path(nid), conf)


def make_backend(name: str, system: str, base_dir: Path, **kw: Any) -> Backend:
    """The backend for ``--backend`` and the system under test (``ledger``, ``pysyncobj`` or ``broker``)."""
    if name == "docker":
        if system != "broker":
            raise Unsupported("the docker group (docker-compose.yml) runs brokers: use --workload queue")
        from .docker_backend import DockerBrokerBackend

        return DockerBrokerBackend(base_dir, **kw)
    if name != "local":
        raise Unsupported(f"unknown backend {name!r}")
    if system == "ledger":
        return LocalLedgerBackend(base_dir, **kw)
    if system == "pysyncobj":
        from .syncobj import LocalSyncObjBackend

        return LocalSyncObjBackend(base_dir, **kw)
    if system == "broker":
        from .queue import LocalBrokerBackend

        return LocalBrokerBackend(base_dir, **kw)
    raise Unsupported(f"unknown system {system!r}")
