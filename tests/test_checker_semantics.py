"""The delay, txn, retry and order checkers: a hand-made history per rule, with and without its anomaly.

Each case is a small history (docs/history.md's formats) built to have exactly the anomalies it
names and no other: a clean history per workload, one per anomaly, and near misses that must
not be flagged (a delivery inside the tolerance, lateness a fault excuses, a commit that came by
a check, a send-back whose outcome is unknown, a redelivery after a rebalance, a lock handed on
by an unlock). All go through one in-process analysis, then through Spark, which must give the
very same results.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_checker_log import H

from jepsen.checker.analyze import analyze_files
from jepsen.checker.semantics_model import ERRORS, INFORMATIONAL

pytestmark = pytest.mark.timeout(900)

W0 = 1_700_000_000_000  # the wall clock (ms) at the histories' time 0
Q = "T/0"  # the test topic's queue
R = "%RETRY%g/0"  # the retry group's retry topic
D = "%DLQ%g/0"  # ... and dead-letter topic


def e(off: int, v: int, store: int = 0, attempt: int = 0) -> list[int]:
    """A read entry ``[offset, value, store_ms, attempt]``."""
    return [off, v, store, attempt]


def read(h: H, p: int, f: str, t: float, entries: list[list[int]], key: str = Q) -> H:
    args = {"from": 0, "max": None} if f == "drain" else {"from": 0, "max": 20}
    return h.op(p, f, t, t + 1, args, key=key, result=entries)


# --- delay ------------------------------------------------------------------------------------


def delayed(
    h: H, p: int, v: int, t0: float, t1: float, delay: int, typ: str = "ok", *, level: bool = True
) -> H:
    args: dict[str, Any] = {"value": v, "delay-ms": delay, "wall-ms": W0 + int(t0)}
    if level:
        args["level"] = 2
    else:
        args["deliver-ms"] = W0 + int(t0) + delay
    return h.op(
        p,
        "send-delayed",
        t0,
        t1,
        args,
        key=Q,
        typ=typ,
        result={"value": v},
        error="x" if typ != "ok" else None,
    )


def delay_case(
    *,
    seen_at: float = 250,
    store1: int = W0 + 205,
    drain: list[list[int]] | None = None,
    fault: tuple[float, float] | None = None,
    v2_type: str = "ok",
    extra: Callable[[H], H] | None = None,
) -> Callable[[], H]:
    """v1: level 2 (200 ms) sent at 0; v2: a delivery time 300 ms ahead, sent at 10; v3: unknown
    outcome, never delivered. A poll sees v1 at ``seen_at``; the drain is at 8000."""

    def build() -> H:
        h = H()
        delayed(h, 1, 1, 0, 1, 200)
        delayed(h, 1, 2, 10, 11, 300, v2_type, level=False)
        delayed(h, 1, 3, 20, 30, 100, "info")
        read(h, 2, "poll", 100, [])
        read(h, 2, "poll", seen_at, [e(0, 1, store1)])
        if fault is not None:
            h.nemesis("kill", fault[0], fault[0] + 1, ["n1"])
            h.nemesis("restart", fault[1], fault[1] + 1, ["n1"])
        read(h, 3, "drain", 8000, drain if drain is not None else [e(0, 1, store1), e(1, 2, W0 + 312)])
        return extra(h) if extra else h

    return build


# --- txn ----------------------------------------------------------------------------------------


def txn(
    h: H,
    p: int,
    v: int,
    t: float,
    outcome: str,
    decision: str | None,
    half: str = "ok",
    end: str = "ok",
) -> H:
    h.op(
        p,
        "send-half",
        t,
        t + 1,
        {"value": v, "outcome": outcome},
        key=None,
        typ=half,
        error="x" if half != "ok" else None,
    )
    if half == "ok" and decision is not None:
        result = {"value": v, "decision": decision, "queue": Q}
        h.op(p, "end", t + 1, t + 2, {"value": v, "decision": decision}, key=None, typ=end, result=result)
    return h


def check(h: H, v: int, t: float, answer: str) -> H:
    return h.op(9, "check", t, t, {"value": v}, key=None, result={"value": v, "answer": answer})


def txn_case(
    *,
    poll: list[list[int]] | None = None,
    poll_at: float = 30,
    drain: list[list[int]] | None = None,
    v3_check: bool = True,
    v1_end: str = "ok",
    extra: Callable[[H], H] | None = None,
) -> Callable[[], H]:
    """v1 committed, v2 rolled back, v3 left unknown and committed by a check at 50, v4 left
    unknown and rolled back by a check at 60, v5's half of unknown outcome."""

    def build() -> H:
        h = H()
        txn(h, 1, 1, 0, "commit", "commit", end=v1_end)
        txn(h, 1, 2, 3, "rollback", "rollback")
        txn(h, 1, 3, 6, "commit", "unknown")
        txn(h, 1, 4, 9, "rollback", "unknown")
        txn(h, 4, 5, 12, "commit", None, half="info")
        if v3_check:
            check(h, 3, 50, "commit")
        check(h, 4, 60, "rollback")
        read(h, 2, "poll", poll_at, poll if poll is not None else [e(0, 1)])
        read(h, 3, "drain", 200, drain if drain is not None else [e(0, 1), e(1, 3)])
        return extra(h) if extra else h

    return build


