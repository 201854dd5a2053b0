"""Pull consumer with explicit offsets, and the broker reads every consumer shares.

Reads (pulls, offset queries) may go to any member of a broker group, so they try the master
first and move on to the slaves when it does not answer: during a DLedger election the old
master is gone but its followers still serve what was committed. Writes (offset commits) go
to the master only, following NOT_MASTER hints.

Offsets follow RocketMQ: a committed offset is the offset of the next message to consume.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import client.broker_api as B
from client.broker_api import PullResult, PullStatus, call, parse_pull_response, pull_request
from client.errors import BrokerError, ClientError, ClientStateError, NoBrokerAvailableError
from client.instance import ClientInstance
from client.message_props import DEFAULT_MAX_RECONSUME_TIMES, client_message_id
from client.route import MessageQueue
from remoting.codes import RequestCode, ResponseCode
from remoting.exceptions import RemotingCommandError, RemotingError
from remoting.message import Message
from remoting.protocol import HeaderValue, RemotingCommand

log = logging.getLogger("client.consumer")

DEFAULT_CALL_TIMEOUT_S = 3.0
LONG_POLL_MARGIN_S = 3.0
"""A long-poll call waits this much longer than the broker may hold it."""
MAX_MASTER_REDIRECTS = 3
SEND_BACK_TIMEOUT_S = 5.0
"""RocketMQ's consumer waits 5 s for a CONSUMER_SEND_MSG_BACK answer."""


