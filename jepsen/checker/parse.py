"""Readers for the history formats the checker accepts, into one common event shape.

Three formats arrive: our JSON Lines contract (``docs/history.md``), Jepsen's etcd
text logs (``INFO  jepsen.util - 3	:ok	:read	nil``) and Jepsen's EDN histories (one
``{:process ..., :type ...}`` map per line). Large JSON Lines histories are read by
Spark itself (see ``frames.py``); the readers here serve the small Jepsen formats,
standalone use, and the exact file:line message when Spark finds a file malformed
(Spark knows a row is bad, not which line it came from).

The common shape keeps ``value`` as text, the same text Spark's JSON reader yields for
a string-typed column: JSON for numbers, lists and objects, and the bare string for a
JSON string. Models decode it themselves (the register model as JSON, the kv model as
a string), so a history reads the same whichever path parsed it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jepsen.checker import edn

TYPES = ("invoke", "ok", "fail", "info")
NEMESIS = "nemesis"

LOG_FS = frozenset({"send", "poll", "drain"})
REGISTER_FS = frozenset({"read", "write", "cas"})
KV_FS = frozenset({"get", "put", "append"})
#: the broker's held-message workloads (docs/history.md): their operations
SEMANTICS_FS: dict[str, frozenset[str]] = {
    "delay": frozenset({"send-delayed", "poll", "drain"}),
    "txn": frozenset({"send-half", "end", "check", "poll", "drain"}),
    "retry": frozenset({"send", "poll", "drain", "send-back", "ack"}),
    "order": frozenset({"send", "consume", "lock", "unlock", "drain"}),
}
WORKLOADS = ("log", "register", "kv", *SEMANTICS_FS)


class HistoryError(Exception):
    """A history that cannot be read; names the file and, where known, the line."""

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


@dataclass(slots=True)
class Event:
    """One history line in the common shape (field names follow docs/history.md)."""

    index: int
    time: int | None
    process: str
    type: str
    f: str
    key: str | None = None
    value: str | None = None
    error: str | None = None
    node: str | None = None
    offset: int | None = None
    line: int = 0

    def as_row(self, src: int) -> tuple[Any, ...]:
        """The tuple matching ``frames.EVENT_SCHEMA`` (with the source file id)."""
        return (
            src,
            self.index,
            self.time,
            self.process,
            self.type,
            self.f,
            self.key,
            self.value,
            self.error,
            self.node,
            self.offset,
        )


def value_text(value: Any) -> str | None:
    """Encode a decoded value the way Spark's JSON reader exposes a string column."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


PARQUET_MAGIC = b"PAR1"


def detect_format(path: str | Path) -> str:
    """Return ``jsonl``, ``edn``, ``etcd`` or ``parquet`` by looking at the file's start.

    Content decides rather than the extension because the Porcupine vectors use
    ``.txt`` for EDN and ``.log`` for text logs, and harness files may be renamed.
    """
    try:
        with open(path, "rb") as raw:
            if raw.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC:
                return "parquet"
        with open(path, encoding="utf-8") as fh:
            for lineno, raw in enumerate(fh, 1):
                line = raw.strip()
                if not line:
                    continue
                if "jepsen.util" in line:
                    return "etcd"
                if line.startswith("{"):
                    rest = line[1:].lstrip()
                    if rest.startswith(":"):
                        return "edn"
                    return "jsonl"
                if line.startswith("["):
                    return "edn"
                if lineno > 200:
                    break
                if re.match(r"^\S*\s*(INFO|WARN|DEBUG|ERROR|TRACE)\b", line):
                    continue  # other log lines before the first operation
                raise HistoryError(
                    path, lineno, "not a history: expected JSON Lines, EDN maps or a Jepsen text log"
                )
    except UnicodeDecodeError as exc:
        raise HistoryError(path, None, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise HistoryError(path, None, f"cannot read: {exc.strerror or exc}") from None
    raise HistoryError(path, None, "no operations found")


def read_events(path: str | Path, fmt: str | None = None, check: bool = True) -> list[Event]:
    """Read a whole history file in Python, validating it; raises :class:`HistoryError`.

    ``check=False`` leaves out the pairing rules (:func:`check_structure`): for a Parquet
    part, whose shard's operations may continue in the next part."""
    fmt = fmt or detect_format(path)
    reader = {"jsonl": _read_jsonl, "edn": _read_edn, "etcd": _read_etcd, "parquet": _read_parquet}[fmt]
    try:
        events = list(reader(Path(path)))
    except UnicodeDecodeError as exc:
        raise HistoryError(path, None, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise HistoryError(path, None, f"cannot read: {exc.strerror or exc}") from None
    if not events and check:
        raise HistoryError(path, None, "no operations found")
    if check:
        check_structure(events, path)
    return events


def check_structure(events: list[Event], path: str | Path) -> None:
    """Enforce the pairing rules of the contract: one outstanding op per process.

    A completion with no invoke, or a second invoke while one is pending, means the
    recorder is broken; checking such a history would give a verdict about the
    recorder's bug, so it is refused with the line.
    """
    pending: dict[str, Event] = {}
    last_index: int | None = None
    for ev in events:
        if last_index is not None and ev.index <= last_index:
            raise HistoryError(path, ev.line, f"index {ev.index} does not increase (previous {last_index})")
        last_index = ev.index
        if ev.process == NEMESIS:
            continue
        if ev.type == "invoke":
            if ev.process in pending:
                first = pending[ev.process]
                raise HistoryError(
                    path,
                    ev.line,
                    f"process {ev.process} invokes {ev.f!r} while its "
                    f"{first.f!r} from line {first.line} is still outstanding",
                )
            pending[ev.process] = ev
        else:
            inv = pending.pop(ev.process, None)
            if inv is None:
                raise HistoryError(
                    path,
                    ev.line,
                    f"{ev.type} completion of {ev.f!r} by process {ev.process} without an invoke",
                )
            if inv.f != ev.f:
                raise HistoryError(
                    path,
                    ev.line,
                    f"completion {ev.f!r} does not match the invoke {inv.f!r} on line {inv.line}",
                )


# --- JSON Lines ---------------------------------------------------------------------------


def _int_field(obj: dict[str, Any], name: str, required: bool) -> int | None:
    v = obj.get(name)
    if v is None:
        if required:
            raise ValueError(f"missing {name!r}")
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name!r} must be an integer, got {json.dumps(v)}")
    return v


def _str_field(obj: dict[str, Any], name: str) -> str | None:
    v = obj.get(name)
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, int | float) and not isinstance(v, bool):
        return json.dumps(v)
    raise ValueError(f"{name!r} must be a string, got {json.dumps(v)}")


