"""Parquet histories (``jepsen/checker/columnar.py``): recorded in parts that are whole on disk,
read by both checker paths with the verdicts JSON Lines gets, exported back to JSON Lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_checker_log import CASES

from jepsen.checker import columnar, shards
from jepsen.checker.analyze import analyze_files
from jepsen.checker.spark import get_spark
from jepsen.checker.synth import generate_log_history
from jepsen.history import History, read_history, validate_shards

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[1]


def _comparable(result: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in result.items() if k != "engine"}
    out["stats"] = {k: v for k, v in result.get("stats", {}).items() if k not in ("format", "search-seconds")}
    return out


def _record(h: History, n: int) -> None:
    """A small queue-shaped history: sends with offsets, polls returning pairs, a fault."""
    p = h.new_process()
    h.nemesis_start("kill", {"nodes": ["n1"]})
    for i in range(n):
        if i % 10:
            h.invoke(p, "send", i, key="q/0")
            h.complete(p, "ok", "send", i, key="q/0", offset=i, node="n2")
        else:
            h.invoke(p, "poll", {"from": 0, "max": 3}, key="q/0")
            h.complete(p, "ok", "poll", [[0, 1], [1, 2]], key="q/0")
    h.invoke(p, "send", "text", key="q/1")
    h.complete(p, "fail", "send", key="q/1", error="refused")
    h.nemesis_end("kill", {"nodes": ["n1"]})


def test_recorded_parts_read_back_as_the_same_events_as_json_lines(tmp_path: Path) -> None:
    for ext in ("jsonl", "parquet"):
        with History(tmp_path / ext / f"shard-00.{ext}", 0) as h:
            _record(h, 500)
    parts = sorted((tmp_path / "parquet").glob("*.parquet"))
    assert parts and all(columnar.shard_name(p) == "shard-00" for p in parts)
    a, b = read_history(tmp_path / "jsonl"), read_history(tmp_path / "parquet")
    assert len(a) == len(b) == 2 * 501 + 2
    strip = [{k: v for k, v in e.items() if k != "time"} for e in a]
    assert strip == [{k: v for k, v in e.items() if k != "time"} for e in b]
    assert validate_shards(tmp_path / "parquet") == []


def test_a_killed_recorder_leaves_whole_parts_up_to_its_last_roll(tmp_path: Path) -> None:
    """SIGKILL mid-recording: every part on disk reads, only the open part is lost."""
    script = (
        "import sys, time\n"
        "from jepsen.history import History\n"
        "h = History(sys.argv[1], 0)\n"
        "p = h.new_process()\n"
        "i = 0\n"
        "while True:\n"
        "    h.invoke(p, 'send', i, key='q/0')\n"
        "    h.complete(p, 'ok', 'send', i, key='q/0', offset=i)\n"
        "    i += 1\n"
        "    if i % 1000 == 0:\n"
        "        time.sleep(0.01)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "h" / "shard-00.parquet")], env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list((tmp_path / "h").glob("*.parquet"))) < 2:
            time.sleep(0.2)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    parts = sorted((tmp_path / "h").glob("*.parquet"))
    assert len(parts) >= 2, "no part was closed within 60 s"
    events = read_history(tmp_path / "h")
    assert events and validate_shards(tmp_path / "h") == []
    assert [e["index"] for e in events] == list(range(len(events)))
    res = analyze_files([tmp_path / "h"], workload="log", out_dir=tmp_path / "out", report=False)
    assert res["files"][0].error is None and res["files"][0].valid is True


def test_export_of_parquet_matches_the_json_lines_it_came_from(tmp_path: Path) -> None:
    generate_log_history(tmp_path / "h.jsonl", 3_000, seed=2, anomalies=True)
    assert shards.to_parquet(tmp_path / "h.jsonl", tmp_path / "pq") > 6_000
    out = tmp_path / "export.jsonl"
    with open(out, "w", encoding="utf-8") as fh:
        shards.export(tmp_path / "pq", fh)
    got = [json.loads(x) for x in out.read_text().splitlines()]
    want = [json.loads(x) for x in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert got == want


def test_bad_parquet_files_are_refused_with_their_name(tmp_path: Path) -> None:
    bad = tmp_path / "garbage"
    bad.mkdir()
    (bad / "shard-00.000001.parquet").write_bytes(b"PAR1 this is not parquet")
    import pyarrow as pa
    import pyarrow.parquet as pq

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    pq.write_table(pa.table({"index": [1], "type": ["ok"]}), wrong / "shard-00.000001.parquet")
    res = analyze_files([bad, wrong], out_dir=tmp_path / "out", report=False, engine="inprocess")
    assert res["exit"] == 3
    e1, e2 = (o.error or "" for o in res["files"])
    assert "garbage" in e1 and "not a readable Parquet file" in e1
    assert "without the contract's column(s)" in e2 and "process" in e2


@pytest.fixture(scope="module")
def spark() -> Any:
    return get_spark()


def test_parquet_histories_get_the_verdicts_of_json_lines_on_both_paths(spark: Any, tmp_path: Path) -> None:
    jsonl = [builder().write(tmp_path / f"{name}.jsonl") for name, (builder, _) in CASES.items()]
    generate_log_history(tmp_path / "synth-bad.jsonl", 6_000, seed=6, anomalies=True)
    jsonl.append(tmp_path / "synth-bad.jsonl")
    pq_dirs = []
    for p in jsonl:
        shards.to_parquet(p, tmp_path / "pq" / p.stem)
        pq_dirs.append(tmp_path / "pq" / p.stem)
    base = analyze_files(jsonl, out_dir=tmp_path / "a", engine="inprocess", report=False)
    fast = analyze_files(pq_dirs, out_dir=tmp_path / "b", engine="inprocess", report=False)
    slow = analyze_files(pq_dirs, out_dir=tmp_path / "c", engine="spark", report=False)
    assert base["exit"] == fast["exit"] == slow["exit"] == 1
    for a, b, c in zip(base["files"], fast["files"], slow["files"], strict=True):
        assert a.error is None and b.error is None and c.error is None, (a.error, b.error, c.error)
        assert b.result["stats"]["format"] == c.result["stats"]["format"] == "parquet"
        assert _comparable(a.result) == _comparable(b.result) == _comparable(c.result), a.path
    assert slow["files"][-1].valid is False


def test_the_run_records_the_format_its_setting_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jepsen.history import DEFAULT_FORMAT, FORMAT_ENV, SHARD_SUFFIXES, shard_path

    monkeypatch.delenv(FORMAT_ENV, raising=False)
    assert shard_path(tmp_path, 3) == tmp_path / f"shard-03{SHARD_SUFFIXES[DEFAULT_FORMAT]}"
    monkeypatch.setenv(FORMAT_ENV, "jsonl")
    assert shard_path(tmp_path, 3) == tmp_path / "shard-03.jsonl"
    monkeypatch.setenv(FORMAT_ENV, "parquet")
    assert shard_path(tmp_path, 0) == tmp_path / "shard-00.parquet"
    monkeypatch.setenv(FORMAT_ENV, "csv")
    with pytest.raises(ValueError, match="must be one of jsonl, parquet"):
        shard_path(tmp_path, 0)


def test_history_export_writes_parquet_parts_and_reads_them_back(tmp_path: Path) -> None:
    generate_log_history(tmp_path / "h.jsonl", 2_000, seed=4)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jepsen", "history", "export", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    made = cli(str(tmp_path / "h.jsonl"), "--parquet", "-o", str(tmp_path / "pq"))
    assert made.returncode == 0, made.stderr
    assert list((tmp_path / "pq").glob("h.*.parquet"))
    again = cli(str(tmp_path / "h.jsonl"), "--parquet", "-o", str(tmp_path / "pq"))
    assert again.returncode != 0 and "is not empty" in again.stderr and "Traceback" not in again.stderr
    back = cli(str(tmp_path / "pq"), "-o", str(tmp_path / "back.jsonl"))
    assert back.returncode == 0, back.stderr
    got = [json.loads(x) for x in (tmp_path / "back.jsonl").read_text().splitlines()]
    assert got == [json.loads(x) for x in (tmp_path / "h.jsonl").read_text().splitlines()]


def test_parquet_shards_are_validated_part_by_part_in_child_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jepsen import history as hmod

    for s in (0, 1):
        with History(tmp_path / f"shard-{s:02d}.parquet", 0, shard=s, shards=2) as h:
            _record(h, 50)
            h.flush()
            h._flush_locked()  # a second part for each shard: a process's events span parts
            _record(h, 50)
    groups = hmod.shard_groups(tmp_path)
    assert [len(g) for g in groups] == [4, 4]  # each nemesis event closes a part too
    monkeypatch.setattr(hmod, "VALIDATE_PARALLEL_BYTES", 0)
    monkeypatch.setattr(hmod.os, "cpu_count", lambda: 2)
    spawned: list[list[str]] = []
    real_popen = hmod.subprocess.Popen
    monkeypatch.setattr(
        hmod.subprocess, "Popen", lambda argv, **kw: spawned.append(argv) or real_popen(argv, **kw)
    )
    assert validate_shards(tmp_path) == []
    assert [a[-5:] for a in spawned] == [[*map(str, g), "2"] for g in groups]


def test_a_reads_pairs_go_to_the_typed_column_only_when_lossless() -> None:
    assert columnar.typed_pairs("poll", "ok", [[0, 1], (1, 2)]) == [[0, 1], (1, 2)]
    assert columnar.typed_pairs("drain", "ok", ()) == []
    for f, typ, value in (
        ("poll", "info", [[0, 1]]),  # not an ok read
        ("send", "ok", [[0, 1]]),  # not a read
        ("poll", "ok", [[0, True]]),  # a bool is not an offset
        ("poll", "ok", [[0, 1 << 63]]),  # does not fit int64
        ("poll", "ok", [[0, 1.5]]),
        ("poll", "ok", [0, 1]),  # not a list of lists
        ("poll", "ok", {"from": 0}),
    ):
        assert columnar.typed_pairs(f, typ, value) is None, (f, typ, value)


def test_recorder_rows_keep_no_lists_and_pairs_are_typed_exactly_when_lossless(tmp_path: Path) -> None:
    """The recorder flattens a read's pairs into its part's buffers (a row holds their count,
    no list for Python's collector to walk); the part holds the same events as JSON Lines."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    values: list[Any] = [
        [[1, 2], [3, 4]],
        [],
        ((8, 9), [5, 6, 7]),
        [[-(1 << 63), (1 << 63) - 1]],
        [[1, True]],  # the rest stay value text (as typed_pairs says)
        [[1, 1 << 63]],
        [[1, 2], "a"],
        [1, 2],
    ]
    events: dict[str, list[dict[str, Any]]] = {}
    for suffix in (".jsonl", ".parquet"):
        h = History(tmp_path / suffix[1:] / f"shard-00{suffix}", 0)
        for v in values:
            p = h.new_process()
            h.invoke(p, "poll", {"from": 0, "max": 4}, key="k")
            h.complete(p, "ok", "poll", v, key="k")
            if h._parts is not None:
                assert all(type(x) in (int, str, type(None)) for row in h._parts.rows for x in row), v
        h.close()
        events[suffix] = [
            {k: x for k, x in e.items() if k != "time"} for e in read_history(tmp_path / suffix[1:])
        ]
    assert events[".parquet"] == events[".jsonl"]
    table = pa.concat_tables(pq.read_table(f) for f in sorted((tmp_path / "parquet").glob("*.parquet")))
    oks = [r for r in table.to_pylist() if r["type"] == "ok"]
    assert [r["pairs"] for r in oks[:4]] == [
        [[1, 2], [3, 4]],
        [],
        [[8, 9], [5, 6, 7]],
        [[-(1 << 63), (1 << 63) - 1]],
    ]
    assert all(r["value"] is None for r in oks[:4])
    assert all(r["pairs"] is None and r["value"] is not None for r in oks[4:])


