"""TLS on the RocketMQ remoting listeners (nameserver, broker) and their clients.

A throwaway CA is made in each test (tests/test_ledger_security.py's helper); servers are
real processes on loopback; clients are ours: RemotingClient, Producer, PullConsumer and the
admin CLI. Modes follow RocketMQ's tls.server.mode: permissive serves TLS and plaintext
clients, enforcing refuses plaintext ones with a log line saying why.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_ledger_security import make_ca_and_cert
from test_remoting_bounds import namesrv_factory  # noqa: F401 F811 - fixture

from broker.localgroup import LocalBrokerGroup
from client.consumer import PullConsumer
from client.instance import TLS_CA_FILE_ENV, TLS_ENABLE_ENV, ClientInstance, tls_from_env
from client.producer import Producer
from common.cluster_secret import load_cluster_secret
from common.process import free_port
from common.settings import ConfigError
from common.tls import client_context
from ledger.client import LedgerClient
from ledger.wire import LedgerError
from namesrv.config import load_config
from remoting import RemotingClient, RemotingCommand, RequestCode
from remoting.config import RemotingConfig
from remoting.exceptions import RemotingError
from remoting.message import Message
from remoting.tls import client_ssl

pytestmark = [pytest.mark.timeout(120)]
pytest.importorskip("cryptography")
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    return make_ca_and_cert(tmp_path / "pki", HOSTS)


def tls_client(pki: dict[str, str], *, with_cert: bool = False) -> RemotingClient:
    cert = pki["tls_cert_file"] if with_cert else ""
    key = pki["tls_key_file"] if with_cert else ""
    ctx = client_ssl(True, pki["tls_ca_file"], cert, key)
    return RemotingClient(RemotingConfig(client_ssl=ctx, connect_timeout_s=2.0), name="tls-test")


async def topic_list(client: RemotingClient, addr: str) -> bool:
    req = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    return (await client.invoke_sync(addr, req, 2.0)).is_success


def wait_log(ns: Any, msg: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r for r in ns.records() if msg in str(r.get("msg", ""))]
        if found:
            return found
        time.sleep(0.05)
    return []


# --- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings,words",
    [
        (
            {"tls_server_mode": "strict"},
            "key 'tls_server_mode' must be one of disabled, permissive, enforcing",
        ),
        ({"tls_server_mode": "enforcing"}, "'tls_cert_file' and 'tls_key_file' are not both set"),
        (
            {"tls_server_mode": "enforcing", "tls_cert_file": "/no/such.pem", "tls_key_file": "/no/such.key"},
            "key 'tls_cert_file'/'tls_key_file': /no/such.pem does not exist",
        ),
    ],
)
def test_bad_tls_settings_name_the_key(settings: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        load_config(None, settings, environ={})


def test_client_tls_from_environment(pki: dict[str, str]) -> None:
    assert tls_from_env({}) is None
    assert tls_from_env({TLS_ENABLE_ENV: "false", TLS_CA_FILE_ENV: "/x"}) is None
    assert tls_from_env({TLS_ENABLE_ENV: "true", TLS_CA_FILE_ENV: pki["tls_ca_file"]}) is not None
    with pytest.raises(ValueError, match="/no/ca.pem does not exist"):
        tls_from_env({TLS_ENABLE_ENV: "true", TLS_CA_FILE_ENV: "/no/ca.pem"})
    with pytest.raises(ValueError, match="must be true or false"):
        tls_from_env({TLS_ENABLE_ENV: "maybe"})


def test_bad_cert_path_stops_namesrv_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "namesrv", "--listen-host", "127.0.0.1", "--listen-port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=40,
        env={
            **os.environ,
            "NAMESRV_TLS_SERVER_MODE": "enforcing",
            "NAMESRV_TLS_CERT_FILE": str(tmp_path / "missing.pem"),
            "NAMESRV_TLS_KEY_FILE": str(tmp_path / "missing.key"),
        },
    )
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "Traceback" not in out
    error_lines = [line for line in out.splitlines() if "missing.pem" in line]
    assert error_lines == [
        f"Error: key 'tls_cert_file'/'tls_key_file': {tmp_path / 'missing.pem'} does not exist"
    ], out


def test_bad_ca_path_stops_broker_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "broker"],
        capture_output=True,
        text=True,
        timeout=40,
        env={
            **os.environ,
            "BROKER_BROKER_NAME": "broker-a",
            "BROKER_NODE_ID": "n1",
            "BROKER_GROUP": f"n1=127.0.0.1:{free_port()}@127.0.0.1:{free_port()}",
            "BROKER_NAMESRV_ADDR": "127.0.0.1:9876",
            "BROKER_DATA_DIR": str(tmp_path / "data"),
            "BROKER_TLS_ENABLE": "true",
            "BROKER_TLS_CA_FILE": str(tmp_path / "missing-ca.pem"),
            "BROKER_CLUSTER_SECRET": "s" * 32,  # a broker needs one before its TLS files are checked
        },
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in out, out
    assert [line for line in out.splitlines() if "missing-ca.pem" in line] == [
        f"Error: bad configuration: key 'tls_ca_file': {tmp_path / 'missing-ca.pem'} does not exist"
    ], out


# --- nameserver listener --------------------------------------------------------------------------


def test_enforcing_namesrv_serves_tls_and_refuses_plaintext(
    namesrv_factory: Any,  # noqa: F811
    pki: dict[str, str],
) -> None:
    ns = namesrv_factory(tls_server_mode="enforcing", **pki)
    other = make_ca_and_cert(Path(pki["tls_ca_file"]).parent.parent / "other-pki", HOSTS)

    async def scenario() -> None:
        async with tls_client(pki) as tls:
            assert await topic_list(tls, ns.addr)
        async with RemotingClient(RemotingConfig(connect_timeout_s=2.0)) as plain:
            with pytest.raises(RemotingError):
                await topic_list(plain, ns.addr)
        async with tls_client(other) as untrusted:  # a server certificate from a CA we do not trust
            with pytest.raises(RemotingError, match="TLS handshake with .* failed"):
                await topic_list(untrusted, ns.addr)
        async with tls_client(pki) as tls:  # still serving
            assert await topic_list(tls, ns.addr)

    asyncio.run(scenario())
    refused = wait_log(ns, "refused plaintext connection: tls_server_mode is enforcing")
    assert refused and refused[0]["level"] == "warning" and refused[0]["peer"].startswith("('127.0.0.1'"), (
        refused
    )


def test_permissive_namesrv_serves_both(
    namesrv_factory: Any,  # noqa: F811
    pki: dict[str, str],
) -> None:
    ns = namesrv_factory(tls_server_mode="permissive", **pki)

    async def scenario() -> None:
        async with tls_client(pki) as tls, RemotingClient() as plain:
            for _ in range(3):
                assert await topic_list(tls, ns.addr)
                assert await topic_list(plain, ns.addr)

    asyncio.run(scenario())
    assert not wait_log(ns, "refused plaintext", timeout=0.2)


def test_client_certificate_required(
    namesrv_factory: Any,  # noqa: F811
    pki: dict[str, str],
) -> None:
    ns = namesrv_factory(tls_server_mode="enforcing", tls_require_client_cert=True, **pki)

    async def scenario() -> None:
        async with tls_client(pki, with_cert=True) as tls:
            assert await topic_list(tls, ns.addr)
        async with tls_client(pki) as anonymous:  # TLS 1.3: the server refuses after the client's Finished
            with pytest.raises(RemotingError):
                await topic_list(anonymous, ns.addr)

    asyncio.run(scenario())
    assert wait_log(ns, "closing connection: TLS handshake failed")


def test_slow_tls_handshake_is_closed(
    namesrv_factory: Any,  # noqa: F811
    pki: dict[str, str],
) -> None:
    """A connection that never starts its TLS handshake is closed after handshake_timeout_s."""
    import socket

    ns = namesrv_factory(tls_server_mode="enforcing", handshake_timeout_s=0.5, **pki)
    with socket.create_connection(("127.0.0.1", ns.port), timeout=5) as s:
        s.settimeout(5)
        started = time.monotonic()
        assert s.recv(1) == b""
        assert time.monotonic() - started < 4
    assert wait_log(ns, "no TLS handshake or frame within handshake_timeout_s")


def test_probe_against_an_enforcing_namesrv(namesrv_factory: Any, pki: dict[str, str]) -> None:  # noqa: F811
    """`jepsen probe` over TLS: malformed frames, slowloris and a flood of plain sockets (which the
    listener holds while it waits for their first byte) stay within the listener's bounds."""
    ns = namesrv_factory(tls_server_mode="enforcing", handshake_timeout_s=1.0, max_connections=20, **pki)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "jepsen", "probe", "--namesrv", ns.addr),
            *("--tls-ca-file", pki["tls_ca_file"]),
            *("--remoting-handshake-timeout-s", "1", "--remoting-max-connections", "20"),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    verdicts = {r["probe"]: r["result"] for r in summary["probes"]}
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts == {
        "garbage": "pass",
        "oversize-length": "pass",
        "truncated-header": "pass",
        "bad-json-header": "pass",
        "unknown-code": "pass",
        "slowloris": "pass",
        "flood": "pass",
        "dedup-growth": "skip",
    }, summary
    assert wait_log(ns, "connection refused: max_connections reached")


