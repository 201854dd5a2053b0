"""``ledgermq-admin`` through click's CliRunner, against the real nameserver and a fake broker group."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result
from client_fake_broker import FakeCluster

from client.admin import main

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def cluster() -> Iterator[FakeCluster]:
    c = FakeCluster({"broker-x": 2})
    try:
        yield c
    finally:
        c.close()


def cli(cluster: FakeCluster | None, *args: str, env: dict[str, str] | None = None) -> Result:
    argv = (["-n", cluster.namesrv_addr] if cluster is not None else []) + list(args)
    return CliRunner().invoke(main, argv, env=env or {}, catch_exceptions=False)


def test_no_nameserver_is_a_usage_error() -> None:
    r = cli(None, "cluster-list", env={"NAMESRV_ADDR": ""})
    assert r.exit_code == 2 and "no nameserver address" in r.output


def test_namesrv_from_environment(cluster: FakeCluster) -> None:
    r = cli(None, "cluster-list", env={"NAMESRV_ADDR": cluster.namesrv_addr})
    assert r.exit_code == 0, r.output
    assert "broker-x" in r.output


def test_cluster_list_and_broker_status(cluster: FakeCluster) -> None:
    r = cli(cluster, "cluster-list")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split() == ["#Cluster", "#BrokerName", "#BID", "#Role", "#Addr"]
    master = cluster.groups["broker-x"].nodes[0].addr
    assert any(line.split()[1:] == ["broker-x", "0", "MASTER", master] for line in lines[1:])
    assert any("SLAVE" in line for line in lines[1:])

    r = cli(cluster, "broker-status", "-b", master)
    assert r.exit_code == 0, r.output
    assert re.search(r"^role\s+: MASTER$", r.output, re.M) and "ledger.commitIndex" in r.output
    r = cli(cluster, "broker-status", "-c", "FakeCluster", "--json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.output)) == 2
    r = cli(cluster, "broker-status", "-c", "NoCluster")
    assert r.exit_code == 1 and "cluster NoCluster is not known" in r.output


def test_topic_lifecycle_and_messages(cluster: FakeCluster) -> None:
    r = cli(cluster, "update-topic", "-t", "AdminT", "-c", "FakeCluster", "-r", "2", "-w", "2")
    assert r.exit_code == 0, r.output
    assert "success" in r.output

    r = cli(cluster, "topic-route", "-t", "AdminT")
    assert r.exit_code == 0, r.output
    route = json.loads(r.output)
    assert route["queueDatas"][0]["writeQueueNums"] == 2
    assert "AdminT" in cli(cluster, "topic-list").output

    r = cli(cluster, "send-message", "-t", "AdminT", "-p", "hello", "-k", "order-1", "-c", "TagA", "-i", "1")
    assert r.exit_code == 0, r.output
    row = r.output.splitlines()[1].split()
    assert row[:3] == ["broker-x", "1", "0"] and row[4] == "SEND_OK"
    msg_id = row[3]

    r = cli(cluster, "query-msg-by-offset", "-t", "AdminT", "-b", "broker-x", "-i", "1", "-o", "0")
    assert r.exit_code == 0, r.output
    assert re.search(r"^Body:\s+hello$", r.output, re.M) and re.search(r"^Tags:\s+TagA$", r.output, re.M)

    r = cli(cluster, "query-msg-by-id", "-i", msg_id)
    assert r.exit_code == 0, r.output
    assert re.search(r"^Keys:\s+order-1$", r.output, re.M)

    r = cli(cluster, "query-msg-by-key", "-t", "AdminT", "-k", "order-1")
    assert r.exit_code == 0 and msg_id in r.output

    cli(cluster, "send-message", "-t", "AdminT", "-p", "two", "--count", "3")
    r = cli(cluster, "consume-message", "-t", "AdminT", "-c", "10")
    assert r.exit_code == 0, r.output
    assert r.output.count("body=") == 4 and "body=hello" in r.output
    r = cli(cluster, "consume-message", "-t", "AdminT", "-i", "1", "-o", "0", "-c", "1")
    assert r.output.count("body=") == 1

    r = cli(cluster, "get-consumer-offset", "-g", "nobody", "-t", "AdminT")
    assert r.exit_code == 0, r.output
    assert "Diff Total: 4" in r.output


def test_errors_are_one_line_and_exit_1(cluster: FakeCluster) -> None:
    r = cli(cluster, "topic-route", "-t", "Missing")
    assert r.exit_code == 1 and "no route info for topic Missing" in r.output
    r = cli(cluster, "query-msg-by-offset", "-t", "Missing", "-b", "broker-x", "-i", "0", "-o", "0")
    assert r.exit_code == 1
    r = cli(cluster, "query-msg-by-id", "-i", "not-an-id")
    assert r.exit_code == 1 and "expected 32 or 56 hex digits" in r.output


def test_retry_dlq_delay_and_transaction_commands(cluster: FakeCluster) -> None:
    g = cluster.groups["broker-x"]
    master = g.nodes[0].addr

    async def prepare() -> None:
        await g.ensure_topic("%RETRY%adm-g")
        await g.ensure_topic("%DLQ%adm-g")
        node = g.nodes[0]
        props = {"RETRY_TOPIC": "Orders", "ORIGIN_MESSAGE_ID": "ORIG1", "UNIQ_KEY": "R1"}
        node._store("%RETRY%adm-g", 0, 0, 1, props, b"try-again", 0, 2)
        node._store("%DLQ%adm-g", 0, 0, 1, {**props, "UNIQ_KEY": "D1"}, b"dead", 0, 16)
        g.state.delay_offsets = {1: 5, 3: 7}
        g.state.store_stats = {"pending_half_messages": 2, "scheduled_messages": 9}

    cluster.call(prepare())
    try:
        r = cli(cluster, "retry-messages", "-g", "adm-g")
        assert r.exit_code == 0, r.output
        row = r.output.splitlines()[1].split()
        assert row[3:6] == ["Orders", "2", "ORIG1"] and row[-1] == "try-again"
        r = cli(cluster, "retry-messages", "-g", "adm-g", "--dlq")
        assert r.exit_code == 0 and "dead" in r.output and " 16 " in r.output

        r = cli(cluster, "delay-offsets", "-c", "FakeCluster")
        assert r.exit_code == 0, r.output
        lines = r.output.splitlines()
        assert lines[0].split() == ["#Broker", "#Level", "#Delivered", "#Max", "Offset", "#Pending", "#Error"]
        assert lines[1].split()[:3] == ["broker-x", "1", "5"] and lines[2].split()[:3] == [
            "broker-x",
            "3",
            "7",
        ]
        r = cli(cluster, "delay-offsets", "-b", master)
        assert r.exit_code == 0 and master in r.output

        r = cli(cluster, "transaction-status")
        assert r.exit_code == 0, r.output
        assert re.search(r"^pending_half_messages\s+: 2$", r.output, re.M)
        assert re.search(r"^scheduled_messages\s+: 9$", r.output, re.M)
        g.state.store_stats = {}
        r = cli(cluster, "transaction-status", "-b", master)
        assert r.exit_code == 0 and "reports no transaction" in r.output
        r = cli(cluster, "transaction-status", "-b", master, "-c", "FakeCluster")
        assert r.exit_code == 2
    finally:
        g.state.delay_offsets, g.state.store_stats = {}, {}
