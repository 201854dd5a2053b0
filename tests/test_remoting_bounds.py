"""Every remoting listener is bounded: connection floods, slowloris, idle connections,
half-sent frames, heartbeat growth and long polls, probed against real processes over real
sockets (a nameserver child for the listener bounds, a one-broker group for the broker tables).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.localgroup import LocalBrokerGroup
from client.producer import Producer
from common.process import write_toml
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.message import Message
from remoting.protocol import encode_command

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parent.parent


class Namesrv:
    """``python -m namesrv -c <toml>`` on a free loopback port; stopped by PID."""

    def __init__(self, tmp: Path, **settings: Any) -> None:
        self.log_path = tmp / "namesrv.log"
        conf = tmp / "namesrv.toml"
        write_toml(conf, {"listen_host": "127.0.0.1", "listen_port": 0, **settings})
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "namesrv", "-c", str(conf)],
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.port = self._wait_started()
        self.addr = f"127.0.0.1:{self.port}"

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def _wait_started(self, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in self.records():
                if rec.get("msg") == "namesrv started":
                    return int(rec["listen_port"])
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"namesrv did not start: {self.log_path.read_text()}")

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


@pytest.fixture
def namesrv_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[Namesrv] = []

    def make(**settings: Any) -> Namesrv:
        d = tmp_path / f"ns{len(started)}"
        d.mkdir()
        ns = Namesrv(d, **settings)
        started.append(ns)
        return ns

    yield make
    for ns in started:
        ns.stop()


def route_request() -> bytes:
    cmd = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    cmd.opaque = 1
    return encode_command(cmd)


def closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes ``sock`` within ``within_s`` (EOF or reset), reading anything it sends."""
    deadline = time.monotonic() + within_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True


async def topic_list(client: RemotingClient, addr: str) -> RemotingCommand:
    return await client.invoke_sync(
        addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 3.0
    )


def test_connection_flood_refused_past_the_limit(namesrv_factory: Any) -> None:
    ns = namesrv_factory(max_connections=20, handshake_timeout_s=3.0)

    async def scenario() -> None:
        async with RemotingClient() as client:
            assert (await topic_list(client, ns.addr)).is_success  # connected before the flood
            flood = []
            try:
                for _ in range(60):
                    s = socket.create_connection(("127.0.0.1", ns.port), timeout=2)
                    flood.append(s)
                await asyncio.sleep(0.5)
                refused = sum(closed_by_peer(s, 0.05) for s in flood)
                # 19 slots were left after the client's own connection; the rest are closed at once
                assert refused == 60 - 19, refused
                resp = await topic_list(client, ns.addr)  # the established client keeps working
                assert resp.is_success
                # the flood's idle sockets never send a frame: the handshake timeout frees their slots
                await asyncio.sleep(3.5)
                assert all(closed_by_peer(s, 0.05) for s in flood)
            finally:
                for s in flood:
                    s.close()
        async with RemotingClient() as fresh:  # a new client gets in once the flood is gone
            assert (await topic_list(fresh, ns.addr)).is_success

    asyncio.run(asyncio.wait_for(scenario(), 30))
    msgs = [r.get("msg") for r in ns.records()]
    assert "connection refused: max_connections reached" in msgs
    assert "closing connection: no complete frame within handshake_timeout_s" in msgs


def test_slowloris_and_idle_connections_are_closed(namesrv_factory: Any) -> None:
    ns = namesrv_factory(handshake_timeout_s=1.0, idle_timeout_s=2.0)
    with socket.create_connection(("127.0.0.1", ns.port), timeout=2) as slow:
        slow.sendall(route_request()[:5])  # half a prefix, then nothing
        started = time.monotonic()
        assert closed_by_peer(slow, 4.0)
        assert time.monotonic() - started < 3.0
    with socket.create_connection(("127.0.0.1", ns.port), timeout=2) as idle:
        idle.sendall(route_request())
        assert idle.recv(8)  # answered: a working connection...
        started = time.monotonic()
        assert closed_by_peer(idle, 5.0)  # ...closed once silent for idle_timeout_s
        assert 1.0 < time.monotonic() - started < 4.5