# --- a TLS broker group: registration, producer, consumer, admin ------------------------------------


@pytest.mark.slow
def test_tls_group_with_producer_consumer_and_admin(
    tmp_path: Path, pki: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in {"tls_server_mode": "enforcing", **pki}.items():
        monkeypatch.setenv(f"NAMESRV_{key.upper()}", value)  # the group's nameservers read their env
    g = LocalBrokerGroup(
        tmp_path / "group",
        brokers=3,
        nameservers=1,
        topics=("TlsTopic:2",),
        settings={
            "tls_server_mode": "enforcing",
            "tls_enable": True,  # registrations to the nameserver
            "ledger_tls": True,  # and the ledger members among themselves
            "register_interval_s": 10,
            **pki,
        },
    )
    ns = g.namesrv_addrs[0]
    ctx = client_ssl(True, pki["tls_ca_file"])
    master: list[str] = []

    async def wait_master(client: RemotingClient) -> str:
        """The node id of the master, once the nameserver routes the topic (it registered over TLS)."""
        deadline = time.monotonic() + 60
        route = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TlsTopic"})
        while time.monotonic() < deadline:
            try:
                if (await client.invoke_sync(ns, route, 1.0)).is_success:
                    for nid, addr in g.broker_addr.items():
                        info = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
                        resp = await client.invoke_sync(addr, info, 1.0)
                        if resp.is_success and json.loads(bytes(resp.body))["role"] == "MASTER":
                            return nid
            except RemotingError:
                pass
            await asyncio.sleep(0.2)
        raise AssertionError(f"no master registered over TLS; logs in {g.base_dir}")

    async def scenario() -> None:
        async with RemotingClient(RemotingConfig(client_ssl=ctx)) as client:
            master.append(await wait_master(client))
        instance = ClientInstance(ns, tls=ctx)
        producer = Producer("tls-producer", instance=instance)
        await producer.start()
        try:
            sent = [await producer.send(Message("TlsTopic", f"tls-{i}".encode())) for i in range(4)]
        finally:
            await producer.shutdown()
        assert all(r.msg_id for r in sent)
        monkeypatch.setenv(TLS_ENABLE_ENV, "true")  # the consumer takes TLS from the environment
        monkeypatch.setenv(TLS_CA_FILE_ENV, pki["tls_ca_file"])
        got: set[bytes] = set()
        async with PullConsumer("tls-consumer", ns) as consumer:
            for q in await consumer.fetch_queues("TlsTopic"):
                r = await consumer.pull(q, 0, 32)
                got.update(m.body for m in r.messages)
        assert got == {f"tls-{i}".encode() for i in range(4)}
        async with RemotingClient(RemotingConfig(connect_timeout_s=2.0)) as plain:
            info = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
            with pytest.raises(RemotingError):
                await plain.invoke_sync(g.broker_addr[master[0]], info, 2.0)
        # the ledger members elected that master over TLS; their listeners take TLS clients only
        ledger = [g.ledger_addr[n] for n in g.node_ids]
        trusted = client_context(pki["tls_ca_file"])
        secret = load_cluster_secret("", g.cluster_secret_file())  # the ledger port wants its proof too
        async with LedgerClient(ledger, timeout=3, attempt_timeout=1, ssl=trusted, secret=secret) as lc:
            roles = [(await lc.status(a))["role"] for a in ledger]
        assert sorted(roles) == ["follower", "follower", "leader"], roles
        async with LedgerClient(ledger, timeout=1.5, attempt_timeout=0.5) as plain_ledger:
            with pytest.raises((LedgerError, OSError)):
                await plain_ledger.status(ledger[0])

    g.start()
    try:
        asyncio.run(asyncio.wait_for(scenario(), 90))
        env = {**os.environ, TLS_ENABLE_ENV: "", TLS_CA_FILE_ENV: ""}
        admin = [sys.executable, "-m", "client.admin", "-n", ns]
        out = subprocess.run(
            [*admin, "--tls", "--tls-ca-file", pki["tls_ca_file"], "cluster-list"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert out.returncode == 0 and "broker-a" in out.stdout, out
        plain = subprocess.run([*admin, "cluster-list"], capture_output=True, text=True, timeout=60, env=env)
        assert plain.returncode == 1 and "Traceback" not in plain.stderr, plain
        log = (g.base_dir / g.name_of(master[0]) / "broker.log").read_text()
        lines = [json.loads(x) for x in log.splitlines() if "refused plaintext connection" in x]
        assert lines and lines[0]["server"] == "broker", lines
    finally:
        g.stop()
