"""What the ``delay``, ``txn``, ``retry`` and ``order`` checkers share: their operations, anomaly
names, tolerances, and the fault windows late deliveries are excused by.

Both paths judge these workloads by one set of rules, ``semantics_checker`` on Spark and
``semantics_rules`` in this process (the formats and rules are in ``docs/history.md``); what
they must agree on is defined once, here. Nothing here imports pyspark.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jepsen.checker.parse import SEMANTICS_FS
from jepsen.checker.recovery import faults_from_nemesis

WORKLOADS = ("delay", "txn", "retry", "order")

#: each workload's operations (the checker refuses a history with others, and infers the
#: workload of a history from them)
FS: dict[str, frozenset[str]] = SEMANTICS_FS

#: anomalies that make a history invalid, in report order
ERRORS: dict[str, tuple[str, ...]] = {
    "delay": ("delivered-early", "delivered-late", "lost", "duplicate", "G1a", "unexpected"),
    "txn": (
        "committed-not-visible",
        "rolled-back-visible",
        "half-visible-before-commit",
        "unresolved",
        "duplicate",
        "G1a",
        "unexpected",
    ),
    "retry": (
        "never-redelivered",
        "redelivered-after-success",
        "past-max-not-in-dlq",
        "dlq-and-success",
        "lost",
        "duplicate",
        "G1a",
        "unexpected",
    ),
    "order": ("order-broken", "two-consumers-one-queue", "lost", "duplicate", "G1a", "unexpected"),
}
#: findings that do not (an ``info`` send that did, or did not, take effect)
INFORMATIONAL = ("recovered", "unseen-info")

#: what each anomaly means, for the report
DESCRIPTIONS: dict[str, str] = {
    "delivered-early": "a delayed message was seen, or stored for delivery, before its delay had passed",
    "delivered-late": "a delayed message was stored for delivery later than its due time plus the tolerance, "
    "fault windows not counted",
    "lost": "an acknowledged send is missing from the final drain of its queue",
    "committed-not-visible": "an acknowledged commit's message is missing from the final drain",
    "rolled-back-visible": "a message the client rolled back (and never committed) was seen",
    "half-visible-before-commit": "a transactional message was seen before the client first said commit",
    "unresolved": "a half message the client would commit (acknowledged, its checks answer commit) "
    "never became visible",
    "never-redelivered": "a message sent back (acknowledged) before its last try never came back from the "
    "retry topic",
    "redelivered-after-success": "a message came back from the retry topic though no consumer sent it back "
    "at the try before",
    "past-max-not-in-dlq": "a message sent back at or past its last try is not in the dead-letter topic, or "
    "was retried past it",
    "dlq-and-success": "a message in the dead-letter topic was also consumed successfully",
    "order-broken": "a queue was stored or consumed out of order: an acknowledged send stored below one "
    "that completed before it began, or a message first consumed after a later one",
    "two-consumers-one-queue": "two consumers held the lock of one queue at overlapping times",
}

#: examples kept per anomaly (as the log checker)
EXAMPLES = 8
#: a time no history reaches: a fault never healed lasts until then
NEVER = 1 << 62


@dataclass(frozen=True)
class Tolerances:
    """How far the checks give the clocks and the faults.

    ``early_ms``: a delayed message may be seen this much before its due time (the broker
    stamps whole milliseconds; the wall clock and the history's monotonic one may drift a
    little apart). ``late_ms``: it may be stored for delivery this much after its latest due
    time, once the time faults were in force is taken off. ``fault_grace_ms``: a fault
    holds deliveries back this much past its heal too (a new election, a leader catching up).
    ``lock_ms``: a queue lock is trusted this much less than the broker keeps it (the broker
    stamps its expiry with its own clock when the request arrives).
    """

    early_ms: int = 25
    late_ms: int = 5000
    fault_grace_ms: int = 5000
    lock_ms: int = 200


DEFAULT_TOLERANCES = Tolerances()


def fault_windows(
    events: Iterable[tuple[int, int, str, Any]], grace_ms: int = DEFAULT_TOLERANCES.fault_grace_ms
) -> list[tuple[int, int]]:
    """Disjoint windows (ns, sorted) during which a fault was in force, each extended by
    ``grace_ms`` past its heal, from nemesis events ``(index, time, f, value)``."""
    spans = sorted(
        (f.start, (f.end if f.end is not None else NEVER) + grace_ms * 1_000_000)
        for f in faults_from_nemesis(events)
    )
    out: list[tuple[int, int]] = []
    for s, e in spans:
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, min(e, NEVER)))
    return out


def excused(windows: list[tuple[int, int]], a: int, b: int) -> int:
    """How much of [a, b] the fault windows cover (ns)."""
    return sum(max(0, min(e, b) - max(s, a)) for s, e in windows)


def quot(a: int, b: int) -> int:
    """``a / b`` truncated toward zero, as Spark's ``div`` (and Java's long division) computes it."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q
