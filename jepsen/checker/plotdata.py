"""The few rows the report's plots need, pulled from Spark in three small jobs for all files.

A million-operation history must not be shipped to the driver to draw a scatter
plot: operations are sampled down to a fixed number of points per file, throughput
is binned in Spark, and only nemesis events come back whole (there are few).
Histories without a clock (Jepsen's text logs) get no time plots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

BINS = 200


def collect_plot_data(
    ops: DataFrame, overview: dict[int, dict[str, Any]], workloads: dict[int, str], max_points: int
) -> dict[int, dict[str, Any]]:
    """{src: {"ops": [...], "throughput": [...], "bin-s": w, "nemesis": [...]}} for timed files."""
    from pyspark.sql import functions as F

    timed = [s for s, ov in overview.items() if ov["timed"] and ov["t0"] is not None]
    if not timed:
        return {}
    frac = {s: min(1.0, max_points / max(1, overview[s]["n"])) for s in timed}
    width = {s: max(1, (overview[s]["t1"] - overview[s]["t0"]) // BINS) for s in timed}

    def lit_map(d: dict[int, Any]) -> Any:
        return F.create_map(*[x for k, v in d.items() for x in (F.lit(k), F.lit(v))])

    src = F.col("src")
    clients = ops.filter((F.col("kind") == "op") & src.isin(timed))
    offset = F.when(F.col("f") == "send", F.col("offset"))
    sample = (
        clients.filter(F.rand(7) < lit_map(frac)[src])
        .select("src", "f", "type", "key", "process", "inv_time", "cmp_time", offset.alias("offset"))
        .collect()
    )
    t_end = F.coalesce("cmp_time", "inv_time")
    binned = (
        clients.select(
            "src",
            "f",
            "type",
            F.floor(
                (t_end - lit_map({s: overview[s]["t0"] for s in timed})[src]) / lit_map(width)[src]
            ).alias("bin"),
        )
        .groupBy("src", "f", "type", "bin")
        .count()
        .collect()
    )
    nemesis = (
        ops.filter((F.col("kind") == "nemesis") & src.isin(timed))
        .select("src", "f", "inv_index", "inv_time", "inv_value")
        .collect()
    )
    out: dict[int, dict[str, Any]] = {
        s: {
            "ops": [],
            "throughput": [],
            "nemesis": [],
            "bin-s": width[s] / 1e9,
            "t0": overview[s]["t0"],
            "workload": workloads.get(s),
            "sampled": frac[s] < 1.0,
        }
        for s in timed
    }
    for r in sample:
        out[r["src"]]["ops"].append(
            (r["f"], r["type"], r["key"], r["process"], r["inv_time"], r["cmp_time"], r["offset"])
        )
    for r in binned:
        out[r["src"]]["throughput"].append((r["f"], r["type"], r["bin"], r["count"]))
    for r in sorted(nemesis, key=lambda r: r["inv_index"]):
        out[r["src"]]["nemesis"].append((r["f"], r["inv_time"], r["inv_value"]))
    return out
