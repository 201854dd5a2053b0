"""Recovery per fault from hand-made histories, sharded recording, and the shard readers.

The recovery figures are the checker's (``jepsen.checker.recovery``) and the histories
here are written by hand so that every figure is known in advance: a fault the group
recovers from, one it never recovers from, and one with no traffic before it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from jepsen.checker import parse, recovery, shards
from jepsen.checker.inprocess import pair
from jepsen.cli import main as jepsen_main
from jepsen.history import History, read_history, validate_shards

MS = 1_000_000
S = 1_000 * MS


class Writer:
    """A hand-made history in the contract's JSON Lines."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def ev(self, t: int, process, type_: str, f: str, value=None, key: str | None = None) -> None:
        e = {"index": len(self.events), "time": t, "process": process, "type": type_, "f": f, "value": value}
        if key is not None:
            e["key"] = key
        self.events.append(e)

    def op(self, p: int, t_inv: int, t_cmp: int, type_: str, key: str, v: int) -> None:
        self.ev(t_inv, p, "invoke", "send", v, key)
        self.ev(t_cmp, p, type_, "send", v, key)

    def nemesis(self, t0: int, t1: int, f: str, nodes: list[str], fault: str = "kill-leader") -> None:
        self.ev(t0, "nemesis", "info", f, {"nodes": nodes, "fault": fault})
        self.ev(t1, "nemesis", "info", f, {"nodes": nodes, "fault": fault})

    def write(self, path: Path) -> Path:
        self.events.sort(key=lambda e: e["time"])
        for i, e in enumerate(self.events):
            e["index"] = i
        path.write_text("".join(json.dumps(e) + "\n" for e in self.events))
        return path


def _faults(path: Path) -> list[dict]:
    return recovery.faults_from_rows(pair(0, parse.read_events(path)))


def _steady(w: Writer, p: int, key: str, start: int, end: int, step: int, latency: int, v0: int) -> int:
    """One client sending back to back on ``key`` from ``start`` to ``end``; returns the next value."""
    t, v = start, v0
    while t + latency <= end:
        w.op(p, t, t + latency, "ok", key, v)
        t += step
        v += 1
    return v


def test_recovery_gap_and_rates_of_a_recovered_kill(tmp_path):
    w = Writer()
    # two keys served every 100 ms (10 ms latency) for 10 s; kill at 10 s, restart at 13 s
    v = _steady(w, 1, "a", 0, 10 * S, 100 * MS, 10 * MS, 1)
    v = _steady(w, 2, "b", 0, 10 * S, 100 * MS, 10 * MS, v)
    w.nemesis(10 * S, 10 * S + 5 * MS, "kill", ["n1"])
    # key a: an op invoked before the kill completes after it (it must not count as recovery)
    w.op(3, 10 * S - 50 * MS, 10 * S + 900 * MS, "ok", "a", v)
    # key a recovers at 11.5 s (invoked 11.2 s), key b at 12.25 s (invoked 12.2 s): recovery 2250 ms
    w.op(4, 11 * S + 200 * MS, 11 * S + 500 * MS, "ok", "a", v + 1)
    w.op(5, 12 * S + 200 * MS, 12 * S + 250 * MS, "ok", "b", v + 2)
    w.nemesis(13 * S, 13 * S + 20 * MS, "restart", ["n1"])
    v = _steady(w, 6, "a", 14 * S, 20 * S, 100 * MS, 10 * MS, v + 3)
    (x,) = _faults(w.write(tmp_path / "h.jsonl"))
    assert x["f"] == "kill" and x["kind"] == "kill-leader" and x["nodes"] == ["n1"]
    assert x["start_s"] == pytest.approx(10.0) and x["end_s"] == pytest.approx(13.02)
    assert x["recovery_ms"] == pytest.approx(2250.0)
    assert x["keys"] == 2
    # no ok completion between 12.25 s and the first op after the restart at 14.01 s
    assert x["gap_ms"] == pytest.approx(1760.0, abs=2)
    assert x["ok_per_s_before"] == pytest.approx(20.0, rel=0.06)  # two keys, 10/s each
    assert x["ok_per_s_during"] == pytest.approx(3 / 3.02, rel=0.01)  # the three ok in the window
    assert x["ok_per_s_after"] == pytest.approx(60 / 7.0, rel=0.05)  # ~60 ops from 14 s to 20.01 s


