"""The proxy's pure parts, no cluster: message conversion both ways, receipt handles and
transaction ids (what it gives out and what it refuses), RocketMQ 5's signature check."""

from __future__ import annotations

import time
import zipfile
import zlib
from pathlib import Path

import pytest

from proxy.auth import Authenticator, AuthError, sign
from proxy.convert import BadRequest, Handle, TxRef, parse_handle, parse_tx, to_remoting, to_v2
from proxy.protocol import pb
from proxy.protocol_build import ProtocolBuildError, built, extract
from remoting.acl import PUB, SUB, Account
from remoting.message import Message

NOW = 1_800_000_000_000


def v2(body: bytes = b"hi", **sysp: object) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name="T"), body=body)
    m.system_properties.message_id = "01ABCDEF"
    m.system_properties.message_type = pb.MessageType.Value(str(sysp.pop("kind", "NORMAL")))
    for key, value in sysp.items():
        if key == "delivery_ms":
            m.system_properties.delivery_timestamp.FromMilliseconds(int(str(value)))
        else:
            setattr(m.system_properties, key, value)
    return m


def test_messages_in_keep_the_id_tags_keys_group_and_delivery_time() -> None:
    m = v2(tag="TagA", message_group="g1", kind="FIFO")
    m.system_properties.keys.extend(["k1", "k2"])
    m.user_properties["color"] = "red"
    out = to_remoting(m, 100, NOW, pb.MessageType)
    assert (out.kind, out.group) == ("FIFO", "g1")
    msg = out.message
    assert (msg.topic, msg.body, msg.tags, msg.keys) == ("T", b"hi", "TagA", ["k1", "k2"])
    assert msg.properties == {"color": "red", "UNIQ_KEY": "01ABCDEF", "__SHARDINGKEY": "g1"}
    later = to_remoting(v2(kind="DELAY", delivery_ms=NOW + 5000), 100, NOW, pb.MessageType).message
    assert later.properties["TIMER_DELIVER_MS"] == str(NOW + 5000)


@pytest.mark.parametrize(
    ("msg", "code"),
    [
        (v2(b""), "MESSAGE_BODY_EMPTY"),
        (v2(b"x" * 101), "MESSAGE_BODY_TOO_LARGE"),
        (v2(kind="FIFO"), "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"),
        (v2(message_group="g", kind="NORMAL"), "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"),
        (v2(kind="TRANSACTION", delivery_ms=NOW + 1000), "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"),
        (v2(kind="DELAY", delivery_ms=NOW + 10 * 24 * 3600 * 1000), "ILLEGAL_DELIVERY_TIME"),
        (v2(tag="a||b"), "ILLEGAL_MESSAGE_TAG"),
        (v2(tag="a\x01b"), "ILLEGAL_MESSAGE_TAG"),
        (v2(message_id=""), "ILLEGAL_MESSAGE_ID"),
        (v2(kind="LITE"), "UNSUPPORTED"),
    ],
)
def test_bad_messages_get_rocketmq_codes(msg: pb.Message, code: str) -> None:
    with pytest.raises(BadRequest) as err:
        to_remoting(msg, 100, NOW, pb.MessageType)
    assert err.value.code == code


def test_reserved_user_property_is_refused() -> None:
    m = v2()
    m.user_properties["UNIQ_KEY"] = "mine"
    with pytest.raises(BadRequest) as err:
        to_remoting(m, 100, NOW, pb.MessageType)
    assert err.value.code == "ILLEGAL_MESSAGE_PROPERTY_KEY"


