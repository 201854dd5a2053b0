"""Both checker paths judge by the same rules: in-process (small inputs) and Spark must agree.

``analyze`` judges small histories in-process (no JVM) and large ones on Spark. A
history must get the same verdict, anomalies, counts, examples and stats whichever
path ran, so every log anomaly history, two synthetic histories (one with planted
bugs) and every Porcupine vector go through both and the results are compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_checker_log import CASES

from jepsen.checker import analyze
from jepsen.checker.analyze import analyze_files, split_by_engine
from jepsen.checker.frames import Source
from jepsen.checker.spark import get_spark, materialize, release
from jepsen.checker.synth import generate_log_history

pytestmark = pytest.mark.timeout(900)

VECTORS = Path(__file__).resolve().parents[2] / "shared" / "vectors" / "porcupine"

# Timing figures differ between two runs of the same search; everything else must not.
TIMING = {"search-seconds"}


def _comparable(result: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in result.items() if k != "engine"}
    out["stats"] = {k: v for k, v in result.get("stats", {}).items() if k not in TIMING}
    return out


def _both(paths: list[Path], out: Path, **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    fast = analyze_files(paths, out_dir=out / "inprocess", engine="inprocess", **kw)
    slow = analyze_files(paths, out_dir=out / "spark", engine="spark", **kw)
    assert all(o.engine == "in-process" for o in fast["files"])
    assert all(o.engine.startswith("spark ") for o in slow["files"])
    return fast, slow


@pytest.fixture(scope="module")
def spark() -> Any:
    return get_spark()


@pytest.mark.parametrize("frames", ["checkpointed", "cached"])
def test_log_histories_agree(
    spark: Any, tmp_path: Path, frames: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small inputs are checked on local checkpoints, large ones on cached frames (planned
    from the cache's own relation, ``spark._cached_leaf``); both must judge alike."""
    if frames == "cached":
        monkeypatch.setattr(analyze, "SMALL_INPUT_BYTES", 0)
    paths = [builder().write(tmp_path / f"{name}.jsonl") for name, (builder, _) in CASES.items()]
    generate_log_history(tmp_path / "synth-clean.jsonl", 6_000, seed=5)
    paths.append(tmp_path / "synth-clean.jsonl")
    generate_log_history(tmp_path / "synth-bad.jsonl", 6_000, seed=6, anomalies=True)
    paths.append(tmp_path / "synth-bad.jsonl")
    fast, slow = _both(paths, tmp_path)
    for a, b in zip(fast["files"], slow["files"], strict=True):
        assert a.error is None and b.error is None, (a.error, b.error)
        assert _comparable(a.result) == _comparable(b.result), a.path
    by_name = {Path(o.path).stem: o for o in fast["files"]}
    for name, (_, expected) in CASES.items():
        assert set(by_name[name].result["anomaly-types"]) == expected, name
    assert by_name["synth-bad"].valid is False
    assert fast["exit"] == slow["exit"] == 1


@pytest.mark.parametrize("names", [("inconsistent-offsets", "clean"), ("duplicate", "inconsistent-offsets")])
def test_inconsistent_offsets_agree_with_and_without_a_value_at_two_offsets(
    spark: Any, tmp_path: Path, names: tuple[str, ...]
) -> None:
    """The Spark check skips its pass over every observation when no value of the analysis was
    seen at two offsets (``log_checker.inconsistent_offsets``): the first set has none, the
    second has one (``duplicate``), and both must still find the inconsistent offset."""
    paths = [CASES[name][0]().write(tmp_path / f"{name}.jsonl") for name in names]
    fast, slow = _both(paths, tmp_path)
    for a, b in zip(fast["files"], slow["files"], strict=True):
        assert a.error is None and b.error is None, (a.error, b.error)
        assert _comparable(a.result) == _comparable(b.result), a.path
        assert set(b.result["anomaly-types"]) == CASES[Path(b.path).stem][1]


