"""Linearizability per key on Spark: group by (file, key), search each group in a Python worker.

Keys are independent (P-compositionality), so the groups run in parallel across the
workers. The group function receives Arrow tables rather than pandas frames: it needs
plain rows, and Arrow avoids a pandas dependency on the hot path. The search module is
registered to be pickled by value, so a standalone cluster or Spark Connect server
runs it without having this package installed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from jepsen.checker import linear

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

RESULT_SCHEMA = "src int, key string, valid string, detail string"
COLUMNS = (
    "src",
    "key",
    "model",
    "process",
    "f",
    "type",
    "inv_index",
    "inv_time",
    "cmp_index",
    "cmp_time",
    "inv_value",
    "cmp_value",
    "error",
)


def _group_checker(budget: float):
    """Build the per-group function; a closure so the budget travels with it."""

    def check_group(table: Any) -> Any:
        import pyarrow as pa

        rows = table.to_pylist()
        first = rows[0]
        res = linear.check_rows(rows, first["model"], budget)
        valid = "true" if res.valid is True else "false" if res.valid is False else "unknown"
        return pa.table(
            {
                "src": pa.array([first["src"]], pa.int32()),
                "key": [first["key"]],
                "valid": [valid],
                "detail": [json.dumps(res.to_json())],
            }
        )

    return check_group


def _pandas_adapter(fn: Any) -> Any:
    def run(pdf: Any) -> Any:
        import pyarrow as pa

        return fn(pa.Table.from_pandas(pdf, preserve_index=False)).to_pandas()

    return run


def _ship_by_value() -> None:
    try:
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(linear)
    except (ImportError, AttributeError, ValueError):  # already registered or unsupported
        pass


def check(
    spark: SparkSession, ops: DataFrame, models: dict[int, str], budget: float
) -> dict[int, dict[str, dict[str, Any]]]:
    """Return {src: {key: KeyResult JSON}} for the given sources and their model names."""
    from pyspark.sql import functions as F

    if not models:
        return {}
    _ship_by_value()
    model_map = F.create_map(*[x for src, m in models.items() for x in (F.lit(src), F.lit(m))])
    df = (
        ops.filter((F.col("kind") == "op") & F.col("src").isin(list(models)))
        .withColumn("model", model_map[F.col("src")])
        .select(*COLUMNS)
    )
    # Tiny inputs would otherwise be coalesced into one partition: one worker, one core.
    conf_key = "spark.sql.adaptive.coalescePartitions.enabled"
    before = spark.conf.get(conf_key, "true")
    spark.conf.set(conf_key, "false")
    grouped = df.groupBy("src", "key")
    try:
        if hasattr(grouped, "applyInArrow"):  # Spark >= 4.0
            rows = grouped.applyInArrow(_group_checker(budget), RESULT_SCHEMA).collect()
        else:  # Spark 3.5: the same function behind a pandas adapter
            rows = grouped.applyInPandas(_pandas_adapter(_group_checker(budget)), RESULT_SCHEMA).collect()
    finally:
        spark.conf.set(conf_key, before)
    out: dict[int, dict[str, dict[str, Any]]] = {src: {} for src in models}
    for r in rows:
        detail = json.loads(r["detail"])
        out[r["src"]][r["key"]] = detail
    return out
