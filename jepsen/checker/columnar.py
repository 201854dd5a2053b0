"""Columnar histories: a shard as a series of small Parquet files, each whole once written.

The one module that knows the Parquet shard format, written by the recorder
(``jepsen.history``) and read by the checker (``shards``, ``parse``, ``frames``).

A Parquet file is unreadable until its footer is written, so one file per shard would lose
the whole shard when a recorder is killed. This sink instead closes a *part* every
``ROLL_EVERY_S`` seconds (or ``ROLL_EVENTS`` events, whichever comes first): it is written
under a hidden temporary name (Spark and our readers skip names starting with ``.``),
fsynced and renamed into place, so every ``*.parquet`` file in a history folder is whole,
and a crash loses at most the events of the part being filled.

Shard ``shard-01`` of a run is the parts ``shard-01.000001.parquet``, ``shard-01.000002.parquet``
... in one folder, read in name order; the part numbers are zero-padded so that name order is
recording order. Columns are the contract's (``jepsen.checker.frames.FIELDS``), ``value`` as
the text Spark's JSON reader gives a string column (a JSON string value bare, anything else
as JSON), so a history reads the same whichever format held it.

One column more than the contract's: ``pairs``, a typed ``list<list<int64>>``. A read's
returned pairs (an ok ``poll`` or ``drain`` whose value is a list of integer lists: the log
workload's ``[offset, value]`` pairs) are stored there instead of as JSON text in ``value``
(then null), so Spark reads them as an array without parsing JSON, and the parts are smaller
(a 2M-operation synthetic history: 47 MB against 51 MB). Every reader here gives such an event
its ``value`` text back (``iter_rows``); parts written before the column existed have no
``pairs`` and read as before.

Recording appends one tuple per event; the columns are built when a part is written, on a
writer thread, so the recording path costs less than formatting a JSON line.
"""

from __future__ import annotations

import json
import os
import threading
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: the longest a part stays open: what a killed recorder can lose
ROLL_EVERY_S = 2.0
#: events per part at most (bounds the recorder's buffered rows, whatever the rate)
ROLL_EVENTS = 200_000
#: Parquet compression of the parts and its level: zstd's fastest level wrote 200k queue events
#: in 0.05 s (the default level: 0.12-0.25 s) into the smallest files measured (12 bytes/op)
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 1
#: columns with few distinct values, dictionary-encoded (the others, mostly unique numbers and
#: value texts, cost more to encode than a dictionary saves)
DICTIONARY_COLUMNS = ["process", "type", "f", "key", "error", "node"]
PART_SUFFIX = ".parquet"

COLUMNS: tuple[tuple[str, str], ...] = (
    ("index", "int64"),
    ("time", "int64"),
    ("process", "string"),
    ("type", "string"),
    ("f", "string"),
    ("key", "string"),
    ("value", "string"),
    ("error", "string"),
    ("node", "string"),
    ("offset", "int64"),
)


#: the typed column of a read's returned pairs (see the module's docstring)
PAIRS_COLUMN = "pairs"
#: the operations whose ok value goes to ``PAIRS_COLUMN`` when it has the shape
READ_FS = frozenset({"poll", "drain"})
_INT64 = (-(1 << 63), (1 << 63) - 1)


def contract_schema() -> Any:
    """The contract's columns as an Arrow schema (what every part must have)."""
    import pyarrow as pa

    kinds = {"int64": pa.int64(), "string": pa.string()}
    return pa.schema([pa.field(name, kinds[kind]) for name, kind in COLUMNS])


def pairs_type() -> Any:
    import pyarrow as pa

    return pa.list_(pa.list_(pa.int64()))


def arrow_schema() -> Any:
    """The parts' schema as written: the contract's columns and ``pairs`` (pyarrow imported
    only by recorders that write Parquet)."""
    import pyarrow as pa

    return contract_schema().append(pa.field(PAIRS_COLUMN, pairs_type()))


def typed_pairs(f: str, typ: str, value: Any) -> list[Any] | None:
    """``value`` when it goes to the ``pairs`` column: an ok read's list of lists of integers
    that fit int64 (anything else, or any other operation, keeps its JSON text)."""
    if typ != "ok" or f not in READ_FS or type(value) not in (list, tuple):  # noqa: E721 - exact types
        return None
    lo, hi = _INT64
    for item in value:
        if type(item) not in (list, tuple):  # noqa: E721
            return None
        for x in item:
            if type(x) is not int or x < lo or x > hi:  # noqa: E721 - bool is not an offset
                return None
    return value if type(value) is list else list(value)  # noqa: E721


