"""The log workload checker: one hand-made history per anomaly, each with exactly that anomaly.

A checker that cannot fail is a defect, so every anomaly of docs/history.md gets a small
history that has it and nothing else, and the clean history must have none. All of
them (plus synthetic ones) go through ONE analyze call: one set of Spark jobs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jepsen.checker.analyze import analyze_files
from jepsen.checker.log_checker import ERRORS, EXAMPLES
from jepsen.checker.spark import get_spark
from jepsen.checker.synth import generate_log_history

pytestmark = pytest.mark.timeout(600)

MS = 1_000_000


class H:
    """Collects operations, then writes them as docs/history.md JSON Lines in time order."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def op(
        self,
        p: int | str,
        f: str,
        t0: float,
        t1: float | None,
        value: Any = None,
        *,
        key: str | None = "q",
        typ: str = "ok",
        result: Any = None,
        offset: int | None = None,
        error: str | None = None,
    ) -> H:
        inv: dict[str, Any] = {"time": int(t0 * MS), "process": p, "type": "invoke", "f": f, "value": value}
        if key is not None:
            inv["key"] = key
        self.events.append(inv)
        if t1 is not None:
            done: dict[str, Any] = {
                "time": int(t1 * MS),
                "process": p,
                "type": typ,
                "f": f,
                "value": result if result is not None else value,
            }
            if key is not None:
                done["key"] = key
            if offset is not None:
                done["offset"] = offset
            if error is not None:
                done["error"] = error
            self.events.append(done)
        return self

    def send(
        self,
        p: int,
        v: int,
        off: int | None,
        t0: float,
        t1: float | None = None,
        typ: str = "ok",
        key: str = "q",
    ) -> H:
        return self.op(
            p,
            "send",
            t0,
            t0 + 1 if t1 is None else t1,
            v,
            key=key,
            typ=typ,
            offset=off if typ == "ok" else None,
            error={"info": "timeout", "fail": "not-leader"}.get(typ),
        )

    def poll(self, p: int, frm: int, mx: int, pairs: list[list[int]], t0: float, key: str = "q") -> H:
        return self.op(p, "poll", t0, t0 + 1, {"from": frm, "max": mx}, key=key, result=pairs)

    def drain(self, p: int, pairs: list[list[int]], t0: float, key: str = "q") -> H:
        return self.op(p, "drain", t0, t0 + 1, {"from": 0}, key=key, result=pairs)

    def drain_pages(self, p: int, pages: list[list[list[int]]], mx: int, t0: float, key: str = "q") -> H:
        """One drain recorded page by page (docs/history.md, "Drain pages"): each page asks for
        ``mx`` pairs from just past the last offset before it."""
        frm = 0
        for i, pairs in enumerate(pages):
            self.op(p, "drain", t0 + 2 * i, t0 + 2 * i + 1, {"from": frm, "max": mx}, key=key, result=pairs)
            if pairs:
                frm = pairs[-1][0] + 1
        return self

    def nemesis(self, f: str, t0: float, t1: float, nodes: list[str]) -> H:
        for t in (t0, t1):
            self.events.append(
                {"time": int(t * MS), "process": "nemesis", "type": "info", "f": f, "value": nodes}
            )
        return self

    def write(self, path: Path) -> Path:
        evs = sorted(self.events, key=lambda e: e["time"])
        with open(path, "w") as fh:
            for i, e in enumerate(evs):
                fh.write(json.dumps({"index": i, **e}) + "\n")
        return path


DRAIN = [[0, 1], [1, 2], [2, 3], [3, 5]]


