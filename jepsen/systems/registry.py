"""Which backend runs which system: the one module that knows every backend.

``backends`` holds the abstract :class:`~jepsen.systems.base.Backend` and the local
ledger group; the broker (``queue``), pysyncobj (``syncobj``) and Docker backends build on
it. Choosing among them lives here, above all of them, so that none of those modules has
to import another to be found (an import cycle otherwise: backends -> queue -> workloads
-> backends).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jepsen.systems.base import Backend, LocalLedgerBackend, Unsupported
from jepsen.systems.clients import (
    LedgerLogClient,
    LedgerRegisterClient,
    LogClient,
    RegisterClient,
    RegisterReplica,
)
from jepsen.workloads.base import ClientSource


def make_backend(name: str, system: str, base_dir: Path, **kw: Any) -> Backend:
    """The backend for ``--backend`` and the system under test (``ledger``, ``pysyncobj``, ``broker``,
    ``rocketmq``: a RocketMQ-protocol cluster the user runs, reached through ``namesrv=...``, or
    ``rocketmq-rust``: RocketMQ-Rust's binaries run as local processes)."""
    if system == "rocketmq":
        if name != "local":
            raise Unsupported("--system rocketmq tests a cluster you already run: leave --backend at local")
        from jepsen.systems.rocketmq import RocketMQBackend

        return RocketMQBackend(base_dir, **kw)
    if system == "rocketmq-rust":
        if name != "local":
            raise Unsupported("--system rocketmq-rust runs local processes: leave --backend at local")
        from jepsen.systems.rocketmq_rust import RocketMQRustBackend

        return RocketMQRustBackend(base_dir, **kw)
    if name == "docker":
        if any(kw.get(k) is not None for k in ("host_base", "port_base")):
            raise Unsupported(
                "--host-base and --port-base apply to the local backend only "
                "(the docker group has its own network and publishes free ports)"
            )
        for k in ("host_base", "port_base"):
            kw.pop(k, None)
        kw["groups"] = int(kw.pop("groups", 1) or 1)
        from jepsen.docker.layout import MAX_GROUPS

        if kw["groups"] > MAX_GROUPS:
            raise Unsupported(f"the docker group holds at most {MAX_GROUPS} broker groups (one /24 network)")
        if system != "broker":
            raise Unsupported("the docker group (docker-compose.yml) runs brokers: use --workload queue")
        from jepsen.systems.docker import DockerBrokerBackend

        return DockerBrokerBackend(base_dir, **kw)
    if name != "local":
        raise Unsupported(f"unknown backend {name!r}")
    if system != "broker" and any(k in kw for k in ("groups", "host_base", "port_base")):
        raise Unsupported(
            "--groups, --host-base and --port-base apply to --system broker (the queue workload)"
        )
    if system == "ledger":
        return LocalLedgerBackend(base_dir, **kw)
    if system == "pysyncobj":
        from jepsen.systems.syncobj import LocalSyncObjBackend

        return LocalSyncObjBackend(base_dir, **kw)
    if system == "broker":
        groups = int(kw.pop("groups", 1) or 1)
        host_base, port_base = kw.pop("host_base", None), kw.pop("port_base", None)
        if groups == 1 and host_base is None and port_base is None:
            from jepsen.systems.broker import LocalBrokerBackend

            return LocalBrokerBackend(base_dir, **kw)
        from jepsen.ports import DEFAULT_HOST_BASE, PortPlan
        from jepsen.systems.broker import LocalBrokerGroupsBackend

        ports = PortPlan(host_base or DEFAULT_HOST_BASE, port_base)
        return LocalBrokerGroupsBackend(base_dir, groups=groups, ports=ports, **kw)
    raise Unsupported(f"unknown system {system!r}")


class LedgerEndpoints:
    """The clients of a local ledger group, built from its ``client_spec`` in a worker process."""

    system = "ledger"

    def __init__(self, spec: dict[str, Any]) -> None:
        self.addresses = [str(a) for a in spec["addresses"]]
        self.direct = {str(k): str(v) for k, v in spec["direct"].items()}
        self.names = {str(k): str(v) for k, v in spec["names"].items()}
        self.client_timeout = float(spec["timeout"])

    def log_client(self) -> LogClient:
        return LedgerLogClient(self.addresses, self.direct, self.names, timeout=self.client_timeout)

    def register_client(self, replica: RegisterReplica) -> RegisterClient:
        return LedgerRegisterClient(
            self.addresses, self.direct, self.names, replica, timeout=self.client_timeout
        )

    def queue_client(self) -> Any:
        raise Unsupported("the ledger group runs the log and register workloads")


def endpoints_from_spec(spec: dict[str, Any]) -> ClientSource:
    """The client source a worker process builds from a backend's ``client_spec``."""
    system = spec.get("system")
    try:
        if system == "ledger":
            return LedgerEndpoints(spec)
        if system in ("broker", "rocketmq"):
            from jepsen.systems.broker import QueueEndpoints

            return QueueEndpoints(spec)
        if system == "pysyncobj":
            from jepsen.systems.syncobj import SyncObjEndpoints

            return SyncObjEndpoints(spec)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Unsupported(f"bad client spec for {system!r}: {type(exc).__name__}: {exc}") from None
    raise Unsupported(f"unknown system {system!r} in a client spec")