def test_a_key_that_never_recovers_gives_null(tmp_path):
    w = Writer()
    v = _steady(w, 1, "a", 0, 5 * S, 100 * MS, 10 * MS, 1)
    v = _steady(w, 2, "b", 0, 5 * S, 100 * MS, 10 * MS, v)
    w.nemesis(5 * S, 5 * S + MS, "start-partition", ["n1", "n2"], "partition-leader")
    _steady(w, 3, "a", 6 * S, 9 * S, 100 * MS, 10 * MS, v)  # only key a comes back
    w.op(4, 6 * S, 7 * S, "info", "b", 10_000)  # b's client times out: info is not ok
    w.nemesis(8 * S, 8 * S + MS, "stop-partition", ["n1", "n2"], "partition-leader")
    (x,) = _faults(w.write(tmp_path / "h.jsonl"))
    assert x["f"] == "start-partition" and x["end_s"] == pytest.approx(8.001)
    assert x["recovery_ms"] is None
    assert x["unrecovered_keys"] == ["b"]
    summary = recovery.summarize([x])
    assert (
        summary["partition-leader"]["recovered"] == 0
        and summary["partition-leader"]["recovery_p50_ms"] is None
    )


def test_no_traffic_before_the_fault_and_a_fault_never_healed(tmp_path):
    w = Writer()
    w.nemesis(1 * S, 1 * S + MS, "kill", ["n3"], "kill-random")
    _steady(w, 1, "a", 2 * S, 4 * S, 100 * MS, 10 * MS, 1)
    (x,) = _faults(w.write(tmp_path / "h.jsonl"))
    assert x["recovery_ms"] is None and "no ok operation" in x["note"]
    assert x["end_s"] is None  # never healed: the window runs to the end of the history
    assert x["ok_per_s_before"] == 0.0 and x["ok_per_s_during"] > 0


def test_jepsen_style_nemesis_pairs_start_stop(tmp_path):
    """Jepsen's partitioner: an info pair :start then an info pair :stop (no value dicts)."""
    w = Writer()
    v = _steady(w, 1, "0", 0, 3 * S, 100 * MS, 10 * MS, 1)
    w.ev(3 * S, "nemesis", "info", "start", None)
    w.ev(3 * S + MS, "nemesis", "info", "start", "Cut off {n1 #{n2 n3}}")
    _steady(w, 2, "0", 3 * S + 500 * MS, 5 * S, 100 * MS, 10 * MS, v)
    w.ev(5 * S, "nemesis", "info", "stop", None)
    w.ev(5 * S + MS, "nemesis", "info", "stop", "fully connected")
    (x,) = _faults(w.write(tmp_path / "h.jsonl"))
    assert (x["f"], x["kind"], x["nodes"]) == ("start", "start", [])
    assert x["end_s"] == pytest.approx(5.001)
    assert x["recovery_ms"] == pytest.approx(510.0)


