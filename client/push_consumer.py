"""PushConsumer: a consumer group member that long-polls its share of a topic's queues.

Like RocketMQ's DefaultMQPushConsumer: each allocated queue gets one asyncio task that pulls
(long polling), hands the batch to the listener and only then moves its offset on, so within a
queue messages reach the listener in offset order. What happens when the listener fails (raises,
or returns RECONSUME_LATER / SUSPEND_CURRENT_QUEUE_A_MOMENT / False) is the mode's:

- concurrent (``orderly=False``, the default; RocketMQ's MessageListenerConcurrently): every
  message of the failed batch is sent back with CONSUMER_SEND_MSG_BACK to the master of the
  group it came from; the broker stores a copy in ``%RETRY%<group>`` (delivered again after a
  delay that grows with each try) or, after ``max_reconsume_times`` tries (16), in
  ``%DLQ%<group>``. If the broker cannot take it back, a copy is sent to the retry topic
  directly (as Java's client falls back); only a message neither took is retried here. Then
  the queue moves on: a failing message does not hold the others back. The consumer subscribes
  ``%RETRY%<group>`` itself, and a message from there reaches the listener with its original
  topic (its RETRY_TOPIC property) and ``reconsume_times``.
- orderly (``orderly=True``; MessageListenerOrderly): a queue is consumed only while this
  member holds its lock on the group's master (LOCK_BATCH_MQ when allocated, renewed every
  20 s, taken as lost 30 s after the last grant; UNLOCK_BATCH_MQ when given up), one batch at
  a time. A failed batch is retried here after ``reconsume_delay_s`` and blocks its queue;
  a message tried ``max_reconsume_times`` times (unlimited by default, as Java's) goes to
  the dead-letter topic (CONSUMER_SEND_MSG_BACK with delay level -1) and the queue moves on.

Delivery is at least once either way: after a rebalance or a failover another member may see
a batch whose offset commit had not yet been replicated.

Subscriptions: a TAG expression (``*`` or ``TagA || TagB``, filtered by the broker and again
here, since the broker filters by hash) or SQL92 (``expression_type="SQL92"``, filtered by the
broker only; checked with CHECK_CLIENT_CONFIG at start, and refused at once if it cannot compile).

Membership: a heartbeat to every member of the topic's broker groups (so a newly elected
master already knows us), the group's consumer ids from GET_CONSUMER_LIST_BY_GROUP, average
allocation per topic, re-done every ``rebalance_interval_s`` or when a broker says the group changed.

Offsets: piggybacked on the next pull to the master after each consumed batch (RocketMQ's
commitOffset sysFlag), committed explicitly every ``commit_interval_s``, and when a queue is
given up or the consumer shuts down.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

import client.broker_api as B
from broker.sql_filter import SqlFilterError, compile_filter
from client.broker_api import PullStatus
from client.consumer import SEND_BACK_TIMEOUT_S, ConsumerBase
from client.errors import BrokerError, ClientError, ClientStateError, NoNameServerError, RouteNotFoundError
from client.instance import ClientInstance
from client.message_props import (
    CLIENT_INNER_PRODUCER_GROUP,
    DEFAULT_MAX_RECONSUME_TIMES,
    MAX_DELAY_LEVEL,
    ORDERLY_MAX_RECONSUME_TIMES,
    PROPERTY_DELAY,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    ExpressionType,
    origin_message_id,
    retry_topic,
)
from client.producer import Producer
from client.rebalance import allocate_average
from client.route import MessageQueue
from remoting.codes import RequestCode
from remoting.exceptions import RemotingError
from remoting.message import Message
from remoting.protocol import HeaderValue, RemotingCommand

log = logging.getLogger("client.push_consumer")

LOCK_INTERVAL_S = 20.0
"""How often an orderly consumer renews its queue locks (RocketMQ's REBALANCE_LOCK_INTERVAL)."""
LOCK_MAX_LIVE_S = 30.0
"""A lock not renewed for this long is taken as lost (RocketMQ's REBALANCE_LOCK_MAX_LIVE_TIME)."""
LOCK_RETRY_DELAY_S = 3.0
"""An orderly queue whose lock was refused asks again after this long (RocketMQ: 3 s)."""
_NOT_COPIED = frozenset(
    {
        PROPERTY_UNIQ_KEY,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_RECONSUME_TIME,
        PROPERTY_MAX_RECONSUME_TIMES,
        PROPERTY_DELAY,
    }
)
"""Properties a retry copy does not take from its original (it gets a new UNIQ_KEY and delay)."""


class ConsumeStatus(Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"
    """Concurrent listeners: send the batch back for a later try."""
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"
    """Orderly listeners: try the batch again after a pause (any failure means the same in either mode)."""


class ConsumeFromWhere(Enum):
    """Where a group with no committed offset for a queue starts."""

    FIRST_OFFSET = "FIRST_OFFSET"
    LAST_OFFSET = "LAST_OFFSET"


ListenerResult = ConsumeStatus | bool | None
MessageListener = Callable[[list[Message], MessageQueue], ListenerResult | Awaitable[ListenerResult]]
"""Gets a batch of one queue, in offset order. None, True or CONSUME_SUCCESS: consumed; anything
else (or an exception): failed, handled as the consumer's mode says."""


def _matcher(subscription: str) -> Callable[[Message], bool] | None:
    """RocketMQ tag expressions: ``*`` or ``TagA || TagB``. None means "everything"."""
    expr = (subscription or "*").strip()
    if expr == "*":
        return None
    tags = {t.strip() for t in expr.split("||") if t.strip()}
    if not tags or "*" in tags:
        return None
    return lambda m: m.tags in tags


@dataclass(frozen=True, slots=True)
class _Subscription:
    topic: str
    expression: str
    expression_type: str
    match: Callable[[Message], bool] | None  # the client-side tag filter (TAG only)
    is_retry: bool = False

    def data(self) -> dict[str, object]:
        return B.subscription_data(self.topic, self.expression, self.expression_type)


class _ProcessQueue:
    """One allocated queue: its task, where it stands, whether it was taken away, its lock."""

    __slots__ = (
        "queue",
        "sub",
        "task",
        "dropped",
        "in_listener",
        "offset",
        "committed",
        "ready",
        "locked",
        "lock_granted",
    )

    def __init__(self, queue: MessageQueue, sub: _Subscription) -> None:
        self.queue = queue
        self.sub = sub
        self.task: asyncio.Task[None] | None = None
        self.dropped = False
        self.in_listener = False
        self.offset = -1  # next offset to consume; -1 until known
        self.committed = -1  # last offset the master confirmed
        self.ready = asyncio.Event()
        self.locked = False  # orderly: the master granted us this queue's lock...
        self.lock_granted = 0.0  # ...last at this monotonic time


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
        expression_type: str | ExpressionType = ExpressionType.TAG,
        orderly: bool = False,
        max_reconsume_times: int | None = None,
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
        send_back_timeout_s: float = SEND_BACK_TIMEOUT_S,
        lock_interval_s: float = LOCK_INTERVAL_S,
        lock_max_live_s: float = LOCK_MAX_LIVE_S,
        lock_retry_delay_s: float = LOCK_RETRY_DELAY_S,
        call_timeout_s: float = 3.0,
        instance: ClientInstance | None = None,
    ) -> None:
        """``max_reconsume_times``: tries before the dead-letter topic (default 16 concurrent,
        unlimited orderly). ``reconsume_delay_s``: the pause before a failed batch is tried
        again here (orderly: RocketMQ's suspendCurrentQueueTimeMillis). ``lock_*``: orderly
        lock renewal period, the age at which a lock counts as lost, the wait after a refusal."""
        try:
            kind = ExpressionType(str(expression_type).upper())
        except ValueError:
            raise ValueError(f"expression_type must be TAG or SQL92, got {expression_type!r}") from None
        if kind is ExpressionType.SQL92:
            if not subscription or not subscription.strip():
                raise ValueError("a SQL92 subscription needs an expression")
            try:
                compile_filter(subscription)
            except SqlFilterError as exc:
                raise ValueError(f"SQL92 subscription {subscription!r} does not compile: {exc}") from None
        if max_reconsume_times is not None and max_reconsume_times < 0:
            raise ValueError(f"max_reconsume_times must be >= 0, got {max_reconsume_times}")
        if (
            min(lock_interval_s, lock_max_live_s, lock_retry_delay_s) <= 0
            or lock_max_live_s < lock_interval_s
        ):
            raise ValueError("lock intervals must be > 0, and lock_max_live_s >= lock_interval_s")
        super().__init__(group, namesrv_addrs, call_timeout_s=call_timeout_s, instance=instance)
        self.topic = topic
        self.listener = listener
        self.subscription = subscription
        self.expression_type = kind.value
        self.orderly = orderly
        if max_reconsume_times is None:
            max_reconsume_times = ORDERLY_MAX_RECONSUME_TIMES if orderly else DEFAULT_MAX_RECONSUME_TIMES
        self.max_reconsume_times = max_reconsume_times
        self._match = _matcher(subscription) if kind is ExpressionType.TAG else None
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
        self.send_back_timeout_s = send_back_timeout_s
        self.lock_interval_s = lock_interval_s
        self.lock_max_live_s = lock_max_live_s
        self.lock_retry_delay_s = lock_retry_delay_s
        # The group's own topic and (clustering, as RocketMQ's copySubscription) its retry topic.
        self._subs: dict[str, _Subscription] = {
            topic: _Subscription(topic, subscription or "*", self.expression_type, self._match),
            retry_topic(group): _Subscription(retry_topic(group), "*", ExpressionType.TAG.value, None, True),
        }
        self._queues: dict[MessageQueue, _ProcessQueue] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalance_now: asyncio.Event | None = None
        self._unwatch: Callable[[], None] | None = None
        self._rebalance_lock: asyncio.Lock | None = None
        self._inner_producer: Producer | None = None

    @property
    def client_id(self) -> str:
        return self.instance.client_id

    @property
    def retry_topic(self) -> str:
        return retry_topic(self.group)

    @property
    def allocated_queues(self) -> list[MessageQueue]:
        """This member's queues of the subscribed topic."""
        return sorted(q for q in self._queues if q.topic == self.topic)

    @property
    def allocated_retry_queues(self) -> list[MessageQueue]:
        """This member's queues of the group's retry topic."""
        return sorted(q for q in self._queues if q.topic != self.topic)

    def locked_queues(self) -> list[MessageQueue]:
        """Orderly: the queues whose lock this member holds now."""
        return sorted(q for q, pq in self._queues.items() if self._lock_valid(pq))

    def consumed_offsets(self) -> dict[MessageQueue, int]:
        """Next offset to consume per allocated queue (known ones only)."""
        return {q: pq.offset for q, pq in self._queues.items() if pq.offset >= 0}

    # --- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Join the group: check a SQL92 subscription, heartbeat, first rebalance, then the loops.

        Raises for configuration errors (no nameserver address) and for a subscription a
        broker refuses (BrokerError, e.g. SUBSCRIPTION_PARSE_FAILED); an unreachable broker or
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
        # Retry copies when the broker cannot take a message back (and orderly's dead letters).
        self._inner_producer = Producer(
            CLIENT_INNER_PRODUCER_GROUP, send_timeout_s=self.send_back_timeout_s, instance=self.instance
        )
        await self._inner_producer.start()
        try:
            await self._check_subscriptions()
            await self._heartbeat()
            await self.rebalance()
        except (NoNameServerError, BrokerError):
            await self._abort_start()
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
        if self.orderly:
            self._tasks.append(
                loop.create_task(
                    self._periodic(
                        self.lock_all, self.lock_interval_s, first_s=min(1.0, self.lock_interval_s)
                    ),
                    name=f"relock-{self.group}",
                )
            )

    async def _abort_start(self) -> None:
        """Undo a start that failed (``shutdown`` still closes the connections)."""
        self._running = False
        if self._unwatch is not None:
            self._unwatch()
        await asyncio.gather(*(self._drop(q) for q in list(self._queues)), return_exceptions=True)
        if self._inner_producer is not None:
            await self._inner_producer.shutdown()
            self._inner_producer = None

    async def shutdown(self) -> None:
        """Stop pulling, let running listener calls finish, commit every queue's offset, give up
        orderly locks, disconnect."""
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
        queues = list(self._queues)
        await asyncio.gather(*(self._drop(q) for q in queues), return_exceptions=True)
        if self.orderly:
            await self._unlock(queues, oneway=False)
        if self._inner_producer is not None:
            await self._inner_producer.shutdown()
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
    async def _periodic(
        self, work: Callable[[], Awaitable[object]], interval_s: float, *, first_s: float | None = None
    ) -> None:
        await asyncio.sleep(interval_s if first_s is None else first_s)
        while self._running:
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "periodic task failed",
                    extra={"group": self.group, "task": work.__name__, "error": str(exc)},
                )
            await asyncio.sleep(interval_s)

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

    async def _check_subscriptions(self) -> None:
        """CHECK_CLIENT_CONFIG for every non-TAG subscription (RocketMQ's checkClientInBroker):
        a broker's refusal raises BrokerError; no route or no answer is only logged (pulls will
        tell the same later)."""
        for sub in self._subs.values():
            if sub.expression_type == ExpressionType.TAG.value:
                continue
            try:
                await self.check_client_config(sub.topic, sub.data(), self.client_id)
            except BrokerError as exc:
                raise BrokerError(
                    exc.code,
                    exc.remark,
                    exc.addr,
                    f"{sub.expression_type} subscription {sub.expression!r} of group {self.group} "
                    f"to topic {sub.topic} refused",
                ) from None
            except NoNameServerError:
                raise
            except (ClientError, RemotingError) as exc:
                log.warning(
                    "subscription not checked: no broker answered",
                    extra={"group": self.group, "topic": sub.topic, "error": str(exc)},
                )

    async def _heartbeat(self) -> None:
        """Tell every member of the topics' groups we are here (slaves too: one may be master soon)."""
        routes = self.instance.routes
        names: set[str] = set()
        for sub in self._subs.values():
            try:
                names.update(q.broker_name for q in await routes.subscribe_queues(sub.topic))
            except NoNameServerError:
                raise
            except ClientError as exc:
                if not sub.is_retry:  # the retry topic appears with the first heartbeat
                    log.warning("heartbeat: no route", extra={"topic": sub.topic, "error": str(exc)})
        if not names:
            return
        data = B.consumer_data(
            self.group,
            [sub.data() for sub in self._subs.values()],
            consume_from_where=f"CONSUME_FROM_{self.consume_from.value}",
        )
        body = B.heartbeat_doc(self.client_id, [data], [])
        addrs = {a for name in names for a in routes.broker_addrs(name)}

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
        names = {
            q.broker_name for sub in self._subs.values() for q in routes.cached_subscribe_queues(sub.topic)
        }
        addrs = {a for name in names for a in routes.broker_addrs(name)}
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
        """Recompute this member's queues of every subscribed topic; start the new ones (orderly:
        those whose lock it got), give up the ones now someone else's."""
        lock = self._rebalance_lock
        if lock is None or not self._running:
            raise ClientStateError(f"consumer {self.group} is not running; call start() first")
        async with lock:
            by_topic: dict[str, list[MessageQueue]] = {}
            for sub in self._subs.values():
                try:
                    by_topic[sub.topic] = await self.fetch_queues(sub.topic)
                except NoNameServerError:
                    raise
                except RouteNotFoundError as exc:
                    if not sub.is_retry:
                        log.warning("rebalance: no route", extra={"topic": sub.topic, "error": str(exc)})
                except ClientError as exc:
                    log.warning("rebalance: no route", extra={"topic": sub.topic, "error": str(exc)})
            if not by_topic:
                return self.allocated_queues
            names = sorted({q.broker_name for qs in by_topic.values() for q in qs})
            try:
                ids = await self.consumer_ids(self.topic, names)
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
            mine: set[MessageQueue] = set()
            for queues in by_topic.values():
                mine.update(allocate_average(self.client_id, queues, ids))
            if not self._running:
                return self.allocated_queues
            gone = [q for q in self._queues if q.topic in by_topic and q not in mine]
            added = sorted(q for q in mine if q not in self._queues)
            if gone:
                await asyncio.gather(*(self._drop(q) for q in gone), return_exceptions=True)
                if self.orderly:
                    await self._unlock(gone, oneway=True)
            asked = time.monotonic()  # a lock counts from its request: the broker's expiry does
            if added and self.orderly:
                granted = await self._lock(added)
                refused = [q for q in added if q not in granted]
                if refused:
                    log.info(
                        "orderly queues not started: locked by another member",
                        extra={"group": self.group, "queues": [str(q) for q in refused]},
                    )
                added = [q for q in added if q in granted]
            if not self._running:
                return self.allocated_queues
            for q in added:
                pq = self._start_queue(q)
                if self.orderly:
                    pq.locked, pq.lock_granted = True, asked
            if gone or added:
                log.info(
                    "rebalanced",
                    extra={
                        "group": self.group,
                        "topic": self.topic,
                        "consumers": len(ids),
                        "queues": [str(q) for q in sorted(self._queues)],
                    },
                )
            return self.allocated_queues

    def _start_queue(self, queue: MessageQueue) -> _ProcessQueue:
        pq = _ProcessQueue(queue, self._subs[queue.topic])
        self._queues[queue] = pq
        pq.task = asyncio.get_running_loop().create_task(self._consume_loop(pq), name=f"pull-{queue}")
        return pq

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

    # --- orderly: queue locks on the groups' masters ------------------------------------------------
    def _lock_valid(self, pq: _ProcessQueue) -> bool:
        return pq.locked and time.monotonic() - pq.lock_granted <= self.lock_max_live_s

    @staticmethod
    def _by_broker(queues: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
        out: dict[str, list[MessageQueue]] = {}
        for q in queues:
            out.setdefault(q.broker_name, []).append(q)
        return out

    async def _lock(self, queues: Iterable[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ per broker group; the queues granted (a group that fails grants none)."""

        async def one(name: str, qs: list[MessageQueue]) -> set[MessageQueue]:
            try:
                return await self.lock_queues(name, qs, self.client_id)
            except (ClientError, RemotingError) as exc:
                log.warning("lock failed", extra={"group": self.group, "broker": name, "error": str(exc)})
                return set()

        results = await asyncio.gather(*(one(n, qs) for n, qs in self._by_broker(queues).items()))
        return set().union(*results) if results else set()

    async def _unlock(self, queues: Iterable[MessageQueue], *, oneway: bool) -> None:
        """UNLOCK_BATCH_MQ per broker group; best effort (the broker's lock expires anyway)."""

        async def one(name: str, qs: list[MessageQueue]) -> None:
            try:
                await self.unlock_queues(name, qs, self.client_id, oneway=oneway)
            except (ClientError, RemotingError) as exc:
                log.info("unlock failed", extra={"group": self.group, "broker": name, "error": str(exc)})

        await asyncio.gather(*(one(n, qs) for n, qs in self._by_broker(queues).items()))

    async def lock_all(self) -> None:
        """Renew the locks of every allocated queue (RocketMQ's lockAll, every 20 s): granted ones
        count from now, refused ones stop being consumed until a lock is granted again."""
        pqs = dict(self._queues)
        if not pqs:
            return
        asked = time.monotonic()
        granted = await self._lock(pqs)
        for q, pq in pqs.items():
            if q in granted:
                pq.locked, pq.lock_granted = True, asked
            else:
                if pq.locked:
                    log.warning("queue lock lost", extra={"group": self.group, "queue": str(q)})
                pq.locked = False

    async def _hold_lock(self, pq: _ProcessQueue) -> bool:
        """Wait until this member holds ``pq``'s lock; False when the queue was dropped meanwhile."""
        while not pq.dropped:
            if self._lock_valid(pq):
                return True
            asked = time.monotonic()
            if pq.queue in await self._lock([pq.queue]):
                pq.locked, pq.lock_granted = True, asked
                return True
            pq.locked = False
            await asyncio.sleep(self.lock_retry_delay_s)
        return False

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

    async def _initial_offset(self, pq: _ProcessQueue) -> int:
        queue = pq.queue
        offset = await self.query_offset(queue)
        if offset is not None and offset >= 0:
            return offset
        # A retry topic is read from its start whatever consume_from says (as RocketMQ does).
        if self.consume_from is ConsumeFromWhere.LAST_OFFSET and not pq.sub.is_retry:
            return await self.max_offset(queue)
        return await self.min_offset(queue)

    # --- the per-queue loop ---------------------------------------------------------------------------
    async def _consume_loop(self, pq: _ProcessQueue) -> None:
        queue, sub = pq.queue, pq.sub
        while not pq.dropped:
            try:
                pq.offset = await self._initial_offset(pq)
                pq.committed = pq.offset
                break
            except (ClientError, RemotingError) as exc:
                # Never guess a start offset: that would skip or repeat messages. Ask again.
                log.warning("cannot read start offset", extra={"queue": str(queue), "error": str(exc)})
                await asyncio.sleep(self.pull_error_delay_s)
        pq.ready.set()
        while not pq.dropped:
            if self.orderly and not await self._hold_lock(pq):
                return
            commit = pq.offset if pq.offset != pq.committed else None
            started = time.monotonic()
            try:
                result = await self.pull(
                    queue,
                    pq.offset,
                    self.batch_size,
                    self.suspend_ms,
                    commit_offset=commit,
                    subscription=sub.expression,
                    expression_type=sub.expression_type,
                )
            except (ClientError, RemotingError, ValueError) as exc:
                log.warning(
                    "pull failed", extra={"queue": str(queue), "offset": pq.offset, "error": str(exc)}
                )
                await asyncio.sleep(self.pull_error_delay_s)
                continue
            if result.status is PullStatus.FOUND:
                msgs = result.messages
                if sub.match is not None:
                    msgs = [m for m in msgs if sub.match(m)]
                if sub.is_retry:
                    for m in msgs:  # RocketMQ's resetRetryAndNamespace: the topic it failed on
                        original = m.properties.get(PROPERTY_RETRY_TOPIC)
                        if original:
                            m.topic = original
                if msgs:
                    consume = self._consume_orderly if self.orderly else self._consume_concurrently
                    if not await consume(pq, msgs):
                        return  # dropped while handling a batch: its offset stays where it was
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

    async def _listen(self, pq: _ProcessQueue, msgs: list[Message]) -> bool:
        """One listener call; True when it consumed the batch."""
        pq.in_listener = True
        try:
            outcome = self.listener(msgs, pq.queue)
            if inspect.isawaitable(outcome):
                outcome = await outcome
        except Exception:
            log.exception("listener raised", extra={"queue": str(pq.queue), "first": msgs[0].queue_offset})
            return False
        finally:
            pq.in_listener = False
        return outcome is None or outcome is True or outcome is ConsumeStatus.CONSUME_SUCCESS

    async def _pause(self, pq: _ProcessQueue) -> bool:
        """The pause before a batch is tried again here; False when the queue was dropped."""
        if pq.dropped:
            return False
        await asyncio.sleep(self.reconsume_delay_s)
        return not pq.dropped

    async def _consume_concurrently(self, pq: _ProcessQueue, msgs: list[Message]) -> bool:
        """Deliver; send back what failed (RocketMQ's processConsumeResult in clustering mode);
        retry here only what no broker took. False if the queue was dropped meanwhile."""
        while True:
            if await self._listen(pq, msgs):
                return True
            if pq.dropped:
                return False  # the new owner delivers it again
            sent = await asyncio.gather(*(self._send_back(pq, m) for m in msgs))
            msgs = [m for m, ok in zip(msgs, sent, strict=True) if not ok]
            if not msgs:
                return True
            for m in msgs:
                m.reconsume_times += 1
            if not await self._pause(pq):
                return False

    async def _consume_orderly(self, pq: _ProcessQueue, msgs: list[Message]) -> bool:
        """Deliver under the queue's lock until consumed; a message tried ``max_reconsume_times``
        times goes to the dead-letter topic (RocketMQ's checkReconsumeTimes). False if dropped."""
        while True:
            if not await self._hold_lock(pq):
                return False
            if await self._listen(pq, msgs):
                return True
            if pq.dropped:
                return False
            again: list[Message] = []
            for m in msgs:
                if m.reconsume_times >= self.max_reconsume_times and await self._dead_letter(pq, m):
                    continue
                m.reconsume_times += 1
                again.append(m)
            if not again:
                return True
            msgs = again
            if not await self._pause(pq):
                return False

    # --- sending messages back --------------------------------------------------------------------------
    async def _send_back(self, pq: _ProcessQueue, msg: Message) -> bool:
        """CONSUMER_SEND_MSG_BACK to the master of the queue's group, else a retry copy; False if neither."""
        try:
            await self.send_message_back(
                msg,
                pq.queue.broker_name,
                delay_level=0,
                max_reconsume_times=self.max_reconsume_times,
                timeout_s=self.send_back_timeout_s,
            )
            return True
        except (ClientError, RemotingError) as exc:
            log.warning(
                "send back failed; sending a retry copy",
                extra={"group": self.group, "msg_id": msg.msg_id, "error": str(exc)},
            )
        return await self._send_retry_copy(msg, msg.reconsume_times + 1)

    async def _dead_letter(self, pq: _ProcessQueue, msg: Message) -> bool:
        """Orderly: a message out of tries goes to ``%DLQ%<group>``: CONSUMER_SEND_MSG_BACK with
        delay level -1 (both RocketMQ's broker and ours store it there at once), else what
        Java's orderly consumer sends, a retry copy whose reconsumeTimes has reached the maximum
        (RocketMQ's broker diverts that to the dead-letter topic); False if neither was taken."""
        try:
            await self.send_message_back(
                msg,
                pq.queue.broker_name,
                delay_level=-1,
                max_reconsume_times=self.max_reconsume_times,
                timeout_s=self.send_back_timeout_s,
            )
            return True
        except (ClientError, RemotingError) as exc:
            log.warning(
                "dead-letter send back failed; sending a copy",
                extra={"group": self.group, "msg_id": msg.msg_id, "error": str(exc)},
            )
        return await self._send_retry_copy(msg, msg.reconsume_times)

    async def _send_retry_copy(self, msg: Message, reconsume_times: int) -> bool:
        """Send a copy of ``msg`` to ``%RETRY%<group>`` as RocketMQ's client does when the broker
        cannot take it back (DefaultMQPushConsumerImpl.sendMessageBack's fallback; the orderly
        consumer's way to the dead-letter topic): ORIGIN_MESSAGE_ID, RETRY_TOPIC, a delay of
        3 + the times it was tried, and reconsumeTimes/maxReconsumeTimes in the send header."""
        producer = self._inner_producer
        if producer is None:
            return False
        props = {
            k: v for k, v in msg.properties.items() if k not in _NOT_COPIED and not k.startswith("TIMER_")
        }
        props[PROPERTY_ORIGIN_MESSAGE_ID] = origin_message_id(msg)
        props[PROPERTY_RETRY_TOPIC] = msg.topic
        props[PROPERTY_DELAY] = str(min(3 + msg.reconsume_times, MAX_DELAY_LEVEL))
        copy = Message(self.retry_topic, bytes(msg.body), msg.tags, list(msg.keys), props, msg.flag)
        try:
            await producer.send_retry_copy(copy, reconsume_times, self.max_reconsume_times)
            return True
        except (ClientError, RemotingError) as exc:
            log.warning(
                "retry copy not sent; the message will be tried again here",
                extra={"group": self.group, "msg_id": msg.msg_id, "error": str(exc)},
            )
            return False
