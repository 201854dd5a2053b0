"""Broker settings (TOML section ``[broker]`` or top level; env prefix ``BROKER_``).

A broker group is one ledger group: every broker of the group runs one ledger node, and
the broker whose node leads is the master. ``group`` lists every member once as
``node id=broker host:port@ledger host:port``, so any broker can name the current master
to a client that asked the wrong one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ledger.config import NodeConfig
from ledger.settings import ConfigError, parse_host_port

_NODE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*?(\d+)$")


@dataclass
class GroupMember:
    node_id: str
    broker_addr: str
    ledger_addr: str
    number: int  # the numeric suffix of the node id; a slave registers as broker id number + 1


@dataclass
class BrokerConfig:
    broker_name: str
    node_id: str
    group: list[str]
    namesrv_addr: list[str]
    data_dir: str
    cluster_name: str = "DefaultCluster"
    listen_host: str = "127.0.0.1"
    fast_listen_port: int = 0  # 0: the main port minus 2, as RocketMQ's VIP channel
    max_message_bytes: int = 4 << 20
    max_batch_bytes: int = 8 << 20
    register_interval_s: float = 30.0
    register_first_delay_s: float = 1.0
    register_timeout_s: float = 6.0
    long_poll_max_ms: int = 30_000
    slave_read_enable: bool = True
    pull_read_index: bool = True  # masters confirm leadership before a pull (no stale reads)
    dedup_window: int = 100_000  # sequence numbers remembered per idempotent producer
    topics: list[str] = field(default_factory=list)  # "name:queues" created by the first master
    default_queue_nums: int = 4
    send_timeout_s: float = 10.0
    tick_ms: int = 50
    election_ticks: int = 8
    preferred_leader: str = ""
    segment_bytes: int = 64 << 20
    retention_hours: float = 0.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    log_level: str = "info"
    members: dict[str, GroupMember] = field(init=False, default_factory=dict)

    def validate(self) -> None:
        if not self.broker_name or not re.fullmatch(r"[A-Za-z0-9_.-]+", self.broker_name):
            raise ConfigError(f"key 'broker_name': {self.broker_name!r} must be letters, digits, _ . -")
        self.namesrv_addr = [a.strip() for item in self.namesrv_addr for a in item.split(";") if a.strip()]
        if not self.namesrv_addr:
            raise ConfigError("key 'namesrv_addr': no nameserver address (give at least one host:port)")
        for a in self.namesrv_addr:
            parse_host_port("namesrv_addr", a)
        members: dict[str, GroupMember] = {}
        for item in self.group:
            nid, sep, rest = item.partition("=")
            baddr, sep2, laddr = rest.partition("@")
            if not sep or not sep2 or not nid:
                raise ConfigError(f"key 'group': expected id=broker_host:port@ledger_host:port, got {item!r}")
            parse_host_port("group", baddr)
            parse_host_port("group", laddr)
            m = _NODE_ID.match(nid)
            if not m:
                raise ConfigError(f"key 'group': node id {nid!r} must end in a number (e.g. n1)")
            if nid in members:
                raise ConfigError(f"key 'group': member {nid!r} listed twice")
            members[nid] = GroupMember(nid, baddr, laddr, int(m.group(1)))
        if self.node_id not in members:
            raise ConfigError(f"key 'group' must include this broker's node_id {self.node_id!r}")
        self.members = members
        for t in self.topics:
            name, _, q = t.partition(":")
            if not name or (q and not q.isdigit()):
                raise ConfigError(f"key 'topics': expected name or name:queues, got {t!r}")
        if self.max_message_bytes < 1 or self.max_message_bytes > 64 << 20:
            raise ConfigError("key 'max_message_bytes' must be between 1 and 64 MiB")

    @property
    def me(self) -> GroupMember:
        return self.members[self.node_id]

    @property
    def listen_port(self) -> int:
        return parse_host_port("group", self.me.broker_addr)[1]

    @property
    def fast_port(self) -> int:
        return self.fast_listen_port or self.listen_port - 2

    @property
    def broker_addr(self) -> str:
        return self.me.broker_addr

    @property
    def slave_id(self) -> int:
        return self.me.number + 1

    def ledger_config(self) -> NodeConfig:
        cfg = NodeConfig(
            id=self.node_id,
            listen=self.me.ledger_addr,
            peers=[f"{m.node_id}={m.ledger_addr}" for m in self.members.values()],
            data_dir=str(Path(self.data_dir) / "ledger"),
            tick_ms=self.tick_ms,
            election_ticks=self.election_ticks,
            max_entry_bytes=max(self.max_message_bytes + 4096, 1 << 20),
            max_frame_bytes=max(64 << 20, self.max_batch_bytes * 2),
            preferred_leader=self.preferred_leader,
            segment_bytes=self.segment_bytes,
            retention_hours=self.retention_hours,
            append_timeout_s=self.send_timeout_s,
            log_level=self.log_level,
        )
        cfg.validate()
        return cfg
