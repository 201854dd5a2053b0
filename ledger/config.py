"""Settings of one ledger node (TOML section ``[ledger]`` or top level; env prefix ``LEDGER_``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .raft import RaftConfig
from .settings import ConfigError, parse_host_port


@dataclass
class NodeConfig:
    id: str
    listen: str
    peers: list[str]  # "id=host:port" for every member, this node included
    data_dir: str
    tick_ms: int = 50
    election_ticks: int = 8
    heartbeat_ticks: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    max_inflight: int = 32
    max_append_bytes: int = 1 << 20
    max_frame_bytes: int = 64 << 20
    max_entry_bytes: int = 4 << 20
    segment_bytes: int = 64 << 20
    retention_bytes: int = 0  # 0 keeps everything
    retention_hours: float = 0.0
    preferred_leader: str = ""
    append_timeout_s: float = 10.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # 0: no Prometheus endpoint
    log_level: str = "info"
    members: dict[str, str] = field(init=False, default_factory=dict)

    def validate(self) -> None:
        parse_host_port("listen", self.listen)
        if not self.id:
            raise ConfigError("key 'id' must not be empty")
        members: dict[str, str] = {}
        for item in self.peers:
            name, sep, addr = item.partition("=")
            if not sep or not name:
                raise ConfigError(f"key 'peers': expected id=host:port, got {item!r}")
            parse_host_port("peers", addr)
            if name in members:
                raise ConfigError(f"key 'peers': member {name!r} listed twice")
            members[name] = addr
        if self.id not in members:
            raise ConfigError(f"key 'peers' must include this node's id {self.id!r}")
        self.members = members
        if self.preferred_leader and self.preferred_leader not in members:
            raise ConfigError(f"key 'preferred_leader': {self.preferred_leader!r} is not a member")
        if self.tick_ms < 1:
            raise ConfigError("key 'tick_ms' must be at least 1")
        if self.max_entry_bytes + 1024 > self.max_frame_bytes:
            raise ConfigError("key 'max_frame_bytes' must exceed max_entry_bytes by at least 1 KiB")
        try:
            self.raft_config().validate()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def raft_config(self) -> RaftConfig:
        return RaftConfig(
            election_ticks=self.election_ticks,
            heartbeat_ticks=self.heartbeat_ticks,
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
            max_inflight=self.max_inflight,
            max_append_bytes=self.max_append_bytes,
            preferred_leader=self.preferred_leader or None,
        )
