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
import errno
import os
import random
import shutil
import signal
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from common.cluster_secret import write_cluster_secret as common_write_cluster_secret
from common.process import ProcessSet
from jepsen.net.proxy import Link, LinkProxy
from jepsen.systems.clients import LogClient, QueueClient, RegisterClient, RegisterReplica

#: bytes read from the end of a node's log to find its last line (a report, not a reader)
LOG_TAIL_BYTES = 4096


def last_log_line(path: Path | None) -> str:
    """The last non-empty line of a log file, or why there is none."""
    if path is None:
        return "no log"
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError as e:
        return f"unreadable: {e.strerror}"
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "empty"


class Unsupported(Exception):
    """The backend cannot perform this fault or workload."""


def write_cluster_secret(base_dir: Path) -> Path:
    """A fresh random cluster secret in ``base_dir/cluster.secret``, readable by its owner only:
    where every backend keeps its run's secret, written the one way every launcher writes it."""
    return common_write_cluster_secret(base_dir / "cluster.secret")


#: how ``lose-data`` can damage a stopped follower (see ``ProcessBackend.lose_data``)
LOSE_DATA_WAYS = ("wipe", "truncate-log", "empty-log", "hardstate")


SMALL_DISK_MB = 64  # disk-full: each node's tmpfs, unless its data needs more
SMALL_DISK_MB_MAX = 4096  # bounds the filler loop
FILLER = "disk-full.filler"


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise OSError(f"{' '.join(argv)} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")


def _fsync_tree(d: Path) -> None:
    for p in d.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


class _Closable(Protocol):
    def close(self) -> Awaitable[None]: ...


C = TypeVar("C", bound=_Closable)


class LoopClient(Generic[C]):
    """A client a backend's own calls (status polls) share, kept for the event loop that made it.

    A client's connections belong to the loop that opened them, so a call from another loop
    (each ``asyncio.run``: a run, a test) gets a new client. ``close`` is awaited inside the
    run's loop when the run ends, so its sockets are closed there rather than left to the
    garbage collector after the loop has gone.
    """

    def __init__(self, make: Callable[[], C]) -> None:
        self._make = make
        self._client: C | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> C:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client, self._loop = self._make(), loop
        return self._client

    async def close(self) -> None:
        client, loop = self._client, self._loop
        self._client = self._loop = None
        if client is not None and loop is asyncio.get_running_loop():
            await client.close()


