"""Every system under test by name: which workloads it runs, its backends, its clients in a worker.

A new system is one module (its backend and client adapters) and one entry here. What a
run may combine with what (``jepsen.run.validate``) is read from these entries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jepsen.systems import broker, ledger, proxy_system, rocketmq, rocketmq_rust, syncobj
from jepsen.systems.base import Backend, Unsupported
from jepsen.systems.clients import ClientSource
from jepsen.systems.docker import docker_broker_backend


@dataclass(frozen=True)
class System:
    """One system under test as a run sees it.

    ``backends``: ``--backend`` name -> how its group is made (``base_dir`` and the run's
    ``system_options``); ``endpoints``: its clients rebuilt in a worker process from the
    backend's ``client_spec``; ``placement``: whether it takes ``--groups``, ``--host-base``
    and ``--port-base``; ``backend_refusal``: why it has no other backend than its own, said
    in its own words (None: the backend's general reason applies).
    """

    name: str
    workloads: tuple[str, ...]
    backends: Mapping[str, Callable[..., Backend]]
    endpoints: Callable[[dict[str, Any]], ClientSource]
    placement: bool = False
    backend_refusal: str | None = None


#: in the order ``--system`` lists them
SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System(
            ledger.SYSTEM, ("log", "register"), {"local": ledger.LocalLedgerBackend}, ledger.LedgerEndpoints
        ),
        System(syncobj.SYSTEM, ("log",), {"local": syncobj.LocalSyncObjBackend}, syncobj.SyncObjEndpoints),
        System(
            broker.SYSTEM,
            ("queue", *broker.SEMANTICS_WORKLOADS),
            {"local": broker.local_broker_backend, "docker": docker_broker_backend},
            broker.QueueEndpoints,
            placement=True,
        ),
        System(
            rocketmq.SYSTEM,
            ("queue",),
            {"local": rocketmq.RocketMQBackend},
            broker.QueueEndpoints,
            backend_refusal=f"--system {rocketmq.SYSTEM} tests a cluster you already run: leave --backend at local",
        ),
        System(
            rocketmq_rust.SYSTEM,
            ("queue",),
            {"local": rocketmq_rust.RocketMQRustBackend},
            broker.QueueEndpoints,
            backend_refusal=f"--system {rocketmq_rust.SYSTEM} runs local processes: leave --backend at local",
        ),
        System(
            proxy_system.SYSTEM,
            ("queue",),
            {"local": proxy_system.ProxyBrokerBackend},
            proxy_system.ProxyEndpoints,
            backend_refusal=f"--system {proxy_system.SYSTEM} runs local processes: leave --backend at local",
        ),
    )
}


def make_backend(name: str, system: str, base_dir: Path, **options: Any) -> Backend:
    """The ``name`` backend (``--backend``) of ``system``, given the run's system options.

    The combination is assumed valid (``jepsen.run.validate`` says why one is not); an
    unknown one is still refused here rather than half made.
    """
    spec = SYSTEMS.get(system)
    if spec is None:
        raise Unsupported(f"unknown system {system!r}")
    make = spec.backends.get(name)
    if make is None:
        raise Unsupported(spec.backend_refusal or f"--system {system} has no {name} backend")
    return make(base_dir, **options)


def endpoints_from_spec(spec: dict[str, Any]) -> ClientSource:
    """The client source a worker process builds from a backend's ``client_spec``."""
    system = spec.get("system")
    entry = SYSTEMS.get(str(system))
    if entry is None:
        raise Unsupported(f"unknown system {system!r} in a client spec")
    try:
        return entry.endpoints(spec)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Unsupported(f"bad client spec for {system!r}: {type(exc).__name__}: {exc}") from None
