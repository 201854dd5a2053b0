"""The history recorder: one shard (JSON Lines or Parquet parts) following ``docs/history.md`` exactly.

Every event gets its ``index`` and ``time`` under one lock, from the machine's monotonic
clock measured from one origin (``clock_origin_ns``, shared by every recording process of
a run), so within a shard file order, index order and time order agree even when the
nemesis (possibly from a worker thread) and many client tasks record at once. Several
processes record one history by each writing its own shard: shard ``s`` of ``n`` hands out
indexes and process ids ``s, s + n, s + 2n, ...``, unique across shards by construction.

The recorder also enforces the contract's process rules at the source (one outstanding
operation per process, a process id is never used again after an ``info``) because a
history that breaks them would make the checker judge the recorder instead of the system.
It remembers only live processes, so its memory is bounded by the number of clients.

Lines are encoded by hand for the fields the harness writes (a profile of a full-rate run
showed ``json.dumps`` of a dict per event as a large share of the recorder's time) and
written through a bounded buffer that is flushed at least every ``FLUSH_EVERY_S``, so a
crashed run still leaves a readable history missing at most that last moment.

A recorder whose path ends in ``.parquet`` writes Parquet parts instead
(``jepsen.checker.columnar``: a part closed, fsynced and renamed into place every
``ROLL_EVERY_S``, so a killed recorder loses at most that part; 5-10x smaller than JSON Lines
and read by Spark without parsing JSON). Parquet is a run's default (``jepsen run
--history-format``, else ``$LEDGERMQ_HISTORY_FORMAT``: :func:`history_format`); JSON Lines is
one option away, and ``jepsen history export`` writes any history as JSON Lines for jq.

:func:`read_events` is the one reader of a recorded history for tools and tests: a run
folder, a folder of shards or a file, either format, in time order, skipping (with a note)
what a killed recorder left half-written.
"""

from __future__ import annotations

import heapq
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from jepsen.checker.columnar import (
    JSONL_BYTES_PER_EVENT,
    PART_SUFFIX,
    READ_FS,
    ROLL_EVENTS,
    ROLL_EVERY_S,
    STRUCTURE_FIELDS,
    ParquetParts,
    iter_part_events,
    rows,
    shard_name,
)
from jepsen.checker.shards import crash_notes, history_root

#: environment setting: a run's history format when ``jepsen run --history-format`` is not
#: given, ``parquet`` or ``jsonl``
FORMAT_ENV = "LEDGERMQ_HISTORY_FORMAT"
SHARD_SUFFIXES = {"jsonl": ".jsonl", "parquet": PART_SUFFIX}
#: a run's history format unless told otherwise: Parquet parts (``jepsen.checker.columnar``),
#: about 15 bytes an operation on disk against JSON Lines' 277, readable after a crash up to
#: the last part closed (at most ``ROLL_EVERY_S`` lost), and recorded at a higher rate
DEFAULT_FORMAT = "parquet"

NEMESIS = "nemesis"
COMPLETIONS = ("ok", "fail", "info")
FLUSH_EVERY_S = 0.2  # the most a crashed recorder can lose
BUFFER_BYTES = 1 << 20  # written out as soon as this much is buffered, whatever the time
#: a Parquet recorder closes its part once its rows hold this many read pairs, whatever the
#: time: a final drain's pages (docs/history.md, "Drain pages") come faster than ROLL_EVERY_S
#: rolls, and the part's rows keep them in memory until it is written
ROLL_PAIRS = 1 << 20
_STR_CACHE_MAX = 4096  # encoded f / key / node strings kept (bounded: the cache stops growing)

_dumps = json.JSONEncoder(separators=(",", ":")).encode


class HistoryMisuse(RuntimeError):
    """The caller broke a pairing rule (a harness bug, never a system-under-test finding)."""


