"""NamesrvController: wires the route table, KV area, processors, listener and scan task.

Follows RocketMQ's NamesrvController: initialize (load KV config, register processors,
schedule the inactive-broker scan), start, shutdown. A broker's closed connection removes it
at once; the scan catches brokers that went silent without closing (a paused or partitioned
process keeps its TCP connection open, which is exactly what Jepsen's nemeses do).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from namesrv.config import NamesrvConfig
from namesrv.kvconfig import KVConfigManager
from namesrv.metrics import MetricsEndpoint
from namesrv.processor import NamesrvProcessor
from namesrv.routeinfo import RouteInfoManager
from remoting.acl import AccessValidator, server_accounts
from remoting.cluster_auth import ClusterGate
from remoting.connection import RemotingConnection
from remoting.server import RemotingServer

log = logging.getLogger("namesrv")


class NamesrvController:
    """One nameserver: ``await start()``, then ``await shutdown()``."""

    def __init__(self, config: NamesrvConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.routes = RouteInfoManager(
            delete_topic_with_broker_registration=config.delete_topic_with_broker_registration
        )
        self.kv = KVConfigManager(config.kv_config_path or None)
        self.processor = NamesrvProcessor(config, self.routes, self.kv, clock)
        self.server = RemotingServer(
            config.listen_host, config.listen_port, config.remoting_config(), name="namesrv"
        )
        self.metrics = MetricsEndpoint(self, config.metrics_host, config.metrics_port)
        self.brokers_expired = 0
        self.brokers_disconnected = 0
        self._scan_task: asyncio.Task[None] | None = None
        self._initialized = False

    def initialize(self) -> None:
        """Load persisted state and register processors; raises (with the reason) if start-up must stop."""
        if self._initialized:
            return
        self.kv.load()
        cfg = self.config
        gate: AccessValidator | ClusterGate | None = None
        if cfg.acl_enable:
            accounts = server_accounts(cfg.acl_file, cfg.acl_admin_access_key, cfg.acl_admin_secret_key)
            gate = AccessValidator(accounts, require_signature=False)
            log.info("ACL on", extra={"accounts": len(accounts), "acl_file": cfg.acl_file})
        if cfg.secret:  # registrations prove the cluster secret, whatever the ACL setting
            gate = ClusterGate([cfg.secret], gate, max_skew_s=cfg.cluster_max_skew_s)
        else:
            log.warning(
                "no cluster_secret: any process that reaches this nameserver can register brokers "
                "(set cluster_secret or cluster_secret_file to the brokers' secret)"
            )
        if gate is not None:
            self.server.set_request_gate(gate)
        for code, handler in self.processor.handlers().items():
            self.server.register_processor(code, handler)
        self.server.add_connection_listener(on_closed=self._on_connection_closed)
        self._initialized = True

    async def start(self) -> None:
        self.initialize()
        await self.server.start()
        self.metrics.start()
        self._scan_task = asyncio.get_running_loop().create_task(self._scan_loop(), name="namesrv-scan")
        log.info(
            "namesrv started",
            extra={
                "listen_host": self.config.listen_host,
                "listen_port": self.server.port,
                "metrics_port": self.metrics.port,
                "broker_expire_s": self.config.broker_expire_s,
                "scan_interval_s": self.config.scan_interval_s,
            },
        )

    @property
    def address(self) -> str:
        return self.server.address

    async def shutdown(self) -> None:
        if self._scan_task is not None:
            self._scan_task.cancel()
            try:
                await self._scan_task
            except asyncio.CancelledError:
                pass
            self._scan_task = None
        await self.server.stop()
        self.metrics.stop()
        log.info("namesrv stopped", extra={"listen_port": self.server.port})

    # --- liveness ---------------------------------------------------------------------------
    def scan_not_active_broker(self) -> int:
        """Remove expired brokers and close their connections; returns how many were removed."""
        expired = self.routes.scan_not_active_broker(self.clock(), self.config.broker_expire_s)
        for info in expired:
            self.brokers_expired += 1
            channel = info.channel
            if isinstance(channel, RemotingConnection) and not channel.closed:
                channel.close("broker expired")
        return len(expired)

    async def _scan_loop(self) -> None:
        interval = self.config.scan_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                self.scan_not_active_broker()
            except Exception:  # never let one bad scan stop liveness checking for good
                log.exception("inactive broker scan failed")

    def _on_connection_closed(self, conn: RemotingConnection) -> None:
        removed = self.routes.on_channel_destroy(conn)
        self.brokers_disconnected += len(removed)
