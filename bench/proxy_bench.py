"""RocketMQ 5 proxy: what a send costs through it, and what a master kill costs a 5.x producer.

On one local cluster (a nameserver, a 3-broker group, the proxy) it measures, in the same run:

- send latency (sync, one at a time, 1 KiB): Apache's official Python 5.x client through the
  proxy; raw gRPC SendMessage calls to the proxy (the v2 stubs, no client library around
  them); ledgermq's own 4.x client straight to the master (the baseline). The proxy's added
  cost per message is raw gRPC p50 minus direct p50;
- failover: the official client sends in a steady loop (one send every 10 ms) while the group's
  master is SIGKILLed; failed-send time is how long sends failed (first failure to first
  success after it), and the longest gap between two successful sends is reported beside it.

The official client runs in its own venv (``~/.cache/ledgermq/rocketmq5-client``, created on
first use: it installs as ``rocketmq``, as the C++ client does).

    python bench/proxy_bench.py [--quick] [--sends N] [--kills K]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import venv
from pathlib import Path
from typing import Any

import grpc

from broker.localcluster import LocalCluster
from client import AdminClient, Producer
from proxy.protocol import pb, sgrpc, spb
from remoting.message import Message

CLIENT = "rocketmq-python-client==5.1.2"
VENV = Path(
    os.environ.get("LEDGERMQ_ROCKETMQ5_VENV", Path.home() / ".cache" / "ledgermq" / "rocketmq5-client")
)
TOPIC = "ProxyBench"
BODY = b"x" * 1024

DRIVER = r"""
import json, sys, time
from rocketmq import ClientConfiguration, Credentials, Message, Producer

endpoints, topic, mode, arg = sys.argv[1:5]
producer = Producer(ClientConfiguration(endpoints, Credentials(), request_timeout=3), (topic,))
producer.startup()


def msg():
    m = Message()
    m.topic, m.body = topic, b"x" * 1024
    return m


try:
    for _ in range(20):
        producer.send(msg())
    print("READY", flush=True)
    if mode == "latency":
        out = []
        for _ in range(int(arg)):
            t = time.perf_counter()
            producer.send(msg())
            out.append((time.perf_counter() - t) * 1000)
    else:  # loop: until the parent closes stdin's deadline file, one send every 10 ms
        out = []
        end = time.time() + float(arg)
        while time.time() < end:
            t = time.time()
            try:
                producer.send(msg())
                ok = True
            except Exception:
                ok = False
            out.append((t, time.time(), ok))
            time.sleep(max(0.0, 0.01 - (time.time() - t)))
finally:
    producer.shutdown()
