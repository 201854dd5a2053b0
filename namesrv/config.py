"""Nameserver settings: defaults < TOML file < NAMESRV_* environment < command line.

Loaded through common.settings.load_settings so errors name the key and where it came from;
``validate`` refuses combinations that would make the nameserver misbehave quietly (a scan
interval longer than the expiry, for instance, would keep dead brokers routable).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.cluster_secret import load_cluster_secret
from common.settings import ConfigError, load_settings
from remoting.config import RemotingConfig, listener_limits
from remoting.protocol import MAX_HEADER_WIRE_BYTES
from remoting.tls import TLS_DISABLED, server_ssl

ENV_PREFIX = "NAMESRV_"
_LEVELS = ("debug", "info", "warning", "error")


@dataclass
class NamesrvConfig:
    """Every setting of one nameserver process. TOML keys are these names (``-`` may replace ``_``)."""

    listen_host: str = "127.0.0.1"
    """Address to bind; set 0.0.0.0 to serve other hosts (docker-compose does)."""
    listen_port: int = 9876
    """RocketMQ's default; 0 picks a free port (logged at start-up)."""
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    """Prometheus /metrics port; 0 disables the endpoint."""
    broker_expire_s: float = 120.0
    """A broker silent for longer than this is removed (RocketMQ: 120 s)."""
    scan_interval_s: float = 10.0
    """How often expired brokers are looked for (RocketMQ: 10 s)."""
    kv_config_path: str = ""
    """JSON file persisting the KV config area; empty keeps it in memory only."""
    order_message_enable: bool = False
    """Attach ORDER_TOPIC_CONFIG entries to routes (RocketMQ's orderMessageEnable)."""
    delete_topic_with_broker_registration: bool = False
    """Drop a group's topics missing from its master's changed registration (RocketMQ 5 option)."""
    max_body_bytes: int = 4 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    max_register_body_bytes: int = 64 * 1024 * 1024
    """Limit on a decompressed (compressed=true) registration body."""
    max_connections: int = 4096
    """Open client/broker connections at most; more are closed on accept (fit the open-file limit)."""
    handshake_timeout_s: float = 10.0
    """A connection must deliver one complete frame within this long."""
    idle_timeout_s: float = 120.0
    """A connection silent (no complete frame) this long is closed; 0 turns it off."""
    max_buffered_frame_bytes: int = 256 * 1024 * 1024
    """Unfinished frames held over all connections at most; the connection passing it is closed."""
    frame_timeout_s: float = 30.0
    """A frame once begun must complete within this, plus what its bytes are worth at
    ``frame_min_bytes_per_s`` (a trickling peer is cut)."""
    frame_min_bytes_per_s: int = 64 * 1024
    max_inflight_requests: int = 1024
    """Per connection: reading pauses while this many requests await their answers."""
    max_inflight_request_bytes: int = 64 * 1024 * 1024
    max_output_bytes: int = 0
    """Per connection: queued answers past this close it (0: automatic, see remoting.config)."""
    max_dispatch_per_turn: int = 256
    """Requests of one connection handled per event-loop turn; the rest wait for the next."""
    acl_enable: bool = False
    """Admin operations (KV put/delete, topic delete, broker write permission) and broker
    registration then need a request signed by an admin account of ``acl_file``."""
    acl_file: str = ""
    """TOML file of ACL accounts (see remoting/acl.py and docs/broker.md, section Security)."""
    acl_admin_access_key: str = ""
    """A superuser account given in settings/env instead of (or besides) ``acl_file``."""
    acl_admin_secret_key: str = field(default="", repr=False)
    tls_server_mode: str = TLS_DISABLED
    """disabled, permissive (TLS and plaintext clients both served) or enforcing (TLS only);
    RocketMQ's tls.server.mode."""
    tls_cert_file: str = ""
    """PEM certificate chain the listener presents (needed unless tls_server_mode is disabled)."""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    """CA that client certificates are checked against (clients that present one)."""
    tls_require_client_cert: bool = False
    """Refuse TLS clients without a certificate from tls_ca_file (RocketMQ's tls.server.need.client.auth)."""
    cluster_secret: str = field(default="", repr=False)
    """The deployment's cluster secret (at least 16 bytes): set, brokers must prove it to
    register, unregister or refresh their liveness, whatever ``acl_enable`` says (a broker
    signs with its own ``cluster_secret``). Empty: registration is open, as in RocketMQ."""
    cluster_secret_file: str = ""
    """A file holding the cluster secret (instead of ``cluster_secret``)."""
    cluster_max_skew_s: float = 300.0
    """How far a signed registration's clock may be from this nameserver's (replay bound)."""
    server_ssl: ssl.SSLContext | None = field(init=False, default=None, repr=False, compare=False)
    secret: bytes = field(init=False, default=b"", repr=False, compare=False)
    log_level: str = "info"
    node_name: str = ""
    """Name put in every log line; defaults to namesrv-<port>."""

    def validate(self) -> None:
        if not self.listen_host:
            raise ConfigError("key 'listen_host' must not be empty")
        for key in ("listen_port", "metrics_port"):
            value = getattr(self, key)
            if not 0 <= value <= 65535:
                raise ConfigError(f"key '{key}' must be a port in 0..65535, got {value}")
        if self.broker_expire_s <= 0:
            raise ConfigError(f"key 'broker_expire_s' must be positive, got {self.broker_expire_s}")
        if self.scan_interval_s <= 0:
            raise ConfigError(f"key 'scan_interval_s' must be positive, got {self.scan_interval_s}")
        if self.scan_interval_s > self.broker_expire_s:
            raise ConfigError(
                f"key 'scan_interval_s' ({self.scan_interval_s}) must not exceed 'broker_expire_s' "
                f"({self.broker_expire_s}), or dead brokers stay routable for up to twice the expiry"
            )
        if not 1024 <= self.max_body_bytes <= 1 << 31:
            raise ConfigError(f"key 'max_body_bytes' must be in 1024..{1 << 31}, got {self.max_body_bytes}")
        if not 256 <= self.max_header_bytes <= MAX_HEADER_WIRE_BYTES:
            raise ConfigError(
                f"key 'max_header_bytes' must be in 256..{MAX_HEADER_WIRE_BYTES}, got {self.max_header_bytes}"
            )
        if self.max_register_body_bytes < self.max_body_bytes:
            raise ConfigError("key 'max_register_body_bytes' must be at least 'max_body_bytes'")
        if self.acl_enable and not (self.acl_file or self.acl_admin_access_key):
            raise ConfigError(
                "key 'acl_enable' is true but neither 'acl_file' nor 'acl_admin_access_key' is set"
            )
        self.secret = load_cluster_secret(self.cluster_secret, self.cluster_secret_file)
        if not 1 <= self.cluster_max_skew_s <= 86400:
            raise ConfigError(
                f"key 'cluster_max_skew_s' must be in 1..86400 s, got {self.cluster_max_skew_s}"
            )
        self.server_ssl = server_ssl(
            self.tls_server_mode,
            self.tls_cert_file,
            self.tls_key_file,
            self.tls_ca_file,
            self.tls_require_client_cert,
        )
        try:
            self.remoting_config()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.log_level.lower() not in _LEVELS:
            raise ConfigError(f"key 'log_level' must be one of {', '.join(_LEVELS)}, got {self.log_level!r}")

    def remoting_config(self) -> RemotingConfig:
        return RemotingConfig(
            max_body_bytes=self.max_body_bytes,
            max_header_bytes=self.max_header_bytes,
            **listener_limits(self),  # type: ignore[arg-type]
            tls_mode=self.tls_server_mode,
            server_ssl=self.server_ssl,
        )


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> NamesrvConfig:
    """The effective config; a ``[namesrv]`` table is used if the file has one, else the top level."""
    return load_settings(
        NamesrvConfig, path, env_prefix=ENV_PREFIX, overrides=overrides, section="namesrv", environ=environ
    )