def test_recorded_pairs_are_typed_on_disk_and_old_parts_read_as_before(spark: Any, tmp_path: Path) -> None:
    """The recorder puts an ok poll's pairs in the typed column (value null there); a part
    written before that column existed (the contract's columns only) reads the same."""
    import pyarrow.parquet as pq

    with History(tmp_path / "new" / "shard-00.parquet", 0) as h:
        _record(h, 300)
    import pyarrow as pa

    table = pa.concat_tables(pq.read_table(f) for f in sorted((tmp_path / "new").glob("*.parquet")))
    polls = [r for r in table.to_pylist() if r["f"] == "poll" and r["type"] == "ok"]
    assert polls and all(r["value"] is None and r["pairs"] == [[0, 1], [1, 2]] for r in polls)
    old = tmp_path / "old"
    old.mkdir()
    rows = [
        {**r, "value": columnar.pairs_text(r["pairs"]) if r["pairs"] is not None else r["value"]}
        for r in table.to_pylist()
    ]
    pq.write_table(
        pa_table(rows, columnar.contract_schema()),
        old / "shard-00.000001.parquet",
    )
    assert read_history(tmp_path / "old") == read_history(tmp_path / "new")
    a = analyze_files(
        [tmp_path / "old", tmp_path / "new"], out_dir=tmp_path / "a", engine="spark", report=False
    )
    b = analyze_files([tmp_path / "new"], out_dir=tmp_path / "b", engine="inprocess", report=False)
    old_res, new_res = (o.result for o in a["files"])
    assert old_res["stats"]["pairs-read"] == new_res["stats"]["pairs-read"] == 2 * 30
    assert _comparable(old_res) == _comparable(new_res) == _comparable(b["files"][0].result)


def pa_table(rows: list[dict[str, Any]], schema: Any) -> Any:
    import pyarrow as pa

    return pa.Table.from_pylist([{k: r[k] for k in schema.names} for r in rows], schema=schema)
