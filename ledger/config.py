"""Settings of one ledger node (TOML section ``[ledger]`` or top level; env prefix ``LEDGER_``).

Security and resource bounds (defaults in parentheses):

- ``cluster_secret`` / ``cluster_secret_file`` (none): the shared secret every member proves
  on each peer connection (at least 16 bytes; env ``LEDGER_CLUSTER_SECRET``). Without one the
  node still runs, but logs a warning at start: anyone who can reach its port can join.
- ``tls_cert_file``, ``tls_key_file``, ``tls_ca_file`` (none): TLS on the listener and on
  outgoing peer connections; ``tls_require_client_cert`` (false) makes clients present one too.
- ``peer_frame_mac`` (false): an HMAC-SHA256 tag on every peer frame after the handshake,
  against an attacker on the path who could inject into an established TCP connection.
  Off by default because it hashes every replicated byte on both ends: measured (bench/
  peer_auth_bench.py) at +2.3 to +3.5 us per 1 KiB entry per hop against about 18-20 us of
  CPU per entry for the whole 3-node group: +13.5% and +23.7% CPU per entry in two runs,
  over the 10% budget. The handshake
  alone (the default with a secret) adds no per-frame work; on an untrusted network use TLS,
  which authenticates and encrypts every record (the MAC is then never used). This is the
  split Kafka makes too (SASL per connection, TLS for the stream).
- ``cluster_secret_accepted`` / ``cluster_secret_accepted_file`` (none): one more secret
  accepted from the nodes this node dials, to rotate the secret without downtime: give every
  node the new secret as accepted (rolling restart), then make it each node's
  ``cluster_secret`` with the old one accepted, then drop the old one.
- ``client_auth`` (false): clients must prove the cluster secret too (the same challenge-
  response) before any request; off by default so the quick start and tools need no secret,
  on wherever the client port is reachable by others (append and transfer are open otherwise).
- ``max_connections`` (1024): accepted connections at once, peers and clients together
  (the open-file limit is raised to fit it, or the cap lowered with a warning).
- ``max_pending_handshakes`` (128): connections that have not finished their hello.
- ``max_pending_appends`` (65536): appends (each one or more entries) a leader holds until
  they commit; past it an append is refused at once with ``busy`` (nothing appended).
- ``handshake_timeout_s`` (5): time allowed for the hello (and TLS) handshake.
- ``idle_timeout_s`` (300): a connection that sends nothing for this long is closed.
- ``max_handshake_frame_bytes`` (1024): the largest frame accepted before the hello is done.
- ``max_buffered_bytes`` (256 MiB): all partly received frames of all connections together.
- ``max_client_write_buffer_bytes`` (64 MiB): replies queued for a client that does not read.
- ``max_read_bytes`` (4 MiB): the most a read request returns, whatever max_bytes it asks.

Membership (see ``ledger.membership``):

- ``peers``: the group's members at its first start (``id=host:port``, this node included).
  Once the log holds a membership change, the log's configuration wins over this list.
- ``join`` (none): ``host:port`` of some nodes of a running group. The node asks them for the
  group's current configuration and waits to be added (``ledger member add``) as a learner;
  ``peers`` then needs at most its own entry (its address as the others dial it; default
  ``listen``). Ignored once the node's log holds a configuration.
- ``join_timeout_s`` (60): how long a joining node keeps asking before it gives up.
- ``dial`` (none): ``id=host:port`` entries, the address this node dials for that member
  instead of the one the configuration (or ``peers``) names: a relay or proxy on the way to
  it (a test harness's per-link proxies, a tunnel). Members the group adds later are covered
  as soon as their id is listed; at most ``MAX_DIAL_OVERRIDES`` entries.
- ``promote_max_lag_entries`` (1024): a learner is promoted to voter only when its log is at
  most this many entries behind the leader's.
- ``learner_catchup_mb_per_s`` (0: no limit): the most MB/s the leader sends one learner
  catching up (counted per tick, so bursts are at most one tick's share, on top of what the
  log grew by; its last ``promote_max_lag_entries`` are not metered). Unthrottled, a
  learner takes the log as fast as the leader can read and encode it, which on a busy
  leader is CPU its clients' appends lose while the change is under way; a broker's ledger
  sets it (see ``broker.config``). Voters are never throttled.

Durability:

- ``durable_mark_interval_s`` (1.0, at most 3600): how often a log fsync also records the
  (index, term) it made durable (``LogStore.mark_interval_s``; a log quiet that long and a
  clean stop record it too). A restart whose log ends before that mark knows it lost entries
  it may have acknowledged and recovers them from its peers; entries made durable in the last
  interval before a crash and then lost look like a torn write instead (the exact window:
  ``ledger/store.py``). Shorter narrows that window at the cost of at most one more small
  file write (two fsyncs) per interval.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from common.cluster_secret import load_cluster_secret
from common.settings import ConfigError, parse_host_port
from common.tls import client_context, server_context

from .raft import RaftConfig

#: The highest ``learner_catchup_mb_per_s`` accepted (beyond it, it would be no limit anyway).
MAX_LEARNER_CATCHUP_MB_PER_S = 100_000.0
#: The most ``dial`` entries one node takes (a configuration holds at most 64 members).
MAX_DIAL_OVERRIDES = 256
#: Default of ``NodeConfig.durable_mark_interval_s`` (seconds between durable marks).
DEFAULT_DURABLE_MARK_INTERVAL_S = 1.0


@dataclass
class NodeConfig:
    id: str
    listen: str
    peers: list[str] = field(default_factory=list)  # "id=host:port" for every member, this node included
    data_dir: str = ""
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
    cluster_secret: str = field(default="", repr=False)
    cluster_secret_file: str = ""
    cluster_secret_accepted: str = field(default="", repr=False)
    cluster_secret_accepted_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_require_client_cert: bool = False
    peer_frame_mac: bool = False
    client_auth: bool = False
    max_connections: int = 1024
    max_pending_handshakes: int = 128
    max_pending_appends: int = 65536
    handshake_timeout_s: float = 5.0
    idle_timeout_s: float = 300.0
    max_handshake_frame_bytes: int = 1024
    max_buffered_bytes: int = 256 << 20
    max_client_write_buffer_bytes: int = 64 << 20
    max_read_bytes: int = 4 << 20
    durable_mark_interval_s: float = DEFAULT_DURABLE_MARK_INTERVAL_S
    join: list[str] = field(default_factory=list)  # host:port of nodes of the group to join
    join_timeout_s: float = 60.0
    dial: list[str] = field(default_factory=list)  # id=host:port: where to dial that member instead
    promote_max_lag_entries: int = 1024
    learner_catchup_mb_per_s: float = 0.0
    members: dict[str, str] = field(init=False, default_factory=dict)
    dial_overrides: dict[str, str] = field(init=False, default_factory=dict)
    secret: bytes = field(init=False, default=b"", repr=False, compare=False)
    accepted_secrets: tuple[bytes, ...] = field(init=False, default=(), repr=False, compare=False)
    server_ssl: ssl.SSLContext | None = field(init=False, default=None, repr=False, compare=False)
    client_ssl: ssl.SSLContext | None = field(init=False, default=None, repr=False, compare=False)

    def _parse_dial(self) -> dict[str, str]:
        if len(self.dial) > MAX_DIAL_OVERRIDES:
            raise ConfigError(f"key 'dial': at most {MAX_DIAL_OVERRIDES} entries (MAX_DIAL_OVERRIDES)")
        out: dict[str, str] = {}
        for item in self.dial:
            name, sep, addr = item.partition("=")
            if not sep or not name or len(name.encode()) > 64 or not name.isprintable():
                raise ConfigError(
                    f"key 'dial': expected id=host:port (id printable, <= 64 bytes), got {item[:100]!r}"
                )
            parse_host_port("dial", addr)
            if name in out:
                raise ConfigError(f"key 'dial': member {name!r} listed twice")
            out[name] = addr
        return out

    def validate(self) -> None:
        parse_host_port("listen", self.listen)
        if not self.id:
            raise ConfigError("key 'id' must not be empty")
        if not self.data_dir:
            raise ConfigError("missing required setting(s): data_dir")
        for addr in self.join:
            parse_host_port("join", addr)
        members: dict[str, str] = {}
        owners: dict[tuple[str, int], str] = {}
        for item in self.peers:
            name, sep, addr = item.partition("=")
            if not sep or not name:
                raise ConfigError(f"key 'peers': expected id=host:port, got {item!r}")
            if len(name.encode()) > 64 or not name.isprintable():
                raise ConfigError(
                    f"key 'peers': member id {name[:80]!r} must be printable and at most 64 bytes"
                )
            host, port = parse_host_port("peers", addr)
            if name in members:
                raise ConfigError(f"key 'peers': member {name!r} listed twice")
            key = (host.lower(), port)
            if key in owners:
                raise ConfigError(
                    f"key 'peers': members {owners[key]!r} and {name!r} have the same address {addr}"
                )
            owners[key] = name
            members[name] = addr
        if self.id not in members:
            if not self.join:
                raise ConfigError(f"key 'peers' must include this node's id {self.id!r}")
            host, _ = parse_host_port("listen", self.listen)
            if host in ("", "0.0.0.0", "::", "[::]"):
                raise ConfigError(
                    f"key 'peers': a joining node listening on {self.listen} needs its own entry "
                    f"({self.id}=host:port, the address the group dials)"
                )
            members[self.id] = self.listen
        self.members = members
        self.dial_overrides = self._parse_dial()
        if self.preferred_leader and self.preferred_leader not in members:
            raise ConfigError(f"key 'preferred_leader': {self.preferred_leader!r} is not a member")
        if self.tick_ms < 1:
            raise ConfigError("key 'tick_ms' must be at least 1")
        if not self.join_timeout_s > 0:
            raise ConfigError("key 'join_timeout_s' must be positive")
        if not 0 <= self.learner_catchup_mb_per_s <= MAX_LEARNER_CATCHUP_MB_PER_S:
            raise ConfigError(
                f"key 'learner_catchup_mb_per_s' must be 0 (no limit) to {MAX_LEARNER_CATCHUP_MB_PER_S}"
            )
        if self.max_entry_bytes + 1024 > self.max_frame_bytes:
            raise ConfigError("key 'max_frame_bytes' must exceed max_entry_bytes by at least 1 KiB")
        try:
            self.raft_config().validate()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self._validate_bounds()
        self.secret = load_cluster_secret(self.cluster_secret, self.cluster_secret_file)
        accepted = load_cluster_secret(
            self.cluster_secret_accepted, self.cluster_secret_accepted_file, "cluster_secret_accepted"
        )
        if accepted and not self.secret:
            raise ConfigError("key 'cluster_secret_accepted' needs a cluster_secret or cluster_secret_file")
        self.accepted_secrets = (accepted,) if accepted else ()
        if self.client_auth and not self.secret:
            raise ConfigError("key 'client_auth' needs a cluster_secret or cluster_secret_file")
        self._load_tls()

    @property
    def frame_mac(self) -> bool:
        """Whether peer frames carry MACs: with a secret, when asked, and never under TLS."""
        return bool(self.secret) and self.peer_frame_mac and self.server_ssl is None

    def _validate_bounds(self) -> None:
        for key in ("max_connections", "max_pending_handshakes", "max_pending_appends", "max_read_bytes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"key '{key}' must be at least 1")
        for key in ("handshake_timeout_s", "idle_timeout_s"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"key '{key}' must be positive")
        if not 0 < self.durable_mark_interval_s <= 3600:  # NaN fails too
            raise ConfigError("key 'durable_mark_interval_s' must be between 0 (exclusive) and 3600 seconds")
        if not 256 <= self.max_handshake_frame_bytes <= self.max_frame_bytes:
            raise ConfigError("key 'max_handshake_frame_bytes' must be between 256 and max_frame_bytes")
        if self.max_buffered_bytes < self.max_frame_bytes + 4:
            raise ConfigError("key 'max_buffered_bytes' must be at least max_frame_bytes + 4")
        if self.max_client_write_buffer_bytes < 1 << 16:
            raise ConfigError("key 'max_client_write_buffer_bytes' must be at least 64 KiB")

    def _load_tls(self) -> None:
        cert, key, ca = self.tls_cert_file, self.tls_key_file, self.tls_ca_file
        if not (cert or key or ca):
            if self.tls_require_client_cert:
                raise ConfigError(
                    "key 'tls_require_client_cert' needs tls_cert_file, tls_key_file and tls_ca_file"
                )
            return
        if not (cert and key and ca):
            raise ConfigError("TLS needs all of 'tls_cert_file', 'tls_key_file' and 'tls_ca_file'")
        self.server_ssl = server_context(cert, key, ca, self.tls_require_client_cert)
        self.client_ssl = client_context(ca, cert, key)

    def raft_config(self) -> RaftConfig:
        return RaftConfig(
            election_ticks=self.election_ticks,
            heartbeat_ticks=self.heartbeat_ticks,
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
            max_inflight=self.max_inflight,
            max_append_bytes=self.max_append_bytes,
            preferred_leader=self.preferred_leader or None,
            max_promote_lag=self.promote_max_lag_entries,
            learner_bytes_per_tick=self.learner_bytes_per_tick,
        )

    @property
    def learner_bytes_per_tick(self) -> int:
        """``learner_catchup_mb_per_s`` as the core counts it (0: no limit; else at least 1)."""
        if not self.learner_catchup_mb_per_s:
            return 0
        return max(1, int(self.learner_catchup_mb_per_s * (1 << 20) * self.tick_ms / 1000))