def test_sharded_recording_keeps_indexes_processes_and_values_apart(tmp_path):
    hist = tmp_path / "history"
    controller = History(hist / "shard-00.jsonl", shards=3)  # records nothing here
    origin = controller.clock_origin_ns
    controller.close()
    recs = [History(hist / f"shard-{s:02d}.jsonl", origin, shard=s, shards=3) for s in (1, 2)]
    for h in recs:
        for _ in range(3):
            p = h.new_process()
            h.invoke(p, "send", p, key="k")
            h.complete(p, "ok", "send", p, key="k", offset=0)
        p = h.new_process()
        h.invoke(p, "send", -p, key="k")
        h.complete(p, "info", "send", -p, key="k")
        with pytest.raises(Exception, match="may not be reused"):
            h.invoke(p, "send", 1, key="k")
        h.close()
    events = read_history(hist)
    assert len(events) == 16
    assert len({e["index"] for e in events}) == 16
    assert {e["process"] for e in read_history(hist / "shard-01.jsonl")}.isdisjoint(
        {e["process"] for e in read_history(hist / "shard-02.jsonl")}
    )
    for s in (1, 2):  # each shard in its own index and time order
        own = read_history(hist / f"shard-{s:02d}.jsonl")
        assert [e["index"] for e in own] == sorted(e["index"] for e in own)
        assert [e["time"] for e in own] == sorted(e["time"] for e in own)
        assert all(e["index"] % 3 == s and e["process"] % 3 == s for e in own)
    assert validate_shards(hist) == []
    # a shard whose indexes collide with another's is caught
    bad = [json.loads(line) for line in (hist / "shard-02.jsonl").read_text().splitlines()]
    for e in bad:
        e["index"] = e["index"] - 1  # now the residue of shard 1
    (hist / "shard-02.jsonl").write_text("".join(json.dumps(e) + "\n" for e in bad))
    assert any("may share indexes" in p for p in validate_shards(hist))


