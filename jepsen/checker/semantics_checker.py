"""The ``delay``, ``txn``, ``retry`` and ``order`` checkers on Spark: the rules of ``docs/history.md``
as joins, aggregates and windows.

Values are unique, so most rules are one aggregate per value (per value and try for retries):
how it was sent, what the client said of it (commits, rollbacks, send-backs, acks) and where it
was seen (every poll and drain entry, with the store time and try count of the copy). The rest
are per queue: an as-of walk over each key's offsets for stored and consumed order, and per lock
window for the queue locks.

Each workload's facts (those aggregates, walks and windows) are computed once
(``Frames.keep``) and every rule is a filter over them emitting candidates of one narrow shape
``(src, anomaly, t, key, i1, i2, example)``; the candidates of every rule and source are unioned
and one job counts them and keeps each anomaly's first examples by ``(t, key, i1, i2)``, as
``semantics_rules`` (this module's in-process twin, tested to agree) does. No Python UDFs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from jepsen.checker.frames import read_pairs
from jepsen.checker.semantics_model import DEFAULT_TOLERANCES, EXAMPLES, Tolerances, fault_windows
from jepsen.checker.spark import materialize, release

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

K = ["src", "key"]
ENTRIES_TYPE = "array<array<bigint>>"
MS = 1_000_000
#: an example's fields, in order: (name, column)
Fields = list[tuple[str, "Column"]]


def _F():  # noqa: N802 - keep pyspark imports lazy so the CLI starts fast
    from pyspark.sql import functions as F

    return F


def _W():  # noqa: N802
    from pyspark.sql import Window

    return Window


def _long(text: str, name: str) -> Column:
    return _F().get_json_object(text, f"$.{name}").cast("long")


def _str(text: str, name: str) -> Column:
    return _F().get_json_object(text, f"$.{name}")


def _div_ms(col: Column) -> Column:
    """ns to ms, truncated toward zero (``semantics_model.quot``)."""
    F = _F()
    return F.when(col.isNotNull(), (col - col % F.lit(MS)) / F.lit(MS)).cast("long")


def _struct(fields: Fields) -> Column:
    return _F().struct(*[c.alias(n) for n, c in fields])


def op_desc(col: str) -> Column:
    """An operation in an example (``semantics_rules.op_desc``), from a struct column of its fields."""
    F = _F()
    s = F.col(col)
    return F.when(
        s.isNotNull(),
        F.struct(
            s["process"].alias("process"),
            s["f"].alias("f"),
            s["type"].alias("type"),
            s["inv_index"].alias("invoke-index"),
            s["inv_time"].alias("invoke-time"),
            s["cmp_index"].alias("complete-index"),
            s["cmp_time"].alias("complete-time"),
        ),
    )


def seen_desc(col: str) -> Column:
    """The first read of a value (``semantics_rules.seen_desc``), from a struct column."""
    F = _F()
    s = F.col(col)
    return F.when(
        s.isNotNull(),
        F.struct(
            s["process"].alias("process"),
            s["f"].alias("f"),
            s["inv_index"].alias("invoke-index"),
            s["cmp_time"].alias("complete-time"),
        ),
    )


def _cand(
    df: DataFrame, anomaly: str, t: Column, key: Column, i1: Column, i2: Column | None, ex: Fields
) -> DataFrame:
    F = _F()
    return df.select(
        "src",
        F.lit(anomaly).alias("anomaly"),
        t.cast("long").alias("t"),
        key.cast("string").alias("key"),
        i1.cast("long").alias("i1"),
        (i2 if i2 is not None else F.lit(None)).cast("long").alias("i2"),
        F.to_json(_struct(ex)).alias("ex"),
    )


def _flag(df: DataFrame, cond: Column) -> DataFrame:
    F = _F()
    return df.filter(F.coalesce(cond, F.lit(False)))


OP_FIELDS = ("inv_index", "key", "process", "f", "type", "inv_time", "cmp_index", "cmp_time")


class Frames:
    """The operations of the sources, their read entries and each key's last drain."""

    def __init__(self, ops: DataFrame, small: bool = False) -> None:
        F = _F()
        self.small = small
        self.kept: list[DataFrame] = []
        self.ops = ops.filter(F.col("kind") == "op")
        reads = self.ops.filter(F.col("f").isin("poll", "drain") & (F.col("type") == "ok"))
        self.last_drain = (
            reads.filter(F.col("f") == "drain")
            .groupBy(*K)
            .agg(F.max(F.struct("inv_time", "inv_index")).alias("ld"))
            .select(*K, F.col("ld.inv_time").alias("ld_time"), F.col("ld.inv_index").alias("ld_index"))
        )
        exploded = reads.select(
            *K,
            "f",
            "process",
            "inv_index",
            "inv_time",
            "cmp_time",
            F.posexplode(read_pairs()).alias("pos", "e"),
        )
        self.entries = exploded.join(F.broadcast(self.last_drain), K, "left").select(
            *K,
            "f",
            "process",
            "inv_index",
            "inv_time",
            "cmp_time",
            "pos",
            F.col("e")[0].alias("off"),
            F.col("e")[1].alias("v"),
            F.col("e")[2].alias("store"),
            F.col("e")[3].alias("attempt"),
            F.coalesce((F.col("f") == "drain") & (F.col("inv_index") == F.col("ld_index")), F.lit(False))
            .cast("int")
            .alias("in_last"),
        )
        # every rule reads the entries: their JSON is parsed once (this cache), not per rule
        self.entries = self.keep(self.entries)

    def keep(self, df: DataFrame) -> DataFrame:
        """``df`` computed once (``spark.materialize``): a workload's facts, which its rules only
        filter. One plan per rule over these stays small; one plan over their joins did not
        (a union of forty rules took longer to plan and compile than to run)."""
        df = materialize(df, self.small)
        self.kept.append(df)
        return df

    def release(self) -> None:
        for df in self.kept:
            release(df)
        self.kept.clear()

    def only(self, srcs: list[int]) -> Frames:
        """These frames for some of the sources only (no new cache: filters on this one's)."""
        F = _F()
        view = object.__new__(Frames)
        view.small, view.kept = self.small, self.kept  # what a view keeps, its parent releases
        keep = F.col("src").isin(srcs)
        view.ops = self.ops.filter(keep)
        view.entries = self.entries.filter(keep)
        view.last_drain = self.last_drain.filter(keep)
        return view

    def final_time(self, keys: Column | None = None) -> DataFrame:
        """Per src: when the earliest of its keys' last drains began (``keys``: which keys)."""
        F = _F()
        ld = self.last_drain if keys is None else self.last_drain.filter(keys)
        return ld.groupBy("src").agg(F.min("ld_time").alias("final_t"))

    def with_last_drain(self, df: DataFrame, key: Column) -> DataFrame:
        """``df`` with the last drain (``ld_time``, ``ld_index``) of the key ``key`` names."""
        F = _F()
        ld = self.last_drain.select(
            F.col("src").alias("l_src"), F.col("key").alias("l_key"), "ld_time", "ld_index"
        )
        j = df.join(F.broadcast(ld), (F.col("src") == F.col("l_src")) & (key == F.col("l_key")), "left")
        return j.drop("l_src", "l_key")