class History:
    """Thread-safe recorder of client and nemesis events into the shard file ``path``."""

    def __init__(
        self,
        path: str | Path,
        clock_origin_ns: int | None = None,
        *,
        shard: int = 0,
        shards: int = 1,
        flush_every_s: float = FLUSH_EVERY_S,
    ) -> None:
        if not 0 <= shard < shards:
            raise ValueError(f"shard {shard} is not one of 0..{shards - 1}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.shard = shard
        self.shards = shards
        self._parts: ParquetParts | None = None
        if self.path.suffix == PART_SUFFIX:  # parts <stem>.000001.parquet, ... (history_parquet)
            self._parts = ParquetParts(self.path.with_suffix(""))
            self._fh: Any = self._parts
            flush_every_s = ROLL_EVERY_S
        else:
            self._fh = open(self.path, "w", encoding="utf-8", buffering=BUFFER_BYTES)  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self._t0 = time.monotonic_ns() if clock_origin_ns is None else clock_origin_ns
        self._flush_every_ns = int(flush_every_s * 1e9)
        self._last_flush = time.monotonic_ns()
        self._n = 0  # events written; index = n * shards + shard
        self._part_pairs = 0  # read pairs in the rows of the Parquet part being filled
        self._next_process = shard
        self._live: set[int] = set()  # allocated and not retired by an info
        self._pending: dict[int, tuple[str, str | None]] = {}
        self._nemesis_open: str | None = None
        self._str: dict[str, str] = {}
        self.counts: Counter[str] = Counter()  # "ok"/"fail"/"info" over client completions
        self.counts_by_f: Counter[tuple[str, str]] = Counter()
        self.nemesis_events = 0

    # ------------------------------------------------------------------ clock and processes

    @property
    def clock_origin_ns(self) -> int:
        """The monotonic-clock reading that is time 0 of this history (shared by all its shards)."""
        return self._t0

    def now_ns(self) -> int:
        """Nanoseconds since the test started, on the history's clock."""
        return time.monotonic_ns() - self._t0

    def new_process(self) -> int:
        """A process id never handed out before by any shard (ids are not recycled, even after ``fail``)."""
        with self._lock:
            p = self._next_process
            self._next_process += self.shards
            self._live.add(p)
            return p

    def outstanding(self) -> dict[int, str]:
        """Processes with an invoke but no completion yet, and their ``f``."""
        with self._lock:
            return {p: v[0] for p, v in self._pending.items()}

    # ------------------------------------------------------------------ client events

    def invoke(
        self, process: int, f: str, value: Any = None, *, key: str | None = None, node: str | None = None
    ) -> None:
        with self._lock:
            if process not in self._live:
                if process % self.shards == self.shard and process < self._next_process:
                    raise HistoryMisuse(f"process {process} completed with info and may not be reused")
                raise HistoryMisuse(f"process {process} was not allocated with new_process()")
            pend = self._pending.get(process)
            if pend is not None:
                raise HistoryMisuse(f"process {process} already has {pend[0]!r} outstanding")
            self._pending[process] = (f, key)
            self._write_locked(process, "invoke", f, value, key, None, node, None)

    def complete(
        self,
        process: int,
        type: str,
        f: str,
        value: Any = None,
        *,
        key: str | None = None,
        error: str | None = None,
        node: str | None = None,
        offset: int | None = None,
    ) -> None:
        """Record the completion of ``process``'s outstanding operation (ok, fail or info)."""
        if type not in COMPLETIONS:
            raise HistoryMisuse(f"completion type must be one of {COMPLETIONS}, got {type!r}")
        with self._lock:
            pend = self._pending.pop(process, None)
            if pend is None:
                raise HistoryMisuse(f"process {process} completes {f!r} without an outstanding invoke")
            if pend[0] != f or pend[1] != key:
                self._pending[process] = pend
                raise HistoryMisuse(
                    f"process {process} completes {f!r}/{key!r} but invoked {pend[0]!r}/{pend[1]!r}"
                )
            if type == "info":
                self._live.discard(process)
            self.counts[type] += 1
            self.counts_by_f[(f, type)] += 1
            self._write_locked(process, type, f, value, key, error, node, offset)

    # ------------------------------------------------------------------ nemesis events

    def nemesis_start(self, f: str, value: Any = None) -> None:
        """The start event of a fault operation (type ``info``, process ``nemesis``)."""
        with self._lock:
            if self._nemesis_open is not None:
                raise HistoryMisuse(f"nemesis starts {f!r} while {self._nemesis_open!r} is still open")
            self._nemesis_open = f
            self.nemesis_events += 1
            self._write_locked(NEMESIS, "info", f, value, None, None, None, None)
            self._flush_locked()  # faults are rare and matter: on disk at once

    def nemesis_end(self, f: str, value: Any = None, *, error: str | None = None) -> None:
        """The end event matching the last ``nemesis_start`` (same ``f``)."""
        with self._lock:
            if self._nemesis_open != f:
                raise HistoryMisuse(f"nemesis ends {f!r} but {self._nemesis_open!r} is open")
            self._nemesis_open = None
            self.nemesis_events += 1
            self._write_locked(NEMESIS, "info", f, value, None, error, None, None)
            self._flush_locked()

    # ------------------------------------------------------------------ output

    def _s(self, text: str) -> str:
        """``text`` as a JSON string, cached: f, key and node repeat on every line."""
        enc = self._str.get(text)
        if enc is None:
            enc = _dumps(text)
            if len(self._str) < _STR_CACHE_MAX:
                self._str[text] = enc
        return enc

    def _write_locked(
        self,
        process: int | str,
        typ: str,
        f: str,
        value: Any,
        key: str | None,
        error: str | None,
        node: str | None,
        offset: int | None,
    ) -> None:
        fh = self._fh
        if fh is None:
            raise HistoryMisuse("history is closed")
        now = time.monotonic_ns()
        if self._parts is not None:
            self._add_row_locked(now, process, typ, f, value, key, error, node, offset)
            return
        proc = '"nemesis"' if process == NEMESIS else str(process)
        if value is None:
            val = "null"
        elif type(value) is int:  # noqa: E721 - exact type: bool is an int subclass and encodes differently
            val = str(value)
        else:
            val = _dumps(value)
        parts = [
            f'{{"index":{self._n * self.shards + self.shard},"time":{now - self._t0},"process":{proc},'
            f'"type":"{typ}","f":{self._s(f)}'
        ]
        if key is not None:
            parts.append(f',"key":{self._s(key)}')
        parts.append(f',"value":{val}')
        if offset is not None:
            parts.append(f',"offset":{int(offset)}')
        if error is not None:
            parts.append(f',"error":{_dumps(error)}')
        if node is not None:
            parts.append(f',"node":{self._s(node)}')
        parts.append("}\n")
        fh.write("".join(parts))
        self._n += 1
        if now - self._last_flush >= self._flush_every_ns:
            self._flush_locked(now)

    def _add_row_locked(
        self,
        now: int,
        process: int | str,
        typ: str,
        f: str,
        value: Any,
        key: str | None,
        error: str | None,
        node: str | None,
        offset: int | None,
    ) -> None:
        """One event as a row of the current Parquet part (``value`` as Spark's JSON reader
        gives a string column: a string bare, anything else as JSON text; a read's returned
        pairs in the typed ``pairs`` column instead, flattened by ``ParquetParts.add_pairs``)."""
        parts = self._parts
        assert parts is not None
        pairs = parts.add_pairs(value) if typ == "ok" and f in READ_FS else None
        if pairs is not None:
            val = None
        elif value is None or type(value) is str:  # noqa: E721 - exact types, as in _write_locked
            val = value
        elif type(value) is int:  # noqa: E721
            val = str(value)
        else:
            val = _dumps(value)
        parts.rows.append(
            (
                self._n * self.shards + self.shard,
                now - self._t0,
                NEMESIS if process == NEMESIS else str(process),
                typ,
                f,
                key,
                val,
                error,
                node,
                None if offset is None else int(offset),
                pairs,
            )
        )
        self._n += 1
        if pairs is not None:
            self._part_pairs += pairs
        if (
            len(parts.rows) >= ROLL_EVENTS
            or self._part_pairs >= ROLL_PAIRS
            or now - self._last_flush >= self._flush_every_ns
        ):
            self._flush_locked(now)

    def _flush_locked(self, now: int | None = None) -> None:
        if self._parts is not None:
            self._parts.roll()
            self._part_pairs = 0
        elif self._fh is not None:
            self._fh.flush()
        self._last_flush = time.monotonic_ns() if now is None else now

    def flush(self) -> None:
        """Write out what is buffered (called on a timer by long-running recorders).

        A Parquet recorder closes its part only once it has been open ``ROLL_EVERY_S``: a
        part per call would leave hundreds of tiny files."""
        with self._lock:
            if self._parts is None or time.monotonic_ns() - self._last_flush >= self._flush_every_ns:
                self._flush_locked()

    @property
    def events(self) -> int:
        """Events written so far."""
        return self._n

    def close(self) -> None:
        """Close the file. Operations still outstanding stay invokes, which the contract reads as info."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def history_format(requested: str | None = None) -> str:
    """The history format of a run: ``requested`` (``--history-format``), else
    ``$LEDGERMQ_HISTORY_FORMAT``, else ``DEFAULT_FORMAT``; ``ValueError`` names a bad one."""
    fmt = requested or os.environ.get(FORMAT_ENV) or DEFAULT_FORMAT
    if fmt not in SHARD_SUFFIXES:
        where = "--history-format" if requested else FORMAT_ENV
        raise ValueError(f"{where}={fmt!r}: the history format must be one of {', '.join(SHARD_SUFFIXES)}")
    return fmt


def shard_path(folder: Path, shard: int, fmt: str | None = None) -> Path:
    """Where shard ``shard`` of a run's history is recorded in ``fmt`` (default:
    :func:`history_format`; a ``.parquet`` path makes the recorder write parts next to it)."""
    return folder / f"shard-{shard:02d}{SHARD_SUFFIXES[history_format(fmt)]}"


SHARD_GLOB = "*.jsonl"
PARQUET_GLOB = "*" + PART_SUFFIX


def shard_files(path: str | Path) -> list[Path]:
    """The files of a history: the file itself, or a folder's ``*.jsonl`` shards (else its
    Parquet parts) in name order."""
    p = Path(path)
    if not p.is_dir():
        return [p]
    return sorted(p.glob(SHARD_GLOB)) or sorted(p.glob(PARQUET_GLOB))


def shard_groups(path: str | Path) -> list[list[Path]]:
    """The history's shards, each as its files in order: a JSON Lines shard is one file, a
    Parquet shard its parts (``shard-01.000001.parquet``, ...)."""
    groups: dict[str, list[Path]] = {}
    for f in shard_files(path):
        name = shard_name(f) if f.suffix == PART_SUFFIX else f.name
        groups.setdefault(name, []).append(f)
    return list(groups.values())


def _iter_file(f: Path, structure_only: bool = False) -> Iterator[dict[str, Any]]:
    if f.suffix == PART_SUFFIX:
        yield from iter_part_events(f, STRUCTURE_FIELDS if structure_only else None)
        return
    with open(f, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def iter_events(path: str | Path | list[Path], structure_only: bool = False) -> Iterator[dict[str, Any]]:
    """Stream a history's events in file order (one shard after another for a folder; a
    list of files: those files, in order). ``structure_only``: a Parquet part's events may
    come without their values and errors (what validation reads)."""
    for f in path if isinstance(path, list) else shard_files(path):
        yield from _iter_file(f, structure_only)


def _time_order(ev: dict[str, Any]) -> tuple[int, int]:
    return (ev.get("time") or 0, ev.get("index") or 0)


def _print_note(note: str) -> None:
    print(f"note: {note}", file=sys.stderr, flush=True)


def _jsonl_shard(f: Path, note: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    """A JSON Lines shard's events; a last line cut short by a killed recorder is skipped with
    a note, any other bad line is a ``ValueError`` naming file and line."""
    with open(f, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError:
                if not line.endswith("\n") and fh.read(1) == "":
                    note(f"{f}:{lineno}: partial last line skipped (its recorder stopped while writing it)")
                    return
                raise ValueError(f"{f}:{lineno}: not a JSON object") from None


def _parquet_shard(files: list[Path], note: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    """A Parquet shard's events, its parts in order. Only whole parts are ever renamed into
    place, so an unreadable part is damage, not a crash: the last one is skipped with a note
    (a copy cut short), an earlier one is a ``ValueError`` naming it."""
    for k, f in enumerate(files):
        try:
            yield from iter_part_events(f)
        except ValueError as exc:
            if k < len(files) - 1:
                raise ValueError(f"{f}: {exc}") from None
            note(f"{f}: unreadable last part skipped ({exc})")


def _noted_root(path: str | Path, note: Callable[[str], None]) -> Path:
    """The history ``path`` names, its half-written parts said through ``note`` (a JSON Lines
    shard's partial line is said by its reader, with the line)."""
    root = history_root(path)
    for text in crash_notes(root):
        if "partial line" not in text:
            note(text)
    return root


def read_events(path: str | Path, on_note: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
    """Every event of a recorded history, in time order (then index), from either format.

    ``path``: a run folder (its ``history/`` or ``history.jsonl``), a folder of shards or one
    file. The shards are merged as they stream (each is in time order already), so memory
    holds an event per shard. What a killed recorder left half-written is skipped, and said
    once through ``on_note`` (default: a ``note:`` line on stderr): a Parquet part still under
    its temporary name, a JSON Lines shard's partial last line. Anything else unreadable is a
    ``ValueError`` naming the file.
    """
    note = on_note or _print_note
    root = _noted_root(path, note)
    if not root.is_dir():
        if root.suffix == PART_SUFFIX:
            yield from _parquet_shard([root], note)
        else:
            yield from _jsonl_shard(root, note)
        return
    streams = [
        _parquet_shard(g, note) if g[0].suffix == PART_SUFFIX else _jsonl_shard(g[0], note)
        for g in shard_groups(root)
    ]
    yield from heapq.merge(*streams, key=_time_order)


def read_shards(
    path: str | Path, on_note: Callable[[str], None] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Each shard's events in recording order, by shard name (``shard-01``, whatever the
    format): for tests that look at what one recording process wrote. ``path`` and the notes as
    :func:`read_events`."""
    note = on_note or _print_note
    root = _noted_root(path, note)
    out: dict[str, list[dict[str, Any]]] = {}
    for g in shard_groups(root):
        if g[0].suffix == PART_SUFFIX:
            out[shard_name(g[0])] = list(_parquet_shard(g, note))
        else:
            out[g[0].name.split(".", 1)[0]] = list(_jsonl_shard(g[0], note))
    return out


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """A whole history as a list (for tests and summaries; the checker has its own reader):
    :func:`read_events`, one list ordered by ``time`` (then ``index``) for a folder of shards,
    which is what ``jepsen history export`` writes; a single file in its own order."""
    events = list(read_events(path))
    if history_root(path).is_dir():
        events.sort(key=_time_order)
    return events


def validate_shards(path: str | Path) -> list[str]:
    """Contract violations of a history file or folder of shards, streamed shard by shard.

    Each shard must keep the rules on its own (:func:`validate_history`). Across shards no
    process may appear in two of them, and indexes must not collide: the recorder gives
    shard ``s`` of ``n`` the indexes ``s + k*n``, so each shard's indexes must share one
    residue modulo the number of shards, a different one per shard.
    """
    groups = shard_groups(path)
    problems: list[str] = []
    owner: dict[Any, str] = {}
    residue_of: dict[int, str] = {}
    n = len(groups)
    for files, (found, seen, residues) in zip(groups, _validate_each(groups), strict=True):
        name = files[0].name if len(files) == 1 else shard_name(files[0])
        problems += [f"{name}: {p}" for p in found]
        for p in seen - {NEMESIS}:
            if p in owner:
                problems.append(f"process {p} appears in {owner[p]} and {name}")
            owner[p] = name
        if len(residues) > 1:
            problems.append(f"{name}: indexes are not one residue modulo {n}: they may collide")
        for r in residues:
            if r in residue_of:
                problems.append(f"{name} and {residue_of[r]} may share indexes (both {r} modulo {n})")
            residue_of[r] = name
    return problems


#: processes that validate shards side by side (a shard each; at most one per core)
VALIDATE_PROCESSES = 8
#: a history smaller than this is validated in this process (starting others costs more)
VALIDATE_PARALLEL_BYTES = 64 << 20
#: seconds one shard's validation may take in its child process
VALIDATE_TIMEOUT_S = 900
#: violations kept per shard (a broken shard can break the rules on every line; the run shows 20)
MAX_SHARD_PROBLEMS = 1000


def _weight(f: Path) -> int:
    """A shard file's size as JSON Lines (a Parquet part's events at ``JSONL_BYTES_PER_EVENT``)."""
    return rows(f) * JSONL_BYTES_PER_EVENT if f.suffix == PART_SUFFIX else f.stat().st_size


def _validate_shard(files: list[Path], n: int) -> tuple[list[str], set[Any], set[int]]:
    """One shard's own violations, the processes it names and its index residues modulo ``n``."""
    seen: set[Any] = set()
    residues: set[int] = set()
    found = validate_history(_tap(iter_events(files, structure_only=True), seen, residues, n))
    return found[:MAX_SHARD_PROBLEMS], seen, residues


def _validate_each(groups: list[list[Path]]) -> list[tuple[list[str], set[Any], set[int]]]:
    """``_validate_shard`` of every shard: in child processes (``python -m jepsen.history``,
    JSON on stdout) when the shards are big and there are cores for them (a 3M-event, three-shard
    history: 12.8 s in one process), else here."""
    n = len(groups)
    procs = min(n, os.cpu_count() or 1, VALIDATE_PROCESSES)
    if procs < 2 or sum(_weight(f) for g in groups for f in g) < VALIDATE_PARALLEL_BYTES:
        return [_validate_shard(g, n) for g in groups]
    results: list[tuple[list[str], set[Any], set[int]]] = []
    waiting = list(groups)
    running: list[tuple[list[Path], subprocess.Popen[str]]] = []
    try:
        while waiting or running:
            while waiting and len(running) < procs:
                g = waiting.pop(0)
                argv = [sys.executable, "-m", "jepsen.history", *map(str, g), str(n)]
                running.append(
                    (g, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                )
            g, proc = running.pop(0)  # in shard order: results line up with ``groups``
            out, err = proc.communicate(timeout=VALIDATE_TIMEOUT_S)
            if proc.returncode != 0:
                raise RuntimeError(f"validating {g[0]} failed (exit {proc.returncode}): {err.strip()[-500:]}")
            doc = json.loads(out)
            results.append((doc["problems"], set(doc["processes"]), set(doc["residues"])))
    finally:
        for _, proc in running:
            proc.kill()
            proc.wait()
    return results


def _validate_main(argv: list[str]) -> None:
    """``python -m jepsen.history FILE... N``: one shard's ``_validate_shard`` as JSON (a Parquet
    shard is several files, its parts in order)."""
    found, seen, residues = _validate_shard([Path(a) for a in argv[:-1]], int(argv[-1]))
    json.dump({"problems": found, "processes": list(seen), "residues": sorted(residues)}, sys.stdout)


def _tap(
    events: Iterator[dict[str, Any]], processes: set[Any], residues: set[int], n: int
) -> Iterator[dict[str, Any]]:
    for ev in events:
        processes.add(ev.get("process"))
        i = ev.get("index")
        if isinstance(i, int):
            residues.add(i % n)
        yield ev


def validate_history(events: Iterable[dict[str, Any]]) -> list[str]:
    """Return every contract violation found (empty when the history is well formed).

    Checks what the recorder promises: indexes strictly increase, times never go back,
    one outstanding operation per process, completions match their invoke, no process id
    after an ``info``, and nemesis events come in start/end pairs with the same ``f``.
    """
    problems: list[str] = []
    last_index = -1
    last_time = -1
    pending: dict[Any, dict[str, Any]] = {}
    retired: set[Any] = set()
    nemesis_open: str | None = None
    for ev in events:
        i = ev.get("index")
        if not isinstance(i, int) or i <= last_index:
            problems.append(f"index {i} does not increase after {last_index}")
        else:
            last_index = i
        t = ev.get("time")
        if not isinstance(t, int) or t < last_time:
            problems.append(f"event {i}: time {t} goes back from {last_time}")
        else:
            last_time = t
        p, typ, f = ev.get("process"), ev.get("type"), ev.get("f")
        if p == NEMESIS:
            if typ != "info":
                problems.append(f"event {i}: nemesis event of type {typ!r}")
            if nemesis_open is None:
                nemesis_open = f
            elif nemesis_open == f:
                nemesis_open = None
            else:
                problems.append(f"event {i}: nemesis {f!r} while {nemesis_open!r} is open")
            continue
        if not isinstance(p, int) or isinstance(p, bool):
            problems.append(f"event {i}: process {p!r} is not an integer")
            continue
        if typ == "invoke":
            if p in retired:
                problems.append(f"event {i}: process {p} reused after an info completion")
            if p in pending:
                problems.append(f"event {i}: process {p} invokes with an operation outstanding")
            pending[p] = ev
        elif typ in COMPLETIONS:
            inv = pending.pop(p, None)
            if inv is None:
                problems.append(f"event {i}: completion without invoke for process {p}")
            elif inv.get("f") != f or inv.get("key") != ev.get("key"):
                problems.append(f"event {i}: completion {f!r} does not match invoke {inv.get('f')!r}")
            if typ == "info":
                retired.add(p)
        else:
            problems.append(f"event {i}: unknown type {typ!r}")
    if nemesis_open is not None:
        problems.append(f"nemesis {nemesis_open!r} never ended")
    return problems


if __name__ == "__main__":
    _validate_main(sys.argv[1:])
