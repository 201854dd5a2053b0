"""The ``log`` workload checker: every anomaly of docs/history.md as Spark joins, aggregates, windows.

Values are unique and offsets are positions, so the log's order is visible in the
history itself and no search is needed: each anomaly is a relational query.

- One aggregate per value (acknowledgement + every read of it) answers duplicate,
  unexpected, G1a, lost-write against the drain, recovered and unseen-info.
- One aggregate per (key, offset) answers inconsistent-offsets.
- The "happened before" questions (realtime-order, stale-read, a read that reached
  past a write) are as-of queries: one running maximum over a time-ordered window
  per key instead of a quadratic join.
- Per-process windows give nonmonotonic-send, nonmonotonic-poll and poll-skip.

Two phases keep a correct history cheap. First every check emits *candidates*:
narrow rows of plain numbers (which op, which offset), all of them in one cached
frame computed by one job, and counted. Only the anomalies that have candidates
then get a second, small job that joins their first examples back to the full
operations. Everything is keyed by ``src`` (the input file) and ``key``, the
partitioning of the cached operations, so most steps need no shuffle and many
histories share one set of jobs. No Python UDFs: the hot path stays in the JVM.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jepsen.checker.frames import read_pairs
from jepsen.checker.spark import materialize, release

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# Errors (any makes the history invalid) and informational findings, in report order.
ERRORS = (
    "lost-write",
    "duplicate",
    "inconsistent-offsets",
    "G1a",
    "unexpected",
    "nonmonotonic-send",
    "realtime-order",
    "stale-read",
    "poll-skip",
    "nonmonotonic-poll",
)
INFORMATIONAL = ("recovered", "unseen-info")
EXAMPLES = 8

K = ["src", "key"]
PAIRS_TYPE = "array<array<bigint>>"


def _F():  # noqa: N802 - keep pyspark imports lazy so the CLI starts fast
    from pyspark.sql import functions as F

    return F


def _W():  # noqa: N802
    from pyspark.sql import Window

    return Window


def send_desc(prefix: str = "") -> Column:
    """A send as it appears in examples, from columns named ``{prefix}x``."""
    F = _F()

    def c(name: str) -> Column:
        return F.col(prefix + name)

    return F.struct(
        c("process").alias("process"),
        c("f").alias("f"),
        c("type").alias("type"),
        c("v").alias("value"),
        c("off").alias("offset"),
        c("inv_index").alias("invoke-index"),
        c("inv_time").alias("invoke-time"),
        c("cmp_index").alias("complete-index"),
        c("cmp_time").alias("complete-time"),
    )


def read_desc(prefix: str = "") -> Column:
    """A poll or drain as it appears in examples: what it asked for and what it got."""
    F = _F()

    def c(name: str) -> Column:
        return F.col(prefix + name)

    return F.struct(
        c("process").alias("process"),
        c("f").alias("f"),
        F.lit("ok").alias("type"),
        c("from_").alias("from"),
        c("max_").alias("max"),
        c("n").alias("returned"),
        c("first").alias("first-offset"),
        c("last").alias("last-offset"),
        c("inv_index").alias("invoke-index"),
        c("inv_time").alias("invoke-time"),
        c("cmp_index").alias("complete-index"),
        c("cmp_time").alias("complete-time"),
    )


def _prefixed(df: DataFrame, prefix: str, keep: tuple[str, ...] = ("src", "key")) -> DataFrame:
    return df.select(*[df[c].alias(c if c in keep else prefix + c) for c in df.columns])


def _row(df: DataFrame, name: str, t: Column, example: Column) -> DataFrame:
    F = _F()
    return df.select("src", F.lit(name).alias("anomaly"), t.alias("t"), F.to_json(example).alias("example"))


class LogFrames:
    """The frames every check reads: sends, read operations, and the pairs they returned."""

    def __init__(self, ops: DataFrame, small: bool = False) -> None:
        F = _F()
        ops = ops.filter(F.col("kind") == "op")
        # Simple projections of the cached operations; not cached again (a scan of the
        # cache reads only the columns it needs).
        self.sends = ops.filter(F.col("f") == "send").select(
            *K,
            "process",
            "f",
            "type",
            F.col("inv_value").try_cast("long").alias("v"),
            F.col("offset").alias("off"),
            "inv_index",
            "inv_time",
            "cmp_index",
            "cmp_time",
        )
        self.ok_sends = self.sends.filter((F.col("type") == "ok") & F.col("off").isNotNull())
        parsed = ops.filter(F.col("f").isin("poll", "drain") & (F.col("type") == "ok")).select(
            *K,
            "process",
            "f",
            "inv_index",
            "inv_time",
            "cmp_index",
            "cmp_time",
            F.coalesce(F.get_json_object("inv_value", "$.from").try_cast("long"), F.lit(0)).alias("from_"),
            F.get_json_object("inv_value", "$.max").try_cast("long").alias("max_"),
            read_pairs().alias("pairs"),
        )
        # Parsing the returned pairs is done once (this cache); the per-read shape derived
        # from it is cached in turn, and neither runs a job of its own: the check's first
        # action computes both (see ``spark.materialize``). One row per returned pair
        # (``pairs``) is exploded from this cache at each use instead of being cached: a
        # final drain returns every value, and building that cache (7.2M rows of a 6.6M-
        # operation history) cost more than all the explodes (its job 21-26 s -> 13 s).
        parsed = materialize(parsed, small, eager=False)
        n = F.size("pairs")
        last = F.element_at("pairs", -1)[0]
        self.reads = parsed.select(
            *K,
            "process",
            "f",
            "inv_index",
            "inv_time",
            "cmp_index",
            "cmp_time",
            "from_",
            "max_",
            n.alias("n"),
            F.when(n > 0, F.col("pairs")[0][0]).alias("first"),
            F.when(n > 0, last).alias("last"),
            # the highest offset the read covered: its last pair, or just below `from`
            F.when(n > 0, last).otherwise(F.col("from_") - 1).alias("reach"),
            # a drain page short of its max ends its drain; a drain with no max (one event) too
            (F.col("max_").isNull() | (n < F.col("max_"))).alias("claims_end"),
        )
        self.reads = materialize(self.reads, small, eager=False)
        self.pairs = parsed.select(
            *K, "process", "f", "inv_index", "inv_time", "from_", F.posexplode("pairs").alias("pos", "pair")
        ).select(
            *K,
            "process",
            "f",
            "inv_index",
            "inv_time",
            "from_",
            "pos",
            F.col("pair")[0].alias("off"),
            F.col("pair")[1].alias("v"),
        )
        self._parsed = parsed

    def unpersist(self) -> None:
        for df in (self._parsed, self.reads):
            release(df)


# --- per value ----------------------------------------------------------------------------


def last_drains(fr: LogFrames) -> tuple[DataFrame, DataFrame]:
    """Per key its last whole drain (``ld``: its first page's ``inv_time``, ``inv_index``), and
    the (key, ``inv_index``) of every page of it (``in_ld``: true).

    A drain is an ok ``drain`` from offset 0 and the ok ``drain`` pages of the same process
    after it, up to that process's next drain from 0 (docs/history.md, "Drain pages"); it is
    whole when its last page claims the end (a one-event drain, with no max, always does).
    Both frames hold a few rows per key (drains are few), so they are broadcast where used.
    ``log_rules.final_drain`` is the same rule in-process.
    """
    F = _F()
    Window = _W()
    upto = Window.partitionBy(*K, "process").orderBy("inv_index").rowsBetween(Window.unboundedPreceding, 0)
    pages = (
        fr.reads.filter(F.col("f") == "drain")
        .select(
            *K,
            "inv_index",
            "inv_time",
            "claims_end",
            F.last(F.when(F.col("from_") == 0, F.col("inv_index")), ignorenulls=True)
            .over(upto)
            .alias("head"),
        )
        .filter(F.col("head").isNotNull())
    )
    drains = (
        pages.groupBy(*K, "head")
        .agg(
            F.min(F.struct("inv_index", "inv_time")).alias("first"),
            F.max_by("claims_end", "inv_index").alias("whole"),
        )
        .filter(F.col("whole"))
    )
    last_drain = drains.groupBy(*K).agg(
        F.max(F.struct(F.col("first.inv_time").alias("inv_time"), F.col("head").alias("inv_index"))).alias(
            "ld"
        )
    )
    ld_pages = pages.join(
        F.broadcast(last_drain.select(*K, F.col("ld.inv_index").alias("head"))), [*K, "head"]
    ).select(*K, "inv_index", F.lit(True).alias("in_ld"))
    return last_drain, ld_pages


def value_facts(fr: LogFrames) -> DataFrame:
    """One row per (src, key, value): how it was sent, where it was seen, the last drain.

    Only fixed-width aggregates (the send's type as a number), so Spark can use its
    hash aggregation instead of sorting every observation.
    """
    F = _F()
    last_drain, ld_pages = last_drains(fr)
    null_long = F.lit(None).cast("long")
    type_code = (
        F.when(F.col("type") == "ok", 3)
        .when(F.col("type") == "info", 2)
        .when(F.col("type") == "fail", 1)
        .otherwise(0)
    )
    sends = fr.sends.select(
        *K,
        "v",
        F.lit(1).alias("is_send"),
        type_code.alias("tc"),
        F.when(F.col("type") == "ok", F.col("off")).alias("off"),
        F.when(F.col("type") == "ok", F.col("cmp_time")).alias("ack_t"),
        F.col("inv_time").alias("t"),
        F.lit(0).alias("is_read"),
        F.lit(0).alias("in_last"),
    )
    reads = fr.pairs.join(F.broadcast(ld_pages), [*K, "inv_index"], "left").select(
        *K,
        "v",
        F.lit(0).alias("is_send"),
        F.lit(0).alias("tc"),
        "off",
        null_long.alias("ack_t"),
        F.col("inv_time").alias("t"),
        F.lit(1).alias("is_read"),
        F.coalesce((F.col("f") == "drain") & F.col("in_ld"), F.lit(False)).cast("int").alias("in_last"),
    )
    facts = (
        sends.unionByName(reads)
        .groupBy(*K, "v")
        .agg(
            F.sum("is_send").alias("n_sends"),
            F.max("tc").alias("tc"),
            F.max(F.when(F.col("is_send") == 1, F.col("off"))).alias("ack_off"),
            F.max("ack_t").alias("ack_t"),
            F.min("t").alias("t"),
            F.sum("is_read").alias("n_reads"),
            F.min("off").alias("lo"),
            F.max("off").alias("hi"),
            F.max("in_last").alias("in_last"),
        )
    )
    s_type = F.when(F.col("tc") == 3, "ok").when(F.col("tc") == 2, "info").when(F.col("tc") == 1, "fail")
    return facts.withColumn("s_type", s_type).drop("tc").join(F.broadcast(last_drain), K, "left")


def _sightings(fr: LogFrames, wanted: DataFrame, on: str) -> DataFrame:
    """The acknowledgements and reads of the wanted (key, value|offset): the ops behind an example.

    ``wanted`` holds a few rows (examples only), so it is broadcast and the big frames
    are merely probed.
    """
    F = _F()
    w = F.broadcast(wanted.select(*K, on).distinct())
    sends = fr.sends if on == "v" else fr.ok_sends
    a = sends.join(w, [*K, on]).select(
        *K, "v", "off", F.col("inv_time").alias("t"), F.to_json(send_desc()).alias("op")
    )
    b = fr.pairs.join(w, [*K, on]).select(
        *K,
        "v",
        "off",
        F.col("inv_time").alias("t"),
        F.to_json(
            F.struct(
                "process",
                "f",
                F.lit("ok").alias("type"),
                F.col("v").alias("value"),
                F.col("off").alias("offset"),
                F.col("inv_index").alias("invoke-index"),
                F.col("inv_time").alias("invoke-time"),
            )
        ).alias("op"),
    )
    return (
        a.unionByName(b)
        .groupBy(*K, on)
        .agg(
            F.sort_array(F.collect_set("off" if on == "v" else "v")).alias("seen_at"),
            F.slice(F.sort_array(F.collect_list(F.struct("t", "op"))), 1, EXAMPLES).alias("seen"),
        )
    )


# --- phase 1: candidates ---------------------------------------------------------------------


def _cand(
    df: DataFrame,
    anomaly: Column | str,
    t: Column,
    i1: Column | None = None,
    i2: Column | None = None,
    i3: Column | None = None,
    i4: Column | None = None,
    s1: Column | None = None,
) -> DataFrame:
    """Candidates share one narrow shape; i1..i4 and s1 mean what each check says."""
    F = _F()
    none = F.lit(None).cast("long")
    name = F.lit(anomaly) if isinstance(anomaly, str) else anomaly
    return df.select(
        *K,
        name.alias("anomaly"),
        t.cast("long").alias("t"),
        *[
            (c if c is not None else none).cast("long").alias(f"i{n}")
            for n, c in enumerate((i1, i2, i3, i4), 1)
        ],
        (s1 if s1 is not None else F.lit(None)).cast("string").alias("s1"),
    )


def value_candidates(facts: DataFrame) -> DataFrame:
    """duplicate, unexpected, G1a, lost-write (drain), recovered, unseen-info: i1 = value.

    For lost-write, i2/i3 = the last drain's invoke index/time and s1 = "drain".
    """
    F = _F()
    read = F.col("n_reads") > 0
    s_type = F.col("s_type")
    conditions = {
        "duplicate": F.col("lo") != F.col("hi"),
        "unexpected": read & (F.col("n_sends") == 0),
        "G1a": read & (s_type == "fail"),
        "lost-write": (s_type == "ok") & (F.col("ld.inv_time") > F.col("ack_t")) & (F.col("in_last") == 0),
        "recovered": read & (s_type == "info"),
        "unseen-info": ~read & (s_type == "info"),
    }
    flags = F.array(*[F.when(c, F.lit(name)) for name, c in conditions.items()])
    # Nearly every value is flagged by nothing: a plain filter drops those first, so the array
    # and its explode are built only for the few that are.
    any_flag = functools.reduce(lambda a, b: a | b, conditions.values())
    flagged = facts.filter(any_flag).select(
        "*", F.explode(F.filter(flags, lambda x: x.isNotNull())).alias("a")
    )
    lost = F.col("a") == "lost-write"
    return _cand(
        flagged,
        F.col("a"),
        F.col("t"),
        i1=F.col("v"),
        i2=F.when(lost, F.col("ld.inv_index")),
        i3=F.when(lost, F.col("ld.inv_time")),
        s1=F.when(lost, F.lit("drain")),
    )


def lost_by_reach(fr: LogFrames, facts: DataFrame) -> DataFrame:
    """An ok send no drain judged, never read, though a read invoked after its ack went past it.

    Candidates: i1 = value, i2 = that read's invoke index, i3 = the offset it reached, s1 = "reach".
    """
    F = _F()
    Window = _W()
    unread = facts.filter(
        (F.col("s_type") == "ok")
        & (F.col("n_reads") == 0)
        & F.col("ack_off").isNotNull()
        & (F.col("ld").isNull() | (F.col("ld.inv_time") <= F.col("ack_t")))
    )
    ev = unread.select(
        *K,
        F.col("ack_t").alias("t"),
        F.lit(0).alias("ord"),
        "v",
        F.col("ack_off").alias("off"),
        F.lit(None).cast("long").alias("reach"),
        F.lit(None).cast("long").alias("r_index"),
    )
    # Only the reads of keys with such sends enter the window (usually none at all).
    rd = fr.reads.join(unread.select(*K).distinct(), K, "left_semi").select(
        *K,
        F.col("inv_time").alias("t"),
        F.lit(1).alias("ord"),
        F.lit(None).cast("long").alias("v"),
        F.lit(None).cast("long").alias("off"),
        "reach",
        F.col("inv_index").alias("r_index"),
    )
    # Descending time: the running max covers exactly the reads invoked after the ack.
    w = (
        Window.partitionBy(*K)
        .orderBy(F.col("t").desc(), F.col("ord").asc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    past = (
        ev.unionByName(rd)
        .select("*", F.max(F.struct("reach", "r_index")).over(w).alias("best"))
        .filter((F.col("ord") == 0) & (F.col("best.reach") >= F.col("off")))
    )
    return _cand(
        past,
        "lost-write",
        F.col("t"),
        i1=F.col("v"),
        i2=F.col("best.r_index"),
        i3=F.col("best.reach"),
        s1=F.lit("reach"),
    )


def spread_values(facts: DataFrame) -> DataFrame:
    """The values seen at two offsets or more (duplicates): (src, key, v). Usually none."""
    F = _F()
    return facts.filter(F.col("lo") != F.col("hi")).select(*K, "v")


def inconsistent_offsets(fr: LogFrames, facts: DataFrame, any_spread: bool = True) -> DataFrame:
    """One (key, offset) seen holding different values (acks, polls, drains): i1 = offset.

    Counted from the per-value facts rather than every observation: a value seen at
    one offset only contributes that offset once; the few values seen at several
    offsets (duplicates) contribute each of their offsets, found again among the acks
    and reads. ``any_spread=False`` (the caller counted none) skips that pass, which
    scans every ok send and explodes every returned pair only to keep none of them.
    """
    F = _F()
    observed = facts.filter(F.col("lo") == F.col("hi")).select(*K, F.col("lo").alias("off"), "v", "t")
    if any_spread:
        spread = (
            fr.ok_sends.select(*K, "off", "v", F.col("inv_time").alias("t"))
            .unionByName(fr.pairs.select(*K, "off", "v", F.col("inv_time").alias("t")))
            .join(F.broadcast(spread_values(facts)), [*K, "v"], "left_semi")
        )
        observed = observed.unionByName(spread)
    bad = (
        observed.groupBy(*K, "off")
        .agg(F.min("v").alias("lo"), F.max("v").alias("hi"), F.min("t").alias("t"))
        .filter(F.col("lo") != F.col("hi"))
    )
    return _cand(bad, "inconsistent-offsets", F.col("t"), i1=F.col("off"))


def realtime_and_stale(fr: LogFrames) -> DataFrame:
    """realtime-order (a later send got a lower offset) and stale-read (end claim below an ack).

    Both ask, for a point (a send's offset, or the offset a poll reached), when the
    earliest acknowledgement of any higher offset completed. Walking each key's offsets
    from the top down with a running minimum of completion times answers that for all
    points in one sort; a violation is a point invoked after that minimum.
    Candidates: i1 = the send's or poll's invoke index, i2 = that earliest ack's
    completion time, i3 = the send's offset or the poll's reach, s1 = the process.
    """
    F = _F()
    Window = _W()
    null_long = F.lit(None).cast("long")
    acks = fr.ok_sends.select(
        *K,
        "off",
        F.lit(1).alias("ord"),
        F.col("cmp_time").alias("ack_t"),
        "inv_time",
        F.col("inv_index").alias("idx"),
        "process",
    )
    polls = fr.reads.filter(F.col("claims_end")).select(
        *K,
        F.col("reach").alias("off"),
        F.lit(0).alias("ord"),
        null_long.alias("ack_t"),
        "inv_time",
        F.col("inv_index").alias("idx"),
        "process",
    )
    # descending offsets; at equal offsets polls first, so a poll sees strictly higher acks
    w = (
        Window.partitionBy(*K)
        .orderBy(F.col("off").desc(), F.col("ord").asc())
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    viol = (
        acks.unionByName(polls)
        .select("*", F.min("ack_t").over(w).alias("first_ack"))
        .filter(F.col("first_ack") < F.col("inv_time"))
    )
    name = F.when(F.col("ord") == 1, F.lit("realtime-order")).otherwise(F.lit("stale-read"))
    return _cand(
        viol,
        name,
        F.col("inv_time"),
        i1=F.col("idx"),
        i2=F.col("first_ack"),
        i3=F.col("off"),
        s1=F.col("process"),
    )


def nonmonotonic_sends(fr: LogFrames) -> DataFrame:
    """A process's later ok send got a lower offset: i1 = later, i2 = earlier invoke index."""
    F = _F()
    Window = _W()
    w = Window.partitionBy(*K, "process").orderBy("inv_index")
    viol = fr.ok_sends.select(
        *K,
        "inv_index",
        "inv_time",
        "off",
        F.lag("off").over(w).alias("prev_off"),
        F.lag("inv_index").over(w).alias("prev_index"),
    ).filter(F.col("off") < F.col("prev_off"))
    return _cand(viol, "nonmonotonic-send", F.col("inv_time"), i1=F.col("inv_index"), i2=F.col("prev_index"))


def poll_order(fr: LogFrames) -> DataFrame:
    """nonmonotonic-poll, and poll-skip candidates still to confirm ("poll-skip?").

    Each process's polled offsets form one stream per key (polls in invoke order,
    pairs in order): going backwards is nonmonotonic; jumping ahead past ``lb`` (the
    previous offset + 1, or the poll's ``from`` for a process's first pair) may skip.
    Candidates: i1 = poll, i2 = previous poll (invoke indexes), i3 = offset, i4 = the
    previous offset (nonmonotonic) or ``lb`` (skip).
    """
    F = _F()
    Window = _W()
    w = Window.partitionBy(*K, "process").orderBy("inv_index", "pos")
    s = fr.pairs.filter(F.col("f") == "poll").select(
        *K,
        "inv_index",
        "inv_time",
        "off",
        "from_",
        F.lag("off").over(w).alias("prev_off"),
        F.lag("inv_index").over(w).alias("prev_index"),
    )
    lb = F.when(F.col("prev_off").isNotNull(), F.col("prev_off") + 1).otherwise(F.col("from_"))
    name = F.when(F.col("off") <= F.col("prev_off"), F.lit("nonmonotonic-poll")).otherwise(
        F.lit("poll-skip?")
    )
    viol = s.filter((F.col("off") <= F.col("prev_off")) | (F.col("off") > lb))
    return _cand(
        viol,
        name,
        F.col("inv_time"),
        i1=F.col("inv_index"),
        i2=F.col("prev_index"),
        i3=F.col("off"),
        i4=F.when(F.col("off") <= F.col("prev_off"), F.col("prev_off")).otherwise(lb),
    )


def candidates(fr: LogFrames, facts: DataFrame, any_spread: bool = True) -> DataFrame:
    """Every check's candidates in one frame (computed by one job once cached)."""
    parts = [
        value_candidates(facts),
        lost_by_reach(fr, facts),
        inconsistent_offsets(fr, facts, any_spread),
        realtime_and_stale(fr),
        nonmonotonic_sends(fr),
        poll_order(fr),
    ]
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


# --- phase 2: examples ------------------------------------------------------------------------

VALUE_ANOMALIES = ("duplicate", "unexpected", "G1a", "recovered", "unseen-info", "lost-write")


def first_examples(c: DataFrame) -> DataFrame:
    """The first EXAMPLES candidates by time of each (source, anomaly) that gets examples; a
    lost-write's first per kind (``s1``: found by the drain or by a read's reach).

    Collected with the counts (one job, one window) and handed back as a small local frame
    (:func:`_first`), so the example jobs neither scan nor sort the candidates again: each
    used to plan this window once more for every use of its result.
    """
    F = _F()
    Window = _W()
    kind = F.when(F.col("anomaly") == "lost-write", F.col("s1"))
    w = Window.partitionBy("src", "anomaly", kind).orderBy("t", "key", "i1")
    return (
        c.filter(~F.col("anomaly").isin(*COUNTED_LATER))
        .withColumn("rn", F.row_number().over(w))
        .filter(F.col("rn") <= EXAMPLES)
        .drop("rn")
    )


def _first(top: DataFrame, *anomalies: str) -> DataFrame:
    """The first examples (:func:`first_examples`) of the given anomalies."""
    return top.filter(_F().col("anomaly").isin(*anomalies))


def describe_values(fr: LogFrames, c: DataFrame, anomalies: list[str]) -> DataFrame:
    """Examples for the per-value anomalies: the value and every operation that touched it.

    One probe of the sends and reads serves all of them at once.
    """
    F = _F()
    top = _first(c.filter(F.col("s1").isNull() | (F.col("s1") == "drain")), *anomalies).withColumnRenamed(
        "i1", "v"
    )
    ex = top.join(_sightings(fr, top, "v"), [*K, "v"])
    example = F.struct(
        "key",
        F.col("v").alias("value"),
        F.when(F.col("anomaly") == "duplicate", F.col("seen_at")).alias("offsets"),
        F.when(
            F.col("anomaly") == "lost-write",
            F.struct(F.col("i2").alias("invoke-index"), F.col("i3").alias("invoke-time")),
        ).alias("missing-from-drain"),
        F.transform("seen", lambda s: s["op"]).alias("ops_json"),
    )
    return ex.select("src", "anomaly", "t", F.to_json(example).alias("example"))


def describe_inconsistent(fr: LogFrames, c: DataFrame) -> DataFrame:
    F = _F()
    top = _first(c, "inconsistent-offsets").withColumnRenamed("i1", "off")
    ex = top.join(_sightings(fr, top, "off"), [*K, "off"])
    example = F.struct(
        "key",
        F.col("off").alias("offset"),
        F.col("seen_at").alias("values"),
        F.transform("seen", lambda s: s["op"]).alias("ops_json"),
    )
    return ex.select("src", "anomaly", "t", F.to_json(example).alias("example"))


def _earliest_higher_ack(fr: LogFrames, rows: DataFrame) -> DataFrame:
    """Join each candidate to the acknowledgement behind i2/i3 (completed at i2, offset > i3)."""
    F = _F()
    Window = _W()
    acked = _prefixed(fr.ok_sends, "a_")
    j = (
        rows.withColumnRenamed("i2", "a_cmp_time")
        .join(acked, [*K, "a_cmp_time"])
        .filter(F.col("a_off") > F.col("i3"))
    )
    one = Window.partitionBy(*K, "anomaly", "i1").orderBy(F.col("a_off").desc(), "a_inv_index")
    return j.withColumn("rn", F.row_number().over(one)).filter(F.col("rn") == 1).drop("rn")


def confirm_realtime(fr: LogFrames, c: DataFrame) -> DataFrame:
    """All realtime-order violations with their examples' operations.

    A candidate whose earliest higher acknowledgement is its own process's is a
    nonmonotonic send (reported as such); it is a realtime-order violation only if
    another process also acknowledged a higher offset before it was invoked.
    """
    F = _F()
    Window = _W()
    cand = c.filter(F.col("anomaly") == "realtime-order")
    b = _prefixed(fr.ok_sends, "b_")
    j = _earliest_higher_ack(fr, cand).withColumnRenamed("i1", "b_inv_index").join(b, [*K, "b_inv_index"])
    other = j.filter(F.col("a_process") != F.col("b_process"))
    acked = _prefixed(fr.ok_sends, "a_")
    own = j.filter(F.col("a_process") == F.col("b_process")).select(
        *K, "anomaly", *[x for x in b.columns if x not in K]
    )
    fallback = own.join(acked, [*K]).filter(
        (F.col("a_process") != F.col("b_process"))
        & (F.col("a_cmp_time") < F.col("b_inv_time"))
        & (F.col("a_off") > F.col("b_off"))
    )
    fw = Window.partitionBy(*K, "b_inv_index").orderBy(F.col("a_off").desc())
    fallback = fallback.withColumn("rn", F.row_number().over(fw)).filter(F.col("rn") == 1).drop("rn")
    cols = [*K, *[x for x in b.columns if x not in K], *[x for x in acked.columns if x not in K]]
    both = other.select(*cols).unionByName(fallback.select(*cols))
    return _row(
        both,
        "realtime-order",
        F.col("b_inv_time"),
        F.struct("key", send_desc("a_").alias("completed-before"), send_desc("b_").alias("later-lower")),
    )


# --- examples by table: the anomalies whose examples are the operations their candidates name


@dataclass(frozen=True)
class Named:
    """An operation an example shows: the candidate's ``column`` holds its ``key`` in the
    ``frame`` of :class:`LogFrames`, whose columns the example reads under ``prefix``."""

    column: str
    frame: str
    prefix: str
    key: str = "inv_index"
    how: str = "inner"


def _col(name: str) -> Callable[[], Column]:
    return lambda: _F().col(name)


def _text(text: str) -> Callable[[], Column]:
    return lambda: _F().lit(text)


def _send(prefix: str) -> Callable[[], Column]:
    return lambda: send_desc(prefix)


def _read(prefix: str) -> Callable[[], Column]:
    return lambda: read_desc(prefix)


@dataclass(frozen=True)
class Example:
    """How one anomaly's examples are made: its first candidates (those whose ``s1`` is ``kind``,
    if given; through ``narrow`` first, if given), the operations they name, and the example's
    fields after ``key``, in order."""

    anomaly: str
    ops: tuple[Named, ...]
    fields: tuple[tuple[str, Callable[[], Column]], ...]
    kind: str | None = None
    narrow: Callable[[LogFrames, DataFrame], DataFrame] | None = None


#: a poll (i1) and the same process's previous poll (i2)
POLL_OPS = (Named("i1", "reads", "r_"), Named("i2", "reads", "p_", how="left"))

EXAMPLES_BY_TABLE: tuple[Example, ...] = (
    Example(
        "lost-write",
        kind="reach",
        ops=(Named("i1", "sends", "s_", key="v"), Named("i2", "reads", "r_")),
        fields=(
            ("value", _col("s_v")),
            ("why", _text("never read, though a read invoked after the ack reached past its offset")),
            ("send", _send("s_")),
            ("read", _read("r_")),
        ),
    ),
    Example(
        "stale-read",
        narrow=_earliest_higher_ack,  # joins the acknowledgement (a_) behind i2/i3
        ops=(Named("i1", "reads", "r_"),),
        fields=(("reached", _col("i3")), ("read", _read("r_")), ("acknowledged-before", _send("a_"))),
    ),
    Example(
        "nonmonotonic-send",
        ops=(Named("i1", "ok_sends", "l_"), Named("i2", "ok_sends", "e_")),
        fields=(("earlier", _send("e_")), ("later", _send("l_"))),
    ),
    Example(
        "nonmonotonic-poll",
        ops=POLL_OPS,
        fields=(
            ("previous-offset", _col("i4")),
            ("offset", _col("i3")),
            ("earlier-poll", _read("p_")),
            ("poll", _read("r_")),
        ),
    ),
)


def _attach(fr: LogFrames, rows: DataFrame, ops: tuple[Named, ...]) -> DataFrame:
    """Join each row to the operations its columns name, their columns under their prefixes."""
    for op in ops:
        target = op.prefix + op.key
        frame = _prefixed(getattr(fr, op.frame), op.prefix)
        rows = rows.withColumnRenamed(op.column, target).join(frame, [*K, target], op.how)
    return rows


def describe(fr: LogFrames, c: DataFrame, ex: Example) -> DataFrame:
    """The first examples of ``ex.anomaly`` as the table says to make them."""
    F = _F()
    if ex.kind is not None:
        c = c.filter(F.col("s1") == ex.kind)
    rows = _first(c, ex.anomaly)
    if ex.narrow is not None:
        rows = ex.narrow(fr, rows)
    j = _attach(fr, rows, ex.ops)
    return _row(j, ex.anomaly, F.col("t"), F.struct("key", *[make().alias(name) for name, make in ex.fields]))


def confirm_poll_skips(fr: LogFrames, c: DataFrame) -> DataFrame:
    """Keep the skip candidates with an offset known to exist (acked or read) in [lb, off).

    A log whose offsets are not dense is thus never accused. The count of known
    offsets below a point is one running count over the key's offsets.
    """
    F = _F()
    Window = _W()
    # a candidate is one (poll, offset): (i1, i3) identifies it
    cand = c.filter(F.col("anomaly") == "poll-skip?").withColumn("cid", F.struct("i1", "i3"))
    known = (
        fr.ok_sends.select(*K, "off")
        .unionByName(fr.pairs.select(*K, "off"))
        .distinct()
        .select(
            *K,
            "off",
            F.lit(1).alias("known"),
            F.lit(None).cast("struct<i1:bigint,i3:bigint>").alias("cid"),
            F.lit(None).cast("string").alias("q"),
        )
    )
    q_lb = cand.select(*K, F.col("i4").alias("off"), F.lit(0).alias("known"), "cid", F.lit("lb").alias("q"))
    q_hi = cand.select(*K, F.col("i3").alias("off"), F.lit(0).alias("known"), "cid", F.lit("hi").alias("q"))
    # queries sort before known offsets at the same offset: the count is of offsets < q
    w = (
        Window.partitionBy(*K)
        .orderBy("off", "known")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    counted = (
        known.unionByName(q_lb)
        .unionByName(q_hi)
        .withColumn("below", F.sum("known").over(w))
        .filter(F.col("q").isNotNull())
    )
    per = counted.groupBy(*K, "cid").agg(
        F.max(F.when(F.col("q") == "lb", F.col("below"))).alias("below_lb"),
        F.max(F.when(F.col("q") == "hi", F.col("below"))).alias("below_hi"),
    )
    skipped = cand.join(per, [*K, "cid"]).filter(F.col("below_hi") > F.col("below_lb"))
    j = _attach(fr, skipped, POLL_OPS)
    return _row(
        j,
        "poll-skip",
        F.col("t"),
        F.struct(
            "key",
            F.col("i4").alias("expected-from"),
            F.col("i3").alias("got"),
            (F.col("below_hi") - F.col("below_lb")).alias("skipped-known-offsets"),
            read_desc("p_").alias("earlier-poll"),
            read_desc("r_").alias("poll"),
        ),
    )


# --- assembly -------------------------------------------------------------------------------

COUNTED_LATER = ("realtime-order", "poll-skip?")


def check(ops: DataFrame, small: bool = False) -> dict[int, dict[str, Any]]:
    """Run every check on the paired operations; returns per-src counts, examples, stats.

    Phase 2 collects each anomaly's examples with its own small job: one wide union
    of them all planned and ran slower than the separate jobs.
    """
    F = _F()
    Window = _W()
    fr = LogFrames(ops, small)
    cached: list[DataFrame] = []
    counts: dict[tuple[int, str], int] = {}
    examples: dict[tuple[int, str], list[tuple[Any, str]]] = {}
    try:
        # One job builds the frames and the facts, counting the values seen at several offsets
        # (when none, inconsistent-offsets needs no pass over every observation); one more
        # computes the candidates (kept for the examples) and the per-source figures.
        facts = materialize(value_facts(fr), small, eager=False)
        cached.append(facts)
        any_spread = spread_values(facts).count() > 0
        cand = materialize(candidates(fr, facts, any_spread), small, eager=False)
        cached.append(cand)
        stats, counts, first = _stats(fr, cand, first_examples(cand))
        present = {a for _, a in counts}
        # the first candidates, collected above, as a frame of their own (no job, no window)
        top = ops.sparkSession.createDataFrame(first, cand.schema)
        jobs: list[DataFrame] = []
        values = [name for name in VALUE_ANOMALIES if name in present]
        if values:
            jobs.append(describe_values(fr, top, values))
        if "inconsistent-offsets" in present:
            jobs.append(describe_inconsistent(fr, top))
        jobs += [describe(fr, top, ex) for ex in EXAMPLES_BY_TABLE if ex.anomaly in present]
        # these are confirmed here, so they are counted here
        for name, fn in (("realtime-order", confirm_realtime), ("poll-skip?", confirm_poll_skips)):
            if name in present:
                confirmed = fn(fr, cand)
                w = Window.partitionBy("src", "anomaly")
                jobs.append(
                    confirmed.select(
                        "*",
                        F.count("*").over(w).alias("n"),
                        F.row_number().over(w.orderBy("t", "example")).alias("rn"),
                    )
                    .filter(F.col("rn") <= EXAMPLES)
                    .drop("rn")
                )
                for k in [k for k in counts if k[1] == name]:
                    del counts[k]
        for job in jobs:
            for r in job.collect():
                key = (r["src"], r["anomaly"])
                if "n" in r.asDict():
                    counts[key] = r["n"]
                examples.setdefault(key, []).append((r["t"], r["example"]))
    finally:
        for df in cached:
            release(df)
        fr.unpersist()
    out: dict[int, dict[str, Any]] = {
        src: {"anomalies": {}, "counts": {}, "stats": st} for src, st in stats.items()
    }
    for (src, anomaly), found in sorted(examples.items()):
        res = out.setdefault(src, {"anomalies": {}, "counts": {}, "stats": {}})
        res["counts"][anomaly] = counts.get((src, anomaly), len(found))
        first = sorted(found, key=lambda e: (e[0] if e[0] is not None else -1, e[1]))[:EXAMPLES]
        res["anomalies"][anomaly] = [_example(text) for _, text in first]
    return out


def _union(dfs: list[DataFrame]) -> DataFrame:
    out = dfs[0]
    for d in dfs[1:]:
        out = out.unionByName(d)
    return out


def _example(text: str) -> dict[str, Any]:
    """Decode an example; operations gathered as JSON text become objects again."""
    ex = json.loads(text)
    if "ops_json" in ex:
        ex["ops"] = [json.loads(o) for o in ex.pop("ops_json") or []]
    return ex


SEND_STATS = ("sends-ok", "sends-ok-without-offset", "sends-info", "sends-fail")
READ_STATS = ("polls-ok", "drains-ok", "pairs-read")


def _stats(
    fr: LogFrames, cand: DataFrame, first: DataFrame
) -> tuple[dict[int, dict[str, Any]], dict[tuple[int, str], int], list[tuple[Any, ...]]]:
    """Per-history figures shown in the report (keys, drains, offsets, values read), the
    candidates' count per (src, anomaly) and the ``first`` candidates (as tuples in the
    candidates' column order), all collected by one job.

    Counted per (src, key), the partitioning the frames already have, so the one job needs
    no shuffle and no distinct count (two per-source jobs with distinct counts took 2.1 s of
    a 2.6M-operation check); a source's figures are the sums of its keys' rows.
    """
    F = _F()

    def n(cond: Column) -> Column:
        return F.sum(F.when(cond, 1).otherwise(0)).cast("long")

    typ, f = F.col("type"), F.col("f")
    sends = fr.sends.groupBy(*K).agg(
        n(typ == "ok").alias("a"),
        n((typ == "ok") & F.col("off").isNull()).alias("b"),
        n(typ == "info").alias("c"),
        n(typ == "fail").alias("d"),
        F.max("off").alias("e"),
    )
    reads = fr.reads.groupBy(*K).agg(
        n(f == "poll").alias("a"),
        n(f == "drain").alias("b"),
        F.sum("n").cast("long").alias("c"),
        F.lit(None).cast("long").alias("d"),
        F.lit(None).cast("long").alias("e"),
    )
    none, text = F.lit(None).cast("long"), F.lit(None).cast("string")
    found = cand.groupBy("src", "anomaly").agg(F.count("*").cast("long").alias("a"))
    cols = ("tag", "src", "key", "anomaly", "s1", "a", "b", "c", "d", "e")
    rows = (
        sends.select(F.lit(0).alias("tag"), "*", text.alias("anomaly"), text.alias("s1"))
        .unionByName(reads.select(F.lit(1).alias("tag"), "*", text.alias("anomaly"), text.alias("s1")))
        .select(*cols)
        .unionByName(
            found.select(F.lit(2).alias("tag"), "src", text.alias("key"), "anomaly", text.alias("s1"), "a")
            .select("*", *[none.alias(x) for x in "bcde"])
            .select(*cols)
        )
        .unionByName(
            first.select(
                F.lit(3).alias("tag"),
                *K,
                "anomaly",
                "s1",
                *[F.col(x).alias(y) for x, y in zip(("t", "i1", "i2", "i3", "i4"), "abcde", strict=True)],
            )
        )
        .collect()
    )
    out: dict[int, dict[str, Any]] = {}
    counts: dict[tuple[int, str], int] = {}
    firsts: list[tuple[Any, ...]] = []
    for tag, src, key, anomaly, s1, a, b, c, d, e in rows:
        if tag == 2:
            counts[(src, anomaly)] = a
            continue
        if tag == 3:  # the candidates' column order
            firsts.append((src, key, anomaly, a, b, c, d, e, s1))
            continue
        st = out.setdefault(src, {})
        if tag == 0:
            for name, v in zip(("keys", *SEND_STATS), (1, a, b, c, d), strict=True):
                st[name] = st.get(name, 0) + v
            if e is not None and (st.get("max-offset") is None or e > st["max-offset"]):
                st["max-offset"] = e
            st.setdefault("max-offset", None)
        else:
            for name, v in zip(READ_STATS, (a, b, c), strict=True):
                st[name] = st.get(name, 0) + v
            st["keys-drained"] = st.get("keys-drained", 0) + (b > 0)
    return out, counts, firsts
