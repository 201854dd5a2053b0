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
from client.errors import BrokerError, ClientStateError, NoBrokerAvailableError
from client.instance import ClientInstance
from client.route import MessageQueue
from remoting.codes import RequestCode, ResponseCode
from remoting.exceptions import RemotingCommandError, RemotingError
from remoting.protocol import HeaderValue, RemotingCommand

log = logging.getLogger("client.consumer")

DEFAULT_CALL_TIMEOUT_S = 3.0
LONG_POLL_MARGIN_S = 3.0
"""A long-poll call waits this much longer than the broker may hold it."""
MAX_MASTER_REDIRECTS = 3


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
    ) -> PullResult:
        """Messages of ``queue`` from ``offset`` on. With ``suspend_ms`` the broker holds the pull
        until a message arrives or that time passes (long polling). ``subscription``
        ("TagA || TagB") makes the broker skip messages with other tags; it filters by tag
        hash, so a collision can let an unwanted tag through."""
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
        self, queue: MessageQueue, make_request: Callable[[], RemotingCommand], what: str
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
                response = await self.instance.remoting.invoke_sync(addr, make_request(), self.call_timeout_s)
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
    ) -> PullResult:
        self._check_running()
        return await super().pull(
            queue, offset, max_nums, suspend_ms, commit_offset=commit_offset, subscription=subscription
        )


__all__ = ["ConsumerBase", "PullConsumer", "PullResult", "PullStatus"]
