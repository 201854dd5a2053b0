"""One pysyncobj node serving the harness's ``log`` workload: a system no one here wrote.

``python -m jepsen.systems.syncobj_node --self HOST:PORT --peers A,B --dial B=PROXY,... --client HOST:PORT --data DIR``

The node runs a ``SyncObj`` whose replicated state is an append-only list, and serves a
JSON-lines protocol on ``--client`` (one request per line, one reply per line):

* ``{"id": 1, "op": "append", "value": 7}`` -> ``{"id": 1, "ok": true, "offset": 12}``
* ``{"id": 2, "op": "read", "from": 0, "max": 50}`` -> ``{"id": 2, "ok": true, "entries": [[0, 5], ...]}``
  (``max`` may be null: everything from ``from``)
* ``{"id": 3, "op": "status"}`` -> role, term, leader, commit index

Honesty rules: an append is ``ok`` only when pysyncobj's callback reports ``SUCCESS``,
and its offset is the list position the replicated method returned when it was applied.
Errors carry ``"definite": true`` only where the command certainly never entered the log:
the node refused it because it was not the leader (checked before submitting), or
pysyncobj reported ``QUEUE_FULL``/``MISSING_LEADER``/``REQUEST_DENIED``. ``NOT_LEADER``,
``LEADER_CHANGED``, ``DISCARDED``, ``UNKNOWN_OUTCOME`` and timeouts are indefinite.

Reads are replicated commands too: the slice is taken when the read command is applied,
so a read is ordered in the log with every append, which makes it linearizable to exactly
the extent that pysyncobj's log is (no leases, no ReadIndex shortcut). A node that is not
the leader refuses reads, so a stale node cannot answer from its own applied state.

Durability: pysyncobj's file journal (``journalFile`` + ``fullDumpFile``) is enabled, so a
SIGKILLed node restarts with its log, term and vote; the journal is an mmap that is never
fsynced, which survives process kills but not power loss. Tuning (not semantics):
``leaderFallbackTimeout`` 3 s instead of 30 s so a partitioned leader steps down within a
short test, and reconnects every 0.5 s instead of 5 s.

Partitions: pysyncobj names nodes by address, so identity stays the real address while
dialing goes to ``--dial`` (the harness's cuttable proxy for that link).

``--bench`` runs the node the throughput baseline uses instead (``bench/ledger_bench.py``):
a counter behind ``append``, an in-memory log that is never fsynced (pysyncobj is given that
advantage), no client protocol; with ``--load SECONDS`` it also appends entries of ``--size``
bytes with ``--inflight`` outstanding and prints one JSON line of results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import sys
import threading
import time
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.node import TCPNode

DEFINITE = {FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.REQUEST_DENIED}
REASONS = {v: k.lower() for k, v in vars(FAIL_REASON).items() if isinstance(v, int)}
ROLES = {0: "follower", 1: "candidate", 2: "leader"}


class DialNode(TCPNode):
    """A peer known by its real address but reached through another (a proxy)."""

    def __init__(self, address: str, dial: str | None = None) -> None:
        super().__init__(address)
        host, port = (dial or address).rsplit(":", 1)
        self._dial_host, self._dial_port = host, int(port)

    @property
    def ip(self) -> str:  # type: ignore[override]
        return self._dial_host

    @property
    def port(self) -> int:  # type: ignore[override]
        return self._dial_port


class ReplicatedLog(SyncObj):
    def __init__(self, self_addr: str, peers: list[DialNode], conf: SyncObjConf) -> None:
        self.items: list[Any] = []  # before SyncObj starts applying the journal
        super().__init__(self_addr, peers, conf)

    @replicated
    def append(self, value: Any) -> int:
        self.items.append(value)
        return len(self.items) - 1

    @replicated
    def read(self, start: int, limit: int | None) -> list[list[Any]]:
        start = max(0, start)
        end = len(self.items) if limit is None else min(len(self.items), start + max(0, limit))
        return [[i, self.items[i]] for i in range(start, end)]


class Server:
    def __init__(self, node: ReplicatedLog, timeout: float) -> None:
        self.node = node
        self.timeout = timeout

    def status(self) -> dict[str, Any]:
        st = self.node.getStatus()
        leader = st.get("leader")
        return {
            "id": self.node.selfNode.address,
            "role": ROLES.get(st.get("state"), str(st.get("state"))),
            "term": st.get("raft_term"),
            "leader": getattr(leader, "address", None) if leader is not None else None,
            "commit_index": st.get("commit_idx"),
            "log_len": st.get("log_len"),
            "has_quorum": st.get("has_quorum"),
        }

    async def _replicate(self, method: Any, *args: Any) -> dict[str, Any]:
        if not self.node._isLeader():
            leader = self.node._getLeader()
            return {
                "ok": False,
                "definite": True,
                "error": "not leader",
                "leader": getattr(leader, "address", None),
            }
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[Any, int]] = loop.create_future()

        def done(result: Any, err: int) -> None:  # runs on pysyncobj's tick thread
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result((result, err)))

        method(*args, callback=done)
        try:
            result, err = await asyncio.wait_for(fut, self.timeout)
        except TimeoutError:
            return {"ok": False, "definite": False, "error": "timeout"}
        if err == FAIL_REASON.SUCCESS:
            return {"ok": True, "result": result}
        return {"ok": False, "definite": err in DEFINITE, "error": REASONS.get(err, str(err))}

    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "status":
            return {"ok": True, "status": self.status()}
        if op == "append":
            res = await self._replicate(self.node.append, req["value"])
            if res.pop("ok"):
                return {"ok": True, "offset": res["result"]}
            return {"ok": False, **res}
        if op == "read":
            res = await self._replicate(self.node.read, int(req.get("from", 0)), req.get("max"))
            if res.pop("ok"):
                return {"ok": True, "entries": res["result"]}
            return {"ok": False, **res}
        return {"ok": False, "definite": True, "error": f"unknown op {op!r}"}

    async def serve_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    req = json.loads(line)
                    reply = await self.handle(req)
                except (ValueError, KeyError, TypeError) as exc:
                    req, reply = {}, {"ok": False, "definite": True, "error": f"bad request: {exc}"}
                reply["id"] = req.get("id")
                writer.write((json.dumps(reply) + "\n").encode())
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def amain(args: argparse.Namespace) -> None:
    os.makedirs(args.data, exist_ok=True)
    dial = dict(item.split("=", 1) for item in args.dial.split(",") if item) if args.dial else {}
    peers = [DialNode(p, dial.get(p)) for p in args.peers.split(",") if p and p != args.self]
    conf = SyncObjConf(
        journalFile=os.path.join(args.data, "journal.bin"),
        fullDumpFile=os.path.join(args.data, "dump.bin"),
        leaderFallbackTimeout=3.0,
        connectionRetryTime=0.5,
        commandsWaitLeader=False,
    )
    node = ReplicatedLog(args.self, peers, conf)
    server = Server(node, args.timeout)
    host, port = args.client.rsplit(":", 1)
    srv = await asyncio.start_server(server.serve_conn, host, int(port), reuse_address=True)
    logging.info("pysyncobj node %s serving clients on %s", args.self, args.client)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    last = None
    while not stop.is_set():
        st = server.status()
        now = (st["role"], st["term"], st["leader"])
        if now != last:
            logging.info("state %s term %s leader %s", *now)
            last = now
        try:
            await asyncio.wait_for(stop.wait(), 0.2)
        except TimeoutError:
            pass
    srv.close()
    threading.Thread(target=node.destroy, daemon=True).start()


class CountingLog(SyncObj):
    """The benchmark's replicated state: a counter, so the baseline measures replication only."""

    def __init__(self, self_addr: str, peers: list[str]) -> None:
        super().__init__(self_addr, peers, SyncObjConf(commandsQueueSize=1_000_000))
        self.count = 0

    @replicated
    def append(self, data: bytes) -> int:
        self.count += 1
        return self.count


