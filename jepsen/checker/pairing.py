"""Pairing a Parquet shard's events into operations in Arrow, a batch at a time, no shuffle.

``frames.pair_ops`` pairs events with a Spark window over (src, key, process) ordered by
index: every event of the history is shuffled and sorted once, with all its columns, a
third of a full-rate history's check. The contract makes that shuffle unnecessary for a
sharded history: *the events of one process lie in one shard, in order*, so one shard's
events can be paired where they are read, in recording order, holding back only each
(process, key)'s last invoke until the next batch brings its completion.

This module is that pairing over Arrow tables (pyarrow and numpy; no Spark), so it runs in
a Spark task per shard (``frames.pair_shards``) and in tests alike. It gives exactly the
rows ``pair_ops`` gives, columns, kinds and problem texts included: each batch is sorted by
(process, key, index) and every event looks at its neighbour in that order, as the window's
``lead`` and ``lag`` do. Memory is one batch (``BATCH_ROWS`` events) plus the invokes held
back, at most one per (process, key).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any

from jepsen.checker import columnar, sparkjson
from jepsen.checker.parse import NEMESIS, TYPES

#: events read and paired at a time: bounds a task's memory whatever a part's size
BATCH_ROWS = 262_144

_INVOKE = 0
_NO_TYPE = -1  # no neighbour in the (process, key) group, or a type outside the contract's
_FIRST = -(1 << 63)  # a missing index sorts first, as Spark's ascending order puts nulls


def ops_schema() -> Any:
    """The Arrow schema of ``frames.pair_ops``'s rows (what a Spark task yields)."""
    import pyarrow as pa

    s, i64 = pa.string(), pa.int64()
    return pa.schema(
        [
            pa.field("src", pa.int32(), False),
            ("kind", s),
            ("process", s),
            ("f", s),
            ("key", s),
            ("type", s),
            ("inv_index", i64),
            ("inv_time", i64),
            ("cmp_index", i64),
            ("cmp_time", i64),
            ("inv_value", s),
            ("cmp_value", s),
            ("cmp_pairs", columnar.pairs_type()),
            ("offset", i64),
            ("error", s),
            ("node", s),
            ("problem", s),
            ("timed", pa.bool_()),
        ]
    )


def ops_ddl() -> str:
    """:func:`ops_schema` as Spark's DDL (what ``mapInArrow`` is told the tasks yield)."""
    kinds = {"int32": "int", "int64": "bigint", "string": "string", "bool": "boolean"}
    cols = [f"{f.name} {kinds.get(str(f.type), 'array<array<bigint>>')}" for f in ops_schema()]
    return ", ".join(cols)


def _conform(batch: Any) -> Any:
    """A part's batch with the contract's columns and ``pairs`` (null when the part predates it)."""
    import pyarrow as pa

    schema = columnar.arrow_schema()
    cols = []
    for field in schema:
        if field.name in batch.schema.names:
            col = batch.column(field.name)
            cols.append(col if col.type == field.type else col.cast(field.type))
        else:
            cols.append(pa.nulls(batch.num_rows, field.type))
    return pa.Table.from_arrays(cols, schema=schema)


def _reader_problems(t: Any) -> list[str | None] | None:
    """``frames.load_events``'s ``problem`` per event (None when no event has one)."""
    import pyarrow.compute as pc

    idx_null = t.column("index").is_null()
    typ = t.column("type")
    type_bad = pc.invert(pc.fill_null(pc.is_in(typ, value_set=_types_array()), False))
    f_null = t.column("f").is_null()
    proc_null = t.column("process").is_null()
    any_bad = pc.or_(pc.or_(idx_null, type_bad), pc.or_(f_null, proc_null))
    if not pc.any(any_bad).as_py():
        return None
    out: list[str | None] = [None] * t.num_rows
    for mask, text in (
        (proc_null, "missing 'process'"),
        (f_null, "missing 'f'"),
        (type_bad, "'type' must be invoke, ok, fail or info"),
        (idx_null, "missing 'index'"),
    ):  # lowest precedence first: the later assignment wins, as the reader's `when` chain
        for i in mask.to_numpy(zero_copy_only=False).nonzero()[0]:
            out[i] = text
    return out


def _types_array() -> Any:
    import pyarrow as pa

    return pa.array(list(TYPES))


def _codes(col: Any) -> Any:
    """Integer codes of a string column (null: -1), equal codes for equal strings."""
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(col)
    if hasattr(enc, "combine_chunks"):
        enc = enc.combine_chunks()
    return enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype("int64")