# --- retry ----------------------------------------------------------------------------------------


def back(h: H, p: int, v: int, a: int, t: float, off: int, key: str = Q, typ: str = "ok") -> H:
    args = {"value": v, "attempt": a, "offset": off, "max": 2, "level": 1}
    return h.op(p, "send-back", t, t + 1, args, key=key, typ=typ, error="x" if typ != "ok" else None)


def ack(h: H, p: int, v: int, a: int, t: float, off: int, key: str = Q) -> H:
    return h.op(p, "ack", t, t, {"value": v, "attempt": a, "offset": off}, key=key)


def retry_case(
    *,
    copies: list[list[int]] | None = None,
    dlq: list[list[int]] | None = None,
    main: list[list[int]] | None = None,
    back_v2: str = "ok",
    extra: Callable[[H], H] | None = None,
) -> Callable[[], H]:
    """v1 consumed at once, v2 failed once, v3 failed three times (to the dead-letter topic)."""
    copies = copies if copies is not None else [e(0, 2, 0, 1), e(1, 3, 0, 1), e(2, 3, 0, 2)]

    def build() -> H:
        h = H()
        for i, v in enumerate((1, 2, 3)):
            h.send(1, v, i, 2 * i, key=Q)
        read(h, 2, "poll", 10, [e(0, 1), e(1, 2), e(2, 3)])
        ack(h, 2, 1, 0, 12, 0)
        back(h, 2, 2, 0, 13, 1, typ=back_v2)
        back(h, 2 if back_v2 == "ok" else 5, 3, 0, 15, 2)
        p = 3
        read(h, p, "poll", 50, [c for c in copies if c[3] == 1], key=R)
        if any(c[1] == 2 and c[3] == 1 for c in copies):
            ack(h, p, 2, 1, 52, 0, key=R)
        back(h, p, 3, 1, 53, 1, key=R)
        read(h, p, "poll", 90, [c for c in copies if c[3] >= 2], key=R)
        back(h, p, 3, 2, 92, 2, key=R)
        read(h, 6, "drain", 200, main if main is not None else [e(0, 1), e(1, 2), e(2, 3)])
        read(h, 6, "drain", 203, copies, key=R)
        read(h, 6, "drain", 206, dlq if dlq is not None else [e(0, 3, 0, 3)], key=D)
        return extra(h) if extra else h

    return build


# --- order ----------------------------------------------------------------------------------------


def lock(h: H, p: int, who: str, t: float, granted: bool = True, live: int = 10_000) -> H:
    return h.op(
        p,
        "lock",
        t,
        t + 1,
        {"consumer": who, "queues": [Q], "live-ms": live},
        key=None,
        result={"granted": [Q] if granted else []},
    )


def unlock(h: H, p: int, who: str, t: float) -> H:
    return h.op(p, "unlock", t, t + 1, {"consumer": who, "queues": [Q]}, key=None, result={})


def consume(h: H, p: int, who: str, t: float, msgs: list[list[int]], typ: str = "ok") -> H:
    return h.op(p, "consume", t, t + 1, {"consumer": who, "messages": msgs}, key=Q, typ=typ, result={})