def parse_json_line(text: str) -> Event:
    """Validate and convert one JSON Lines event; raises ``ValueError`` with the reason."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError("an event must be a JSON object")
    index = _int_field(obj, "index", True)
    time = _int_field(obj, "time", False)
    typ = obj.get("type")
    if typ not in TYPES:
        raise ValueError(f"'type' must be one of {', '.join(TYPES)}, got {json.dumps(typ)}")
    f = obj.get("f")
    if not isinstance(f, str) or not f:
        raise ValueError(f"'f' must be a non-empty string, got {json.dumps(f)}")
    proc = obj.get("process")
    if isinstance(proc, bool) or not (isinstance(proc, int) or proc == NEMESIS):
        raise ValueError(f"'process' must be an integer or \"nemesis\", got {json.dumps(proc)}")
    offset = _int_field(obj, "offset", False)
    return Event(
        index=index or 0,
        time=time,
        process=str(proc),
        type=typ,
        f=f,
        key=_str_field(obj, "key"),
        value=value_text(obj.get("value")),
        error=_str_field(obj, "error"),
        node=_str_field(obj, "node"),
        offset=offset,
    )


def _read_jsonl(path: Path) -> Iterator[Event]:
    with open(path, encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                ev = parse_json_line(raw)
            except ValueError as exc:
                raise HistoryError(path, lineno, str(exc)) from None
            ev.line = lineno
            yield ev


# --- Parquet parts (columnar.py) -----------------------------------------------------------


def _parquet_event(row: dict[str, Any], n: int, path: Path) -> Event:
    """One row of a Parquet part as an event, with the checks a JSON line gets."""
    typ, f, proc, index = row["type"], row["f"], row["process"], row["index"]
    if index is None:
        raise HistoryError(path, n, "missing 'index'")
    if typ not in TYPES:
        raise HistoryError(path, n, f"'type' must be one of {', '.join(TYPES)}, got {json.dumps(typ)}")
    if not f:
        raise HistoryError(path, n, f"'f' must be a non-empty string, got {json.dumps(f)}")
    if proc != NEMESIS and not (isinstance(proc, str) and proc.lstrip("-").isdigit()):
        raise HistoryError(path, n, f"'process' must be an integer or \"nemesis\", got {json.dumps(proc)}")
    return Event(
        index=index,
        time=row["time"],
        process=proc,
        type=typ,
        f=f,
        key=row["key"],
        value=row["value"],
        error=row["error"],
        node=row["node"],
        offset=row["offset"],
        line=n,
    )


def _read_parquet(path: Path) -> Iterator[Event]:
    from jepsen.checker import columnar

    try:
        for n, row in columnar.iter_rows(path):
            yield _parquet_event(row, n, path)
    except ValueError as exc:
        raise HistoryError(path, None, str(exc)) from None


# --- Jepsen etcd text log ------------------------------------------------------------------

_ETCD_LINE = re.compile(
    r"jepsen\.util\s+-\s+(?P<proc>\S+)\s+:(?P<type>[\w-]+)\s+:(?P<f>[\w-]+)(?:\s+(?P<value>.*?))?\s*$"
)


def _edn_value(text: str | None, path: Path, lineno: int) -> Any:
    if text is None or text == "":
        return None
    try:
        return edn.loads(text)
    except edn.EdnError as exc:
        raise HistoryError(path, lineno, f"bad value {text!r}: {exc}") from None


def _process_name(proc: Any, path: Path, lineno: int) -> str:
    if isinstance(proc, edn.Keyword) and proc.name == NEMESIS:
        return NEMESIS
    if isinstance(proc, int) and not isinstance(proc, bool):
        return str(proc)
    raise HistoryError(path, lineno, f"process must be an integer or :nemesis, got {proc!r}")


def _completion(typ: str, value: Any) -> tuple[Any, str | None]:
    """Jepsen puts the failure reason (``:timed-out``) where the value would be."""
    if typ in ("info", "fail") and isinstance(value, edn.Keyword):
        return None, value.name
    return value, None


def _read_etcd(path: Path) -> Iterator[Event]:
    with open(path, encoding="utf-8") as fh:
        n = 0
        for lineno, raw in enumerate(fh, 1):
            if "jepsen.util" not in raw:
                continue  # other loggers' lines are not operations
            m = _ETCD_LINE.search(raw)
            if m is None:
                raise HistoryError(
                    path, lineno, f"unreadable jepsen.util operation line: {raw.strip()[:120]!r}"
                )
            typ = m["type"]
            if typ not in TYPES:
                raise HistoryError(path, lineno, f"unknown operation type :{typ}")
            try:
                proc_form = edn.loads(m["proc"])
            except edn.EdnError as exc:
                raise HistoryError(path, lineno, f"bad process {m['proc']!r}: {exc}") from None
            proc = _process_name(proc_form, path, lineno)
            value, error = _completion(typ, _edn_value(m["value"], path, lineno))
            yield Event(
                index=n,
                time=None,
                process=proc,
                type=typ,
                f=m["f"],
                value=value_text(edn.to_plain(value)),
                error=error,
                line=lineno,
            )
            n += 1


# --- Jepsen EDN ---------------------------------------------------------------------------


def _kw(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, edn.Keyword):
        return value.name
    if isinstance(value, str):
        return value
    return str(edn.to_plain(value))


def _edn_event(form: Any, n: int, path: Path, lineno: int) -> Event:
    if not isinstance(form, dict):
        raise HistoryError(path, lineno, "an operation must be an EDN map")
    get = {(k.name if isinstance(k, edn.Keyword) else str(k)): v for k, v in form.items()}
    typ = _kw(get.get("type"))
    if typ not in TYPES:
        raise HistoryError(
            path, lineno, f":type must be one of {', '.join(':' + t for t in TYPES)}, got {get.get('type')!r}"
        )
    f = _kw(get.get("f"))
    if not f:
        raise HistoryError(path, lineno, "missing :f")
    if "process" not in get:
        raise HistoryError(path, lineno, "missing :process")
    proc = _process_name(get["process"], path, lineno)
    value, error = _completion(typ, get.get("value"))
    if get.get("error") is not None:
        error = _kw(get["error"])
    index, time = get.get("index", n), get.get("time")
    for name, v in (("index", index), ("time", time)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise HistoryError(path, lineno, f":{name} must be an integer, got {v!r}")
    key = get.get("key")
    return Event(
        index=index,
        time=time,
        process=proc,
        type=typ,
        f=f,
        key=None if key is None else _kw(key),
        value=value_text(edn.to_plain(value)),
        error=error,
        node=_kw(get.get("node")),
        line=lineno,
    )


def _read_edn(path: Path) -> Iterator[Event]:
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            forms = edn.loads(text)
        except edn.EdnError as exc:
            raise HistoryError(path, text.count("\n", 0, exc.pos) + 1, str(exc)) from None
        for n, form in enumerate(forms):
            yield _edn_event(form, n, path, n + 1)
        return
    n = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            form = edn.loads(raw)
        except edn.EdnError as exc:
            raise HistoryError(path, lineno, f"bad EDN: {exc}") from None
        yield _edn_event(form, n, path, lineno)
        n += 1


def infer_workload(fs: set[str]) -> str | None:
    """Pick the workload from the operation names a history uses (None if ambiguous): the first
    whose operations include them all (a retry history without send-backs reads as a log)."""
    fs = set(fs)
    for name, known in (("log", LOG_FS), ("register", REGISTER_FS), ("kv", KV_FS), *SEMANTICS_FS.items()):
        if fs and fs <= known:
            return name
    return None
