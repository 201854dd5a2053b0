"""Broker membership without processes: the broker-address record, the state's table, the
config's ``join``, the proof of the cluster secret, the admin commands' arguments, ACL rules."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from broker.cli import main as broker_main
from broker.config import BrokerConfig
from broker.membership import (
    MEMBER_CODES,
    GroupMembership,
    change_proof_problem,
    host_port_error,
    node_number,
)
from broker.meta import BrokerAddrOp, MetaError, broker_addrs_op, parse_meta, topic_op
from broker.registration import BrokerIdentity, BrokerOuterAPI
from broker.state import MAX_BROKER_ADDR_TABLE, BrokerState
from client.admin import main as admin_main
from common.process import free_port
from common.settings import ConfigError
from ledger.config import MAX_DIAL_OVERRIDES
from ledger.embed import MembershipView
from remoting.acl import OPEN_CODES, RULES
from remoting.cluster_auth import sign_request
from remoting.codes import RequestCode
from remoting.protocol import RemotingCommand
from remoting.topic import TopicConfigWrapper

SECRET = b"0123456789abcdef0123456789abcdef"


def apply(state: BrokerState, *payloads: bytes) -> None:
    state.apply([(state.applied + 1 + i, p) for i, p in enumerate(payloads)])


def test_broker_address_records_set_move_and_drop_entries_the_same_way_everywhere() -> None:
    state = BrokerState()
    apply(
        state,
        broker_addrs_op({"n1": "127.0.0.1:10911", "n2": "127.0.0.2:10911"}),
        broker_addrs_op({"n4": "[::1]:10911"}, drop=["n2"]),
        broker_addrs_op({"n1": "127.0.0.9:10911"}),  # a set moves its entry to the end
    )
    assert list(state.broker_addrs.items()) == [("n4", "[::1]:10911"), ("n1", "127.0.0.9:10911")]
    assert state.skipped_entries == 0 and state.data_version.counter == 0  # no topic changed
    assert parse_meta(broker_addrs_op({"n1": "h:1"}, ["n2"])) == BrokerAddrOp((("n1", "h:1"),), ("n2",))


def test_the_broker_address_table_is_bounded_oldest_first() -> None:
    state = BrokerState()
    for i in range(MAX_BROKER_ADDR_TABLE // 64 + 1):
        apply(state, broker_addrs_op({f"n{i * 64 + k}": f"h:{k + 1}" for k in range(64)}))
    assert len(state.broker_addrs) == MAX_BROKER_ADDR_TABLE
    assert "n0" not in state.broker_addrs and f"n{MAX_BROKER_ADDR_TABLE + 63}" in state.broker_addrs


BAD_BROKER_RECORDS = [
    b'\x02{"op":"brokers"}',  # sets and drops nothing
    b'\x02{"op":"brokers","set":[["n1","h:1"]]}',
    b'\x02{"op":"brokers","set":{"n1":"no-port"}}',
    b'\x02{"op":"brokers","set":{"n1":"h:0"}}',
    b'\x02{"op":"brokers","set":{"n1":"h:65536"}}',
    b'\x02{"op":"brokers","set":{"n1":"a b:1"}}',
    b'\x02{"op":"brokers","set":{"n1":7}}',
    b'\x02{"op":"brokers","set":{"1n":"h:1"}}',
    b'\x02{"op":"brokers","set":{"n=1":"h:1"}}',
    b'\x02{"op":"brokers","set":{"n1":"' + b"h" * 300 + b':1"}}',
    b'\x02{"op":"brokers","drop":"n1"}',
    b'\x02{"op":"brokers","drop":[1]}',
    b'\x02{"op":"brokers","set":{' + b",".join(b'"n%d":"h:1"' % i for i in range(65)) + b"}}",
]


@pytest.mark.parametrize("payload", BAD_BROKER_RECORDS, ids=range(len(BAD_BROKER_RECORDS)))
def test_a_broker_address_record_no_replica_can_apply_is_skipped_and_the_rest_goes_on(payload: bytes) -> None:
    with pytest.raises(MetaError):
        parse_meta(payload)
    state = BrokerState()
    apply(state, broker_addrs_op({"n1": "h:1"}), payload, topic_op("T", 1, 1, 6))
    assert state.applied == 3 and state.skipped_entries == 1
    assert state.broker_addrs == {"n1": "h:1"} and "T" in state.topics


def _config(tmp_path: Path, **kw: object) -> BrokerConfig:
    cfg = BrokerConfig(
        broker_name="broker-a",
        node_id=str(kw.pop("node_id", "n4")),
        group=list(
            kw.pop("group", ["n1=127.0.0.1:10911@127.0.0.1:20911", "n4=127.0.0.4:10911@127.0.0.4:20911"])
        ),  # type: ignore[arg-type]
        namesrv_addr=["127.0.0.1:9876"],
        data_dir=str(tmp_path),
        cluster_secret=SECRET.decode(),
        **kw,  # type: ignore[arg-type]
    )
    cfg.validate()
    return cfg


def test_a_joining_broker_asks_the_others_and_bootstraps_no_configuration(tmp_path: Path) -> None:
    led = _config(tmp_path, join=True).ledger_config()
    assert led.join == ["127.0.0.1:20911"] and led.peers == ["n4=127.0.0.4:20911"]
    plain = _config(tmp_path).ledger_config()
    assert plain.join == [] and len(plain.peers) == 2
    with pytest.raises(ConfigError, match="at least one member of the running group"):
        _config(tmp_path, join=True, group=["n4=127.0.0.4:10911@127.0.0.4:20911"])


def _signed(code: int, secret: bytes, *, skew_ms: int = 0) -> RemotingCommand:
    req = RemotingCommand.request(code, {"nodeId": "n4"})
    sign_request(req, secret, int(time.time() * 1000) + skew_ms)
    return req


def test_membership_changes_must_prove_the_cluster_secret() -> None:
    code = RequestCode.REMOVE_GROUP_MEMBER
    assert change_proof_problem((SECRET,), _signed(code, SECRET), 300) is None
    unsigned = RemotingCommand.request(code, {"nodeId": "n4"})
    assert "--cluster-secret-file" in (change_proof_problem((SECRET,), unsigned, 300) or "")
    other = _signed(code, b"another secret of 32 bytes......")
    assert "does not verify" in (change_proof_problem((SECRET,), other, 300) or "")
    tampered = _signed(code, SECRET)
    tampered.headers["nodeId"] = "n1"  # the proof covers the headers: a replay cannot aim elsewhere
    assert "does not verify" in (change_proof_problem((SECRET,), tampered, 300) or "")
    assert "clock" in (change_proof_problem((SECRET,), _signed(code, SECRET, skew_ms=-600_000), 300) or "")


def test_every_membership_code_is_for_admins_only() -> None:
    for code in MEMBER_CODES:
        assert RULES[int(code)].admin and int(code) not in OPEN_CODES, code.name


def test_node_ids_and_addresses() -> None:
    assert node_number("n4") == 4 and node_number("broker7") == 7 and node_number("n") is None
    assert node_number("4") is None and host_port_error("127.0.0.1:10911") is None
    assert host_port_error("127.0.0.1") and host_port_error("h:0") and host_port_error("h@x:1")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["member-add", "-b", "broker-a", "n4"], "expected ID=BROKER_HOST:PORT"),
        (["member-add", "-b", "broker-a", "=h:1"], "expected ID=BROKER_HOST:PORT"),
        (["member-add", "n4=h:1"], "Missing option '-b'"),
        (["member-remove", "-b", "broker-a", "--cluster-secret-file", "/nonexistent", "n2"], "cannot read"),
        (["member-list", "-b", "broker-a"], "no nameserver address"),
    ],
)
def test_admin_membership_commands_refuse_bad_arguments_plainly(args: list[str], words: str) -> None:
    result = CliRunner().invoke(admin_main, args, env={"NAMESRV_ADDR": ""})
    assert result.exit_code == 2 and words in result.output, result.output


def _view(index: int, voters: list[str], removed: tuple[str, ...] = ()) -> MembershipView:
    return MembershipView({n: f"127.0.0.{n[1:]}:20911" for n in voters}, {}, index, True, removed)


def test_a_removed_broker_stops_registering_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Once its removal reaches it, a broker's registration rounds send nothing (a closed port as
    the nameserver: a round that tried would come back failed), and its log says why, once."""
    dead_namesrv = f"127.0.0.1:{free_port()}"
    api = BrokerOuterAPI([dead_namesrv])
    broker = SimpleNamespace(
        config=_config(tmp_path, node_id="n4"),
        outer_api=api,
        is_master=False,
        store=SimpleNamespace(state=BrokerState()),
    )
    members = GroupMembership(broker)  # type: ignore[arg-type]
    members.view = _view(0, ["n1", "n4"])
    api.withhold = members.withhold_reason
    identity = BrokerIdentity("DefaultCluster", "broker-a", "127.0.0.4:10911", 5)

    async def rounds() -> list[object]:
        tried = await api.register_if_needed(identity, TopicConfigWrapper(), force=True, timeout_s=1)
        members._on_view(_view(7, ["n1", "n2"], removed=("n4",)))
        withheld = [
            await api.register_if_needed(identity, TopicConfigWrapper(), force=True, timeout_s=1)
            for _ in range(3)
        ]
        await members.close()
        await api.close()
        return [tried, *withheld]

    with caplog.at_level(logging.INFO):
        tried, *withheld = asyncio.run(rounds())
    assert tried and not tried[0].ok  # still a member: it tried (and failed on the closed port)
    assert withheld == [None, None, None] and members.is_removed
    assert members.status()["removed"] is True
    said = [r.getMessage() for r in caplog.records if r.name.startswith("broker.")]
    assert said.count("no longer registering with the nameservers") == 1, said
    assert any("was removed from the group" in m for m in said), said
    reason = members.withhold_reason() or ""
    assert "log index 7" in reason and "shut this broker down" in reason


