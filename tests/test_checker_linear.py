"""Linearizability (register, kv): the pure search, the Porcupine vectors, and the Spark path.

The search is tested on tiny histories whose verdict is obvious by hand (including
each way it must be able to say no), then on the Porcupine/Jepsen vectors with known
verdicts: all of them through the pure search, and all of them through one Spark
``analyze`` call, which must agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jepsen.checker import linear
from jepsen.checker.analyze import analyze_files
from jepsen.checker.linear import KV, REGISTER, Op, check_ops, pair_events
from jepsen.checker.parse import read_events, value_text
from jepsen.checker.spark import get_spark

pytestmark = pytest.mark.timeout(600)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
VECTORS = SHARED / "vectors" / "porcupine"
needs_vectors = pytest.mark.skipif(not VECTORS.is_dir(), reason=f"Porcupine vectors not found at {VECTORS}")


def _expected() -> dict[str, bool]:
    out = {}
    for line in (VECTORS / "EXPECTED.tsv").read_text().splitlines():
        if line.strip():
            name, verdict = line.split("\t")
            out[name] = verdict == "linearizable"
    return out


def ops_of(*spec: tuple[Any, ...]) -> list[Op]:
    """Ops from (process, f, value, result, type, call, ret) tuples; ret None = never completed."""
    out = []
    for i, (p, f, value, result, typ, call, ret) in enumerate(spec):
        out.append(
            Op(
                str(p),
                f,
                typ,
                call,
                ret if typ in ("ok", "fail") else None,
                call * 10 + i,
                None if ret is None else ret * 10 + i,
                value_text(value),
                value_text(result),
            )
        )
    return out


# --- the pure search -----------------------------------------------------------------------------


def test_sequential_register_is_linearizable() -> None:
    ops = ops_of(
        (0, "write", 1, None, "ok", 0, 1),
        (0, "read", None, 1, "ok", 2, 3),
        (1, "cas", [1, 2], None, "ok", 4, 5),
        (1, "read", None, 2, "ok", 6, 7),
    )
    assert check_ops(ops, REGISTER).valid is True


def test_stale_read_is_not_linearizable_and_names_the_read() -> None:
    ops = ops_of(
        (0, "write", 1, None, "ok", 0, 1), (0, "write", 2, None, "ok", 2, 3), (1, "read", None, 1, "ok", 4, 5)
    )
    r = check_ops(ops, REGISTER)
    assert r.valid is False
    assert r.failure is not None and r.failure["op"]["f"] == "read" and r.failure["op"]["result"] == 1
    assert r.failure["minimal"] is True


def test_concurrent_ops_may_take_effect_in_either_order() -> None:
    ops = ops_of(
        (0, "write", 1, None, "ok", 0, 10),
        (1, "write", 2, None, "ok", 1, 9),
        (2, "read", None, 1, "ok", 11, 12),
    )
    assert check_ops(ops, REGISTER).valid is True


def test_info_write_may_take_effect_late_or_never() -> None:
    late = ops_of(
        (0, "write", 1, None, "ok", 0, 1),
        (1, "write", 2, None, "info", 2, None),
        (2, "read", None, 1, "ok", 3, 4),
        (2, "read", None, 2, "ok", 5, 6),
    )
    assert check_ops(late, REGISTER).valid is True
    never = ops_of(
        (0, "write", 1, None, "ok", 0, 1),
        (1, "write", 2, None, "info", 2, None),
        (2, "read", None, 1, "ok", 30, 31),
    )
    assert check_ops(never, REGISTER).valid is True
    # but it cannot take effect twice, nor undo itself
    back = ops_of(
        (0, "write", 1, None, "ok", 0, 1),
        (1, "write", 2, None, "info", 2, None),
        (2, "read", None, 2, "ok", 3, 4),
        (2, "read", None, 1, "ok", 5, 6),
    )
    assert check_ops(back, REGISTER).valid is False


def test_failed_ops_did_not_happen() -> None:
    ops = ops_of(
        (0, "write", 1, None, "ok", 0, 1),
        (1, "write", 2, None, "fail", 2, 3),
        (2, "read", None, 2, "ok", 4, 5),
    )
    assert check_ops(ops, REGISTER).valid is False
    assert check_ops(ops[:2] + ops_of((2, "read", None, 1, "ok", 4, 5)), REGISTER).valid is True


def test_cas_needs_the_old_value() -> None:
    ok = ops_of(
        (0, "write", 1, None, "ok", 0, 1),
        (0, "cas", [1, 3], None, "ok", 2, 3),
        (0, "read", None, 3, "ok", 4, 5),
    )
    assert check_ops(ok, REGISTER).valid is True
    bad = ops_of((0, "write", 1, None, "ok", 0, 1), (0, "cas", [2, 3], None, "ok", 2, 3))
    assert check_ops(bad, REGISTER).valid is False


def test_kv_appends_and_gets() -> None:
    ok = ops_of(
        (0, "append", "a", None, "ok", 0, 1),
        (1, "append", "b", None, "ok", 2, 3),
        (2, "get", None, "ab", "ok", 4, 5),
        (0, "put", "x", None, "ok", 6, 7),
        (1, "get", None, "x", "ok", 8, 9),
    )
    assert check_ops(ok, KV).valid is True
    lost = ops_of(
        (0, "append", "a", None, "ok", 0, 1),
        (1, "append", "b", None, "ok", 2, 3),
        (2, "get", None, "b", "ok", 4, 5),
    )
    assert check_ops(lost, KV).valid is False


def test_shortest_failing_prefix() -> None:
    # fine up to the last read, which sees a value overwritten long before
    spec = [(0, "write", i, None, "ok", 2 * i, 2 * i + 1) for i in range(10)]
    spec.append((1, "read", None, 3, "ok", 40, 41))
    spec += [(0, "write", 20 + i, None, "ok", 50 + 2 * i, 51 + 2 * i) for i in range(5)]
    r = check_ops(ops_of(*spec), REGISTER)
    assert r.valid is False and r.failure is not None
    assert r.failure["op"]["result"] == 3 and r.failure["minimal"] is True
    assert r.failure["last-index"] == r.failure["op"]["complete-index"]


def hard_register_history(n: int = 22) -> list[Op]:
    """n concurrent writes, then two reads that need different writes to be last."""
    spec = [(i, "write", i, None, "ok", 0, 100) for i in range(n)]
    spec += [(n, "read", None, 0, "ok", 200, 201), (n, "read", None, 1, "ok", 202, 203)]
    return ops_of(*spec)


def test_budget_exhaustion_is_unknown_never_valid() -> None:
    r = check_ops(hard_register_history(), REGISTER, budget=0.2)
    assert r.valid == linear.UNKNOWN
    assert r.notes and "budget" in r.notes[0]


def test_malformed_cas_is_reported() -> None:
    r = check_ops(ops_of((0, "cas", 5, None, "ok", 0, 1)), REGISTER)
    assert r.valid == linear.UNKNOWN and r.error and "cas" in r.error


def test_pair_events_treats_a_missing_completion_as_info() -> None:
    ops = pair_events(
        [
            ("1", "invoke", "write", 0, 0, "3", None),
            ("2", "invoke", "read", 1, 1, None, None),
            ("2", "ok", "read", 2, 2, "3", None),
        ]
    )
    assert [o.type for o in ops] == ["info", "ok"]
    assert check_ops(ops, REGISTER).valid is True


# --- the vectors ----------------------------------------------------------------------------------


@needs_vectors
def test_porcupine_vectors_pure_search() -> None:
    from collections import defaultdict

    for name, want in _expected().items():
        events = read_events(VECTORS / name)
        by_key: dict[str | None, list[tuple[Any, ...]]] = defaultdict(list)
        for e in events:
            by_key[e.key].append((e.process, e.type, e.f, e.index, e.index, e.value, e.error))
        model = KV if name.startswith("kv/") else REGISTER
        verdicts = [check_ops(pair_events(rows), model, budget=20).valid for rows in by_key.values()]
        got = (
            linear.UNKNOWN
            if linear.UNKNOWN in verdicts and False not in verdicts
            else all(v is True for v in verdicts)
        )
        assert got is want, name


# --- the Spark path -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Any:
    return get_spark()


def _jsonl(path: Path, events: list[dict[str, Any]]) -> Path:
    with open(path, "w") as fh:
        for i, e in enumerate(events):
            fh.write(json.dumps({"index": i, "time": i * 1000, **e}) + "\n")
    return path


def register_history(stale: bool) -> list[dict[str, Any]]:
    """Two keys; with ``stale`` key "b" has a read of an overwritten value."""
    ev = []
    for key in ("a", "b"):
        ev += [
            {"process": 0, "type": "invoke", "f": "write", "key": key, "value": 1},
            {"process": 0, "type": "ok", "f": "write", "key": key, "value": 1},
            {"process": 1, "type": "invoke", "f": "write", "key": key, "value": 2},
            {"process": 1, "type": "info", "f": "write", "key": key, "value": 2, "error": "timeout"},
            {"process": 2, "type": "invoke", "f": "read", "key": key, "value": None},
            {"process": 2, "type": "ok", "f": "read", "key": key, "value": 2},
            {"process": 0, "type": "invoke", "f": "read", "key": key, "value": None},
            {"process": 0, "type": "ok", "f": "read", "key": key, "value": 1 if stale and key == "b" else 2},
        ]
    ev.append({"process": "nemesis", "type": "info", "f": "kill", "value": ["n1"]})
    return ev


@needs_vectors
def test_spark_path_matches_expected_and_hand_made(spark: Any, tmp_path: Path) -> None:
    expected = _expected()
    files = [str(VECTORS / name) for name in expected]
    ok = _jsonl(tmp_path / "register-ok.jsonl", register_history(stale=False))
    bad = _jsonl(tmp_path / "register-stale.jsonl", register_history(stale=True))
    kv = _jsonl(
        tmp_path / "kv.jsonl",
        [
            {"process": 0, "type": "invoke", "f": "append", "key": "k", "value": "x"},
            {"process": 0, "type": "ok", "f": "append", "key": "k", "value": "x"},
            {"process": 1, "type": "invoke", "f": "get", "key": "k", "value": None},
            {"process": 1, "type": "ok", "f": "get", "key": "k", "value": "x"},
        ],
    )
    res = analyze_files([*files, ok, bad, kv], out_dir=tmp_path / "out")
    by_path = {o.path: o for o in res["files"]}
    wrong = [name for name in expected if by_path[str(VECTORS / name)].valid is not expected[name]]
    assert not wrong
    assert by_path[str(ok)].valid is True and by_path[str(ok)].workload == "register"
    stale = by_path[str(bad)].result
    assert stale["valid"] is False and stale["anomaly-types"] == ["nonlinearizable"]
    assert [e["key"] for e in stale["anomalies"]["nonlinearizable"]] == ["b"]
    assert stale["stats"]["keys"] == 2 and stale["stats"]["linearizable-keys"] == 1
    assert by_path[str(kv)].valid is True and by_path[str(kv)].workload == "kv"
    etcd = json.loads((tmp_path / "out" / "etcd_000" / "results.json").read_text())
    failure = etcd["anomalies"]["nonlinearizable"][0]
    assert failure["prefix-events"] > 0 and failure["op"]["type"] == "ok"
    page = (tmp_path / "out" / "etcd_000" / "report.html").read_text()
    assert "<svg" in page and "INVALID" in page
    assert res["exit"] == 1


def test_spark_path_reports_unknown(spark: Any, tmp_path: Path) -> None:
    events = []
    for op in hard_register_history():
        events.append(
            {
                "process": int(op.process),
                "type": "invoke",
                "f": op.f,
                "key": "r",
                "value": None if op.f == "read" else int(op.value or 0),
                "time": op.call,
            }
        )
        events.append(
            {
                "process": int(op.process),
                "type": op.type,
                "f": op.f,
                "key": "r",
                "value": int(op.result or op.value or 0),
                "time": op.ret,
            }
        )
    events.sort(key=lambda e: (e["time"], e["type"] != "invoke"))
    path = tmp_path / "hard.jsonl"
    with open(path, "w") as fh:
        for i, e in enumerate(events):
            fh.write(json.dumps({"index": i, **e}) + "\n")
    res = analyze_files([path], workload="register", out_dir=tmp_path / "out", budget=0.3)
    o = res["files"][0]
    assert o.valid == "unknown" and o.result["unknown-keys"] == ["r"]
    assert res["exit"] == 2
