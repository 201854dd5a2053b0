"""The harness's parts on their own: the history recorder, the link proxy, partition shapes."""

from __future__ import annotations

import asyncio
import json
import random
import threading

import pytest

from jepsen.checker.recovery import HEALS
from jepsen.faults.partition import bridge, cut_between, majorities_ring
from jepsen.faults.registry import FAULTS
from jepsen.history import History, HistoryMisuse, read_history, validate_history
from jepsen.net.proxy import LinkProxy


def test_history_lines_follow_the_contract(tmp_path):
    path = tmp_path / "h.jsonl"
    with History(path) as h:
        p = h.new_process()
        h.invoke(p, "send", 7, key="0")
        h.complete(p, "ok", "send", 7, key="0", offset=3, node="n1")
        h.nemesis_start("kill", {"nodes": ["n1"]})
        h.nemesis_end("kill", {"nodes": ["n1"]})
        h.invoke(p, "poll", {"from": 0, "max": 2}, key="0")
        h.complete(p, "info", "poll", None, key="0", error="timed out")
    events = read_history(path)
    assert [e["index"] for e in events] == list(range(6))
    assert all(isinstance(e["time"], int) for e in events)
    assert events[1] == {
        "index": 1,
        "time": events[1]["time"],
        "process": 0,
        "type": "ok",
        "f": "send",
        "key": "0",
        "value": 7,
        "offset": 3,
        "node": "n1",
    }
    assert events[2]["process"] == "nemesis" and events[2]["type"] == "info"
    assert events[5]["error"] == "timed out" and "offset" not in events[5]
    assert validate_history(events) == []


def test_history_refuses_what_the_contract_forbids(tmp_path):
    with History(tmp_path / "h.jsonl") as h:
        p = h.new_process()
        h.invoke(p, "send", 1)
        with pytest.raises(HistoryMisuse, match="outstanding"):
            h.invoke(p, "send", 2)  # two operations at once
        with pytest.raises(HistoryMisuse, match="invoked"):
            h.complete(p, "ok", "poll")  # completion of another f
        h.complete(p, "info", "send", 1)
        with pytest.raises(HistoryMisuse, match="reused"):
            h.invoke(p, "send", 3)  # a process after info
        with pytest.raises(HistoryMisuse, match="not allocated"):
            h.invoke(99, "send", 3)
        h.nemesis_start("pause")
        with pytest.raises(HistoryMisuse, match="open"):
            h.nemesis_start("kill")
        with pytest.raises(HistoryMisuse):
            h.nemesis_end("kill")
        h.nemesis_end("pause")
        assert h.new_process() == p + 1  # ids are never recycled


