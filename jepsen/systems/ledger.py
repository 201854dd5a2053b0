"""The ledger as a system under test: a 3-node group of local processes and its client adapters.

The group (``ledger.localcluster``) runs behind the harness's link proxies, so partitions
cut its peer links while clients still reach every node. Two adapters serve the
workloads: :class:`LedgerLogClient` (the ``log`` workload: offsets are ledger indexes) and
:class:`LedgerRegisterClient` (the ``register`` workload: registers as a state machine
replayed over the log).

Ledger classification (from ``ledger.client.LedgerClient._call``): ``UNKNOWN_OUTCOME`` is
raised whenever an append left the client and no answer came back, and the client never
retries such an append; ``NOT_LEADER`` answers are retried and, when the deadline runs
out, surface as ``UNAVAILABLE`` — which for an append therefore means every attempt was
refused or never sent. ``FAILED`` (overwritten by a newer leader), ``BUSY`` (refused: too many appends await commit),
``BAD_REQUEST`` and ``TOO_LARGE`` are definite. Reads have no effect, so every read error is a ``fail``.

Membership (the ``membership`` nemesis, ``jepsen.faults.membership``): when a run names it,
the backend plans ``MEMBERSHIP_SPARES`` more nodes up front (``plan_faults``), each with its
own loopback address for the whole run, so that every client knows every address a member
may ever have. ``nodes`` is then the group's current members (what the other faults aim
at); a removed node is killed and its data deleted, and one added starts empty with
``join`` and is added as a learner, then promoted once caught up. The link proxy fronts
every link of the pool (spares included), and every node's config lists every other node
of the pool under ``dial`` at its link's proxy: a member added later is dialled through
the link a partition cuts (not at the address the configuration carries), so the link
faults combine with ``membership`` on this backend.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.process import free_port, write_toml
from jepsen.net.proxy import LinkProxy
from jepsen.systems.base import ProcessBackend, Unsupported
from jepsen.systems.clients import (
    Definite,
    Indefinite,
    LogClient,
    Pair,
    RegisterClient,
    decode_value,
    encode_int,
)
from ledger.client import LedgerClient
from ledger.codec import KIND_NORMAL, Entry
from ledger.localcluster import LocalCluster
from ledger.wire import BAD_REQUEST, BUSY, FAILED, NOT_LEADER, TOO_LARGE, UNAVAILABLE, LedgerError

SYSTEM = "ledger"
#: nodes planned beyond the first members when a run changes membership (grow to 5, replace one)
MEMBERSHIP_SPARES = 3
#: seconds a change refused as ``busy`` (a leader that has not committed an entry of its term
#: yet, e.g. just after the last change removed the old one) is retried, as an operator would
BUSY_WAIT_S = 10.0
#: seconds a node added by the membership nemesis has to catch up before it is promoted
PROMOTE_WAIT_S = 30.0


def classify_append_error(exc: BaseException) -> Exception:
    """Map an error from a ledger append to :class:`Definite` or :class:`Indefinite`."""
    if isinstance(exc, LedgerError):
        if exc.code in (FAILED, BAD_REQUEST, TOO_LARGE, NOT_LEADER, UNAVAILABLE, BUSY):
            return Definite(str(exc))
        return Indefinite(str(exc))
    return Indefinite(f"{type(exc).__name__}: {exc}")


class DirectLedgerClient(LedgerClient):
    """A ``LedgerClient`` that reaches nodes directly even when redirected to a proxy address.

    Nodes know each other by the proxied addresses (so partitions can cut them), and name
    those in "not leader" redirects. The harness's clients must not be partitioned with the
    peers, so every connection is made to the node's own address instead.
    """

    def __init__(self, addresses: Sequence[str], direct: dict[str, str], **kw: Any) -> None:
        super().__init__(addresses, **kw)
        self._direct = dict(direct)

    def dial_address(self, address: str) -> str:
        return self._direct.get(address, address)


class LedgerLogClient:
    """The ``log`` workload on the ledger: offsets are ledger indexes.

    Offsets are the ledger's own positions, not renumbered: a new leader's no-op occupies
    an index too, so offsets have gaps where terms begin, as Kafka offsets do. Polls are
    linearizable (ReadIndex) and keep reading past no-ops until they hold ``limit`` pairs
    or a read comes back short, which is the only way a poll returns fewer than ``limit``
    pairs: then it really reached the committed end of the log.
    """

    def __init__(
        self,
        addresses: list[str],
        direct: dict[str, str],
        names: dict[str, str],
        *,
        timeout: float = 5.0,
        attempt_timeout: float = 1.0,
    ) -> None:
        self.client = DirectLedgerClient(addresses, direct, timeout=timeout, attempt_timeout=attempt_timeout)
        self.names = names  # address (direct or proxied) -> node id
        self.node: str | None = None

    def _note_node(self) -> None:
        addr = self.client.leader_address
        self.node = self.names.get(addr) if addr else None

    async def send(self, value: int) -> int:
        try:
            index, _term = await self.client.append(encode_int(value))
        except Exception as exc:  # noqa: BLE001 - classified, never swallowed
            self._note_node()
            raise classify_append_error(exc) from exc
        self._note_node()
        return index

    async def _read(self, lo: int, hi: int) -> list[Entry]:
        try:
            entries = await self.client.read(lo, hi, linearizable=True)
        except Exception as exc:  # noqa: BLE001 - a failed read changed nothing
            self._note_node()
            raise Definite(f"read {lo}..{hi}: {exc}") from exc
        self._note_node()
        return entries

    async def poll(self, start: int, limit: int) -> list[Pair]:
        out: list[Pair] = []
        lo = max(1, start)
        for _ in range(1000):  # bounded: each round covers `limit` indexes
            want = limit - len(out)
            hi = lo + want - 1
            entries = await self._read(lo, hi)
            out.extend((e.index, decode_value(e.data)) for e in entries if e.kind == KIND_NORMAL)
            if len(entries) < hi - lo + 1 or len(out) >= limit:
                return out[:limit]
            lo = hi + 1
        raise Definite(f"poll from {start} did not finish in 1000 reads")

    async def drain(self) -> list[Pair]:
        out: list[Pair] = []
        lo = 1
        chunk = 2000
        for _ in range(100_000):
            entries = await self._read(lo, lo + chunk - 1)
            out.extend((e.index, decode_value(e.data)) for e in entries if e.kind == KIND_NORMAL)
            if len(entries) < chunk:
                return out
            lo += chunk
        raise Definite("drain did not reach the end of the log")

    async def close(self) -> None:
        await self.client.close()


class LedgerRegisterClient:
    """Compare-and-set registers as a deterministic state machine replayed over the ledger.

    Every operation — reads included — is appended as a JSON command, so its place in the
    log is its linearization point. Its outcome follows from replaying the committed log
    up to that index: a ``cas`` applied iff the register held ``old`` just before it, a
    ``read`` returns the value just before it. The replayed state is this client's own
    replica (kept across operations, fed only by committed entries, which never change),
    so each worker checks the log it reads rather than sharing one view.
    """

    def __init__(
        self,
        addresses: list[str],
        direct: dict[str, str],
        names: dict[str, str],
        replica: LedgerRegisterReplica,
        *,
        timeout: float = 5.0,
        attempt_timeout: float = 1.0,
    ) -> None:
        self.client = DirectLedgerClient(addresses, direct, timeout=timeout, attempt_timeout=attempt_timeout)
        self.names = names
        self.replica = replica
        self.node: str | None = None
        self.timeout = timeout
        self._tag = uuid.uuid4().hex[:12]  # tells this client's commands from every other's
        self._nonce = 0

    def _note_node(self) -> None:
        addr = self.client.leader_address
        self.node = self.names.get(addr) if addr else None

    async def _submit(self, cmd: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Append ``cmd``; return its index and the state of its key just before it."""
        self._nonce += 1
        cmd = {**cmd, "n": f"{self._tag}-{self._nonce}"}
        try:
            index, _ = await self.client.append(json.dumps(cmd, separators=(",", ":")).encode())
        except Exception as exc:  # noqa: BLE001 - classified
            self._note_node()
            raise classify_append_error(exc) from exc
        self._note_node()
        # The command took effect at `index`; what it saw needs the log up to it.
        try:
            await asyncio.wait_for(self.replica.advance(self.client, index), self.timeout)
        except Exception as exc:  # noqa: BLE001 - applied, but its result is unknown to us
            raise Indefinite(f"applied at {index} but the log before it could not be read: {exc}") from exc
        found = self.replica.commands.get(index)
        if found is None or found.get("n") != cmd["n"]:
            self.replica.ack_mismatches.append({"index": index, "sent": cmd, "found": found})
        return index, cmd

    async def read(self, key: str) -> Any:
        index, _ = await self._submit({"k": key, "f": "read"})
        return self.replica.before(index, key)

    async def write(self, key: str, value: Any) -> None:
        await self._submit({"k": key, "f": "write", "v": value})

    async def cas(self, key: str, old: Any, new: Any) -> bool:
        index, _ = await self._submit({"k": key, "f": "cas", "v": [old, new]})
        return self.replica.before(index, key) == old

    async def close(self) -> None:
        await self.client.close()


