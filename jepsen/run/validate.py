"""What combines with what: every rule about systems, workloads, backends, faults and options, in one place.

A run is checked here before anything starts, so a combination that cannot work is one clear
message instead of a half-started group. The systems' own facts (which workloads each runs,
which backends it has, whether it takes ``--groups``) come from ``systems.registry``, the
workloads' from ``workloads.registry``; the rules that read them are all here. What a
backend can break is asked of each fault (``faults.registry.check_faults``) once the
backend exists. Functions named ``*_refusal`` return the reason (None: fine), so that
``jepsen run`` can print it in the form it always has; :func:`validated` raises it.
"""

from __future__ import annotations

from collections.abc import Iterable

from jepsen.docker.layout import MAX_GROUPS as DOCKER_MAX_GROUPS
from jepsen.run.config import DEFAULT_SYSTEM, RunConfig, resolve_load
from jepsen.systems.base import Unsupported
from jepsen.systems.broken import adapters_for
from jepsen.systems.registry import SYSTEMS
from jepsen.workloads.registry import WORKLOADS

#: the broker placement options (``--groups``, ``--host-base``, ``--port-base``) as backend options
PLACEMENT = ("groups", "host_base", "port_base")


def _either(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


#: the workloads the docker group runs (the broker system's: the queue and the held-message ones)
DOCKER_WORKLOADS = [w for s in SYSTEMS.values() if "docker" in s.backends for w in s.workloads]
#: a backend's own reason to refuse a system that does not offer it
BACKEND_REFUSALS = {
    "docker": f"the docker group (docker-compose.yml) runs brokers: use --workload {_either(DOCKER_WORKLOADS)}"
}
#: ``--system rocketmq``'s options: its cluster, the nodes its hooks act on, its topic
EXTERNAL_OPTIONS = (
    "namesrv",
    "nodes",
    "kill_cmd",
    "restart_cmd",
    "pause_cmd",
    "resume_cmd",
    "topic",
    "broker_name",
)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def system_for(workload: str, system: str) -> str:
    """The system a run of ``workload`` tests: ``system``, unless that is the default one and
    does not run the workload (the queue workload then runs on the first system that does)."""
    spec = SYSTEMS.get(system)
    if system != DEFAULT_SYSTEM or spec is None or workload in spec.workloads:
        return system
    return next((name for name, s in SYSTEMS.items() if workload in s.workloads), system)


def _runs_only(workload: str) -> bool:
    """Whether every system that runs ``workload`` runs nothing else (the queue systems)."""
    runners = [s for s in SYSTEMS.values() if workload in s.workloads]
    return bool(runners) and all(s.workloads == (workload,) for s in runners)


def workload_refusal(system: str, workload: str) -> str | None:
    """Why ``system`` does not run ``workload``."""
    if workload not in WORKLOADS:
        return f"unknown workload {workload!r}; available: {', '.join(WORKLOADS)}"
    spec = SYSTEMS.get(system)
    if spec is None:
        return f"unknown system {system!r}"
    if workload in spec.workloads:
        return None
    # a system whose workload only systems of its kind run (the queue systems) is refused in
    # that workload's words, any other in its own
    exclusive = next((w for w in spec.workloads if _runs_only(w)), None)
    if exclusive is not None:
        runners = [name for name, s in SYSTEMS.items() if exclusive in s.workloads]
        return f"the {exclusive} workload runs on the {_and(runners)} systems, and they run only it"
    plural = "s" if len(spec.workloads) > 1 else ""
    return f"the {system} system runs the {_and(list(spec.workloads))} workload{plural} only"


def placement_refusal(system: str, *, system_given: bool = True) -> str | None:
    """Why ``system`` takes no ``--groups``, ``--host-base``, ``--port-base`` or ``--addresses``
    (the default system is let through: a queue workload moves the run to the broker)."""
    spec = SYSTEMS.get(system)
    if spec is not None and (spec.placement or (system == DEFAULT_SYSTEM and not system_given)):
        return None
    placed = [name for name, s in SYSTEMS.items() if s.placement]
    return f"--groups, --host-base, --port-base and --addresses apply to --system {_and(placed)} only"


def external_refusal(system: str, given: Iterable[str]) -> str | None:
    """Why the options ``given`` (of :data:`EXTERNAL_OPTIONS`) do not go with ``system``, or why
    ``system`` needs one that is missing."""
    given = set(given)
    if system == "rocketmq":
        return (
            None
            if "namesrv" in given
            else "--system rocketmq needs --namesrv HOST:PORT (your cluster's nameserver)"
        )
    if system == "rocketmq-rust":
        if given - {"topic"}:
            return (
                "--system rocketmq-rust starts its own cluster: --namesrv, --nodes, --broker-name and "
                "the --*-cmd hooks apply to --system rocketmq only"
            )
        return None
    if given:
        return (
            "--namesrv, --nodes, --topic, --broker-name and the --*-cmd hooks apply to --system rocketmq only"
        )
    return None


def backend_refusal(cfg: RunConfig) -> str | None:
    """Why ``cfg.system`` cannot run on ``cfg.backend`` with its ``system_options``."""
    spec = SYSTEMS[cfg.system]
    options = cfg.system_options
    offered = cfg.backend in spec.backends
    if not offered and spec.backend_refusal:
        return spec.backend_refusal
    if cfg.backend == "docker":
        if any(options.get(k) is not None for k in ("host_base", "port_base")):
            return (
                "--host-base and --port-base apply to the local backend only "
                "(the docker group has its own network and publishes free ports)"
            )
        if int(options.get("groups") or 1) > DOCKER_MAX_GROUPS:
            return f"the docker group holds at most {DOCKER_MAX_GROUPS} broker groups (one /24 network)"
    if not offered:
        return BACKEND_REFUSALS.get(cfg.backend, f"unknown backend {cfg.backend!r}")
    if not spec.placement and any(k in options for k in PLACEMENT):
        placed = [name for name, s in SYSTEMS.items() if s.placement]
        return f"--groups, --host-base and --port-base apply to --system {_and(placed)} (the queue workload)"
    return None


def load_refusal(cfg: RunConfig) -> str | None:
    """Why the run's load does not fit its workload (once ``resolve_load`` filled it in)."""
    if (cfg.send_batch or 1) > 1 and not WORKLOADS[cfg.workload].batches_sends:
        batching = [name for name, w in WORKLOADS.items() if w.batches_sends]
        return f"--send-batch applies to the {_and(batching)} workload only"
    if cfg.workers and (cfg.clients or 0) < cfg.workers:
        return f"{cfg.workers} workers need at least as many clients, not {cfg.clients}"
    if cfg.broken_adapter:
        table = adapters_for(WORKLOADS[cfg.workload].wraps)
        if cfg.broken_adapter not in table:
            return (
                f"no broken adapter {cfg.broken_adapter!r} for the {cfg.workload} workload; "
                f"available: {', '.join(table)}"
            )
    return None


def nemesis_refusal(cfg: RunConfig) -> str | None:
    """Why the run's faults do not combine with ``membership``: ``disk-full``'s small disks
    exist for the first members only. (The link faults do combine: on the local backend the
    link proxy fronts every link of the pool, spares included, and every node dials every
    other through it, a ledger node by ``dial``, a broker by ``ledger_dial``.)"""
    if "membership" in cfg.nemesis and "disk-full" in cfg.nemesis:
        return (
            "--nemesis membership does not combine with disk-full: the small disks are laid out for "
            "the first members before the run, and members added later have none"
        )
    return None


def validated(cfg: RunConfig) -> RunConfig:
    """``cfg`` as it will run: the system its workload needs, the load filled in, every
    combination checked (``Unsupported`` says what does not combine)."""
    if cfg.workload in WORKLOADS:
        cfg.system = system_for(cfg.workload, cfg.system)
    reason = workload_refusal(cfg.system, cfg.workload) or backend_refusal(cfg) or nemesis_refusal(cfg)
    if reason:
        raise Unsupported(reason)
    try:
        resolve_load(cfg)
    except ValueError as exc:  # a bad $LEDGERMQ_HISTORY_FORMAT: one line, as any other refusal
        raise Unsupported(str(exc)) from None
    reason = load_refusal(cfg)
    if reason:
        raise Unsupported(reason)
    return cfg
