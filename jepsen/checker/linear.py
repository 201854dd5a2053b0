"""Linearizability search (Wing & Gong, with Lowe's memo) for the register and kv models.

Pure Python with no Spark or jepsen imports at module level, because Spark ships this
module by value to its Python workers (``linear_spark.py``) and runs one search per key:
linearizability is compositional (P-compositionality), so keys are independent.

The search walks a time-ordered list of call/return entries, tentatively linearizing
calls that the model accepts; reaching a return whose call is not linearized forces a
backtrack. The memo of (set of linearized ops, model state) prunes every configuration
already explored, which is what keeps real histories tractable. ``info`` operations
(timed out, unknown outcome) have no return entry: they may take effect at any point
after their invoke, or never, so they never force a backtrack and need not be
linearized for the history to pass. ``fail`` operations certainly did not happen and
are dropped, as are reads whose result is unknown (they constrain nothing).

A per-key deadline bounds the work; running out gives ``unknown``, never ``valid``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

UNKNOWN = "unknown"

# Compiled operation kinds for the step function.
_READ, _WRITE, _CAS, _APPEND = range(4)
_FAIL = object()  # the model refuses the operation in this state


class ModelError(ValueError):
    """An operation whose arguments do not fit the model (e.g. a cas without two values)."""


@dataclass(slots=True)
class Op:
    """A paired operation: invoke plus completion (``type`` is ok, fail or info).

    ``ret`` is the completion time for ok and fail only: an info op has no known end.
    ``ret_index`` is the completion event's index whatever its type (None if none).
    """

    process: str
    f: str
    type: str
    call: int
    ret: int | None
    call_index: int
    ret_index: int | None
    value: str | None = None
    result: str | None = None
    error: str | None = None


def _decode_json(text: str | None) -> Any:
    """Values arrive as text: JSON for numbers/lists, the bare string for strings."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


# --- models: one per workload, Porcupine's shape --------------------------------------------

Step = tuple[int, Any, Any]  # a compiled operation: (kind, a, b)


