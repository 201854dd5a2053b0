"""AdminClient: the operations behind ``ledgermq-admin`` (RocketMQ's DefaultMQAdminExt), usable from code.

The Jepsen harness and tests call these directly (cluster state, broker runtime info, topic
creation); the CLI in ``client.admin`` only parses arguments and prints.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import client.broker_api as B
from client.broker_api import call, json_body
from client.consumer import ConsumerBase
from client.errors import BrokerError, ClientError, NoBrokerAvailableError
from client.instance import ClientInstance
from client.message_props import dlq_topic, retry_topic
from client.route import MessageQueue
from remoting.cluster_auth import sign_request
from remoting.codes import RequestCode, ResponseCode, response_code_name
from remoting.exceptions import RemotingCommandError, RemotingError, RemotingTimeoutError
from remoting.message import Message, parse_offset_msg_id
from remoting.protocol import HeaderValue, RemotingCommand
from remoting.route import MASTER_ID, BrokerData, ClusterInfo, TopicRouteData
from remoting.stats_body import ConsumeStats, QueueKey, TopicOffset, decode_consume_stats, decode_topic_stats
from remoting.topic import PERM_READ_WRITE, topic_name_error


@dataclass(slots=True)
class TopicUpdateResult:
    broker_name: str
    addr: str
    ok: bool
    error: str = ""


SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
"""Where RocketMQ's broker keeps delayed messages, queue ``level - 1`` per delay level."""


@dataclass(slots=True)
class DelayLevelProgress:
    """One delay level of a broker: delivered up to ``delivered``, queued up to ``max_offset``."""

    level: int
    delivered: int
    max_offset: int | None

    @property
    def pending(self) -> int | None:
        return None if self.max_offset is None else max(self.max_offset - self.delivered, 0)


@dataclass(slots=True)
class QueueProgress:
    """One queue of a consumer group: how far the broker is, how far the group got."""

    queue: MessageQueue
    broker_offset: int | None
    consumer_offset: int | None
    error: str = ""

    @property
    def lag(self) -> int | None:
        if self.broker_offset is None:
            return None
        return self.broker_offset - (self.consumer_offset or 0)


class MembershipRefusedError(BrokerError):
    """The group refused a membership change; ``retryable`` when the same request may succeed
    shortly (another change in progress, the learner still catching up)."""

    def __init__(self, remark: str, addr: str, retryable: bool) -> None:
        super().__init__(ResponseCode.MEMBERSHIP_REFUSED, remark, addr, "membership change")
        self.retryable = retryable


#: redirects (NOT_MASTER) and elections (no master yet) a membership request follows or waits out
MEMBER_CALL_TRIES = 8
MEMBER_RETRY_S = 0.5