def read_facts(entries: DataFrame, by: tuple[str, ...] = ("v",)) -> DataFrame:
    """Per (src, *by): ``semantics_rules.read_facts``."""
    F = _F()
    return entries.groupBy("src", *by).agg(
        F.count("*").alias("n_reads"),
        F.min(F.struct("cmp_time", "inv_index", "process", "f")).alias("seen"),
        F.min("inv_time").alias("t_read"),
        F.min("key").alias("key_read"),
        F.min("store").alias("store"),
        F.size(F.collect_set(F.struct("key", "off"))).alias("npos"),
        F.max("in_last").alias("in_last"),
    )


def _type_code() -> Column:
    F = _F()
    t = F.col("type")
    return F.when(t == "ok", 3).when(t == "info", 2).when(t == "fail", 1).otherwise(0)


def send_facts(sends: DataFrame, fields: tuple[str, ...] = ()) -> DataFrame:
    """Per (src, v): the earliest send (by invoke index) with ``fields``, how many, their best type."""
    F = _F()
    return (
        sends.groupBy("src", "v")
        .agg(
            F.min(F.struct(*OP_FIELDS, *fields)).alias("s"),
            F.count("*").alias("n_sends"),
            F.max(_type_code()).alias("tc"),
        )
        .select(
            "src",
            "v",
            "s",
            "n_sends",
            F.when(F.col("tc") == 3, "ok")
            .when(F.col("tc") == 2, "info")
            .when(F.col("tc") == 1, "fail")
            .alias("s_type"),
        )
    )


def _outer(a: DataFrame, b: DataFrame) -> DataFrame:
    """``a`` and ``b`` (each keyed by src, v) joined fully, v compared null-safely."""
    F = _F()
    a2 = a.withColumnRenamed("src", "a_src").withColumnRenamed("v", "a_v")
    b2 = b.withColumnRenamed("src", "b_src").withColumnRenamed("v", "b_v")
    j = a2.join(b2, (F.col("a_src") == F.col("b_src")) & F.col("a_v").eqNullSafe(F.col("b_v")), "full")
    rest = [c for c in j.columns if c not in ("a_src", "b_src", "a_v", "b_v")]
    return j.select(
        F.coalesce("a_src", "b_src").alias("src"),
        F.when(F.col("a_src").isNotNull(), F.col("a_v")).otherwise(F.col("b_v")).alias("v"),
        *rest,
    )


def value_checks(
    df: DataFrame, t: Column, key: Column, base: Fields, npos: Column, n_reads: Column
) -> list[DataFrame]:
    """duplicate, unexpected, G1a, recovered and unseen-info (``semantics_rules.value_checks``)."""
    F = _F()
    read = F.coalesce(n_reads, F.lit(0)) > 0
    st = F.col("s_type")
    n_sends = F.coalesce(F.col("n_sends"), F.lit(0))
    return [
        _cand(_flag(df, hit), name, t, key, F.col("v"), None, base)
        for name, hit in (
            ("duplicate", F.coalesce(npos, F.lit(0)) > 1),
            ("unexpected", read & (n_sends == 0)),
            ("G1a", read & (st == "fail")),
            ("recovered", read & (st == "info")),
            ("unseen-info", ~read & (st == "info")),
        )
    ]


def _missing(ld_index: str = "ld_index", ld_time: str = "ld_time") -> tuple[str, Column]:
    F = _F()
    return (
        "missing-from-drain",
        F.struct(F.col(ld_index).alias("invoke-index"), F.col(ld_time).alias("invoke-time")),
    )