class Model:
    """How one workload's operations act on one key's state (Porcupine's ``Model``).

    ``init`` is the state before any operation, ``step`` one operation's effect on a state
    (``_FAIL``: the model refuses it there), ``describe`` an operation as results.json shows
    it. Operations are compiled once (``compile``: the triple ``step`` reads, or None for an
    operation that constrains nothing) because the search steps millions of times and must
    not decode values as it goes. ``grows``: states only ever extend (kv's appends), so a
    read of v may still be reached from any prefix of v; the search prunes with that.

    A ``fail`` is taken at its word (it did not happen), as Knossos does, even where the
    client means "the compare did not match": that reads less into the history, and the
    etcd vectors' verdicts are the same either way.
    """

    name: str = "?"
    grows: bool = False
    #: the operations whose ok completion carries a value read (described with their result)
    reads: frozenset[str] = frozenset()

    def init(self) -> Any:
        return None

    def compile(self, op: Op) -> Step | None:
        raise NotImplementedError

    @staticmethod
    def step(state: Any, kind: int, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def describe(self, op: Op) -> dict[str, Any]:
        """A JSON-ready description of ``op`` used in results.json examples."""
        out: dict[str, Any] = {
            "process": op.process,
            "f": op.f,
            "type": op.type,
            "value": _decode_json(op.value),
            "invoke-index": op.call_index,
            "invoke-time": op.call,
        }
        if op.type == "ok" and op.f in self.reads:
            out["result"] = _decode_json(op.result)
        if op.ret_index is not None:
            out["complete-index"] = op.ret_index
        if op.ret is not None:
            out["complete-time"] = op.ret
        if op.error:
            out["error"] = op.error
        return out


class RegisterModel(Model):
    """Knossos' cas-register: read, write and compare-and-set of one value (JSON) per key."""

    name = "register"
    reads = frozenset({"read"})

    def compile(self, op: Op) -> Step | None:
        if op.f == "read":
            if op.type != "ok":
                return None
            return (_READ, _hashable(_decode_json(op.result)), None)
        if op.f == "write":
            if op.type == "fail":
                return None
            return (_WRITE, _hashable(_decode_json(op.value)), None)
        if op.f == "cas":
            pair = _decode_json(op.value)
            if not isinstance(pair, list) or len(pair) != 2:
                raise ModelError(f"cas value must be [old, new], got {op.value!r}")
            old, new = _hashable(pair[0]), _hashable(pair[1])
            if op.type == "fail":
                return None
            return (_CAS, old, new)
        raise ModelError(f"register has no operation {op.f!r}")

    @staticmethod
    def step(state: Any, kind: int, a: Any, b: Any) -> Any:
        if kind == _READ:
            return state if state == a else _FAIL
        if kind == _WRITE:
            return a
        return b if state == a else _FAIL  # _CAS


class KVModel(Model):
    """Porcupine's kv: get, put and append of one string per key (the empty string at first)."""

    name = "kv"
    grows = True
    reads = frozenset({"get"})

    def init(self) -> Any:
        return ""

    def compile(self, op: Op) -> Step | None:
        if op.f == "get":
            if op.type != "ok":
                return None
            return (_READ, op.result or "", None)
        if op.type == "fail":
            return None
        if op.f == "put":
            return (_WRITE, op.value or "", None)
        if op.f == "append":
            return (_APPEND, op.value or "", None)
        raise ModelError(f"kv has no operation {op.f!r}")

    @staticmethod
    def step(state: Any, kind: int, a: Any, b: Any) -> Any:
        if kind == _READ:
            return state if state == a else _FAIL
        if kind == _WRITE:
            return a
        return state + a  # _APPEND


REGISTER = RegisterModel()
KV = KVModel()
#: the model of each workload the search judges
MODELS: dict[str, Model] = {m.name: m for m in (REGISTER, KV)}


def model_for(workload: str) -> Model:
    """The model for a workload name."""
    model = MODELS.get(workload)
    if model is None:
        raise ModelError(f"no linearizability model for workload {workload!r}")
    return model


# --- the search -----------------------------------------------------------------------------


class _Timeout(Exception):
    pass


def _search(ops: list[Op], model: Model, deadline: float) -> tuple[bool, int]:
    """Return (linearizable, configurations explored); raises _Timeout past the deadline."""
    compiled: list[tuple[int, Any, Any]] = []
    required: list[bool] = []
    entries: list[tuple[int, int, int, int]] = []  # (time, kind 0=call 1=return, seq, op)
    for op in ops:
        c = model.compile(op)
        if c is None:
            continue
        i = len(compiled)
        compiled.append(c)
        req = op.type == "ok"
        required.append(req)
        entries.append((op.call, 0, op.call_index, i))
        if req:
            assert op.ret is not None
            entries.append((op.ret, 1, op.ret_index if op.ret_index is not None else 0, i))
    # Calls sort before returns at equal times: ops that touch are treated as concurrent.
    entries.sort()
    n = len(entries)
    remaining = sum(required)
    if remaining == 0:
        return True, 0
    # Doubly linked list over entries 1..n with sentinels 0 (head) and n+1 (tail).
    nxt = list(range(1, n + 2)) + [n + 1]
    prv = [0] + list(range(0, n + 1))
    is_call = [False] * (n + 2)
    op_of = [0] * (n + 2)
    match = [0] * (n + 2)  # call entry -> its return entry (0 for info ops)
    call_entry: dict[int, int] = {}
    for pos, (_, kind, _, i) in enumerate(entries, 1):
        op_of[pos] = i
        if kind == 0:
            is_call[pos] = True
            call_entry[i] = pos
        else:
            match[call_entry[i]] = pos
    tail = n + 1
    bits = [1 << i for i in range(len(compiled))]
    grows = model.grows
    obligations = _obligations(compiled, required, grows)
    step = model.step

    cache: set[tuple[int, Any]] = set()
    stack: list[tuple[int, Any, bool]] = []  # (call entry, state before, taken greedily)
    state: Any = model.init()
    lin = 0
    steps = 0
    fresh = True  # a new configuration: look for a read to take greedily first
    e = nxt[0]
    while True:
        steps += 1
        if not steps & 0xFFF and time.monotonic() > deadline:
            raise _Timeout
        greedy = False
        if fresh:
            fresh = False
            # Partial-order reduction: a pending read that matches the current state can
            # be linearized now without loss of generality (it changes no state, and
            # everything that must precede it is already linearized), so it is not a
            # branch point. Only one such read is taken per configuration.
            r = nxt[0]
            while r != tail and is_call[r]:
                kind, a, _ = compiled[op_of[r]]
                if kind == _READ and a == state:
                    greedy = True
                    e = r
                    break
                r = nxt[r]
        if e != tail and is_call[e]:
            i = op_of[e]
            kind, a, b = compiled[i]
            ns = step(state, kind, a, b)
            if ns is not _FAIL:
                nl = lin | bits[i]
                k = (nl, ns)
                if k not in cache:
                    cache.add(k)
                    stack.append((e, state, greedy))
                    state, lin = ns, nl
                    # lift the call and its return out of the list
                    p, q = prv[e], nxt[e]
                    nxt[p], prv[q] = q, p
                    m = match[e]
                    if m:
                        p, q = prv[m], nxt[m]
                        nxt[p], prv[q] = q, p
                    if required[i]:
                        remaining -= 1
                        if remaining == 0:
                            return True, len(cache)
                    e = nxt[0]
                    fresh = True
                    if kind != _READ and _doomed(obligations, lin, ns, grows):
                        e = tail  # some later read can no longer be satisfied: backtrack
                    continue
                if greedy:
                    # Explored before and failed; delaying the read cannot do better.
                    e = tail
                    continue
            e = nxt[e]
        else:
            # A return (or the end) whose op is not linearized: undo the latest choice.
            # Undoing a greedy read goes on to the choice before it: its alternatives
            # (the read left for later) are no better than what just failed.
            while True:
                if not stack:
                    return False, len(cache)
                e, state, was_greedy = stack.pop()
                i = op_of[e]
                lin ^= bits[i]
                if required[i]:
                    remaining += 1
                m = match[e]
                if m:
                    nxt[prv[m]] = m
                    prv[nxt[m]] = m
                nxt[prv[e]] = e
                prv[nxt[e]] = e
                if not was_greedy:
                    break
            e = nxt[e]


def _obligations(
    compiled: list[tuple[int, Any, Any]], required: list[bool], grows: bool
) -> list[tuple[int, Any, int]]:
    """For each required read (or cas), the value it needs and the ops that could supply it.

    This is a necessary condition, checked after every state change, that prunes the
    search long before the read's return entry would force the backtrack: a register
    read of v needs the state to be v now or some unlinearized write/cas to write v;
    a kv read of v needs the state to be a prefix of v (appends only extend it) or an
    unlinearized put of a prefix of v. Real-time order is ignored, so it never prunes
    a configuration that could succeed.
    """
    out: list[tuple[int, Any, int]] = []
    writers = [(j, c) for j, c in enumerate(compiled) if c[0] in (_WRITE, _CAS)]
    for j, (kind, a, _) in enumerate(compiled):
        if not required[j] or kind not in (_READ, _CAS):
            continue
        mask = 0
        for w, (wkind, wa, wb) in writers:
            if w == j:
                continue
            written = wa if wkind == _WRITE else wb
            if written == a or (
                grows and isinstance(a, str) and isinstance(written, str) and a.startswith(written)
            ):
                mask |= 1 << w
        out.append((j, a, mask))
    return out


def _doomed(obligations: list[tuple[int, Any, int]], lin: int, state: Any, grows: bool) -> bool:
    for j, want, mask in obligations:
        if lin >> j & 1:
            continue
        if want == state or (grows and want.startswith(state)) or mask & ~lin:
            continue
        return True
    return False


def _prefix(ops: list[Op], last_index: int) -> list[Op]:
    """The history cut after event ``last_index``: later completions become pending."""
    out: list[Op] = []
    for op in ops:
        if op.call_index > last_index:
            continue
        if op.ret_index is not None and op.ret_index > last_index:
            out.append(Op(op.process, op.f, "info", op.call, None, op.call_index, None, op.value, None, None))
        else:
            out.append(op)
    return out


@dataclass(slots=True)
class KeyResult:
    """The verdict for one key: True, False or ``"unknown"`` plus the evidence."""

    valid: bool | str
    ops: int
    seconds: float
    explored: int = 0
    failure: dict[str, Any] | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "valid": self.valid,
            "ops": self.ops,
            "seconds": round(self.seconds, 4),
            "explored": self.explored,
        }
        if self.failure is not None:
            out["failure"] = self.failure
        if self.error:
            out["error"] = self.error
        if self.notes:
            out["notes"] = self.notes
        return out