def bench(args: argparse.Namespace) -> None:
    """A benchmark member; with ``--load`` also the load generator (prints one JSON line)."""
    node = CountingLog(args.self, [p for p in args.peers.split(",") if p and p != args.self])
    if not args.load:
        while True:
            time.sleep(3600)
    deadline = time.monotonic() + 30
    while node._getLeader() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(args.warmup)
    sem = threading.Semaphore(args.inflight)
    lock = threading.Lock()
    latencies: list[float] = []
    errors = 0
    payload = b"x" * args.size

    def make_cb(t0: float) -> Any:
        def cb(result: Any, err: int) -> None:
            nonlocal errors
            with lock:
                if err == 0:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors += 1
            sem.release()

        return cb

    start = time.perf_counter()
    end = start + args.load
    while time.perf_counter() < end:
        if sem.acquire(timeout=0.5):
            node.append(payload, callback=make_cb(time.perf_counter()))
    elapsed = time.perf_counter() - start
    for _ in range(args.inflight):
        sem.acquire(timeout=5)
    lat = sorted(latencies)
    result = {
        "entries_per_s": len(lat) / elapsed,
        "p50_ms": 1000 * statistics.median(lat) if lat else None,
        "p99_ms": 1000 * lat[int(len(lat) * 0.99)] if lat else None,
        "errors": errors,
    }
    print(json.dumps(result), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--self", required=True, help="this node's raft address (its identity)")
    ap.add_argument("--peers", required=True, help="every member's raft address, comma separated")
    ap.add_argument("--dial", default="", help="peer=address to dial instead, comma separated")
    ap.add_argument("--client", help="host:port for the JSON-lines client protocol (required unless --bench)")
    ap.add_argument("--data", help="directory for the journal and dump files (required unless --bench)")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for a command to apply")
    ap.add_argument("--bench", action="store_true", help="run the benchmark baseline's node instead")
    ap.add_argument("--load", type=float, default=0.0, help="--bench: seconds of load to generate")
    ap.add_argument("--size", type=int, default=1024, help="--bench: bytes per appended entry")
    ap.add_argument("--inflight", type=int, default=1000, help="--bench: appends outstanding")
    ap.add_argument("--warmup", type=float, default=3.0, help="--bench: seconds between election and load")
    args = ap.parse_args()
    if args.bench:
        bench(args)
        return
    if not args.client or not args.data:
        ap.error("--client and --data are required (unless --bench)")
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    asyncio.run(amain(args))


if __name__ == "__main__":
    main()
