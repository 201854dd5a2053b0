"""``broker local-cluster``: RocketMQ's quick start for ledgermq, driven as a user would."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from client import Producer, PullConsumer
from client.errors import RouteNotFoundError
from remoting.message import Message

pytestmark = pytest.mark.slow


def _listening(addr: str) -> bool:
    host, port = addr.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, int(port))) == 0


def test_local_cluster_prints_its_nameserver_serves_auto_created_topics_and_stops_on_sigterm(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker",
            "local-cluster",
            "--groups",
            "2",
            "--dir",
            str(tmp_path),
            "--namesrv-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        assert first.startswith("namesrv=127.0.0.1:"), first
        namesrv = first.split("=", 1)[1]
        lines: list[str] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"local-cluster exited early: {lines}"
            lines.append(line.strip())
            if line.startswith("ready:"):
                break
        masters = {ln.split()[0]: ln.split()[1].split("=")[1] for ln in lines if " master=" in ln}
        assert set(masters) == {"broker-a", "broker-b"}, lines

        async def produce_and_consume() -> list[bytes]:
            # A topic nobody created: RocketMQ 4.x creates it on its first send (via TBW102's route).
            async with Producer("quick-pg", namesrv) as producer:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        result = await producer.send(Message("QuickStart", b"hello ledgermq", tags="TagA"))
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.5)
            consumer = PullConsumer("quick-cg", namesrv)
            await consumer.start()
            try:
                for _ in range(60):
                    try:  # the broker registers the new topic's route just after creating it
                        found = await consumer.fetch_queues("QuickStart")
                    except RouteNotFoundError:
                        found = []
                    queues = [q for q in found if q.queue_id == result.queue_id]
                    queue = next((q for q in queues if q.broker_name == result.broker_name), None)
                    if queue is not None:
                        pulled = await consumer.pull(queue, result.queue_offset, 1)
                        return [m.body for m in pulled.messages]
                    await asyncio.sleep(0.5)
                return []
            finally:
                await consumer.shutdown()

        assert asyncio.run(produce_and_consume()) == [b"hello ledgermq"]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0 and out.strip().endswith("stopped"), out
        assert not _listening(namesrv) and not any(_listening(a) for a in masters.values())
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
