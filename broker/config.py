"""Broker settings (TOML section ``[broker]`` or top level; env prefix ``BROKER_``).

A broker group is one ledger group: every broker of the group runs one ledger node, and
the broker whose node leads is the master. ``group`` lists every member once as
``node id=broker host:port@ledger host:port``, so any broker can name the current master
to a client that asked the wrong one.

Membership changes at run time (``broker.membership``): a broker started with ``join``
(``--join``) lists in ``group`` itself and some members of a running group; it comes up
outside the group, is added as a learner (``ledgermq-admin member-add``), catches up and
serves as a slave once promoted. The log then says who the members are and where their
brokers listen; ``group`` only bootstraps that.

``ledger_dial`` (``id=ledger_host:port`` entries) is the embedded ledger node's ``dial``
(``ledger.config``): where this broker's ledger dials that member instead of the address the
group's configuration names (a relay, a tunnel, a test harness's per-link proxy). It covers
members added later as soon as their id is listed, which ``group`` cannot (it only bootstraps).
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from common.cluster_secret import load_cluster_secret
from common.settings import ConfigError, parse_host_port
from ledger.config import MAX_DIAL_OVERRIDES, NodeConfig
from remoting.config import RemotingConfig, listener_limits
from remoting.message import MAX_PULL_FRAME_BYTES, MAX_RECORD_OVERHEAD
from remoting.tls import TLS_DISABLED, client_ssl, server_ssl

from .checkpoint import CHECKPOINT_FILE
from .message_store import DEFAULT_CHECKPOINT_MIN_ENTRIES, DEFAULT_YIELD_LAG_ENTRIES
from .meta import MAX_POP_INFLIGHT_CAP
from .system_topics import DEFAULT_DELAY_LEVELS, parse_delay_levels

#: Default of ``BrokerConfig.learner_catchup_mb_per_s``, measured with bench/membership_bench.py.
DEFAULT_LEARNER_CATCHUP_MB_PER_S = 4.0

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
    listen_host: str = ""  # empty: the host of this node's own broker address in 'group'
    fast_listen_port: int = 0  # 0: the main port minus 2, as RocketMQ's VIP channel
    max_message_bytes: int = 4 << 20
    max_batch_bytes: int = 8 << 20
    register_interval_s: float = 30.0
    register_first_delay_s: float = 1.0
    register_timeout_s: float = 6.0
    long_poll_max_ms: int = 30_000
    slave_read_enable: bool = True
    pull_read_index: bool = True  # masters confirm leadership before a pull (no stale reads)
    dedup_window: int = 100_000  # message unique keys (UNIQ_KEY) remembered for de-duplication
    dedup_ttl_s: float = 600.0  # ... for at most this long, by the records' store time (0: no limit)
    apply_slice_bytes: int = 1 << 20  # committed entries applied per event-loop turn (replay, catch-up)
    # committed entries not yet applied beyond which this broker lets its peers stand for
    # leader first (a restarted broker replaying its log); 0: it never yields
    yield_lag_entries: int = DEFAULT_YIELD_LAG_ENTRIES
    # how often the applied broker state is checkpointed beside ledger/ (broker.checkpoint), so a
    # restart replays only the log's tail; 0: never (a restart replays the whole retained log)
    checkpoint_interval_s: float = 5.0
    checkpoint_min_entries: int = (
        DEFAULT_CHECKPOINT_MIN_ENTRIES  # ... and only once this many entries were applied since the last
    )
    read_barrier_timeout_s: float = 5.0  # a master's leadership check before a pull
    topics: list[str] = field(default_factory=list)  # "name:queues" created by the first master
    default_queue_nums: int = 4
    auto_create_topic_enable: bool = True  # RocketMQ 4.x's default: a send to an unknown topic creates it
    send_timeout_s: float = 10.0
    tick_ms: int = 50
    election_ticks: int = 8
    preferred_leader: str = ""
    segment_bytes: int = 64 << 20
    retention_hours: float = 0.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    log_level: str = "info"
    max_connections: int = 4096  # per listener (main and fast port); more are closed on accept
    handshake_timeout_s: float = 10.0  # a connection must deliver one complete frame within this long
    idle_timeout_s: float = 120.0  # a connection without a complete frame this long is closed (0: off)
    max_buffered_frame_bytes: int = 256 << 20  # unfinished frames held per listener, all connections
    frame_timeout_s: float = 30.0  # a frame once begun must complete within this (plus its bytes' worth)
    frame_min_bytes_per_s: int = 64 << 10  # ... at this rate: a slower peer is cut
    max_inflight_requests: int = 1024  # per connection: reading pauses while this many await answers
    max_inflight_request_bytes: int = 64 << 20  # ... or this many bytes of their bodies
    max_output_bytes: int = 0  # per connection: queued answers past this close it (0: automatic)
    max_dispatch_per_turn: int = 256  # requests of one connection handled per event-loop turn
    reply_flush_bytes: int = 32 << 10  # replies are written once this many wait (0: at turn end)
    max_heartbeat_clients: int = 20_000  # (group, client) entries from heartbeats; over it SYSTEM_BUSY
    max_heartbeat_table_bytes: int = 64 << 20  # ... and the bytes their subscriptions take together
    max_heartbeat_bytes: int = 1 << 20  # one heartbeat's body
    max_subscriptions_per_client: int = 1024  # topics one consumer entry may subscribe to
    max_topics: int = 65_536  # topics a broker group holds; an auto-created topic past it is refused
    message_delay_level: str = DEFAULT_DELAY_LEVELS  # RocketMQ's messageDelayLevel (units ms, s, m, h, d)
    max_timer_delay_s: float = 3 * 86400.0  # the furthest a RocketMQ 5 delivery time may lie ahead
    max_scheduled_messages: int = 1_000_000  # delayed messages held at once; past it a send is SYSTEM_BUSY
    max_reconsume_times: int = (
        16  # a group's retries before a message goes to %DLQ% (if the client names none)
    )
    transaction_timeout_s: float = 6.0  # a half message younger than this is not checked
    transaction_check_interval_s: float = 60.0  # how often unresolved half messages are checked
    transaction_check_max: int = 15  # checks before an unresolved half message is discarded
    max_half_messages: int = (
        100_000  # half messages held at once; past it a transactional send is SYSTEM_BUSY
    )
    lock_max_live_s: float = 60.0  # a consumer's queue lock lasts this long unless renewed (RocketMQ: 60 s)
    enable_property_filter: bool = True  # SQL92 subscriptions (RocketMQ's enablePropertyFilter)
    max_suspended_pulls: int = 10_000  # long polls held at once; over it a pull is answered at once
    # POP consumption: messages of one (group, topic, queue) popped and not yet acked; past it
    # a POP with nothing expired to give is SYSTEM_BUSY (RocketMQ: popInflightMessageThreshold)
    max_pop_inflight: int = 1024
    acl_enable: bool = False  # every request must be signed by an account of acl_file (RocketMQ ACL)
    acl_file: str = ""  # TOML accounts file (remoting/acl.py)
    acl_admin_access_key: str = ""  # a superuser given in settings/env instead of (or besides) acl_file
    acl_admin_secret_key: str = field(default="", repr=False)
    access_key: str = ""  # the broker's own account, signing its registrations with the nameservers
    secret_key: str = field(default="", repr=False)
    cluster_secret: str = field(default="", repr=False)  # the group's ledger peers prove it (ledger.config)
    cluster_secret_file: str = ""
    tls_server_mode: str = TLS_DISABLED  # both listeners: disabled, permissive or enforcing (tls.server.mode)
    tls_cert_file: str = ""  # PEM chain presented by the listeners, and to nameservers when tls_enable
    tls_key_file: str = ""
    tls_ca_file: str = ""  # checks client certificates, and the nameservers' when tls_enable
    tls_require_client_cert: bool = False  # refuse TLS clients without a certificate from tls_ca_file
    tls_enable: bool = False  # dial the nameservers with TLS (RocketMQ's tls.enable)
    ledger_tls: bool = False  # the group's ledger members talk TLS too, with the same three files
    join: bool = False  # start outside the group and wait to be added (the others in 'group' are asked)
    # The master sends a learner catching up at most this many MB/s of log (0: no limit): unthrottled,
    # the catch-up took the CPU its sends need (see docs/benchmarks.md, membership changes).
    learner_catchup_mb_per_s: float = DEFAULT_LEARNER_CATCHUP_MB_PER_S
    # id=ledger_host:port: where the embedded ledger dials that member instead (its 'dial')
    ledger_dial: list[str] = field(default_factory=list)
    server_ssl: ssl.SSLContext | None = field(init=False, default=None, repr=False, compare=False)
    client_ssl: ssl.SSLContext | None = field(init=False, default=None, repr=False, compare=False)
    members: dict[str, GroupMember] = field(init=False, default_factory=dict)
    secret: bytes = field(init=False, default=b"", repr=False, compare=False)
    delay_levels_ms: tuple[int, ...] = field(init=False, default=(), repr=False, compare=False)

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
        if self.join and len(members) < 2:
            raise ConfigError(
                "key 'join': 'group' must list this broker and at least one member of the running "
                "group (id=broker_host:port@ledger_host:port) to ask for its configuration"
            )
        self.members = members
        if not self.listen_host:  # listen where the group (and so every client) says this broker is
            self.listen_host = parse_host_port("group", members[self.node_id].broker_addr)[0].strip("[]")
        addrs = [m.broker_addr for m in members.values()] + [m.ledger_addr for m in members.values()]
        dup = sorted({a for a in addrs if addrs.count(a) > 1})
        if dup:
            raise ConfigError(
                f"key 'group': address(es) {', '.join(dup)} given to more than one member or port"
            )
        for t in self.topics:
            name, _, q = t.partition(":")
            if not name or (q and not q.isdigit()):
                raise ConfigError(f"key 'topics': expected name or name:queues, got {t!r}")
        if self.apply_slice_bytes < 4096:
            raise ConfigError(f"key 'apply_slice_bytes' must be at least 4096, got {self.apply_slice_bytes}")
        if self.yield_lag_entries < 0:
            raise ConfigError(f"key 'yield_lag_entries' must not be negative, got {self.yield_lag_entries}")
        if self.checkpoint_interval_s < 0:
            raise ConfigError(
                f"key 'checkpoint_interval_s' must not be negative (0: off), got {self.checkpoint_interval_s}"
            )
        if self.checkpoint_min_entries < 1:
            raise ConfigError(
                f"key 'checkpoint_min_entries' must be at least 1, got {self.checkpoint_min_entries}"
            )
        if not 0 < self.read_barrier_timeout_s <= 60:
            raise ConfigError(
                f"key 'read_barrier_timeout_s' must be in (0, 60] seconds, got {self.read_barrier_timeout_s}"
            )
        if self.acl_enable and not (self.acl_file or self.acl_admin_access_key):
            raise ConfigError(
                "key 'acl_enable' is true but neither 'acl_file' nor 'acl_admin_access_key' is set"
            )
        self.secret = load_cluster_secret(self.cluster_secret, self.cluster_secret_file)
        if not self.secret:
            raise ConfigError(
                "key 'cluster_secret' (or 'cluster_secret_file'): a broker needs the cluster secret "
                "(at least 16 bytes, the same on every broker of the group and on the nameservers): "
                "without it anyone who reaches the ledger port could append to the commit log. "
                "'broker local-cluster' and docker-compose generate one; e.g. openssl rand -hex 32"
            )
        if bool(self.access_key) != bool(self.secret_key):
            raise ConfigError("keys 'access_key' and 'secret_key' go together (or neither)")
        if self.max_heartbeat_clients < 1 or self.max_suspended_pulls < 0:
            raise ConfigError(
                "keys 'max_heartbeat_clients' (>= 1) and 'max_suspended_pulls' (>= 0) out of range"
            )
        try:
            self.delay_levels_ms = parse_delay_levels(self.message_delay_level)
        except ValueError as exc:
            raise ConfigError(f"key 'message_delay_level': {exc}") from None
        for key in (
            "transaction_timeout_s",
            "transaction_check_interval_s",
            "lock_max_live_s",
            "max_timer_delay_s",
        ):
            if not 0 < getattr(self, key) <= 30 * 86400:
                raise ConfigError(f"key '{key}' must be in (0, 30 days], got {getattr(self, key)}")
        longest_s = max(max(self.delay_levels_ms) / 1000, self.max_timer_delay_s)
        if self.retention_hours and self.retention_hours * 3600 < 2 * longest_s:
            # a held message must outlive its delay in the log, or retention removes it first
            raise ConfigError(
                f"key 'retention_hours' ({self.retention_hours}) must keep the log at least twice the "
                f"longest delay ({longest_s:.0f} s: message_delay_level, max_timer_delay_s)"
            )
        for key, least in (
            ("max_scheduled_messages", 1),
            ("max_half_messages", 1),
            ("max_reconsume_times", 0),
            ("transaction_check_max", 1),
            ("max_heartbeat_table_bytes", 1 << 16),
            ("max_heartbeat_bytes", 1 << 12),
            ("max_subscriptions_per_client", 1),
            ("max_topics", 16),
            ("max_pop_inflight", 1),
        ):
            if getattr(self, key) < least:
                raise ConfigError(f"key '{key}' must be at least {least}, got {getattr(self, key)}")
        if self.max_pop_inflight > MAX_POP_INFLIGHT_CAP:
            raise ConfigError(
                f"key 'max_pop_inflight' must be at most {MAX_POP_INFLIGHT_CAP}, got {self.max_pop_inflight}"
            )
        self.server_ssl = server_ssl(
            self.tls_server_mode,
            self.tls_cert_file,
            self.tls_key_file,
            self.tls_ca_file,
            self.tls_require_client_cert,
        )
        self.client_ssl = client_ssl(self.tls_enable, self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        if self.ledger_tls and not (self.tls_cert_file and self.tls_key_file and self.tls_ca_file):
            raise ConfigError("key 'ledger_tls' needs 'tls_cert_file', 'tls_key_file' and 'tls_ca_file'")
        try:
            self.remoting_config()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self._check_ledger_dial()
        if self.dedup_window < 1:
            raise ConfigError(f"key 'dedup_window' must be at least 1, got {self.dedup_window}")
        if not self.dedup_ttl_s >= 0:
            raise ConfigError(f"key 'dedup_ttl_s' must be 0 (no limit) or more, got {self.dedup_ttl_s}")
        largest = MAX_PULL_FRAME_BYTES - MAX_RECORD_OVERHEAD
        if not 1 <= self.max_message_bytes <= largest:
            # what the broker acknowledges, every client can read: a pull answer holding one
            # such message must fit the frame RocketMQ's clients accept (16 MiB)
            raise ConfigError(
                f"key 'max_message_bytes' must be between 1 and {largest} (a pull answer holding one "
                f"message must fit a client's {MAX_PULL_FRAME_BYTES}-byte frame), got {self.max_message_bytes}"
            )

    def _check_ledger_dial(self) -> None:
        """Refuse a bad ``ledger_dial`` here, naming the broker's key, rather than when the
        ledger node is built (its own check would name its ``dial``)."""
        if len(self.ledger_dial) > MAX_DIAL_OVERRIDES:
            raise ConfigError(f"key 'ledger_dial': at most {MAX_DIAL_OVERRIDES} entries (MAX_DIAL_OVERRIDES)")
        seen: set[str] = set()
        for item in self.ledger_dial:
            nid, sep, addr = item.partition("=")
            if not sep or not _NODE_ID.match(nid) or len(nid.encode()) > 64:
                raise ConfigError(
                    f"key 'ledger_dial': expected id=ledger_host:port (id ending in a number, e.g. n4), "
                    f"got {item[:100]!r}"
                )
            parse_host_port("ledger_dial", addr)
            if nid in seen:
                raise ConfigError(f"key 'ledger_dial': member {nid!r} listed twice")
            seen.add(nid)

    def remoting_config(self) -> RemotingConfig:
        """Both listeners' limits. Frames may carry a whole batch; the broker's own checks then
        say which limit a body broke."""
        return RemotingConfig(
            max_body_bytes=max(self.max_batch_bytes, self.max_message_bytes) + (64 << 10),
            **listener_limits(self),  # type: ignore[arg-type]
            reply_flush_bytes=self.reply_flush_bytes,
            tls_mode=self.tls_server_mode,
            server_ssl=self.server_ssl,
        )

    def outgoing_remoting_config(self) -> RemotingConfig:
        """The broker's own dials (registration with every nameserver): TLS when tls_enable."""
        return RemotingConfig(client_ssl=self.client_ssl)

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

    @property
    def checkpoint_path(self) -> Path | None:
        """Where the broker state's checkpoint lives (beside ledger/), None when checkpoints are off."""
        return Path(self.data_dir) / CHECKPOINT_FILE if self.checkpoint_interval_s > 0 else None

    def ledger_config(self) -> NodeConfig:
        others = [m for m in self.members.values() if m.node_id != self.node_id]
        cfg = NodeConfig(
            id=self.node_id,
            listen=self.me.ledger_addr,
            # a joining broker is no member yet: the group's configuration comes from the others
            peers=[
                f"{m.node_id}={m.ledger_addr}" for m in self.members.values() if not self.join or m is self.me
            ],
            join=[m.ledger_addr for m in others] if self.join else [],
            dial=list(self.ledger_dial),
            data_dir=str(Path(self.data_dir) / "ledger"),
            tick_ms=self.tick_ms,
            election_ticks=self.election_ticks,
            max_entry_bytes=max(self.max_message_bytes + 4096, 1 << 20),
            max_frame_bytes=max(64 << 20, self.max_batch_bytes * 2),
            preferred_leader=self.preferred_leader,
            segment_bytes=self.segment_bytes,
            retention_hours=self.retention_hours,
            append_timeout_s=self.send_timeout_s,
            learner_catchup_mb_per_s=self.learner_catchup_mb_per_s,
            log_level=self.log_level,
            cluster_secret=self.cluster_secret,
            cluster_secret_file=self.cluster_secret_file,
            # The ledger port takes peers and clients alike: clients (ledger status, a stray
            # LedgerClient) must prove the secret too, or they could append past every ACL.
            client_auth=True,
        )
        if self.ledger_tls:  # certificates must then also name the ledger addresses of 'group'
            cfg.tls_cert_file, cfg.tls_key_file = self.tls_cert_file, self.tls_key_file
            cfg.tls_ca_file, cfg.tls_require_client_cert = self.tls_ca_file, self.tls_require_client_cert
        cfg.validate()
        return cfg
