"""RocketMQ-style ACL: signed requests, per-account topic permissions, admin operations only
for a superuser; against a real nameserver and a real one-broker group over real sockets."""

from __future__ import annotations

import asyncio
import base64
import hmac as hmac_lib
import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_remoting_bounds import namesrv_factory  # noqa: F401 - fixture

from broker.localgroup import LocalBrokerGroup
from client.errors import ClientError
from client.instance import ClientInstance
from client.producer import Producer
from common.process import free_port
from common.settings import ConfigError
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.acl import (
    ACCESS_KEY,
    SIGNATURE,
    AccessValidator,
    RequestSigner,
    accounts_from_doc,
    load_accounts,
)
from remoting.message import Message
from remoting.protocol import encode_parts

pytestmark = pytest.mark.timeout(120)

ACCOUNTS = """
[[accounts]]
access_key = "root"
secret_key = "root-secret-1"
admin = true

[[accounts]]
access_key = "writer"
secret_key = "writer-secret-1"
topic_perms = ["AclTopic=PUB"]
default_group_perm = "SUB"

[[accounts]]
access_key = "reader"
secret_key = "reader-secret-1"
topic_perms = ["AclTopic=SUB"]
default_group_perm = "SUB"
"""
ADMIN = RequestSigner("root", "root-secret-1")
WRITER = RequestSigner("writer", "writer-secret-1")
READER = RequestSigner("reader", "reader-secret-1")


def accounts_file(tmp: Path) -> Path:
    p = tmp / "acl.toml"
    p.write_text(ACCOUNTS)
    return p


def test_signature_verifies_and_detects_tampering(tmp_path: Path) -> None:
    validator = AccessValidator(load_accounts(accounts_file(tmp_path)), require_signature=True)
    req = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "AclTopic", "queueId": 1}, b"body")
    WRITER(req)
    assert req.headers[ACCESS_KEY] == "writer" and req.headers[SIGNATURE]
    assert validator.check(None, req) is None
    WRITER(req)  # signing again (a retry) replaces the old signature
    assert validator.check(None, req) is None
    req.body = b"tampered"
    refusal = validator.check(None, req)
    assert refusal is not None and refusal.code == ResponseCode.NO_PERMISSION
    assert "does not verify" in refusal.remark
    forged = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "AclTopic"})
    RequestSigner("writer", "guessed-secret")(forged)
    assert validator.check(None, forged).code == ResponseCode.NO_PERMISSION  # type: ignore[union-attr]
    denied = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "AclTopic"})
    READER(denied)
    refusal = validator.check(None, denied)
    assert refusal is not None and "needs PUB on topic 'AclTopic'" in refusal.remark


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"topic": "T"},
        {"topic": "T", "queueId": 3, "flag": True, "_UNIQUE_KEY_QUERY": "x"},
        {"queueId": 3, "topic": "T", "flag": False},  # same keys, other order: same content
        {"b": "T", "a": "g", "g": 1795481683110, "i": "UNIQ_KEY\x01abc\x02", "k": "false"},
    ],
)
def test_signature_is_hmac_sha1_over_sorted_values_then_body(headers: dict[str, Any]) -> None:
    """RocketMQ's AclUtils.combineRequestContent: values (not keys) of every extField but
    Signature and _UNIQUE_KEY_QUERY, in key order, then the body; wire text for ints/bools."""

    def wire(v: object) -> str:
        return ("true" if v else "false") if isinstance(v, bool) else str(v)

    for _ in range(2):  # a second time through the cached key order
        req = RemotingCommand.request(RequestCode.SEND_MESSAGE, dict(headers), b"the body")
        WRITER(req)
        signed = {k: v for k, v in req.headers.items() if k not in (SIGNATURE, "_UNIQUE_KEY_QUERY")}
        content = "".join(wire(signed[k]) for k in sorted(signed)).encode() + b"the body"
        expected = base64.b64encode(hmac_lib.digest(b"writer-secret-1", content, "sha1")).decode()
        assert req.headers[SIGNATURE] == expected
        decoded = {k: wire(v) for k, v in req.headers.items()}  # as a server decodes it
        validator = AccessValidator(
            accounts_from_doc(tomllib.loads(ACCOUNTS), "test"), require_signature=True
        )
        assert (
            validator.check(
                None, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, decoded, b"the body")
            )
            is None
        )