def _lost(s: Column) -> Column:
    """An ok send that completed before its key's last drain began, missing from it."""
    F = _F()
    return (
        (F.col("s_type") == "ok")
        & s.isNotNull()
        & F.col("ld_time").isNotNull()
        & s["cmp_time"].isNotNull()
        & (F.col("ld_time") > s["cmp_time"])
    )


# --- delay -----------------------------------------------------------------------------------


def delay_candidates(
    spark: SparkSession, fr: Frames, windows: dict[int, list[tuple[int, int]]], tol: Tolerances
) -> list[DataFrame]:
    F = _F()
    sends = fr.ops.filter(F.col("f") == "send-delayed").select(
        "*",
        _long("inv_value", "value").alias("v"),
        _long("inv_value", "delay-ms").alias("d"),
        _long("inv_value", "wall-ms").alias("w"),
        _long("inv_value", "level").alias("level"),
        _long("inv_value", "deliver-ms").alias("deliver"),
    )
    facts = _outer(send_facts(sends, ("d", "w", "level", "deliver")), read_facts(fr.entries))
    facts = fr.with_last_drain(facts, F.col("s.key"))
    rows = [(src, [(a, b) for a, b in ws]) for src, ws in windows.items()] or [(-1, [])]
    wins = spark.createDataFrame(rows, "src int, windows array<struct<s:bigint,e:bigint>>")
    facts = facts.join(F.broadcast(wins), "src", "left")
    s = F.col("s")
    d, w, store = s["d"], s["w"], F.col("store")
    n_reads = F.coalesce(F.col("n_reads"), F.lit(0))
    seen_cmp = F.col("seen")["cmp_time"]
    judged = s.isNotNull() & d.isNotNull() & (n_reads > 0) & s["type"].isin("ok", "info")
    early_h = F.when(
        judged & seen_cmp.isNotNull() & s["inv_time"].isNotNull(), s["inv_time"] + d * MS - seen_cmp
    )
    early_s = F.when(judged & w.isNotNull() & store.isNotNull(), w + d - store)
    late_judged = (
        s.isNotNull()
        & (F.col("s_type") == "ok")
        & (n_reads > 0)
        & d.isNotNull()
        & w.isNotNull()
        & store.isNotNull()
        & s["cmp_time"].isNotNull()
    )
    store_h = s["inv_time"] + (store - w) * MS
    due_h = s["cmp_time"] + d * MS
    spans = F.coalesce(F.col("windows"), F.array().cast("array<struct<s:bigint,e:bigint>>"))
    zero = F.lit(0).cast("long")
    exc = F.aggregate(
        spans,
        zero,
        lambda acc, x: acc + F.greatest(zero, F.least(x["e"], store_h) - F.greatest(x["s"], due_h)),
    )
    facts = facts.select(
        "*",
        early_h.alias("early_h"),
        early_s.alias("early_s"),
        F.when(late_judged, store_h - due_h).alias("late_by"),
        F.when(late_judged, exc).alias("late_exc"),
        F.coalesce(s["key"], F.col("key_read")).alias("ckey"),
        F.coalesce(s["inv_time"], F.col("t_read")).alias("ct"),
    )
    facts = fr.keep(facts)
    base: Fields = [
        ("key", F.col("ckey")),
        ("value", F.col("v")),
        ("level", s["level"]),
        ("deliver-ms", s["deliver"]),
        ("delay-ms", d),
        ("wall-ms", w),
        ("send", op_desc("s")),
        ("reads", n_reads),
        ("first-seen", seen_desc("seen")),
        ("store-ms", store),
    ]
    ck, ct, v = F.col("ckey"), F.col("ct"), F.col("v")
    early = (F.col("early_h") > tol.early_ms * MS) | (F.col("early_s") > tol.early_ms)
    late = F.col("late_by") - F.col("late_exc") > tol.late_ms * MS
    return [
        _cand(
            _flag(facts, early),
            "delivered-early",
            ct,
            ck,
            v,
            None,
            [
                *base,
                ("seen-early-by-ms", _div_ms(F.col("early_h"))),
                ("stored-early-by-ms", F.col("early_s")),
            ],
        ),
        _cand(
            _flag(facts, late),
            "delivered-late",
            ct,
            ck,
            v,
            None,
            [*base, ("late-by-ms", _div_ms(F.col("late_by"))), ("fault-ms", _div_ms(F.col("late_exc")))],
        ),
        _cand(
            _flag(facts, _lost(s) & (F.coalesce(F.col("in_last"), F.lit(0)) == 0)),
            "lost",
            ct,
            ck,
            v,
            None,
            [*base, _missing()],
        ),
        *value_checks(facts, ct, ck, base, F.col("npos"), n_reads),
    ]


# --- txn -------------------------------------------------------------------------------------