def test_a_joining_broker_replaying_configurations_older_than_itself_is_not_removed(tmp_path: Path) -> None:
    broker = SimpleNamespace(config=_config(tmp_path, node_id="n4"), outer_api=None, is_master=False)
    members = GroupMembership(broker)  # type: ignore[arg-type]
    members.view = _view(5, ["n1", "n2"], removed=("n3",))  # a change from before n4 was added
    assert not members.is_removed and members.withhold_reason() is None
    members.view = _view(9, ["n1", "n2"], removed=("n3", "n4"))
    assert members.is_removed


def test_the_learner_catch_up_throttle_reaches_the_ledger_and_refuses_nonsense(tmp_path: Path) -> None:
    led = _config(tmp_path, learner_catchup_mb_per_s=4.0).ledger_config()
    assert led.raft_config().learner_bytes_per_tick == 4 * (1 << 20) * 50 // 1000  # 50 ms ticks
    assert (
        _config(tmp_path, learner_catchup_mb_per_s=0).ledger_config().raft_config().learner_bytes_per_tick
        == 0
    )
    with pytest.raises(ConfigError, match="learner_catchup_mb_per_s"):
        _config(tmp_path, learner_catchup_mb_per_s=-1.0).ledger_config()


def test_a_broker_removed_while_it_was_down_stops_registering_when_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its own log still makes it a voter; the member that answered its ledger holds the removal
    committed (``EmbeddedLedger.removed_by``): it withholds its registrations and says why."""
    ledger = SimpleNamespace(removed_by=None)
    broker = SimpleNamespace(
        config=_config(tmp_path, node_id="n4"),
        outer_api=None,
        is_master=False,
        store=SimpleNamespace(state=BrokerState()),
        ledger=ledger,
    )
    members = GroupMembership(broker)  # type: ignore[arg-type]
    members.view = _view(3, ["n1", "n2", "n4"])
    assert not members.is_removed and members.withhold_reason() is None
    ledger.removed_by = "n2"

    async def told() -> None:
        members._on_told_removed("n2")
        await members.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(told())
    assert members.is_removed and members.status()["removed"] is True
    reason = members.withhold_reason() or ""
    assert "while it was down" in reason and "member n2" in reason and "shut this broker down" in reason
    assert any("removed from the group while it was down" in r.getMessage() for r in caplog.records)
    ledger.removed_by = None  # a leader replicates to it again: added back under its id
    assert not members.is_removed and members.withhold_reason() is None


def test_ledger_dial_reaches_the_embedded_ledger_and_refuses_nonsense_plainly(tmp_path: Path) -> None:
    led = _config(tmp_path, ledger_dial=["n1=127.0.0.9:30001", "n7=[::1]:30002"]).ledger_config()
    assert led.dial_overrides == {"n1": "127.0.0.9:30001", "n7": "[::1]:30002"}  # n7: a member to come
    assert _config(tmp_path).ledger_config().dial_overrides == {}
    for bad, words in (
        (["n1"], "expected id=ledger_host:port"),
        (["=127.0.0.1:1"], "expected id=ledger_host:port"),
        (["n1=127.0.0.1"], "expected host:port"),
        (["n1=127.0.0.1:70000"], "expected host:port"),
        (["n1=127.0.0.1:1", "n1=127.0.0.2:1"], "listed twice"),
        ([f"n{i}=127.0.0.1:1" for i in range(MAX_DIAL_OVERRIDES + 1)], "at most"),
    ):
        with pytest.raises(ConfigError, match="ledger_dial") as err:
            _config(tmp_path, ledger_dial=bad)
        assert words in str(err.value)
    conf = tmp_path / "broker.toml"
    conf.write_text(
        'broker_name = "broker-a"\nnode_id = "n1"\ngroup = ["n1=127.0.0.1:10911@127.0.0.1:20911"]\n'
        f'namesrv_addr = ["127.0.0.1:9876"]\ndata_dir = "{tmp_path}"\ncluster_secret = "{SECRET.decode()}"\n'
        'ledger_dial = ["n2=nowhere"]\n',
        encoding="utf-8",
    )
    res = CliRunner().invoke(broker_main, ["--config", str(conf)])
    assert res.exit_code == 1 and "bad configuration: key 'ledger_dial'" in res.output, res.output
    assert "Traceback" not in res.output