def test_bad_accounts_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[accounts]]\naccess_key = "a"\nsecret_key = "s3cret!"\ntopic_perms = ["T=WRITE"]\n')
    with pytest.raises(ConfigError, match=r"accounts\[0\]\.topic_perms\[0\].*WRITE"):
        load_accounts(bad)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_accounts(binary)


NAMESRV_ADMIN_OPS = [
    (
        RequestCode.REGISTER_BROKER,
        {"brokerName": "forged", "brokerAddr": "127.0.0.1:1", "clusterName": "c", "brokerId": 0},
    ),
    (RequestCode.PUT_KV_CONFIG, {"namespace": "ns", "key": "k", "value": "v"}),
    (RequestCode.DELETE_KV_CONFIG, {"namespace": "ns", "key": "k"}),
    (RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-x"}),
    (RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-x"}),
    (RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "SomeTopic"}),
    (
        RequestCode.UNREGISTER_BROKER,
        {"brokerName": "b", "brokerAddr": "127.0.0.1:1", "clusterName": "c", "brokerId": 0},
    ),
]


def test_namesrv_admin_operations_need_a_superuser(tmp_path: Path, namesrv_factory: Any) -> None:  # noqa: F811
    ns = namesrv_factory(acl_enable=True, acl_file=str(accounts_file(tmp_path)))

    async def scenario() -> None:
        async with (
            RemotingClient() as anon,
            RemotingClient(rpc_hook=WRITER) as user,
            RemotingClient(rpc_hook=ADMIN) as admin,
        ):
            for code, headers in NAMESRV_ADMIN_OPS:
                r = await anon.invoke_sync(ns.addr, RemotingCommand.request(code, headers), 3.0)
                assert r.code == ResponseCode.NO_PERMISSION and "not signed" in r.remark, (code, r)
                r = await user.invoke_sync(ns.addr, RemotingCommand.request(code, headers), 3.0)
                assert r.code == ResponseCode.NO_PERMISSION and "admin" in r.remark, (code, r)
                r = await admin.invoke_sync(ns.addr, RemotingCommand.request(code, headers), 3.0)
                assert r.code != ResponseCode.NO_PERMISSION, (code, r)
            # the KV put by the superuser took effect; lookups stay open without credentials
            put = RemotingCommand.request(
                RequestCode.PUT_KV_CONFIG, {"namespace": "ns", "key": "k2", "value": "v2"}
            )
            assert (await admin.invoke_sync(ns.addr, put, 3.0)).is_success
            get = RemotingCommand.request(RequestCode.GET_KV_CONFIG, {"namespace": "ns", "key": "k2"})
            r = await anon.invoke_sync(ns.addr, get, 3.0)
            assert r.is_success and r.headers.get("value") == "v2"

    asyncio.run(asyncio.wait_for(scenario(), 30))


# --- broker ---------------------------------------------------------------------------------------


@pytest.fixture
def acl_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalBrokerGroup]:
    """One broker with ACL on, and a nameserver with ACL on (superuser from its environment,
    as docker-compose does): the broker's registrations must be signed to be routed at all."""
    monkeypatch.setenv("NAMESRV_ACL_ENABLE", "true")
    monkeypatch.setenv("NAMESRV_ACL_ADMIN_ACCESS_KEY", "root")
    monkeypatch.setenv("NAMESRV_ACL_ADMIN_SECRET_KEY", "root-secret-1")
    g = LocalBrokerGroup(
        tmp_path,
        brokers=1,
        nameservers=1,
        topics=("AclTopic:2",),
        settings={
            "acl_enable": True,
            "acl_file": str(accounts_file(tmp_path)),
            "access_key": "root",
            "secret_key": "root-secret-1",
            "register_interval_s": 10,
        },
    )
    g.start()
    try:
        asyncio.run(asyncio.wait_for(_wait_master(g), 60))
        yield g
    finally:
        g.stop()


