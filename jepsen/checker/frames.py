"""Histories into Spark: one events DataFrame for all input files, then paired operations.

Every input file gets an integer ``src`` and everything downstream is keyed by it, so
a hundred histories cost one set of Spark jobs rather than a hundred (job overhead,
not data, dominates small histories). JSON Lines is read by Spark's JSON reader with
an explicit schema: ``value`` is a string column, which makes the reader keep the raw
JSON text of lists and objects, so one schema fits every operation's value. The small
Jepsen formats are parsed in Python and handed over as rows. Parquet parts are read with
their typed ``pairs`` column; :func:`read_pairs` is how a check gets a read's pairs from either.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jepsen.checker.parse import NEMESIS, TYPES, Event

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

CORRUPT = "_corrupt"

FIELDS: list[tuple[str, str]] = [
    ("index", "long"),
    ("time", "long"),
    ("process", "string"),
    ("type", "string"),
    ("f", "string"),
    ("key", "string"),
    ("value", "string"),
    ("error", "string"),
    ("node", "string"),
    ("offset", "long"),
]


#: a read's returned pairs, typed: the Parquet parts' ``pairs`` column (``columnar``), null for
#: every other event and for the other formats (their pairs are parsed from ``value``)
PAIRS = "pairs"
PAIRS_TYPE = "array<array<bigint>>"


def _schema(with_src: bool, with_corrupt: bool):  # -> StructType
    from pyspark.sql import types as T

    kinds = {"long": T.LongType(), "string": T.StringType(), "int": T.IntegerType()}
    fields = [T.StructField("src", T.IntegerType(), False)] if with_src else []
    fields += [T.StructField(name, kinds[kind], True) for name, kind in FIELDS]
    if with_corrupt:
        fields.append(T.StructField(CORRUPT, T.StringType(), True))
    return T.StructType(fields)


@dataclass(slots=True)
class Source:
    """One input file: its id in the frames, path and format."""

    src: int
    path: str
    fmt: str
    events: list[Event] | None = None  # already parsed (the Python-read formats)


def load_events(spark: SparkSession, sources: list[Source]) -> DataFrame:
    """All sources as one events DataFrame with a ``problem`` column for bad rows."""
    from pyspark.sql import functions as F

    frames: list[DataFrame] = []
    json_schema = _schema(with_src=False, with_corrupt=True)
    for s in sources:
        if s.events is not None:
            continue
        if s.fmt == "parquet":  # a folder of Parquet shards with the contract's columns
            from pyspark.sql import types as T

            pairs = T.ArrayType(T.ArrayType(T.LongType()))
            plain = _schema(with_src=False, with_corrupt=False).add(PAIRS, pairs, True)
            reader = spark.read.schema(plain)  # parts without the pairs column read it as null
            if Path(s.path).is_dir():  # its parts, nothing else (a part being written is hidden)
                reader = reader.option("pathGlobFilter", "*.parquet")
            df = reader.parquet(s.path).withColumn(CORRUPT, F.lit(None).cast("string"))
        else:
            reader = spark.read.schema(json_schema).option("mode", "PERMISSIVE")
            if Path(s.path).is_dir():  # a folder of shards: every *.jsonl in it, nothing else
                reader = reader.option("pathGlobFilter", "*.jsonl")
            df = reader.option("columnNameOfCorruptRecord", CORRUPT).json(s.path)
            df = df.withColumn(PAIRS, F.lit(None).cast(PAIRS_TYPE))
        frames.append(df.withColumn("src", F.lit(s.src)))
    rows = [ev.as_row(s.src) for s in sources if s.events is not None for ev in s.events]
    if rows:
        py = spark.createDataFrame(rows, _schema(with_src=True, with_corrupt=False))
        frames.append(
            py.withColumn(CORRUPT, F.lit(None).cast("string")).withColumn(PAIRS, F.lit(None).cast(PAIRS_TYPE))
        )
    if not frames:
        raise ValueError("no sources")
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    types = F.array(*[F.lit(t) for t in TYPES])
    problem = (
        F.when(F.col(CORRUPT).isNotNull(), F.lit("not a JSON object with the contract's field types"))
        .when(F.col("index").isNull(), F.lit("missing 'index'"))
        .when(
            ~F.array_contains(types, F.col("type")) | F.col("type").isNull(),
            F.lit("'type' must be invoke, ok, fail or info"),
        )
        .when(F.col("f").isNull(), F.lit("missing 'f'"))
        .when(F.col("process").isNull(), F.lit("missing 'process'"))
    )
    return df.withColumn("problem", problem).drop(CORRUPT)


def pair_ops(events: DataFrame, partitions: int) -> DataFrame:
    """Pair each invoke with its process's next event, the completion (a window, no join).

    One row per operation (``kind`` = ``op``), per nemesis event (``nemesis``) and per
    malformed event (``bad``, with ``problem`` saying why). An invoke with no completion
    is ``info``, as the contract says. An invoke and its completion share the key, so
    the events are shuffled once, by (src, key), and paired within that partitioning;
    the result stays partitioned by (src, key), which every check downstream reuses.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = events.withColumn("key", F.coalesce(F.col("key"), F.lit(""))).repartition(partitions, "src", "key")
    w = Window.partitionBy("src", "key", "process").orderBy("index")
    nxt = {
        c: F.lead(c).over(w)
        for c in ("type", "f", "index", "time", "value", "error", "node", "offset", PAIRS)
    }
    t = F.coalesce(F.col("time"), F.col("index"))
    paired = df.select(
        "src",
        "process",
        "f",
        "key",
        "index",
        "type",
        "value",
        "error",
        "node",
        "problem",
        t.alias("t"),
        F.col("time").isNotNull().alias("timed"),
        nxt["type"].alias("n_type"),
        nxt["f"].alias("n_f"),
        nxt["index"].alias("n_index"),
        F.coalesce(nxt["time"], nxt["index"]).alias("n_t"),
        nxt["value"].alias("n_value"),
        nxt["error"].alias("n_error"),
        nxt["node"].alias("n_node"),
        nxt["offset"].alias("n_offset"),
        nxt[PAIRS].alias("n_pairs"),
        F.lag("type").over(w).alias("p_type"),
    )
    # Rows the reader already rejected sit in their own window partitions (their
    # process is usually null), so they never pair with good rows of a process.
    is_nem = F.col("process") == NEMESIS
    is_inv = (F.col("type") == "invoke") & ~is_nem
    completed = is_inv & F.col("n_type").isNotNull() & (F.col("n_type") != "invoke")
    problem = (
        F.when(F.col("problem").isNotNull(), F.col("problem"))
        .when(is_nem, F.lit(None))
        .when(
            is_inv & (F.col("n_type") == "invoke"),
            F.concat(
                F.lit("process "),
                F.col("process"),
                F.lit(" invokes again (index "),
                F.col("n_index").cast("string"),
                F.lit(") while this operation is outstanding"),
            ),
        )
        .when(
            completed & (F.col("n_f") != F.col("f")),
            F.concat(
                F.lit("completion f '"),
                F.col("n_f"),
                F.lit("' does not match the invoke '"),
                F.col("f"),
                F.lit("'"),
            ),
        )
        .when(
            ~is_inv & (F.col("p_type").isNull() | (F.col("p_type") != "invoke")),
            F.concat(F.col("type"), F.lit(" completion without an invoke by process "), F.col("process")),
        )
    )
    kind = F.when(problem.isNotNull(), F.lit("bad")).when(is_nem, F.lit("nemesis")).otherwise(F.lit("op"))
    return paired.filter(is_inv | is_nem | problem.isNotNull()).select(
        "src",
        kind.alias("kind"),
        "process",
        "f",
        "key",
        F.when(completed, F.col("n_type"))
        .when(~is_inv, F.col("type"))
        .otherwise(F.lit("info"))
        .alias("type"),
        F.col("index").alias("inv_index"),
        F.col("t").alias("inv_time"),
        F.when(completed, F.col("n_index")).alias("cmp_index"),
        F.when(completed, F.col("n_t")).alias("cmp_time"),
        F.col("value").alias("inv_value"),
        F.when(completed, F.col("n_value")).alias("cmp_value"),
        # a read's returned pairs when its history held them typed (else in cmp_value's text)
        F.when(completed, F.col("n_pairs")).alias("cmp_pairs"),
        # a send's offset: the contract's top-level field, or inside an object value
        F.when(
            completed,
            F.coalesce(
                F.col("n_offset"),
                F.when(
                    F.col("n_value").startswith("{"), F.get_json_object("n_value", "$.offset").cast("long")
                ),
            ),
        ).alias("offset"),
        F.when(completed, F.col("n_error")).otherwise(F.col("error")).alias("error"),
        F.coalesce(F.when(completed, F.col("n_node")), F.col("node")).alias("node"),
        problem.alias("problem"),
        "timed",
    )