def test_half_sent_frames_do_not_grow_memory(namesrv_factory: Any) -> None:
    cap = 8 << 20
    ns = namesrv_factory(max_buffered_frame_bytes=cap, handshake_timeout_s=60.0)
    body = 4 * 1024 * 1024 - 1024  # under max_body_bytes, so each frame would be buffered whole
    cmd = RemotingCommand.request(RequestCode.PUT_KV_CONFIG, {"namespace": "x", "key": "k", "value": "v"})
    frame = encode_command(cmd)
    total, word = struct.unpack(">II", frame[:8])
    header = frame[8:]
    prefix = struct.pack(">II", total + body, word) + header
    chunk = b"\0" * (body - 4096)  # all but the last 4 KiB of the body
    time.sleep(0.3)
    before = ns.rss_kib()
    socks = []
    try:
        for _ in range(30):  # 30 x ~4 MiB = ~120 MiB if nothing bounded it
            s = socket.create_connection(("127.0.0.1", ns.port), timeout=5)
            socks.append(s)
            try:
                s.sendall(prefix + chunk)
            except OSError:
                pass  # closed by the server while we were still sending: what the cap does
        time.sleep(1.0)
        grown_mib = (ns.rss_kib() - before) / 1024
        closed = sum(closed_by_peer(s, 0.2) for s in socks)
    finally:
        for s in socks:
            s.close()
    assert closed >= 25, closed  # only about cap / 4 MiB of them may hold a frame
    assert grown_mib < 40, f"RSS grew {grown_mib:.1f} MiB"

    async def still_serves() -> RemotingCommand:
        async with RemotingClient() as client:
            return await topic_list(client, ns.addr)

    assert asyncio.run(still_serves()).is_success


# --- broker tables ------------------------------------------------------------------------------


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBrokerGroup]:
    g = LocalBrokerGroup(
        tmp_path,
        brokers=1,
        nameservers=1,
        topics=("BoundTopic:1",),
        settings={
            "max_heartbeat_clients": 200,
            "max_suspended_pulls": 3,
            "dedup_window": 500,
            "register_interval_s": 10,
        },
    )
    g.start()
    try:
        asyncio.run(g.wait_for_master(timeout=40))
        yield g
    finally:
        g.stop()


def _broker_rss_kib(g: LocalBrokerGroup) -> int:
    pid = g.pid(g.name_of("n1"))
    assert pid is not None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_heartbeat_table_and_long_polls_are_bounded(broker: LocalBrokerGroup) -> None:
    addr = broker.broker_addr["n1"]

    async def scenario() -> None:
        async with RemotingClient() as client:
            codes: dict[int, int] = {}
            rss0 = _broker_rss_kib(broker)
            for i in range(3000):  # made-up groups and clients, 15x the cap
                body = json.dumps(
                    {
                        "clientID": f"forged-{i}",
                        "consumerDataSet": [{"groupName": f"G{i}", "subscriptionDataSet": []}],
                        "producerDataSet": [],
                    }
                ).encode()
                resp = await client.invoke_sync(
                    addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=body), 3.0
                )
                codes[resp.code] = codes.get(resp.code, 0) + 1
            assert codes.get(ResponseCode.SUCCESS) == 200, codes
            assert codes.get(ResponseCode.SYSTEM_BUSY) == 2800, codes
            assert (_broker_rss_kib(broker) - rss0) / 1024 < 20
            # a known client's heartbeat is still accepted (it updates its own entry)
            again = json.dumps(
                {"clientID": "forged-7", "consumerDataSet": [{"groupName": "G7"}], "producerDataSet": []}
            ).encode()
            resp = await client.invoke_sync(addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=again))
            assert resp.code == ResponseCode.SUCCESS

            # long polls: 3 are held, the 4th and later are answered at once
            def pull(offset: int) -> RemotingCommand:
                return RemotingCommand.request(
                    RequestCode.PULL_MESSAGE,
                    {
                        "consumerGroup": "G1",
                        "topic": "BoundTopic",
                        "queueId": 0,
                        "queueOffset": offset,
                        "maxMsgNums": 1,
                        "sysFlag": 0x2,
                        "suspendTimeoutMillis": 3000,
                    },
                )

            held = [asyncio.ensure_future(client.invoke_sync(addr, pull(0), 10.0)) for _ in range(3)]
            await asyncio.sleep(0.5)
            started = time.monotonic()
            quick = await client.invoke_sync(addr, pull(0), 10.0)
            assert quick.code == ResponseCode.PULL_NOT_FOUND
            assert time.monotonic() - started < 1.0
            assert "max_suspended_pulls" in quick.remark
            assert not any(h.done() for h in held)
            for resp in await asyncio.gather(*held):
                assert resp.code == ResponseCode.PULL_NOT_FOUND

            # de-dup state is bounded by count: 2,000 unique keys from 20 idempotent producers, window 500
            for p in range(20):
                async with Producer(f"dedup-{p}", broker.namesrv_addr_str, idempotent=True) as producer:
                    await producer.send_batch([Message("BoundTopic", b"x") for _ in range(100)], queue_id=0)
            resp = await client.invoke_sync(
                addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
            )
            store = json.loads(bytes(resp.body))["store"]
            assert 0 < store["dedup_keys"] <= 500, store

    asyncio.run(asyncio.wait_for(scenario(), 90))


