"""Inter-node requests prove the cluster secret: brokers' registrations with a nameserver,
and a broker group's ledger port, which serves no client that does not hold the secret."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from test_remoting_bounds import namesrv_factory  # noqa: F401 - fixture

from broker.config import BrokerConfig
from common.cluster_secret import load_cluster_secret, write_cluster_secret
from common.settings import ConfigError
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.acl import AccessValidator, RequestSigner, accounts_from_doc
from remoting.cluster_auth import CLUSTER_SIGNATURE, CLUSTER_TIME, ClusterGate, ClusterSigner, chain_hooks
from remoting.protocol import SERIALIZE_JSON, SERIALIZE_ROCKETMQ, FrameDecoder, encode_command

pytestmark = pytest.mark.timeout(120)

SECRET = b"s" * 32
OTHER = b"o" * 32
NOW = 1_700_000_000.0


def over_the_wire(cmd: RemotingCommand, serialize_type: int = SERIALIZE_ROCKETMQ) -> RemotingCommand:
    """The request as the receiver decodes it (every extField a string)."""
    cmd.opaque = 7
    cmd.serialize_type = serialize_type
    decoder = FrameDecoder()
    (frame,) = decoder.feed(encode_command(cmd))
    assert isinstance(frame, RemotingCommand)
    return frame


def registration(**headers: Any) -> RemotingCommand:
    base = {"brokerName": "broker-a", "brokerAddr": "127.0.0.1:10911", "clusterName": "C", "brokerId": 0}
    return RemotingCommand.request(
        RequestCode.REGISTER_BROKER, {**base, **headers}, b'{"topicConfigSerializeWrapper":{}}'
    )


def gate(*secrets: bytes, inner: Any = None, now: float = NOW) -> ClusterGate:
    return ClusterGate(secrets or (SECRET,), inner, clock=lambda: now)


@pytest.mark.parametrize("serialize_type", [SERIALIZE_ROCKETMQ, SERIALIZE_JSON])
def test_a_signed_registration_passes_and_every_tampering_is_refused(serialize_type: int) -> None:
    req = registration()
    ClusterSigner(SECRET, clock=lambda: NOW)(req)
    assert gate().check(None, over_the_wire(req, serialize_type)) is None
    assert gate(OTHER, SECRET).check(None, over_the_wire(req, serialize_type)) is None  # during a rotation

    for change in ("header", "body", "code", "secret"):
        forged = over_the_wire(req, serialize_type)
        if change == "header":
            forged.headers["brokerAddr"] = "10.0.0.66:10911"  # routes pointed at an attacker's listener
        elif change == "body":
            forged.body = b'{"topicConfigSerializeWrapper":{"x":1}}'
        elif change == "code":
            forged.code = int(RequestCode.UNREGISTER_BROKER)
        refusal = gate(OTHER if change == "secret" else SECRET).check(None, forged)
        assert refusal is not None and refusal.code == ResponseCode.NO_PERMISSION, change
        assert "does not verify" in refusal.remark


def test_unsigned_stale_and_future_registrations_are_refused_with_the_reason() -> None:
    unsigned = gate().check(None, over_the_wire(registration()))
    assert unsigned is not None and unsigned.code == ResponseCode.NO_PERMISSION
    assert "requires the cluster secret" in unsigned.remark and "REGISTER_BROKER" in unsigned.remark
    for skew in (-301.0, 301.0):
        req = registration()
        ClusterSigner(SECRET, clock=lambda s=skew: NOW + s)(req)
        refusal = gate().check(None, over_the_wire(req))
        assert refusal is not None and "from the receiver's clock" in refusal.remark
    req = registration()
    ClusterSigner(SECRET, clock=lambda: NOW)(req)
    wire = over_the_wire(req)
    wire.headers[CLUSTER_TIME] = "12e3"
    assert "not a time" in gate().check(None, wire).remark  # type: ignore[union-attr]


def test_client_requests_pass_the_cluster_gate_to_the_acl_behind_it() -> None:
    accounts = accounts_from_doc(
        {"accounts": [{"access_key": "root", "secret_key": "root-secret", "admin": True}]}, "test"
    )
    g = gate(inner=AccessValidator(accounts, require_signature=False))
    lookup = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert g.check(None, over_the_wire(lookup)) is None  # lookups stay open
    req = registration()
    hook = chain_hooks(ClusterSigner(SECRET, clock=lambda: NOW), RequestSigner("root", "root-secret"))
    assert hook is not None
    hook(req)  # the ACL signature covers the cluster proof, which leaves ACL's fields out
    assert g.check(None, over_the_wire(req)) is None
    unsigned_acl = registration()
    ClusterSigner(SECRET, clock=lambda: NOW)(unsigned_acl)
    refusal = g.check(None, over_the_wire(unsigned_acl))
    assert refusal is not None and "not signed" in refusal.remark  # ACL still wants its signature
    assert CLUSTER_SIGNATURE in req.headers


def test_a_broker_needs_a_cluster_secret(tmp_path: Path) -> None:
    def config(**extra: Any) -> BrokerConfig:
        return BrokerConfig(
            broker_name="b",
            node_id="n1",
            group=["n1=127.0.0.1:10911@127.0.0.1:20911"],
            namesrv_addr=["127.0.0.1:9876"],
            data_dir=str(tmp_path),
            **extra,
        )

    with pytest.raises(ConfigError, match="a broker needs the cluster secret"):
        config().validate()
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        config(cluster_secret="short").validate()
    path = write_cluster_secret(tmp_path / "cluster.secret")
    assert path.stat().st_mode & 0o777 == 0o600 and len(load_cluster_secret("", str(path))) == 64
    cfg = config(cluster_secret_file=str(path))
    cfg.validate()
    ledger = cfg.ledger_config()
    assert ledger.client_auth and ledger.secret == cfg.secret  # the ledger port serves no stranger


def test_a_nameserver_with_the_secret_refuses_unproven_registrations(
    namesrv_factory: Any,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    secret_file = write_cluster_secret(tmp_path / "cluster.secret")
    ns = namesrv_factory(cluster_secret_file=str(secret_file))
    secret = load_cluster_secret("", str(secret_file))

    async def main() -> None:
        async with RemotingClient() as plain, RemotingClient(rpc_hook=ClusterSigner(secret)) as signed:
            refused = await plain.invoke_sync(ns.addr, registration(), 5.0)
            assert refused.code == ResponseCode.NO_PERMISSION and "cluster secret" in refused.remark
            wrong = RemotingClient(rpc_hook=ClusterSigner(OTHER))
            async with wrong:
                refused = await wrong.invoke_sync(ns.addr, registration(), 5.0)
            assert refused.code == ResponseCode.NO_PERMISSION and "does not verify" in refused.remark
            routes = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
            table = json.loads(bytes((await plain.invoke_sync(ns.addr, routes, 5.0)).body))
            assert not table.get("brokerAddrTable")  # nothing was registered by the refused ones
            ok = await signed.invoke_sync(ns.addr, registration(), 5.0)
            assert ok.code == ResponseCode.SUCCESS, ok.remark
            table = json.loads(bytes((await plain.invoke_sync(ns.addr, routes, 5.0)).body))
            assert "broker-a" in table["brokerAddrTable"]

    asyncio.run(main())
