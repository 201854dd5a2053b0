"""The broker group's held-message semantics as the harness drives them: its timing, delivered
messages as the history records them, transactions and orderly consumers.

The ``delay``, ``txn``, ``retry`` and ``order`` workloads (``docs/history.md``) reach these through
:class:`~jepsen.systems.broker.BrokerQueueClient`, which builds on the pieces here:

- :class:`BrokerTiming`: what the workloads must know of a group's configuration to judge it
  (its delay levels, how soon it checks transactions, how long a queue lock lives), carried in
  the client spec so that worker processes know it too;
- :class:`Received`: one delivered message as a history entry ``[offset, value, store_ms, attempt]``
  plus the message itself (a send-back needs it);
- :class:`TransactionSide`: a ``TransactionProducer`` whose local transaction and checks are the
  workload's callbacks;
- :class:`HarnessOrderlyConsumer`: an orderly ``PushConsumer`` whose queue locks go through the
  workload's callbacks, so that each lock and unlock is an operation in the history.

Nothing here records history: the workloads do, around the callbacks.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from typing import Any

from broker.config import BrokerConfig
from broker.system_topics import DEFAULT_DELAY_LEVELS, parse_delay_levels
from client.errors import BrokerError, ClientError
from client.instance import ClientInstance
from client.push_consumer import ConsumeStatus, PushConsumer
from client.route import MessageQueue
from client.transaction import LocalTransactionState, TransactionProducer
from jepsen.systems.clients import Definite, Indefinite, decode_value
from remoting.exceptions import RemotingError
from remoting.message import Message

#: the broker settings the local backend runs with, so that runs of tens of seconds see delays
#: expire, retries come back, transactions get checked and unrenewed queue locks expire
#: (RocketMQ's defaults: 1 s .. 2 h levels, checks every 60 s, locks for 60 s)
SEMANTICS_SETTINGS: dict[str, Any] = {
    "message_delay_level": "100ms 200ms 500ms 1s 2s 3s 4s 5s 6s 7s 8s 9s 10s 15s 20s 30s 1m 2m",
    "transaction_timeout_s": 1.0,
    "transaction_check_interval_s": 1.0,
    "lock_max_live_s": 10.0,
}
#: the message property that says how a transactional message's checks are to be answered
OUTCOME_PROPERTY = "JEPSEN_OUTCOME"
TXN_PRODUCER_GROUP = "jepsen-txn"
RETRY_GROUP = "jepsen-retry"
ORDER_GROUP = "jepsen-order"

_DECISIONS = {
    "commit": LocalTransactionState.COMMIT_MESSAGE,
    "rollback": LocalTransactionState.ROLLBACK_MESSAGE,
    "unknown": LocalTransactionState.UNKNOW,
}


def _config_default(name: str) -> Any:
    return next(f.default for f in fields(BrokerConfig) if f.name == name)


@dataclass(frozen=True)
class BrokerTiming:
    """A broker group's timing as the semantics workloads need it.

    Defaults are the broker's own (a group started without settings, as the docker group is);
    ``from_settings`` reads the settings a local group was started with.
    """

    delay_levels_ms: tuple[int, ...] = field(default_factory=lambda: parse_delay_levels(DEFAULT_DELAY_LEVELS))
    transaction_timeout_s: float = field(
        default_factory=lambda: float(_config_default("transaction_timeout_s"))
    )
    transaction_check_interval_s: float = field(
        default_factory=lambda: float(_config_default("transaction_check_interval_s"))
    )
    lock_max_live_s: float = field(default_factory=lambda: float(_config_default("lock_max_live_s")))

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> BrokerTiming:
        """The timing of brokers started with ``settings`` (missing ones: the broker's defaults)."""
        base = cls()
        levels = settings.get("message_delay_level")
        return cls(
            delay_levels_ms=parse_delay_levels(str(levels)) if levels else base.delay_levels_ms,
            transaction_timeout_s=float(settings.get("transaction_timeout_s", base.transaction_timeout_s)),
            transaction_check_interval_s=float(
                settings.get("transaction_check_interval_s", base.transaction_check_interval_s)
            ),
            lock_max_live_s=float(settings.get("lock_max_live_s", base.lock_max_live_s)),
        )

    def to_spec(self) -> dict[str, Any]:
        return {
            "delay_levels_ms": list(self.delay_levels_ms),
            "transaction_timeout_s": self.transaction_timeout_s,
            "transaction_check_interval_s": self.transaction_check_interval_s,
            "lock_max_live_s": self.lock_max_live_s,
        }

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> BrokerTiming:
        if not spec:
            return cls()
        return cls(
            delay_levels_ms=tuple(int(x) for x in spec["delay_levels_ms"]),
            transaction_timeout_s=float(spec["transaction_timeout_s"]),
            transaction_check_interval_s=float(spec["transaction_check_interval_s"]),
            lock_max_live_s=float(spec["lock_max_live_s"]),
        )


@dataclass(frozen=True, slots=True)
class Received:
    """One delivered message: its queue offset, value, the store time of the copy delivered
    (a released delay or a retry copy is a new record with its own), how often it was tried
    before (``reconsume_times``), and the message (for a send-back)."""

    offset: int
    value: Any
    store_ms: int
    attempt: int
    message: Message | None = field(default=None, compare=False, repr=False)

    def entry(self) -> list[Any]:
        """The history's entry for it: ``[offset, value, store_ms, attempt]``."""
        return [self.offset, self.value, self.store_ms, self.attempt]

    @classmethod
    def of(cls, msg: Message) -> Received:
        return cls(msg.queue_offset, decode_value(msg.body), msg.store_ms, msg.reconsume_times, msg)


#: the workload's side of a transaction, called once the half is stored: the decision to end it
#: with ("commit", "rollback" or "unknown")
OnHalf = Callable[[], str]
#: the workload's answer to a broker's check: (value, the message's outcome property) -> decision
OnCheck = Callable[[Any, str], str]


@dataclass(slots=True)
class TxnResult:
    """What became of a transactional send: whether ``on_half`` decided it (False: the half was
    stored without confirmation and the client rolled it back itself, as RocketMQ's does),
    where it was stored, the status, and the END_TRANSACTION error ('' when the broker took it)."""

    decided: bool
    broker_name: str
    queue_id: int
    status: str
    end_error: str


class TransactionSide:
    """A ``TransactionProducer`` of group :data:`TXN_PRODUCER_GROUP` whose checks the workload answers."""

    def __init__(
        self,
        namesrv: list[str],
        *,
        timeout: float,
        instance: ClientInstance | None,
        on_check: OnCheck,
    ) -> None:
        self.on_check = on_check
        self.producer = TransactionProducer(
            TXN_PRODUCER_GROUP,
            namesrv,
            check_local=self._check,
            send_timeout_s=timeout,
            retries=2,
            retry_backoff_s=0.05,
            instance=instance,
        )
        self.started = False
        self.announced = False

    async def start(self, topic: str) -> None:
        """Start the producer and name its group to the masters of ``topic``'s groups at once: a
        producer heartbeats only the masters its route cache knows, and one that has not sent
        yet (the final phase's, there only to answer checks) knows none."""
        if not self.started:
            await self.producer.start()
            self.started = True
        if not self.announced:
            await self.producer.fetch_publish_queues(topic)
            await self.producer.heartbeat()
            self.announced = True

    def _check(self, msg: Message) -> LocalTransactionState:
        answer = self.on_check(decode_value(msg.body), msg.properties.get(OUTCOME_PROPERTY, ""))
        return _DECISIONS.get(answer, LocalTransactionState.UNKNOW)

    async def send(self, topic: str, value: int, outcome: str, on_half: OnHalf) -> TxnResult:
        """Send ``value`` as a half message carrying ``outcome``; once it is stored, ``on_half()``
        decides how it ends (its place is only known from the result, afterwards)."""
        await self.start(topic)
        decided: list[str] = []

        def execute_local(msg: Message, arg: Any) -> LocalTransactionState:
            decided.append(on_half())
            return _DECISIONS[decided[-1]]

        msg = Message(topic, str(value).encode(), properties={OUTCOME_PROPERTY: outcome})
        result = await self.producer.send_in_transaction(msg, execute_local)
        sent = result.send_result
        return TxnResult(
            decided=bool(decided),
            broker_name=sent.broker_name,
            queue_id=sent.queue_id,
            status=result.status.value,
            end_error=result.end_error,
        )

    async def close(self) -> None:
        if self.started:
            self.started = False
            await self.producer.shutdown(grace_s=0.5)


#: a queue of one broker group as the hooks name it: (topic, queue id). An orderly consumer also
#: locks the queues of its group's retry topic, in the same requests as the topic's own
Queue = tuple[str, int]
#: the workload's side of a lock request: (broker name, queues, the request) -> the queues granted
LockHook = Callable[[str, list[Queue], Callable[[], Awaitable[list[Queue]]]], Awaitable[list[Queue]]]
#: ... of an unlock request: (broker name, queues, the request)
UnlockHook = Callable[[str, list[Queue], Callable[[], Awaitable[None]]], Awaitable[None]]
#: the workload's listener: (broker name, topic, queue id, the batch) -> consumed?
OrderlyListener = Callable[[str, str, int, list[Received]], bool | Awaitable[bool]]


class HarnessOrderlyConsumer(PushConsumer):
    """An orderly ``PushConsumer`` whose LOCK_BATCH_MQ and UNLOCK_BATCH_MQ go through hooks.

    The library decides when to lock (before consuming a queue, and every ``lock_interval_s``)
    and when to unlock (when a queue is given up, and at shutdown); the hooks let the workload
    record each request as an operation with its outcome, without changing what is sent.
    """

    def __init__(
        self,
        namesrv: list[str],
        topic: str,
        listener: OrderlyListener,
        *,
        on_lock: LockHook,
        on_unlock: UnlockHook,
        timing: BrokerTiming,
        instance: ClientInstance | None,
        batch_size: int = 8,
        timeout: float = 3.0,
    ) -> None:
        # the client counts a lock as held for at most half the broker's lifetime of it, and
        # renews it four times in that: a lock the client relies on never outlives the broker's
        live = timing.lock_max_live_s
        super().__init__(
            ORDER_GROUP,
            namesrv,
            topic,
            self._deliver,
            orderly=True,
            batch_size=batch_size,
            suspend_ms=1000,
            rebalance_interval_s=1.0,
            heartbeat_interval_s=1.0,
            commit_interval_s=1.0,
            pull_error_delay_s=0.5,
            reconsume_delay_s=0.1,
            listener_grace_s=5.0,
            lock_interval_s=max(0.5, live / 8),
            lock_max_live_s=max(0.5, live / 2),
            lock_retry_delay_s=0.5,
            call_timeout_s=timeout,
            instance=instance,
        )
        self.harness_listener = listener
        self.on_lock = on_lock
        self.on_unlock = on_unlock

    async def _deliver(self, msgs: list[Message], queue: MessageQueue) -> ConsumeStatus:
        outcome = self.harness_listener(
            queue.broker_name, queue.topic, queue.queue_id, [Received.of(m) for m in msgs]
        )
        if inspect.isawaitable(outcome):
            outcome = await outcome
        return ConsumeStatus.CONSUME_SUCCESS if outcome else ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

    async def lock_queues(
        self, broker_name: str, queues: Sequence[MessageQueue], client_id: str
    ) -> set[MessageQueue]:
        qs = list(queues)
        if not qs:
            return set()
        raised: list[BaseException] = []

        async def request() -> list[Queue]:
            async with _as_outcome(raised):
                granted = await PushConsumer.lock_queues(self, broker_name, qs, client_id)
            return sorted((q.topic, q.queue_id) for q in granted)

        try:
            ids = set(await self.on_lock(broker_name, [(q.topic, q.queue_id) for q in qs], request))
        except (Definite, Indefinite):
            if raised:  # the library handles its own errors: hand it back the one it knows
                raise raised[0] from None
            raise
        return {q for q in qs if (q.topic, q.queue_id) in ids}

    async def unlock_queues(
        self, broker_name: str, queues: Sequence[MessageQueue], client_id: str, *, oneway: bool = False
    ) -> None:
        qs = list(queues)
        if not qs:
            return
        raised: list[BaseException] = []

        async def request() -> None:
            async with _as_outcome(raised):
                await PushConsumer.unlock_queues(self, broker_name, qs, client_id, oneway=oneway)

        try:
            await self.on_unlock(broker_name, [(q.topic, q.queue_id) for q in qs], request)
        except (Definite, Indefinite):
            if raised:
                raise raised[0] from None
            raise


@asynccontextmanager
async def _as_outcome(raised: list[BaseException]) -> AsyncIterator[None]:
    """A lock request's errors as the harness's: a broker's refusal is ``Definite``, anything
    unanswered ``Indefinite``; the original is kept for the library."""
    try:
        yield
    except BrokerError as exc:
        raised.append(exc)
        raise Definite(str(exc)) from None
    except (ClientError, RemotingError) as exc:
        raised.append(exc)
        raise Indefinite(f"{type(exc).__name__}: {exc}") from None
