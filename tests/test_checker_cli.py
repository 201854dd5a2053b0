"""The ``jepsen analyze`` command: exit codes, outputs, and malformed input named by file and line.

Readers are tested directly (no Spark); the command itself runs in-process through
click's runner so it shares the one Spark session of the test run. Each command run
bundles several histories, since a run's cost is mostly fixed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from jepsen.checker import edn
from jepsen.checker.parse import HistoryError, detect_format, read_events
from jepsen.checker.spark import get_spark
from jepsen.cli import main

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT.parent / "shared" / "vectors" / "porcupine"


def jsonl(path: Path, events: list[dict[str, Any]], blank_line_at: int | None = None) -> Path:
    lines = [json.dumps({"index": i, "time": 1000 * (i + 1), **e}) for i, e in enumerate(events)]
    if blank_line_at is not None:
        lines.insert(blank_line_at, "")
    path.write_text("\n".join(lines) + "\n")
    return path


def log_events(lost: bool = False) -> list[dict[str, Any]]:
    drain = [[0, 10]] if lost else [[0, 10], [1, 11]]
    return [
        {"process": 0, "type": "invoke", "f": "send", "key": "q", "value": 10},
        {"process": 0, "type": "ok", "f": "send", "key": "q", "value": 10, "offset": 0},
        {"process": 1, "type": "invoke", "f": "send", "key": "q", "value": 11},
        {"process": 1, "type": "ok", "f": "send", "key": "q", "value": 11, "offset": 1},
        {"process": 2, "type": "invoke", "f": "drain", "key": "q", "value": {"from": 0}},
        {"process": 2, "type": "ok", "f": "drain", "key": "q", "value": drain},
    ]


# --- readers, no Spark ----------------------------------------------------------------------------


def test_edn_subset() -> None:
    form = edn.loads('{:process 0, :type :ok, :f :cas, :value [1 2], :key "a\\"b", :x nil, :t true}')
    assert form[edn.Keyword("process")] == 0 and form[edn.Keyword("value")] == [1, 2]
    assert form[edn.Keyword("key")] == 'a"b' and form[edn.Keyword("x")] is None
    assert edn.to_plain(edn.loads("[:a #{1} (2 3) -4.5]")) == ["a", [1], [2, 3], -4.5]
    for bad in ("{:a}", "[1 2", '"open', '#inst "2020"', "{:a 1} x"):
        with pytest.raises(edn.EdnError):
            edn.loads(bad)


def test_formats_are_detected_by_content(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text('{"index": 0}\n')
    (tmp_path / "b.log").write_text("INFO  jepsen.util - 0\t:invoke\t:read\tnil\n")
    (tmp_path / "c.jsonl").write_text("{:process 0, :type :invoke, :f :read}\n")
    (tmp_path / "d.edn").write_text("hello world\n")
    assert [detect_format(tmp_path / n) for n in ("a.txt", "b.log", "c.jsonl")] == ["jsonl", "etcd", "edn"]
    with pytest.raises(HistoryError, match=r"d\.edn:1: not a history"):
        detect_format(tmp_path / "d.edn")


@pytest.mark.parametrize(
    "lines,where,what",
    [
        (
            [
                '{"index":0,"process":0,"type":"invoke","f":"read"}',
                '{"index":1,"process":0,"type":"ok","f":"read"',
            ],
            2,
            "invalid JSON",
        ),
        (['{"index":0,"process":0,"f":"read"}'], 1, "'type' must be one of"),
        (['{"index":0,"process":0,"type":"ok","f":"read","value":1}'], 1, "without an invoke"),
        (
            [
                '{"index":0,"process":0,"type":"invoke","f":"read"}',
                '{"index":1,"process":0,"type":"invoke","f":"read"}',
            ],
            2,
            "still outstanding",
        ),
        (
            [
                '{"index":0,"process":0,"type":"invoke","f":"read"}',
                '{"index":1,"process":0,"type":"ok","f":"write"}',
            ],
            2,
            "does not match",
        ),
        (['{"index":0,"process":true,"type":"invoke","f":"read"}'], 1, "'process' must be"),
        (
            [
                '{"index":5,"process":0,"type":"invoke","f":"read"}',
                '{"index":5,"process":0,"type":"ok","f":"read"}',
            ],
            2,
            "does not increase",
        ),
    ],
)
def test_jsonl_reader_names_the_line(tmp_path: Path, lines: list[str], where: int, what: str) -> None:
    p = tmp_path / "h.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(HistoryError) as exc:
        read_events(p)
    assert exc.value.line == where and what in str(exc.value) and str(p) in str(exc.value)


def test_etcd_and_edn_readers(tmp_path: Path) -> None:
    log = tmp_path / "e.log"
    log.write_text(
        "INFO  jepsen.core - starting\n"
        "INFO  jepsen.util - 3\t:invoke\t:cas\t[1 2]\n"
        "INFO  jepsen.util - 3   :info   :cas    :timed-out\n"
        "INFO  jepsen.util - :nemesis\t:info\t:start\tnil\n"
    )
    ev = read_events(log)
    assert [(e.process, e.type, e.f, e.value, e.error) for e in ev] == [
        ("3", "invoke", "cas", "[1,2]", None),
        ("3", "info", "cas", None, "timed-out"),
        ("nemesis", "info", "start", None, None),
    ]
    bad = tmp_path / "bad.log"
    bad.write_text("INFO  jepsen.util - 3\t:invoke\t:cas\t[1 2\n")
    with pytest.raises(HistoryError, match=r"bad\.log:1: bad value"):
        read_events(bad)
    e = tmp_path / "h.edn"
    e.write_text(
        '{:process 0, :type :invoke, :f :append, :key "k", :value "x"}\n'
        '{:process 0, :type :ok, :f :append, :key "k", :value "x", :time 5}\n'
    )
    assert [(x.key, x.value, x.time) for x in read_events(e)] == [("k", "x", None), ("k", "x", 5)]
    e.write_text("{:process 0, :type :invoke, :f :append}\n{:process 0 :type}\n")
    with pytest.raises(HistoryError, match=r"h\.edn:2: bad EDN"):
        read_events(e)


def test_module_entry_point_help_is_instant() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "jepsen", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "analyze" in out.stdout


def test_analyze_help_documents_exit_codes() -> None:
    out = CliRunner().invoke(main, ["analyze", "--help"])
    assert out.exit_code == 0
    for text in (
        "0  every history is valid",
        "1  some history is invalid",
        "2  some history is unknown",
        "3  some history is unreadable",
        "--workload",
        "--master",
        "--out",
    ):
        assert text in out.output


# --- the command ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Any:
    return get_spark()


def run(args: list[str]) -> Any:
    return CliRunner().invoke(main, ["analyze", *args], catch_exceptions=False)


def test_all_valid_exits_0(spark: Any, tmp_path: Path) -> None:
    a = jsonl(tmp_path / "a.jsonl", log_events(), blank_line_at=3)
    b_dir = tmp_path / "other"
    b_dir.mkdir()
    b = jsonl(b_dir / "a.jsonl", log_events())  # same name: its own output directory
    out = tmp_path / "out"
    r = run(["--out", str(out), str(a), str(b)])
    assert r.exit_code == 0, r.output
    assert "2 histories: 2 valid" in r.output and "valid" in r.output
    assert json.loads((out / "summary.json").read_text()) == {str(a): True, str(b): True}
    for d in ("a", "a-2"):
        assert json.loads((out / d / "results.json").read_text())["valid"] is True
        assert (out / d / "report.html").exists()


def test_malformed_inputs_exit_3_and_the_rest_is_checked(spark: Any, tmp_path: Path) -> None:
    good = jsonl(tmp_path / "good.jsonl", log_events())
    bad_json = tmp_path / "bad-json.jsonl"
    bad_json.write_text(
        good.read_text().splitlines()[0]
        + "\n"
        + good.read_text().splitlines()[1]
        + "\n"
        + '{"index": 2, "process": 1, "type": "invoke", "f": "send", "key": "q", "value": \n'
    )
    orphan = jsonl(tmp_path / "orphan.jsonl", log_events()[1:])
    twice = jsonl(tmp_path / "twice.jsonl", [log_events()[0], log_events()[0], log_events()[1]])
    wrong_type = jsonl(
        tmp_path / "wrong-type.jsonl", [*log_events()[:2], {"process": 3, "type": "done", "f": "send"}]
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage\n")
    mystery = jsonl(tmp_path / "mystery.jsonl", [{"process": 0, "type": "invoke", "f": "frobnicate"}])
    missing = tmp_path / "missing.jsonl"
    out = tmp_path / "out"
    r = run(
        [
            "--out",
            str(out),
            str(good),
            str(bad_json),
            str(orphan),
            str(twice),
            str(wrong_type),
            str(empty),
            str(binary),
            str(mystery),
            str(missing),
        ]
    )
    assert r.exit_code == 3, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary.pop(str(good)) is True
    assert set(summary.values()) == {None}
    expect = {
        bad_json: f"{bad_json}:3: invalid JSON",
        orphan: f"{orphan}:1: ok completion",
        twice: f"{twice}:2: process 0 invokes",
        wrong_type: f"{wrong_type}:3: 'type' must be",
        empty: "no operations",
        binary: "not UTF-8",
        mystery: "cannot tell the workload",
        missing: "cannot read",
    }
    for path, text in expect.items():
        res = json.loads((out / path.stem / "results.json").read_text())
        assert res["valid"] is None and text in res["error"], (path, res["error"])
        assert text in r.output
        assert "ERROR" in (out / path.stem / "report.html").read_text()


def test_invalid_beats_malformed_exits_1(spark: Any, tmp_path: Path) -> None:
    lost = jsonl(tmp_path / "lost.jsonl", log_events(lost=True))
    reg = jsonl(
        tmp_path / "reg.jsonl",
        [
            {"process": 0, "type": "invoke", "f": "read", "key": "r", "value": None},
            {"process": 0, "type": "ok", "f": "read", "key": "r", "value": None},
        ],
    )
    r = run(["--out", str(tmp_path / "out"), "--workload", "log", str(lost), str(reg)])
    assert r.exit_code == 1, r.output
    assert "lost-write=1" in r.output
    assert "not part of the log workload" in r.output


@pytest.mark.skipif(not VECTORS.is_dir(), reason=f"Porcupine vectors not found at {VECTORS}")
def test_unknown_exits_2(spark: Any, tmp_path: Path) -> None:
    events = [{"process": i, "type": "invoke", "f": "write", "key": "r", "value": i} for i in range(22)]
    events += [{"process": i, "type": "ok", "f": "write", "key": "r", "value": i} for i in range(22)]
    for p, v in ((30, 0), (31, 1)):
        events += [
            {"process": p, "type": "invoke", "f": "read", "key": "r", "value": None},
            {"process": p, "type": "ok", "f": "read", "key": "r", "value": v},
        ]
    hard = jsonl(tmp_path / "hard.jsonl", events)
    ok = VECTORS / "etcd" / "etcd_002.log"
    r = run(["--out", str(tmp_path / "out"), "--budget", "0.3", str(hard), str(ok)])
    assert r.exit_code == 2, r.output
    assert "unknown keys=1" in r.output
    res = json.loads((tmp_path / "out" / "hard" / "results.json").read_text())
    assert res["valid"] == "unknown" and res["unknown-keys"] == ["r"]
