"""What every request processor of a broker shares: the master check and its NOT_MASTER
answer, topic checks, appends answered from the commit, message ids, and the bounded set of
topics being created (auto-created on a first send, retry and dead-letter topics)."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable

from ledger.embed import AppendFailed, EmbedError, LedgerBusy, NotLeaderError
from remoting.codes import ResponseCode
from remoting.dispatcher import Deferred
from remoting.message import STORED_STORE_HOST_AT, MessageFormatError, host_to_bytes, offset_msg_id
from remoting.protocol import RemotingCommand
from remoting.topic import PERM_READ, PERM_WRITE, topic_name_error

from .clients import ClientTable
from .context import Broker
from .message_store import Stored
from .meta import topic_op

log = logging.getLogger("broker.processors")

Response = RemotingCommand | asyncio.Future[RemotingCommand] | Deferred | None

MAX_TOPICS_BEING_CREATED = 1000  # auto-created topics whose config is not applied yet
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1  # a Java int, as a record stores flag and sysFlag
MAX_TIMESTAMP_MS = (1 << 63) - 1  # a Java long

_ZERO_HOST = b"\x00" * 8
_HOST_CACHE: dict[str, bytes] = {}
_HOST_CACHE_MAX = 4096  # peers' addresses: a bounded cache, cleared when full


def host_bytes(addr: str) -> bytes:
    """``ip:port`` -> the 8-byte socket address a record stores (zeros for one it cannot hold)."""
    raw = _HOST_CACHE.get(addr)
    if raw is None:
        try:
            raw = host_to_bytes(addr)
        except MessageFormatError:
            raw = _ZERO_HOST
        if len(raw) != 8:
            raw = _ZERO_HOST  # records keep IPv4 socket addresses
        if len(_HOST_CACHE) >= _HOST_CACHE_MAX:
            _HOST_CACHE.clear()
        _HOST_CACHE[addr] = raw
    return raw


class RequestContext:
    """One per broker, shared by its processors (both listeners)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store
        self.config = broker.config
        self.clients = ClientTable(self.config.max_heartbeat_clients, self.config.max_heartbeat_table_bytes)
        # topics being auto-created -> (queue count, when proposed); bounded, stale ones retried
        self.creating: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self.store_host = host_bytes(self.config.broker_addr)
        self._store_host_hex = self.store_host.hex().upper()  # the first 16 digits of our message ids

    def not_master(self, req: RemotingCommand) -> RemotingCommand:
        master = self.broker.master_address()
        remark = f"broker {self.config.broker_addr} is not the master of {self.config.broker_name}; " + (
            f"the master is {master}" if master else "no master is elected yet"
        )
        code = (
            ResponseCode.NOT_MASTER
            if master or self.broker.leader_known
            else ResponseCode.SERVICE_NOT_AVAILABLE
        )
        return req.make_response(code, remark, {"masterAddr": master} if master else None)

    def check_topic(
        self, req: RemotingCommand, topic: str, queue_id: int, perm: int, pending_nums: int = 0
    ) -> RemotingCommand | None:
        problem = topic_name_error(topic)
        if problem:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, f"topic {topic!r}: {problem}")
        tc = self.store.topics.get(topic)
        if tc is None and pending_nums:
            nums, topic_perm = pending_nums, PERM_READ | PERM_WRITE
        elif tc is None:
            return req.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic {topic!r} does not exist on broker {self.config.broker_name}",
            )
        else:
            topic_perm = tc.perm
            nums = tc.write_queue_nums if perm == PERM_WRITE else tc.read_queue_nums
        if not topic_perm & perm:
            return req.make_response(
                ResponseCode.NO_PERMISSION, f"topic {topic!r} does not allow this (perm {topic_perm})"
            )
        if not 0 <= queue_id < max(nums, 1):
            return req.make_response(
                ResponseCode.MESSAGE_ILLEGAL,
                f"queue id {queue_id} is outside 0..{nums - 1} of topic {topic!r}",
            )
        return None

    def append(
        self,
        req: RemotingCommand,
        payloads: list[bytes],
        reply: Callable[[list[Stored]], RemotingCommand],
        hint: tuple[bytes, int] | None = None,
    ) -> Response:
        """Append and answer from the commit callback (a Deferred: no future or loop turn per send)."""
        later = Deferred()

        def done(results: list[Stored] | None, exc: EmbedError | None) -> None:
            if later.answered:
                return
            if exc is None:
                later.answer(reply(results or []))
            elif isinstance(exc, NotLeaderError):  # leadership lost before the append was proposed
                later.answer(self.not_master(req))
            elif isinstance(exc, AppendFailed):
                later.answer(req.make_response(ResponseCode.SYSTEM_ERROR, f"not stored: {exc}"))
            elif isinstance(exc, LedgerBusy):  # back-pressure: certainly not stored
                later.answer(req.make_response(ResponseCode.SYSTEM_BUSY, f"not stored: {exc}"))
            else:
                later.answer(req.make_response(ResponseCode.REPLICATION_TIMEOUT, f"outcome unknown: {exc}"))

        try:
            self.store.append(payloads, done, hint)
        except NotLeaderError:
            return self.not_master(req)
        return later

    def msg_id(self, stored: Stored) -> str:
        """The offset message id of a stored message: the host in its record (a duplicate's
        original may have been stored by an earlier master) and its position."""
        if stored.duplicate:
            host = self.store_host
            found = self.store.record_at(stored.position)
            if found is not None:
                host = bytes(found[1][STORED_STORE_HOST_AT : STORED_STORE_HOST_AT + 8])
            return offset_msg_id(host, stored.position)
        # offset_msg_id(self._store_host, position), without re-encoding the host per message
        return f"{self._store_host_hex}{stored.position:016X}"

    def begin_creation(self, topic: str, nums: int, now: float) -> tuple[int, str] | None:
        """Note that ``topic``'s config is being proposed now; the refusal (code, remark) when
        the group holds ``max_topics`` or MAX_TOPICS_BEING_CREATED are on their way. O(1)
        amortised: proposals are kept oldest first and only expired ones are looked at."""
        creating = self.creating
        if topic not in creating:
            if len(self.store.topics) + len(creating) >= self.config.max_topics:
                return (
                    ResponseCode.TOPIC_NOT_EXIST,
                    f"topic {topic!r} not created: broker group {self.config.broker_name} holds "
                    f"max_topics={self.config.max_topics} topics",
                )
            if len(creating) >= MAX_TOPICS_BEING_CREATED:
                horizon = now - self.config.send_timeout_s
                while creating and next(iter(creating.values()))[1] < horizon:
                    creating.popitem(last=False)
                if len(creating) >= MAX_TOPICS_BEING_CREATED:
                    return (
                        ResponseCode.SYSTEM_BUSY,
                        f"{MAX_TOPICS_BEING_CREATED} topics are being created; try again shortly",
                    )
        creating[topic] = (nums, now)
        creating.move_to_end(topic)
        return None

    def created(self, topic: str) -> None:
        if topic in self.store.topics:
            self.creating.pop(topic, None)

    def ensure_topic(self, topic: str, queues: int, now: float, perm: int = PERM_READ | PERM_WRITE) -> None:
        """Create ``topic`` (``queues`` queues) if it does not exist, without waiting: a group's
        retry topic on its first heartbeat (RocketMQ's broker does; admin tools such as
        ``mqadmin consumerProgress`` look it up), its dead-letter topic on its first dead letter.
        Only a master proposes it; the bound on topics being created applies."""
        if topic in self.store.topics or not self.broker.is_master or topic_name_error(topic):
            return
        pending = self.creating.get(topic)
        if pending is not None and now - pending[1] <= self.config.send_timeout_s:
            return  # proposed a moment ago
        if self.begin_creation(topic, queues, now) is not None:
            return  # (the next request tries again)

        def done(results: list[Stored] | None, exc: EmbedError | None) -> None:
            if exc is not None:
                log.warning("topic not created", extra={"topic": topic, "error": str(exc)})
            self.created(topic)

        try:
            self.store.append([topic_op(topic, queues, queues, perm)], done)
        except EmbedError as exc:  # leadership lost since the check
            self.creating.pop(topic, None)
            log.info("topic not created", extra={"topic": topic, "error": str(exc)})
