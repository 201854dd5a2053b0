"""Load test of one nameserver process: route lookups/s and broker registrations/s.

Starts ``python -m namesrv`` on a free loopback port, fills its route table with broker groups
and topics, then drives it from several concurrent clients (one connection each, several
requests in flight per connection) for a fixed time per phase. Prints the figures and ends
with one JSON line for scripts.

    python bench/namesrv_bench.py [--quick] [--clients 4] [--in-flight 16] [--duration 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from broker.registration import BrokerIdentity  # noqa: E402
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode  # noqa: E402
from remoting.jsonbody import dump_body  # noqa: E402
from remoting.topic import DataVersion, TopicConfig, TopicConfigWrapper  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_namesrv(log_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start the nameserver at log level warning (so logging does not skew the figures)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    port = free_port()
    log = open(log_path, "wb")  # noqa: SIM115 - owned by the child for its lifetime
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "namesrv",
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"namesrv exited with {proc.returncode}: {log_path.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    stop(proc)
    raise SystemExit("namesrv did not start within 15 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


def topic_table(group: int, topics_per_group: int, version: int) -> TopicConfigWrapper:
    names = [f"bench-topic-{(group * 7 + i) % (topics_per_group * 2)}" for i in range(topics_per_group)]
    return TopicConfigWrapper(
        {n: TopicConfig(n, 8, 8) for n in names}, DataVersion(1_700_000_000_000, version)
    )


def register_request(ident: BrokerIdentity, body: bytes) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, ident.headers(), body)


async def populate(client: RemotingClient, addr: str, groups: int, topics_per_group: int) -> list[str]:
    """Register the broker groups over ``client``; they stay registered while its connection is open."""
    topics: set[str] = set()
    for g in range(groups):
        tc = topic_table(g, topics_per_group, 1)
        topics.update(tc.topic_config_table)
        body = dump_body(tc.to_json())
        for broker_id in (0, 1):
            host = f"127.0.{g // 250}.{g % 250 + 1}:{10911 + broker_id}"
            ident = BrokerIdentity("bench", f"grp-{g}", host, broker_id)
            (await client.invoke_sync(addr, register_request(ident, body), 5.0)).check_success(addr)
    return sorted(topics)


async def phase(
    addr: str, clients: int, in_flight: int, duration: float, make_request
) -> tuple[int, int, list[float]]:
    """Run ``clients`` connections x ``in_flight`` workers for ``duration`` s; count ok and failed calls."""
    ok = failed = 0
    latencies: list[float] = []
    stop_at = time.monotonic() + duration

    async def worker(client: RemotingClient, wid: int) -> None:
        nonlocal ok, failed
        rnd = random.Random(wid)
        n = 0
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            resp = await client.invoke_sync(addr, make_request(rnd, wid, n), 5.0)
            n += 1
            if resp.code == ResponseCode.SUCCESS:
                ok += 1
            else:
                failed += 1
            if n % 16 == 0:
                latencies.append(time.perf_counter() - t0)

    cls = [RemotingClient(name=f"bench-{i}") for i in range(clients)]
    try:
        await asyncio.gather(
            *(worker(c, i * in_flight + j) for i, c in enumerate(cls) for j in range(in_flight))
        )
    finally:
        for c in cls:
            await c.close()
    return ok, failed, latencies


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


async def main_async(args: argparse.Namespace, addr: str) -> dict[str, float | int]:
    brokers = RemotingClient(name="bench-brokers")  # closing it would unregister every broker
    topics = await populate(brokers, addr, args.groups, args.topics)
    print(f"route table: {args.groups} broker groups x 2 brokers, {len(topics)} topics")

    def lookup(rnd: random.Random, wid: int, n: int) -> RemotingCommand:
        return RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": rnd.choice(topics)})

    ok, failed, lat = await phase(addr, args.clients, args.in_flight, args.duration, lookup)
    lookups = ok / args.duration
    print(
        f"route lookups: {lookups:,.0f}/s ({ok} ok, {failed} failed) "
        f"p50 {pct(lat, 0.5):.2f} ms p99 {pct(lat, 0.99):.2f} ms"
    )

    # Registration: every worker is its own broker re-registering its topic table; every 10th
    # round bumps the data version so the nameserver also rewrites queue data.
    bodies = {v: dump_body(topic_table(7, args.topics, v).to_json()) for v in (1, 2)}

    def registration(rnd: random.Random, wid: int, n: int) -> RemotingCommand:
        ident = BrokerIdentity("bench-reg", f"reg-{wid}", f"10.9.{wid // 250}.{wid % 250 + 1}:10911", 0)
        return register_request(ident, bodies[1 + (n // 10) % 2])

    ok, failed, lat = await phase(addr, args.clients, args.in_flight, args.duration, registration)
    regs = ok / args.duration
    print(
        f"registrations: {regs:,.0f}/s ({ok} ok, {failed} failed; body {len(bodies[1])} bytes, "
        f"{args.topics} topics) p50 {pct(lat, 0.5):.2f} ms p99 {pct(lat, 0.99):.2f} ms"
    )
    await brokers.close()
    return {
        "route_lookups_per_s": round(lookups, 1),
        "registrations_per_s": round(regs, 1),
        "clients": args.clients,
        "in_flight_per_client": args.in_flight,
        "topics": len(topics),
        "duration_s": args.duration,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 s per phase, smaller table")
    parser.add_argument("--clients", type=int, default=4, help="concurrent connections")
    parser.add_argument("--in-flight", type=int, default=16, help="requests in flight per connection")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase")
    parser.add_argument("--groups", type=int, default=50, help="broker groups in the route table")
    parser.add_argument("--topics", type=int, default=100, help="topics per broker group")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.groups, args.topics = 1.0, 10, 20
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        uvloop = None
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_namesrv(Path(tmp) / "namesrv.log")
        try:
            coro = main_async(args, f"127.0.0.1:{port}")
            result = uvloop.run(coro) if uvloop is not None else asyncio.run(coro)
        finally:
            stop(proc)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