def txn_candidates(fr: Frames) -> list[DataFrame]:
    F = _F()
    ops = fr.ops
    halves = ops.filter(F.col("f") == "send-half").select(
        "*", _long("inv_value", "value").alias("v"), _str("inv_value", "outcome").alias("outcome")
    )
    said = ops.filter((F.col("f") == "end") | ((F.col("f") == "check") & (F.col("type") == "ok"))).select(
        "src",
        "f",
        "type",
        "inv_time",
        "cmp_time",
        _long("inv_value", "value").alias("v"),
        F.when(F.col("f") == "end", _str("inv_value", "decision"))
        .otherwise(_str("cmp_value", "answer"))
        .alias("says"),
        F.when((F.col("f") == "end") & F.col("type").isin("ok", "info"), _str("cmp_value", "queue")).alias(
            "queue"
        ),
    )
    commit = F.col("says") == "commit"
    said_facts = said.groupBy("src", "v").agg(
        F.min(F.when(commit, F.col("inv_time"))).alias("commit_t"),
        F.min(F.when(commit & (F.col("f") == "end") & (F.col("type") == "ok"), F.col("cmp_time"))).alias(
            "commit_ok"
        ),
        F.max((F.col("says") == "rollback").cast("int")).alias("rolled_i"),
        F.min("queue").alias("queue"),
    )
    facts = _outer(_outer(send_facts(halves, ("outcome",)), said_facts), read_facts(fr.entries))
    facts = facts.join(F.broadcast(fr.final_time()), "src", "left")
    s = F.col("s")
    n_reads = F.coalesce(F.col("n_reads"), F.lit(0))
    read = n_reads > 0
    rolled = F.coalesce(F.col("rolled_i"), F.lit(0)) == 1
    in_last = F.coalesce(F.col("in_last"), F.lit(0)) == 1
    commit_t, commit_ok, final_t = F.col("commit_t"), F.col("commit_ok"), F.col("final_t")
    seen_cmp = F.col("seen")["cmp_time"]
    facts = fr.keep(
        facts.select(
            "*",
            F.coalesce(F.col("queue"), F.col("key_read")).alias("ckey"),
            F.coalesce(s["inv_time"], F.col("t_read")).alias("ct"),
        )
    )
    base: Fields = [
        ("key", F.col("ckey")),
        ("value", F.col("v")),
        ("outcome", s["outcome"]),
        ("half", op_desc("s")),
        ("commit-said-time", commit_t),
        ("commit-acked-time", commit_ok),
        ("rolled-back", rolled),
        ("reads", n_reads),
        ("first-seen", seen_desc("seen")),
        ("final-drain-time", final_t),
    ]
    ck, ct, v = F.col("ckey"), F.col("ct"), F.col("v")
    rules = (
        (
            "committed-not-visible",
            commit_ok.isNotNull() & final_t.isNotNull() & (final_t > commit_ok) & ~in_last,
        ),
        ("rolled-back-visible", read & rolled & commit_t.isNull()),
        (
            "half-visible-before-commit",
            read
            & F.col("s_type").isin("ok", "info")
            & ~(rolled & commit_t.isNull())
            & (commit_t.isNull() | (seen_cmp.isNotNull() & (seen_cmp < commit_t))),
        ),
        (
            "unresolved",
            s.isNotNull()
            & (F.col("s_type") == "ok")
            & (s["outcome"] == "commit")
            & ~rolled
            & commit_ok.isNull()
            & final_t.isNotNull()
            & s["cmp_time"].isNotNull()
            & (final_t > s["cmp_time"])
            & ~in_last,
        ),
    )
    out = [_cand(_flag(facts, cond), name, ct, ck, v, None, base) for name, cond in rules]
    return out + value_checks(facts, ct, ck, base, F.col("npos"), n_reads)


# --- retry -----------------------------------------------------------------------------------


def _kind(key: Column) -> Column:
    F = _F()
    return F.when(key.startswith("%RETRY%"), "retry").when(key.startswith("%DLQ%"), "dlq").otherwise("main")