def pair_table(src: int, t: Any, final: bool) -> tuple[Any, Any]:
    """Pair the events of table ``t`` (the events-schema columns): ``(ops, held)``.

    ``ops`` are ``pair_ops`` rows for every invoke whose completion is in ``t``, every
    nemesis event and every malformed event; ``held`` are the invokes whose (process,
    key) has no later event in ``t`` (the next batch is prepended to them). With
    ``final`` nothing is held: those invokes become ``info`` operations, as the contract
    says of an invoke with no completion.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = t.num_rows
    if n == 0:
        return pa.table({f.name: pa.array([], f.type) for f in ops_schema()}, schema=ops_schema()), t
    key = pc.fill_null(t.column("key"), "")
    proc_codes = _codes(t.column("process"))
    key_codes = _codes(key)
    group = proc_codes * (int(key_codes.max()) + 2) + key_codes
    index = t.column("index").fill_null(_FIRST).to_numpy(zero_copy_only=False)
    order = np.lexsort((index, group))
    g = group[order]
    tcode = pc.index_in(t.column("type"), value_set=_types_array()).fill_null(_NO_TYPE)
    ty = tcode.to_numpy(zero_copy_only=False).astype("int64")[order]
    process = t.column("process")
    is_nem = pc.fill_null(pc.equal(process, NEMESIS), False).to_numpy(zero_copy_only=False)[order]
    # the window's lead is null past the group's last event
    has_next = np.zeros(n, dtype=bool)
    has_next[:-1] = g[1:] == g[:-1]
    same_prev = np.zeros(n, dtype=bool)
    same_prev[1:] = has_next[:-1]
    n_type = np.full(n, _NO_TYPE, dtype="int64")
    n_type[:-1] = ty[1:]
    n_type[~has_next] = _NO_TYPE
    p_type = np.full(n, _NO_TYPE, dtype="int64")
    p_type[1:] = ty[:-1]
    p_type[~same_prev] = _NO_TYPE
    types_null = t.column("type").is_null().to_numpy(zero_copy_only=False)[order]
    n_type_null = np.ones(n, dtype=bool)
    n_type_null[:-1] = types_null[1:]
    n_type_null |= ~has_next
    is_inv = (ty == _INVOKE) & ~is_nem
    held = is_inv & ~has_next if not final else np.zeros(n, dtype=bool)
    # a completion is the group's next event when that is not an invoke (a type outside the
    # contract's still completes, as `n_type != 'invoke'` holds for it; a null type does not)
    completed = is_inv & has_next & ~n_type_null & (n_type != _INVOKE)
    reader = _reader_problems(t)
    sorted_reader = None if reader is None else [reader[i] for i in order]
    inv_again = is_inv & has_next & (n_type == _INVOKE)
    f_codes = _codes(t.column("f"))[order]
    n_f = np.full(n, -1, dtype="int64")
    n_f[:-1] = f_codes[1:]
    f_mismatch = completed & (n_f != f_codes) & (n_f >= 0) & (f_codes >= 0)
    orphan = ~is_inv & ~is_nem & (p_type != _INVOKE) & ~types_null
    flagged = inv_again | f_mismatch | orphan
    if sorted_reader is not None:
        flagged |= np.array([p is not None for p in sorted_reader], dtype=bool)
    emit = (is_inv | is_nem | flagged) & ~held
    pos = np.flatnonzero(emit)
    rows = order[pos]
    nxt_pos = np.minimum(pos + 1, n - 1)
    done = completed[pos]
    nxt = pa.array(order[nxt_pos], mask=~done)  # null where the operation has no completion
    rows_a = pa.array(rows)

    def own(name: str, col: Any = None) -> Any:
        return pc.take(t.column(name) if col is None else col, rows_a)

    def cmp(name: str) -> Any:
        return pc.take(t.column(name), nxt)

    problems = _problems(t, pos, order, inv_again, f_mismatch, orphan, sorted_reader)
    done_a = pa.array(done)
    inv_out = is_inv[pos]
    nem_out = is_nem[pos]
    bad = np.array([p is not None for p in problems], dtype=bool)
    kind = np.where(bad, "bad", np.where(nem_out, "nemesis", "op"))
    own_type = own("type")
    # an invoke with no completion is `info`; so is a row without a type (Spark's `~is_inv` is null)
    info = pa.array(inv_out | types_null[pos])
    out_type = pc.if_else(done_a, cmp("type"), pc.if_else(info, pa.scalar("info"), own_type))
    time_own = own("time")
    index_own = own("index")
    offset = cmp("offset")
    cmp_value = cmp("value")
    offset = _fill_object_offsets(offset, cmp_value, done)
    ops = pa.table(
        {
            "src": pa.array(np.full(len(pos), src, dtype="int32")),
            "kind": pa.array(kind.tolist(), pa.string()),
            "process": own("process"),
            "f": own("f"),
            "key": own("key", key),
            "type": out_type,
            "inv_index": index_own,
            "inv_time": pc.coalesce(time_own, index_own),
            "cmp_index": cmp("index"),
            "cmp_time": pc.coalesce(cmp("time"), cmp("index")),
            "inv_value": own("value"),
            "cmp_value": cmp_value,
            "cmp_pairs": cmp("pairs"),
            "offset": offset,
            "error": pc.if_else(done_a, cmp("error"), own("error")),
            "node": pc.coalesce(cmp("node"), own("node")),
            "problem": pa.array(problems, pa.string()),
            "timed": pc.is_valid(time_own),
        },
        schema=ops_schema(),
    )
    return ops, t.take(pa.array(order[held]))


def _problems(
    t: Any,
    pos: Any,
    order: Any,
    inv_again: Any,
    f_mismatch: Any,
    orphan: Any,
    sorted_reader: list[str | None] | None,
) -> list[str | None]:
    """The ``problem`` text of each emitted row, worded as ``pair_ops`` words it."""
    import numpy as np

    out: list[str | None] = [None] * len(pos)
    flagged = inv_again[pos] | f_mismatch[pos] | orphan[pos]
    if sorted_reader is not None:
        flagged = flagged | np.array([sorted_reader[p] is not None for p in pos], dtype=bool)
    for j in np.flatnonzero(flagged):
        p = int(pos[j])
        if sorted_reader is not None and sorted_reader[p] is not None:
            out[j] = sorted_reader[p]
            continue
        row = int(order[p])
        ev = {c: t.column(c)[row].as_py() for c in ("process", "type", "f")}
        if inv_again[p]:
            n_index = t.column("index")[int(order[p + 1])].as_py()
            out[j] = (
                f"process {ev['process']} invokes again (index {n_index}) while this operation is outstanding"
            )
        elif f_mismatch[p]:
            n_f = t.column("f")[int(order[p + 1])].as_py()
            out[j] = f"completion f '{n_f}' does not match the invoke '{ev['f']}'"
        else:
            out[j] = f"{ev['type']} completion without an invoke by process {ev['process']}"
    return out


def _fill_object_offsets(offset: Any, cmp_value: Any, done: Any) -> Any:
    """The send offset inside an object value where no top-level ``offset`` was recorded."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    want = pc.and_(pc.is_null(offset), pc.fill_null(pc.starts_with(cmp_value, "{"), False))
    want = pc.and_(want, pa.array(done))
    hits = np.flatnonzero(want.to_numpy(zero_copy_only=False))
    if len(hits) == 0:
        return offset
    values = offset.to_pylist()
    for i in hits:
        values[i] = sparkjson.offset_in(cmp_value[int(i)].as_py())
    return pa.array(values, pa.int64())


def iter_batches(files: Iterable[str], batch_rows: int = BATCH_ROWS) -> Iterator[Any]:
    """The events of a shard's parts, in order, as tables of the events schema."""
    import pyarrow.parquet as pq

    for f in files:
        with pq.ParquetFile(f) as pf:
            names = [n for n in columnar.arrow_schema().names if n in pf.schema_arrow.names]
            for batch in pf.iter_batches(batch_size=batch_rows, columns=names):
                yield _conform(batch)


def pair_shard(src: int, files: Iterable[str], batch_rows: int = BATCH_ROWS) -> Iterator[Any]:
    """A shard's operations as record batches, its parts read and paired a batch at a time."""
    import pyarrow as pa

    held = None
    for batch in iter_batches(files, batch_rows):
        t = batch if held is None or held.num_rows == 0 else pa.concat_tables([held, batch])
        ops, held = pair_table(src, t, final=False)
        yield from ops.to_batches()
    if held is not None and held.num_rows:
        ops, _ = pair_table(src, held, final=True)
        yield from ops.to_batches()


def ship_by_value() -> None:
    """Send this module and the two it reads with to the executors inside the pickled task.

    A cluster's Python workers need not have the project installed (a foreign Spark cluster
    usually has only pyspark, pyarrow and numpy): the task function then carries these
    modules' code with it instead of an import the worker cannot do. Idempotent.
    """
    try:
        from pyspark import cloudpickle
    except ImportError:  # pragma: no cover - Spark is the only caller
        return
    for module in (columnar, sparkjson, sys.modules[__name__]):
        try:
            cloudpickle.register_pickle_by_value(module)
        except ValueError:  # already registered
            pass
