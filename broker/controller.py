"""BrokerController: the broker's life cycle, following RocketMQ's start-up.

create (config, validated) -> initialize (open the ledger and message store, replay the log
into consume queues, offsets and topics; create both listeners and register processors)
-> start (ledger node, listeners, periodic registration with every nameserver) -> shutdown.

Roles follow the ledger (DLedger's role-change handler): when this node's no-op commits
("leader ready") the broker becomes master (broker id 0); when it follows, it is a slave
(broker id = node number + 1). Either way it re-registers with every nameserver at once.
Unlike RocketMQ, the switch to master does not wait on a dispatch backlog: dispatch runs
synchronously on every commit, so at "leader ready" there is at most one batch to apply.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ledger.node import LedgerNode
from ledger.raft import NotLeader, Role
from remoting import RemotingConfig, RemotingServer
from remoting.topic import PERM_READ, PERM_WRITE

from .config import BrokerConfig
from .message_store import MessageStore
from .meta import topic_op
from .processors import Processors
from .registration import BrokerIdentity, BrokerOuterAPI, PeriodicRegistration

log = logging.getLogger("broker")


class BrokerController:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.node: LedgerNode | None = None  # type: ignore[assignment]
        self.store: MessageStore | None = None  # type: ignore[assignment]
        self.is_master = False
        self.broker_id = config.slave_id
        self.role_since = time.monotonic()
        self.switch_times_ms: list[float] = []
        self._leader_at: float | None = None
        self.outer_api = BrokerOuterAPI(config.namesrv_addr)
        self.registration: PeriodicRegistration | None = None
        self.servers: list[RemotingServer] = []
        self._stopped = asyncio.Event()
        self._bootstrap_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ life cycle

    def initialize(self) -> None:
        """Open the ledger, replay it into the message store, and set up listeners and processors."""
        cfg = self.config
        self.node = LedgerNode(cfg.ledger_config())
        self.store = MessageStore(self.node, cfg.broker_name, cfg.dedup_window)
        self.node.role_listeners.append(self._on_role)
        self.node.leader_ready_listeners.append(self._on_leader_ready)
        self.store.topic_listeners.append(lambda: self.trigger_register())
        self.processors = Processors(self)
        # Frames may carry a whole batch; the broker's own checks then say which limit a body broke.
        rcfg = RemotingConfig(max_body_bytes=max(cfg.max_batch_bytes, cfg.max_message_bytes) + (64 << 10))
        main = RemotingServer(cfg.listen_host, cfg.listen_port, rcfg, name="broker")
        fast = RemotingServer(cfg.listen_host, cfg.fast_port, rcfg, name="broker-fast")
        self.processors.register(main, pulls=True)
        self.processors.register(fast, pulls=False)  # the VIP channel serves everything but pulls
        self.servers = [main, fast]

    async def start(self) -> None:
        assert self.node is not None
        await self.node.start()
        for s in self.servers:
            await s.start()
        self.registration = PeriodicRegistration(
            self._register,
            interval_s=self.config.register_interval_s,
            first_delay_s=self.config.register_first_delay_s,
            force_register=False,
        )
        self.registration.start()
        if self.config.retention_hours > 0:
            self._tasks.append(asyncio.get_running_loop().create_task(self._checkpoint_metadata()))
        if self.config.metrics_port:
            self._serve_metrics()
        log.info(
            "broker started",
            extra={
                "broker_name": self.config.broker_name,
                "addr": self.config.broker_addr,
                "fast_port": self.config.fast_port,
                "replayed_index": self.store.applied if self.store else 0,
            },
        )

    def _serve_metrics(self) -> None:
        """Broker gauges join the embedded ledger node's registry: one endpoint per broker process."""
        from prometheus_client import Gauge

        assert self.node is not None and self.store is not None
        reg = self.node.metrics.registry
        store = self.store
        Gauge("broker_is_master", "1 while this broker is its group's master", registry=reg).set_function(
            lambda: 1.0 if self.is_master else 0.0
        )
        Gauge("broker_dispatched_messages", "Messages dispatched into consume queues", registry=reg).set_function(
            lambda: float(store.dispatched_messages)
        )
        Gauge("broker_applied_index", "Ledger index the dispatcher has applied", registry=reg).set_function(
            lambda: float(store.applied)
        )
        Gauge("broker_last_switch_ms", "Duration of the last switch to master", registry=reg).set_function(
            lambda: self.switch_times_ms[-1] if self.switch_times_ms else 0.0
        )
        self.node.metrics.serve(self.config.metrics_host, self.config.metrics_port)

    async def shutdown(self) -> None:
        if self._stopped.is_set():
            return
        for t in self._tasks:
            t.cancel()
        if self.registration is not None:
            await self.registration.stop()
        try:
            await asyncio.wait_for(self.outer_api.unregister_broker_all(self.identity()), 3)
        except Exception as exc:  # noqa: BLE001 - best effort: nameservers expire us anyway
            log.warning("unregister failed", extra={"error": str(exc)})
        for s in self.servers:
            await s.stop()
        if self.node is not None:
            await self.node.stop()
        await self.outer_api.close()
        self._stopped.set()
        log.info("broker stopped")

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # ------------------------------------------------------------------ roles

    def _on_role(self, role: Role, term: int, leader: str | None) -> None:
        if role is Role.LEADER:
            self._leader_at = time.monotonic()
            return
        if self.is_master or self.broker_id != self.config.slave_id:
            log.info("switching to slave", extra={"term": term, "leader": leader})
        self.is_master = False
        self.broker_id = self.config.slave_id
        self.role_since = time.monotonic()
        self.trigger_register()

    def _on_leader_ready(self, term: int) -> None:
        assert self.store is not None
        self.store.dispatch()  # at most one batch behind: dispatch runs on every commit
        self.is_master = True
        self.broker_id = 0
        now = time.monotonic()
        self.role_since = now
        switch_ms = 1000 * (now - (self._leader_at or now))
        self.switch_times_ms.append(switch_ms)
        log.info("switched to master", extra={"term": term, "switch_ms": round(switch_ms, 2)})
        self.trigger_register()
        self._bootstrap_task = asyncio.get_running_loop().create_task(self._create_configured_topics())

    async def _create_configured_topics(self) -> None:
        """The first master creates the topics named in the config (through the ledger)."""
        assert self.store is not None
        for spec in self.config.topics:
            name, _, q = spec.partition(":")
            nums = int(q) if q else self.config.default_queue_nums
            if name in self.store.topics:
                continue
            try:
                await self.store.append_async([topic_op(name, nums, nums, PERM_READ | PERM_WRITE)])
            except (NotLeader, Exception) as exc:  # noqa: BLE001 - the next master will try again
                log.warning("could not create configured topic", extra={"topic": name, "error": str(exc)})
                return

    async def _checkpoint_metadata(self) -> None:
        """With retention on, re-state topics and offsets well within the retention period."""
        interval = max(1.0, min(600.0, self.config.retention_hours * 3600 / 4))
        while True:
            await asyncio.sleep(interval)
            if self.is_master and self.store is not None and (self.store.topics or self.store.offsets):
                try:
                    await self.store.append_async([self.store.snapshot_record()])
                except Exception as exc:  # noqa: BLE001 - the next round or the next master retries
                    log.warning("metadata checkpoint failed", extra={"error": str(exc)})

    def master_address(self) -> str | None:
        assert self.node is not None
        if self.is_master:
            return self.config.broker_addr
        leader = self.node.core.leader
        member = self.config.members.get(leader) if leader else None
        return member.broker_addr if member else None

    # ------------------------------------------------------------------ registration

    def identity(self) -> BrokerIdentity:
        return BrokerIdentity(
            self.config.cluster_name, self.config.broker_name, self.config.broker_addr, self.broker_id
        )

    def trigger_register(self) -> None:
        if self.registration is not None:
            self.registration.trigger(force=True)

    async def _register(self, force: bool) -> None:
        assert self.store is not None
        results = await self.outer_api.register_if_needed(
            self.identity(),
            self.store.topic_config_wrapper(),
            force=force,
            timeout_s=self.config.register_timeout_s,
        )
        if results:
            failed = [r for r in results if getattr(r, "error", None)]
            if failed:
                log.warning(
                    "registration failed on some nameservers",
                    extra={"failed": [f"{r.namesrv_addr}: {r.error}" for r in failed]},
                )

    # ------------------------------------------------------------------ status

    def runtime_info(self) -> dict[str, Any]:
        assert self.node is not None and self.store is not None
        return {
            "brokerName": self.config.broker_name,
            "brokerAddr": self.config.broker_addr,
            "brokerId": self.broker_id,
            "role": "MASTER" if self.is_master else "SLAVE",
            "masterAddr": self.master_address(),
            "roleSinceSeconds": round(time.monotonic() - self.role_since, 3),
            "switchTimesMs": [round(x, 2) for x in self.switch_times_ms[-10:]],
            "ledger": self.node.status(),
            "store": self.store.stats(),
        }
