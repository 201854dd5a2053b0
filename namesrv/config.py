"""Nameserver settings: defaults < TOML file < NAMESRV_* environment < command line.

Loaded through ledger.settings.load_settings so errors name the key and where it came from;
``validate`` refuses combinations that would make the nameserver misbehave quietly (a scan
interval longer than the expiry, for instance, would keep dead brokers routable).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.settings import ConfigError, load_settings
from remoting.config import RemotingConfig
from remoting.protocol import MAX_HEADER_WIRE_BYTES

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
        if self.log_level.lower() not in _LEVELS:
            raise ConfigError(f"key 'log_level' must be one of {', '.join(_LEVELS)}, got {self.log_level!r}")

    def remoting_config(self) -> RemotingConfig:
        return RemotingConfig(max_body_bytes=self.max_body_bytes, max_header_bytes=self.max_header_bytes)


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> NamesrvConfig:
    """The effective config; a ``[namesrv]`` table is used if the file has one, else the top level."""
    return load_settings(
        NamesrvConfig, path, env_prefix=ENV_PREFIX, overrides=overrides, section="namesrv", environ=environ
    )
