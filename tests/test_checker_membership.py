"""Membership over time from hand-made histories: the changes, the first members inferred,
the spans of voters, and the report's section (through ``jepsen analyze``'s in-process path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jepsen.checker import membership
from jepsen.checker.analyze import analyze_files

S = 1_000_000_000


def _op(
    f: str, t0: float, t1: float | None, value: dict[str, Any], end: dict[str, Any] | None = None
) -> list[Any]:
    """A nemesis operation's two events as (f, time, value); no end event when ``t1`` is None."""
    evs: list[Any] = [(f, int(t0 * S), value)]
    if t1 is not None:
        evs.append((f, int(t1 * S), end if end is not None else value))
    return evs


def _readd_then_grow() -> list[Any]:
    rm = {"nodes": ["n2"], "fault": "membership", "variant": "readd"}
    grow = {"nodes": ["n4", "n5"], "fault": "membership", "variant": "grow"}
    return [
        ("kill", 1 * S, {"nodes": ["n1"]}),  # other faults are passed over
        *_op("member-remove", 2, 3, rm, {**rm, "voters": ["n1", "n3"], "learners": []}),
        ("restart", 3.5 * S, {"nodes": ["n1"]}),
        *_op("member-add", 4, 6, rm, {**rm, "voters": ["n1", "n2", "n3"], "learners": []}),
        *_op("member-add", 8, 9, grow, {**grow, "voters": ["n1", "n2", "n3", "n4", "n5"], "learners": []}),
    ]


def test_each_change_has_its_time_nodes_variant_outcome_and_configuration() -> None:
    cs = membership.changes(_readd_then_grow())
    assert [(c.f, c.nodes, c.variant, c.ok) for c in cs] == [
        ("member-remove", ("n2",), "readd", True),
        ("member-add", ("n2",), "readd", True),
        ("member-add", ("n4", "n5"), "grow", True),
    ]
    assert (cs[0].start, cs[0].end, cs[0].voters) == (2 * S, 3 * S, ("n1", "n3"))
    assert cs[2].voters == ("n1", "n2", "n3", "n4", "n5") and cs[2].learners == ()


def test_first_members_are_inferred_from_the_first_committed_change_and_spans_follow() -> None:
    [g] = membership.by_group(_readd_then_grow())
    assert g.group == "" and g.initial == ("n1", "n2", "n3")
    assert "inferred" in g.initial_from and "member-remove n2" in g.initial_from
    spans = g.intervals(0, 20 * S)
    assert spans == [
        (0, 3 * S, ("n1", "n2", "n3")),
        (3 * S, 6 * S, ("n1", "n3")),
        (6 * S, 9 * S, ("n1", "n2", "n3")),
        (9 * S, 20 * S, ("n1", "n2", "n3", "n4", "n5")),
    ]


def test_a_failed_change_an_unended_one_and_json_text_values() -> None:
    add = {"nodes": ["n4"], "fault": "membership", "variant": "replace", "replaces": "n1"}
    heal = {"nodes": ["n6"], "variant": "heal"}
    evs = [
        ("member-add", 1 * S, json.dumps(add)),  # the Spark frames carry values as JSON text
        ("member-add", 2 * S, json.dumps(add), "TimeoutError: learner n4 did not catch up"),
        ("member-add", 3 * S, heal),
        ("member-add", 4 * S, {**heal, "voters": ["n2", "n3", "n6"], "learners": []}),
        ("member-remove", 5 * S, {"nodes": ["n2"], "variant": "readd"}),  # the run stopped here
        ("member-add", 6 * S, "{not json"),
    ]
    cs = membership.changes(evs)
    assert [(c.variant, c.ok) for c in cs] == [
        ("replace", False),
        ("heal", True),
        ("readd", None),
        (None, None),
    ]
    assert cs[0].error and "did not catch up" in cs[0].error and cs[0].voters is None
    assert cs[2].end is None and cs[3].nodes == ()
    [g] = membership.by_group(evs)
    assert g.initial == ("n2", "n3")  # the failed change before it is taken to have changed nothing
    spans = g.intervals(0, 10 * S)
    assert spans[1] == (2 * S, 4 * S, None) and spans[-1] == (4 * S, 10 * S, ("n2", "n3", "n6"))


def test_an_end_without_a_configuration_is_not_ok_and_groups_without_a_committed_change_are_unknown() -> None:
    v = {"nodes": ["n2"], "variant": "readd"}
    [g] = membership.by_group(_op("member-remove", 1, 2, v))
    assert g.changes[0].ok is False and g.initial is None and "unknown" in g.initial_from
    assert membership.by_group([("kill", 1, {"nodes": ["n1"]})]) == []


def test_broker_groups_are_told_apart_by_their_node_names() -> None:
    a = {"nodes": ["broker-a/n2"], "variant": "readd"}
    b = {"nodes": ["broker-b/n4"], "variant": "replace"}
    evs = [
        *_op("member-remove", 1, 2, a, {**a, "voters": ["broker-a/n1", "broker-a/n3"], "learners": []}),
        *_op(
            "member-add", 3, 4, b, {**b, "voters": [f"broker-b/n{i}" for i in (1, 2, 3, 4)], "learners": []}
        ),
    ]
    ga, gb = membership.by_group(evs)
    assert (ga.group, ga.initial) == ("broker-a", ("broker-a/n1", "broker-a/n2", "broker-a/n3"))
    assert (gb.group, gb.initial) == ("broker-b", ("broker-b/n1", "broker-b/n2", "broker-b/n3"))


def _history(path: Path) -> None:
    """A small valid log history with one readd cycle, written as the harness records it."""
    events: list[dict[str, Any]] = []

    def ev(process: Any, typ: str, f: str, t: float, **kw: Any) -> None:
        events.append(
            {"index": len(events), "time": int(t * S), "process": process, "type": typ, "f": f, **kw}
        )

    rm = {"nodes": ["n2"], "fault": "membership", "variant": "readd"}
    for i in range(20):
        ev(0, "invoke", "send", i * 0.5, key="0", value=i)
        ev(0, "ok", "send", i * 0.5 + 0.01, key="0", value=i, offset=i)
        if i == 4:
            ev("nemesis", "info", "member-remove", 2.1, value=rm)
            ev("nemesis", "info", "member-remove", 2.2, value={**rm, "voters": ["n1", "n3"], "learners": []})
        if i == 8:
            ev("nemesis", "info", "member-add", 4.1, value=rm)
            ev("nemesis", "info", "member-add", 4.3, value=rm, error="TimeoutError: no catch-up")
    ev(1, "invoke", "drain", 10.5, key="0")
    ev(1, "ok", "drain", 10.6, key="0", value=[[i, i] for i in range(20)])
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")


def test_the_report_of_an_analyzed_history_shows_the_membership_section(tmp_path: Path) -> None:
    h = tmp_path / "run.jsonl"
    _history(h)
    res = analyze_files([h], workload="log", out_dir=tmp_path / "out", engine="inprocess")
    assert res["summary"][str(h)] is True, res
    page = (tmp_path / "out" / "run" / "report.html").read_text(encoding="utf-8")
    section = page[page.index("<h2>Membership</h2>") :]
    assert "First members: <b>n1, n2, n3</b>" in section and "inferred" in section
    assert "<td>member-remove</td><td>n2</td><td>readd</td><td>ok</td><td>n1, n3</td>" in section
    # the plots bring back nemesis events without their error: the missing configuration says it failed
    assert "<td>member-add</td><td>n2</td><td>readd</td><td>failed</td><td>?</td>" in section
    assert section.count("data:image/png;base64,") == 3  # the plots, with the changes marked, still draw
