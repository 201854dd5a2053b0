"""RocketMQ 5's gRPC proxy (``proxy``) in front of a real local cluster (a nameserver, a 3-broker
group, the proxy process), driven over gRPC with the v2 message types: routes, the settings
handshake, sends of every message type, receive/ack/invisible time, and RocketMQ's status codes."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.localcluster import LocalCluster
from client import AdminClient
from common.process import free_port
from proxy.protocol import pb, sgrpc, spb

pytestmark = pytest.mark.slow

T = "ProxyT"
F = "ProxyFail"
START_TIMEOUT_S = 60


def wait_for(cluster: LocalCluster, topics: dict[str, int]) -> None:
    """Until the group has a master, the topics exist and the proxy answers their routes."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not asyncio.run(cluster.masters()):
        assert time.monotonic() < deadline, "no master"
        time.sleep(0.2)

    async def create() -> None:
        async with AdminClient(cluster.namesrv_addr) as admin:
            for topic, queues in topics.items():
                for r in await admin.update_topic(topic, read_queue_nums=queues, write_queue_nums=queues):
                    assert r.ok, r

    asyncio.run(create())
    with grpc.insecure_channel(cluster.proxy_addr) as ch:
        stub = sgrpc.MessagingServiceStub(ch)
        while True:
            try:
                answers = [stub.QueryRoute(route_request(t), timeout=3).status.code for t in topics]
                if all(c == pb.Code.OK for c in answers):
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, "the proxy never routed the topics"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("proxy"), namesrv_port=0, proxy_port=0)
    c.start()
    try:
        wait_for(c, {T: 2, "ProxyFifo": 4, "ProxyTx": 2, "ProxyDelay": 1, "ProxyFail": 2})
        yield c
    finally:
        c.stop()
        log = (Path(c.base_dir) / "proxy" / "proxy.log").read_text(errors="replace")
        assert "Traceback" not in log, log[-4000:]


@pytest.fixture
def stub(cluster: LocalCluster) -> Iterator[Any]:
    with grpc.insecure_channel(cluster.proxy_addr) as ch:
        yield sgrpc.MessagingServiceStub(ch)


def route_request(topic: str) -> Any:
    return spb.QueryRouteRequest(topic=pb.Resource(name=topic))


_ids = iter(range(1, 1 << 30))


def message(topic: str, body: bytes, **sysp: Any) -> Any:
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    m.system_properties.message_id = f"01PROXYTEST{next(_ids):012X}"
    m.system_properties.message_type = pb.MessageType.Value(sysp.pop("kind", "NORMAL"))
    for key, value in sysp.items():
        if key == "delivery_ms":
            m.system_properties.delivery_timestamp.FromMilliseconds(value)
        else:
            setattr(m.system_properties, key, value)
    return m


def send(stub: Any, *msgs: Any) -> Any:
    return stub.SendMessage(spb.SendMessageRequest(messages=list(msgs)), timeout=10)


def receive(
    stub: Any,
    group: str,
    topic: str = T,
    n: int = 8,
    invisible_s: float = 30,
    poll_s: float = 1,
    tag: str = "*",
) -> tuple[Any, list[Any]]:
    """(status, messages) of one ReceiveMessage."""
    req = spb.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), broker=pb.Broker(name="broker-a")),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression=tag),
        batch_size=n,
    )
    req.invisible_duration.FromMilliseconds(int(invisible_s * 1000))
    req.long_polling_timeout.FromMilliseconds(int(poll_s * 1000))
    answers = list(stub.ReceiveMessage(req, timeout=poll_s + 10))
    status = [a.status for a in answers if a.HasField("status")]
    assert len(status) == 1, answers
    return status[0], [a.message for a in answers if a.HasField("message")]


def receive_all(stub: Any, group: str, want: int, topic: str = T, **kw: Any) -> list[Any]:
    """Receive until ``want`` messages came (or 20 tries found nothing more)."""
    out: list[Any] = []
    for _ in range(20):
        if len(out) >= want:
            break
        _status, got = receive(stub, group, topic, **kw)
        out += got
    return out


def ack(stub: Any, group: str, m: Any, topic: str = T, handle: str | None = None) -> Any:
    entry = spb.AckMessageEntry(
        message_id=m.system_properties.message_id if m is not None else "x",
        receipt_handle=handle if handle is not None else m.system_properties.receipt_handle,
    )
    req = spb.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=[entry])
    return stub.AckMessage(req, timeout=10).status