def pairs_text(pairs: list[Any]) -> str:
    """A ``pairs`` cell as the ``value`` text it replaces (compact JSON, as recorded)."""
    return _compact(pairs)


_compact = json.JSONEncoder(separators=(",", ":")).encode


def part_path(stem: Path, seq: int) -> Path:
    """Part ``seq`` of the shard whose name (without suffix) is ``stem``."""
    return stem.parent / f"{stem.name}.{seq:06d}{PART_SUFFIX}"


class ParquetParts:
    """Buffers event rows and writes them as numbered Parquet parts on a writer thread.

    ``add`` is called under the recorder's lock; ``roll`` hands the buffered rows to the
    writer thread and returns at once. At most two parts' rows are in memory: the one
    being filled and the one being written (``roll`` waits for the previous write).
    """

    def __init__(self, stem: Path) -> None:
        import pyarrow  # noqa: F401 - fail at the start of a run, not at its first roll

        self.stem = stem
        self.rows: list[tuple[Any, ...]] = []
        # Pairs given to add_pairs, flattened: each pair's length, and all their integers. A
        # row then holds only its number of pairs, so it keeps no list alive: a part's rows
        # holding the clients' lists of pairs made Python's collector run thousands of times a
        # part and took 8 us of CPU per operation in a recorder (26 -> 18 us with it off).
        self.pair_lens = array("q")
        self.flat = array("q")
        # whether a row of this part holds a count: a part whose reads all came back empty has
        # counts (0) but no pair at all, and must still be written as counted rows
        self.counted = False
        self.parts = 0
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None

    def add_pairs(self, value: Any) -> int | None:
        """A read's returned pairs into this part's flat buffers: what a row's ``pairs`` slot
        then holds (their number), or None when ``value`` is not a list of lists of int64
        integers (as :func:`typed_pairs`; nothing is kept then, and the value stays text).

        A part's rows must all hold counts or all hold lists (``shards.to_parquet``)."""
        if type(value) not in (list, tuple):  # noqa: E721 - exact types
            return None
        lens, flat = self.pair_lens, self.flat
        n_lens, n_flat = len(lens), len(flat)
        lo, hi = _INT64
        for item in value:
            if type(item) not in (list, tuple):  # noqa: E721
                break
            for x in item:
                if type(x) is not int or x < lo or x > hi:  # noqa: E721 - bool is not an offset
                    break
            else:
                lens.append(len(item))
                flat.extend(item)
                continue
            break
        else:
            self.counted = True
            return len(value)
        del lens[n_lens:]
        del flat[n_flat:]
        return None

    def roll(self) -> None:
        """Close the current part (nothing happens when no event was added)."""
        if not self.rows:
            return
        rows, self.rows = self.rows, []
        flat = (self.pair_lens, self.flat) if self.counted else None
        self.pair_lens, self.flat = array("q"), array("q")
        self.counted = False
        self.parts += 1
        self._join()
        self._writer = threading.Thread(
            target=self._write,
            args=(rows, part_path(self.stem, self.parts), flat),
            name="history-parquet",
            daemon=True,
        )
        self._writer.start()

    def close(self) -> None:
        """Write what is buffered and wait for it: every part is on disk afterwards."""
        self.roll()
        self._join()

    def _join(self) -> None:
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._error is not None:
            err, self._error = self._error, None
            raise OSError(f"writing a history part under {self.stem.parent} failed: {err}") from err

    def _write(
        self, rows: list[tuple[Any, ...]], path: Path, flat: tuple[array, array] | None = None
    ) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            # the row tuples straight into one struct array (one conversion in C++; transposing
            # them into column lists first took 2-6 times as long)
            if flat is None:  # rows hold their pairs as lists
                struct = pa.array(rows, type=pa.struct(list(arrow_schema())))
                batch = pa.RecordBatch.from_struct_array(struct)
            else:  # rows hold their number of pairs (add_pairs)
                batch = _with_flat_pairs(rows, *flat)
            table = pa.Table.from_batches([batch])
            tmp = path.parent / f".{path.name}.tmp"
            with open(tmp, "wb") as fh:
                pq.write_table(
                    table,
                    fh,
                    compression=COMPRESSION,
                    compression_level=COMPRESSION_LEVEL,
                    use_dictionary=DICTIONARY_COLUMNS,
                )
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException as exc:  # noqa: BLE001 - reported by the next roll or close
            self._error = exc