def retry_candidates(fr: Frames) -> list[DataFrame]:
    F = _F()
    ops = fr.ops
    entries = fr.entries.withColumn("kind", _kind(F.col("key")))
    sends = ops.filter(F.col("f") == "send").withColumn("v", F.col("inv_value").cast("long"))
    acks = ops.filter((F.col("f") == "ack") & (F.col("type") == "ok")).select(
        "src", _long("inv_value", "value").alias("v"), _long("inv_value", "attempt").alias("a")
    )
    main = read_facts(entries.filter(F.col("kind") == "main"))
    allr = read_facts(entries).select(
        "src",
        "v",
        F.col("n_reads").alias("all_n_reads"),
        F.col("t_read").alias("all_t_read"),
        F.col("key_read").alias("all_key_read"),
    )
    dead = (
        entries.filter(F.col("kind") == "dlq")
        .groupBy("src", "v")
        .agg(
            F.count("*").alias("dlq_n"),
            F.size(F.collect_set(F.struct("key", "off"))).alias("dlq_pos"),
            F.max("in_last").alias("in_dlq_i"),
        )
    )
    copy_pos = (
        entries.filter(F.col("kind") == "retry")
        .groupBy("src", "v", "attempt")
        .agg(F.size(F.collect_set(F.struct("key", "off"))).alias("n"))
        .groupBy("src", "v")
        .agg(F.max("n").alias("copy_pos"))
    )
    acked = acks.groupBy("src", "v").agg(F.sort_array(F.collect_set("a")).alias("acked"))
    facts = _outer(_outer(_outer(_outer(_outer(send_facts(sends), main), allr), dead), copy_pos), acked)
    facts = fr.with_last_drain(facts, F.col("s.key"))
    s = F.col("s")
    dlq_n = F.coalesce(F.col("dlq_n"), F.lit(0))
    acked_any = F.coalesce(F.size("acked"), F.lit(0)) > 0
    facts = fr.keep(
        facts.select(
            "*",
            F.coalesce(s["key"], F.col("all_key_read")).alias("ckey"),
            F.coalesce(s["inv_time"], F.col("all_t_read")).alias("ct"),
        )
    )
    base: Fields = [
        ("key", F.col("ckey")),
        ("value", F.col("v")),
        ("send", op_desc("s")),
        ("reads", F.coalesce(F.col("all_n_reads"), F.lit(0))),
        ("acked-attempts", F.when(acked_any, F.col("acked"))),
        ("in-dlq", dlq_n > 0),
    ]
    ck, ct, v = F.col("ckey"), F.col("ct"), F.col("v")
    npos = F.greatest(
        F.coalesce(F.col("npos"), F.lit(0)),
        F.coalesce(F.col("dlq_pos"), F.lit(0)),
        F.coalesce(F.col("copy_pos"), F.lit(0)),
    )
    out = [
        _cand(_flag(facts, (dlq_n > 0) & acked_any), "dlq-and-success", ct, ck, v, None, base),
        _cand(
            _flag(facts, _lost(s) & (F.coalesce(F.col("in_last"), F.lit(0)) == 0)),
            "lost",
            ct,
            ck,
            v,
            None,
            [*base, _missing()],
        ),
        *value_checks(facts, ct, ck, base, npos, F.col("all_n_reads")),
    ]
    # per value and try
    backs = ops.filter(F.col("f") == "send-back").select(
        "*",
        _long("inv_value", "value").alias("v"),
        _long("inv_value", "attempt").alias("a"),
        _long("inv_value", "max").alias("m"),
    )
    back_facts = backs.groupBy("src", "v", "a").agg(
        F.min(F.when(F.col("type") == "ok", F.struct(F.col("cmp_time").alias("by"), *OP_FIELDS))).alias("b"),
        F.max("m").alias("m"),
        F.max(F.col("type").isin("ok", "info").cast("int")).alias("nonfail"),
    )
    copies = (
        entries.filter(F.col("kind") == "retry")
        .withColumn("a", F.col("attempt"))
        .groupBy("src", "v", "a")
        .agg(F.min(F.struct("cmp_time", "inv_index", "process", "f", "key", "inv_time")).alias("c"))
    )
    acked_at = acks.groupBy("src", "v", "a").agg(F.lit(1).alias("acked_here"))
    per = (
        back_facts.withColumnRenamed("src", "x_src")
        .withColumnRenamed("v", "x_v")
        .withColumnRenamed("a", "x_a")
        .join(
            copies.withColumnRenamed("src", "y_src")
            .withColumnRenamed("v", "y_v")
            .withColumnRenamed("a", "y_a"),
            (F.col("x_src") == F.col("y_src"))
            & F.col("x_v").eqNullSafe(F.col("y_v"))
            & F.col("x_a").eqNullSafe(F.col("y_a")),
            "full",
        )
    )
    per = per.select(
        F.coalesce("x_src", "y_src").alias("src"),
        F.when(F.col("x_src").isNotNull(), F.col("x_v")).otherwise(F.col("y_v")).alias("v"),
        F.when(F.col("x_src").isNotNull(), F.col("x_a")).otherwise(F.col("y_a")).alias("a"),
        "b",
        "m",
        "c",
    )
    nxt = copies.select("src", "v", (F.col("a") - 1).alias("a"), F.lit(1).alias("next_copy"))
    prev = back_facts.select(
        "src",
        "v",
        (F.col("a") + 1).alias("a"),
        F.col("nonfail").alias("prev_nonfail"),
        F.col("m").alias("prev_m"),
    )
    prev_ack = acked_at.select(
        "src", "v", (F.col("a") + 1).alias("a"), F.col("acked_here").alias("prev_acked")
    )
    for extra in (nxt, prev, prev_ack):
        per = per.join(extra, ["src", "v", "a"], "left")
    retry_final = fr.final_time(F.col("key").startswith("%RETRY%")).withColumnRenamed(
        "final_t", "retry_final"
    )
    dlq_final = fr.final_time(F.col("key").startswith("%DLQ%")).withColumnRenamed("final_t", "dlq_final")
    in_dlq = dead.filter(F.col("in_dlq_i") == 1).select("src", "v", F.lit(1).alias("in_dlq"))
    per = (
        per.join(F.broadcast(retry_final), "src", "left")
        .join(F.broadcast(dlq_final), "src", "left")
        .join(in_dlq, ["src", "v"], "left")
    )
    b, c, a, m = F.col("b"), F.col("c"), F.col("a"), F.col("m")
    per = fr.keep(per.select("*", F.coalesce(b["key"], c["key"]).alias("ckey")))
    base_a: Fields = [
        ("key", F.col("ckey")),
        ("value", F.col("v")),
        ("attempt", a),
        ("max", m),
        ("send-back", op_desc("b")),
        ("copy", seen_desc("c")),
    ]
    backed = b.isNotNull() & m.isNotNull() & a.isNotNull()
    copied = c.isNotNull() & a.isNotNull()
    out += [
        _cand(
            _flag(
                per,
                backed
                & (a < m)
                & F.col("next_copy").isNull()
                & F.col("retry_final").isNotNull()
                & b["cmp_time"].isNotNull()
                & (F.col("retry_final") > b["cmp_time"]),
            ),
            "never-redelivered",
            b["inv_time"],
            F.col("ckey"),
            F.col("v"),
            a,
            base_a,
        ),
        _cand(
            _flag(
                per,
                backed
                & (a >= m)
                & F.col("dlq_final").isNotNull()
                & b["cmp_time"].isNotNull()
                & (F.col("dlq_final") > b["cmp_time"])
                & F.col("in_dlq").isNull(),
            ),
            "past-max-not-in-dlq",
            b["inv_time"],
            F.col("ckey"),
            F.col("v"),
            a,
            [*base_a, ("why", F.lit("not in the dead-letter drain"))],
        ),
        _cand(
            _flag(per, copied & (a >= 1) & (F.coalesce(F.col("prev_nonfail"), F.lit(0)) == 0)),
            "redelivered-after-success",
            c["inv_time"],
            F.col("ckey"),
            F.col("v"),
            a,
            [*base_a, ("acked-before", F.col("prev_acked").isNotNull())],
        ),
        _cand(
            _flag(per, copied & F.col("prev_m").isNotNull() & (a > F.col("prev_m"))),
            "past-max-not-in-dlq",
            c["inv_time"],
            F.col("ckey"),
            F.col("v"),
            a,
            [
                *[(n, col) if n != "max" else ("max", F.col("prev_m")) for n, col in base_a],
                ("why", F.lit("retried past its last try")),
            ],
        ),
    ]
    return out


