"""What one run is asked to do (``RunConfig``), what it ends with (``RunResult``), and the load
it gets when the user leaves it to us (``resolve_load``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jepsen.history import history_format
from jepsen.workloads.base import DRAIN_PAGE

DEFAULT_NEMESIS = ("kill-leader", "partition-leader")
#: the checker's verdict -> a run's exit status (3, any other: not checked)
VERDICTS = {True: 0, False: 1, "unknown": 2}
#: the system a run tests unless told otherwise (a workload it does not run picks its own)
DEFAULT_SYSTEM = "ledger"


@dataclass
class RunConfig:
    workload: str = "log"
    system: str = DEFAULT_SYSTEM  # "ledger", "pysyncobj" or "broker" (the queue workload's system)
    backend: str = "local"
    nemesis: tuple[str, ...] = DEFAULT_NEMESIS
    time: float = 40.0
    interval: float = 4.0
    rate: float = 50.0  # operations per second over all clients; math.inf: closed loop ("--rate max")
    clients: int | None = None  # logical clients over all workers; None: chosen by resolve_load
    out: Path = Path("jepsen-runs")
    seed: int | None = None
    op_timeout: float = 5.0
    drain_timeout: float = 120.0  # seconds a final drain (the whole log read back) may take
    drain_page: int = DRAIN_PAGE  # pairs per drain event (the drain is recorded page by page)
    send_batch: int | None = None  # queue workload: coalesce up to this many concurrent sends to a queue
    workers: int | None = None  # client processes; 0: clients in this process; None: resolve_load
    progress: bool = True
    check: bool = True
    keep_data: bool = False
    broken_adapter: str | None = None  # harness self-test: a client known to be wrong
    check_engine: str = "auto"  # the checker's engine: auto (small histories in-process), inprocess, spark
    name: str | None = None
    #: keyword arguments for the system's backend (``--system rocketmq``: namesrv, nodes, hooks, topic;
    #: ``--system broker``: groups, host_base, port_base)
    system_options: dict[str, Any] = field(default_factory=dict)
    #: several broker groups: a fault hits one group at random ("one") or every group at once ("all")
    fault_scope: str = "one"
    #: the history's format, "parquet" or "jsonl"; None: ``$LEDGERMQ_HISTORY_FORMAT``, else Parquet
    #: (``jepsen.history.history_format``, filled in by ``resolve_load``)
    history_format: str | None = None

    @property
    def full_rate(self) -> bool:
        return self.rate == math.inf

    @property
    def send_ratio(self) -> float:
        """The share of the log and queue workloads' operations that are sends."""
        return FULL_RATE_SEND_RATIO if self.full_rate else 0.75

    @property
    def poll_max(self) -> int:
        """Pairs a poll of the log and queue workloads asks for."""
        return FULL_RATE_POLL_MAX if self.full_rate else 50

    def test_name(self) -> str:
        if self.name:
            return self.name
        parts = [self.system, self.workload, "+".join(self.nemesis) or "none"]
        if self.broken_adapter:
            parts.append(f"broken-{self.broken_adapter}")
        return "-".join(parts)


@dataclass
class RunResult:
    run_dir: Path
    valid: bool | str | None  # checker verdict; None: not checked / harness problem
    history: Path
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def report(self) -> Path:
        return self.run_dir / "report.html"

    @property
    def exit_code(self) -> int:
        """0 valid, 1 invalid, 2 unknown, 3 could not check (checker missing or failed)."""
        return VERDICTS.get(self.valid, 3)  # type: ignore[arg-type]


#: logical clients per worker process at --rate max, by workload: enough outstanding sends to
#: fill batches (queue), to keep the ledger's group commit busy (log); few for registers,
#: whose linearizability check grows with concurrency
FULL_RATE_CLIENTS = {"queue": 1024, "log": 64, "register": 4}
#: queue workload at --rate max: sends per batch request, at most. A broker group answers a
#: roughly constant number of requests per second under load, so recorded throughput follows
#: the messages in flight: measured (15 s runs, 2 workers, the same hour; ok sends/s, medians)
#: 512 clients / batch 64: 2.4-6.2k; 2048 / 128: 5.9-6.6k; 2048 / 256: 4.5k (3.9-10.3k);
#: 4096 / 512: 5.2k, with a third more memory per worker
FULL_RATE_SEND_BATCH = 256
#: at --rate max polls are 1% of operations. Each poll is a request the leader answers on its
#: own, while a batch of up to FULL_RATE_SEND_BATCH sends is one: at 5% polls they were nine
#: requests in ten the leader served, and took 13% of a worker's CPU. 0.95 -> 0.99 (25 s runs
#: without faults, three alternating pairs): 29.4k/30.1k/28.7k -> 42.8k/43.7k/36.9k ok sends/s,
#: worker CPU 31-34 -> 24-28 us per operation; a 60 s run still records about 20k polls
FULL_RATE_SEND_RATIO = 0.99
#: at --rate max a poll asks for fewer pairs: decoding polled messages was the largest client
#: cost in a worker's profile (50 pairs per poll cost more than all the sends together)
FULL_RATE_POLL_MAX = 10
DEFAULT_CLIENTS = 5


def resolve_load(cfg: RunConfig) -> RunConfig:
    """Fill in what the user left to us: workers, clients, batching (``--rate max`` loads hard).

    The default run (an open-loop rate) stays one light process; ``--rate max`` gets one
    worker process per core, closed-loop clients and batched sends.
    """
    if cfg.workers is None:
        cfg.workers = (os.cpu_count() or 1) if cfg.full_rate else 0
    if cfg.clients is None:
        per = FULL_RATE_CLIENTS.get(cfg.workload, DEFAULT_CLIENTS) if cfg.full_rate else DEFAULT_CLIENTS
        cfg.clients = per * max(1, cfg.workers) if cfg.full_rate else per
    if cfg.send_batch is None:
        cfg.send_batch = FULL_RATE_SEND_BATCH if cfg.full_rate and cfg.workload == "queue" else 1
    cfg.history_format = history_format(cfg.history_format)
    return cfg
