"""The pysyncobj group as a system under test: three ``jepsen.systems.syncobj_node`` processes.

It shows the harness and checker on a system no one here wrote. Nodes dial each other
through the link proxies (pysyncobj keeps one connection per pair, opened by the node
with the larger address, so cuts are made symmetric). Clients speak the node program's
JSON-lines protocol directly to each node's client port.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from common.process import ProcessSet, free_port
from jepsen.systems.base import ProcessBackend, Unsupported
from jepsen.systems.clients import Definite, Indefinite, LogClient, Pair

SYSTEM = "pysyncobj"


class LocalSyncObjBackend(ProcessBackend):
    system = SYSTEM
    directed_links = False

    def __init__(self, base_dir: Path, n: int = 3, python: str = sys.executable) -> None:
        super().__init__(base_dir, ProcessSet(base_dir))  # started, signalled and reaped by PID
        self.nodes = [f"n{i + 1}" for i in range(n)]
        self.hosts = {nid: f"127.0.0.{i + 1}" for i, nid in enumerate(self.nodes)}
        self.raft = {nid: f"{self.hosts[nid]}:{free_port(self.hosts[nid])}" for nid in self.nodes}
        self.client_addr = {nid: f"{self.hosts[nid]}:{free_port(self.hosts[nid])}" for nid in self.nodes}
        self.python = python

    # ------------------------------------------------------------------ processes

    def _argv(self, nid: str) -> list[str]:
        assert self.proxy is not None
        dial = ",".join(f"{self.raft[p]}={self.proxy.address(nid, p)}" for p in self.nodes if p != nid)
        return [
            self.python,
            "-m",
            "jepsen.systems.syncobj_node",
            "--self",
            self.raft[nid],
            "--peers",
            ",".join(self.raft[p] for p in self.nodes),
            "--dial",
            dial,
            "--client",
            self.client_addr[nid],
            "--data",
            str(self.base_dir / nid / "data"),
        ]

    def spawn(self, nid: str) -> None:
        self.procs.spawn(nid, self._argv(nid), self.base_dir / nid / "node.log")

    def peer_addresses(self) -> dict[str, str]:
        return self.raft

    def listen_addresses(self) -> list[str]:
        return list(self.client_addr.values())

    def launch(self) -> None:
        for nid in self.nodes:
            self.spawn(nid)

    # ------------------------------------------------------------------ status and clients

    def node_of_raft(self, addr: str | None) -> str | None:
        for nid, a in self.raft.items():
            if a == addr:
                return nid
        return None

    async def status(self, nid: str) -> dict[str, Any] | None:
        conn = await JsonLineConn.open(self.client_addr[nid], 0.5)
        try:
            reply = await conn.call({"op": "status"}, 0.5)
        finally:
            await conn.close()
        st = reply["status"]
        return {
            "role": st["role"],
            "term": st["term"],
            "leader": self.node_of_raft(st.get("leader")),
            "ready": True,
            "commit_index": st.get("commit_index"),
        }

    def log_client(self) -> LogClient:
        return SyncObjLogClient(self, timeout=self.client_timeout)

    def client_spec(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "nodes": self.nodes,
            "raft": self.raft,
            "client_addr": self.client_addr,
            "timeout": self.client_timeout,
        }

    def log_files(self) -> dict[str, Path]:
        return {n: self.base_dir / n / "node.log" for n in self.nodes}

    def cleanup_data(self) -> None:
        import shutil

        for n in self.nodes:
            shutil.rmtree(self.base_dir / n / "data", ignore_errors=True)


class SyncObjEndpoints:
    """The clients of a pysyncobj group, built from its ``client_spec`` in a worker process."""

    system = SYSTEM

    def __init__(self, spec: dict[str, Any]) -> None:
        self.nodes = [str(n) for n in spec["nodes"]]
        self.raft = {str(k): str(v) for k, v in spec["raft"].items()}
        self.client_addr = {str(k): str(v) for k, v in spec["client_addr"].items()}
        self.client_timeout = float(spec["timeout"])

    def node_of_raft(self, addr: str | None) -> str | None:
        for nid, a in self.raft.items():
            if a == addr:
                return nid
        return None

    def log_client(self) -> LogClient:
        return SyncObjLogClient(self, timeout=self.client_timeout)

    def register_replica(self) -> Any:
        raise Unsupported("pysyncobj runs the log workload only")

    def register_client(self, replica: Any) -> Any:
        raise Unsupported("pysyncobj runs the log workload only")

    def queue_client(self, broker_name: str | None = None) -> Any:
        raise Unsupported("pysyncobj runs the log workload only")


class JsonLineConn:
    """One JSON-lines connection with at most one request in flight (a Jepsen process)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._id = 0

    @classmethod
    async def open(cls, address: str, timeout: float) -> JsonLineConn:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
        return cls(reader, writer)

    async def call(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request; ``Indefinite`` if it left and no well-formed answer came back."""
        self._id += 1
        self.writer.write((json.dumps({**req, "id": self._id}) + "\n").encode())
        try:
            await self.writer.drain()
            line = await asyncio.wait_for(self.reader.readline(), timeout)
        except (OSError, TimeoutError) as exc:
            raise Indefinite(f"sent, no answer: {type(exc).__name__} {exc}") from exc
        if not line:
            raise Indefinite("sent, connection closed before the answer")
        reply = json.loads(line)
        if reply.get("id") != self._id:
            raise Indefinite(f"answer for request {reply.get('id')} while waiting for {self._id}")
        return reply

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass


class SyncObjLogClient:
    """``LogClient`` over the pysyncobj node protocol; follows "not leader" answers."""

    def __init__(self, backend: LocalSyncObjBackend | SyncObjEndpoints, timeout: float = 5.0) -> None:
        self.backend = backend
        self.timeout = timeout
        self.node: str | None = None
        self._conns: dict[str, JsonLineConn] = {}
        self._leader: str | None = None
        self._rr = 0

    async def _conn(self, nid: str) -> JsonLineConn:
        conn = self._conns.get(nid)
        if conn is not None and (conn.reader.at_eof() or conn.writer.is_closing()):
            self._conns.pop(nid, None)  # the node closed it (died, restarted): nothing sent on it yet
            await conn.close()
            conn = None
        if conn is None:
            try:
                conn = await JsonLineConn.open(self.backend.client_addr[nid], 1.0)
            except (OSError, TimeoutError) as exc:
                raise Definite(f"cannot connect to {nid}: {exc}") from exc  # nothing was sent
            self._conns[nid] = conn
        return conn

    async def _request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send to the leader, redirecting on definite refusals; ``Indefinite`` once sent and unanswered."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        last = "no node tried"
        nodes = self.backend.nodes
        while loop.time() < deadline:
            if self._leader is None:
                self._rr = (self._rr + 1) % len(nodes)
            nid = self._leader or nodes[self._rr]
            self.node = nid
            try:
                conn = await self._conn(nid)
            except Definite as exc:
                last = str(exc)
                self._leader = None
                await asyncio.sleep(0.05)
                continue
            try:
                reply = await conn.call(req, max(0.1, deadline - loop.time()))
            except Indefinite:
                self._conns.pop(nid, None)
                await conn.close()
                self._leader = None
                raise
            if reply.get("ok"):
                self._leader = nid
                return reply
            if not reply.get("definite"):
                self._leader = None
                raise Indefinite(f"{nid}: {reply.get('error')}")
            last = f"{nid}: {reply.get('error')}"
            self._leader = self.backend.node_of_raft(reply.get("leader"))
            if self._leader == nid:
                self._leader = None
            await asyncio.sleep(0.02 if self._leader else 0.1)
        raise Definite(f"no leader accepted the request within {self.timeout}s ({last})")

    async def send(self, value: int) -> int:
        reply = await self._request({"op": "append", "value": value})
        return int(reply["offset"])

    async def poll(self, start: int, limit: int) -> list[Pair]:
        try:
            reply = await self._request({"op": "read", "from": start, "max": limit})
        except Indefinite as exc:
            raise Definite(f"read: {exc}") from exc  # a read changes nothing
        return [(int(o), v) for o, v in reply["entries"]]

    async def drain(self) -> list[Pair]:
        try:
            reply = await self._request({"op": "read", "from": 0, "max": None})
        except Indefinite as exc:
            raise Definite(f"read: {exc}") from exc
        return [(int(o), v) for o, v in reply["entries"]]

    async def close(self) -> None:
        for conn in self._conns.values():
            await conn.close()
        self._conns.clear()