class ConsumerBase:
    """Broker calls for consumers: queues of a topic, pulls, offsets."""

    def __init__(
        self,
        group: str,
        namesrv_addrs: str | Sequence[str] | None = None,
        *,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        instance: ClientInstance | None = None,
    ) -> None:
        if not group or not isinstance(group, str):
            raise ValueError("consumer group must be a non-empty string")
        self.group = group
        self.call_timeout_s = call_timeout_s
        self._own_instance = instance is None
        self.instance = instance or ClientInstance(namesrv_addrs, name=f"consumer-{group}")
        self._running = False

    def _check_running(self) -> None:
        if not self._running:
            raise ClientStateError(f"consumer {self.group} is not running; call start() first")

    async def _close_instance(self) -> None:
        if self._own_instance:
            await self.instance.close()

    # --- queues ---------------------------------------------------------------------------------
    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """Readable queues of ``topic`` on every live group (asks a nameserver)."""
        return await self.instance.routes.subscribe_queues(topic, force=True)

    async def _group_addrs(self, queue: MessageQueue) -> list[str]:
        routes = self.instance.routes
        addrs = routes.broker_addrs(queue.broker_name)
        if not addrs:
            await routes.route(queue.topic, force=True)
            addrs = routes.broker_addrs(queue.broker_name)
        if not addrs:
            raise NoBrokerAvailableError(
                f"broker group {queue.broker_name} of topic {queue.topic} has no live member"
            )
        return addrs

    # --- reads: any member ------------------------------------------------------------------------
    async def _read(
        self,
        queue: MessageQueue,
        make_request: Callable[[bool], RemotingCommand],
        timeout_s: float,
        what: str,
    ) -> tuple[str, RemotingCommand]:
        """First answer from the group, master first; ``make_request(is_master)``."""
        errors: list[str] = []
        routes = self.instance.routes
        for addr in await self._group_addrs(queue):
            is_master = addr == routes.master_addr(queue.broker_name)
            try:
                return addr, await self.instance.remoting.invoke_sync(
                    addr, make_request(is_master), timeout_s
                )
            except RemotingError as exc:
                errors.append(f"{addr}: {exc}")
                if is_master:
                    routes.forget_master(queue.broker_name, addr)
        raise NoBrokerAvailableError(
            f"{what} on {queue}: no member of the group answered ({'; '.join(errors)})"
        )

    async def pull(
        self,
        queue: MessageQueue,
        offset: int,
        max_nums: int = 32,
        suspend_ms: int = 0,
        *,
        commit_offset: int | None = None,
        subscription: str | None = None,
        expression_type: str = B.EXPRESSION_TAG,
    ) -> PullResult:
        """Messages of ``queue`` from ``offset`` on. With ``suspend_ms`` the broker holds the pull
        until a message arrives or that time passes (long polling). ``subscription``
        ("TagA || TagB") makes the broker skip messages with other tags; it filters by tag
        hash, so a collision can let an unwanted tag through. With ``expression_type`` SQL92
        the subscription is a property filter (``a > 5 AND TAGS IN ('x')``) the broker applies."""
        if offset < 0 or max_nums < 1 or suspend_ms < 0:
            raise ValueError("offset and suspend_ms must be >= 0, max_nums >= 1")
        timeout_s = self.call_timeout_s + (suspend_ms / 1000.0 + LONG_POLL_MARGIN_S if suspend_ms else 0.0)

        def make(is_master: bool) -> RemotingCommand:
            # Only the master accepts offset commits; a slave would drop it (or refuse the pull).
            return pull_request(
                self.group,
                queue.topic,
                queue.queue_id,
                offset,
                max_nums,
                suspend_ms,
                commit_offset if is_master else None,
                subscription,
                expression_type,
            )

        addr, response = await self._read(queue, make, timeout_s, "pull")
        return parse_pull_response(response, addr, queue.broker_name, offset)

    async def _offset_call(
        self, queue: MessageQueue, code: int, what: str, *, with_group: bool
    ) -> int | None:
        headers: dict[str, HeaderValue] = {B.TOPIC: queue.topic, B.QUEUE_ID: queue.queue_id}
        if with_group:
            headers[B.CONSUMER_GROUP] = self.group
        addr, response = await self._read(
            queue, lambda _m: RemotingCommand.request(code, headers), self.call_timeout_s, what
        )
        if response.code == ResponseCode.QUERY_NOT_FOUND and with_group:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise BrokerError(response.code, response.remark, addr, f"{what} of {queue}")
        try:
            return response.header_int(B.OFFSET)
        except RemotingCommandError as exc:
            raise BrokerError(response.code, f"malformed answer: {exc}", addr, what) from None

    async def query_offset(self, queue: MessageQueue) -> int | None:
        """The group's committed offset of ``queue`` (next message to consume), None if it has none."""
        return await self._offset_call(
            queue, RequestCode.QUERY_CONSUMER_OFFSET, "query consumer offset", with_group=True
        )

    async def max_offset(self, queue: MessageQueue) -> int:
        """One past the last message of ``queue``."""
        value = await self._offset_call(queue, RequestCode.GET_MAX_OFFSET, "max offset", with_group=False)
        assert value is not None
        return value

    async def min_offset(self, queue: MessageQueue) -> int:
        value = await self._offset_call(queue, RequestCode.GET_MIN_OFFSET, "min offset", with_group=False)
        assert value is not None
        return value

    # --- writes: the master ----------------------------------------------------------------------
    async def _master_call(
        self,
        queue: MessageQueue,
        make_request: Callable[[], RemotingCommand],
        what: str,
        *,
        timeout_s: float | None = None,
    ) -> RemotingCommand:
        """Send to the group's master, following NOT_MASTER hints and re-reading the route."""
        routes = self.instance.routes
        last = ""
        for _ in range(MAX_MASTER_REDIRECTS):
            addr = routes.master_addr(queue.broker_name)
            if addr is None:
                await routes.route(queue.topic, force=True)
                addr = routes.master_addr(queue.broker_name)
            if addr is None:
                raise NoBrokerAvailableError(
                    f"{what}: broker group {queue.broker_name} has no master at the moment"
                )
            try:
                response = await self.instance.remoting.invoke_sync(
                    addr, make_request(), self.call_timeout_s if timeout_s is None else timeout_s
                )
            except RemotingError as exc:
                routes.forget_master(queue.broker_name, addr)
                last = f"{addr}: {exc}"
                continue
            if response.code == ResponseCode.NOT_MASTER:
                hint = response.header_str(B.MASTER_ADDR, "")
                if hint and hint != addr:
                    routes.note_master(queue.broker_name, hint)
                else:
                    routes.forget_master(queue.broker_name, addr)
                last = f"{addr}: NOT_MASTER {response.remark}"
                continue
            if response.code != ResponseCode.SUCCESS:
                raise BrokerError(response.code, response.remark, addr, what)
            return response
        raise NoBrokerAvailableError(f"{what} on {queue}: the group's master did not take it ({last})")

    async def commit_offset(self, queue: MessageQueue, offset: int) -> None:
        """Commit ``offset`` (the next message to consume) for this group; returns once replicated."""
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        headers: dict[str, HeaderValue] = {
            B.CONSUMER_GROUP: self.group,
            B.TOPIC: queue.topic,
            B.QUEUE_ID: queue.queue_id,
            B.COMMIT_OFFSET: offset,
        }
        await self._master_call(
            queue,
            lambda: RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, headers),
            f"commit offset {offset}",
        )

    # --- retries, queue locks, filters (all on a group's master) --------------------------------
    async def send_message_back(
        self,
        msg: Message,
        broker_name: str,
        *,
        delay_level: int = 0,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
        timeout_s: float = SEND_BACK_TIMEOUT_S,
    ) -> None:
        """CONSUMER_SEND_MSG_BACK: ask the master of ``broker_name`` (the group the message was
        pulled from) to copy the stored message into ``%RETRY%<group>`` for a later try, or into
        ``%DLQ%<group>`` once it was tried ``max_reconsume_times`` times (or ``delay_level`` < 0).
        ``delay_level`` 0 lets the broker pick 3 + the times it was tried. Raises BrokerError for
        a refusal and NoBrokerAvailableError when the master could not be reached."""
        if msg.physical_offset < 0:
            raise ClientError(f"message {msg.msg_id or '?'} has no commit-log offset: it was not pulled")
        headers = B.send_back_headers(
            msg, self.group, delay_level, max_reconsume_times, client_message_id(msg)
        )
        queue = MessageQueue(msg.topic, broker_name, max(msg.queue_id, 0))
        await self._master_call(
            queue,
            lambda: RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, headers),
            f"send back message {msg.msg_id}",
            timeout_s=timeout_s,
        )

    async def lock_queues(
        self, broker_name: str, queues: Sequence[MessageQueue], client_id: str
    ) -> set[MessageQueue]:
        """LOCK_BATCH_MQ: lock ``queues`` (all of group ``broker_name``) for ``client_id`` on that
        group's master; returns the ones it holds now (another member may hold the rest)."""
        if not queues:
            return set()
        body = B.lock_batch_body(self.group, client_id, list(queues))
        response = await self._master_call(
            queues[0],
            lambda: RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, None, body),
            f"lock {len(queues)} queue(s) of {broker_name}",
        )
        wanted = set(queues)
        locked = {MessageQueue(t, b, q) for t, b, q in B.parse_locked_queues(response, broker_name)}
        return locked & wanted

    async def unlock_queues(
        self, broker_name: str, queues: Sequence[MessageQueue], client_id: str, *, oneway: bool = False
    ) -> None:
        """UNLOCK_BATCH_MQ: give up the locks on ``queues`` (all of group ``broker_name``), so
        another member may take them at once instead of after the broker's lock expiry.
        ``oneway`` sends it without waiting (as RocketMQ's rebalance does)."""
        if not queues:
            return
        body = B.lock_batch_body(self.group, client_id, list(queues))
        if oneway:
            addr = self.instance.routes.master_addr(broker_name)
            if addr is None:
                raise NoBrokerAvailableError(
                    f"unlock: broker group {broker_name} has no master at the moment"
                )
            request = RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, None, body, oneway=True)
            await self.instance.remoting.invoke_oneway(addr, request, self.call_timeout_s)
            return
        await self._master_call(
            queues[0],
            lambda: RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, None, body),
            f"unlock {len(queues)} queue(s) of {broker_name}",
        )

    async def check_client_config(self, topic: str, subscription: dict[str, object], client_id: str) -> None:
        """CHECK_CLIENT_CONFIG: ask a broker serving ``topic`` whether it takes the subscription
        (a SQL92 expression it must compile). Raises BrokerError (SUBSCRIPTION_PARSE_FAILED for an
        expression it cannot parse); NoBrokerAvailableError when no member answered."""
        routes = self.instance.routes
        queues = await routes.subscribe_queues(topic)
        names = sorted({q.broker_name for q in queues})
        body = B.check_client_body(client_id, self.group, dict(subscription))
        errors: list[str] = []
        for name in names:
            for addr in routes.broker_addrs(name):
                try:
                    await call(
                        self.instance.remoting,
                        addr,
                        RequestCode.CHECK_CLIENT_CONFIG,
                        None,
                        body,
                        timeout_s=self.call_timeout_s,
                        what=f"check subscription of {topic}",
                    )
                    return
                except RemotingError as exc:
                    errors.append(f"{addr}: {exc}")
        raise NoBrokerAvailableError(
            f"check subscription of {topic}: no broker answered ({'; '.join(errors) or 'no broker serves it'})"
        )

    async def consumer_ids(self, topic: str, broker_names: Sequence[str] = ()) -> list[str]:
        """Client ids of this group's live consumers, as the first answering group master knows them."""
        routes = self.instance.routes
        names = list(broker_names) or sorted({q.broker_name for q in await routes.subscribe_queues(topic)})
        errors: list[str] = []
        for name in names:
            for addr in routes.broker_addrs(name):
                try:
                    response = await call(
                        self.instance.remoting,
                        addr,
                        RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                        {B.CONSUMER_GROUP: self.group},
                        timeout_s=self.call_timeout_s,
                        what="consumer list",
                    )
                except RemotingError as exc:
                    errors.append(f"{addr}: {exc}")
                    continue
                return B.parse_consumer_ids(response, addr)
        raise NoBrokerAvailableError(
            f"consumer list of group {self.group}: no broker answered ({'; '.join(errors)})"
        )


class PullConsumer(ConsumerBase):
    """Explicit-offset consumer: you choose queues and offsets, and commit when you like.

    Every method works on any queue of any topic; ``group`` names whose offsets are queried
    and committed.
    """

    async def start(self) -> None:
        if self.instance.closed:
            raise ClientStateError("consumer was shut down; create a new one")
        self._running = True

    async def shutdown(self) -> None:
        self._running = False
        await self._close_instance()

    async def __aenter__(self) -> PullConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def pull(
        self,
        queue: MessageQueue,
        offset: int,
        max_nums: int = 32,
        suspend_ms: int = 0,
        *,
        commit_offset: int | None = None,
        subscription: str | None = None,
        expression_type: str = B.EXPRESSION_TAG,
    ) -> PullResult:
        self._check_running()
        return await super().pull(
            queue,
            offset,
            max_nums,
            suspend_ms,
            commit_offset=commit_offset,
            subscription=subscription,
            expression_type=expression_type,
        )


__all__ = ["ConsumerBase", "PullConsumer", "PullResult", "PullStatus"]
