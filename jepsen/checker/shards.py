"""Where a history's events live: one file, a folder of shards, or a run folder holding either.

``docs/history.md``: a history is ``history.jsonl`` or a ``history/`` folder of shards
(``*.jsonl`` or ``*.parquet``), each written by one recording process. ``jepsen analyze``
accepts any of the three shapes (:func:`resolve`); Spark reads a folder of shards as one
input, in parallel. ``jepsen history export`` merges the shards back into one file
ordered by time (:func:`export`), streaming: memory holds one line per shard.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from jepsen.checker import columnar, parse

JSONL_GLOB = "*.jsonl"
PARQUET_GLOB = "*.parquet"
RUN_HISTORY = ("history", "history.jsonl")  # what a run folder holds, in order of preference
#: a part its recorder was still writing when it stopped (``columnar.ParquetParts`` writes
#: ``.<part>.tmp`` and renames it into place once whole): never read, only reported
HALF_WRITTEN_GLOB = ".*" + columnar.PART_SUFFIX + ".tmp"
#: bytes read from the end of a JSON Lines shard to see whether its last line is whole
TAIL_BYTES = 1


def shard_files(path: str | Path) -> list[Path]:
    """The files of a history: the file itself, or a folder's shards in name order."""
    p = Path(path)
    if not p.is_dir():
        return [p]
    return sorted(p.glob(JSONL_GLOB)) or sorted(p.glob(PARQUET_GLOB))


def history_root(path: str | Path) -> Path:
    """The history a path names: a run folder's ``history/`` (else its ``history.jsonl``),
    anything else as given."""
    p = Path(path)
    if p.is_dir():
        for name in RUN_HISTORY:
            if (p / name).exists():
                return p / name
    return p


def crash_notes(path: str | Path) -> list[str]:
    """What a recorder that was killed left behind, one note each, for readers to print:
    half-written Parquet parts (skipped by every reader: only whole parts are read) and JSON
    Lines shards that end in a partial line.

    A part is renamed into place only once it is whole (``columnar``), so a kill loses at most
    the part being filled; these notes say where that happened instead of staying silent."""
    root = history_root(path)
    folder = root if root.is_dir() else root.parent
    notes = [
        f"{f}: half-written history part skipped (its recorder stopped while writing it; the "
        f"events of that part are lost, every whole part is read)"
        for f in sorted(folder.glob(HALF_WRITTEN_GLOB))
    ]
    files = shard_files(root) if root.is_dir() else [root] if root.suffix == ".jsonl" else []
    for f in files:
        if f.suffix == ".jsonl" and not _ends_whole(f):
            notes.append(f"{f}: ends in a partial line (its recorder stopped while writing it)")
    return notes


def _ends_whole(f: Path) -> bool:
    """Whether ``f`` is empty or ends with a newline."""
    try:
        with open(f, "rb") as fh:
            fh.seek(0, 2)
            if fh.tell() == 0:
                return True
            fh.seek(-TAIL_BYTES, 2)
            return fh.read(TAIL_BYTES) == b"\n"
    except OSError:
        return True  # unreadable: the reader says so


def resolve(path: str | Path) -> tuple[str, str]:
    """``(path of the history, format)`` for a history file, a shard folder or a run folder.

    Formats: ``jsonl`` (a file or a folder of JSON Lines shards), ``parquet`` (a folder of
    Parquet shards), or what :func:`parse.detect_format` finds in a single file.
    """
    p = Path(path)
    if not p.is_dir():
        return str(p), parse.detect_format(p)
    for name in RUN_HISTORY:
        if (p / name).exists():
            return resolve(p / name)
    if any(p.glob(JSONL_GLOB)):
        return str(p), "jsonl"
    if any(p.glob(PARQUET_GLOB)):
        return str(p), "parquet"
    raise parse.HistoryError(
        p, None, "a folder without history shards (*.jsonl or *.parquet), history/ or history.jsonl"
    )


def size_bytes(path: str | Path) -> int:
    """Bytes on disk of a history file or of all its shards."""
    total = 0
    for f in shard_files(path):
        try:
            total += f.stat().st_size
        except OSError:
            pass
    return total


def weight_bytes(path: str | Path) -> int:
    """What the history would weigh as JSON Lines: its size, or for Parquet its events times
    ``columnar.JSONL_BYTES_PER_EVENT`` (engine choice and partition counts were measured in
    JSON Lines bytes; a Parquet history is 5-10 times smaller for the same work)."""
    files = shard_files(path)
    if not files or not columnar.is_part(files[0]):
        return size_bytes(path)
    total = 0
    for f in files:
        try:
            total += columnar.rows(f) * columnar.JSONL_BYTES_PER_EVENT
        except Exception:  # noqa: BLE001 - an unreadable part is reported by the reader
            total += f.stat().st_size
    return total


