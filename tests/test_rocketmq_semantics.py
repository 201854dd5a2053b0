"""Apache RocketMQ's C++ client (PyPI ``rocketmq`` 0.4.4) using RocketMQ's semantics past plain
send and pull against a ledgermq broker group: a listener that fails gets the message again
from the group's retry topic, delay levels hold a message until due, and an orderly consumer
locks its queues and consumes each in order. (Its 0.4.4 build has no transactional producer
and no SQL92 subscriptions: those are tested with raw requests in test_broker_semantics.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_rocketmq_compat import HOME, check_intact, drive

from broker.localgroup import LocalBrokerGroup

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TOPIC = "CppSemTopic"
LEVELS = "300ms 600ms 900ms 1200ms 1500ms 2s 3s 4s"


@pytest.fixture
def group(tmp_path: Path) -> Iterator[LocalBrokerGroup]:
    g = LocalBrokerGroup(
        tmp_path,
        topics=(f"{TOPIC}:4",),
        settings={"register_interval_s": 5, "message_delay_level": LEVELS, "lock_max_live_s": 60.0},
    )
    HOME["dir"] = tmp_path / "cpp-home"
    HOME["dir"].mkdir()
    g.start()
    try:
        asyncio.run(g.wait_for_master())
        time.sleep(1.0)  # the master registers its topics with both nameservers
        yield g
    finally:
        g.stop()


def test_cpp_listener_failures_are_retried_from_the_retry_topic(group: LocalBrokerGroup) -> None:
    """One message per queue, each failing its first delivery: the client sends it back, and it
    comes back from %RETRY%<group> after level 3 (900 ms here) with its count raised."""
    ns = group.namesrv_addrs[0]
    out = drive("produce", ns, TOPIC, "cpp-pg", "sync", 4, "retry")
    assert not out["errors"] and len(out["acked"]) == 4
    deliveries = drive("failing", ns, TOPIC, "cpp-retry", 4, 1, 90, timeout=150)["deliveries"]
    by_body: dict[str, list[dict]] = {}
    for d in deliveries:
        by_body.setdefault(d["body"], []).append(d)
    assert set(by_body) == {f"retry-{i}" for i in range(4)}
    for body, seen in by_body.items():
        assert len(seen) == 2, (body, seen)  # failed once, then consumed from the retry topic
        assert [d["reconsume"] for d in seen][0] == 0 and seen[1]["reconsume"] >= 1, (body, seen)
        assert seen[1]["at_ms"] - seen[0]["at_ms"] >= 800, (body, seen)
        check_intact(seen)  # keys, tag and property came back with the retry


def test_cpp_delay_levels_hold_messages_until_due(group: LocalBrokerGroup) -> None:
    ns = group.namesrv_addrs[0]
    acked = drive("delayed", ns, TOPIC, "cpp-pg", 6, 5)["acked"]  # level 5: 1.5 s
    assert len(acked) == 6 and all(a["status"] == 0 for a in acked)
    got = drive("push", ns, TOPIC, "cpp-delayed", 6, 30, timeout=90)["messages"]
    assert {m["body"] for m in got} >= {a["body"] for a in acked}
    check_intact(got)


def test_cpp_orderly_consumer_locks_its_queues_and_consumes_in_order(group: LocalBrokerGroup) -> None:
    ns = group.namesrv_addrs[0]
    out = drive("produce", ns, TOPIC, "cpp-pg", "sync", 40, "ordered")
    assert not out["errors"] and len(out["acked"]) == 40
    got = drive("orderly", ns, TOPIC, "cpp-orderly", 40, 60, timeout=120)["messages"]
    assert {m["body"] for m in got} == {a["body"] for a in out["acked"]}
    per_queue: dict[int, list[int]] = {}
    for m in got:
        per_queue.setdefault(m["queue_id"], []).append(m["queue_offset"])
    for q, offsets in per_queue.items():
        assert offsets == sorted(offsets), (q, offsets)  # each queue in order
