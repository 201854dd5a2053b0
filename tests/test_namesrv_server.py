"""Nameservers as real processes, fake brokers registering over real sockets.

Two independent nameserver processes (``python -m namesrv``) on 127.0.0.1 serve the whole
module; tests use their own broker and topic names so they do not see each other's state.
Processes are stopped by PID (SIGTERM, then SIGKILL) and every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from broker.registration import (
    BrokerIdentity,
    BrokerOuterAPI,
    PeriodicRegistration,
    RegisterBrokerResult,
    clamp_register_interval,
)
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol import FrameDecoder, encode_command
from remoting.route import ClusterInfo, TopicRouteData
from remoting.topic import DataVersion, TopicConfig, TopicConfigWrapper

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def reported_master(results: list[RegisterBrokerResult]) -> str | None:
    """The master address reported by the first nameserver that knows one."""
    return next((r.master_addr for r in results if r.ok and r.master_addr), None)


def run(coro: Awaitable[T], timeout: float = 30.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NamesrvProcess:
    """One ``python -m namesrv`` child; its JSON log goes to a file we poll for the start line."""

    def __init__(self, log_path: Path, *args: str) -> None:
        self.log_path = log_path
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "namesrv", "--listen-host", "127.0.0.1", "--listen-port", "0", *args],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.pid = self.proc.pid
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

    def _wait_started(self, timeout: float = 15.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in self.records():
                if rec.get("msg") == "namesrv started":
                    return int(rec["listen_port"])
            if self.proc.poll() is not None:
                raise RuntimeError(f"namesrv exited with {self.proc.returncode}: {self.log_path.read_text()}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"namesrv did not start within {timeout}s: {self.log_path.read_text()}")

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM by PID, SIGKILL if it lingers; returns the exit code."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def namesrvs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NamesrvProcess, NamesrvProcess]]:
    d = tmp_path_factory.mktemp("namesrv")
    ns1 = NamesrvProcess(d / "ns1.log")
    try:
        ns2 = NamesrvProcess(
            d / "ns2.log", "--order-message-enable", "--kv-config-path", str(d / "kv2" / "kvConfig.json")
        )
    except BaseException:
        ns1.stop()
        raise
    yield ns1, ns2
    ns1.stop()
    ns2.stop()


def topic_table(*names: str, version: int = 1, queues: int = 4) -> TopicConfigWrapper:
    return TopicConfigWrapper(
        {n: TopicConfig(n, queues, queues) for n in names}, DataVersion(1700000000000, version)
    )


async def route(client: RemotingClient, addr: str, topic: str) -> TopicRouteData | None:
    resp = await client.invoke_sync(
        addr, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    )
    if resp.code == ResponseCode.TOPIC_NOT_EXIST:
        assert resp.remark == f"No topic route info in name server for the topic: {topic}"
        return None
    resp.check_success(addr)
    return TopicRouteData.from_json(json.loads(resp.body))


async def wait_until(pred: Callable[[], Awaitable[bool]], timeout: float, what: str) -> float:
    """Poll ``pred`` every 50 ms up to ``timeout``; return the seconds it took."""
    t0 = time.monotonic()
    for _ in range(int(timeout / 0.05) + 1):
        if await pred():
            return time.monotonic() - t0
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# ---------------------------------------------------------------------------------------------
def test_brokers_register_to_both_nameservers_and_clients_find_routes(namesrvs) -> None:
    ns1, ns2 = namesrvs

    async def main() -> None:
        master = BrokerIdentity("cluster-r", "grp-r", "127.0.0.1:20911", 0, ha_server_addr="127.0.0.1:20912")
        slave = BrokerIdentity("cluster-r", "grp-r", "127.0.0.2:20911", 1)
        api = BrokerOuterAPI([ns1.addr, ns2.addr])
        results = await api.register_broker_all(master, topic_table("reg-orders", "reg-audit"))
        assert [(r.namesrv_addr, r.ok) for r in results] == [(ns1.addr, True), (ns2.addr, True)]
        assert reported_master(results) is None
        results = await api.register_broker_all(slave, topic_table("reg-orders"))
        assert all(r.ok and r.master_addr == master.broker_addr for r in results)
        assert all(r.ha_server_addr == "127.0.0.1:20912" for r in results)
        assert reported_master(results) == master.broker_addr

        async with RemotingClient() as client:
            for ns in (ns1, ns2):
                r = await route(client, ns.addr, "reg-orders")
                assert r is not None
                assert [(q.broker_name, q.write_queue_nums) for q in r.queue_datas] == [("grp-r", 4)]
                assert r.broker_datas[0].broker_addrs == {0: master.broker_addr, 1: slave.broker_addr}
                assert await route(client, ns.addr, "reg-missing") is None
            resp = await client.invoke_sync(
                ns1.addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
            )
            info = ClusterInfo.from_json(json.loads(resp.body))
            assert info.cluster_addr_table["cluster-r"] == {"grp-r"}
            resp = await client.invoke_sync(
                ns1.addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
            )
            assert {"reg-orders", "reg-audit"} <= set(json.loads(resp.body)["topicList"])
        await api.close()

    run(main())


def test_master_switch_same_address_new_id(namesrvs) -> None:
    ns1, ns2 = namesrvs

    async def main() -> None:
        n1 = BrokerIdentity("cluster-sw", "grp-sw", "127.0.0.1:21911", 0)
        n2 = BrokerIdentity("cluster-sw", "grp-sw", "127.0.0.1:22911", 1)
        api = BrokerOuterAPI([ns1.addr, ns2.addr])
        tc = topic_table("sw-orders")
        await api.register_broker_all(n1, tc)
        await api.register_broker_all(n2, tc)
        async with RemotingClient() as client:  # looked up (and cached) before the switch
            r = await route(client, ns1.addr, "sw-orders")
            assert r is not None and r.broker_datas[0].broker_addrs == {0: n1.broker_addr, 1: n2.broker_addr}
        # leader change: n2 becomes master (id 0), n1 follows with id self+1
        await api.register_broker_all(BrokerIdentity("cluster-sw", "grp-sw", n2.broker_addr, 0), tc)
        results = await api.register_broker_all(BrokerIdentity("cluster-sw", "grp-sw", n1.broker_addr, 2), tc)
        assert reported_master(results) == n2.broker_addr
        async with RemotingClient() as client:
            for ns in (ns1, ns2):
                r = await route(client, ns.addr, "sw-orders")
                assert r is not None and r.broker_datas[0].broker_addrs == {
                    0: n2.broker_addr,
                    2: n1.broker_addr,
                }
        await api.close()

    run(main())


def test_closed_broker_connection_removes_it_at_once(namesrvs) -> None:
    ns1, ns2 = namesrvs

    async def main() -> None:
        broker = BrokerIdentity("cluster-cc", "grp-cc", "127.0.0.1:23911", 0)
        api = BrokerOuterAPI([ns1.addr, ns2.addr])  # its own client: its own connections
        await api.register_broker_all(broker, topic_table("cc-orders"))
        async with RemotingClient() as client:
            assert await route(client, ns1.addr, "cc-orders") is not None
            await api.close()  # the broker process "dies": its connections close

            async def gone() -> bool:
                return all([await route(client, ns.addr, "cc-orders") is None for ns in (ns1, ns2)])

            took = await wait_until(gone, 3.0, "routes of a disconnected broker to disappear")
            assert took < 1.0  # removed on close, not by the 120 s expiry

    run(main())


def test_silent_broker_expires_while_a_heartbeating_one_stays(tmp_path) -> None:
    ns = NamesrvProcess(tmp_path / "ns-expiry.log", "--broker-expire-s", "1.0", "--scan-interval-s", "0.2")
    try:

        async def main() -> None:
            silent = BrokerIdentity("cluster-ex", "grp-silent", "127.0.0.1:24911", 0)
            alive = BrokerIdentity("cluster-ex", "grp-alive", "127.0.0.1:25911", 0)
            tc_alive = topic_table("ex-alive")
            # one client (connection) per broker, as with real broker processes: closing an expired
            # broker's connection would otherwise drop every broker registered over it
            silent_api, api = BrokerOuterAPI([ns.addr]), BrokerOuterAPI([ns.addr])
            await silent_api.register_broker_all(silent, topic_table("ex-silent"))
            rounds: list[Any] = []

            async def heartbeat(force: bool) -> None:
                # force=False: the data-version query (not a full registration) keeps it alive
                rounds.append(await api.register_if_needed(alive, tc_alive, force=force, timeout_s=1.0))

            periodic = PeriodicRegistration(
                heartbeat, interval_s=0.25, first_delay_s=0.0, force_register=False, min_interval_s=0.05
            )
            periodic.start()
            async with RemotingClient() as client:

                async def silent_gone() -> bool:
                    return await route(client, ns.addr, "ex-silent") is None

                took = await wait_until(silent_gone, 4.0, "the silent broker to expire")
                assert 0.8 <= took <= 3.0
                assert await route(client, ns.addr, "ex-alive") is not None
                assert rounds[0] is not None and all(
                    r is None for r in rounds[1:]
                )  # registered once, then skipped
                assert len(rounds) >= 4
            await periodic.stop()
            await api.close()
            await silent_api.close()

        run(main())
        expired = [r for r in ns.records() if r.get("msg", "").startswith("broker expired")]
        assert [r["broker_addr"] for r in expired] == ["127.0.0.1:24911"]
    finally:
        assert ns.stop() == 0


def test_registration_does_not_wait_for_a_dead_or_hung_nameserver(namesrvs) -> None:
    ns1, ns2 = namesrvs

    async def main() -> None:
        hung_conns: list[Any] = []

        async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            hung_conns.append(writer)
            await reader.read()  # swallow requests, never reply

        hung = await asyncio.start_server(never_answer, "127.0.0.1", 0)
        hung_addr = f"127.0.0.1:{hung.sockets[0].getsockname()[1]}"
        dead_addr = f"127.0.0.1:{free_port()}"
        api = BrokerOuterAPI([ns1.addr, dead_addr, hung_addr, ns2.addr])
        t0 = time.monotonic()
        results = await api.register_broker_all(
            BrokerIdentity("cluster-to", "grp-to", "127.0.0.1:26911", 0),
            topic_table("to-orders"),
            timeout_s=1.0,
        )
        took = time.monotonic() - t0
        assert took < 1.8
        by_addr = {r.namesrv_addr: r for r in results}
        assert by_addr[ns1.addr].ok and by_addr[ns2.addr].ok
        assert not by_addr[dead_addr].ok and "failed" in (by_addr[dead_addr].error or "")
        assert not by_addr[hung_addr].ok
        assert "RemotingTimeoutError" in (by_addr[hung_addr].error or "") or "timeout" in (
            by_addr[hung_addr].error or ""
        )
        # need_register counts an unreachable nameserver as "register again"
        assert await api.need_register(
            BrokerIdentity("cluster-to", "grp-to", "127.0.0.1:26911", 0),
            DataVersion(1700000000000, 1),
            timeout_s=0.5,
        )
        await api.close()
        for w in hung_conns:
            w.close()
        hung.close()
        await hung.wait_closed()

    run(main())


def test_data_version_query_lets_a_broker_skip_registration(namesrvs) -> None:
    ns1, ns2 = namesrvs

    async def main() -> None:
        broker = BrokerIdentity("cluster-dv", "grp-dv", "127.0.0.1:27911", 0)
        api = BrokerOuterAPI([ns1.addr, ns2.addr])
        v1 = topic_table("dv-orders", version=1)
        assert await api.need_register(broker, v1.data_version)  # never registered
        assert await api.register_if_needed(broker, v1, force=False) is not None
        assert not await api.need_register(broker, v1.data_version)
        assert await api.register_if_needed(broker, v1, force=False) is None
        v2 = topic_table("dv-orders", "dv-new", version=2)
        assert await api.need_register(broker, v2.data_version)
        assert await api.register_if_needed(broker, v2, force=False) is not None
        async with RemotingClient() as client:
            assert await route(client, ns2.addr, "dv-new") is not None
        assert [r.ok for r in await api.unregister_broker_all(broker)] == [True, True]
        async with RemotingClient() as client:
            assert await route(client, ns1.addr, "dv-orders") is None
        await api.close()

    run(main())


def test_kv_config_and_order_topic_conf(namesrvs) -> None:
    ns1, ns2 = namesrvs

    async def main() -> None:
        async with RemotingClient() as client:
            put = RemotingCommand.request(
                RequestCode.PUT_KV_CONFIG,
                {"namespace": "ORDER_TOPIC_CONFIG", "key": "kv-orders", "value": "grp-kv:4"},
            )
            (await client.invoke_sync(ns2.addr, put)).check_success()
            get = RemotingCommand.request(
                RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "kv-orders"}
            )
            assert (await client.invoke_sync(ns2.addr, get)).headers["value"] == "grp-kv:4"
            missing = await client.invoke_sync(ns1.addr, get)  # nameservers are independent
            assert missing.code == ResponseCode.QUERY_NOT_FOUND
            assert missing.remark == "No config item, Namespace: ORDER_TOPIC_CONFIG Key: kv-orders"
            lst = await client.invoke_sync(
                ns2.addr,
                RemotingCommand.request(
                    RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ORDER_TOPIC_CONFIG"}
                ),
            )
            assert json.loads(lst.body)["table"]["kv-orders"] == "grp-kv:4"

            api = BrokerOuterAPI([ns1.addr, ns2.addr], client)
            results = await api.register_broker_all(
                BrokerIdentity("cluster-kv", "grp-kv", "127.0.0.1:28911", 0), topic_table("kv-orders")
            )
            assert (
                results[1].kv_table.get("kv-orders") == "grp-kv:4" and "kv-orders" not in results[0].kv_table
            )
            r2 = await route(client, ns2.addr, "kv-orders")  # ns2 runs with --order-message-enable
            r1 = await route(client, ns1.addr, "kv-orders")
            assert r2 is not None and r2.order_topic_conf == "grp-kv:4"
            assert r1 is not None and r1.order_topic_conf is None

            delete = RemotingCommand.request(
                RequestCode.DELETE_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "kv-orders"}
            )
            (await client.invoke_sync(ns2.addr, delete)).check_success()
            assert (await client.invoke_sync(ns2.addr, get)).code == ResponseCode.QUERY_NOT_FOUND
            r2 = await route(client, ns2.addr, "kv-orders")  # the cached route must not keep the old entry
            assert r2 is not None and r2.order_topic_conf is None

    run(main())


def test_bad_requests_get_clear_answers_and_the_server_keeps_serving(namesrvs) -> None:
    ns1, _ = namesrvs

    async def main() -> None:
        async with RemotingClient() as client:
            resp = await client.invoke_sync(ns1.addr, RemotingCommand.request(9999))
            assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "not supported" in resp.remark

            hdr = BrokerIdentity("cluster-bad", "grp-bad", "127.0.0.1:29911", 0).headers()
            cases: list[tuple[dict[str, Any], bytes, str]] = [
                (
                    {k: v for k, v in hdr.items() if k != "brokerName"},
                    b"",
                    "required header 'brokerName' is missing",
                ),
                ({**hdr, "brokerAddr": "nowhere"}, b"", "expected host:port"),
                ({**hdr, "brokerId": -1}, b"", "'brokerId'=-1 out of range"),
                (hdr, b"{oops", "REGISTER_BROKER: body is not valid UTF-8 JSON"),
                (
                    hdr,
                    json.dumps({"topicConfigTable": {"t": {"topicName": "t", "perm": "rw"}}}).encode(),
                    "REGISTER_BROKER body.topicConfigTable.t.perm must be an integer",
                ),
                (
                    hdr,
                    json.dumps({"topicConfigTable": {"a b": {"topicName": "a b"}}}).encode(),
                    "may only contain letters",
                ),
                (
                    {**hdr, "compressed": True},
                    zlib.compress(b" " * (70 * 1024 * 1024), 9),
                    "compressed body expands past the 67108864-byte limit",
                ),
            ]
            for headers, body, reason in cases:
                resp = await client.invoke_sync(
                    ns1.addr, RemotingCommand.request(RequestCode.REGISTER_BROKER, headers, body)
                )
                assert resp.code == ResponseCode.BAD_REQUEST, (headers, resp)
                assert reason in resp.remark, resp.remark
            resp = await client.invoke_sync(
                ns1.addr, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "x" * 200})
            )
            assert resp.code == ResponseCode.BAD_REQUEST and "longer than 127" in resp.remark

            # raw garbage: that connection is dropped ...
            reader, writer = await asyncio.open_connection("127.0.0.1", ns1.port)
            writer.write(b"\x16\x03\x01\x02\x00" + b"\x00" * 64)  # a TLS ClientHello, say
            assert await asyncio.wait_for(reader.read(), 3.0) == b""
            writer.close()
            # ... an oversize body is refused on its own connection, which stays usable ...
            reader, writer = await asyncio.open_connection("127.0.0.1", ns1.port)
            big = RemotingCommand.request(RequestCode.REGISTER_BROKER, hdr, b"x" * (5 * 1024 * 1024))
            big.opaque = 5
            ok = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
            ok.opaque = 6
            writer.write(encode_command(big) + encode_command(ok))
            dec, got = FrameDecoder(), []
            for _ in range(200):
                if len(got) >= 2:
                    break
                chunk = await asyncio.wait_for(reader.read(65536), 3.0)
                assert chunk, "server closed the connection"
                got += dec.feed(chunk)
            assert [(g.opaque, g.code) for g in got] == [
                (5, ResponseCode.FRAME_TOO_LARGE),
                (6, ResponseCode.SUCCESS),
            ]
            writer.close()
            # ... and everyone else is still served
            resp = await client.invoke_sync(
                ns1.addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
            )
            assert resp.is_success

    run(main())
    logged = [r for r in ns1.records() if r.get("level") == "warning"]
    assert any(r["msg"].startswith("closing connection: frame without a header") for r in logged), logged
    assert any(r["msg"].startswith("refused frame: frame refused: body of 5242880 bytes") for r in logged), (
        logged
    )


def test_periodic_registration_clamp_first_delay_and_trigger() -> None:
    assert clamp_register_interval(30) == 30
    assert clamp_register_interval(1) == 10 and clamp_register_interval(600) == 60

    async def main() -> None:
        calls: list[tuple[float, bool]] = []
        t0 = time.monotonic()

        async def register(force: bool) -> None:
            calls.append((time.monotonic() - t0, force))
            if len(calls) == 2:
                raise RuntimeError("one bad round")  # logged, the loop goes on

        async def calls_reach(n: int) -> None:
            async def reached() -> bool:
                return len(calls) >= n

            await wait_until(reached, 3.0, f"{n} registration rounds")

        p = PeriodicRegistration(
            register, interval_s=5.0, first_delay_s=0.3, force_register=False, min_interval_s=0.01
        )
        assert p.interval_s == 5.0
        p.start()
        await asyncio.sleep(0.1)
        assert calls == []  # still in the first delay
        await calls_reach(1)
        assert calls[0][0] >= 0.3 and calls[0][1] is False
        p.trigger(force=True)  # role change: register now, forced, without waiting 5 s
        await calls_reach(2)
        assert calls[1][1] is True and calls[1][0] < 4.0
        p.trigger(force=False)
        await calls_reach(3)
        assert calls[2][1] is False and p.failures == 1 and p.running
        await p.stop()
        assert not p.running and len(calls) == 3
        assert PeriodicRegistration(register, interval_s=1.0).interval_s == 10.0

    run(main())


def test_sigterm_shuts_down_cleanly_and_metrics_are_served(tmp_path) -> None:
    metrics_port = free_port()
    ns = NamesrvProcess(tmp_path / "ns-metrics.log", "--metrics-port", str(metrics_port))
    try:

        async def main() -> None:
            api = BrokerOuterAPI([ns.addr])
            await api.register_broker_all(
                BrokerIdentity("cluster-m", "grp-m", "127.0.0.1:30911", 0), topic_table("m-t")
            )
            async with RemotingClient() as client:
                await route(client, ns.addr, "m-t")
                await route(client, ns.addr, "m-missing")
            await api.close()

        run(main())
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        assert "namesrv_broker_registrations_total 1.0" in text
        assert 'namesrv_route_lookups_total{result="not_found"} 1.0' in text
        assert 'namesrv_requests_total{code="GET_ROUTEINFO_BY_TOPIC"} 2.0' in text
        assert "namesrv_topics 0.0" in text  # the broker's connection closed: its routes are gone
        assert "namesrv_brokers_disconnected_total 1.0" in text
    finally:
        t0 = time.monotonic()
        code = ns.stop()
    assert code == 0 and time.monotonic() - t0 < 3.0
    msgs = [r.get("msg") for r in ns.records()]
    assert "signal received" in msgs and msgs[-1] == "namesrv stopped"


def _run_cli(*args: str, timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "namesrv", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bad_config_is_refused_with_the_key_and_its_source(tmp_path) -> None:
    res = _run_cli("--listen-port", "70000")
    assert res.returncode == 2 and "key 'listen_port' must be a port in 0..65535, got 70000" in res.stderr
    cfg = tmp_path / "ns.toml"
    cfg.write_text("[namesrv]\nlisten_port = 9876\nbroker_expiry = 5\n")
    res = _run_cli("--config", str(cfg))
    assert res.returncode == 2 and f"config file {cfg}: unknown key 'broker_expiry'" in res.stderr


def test_example_config_loads_and_environment_and_cli_override_it() -> None:
    from namesrv.config import load_config

    example = REPO / "namesrv" / "example.toml"
    cfg = load_config(example, environ={})
    assert (cfg.listen_host, cfg.listen_port, cfg.metrics_port) == ("0.0.0.0", 9876, 9877)
    cfg = load_config(
        example, {"listen_port": 9999}, environ={"NAMESRV_LISTEN_PORT": "9000", "NAMESRV_LOG_LEVEL": "debug"}
    )
    assert (cfg.listen_port, cfg.log_level) == (9999, "debug")


def test_port_in_use_fails_start_up_with_exit_1(namesrvs) -> None:
    ns1, _ = namesrvs
    res = _run_cli("--listen-port", str(ns1.port))
    assert res.returncode == 1 and f"cannot start on 127.0.0.1:{ns1.port}" in res.stderr


def test_rocketmq_client_view_json_route_and_admin_calls(namesrvs) -> None:
    """What a RocketMQ client sends (JSON header) and reads back: the route with every field it
    requires, admin calls mqadmin makes, and REQUEST_CODE_NOT_SUPPORTED for codes we lack."""
    ns1, _ = namesrvs

    async def main() -> None:
        master = BrokerIdentity("cluster-j", "grp-j", "127.0.0.1:23911", 0)
        api = BrokerOuterAPI([ns1.addr])
        await api.register_broker_all(master, topic_table("json-orders"))
        reader, writer = await asyncio.open_connection("127.0.0.1", ns1.port)
        requests = [
            (RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "json-orders"}),
            (RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS, {}),
            (RequestCode.GET_NAMESRV_CONFIG, {}),
            (RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "cluster-j"}),
            (9999, {}),
        ]
        for opaque, (code, ext) in enumerate(requests, 1):
            header = json.dumps(
                {
                    "code": int(code),
                    "extFields": ext,
                    "flag": 0,
                    "language": "CPP",
                    "opaque": opaque,
                    "version": 1,
                }
            ).encode()
            # RocketMQ frame: total length, header length (serialisation 0 = JSON), header
            writer.write((4 + len(header)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header)
        await writer.drain()
        dec, got = FrameDecoder(), []
        for _ in range(100):
            if len(got) >= len(requests):
                break
            chunk = await asyncio.wait_for(reader.read(65536), 3.0)
            assert chunk
            got += dec.feed(chunk)
        writer.close()
        await api.close()
        assert all(g.serialize_type == 0 for g in got)
        route_resp, system, config, by_cluster, unknown = got
        route_doc = json.loads(route_resp.body)
        assert route_doc["filterServerTable"] == {}
        assert route_doc["brokerDatas"] == [
            {
                "cluster": "cluster-j",
                "brokerName": "grp-j",
                "brokerAddrs": {"0": "127.0.0.1:23911"},
                "enableActingMaster": False,
            }
        ]
        assert route_doc["queueDatas"][0]["brokerName"] == "grp-j"
        assert json.loads(system.body) == {
            "topicList": ["cluster-j", "grp-j"],
            "brokerAddr": "127.0.0.1:23911",
        }
        assert b"listen_port=" in config.body
        assert "json-orders" in json.loads(by_cluster.body)["topicList"]
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED

    run(main())


def test_route_from_a_java_nameserver_with_unquoted_broker_ids_is_read() -> None:
    from remoting.jsonbody import load_body

    raw = b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},"brokerName":"b",'
    raw += b'"cluster":"c"}],"filterServerTable":{},"queueDatas":[{"brokerName":"b","perm":6,'
    raw += b'"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}],"orderTopicConf":"{0:1}"}'
    route = TopicRouteData.from_json(load_body(raw, "route"))
    assert route.broker_datas[0].broker_addrs == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}
    assert route.order_topic_conf == "{0:1}"