@pytest.mark.skipif(not VECTORS.is_dir(), reason=f"no Porcupine vectors at {VECTORS}")
def test_porcupine_vectors_agree(spark: Any, tmp_path: Path) -> None:
    expected = {}
    for line in (VECTORS / "EXPECTED.tsv").read_text().splitlines():
        if line.strip():
            name, verdict = line.split("\t")[:2]
            expected[name] = verdict
    paths = [VECTORS / name for name in expected]
    fast, slow = _both(paths, tmp_path, report=False, budget=30)
    want = {"linearizable": True, "not-linearizable": False}
    for a, b in zip(fast["files"], slow["files"], strict=True):
        name = str(Path(a.path).relative_to(VECTORS))
        assert a.valid is want.get(expected[name], "unknown"), name
        ra, rb = _comparable(a.result), _comparable(b.result)
        # how far a failing prefix was narrowed depends on the search's clock
        for r in (ra, rb):
            for ex in r["anomalies"].get("nonlinearizable", []):
                ex.pop("minimal", None)
        assert ra["valid"] == rb["valid"] and ra["counts"] == rb["counts"], name
        assert ra["stats"] == rb["stats"], name


def test_a_cached_frame_is_planned_from_its_cache_and_released_whole(spark: Any) -> None:
    df = spark.range(100).selectExpr("id", "id % 3 AS k").repartition(2, "k")
    kept = materialize(df, cut_lineage=False)
    plan = kept._jdf.queryExecution().logical()
    assert plan.getClass().getSimpleName() == "InMemoryRelation", plan.toString()
    # its hash partitioning is kept: grouping by k needs no shuffle
    executed = kept.groupBy("k").count()._jdf.queryExecution().executedPlan().toString()
    assert "Exchange" not in executed.split("InMemoryTableScan")[0], executed
    assert sorted(r["count"] for r in kept.groupBy("k").count().collect()) == [33, 33, 34]
    assert df.is_cached
    release(kept)
    assert not df.is_cached


def test_auto_sends_small_files_in_process_and_large_ones_to_spark(tmp_path: Path) -> None:
    small = tmp_path / "small.jsonl"
    generate_log_history(small, 200, seed=1)
    big = tmp_path / "big.jsonl"
    big.write_bytes(b" " * ((8 << 20) + 1))
    srcs = [Source(0, str(small), "jsonl"), Source(1, str(big), "jsonl")]
    fast, slow = split_by_engine(srcs, "auto")
    assert [s.src for s in fast] == [0] and [s.src for s in slow] == [1]
    assert split_by_engine(srcs, "spark") == ([], srcs)
    assert split_by_engine(srcs, "inprocess") == (srcs, [])


def test_small_history_needs_no_jvm(tmp_path: Path) -> None:
    """The in-process path never imports pyspark (checked in a fresh interpreter)."""
    import subprocess
    import sys

    h = tmp_path / "h.jsonl"
    generate_log_history(h, 2_000, seed=2)
    code = (
        "import sys, json\n"
        "from jepsen.checker.analyze import analyze_files\n"
        f"r = analyze_files([{str(h)!r}], out_dir={str(tmp_path / 'o')!r})\n"
        "print(json.dumps([r['files'][0].valid, r['files'][0].engine, 'pyspark' in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == '[true, "in-process", false]', out.stderr


def test_both_paths_give_the_report_the_same_plot_rows(tmp_path: Path) -> None:
    """Spark's one timeline job and the in-process pass hand the report the same rows: the
    sampled operations (all of them, under the points limit), binned throughput and nemesis
    events; and the same faults."""
    from jepsen.checker.analyze import FileOutcome

    h = tmp_path / "h.jsonl"
    generate_log_history(h, 3_000, seed=5)
    plots: dict[str, dict[int, dict[str, Any]]] = {}
    faults = {}
    for engine, run in (("inprocess", analyze._check_in_process), ("spark", analyze._check_sources)):
        outcomes = [FileOutcome(str(h), tmp_path / engine)]
        src = [Source(0, str(h), "jsonl", None)]
        plots[engine] = {}
        if engine == "inprocess":
            run(src, outcomes, None, 10.0, plots[engine], True)
        else:
            run(src, outcomes, None, None, 10.0, plots[engine], True)
        faults[engine] = outcomes[0].result["faults"]
    fast, slow = plots["inprocess"][0], plots["spark"][0]
    assert len(fast["ops"]) == 3_000 and len(fast["nemesis"]) == 8, fast["nemesis"]
    for k in ("ops", "throughput"):
        assert sorted(fast[k], key=repr) == sorted(slow[k], key=repr), k
    assert fast["nemesis"] == slow["nemesis"]
    assert {k: v for k, v in fast.items() if k not in ("ops", "throughput")} == {
        k: v for k, v in slow.items() if k not in ("ops", "throughput")
    }
    assert faults["inprocess"] == faults["spark"] and len(faults["spark"]) == 2