def _with_flat_pairs(rows: list[tuple[Any, ...]], lens: array, flat: array) -> Any:
    """A part's batch from rows whose ``pairs`` slot holds a count, and the flat buffers
    (``ParquetParts.add_pairs``): the lists are built from offsets, no Python object each."""
    import pyarrow as pa
    import pyarrow.compute as pc

    counted = pa.struct([*contract_schema(), pa.field(PAIRS_COLUMN, pa.int64())])
    batch = pa.RecordBatch.from_struct_array(pa.array(rows, type=counted))
    counts = batch.column(PAIRS_COLUMN)

    def offsets(sizes: Any) -> Any:
        return pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(sizes).cast(pa.int32())])

    values = pa.Array.from_buffers(pa.int64(), len(flat), [None, pa.py_buffer(flat)])
    inner = pa.ListArray.from_arrays(
        offsets(pa.Array.from_buffers(pa.int64(), len(lens), [None, pa.py_buffer(lens)])), values
    )
    outer = pa.ListArray.from_arrays(offsets(counts.fill_null(0)), inner, mask=counts.is_null())
    return pa.RecordBatch.from_arrays([*batch.columns[:-1], outer], schema=arrow_schema())


def shard_name(path: Path) -> str:
    """The shard a part belongs to: its name up to the first dot (``shard-01``)."""
    return path.name.split(".", 1)[0]


def decode_value(text: str | None) -> Any:
    """A part's ``value`` text as the JSON value it was recorded from (a string that is
    not JSON is the string itself, as the recorder stored it)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


#: the fields the contract's rules are checked on (``jepsen.history.validate_history``)
STRUCTURE_FIELDS = ("index", "time", "process", "type", "f", "key")


def iter_part_events(path: Path, fields: tuple[str, ...] | None = None) -> Iterator[dict[str, Any]]:
    """A part's events as the dicts a JSON Lines line decodes to (absent fields left out);
    only ``fields`` when given (``STRUCTURE_FIELDS``: no value is read or decoded, which was
    most of the time validating a full-rate run's shards)."""
    for _, row in iter_rows(path, columns=fields):
        ev: dict[str, Any] = {}
        for name, v in row.items():
            if v is None and name not in ("index", "time", "process", "type", "f", "value"):
                continue
            if name == "process" and isinstance(v, str) and v.isdigit():
                v = int(v)
            elif name == "value":
                v = decode_value(v)
            ev[name] = v
        yield ev


#: a JSON Lines event is about this many bytes: what a Parquet history's events weigh when
#: sizes decide the engine and the partitions (both were measured on JSON Lines bytes)
JSONL_BYTES_PER_EVENT = 140


def is_part(path: Path) -> bool:
    return path.suffix == PART_SUFFIX


def rows(path: Path) -> int:
    """Events in a Parquet file (from its footer)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def open_problem(path: Path) -> str | None:
    """Why ``path`` is not a readable Parquet file of the contract's columns (None: it is)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        return f"not a readable Parquet file ({exc})"
    want = contract_schema()
    if PAIRS_COLUMN in schema.names and schema.field(PAIRS_COLUMN).type != pairs_type():
        return f"Parquet column {PAIRS_COLUMN} of the wrong type: {schema.field(PAIRS_COLUMN).type}"
    missing = [f.name for f in want if f.name not in schema.names]
    if missing:
        return f"Parquet file without the contract's column(s) {', '.join(missing)}"
    wrong = [
        f"{f.name} ({schema.field(f.name).type}, not {f.type})"
        for f in want
        if schema.field(f.name).type != f.type
    ]
    if wrong:
        return f"Parquet columns of the wrong type: {', '.join(wrong)}"
    return None


def iter_rows(
    path: Path, batch_rows: int = 65_536, columns: tuple[str, ...] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number from 1, the row's columns, or only ``columns``) of a Parquet part, a batch
    at a time. A read whose pairs the ``pairs`` column holds gets them back as its ``value``
    text, so a row reads the same as before the column existed.

    Raises ``ValueError`` with the reason for a file that is not a part of the contract's shape.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    problem = open_problem(path)
    if problem is not None:
        raise ValueError(problem)
    names = list(columns) if columns is not None else [name for name, _ in COLUMNS]
    n = 0
    try:
        with pq.ParquetFile(path) as pf:
            typed = "value" in names and PAIRS_COLUMN in pf.schema_arrow.names
            for batch in pf.iter_batches(
                batch_size=batch_rows, columns=[*names, PAIRS_COLUMN] if typed else names
            ):
                for row in batch.to_pylist():
                    n += 1
                    if typed:
                        pairs = row.pop(PAIRS_COLUMN)
                        if pairs is not None and row["value"] is None:
                            row["value"] = pairs_text(pairs)
                    yield n, row
    except pa.ArrowException as exc:
        raise ValueError(f"unreadable Parquet data after row {n} ({exc})") from None