class AdminClient(ConsumerBase):
    """Cluster, topic, broker and message queries. ``await close()`` when done."""

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str] | None = None,
        *,
        timeout_s: float = 5.0,
        group: str = "ledgermq-admin",
        instance: ClientInstance | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        """``access_key``/``secret_key`` sign every request (ACL); without them the
        LEDGERMQ_ACCESS_KEY/LEDGERMQ_SECRET_KEY environment variables are used, if set."""
        own = instance is None
        if instance is None:
            instance = ClientInstance(
                namesrv_addrs, name=f"admin-{group}", access_key=access_key, secret_key=secret_key
            )
        super().__init__(group, namesrv_addrs, call_timeout_s=timeout_s, instance=instance)
        self._own_instance = own
        self._running = True

    async def close(self) -> None:
        self._running = False
        await self._close_instance()

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- nameserver -----------------------------------------------------------------------------
    async def cluster_info(self) -> ClusterInfo:
        info = await self.instance.namesrv.get_cluster_info()
        self.instance.routes.update_brokers(info.broker_addr_table)
        return info

    async def topic_route(self, topic: str) -> TopicRouteData:
        return await self.instance.routes.route(topic, force=True)

    async def topic_list(self) -> list[str]:
        return await self.instance.namesrv.get_all_topics()

    async def broker_groups(self, cluster: str | None = None) -> dict[str, BrokerData]:
        """Broker groups by name, of one cluster or all; ClientError naming the cluster if it is unknown."""
        info = await self.cluster_info()
        if cluster is None:
            return dict(info.broker_addr_table)
        names = info.cluster_addr_table.get(cluster)
        if names is None:
            known = ", ".join(sorted(info.cluster_addr_table)) or "none"
            raise ClientError(f"cluster {cluster} is not known to the nameserver (clusters: {known})")
        return {n: info.broker_addr_table[n] for n in sorted(names) if n in info.broker_addr_table}

    # --- topics -----------------------------------------------------------------------------------
    async def update_topic(
        self,
        topic: str,
        *,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = PERM_READ_WRITE,
        cluster: str | None = None,
        broker_addr: str | None = None,
        order: bool = False,
    ) -> list[TopicUpdateResult]:
        """Create or update ``topic`` on one broker (``broker_addr``) or every group's master of
        ``cluster`` (default: every group known). A slave's NOT_MASTER is followed to its master.
        ``order`` marks it an ordered topic, as mqadmin's ``-o true`` does."""
        problem = topic_name_error(topic)
        if problem:
            raise ClientError(f"topic: {problem}")
        headers = create_topic_headers(topic, read_queue_nums, write_queue_nums, perm, order)
        targets: list[tuple[str, str]] = []
        if broker_addr:
            targets.append(("", broker_addr))
        else:
            groups = await self.broker_groups(cluster)
            if not groups:
                raise NoBrokerAvailableError(
                    f"no broker group in {'cluster ' + cluster if cluster else 'any cluster'}"
                )
            for name, bd in groups.items():
                master = bd.broker_addrs.get(MASTER_ID)
                targets.append((name, master or bd.select_broker_addr() or ""))

        async def one(name: str, addr: str) -> TopicUpdateResult:
            if not addr:
                return TopicUpdateResult(name, "", False, "group has no live member")
            for _ in range(3):
                try:
                    response = await self.instance.remoting.invoke_sync(
                        addr, _request(RequestCode.UPDATE_AND_CREATE_TOPIC, headers), self.call_timeout_s
                    )
                except RemotingError as exc:
                    return TopicUpdateResult(name, addr, False, str(exc))
                hint = response.header_str(B.MASTER_ADDR, "")
                if response.code == ResponseCode.NOT_MASTER and hint and hint != addr:
                    addr = hint
                    continue
                if response.code != ResponseCode.SUCCESS:
                    return TopicUpdateResult(
                        name, addr, False, f"{response_code_name(response.code)}: {response.remark}"
                    )
                return TopicUpdateResult(name, addr, True)
            return TopicUpdateResult(name, addr, False, "kept being redirected to another master")

        return list(await asyncio.gather(*(one(n, a) for n, a in targets)))

    # --- brokers ------------------------------------------------------------------------------------
    async def broker_runtime_info(self, addr: str) -> dict[str, Any]:
        response = await call(
            self.instance.remoting,
            addr,
            RequestCode.GET_BROKER_RUNTIME_INFO,
            timeout_s=self.call_timeout_s,
            what="broker runtime info",
        )
        info = json_body(response, addr, "broker runtime info")
        if not isinstance(info, dict):
            raise BrokerError(response.code, "runtime info is not a JSON object", addr, "broker runtime info")
        return info

    async def topic_stats(self, topic: str) -> dict[QueueKey, TopicOffset]:
        """Per queue of ``topic`` on every group serving it: min and max offset and when its last
        message was stored (mqadmin topicStatus; GET_TOPIC_STATS_INFO of each group's master)."""
        route = await self.instance.routes.route(topic, force=True)
        merged: dict[QueueKey, TopicOffset] = {}
        for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
            addr = bd.select_broker_addr()
            if addr is None:
                raise NoBrokerAvailableError(
                    f"topic stats of {topic}: broker group {bd.broker_name} has no member"
                )
            response = await call(
                self.instance.remoting,
                addr,
                RequestCode.GET_TOPIC_STATS_INFO,
                {B.TOPIC: topic},
                timeout_s=self.call_timeout_s,
                what=f"topic stats of {topic}",
            )
            try:
                merged.update(decode_topic_stats(response.body))
            except RemotingCommandError as exc:
                raise BrokerError(response.code, str(exc), addr, f"topic stats of {topic}") from None
        return merged

    async def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        """Per queue: the broker's max offset, ``group``'s committed offset and the store time of
        the last message it consumed, plus its consume rate (mqadmin consumerProgress;
        GET_CONSUME_STATS). Asks the groups serving ``topic``, or every group when it is None.
        ClientError when no broker has stats for the group."""
        if topic is not None:
            groups = (await self.instance.routes.route(topic, force=True)).broker_datas
        else:
            groups = list((await self.broker_groups()).values())
        headers: dict[str, HeaderValue] = {B.CONSUMER_GROUP: group}
        if topic is not None:
            headers[B.TOPIC] = topic
        merged = ConsumeStats({})
        remarks: list[str] = []
        for bd in sorted(groups, key=lambda b: b.broker_name):
            addr = bd.select_broker_addr()
            if addr is None:
                remarks.append(f"{bd.broker_name}: no member")
                continue
            what = f"consume stats of {group}"
            response = await call(
                self.instance.remoting,
                addr,
                RequestCode.GET_CONSUME_STATS,
                headers,
                timeout_s=self.call_timeout_s,
                what=what,
            )
            try:
                stats = decode_consume_stats(response.body)
            except RemotingCommandError as exc:
                raise BrokerError(response.code, str(exc), addr, what) from None
            merged.offsets.update(stats.offsets)
            merged.consume_tps += stats.consume_tps
            if response.remark:
                remarks.append(response.remark)
        if not merged.offsets:
            why = "; ".join(remarks) or "no broker group is known"
            raise ClientError(f"consumer group {group} has no consume stats on any broker: {why}")
        return merged

    async def master_addrs(
        self, cluster: str | None = None, broker_addr: str | None = None
    ) -> dict[str, str]:
        """Broker name -> master address (one broker when ``broker_addr`` is given, named by
        its address), for the commands that ask every master."""
        if broker_addr:
            return {broker_addr: broker_addr}
        groups = await self.broker_groups(cluster)
        return {
            name: bd.broker_addrs[MASTER_ID] for name, bd in groups.items() if MASTER_ID in bd.broker_addrs
        }

    async def delay_offsets(self, addr: str) -> dict[int, int]:
        """GET_ALL_DELAY_OFFSET: per delay level, the offset up to which the broker has delivered
        that level's schedule queue (RocketMQ's delayOffset.json, ``{"offsetTable":{"1":N,...}}``)."""
        response = await call(
            self.instance.remoting,
            addr,
            RequestCode.GET_ALL_DELAY_OFFSET,
            timeout_s=self.call_timeout_s,
            what="delay offsets",
        )
        doc = json_body(response, addr, "delay offsets")
        table = doc.get("offsetTable") if isinstance(doc, dict) else None
        if not isinstance(table, dict):
            raise BrokerError(response.code, "delay offsets: no offsetTable object", addr, "delay offsets")
        out: dict[int, int] = {}
        for level, offset in table.items():
            try:
                out[int(level)] = int(offset)
            except (TypeError, ValueError):
                raise BrokerError(
                    response.code, f"delay offsets: level {level!r} -> {offset!r}", addr, "delay offsets"
                ) from None
        return dict(sorted(out.items()))

    async def schedule_progress(self, addr: str) -> list[DelayLevelProgress]:
        """Per delay level: delivered offset (GET_ALL_DELAY_OFFSET) and the schedule queue's max
        offset (queue ``level - 1`` of SCHEDULE_TOPIC_XXXX), when the broker tells it."""
        delivered = await self.delay_offsets(addr)

        async def one(level: int, offset: int) -> DelayLevelProgress:
            headers: dict[str, HeaderValue] = {B.TOPIC: SCHEDULE_TOPIC, B.QUEUE_ID: level - 1}
            try:
                response = await call(
                    self.instance.remoting,
                    addr,
                    RequestCode.GET_MAX_OFFSET,
                    headers,
                    timeout_s=self.call_timeout_s,
                    what="schedule queue max offset",
                )
                return DelayLevelProgress(level, offset, response.header_int(B.OFFSET))
            except (ClientError, RemotingError, RemotingCommandError):
                return DelayLevelProgress(level, offset, None)

        return list(await asyncio.gather(*(one(lv, off) for lv, off in delivered.items())))

    async def transaction_status(self, addr: str) -> dict[str, Any]:
        """Half (transactional) and scheduled message counts of a broker, from its runtime info:
        the store's ``pending_half_messages``, ``scheduled_messages`` and ``queue_locks``, and its
        ``transactions`` (checks) and ``delivery`` (schedule) sections, whichever it reports
        ({} when none)."""
        info = await self.broker_runtime_info(addr)
        out: dict[str, Any] = {}
        store = info.get("store")
        if isinstance(store, dict):
            for key in ("pending_half_messages", "scheduled_messages", "queue_locks"):
                if key in store:
                    out[key] = store[key]
        for section in ("transactions", "delivery"):
            value = info.get(section)
            if isinstance(value, dict) and value:
                out[section] = value
        return out

    async def group_messages(self, group: str, *, dead: bool = False, max_num: int = 128) -> list[Message]:
        """Messages waiting in ``%RETRY%<group>`` (or ``%DLQ%<group>``), oldest first per queue,
        at most ``max_num``; pulled from each queue's start, nothing committed."""
        topic = dlq_topic(group) if dead else retry_topic(group)
        out: list[Message] = []
        for q in await self.fetch_queues(topic):
            offset = await self.min_offset(q)
            while len(out) < max_num:
                result = await self.pull(q, offset, min(32, max_num - len(out)), 0)
                if not result.messages:
                    break
                out.extend(result.messages)
                offset = result.next_begin_offset
        return out[:max_num]

    async def all_topic_config(self, addr: str) -> Any:
        response = await call(
            self.instance.remoting,
            addr,
            RequestCode.GET_ALL_TOPIC_CONFIG,
            timeout_s=self.call_timeout_s,
            what="topic config",
        )
        return json_body(response, addr, "topic config")

    # --- membership (broker.membership): the group's master takes the changes ------------------
    async def _member_call(
        self,
        broker_name: str,
        code: int,
        headers: dict[str, HeaderValue],
        *,
        secret: bytes | None,
        timeout_s: float,
        via: str | None = None,
    ) -> dict[str, Any]:
        """One membership request to ``broker_name``'s master (``via``, a member's address, is
        asked first): a slave's NOT_MASTER is followed, a group electing its master waited for;
        signed with the cluster secret when given. A request sent and never answered is not
        sent again (it may have taken effect): the error says to look at member-list."""
        addrs = [via] if via else []
        try:
            groups = await self.broker_groups()
        except ClientError:
            if not addrs:
                raise
            groups = {}
        bd = groups.get(broker_name)
        if bd is not None:
            master = bd.broker_addrs.get(MASTER_ID)
            addrs += ([master] if master else []) + [a for _, a in sorted(bd.broker_addrs.items())]
        pending = list(dict.fromkeys(a for a in addrs if a))
        if not pending:
            known = ", ".join(sorted(groups)) or "none"
            raise NoBrokerAvailableError(
                f"broker group {broker_name} is not known to the nameserver (groups: {known}); "
                f"name one of its brokers with --broker-addr"
            )
        errors: list[str] = []
        addr = pending.pop(0)
        for _ in range(MEMBER_CALL_TRIES):
            request = RemotingCommand.request(code, dict(headers))
            if secret:
                sign_request(request, secret, int(time.time() * 1000))
            try:
                response = await self.instance.remoting.invoke_sync(addr, request, timeout_s)
            except RemotingTimeoutError as exc:
                raise ClientError(
                    f"{addr} did not answer within {timeout_s:g} s ({exc}): the change may still take "
                    f"effect; see member-list --broker-name {broker_name}"
                ) from None
            except RemotingError as exc:
                errors.append(f"{addr}: {exc}")
                if not pending:
                    raise NoBrokerAvailableError(
                        f"no broker of {broker_name} answered ({'; '.join(errors)})"
                    ) from None
                addr = pending.pop(0)
                continue
            if response.code == ResponseCode.SUCCESS:
                doc = json_body(response, addr, "membership")
                if not isinstance(doc, dict):
                    raise BrokerError(response.code, "membership answer is not a JSON object", addr)
                return doc
            if response.code == ResponseCode.MEMBERSHIP_REFUSED:
                retryable = response.header_bool("retryable", False)
                raise MembershipRefusedError(response.remark or "", addr, retryable)
            hint = response.header_str(B.MASTER_ADDR, "")
            if response.code == ResponseCode.NOT_MASTER and hint and hint != addr:
                addr = hint
                continue
            if response.code in (ResponseCode.NOT_MASTER, ResponseCode.SERVICE_NOT_AVAILABLE):
                await asyncio.sleep(MEMBER_RETRY_S)  # an election: the group names its master shortly
                continue
            raise BrokerError(response.code, response.remark or "", addr, "membership")
        raise NoBrokerAvailableError(
            f"broker group {broker_name}: no master took the request in {MEMBER_CALL_TRIES} tries"
        )

    async def group_members(self, broker_name: str, *, via: str | None = None) -> dict[str, Any]:
        """The group's configuration from its master: ``voters`` and ``learners`` (each member's
        role, broker and ledger address, broker id, lag), ``leader``, ``index``, ``committed``."""
        return await self._member_call(
            broker_name,
            RequestCode.GET_GROUP_MEMBERS,
            {},
            secret=None,
            timeout_s=self.call_timeout_s,
            via=via,
        )

    async def joining_ledger_addr(self, broker_name: str, node_id: str, broker_addr: str) -> str:
        """Ask the broker started with ``--join`` at ``broker_addr`` where its ledger node listens,
        checking it is ``node_id`` of ``broker_name``: the operator names only the broker address."""
        info = await self.broker_runtime_info(broker_addr)
        ledger = info.get("ledger")
        ledger = ledger if isinstance(ledger, dict) else {}
        name, nid, laddr = info.get("brokerName"), ledger.get("id"), ledger.get("address")
        if name != broker_name or nid != node_id:
            raise ClientError(
                f"the broker at {broker_addr} is {nid} of {name}, not {node_id} of {broker_name}"
            )
        if not isinstance(laddr, str) or not laddr:
            raise ClientError(f"the broker at {broker_addr} does not say where its ledger node listens")
        return laddr

    async def add_member(
        self,
        broker_name: str,
        node_id: str,
        broker_addr: str,
        ledger_addr: str | None = None,
        *,
        secret: bytes | None,
        promote: bool = True,
        wait_s: float = 60.0,
        via: str | None = None,
    ) -> dict[str, Any]:
        """Add the broker ``node_id`` (started with ``--join``; its ledger address asked of it
        unless given) to ``broker_name`` as a learner and, with ``promote``, make it a voter once
        it has caught up (within ``wait_s``); it then registers as a slave."""
        if ledger_addr is None:
            ledger_addr = await self.joining_ledger_addr(broker_name, node_id, broker_addr)
        headers: dict[str, HeaderValue] = {
            "nodeId": node_id,
            "brokerAddr": broker_addr,
            "ledgerAddr": ledger_addr,
            "promote": promote,
            "waitMs": int(wait_s * 1000),
        }
        return await self._member_call(
            broker_name,
            RequestCode.ADD_GROUP_MEMBER,
            headers,
            secret=secret,
            timeout_s=self.call_timeout_s + wait_s,
            via=via,
        )

    async def promote_member(
        self,
        broker_name: str,
        node_id: str,
        *,
        secret: bytes | None,
        wait_s: float = 60.0,
        via: str | None = None,
    ) -> dict[str, Any]:
        """Make learner ``node_id`` a voter once it has caught up (within ``wait_s``)."""
        return await self._member_call(
            broker_name,
            RequestCode.PROMOTE_GROUP_MEMBER,
            {"nodeId": node_id, "waitMs": int(wait_s * 1000)},
            secret=secret,
            timeout_s=self.call_timeout_s + wait_s,
            via=via,
        )

    async def remove_member(
        self, broker_name: str, node_id: str, *, secret: bytes | None, via: str | None = None
    ) -> dict[str, Any]:
        """Remove ``node_id`` from ``broker_name`` (the nameservers drop its route); refused if
        the voters left that answer would not be a majority."""
        return await self._member_call(
            broker_name,
            RequestCode.REMOVE_GROUP_MEMBER,
            {"nodeId": node_id},
            secret=secret,
            timeout_s=self.call_timeout_s + 10.0,
            via=via,
        )

    # --- messages -----------------------------------------------------------------------------------
    async def _group_addrs_by_name(self, broker_name: str) -> list[str]:
        addrs = self.instance.routes.broker_addrs(broker_name)
        if not addrs:
            await self.cluster_info()
            addrs = self.instance.routes.broker_addrs(broker_name)
        if not addrs:
            raise NoBrokerAvailableError(f"broker group {broker_name} is not known to the nameserver")
        return addrs

    async def view_message(self, msg_id: str) -> Message:
        """The message with this offset message id (store host + physical offset), as
        RocketMQ's ``queryMsgById``: asked of the host in the id first, then of the other
        brokers (the host's group mates hold the same log after a failover). A record counts
        only if it names the same store host, so another group's record at the same
        position is never taken for it."""
        try:
            host, position = parse_offset_msg_id(msg_id)
        except ValueError as exc:
            raise ClientError(str(exc)) from None
        info = await self.cluster_info()
        groups = sorted(info.broker_addr_table.values(), key=lambda bd: host not in bd.broker_addrs.values())
        addrs = [host] + [a for bd in groups for _, a in sorted(bd.broker_addrs.items()) if a != host]
        errors: list[str] = []
        for addr in addrs:
            try:
                response = await self.instance.remoting.invoke_sync(
                    addr, _request(RequestCode.VIEW_MESSAGE_BY_ID, {B.OFFSET: position}), self.call_timeout_s
                )
            except RemotingError as exc:
                errors.append(f"{addr}: {exc}")
                continue
            if response.code != ResponseCode.SUCCESS:
                errors.append(f"{addr}: {response_code_name(response.code)} {response.remark}")
                continue
            msgs = [m for m in _decode(response.body, "", addr) if m.store_host == host]
            if msgs:
                return msgs[0]
            errors.append(f"{addr}: holds another message at that position")
        raise NoBrokerAvailableError(f"message {msg_id}: not found ({'; '.join(errors)})")

    async def query_message_by_key(self, topic: str, key: str, max_num: int = 32) -> list[Message]:
        """Messages of ``topic`` with ``key`` among their keys, from every group serving it."""
        route = await self.instance.routes.route(topic, force=True)
        out: list[Message] = []
        for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
            addr = bd.select_broker_addr()
            if addr is None:
                continue
            response = await call(
                self.instance.remoting,
                addr,
                RequestCode.QUERY_MESSAGE,
                {B.TOPIC: topic, B.KEY: key, B.MAX_NUM: max_num},
                timeout_s=self.call_timeout_s,
                what="query message",
                ok_codes=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
            )
            if response.code == ResponseCode.SUCCESS:
                out.extend(_decode(response.body, bd.broker_name, addr))
        return out

    async def message_at(self, queue: MessageQueue, offset: int) -> Message | None:
        """The message at ``offset`` of ``queue``, or None if there is none."""
        result = await self.pull(queue, offset, 1, 0)
        for m in result.messages:
            if m.queue_offset == offset:
                return m
        return None

    async def consumer_progress(self, group: str, topic: str) -> list[QueueProgress]:
        """Per queue of ``topic``: the broker's max offset and ``group``'s committed offset."""
        queues = await self.fetch_queues(topic)
        reader = ConsumerBase(group, call_timeout_s=self.call_timeout_s, instance=self.instance)

        async def one(q: MessageQueue) -> QueueProgress:
            try:
                return QueueProgress(q, await self.max_offset(q), await reader.query_offset(q))
            except (ClientError, RemotingError) as exc:
                return QueueProgress(q, None, None, str(exc))

        return list(await asyncio.gather(*(one(q) for q in queues)))


def create_topic_headers(
    topic: str, read_queue_nums: int, write_queue_nums: int, perm: int, order: bool = False
) -> dict[str, HeaderValue]:
    """UPDATE_AND_CREATE_TOPIC's header, RocketMQ's CreateTopicRequestHeader as mqadmin's
    updateTopic fills it: an Apache broker requires every field but topicSysFlag."""
    return {
        B.TOPIC: topic,
        B.DEFAULT_TOPIC: B.DEFAULT_TOPIC_NAME,
        B.READ_QUEUE_NUMS: read_queue_nums,
        B.WRITE_QUEUE_NUMS: write_queue_nums,
        B.PERM: perm,
        B.TOPIC_FILTER_TYPE: B.SINGLE_TAG,
        B.TOPIC_SYS_FLAG: 0,
        B.ORDER: order,
    }


def _request(code: int, headers: dict[str, HeaderValue]) -> RemotingCommand:
    return RemotingCommand.request(code, headers)


def _decode(body: bytes | bytearray | memoryview, broker_name: str, addr: str) -> list[Message]:
    try:
        return B.decode_pull_messages(memoryview(body), broker_name)
    except ValueError as exc:
        raise BrokerError(ResponseCode.SUCCESS, f"malformed message body: {exc}", addr) from None
