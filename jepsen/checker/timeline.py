"""What the recovery figures and the report's time plots need from Spark, in one job.

Recovery needs the nemesis events and two per-millisecond aggregates of ok operations
(``recovery.OkIndex``); the plots need the nemesis events too, throughput binned in time
and a sample of operations. Asked for as separate queries they were six jobs, each planned
on its own and shipping its rows to Python one pickled ``Row`` at a time; here they are
branches of one union with a tag column, read back as one Arrow table. On a 2.6M-operation
history (Spark event logs): 5.5 s from the first of the six jobs to the end of the last,
4.7 s for the one job and its planning.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jepsen.checker.plotdata import bin_width, sample_fraction

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# the union's branches
NEMESIS, FIRST_OK, DONE, THROUGHPUT, SAMPLE = range(5)


@dataclass(slots=True)
class Timeline:
    """Per source: nemesis events, recovery's aggregates, and the plot's rows."""

    nemesis: dict[int, list[tuple[int, int, str, Any]]] = field(default_factory=lambda: defaultdict(list))
    """(invoke index, invoke time, f, value) of every timed nemesis event."""
    first_ok: dict[int, tuple[Any, Any, Any]] = field(default_factory=dict)
    """Columns (key, invoke ms, earliest completion ns) of ok operations (``recovery.OkIndex``)."""
    done: dict[int, tuple[Any, Any, Any]] = field(default_factory=dict)
    """Columns (key, completion ms, count) of ok operations (``recovery.OkIndex``)."""
    throughput: dict[int, list[tuple[str, str, int, int]]] = field(default_factory=lambda: defaultdict(list))
    """(f, type, bin, count): operations by the bin their completion (else invocation) fell in."""
    sample: dict[int, list[tuple[Any, ...]]] = field(default_factory=lambda: defaultdict(list))
    """(f, type, key, process, invoke time, completion time, offset of a send) of sampled operations."""


def collect(
    ops: DataFrame,
    recovery_srcs: list[int],
    plot_srcs: list[int],
    overview: dict[int, dict[str, Any]],
    max_points: int,
    bucket_ns: int,
) -> Timeline:
    """One job over the paired operations: recovery's aggregates for ``recovery_srcs`` (at
    ``bucket_ns``), the plot's rows for ``plot_srcs`` (their t0/t1/n from ``overview``),
    nemesis events for both."""
    from pyspark.sql import functions as F

    out = Timeline()
    srcs = sorted(set(recovery_srcs) | set(plot_srcs))
    if not srcs:
        return out
    src = F.col("src")
    null_s, null_l = F.lit(None).cast("string"), F.lit(None).cast("long")

    def row(
        tag: int,
        key: Column = null_s,
        f: Column = null_s,
        type_: Column = null_s,
        process: Column = null_s,
        a: Column = null_l,
        b: Column = null_l,
        c: Column = null_l,
        value: Column = null_s,
    ) -> list[Column]:
        return [
            F.lit(tag).alias("tag"),
            src.alias("src"),
            key.alias("key"),
            f.alias("f"),
            type_.alias("type"),
            process.alias("process"),
            a.cast("long").alias("a"),
            b.cast("long").alias("b"),
            c.cast("long").alias("c"),
            value.alias("value"),
        ]

    col = F.col
    parts = [
        ops.filter((col("kind") == "nemesis") & src.isin(srcs) & col("inv_time").isNotNull()).select(
            *row(NEMESIS, f=col("f"), a=col("inv_index"), b=col("inv_time"), value=col("inv_value"))
        )
    ]
    if recovery_srcs:
        ok = ops.filter(
            (col("kind") == "op")
            & (col("type") == "ok")
            & src.isin(recovery_srcs)
            & col("inv_time").isNotNull()
            & col("cmp_time").isNotNull()
        )
        first = ok.groupBy("src", "key", F.floor(col("inv_time") / bucket_ns).alias("ms")).agg(
            F.min("cmp_time").alias("t")
        )
        done = ok.groupBy("src", "key", F.floor(col("cmp_time") / bucket_ns).alias("ms")).count()
        parts.append(first.select(*row(FIRST_OK, key=col("key"), a=col("ms"), b=col("t"))))
        parts.append(done.select(*row(DONE, key=col("key"), a=col("ms"), b=col("count"))))
    if plot_srcs:
        frac = {s: sample_fraction(overview[s], max_points) for s in plot_srcs}
        width = {s: bin_width(overview[s]) for s in plot_srcs}
        t0 = {s: overview[s]["t0"] for s in plot_srcs}

        def per_src(d: dict[int, Any]) -> Column:
            return F.create_map(*[x for k, v in d.items() for x in (F.lit(k), F.lit(v))])[src]

        clients = ops.filter((col("kind") == "op") & src.isin(plot_srcs))
        t_end = F.coalesce("cmp_time", "inv_time")
        binned = (
            clients.select("src", "f", "type", F.floor((t_end - per_src(t0)) / per_src(width)).alias("bin"))
            .groupBy("src", "f", "type", "bin")
            .count()
        )
        parts.append(
            binned.select(*row(THROUGHPUT, f=col("f"), type_=col("type"), a=col("bin"), b=col("count")))
        )
        sampled = clients.filter(F.rand(7) < per_src(frac))
        parts.append(
            sampled.select(
                *row(
                    SAMPLE,
                    key=col("key"),
                    f=col("f"),
                    type_=col("type"),
                    process=col("process"),
                    a=col("inv_time"),
                    b=col("cmp_time"),
                    c=F.when(col("f") == "send", col("offset")),
                )
            )
        )
    import pyarrow as pa
    import pyarrow.compute as pc

    union = parts[0]
    for p in parts[1:]:
        union = union.unionByName(p)
    table = union.toArrow()
    # Recovery's aggregates have a row per key and millisecond: millions for a run of hours.
    # They stay columns (numpy and Arrow, never a Python object per row) for ``OkIndex``.
    tag = table.column("tag")
    for which, into in ((FIRST_OK, out.first_ok), (DONE, out.done)):
        part = table.filter(pc.equal(tag, which))
        for s in pc.unique(part.column("src")).to_pylist():
            mine = part.filter(pc.equal(part.column("src"), s))
            into[s] = (mine.column("key"), mine.column("a").to_numpy(), mine.column("b").to_numpy())
    table = table.filter(pc.invert(pc.is_in(tag, value_set=pa.array([FIRST_OK, DONE], tag.type))))
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    for kind, s, key, f, type_, process, a, b, c, value in zip(
        cols["tag"],
        cols["src"],
        cols["key"],
        cols["f"],
        cols["type"],
        cols["process"],
        cols["a"],
        cols["b"],
        cols["c"],
        cols["value"],
        strict=True,
    ):
        if kind == NEMESIS:
            out.nemesis[s].append((a, b, f, value))
        elif kind == THROUGHPUT:
            out.throughput[s].append((f, type_, a, b))
        else:
            out.sample[s].append((f, type_, key, process, a, b, c))
    return out