class Backend(ABC):
    """A group of nodes the harness can load and break."""

    system: str = "?"
    #: False when one TCP connection carries both directions between two nodes (pysyncobj):
    #: then only symmetric cuts are meaningful and the nemesis makes every cut symmetric.
    directed_links: bool = True
    supports_corruption: bool = False
    #: whether ``set_shape`` can delay (``slow-network``) and drop (``lossy-network``) peer traffic
    supports_delay: bool = False
    supports_loss: bool = False
    #: seconds a client spends on one operation (kept below the harness's operation timeout,
    #: so that the system's own definite answers arrive before the harness gives up)
    client_timeout: float = 4.0

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = Path(base_dir)
        self.nodes: list[str] = []
        self.killed: set[str] = set()
        self.paused: set[str] = set()
        self.cut: set[Link] = set()
        self.shaped: set[Link] = set()  # links with a delay or loss in force
        self._loop_clients: list[LoopClient[Any]] = []

    def loop_client(self, make: Callable[[], C]) -> LoopClient[C]:
        """A per-loop client for this backend's own calls, closed by ``close_clients``."""
        held: LoopClient[C] = LoopClient(make)
        self._loop_clients.append(held)
        return held

    async def close_clients(self) -> None:
        """Close the backend's own clients (status polls); the runner awaits it as a run ends."""
        for held in self._loop_clients:
            await held.close()

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

    def node_groups(self) -> dict[str, list[str]]:
        """Replication groups by name, each with its nodes: one group unless a backend runs several
        (broker groups, each its own Raft group); the nemesis aims a fault at one or all of them."""
        return {"": list(self.nodes)}

    async def leader(self, among: list[str] | None = None) -> str | None:
        """The node that claims leadership in the highest term (None if no one does), of ``among``
        only if given (one group's nodes: terms of different groups do not compare)."""
        best: tuple[int, str] | None = None
        for nid, st in (await self.statuses()).items():
            if among is not None and nid not in among:
                continue
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
        raise TimeoutError(
            f"{self.system}: no leader within {timeout}s; {await self.leaderless_report()}; "
            f"node logs under {self.base_dir}"
        )

    async def wait_for_every_leader(self, timeout: float = 30.0) -> str:
        """Every group of ``node_groups`` has a leader (a run needs all its queues); returns
        them, comma-separated. Backends with several groups use it as ``wait_for_leader``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            leaders = {name: await self.leader(members) for name, members in self.node_groups().items()}
            if all(leaders.values()):
                return ",".join(str(v) for v in leaders.values())
            if loop.time() >= deadline:
                missing = sorted(name for name, v in leaders.items() if v is None)
                among = [n for name in missing for n in self.node_groups()[name]]
                raise TimeoutError(
                    f"broker groups {', '.join(missing)}: no master within {timeout}s; "
                    f"{await self.leaderless_report(among)}; logs under {self.base_dir}"
                )
            await asyncio.sleep(0.1)

    async def leaderless_report(self, among: list[str] | None = None) -> str:
        """What each node (of ``among``, else all) says now, for a leader that never came: its
        role and term, or why it cannot answer (a node that exited, say after failing to bind
        its port, names that in the last line of its log)."""
        try:
            statuses = await self.statuses()
            logs = self.log_files()
        except Exception as exc:  # noqa: BLE001 - a report on the way to an error must not replace it
            return f"no report on the nodes ({type(exc).__name__}: {exc})"
        parts = []
        for nid in among if among is not None else self.nodes:
            st = statuses.get(nid)
            if st is not None:
                ready = "" if st.get("ready", True) else ", not ready"
                parts.append(f"{nid} {st.get('role')} in term {st.get('term')}{ready}")
                continue
            exited = self.exit_code(nid)
            state = "unreachable" if exited is None else f"exited with code {exited}"
            parts.append(f"{nid} {state} (log: {last_log_line(logs.get(nid))!r})")
        return "; ".join(parts)

    def exit_code(self, nid: str) -> int | None:
        """The node's exit code if its process has ended (None: running, or not known here)."""
        return None

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

    def set_shape(
        self, links: set[Link], *, delay_ms: float, jitter_ms: float, drop: float, seed: int
    ) -> Any:
        """Delay and/or drop traffic on exactly ``links``; an empty set heals every link."""
        raise Unsupported(f"{self.system} on this backend cannot delay or drop traffic")

    def shape_refusal(self, fault: str) -> str:
        """Why ``slow-network`` or ``lossy-network`` cannot run on this backend."""
        return f"{self.system} on this backend cannot {'delay' if fault == 'slow-network' else 'drop'} peer traffic ({fault})"

    def corrupt_tail(self, nid: str, rng: random.Random) -> dict[str, Any]:
        raise Unsupported(f"{self.system} has no corrupt-tail fault")

    def tail_recovered(self, nid: str) -> bool | None:
        """Whether the node's log says it found and cut a corrupt tail (None: cannot tell)."""
        return None

    def lose_data(self, nid: str, how: str, rng: random.Random) -> dict[str, Any]:
        raise Unsupported(f"{self.system} has no lose-data fault")

    def small_disk_refusal(self) -> str | None:
        """Why ``disk-full`` cannot run here (None: it can)."""
        return f"{self.system} on this backend has no disk-full fault"

    #: whether ``disk-full``'s small disks exist from the start (laid out by ``start`` after
    #: ``plan_faults`` named the fault), so the nemesis needs no kill-mount-restart round first
    small_disks_from_start: bool = False

    def plan_faults(self, faults: Sequence[str]) -> None:
        """Told the run's nemeses before ``start``, for a backend that must lay its nodes out for a
        fault (the docker group's small volumes for ``disk-full``); most need nothing."""
        return None

    def forge_targets(self) -> dict[str, Any]:
        """What the ``forge-peer`` nemesis attacks: ``{"ledger": {node: peer address}, "secured": bool,
        "admin": [broker addresses], "acl": bool}``."""
        raise Unsupported(f"{self.system} on this backend has no forge-peer fault")

    # ------------------------------------------------------------------ clients and files

    @abstractmethod
    def log_client(self) -> LogClient: ...

    def register_replica(self) -> RegisterReplica:
        """What one logical register client keeps across its reconnects (see ``clients``)."""
        raise Unsupported(f"{self.system} has no register workload")

    def register_client(self, replica: Any) -> RegisterClient:
        raise Unsupported(f"{self.system} has no register workload")

    def queue_client(self, broker_name: str | None = None) -> QueueClient:
        """Producer/consumer adapter for a ``queue`` workload: a backend whose nodes are brokers
        (not bare ledger nodes) provides it; ``broker_name`` picks one group's queues where there are several."""
        raise Unsupported(f"{self.system} has no queue workload (it runs no brokers)")

    def client_spec(self) -> dict[str, Any]:
        """What a worker process needs to build this system's clients, as plain JSON.

        Workers are separate OS processes: they get addresses, never the backend itself
        (``registry.endpoints_from_spec`` turns this back into a client source).
        """
        raise Unsupported(f"{self.system} cannot hand its clients to worker processes")

    @abstractmethod
    def log_files(self) -> dict[str, Path]:
        """Each node's log file."""

    @abstractmethod
    def cleanup_data(self) -> None:
        """Delete data directories (node logs stay); called after a valid run unless asked to keep."""


