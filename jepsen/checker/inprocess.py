"""Small histories judged in this process: no JVM, no Spark, the same rules.

A Spark analysis costs 13-17 s before it reads the first line (JVM and session
start-up, then a dozen small jobs), while a history of ten thousand operations is
judged in Python in well under a second. So ``analyze`` sends inputs below
``FAST_PATH_MAX_BYTES`` here. Nothing here imports pyspark.

The rules are the Spark path's: operations are paired as ``frames.pair_ops`` pairs
them (same columns), the register/kv search is ``linear.check_rows`` (the very
function Spark's per-key groups call), the log rules are ``log_rules`` (the
``log_checker`` rules per key, tested to give identical counts, verdicts and stats),
and the overview and plot data follow ``analyze._collect_overview`` and
``timeline``/``plotdata``.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Any

from jepsen.checker import linear, sparkjson
from jepsen.checker.parse import NEMESIS, Event

Row = dict[str, Any]

# Inputs up to this size (about 30k operations of the harness's JSON Lines) are judged
# in-process when the engine is "auto"; larger ones go to Spark.
FAST_PATH_MAX_BYTES = 8 << 20
# All in-process inputs of one call together; past this the rest go to Spark.
FAST_PATH_TOTAL_BYTES = 64 << 20


def pair(src: int, events: list[Event]) -> list[Row]:
    """Operation and nemesis rows with the columns of ``frames.pair_ops`` (kind op/nemesis).

    ``events`` passed ``parse.check_structure``: every completion follows its
    process's invoke, so pairing is a pending map per (key, process).
    """
    rows: list[Row] = []
    pending: dict[tuple[str, str], Row] = {}
    for ev in sorted(events, key=lambda e: e.index):
        key = ev.key if ev.key is not None else ""
        t = ev.time if ev.time is not None else ev.index
        if ev.process == NEMESIS:
            rows.append(
                {
                    "src": src,
                    "kind": "nemesis",
                    "process": ev.process,
                    "f": ev.f,
                    "key": key,
                    "type": ev.type,
                    "inv_index": ev.index,
                    "inv_time": t,
                    "cmp_index": None,
                    "cmp_time": None,
                    "inv_value": ev.value,
                    "cmp_value": None,
                    "offset": None,
                    "error": ev.error,
                    "node": ev.node,
                    "timed": ev.time is not None,
                }
            )
            continue
        if ev.type == "invoke":
            row = {
                "src": src,
                "kind": "op",
                "process": ev.process,
                "f": ev.f,
                "key": key,
                "type": "info",
                "inv_index": ev.index,
                "inv_time": t,
                "cmp_index": None,
                "cmp_time": None,
                "inv_value": ev.value,
                "cmp_value": None,
                "offset": None,
                "error": ev.error,
                "node": ev.node,
                "timed": ev.time is not None,
            }
            pending[(key, ev.process)] = row
            rows.append(row)
            continue
        row = pending.pop((key, ev.process), None)
        if row is None:
            continue  # refused by check_structure already; kept defensive
        row["type"] = ev.type
        row["cmp_index"] = ev.index
        row["cmp_time"] = t
        row["cmp_value"] = ev.value
        row["offset"] = ev.offset if ev.offset is not None else sparkjson.offset_in(ev.value)
        row["error"] = ev.error
        row["node"] = ev.node if ev.node is not None else row["node"]
    return rows


def overview(rows: list[Row]) -> dict[str, Any]:
    """The figures ``analyze._collect_overview`` gathers for one source."""
    o: dict[str, Any] = {
        "ops": {},
        "fs": set(),
        "t0": None,
        "t1": None,
        "bad": None,
        "timed": False,
        "nemesis": 0,
        "n": 0,
    }
    for r in rows:
        o["timed"] = o["timed"] or r["timed"]
        if r["kind"] == "nemesis":
            o["nemesis"] += 1
            continue
        o["fs"].add(r["f"])
        by_type = o["ops"].setdefault(r["f"], {})
        by_type[r["type"]] = by_type.get(r["type"], 0) + 1
        o["n"] += 1
        t0 = r["inv_time"]
        t1 = max(x for x in (r["inv_time"], r["cmp_time"]) if x is not None)
        o["t0"] = t0 if o["t0"] is None else min(o["t0"], t0)
        o["t1"] = t1 if o["t1"] is None else max(o["t1"], t1)
    return o


def check_linear(ops: list[Row], model: str, budget: float) -> dict[str, dict[str, Any]]:
    """{key: KeyResult JSON}, one search per key as Spark's groups run it."""
    by_key: dict[str, list[Row]] = defaultdict(list)
    for r in ops:
        by_key[r["key"]].append(r)
    return {k: linear.check_rows(rs, model, budget).to_json() for k, rs in by_key.items()}


def plot_data(
    rows: list[Row], ov: dict[str, Any], workload: str, max_points: int, bins: int
) -> dict[str, Any]:
    """What the report draws (``plotdata.plot_data`` for one source on Spark)."""
    ops = [r for r in rows if r["kind"] == "op"]
    frac = min(1.0, max_points / max(1, ov["n"]))
    width = max(1, (ov["t1"] - ov["t0"]) // bins)
    rng = random.Random(7)
    sample = [r for r in ops if frac >= 1.0 or rng.random() < frac]
    through: dict[tuple[str, str, int], int] = defaultdict(int)
    for r in ops:
        end = r["cmp_time"] if r["cmp_time"] is not None else r["inv_time"]
        through[(r["f"], r["type"], math.floor((end - ov["t0"]) / width))] += 1
    return {
        "ops": [
            (
                r["f"],
                r["type"],
                r["key"],
                r["process"],
                r["inv_time"],
                r["cmp_time"],
                r["offset"] if r["f"] == "send" else None,
            )
            for r in sample
        ],
        "throughput": [(f, t, b, n) for (f, t, b), n in through.items()],
        "nemesis": [
            (r["f"], r["inv_time"], r["inv_value"])
            for r in sorted((r for r in rows if r["kind"] == "nemesis"), key=lambda r: r["inv_index"])
        ],
        "bin-s": width / 1e9,
        "t0": ov["t0"],
        "workload": workload,
        "sampled": frac < 1.0,
    }
