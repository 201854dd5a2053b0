"""Heartbeats and what a broker answers from them: the consumer groups' members (for
rebalancing), their subscriptions (for filtering), and the producers' connections (for
transaction checks). Everything a heartbeat carries is bounded (see ``broker.clients``)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from remoting.codes import ResponseCode
from remoting.exceptions import RemotingCommandError
from remoting.jsonbody import loads_bounded
from remoting.message import java_string_hash
from remoting.protocol import RemotingCommand

from .clients import ClientInfo, subscriptions_size
from .requests import RequestContext
from .system_topics import retry_topic

if TYPE_CHECKING:
    from remoting.connection import RemotingConnection

TAG, SQL92 = "TAG", "SQL92"  # RocketMQ's expression types
MAX_NAME_CHARS = 255  # a group, client id or topic name in a heartbeat
MAX_EXPRESSION_CHARS = 4096  # a subscription expression (tags or SQL92)
MAX_GROUPS_PER_HEARTBEAT = 256  # consumer groups (and producer groups) one heartbeat may name


def _subscription_data(topic: str, expr: str, kind: str = TAG) -> dict[str, Any]:
    """RocketMQ's SubscriptionData of an expression (tags: "*" for all, no tags, no codes)."""
    tags = sorted({t.strip() for t in expr.split("||")} - {""}) if kind == TAG else []
    if not tags or "*" in tags:
        tags = []
    return {
        "classFilterMode": False,
        "topic": topic,
        "subString": expr or "*",
        "tagsSet": tags,
        "codeSet": sorted({java_string_hash(t) for t in tags}),
        "subVersion": 0,
        "expressionType": kind,
    }