def shard_groups(path: str | Path) -> list[list[Path]]:
    """The shards of a history, each as its files in order (a Parquet shard is its parts)."""
    groups: dict[str, list[Path]] = {}
    for f in shard_files(path):
        groups.setdefault(columnar.shard_name(f) if columnar.is_part(f) else f.name, []).append(f)
    return list(groups.values())


def read_events(path: str | Path, fmt: str | None = None) -> list[parse.Event]:
    """:func:`parse.read_events` for any shape: each shard is read and checked on its own
    (errors name the shard and line; a Parquet shard's parts are read as one), then all come
    back in time order."""
    files = shard_files(path)
    if len(files) == 1 and not Path(path).is_dir():
        return parse.read_events(files[0], fmt)
    events: list[parse.Event] = []
    for group in shard_groups(path):
        shard = [ev for f in group for ev in parse.read_events(f, fmt, check=len(group) == 1)]
        if len(group) > 1:
            if not shard:
                raise parse.HistoryError(group[0], None, "no operations found")
            parse.check_structure(shard, group[0].parent / columnar.shard_name(group[0]))
        events += shard
    events.sort(key=lambda e: (e.time if e.time is not None else e.index, e.index))
    return events


def _timed_lines(path: Path) -> Iterator[tuple[int, int, str]]:
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
                t, i = ev.get("time"), ev.get("index")
            except (ValueError, AttributeError):
                raise parse.HistoryError(path, lineno, "not a JSON object") from None
            if not isinstance(t, int) or not isinstance(i, int):
                raise parse.HistoryError(
                    path, lineno, "export needs integer 'time' and 'index' on every event"
                )
            yield t, i, line if line.endswith("\n") else line + "\n"


def _timed_part_lines(files: list[Path]) -> Iterator[tuple[int, int, str]]:
    """A Parquet shard's events as JSON lines, in its parts' order."""
    for f in files:
        try:
            for ev in columnar.iter_part_events(f):
                t, i = ev.get("time"), ev.get("index")
                if not isinstance(t, int) or not isinstance(i, int):
                    raise parse.HistoryError(
                        f, None, "export needs integer 'time' and 'index' on every event"
                    )
                yield t, i, json.dumps(ev, separators=(",", ":")) + "\n"
        except ValueError as exc:
            raise parse.HistoryError(f, None, str(exc)) from None


def export(path: str | Path, out: IO[str]) -> int:
    """Write the history at ``path`` (any shape, JSON Lines or Parquet) to ``out`` as JSON
    Lines ordered by time, then index.

    Each shard is already in time order (one clock, appended as it ran), so this is a
    k-way merge; memory holds a line per JSON Lines shard and a batch per Parquet shard.
    Returns the number of events written.
    """
    src, fmt = resolve(path)
    if fmt == "parquet":
        streams = [_timed_part_lines(g) for g in shard_groups(src)]
    elif fmt == "jsonl":
        streams = [_timed_lines(f) for f in shard_files(src)]
    else:
        raise parse.HistoryError(src, None, f"export reads JSON Lines or Parquet histories, not {fmt}")
    n = 0
    for _, _, line in heapq.merge(*streams):
        out.write(line)
        n += 1
    return n


def _typed_pairs(ev: parse.Event) -> list | None:
    """A JSON Lines read's returned pairs for the ``pairs`` column (None: its value stays text)."""
    text = ev.value
    if ev.f not in columnar.READ_FS or ev.type != "ok" or not text or not text.startswith("["):
        return None
    try:
        return columnar.typed_pairs(ev.f, ev.type, json.loads(text))
    except ValueError:  # a string value that merely starts with "["
        return None


def to_parquet(path: str | Path, folder: str | Path) -> int:
    """Write the JSON Lines history at ``path`` (a file or a folder of shards) as Parquet parts
    in ``folder``, one shard per input file (``shard-00.jsonl`` -> ``shard-00.000001.parquet``,
    ...), each line checked as the in-process reader checks it. Streams: memory holds one
    part's rows. Returns the number of events written."""
    src, fmt = resolve(path)
    if fmt != "jsonl":
        raise parse.HistoryError(src, None, f"only JSON Lines histories are converted, not {fmt}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in shard_files(src):
        parts = columnar.ParquetParts(out / f.name.split(".", 1)[0])
        with open(f, encoding="utf-8") as fh:
            for lineno, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    ev = parse.parse_json_line(raw)
                except ValueError as exc:
                    raise parse.HistoryError(f, lineno, str(exc)) from None
                value, pairs = ev.value, _typed_pairs(ev)
                if pairs is not None:
                    value = None
                parts.rows.append(
                    (
                        ev.index,
                        ev.time,
                        ev.process,
                        ev.type,
                        ev.f,
                        ev.key,
                        value,
                        ev.error,
                        ev.node,
                        ev.offset,
                        pairs,
                    )
                )
                n += 1
                if len(parts.rows) >= columnar.ROLL_EVENTS:
                    parts.roll()
        parts.close()
    return n
