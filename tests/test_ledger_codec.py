"""Sans-I/O tests of the ledger's encodings: entries, peer messages, client requests, settings."""

from __future__ import annotations

import subprocess
import sys

import pytest

from common.settings import ConfigError, load_settings
from ledger.codec import (
    HEADER_SIZE,
    KIND_NOOP,
    ChecksumError,
    Entry,
    decode_entries,
    encode_entries,
    scan_entries,
)
from ledger.config import DEFAULT_DURABLE_MARK_INTERVAL_S, NodeConfig
from ledger.messages import (
    AppendRequest,
    AppendResponse,
    InstallBase,
    MessageError,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    decode_message,
    encode_message,
)
from ledger.node import LedgerNode
from ledger.wire import (
    OP_APPEND,
    TOO_LARGE,
    LedgerError,
    WireError,
    decode_request,
    encode_append,
    encode_read,
)


def entries(n: int, term: int = 3) -> list[Entry]:
    return [Entry(i + 1, term, f"payload-{i}".encode()) for i in range(n)]


def test_entries_round_trip_with_positions():
    es = entries(5) + [Entry(6, 4, b"", KIND_NOOP)]
    blob = encode_entries(es, 1000)
    back = decode_entries(blob)
    assert back == es
    assert back[0].pos == 1000
    assert back[1].pos == 1000 + HEADER_SIZE + len(b"payload-0")
    assert [e.kind for e in back][-1] == KIND_NOOP


@pytest.mark.parametrize("where", [0, 4, 12, 20, 36, HEADER_SIZE, HEADER_SIZE + 3])
def test_any_flipped_bit_is_detected(where):
    blob = bytearray(encode_entries(entries(3), 0))
    first_size = HEADER_SIZE + len(b"payload-0")
    blob[first_size + where] ^= 0x10  # corrupt the second entry
    with pytest.raises(ChecksumError) as info:
        decode_entries(bytes(blob))
    assert info.value.offset == first_size


def test_scan_stops_at_a_torn_tail():
    blob = encode_entries(entries(3), 0)
    good, end, err = scan_entries(blob[:-5])
    assert [e.index for e in good] == [1, 2] and err == "truncated body" and end < len(blob)