class ProcessBackend(Backend):
    """Nodes that are local processes of one ``ProcessSet`` and dial each other through one
    ``LinkProxy``: whatever the processes run, kill, restart, pause and cut work the same."""

    supports_delay = True
    supports_loss = True

    def __init__(self, base_dir: Path, procs: ProcessSet) -> None:
        super().__init__(base_dir)
        self.procs = procs
        self.proxy: LinkProxy | None = None
        self.small_disks: dict[str, Path] = {}  # node -> its ledger dir, now a mounted tmpfs

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

    def proxy_links(self) -> list[Link] | None:
        """The peer links that carry traffic (None: every ordered pair of nodes)."""
        return None

    def proxy_ports(self) -> dict[Link, int] | None:
        """Each link's listening port where the harness planned them (None: the OS picks)."""
        return None

    def listen_addresses(self) -> list[str]:
        """Every ``host:port`` the nodes will listen on besides their peer addresses (which the
        proxy avoids anyway): the proxy's own listeners must not take one before a node binds it."""
        return []

    def start(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.proxy = LinkProxy(
            self.peer_addresses(),
            log_path=self.base_dir / "proxy.log",
            links=self.proxy_links(),
            ports=self.proxy_ports(),
            avoid=self.listen_addresses(),
        )
        self.launch()

    def stop(self) -> None:
        try:
            self.procs.stop()
            self.paused.clear()
        finally:
            try:
                self.release_small_disks()
            finally:
                if self.proxy is not None:
                    self.proxy.close()

    def exit_code(self, nid: str) -> int | None:
        proc = self.procs.procs.get(self.process_name(nid))
        return None if proc is None else proc.poll()

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

    def set_shape(
        self, links: set[Link], *, delay_ms: float = 0, jitter_ms: float = 0, drop: float = 0, seed: int = 0
    ) -> dict[str, Any]:
        assert self.proxy is not None
        reply = self.proxy.set_shape(links, delay_ms=delay_ms, jitter_ms=jitter_ms, drop=drop, seed=seed)
        self.shaped = set(links)
        return reply

    # ------------------------------------------------------------------ disk faults

    def ledger_dir(self, nid: str) -> Path | None:
        """The node's ledger data directory (``log/`` segments and ``hardstate``), None if it has none."""
        return None

    def node_log(self, nid: str) -> Path:
        return self.log_files()[nid]

    def _stopped_ledger(self, nid: str) -> Path:
        d = self.ledger_dir(nid)
        if d is None:
            raise Unsupported(f"{self.system} keeps no ledger files the harness can reach")
        if self.procs.is_running(self.process_name(nid)):
            raise RuntimeError(f"{nid} must be stopped before its files are damaged")
        return d

    def _mark_log(self, nid: str) -> None:
        try:
            self._log_mark = self.node_log(nid).stat().st_size
        except OSError:
            self._log_mark = 0

    def corrupt_tail(self, nid: str, rng: random.Random) -> dict[str, Any]:
        """Flip bytes at the end of the node's newest segment (the node must be stopped).

        The flipped bytes sit inside the last entry, so its checksum fails and nothing
        valid follows: the store must treat it as a torn tail, cut it at start-up and fetch
        the entry again from the leader.
        """
        d = self._stopped_ledger(nid)
        segs = [s for s in sorted((d / "log").glob("*.seg")) if s.stat().st_size > 0]
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
        self._mark_log(nid)
        return {"node": nid, "file": str(path.relative_to(self.base_dir)), "offset": offset, "bytes": count}

    def tail_recovered(self, nid: str) -> bool | None:
        mark = getattr(self, "_log_mark", 0)
        try:
            with open(self.node_log(nid), "rb") as fh:
                fh.seek(mark)
                return b"truncating torn tail" in fh.read()
        except OSError:
            return None

    def small_disk_refusal(self) -> str | None:
        if os.geteuid() != 0:
            return "disk-full mounts a small tmpfs under each node's data and needs root; run the harness as root"
        if shutil.which("mount") is None or shutil.which("umount") is None:
            return "disk-full needs mount(8) and umount(8)"
        if self.ledger_dir(self.nodes[0]) is None:
            return f"{self.system} keeps no ledger files the harness can reach"
        return None

    def mount_small_disk(self, nid: str) -> dict[str, Any]:
        """Move a stopped node's ledger directory onto its own small tmpfs (``SMALL_DISK_MB``,
        more if the data needs it), so that ``fill_disk`` can make its writes fail with ENOSPC."""
        d = self._stopped_ledger(nid)
        if nid in self.small_disks:
            return {"node": nid, "mounted": str(d), "already": True}
        d.mkdir(parents=True, exist_ok=True)
        used = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        size_mb = max(SMALL_DISK_MB, 2 * used // (1 << 20) + 16)
        moved = d.with_name(d.name + ".before-tmpfs")
        shutil.rmtree(moved, ignore_errors=True)
        d.rename(moved)
        d.mkdir()
        _run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", f"ledgermq-{nid}", str(d)])
        self.small_disks[nid] = d
        shutil.copytree(moved, d, dirs_exist_ok=True)
        _fsync_tree(d)
        shutil.rmtree(moved)
        return {"node": nid, "mounted": str(d.relative_to(self.base_dir)), "size_mb": size_mb, "copied": used}

    def fill_disk(self, nid: str) -> dict[str, Any]:
        """Fill the node's tmpfs to the last byte with a filler file (the node keeps running)."""
        d = self.small_disks.get(nid)
        if d is None:
            raise RuntimeError(f"{nid} has no small disk mounted")
        filler = d / FILLER
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (1 << 20, 4096):  # big blocks, then the last pages
                block = bytes(chunk)
                for _ in range(SMALL_DISK_MB_MAX * (1 << 20) // chunk):
                    try:
                        n = os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
                    if n < chunk:
                        break
        finally:
            os.close(fd)
        st = os.statvfs(d)
        return {"node": nid, "filler_bytes": filler.stat().st_size, "free_bytes": st.f_bavail * st.f_frsize}

    def free_disk(self, nid: str) -> dict[str, Any]:
        d = self.small_disks.get(nid)
        if d is None:
            return {"node": nid, "freed": 0}
        filler = d / FILLER
        size = filler.stat().st_size if filler.exists() else 0
        filler.unlink(missing_ok=True)
        return {"node": nid, "freed": size}

    def release_small_disks(self) -> None:
        """Copy each tmpfs's data back to a plain directory and unmount it (nodes must be stopped)."""
        for nid, d in sorted(self.small_disks.items()):
            (d / FILLER).unlink(missing_ok=True)
            back = d.with_name(d.name + ".from-tmpfs")
            shutil.rmtree(back, ignore_errors=True)
            shutil.copytree(d, back)
            _run(["umount", str(d)])
            d.rmdir()
            back.rename(d)
            del self.small_disks[nid]

    def lose_data(self, nid: str, how: str, rng: random.Random) -> dict[str, Any]:
        """Lose a stopped node's data the way a careless operator or a bad disk would.

        ``truncate-log`` (the default): the newest segment is cut to a random shorter
        length; ``empty-log``: every segment emptied; ``wipe``: the whole ledger directory
        goes; ``hardstate``: the term/vote file deleted. A leader repairs a follower that
        reports a shorter log; a node that also forgot its vote (``wipe``, ``hardstate``)
        may vote twice in a term, which only storage healing prevents.
        """
        d = self._stopped_ledger(nid)
        info: dict[str, Any] = {"node": nid, "how": how}
        if how == "wipe":
            removed = sum(1 for p in d.rglob("*") if p.is_file())
            shutil.rmtree(d, ignore_errors=True)
            info["files_removed"] = removed
        elif how in ("truncate-log", "empty-log"):
            segs = [s for s in sorted((d / "log").glob("*.seg")) if s.stat().st_size > 0]
            if not segs:
                return {**info, "skipped": "no non-empty segment"}
            for path in segs if how == "empty-log" else segs[-1:]:
                size = path.stat().st_size
                keep = 0 if how == "empty-log" else rng.randint(0, size - 1)
                os.truncate(path, keep)
                info.setdefault("files", []).append(
                    {"file": str(path.relative_to(self.base_dir)), "was": size, "now": keep}
                )
        elif how == "hardstate":
            hs = d / "hardstate"
            info["existed"] = hs.exists()
            hs.unlink(missing_ok=True)
        else:
            raise ValueError(f"unknown lose-data variant {how!r}; choose from {', '.join(LOSE_DATA_WAYS)}")
        self._mark_log(nid)
        return info
