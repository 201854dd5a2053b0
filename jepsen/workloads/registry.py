"""Every workload by name: a new workload is one module and one line here."""

from __future__ import annotations

from jepsen.workloads.base import Workload
from jepsen.workloads.log import LogWorkload
from jepsen.workloads.queue import QueueWorkload
from jepsen.workloads.register import RegisterWorkload

WORKLOADS: dict[str, type[Workload]] = {
    "log": LogWorkload,
    "register": RegisterWorkload,
    "queue": QueueWorkload,
}