# --- order ---------------------------------------------------------------------------------------


def order_candidates(fr: Frames, tol: Tolerances) -> list[DataFrame]:
    F = _F()
    Window = _W()
    ops = fr.ops
    sends = ops.filter(F.col("f") == "send").select(
        "*", F.col("inv_value").cast("long").alias("v"), F.col("offset").alias("off")
    )
    ok_sends = sends.filter((F.col("type") == "ok") & F.col("off").isNotNull())
    out: list[DataFrame] = []
    # stored out of order: the earliest completion among strictly higher offsets of the key
    above = Window.partitionBy(*K).orderBy(F.col("off").desc()).rangeBetween(Window.unboundedPreceding, -1)
    best = F.min(F.struct(F.col("cmp_time").alias("by"), *OP_FIELDS, "v", "off")).over(above)
    stored = ok_sends.select("*", best.alias("best")).filter(
        F.col("best").isNotNull() & (F.col("best")["cmp_time"] < F.col("inv_time"))
    )
    stored = fr.keep(stored.select("*", F.struct(*OP_FIELDS).alias("me")))
    out.append(
        _cand(
            stored,
            "order-broken",
            F.col("inv_time"),
            F.col("key"),
            F.col("inv_index"),
            F.lit(0),
            [
                ("key", F.col("key")),
                ("kind", F.lit("stored")),
                (
                    "later-lower",
                    _op_plus("me", value=F.col("v"), offset=F.col("off")),
                ),
                (
                    "completed-before",
                    _op_plus("best", value=F.col("best")["v"], offset=F.col("best")["off"]),
                ),
            ],
        )
    )
    # consumed out of order
    consumes = ops.filter((F.col("f") == "consume") & (F.col("type") == "ok")).select(
        *K,
        "inv_index",
        "inv_time",
        _str("inv_value", "consumer").alias("consumer"),
        F.posexplode(
            F.coalesce(F.from_json(_str("inv_value", "messages"), ENTRIES_TYPE), F.array().cast(ENTRIES_TYPE))
        ).alias("pos", "e"),
    )
    consumed = consumes.select(
        *K, "inv_index", "inv_time", "consumer", "pos", F.col("e")[0].alias("off"), F.col("e")[1].alias("v")
    ).filter(F.col("off").isNotNull())
    firsts = (
        consumed.filter(F.col("off").isNotNull())
        .groupBy(*K, "off")
        .agg(F.min(F.struct("inv_time", "inv_index", "pos", "off", "consumer")).alias("first"))
    )
    drained = (
        fr.entries.filter(F.col("in_last") == 1).filter(F.col("off").isNotNull()).select(*K, "off").distinct()
    )
    existing = drained.join(firsts, [*K, "off"], "full")
    later_w = Window.partitionBy(*K).orderBy(F.col("off").desc()).rangeBetween(Window.unboundedPreceding, -1)
    walked = existing.select("*", F.min("first").over(later_w).alias("later"))
    f_, l_ = F.col("first"), F.col("later")
    mine_after = f_.isNull() | (
        F.struct(f_["inv_time"], f_["inv_index"], f_["pos"])
        > F.struct(l_["inv_time"], l_["inv_index"], l_["pos"])
    )
    overtaken = fr.keep(walked.filter(l_.isNotNull() & mine_after))
    out.append(
        _cand(
            overtaken,
            "order-broken",
            l_["inv_time"],
            F.col("key"),
            F.col("off"),
            F.lit(1),
            [
                ("key", F.col("key")),
                ("kind", F.lit("consumed")),
                ("offset", F.col("off")),
                (
                    "first-consumed",
                    F.when(
                        f_.isNotNull(),
                        F.struct(
                            f_["inv_index"].alias("invoke-index"),
                            f_["inv_time"].alias("invoke-time"),
                            f_["consumer"].alias("consumer"),
                        ),
                    ),
                ),
                (
                    "overtaken-by",
                    F.struct(
                        l_["off"].alias("offset"),
                        l_["inv_index"].alias("invoke-index"),
                        l_["inv_time"].alias("invoke-time"),
                        l_["consumer"].alias("consumer"),
                    ),
                ),
            ],
        )
    )
    out.append(lock_overlaps(fr, tol))
    # per value: lost, duplicate, unexpected, G1a
    positions = (
        ok_sends.select("src", "v", "key", "off")
        .unionByName(consumed.select("src", "v", "key", "off"))
        .unionByName(fr.entries.select("src", "v", "key", "off"))
    )
    seen = (
        consumed.select("src", "v", "key", "inv_time")
        .unionByName(fr.entries.select("src", "v", "key", "inv_time"))
        .groupBy("src", "v")
        .agg(F.count("*").alias("n_reads"), F.min("key").alias("key_read"), F.min("inv_time").alias("t_read"))
    )
    pos_facts = positions.groupBy("src", "v").agg(
        F.size(F.collect_set(F.struct("key", "off"))).alias("npos"),
        F.sort_array(F.collect_set("off")).alias("offsets"),
    )
    in_last = (
        fr.entries.filter(F.col("in_last") == 1)
        .select("src", "v")
        .distinct()
        .select("src", "v", F.lit(1).alias("in_last_v"))
    )
    facts = _outer(_outer(_outer(send_facts(sends), seen), pos_facts), in_last)
    facts = fr.with_last_drain(facts, F.col("s.key"))
    s = F.col("s")
    facts = fr.keep(
        facts.select(
            "*",
            F.coalesce(s["key"], F.col("key_read")).alias("ckey"),
            F.coalesce(s["inv_time"], F.col("t_read")).alias("ct"),
        )
    )
    base: Fields = [
        ("key", F.col("ckey")),
        ("value", F.col("v")),
        ("send", op_desc("s")),
        ("offsets", F.when(F.size("offsets") > 0, F.col("offsets"))),
    ]
    ck, ct, v = F.col("ckey"), F.col("ct"), F.col("v")
    out.append(
        _cand(
            _flag(facts, _lost(s) & F.col("in_last_v").isNull()),
            "lost",
            ct,
            ck,
            v,
            None,
            [*base, _missing()],
        )
    )
    out += value_checks(facts, ct, ck, base, F.col("npos"), F.col("n_reads"))
    return out


