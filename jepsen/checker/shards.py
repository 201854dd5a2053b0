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

from jepsen.checker import parse

JSONL_GLOB = "*.jsonl"
PARQUET_GLOB = "*.parquet"
RUN_HISTORY = ("history", "history.jsonl")  # what a run folder holds, in order of preference


def shard_files(path: str | Path) -> list[Path]:
    """The files of a history: the file itself, or a folder's shards in name order."""
    p = Path(path)
    if not p.is_dir():
        return [p]
    return sorted(p.glob(JSONL_GLOB)) or sorted(p.glob(PARQUET_GLOB))


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


def read_events(path: str | Path, fmt: str | None = None) -> list[parse.Event]:
    """:func:`parse.read_events` for any shape: each shard is read and checked on its own
    (errors name the shard and line), then all come back in time order."""
    files = shard_files(path)
    if len(files) == 1 and not Path(path).is_dir():
        return parse.read_events(files[0], fmt)
    events = [ev for f in files for ev in parse.read_events(f, fmt)]
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


def export(path: str | Path, out: IO[str]) -> int:
    """Write the history at ``path`` (any shape, JSON Lines) to ``out`` ordered by time, then index.

    Each shard is already in time order (one clock, appended as it ran), so this is a
    k-way merge. Returns the number of events written.
    """
    src, fmt = resolve(path)
    if fmt != "jsonl":
        raise parse.HistoryError(src, None, f"export reads JSON Lines histories, not {fmt}")
    n = 0
    for _, _, line in heapq.merge(*(_timed_lines(f) for f in shard_files(src))):
        out.write(line)
        n += 1
    return n