def _failure_detail(ops: list[Op], last_index: int, minimal: bool, model: Model) -> dict[str, Any]:
    """Describe the shortest failing prefix: the op whose completion breaks it and its peers."""
    culprit = next(op for op in ops if op.ret_index == last_index)
    events = sum(1 for op in ops if op.call_index <= last_index) + sum(
        1 for op in ops if op.ret_index is not None and op.ret_index <= last_index
    )
    prefix = [op for op in ops if op.call_index <= last_index]
    concurrent = [
        op
        for op in prefix
        if op is not culprit
        and (op.ret is None or op.ret_index is None or op.ret_index > last_index or op.ret >= culprit.call)
    ]
    # only the part of the story that had happened by the cut
    concurrent = [
        op
        if op.ret_index is None or op.ret_index <= last_index
        else Op(op.process, op.f, "info", op.call, None, op.call_index, None, op.value)
        for op in concurrent
    ]
    before = sorted(
        (
            op
            for op in prefix
            if op.ret is not None
            and op.ret_index is not None
            and op.ret_index <= last_index
            and op.ret < culprit.call
        ),
        key=lambda o: o.ret_index or 0,
    )[-6:]
    shown = sorted(before + concurrent[:17], key=lambda o: o.call_index)
    return {
        "prefix-events": events,
        "last-index": last_index,
        "minimal": minimal,
        "op": model.describe(culprit),
        "ops": [model.describe(o) for o in shown],
    }