MESSAGES = [
    VoteRequest(7, "n1", "n2", 10, 6, pre_vote=True, transfer=False),
    VoteResponse(7, "n2", "n1", True, True),
    AppendRequest(7, "n1", "n3", 9, 6, 8, entries(2, 7), seq=4),
    AppendRequest(7, "n1", "n3", 9, 6, 8, [], seq=5),
    AppendResponse(7, "n3", "n1", False, 0, 9, 4, 5, 5),
    TimeoutNow(7, "n1", "n2"),
    InstallBase(7, "n1", "n2", 100, 6, 4096, 3),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_peer_messages_round_trip(msg):
    assert decode_message(encode_message(msg)) == msg


@pytest.mark.parametrize(
    "body,words",
    [
        (b"", "empty frame"),
        (b"\x63abc", "unknown message type 99"),
        (encode_message(MESSAGES[0])[:10], "truncated"),
        (encode_message(MESSAGES[2])[:-3], "append from n1"),
    ],
)
def test_malformed_peer_messages_are_refused_with_a_reason(body, words):
    with pytest.raises(MessageError, match=words):
        decode_message(body)


def test_client_requests_decode_and_refuse_bad_input():
    req = decode_request(encode_append(9, [b"a", b"bc"]), max_entry=10)
    assert req.op == OP_APPEND and req.req_id == 9 and req.payloads == [b"a", b"bc"]
    read = decode_request(encode_read(3, 5, 9, 1024, True), max_entry=10)
    assert (read.lo, read.hi, read.max_bytes, read.linearizable) == (5, 9, 1024, True)
    with pytest.raises(LedgerError) as info:
        decode_request(encode_append(1, [b"x" * 11]), max_entry=10)
    assert info.value.code == TOO_LARGE and "limit is 10" in info.value.message
    with pytest.raises(WireError, match="truncated"):
        decode_request(encode_append(1, [b"abc"])[:-1], max_entry=10)
    with pytest.raises(WireError, match="unknown request op"):
        decode_request(b"\x77" + bytes(8), max_entry=10)


def _config(tmp_path, text: str):
    path = tmp_path / "node.toml"
    path.write_text(text)
    return load_settings(NodeConfig, path, env_prefix="LEDGER_", environ={}, section="ledger")


GOOD = 'id = "n1"\nlisten = "127.0.0.1:7001"\npeers = ["n1=127.0.0.1:7001", "n2=127.0.0.1:7002"]\ndata_dir = "d"\n'


def test_config_loads_and_env_overrides(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text(GOOD)
    cfg = load_settings(NodeConfig, path, env_prefix="LEDGER_", environ={"LEDGER_TICK_MS": "20"})
    assert cfg.tick_ms == 20 and cfg.members == {"n1": "127.0.0.1:7001", "n2": "127.0.0.1:7002"}


def test_durable_mark_interval_is_a_setting_that_reaches_the_store(tmp_path):
    """The mark interval bounds which losses a restart can tell from a torn write, so operators
    set it like any other ledger setting (TOML or env); the store must run with that value."""
    path = tmp_path / "node.toml"
    path.write_text(GOOD.replace('"d"', repr(str(tmp_path / "d")).replace("'", '"')))
    default = load_settings(NodeConfig, path, env_prefix="LEDGER_", environ={})
    assert default.durable_mark_interval_s == DEFAULT_DURABLE_MARK_INTERVAL_S == 1.0
    cfg = load_settings(
        NodeConfig, path, env_prefix="LEDGER_", environ={"LEDGER_DURABLE_MARK_INTERVAL_S": "0.25"}
    )
    assert cfg.durable_mark_interval_s == 0.25
    node = LedgerNode(cfg)
    try:
        assert node.store.mark_interval_s == 0.25
    finally:
        node.disk.close()


@pytest.mark.parametrize(
    "text,words",
    [
        (GOOD + "tick_msec = 5\n", "unknown key 'tick_msec'"),
        (GOOD + 'tick_ms = "fast"\n', "key 'tick_ms' must be an integer"),
        (GOOD.replace('"127.0.0.1:7001"\n', '"localhost"\n'), "key 'listen': expected host:port"),
        (GOOD.replace('"n1=127.0.0.1:7001", ', ""), "must include this node's id 'n1'"),
        (GOOD.replace('data_dir = "d"\n', ""), "missing required setting(s): data_dir"),
        (GOOD + "election_ticks = 1\n", "election_ticks must be at least 2"),
        (GOOD + "durable_mark_interval_s = 0\n", "key 'durable_mark_interval_s' must be between"),
        (GOOD + "durable_mark_interval_s = nan\n", "key 'durable_mark_interval_s' must be between"),
        ("id = \n", "invalid TOML"),
    ],
)
def test_bad_config_names_the_key(tmp_path, text, words):
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, text)
    assert words in str(info.value)


def test_cli_refuses_bad_config_with_a_clear_message(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text(GOOD + "max_inflight = 0\n")
    out = subprocess.run(
        [sys.executable, "-m", "ledger", "start", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "bad configuration" in out.stderr and "max_inflight must be at least 1" in out.stderr


def test_membership_requests_round_trip_and_bad_ones_get_a_reason() -> None:
    from ledger.membership import MembershipChange
    from ledger.wire import BAD_REQUEST, OP_MEMBER, LedgerError, decode_request, encode_member

    req = decode_request(encode_member(9, "add", "n4", "127.0.0.4:7004"), 1024)
    assert (req.op, req.req_id, req.change) == (OP_MEMBER, 9, MembershipChange("add", "n4", "127.0.0.4:7004"))
    assert decode_request(encode_member(3, "list"), 1024).change is None
    for op, nid, addr, words in (
        ("demote", "n4", "", "unknown membership change"),
        ("add", "n4", "", "needs its address"),
        ("remove", "a=b", "", "must not contain"),
    ):
        with pytest.raises(LedgerError) as info:
            decode_request(encode_member(1, op, nid, addr), 1024)
        assert info.value.code == BAD_REQUEST and words in info.value.message
    with pytest.raises(LedgerError, match="not JSON"):
        decode_request(bytes([OP_MEMBER]) + (1).to_bytes(8, "little") + b"{", 1024)


def test_a_joining_node_needs_only_its_own_address() -> None:
    cfg = NodeConfig(id="n4", listen="127.0.0.4:7004", data_dir="/tmp/x", join=["127.0.0.1:7001"])
    cfg.validate()
    assert cfg.members == {"n4": "127.0.0.4:7004"}
    wild = NodeConfig(id="n4", listen="0.0.0.0:7004", data_dir="/tmp/x", join=["127.0.0.1:7001"])
    with pytest.raises(ConfigError, match="needs its own entry"):
        wild.validate()
    with pytest.raises(ConfigError, match="join"):
        NodeConfig(id="n4", listen="127.0.0.4:7004", data_dir="/tmp/x", join=["nowhere"]).validate()
    with pytest.raises(ConfigError, match="must include this node's id"):
        NodeConfig(id="n4", listen="127.0.0.4:7004", data_dir="/tmp/x", peers=["n1=127.0.0.1:1"]).validate()
