"""Prometheus metrics of a ledger node.

Each node has its own registry, so several nodes (or a broker embedding one) can live in
one process, as they do in tests, without their series colliding.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

from .raft import Role

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class NodeMetrics:
    def __init__(self, node_id: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = {"node": node_id}
        r = self.registry
        self.term = Gauge("ledger_term", "Current Raft term", ["node"], registry=r).labels(**labels)
        self._role = Gauge("ledger_role", "1 for the role this node has now", ["node", "role"], registry=r)
        self.node_id = node_id
        self.commit_index = Gauge(
            "ledger_commit_index", "Highest committed index", ["node"], registry=r
        ).labels(**labels)
        self.first_index = Gauge("ledger_first_index", "First retained index", ["node"], registry=r).labels(
            **labels
        )
        self.disk_fault = Gauge(
            "ledger_disk_fault",
            "1 while the disk refuses writes (the node does not lead or vote)",
            ["node"],
            registry=r,
        ).labels(**labels)
        self.append_seconds = Histogram(
            "ledger_append_seconds",
            "From proposal to commitment of a client append",
            ["node"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.fsync_seconds = Histogram(
            "ledger_fsync_seconds",
            "Duration of one group-commit fsync",
            ["node"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.set_role(Role.FOLLOWER, 0)

    def set_role(self, role: Role, term: int) -> None:
        self.term.set(term)
        for r in Role:
            self._role.labels(node=self.node_id, role=r.value).set(1 if r is role else 0)

    def serve(self, host: str, port: int) -> None:
        """Expose ``/metrics`` over HTTP on ``host:port`` (a daemon thread of prometheus_client)."""
        start_http_server(port, addr=host, registry=self.registry)
