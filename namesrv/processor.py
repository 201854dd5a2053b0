"""Request processors of the nameserver (RocketMQ's DefaultRequestProcessor and ClientRequestProcessor).

Every handler is synchronous: the route table lives on the event loop and nothing here waits
for I/O, so the dispatcher answers without creating a task. Malformed requests raise
RemotingCommandError, which the dispatcher turns into BAD_REQUEST with the reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from common.settings import ConfigError, parse_host_port
from namesrv.config import NamesrvConfig
from namesrv.kvconfig import ORDER_TOPIC_CONFIG, KVConfigError, KVConfigManager, KVPersistError
from namesrv.routeinfo import RouteInfoManager, TopicConfigSource
from remoting import headers as H
from remoting.codes import RequestCode, ResponseCode
from remoting.dispatcher import Processor
from remoting.exceptions import RemotingCommandError
from remoting.jsonbody import dump_body, inflate, load_body
from remoting.protocol import RemotingCommand
from remoting.topic import DataVersion, LazyTopicConfigWrapper, TopicConfigWrapper, topic_name_error

log = logging.getLogger("namesrv.processor")


class NamesrvStats:
    """Counters beyond per-code request counts, exported as metrics."""

    __slots__ = ("registrations", "unregistrations", "route_found", "route_not_found", "version_queries")

    def __init__(self) -> None:
        self.registrations = 0
        self.unregistrations = 0
        self.route_found = 0
        self.route_not_found = 0
        self.version_queries = 0


def _broker_addr(request: RemotingCommand) -> str:
    addr = request.header_str(H.BROKER_ADDR)
    try:
        parse_host_port(H.BROKER_ADDR, addr)
    except ConfigError as exc:
        raise RemotingCommandError(f"header {exc}") from None
    return addr


def _name(request: RemotingCommand, key: str) -> str:
    value = request.header_str(key)
    if not value or len(value) > 255:
        raise RemotingCommandError(f"header '{key}' must be 1..255 chars, got {value!r}")
    return value


def _topic(request: RemotingCommand) -> str:
    topic = request.header_str(H.TOPIC)
    problem = topic_name_error(topic)
    if problem:
        raise RemotingCommandError(f"header 'topic': {problem}")
    return topic


class NamesrvProcessor:
    """Handlers bound to one route table, KV area and clock."""

    def __init__(
        self,
        config: NamesrvConfig,
        routes: RouteInfoManager,
        kv: KVConfigManager,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.routes = routes
        self.kv = kv
        self.clock = clock
        self.stats = NamesrvStats()
        self._route_cache: dict[str, bytes] = {}
        self._route_cache_generation: tuple[int, int] = (-1, -1)

    def handlers(self) -> dict[int, Processor]:
        """Request code -> handler, for RemotingServer.register_processor."""
        return {
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.QUERY_DATA_VERSION: self.query_data_version,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route_info_by_topic,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_broker_cluster_info,
            RequestCode.PUT_KV_CONFIG: self.put_kv_config,
            RequestCode.GET_KV_CONFIG: self.get_kv_config,
            RequestCode.DELETE_KV_CONFIG: self.delete_kv_config,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self.get_kvlist_by_namespace,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self.wipe_write_perm_of_broker,
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self.add_write_perm_of_broker,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topic_list,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic_in_namesrv,
            RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS: self.get_system_topic_list,
            RequestCode.GET_NAMESRV_CONFIG: self.get_namesrv_config,
        }

    # --- brokers --------------------------------------------------------------------------
    def register_broker(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        cluster = _name(request, H.CLUSTER_NAME)
        broker_name = _name(request, H.BROKER_NAME)
        broker_addr = _broker_addr(request)
        broker_id = request.header_int(H.BROKER_ID, min_value=0, max_value=1 << 31)
        ha_addr = request.header_str(H.HA_SERVER_ADDR, "")
        if request.body:
            raw = request.body
            if request.header_bool(H.COMPRESSED, False):
                raw = inflate(raw, self.config.max_register_body_bytes, "REGISTER_BROKER")
            wrapper: TopicConfigSource = LazyTopicConfigWrapper.from_json(
                load_body(raw, "REGISTER_BROKER"), "REGISTER_BROKER body"
            )
        else:
            wrapper = TopicConfigWrapper()  # RocketMQ: no body means version 0/0 and no topics
        result = self.routes.register_broker(
            cluster, broker_addr, broker_name, broker_id, ha_addr, wrapper, conn, self.clock()
        )
        self.stats.registrations += 1
        headers: dict[str, Any] = {}
        if result.master_addr:
            headers[H.MASTER_ADDR] = result.master_addr
        if result.ha_server_addr:
            headers[H.HA_SERVER_ADDR] = result.ha_server_addr
        kv = self.kv.get_namespace(ORDER_TOPIC_CONFIG) or {}
        return request.make_response(headers=headers, body=dump_body({"table": kv}))

    def unregister_broker(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        existed = self.routes.unregister_broker(
            _name(request, H.CLUSTER_NAME),
            _broker_addr(request),
            _name(request, H.BROKER_NAME),
            request.header_int(H.BROKER_ID, min_value=0),
        )
        self.stats.unregistrations += 1
        return request.make_response(remark="" if existed else "broker was not registered")

    def query_data_version(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        broker_addr = _broker_addr(request)
        version = (
            DataVersion.from_json(load_body(request.body, "QUERY_DATA_VERSION"), "QUERY_DATA_VERSION body")
            if request.body
            else DataVersion()
        )
        changed = self.routes.is_broker_topic_config_changed(broker_addr, version)
        if not changed:
            # The query doubles as a heartbeat, so a broker that skips registering stays live.
            self.routes.update_broker_info_update_timestamp(broker_addr, self.clock())
        self.stats.version_queries += 1
        ours = self.routes.query_broker_topic_config(broker_addr)
        return request.make_response(
            headers={H.CHANGED: changed}, body=dump_body(ours.to_json()) if ours is not None else b""
        )

    # --- clients -------------------------------------------------------------------------
    def get_route_info_by_topic(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        # Producers and consumers poll routes constantly while the table changes rarely, so the
        # encoded answer is cached until the route table or the KV area next changes.
        topic = request.headers.get(H.TOPIC)
        generation = (self.routes.generation, self.kv.generation)
        if generation != self._route_cache_generation:
            self._route_cache.clear()
            self._route_cache_generation = generation
        body = self._route_cache.get(topic) if isinstance(topic, str) else None
        if body is None:
            topic = _topic(request)
            route = self.routes.pickup_topic_route_data(topic)
            if route is None:
                self.stats.route_not_found += 1
                return request.make_response(
                    ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}"
                )
            if self.config.order_message_enable:
                route.order_topic_conf = self.kv.get(ORDER_TOPIC_CONFIG, topic)
            body = dump_body(route.to_json())
            self._route_cache[topic] = body
        self.stats.route_found += 1
        return request.make_response(body=body)

    def get_broker_cluster_info(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(body=dump_body(self.routes.get_all_cluster_info().to_json()))

    def get_all_topic_list(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(body=dump_body({"topicList": self.routes.get_all_topic_list()}))

    def get_topics_by_cluster(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        cluster = _name(request, "cluster")
        topics = self.routes.get_topics_by_cluster(cluster)
        if topics is None:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND, f"cluster {cluster} has no brokers")
        return request.make_response(body=dump_body({"topicList": topics}))

    def get_system_topic_list(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        """RocketMQ counts every cluster name and broker name as a system topic (brokers create
        topics so named); ``brokerAddr`` is a master that can say more, as mqadmin expects."""
        info = self.routes.get_all_cluster_info()
        topics = sorted(set(info.cluster_addr_table) | set(info.broker_addr_table))
        master = next((bd.master_addr for bd in info.broker_addr_table.values() if bd.master_addr), None)
        doc: dict[str, Any] = {"topicList": topics}
        if master:
            doc["brokerAddr"] = master
        return request.make_response(body=dump_body(doc))

    def get_namesrv_config(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        """The settings as Java properties text (``key=value`` lines), as mqadmin getNamesrvConfig prints them."""
        lines = [
            f"{name}={'******' if 'secret' in name and value else value}"  # never hand out a secret
            for name, value in sorted(vars(self.config).items())
        ]
        return request.make_response(body=("\n".join(lines) + "\n").encode())

    def delete_topic_in_namesrv(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        topic = _topic(request)
        cluster = request.header_str(H.CLUSTER_NAME, None)
        if not self.routes.delete_topic(topic, cluster):
            return request.make_response(
                ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} is not in this name server"
            )
        log.info(
            "topic deleted by admin", extra={"topic": topic, "cluster": cluster, "peer": conn.remote_addr}
        )
        return request.make_response()

    def wipe_write_perm_of_broker(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        count = self.routes.set_write_perm_of_broker(_name(request, H.BROKER_NAME), False)
        return request.make_response(headers={H.WIPE_TOPIC_COUNT: count})

    def add_write_perm_of_broker(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        count = self.routes.set_write_perm_of_broker(_name(request, H.BROKER_NAME), True)
        return request.make_response(headers={H.ADD_TOPIC_COUNT: count})

    # --- KV config ---------------------------------------------------------------------
    def put_kv_config(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        try:
            self.kv.put(
                request.header_str(H.NAMESPACE), request.header_str(H.KEY), request.header_str(H.VALUE)
            )
        except KVPersistError as exc:
            log.error("kv put not persisted", extra={"error": str(exc)})
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"{exc}; the value was not stored")
        except KVConfigError as exc:
            raise RemotingCommandError(str(exc)) from None
        return request.make_response()

    def get_kv_config(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        namespace, key = request.header_str(H.NAMESPACE), request.header_str(H.KEY)
        value = self.kv.get(namespace, key)
        if value is None:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace} Key: {key}"
            )
        return request.make_response(headers={H.VALUE: value})

    def delete_kv_config(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        namespace, key = request.header_str(H.NAMESPACE), request.header_str(H.KEY)
        try:
            deleted = self.kv.delete(namespace, key)
        except KVPersistError as exc:
            log.error("kv delete not persisted", extra={"error": str(exc)})
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"{exc}; the item was not deleted")
        if not deleted:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace} Key: {key}"
            )
        return request.make_response()

    def get_kvlist_by_namespace(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        namespace = request.header_str(H.NAMESPACE)
        table = self.kv.get_namespace(namespace)
        if table is None:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}"
            )
        return request.make_response(body=dump_body({"table": table}))