class Heartbeats:
    """HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, GET_CONSUMER_CONNECTION_LIST."""

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.clients = ctx.clients

    def heartbeat(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """RocketMQ's HeartbeatData: consumerDataSet[].groupName with subscriptionDataSet, and
        producerDataSet[].groupName. Bounded like everything from the network: the body's
        size and nesting, the groups and subscriptions one heartbeat may carry, and the
        table's entries and bytes (over them SYSTEM_BUSY, nothing kept)."""
        cfg = self.config
        if len(req.body) > cfg.max_heartbeat_bytes:
            raise RemotingCommandError(
                f"HEART_BEAT body of {len(req.body)} bytes exceeds max_heartbeat_bytes={cfg.max_heartbeat_bytes}"
            )
        doc = loads_bounded(bytes(req.body) or b"{}", "HEART_BEAT body")
        if not isinstance(doc, dict):
            raise RemotingCommandError("HEART_BEAT body must be a JSON object")
        client_id = doc.get("clientID") or conn.remote_addr
        if not isinstance(client_id, str) or len(client_id) > MAX_NAME_CHARS:
            raise RemotingCommandError(
                f"HEART_BEAT clientID must be a string of at most {MAX_NAME_CHARS} characters"
            )
        consumers = _bounded_list(doc.get("consumerDataSet"), "consumerDataSet", MAX_GROUPS_PER_HEARTBEAT)
        producers = _bounded_list(doc.get("producerDataSet"), "producerDataSet", MAX_GROUPS_PER_HEARTBEAT)
        now = time.monotonic()
        for i, consumer in enumerate(consumers):
            group = consumer.get("groupName") if isinstance(consumer, dict) else None
            if not isinstance(group, str) or not 0 < len(group) <= MAX_NAME_CHARS:
                raise RemotingCommandError(f"HEART_BEAT consumerDataSet[{i}].groupName must be a group name")
            subs, sql_topics = self._subscriptions(consumer.get("subscriptionDataSet"), i)
            info = ClientInfo(
                now,
                subs,
                conn.remote_addr,
                req.language,
                req.version,
                _short_text(consumer.get("consumeType")),
                _short_text(consumer.get("messageModel")),
                _short_text(consumer.get("consumeFromWhere")),
                subscriptions_size(subs),
                sql_topics,
            )
            if not self.clients.touch_consumer(group, client_id, info):
                return self._clients_full(req)
            self.ctx.ensure_topic(retry_topic(group), 1, now)
        for producer in producers:
            group = producer.get("groupName") if isinstance(producer, dict) else None
            if isinstance(group, str) and 0 < len(group) <= MAX_NAME_CHARS:
                if not self.clients.touch_producer(group, client_id, now, conn):
                    return self._clients_full(req)
        return req.make_response()

    def _subscriptions(self, raw: Any, i: int) -> tuple[dict[str, str], frozenset[str]]:
        """A consumer's topic -> expression, each checked against the heartbeat's bounds, and
        the topics whose expression is SQL92."""
        subs: dict[str, str] = {}
        sql: set[str] = set()
        limit = self.config.max_subscriptions_per_client
        for j, sub in enumerate(_bounded_list(raw, f"consumerDataSet[{i}].subscriptionDataSet", limit)):
            if not isinstance(sub, dict) or not isinstance(sub.get("topic"), str):
                continue
            topic, expr = sub["topic"], sub.get("subString") or "*"
            if not isinstance(expr, str) or len(expr) > MAX_EXPRESSION_CHARS or len(topic) > MAX_NAME_CHARS:
                raise RemotingCommandError(
                    f"HEART_BEAT consumerDataSet[{i}].subscriptionDataSet[{j}]: a topic of at most "
                    f"{MAX_NAME_CHARS} and an expression of at most {MAX_EXPRESSION_CHARS} characters"
                )
            subs[topic] = expr
            if str(sub.get("expressionType") or TAG).upper() == SQL92:
                sql.add(topic)
        return subs, frozenset(sql)

    def _clients_full(self, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(
            ResponseCode.SYSTEM_BUSY,
            f"[REJECTREQUEST]heartbeat table full: {self.config.max_heartbeat_clients} clients "
            f"(max_heartbeat_clients) or {self.config.max_heartbeat_table_bytes} bytes "
            "(max_heartbeat_table_bytes); try again later",
        )

    def unregister_client(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """UNREGISTER_CLIENT (35): the client left its groups; the others rebalance at once."""
        client_id = req.header_str("clientID")
        group = req.header_str("consumerGroup", "")
        if group:
            self.clients.remove_consumer(group, client_id)
        producer_group = req.header_str("producerGroup", "")
        if producer_group:
            self.clients.remove_producer(producer_group, client_id)
        return req.make_response()

    def consumer_connections(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST (203): the group's live clients and their subscriptions
        (RocketMQ's ConsumerConnection; ``mqadmin consumerConnection``); CONSUMER_NOT_ONLINE
        when none has sent a heartbeat lately, as RocketMQ answers."""
        group = req.header_str("consumerGroup")
        now = time.monotonic()
        live = list(self.clients.live_consumers(group, now))
        if not live:
            return req.make_response(
                ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group {group!r} is not online"
            )
        subscriptions: dict[str, tuple[str, str]] = {}
        for _, info in live:
            for topic, expr in info.subscriptions.items():
                subscriptions[topic] = (expr, SQL92 if topic in info.sql_topics else TAG)
        newest = max(live, key=lambda item: item[1].seen)[1]
        doc = {
            "connectionSet": [
                {"clientId": cid, "clientAddr": info.addr, "language": info.language, "version": info.version}
                for cid, info in sorted(live)
            ],
            "subscriptionTable": {
                topic: _subscription_data(topic, *sub) for topic, sub in sorted(subscriptions.items())
            },
            "consumeType": newest.consume_type,
            "messageModel": newest.message_model,
            "consumeFromWhere": newest.consume_from_where,
        }
        return req.make_response(body=json.dumps(doc, separators=(",", ":")).encode())

    def consumer_list(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        group = req.header_str("consumerGroup")
        live = sorted(cid for cid, _ in self.clients.live_consumers(group, time.monotonic()))
        return req.make_response(body=json.dumps({"consumerIdList": live}).encode())

    def group_subscription(self, group: str, topic: str) -> tuple[str, str]:
        """(expression, type) the group's consumers subscribed with (from their heartbeats);
        ('*', TAG) if none did."""
        for info in self.clients.consumers.get(group, {}).values():
            expr = info.subscriptions.get(topic)
            if expr:
                return expr, SQL92 if topic in info.sql_topics else TAG
        return "*", TAG


def _bounded_list(value: Any, what: str, limit: int) -> list[Any]:
    """A JSON list from a request of at most ``limit`` items ([] for none); refused otherwise."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > limit:
        raise RemotingCommandError(f"HEART_BEAT {what} must be a list of at most {limit} items")
    return value


def _short_text(value: Any) -> str:
    """A descriptive field of a heartbeat (consumeType, ...), kept short whatever was sent."""
    return value[:MAX_NAME_CHARS] if isinstance(value, str) else ""