def test_messages_out_carry_what_a_5x_consumer_reads() -> None:
    stored = Message(
        "T",
        b"body",
        tags="TagA",
        keys=["k"],
        properties={"UNIQ_KEY": "01ABC", "color": "red", "__SHARDINGKEY": "g1", "WAIT": "true"},
        queue_id=3,
        queue_offset=7,
        born_ms=NOW,
        store_ms=NOW + 1,
        reconsume_times=2,
    )
    out = to_v2(stored, pb, "handle", 5000)
    sysp = out.system_properties
    assert dict(out.user_properties) == {"color": "red"}
    assert (sysp.message_id, sysp.tag, list(sysp.keys)) == ("01ABC", "TagA", ["k"])
    assert (sysp.queue_id, sysp.queue_offset, sysp.delivery_attempt) == (3, 7, 3)
    assert (sysp.message_group, sysp.message_type) == ("g1", pb.MessageType.FIFO)
    assert sysp.receipt_handle == "handle" and sysp.invisible_duration.ToMilliseconds() == 5000
    assert sysp.body_digest.checksum == format(zlib.crc32(b"body"), "08X")
    assert sysp.born_timestamp.ToMilliseconds() == NOW


def test_receipt_handles_and_transaction_ids_round_trip_and_junk_is_refused() -> None:
    h = Handle(3, NOW, 30000, "broker-a", 1, 9, 524288)
    assert parse_handle(h.text()) == h
    assert h.extra_info() == f"3 {NOW} 30000 0 0 broker-a 1 9"
    for junk in (
        "",
        "garbage",
        h.extra_info(),
        h.text() + " 1",
        h.text().replace("broker-a", ""),
        "a b c d e f g h i",
    ):
        with pytest.raises(BadRequest) as err:
            parse_handle(junk)
        assert err.value.code == "INVALID_RECEIPT_HANDLE"
    tx = TxRef("broker-a", 4, 524288, "pg", "01ABC")
    assert parse_tx(tx.text()) == tx
    for junk in ("", "x|1|2|pg", "b|x|2|pg|t", "b|-1|2|pg|t"):
        with pytest.raises(BadRequest) as err:
            parse_tx(junk)
        assert err.value.code == "INVALID_TRANSACTION_ID"


def test_signatures_and_permissions() -> None:
    alice = Account("alice", "alice-secret", topic_perms={"T": PUB}, group_perms={"g": SUB})
    auth = Authenticator({"alice": alice})
    now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())

    def md(ak: str, secret: str, signed: str = "x-mq-date-time") -> list[tuple[str, str]]:
        value = f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders={signed}, Signature={sign(secret, now)}"
        return [("x-mq-date-time", now), ("authorization", value)]

    assert auth.check(md("alice", "alice-secret")) is alice
    for bad in (None, md("alice", "nope"), md("bob", "alice-secret"), md("alice", "alice-secret", "host")):
        with pytest.raises(AuthError) as err:
            auth.check(bad)
        assert err.value.code == "UNAUTHORIZED"
    with pytest.raises(AuthError):
        auth.check([("x-mq-date-time", now), ("authorization", "Basic abc")])
    auth.allow_topic(alice, "T", PUB)
    with pytest.raises(AuthError) as err:
        auth.allow_topic(alice, "T", SUB)
    assert err.value.code == "FORBIDDEN"
    auth.allow_group(alice, "g")
    with pytest.raises(AuthError):
        auth.allow_group(alice, "other")
    assert Authenticator().check(None) is None  # no ACL: everything is taken


def test_protocol_build_refuses_a_wheel_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    wheel = tmp_path / "rocketmq_python_client-5.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("rocketmq/grpc_protocol/service_pb2.py", "raise SystemExit('not Apache')\n")
    with pytest.raises(ProtocolBuildError, match="SHA-256"):
        extract(wheel, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not built(tmp_path / "out")


def test_fifo_groups_are_told_so_in_the_settings_and_parsed_from_the_command_line() -> None:
    from types import SimpleNamespace

    from proxy.server import parse_args
    from proxy.service import MessagingService, ServiceConfig

    opts = parse_args(["--namesrv", "127.0.0.1:9876", "--fifo-groups", " orders , ,audit"])
    assert opts.fifo_groups == frozenset({"orders", "audit"})
    service = MessagingService(
        SimpleNamespace(on_check=None),  # type: ignore[arg-type]
        ServiceConfig(fifo_groups=opts.fifo_groups),
        Authenticator({}),
    )
    for group, fifo in (("orders", True), ("other", False)):
        theirs = pb.Settings()
        theirs.subscription.group.name = group
        assert service.settings_for(theirs).subscription.fifo is fifo