async def _wait_master(g: LocalBrokerGroup) -> None:
    addr = g.broker_addr["n1"]
    async with RemotingClient(rpc_hook=ADMIN) as client:
        while True:
            try:
                r = await client.invoke_sync(
                    addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 1.0
                )
                routed = await client.invoke_sync(
                    g.namesrv_addrs[0],
                    RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "AclTopic"}),
                    1.0,
                )
                if r.is_success and json.loads(bytes(r.body))["role"] == "MASTER" and routed.is_success:
                    return
            except Exception:  # noqa: BLE001 - starting up
                pass
            await asyncio.sleep(0.2)


@pytest.mark.slow
def test_broker_acl(acl_broker: LocalBrokerGroup) -> None:
    g = acl_broker
    addr = g.broker_addr["n1"]
    ns = g.namesrv_addr_str

    async def scenario() -> None:
        create = {"topic": "NewTopic", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
        async with (
            RemotingClient() as anon,
            RemotingClient(rpc_hook=WRITER) as user,
            RemotingClient(rpc_hook=ADMIN) as admin,
        ):
            # topic create/update is an admin operation
            r = await anon.invoke_sync(
                addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, create)
            )
            assert r.code == ResponseCode.NO_PERMISSION
            r = await user.invoke_sync(
                addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, create)
            )
            assert r.code == ResponseCode.NO_PERMISSION and "admin" in r.remark
            r = await admin.invoke_sync(
                addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, create)
            )
            assert r.is_success, r
            # with ACL on the broker refuses every unsigned request, even status
            r = await anon.invoke_sync(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO))
            assert r.code == ResponseCode.NO_PERMISSION

        # our Producer signs with the instance's credentials: PUB allowed for writer...
        writer_instance = ClientInstance(ns, access_key="writer", secret_key="writer-secret-1")
        # a signed frame carries no lmqBodyCrc32 (added after signing, a RocketMQ broker would
        # verify the signature over it too): the HMAC already covers the body
        probe = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "AclTopic"}, b"body")
        writer_instance.signer(probe)
        head, _ = encode_parts(probe, crc=writer_instance.remoting.config.send_crc)
        assert b"lmqBodyCrc32" not in head and b"Signature" in head
        producer = Producer("acl-producer", instance=writer_instance, retries=0, send_timeout_s=5)
        await producer.start()
        try:
            result = await producer.send(Message("AclTopic", b"hello"))
            assert result.msg_id
        finally:
            await producer.shutdown()
            await writer_instance.close()
        # ...and refused for an account whose permission on the topic is SUB only
        reader_instance = ClientInstance(ns, access_key="reader", secret_key="reader-secret-1")
        denied = Producer("acl-producer", instance=reader_instance, retries=0, send_timeout_s=5)
        await denied.start()
        try:
            with pytest.raises(ClientError, match="needs PUB on topic 'AclTopic'"):
                await denied.send(Message("AclTopic", b"nope"))
        finally:
            await denied.shutdown()
            await reader_instance.close()

    started = time.monotonic()
    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert time.monotonic() - started < 60

    # the admin CLI: refused without credentials (one line, exit 1), accepted with a superuser's
    def admin_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERMQ_")}
        return subprocess.run(
            [sys.executable, "-m", "client.admin", "-n", ns, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**clean, **(env or {})},
        )

    topic_args = ("update-topic", "-t", "CliTopic", "-b", addr, "-r", "2", "-w", "2")
    refused = admin_cli(*topic_args)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "not signed" in refused.stderr or "NO_PERMISSION" in refused.stderr, refused.stderr
    as_user = admin_cli("--access-key", "writer", "--secret-key", "writer-secret-1", *topic_args)
    assert as_user.returncode != 0 and "admin" in as_user.stderr, as_user.stderr
    ok = admin_cli("--access-key", "root", "--secret-key", "root-secret-1", *topic_args)
    assert ok.returncode == 0, ok.stderr
    via_env = admin_cli(
        *topic_args, env={"LEDGERMQ_ACCESS_KEY": "root", "LEDGERMQ_SECRET_KEY": "root-secret-1"}
    )
    assert via_env.returncode == 0, via_env.stderr


