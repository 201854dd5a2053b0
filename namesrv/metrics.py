"""Prometheus metrics of a nameserver, computed at scrape time.

A custom collector reads the counters the server already keeps instead of updating
prometheus objects per request, so serving a route costs nothing extra. Each controller has
its own registry, so several nameservers in one process (tests) do not collide.
The HTTP endpoint runs in prometheus-client's thread and only copies plain ints and dicts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from remoting.codes import request_code_name

if TYPE_CHECKING:
    from namesrv.processor import NamesrvProcessor
    from namesrv.routeinfo import RouteInfoManager
    from remoting.server import RemotingServer

log = logging.getLogger("namesrv.metrics")


class Observed(Protocol):
    """What the collector reads of a nameserver (its controller), without importing it."""

    server: RemotingServer
    processor: NamesrvProcessor
    routes: RouteInfoManager
    brokers_expired: int
    brokers_disconnected: int


class NamesrvCollector(Collector):
    def __init__(self, controller: Observed) -> None:
        self.controller = controller

    def collect(self) -> Iterator[Metric]:
        c = self.controller
        server = c.server
        requests = CounterMetricFamily(
            "namesrv_requests", "Requests received, by request code", labels=["code"]
        )
        for code, n in sorted(dict(server.dispatcher.requests_by_code).items()):
            requests.add_metric([request_code_name(code)], n)
        yield requests
        yield CounterMetricFamily(
            "namesrv_request_errors",
            "Requests answered BAD_REQUEST or SYSTEM_ERROR",
            value=server.dispatcher.errors,
        )
        yield CounterMetricFamily(
            "namesrv_requests_unsupported",
            "Requests with a code this server does not serve",
            value=server.dispatcher.unsupported,
        )
        stats = server.stats
        yield GaugeMetricFamily(
            "namesrv_connections", "Open client and broker connections", value=server.connection_count
        )
        yield CounterMetricFamily(
            "namesrv_connections_opened", "Connections accepted", value=stats.connections_opened
        )
        yield CounterMetricFamily(
            "namesrv_bad_frames", "Frames refused (too large, CRC, header)", value=stats.bad_frames
        )
        yield CounterMetricFamily(
            "namesrv_protocol_errors",
            "Connections dropped for an undecodable stream",
            value=stats.protocol_errors,
        )
        ps = c.processor.stats
        yield CounterMetricFamily(
            "namesrv_broker_registrations", "REGISTER_BROKER requests served", value=ps.registrations
        )
        lookups = CounterMetricFamily("namesrv_route_lookups", "Route lookups by outcome", labels=["result"])
        lookups.add_metric(["found"], ps.route_found)
        lookups.add_metric(["not_found"], ps.route_not_found)
        yield lookups
        yield CounterMetricFamily(
            "namesrv_brokers_expired", "Brokers removed by the inactivity scan", value=c.brokers_expired
        )
        yield CounterMetricFamily(
            "namesrv_brokers_disconnected",
            "Brokers removed because their connection closed",
            value=c.brokers_disconnected,
        )
        for name, value in c.routes.counts().items():
            yield GaugeMetricFamily(
                f"namesrv_{name}", f"Route table: number of {name.replace('_', ' ')}", value=value
            )


class MetricsEndpoint:
    """The /metrics HTTP server of one controller; port 0 means disabled."""

    def __init__(self, controller: Observed, host: str, port: int) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(NamesrvCollector(controller))
        self.host = host
        self.port = port
        self._server = None
        self._thread = None

    def start(self) -> None:
        if self.port == 0:
            return
        self._server, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        self.port = self._server.server_port
        log.info("metrics endpoint listening", extra={"host": self.host, "port": self.port})

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
