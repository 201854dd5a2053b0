"""``--system ledgermq-proxy``: the queue workload through RocketMQ 5's gRPC proxy.

A short run with a leader kill: every operation goes through the proxies (SendMessage,
ReceiveMessage + AckMessage), the checker judges it like the broker system's, and the
proxies are gone afterwards. Then the client on a live group: a delivery whose answer was
lost (a receive made and never acked) holds the next poll until it comes back, so the poll
still starts where it was asked to; a lost ack's redelivery is not reported again, an acked
message coming back is.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from pathlib import Path

import pytest

from jepsen.history import read_history, validate_history
from jepsen.run.config import RunConfig
from jepsen.run.runner import run
from jepsen.systems.broker import TOPIC
from jepsen.systems.proxy_client import INVISIBLE_MS, ProxyQueueClient, _Group, queue_topic
from jepsen.systems.proxy_system import ProxyBrokerBackend

pytestmark = pytest.mark.slow


def _listening(addr: str) -> bool:
    host, port = addr.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, int(port))) == 0


def test_queue_through_the_proxies_across_leader_kills_is_valid(tmp_path: Path) -> None:
    result = run(
        RunConfig(
            out=tmp_path,
            progress=False,
            time=10,
            interval=2,
            rate=40,
            clients=4,
            seed=31,
            workload="queue",
            system="ledgermq-proxy",
            nemesis=("kill-leader",),
        )
    )
    events = read_history(result.history)
    assert validate_history(events) == []
    ops = [e for e in events if e["process"] != "nemesis"]
    assert {e.get("key") for e in ops} == {f"{TOPIC}/0", f"{TOPIC}/1"}
    assert {e.get("node") for e in ops if e["type"] == "ok"} <= {"grpc-proxy-1", "grpc-proxy-2"}
    assert sum(1 for e in events if e["process"] == "nemesis" and e["f"] == "kill") >= 1
    assert result.summary["leaders"]["leader_changes"] >= 1
    ok_sends = [e for e in ops if e["f"] == "send" and e["type"] == "ok"]
    read = [p for e in ops if e["f"] == "poll" and e["type"] == "ok" for p in e["value"]]
    drains = [e for e in ops if e["f"] == "drain" and e["type"] == "ok"]
    assert len(ok_sends) > 50 and len(read) > 50 and len(drains) == 2
    drained = {v for d in drains for _, v in d["value"]}
    assert {e["value"] for e in ok_sends} <= drained, "an acknowledged send is missing from the drains"
    counts = Counter(e["f"] for e in ops if e["type"] == "ok")
    assert counts["poll"] > 10, counts
    assert result.valid is True, (
        f"anomalies: {result.summary.get('check', {}).get('results', {}).get('anomalies')}"
    )
    cluster = result.run_dir / "cluster"
    for name in ("grpc-proxy-1", "grpc-proxy-2"):
        log = (cluster / name / "proxy.log").read_text(errors="replace")
        assert "proxy=" in log and "Traceback" not in log, log[-2000:]
        addr = log.split("proxy=", 1)[1].split()[0]
        assert not _listening(addr), f"{name} still serves {addr} after the run"


def test_a_lost_receive_holds_the_next_poll_until_it_comes_back(tmp_path: Path) -> None:
    backend = ProxyBrokerBackend(tmp_path, queues=1, proxies=1)
    backend.start()
    try:

        async def scenario() -> None:
            await backend.wait_for_leader(60)
            client = ProxyQueueClient(backend.proxy_addrs, backend.topic, 5.0)
            try:
                sent = [await client.send(0, v) for v in (10, 11, 12, 13)]
                assert sent == [0, 1, 2, 3]
                first = await client.poll(0, 0, 1)
                assert first == [(0, 10)]
                # the group at offset 1 receives 1..2 and the answer is "lost": not acked, in flight
                (group,) = client._free[(0, 1)]
                lost = await client._receive(group.name, queue_topic(backend.topic, 0), 2, 0)
                assert [o for o, _ in lost] == [1, 2]
                got = await client.poll(0, 1, 3)
                # 3 came at once, 1 and 2 only after their invisible time: the poll waited for them
                assert got == [(1, 11), (2, 12), (3, 13)], got
                assert await client.poll(0, 4, 3) == []  # the end: everything acked
                assert await client.drain(0) == [(0, 10), (1, 11), (2, 12), (3, 13)]
                topic = queue_topic(backend.topic, 0)
                # a poll returned 0..1 and their ack was lost: they come back below the next
                # poll's start, are acked again and not reported again
                lost_ack = _Group("jepsen-test-lost-ack", unconfirmed={0, 1})
                assert [o for o, _ in await client._receive(lost_ack.name, topic, 2, 0)] == [0, 1]
                client._free[(0, 2)] = [lost_ack]
                # a group whose acks of 0..1 were confirmed, yet they come back: reported first
                came_back = _Group("jepsen-test-came-back")
                assert [o for o, _ in await client._receive(came_back.name, topic, 2, 0)] == [0, 1]
                await asyncio.sleep(INVISIBLE_MS / 1000 + 0.5)  # both groups' deliveries expire
                before = client.redelivered
                assert await client.poll(0, 2, 4) == [(2, 12), (3, 13)]
                assert client.redelivered == before + 2
                client._free[(0, 2)] = [came_back]
                assert await client.poll(0, 2, 4) == [(0, 10), (1, 11), (2, 12), (3, 13)]
            finally:
                await client.close_all()

        asyncio.run(scenario())
    finally:
        backend.stop()