def clean(
    poll2: tuple[int, list[list[int]]] = (2, [[2, 3]]),
    poll3: tuple[int, list[list[int]]] = (3, [[3, 5]]),
    drain: list[list[int]] | None = None,
    page: int | None = None,
) -> H:
    """Two producers, a consumer, a fault, a drain; one info send lands, one does not.

    The anomaly cases below are this history with one thing changed. ``page``: key q's drain
    recorded in pages of that many pairs (the last one short, possibly empty), not as one event.
    """
    h = H()
    h.send(0, 1, 0, 1).send(1, 2, 1, 3).send(0, 3, 2, 5)
    h.poll(5, 0, 2, [[0, 1], [1, 2]], 7).poll(5, poll2[0], 2, poll2[1], 9)
    h.nemesis("kill", 10, 10.5, ["n1"]).nemesis("restart", 14, 14.5, ["n1"])
    h.send(2, 4, None, 11, None, typ="info")  # never seen: unseen-info
    h.send(3, 5, None, 11.5, None, typ="info")  # lands at offset 3: recovered
    h.send(4, 6, None, 12, typ="fail")  # certainly not in the log
    h.send(1, 7, 0, 13, key="r")  # a second key
    h.poll(5, poll3[0], 2, poll3[1], 16)
    pairs = DRAIN if drain is None else drain
    if page is None:
        h.drain(9, pairs, 20)
    else:
        h.drain_pages(9, [pairs[i : i + page] for i in range(0, len(pairs) + 1, page)], page, 20)
    h.drain(9, [[0, 7]], 28, key="r")
    return h


def drain_in_pages() -> H:
    """Key q's drain as pages of 2 ([0-1], [2-3], []): together they are the final drain; a full
    page does not claim the end (else offset 3, acknowledged before it, would be a stale read)."""
    return clean(page=2)


def lost_write_later_page() -> H:
    return clean(drain=[[0, 1], [1, 2], [3, 5]], page=2)  # value 3 (offset 2) missing from page 2


def unfinished_later_drain() -> H:
    """A second drain stopped after its first full page (its next page failed): not a whole
    drain, so the whole one before it judges (judged alone, it would lose value 3)."""
    h = clean()
    h.drain_pages(10, [[[0, 1], [1, 2]]], 2, 30)
    h.op(10, "drain", 32, 33, {"from": 2, "max": 2}, typ="fail", result=None, error="timed out")
    return h


def lost_write_drain() -> H:
    return clean(drain=[[0, 1], [2, 3], [3, 5]])  # value 2 (acked at offset 1) vanished


def lost_write_reach() -> H:
    """No drain; value 2 (offset 1) was never read though a later poll read offset 2."""
    h = H()
    h.send(0, 1, 0, 1).send(1, 2, 1, 3).send(0, 3, 2, 5)
    h.poll(5, 0, 1, [[0, 1]], 7)
    h.poll(6, 2, 5, [[2, 3]], 9)
    return h


def duplicate() -> H:
    return clean(drain=[*DRAIN, [4, 3]])


def inconsistent_offsets() -> H:
    h = clean(drain=[[0, 1], [1, 2], [2, 3], [3, 8]])  # the drain sees 8 where a poll saw 5
    h.send(7, 8, None, 11.7, None, typ="info")
    return h


def g1a() -> H:
    return clean(drain=[*DRAIN, [4, 6]])


def unexpected() -> H:
    return clean(drain=[*DRAIN, [4, 99]])


def nonmonotonic_send() -> H:
    h = H()
    h.send(0, 1, 1, 1).send(0, 2, 0, 3)  # same process: later send, lower offset
    h.send(1, 3, 2, 5)
    h.drain(9, [[0, 2], [1, 1], [2, 3]], 20)
    return h


def realtime_order() -> H:
    h = H()
    h.send(0, 1, 1, 1).send(1, 2, 0, 3)  # 1 acked before 2 was invoked, yet 2 is earlier
    h.send(0, 3, 2, 5)
    h.drain(9, [[0, 2], [1, 1], [2, 3]], 20)
    return h


def stale_read() -> H:
    h = H()
    h.send(0, 1, 0, 1).send(1, 2, 1, 3)
    h.poll(5, 0, 10, [[0, 1]], 5)  # claims the end at offset 0 though offset 1 was acked at t=4
    h.poll(5, 1, 10, [[1, 2]], 7)
    h.drain(9, [[0, 1], [1, 2]], 20)
    return h