def code(status: Any) -> str:
    return pb.Code.Name(status.code)


def test_routes_settings_handshake_and_refusals(cluster: LocalCluster, stub: Any) -> None:
    host, port = cluster.proxy_addr.rsplit(":", 1)
    endpoints = pb.Endpoints(scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host=host, port=int(port))])
    r = stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=T), endpoints=endpoints), timeout=5)
    assert code(r.status) == "OK"
    assert sorted(q.id for q in r.message_queues) == [0, 1]
    for q in r.message_queues:  # cluster mode: every queue is reached through this proxy
        assert q.broker.name == "broker-a" and q.broker.id == 0 and q.broker.endpoints == endpoints
        assert q.permission == pb.Permission.READ_WRITE
        assert pb.MessageType.FIFO in q.accept_message_types
    assert code(stub.QueryRoute(route_request("NoSuchTopic"), timeout=5).status) == "TOPIC_NOT_FOUND"
    assert code(stub.QueryRoute(route_request("bad topic!"), timeout=5).status) == "ILLEGAL_TOPIC"
    assert (
        code(stub.Heartbeat(spb.HeartbeatRequest(client_type=pb.ClientType.PRODUCER), timeout=5).status)
        == "OK"
    )
    bad_group = spb.HeartbeatRequest(
        group=pb.Resource(name="bad group"), client_type=pb.ClientType.SIMPLE_CONSUMER
    )
    assert code(stub.Heartbeat(bad_group, timeout=5).status) == "ILLEGAL_CONSUMER_GROUP"

    # the settings handshake: a producer's settings answered with the server's
    ours = pb.Settings(client_type=pb.ClientType.PRODUCER, access_point=endpoints)
    ours.publishing.topics.add(name=T)
    ours.publishing.max_body_size = 128 << 20
    replies = stub.Telemetry(iter([spb.TelemetryCommand(settings=ours)]), timeout=10)
    first = next(replies)
    assert code(first.status) == "OK" and first.HasField("settings")
    assert first.settings.publishing.max_body_size == 4 << 20
    assert first.settings.backoff_policy.max_attempts >= 2 and not first.settings.metric.on
    replies.cancel()
    # a consumer's: RocketMQ's retry delays, and the deliveries a message gets before it is a dead letter
    sub = pb.Settings(client_type=pb.ClientType.PUSH_CONSUMER, access_point=endpoints)
    sub.subscription.group.name = "g-settings"
    replies = stub.Telemetry(iter([spb.TelemetryCommand(settings=sub)]), timeout=10)
    theirs = next(replies).settings
    replies.cancel()
    assert theirs.backoff_policy.max_attempts == 17  # a first delivery and 16 retries
    assert [d.seconds for d in theirs.backoff_policy.customized_backoff.next][:4] == [1, 5, 10, 30]
    assert theirs.subscription.long_polling_timeout.seconds == 20

    # RocketMQ's status codes for bad sends, handles and groups; UNIMPLEMENTED for RPCs not served
    r = send(stub, message(T, b"x" * ((4 << 20) + 1)))
    assert (
        code(r.status) == "MESSAGE_BODY_TOO_LARGE" and code(r.entries[0].status) == "MESSAGE_BODY_TOO_LARGE"
    )
    assert code(send(stub, message(T, b"")).status) == "MESSAGE_BODY_EMPTY"
    assert code(send(stub, message("NoSuchTopic", b"x")).status) == "TOPIC_NOT_FOUND"
    assert code(send(stub, message(T, b"x", kind="FIFO")).status) == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
    assert code(ack(stub, "g-bad", None, handle="garbage")) == "INVALID_RECEIPT_HANDLE"
    never = "0 1700000000000 30000 0 0 broker-a 0 999999 -1"
    assert code(ack(stub, "g-bad", None, handle=never)) == "INVALID_RECEIPT_HANDLE"
    status, _ = receive(stub, "bad group")
    assert code(status) == "ILLEGAL_CONSUMER_GROUP"
    status, _ = receive(stub, "g-bad", invisible_s=0.01)
    assert code(status) == "ILLEGAL_INVISIBLE_TIME"
    with pytest.raises(grpc.RpcError) as err:
        stub.PullMessage(spb.PullMessageRequest(group=pb.Resource(name="g")), timeout=5).next()
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as err:
        stub.UpdateOffset(spb.UpdateOffsetRequest(group=pb.Resource(name="g")), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # an RPC the service has not, and bytes that are no request: gRPC's own refusals, the proxy lives on
    with grpc.insecure_channel(cluster.proxy_addr) as ch:
        unknown = ch.unary_unary("/apache.rocketmq.v2.MessagingService/NoSuchRpc")
        with pytest.raises(grpc.RpcError) as err:
            unknown(b"", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        garbage = ch.unary_unary(
            "/apache.rocketmq.v2.MessagingService/SendMessage",
            response_deserializer=spb.SendMessageResponse.FromString,
        )
        assert code(garbage(b"\xff\xff\xff\x0f not a protobuf", timeout=5).status) == "BAD_REQUEST"
    assert code(stub.QueryRoute(route_request(T), timeout=5).status) == "OK"


def test_receive_ack_invisible_time_tags_and_long_polling(stub: Any) -> None:
    sent = send(stub, message(T, b"a1", tag="A"), message(T, b"b1", tag="B"), message(T, b"a2", tag="A"))
    assert code(sent.status) == "OK" and all(code(e.status) == "OK" for e in sent.entries)
    ids = {e.message_id for e in sent.entries}
    assert len(ids) == 3

    # a tag filter: only the A messages, each once
    got = receive_all(stub, "g-tags", 2, tag="A", invisible_s=1)
    assert sorted(m.body for m in got) == [b"a1", b"a2"]
    assert all(m.system_properties.tag == "A" and m.system_properties.delivery_attempt == 1 for m in got)
    assert {m.system_properties.message_id for m in got} <= ids
    first, second = sorted(got, key=lambda m: m.body)
    assert code(ack(stub, "g-tags", first)) == "OK"
    assert code(ack(stub, "g-tags", first)) == "OK"  # a repeated ack (its answer lost) succeeds

    # not acked within its invisible time: it comes back, under a new handle, attempt 2
    again = receive_all(stub, "g-tags", 1, tag="A", invisible_s=30, poll_s=3)
    assert [m.body for m in again] == [b"a2"]
    assert again[0].system_properties.delivery_attempt == 2
    assert again[0].system_properties.message_id == second.system_properties.message_id
    assert code(ack(stub, "g-tags", second)) == "INVALID_RECEIPT_HANDLE"  # the old handle is stale

    # a new invisible time gives a new handle and stales the current one
    change = spb.ChangeInvisibleDurationRequest(
        group=pb.Resource(name="g-tags"),
        topic=pb.Resource(name=T),
        receipt_handle=again[0].system_properties.receipt_handle,
        message_id=again[0].system_properties.message_id,
    )
    change.invisible_duration.FromSeconds(60)
    changed = stub.ChangeInvisibleDuration(change, timeout=10)
    assert code(changed.status) == "OK" and changed.receipt_handle != change.receipt_handle
    assert code(ack(stub, "g-tags", again[0])) == "INVALID_RECEIPT_HANDLE"
    assert code(ack(stub, "g-tags", None, handle=changed.receipt_handle)) == "OK"
    status, none = receive(stub, "g-tags", tag="A", poll_s=0.5)
    assert code(status) == "MESSAGE_NOT_FOUND" and none == []

    # another group sees every message; B alone for a B filter
    assert sorted(m.body for m in receive_all(stub, "g-all", 3)) == [b"a1", b"a2", b"b1"]
    assert [m.body for m in receive_all(stub, "g-b", 1, tag="B")] == [b"b1"]

    # long polling: a receive waiting when the message is sent gets it
    result: list[Any] = []
    waiter = threading.Thread(target=lambda: result.append(receive(stub, "g-all", poll_s=15)))
    waiter.start()
    time.sleep(1)
    assert code(send(stub, message(T, b"late")).status) == "OK"
    waiter.join(30)
    assert not waiter.is_alive()
    status, late = result[0]
    assert code(status) == "OK" and [m.body for m in late] == [b"late"]


def test_fifo_delay_and_transactions(stub: Any) -> None:
    # FIFO: a message group's messages go to one queue, in order
    bodies = [f"f{i}".encode() for i in range(6)]
    for b in bodies:
        assert code(send(stub, message("ProxyFifo", b, kind="FIFO", message_group="order-7")).status) == "OK"
    got = receive_all(stub, "g-fifo", 6, topic="ProxyFifo")
    assert len({m.system_properties.queue_id for m in got}) == 1
    assert sorted(got, key=lambda m: m.system_properties.queue_offset) == sorted(got, key=lambda m: m.body)
    assert [m.body for m in sorted(got, key=lambda m: m.system_properties.queue_offset)] == bodies
    assert all(m.system_properties.message_group == "order-7" for m in got)
    assert all(m.system_properties.message_type == pb.MessageType.FIFO for m in got)

    # delayed: not delivered before its delivery timestamp
    due = int(time.time() * 1000) + 2000
    assert code(send(stub, message("ProxyDelay", b"later", kind="DELAY", delivery_ms=due)).status) == "OK"
    got = receive_all(stub, "g-delay", 1, topic="ProxyDelay", poll_s=2)
    assert [m.body for m in got] == [b"later"]
    assert time.time() * 1000 >= due

    # transactions: a half message is invisible until committed; a rolled-back one never shows
    commit_me = message("ProxyTx", b"commit", kind="TRANSACTION")
    roll_me = message("ProxyTx", b"rollback", kind="TRANSACTION")
    halves = [send(stub, commit_me), send(stub, roll_me)]
    assert all(code(h.status) == "OK" and h.entries[0].transaction_id for h in halves)
    status, none = receive(stub, "g-tx", topic="ProxyTx", poll_s=0.5)
    assert code(status) == "MESSAGE_NOT_FOUND" and none == []

    def end(m: Any, answer: Any, resolution: str, tx_id: str | None = None) -> str:
        req = spb.EndTransactionRequest(
            topic=pb.Resource(name="ProxyTx"),
            message_id=m.system_properties.message_id,
            transaction_id=tx_id if tx_id is not None else answer.entries[0].transaction_id,
            resolution=pb.TransactionResolution.Value(resolution),
            source=pb.TransactionSource.SOURCE_CLIENT,
        )
        return code(stub.EndTransaction(req, timeout=10).status)

    assert end(commit_me, halves[0], "COMMIT", tx_id="not-ours") == "INVALID_TRANSACTION_ID"
    assert end(roll_me, halves[1], "ROLLBACK") == "OK"
    assert end(commit_me, halves[0], "COMMIT") == "OK"
    got = receive_all(stub, "g-tx", 1, topic="ProxyTx", poll_s=3)
    assert [m.body for m in got] == [b"commit"]
    assert got[0].system_properties.message_id == commit_me.system_properties.message_id
    status, none = receive(stub, "g-tx", topic="ProxyTx", poll_s=0.5)
    assert code(status) == "MESSAGE_NOT_FOUND" and none == []


# ---------------------------------------------------------------------- ACL, TLS, dead letters, SQL92


def spawn_proxy(cluster: LocalCluster, name: str, *extra: str) -> str:
    """Another proxy process in front of the same cluster (stopped with it); its address."""
    addr = f"127.0.0.1:{free_port('127.0.0.1')}"
    argv = [sys.executable, "-m", "proxy", "--namesrv", cluster.namesrv_addr, "--listen", addr, *extra]
    log = Path(cluster.base_dir) / name / "proxy.log"
    cluster.spawn(name, argv, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while "proxy=" not in (log.read_text() if log.exists() else ""):
        assert cluster.is_running(name), log.read_text()
        assert time.monotonic() < deadline, f"{name} did not start"
        time.sleep(0.1)
    return addr


def signed(access_key: str, secret_key: str) -> list[tuple[str, str]]:
    """The metadata a 5.x client with credentials sends (rocketmq.v5.util.Signature)."""
    now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    sig = hmac.new(secret_key.encode(), now.encode(), hashlib.sha1).hexdigest()
    auth = f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={sig}"
    return [("x-mq-date-time", now), ("authorization", auth), ("x-mq-client-id", "test")]


def test_rocketmq5_authentication_against_the_acl(cluster: LocalCluster, tmp_path: Path) -> None:
    acl = tmp_path / "acl.toml"
    acl.write_text(
        '[[accounts]]\naccess_key = "alice"\nsecret_key = "alice-secret"\ntopic_perms = ["ProxyT=PUB"]\n\n'
        '[[accounts]]\naccess_key = "bob"\nsecret_key = "bob-secret"\n'
        'topic_perms = ["ProxyT=PUB|SUB"]\ngroup_perms = ["g-bob=SUB"]\n'
    )
    addr = spawn_proxy(cluster, "proxy-acl", "--acl-file", str(acl))
    with grpc.insecure_channel(addr) as ch:
        stub = sgrpc.MessagingServiceStub(ch)
        req = spb.SendMessageRequest(messages=[message(T, b"acl")])
        assert code(stub.SendMessage(req, timeout=10).status) == "UNAUTHORIZED"
        assert (
            code(stub.SendMessage(req, timeout=10, metadata=signed("alice", "wrong-secret")).status)
            == "UNAUTHORIZED"
        )
        assert (
            code(stub.SendMessage(req, timeout=10, metadata=signed("mallory", "x" * 8)).status)
            == "UNAUTHORIZED"
        )
        assert (
            code(stub.SendMessage(req, timeout=10, metadata=signed("alice", "alice-secret")).status) == "OK"
        )
        ask = spb.ReceiveMessageRequest(
            group=pb.Resource(name="g-bob"),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=T), broker=pb.Broker(name="broker-a")),
            batch_size=1,
        )
        ask.invisible_duration.FromSeconds(30)
        ask.long_polling_timeout.FromSeconds(1)

        def status_of(metadata: Any) -> str:
            answers = list(stub.ReceiveMessage(ask, timeout=15, metadata=metadata))
            return code(next(a.status for a in answers if a.HasField("status")))

        assert status_of(signed("alice", "alice-secret")) == "FORBIDDEN"  # no SUB
        assert status_of(signed("bob", "bob-secret")) == "OK"
        assert status_of(None) == "UNAUTHORIZED"


def test_tls(cluster: LocalCluster, tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from test_ledger_security import make_ca_and_cert

    pki = make_ca_and_cert(tmp_path / "pki", ["127.0.0.1"])
    addr = spawn_proxy(
        cluster, "proxy-tls", "--tls-cert", pki["tls_cert_file"], "--tls-key", pki["tls_key_file"]
    )
    creds = grpc.ssl_channel_credentials(Path(pki["tls_ca_file"]).read_bytes())
    with grpc.secure_channel(addr, creds) as ch:
        assert code(sgrpc.MessagingServiceStub(ch).QueryRoute(route_request(T), timeout=10).status) == "OK"
    with grpc.insecure_channel(addr) as ch, pytest.raises(grpc.RpcError):
        sgrpc.MessagingServiceStub(ch).QueryRoute(route_request(T), timeout=3)


def test_sql92_filter_and_dead_letter_forward(cluster: LocalCluster, stub: Any) -> None:
    msgs = [message("ProxyDelay", f"n{i}".encode()) for i in range(6)]
    for i, m in enumerate(msgs):
        m.user_properties["n"] = str(i)
    assert code(send(stub, *msgs).status) == "OK"
    req = spb.ReceiveMessageRequest(
        group=pb.Resource(name="g-sql"),
        message_queue=pb.MessageQueue(
            topic=pb.Resource(name="ProxyDelay"), broker=pb.Broker(name="broker-a")
        ),
        filter_expression=pb.FilterExpression(type=pb.FilterType.SQL, expression="n > 3"),
        batch_size=8,
    )
    req.invisible_duration.FromSeconds(30)
    req.long_polling_timeout.FromSeconds(1)
    got: list[Any] = []
    for _ in range(10):
        got += [a.message for a in stub.ReceiveMessage(req, timeout=15) if a.HasField("message")]
        if len(got) >= 2:
            break
    assert sorted(m.body for m in got) == [b"n4", b"n5"]
    assert got[0].user_properties["n"] in ("4", "5")
    bad = spb.ReceiveMessageRequest()
    bad.CopyFrom(req)
    bad.filter_expression.expression = "n >>> 3"
    answers = list(stub.ReceiveMessage(bad, timeout=15))
    assert code(answers[0].status) == "ILLEGAL_FILTER_EXPRESSION"

    # a consumer gives up on a message: it goes to the group's dead-letter topic, acked here
    dead = got[0]
    forward = spb.ForwardMessageToDeadLetterQueueRequest(
        group=pb.Resource(name="g-sql"),
        topic=pb.Resource(name="ProxyDelay"),
        receipt_handle=dead.system_properties.receipt_handle,
        message_id=dead.system_properties.message_id,
        delivery_attempt=1,
        max_delivery_attempts=1,
    )
    answer = stub.ForwardMessageToDeadLetterQueue(forward, timeout=10).status
    assert code(answer) == "OK", (answer, forward.receipt_handle)

    async def dead_letters() -> list[bytes]:
        async with AdminClient(cluster.namesrv_addr) as admin:
            for _ in range(50):
                found = await admin.group_messages("g-sql", dead=True)
                if found:
                    return [bytes(m.body) for m in found]
                await asyncio.sleep(0.2)
        return []

    assert asyncio.run(dead_letters()) == [dead.body]


def test_state_survives_another_proxy_and_a_master_failover(cluster: LocalCluster, stub: Any) -> None:
    """Receipt handles are the brokers' state, not the proxy's: one proxy's handle is acked
    through another, and across a kill of the group's master an acked message stays acked and
    an un-acked one comes back (runs last: it leaves the group with two brokers)."""
    assert code(send(stub, *(message(F, b) for b in (b"keep", b"done", b"other"))).status) == "OK"
    got = {m.body: m for m in receive_all(stub, "g-failover", 3, topic=F, invisible_s=4)}
    assert set(got) == {b"keep", b"done", b"other"}
    second = spawn_proxy(cluster, "proxy-b")
    with grpc.insecure_channel(second) as ch:
        assert code(ack(sgrpc.MessagingServiceStub(ch), "g-failover", got[b"other"], topic=F)) == "OK"
    assert code(ack(stub, "g-failover", got[b"done"], topic=F)) == "OK"

    master = asyncio.run(cluster.masters())["broker-a"]
    victim = next(f"broker-a/{n}" for n, (addr, _) in cluster.brokers["broker-a"].items() if addr == master)
    cluster.kill(victim)
    back: list[Any] = []
    for _ in range(20):  # each receive long-polls up to 3 s; the proxy finds the new master
        status, found = receive(stub, "g-failover", F, invisible_s=30, poll_s=3)
        back += found
        if back:
            break
    assert [m.body for m in back] == [b"keep"]
    assert back[0].system_properties.delivery_attempt == 2
    assert code(ack(stub, "g-failover", back[0], topic=F)) == "OK"
    status, none = receive(stub, "g-failover", F, poll_s=1)
    assert code(status) == "MESSAGE_NOT_FOUND" and none == []
    assert asyncio.run(cluster.masters())["broker-a"] != master


# ---------------------------------------------------------------------- FIFO consumption (orderly POP)


def test_fifo_group_gets_a_queues_next_message_only_once_the_previous_is_acked(cluster: LocalCluster) -> None:
    topic = "ProxyOrderly"
    wait_for(cluster, {topic: 1})
    addr = spawn_proxy(cluster, "proxy-fifo", "--fifo-groups", "fifo-readers")
    with grpc.insecure_channel(addr) as ch:
        stub = sgrpc.MessagingServiceStub(ch)
        sent = send(
            stub, *(message(topic, f"o{i}".encode(), kind="FIFO", message_group="g1") for i in range(3))
        )
        assert all(code(e.status) == "OK" for e in sent.entries), sent

        # a group that is not FIFO gets the three at once
        status, plain = receive(stub, "plain-readers", topic, n=3, poll_s=2)
        assert sorted(m.body for m in plain) == [b"o0", b"o1", b"o2"], plain
        # the FIFO group: one message of the queue at a time, the next only after the ack
        status, first = receive(stub, "fifo-readers", topic, n=3, invisible_s=30, poll_s=1)
        assert [m.body for m in first] == [b"o0"], first
        status, none = receive(stub, "fifo-readers", topic, n=3, poll_s=0.5)
        assert code(status) == "MESSAGE_NOT_FOUND" and none == []  # o0 is in flight: nothing after it
        assert code(ack(stub, "fifo-readers", first[0], topic)) == "OK"
        status, second = receive(stub, "fifo-readers", topic, n=1, invisible_s=1, poll_s=1)
        assert [m.body for m in second] == [b"o1"]
        # not acked: once its invisible time is over it comes again, before o2
        status, again = receive(stub, "fifo-readers", topic, n=3, invisible_s=30, poll_s=5)
        assert [m.body for m in again] == [b"o1"] and again[0].system_properties.delivery_attempt == 2
        # a receive waiting for the queue gets o2 as soon as o1 is acked
        result: list[Any] = []
        waiter = threading.Thread(
            target=lambda: result.append(receive(stub, "fifo-readers", topic, n=3, poll_s=15))
        )
        waiter.start()
        time.sleep(0.5)
        assert code(ack(stub, "fifo-readers", again[0], topic)) == "OK"
        waiter.join(30)
        assert not waiter.is_alive()
        status, last = result[0]
        assert [m.body for m in last] == [b"o2"], last
