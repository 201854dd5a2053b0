"""Every workload by name: a new workload is one module and one line here."""

from __future__ import annotations

from jepsen.workloads.base import Workload
from jepsen.workloads.delay import DelayWorkload
from jepsen.workloads.log import LogWorkload
from jepsen.workloads.order import OrderWorkload
from jepsen.workloads.queue import QueueWorkload
from jepsen.workloads.register import RegisterWorkload
from jepsen.workloads.retry import RetryWorkload
from jepsen.workloads.txn import TxnWorkload

WORKLOADS: dict[str, type[Workload]] = {
    "log": LogWorkload,
    "register": RegisterWorkload,
    "queue": QueueWorkload,
    "delay": DelayWorkload,
    "txn": TxnWorkload,
    "retry": RetryWorkload,
    "order": OrderWorkload,
}
