"""Pairing Parquet shards in Arrow (``jepsen/checker/pairing.py``) gives exactly the rows of
Spark's window (``frames.pair_ops``): on well-formed and malformed histories, whatever the
batch size (so across batch and part boundaries), and ``analyze`` takes that path for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jepsen.checker import frames, pairing, shards
from jepsen.checker.analyze import analyze_files
from jepsen.checker.frames import Source
from jepsen.checker.spark import get_spark
from jepsen.checker.synth import generate_log_history

pytestmark = pytest.mark.timeout(600)

FIELDS = ("index", "time", "process", "type", "f", "key", "value", "error", "node", "offset", "pairs")


def _ev(index: int | None, process: str | None, typ: str | None, f: str | None, **kw: Any) -> dict[str, Any]:
    row = dict.fromkeys(FIELDS)
    row.update(index=index, time=None if index is None else 1000 * index, process=process, type=typ, f=f)
    row.update(kw)
    return row


def _odd_events() -> list[dict[str, Any]]:
    """Every shape the pairing must word as the window does, in recording order."""
    return [
        _ev(1, "nemesis", "info", "kill", value='{"nodes":["n1"]}'),
        _ev(2, "1", "invoke", "send", key="q/0", value="10"),
        _ev(3, "2", "invoke", "poll", key="q/0", value='{"from":0,"max":4}'),
        _ev(4, "1", "ok", "send", key="q/0", value="10", offset=0, node="n1"),
        _ev(5, "2", "ok", "poll", key="q/0", pairs=[[0, 10]]),
        _ev(6, "3", "invoke", "send", key="q/1", value="11", node="n2"),
        _ev(7, "3", "invoke", "send", key="q/1", value="12"),  # invokes again
        _ev(8, "3", "ok", "send", key="q/1", value="12", offset=0),
        _ev(9, "4", "ok", "send", key="q/0", value="13"),  # completion without an invoke
        _ev(10, "5", "invoke", "send", key="q/0", value="14"),
        _ev(11, "5", "ok", "poll", key="q/0", value="[]"),  # completion of another f
        _ev(12, "6", "invoke", "send", key="q/0", value="15"),
        _ev(13, "6", "ok", "send", key="q/0", value='{"offset":3,"extra":true}'),  # offset inside
        _ev(14, "7", "invoke", "send", key=None, value="16"),  # no key
        _ev(15, "7", "fail", "send", key=None, error="refused"),
        _ev(16, "8", "invoke", "send", key="q/0", value="17", node="n3"),
        _ev(17, "8", "info", "send", key="q/0", error="timeout"),
        _ev(18, None, "invoke", "send", key="q/0", value="18"),  # no process
        _ev(19, "9", "bogus", "send", key="q/0"),  # a type outside the contract
        _ev(20, "10", None, "send", key="q/0"),  # no type
        _ev(21, "11", "invoke", None, key="q/0"),  # no f
        _ev(None, "12", "invoke", "send", key="q/0"),  # no index
        _ev(22, "13", "invoke", "send", key="q/0", value="19"),  # its completion has another key
        _ev(23, "13", "ok", "send", key="q/1", value="19", offset=1),
        _ev(24, "14", "invoke", "send", key="q/0", value="20", time=None),  # no time
        _ev(25, "14", "ok", "send", key="q/0", value="20", offset=4, time=None),
        _ev(26, "nemesis", "info", "kill", value='{"nodes":["n1"]}'),
        _ev(27, "15", "invoke", "send", key="q/0", value="21"),  # never completed
    ]


def _write_shard(folder: Path, name: str, events: list[dict[str, Any]], per_part: int) -> None:
    """``events`` as the parts of one shard, ``per_part`` events each (a part's columns as the
    recorder writes them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jepsen.checker import columnar

    folder.mkdir(parents=True, exist_ok=True)
    schema = columnar.arrow_schema()
    for n, start in enumerate(range(0, len(events), per_part), 1):
        rows = events[start : start + per_part]
        table = pa.Table.from_pylist([{k: r[k] for k in schema.names} for r in rows], schema=schema)
        pq.write_table(table, columnar.part_path(folder / name, n))


def _rows(batches: Any) -> list[tuple[Any, ...]]:
    out = []
    for b in batches:
        for r in b.to_pylist():
            out.append(tuple(sorted(r.items(), key=lambda kv: kv[0])))
    return sorted(out, key=repr)


def test_a_shard_pairs_the_same_whatever_the_batch(tmp_path: Path) -> None:
    _write_shard(tmp_path, "shard-00", _odd_events(), per_part=5)
    files = [str(f) for f in shards.shard_groups(tmp_path)[0]]
    whole = _rows(pairing.pair_shard(3, files, batch_rows=1000))
    kinds = [dict(r)["kind"] for r in whole]
    assert kinds.count("nemesis") == 2 and kinds.count("bad") >= 7
    for size in (1, 2, 3, 7):
        assert _rows(pairing.pair_shard(3, files, batch_rows=size)) == whole, size
    never = [dict(r) for r in whole if dict(r)["inv_index"] == 27]
    assert never and never[0]["type"] == "info" and never[0]["cmp_index"] is None
    inside = [dict(r) for r in whole if dict(r)["inv_index"] == 12][0]
    assert inside["offset"] == 3 and inside["type"] == "ok"


@pytest.fixture(scope="module")
def spark() -> Any:
    return get_spark()


def _collect(df: Any) -> list[tuple[Any, ...]]:
    rows = [tuple(sorted(r.asDict(recursive=True).items())) for r in df.collect()]
    return sorted(rows, key=repr)


def test_shard_pairing_gives_the_rows_of_the_window(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    odd = tmp_path / "odd"
    events = _odd_events()
    _write_shard(odd, "shard-00", events[:9], per_part=4)  # a process's events in one shard
    _write_shard(odd, "shard-01", events[9:], per_part=3)
    generate_log_history(tmp_path / "synth.jsonl", 3_000, seed=11, anomalies=True)
    shards.to_parquet(tmp_path / "synth.jsonl", tmp_path / "synth")
    sources = [Source(0, str(odd), "parquet"), Source(1, str(tmp_path / "synth"), "parquet")]
    assert frames.shard_pairable(sources)
    monkeypatch.setattr(pairing, "BATCH_ROWS", 5)  # carries across batches and parts
    by_shards = _collect(frames.pair_shards(spark, sources, 4))
    by_window = _collect(frames.pair_ops(frames.load_events(spark, sources), 4))
    assert len(by_shards) == len(by_window) > 3_000
    assert [r for r in by_shards if r not in by_window] == [r for r in by_window if r not in by_shards] == []
    monkeypatch.setenv(frames.PAIRING_ENV, "window")
    assert not frames.shard_pairable(sources)


def test_a_malformed_parquet_history_gets_the_same_error_either_way(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_shard(tmp_path / "odd", "shard-00", _odd_events(), per_part=6)
    a = analyze_files([tmp_path / "odd"], out_dir=tmp_path / "a", engine="spark", report=False)
    monkeypatch.setenv(frames.PAIRING_ENV, "window")
    b = analyze_files([tmp_path / "odd"], out_dir=tmp_path / "b", engine="spark", report=False)
    assert a["exit"] == b["exit"] == 3
    assert a["files"][0].error == b["files"][0].error
    assert str(tmp_path / "odd") in a["files"][0].error


def test_the_shipped_pairing_runs_where_the_project_is_not_installed(tmp_path: Path) -> None:
    """A foreign cluster's Python workers may lack the project: the task carries the pairing's
    code (``pairing.ship_by_value``), so a worker that cannot import ``jepsen`` pairs a shard
    all the same."""
    import json
    import subprocess
    import sys

    from pyspark import cloudpickle

    _write_shard(tmp_path, "shard-00", _odd_events(), per_part=5)
    files = [str(f) for f in shards.shard_groups(tmp_path)[0]]
    pairing.ship_by_value()
    task = lambda: [r for b in pairing.pair_shard(3, files, batch_rows=4) for r in b.to_pylist()]  # noqa: E731
    (tmp_path / "task.pickle").write_bytes(cloudpickle.dumps(task))
    worker = (
        "import json, pickle, sys\n"
        "sys.modules['jepsen'] = None  # no project here: `import jepsen` fails\n"
        "try:\n    import jepsen.checker.pairing\nexcept ImportError:\n    pass\n"
        "else:\n    raise SystemExit('jepsen is importable')\n"
        f"rows = pickle.loads(open({str(tmp_path / 'task.pickle')!r}, 'rb').read())()\n"
        "print(json.dumps(rows, sort_keys=True))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", worker], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    shipped = sorted(json.dumps(r, sort_keys=True) for r in json.loads(out.stdout))
    here = sorted(json.dumps(r, sort_keys=True) for r in task())
    assert shipped == here and len(here) > 10