def poll_skip() -> H:
    return clean(poll2=(2, [[3, 5]]), poll3=(4, []))  # from offset 1 straight to 3


def nonmonotonic_poll() -> H:
    return clean(poll2=(1, [[1, 2], [2, 3]]))  # went back to offset 1


# name -> (builder, the error anomalies it must report, exactly)
CASES: dict[str, tuple[Callable[[], H], set[str]]] = {
    "clean": (clean, set()),
    "lost-write-drain": (lost_write_drain, {"lost-write"}),
    "drain-in-pages": (drain_in_pages, set()),
    "lost-write-later-page": (lost_write_later_page, {"lost-write"}),
    "unfinished-later-drain": (unfinished_later_drain, set()),
    "lost-write-reach": (lost_write_reach, {"lost-write"}),
    "duplicate": (duplicate, {"duplicate"}),
    "inconsistent-offsets": (inconsistent_offsets, {"inconsistent-offsets"}),
    "G1a": (g1a, {"G1a"}),
    "unexpected": (unexpected, {"unexpected"}),
    "nonmonotonic-send": (nonmonotonic_send, {"nonmonotonic-send"}),
    "realtime-order": (realtime_order, {"realtime-order"}),
    "stale-read": (stale_read, {"stale-read"}),
    "poll-skip": (poll_skip, {"poll-skip"}),
    "nonmonotonic-poll": (nonmonotonic_poll, {"nonmonotonic-poll"}),
}


@pytest.fixture(scope="module")
def spark() -> Any:
    return get_spark()