#: how ``pair_events`` pairs: ``auto`` (in Arrow per shard when every input is a local Parquet
#: history, else the window) or ``window`` (always :func:`pair_ops`; for comparing the two)
PAIRING_ENV = "LEDGERMQ_CHECKER_PAIRING"


def shard_pairable(sources: list[Source]) -> bool:
    """Whether every source is a Parquet history this process can list, read where it lies:
    its shards are then paired in Arrow, one Spark task each (:func:`pair_shards`)."""
    import os

    if os.environ.get(PAIRING_ENV, "auto") == "window" or not sources:
        return False
    for s in sources:
        if s.events is not None or s.fmt != "parquet" or "://" in s.path.removeprefix("file://"):
            return False
        if not Path(s.path.removeprefix("file://")).exists():
            return False
    return True


def pair_shards(spark: SparkSession, sources: list[Source], partitions: int) -> DataFrame:
    """:func:`pair_ops`'s rows for Parquet histories, without its shuffle of every event.

    The contract puts a process's events in one shard, in order, so each shard is paired by
    one Spark task reading its parts in order (``pairing.pair_shard``; a task per shard, the
    shards spread over the executors) and only the operations, half as many rows as events,
    are shuffled, once, into the (src, key) partitioning the checks reuse.
    """
    from jepsen.checker import pairing, shards

    work: list[tuple[int, list[str]]] = []
    for s in sources:
        for group in shards.shard_groups(s.path.removeprefix("file://")):
            work.append((s.src, [str(f) for f in group]))
    batch_rows = pairing.BATCH_ROWS
    pairing.ship_by_value()  # executors without the project installed run it too

    def pair(batches: Any) -> Any:  # in a Python worker of an executor
        for b in batches:
            for i in b.column(0).to_pylist():
                src, files = work[i]
                yield from pairing.pair_shard(src, files, batch_rows)

    tasks = spark.range(0, len(work), 1, numPartitions=max(1, len(work)))
    return tasks.mapInArrow(pair, pairing.ops_ddl()).repartition(partitions, "src", "key")


def pair_events(spark: SparkSession, sources: list[Source], partitions: int) -> DataFrame:
    """The paired operations of ``sources``, partitioned by (src, key): per shard in Arrow
    where every source allows it (:func:`shard_pairable`), else Spark's window over events."""
    if shard_pairable(sources):
        return pair_shards(spark, sources, partitions)
    return pair_ops(load_events(spark, sources), partitions)


def read_pairs() -> Column:
    """An ok read's returned pairs as ``array<array<bigint>>`` (empty when none): the typed
    column when the history held one, else its ``cmp_value`` text parsed (JSON Lines, the
    Python-read formats). ``coalesce`` parses only the rows without the typed column."""
    from pyspark.sql import functions as F

    return F.coalesce(F.col("cmp_pairs"), F.from_json("cmp_value", PAIRS_TYPE), F.array().cast(PAIRS_TYPE))