def test_namesrv_superuser_from_environment(tmp_path: Path) -> None:
    """docker-compose's way: ACL on and the superuser given by environment variables, no file."""
    port = free_port()
    env = {
        **os.environ,
        "NAMESRV_ACL_ENABLE": "true",
        "NAMESRV_ACL_ADMIN_ACCESS_KEY": "env-admin",
        "NAMESRV_ACL_ADMIN_SECRET_KEY": "env-admin-secret",
    }
    log = open(tmp_path / "ns.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "namesrv", "--listen-host", "127.0.0.1", "--listen-port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    addr = f"127.0.0.1:{port}"

    async def scenario() -> None:
        put = {"namespace": "ns", "key": "k", "value": "v"}
        async with (
            RemotingClient() as anon,
            RemotingClient(rpc_hook=RequestSigner("env-admin", "env-admin-secret")) as admin,
        ):
            for _ in range(100):
                try:
                    await anon.invoke_sync(
                        addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 1.0
                    )
                    break
                except Exception:  # noqa: BLE001 - starting
                    await asyncio.sleep(0.1)
            r = await anon.invoke_sync(addr, RemotingCommand.request(RequestCode.PUT_KV_CONFIG, put), 3.0)
            assert r.code == ResponseCode.NO_PERMISSION
            r = await admin.invoke_sync(addr, RemotingCommand.request(RequestCode.PUT_KV_CONFIG, put), 3.0)
            assert r.is_success, r
            conf = await anon.invoke_sync(addr, RemotingCommand.request(RequestCode.GET_NAMESRV_CONFIG), 3.0)
            text = bytes(conf.body).decode()
            assert "acl_admin_access_key=env-admin" in text and "env-admin-secret" not in text

    try:
        asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def test_bad_accounts_file_stops_namesrv_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "acl.toml"
    bad.write_text("[[accounts]]\naccess_key = 3\n")
    done = subprocess.run(
        [sys.executable, "-m", "namesrv", "--listen-host", "127.0.0.1", "--listen-port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=40,
        env={**os.environ, "NAMESRV_ACL_ENABLE": "true", "NAMESRV_ACL_FILE": str(bad)},
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    assert f"ACL accounts file {bad}: accounts[0]" in done.stderr


CPP_SEND = """
import json, sys
from rocketmq.client import Message, Producer
namesrv, ak, sk = sys.argv[1:4]
producer = Producer("cpp-acl-producer", timeout=3000)
producer.set_namesrv_addr(namesrv)
producer.set_session_credentials(ak, sk, "ALIYUN")
producer.start()
out = {}
try:
    msg = Message("AclTopic")
    msg.set_keys("cpp-key")
    msg.set_body("signed by the C++ client")
    r = producer.send_sync(msg)
    out = {"status": int(r.status), "msg_id": r.msg_id}
except Exception as exc:
    out = {"error": str(exc)}
finally:
    producer.shutdown()
print(json.dumps(out), flush=True)
"""


@pytest.mark.slow
def test_rocketmq_cpp_client_signatures_verify(acl_broker: LocalBrokerGroup, tmp_path: Path) -> None:
    """Apache RocketMQ's own C++ client (session credentials) is accepted and refused as ours is."""
    pytest.importorskip("rocketmq.client")

    def send(ak: str, sk: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", CPP_SEND, acl_broker.namesrv_addr_str, ak, sk],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "HOME": str(tmp_path)},  # the C++ client logs under $HOME/logs
        )
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        assert lines, f"no result (rc={done.returncode}): {done.stderr[-2000:]}"
        return json.loads(lines[-1])

    ok = send("writer", "writer-secret-1")
    assert ok.get("status") == 0 and ok.get("msg_id"), ok
    refused = send("reader", "reader-secret-1")
    assert "error" in refused, refused
    forged = send("writer", "not-the-secret")
    assert "error" in forged, forged
    # the C++ client does not show the broker's remark; the broker's log says why it refused each
    log = (acl_broker.base_dir / acl_broker.name_of("n1") / "broker.log").read_text(errors="replace")
    assert "AccessKey 'reader': SEND_MESSAGE" in log and "needs PUB on topic 'AclTopic'" in log
    assert "by AccessKey 'writer' does not verify" in log


def test_malformed_heartbeat_bodies_do_not_break_the_gate(tmp_path: Path) -> None:
    validator = AccessValidator(load_accounts(accounts_file(tmp_path)), require_signature=True)
    for body in (
        b"[1,2]",
        b'{"consumerDataSet": 5}',
        b'{"consumerDataSet": [{"subscriptionDataSet": 7}]}',
        b"\xff",
    ):
        req = RemotingCommand.request(RequestCode.HEART_BEAT, {}, body)
        WRITER(req)
        assert validator.check(None, req) is None  # the processor answers what is malformed
    req = RemotingCommand.request(
        RequestCode.HEART_BEAT,
        {},
        json.dumps(
            {"consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [{"topic": "Secret"}]}]}
        ).encode(),
    )
    WRITER(req)
    refusal = validator.check(None, req)
    assert refusal is not None and "needs SUB on topic 'Secret'" in refusal.remark


def test_pop_codes_need_sub_on_the_topic_and_every_group_named(tmp_path: Path) -> None:
    validator = AccessValidator(load_accounts(accounts_file(tmp_path)), require_signature=True)

    def judged(signer: RequestSigner, code: int, headers: dict[str, Any], body: bytes = b"") -> str | None:
        req = RemotingCommand.request(code, headers, body)
        signer(req)
        refusal = validator.check(None, req)
        return None if refusal is None else refusal.remark

    for code in (RequestCode.POP_MESSAGE, RequestCode.ACK_MESSAGE, RequestCode.CHANGE_MESSAGE_INVISIBLETIME):
        assert judged(READER, code, {"consumerGroup": "g", "topic": "AclTopic"}) is None
        refused = judged(WRITER, code, {"consumerGroup": "g", "topic": "AclTopic"})
        assert refused is not None and "needs SUB on topic 'AclTopic'" in refused
    acks = [{"c": "g", "t": "AclTopic", "so": 0, "q": 0, "pt": 1, "b": "AQ=="}]
    body = json.dumps({"brokerName": "b", "acks": acks}).encode()
    assert judged(READER, RequestCode.BATCH_ACK_MESSAGE, {}, body) is None
    acks.append({"consumerGroup": "g", "topic": "Secret", "startOffset": 0, "queueId": 0, "popTime": 1})
    body = json.dumps({"brokerName": "b", "acks": acks}).encode()
    refused = judged(READER, RequestCode.BATCH_ACK_MESSAGE, {}, body)
    assert refused is not None and "needs SUB on topic 'Secret'" in refused
    for malformed in (b"[1]", b'{"acks": 3}', b'{"acks": [7, {"c": 5}]}', b"\xff"):
        assert judged(READER, RequestCode.BATCH_ACK_MESSAGE, {}, malformed) is None  # the processor says


# An account may send to AclTopic only; every way of naming another topic in a send must be
# judged by the topic the broker would store into.
MIXED_SENDS = [
    (RequestCode.SEND_MESSAGE_V2, {"b": "AclTopic", "topic": "Forbidden", "e": 0}, "AclTopic"),
    (RequestCode.SEND_MESSAGE, {"b": "Forbidden", "e": 0}, "Forbidden"),
    (RequestCode.SEND_BATCH_MESSAGE, {"topic": "Forbidden", "queueId": 0}, "Forbidden"),
    (RequestCode.SEND_BATCH_MESSAGE, {"b": "Forbidden", "topic": "AclTopic"}, "Forbidden"),
    (RequestCode.SEND_MESSAGE, {"topic": "Forbidden", "b": "AclTopic"}, "Forbidden"),
]


@pytest.mark.parametrize(("code", "headers", "stored_in"), MIXED_SENDS)
def test_acl_judges_the_topic_the_broker_stores_into(
    tmp_path: Path, code: int, headers: dict[str, Any], stored_in: str
) -> None:
    from broker.processors import _send_headers

    validator = AccessValidator(load_accounts(accounts_file(tmp_path)), require_signature=True)
    req = RemotingCommand.request(code, dict(headers), b"body")
    WRITER(req)
    decoded = RemotingCommand.request(code, {k: str(v) for k, v in req.headers.items()}, b"body")
    assert _send_headers(decoded).header_str("topic") == stored_in
    refusal = validator.check(None, decoded)
    if stored_in == "AclTopic":
        assert refusal is None
    else:
        assert refusal is not None and "needs PUB on topic 'Forbidden'" in refusal.remark


def _registered_codes(server_kind: str) -> set[int]:
    """Every request code a broker (both listeners) or a nameserver registers a processor for."""

    class Recorder:
        def __init__(self) -> None:
            self.codes: set[int] = set()

        def register_processor(self, code: int, fn: object) -> None:
            self.codes.add(int(code))

    recorder = Recorder()
    if server_kind == "broker":
        from types import SimpleNamespace

        from broker.processors import Processors

        config = SimpleNamespace(
            broker_addr="127.0.0.1:10911",
            broker_name="b",
            data_dir=".",
            max_heartbeat_clients=16,
            max_heartbeat_table_bytes=1 << 20,
        )
        store = SimpleNamespace(dispatched_messages=0, offsets={})
        processors = Processors(SimpleNamespace(store=store, config=config))  # type: ignore[arg-type]
        processors.register(recorder, pulls=True)
        processors.register(recorder, pulls=False)
    else:
        from namesrv.config import NamesrvConfig
        from namesrv.kvconfig import KVConfigManager
        from namesrv.processor import NamesrvProcessor
        from namesrv.routeinfo import RouteInfoManager

        processor = NamesrvProcessor(
            NamesrvConfig(), RouteInfoManager(), KVConfigManager(None), time.monotonic
        )
        for code in processor.handlers():
            recorder.register_processor(code, None)
    return recorder.codes


@pytest.mark.parametrize("server_kind", ["broker", "namesrv"])
def test_every_registered_request_code_has_an_acl_rule(server_kind: str) -> None:
    """A new request code cannot be served without deciding who may use it: a rule (admin, or
    permissions on what it reads or writes) or a place among the open metadata codes."""
    from remoting.acl import OPEN_CODES, RULES
    from remoting.codes import request_code_name

    codes = _registered_codes(server_kind)
    assert codes
    missing = sorted(request_code_name(c) for c in codes if c not in RULES and c not in OPEN_CODES)
    assert not missing, f"request codes without an ACL rule: {missing}"
    assert not set(RULES) & OPEN_CODES


@pytest.mark.slow
def test_no_mix_of_send_headers_and_no_query_passes_the_acl(acl_broker: LocalBrokerGroup) -> None:
    """The ways past the ACL found by trying: send headers that name two topics, and the
    message queries (by key, by id) that had no rule."""
    g = acl_broker
    addr = g.broker_addr["n1"]

    async def max_offset(client: RemotingClient, topic: str) -> int:
        total = 0
        for q in range(2):
            r = await client.invoke_sync(
                addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": q})
            )
            assert r.is_success, r
            total += r.header_int("offset")
        return total

    async def scenario() -> None:
        async with RemotingClient(rpc_hook=ADMIN) as admin, RemotingClient(rpc_hook=WRITER) as writer:
            create = {"topic": "Forbidden", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
            r = await admin.invoke_sync(
                addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, create)
            )
            assert r.is_success, r
            secret = RemotingCommand.request(
                RequestCode.SEND_MESSAGE,
                {"topic": "Forbidden", "queueId": 0, "properties": "KEYS\x01k1\x02"},
                b"a secret",
            )
            sent = await admin.invoke_sync(addr, secret)
            assert sent.is_success, sent
            for code, headers, stored_in in MIXED_SENDS:
                r = await writer.invoke_sync(addr, RemotingCommand.request(code, dict(headers), b"mixed"))
                if stored_in == "Forbidden":
                    assert r.code == ResponseCode.NO_PERMISSION, (code, headers, r)
                else:
                    assert r.is_success, r
            assert await max_offset(admin, "Forbidden") == 1  # the admin's message alone
            query = RemotingCommand.request(
                RequestCode.QUERY_MESSAGE, {"topic": "Forbidden", "key": "k1", "maxNum": 4}
            )
            r = await writer.invoke_sync(addr, query)
            assert r.code == ResponseCode.NO_PERMISSION and "needs SUB on topic 'Forbidden'" in r.remark
            view = RemotingCommand.request(
                RequestCode.VIEW_MESSAGE_BY_ID, {"msgId": sent.header_str("msgId")}
            )
            r = await writer.invoke_sync(addr, view)
            assert r.code == ResponseCode.NO_PERMISSION and "needs SUB on topic 'Forbidden'" in r.remark
            r = await admin.invoke_sync(
                addr,
                RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"msgId": sent.header_str("msgId")}),
            )
            assert r.is_success and b"a secret" in bytes(r.body)

    asyncio.run(asyncio.wait_for(scenario(), 60))
