"""The client's route cache: topic routes, broker addresses, publish info and queue choice.

RocketMQ's MQClientInstance keeps ``topicRouteTable`` and ``brokerAddrTable`` and turns a
route into a TopicPublishInfo (the writable queues of groups that have a master). We do the
same, refreshing a route when it is older than a TTL or when a send just failed, and we
remember the master a broker named in a NOT_MASTER answer: after a DLedger leader change
the new master knows it is master before the nameserver does.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass

from client.errors import ClientError, NoBrokerAvailableError, RouteNotFoundError
from client.namesrv_client import NamesrvClient
from remoting.route import MASTER_ID, BrokerData, QueueData, TopicRouteData
from remoting.topic import PERM_READ, PERM_WRITE

log = logging.getLogger("client.route")

DEFAULT_ROUTE_TTL_S = 30.0
DEFAULT_TOPIC = "TBW102"
"""RocketMQ's template topic, served by brokers that create topics on their first message."""
DEFAULT_TOPIC_QUEUE_NUMS = 4
AUTO_CREATE_ROUTE_TTL_S = 1.0
"""How long a route borrowed from TBW102 is used before asking for the topic's own again."""
"""RocketMQ refreshes routes every 30 s (pollNameServerInterval)."""
MASTER_HINT_TTL_S = 10.0
"""How long a master learned from NOT_MASTER wins over the nameserver's (possibly stale) route."""
DEAD_MASTER_TTL_S = 2.0
"""How long a master that refused or dropped our connection is not taken from a route again:
the nameservers list it until they notice, and asking a slave finds the new one sooner."""


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker group."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"


class TopicPublishInfo:
    """Writable queues of a topic, and round-robin choice among them."""

    __slots__ = ("topic", "route", "queues", "masterless", "_counter")

    def __init__(
        self,
        topic: str,
        route: TopicRouteData,
        queues: list[MessageQueue],
        masterless: frozenset[str] = frozenset(),
    ) -> None:
        self.topic = topic
        self.route = route
        self.queues = queues
        # Groups listed without a master (mid-election): their queues stay, so a send pinned to
        # one can ask a slave where the new master is, but a free choice takes them last.
        self.masterless = masterless
        self._counter = random.randrange(1 << 16)  # like RocketMQ's random thread-local start

    @property
    def ok(self) -> bool:
        return bool(self.queues)

    def broker_names(self) -> list[str]:
        return sorted({q.broker_name for q in self.queues})

    def select_queue(self, avoid_broker: str | None = None) -> MessageQueue:
        """Next queue round-robin, skipping ``avoid_broker`` (the one that just failed) if another exists."""
        queues = self.queues
        n = len(queues)
        if n == 0:
            raise NoBrokerAvailableError(f"topic {self.topic} has no writable queue with a master")
        self._counter += 1
        start = self._counter
        masterless = self.masterless
        if avoid_broker is not None or masterless:
            for i in range(n):
                q = queues[(start + i) % n]
                if q.broker_name != avoid_broker and q.broker_name not in masterless:
                    self._counter = start + i
                    return q
            if avoid_broker is not None and masterless:  # all masterless: still avoid the failed one
                for i in range(n):
                    q = queues[(start + i) % n]
                    if q.broker_name != avoid_broker:
                        self._counter = start + i
                        return q
        return queues[start % n]

    def select_by_queue_id(self, queue_id: int) -> MessageQueue:
        """A queue with this id, round-robin among the groups that have it."""
        matches = [q for q in self.queues if q.queue_id == queue_id]
        if not matches:
            raise NoBrokerAvailableError(
                f"topic {self.topic} has no writable queue {queue_id} "
                f"(write queues: {', '.join(str(q) for q in self.queues) or 'none'})"
            )
        self._counter += 1
        return matches[self._counter % len(matches)]


def publish_queues(topic: str, route: TopicRouteData, has_master: set[str]) -> list[MessageQueue]:
    """RocketMQ's topicRouteData2TopicPublishInfo: writable queues of groups with a master."""
    out: list[MessageQueue] = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if not qd.perm & PERM_WRITE or qd.broker_name not in has_master:
            continue
        out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
    return out


def subscribe_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    """Readable queues of every group that has any live member (slaves serve reads too)."""
    live = {bd.broker_name for bd in route.broker_datas if bd.broker_addrs}
    out: list[MessageQueue] = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if not qd.perm & PERM_READ or qd.broker_name not in live:
            continue
        out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
    return out


class _Entry:
    __slots__ = ("route", "fetched_at", "publish")

    def __init__(self, route: TopicRouteData, fetched_at: float, publish: TopicPublishInfo) -> None:
        self.route = route
        self.fetched_at = fetched_at
        self.publish = publish