# --- rough edges ----------------------------------------------------------------------------------


def _run_cli(args: list[str], timeout: float = 40.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def _occupied_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def test_namesrv_port_in_use_is_one_line_and_exits() -> None:
    holder, port = _occupied_port()
    with holder:
        done = _run_cli(["namesrv", "--listen-host", "127.0.0.1", "--listen-port", str(port)])
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Traceback" not in out
    assert f"cannot start on 127.0.0.1:{port}" in done.stderr
    assert "in use" in done.stderr


def test_broker_port_in_use_is_one_line_and_stops_everything(tmp_path: Path) -> None:
    from common.process import free_port

    holder, port = _occupied_port()
    ledger_port = free_port()
    conf = tmp_path / "broker.toml"
    write_toml(
        conf,
        {
            "broker_name": "broker-x",
            "node_id": "n1",
            "group": [f"n1=127.0.0.1:{port}@127.0.0.1:{ledger_port}"],
            "namesrv_addr": ["127.0.0.1:9"],
            "data_dir": str(tmp_path / "data"),
            "cluster_secret": "s" * 32,
        },
    )
    with holder:
        started = time.monotonic()
        done = _run_cli(["broker", "-c", str(conf)])  # the timeout would raise if it hung at exit
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Traceback" not in out
    errors = [line for line in done.stderr.splitlines() if "cannot start broker broker-x/n1" in line]
    assert len(errors) == 1 and "in use" in errors[0], done.stderr
    assert time.monotonic() - started < 30
    with socket.socket() as probe:  # the ledger node that did start was stopped: its port is free
        probe.bind(("127.0.0.1", ledger_port))


def test_broker_listen_host_follows_its_group_address(tmp_path: Path) -> None:
    from broker.config import BrokerConfig
    from common.settings import ConfigError

    cfg = BrokerConfig(
        broker_name="b",
        node_id="n2",
        group=["n1=127.0.0.1:10911@127.0.0.1:20911", "n2=127.0.0.2:10911@127.0.0.2:20911"],
        namesrv_addr=["127.0.0.1:9876"],
        data_dir=str(tmp_path),
        cluster_secret="s" * 32,
    )
    cfg.validate()
    assert cfg.listen_host == "127.0.0.2"
    dup = BrokerConfig(
        broker_name="b",
        node_id="n1",
        group=["n1=127.0.0.1:10911@127.0.0.1:20911", "n2=127.0.0.1:10911@127.0.0.2:20911"],
        namesrv_addr=["127.0.0.1:9876"],
        data_dir=str(tmp_path),
        cluster_secret="s" * 32,
    )
    with pytest.raises(ConfigError, match="127.0.0.1:10911 given to more than one member"):
        dup.validate()


def test_namesrv_kv_put_not_persisted_is_not_served(tmp_path: Path, namesrv_factory: Any) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the KV directory should be")
    ns = namesrv_factory(kv_config_path=str(blocker / "kv" / "kvConfig.json"))

    async def scenario() -> None:
        async with RemotingClient() as client:
            put = RemotingCommand.request(
                RequestCode.PUT_KV_CONFIG, {"namespace": "ns", "key": "k", "value": "v"}
            )
            r = await client.invoke_sync(ns.addr, put, 3.0)
            assert r.code == ResponseCode.SYSTEM_ERROR and "not stored" in r.remark, r
            get = RemotingCommand.request(RequestCode.GET_KV_CONFIG, {"namespace": "ns", "key": "k"})
            r = await client.invoke_sync(ns.addr, get, 3.0)
            assert r.code == ResponseCode.QUERY_NOT_FOUND

    asyncio.run(asyncio.wait_for(scenario(), 20))