class LedgerRegisterReplica:
    """The register state machine applied from the committed ledger, with per-index history."""

    def __init__(self) -> None:
        self.applied = 0
        self.state: dict[str, Any] = {}
        self.commands: dict[int, dict[str, Any] | None] = {}
        self._before: dict[int, Any] = {}  # index -> value of its key just before it
        self.ack_mismatches: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()

    async def advance(self, client: LedgerClient, upto: int) -> None:
        async with self._lock:
            for _ in range(10_000):
                if self.applied >= upto:
                    return
                entries = await client.read(self.applied + 1, upto)
                if not entries:
                    await asyncio.sleep(0.02)
                for e in entries:
                    self._apply(e)

    def _apply(self, e: Entry) -> None:
        assert e.index == self.applied + 1, f"replica at {self.applied} got entry {e.index}"
        self.applied = e.index
        if e.kind != KIND_NORMAL:
            self.commands[e.index] = None
            return
        try:
            cmd = json.loads(bytes(e.data))
            key = cmd["k"]
        except (ValueError, KeyError, TypeError):
            self.commands[e.index] = None
            return
        self.commands[e.index] = cmd
        cur = self.state.get(key)
        self._before[e.index] = cur
        if cmd.get("f") == "write":
            self.state[key] = cmd.get("v")
        elif cmd.get("f") == "cas":
            old, new = cmd.get("v", [None, None])
            if cur == old:
                self.state[key] = new

    def before(self, index: int, key: str) -> Any:
        cmd = self.commands.get(index)
        if cmd is None or cmd.get("k") != key:
            raise Indefinite(f"index {index} does not hold this client's command for {key!r}")
        return self._before[index]