def test_history_is_ordered_under_concurrent_writers(tmp_path):
    path = tmp_path / "h.jsonl"
    with History(path) as h:

        def writer() -> None:
            for i in range(200):
                p = h.new_process()
                h.invoke(p, "send", i)
                h.complete(p, "ok", "send", i, offset=i)

        threads = [threading.Thread(target=writer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    events = read_history(path)
    assert len(events) == 1600
    assert validate_history(events) == []
    assert [e["index"] for e in events] == list(range(1600))
    times = [e["time"] for e in events]
    assert times == sorted(times)


def test_validator_reports_broken_histories():
    ok = {"time": 1, "f": "send", "key": "0"}
    bad = [
        {**ok, "index": 0, "process": 0, "type": "invoke"},
        {**ok, "index": 0, "process": 0, "type": "info"},  # index does not increase
        {**ok, "index": 2, "process": 0, "type": "invoke"},  # reuse after info
        {**ok, "index": 3, "process": 1, "type": "ok"},  # completion without invoke
        {**ok, "index": 4, "process": "nemesis", "type": "info", "f": "kill"},  # never ended
    ]
    problems = validate_history(bad)
    assert any("does not increase" in p for p in problems)
    assert any("reused after an info" in p for p in problems)
    assert any("without invoke" in p for p in problems)
    assert any("never ended" in p for p in problems)


def test_partition_shapes_for_three_nodes():
    nodes = ["n1", "n2", "n3"]
    assert cut_between([["n1"], ["n2", "n3"]]) == {("n1", "n2"), ("n2", "n1"), ("n1", "n3"), ("n3", "n1")}
    for seed in range(20):
        rng = random.Random(seed)
        ring = majorities_ring(nodes, rng, directed=True)
        # every node drops traffic from exactly one other node, and hears from a majority
        assert sorted(dst for _, dst in ring) == nodes
        assert all((b, a) not in ring for a, b in ring)  # one-way cuts only
        sym = majorities_ring(nodes, rng, directed=False)
        assert len(sym) == 2 and all((b, a) in sym for a, b in sym)
        cut, middle = bridge(nodes, rng)
        assert middle not in {x for link in cut for x in link}
        assert len(cut) == 2
    five = [f"n{i}" for i in range(1, 6)]
    sym5 = majorities_ring(five, random.Random(1), directed=False)
    for n in five:  # each node still reaches two others: itself plus two is a majority of five
        assert sum(1 for m in five if m != n and (n, m) not in sym5) == 2


def test_link_proxy_cuts_and_heals_real_connections(tmp_path):
    async def scenario() -> None:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(100):
                w.write(data)
            w.close()

        srv = await asyncio.start_server(echo, "127.0.0.2", 0)
        port = srv.sockets[0].getsockname()[1]
        proxy = LinkProxy({"a": "127.0.0.1:9", "b": f"127.0.0.2:{port}"}, log_path=tmp_path / "proxy.log")
        try:
            host, p = proxy.address("a", "b").rsplit(":", 1)
            assert host == "127.0.0.2"  # the link listens on the destination's address
            r, w = await asyncio.open_connection(host, int(p))
            w.write(b"ping\n")
            assert await asyncio.wait_for(r.readline(), 5) == b"ping\n"
            reply = await asyncio.to_thread(proxy.set_cut, {("a", "b")})
            assert reply["cut"] == ["a->b"] and reply["closed"] == 1
            assert await asyncio.wait_for(r.read(10), 5) == b""  # the open connection died
            r2, w2 = await asyncio.open_connection(host, int(p))
            assert await asyncio.wait_for(r2.read(10), 5) == b""  # new ones are refused
            await asyncio.to_thread(proxy.heal)
            r3, w3 = await asyncio.open_connection(host, int(p))
            w3.write(b"again\n")
            assert await asyncio.wait_for(r3.readline(), 5) == b"again\n"
            stats = await asyncio.to_thread(proxy.stats)
            assert stats["a->b"]["refused"] >= 1 and stats["b->a"]["accepted"] == 0
            for wr in (w, w2, w3):
                wr.close()
        finally:
            proxy.close()
            srv.close()
        assert proxy.proc.poll() is not None

    asyncio.run(scenario())


def test_link_proxy_exits_with_its_controller(tmp_path):
    proxy = LinkProxy({"a": "127.0.0.1:9", "b": "127.0.0.2:9"})
    pid = proxy.proc.pid
    proxy.close()
    assert proxy.proc.returncode is not None, f"proxy {pid} still running"
    assert json.loads(json.dumps(list(proxy.addresses.values())))  # it had bound both links


def test_the_default_run_stays_light_and_rate_max_loads_every_core():
    import math
    import os

    from jepsen.run.config import RunConfig, resolve_load

    light = resolve_load(RunConfig())
    assert (light.workers, light.clients, light.send_batch) == (0, 5, 1)  # one process, one shard
    full = resolve_load(RunConfig(workload="queue", rate=math.inf))
    assert full.workers == (os.cpu_count() or 1) and full.send_batch > 1
    assert full.clients >= 64 * full.workers  # closed-loop clients enough to fill batches
    explicit = resolve_load(RunConfig(workload="log", rate=math.inf, workers=3, clients=7))
    assert (explicit.workers, explicit.clients, explicit.send_batch) == (3, 7, 1)


def test_free_port_never_hands_out_a_port_twice():
    """A cluster's ports are picked and released before its processes bind them; the OS offers
    released ports again, so without a memory of what was handed out, two nodes share a port."""
    from common.process import free_port

    ports = [free_port("127.0.0.1") for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_broker_group_names_every_port_it_will_listen_on(tmp_path):
    """What the link proxy must not take: nameservers, and each broker's main, fast and ledger ports."""
    from broker.localgroup import LocalBrokerGroup

    group = LocalBrokerGroup(tmp_path)
    addrs = group.listen_addresses()
    assert len(addrs) == len(set(addrs)) == 2 + 3 * 3
    for nid in group.node_ids:
        host, port = group.broker_addr[nid].rsplit(":", 1)
        assert {group.broker_addr[nid], f"{host}:{int(port) - 2}", group.ledger_addr[nid]} <= set(addrs)
    assert set(group.ns_addr.values()) <= set(addrs)


def test_a_leader_that_never_comes_is_explained_by_the_nodes_logs(tmp_path):
    """Brokers that cannot bind their ports exit; the harness's start-up wait says so, with each
    one's own last word, instead of only that no leader came."""
    import socket

    from jepsen.systems.broker import LocalBrokerBackend

    backend = LocalBrokerBackend(tmp_path / "cluster")
    held = []
    try:
        for nid in backend.nodes:
            host, port = backend.group.ledger_addr[nid].rsplit(":", 1)
            s = socket.socket()
            held.append(s)
            s.bind((host, int(port)))
            s.listen()
        backend.start()
        with pytest.raises(TimeoutError) as err:
            asyncio.run(backend.wait_for_leader(6))
    finally:
        backend.stop()
        for s in held:
            s.close()
    text = str(err.value)
    for nid in backend.nodes:
        host, port = backend.group.ledger_addr[nid].rsplit(":", 1)
        assert f"{nid} exited with code 1" in text, text
        assert f"cannot listen on {host}:{port}" in text and "address already in use" in text, text


def test_a_backend_status_client_is_kept_per_loop_and_closed_in_its_own() -> None:
    """Status polls share one client per event loop; the run closes it inside that loop."""
    from jepsen.systems.base import LoopClient
    from remoting import RemotingClient, RemotingCommand, RemotingServer

    async def serve_and_poll(held: LoopClient[RemotingClient]) -> tuple[bool, list[str], list[str]]:
        server = RemotingServer("127.0.0.1", 0)
        await server.start()
        try:
            client = held.get()
            same = held.get() is client
            # an unknown request code: the server answers it as not supported; the connection stays
            await client.invoke_sync(server.address, RemotingCommand.request(999, {}), timeout_s=2.0)
            before = client.connected_addresses
            await held.close()
            return same, before, client.connected_addresses
        finally:
            await server.stop()

    made: list[RemotingClient] = []

    def make() -> RemotingClient:
        made.append(RemotingClient())
        return made[-1]

    held = LoopClient(make)
    same, before, after = asyncio.run(serve_and_poll(held))
    assert same and len(before) == 1 and after == []
    asyncio.run(serve_and_poll(held))  # a new loop gets a new client
    assert len(made) == 2 and made[0] is not made[1]


def test_every_fault_records_what_the_checker_reads_as_a_fault() -> None:
    """The checker knows a fault only from its history operations: each fault's breaking
    operation must be one the checker opens a fault window on, healed by the operation the
    fault records to stop it (a fault that heals nothing is its own window)."""
    for name, fault in FAULTS.items():
        d = fault.describe()
        assert d.name == name and d.summary, name
        if d.heals is None:
            assert d.breaks not in HEALS, name
        else:
            assert d.heals in HEALS.get(d.breaks, ()), (name, d)


def test_a_run_records_parquet_unless_told_otherwise(monkeypatch, tmp_path):
    """``--history-format`` wins over ``$LEDGERMQ_HISTORY_FORMAT``, which wins over Parquet;
    a bad value is one clear refusal, not a traceback."""
    from click.testing import CliRunner

    from jepsen.history import FORMAT_ENV, history_format, shard_path
    from jepsen.run.config import RunConfig
    from jepsen.run.run_cli import run as run_command
    from jepsen.run.validate import validated
    from jepsen.systems.base import Unsupported

    monkeypatch.delenv(FORMAT_ENV, raising=False)
    assert history_format() == "parquet" and validated(RunConfig()).history_format == "parquet"
    assert shard_path(tmp_path, 3).name == "shard-03.parquet"
    monkeypatch.setenv(FORMAT_ENV, "jsonl")
    assert validated(RunConfig()).history_format == "jsonl"
    assert validated(RunConfig(history_format="parquet")).history_format == "parquet"
    assert shard_path(tmp_path, 0).name == "shard-00.jsonl"
    monkeypatch.setenv(FORMAT_ENV, "csv")
    with pytest.raises(Unsupported, match="LEDGERMQ_HISTORY_FORMAT='csv'.*one of jsonl, parquet"):
        validated(RunConfig())
    res = CliRunner().invoke(run_command, ["--history-format", "csv", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "csv" in res.output and "Traceback" not in res.output, res.output


def test_a_fault_cancelled_mid_action_is_closed_so_the_heal_is_recorded(tmp_path):
    """A run that stops while a fault's action is still running (its load ended, or a worker
    failed) cancels the fault; the heal that follows must still be recordable."""
    from jepsen.faults.base import FaultContext

    path = tmp_path / "h.jsonl"
    release = threading.Event()

    async def scenario() -> None:
        with History(path) as h:
            ctx = FaultContext(None, h, random.Random(1), lose_data="truncate")  # type: ignore[arg-type]
            fault = asyncio.create_task(ctx.op("restart", "n1", lambda: release.wait(5.0)))
            for _ in range(200):  # until the action runs in its thread
                if h.nemesis_events:
                    break
                await asyncio.sleep(0.005)
            fault.cancel()
            with pytest.raises(asyncio.CancelledError):
                await fault
            release.set()
            assert await ctx.op("heal", None, lambda: "healed") == "healed"

    asyncio.run(scenario())
    nemesis = [e for e in read_history(path) if e["process"] == "nemesis"]
    assert [(e["f"], e.get("error")) for e in nemesis] == [
        ("restart", None),
        ("restart", "cancelled: outcome unknown"),
        ("heal", None),
        ("heal", None),
    ]


def test_a_parquet_part_whose_reads_all_came_back_empty_is_written(tmp_path):
    """During a fault a part may hold only empty reads: counted rows with no pair at all. Such
    a part once failed to convert, and the error ended the run at the next roll."""
    folder = tmp_path / "history"
    folder.mkdir()
    h = History(folder / "shard-00.parquet")
    p = h.new_process()
    h.invoke(p, "poll", {"from": 0, "max": 5}, key="k")
    h.complete(p, "ok", "poll", [], key="k")
    h.nemesis_start("kill", {"nodes": ["n1"]})  # a fault's event closes the part at once
    h.nemesis_end("kill", {"nodes": ["n1"]})
    h.invoke(p, "poll", {"from": 0, "max": 5}, key="k")
    h.complete(p, "ok", "poll", [[0, 7]], key="k")
    h.close()
    reads = [e["value"] for e in read_history(folder) if e["type"] == "ok"]
    assert reads == [[], [[0, 7]]]
