"""BrokerController: the broker's life cycle, following RocketMQ's start-up.

create (config, validated) -> initialize (the embedded ledger member, the message store,
both listeners and their processors) -> start (ledger, listeners, periodic registration
with every nameserver; the store replays the retained log a slice per loop turn) ->
shutdown.

Roles follow the ledger (DLedger's role-change handler). A follower is a slave (broker id
= node number + 1). A leader becomes master (broker id 0) once its no-op has committed
("leader ready") AND its store has applied everything committed up to then, so a new
master never serves sends or pulls from state that misses committed entries; while a
backlog is being applied the event loop keeps running (votes, heartbeats, other
requests). Every switch re-registers with every nameserver at once.

Membership (``broker.membership``): only a voter of the ledger's configuration registers; a
learner catching up does not, and a removed member unregisters. Members' broker addresses
come from the log (``brokers`` records), the config's ``group`` only bootstrapping them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from common.loop_lag import LoopLagMonitor
from ledger.embed import EmbeddedLedger, EmbedError, Role, RoleChange
from remoting import RemotingServer, RequestCode
from remoting.acl import AccessValidator, RequestSigner, server_accounts
from remoting.cluster_auth import ClusterSigner, chain_hooks
from remoting.topic import PERM_READ, PERM_WRITE

from .config import BrokerConfig
from .delivery import ScheduledDelivery, TransactionChecker
from .membership import GroupMembership
from .message_store import MessageStore
from .meta import broker_addrs_op, topic_op
from .processors import DEFAULT_TOPIC, PERM_INHERIT, Processors
from .registration import BrokerIdentity, BrokerOuterAPI, PeriodicRegistration
from .system_topics import HALF_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC

log = logging.getLogger("broker")


class BrokerController:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.ledger: EmbeddedLedger | None = None
        self._store: MessageStore | None = None
        self.is_master = False
        self.broker_id = config.slave_id
        self.role_since = time.monotonic()
        self.switch_times_ms: list[float] = []
        self._leader_at: float | None = None
        self._backlog_at_election = 0  # committed entries not yet applied when this broker was elected
        self._backlog_at_ready = 0  # ... when its term's no-op committed (see _on_leader_ready)
        self._leader_term: int | None = None  # the term this broker's ledger member leads in
        self.outer_api = BrokerOuterAPI(
            config.namesrv_addr, remoting_config=config.outgoing_remoting_config()
        )
        # Set before the first connection (each connection takes the hook then): registrations
        # prove the cluster secret, and are signed by the broker's ACL account when it has one.
        self.outer_api.client.rpc_hook = chain_hooks(
            ClusterSigner(config.secret),
            RequestSigner(config.access_key, config.secret_key) if config.access_key else None,
        )
        self.registration: PeriodicRegistration | None = None
        self.servers: list[RemotingServer] = []
        self._stopped = asyncio.Event()
        self._bootstrap_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._master_tasks: list[asyncio.Task[None]] = []
        self.loop_lag = LoopLagMonitor()  # how late the event loop runs: what floods would cost
        self.membership = GroupMembership(self)  # follows the ledger's configuration once initialized

    # ------------------------------------------------------------------ life cycle

    def initialize(self) -> None:
        """Open the ledger, replay it into the message store, and set up listeners and processors."""
        cfg = self.config
        self.ledger = EmbeddedLedger(cfg.ledger_config())
        self._store = MessageStore(
            self.ledger,
            cfg.broker_name,
            cfg.dedup_window,
            cfg.apply_slice_bytes,
            cfg.dedup_ttl_s,
            yield_lag_entries=cfg.yield_lag_entries,
            checkpoint_path=cfg.checkpoint_path,
            checkpoint_min_entries=cfg.checkpoint_min_entries,
        )
        self.membership.attach()
        self.ledger.on_role(self._on_role)
        self.ledger.on_leader_ready(self._on_leader_ready)
        self._store.topic_listeners.append(self._topics_changed)
        self.processors = Processors(self)
        # what only a master does: deliver scheduled messages when due, check transactions
        self.delivery = ScheduledDelivery(self._store, cfg, self.processors.ctx.store_host)
        self.transaction_checks = TransactionChecker(self._store, cfg, self.processors.clients)
        rcfg = cfg.remoting_config()
        main = RemotingServer(cfg.listen_host, cfg.listen_port, rcfg, name="broker")
        fast = RemotingServer(cfg.listen_host, cfg.fast_port, rcfg, name="broker-fast")
        self.processors.register(main, pulls=True)
        self.processors.register(fast, pulls=False)  # the VIP channel serves everything but pulls
        for server in (main, fast):
            self.membership.register(server)
        self.servers = [main, fast]
        if cfg.acl_enable:
            accounts = server_accounts(cfg.acl_file, cfg.acl_admin_access_key, cfg.acl_admin_secret_key)
            validator = AccessValidator(
                accounts,
                require_signature=True,
                topic_resolvers={
                    RequestCode.VIEW_MESSAGE_BY_ID: self.processors.viewed_topic,
                    **self.processors.held.topic_resolvers(),
                },
            )
            for server in self.servers:
                server.set_request_gate(validator)
            log.info("ACL on", extra={"accounts": len(accounts), "acl_file": cfg.acl_file})

    @property
    def store(self) -> MessageStore:
        assert self._store is not None, "initialize() first"
        return self._store

    async def start(self) -> None:
        assert self.ledger is not None
        self.loop_lag.start()
        await self.ledger.start()
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
        if self.config.checkpoint_interval_s > 0:  # the state, so a restart replays only the log's tail
            self._tasks.append(
                asyncio.get_running_loop().create_task(
                    self.store.run_checkpoints(self.config.checkpoint_interval_s)
                )
            )
        if self.config.metrics_port:
            self._serve_metrics()
        log.info(
            "broker started",
            extra={
                "broker_name": self.config.broker_name,
                "addr": self.config.broker_addr,
                "fast_port": self.config.fast_port,
                "applied_index": self.store.applied,
            },
        )

    def _serve_metrics(self) -> None:
        """Broker gauges join the embedded ledger node's registry: one endpoint per broker process."""
        from prometheus_client import Gauge

        assert self.ledger is not None
        reg = self.ledger.metrics_registry
        store = self.store
        Gauge("broker_is_master", "1 while this broker is its group's master", registry=reg).set_function(
            lambda: 1.0 if self.is_master else 0.0
        )
        Gauge(
            "broker_dispatched_messages", "Messages dispatched into consume queues", registry=reg
        ).set_function(lambda: float(store.dispatched_messages))
        Gauge("broker_applied_index", "Ledger index the dispatcher has applied", registry=reg).set_function(
            lambda: float(store.applied)
        )
        Gauge("broker_last_switch_ms", "Duration of the last switch to master", registry=reg).set_function(
            lambda: self.switch_times_ms[-1] if self.switch_times_ms else 0.0
        )
        self.ledger.serve_metrics(self.config.metrics_host, self.config.metrics_port)

    async def shutdown(self) -> None:
        if self._stopped.is_set():
            return
        for t in [*self._tasks, *self._master_tasks]:
            t.cancel()
        await self.membership.close()
        self.loop_lag.stop()
        if self.registration is not None:  # None: start failed before the broker registered
            await self.registration.stop()
            try:
                await asyncio.wait_for(self.outer_api.unregister_broker_all(self.identity()), 3)
            except Exception as exc:  # noqa: BLE001 - best effort: nameservers expire us anyway
                log.warning("unregister failed", extra={"error": str(exc)})
        for s in self.servers:
            await s.stop()
        if self._store is not None:  # a clean stop leaves a checkpoint of everything applied
            try:
                await self._store.write_checkpoint(force=True)
            except Exception as exc:  # noqa: BLE001 - best effort: a restart replays more without it
                log.warning("checkpoint at shutdown failed", extra={"error": str(exc)})
        if self.ledger is not None:
            await self.ledger.stop()
        await self.outer_api.close()
        self._stopped.set()
        log.info("broker stopped")

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # ------------------------------------------------------------------ roles

    def _on_role(self, change: RoleChange) -> None:
        if change.role is Role.LEADER:
            self._leader_at = time.monotonic()
            self._leader_term = change.term
            self._backlog_at_election = self.ledger.commit_index - self.store.applied if self.ledger else 0
            return
        self._leader_term = None
        for task in self._master_tasks:
            task.cancel()  # (they stop by themselves too, once they see the role change)
        self._master_tasks = []
        if self.is_master or self.broker_id != self.config.slave_id:
            log.info("switching to slave", extra={"term": change.term, "leader": change.leader_id})
        self.is_master = False
        self.broker_id = self.config.slave_id
        self.role_since = time.monotonic()
        self.trigger_register()

    def _on_leader_ready(self, term: int) -> None:
        """Become master once the store has applied everything committed so far (a slice per loop turn)."""
        assert self.ledger is not None
        # what the switch waits for: the backlog committed when elected, and what the new term's
        # no-op committed with it (entries the old leader had sent but not committed)
        self._backlog_at_ready = self.ledger.commit_index - self.store.applied
        self.store.when_applied(self.ledger.commit_index, lambda: self._become_master(term))

    def _become_master(self, term: int) -> None:
        if self._leader_term != term or self.is_master:
            return  # deposed while the backlog was being applied
        self.is_master = True
        self.broker_id = 0
        now = time.monotonic()
        self.role_since = now
        switch_ms = 1000 * (now - (self._leader_at or now))
        self.switch_times_ms.append(switch_ms)
        log.info(
            "switched to master",
            extra={
                "term": term,
                "switch_ms": round(switch_ms, 2),
                "backlog_at_election": self._backlog_at_election,
                "backlog_at_ready": self._backlog_at_ready,
            },
        )
        self.trigger_register()
        loop = asyncio.get_running_loop()
        self._bootstrap_task = loop.create_task(self._create_configured_topics())
        self._tasks.append(loop.create_task(self._record_member_addresses(term)))

        def still_master() -> bool:
            return self.is_master and self._leader_term == term

        self._master_tasks = [
            loop.create_task(self.delivery.run(still_master), name="scheduled-delivery"),
            loop.create_task(self.transaction_checks.run(still_master), name="transaction-checks"),
        ]

    async def _create_configured_topics(self) -> None:
        """The first master creates the topics named in the config (through the ledger), and
        RocketMQ's template topic TBW102 when topics are auto-created: RocketMQ clients look up
        its route to find brokers for a topic that does not exist yet."""
        specs = [
            (spec.partition(":")[0], spec.partition(":")[2], PERM_READ | PERM_WRITE)
            for spec in self.config.topics
        ]
        if self.config.auto_create_topic_enable:
            specs.append((DEFAULT_TOPIC, "", PERM_INHERIT | PERM_READ | PERM_WRITE))
        # the broker's own (clients cannot send to them), as RocketMQ creates them
        specs += [
            (SCHEDULE_TOPIC, str(len(self.config.delay_levels_ms)), PERM_READ | PERM_WRITE),
            (TIMER_TOPIC, "1", PERM_READ | PERM_WRITE),
            (HALF_TOPIC, "1", PERM_READ | PERM_WRITE),
        ]
        for name, q, perm in specs:
            nums = int(q) if q else self.config.default_queue_nums
            if name in self.store.topics:
                continue
            try:
                await self.store.append_async([topic_op(name, nums, nums, perm)])
            except (EmbedError, Exception) as exc:  # noqa: BLE001 - the next master will try again
                log.warning("could not create configured topic", extra={"topic": name, "error": str(exc)})
                return

    async def _record_member_addresses(self, term: int) -> None:
        """Put into the log, once, the broker addresses of members it lacks that this broker's
        ``group`` names: a broker that joins later may list only some of the group."""
        missing = self.membership.missing_addresses()
        if not missing or self._leader_term != term:
            return
        try:
            await self.store.append_async([broker_addrs_op(missing)])
        except Exception as exc:  # noqa: BLE001 - the next master tries again
            log.warning("could not record member broker addresses", extra={"error": str(exc)})

    async def _checkpoint_metadata(self) -> None:
        """With retention on, re-state topics and offsets well within the retention period."""
        interval = max(1.0, min(600.0, self.config.retention_hours * 3600 / 4))
        while True:
            await asyncio.sleep(interval)
            if self.is_master and (self.store.topics or self.store.offsets):
                try:
                    addrs = self.membership.table_record()  # retention must not lose them either
                    await self.store.append_async([self.store.snapshot_record(), *([addrs] if addrs else [])])
                except Exception as exc:  # noqa: BLE001 - the next round or the next master retries
                    log.warning("metadata checkpoint failed", extra={"error": str(exc)})

    def master_address(self) -> str | None:
        assert self.ledger is not None
        if self.is_master:
            return self.config.broker_addr
        leader = self.ledger.leader_id
        return self.membership.broker_addr(leader) if leader else None

    @property
    def leader_known(self) -> bool:
        """Whether this broker's ledger member knows a leader (so a master exists or is coming)."""
        return self.ledger is not None and self.ledger.leader_id is not None

    async def read_barrier(self) -> int:
        """Confirm leadership (ReadIndex): state applied through the result may be served as current."""
        assert self.ledger is not None
        return await self.ledger.read_barrier(self.config.read_barrier_timeout_s)

    # ------------------------------------------------------------------ registration

    def identity(self) -> BrokerIdentity:
        return BrokerIdentity(
            self.config.cluster_name, self.config.broker_name, self.config.broker_addr, self.broker_id
        )

    def _topics_changed(self) -> None:
        if self.registration is not None:
            self.registration.trigger_coalesced()

    def trigger_register(self) -> None:
        if self.registration is not None:
            self.registration.trigger(force=True)

    async def _register(self, force: bool) -> None:
        if not self.membership.is_voter:
            return  # a learner (still catching up) or a removed member: no replica clients may use
        self.membership.registered = True
        results = await self.outer_api.register_if_needed(
            self.identity(),
            self.store.topic_config_wrapper(),
            force=force,
            timeout_s=self.config.register_timeout_s,
        )
        if not self.membership.is_voter:  # removed while this round was on its way
            await self.membership.unregister_self()
            return
        if results:
            failed = [r for r in results if getattr(r, "error", None)]
            if failed:
                log.warning(
                    "registration failed on some nameservers",
                    extra={"failed": [f"{r.namesrv_addr}: {r.error}" for r in failed]},
                )

    # ------------------------------------------------------------------ status

    def runtime_info(self, lag_since: float = 0.0) -> dict[str, Any]:
        assert self.ledger is not None
        return {
            "brokerName": self.config.broker_name,
            "brokerAddr": self.config.broker_addr,
            "brokerId": self.broker_id,
            "role": "MASTER" if self.is_master else "SLAVE",
            "masterAddr": self.master_address(),
            "roleSinceSeconds": round(time.monotonic() - self.role_since, 3),
            "switchTimesMs": [round(x, 2) for x in self.switch_times_ms[-10:]],
            "ledger": self.ledger.status(),
            "store": self.store.stats(),
            "loopLag": self.loop_lag.summary(lag_since),
            "delivery": self.delivery.stats(),
            "transactions": self.transaction_checks.stats(),
            "membership": self.membership.status(),
        }