class LocalLedgerBackend(ProcessBackend):
    """A 3-node ledger group of local processes (``ledger.localcluster``) behind link proxies."""

    system = SYSTEM
    supports_corruption = True

    def __init__(self, base_dir: Path, n: int = 3, settings: dict[str, Any] | None = None) -> None:
        self.cluster = _ProxiedCluster(Path(base_dir), n, settings=settings)
        super().__init__(base_dir, self.cluster)
        self.nodes = list(self.cluster.ids)
        self.spares: list[str] = []  # nodes planned for membership changes (plan_faults)
        self._status_client = self.loop_client(
            lambda: LedgerClient(self.cluster.addresses, timeout=0.5, attempt_timeout=0.5)
        )

    @property
    def pool(self) -> list[str]:
        """Every node the run may start: the first members, then the spares."""
        return [*self.cluster.ids, *self.spares]

    @property
    def addresses(self) -> list[str]:
        """Every address a member may have during the run (what clients are given)."""
        return [self.cluster.address(n) for n in self.pool]

    def plan_faults(self, faults: Sequence[str]) -> None:
        """With ``membership``: the spare nodes' addresses, before anything starts."""
        if "membership" not in faults or self.spares:
            return
        first = len(self.cluster.ids)
        for k in range(first + 1, first + 1 + MEMBERSHIP_SPARES):
            nid = f"n{k}"
            host = f"127.0.0.{k}" if len(set(self.cluster.hosts.values())) > 1 else "127.0.0.1"
            self.cluster.hosts[nid] = host
            self.cluster.ports[nid] = free_port(host)
            self.spares.append(nid)

    def listen_addresses(self) -> list[str]:
        return [self.cluster.address(n) for n in self.spares]

    def peer_addresses(self) -> dict[str, str]:
        """Every node of the pool, spares included: the proxy fronts each link a member added
        later may use, and every node dials every other through it (``dial``)."""
        return {n: self.cluster.address(n) for n in self.pool}

    def launch(self) -> None:
        self.cluster.proxy = self.proxy
        self.cluster.pool = self.pool
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
        out = {self.cluster.address(n): n for n in self.pool}
        out.update({addr: dst for (_, dst), addr in self.proxy.addresses.items()})
        return out

    # ------------------------------------------------------------------ membership (the nemesis's primitives)

    def membership_refusal(self) -> str | None:
        """Why this backend cannot change membership (None: it can, once spares are planned)."""
        return None if self.spares else "no spare nodes were planned (plan_faults without 'membership')"

    def _member_client(self, timeout: float = 10.0) -> DirectLedgerClient:
        return DirectLedgerClient(
            self.addresses,
            self.direct,
            timeout=timeout,
            attempt_timeout=1.0,
            secret=self.cluster.client_secret,
        )

    async def group_members(self, group: Sequence[str]) -> dict[str, Any]:
        """The leader's configuration: ``voters``, ``learners`` (node ids) and ``leader``."""
        async with self._member_client() as client:
            doc = await client.members()
        return self._follow(doc)

    def spare_nodes(self, group: Sequence[str]) -> list[str]:
        """Nodes of the pool outside the group and not running: what can be added fresh."""
        return [n for n in self.pool if n not in self.nodes and not self.procs.is_running(n)]

    def _follow(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Take the group's configuration as the nodes the other faults aim at; its summary."""
        voters, learners = list(doc.get("voters") or {}), list(doc.get("learners") or {})
        self.nodes = [n for n in self.pool if n in voters or n in learners]
        return {"voters": sorted(voters), "learners": sorted(learners), "leader": doc.get("leader")}

    def wipe(self, nid: str) -> None:
        """SIGKILL the node and delete its data: a machine whose disk is gone (not a fault to heal)."""
        self.procs.kill(self.process_name(nid))
        self.killed.discard(nid)
        self.paused.discard(nid)
        shutil.rmtree(self.base_dir / nid / "data", ignore_errors=True)

    def _start_joining(self, nid: str, join: list[str]) -> None:
        """Start ``nid`` empty, asking ``join`` for the group's configuration (``ledger start --join``)."""
        self.wipe(nid)
        d = self.base_dir / nid
        d.mkdir(parents=True, exist_ok=True)
        conf = {
            "id": nid,
            "listen": self.cluster.address(nid),
            "peers": [f"{nid}={self.cluster.address(nid)}"],
            "data_dir": str(d / "data"),
            "join": join,
            **self.cluster.settings,
            **self.cluster.node_settings(nid),
        }
        write_toml(self.cluster.config_path(nid), conf)
        self.cluster.start_node(nid)

    async def member_add(self, nid: str) -> dict[str, Any]:
        """Start ``nid`` fresh, add it as a learner, promote it once it has caught up."""
        join = [self.cluster.address(n) for n in self.nodes]
        await asyncio.to_thread(self._start_joining, nid, join)
        address = self.cluster.address(nid)
        async with self._member_client(timeout=PROMOTE_WAIT_S + 10.0) as client:
            try:
                added = await client.add_learner(nid, address, wait_s=BUSY_WAIT_S)
                await caught_up(client, nid, int(added.get("index") or 0), PROMOTE_WAIT_S)
                doc = await client.promote(nid, wait_s=PROMOTE_WAIT_S)
            except BaseException:
                await self._refresh(client)
                raise
        return self._follow(doc)

    async def member_remove(self, nid: str) -> dict[str, Any]:
        """Remove ``nid`` from the group, then kill it and delete its data (it leaves for good)."""
        async with self._member_client() as client:
            try:
                doc = await client.remove_member(nid, wait_s=BUSY_WAIT_S)
            except BaseException:
                await self._refresh(client)
                raise
        await asyncio.to_thread(self.wipe, nid)
        return self._follow(doc)

    async def _refresh(self, client: LedgerClient) -> None:
        """After a failed change: follow whatever configuration the group has now."""
        try:
            self._follow(await client.members())
        except Exception:  # noqa: BLE001 - the change's own error is what the history records
            pass

    async def status(self, nid: str) -> dict[str, Any] | None:
        st = await self._status_client.get().status(self.cluster.address(nid))
        return {
            "role": st.get("role"),
            "term": st.get("term"),
            "leader": st.get("leader"),
            "ready": bool(st.get("leader_ready")),
            "commit_index": st.get("commit_index"),
        }

    def ledger_dir(self, nid: str) -> Path | None:
        return self.base_dir / nid / "data"

    def forge_targets(self) -> dict[str, Any]:
        return {
            "ledger": {n: self.cluster.address(n) for n in self.nodes},
            "secured": bool(
                self.cluster.settings.get("cluster_secret")
                or self.cluster.settings.get("cluster_secret_file")
            ),
            "admin": [],
            "acl": False,
        }

    def log_client(self) -> LogClient:
        return LedgerLogClient(self.addresses, self.direct, self.names, timeout=self.client_timeout)

    def client_spec(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "addresses": self.addresses,
            "direct": self.direct,
            "names": self.names,
            "timeout": self.client_timeout,
        }

    def register_replica(self) -> LedgerRegisterReplica:
        return LedgerRegisterReplica()

    def register_client(self, replica: LedgerRegisterReplica) -> RegisterClient:
        return LedgerRegisterClient(
            self.addresses, self.direct, self.names, replica, timeout=self.client_timeout
        )

    def log_files(self) -> dict[str, Path]:
        return {
            n: self.base_dir / n / "node.log"
            for n in self.pool
            if n in self.nodes or (self.base_dir / n).exists()
        }

    def cleanup_data(self) -> None:
        for n in self.pool:
            shutil.rmtree(self.base_dir / n / "data", ignore_errors=True)


async def caught_up(client: LedgerClient, nid: str, index: int, timeout: float) -> None:
    """Wait until learner ``nid`` holds the log up to ``index`` (the entry that added it), so that
    it is promoted only once it has answered: the leader promotes a learner whose lag is small
    even if it never replied (a young log), and a voter that never started weakens the quorum."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        doc = await client.members()
        if int(doc.get("progress", {}).get(nid, {}).get("match") or 0) >= index:
            return
        if loop.time() >= deadline:
            raise TimeoutError(f"learner {nid} did not reach index {index} within {timeout:g} s")
        await asyncio.sleep(0.05)


class _ProxiedCluster(LocalCluster):
    """A ``LocalCluster`` whose nodes reach each other through the link proxy."""

    proxy: LinkProxy | None = None
    pool: Sequence[str] = ()  # every node the run may start (the proxy fronts their links)

    def peer_address(self, nid: str, peer: str) -> str:
        assert self.proxy is not None, "start the link proxy before writing configs"
        return self.proxy.address(nid, peer)

    def node_settings(self, nid: str) -> dict[str, Any]:
        """``dial``: every other node of the pool through its link's proxy, so a member added
        later (its address in the configuration is where it listens) is still dialled through
        the link a partition cuts, and so are the first members by a node that joined."""
        assert self.proxy is not None, "start the link proxy before writing configs"
        return {"dial": [f"{p}={self.proxy.address(nid, p)}" for p in self.pool or self.ids if p != nid]}


class LedgerEndpoints:
    """The clients of a local ledger group, built from its ``client_spec`` in a worker process."""

    system = SYSTEM

    def __init__(self, spec: dict[str, Any]) -> None:
        self.addresses = [str(a) for a in spec["addresses"]]
        self.direct = {str(k): str(v) for k, v in spec["direct"].items()}
        self.names = {str(k): str(v) for k, v in spec["names"].items()}
        self.client_timeout = float(spec["timeout"])

    def log_client(self) -> LogClient:
        return LedgerLogClient(self.addresses, self.direct, self.names, timeout=self.client_timeout)

    def register_replica(self) -> LedgerRegisterReplica:
        return LedgerRegisterReplica()

    def register_client(self, replica: LedgerRegisterReplica) -> RegisterClient:
        return LedgerRegisterClient(
            self.addresses, self.direct, self.names, replica, timeout=self.client_timeout
        )

    def queue_client(self, broker_name: str | None = None) -> Any:
        raise Unsupported("the ledger group runs the log and register workloads")
