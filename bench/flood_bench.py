"""Client floods against a 3-broker group: do they stall the master or cost it its leadership?

Stands up two nameservers and a broker group (default settings, local processes), then, while
one producer sends a message every 10 ms and a watcher polls every broker's role and term:

1. a heartbeat flood: ``--clients`` heartbeats (default 25,000), each from a fresh client id
   (the table holds ``max_heartbeat_clients``, 20,000: the rest are refused), 500 in flight;
2. a topic burst: ``--topics`` sends (default 10,000) to topics that do not exist yet, 1,000
   in flight (each creates its topic; past the bound of topics being created, SYSTEM_BUSY).

Reported per phase: the master's event-loop lag (p50/p99/max, from its own LoopLagMonitor,
sampled every 20 ms), the steady sends' latency (p50/p99/max), the flood's own answer codes,
and whether any broker's term changed. Ends with one JSON line.

    python bench/flood_bench.py [--quick] [--clients N] [--topics N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from broker.localgroup import LocalBrokerGroup
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode

TOPIC = "FloodTopic"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def send(topic: str, body: bytes) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": topic, "queueId": -1}, body)


def heartbeat(i: int) -> RemotingCommand:
    doc = {
        "clientID": f"flood-{i}@127.0.0.1",
        "producerDataSet": [{"groupName": "flood-pg"}],
        "consumerDataSet": [
            {
                "groupName": "flood-cg",
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "subscriptionDataSet": [{"topic": TOPIC, "subString": "*"}],
            }
        ],
    }
    return RemotingCommand.request(RequestCode.HEART_BEAT, body=json.dumps(doc).encode())


class Watch:
    """A steady producer and a role/term watcher, running beside a flood."""

    def __init__(self, g: LocalBrokerGroup, master: str) -> None:
        self.g, self.addr = g, g.broker_addr[master]
        self.latencies: list[float] = []
        self.failed: Counter[str] = Counter()
        self.terms: dict[str, set[int]] = {n: set() for n in g.node_ids}
        self.masters: set[str] = set()
        self._stop = asyncio.Event()

    async def _sends(self, client: RemotingClient) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                r = await client.invoke_sync(self.addr, send(TOPIC, b"steady"), 10.0)
                if r.is_success:
                    self.latencies.append((time.monotonic() - started) * 1000)
                else:
                    self.failed[r.remark[:60]] += 1
            except Exception as exc:  # noqa: BLE001 - counted, the bench goes on
                self.failed[type(exc).__name__] += 1
            await asyncio.sleep(0.01)

    async def _roles(self, client: RemotingClient) -> None:
        while not self._stop.is_set():
            for nid in self.g.node_ids:
                info = await self.g.runtime_info(client, nid)
                if info:
                    self.terms[nid].add(int(info["ledger"]["term"]))
                    if info["role"] == "MASTER":
                        self.masters.add(nid)
            await asyncio.sleep(1.0)

    async def run(self, flood: Any) -> dict[str, Any]:
        async with RemotingClient() as steady, RemotingClient() as watcher:
            tasks = [asyncio.create_task(self._sends(steady)), asyncio.create_task(self._roles(watcher))]
            started = time.monotonic()
            try:
                codes = await flood
            finally:
                elapsed = time.monotonic() - started
                self._stop.set()
                await asyncio.gather(*tasks)
        return {
            "seconds": round(elapsed, 2),
            "codes": {
                ResponseCode(c).name if c in ResponseCode._value2member_map_ else str(c): n
                for c, n in codes.items()
            },
            "send_p50_ms": round(pct(self.latencies, 0.5), 2),
            "send_p99_ms": round(pct(self.latencies, 0.99), 2),
            "send_max_ms": round(max(self.latencies, default=0.0), 2),
            "sends_ok": len(self.latencies),
            "sends_failed": dict(self.failed),
            "leader_changed": len(self.masters) > 1 or any(len(t) > 1 for t in self.terms.values()),
        }


async def flood_requests(addr: str, requests: list[RemotingCommand], in_flight: int) -> Counter[int]:
    codes: Counter[int] = Counter()
    async with RemotingClient() as client:
        for start in range(0, len(requests), in_flight):
            answers = await asyncio.gather(
                *(client.invoke_sync(addr, r, 30.0) for r in requests[start : start + in_flight]),
                return_exceptions=True,
            )
            for a in answers:
                codes[a.code if isinstance(a, RemotingCommand) else -1] += 1
    return codes


async def loop_lag(g: LocalBrokerGroup, nid: str, since: float) -> dict[str, Any]:
    """The broker's event-loop lag over the samples it took since wall time ``since``."""
    req = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {"loopLagSinceMs": int(since * 1000)})
    async with RemotingClient() as client:
        r = await client.invoke_sync(g.broker_addr[nid], req, 10.0)
    return dict(json.loads(bytes(r.body))["loopLag"]) if r.is_success else {}


async def phase(g: LocalBrokerGroup, master: str, name: str, flood: Any) -> dict[str, Any]:
    since = time.time()
    out = await Watch(g, master).run(flood)
    out["loop_lag"] = await loop_lag(g, master, since)
    print(f"{name}: {json.dumps(out)}", flush=True)
    return out


async def main_async(clients: int, topics: int, base: Path) -> dict[str, Any]:
    g = LocalBrokerGroup(base, topics=(f"{TOPIC}:4",), settings={"register_interval_s": 10})
    g.start()
    try:
        master = await g.wait_for_master(60)
        addr = g.broker_addr[master]
        await asyncio.sleep(3)
        idle = await phase(g, master, "idle", asyncio.sleep(5, result=Counter()))
        heartbeats = [heartbeat(i) for i in range(clients)]
        hb = await phase(
            g, master, f"heartbeat flood ({clients} client ids)", flood_requests(addr, heartbeats, 500)
        )
        burst = [send(f"Burst{i}", b"x") for i in range(topics)]
        tb = await phase(g, master, f"topic burst ({topics} new topics)", flood_requests(addr, burst, 1000))
        return {"idle": idle, "heartbeat_flood": hb, "topic_burst": tb}
    finally:
        g.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="5,000 heartbeats and 2,000 topics")
    ap.add_argument("--clients", type=int, default=25_000)
    ap.add_argument("--topics", type=int, default=10_000)
    args = ap.parse_args()
    clients, topics = (5000, 2000) if args.quick else (args.clients, args.topics)
    with tempfile.TemporaryDirectory(prefix="flood-bench-") as tmp:
        out = asyncio.run(main_async(clients, topics, Path(tmp)))
    summary = {
        "bench": "flood",
        "heartbeats": clients,
        "topics": topics,
        "leader_changed": out["heartbeat_flood"]["leader_changed"] or out["topic_burst"]["leader_changed"],
        "idle_lag_p99_ms": out["idle"]["loop_lag"].get("p99_ms"),
    }
    for phase in ("heartbeat_flood", "topic_burst"):
        summary[f"{phase}_lag_p99_ms"] = out[phase]["loop_lag"].get("p99_ms")
        summary[f"{phase}_lag_max_ms"] = out[phase]["loop_lag"].get("max_ms")
        summary[f"{phase}_send_max_ms"] = out[phase]["send_max_ms"]
        summary[f"{phase}_send_p99_ms"] = out[phase]["send_p99_ms"]
    summary["send_p50_ms"] = statistics.median([out[p]["send_p50_ms"] for p in out])
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