def _op_plus(col: str, **extra: Column) -> Column:
    """``op_desc`` of a struct column with more fields after its own."""
    F = _F()
    s = F.col(col)
    return F.struct(
        s["process"].alias("process"),
        s["f"].alias("f"),
        s["type"].alias("type"),
        s["inv_index"].alias("invoke-index"),
        s["inv_time"].alias("invoke-time"),
        s["cmp_index"].alias("complete-index"),
        s["cmp_time"].alias("complete-time"),
        *[c.alias(k) for k, c in extra.items()],
    )


def lock_overlaps(fr: Frames, tol: Tolerances) -> DataFrame:
    """Lock windows per (queue, consumer), merged into islands, then overlapping islands of two
    consumers (``semantics_rules.lock_overlaps``)."""
    F = _F()
    Window = _W()
    ops = fr.ops
    locks = ops.filter((F.col("f") == "lock") & (F.col("type") == "ok")).select(
        "src",
        _str("inv_value", "consumer").alias("consumer"),
        _long("inv_value", "live-ms").alias("live"),
        "inv_time",
        "cmp_time",
        F.explode(
            F.coalesce(
                F.from_json(_str("cmp_value", "granted"), "array<string>"), F.array().cast("array<string>")
            )
        ).alias("key"),
    )
    wins = locks.filter(
        F.col("key").isNotNull()
        & F.col("consumer").isNotNull()
        & F.col("live").isNotNull()
        & F.col("cmp_time").isNotNull()
    ).select(
        "src",
        "key",
        "consumer",
        "inv_time",
        F.col("cmp_time").alias("start"),
        (F.col("inv_time") + (F.col("live") - tol.lock_ms) * MS).alias("expiry"),
    )
    unlocks = ops.filter(F.col("f") == "unlock").select(
        F.col("src").alias("u_src"),
        _str("inv_value", "consumer").alias("u_consumer"),
        F.col("inv_time").alias("u_time"),
        F.explode(
            F.coalesce(
                F.from_json(_str("inv_value", "queues"), "array<string>"), F.array().cast("array<string>")
            )
        ).alias("u_key"),
    )
    cut = (
        wins.join(
            unlocks,
            (F.col("src") == F.col("u_src"))
            & (F.col("key") == F.col("u_key"))
            & (F.col("consumer") == F.col("u_consumer"))
            & (F.col("u_time") >= F.col("inv_time")),
            "left",
        )
        .groupBy("src", "key", "consumer", "inv_time", "start", "expiry")
        .agg(F.min("u_time").alias("unlock"))
        .select(
            "src",
            "key",
            "consumer",
            "start",
            F.least(F.col("expiry"), F.coalesce(F.col("unlock"), F.col("expiry"))).alias("end"),
        )
        .filter(F.col("end") > F.col("start"))
    )
    # gaps and islands: a window starts a new island past every earlier window's end
    w = Window.partitionBy("src", "key", "consumer").orderBy("start", "end")
    prev_end = F.max("end").over(w.rowsBetween(Window.unboundedPreceding, -1))
    marked = cut.select(
        "*", F.when(prev_end.isNull() | (F.col("start") > prev_end), 1).otherwise(0).alias("new")
    )
    island = marked.select(
        "*", F.sum("new").over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow)).alias("isl")
    )
    islands = island.groupBy("src", "key", "consumer", "isl").agg(
        F.min("start").alias("s"), F.max("end").alias("e")
    )
    a = islands.select(*[F.col(c).alias("a_" + c) for c in ("src", "key", "consumer", "s", "e")])
    b = islands.select(*[F.col(c).alias("b_" + c) for c in ("src", "key", "consumer", "s", "e")])
    pairs = fr.keep(
        a.join(
            b,
            (F.col("a_src") == F.col("b_src"))
            & (F.col("a_key") == F.col("b_key"))
            & (F.col("a_consumer") < F.col("b_consumer"))
            & (F.col("a_s") < F.col("b_e"))
            & (F.col("b_s") < F.col("a_e")),
        ).select(
            F.col("a_src").alias("src"),
            F.col("a_key").alias("key"),
            "a_consumer",
            "a_s",
            "a_e",
            "b_consumer",
            "b_s",
            "b_e",
            F.greatest("a_s", "b_s").alias("from"),
            F.least("a_e", "b_e").alias("to"),
        )
    )
    return _cand(
        pairs,
        "two-consumers-one-queue",
        F.col("from"),
        F.col("key"),
        F.col("a_s"),
        F.col("b_s"),
        [
            ("key", F.col("key")),
            ("overlap-from", F.col("from")),
            ("overlap-to", F.col("to")),
            (
                "first",
                F.struct(
                    F.col("a_consumer").alias("consumer"),
                    F.col("a_s").alias("from"),
                    F.col("a_e").alias("to"),
                ),
            ),
            (
                "second",
                F.struct(
                    F.col("b_consumer").alias("consumer"),
                    F.col("b_s").alias("from"),
                    F.col("b_e").alias("to"),
                ),
            ),
        ],
    )