def order_case(
    *,
    offsets: tuple[int, int, int] = (0, 1, 2),
    first: list[list[int]] | None = None,
    b_lock_at: float = 22,
    b_granted: bool = True,
    a_unlocks: bool = True,
    a_live: int = 10_000,
    b_msgs: list[list[int]] | None = None,
    drain: list[list[int]] | None = None,
    extra: Callable[[H], H] | None = None,
) -> Callable[[], H]:
    """One producer sends v1..v3; consumer A locks the queue, consumes 0-1, fails then consumes 2
    and unlocks at 20; B locks it at 22 and gets 1-2 again (its committed offset was behind)."""

    def build() -> H:
        h = H()
        for i, v in enumerate((1, 2, 3)):
            h.send(1, v, offsets[i], 2 * i, key=Q)
        lock(h, 10, "A", 5, live=a_live)
        consume(h, 11, "A", 7, first if first is not None else [e(0, 1), e(1, 2)])
        consume(h, 11, "A", 9, [e(2, 3)], typ="fail")
        consume(h, 11, "A", 11, [e(2, 3, 0, 1)])
        if a_unlocks:
            unlock(h, 12, "A", 20)
        lock(h, 13, "B", b_lock_at, granted=b_granted)
        if b_granted:
            consume(h, 14, "B", b_lock_at + 2, b_msgs if b_msgs is not None else [e(1, 2), e(2, 3)])
        read(
            h,
            15,
            "drain",
            100,
            drain if drain is not None else [e(o, v) for o, v in zip(offsets, (1, 2, 3), strict=True)],
        )
        return extra(h) if extra else h

    return build