def test_big_histories_are_validated_in_worker_processes_with_the_same_findings(tmp_path, monkeypatch):
    """Shards are validated side by side in child processes when the history is big; what
    they find (each shard's own violations, and processes or indexes shared across shards)
    is what one process finds."""
    from jepsen import history as hmod

    hist = tmp_path / "history"
    hist.mkdir()
    rows = {1: [], 2: []}
    for s in (1, 2):
        for k in range(200):
            p = s + 3 * k
            rows[s] += [
                {
                    "index": 6 * k + s,
                    "time": 10 * k,
                    "process": p,
                    "type": "invoke",
                    "f": "send",
                    "key": "q",
                    "value": p,
                },
                {
                    "index": 6 * k + s + 3,
                    "time": 10 * k + 5,
                    "process": p,
                    "type": "ok",
                    "f": "send",
                    "key": "q",
                    "value": p,
                },
            ]
    rows[2][5]["type"] = "invoke"  # shard 2: a process invokes again with an operation outstanding
    rows[2][10]["process"] = 1  # and a process of shard 1 appears in shard 2
    for s, evs in rows.items():
        (hist / f"shard-{s:02d}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    alone = validate_shards(hist)
    assert any("shard-02.jsonl: event" in p for p in alone), alone
    assert any("process 1 appears in shard-01.jsonl and shard-02.jsonl" in p for p in alone), alone
    monkeypatch.setattr(hmod, "VALIDATE_PARALLEL_BYTES", 0)
    monkeypatch.setattr(hmod.os, "cpu_count", lambda: 2)  # side by side even on a one-core machine
    spawned = []
    real_popen = hmod.subprocess.Popen
    monkeypatch.setattr(
        hmod.subprocess, "Popen", lambda argv, **kw: spawned.append(argv) or real_popen(argv, **kw)
    )
    assert validate_shards(hist) == alone
    assert [a[-2:] for a in spawned] == [
        [str(hist / "shard-01.jsonl"), "2"],
        [str(hist / "shard-02.jsonl"), "2"],
    ]


def test_export_merges_shards_in_time_order_and_resolve_finds_them(tmp_path):
    run = tmp_path / "run"
    hist = run / "history"
    hist.mkdir(parents=True)
    a = [
        {
            "index": i * 2,
            "time": t,
            "process": 0,
            "type": "invoke" if i % 2 == 0 else "ok",
            "f": "send",
            "value": 1,
        }
        for i, t in enumerate((5, 9, 20, 21))
    ]
    b = [
        {
            "index": i * 2 + 1,
            "time": t,
            "process": 1,
            "type": "invoke" if i % 2 == 0 else "ok",
            "f": "send",
            "value": 2,
        }
        for i, t in enumerate((1, 7, 8, 30))
    ]
    (hist / "shard-00.jsonl").write_text("".join(json.dumps(e) + "\n" for e in a))
    (hist / "shard-01.jsonl").write_text("".join(json.dumps(e) + "\n" for e in b))
    assert shards.resolve(run) == (str(hist), "jsonl")
    assert shards.resolve(hist) == (str(hist), "jsonl")
    out = CliRunner().invoke(jepsen_main, ["history", "export", str(run)])
    assert out.exit_code == 0, out.output
    merged = [json.loads(line) for line in (run / "history-export.jsonl").read_text().splitlines()]
    assert [e["time"] for e in merged] == [1, 5, 7, 8, 9, 20, 21, 30]
    # a broken line is named with its shard and line, not a traceback
    (hist / "shard-01.jsonl").write_text('{"index": 1, "time": 3}\nnot json\n')
    out = CliRunner().invoke(jepsen_main, ["history", "export", str(run), "-o", "-"])
    assert out.exit_code == 1 and "shard-01.jsonl:2" in out.output
    with pytest.raises(parse.HistoryError, match="without history shards"):
        shards.resolve(tmp_path)


@pytest.mark.slow
def test_spark_reads_a_shard_folder_and_agrees_on_recovery(tmp_path):
    """The Spark path (folder of shards, grouped aggregates) gives the in-process figures."""
    from jepsen.checker.analyze import analyze_files

    w = Writer()
    v = _steady(w, 1, "a", 0, 4 * S, 50 * MS, 7 * MS, 1)
    v = _steady(w, 2, "b", 0, 4 * S, 50 * MS, 9 * MS, v)
    w.nemesis(4 * S, 4 * S + MS, "kill", ["n2"])
    v = _steady(w, 3, "a", 4 * S + 300 * MS, 9 * S, 50 * MS, 7 * MS, v)
    w.nemesis(6 * S, 6 * S + MS, "restart", ["n2"])
    _steady(w, 4, "b", 4 * S + 700 * MS, 9 * S, 50 * MS, 9 * MS, v)
    w.write(tmp_path / "all.jsonl")
    hist = tmp_path / "run" / "history"
    hist.mkdir(parents=True)
    odd = [e for e in w.events if e["process"] == "nemesis" or e["process"] % 2]
    even = [e for e in w.events if e["process"] != "nemesis" and not e["process"] % 2]
    (hist / "shard-00.jsonl").write_text("".join(json.dumps(e) + "\n" for e in odd))
    (hist / "shard-01.jsonl").write_text("".join(json.dumps(e) + "\n" for e in even))
    (hist / "notes.txt").write_text("not a shard: never read\n")
    figures = {}
    for engine in ("spark", "inprocess"):
        res = analyze_files(
            [tmp_path / "run"], workload="log", out_dir=tmp_path / engine, engine=engine, report=False
        )
        (o,) = res["files"]
        assert o.error is None and o.valid is True, o.error
        assert o.ops == len(w.events) // 2 - 2
        figures[engine] = o.result["faults"]
    (x,) = figures["spark"]
    assert x["recovery_ms"] == pytest.approx(709.0)  # key b's first op after the kill: 4.7 s + 9 ms
    assert figures["spark"] == figures["inprocess"]


def test_the_pause_before_the_final_drain_is_not_a_gap(tmp_path):
    """A fault in a run's last 10 s: its after window and gap stop where the load stopped, not at
    the final drain seconds later (the harness heals, waits for a leader, then drains)."""
    w = Writer()
    v = _steady(w, 1, "a", 0, 20 * S, 100 * MS, 10 * MS, 1)
    w.nemesis(15 * S, 15 * S + 5 * MS, "kill", ["n1"])  # the client never notices: steady throughout
    w.nemesis(16 * S, 16 * S + 5 * MS, "restart", ["n1"])
    w.ev(24 * S, 9, "invoke", "drain", {"from": 0, "max": None}, "a")
    w.ev(25 * S, 9, "ok", "drain", [[i, i + 1] for i in range(v - 1)], "a")
    path = w.write(tmp_path / "h.jsonl")
    (x,) = _faults(path)
    assert x["gap_ms"] == pytest.approx(100.0, abs=2)  # the steady 100 ms between completions
    assert x["ok_per_s_after"] == pytest.approx(10.0, rel=0.05)  # 16 s to 19.91 s: ten a second
    # without the drain, the history ends with the load: the same figures
    w.events = [e for e in w.events if e["f"] != "drain"]
    (y,) = _faults(w.write(tmp_path / "no-drain.jsonl"))
    assert (y["gap_ms"], y["ok_per_s_after"]) == (x["gap_ms"], x["ok_per_s_after"])
    # the Spark path agrees
    from jepsen.checker.analyze import analyze_files

    res = analyze_files([path], workload="log", out_dir=tmp_path / "spark", engine="spark", report=False)
    (o,) = res["files"]
    assert o.error is None and o.valid is True, o.error
    (z,) = o.result["faults"]
    assert (z["gap_ms"], z["ok_per_s_after"]) == (x["gap_ms"], x["ok_per_s_after"])


def test_the_index_from_spark_columns_answers_as_the_one_from_rows() -> None:
    """``timeline.collect`` hands recovery its aggregates as Arrow/numpy columns (chunked, and
    a key may be missing); the in-process path builds the index from tuples. Same answers."""
    import random

    import numpy as np
    import pyarrow as pa

    ms = recovery.BUCKET_NS
    rnd = random.Random(3)
    first: dict[tuple[str, int], int] = {}
    done: dict[tuple[str, int], int] = {}
    for _ in range(2000):
        key = rnd.choice(["t/a/0", "t/b/1", ""])
        inv = rnd.randrange(0, 900) * ms + rnd.randrange(ms)
        t = inv + rnd.randrange(30 * ms)
        first[(key, inv // ms)] = min(t, first.get((key, inv // ms), t))
        done[(key, t // ms)] = done.get((key, t // ms), 0) + 1

    def columns(d: dict[tuple[str, int], int]) -> tuple[pa.ChunkedArray, np.ndarray, np.ndarray]:
        keys = [k or None for k, _ in d]  # Spark's column may hold a null where rows have ""
        half = len(keys) // 2
        return (
            pa.chunked_array([pa.array(keys[:half], pa.string()), pa.array(keys[half:], pa.string())]),
            np.array([b for _, b in d], np.int64),
            np.array(list(d.values()), np.int64),
        )

    rows = recovery.OkIndex(
        [(k, b, t) for (k, b), t in first.items()], [(k, b, n) for (k, b), n in done.items()]
    )
    cols = recovery.OkIndex.from_columns(columns(first), columns(done))
    checked = 0
    for lo in range(-5 * ms, 950 * ms, 7 * ms + 13):
        for hi in (lo + 3 * ms, lo + 60 * ms, lo):
            assert sorted(rows.keys_active(lo, hi)) == sorted(cols.keys_active(lo, hi))
            assert rows.count(lo, hi) == cols.count(lo, hi)
            assert rows.longest_gap(lo, hi) == cols.longest_gap(lo, hi)
            for key in ("t/a/0", "t/b/1", "", "t/none/2"):
                assert rows.first_ok_after(key, lo) == cols.first_ok_after(key, lo)
                checked += 1
    assert checked > 1000 and rows.count(0, 10**6 * ms) == sum(done.values())
    empty = recovery.OkIndex.from_columns(None, None)
    assert empty.keys_active(0, ms) == [] and empty.count(0, ms) == 0 and empty.longest_gap(0, ms) == 1.0
