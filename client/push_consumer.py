"""PushConsumer: a consumer group member that long-polls its share of a topic's queues.

Like RocketMQ's DefaultMQPushConsumer, but each allocated queue gets one asyncio task that
pulls (long polling), hands the batch to the listener, and only then moves its offset on.
So within a queue messages reach the listener in order and a batch is never skipped: a
listener that fails or returns RECONSUME_LATER sees the same batch again after a pause.
Delivery is at least once: after a rebalance or a failover another member may see a batch
whose offset commit had not yet been replicated.

Membership: a heartbeat to every member of the topic's broker groups (so a newly elected
master already knows us), the group's consumer ids from GET_CONSUMER_LIST_BY_GROUP, average
allocation, re-done every ``rebalance_interval_s`` or when a broker says the group changed.

Offsets: piggybacked on the next pull to the master after each consumed batch (RocketMQ's
commitOffset sysFlag), committed explicitly every ``commit_interval_s``, and when a queue is
given up or the consumer shuts down.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from enum import Enum

import client.broker_api as B
from client.broker_api import PullStatus
from client.consumer import ConsumerBase
from client.errors import BrokerError, ClientError, ClientStateError, NoNameServerError
from client.instance import ClientInstance
from client.rebalance import allocate_average
from client.route import MessageQueue
from remoting.codes import RequestCode
from remoting.exceptions import RemotingError
from remoting.message import Message
from remoting.protocol import HeaderValue, RemotingCommand

log = logging.getLogger("client.push_consumer")


class ConsumeStatus(Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeFromWhere(Enum):
    """Where a group with no committed offset for a queue starts."""

    FIRST_OFFSET = "FIRST_OFFSET"
    LAST_OFFSET = "LAST_OFFSET"


ListenerResult = ConsumeStatus | bool | None
MessageListener = Callable[[list[Message], MessageQueue], ListenerResult | Awaitable[ListenerResult]]
"""Gets a batch of one queue, in offset order. None, True or CONSUME_SUCCESS: consumed."""


def _matcher(subscription: str) -> Callable[[Message], bool] | None:
    """RocketMQ tag expressions: ``*`` or ``TagA || TagB``. None means "everything"."""
    expr = (subscription or "*").strip()
    if expr == "*":
        return None
    tags = {t.strip() for t in expr.split("||") if t.strip()}
    if not tags or "*" in tags:
        return None
    return lambda m: m.tags in tags


class _ProcessQueue:
    """One allocated queue: its task, where it stands, and whether it was taken away."""

    __slots__ = ("queue", "task", "dropped", "in_listener", "offset", "committed", "ready")

    def __init__(self, queue: MessageQueue) -> None:
        self.queue = queue
        self.task: asyncio.Task[None] | None = None
        self.dropped = False
        self.in_listener = False
        self.offset = -1  # next offset to consume; -1 until known
        self.committed = -1  # last offset the master confirmed
        self.ready = asyncio.Event()


class PushConsumer(ConsumerBase):
    """Consume ``topic`` as a member of ``group``: ``await start()`` ... ``await shutdown()``."""

    def __init__(
        self,
        group: str,
        namesrv_addrs: str | Sequence[str] | None,
        topic: str,
        listener: MessageListener,
        *,
        subscription: str = "*",
        consume_from: ConsumeFromWhere = ConsumeFromWhere.FIRST_OFFSET,
        batch_size: int = 32,
        suspend_ms: int = 15_000,
        rebalance_interval_s: float = 5.0,
        heartbeat_interval_s: float = 10.0,
        commit_interval_s: float = 5.0,
        commit_each_batch: bool = False,
        pull_error_delay_s: float = 1.0,
        reconsume_delay_s: float = 1.0,
        listener_grace_s: float = 30.0,
        call_timeout_s: float = 3.0,
        instance: ClientInstance | None = None,
    ) -> None:
        super().__init__(group, namesrv_addrs, call_timeout_s=call_timeout_s, instance=instance)
        self.topic = topic
        self.listener = listener
        self.subscription = subscription
        self._match = _matcher(subscription)
        self.consume_from = consume_from
        self.batch_size = batch_size
        self.suspend_ms = suspend_ms
        self.rebalance_interval_s = rebalance_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.commit_interval_s = commit_interval_s
        self.commit_each_batch = commit_each_batch
        self.pull_error_delay_s = pull_error_delay_s
        self.reconsume_delay_s = reconsume_delay_s
        self.listener_grace_s = listener_grace_s
        self._queues: dict[MessageQueue, _ProcessQueue] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalance_now: asyncio.Event | None = None
        self._unwatch: Callable[[], None] | None = None
        self._rebalance_lock: asyncio.Lock | None = None

    @property
    def client_id(self) -> str:
        return self.instance.client_id

    @property
    def allocated_queues(self) -> list[MessageQueue]:
        return sorted(self._queues)

    def consumed_offsets(self) -> dict[MessageQueue, int]:
        """Next offset to consume per allocated queue (known ones only)."""
        return {q: pq.offset for q, pq in self._queues.items() if pq.offset >= 0}

    # --- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Join the group: heartbeat, first rebalance, then the periodic loops.

        Raises only for configuration errors (no nameserver address); an unreachable broker or
        unknown topic is logged and retried by the loops.
        """
        if self.instance.closed:
            raise ClientStateError("consumer was shut down; create a new one")
        if self._running:
            return
        self._running = True
        self._rebalance_now = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self._unwatch = self.instance.watch_consumer_ids(self.group, self._rebalance_now.set)
        try:
            await self._heartbeat()
            await self.rebalance()
        except NoNameServerError:
            self._running = False
            raise
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(
                self._periodic(self._heartbeat, self.heartbeat_interval_s), name=f"heartbeat-{self.group}"
            ),
            loop.create_task(self._rebalance_loop(), name=f"rebalance-{self.group}"),
            loop.create_task(
                self._periodic(self._commit_all, self.commit_interval_s), name=f"commit-{self.group}"
            ),
        ]

    async def shutdown(self) -> None:
        """Stop pulling, let running listener calls finish, commit every queue's offset, disconnect."""
        if not self._running:
            await self._close_instance()
            return
        self._running = False
        if self._unwatch is not None:
            self._unwatch()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await asyncio.gather(*(self._drop(q) for q in list(self._queues)), return_exceptions=True)
        await self._unregister()
        await self._close_instance()

    async def __aenter__(self) -> PushConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def wait_assigned(self, timeout_s: float = 10.0) -> list[MessageQueue]:
        """Wait until every allocated queue knows its start offset (handy in tests and tools)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pqs = list(self._queues.values())
            if pqs and all(pq.ready.is_set() for pq in pqs):
                return self.allocated_queues
            await asyncio.sleep(0.02)
        return self.allocated_queues

    # --- periodic work ------------------------------------------------------------------------------
    async def _periodic(self, work: Callable[[], Awaitable[object]], interval_s: float) -> None:
        while self._running:
            await asyncio.sleep(interval_s)
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "periodic task failed",
                    extra={"group": self.group, "task": work.__name__, "error": str(exc)},
                )

    async def _rebalance_loop(self) -> None:
        event = self._rebalance_now
        assert event is not None
        while self._running:
            try:
                await asyncio.wait_for(event.wait(), self.rebalance_interval_s)
            except TimeoutError:
                pass
            event.clear()
            try:
                await self.rebalance()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "rebalance failed", extra={"group": self.group, "topic": self.topic, "error": str(exc)}
                )

    async def _heartbeat(self) -> None:
        """Tell every member of the topic's groups we are here (slaves too: one may be master soon)."""
        routes = self.instance.routes
        try:
            queues = await routes.subscribe_queues(self.topic)
        except NoNameServerError:
            raise
        except ClientError as exc:
            log.warning("heartbeat: no route", extra={"topic": self.topic, "error": str(exc)})
            return
        body = B.heartbeat_body(self.client_id, self.group, None, [self.topic], self.subscription or "*")
        addrs = {a for name in {q.broker_name for q in queues} for a in routes.broker_addrs(name)}

        async def one(addr: str) -> None:
            try:
                await B.call(
                    self.instance.remoting,
                    addr,
                    RequestCode.HEART_BEAT,
                    body=body,
                    timeout_s=self.call_timeout_s,
                    what="heartbeat",
                )
            except (RemotingError, BrokerError) as exc:
                log.debug("heartbeat failed", extra={"broker": addr, "error": str(exc)})

        await asyncio.gather(*(one(a) for a in sorted(addrs)))

    async def _unregister(self) -> None:
        """Tell the brokers we left, so the others take our queues now rather than after our
        heartbeat expires (30 s). Best effort: a broker that does not know the request is fine."""
        routes = self.instance.routes
        queues = routes.cached_subscribe_queues(self.topic)
        addrs = {a for name in {q.broker_name for q in queues} for a in routes.broker_addrs(name)}
        headers: dict[str, HeaderValue] = {B.CLIENT_ID: self.client_id, B.CONSUMER_GROUP: self.group}

        async def one(addr: str) -> None:
            try:
                await self.instance.remoting.invoke_sync(
                    addr,
                    RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, headers),
                    min(self.call_timeout_s, 1.0),
                )
            except RemotingError:
                pass

        await asyncio.gather(*(one(a) for a in sorted(addrs)))

    # --- rebalance ------------------------------------------------------------------------------------
    async def rebalance(self) -> list[MessageQueue]:
        """Recompute this member's queues; start the new ones, give up the ones now someone else's."""
        lock = self._rebalance_lock
        if lock is None or not self._running:
            raise ClientStateError(f"consumer {self.group} is not running; call start() first")
        async with lock:
            try:
                queues = await self.fetch_queues(self.topic)
            except NoNameServerError:
                raise
            except ClientError as exc:
                log.warning("rebalance: no route", extra={"topic": self.topic, "error": str(exc)})
                return self.allocated_queues
            try:
                ids = await self.consumer_ids(self.topic, sorted({q.broker_name for q in queues}))
            except BrokerError as exc:
                # The broker answered but cannot list members: consume alone rather than not at all.
                log.warning(
                    "consumer list refused; allocating alone", extra={"group": self.group, "error": str(exc)}
                )
                ids = []
            except ClientError as exc:
                log.warning(
                    "rebalance: consumer list unavailable", extra={"group": self.group, "error": str(exc)}
                )
                return self.allocated_queues
            if self.client_id not in ids:
                ids = [*ids, self.client_id]  # our heartbeat has not reached the master yet
            mine = set(allocate_average(self.client_id, queues, ids))
            if not self._running:
                return self.allocated_queues
            gone = [q for q in self._queues if q not in mine]
            added = sorted(q for q in mine if q not in self._queues)
            if gone:
                await asyncio.gather(*(self._drop(q) for q in gone), return_exceptions=True)
            for q in added:
                self._start_queue(q)
            if gone or added:
                log.info(
                    "rebalanced",
                    extra={
                        "group": self.group,
                        "topic": self.topic,
                        "consumers": len(ids),
                        "queues": [str(q) for q in sorted(mine)],
                    },
                )
            return self.allocated_queues

    def _start_queue(self, queue: MessageQueue) -> None:
        pq = _ProcessQueue(queue)
        self._queues[queue] = pq
        pq.task = asyncio.get_running_loop().create_task(self._consume_loop(pq), name=f"pull-{queue}")

    async def _drop(self, queue: MessageQueue) -> None:
        """Stop consuming ``queue``: cancel a waiting pull, let a listener call finish, commit."""
        pq = self._queues.pop(queue, None)
        if pq is None:
            return
        pq.dropped = True
        task = pq.task
        if task is not None and not task.done():
            if not pq.in_listener:
                task.cancel()
            else:
                # Let the running batch finish so its offset counts; a listener stuck longer is
                # cancelled and its batch will be delivered again (to whoever owns the queue next).
                await asyncio.wait({task}, timeout=self.listener_grace_s)
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise  # we ourselves were cancelled
            except Exception:
                log.exception("consume loop failed", extra={"queue": str(queue)})
        await self._commit(pq)

    # --- offsets ------------------------------------------------------------------------------------------
    async def _commit(self, pq: _ProcessQueue) -> None:
        offset = pq.offset
        if offset < 0 or offset == pq.committed:
            return
        try:
            await self.commit_offset(pq.queue, offset)
            pq.committed = max(pq.committed, offset)
        except (ClientError, RemotingError) as exc:
            log.warning(
                "offset commit failed", extra={"queue": str(pq.queue), "offset": offset, "error": str(exc)}
            )

    async def _commit_all(self) -> None:
        await asyncio.gather(*(self._commit(pq) for pq in list(self._queues.values())))

    async def _initial_offset(self, queue: MessageQueue) -> int:
        offset = await self.query_offset(queue)
        if offset is not None and offset >= 0:
            return offset
        if self.consume_from is ConsumeFromWhere.LAST_OFFSET:
            return await self.max_offset(queue)
        return await self.min_offset(queue)

    # --- the per-queue loop ---------------------------------------------------------------------------
    async def _consume_loop(self, pq: _ProcessQueue) -> None:
        queue = pq.queue
        while not pq.dropped:
            try:
                pq.offset = await self._initial_offset(queue)
                pq.committed = pq.offset
                break
            except (ClientError, RemotingError) as exc:
                # Never guess a start offset: that would skip or repeat messages. Ask again.
                log.warning("cannot read start offset", extra={"queue": str(queue), "error": str(exc)})
                await asyncio.sleep(self.pull_error_delay_s)
        pq.ready.set()
        while not pq.dropped:
            commit = pq.offset if pq.offset != pq.committed else None
            started = time.monotonic()
            try:
                result = await self.pull(
                    queue,
                    pq.offset,
                    self.batch_size,
                    self.suspend_ms,
                    commit_offset=commit,
                    subscription=self.subscription,
                )
            except (ClientError, RemotingError, ValueError) as exc:
                log.warning(
                    "pull failed", extra={"queue": str(queue), "offset": pq.offset, "error": str(exc)}
                )
                await asyncio.sleep(self.pull_error_delay_s)
                continue
            if result.status is PullStatus.FOUND:
                msgs = result.messages
                if self._match is not None:
                    msgs = [m for m in msgs if self._match(m)]
                if msgs and not await self._deliver(pq, msgs):
                    return  # dropped while retrying a batch: its offset stays where it was
                pq.offset = max(pq.offset, result.next_begin_offset)
                if self.commit_each_batch:
                    await self._commit(pq)
            elif result.status is PullStatus.NO_NEW_MSG:
                if result.next_begin_offset > pq.offset:
                    pq.offset = result.next_begin_offset  # past messages the subscription skips
                elif time.monotonic() - started < 0.05:
                    await asyncio.sleep(0.1)  # the broker did not hold the pull: do not spin
            else:
                log.warning(
                    "offset moved",
                    extra={
                        "queue": str(queue),
                        "offset": pq.offset,
                        "next": result.next_begin_offset,
                        "min": result.min_offset,
                        "max": result.max_offset,
                    },
                )
                pq.offset = result.next_begin_offset
                await self._commit(pq)

    async def _deliver(self, pq: _ProcessQueue, msgs: list[Message]) -> bool:
        """Run the listener until it accepts the batch; False if the queue was dropped meanwhile."""
        while True:
            pq.in_listener = True
            try:
                outcome = self.listener(msgs, pq.queue)
                if inspect.isawaitable(outcome):
                    outcome = await outcome
            except Exception:
                log.exception(
                    "listener raised; will redeliver",
                    extra={"queue": str(pq.queue), "first": msgs[0].queue_offset},
                )
                outcome = ConsumeStatus.RECONSUME_LATER
            finally:
                pq.in_listener = False
            if outcome is None or outcome is True or outcome is ConsumeStatus.CONSUME_SUCCESS:
                return True
            if pq.dropped:
                return False
            await asyncio.sleep(self.reconsume_delay_s)
            if pq.dropped:
                return False