class RouteTable:
    """Routes by topic and broker addresses by broker name, refreshed from the nameservers."""

    def __init__(self, namesrv: NamesrvClient, *, ttl_s: float = DEFAULT_ROUTE_TTL_S) -> None:
        self.namesrv = namesrv
        self.ttl_s = ttl_s
        self._topics: dict[str, _Entry] = {}
        self._brokers: dict[str, BrokerData] = {}
        self._hints: dict[str, tuple[str, float]] = {}  # broker name -> (master addr, learned at)
        self._dead: dict[str, tuple[str, float]] = {}  # broker name -> (failed master addr, at)
        self._inflight: dict[str, asyncio.Future[_Entry]] = {}

    # --- routes -------------------------------------------------------------------------------
    async def route(self, topic: str, *, force: bool = False) -> TopicRouteData:
        return (await self._entry(topic, force)).route

    async def publish_info(self, topic: str, *, force: bool = False) -> TopicPublishInfo:
        """Writable queues of ``topic``; RouteNotFoundError / NoNameServerError / ... when unknown."""
        if not force:
            publish = self.fresh_publish_info(topic)
            if publish is not None:
                return publish
        try:
            return (await self._entry(topic, force)).publish
        except RouteNotFoundError:
            if topic == DEFAULT_TOPIC:
                raise
            auto = await self._auto_create_publish_info(topic)
            if auto is None:
                raise
            return auto

    async def _auto_create_publish_info(self, topic: str) -> TopicPublishInfo | None:
        """RocketMQ's producer path for a topic no nameserver knows: send to the brokers that
        serve TBW102 (queue counts capped at the default 4); they create the topic on its first
        message and register it. None if no broker auto-creates topics."""
        try:
            template = await self.route(DEFAULT_TOPIC)
        except RouteNotFoundError:
            return None
        n = DEFAULT_TOPIC_QUEUE_NUMS
        route = TopicRouteData(
            [
                QueueData(q.broker_name, min(q.read_queue_nums, n), min(q.write_queue_nums, n), q.perm & 6)
                for q in template.queue_datas
            ],
            template.broker_datas,
        )
        has_master = {bd.broker_name for bd in route.broker_datas if self.master_addr(bd.broker_name)}
        publish = TopicPublishInfo(topic, route, publish_queues(topic, route, has_master))
        if not publish.queues:
            return None
        # Used briefly: once a broker has created the topic its own route takes over.
        self._topics[topic] = _Entry(route, time.monotonic() - self.ttl_s + AUTO_CREATE_ROUTE_TTL_S, publish)
        return publish

    async def subscribe_queues(self, topic: str, *, force: bool = False) -> list[MessageQueue]:
        return subscribe_queues(topic, await self.route(topic, force=force))

    def fresh_publish_info(self, topic: str) -> TopicPublishInfo | None:
        """The cached writable queues of ``topic`` while younger than the TTL, else None:
        the hot path of ``publish_info``, for callers that can skip an await."""
        entry = self._topics.get(topic)
        if entry is not None and time.monotonic() - entry.fetched_at < self.ttl_s:
            return entry.publish
        return None

    def cached_publish_info(self, topic: str) -> TopicPublishInfo | None:
        """What we know without asking anyone (possibly stale)."""
        entry = self._topics.get(topic)
        return entry.publish if entry is not None else None

    def cached_subscribe_queues(self, topic: str) -> list[MessageQueue]:
        entry = self._topics.get(topic)
        return subscribe_queues(topic, entry.route) if entry is not None else []

    def invalidate(self, topic: str) -> None:
        """Make the next lookup of ``topic`` ask a nameserver (after a failed send)."""
        entry = self._topics.get(topic)
        if entry is not None:
            entry.fetched_at = float("-inf")

    async def _entry(self, topic: str, force: bool) -> _Entry:
        entry = self._topics.get(topic)
        if entry is not None and not force and time.monotonic() - entry.fetched_at < self.ttl_s:
            return entry
        pending = self._inflight.get(topic)
        if pending is None:
            # Concurrent callers share one nameserver round trip.
            pending = asyncio.ensure_future(self._fetch(topic))
            self._inflight[topic] = pending
            pending.add_done_callback(lambda _f: self._inflight.pop(topic, None))
        try:
            return await asyncio.shield(pending)
        except RouteNotFoundError:
            raise
        except ClientError as exc:
            if entry is not None:  # nameservers unreachable: a stale route beats none
                log.warning(
                    "route refresh failed, using cached route", extra={"topic": topic, "error": str(exc)}
                )
                return entry
            raise

    async def _fetch(self, topic: str) -> _Entry:
        route = await self.namesrv.get_topic_route(topic)
        now = time.monotonic()
        for bd in route.broker_datas:
            self._brokers[bd.broker_name] = bd.copy()
            hint = self._hints.get(bd.broker_name)
            if hint is not None and (bd.master_addr == hint[0] or now - hint[1] > MASTER_HINT_TTL_S):
                del self._hints[bd.broker_name]  # the nameserver caught up, or the hint is old
        has_master = {bd.broker_name for bd in route.broker_datas if self.master_addr(bd.broker_name)}
        # A group whose master just died is listed with its slaves only: a send can still ask a
        # slave where the new master is (it knows before the nameservers do).
        askable = {bd.broker_name for bd in route.broker_datas if bd.broker_addrs}
        old = self._topics.get(topic)
        publish = TopicPublishInfo(
            topic, route, publish_queues(topic, route, has_master | askable), frozenset(askable - has_master)
        )
        if old is not None:
            publish._counter = old.publish._counter  # keep round-robin going across refreshes
        entry = _Entry(route, now, publish)
        self._topics[topic] = entry
        return entry

    # --- broker addresses ----------------------------------------------------------------------
    def master_addr(self, broker_name: str) -> str | None:
        """The master to send to: a fresh NOT_MASTER hint, else the route's broker id 0."""
        hint = self._hints.get(broker_name)
        if hint is not None:
            if time.monotonic() - hint[1] <= MASTER_HINT_TTL_S:
                return hint[0]
            del self._hints[broker_name]
        bd = self._brokers.get(broker_name)
        addr = bd.broker_addrs.get(MASTER_ID) if bd is not None else None
        dead = self._dead.get(broker_name)
        if dead is not None and addr is not None:
            if time.monotonic() - dead[1] > DEAD_MASTER_TTL_S:
                del self._dead[broker_name]
            elif dead[0] == addr:
                return None  # the route is older than what we saw: ask a slave instead
        return addr

    def broker_addrs(self, broker_name: str) -> list[str]:
        """Every known member of the group, master first, then slaves by id (for reads)."""
        bd = self._brokers.get(broker_name)
        out: list[str] = []
        master = self.master_addr(broker_name)
        if master:
            out.append(master)
        if bd is not None:
            for _bid, addr in sorted(bd.broker_addrs.items()):
                if addr not in out:
                    out.append(addr)
        return out

    def recently_failed(self, broker_name: str, addr: str) -> bool:
        """Whether ``addr`` failed as ``broker_name``'s master within DEAD_MASTER_TTL_S."""
        dead = self._dead.get(broker_name)
        return dead is not None and dead[0] == addr and time.monotonic() - dead[1] <= DEAD_MASTER_TTL_S

    def member_to_ask(self, broker_name: str, avoid: str = "") -> str | None:
        """A live member of a group with no known master, to ask where its master is (a slave
        answers a send with NOT_MASTER naming the master as soon as its ledger knows the
        leader); None when the route names none."""
        bd = self._brokers.get(broker_name)
        if bd is None:
            return None
        dead = self._dead.get(broker_name)
        skip = {avoid, dead[0] if dead is not None else ""}
        members = [addr for _bid, addr in sorted(bd.broker_addrs.items()) if addr not in skip]
        return random.choice(members) if members else None

    def note_master(self, broker_name: str, addr: str) -> None:
        """A broker said ``addr`` is its group's master (NOT_MASTER with masterAddr)."""
        self._hints[broker_name] = (addr, time.monotonic())
        dead = self._dead.get(broker_name)
        if dead is not None and dead[0] == addr:
            del self._dead[broker_name]  # restarted and elected again

    def forget_master(self, broker_name: str, addr: str) -> None:
        """``addr`` failed as master of ``broker_name``: drop the hint and stop using it until re-routed."""
        hint = self._hints.get(broker_name)
        if hint is not None and hint[0] == addr:
            del self._hints[broker_name]
        self._dead[broker_name] = (addr, time.monotonic())
        bd = self._brokers.get(broker_name)
        if bd is not None and bd.broker_addrs.get(MASTER_ID) == addr:
            bd = bd.copy()
            del bd.broker_addrs[MASTER_ID]
            self._brokers[broker_name] = bd
        for topic, entry in list(self._topics.items()):
            if any(q.broker_name == broker_name for q in entry.publish.queues):
                self._refresh_behind(topic)

    def _refresh_behind(self, topic: str) -> None:
        """Ask the nameservers for ``topic``'s route again without making the next send wait.

        A failed master's group is asked through its slaves (``member_to_ask``) at once; the
        cached route still names them. Invalidating the route made every next attempt wait for
        a nameserver round trip first, which under full load took 100-400 ms, the longest part
        of the time between the new master serving and the clients reaching it. The refresh
        still runs (one per topic at a time), and a failed one leaves the route stale, so the
        next lookup asks again. Outside an event loop the route is just marked stale."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.invalidate(topic)
            return
        if topic in self._inflight:
            return
        pending = asyncio.ensure_future(self._fetch(topic))
        self._inflight[topic] = pending

        def done(f: asyncio.Future[_Entry]) -> None:
            self._inflight.pop(topic, None)
            if f.cancelled() or f.exception() is not None:
                self.invalidate(topic)

        pending.add_done_callback(done)

    def broker_names(self) -> list[str]:
        """Names of every broker group a route named so far."""
        return list(self._brokers)

    def known_brokers(self) -> dict[str, BrokerData]:
        return {name: bd.copy() for name, bd in self._brokers.items()}

    def update_brokers(self, brokers: dict[str, BrokerData]) -> None:
        """Merge broker addresses from elsewhere (cluster info), e.g. to resolve a message id's group."""
        for name, bd in brokers.items():
            self._brokers[name] = bd.copy()