#: name -> (workload, history, the anomalies it must have, exactly)
CASES: dict[str, tuple[str, Callable[[], H], set[str]]] = {
    # delay
    "delay-clean": ("delay", delay_case(), set()),
    "delay-early-seen": ("delay", delay_case(seen_at=150), {"delivered-early"}),
    "delay-early-stored": ("delay", delay_case(store1=W0 + 150), {"delivered-early"}),
    "delay-early-within-tolerance": ("delay", delay_case(seen_at=180, store1=W0 + 185), set()),
    "delay-late": ("delay", delay_case(seen_at=7000, store1=W0 + 6000), {"delivered-late"}),
    "delay-late-fault-excused": (
        "delay",
        delay_case(seen_at=7000, store1=W0 + 6000, fault=(500, 1500)),
        set(),
    ),
    "delay-late-fault-elsewhere": (
        "delay",
        delay_case(seen_at=7000, store1=W0 + 6000, fault=(7500, 7600)),
        {"delivered-late"},
    ),
    "delay-lost": ("delay", delay_case(drain=[e(0, 1, W0 + 205)]), {"lost"}),
    "delay-info-unseen": ("delay", delay_case(drain=[e(0, 1, W0 + 205)], v2_type="info"), set()),
    "delay-duplicate": (
        "delay",
        delay_case(drain=[e(0, 1, W0 + 205), e(1, 2, W0 + 312), e(2, 1, W0 + 400)]),
        {"duplicate"},
    ),
    "delay-unexpected": (
        "delay",
        delay_case(drain=[e(0, 1, W0 + 205), e(1, 2, W0 + 312), e(2, 99, W0 + 400)]),
        {"unexpected"},
    ),
    "delay-failed-delivered": (
        "delay",
        delay_case(
            drain=[e(0, 1, W0 + 205), e(1, 2, W0 + 312), e(2, 4, W0 + 400)],
            extra=lambda h: delayed(h, 1, 4, 40, 41, 100, "fail"),
        ),
        {"G1a"},
    ),
    # txn
    "txn-clean": ("txn", txn_case(), set()),
    "txn-committed-not-visible": ("txn", txn_case(drain=[e(1, 3)]), {"committed-not-visible"}),
    "txn-rolled-back-visible": ("txn", txn_case(drain=[e(0, 1), e(1, 3), e(2, 2)]), {"rolled-back-visible"}),
    "txn-check-rollback-visible": (
        "txn",
        txn_case(drain=[e(0, 1), e(1, 3), e(2, 4)]),
        {"rolled-back-visible"},
    ),
    "txn-half-visible-before-commit": (
        "txn",
        txn_case(poll=[e(0, 1), e(1, 3)]),
        {"half-visible-before-commit"},
    ),
    "txn-commit-by-check-then-visible": ("txn", txn_case(poll=[e(0, 1), e(1, 3)], poll_at=70), set()),
    "txn-never-committed-visible": (
        "txn",
        txn_case(v3_check=False, drain=[e(0, 1), e(1, 3)]),
        {"half-visible-before-commit"},
    ),
    "txn-unresolved": ("txn", txn_case(v3_check=False, drain=[e(0, 1)]), {"unresolved"}),
    "txn-unresolved-end-unknown": ("txn", txn_case(v1_end="info", drain=[e(1, 3)]), {"unresolved"}),
    "txn-duplicate": ("txn", txn_case(drain=[e(0, 1), e(1, 3), e(2, 1)]), {"duplicate"}),
    "txn-unexpected": ("txn", txn_case(drain=[e(0, 1), e(1, 3), e(2, 99)]), {"unexpected"}),
    "txn-failed-half-visible": (
        "txn",
        txn_case(
            drain=[e(0, 1), e(1, 3), e(2, 7)], extra=lambda h: txn(h, 1, 7, 30, "commit", None, half="fail")
        ),
        {"G1a"},
    ),
    # retry
    "retry-clean": ("retry", retry_case(), set()),
    "retry-never-redelivered": (
        "retry",
        retry_case(copies=[e(1, 3, 0, 1), e(2, 3, 0, 2)]),
        {"never-redelivered"},
    ),
    "retry-send-back-unknown": (
        "retry",
        retry_case(copies=[e(1, 3, 0, 1), e(2, 3, 0, 2)], back_v2="info"),
        set(),
    ),
    "retry-redelivered-after-success": (
        "retry",
        retry_case(copies=[e(0, 2, 0, 1), e(1, 3, 0, 1), e(2, 3, 0, 2), e(3, 1, 0, 1)]),
        {"redelivered-after-success"},
    ),
    "retry-failed-send-back-redelivered": (
        "retry",
        retry_case(back_v2="fail"),
        {"redelivered-after-success"},
    ),
    "retry-past-max-not-in-dlq": ("retry", retry_case(dlq=[]), {"past-max-not-in-dlq"}),
    "retry-retried-past-max": (
        "retry",
        retry_case(copies=[e(0, 2, 0, 1), e(1, 3, 0, 1), e(2, 3, 0, 2), e(3, 3, 0, 3)]),
        {"past-max-not-in-dlq"},
    ),
    "retry-dlq-and-success": ("retry", retry_case(dlq=[e(0, 3, 0, 3), e(1, 1, 0, 1)]), {"dlq-and-success"}),
    "retry-lost": ("retry", retry_case(main=[e(0, 1), e(2, 3)]), {"lost"}),
    "retry-duplicate": ("retry", retry_case(main=[e(0, 1), e(1, 2), e(2, 3), e(3, 1)]), {"duplicate"}),
    # order
    "order-clean": ("order", order_case(), set()),
    "order-stored-out-of-order": (
        "order",
        order_case(offsets=(1, 0, 2), first=[e(0, 2), e(1, 1)], b_msgs=[e(1, 1), e(2, 3)]),
        {"order-broken"},
    ),
    "order-consumer-skipped": (
        "order",
        order_case(first=[e(0, 1), e(2, 3)], b_msgs=[e(2, 3)]),
        {"order-broken"},
    ),
    "order-batch-reversed": ("order", order_case(first=[e(1, 2), e(0, 1)]), {"order-broken"}),
    "order-two-consumers": ("order", order_case(b_lock_at=15, a_unlocks=False), {"two-consumers-one-queue"}),
    "order-lock-refused-then-free": ("order", order_case(b_lock_at=15, b_granted=False), set()),
    "order-lock-expired": ("order", order_case(b_lock_at=15, a_unlocks=False, a_live=5), set()),
    "order-lost": ("order", order_case(drain=[e(0, 1), e(1, 2)]), {"lost"}),
    "order-duplicate": ("order", order_case(drain=[e(0, 1), e(1, 2), e(2, 3), e(3, 1)]), {"duplicate"}),
}


