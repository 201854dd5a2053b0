"""The history recorder: one JSON Lines file following ``shared/HISTORY.md`` exactly.

Every event gets its ``index`` and ``time`` under one lock, from one monotonic clock that
starts with the test, so file order, index order and time order agree even when the
nemesis (possibly from a worker thread) and many client tasks record at once. The
recorder also enforces the contract's process rules at the source — one outstanding
operation per process, and a process id is never used again after an ``info`` — because a
history that breaks them would make the checker judge the recorder instead of the system.
Each line is flushed as it is written so a crashed run still leaves a readable history.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

NEMESIS = "nemesis"
COMPLETIONS = ("ok", "fail", "info")


class HistoryMisuse(RuntimeError):
    """The caller broke a pairing rule (a harness bug, never a system-under-test finding)."""


@dataclass(slots=True)
class _Pending:
    f: str
    key: str | None


class History:
    """Thread-safe recorder of client and nemesis events into ``path``."""

    def __init__(self, path: str | Path, clock_origin_ns: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: TextIO | None = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self._t0 = time.monotonic_ns() if clock_origin_ns is None else clock_origin_ns
        self._index = 0
        self._next_process = 0
        self._pending: dict[int, _Pending] = {}
        self._retired: set[int] = set()
        self._nemesis_open: str | None = None
        self.counts: Counter[str] = Counter()  # "ok"/"fail"/"info" over client completions
        self.counts_by_f: Counter[tuple[str, str]] = Counter()
        self.nemesis_events = 0

    # ------------------------------------------------------------------ clock and processes

    def now_ns(self) -> int:
        """Nanoseconds since the test started, on the history's clock."""
        return time.monotonic_ns() - self._t0

    def new_process(self) -> int:
        """A process id never handed out before (ids are not recycled, even after ``fail``)."""
        with self._lock:
            p = self._next_process
            self._next_process += 1
            return p

    def outstanding(self) -> dict[int, str]:
        """Processes with an invoke but no completion yet, and their ``f``."""
        with self._lock:
            return {p: v.f for p, v in self._pending.items()}

    # ------------------------------------------------------------------ client events

    def invoke(
        self, process: int, f: str, value: Any = None, *, key: str | None = None, node: str | None = None
    ) -> dict[str, Any]:
        with self._lock:
            if process in self._retired:
                raise HistoryMisuse(f"process {process} completed with info and may not be reused")
            if process in self._pending:
                raise HistoryMisuse(f"process {process} already has {self._pending[process].f!r} outstanding")
            if process >= self._next_process:
                raise HistoryMisuse(f"process {process} was not allocated with new_process()")
            self._pending[process] = _Pending(f, key)
            return self._write_locked(process, "invoke", f, value, key=key, node=node)

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
    ) -> dict[str, Any]:
        """Record the completion of ``process``'s outstanding operation (ok, fail or info)."""
        if type not in COMPLETIONS:
            raise HistoryMisuse(f"completion type must be one of {COMPLETIONS}, got {type!r}")
        with self._lock:
            pend = self._pending.pop(process, None)
            if pend is None:
                raise HistoryMisuse(f"process {process} completes {f!r} without an outstanding invoke")
            if pend.f != f or pend.key != key:
                self._pending[process] = pend
                raise HistoryMisuse(
                    f"process {process} completes {f!r}/{key!r} but invoked {pend.f!r}/{pend.key!r}"
                )
            if type == "info":
                self._retired.add(process)
            self.counts[type] += 1
            self.counts_by_f[(f, type)] += 1
            return self._write_locked(process, type, f, value, key=key, error=error, node=node, offset=offset)

    # ------------------------------------------------------------------ nemesis events

    def nemesis_start(self, f: str, value: Any = None) -> dict[str, Any]:
        """The start event of a fault operation (type ``info``, process ``nemesis``)."""
        with self._lock:
            if self._nemesis_open is not None:
                raise HistoryMisuse(f"nemesis starts {f!r} while {self._nemesis_open!r} is still open")
            self._nemesis_open = f
            self.nemesis_events += 1
            return self._write_locked(NEMESIS, "info", f, value)

    def nemesis_end(self, f: str, value: Any = None, *, error: str | None = None) -> dict[str, Any]:
        """The end event matching the last ``nemesis_start`` (same ``f``)."""
        with self._lock:
            if self._nemesis_open != f:
                raise HistoryMisuse(f"nemesis ends {f!r} but {self._nemesis_open!r} is open")
            self._nemesis_open = None
            self.nemesis_events += 1
            return self._write_locked(NEMESIS, "info", f, value, error=error)

    # ------------------------------------------------------------------ output

    def _write_locked(
        self,
        process: int | str,
        type: str,
        f: str,
        value: Any,
        *,
        key: str | None = None,
        error: str | None = None,
        node: str | None = None,
        offset: int | None = None,
    ) -> dict[str, Any]:
        if self._fh is None:
            raise HistoryMisuse("history is closed")
        ev: dict[str, Any] = {
            "index": self._index,
            "time": time.monotonic_ns() - self._t0,
            "process": process,
            "type": type,
            "f": f,
        }
        if key is not None:
            ev["key"] = key
        ev["value"] = value
        if offset is not None:
            ev["offset"] = offset
        if error is not None:
            ev["error"] = error
        if node is not None:
            ev["node"] = node
        self._fh.write(json.dumps(ev, separators=(",", ":")) + "\n")
        self._fh.flush()
        self._index += 1
        return ev

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


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """Load a history file (for tests and summaries; the checker has its own reader)."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def validate_history(events: list[dict[str, Any]]) -> list[str]:
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