@pytest.fixture(scope="module")
def checked(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case plus two synthetic histories, analyzed in one call."""
    d = tmp_path_factory.mktemp("log-histories")
    paths = [builder().write(d / f"{name}.jsonl") for name, (builder, _) in CASES.items()]
    generate_log_history(d / "synth-clean.jsonl", 20_000, seed=3)
    generate_log_history(d / "synth-bad.jsonl", 20_000, seed=4, anomalies=True)
    paths += [d / "synth-clean.jsonl", d / "synth-bad.jsonl"]
    out = d / "out"
    res = analyze_files(paths, workload=None, out_dir=out)
    return {"res": res, "out": out, "by_name": {Path(o.path).stem: o for o in res["files"]}}


@pytest.mark.parametrize("name", list(CASES))
def test_each_history_reports_exactly_its_anomaly(checked: dict[str, Any], name: str) -> None:
    o = checked["by_name"][name]
    expected = CASES[name][1]
    assert o.error is None, o.error
    assert o.workload == "log"
    assert set(o.result["anomaly-types"]) == expected, o.result["counts"]
    assert o.valid is (not expected)
    for anomaly in expected:
        examples = o.result["anomalies"][anomaly]
        assert 1 <= len(examples) <= EXAMPLES
        assert o.result["counts"][anomaly] >= len(examples)
        assert "time" in json.dumps(examples[0])  # the operations come with their times


def test_every_anomaly_of_the_contract_is_exercised() -> None:
    covered = set().union(*(exp for _, exp in CASES.values()))
    assert covered == set(ERRORS)


def test_clean_history_is_valid_with_its_informational_findings(checked: dict[str, Any]) -> None:
    r = checked["by_name"]["clean"].result
    assert r["valid"] is True and r["anomaly-types"] == []
    assert r["counts"] == {"recovered": 1, "unseen-info": 1}
    recovered = r["anomalies"]["recovered"][0]
    assert recovered["value"] == 5 and {o["f"] for o in recovered["ops"]} == {"send", "poll", "drain"}
    assert r["anomalies"]["unseen-info"][0]["value"] == 4
    st = r["stats"]
    assert st["keys"] == 2 and st["sends-ok"] == 4 and st["drains-ok"] == 2 and st["nemesis-events"] == 4


def test_examples_name_the_operations_involved(checked: dict[str, Any]) -> None:
    lost = checked["by_name"]["lost-write-drain"].result["anomalies"]["lost-write"][0]
    assert lost["value"] == 2 and lost["missing-from-drain"]["invoke-index"] > 0
    send = next(o for o in lost["ops"] if o["f"] == "send")
    assert send["offset"] == 1 and send["type"] == "ok" and send["complete-time"] > send["invoke-time"]
    reach = checked["by_name"]["lost-write-reach"].result["anomalies"]["lost-write"][0]
    assert reach["value"] == 2 and reach["send"]["offset"] == 1 and reach["read"]["last-offset"] == 2
    dup = checked["by_name"]["duplicate"].result["anomalies"]["duplicate"][0]
    assert dup["value"] == 3 and dup["offsets"] == [2, 4]
    inc = checked["by_name"]["inconsistent-offsets"].result["anomalies"]["inconsistent-offsets"][0]
    assert inc["offset"] == 3 and inc["values"] == [5, 8]
    rt = checked["by_name"]["realtime-order"].result["anomalies"]["realtime-order"][0]
    assert rt["completed-before"]["value"] == 1 and rt["later-lower"]["value"] == 2
    stale = checked["by_name"]["stale-read"].result["anomalies"]["stale-read"][0]
    assert stale["reached"] == 0 and stale["acknowledged-before"]["offset"] == 1
    paged = checked["by_name"]["lost-write-later-page"].result["anomalies"]["lost-write"][0]
    assert paged["value"] == 3 and paged["missing-from-drain"] == lost["missing-from-drain"]
    skip = checked["by_name"]["poll-skip"].result["anomalies"]["poll-skip"][0]
    assert skip["expected-from"] == 2 and skip["got"] == 3 and skip["skipped-known-offsets"] == 1


def test_synthetic_histories(checked: dict[str, Any]) -> None:
    clean = checked["by_name"]["synth-clean"]
    assert clean.valid is True, clean.result["counts"]
    assert clean.ops == 20_000
    bad = checked["by_name"]["synth-bad"]
    assert bad.valid is False
    assert {"lost-write", "duplicate", "G1a"} <= set(bad.result["anomaly-types"])


def test_outputs_written(checked: dict[str, Any]) -> None:
    out: Path = checked["out"]
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary) == len(CASES) + 2
    assert all(v is (not CASES[Path(p).stem][1]) for p, v in summary.items() if Path(p).stem in CASES)
    page = (out / "synth-clean" / "report.html").read_text()
    assert "VALID" in page and page.count("data:image/png;base64,") == 3  # latency, throughput, offsets
    bad = (out / "lost-write-drain" / "report.html").read_text()
    assert "INVALID" in bad and "lost-write" in bad
    res = json.loads((out / "lost-write-drain" / "results.json").read_text())
    assert res["valid"] is False and res["workload"] == "log" and res["anomaly-types"] == ["lost-write"]
    assert checked["res"]["exit"] == 1


#: Spark jobs a small valid log history's analysis may run: the overview (which also pairs
#: the operations), Spark's broadcasts of the small per-key frames (last drains, their pages,
#: the keys to search: 5), the one job of every check with its figures and counts, the
#: examples of the informational findings (2) and recovery's timeline. Each cached frame
#: (operations, parsed reads, reads, pairs, facts, candidates) and the figures used to be a job
#: of its own: 19 jobs before.
MAX_JOBS_CLEAN = 10


def test_a_clean_history_is_checked_in_a_few_spark_jobs(spark: Any, tmp_path: Path) -> None:
    path = clean().write(tmp_path / "clean.jsonl")
    sc = spark.sparkContext
    group = f"few-jobs-{tmp_path.name}"
    sc.setJobGroup(group, "the log check's job count")
    try:
        res = analyze_files([path], workload="log", out_dir=tmp_path / "out", engine="spark", report=False)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    o = res["files"][0]
    assert o.valid is True and o.engine.startswith("spark"), (o.error, o.result)
    jobs = sc.statusTracker().getJobIdsForGroup(group)
    assert 1 <= len(jobs) <= MAX_JOBS_CLEAN, sorted(jobs)