print("RESULT " + json.dumps(out), flush=True)
"""


def official_python() -> Path:
    python = VENV / "bin" / "python"
    if (
        python.exists()
        and subprocess.run([str(python), "-c", "import rocketmq.v5"], capture_output=True).returncode == 0
    ):
        return python
    venv.create(VENV, with_pip=True, clear=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", CLIENT], check=True, timeout=900)
    return python


def p(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def start_cluster(base: Path) -> LocalCluster:
    cluster = LocalCluster(base, namesrv_port=0, proxy_port=0)
    cluster.start()
    deadline = time.monotonic() + 60
    while not asyncio.run(cluster.masters()):
        if time.monotonic() > deadline:
            raise SystemExit("no master within 60 s")
        time.sleep(0.2)

    async def create() -> None:
        async with AdminClient(cluster.namesrv_addr) as admin:
            await admin.update_topic(TOPIC, read_queue_nums=4, write_queue_nums=4)

    asyncio.run(create())
    with grpc.insecure_channel(cluster.proxy_addr) as ch:
        stub = sgrpc.MessagingServiceStub(ch)
        while True:
            try:
                r = stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=TOPIC)), timeout=3)
                if r.status.code == pb.Code.OK:
                    break
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the proxy never routed the topic")
            time.sleep(0.2)
    return cluster


def run_driver(python: Path, workdir: Path, endpoints: str, mode: str, arg: str, on_ready: Any = None) -> Any:
    script = workdir / "driver.py"
    script.write_text(DRIVER)
    proc = subprocess.Popen(
        [str(python), str(script), endpoints, TOPIC, mode, arg],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=workdir,
    )
    try:
        assert proc.stdout is not None
        result = None
        for line in proc.stdout:
            if line.startswith("READY") and on_ready is not None:
                on_ready()
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if result is None:
        raise SystemExit(f"the official client driver ({mode}) gave no result (exit {proc.returncode})")
    return result


def grpc_latencies(endpoint: str, n: int) -> list[float]:
    out = []
    with grpc.insecure_channel(endpoint) as ch:
        stub = sgrpc.MessagingServiceStub(ch)
        for i in range(n + 20):
            m = pb.Message(topic=pb.Resource(name=TOPIC), body=BODY)
            m.system_properties.message_id = f"01BENCH{os.getpid():08X}{i:010X}"
            m.system_properties.message_type = pb.MessageType.NORMAL
            t = time.perf_counter()
            r = stub.SendMessage(spb.SendMessageRequest(messages=[m]), timeout=5)
            if i >= 20:
                out.append((time.perf_counter() - t) * 1000)
            if r.status.code != pb.Code.OK:
                raise SystemExit(f"raw gRPC send failed: {r.status}")
    return out


def direct_latencies(namesrv: str, n: int) -> list[float]:
    async def run() -> list[float]:
        out = []
        async with Producer("proxy-bench-direct", namesrv) as producer:
            for i in range(n + 20):
                t = time.perf_counter()
                await producer.send(Message(TOPIC, BODY))
                if i >= 20:
                    out.append((time.perf_counter() - t) * 1000)
        return out

    return asyncio.run(run())


def failover(cluster: LocalCluster, python: Path, workdir: Path, seconds: float) -> dict[str, float]:
    """One master kill under the official client's steady send loop."""
    killed: list[float] = []
    before = asyncio.run(cluster.masters()).get("broker-a", "")

    def kill_soon() -> None:
        def later() -> None:
            time.sleep(seconds / 3)
            master = asyncio.run(cluster.masters()).get("broker-a", "")
            name = next(f"broker-a/{n}" for n, (b, _) in cluster.brokers["broker-a"].items() if b == master)
            killed.append(time.time())
            cluster.kill(name)

        threading.Thread(target=later, daemon=True).start()

    records = run_driver(python, workdir, cluster.proxy_addr, "loop", str(seconds), on_ready=kill_soon)
    kill_at = killed[0] if killed else float("nan")
    after = [r for r in records if r[0] >= kill_at - 0.5]
    failed = [r for r in after if not r[2]]
    ok_after = [r for r in after if r[2]]
    failed_s = 0.0
    if failed:
        first_fail = failed[0][0]
        recovered = next((r[1] for r in ok_after if r[0] > first_fail), float("nan"))
        failed_s = recovered - first_fail
    oks = [r[1] for r in records if r[2]]
    gaps = [b - a for a, b in zip(oks, oks[1:], strict=False) if b >= kill_at - 0.5]
    after_master = asyncio.run(cluster.masters()).get("broker-a", "")
    if not killed or after_master == before:
        raise SystemExit(
            f"the master was not replaced (killed: {bool(killed)}, master {before} -> {after_master})"
        )
    return {
        "master": f"{before} -> {after_master}",
        "failed_send_s": round(failed_s, 3),
        "max_gap_s": round(max(gaps, default=float("nan")), 3),
        "failed_sends": len(failed),
        "sends": len(records),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer sends, one short kill")
    ap.add_argument("--sends", type=int, default=0)
    ap.add_argument("--kills", type=int, default=0)
    a = ap.parse_args()
    sends = a.sends or (200 if a.quick else 1000)
    kills = a.kills or (1 if a.quick else 3)
    python = official_python()
    print(f"load before: {os.getloadavg()}", file=sys.stderr)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp:
        base = Path(tmp)
        cluster = start_cluster(base / "cluster")
        try:
            runs = 3
            official, raw, direct = [], [], []
            for _ in range(runs):  # interleaved, medians of the runs' p50s
                direct.append(statistics.median(direct_latencies(cluster.namesrv_addr, sends)))
                raw.append(statistics.median(grpc_latencies(cluster.proxy_addr, sends)))
                official.append(
                    statistics.median(run_driver(python, base, cluster.proxy_addr, "latency", str(sends)))
                )
            result.update(
                official_via_proxy_p50_ms=round(statistics.median(official), 3),
                grpc_via_proxy_p50_ms=round(statistics.median(raw), 3),
                direct_p50_ms=round(statistics.median(direct), 3),
                proxy_added_p50_ms=round(statistics.median(raw) - statistics.median(direct), 3),
                runs=runs,
                sends_per_run=sends,
            )
            print(f"send p50 per run (ms): official {official} grpc {raw} direct {direct}", file=sys.stderr)
        finally:
            cluster.stop()
        outcomes = []
        for k in range(kills):  # a fresh cluster per kill: the killed broker is not restarted
            cluster = start_cluster(base / f"failover{k}")
            try:
                outcomes.append(failover(cluster, python, base, 9.0 if a.quick else 12.0))
                print(f"kill {k + 1}: {outcomes[-1]}", file=sys.stderr)
            finally:
                cluster.stop()
        fails = [o["failed_send_s"] for o in outcomes]
        result.update(
            failover_failed_send_s_median=round(statistics.median(fails), 3),
            failover_failed_send_s_max=round(max(fails), 3),
            failover_max_gap_s_max=round(max(o["max_gap_s"] for o in outcomes), 3),
            failover_failed_sends=[o["failed_sends"] for o in outcomes],
            kills=kills,
            loadavg=[round(x, 2) for x in os.getloadavg()],
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