@pytest.fixture(scope="module")
def histories(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("semantics")
    return [builder().write(d / f"{name}.jsonl") for name, (_, builder, _) in CASES.items()]


def test_every_rule_has_a_history_with_it_and_one_without(histories: list[Path], tmp_path: Path) -> None:
    res = analyze_files(histories, out_dir=tmp_path, engine="inprocess", report=False)
    by_name = {Path(o.path).stem: o for o in res["files"]}
    for name, (workload, _, expected) in CASES.items():
        o = by_name[name]
        assert o.error is None, (name, o.error)
        assert o.workload == workload, name
        assert set(o.result["anomaly-types"]) == expected, (name, o.result["anomalies"])
        assert o.valid is (not expected), name
        for anomaly in expected:
            assert o.result["counts"][anomaly] >= 1 and o.result["anomalies"][anomaly], name
    covered = {a for _, _, expected in CASES.values() for a in expected}
    for workload, errors in ERRORS.items():
        assert set(errors) <= covered, f"{workload}: no history for {sorted(set(errors) - covered)}"


def test_examples_say_what_happened(histories: list[Path], tmp_path: Path) -> None:
    res = analyze_files(histories, out_dir=tmp_path, engine="inprocess", report=False)
    by_name = {Path(o.path).stem: o.result for o in res["files"]}
    early = by_name["delay-early-seen"]["anomalies"]["delivered-early"][0]
    assert early["value"] == 1 and early["seen-early-by-ms"] == 49 and early["delay-ms"] == 200
    late = by_name["delay-late"]["anomalies"]["delivered-late"][0]
    assert late["late-by-ms"] == 5799 and late["fault-ms"] == 0
    excused = by_name["delay-late-fault-elsewhere"]["anomalies"]["delivered-late"][0]
    assert excused["fault-ms"] == 0  # a fault after the delivery excuses nothing
    half = by_name["txn-half-visible-before-commit"]["anomalies"]["half-visible-before-commit"][0]
    assert (
        half["value"] == 3
        and half["commit-said-time"] == 50_000_000
        and half["first-seen"]["complete-time"] == 31_000_000
    )
    never = by_name["retry-never-redelivered"]["anomalies"]["never-redelivered"][0]
    assert (never["value"], never["attempt"], never["max"]) == (2, 0, 2)
    past = by_name["retry-retried-past-max"]["anomalies"]["past-max-not-in-dlq"][0]
    assert past["why"] == "retried past its last try" and past["attempt"] == 3
    skipped = by_name["order-consumer-skipped"]["anomalies"]["order-broken"][0]
    assert skipped["kind"] == "consumed" and skipped["offset"] == 1 and skipped["overtaken-by"]["offset"] == 2
    assert "first-consumed" not in skipped  # never consumed at all
    two = by_name["order-two-consumers"]["anomalies"]["two-consumers-one-queue"][0]
    assert {two["first"]["consumer"], two["second"]["consumer"]} == {"A", "B"}
    assert two["overlap-from"] == 16_000_000
    assert by_name["delay-clean"]["informational"] == ["unseen-info"]
    assert set(INFORMATIONAL) >= set(by_name["txn-clean"]["informational"])


def test_spark_gives_the_same_results(histories: list[Path], tmp_path: Path) -> None:
    fast = analyze_files(histories, out_dir=tmp_path / "inprocess", engine="inprocess", report=False)
    slow = analyze_files(histories, out_dir=tmp_path / "spark", engine="spark", report=False)
    for a, b in zip(fast["files"], slow["files"], strict=True):
        assert a.error is None and b.error is None, (a.error, b.error)
        ra = {k: v for k, v in a.result.items() if k != "engine"}
        rb = {k: v for k, v in b.result.items() if k != "engine"}
        assert ra == rb, Path(a.path).stem


def test_the_report_names_each_anomaly_and_says_what_it_means(tmp_path: Path) -> None:
    from jepsen.checker.report import DESCRIPTIONS

    paths = [CASES[n][1]().write(tmp_path / f"{n}.jsonl") for n in ("delay-late", "order-two-consumers")]
    res = analyze_files(paths, out_dir=tmp_path / "out", engine="inprocess", report=True)
    for o, anomaly in zip(res["files"], ("delivered-late", "two-consumers-one-queue"), strict=True):
        page = (o.out_dir / "report.html").read_text(encoding="utf-8")
        assert anomaly in page and DESCRIPTIONS[anomaly].split(",")[0] in page, anomaly