def check_ops(
    ops: list[Op], model: Model, budget: float = 10.0, narrow_budget: float | None = None
) -> KeyResult:
    """Check one key's operations; a failure is narrowed to its shortest failing prefix.

    Linearizability is prefix-closed and only an ``ok`` completion can break it, so a
    binary search over ok completions finds the first one that cannot be placed. A
    prefix search can cost far more than the full one (the reads that pruned the full
    search lie beyond the cut), so the narrowing has its own smaller budget, split
    across probes; a probe that runs out counts as "maybe linearizable", which keeps
    the reported prefix a proven failure but marks it ``minimal: false``.
    """
    start = time.monotonic()
    try:
        ok, explored = _search(ops, model, start + budget)
    except _Timeout:
        return KeyResult(
            UNKNOWN, len(ops), time.monotonic() - start, notes=[f"search ran out of its {budget:g} s budget"]
        )
    except ModelError as exc:
        return KeyResult(UNKNOWN, len(ops), time.monotonic() - start, error=str(exc))
    if ok:
        return KeyResult(True, len(ops), time.monotonic() - start, explored)
    cuts = sorted(op.ret_index for op in ops if op.type == "ok" and op.ret_index is not None)
    lo, hi = 0, len(cuts) - 1  # cuts[hi] is known to fail (the whole history does)
    narrow = budget / 2 if narrow_budget is None else narrow_budget
    narrow_end = time.monotonic() + narrow
    probe_cap = max(narrow / 8, 0.05)
    minimal = True
    while lo < hi:
        mid = (lo + hi) // 2
        now = time.monotonic()
        if now >= narrow_end:
            minimal = False
            break
        try:
            if _search(_prefix(ops, cuts[mid]), model, min(narrow_end, now + probe_cap))[0]:
                lo = mid + 1
            else:
                hi = mid
        except _Timeout:
            minimal = False
            lo = mid + 1
    return KeyResult(
        False,
        len(ops),
        time.monotonic() - start,
        explored,
        failure=_failure_detail(ops, cuts[hi], minimal, model),
    )


def op_from_row(r: dict[str, Any]) -> Op:
    """One paired operation row (the columns of ``frames.pair_ops``) as a search ``Op``.

    Both checker paths build their ops here (Spark's per-key group function and the
    in-process path for small histories), so they judge the same operations.
    """
    done = r["type"] in ("ok", "fail") and r["cmp_index"] is not None
    return Op(
        process=r["process"],
        f=r["f"],
        type=r["type"] if done else "info",
        call=r["inv_time"],
        ret=r["cmp_time"] if done else None,
        call_index=r["inv_index"],
        ret_index=r["cmp_index"],
        value=r["inv_value"],
        result=r["cmp_value"] if r["type"] == "ok" else None,
        error=r["error"],
    )


def check_rows(rows: list[dict[str, Any]], model_name: str, budget: float) -> KeyResult:
    """Check one key given as paired operation rows; a model error is ``unknown`` with the reason."""
    ops = [op_from_row(r) for r in sorted(rows, key=lambda r: r["inv_index"])]
    try:
        return check_ops(ops, model_for(model_name), budget)
    except ModelError as exc:
        return KeyResult(UNKNOWN, len(ops), 0.0, error=str(exc))


def pair_events(rows: list[tuple[str, str, str, int, int, str | None, str | None]]) -> list[Op]:
    """Pair (process, type, f, index, time, value, error) events of one key into ops.

    An invoke left without a completion is an ``info`` op, as the contract says.
    """
    pending: dict[str, Op] = {}
    ops: list[Op] = []
    for process, typ, f, index, t, value, error in sorted(rows, key=lambda r: r[3]):
        if typ == "invoke":
            op = Op(process, f, "info", t, None, index, None, value)
            pending[process] = op
            ops.append(op)
            continue
        op = pending.pop(process, None)
        if op is None:
            continue
        op.type = typ
        op.error = error
        op.ret_index = index
        if typ == "ok":
            op.ret, op.result = t, value
        elif typ == "fail":
            op.ret = t
    return ops