# --- assembly ------------------------------------------------------------------------------


def stats(fr: Frames, order_srcs: list[int]) -> dict[int, dict[str, Any]]:
    """Per src: ``semantics_rules.stats``, in one job."""
    F = _F()
    parts = [
        fr.entries.groupBy("src").agg(F.lit("entries-read").alias("name"), F.count("*").alias("n")),
        fr.last_drain.groupBy("src").agg(F.lit("keys-drained").alias("name"), F.count("*").alias("n")),
    ]
    if order_srcs:
        parts.append(
            fr.ops.filter((F.col("f") == "consume") & F.col("src").isin(order_srcs))
            .groupBy("src")
            .agg(F.lit("consumers").alias("name"), F.countDistinct(_str("inv_value", "consumer")).alias("n"))
        )
    rows = parts[0]
    for p in parts[1:]:
        rows = rows.unionByName(p)
    out: dict[int, dict[str, Any]] = {}
    for r in rows.collect():
        out.setdefault(r["src"], {})[r["name"]] = r["n"]
    return out


def check(
    spark: SparkSession,
    ops: DataFrame,
    workloads: dict[int, str],
    tolerances: Tolerances = DEFAULT_TOLERANCES,
    small: bool = False,
) -> dict[int, dict[str, Any]]:
    """Every rule of each source's workload; per src ``{"anomalies", "counts", "stats"}``.

    However many sources and workloads: one job for the fault windows (when a source is a
    delay history: a few nemesis rows to the driver), one for the stats, and one that counts
    every anomaly's candidates and keeps its first examples.
    """
    F = _F()
    Window = _W()
    srcs = sorted(workloads)
    by_workload = {w: [s for s in srcs if workloads[s] == w] for w in sorted(set(workloads.values()))}
    fr = Frames(ops.filter(F.col("src").isin(srcs)), small)
    try:
        parts: list[DataFrame] = []
        for workload, mine in by_workload.items():
            view = fr.only(mine)
            if workload == "delay":
                nem = (
                    ops.filter((F.col("kind") == "nemesis") & F.col("src").isin(mine))
                    .select("src", "inv_index", "inv_time", "f", "inv_value")
                    .collect()
                )
                events: dict[int, list[tuple[int, int, str, Any]]] = {s: [] for s in mine}
                for r in nem:
                    events[r["src"]].append((r["inv_index"], r["inv_time"], r["f"], r["inv_value"]))
                windows = {s: fault_windows(evs, tolerances.fault_grace_ms) for s, evs in events.items()}
                parts += delay_candidates(spark, view, windows, tolerances)
            elif workload == "txn":
                parts += txn_candidates(view)
            elif workload == "retry":
                parts += retry_candidates(view)
            elif workload == "order":
                parts += order_candidates(view, tolerances)
            else:
                raise ValueError(f"no semantics checker for workload {workload!r}")
        cands = parts[0]
        for p in parts[1:]:
            cands = cands.unionByName(p)
        w = Window.partitionBy("src", "anomaly")
        first = (
            cands.select(
                "*",
                F.count("*").over(w).alias("n"),
                F.row_number().over(w.orderBy("t", "key", "i1", "i2")).alias("rn"),
            )
            .filter(F.col("rn") <= EXAMPLES)
            .select("src", "anomaly", "n", "rn", "ex")
            .collect()
        )
        st = stats(fr, by_workload.get("order", []))
    finally:
        fr.release()
    out: dict[int, dict[str, Any]] = {}
    for src in srcs:
        figures = {
            "entries-read": 0,
            "keys-drained": 0,
            **({"consumers": 0} if workloads[src] == "order" else {}),
        }
        out[src] = {"anomalies": {}, "counts": {}, "stats": {**figures, **st.get(src, {})}}
    found: dict[tuple[int, str], list[tuple[int, str]]] = {}
    for r in first:
        out[r["src"]]["counts"][r["anomaly"]] = r["n"]
        found.setdefault((r["src"], r["anomaly"]), []).append((r["rn"], r["ex"]))
    for (src, anomaly), exs in sorted(found.items()):
        out[src]["anomalies"][anomaly] = [json.loads(ex) for _, ex in sorted(exs)]
    return out
