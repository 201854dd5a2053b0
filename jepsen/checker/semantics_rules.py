"""The ``delay``, ``txn``, ``retry`` and ``order`` rules as plain Python, for small histories.

``semantics_checker`` states the same rules as Spark queries; this module is its twin for the
histories ``analyze`` judges in-process, rule by rule in the same vocabulary: the same facts per
value (or per value and try, per queue offset, per lock window), the same candidates
``(anomaly, t, key, i1, i2, example)``, the same first examples by ``(t, key, i1, i2)`` and the
same example fields. The tests run both on every hand-made history and on real runs' histories
and require identical results. The rules themselves are in ``docs/history.md``.

Operation rows are the dicts ``inprocess.pair`` makes (the columns of ``frames.pair_ops``);
values are the JSON text the history held, read here as Spark's ``get_json_object`` and
``from_json`` read them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from jepsen.checker.log_rules import _drop_nulls, _nulls_first
from jepsen.checker.semantics_model import (
    DEFAULT_TOLERANCES,
    EXAMPLES,
    Tolerances,
    excused,
    fault_windows,
    quot,
)
from jepsen.checker.sparkjson import as_long, json_field, json_object

Row = dict[str, Any]
MS = 1_000_000
TYPE_CODE = {"ok": 3, "info": 2, "fail": 1}
CODE_TYPE = {3: "ok", 2: "info", 1: "fail"}


# --- reading values as Spark does -------------------------------------------------------------


def field_long(text: Any, name: str) -> int | None:
    """``get_json_object(text, '$.name').cast('long')``."""
    return json_field(text, name) if isinstance(text, str) else None


def field_str(text: Any, name: str) -> str | None:
    """``get_json_object(text, '$.name')`` of a string (other JSON as its text)."""
    obj = json_object(text) if isinstance(text, str) else None
    if obj is None or obj.get(name) is None:
        return None
    v = obj[name]
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v, separators=(",", ":"))


def longs(items: Any) -> list[int | None]:
    """One JSON array as ``array<bigint>``: a non-integer element is null."""
    if not isinstance(items, list):
        return []
    return [x if isinstance(x, int) and not isinstance(x, bool) else None for x in items]


def entries(text: Any) -> list[list[int | None]]:
    """``from_json(text, 'array<array<bigint>>')``: each entry ``[offset, value, store_ms, attempt]``."""
    if isinstance(text, str):
        try:
            obj = json.loads(text)
        except ValueError:
            return []
    else:
        obj = text
    if not isinstance(obj, list):
        return []
    out = []
    for e in obj:
        row = longs(e) if isinstance(e, list) else []
        out.append(row + [None] * (4 - len(row)) if len(row) < 4 else row[:4])
    return out


def strings(text: Any, name: str) -> list[str]:
    """``from_json(get_json_object(text, '$.name'), 'array<string>')`` (non-strings dropped)."""
    obj = json_object(text) if isinstance(text, str) else None
    items = obj.get(name) if obj is not None else None
    return [x for x in items if isinstance(x, str)] if isinstance(items, list) else []


def dump(obj: Any) -> dict[str, Any]:
    """An example as ``to_json`` then ``json.loads`` gives it: null fields left out."""
    return json.loads(json.dumps(_drop_nulls(obj), separators=(",", ":")))


def op_desc(o: Row | None) -> dict[str, Any] | None:
    """An operation in an example: who, what outcome, when."""
    if o is None:
        return None
    return {
        "process": o["process"],
        "f": o["f"],
        "type": o["type"],
        "invoke-index": o["inv_index"],
        "invoke-time": o["inv_time"],
        "complete-index": o["cmp_index"],
        "complete-time": o["cmp_time"],
    }


def cand(anomaly: str, t: Any, key: Any, i1: Any, i2: Any, example: dict[str, Any]) -> Row:
    return {"anomaly": anomaly, "t": t, "key": key, "i1": i1, "i2": i2, "ex": example}


def earliest(rows: Iterable[Row], *cols: str) -> Row | None:
    """The row with the smallest (cols...) tuple, nulls first (Spark's ``min(struct(...))``)."""
    best: Row | None = None
    best_k: tuple[Any, ...] | None = None
    for r in rows:
        k = tuple(_nulls_first(r[c]) for c in cols)
        if best_k is None or k < best_k:
            best, best_k = r, k
    return best


# --- what every workload reads ------------------------------------------------------------------


class Reads:
    """Every entry of the ok polls and drains, and each key's last drain."""

    def __init__(self, ops: list[Row]) -> None:
        self.entries: list[Row] = []
        self.last_drain: dict[str, Row] = {}
        for o in ops:
            if o["f"] not in ("poll", "drain") or o["type"] != "ok":
                continue
            if o["f"] == "drain":
                cur = self.last_drain.get(o["key"])
                if cur is None or (o["inv_time"], o["inv_index"]) > (cur["inv_time"], cur["inv_index"]):
                    self.last_drain[o["key"]] = o
            for pos, (off, v, store, attempt) in enumerate(entries(o["cmp_value"])):
                self.entries.append(
                    {
                        "key": o["key"],
                        "f": o["f"],
                        "process": o["process"],
                        "inv_index": o["inv_index"],
                        "inv_time": o["inv_time"],
                        "cmp_time": o["cmp_time"],
                        "pos": pos,
                        "off": off,
                        "v": v,
                        "store": store,
                        "attempt": attempt,
                    }
                )

    def in_last(self, e: Row) -> bool:
        ld = self.last_drain.get(e["key"])
        return e["f"] == "drain" and ld is not None and e["inv_index"] == ld["inv_index"]

    def final_time(self, keys: Iterable[str] | None = None) -> int | None:
        """When the earliest of the keys' last drains began (every key with one, by default)."""
        times = [d["inv_time"] for k, d in self.last_drain.items() if keys is None or k in keys]
        return min(times) if times else None


def read_facts(es: list[Row], reads: Reads) -> Row:
    """How one value was seen: reads, first completion, earliest store, positions, in a last drain."""
    seen = earliest(es, "cmp_time", "inv_index")
    return {
        "n_reads": len(es),
        "seen": seen,
        "t_read": min((e["inv_time"] for e in es), default=None),
        "key_read": min((e["key"] for e in es), default=None),
        "store": min((e["store"] for e in es if e["store"] is not None), default=None),
        "npos": len({(e["key"], e["off"]) for e in es}),
        "in_last": any(reads.in_last(e) for e in es),
    }


def seen_desc(seen: Row | None) -> dict[str, Any] | None:
    if seen is None:
        return None
    return {
        "process": seen["process"],
        "f": seen["f"],
        "invoke-index": seen["inv_index"],
        "complete-time": seen["cmp_time"],
    }


def send_type(sends: list[Row]) -> str | None:
    return CODE_TYPE.get(max((TYPE_CODE.get(s["type"], 0) for s in sends), default=0))


def value_checks(
    out: list[Row],
    base: dict[str, Any],
    t: Any,
    key: Any,
    v: Any,
    n_sends: int,
    s_type: str | None,
    rf: Row,
) -> None:
    """``duplicate``, ``unexpected``, ``G1a``, ``recovered`` and ``unseen-info`` of one value."""
    read = rf["n_reads"] > 0
    for name, hit in (
        ("duplicate", rf["npos"] > 1),
        ("unexpected", read and n_sends == 0),
        ("G1a", read and s_type == "fail"),
        ("recovered", read and s_type == "info"),
        ("unseen-info", not read and s_type == "info"),
    ):
        if hit:
            out.append(cand(name, t, key, v, None, dict(base)))


# --- delay ----------------------------------------------------------------------------------------


def delay_candidates(ops: list[Row], windows: list[tuple[int, int]], tol: Tolerances) -> list[Row]:
    reads = Reads(ops)
    sends: dict[Any, list[Row]] = defaultdict(list)
    for o in ops:
        if o["f"] == "send-delayed":
            v = field_long(o["inv_value"], "value")
            sends[v].append(
                {
                    **o,
                    "v": v,
                    "d": field_long(o["inv_value"], "delay-ms"),
                    "w": field_long(o["inv_value"], "wall-ms"),
                    "level": field_long(o["inv_value"], "level"),
                    "deliver": field_long(o["inv_value"], "deliver-ms"),
                }
            )
    by_v: dict[Any, list[Row]] = defaultdict(list)
    for e in reads.entries:
        by_v[e["v"]].append(e)
    out: list[Row] = []
    for v in set(sends) | set(by_v):
        ss = sends.get(v, [])
        s = earliest(ss, "inv_index")
        rf = read_facts(by_v.get(v, []), reads)
        s_type = send_type(ss)
        key = s["key"] if s is not None else rf["key_read"]
        t = s["inv_time"] if s is not None else rf["t_read"]
        ld = reads.last_drain.get(s["key"]) if s is not None else None
        d, w = (s["d"], s["w"]) if s is not None else (None, None)
        seen = rf["seen"]
        early_h = early_s = late = None
        if s is not None and d is not None and rf["n_reads"] > 0 and s["type"] in ("ok", "info"):
            if seen is not None and seen["cmp_time"] is not None and s["inv_time"] is not None:
                early_h = s["inv_time"] + d * MS - seen["cmp_time"]
            if w is not None and rf["store"] is not None:
                early_s = w + d - rf["store"]
        if (
            s is not None
            and s_type == "ok"
            and rf["n_reads"] > 0
            and d is not None
            and w is not None
            and rf["store"] is not None
            and s["cmp_time"] is not None
        ):
            store_h = s["inv_time"] + (rf["store"] - w) * MS
            due_h = s["cmp_time"] + d * MS
            late = (store_h - due_h, excused(windows, due_h, store_h))

        base: dict[str, Any] = {
            "key": key,
            "value": v,
            "level": s["level"] if s else None,
            "deliver-ms": s["deliver"] if s else None,
            "delay-ms": d,
            "wall-ms": w,
            "send": op_desc(s),
            "reads": rf["n_reads"],
            "first-seen": seen_desc(seen),
            "store-ms": rf["store"],
        }

        if (early_h is not None and early_h > tol.early_ms * MS) or (
            early_s is not None and early_s > tol.early_ms
        ):
            ex = dict(base)
            ex["seen-early-by-ms"] = quot(early_h, MS) if early_h is not None else None
            ex["stored-early-by-ms"] = early_s
            out.append(cand("delivered-early", t, key, v, None, ex))
        if late is not None and late[0] - late[1] > tol.late_ms * MS:
            ex = dict(base)
            ex["late-by-ms"] = quot(late[0], MS)
            ex["fault-ms"] = quot(late[1], MS)
            out.append(cand("delivered-late", t, key, v, None, ex))
        if (
            s_type == "ok"
            and s is not None
            and ld is not None
            and s["cmp_time"] is not None
            and ld["inv_time"] > s["cmp_time"]
            and not rf["in_last"]
        ):
            ex = dict(base)
            ex["missing-from-drain"] = {"invoke-index": ld["inv_index"], "invoke-time": ld["inv_time"]}
            out.append(cand("lost", t, key, v, None, ex))
        value_checks(out, base, t, key, v, len(ss), s_type, rf)
    return out


# --- txn --------------------------------------------------------------------------------------------


def txn_candidates(ops: list[Row]) -> list[Row]:
    reads = Reads(ops)
    halves: dict[Any, list[Row]] = defaultdict(list)
    said: dict[Any, list[Row]] = defaultdict(list)  # ends and checks: who said what, when
    queue_of: dict[Any, str] = {}
    for o in ops:
        if o["f"] == "send-half":
            v = field_long(o["inv_value"], "value")
            halves[v].append({**o, "outcome": field_str(o["inv_value"], "outcome")})
        elif o["f"] == "end":
            v = field_long(o["inv_value"], "value")
            said[v].append({**o, "says": field_str(o["inv_value"], "decision")})
            q = field_str(o["cmp_value"], "queue") if o["type"] in ("ok", "info") else None
            if q is not None and (v not in queue_of or q < queue_of[v]):
                queue_of[v] = q
        elif o["f"] == "check" and o["type"] == "ok":
            v = field_long(o["inv_value"], "value")
            said[v].append({**o, "says": field_str(o["cmp_value"], "answer")})
    by_v: dict[Any, list[Row]] = defaultdict(list)
    for e in reads.entries:
        by_v[e["v"]].append(e)
    final_t = reads.final_time()
    out: list[Row] = []
    for v in set(halves) | set(by_v) | set(said):
        hs = halves.get(v, [])
        h = earliest(hs, "inv_index")
        rf = read_facts(by_v.get(v, []), reads)
        ss = said.get(v, [])
        commit_t = min((o["inv_time"] for o in ss if o["says"] == "commit"), default=None)
        commit_ok = min(
            (o["cmp_time"] for o in ss if o["says"] == "commit" and o["f"] == "end" and o["type"] == "ok"),
            default=None,
        )
        rolled = any(o["says"] == "rollback" for o in ss)
        h_type = send_type(hs)
        key = queue_of.get(v) or rf["key_read"]
        t = h["inv_time"] if h is not None else rf["t_read"]
        seen = rf["seen"]

        base: dict[str, Any] = {
            "key": key,
            "value": v,
            "outcome": h["outcome"] if h else None,
            "half": op_desc(h),
            "commit-said-time": commit_t,
            "commit-acked-time": commit_ok,
            "rolled-back": rolled,
            "reads": rf["n_reads"],
            "first-seen": seen_desc(seen),
            "final-drain-time": final_t,
        }

        read = rf["n_reads"] > 0
        if commit_ok is not None and final_t is not None and final_t > commit_ok and not rf["in_last"]:
            out.append(cand("committed-not-visible", t, key, v, None, dict(base)))
        if read and rolled and commit_t is None:
            out.append(cand("rolled-back-visible", t, key, v, None, dict(base)))
        if (
            read
            and h_type in ("ok", "info")
            and not (rolled and commit_t is None)
            and (
                commit_t is None
                or (seen is not None and seen["cmp_time"] is not None and seen["cmp_time"] < commit_t)
            )
        ):
            out.append(cand("half-visible-before-commit", t, key, v, None, dict(base)))
        if (
            h is not None
            and h_type == "ok"
            and h["outcome"] == "commit"
            and not rolled
            and commit_ok is None
            and final_t is not None
            and h["cmp_time"] is not None
            and final_t > h["cmp_time"]
            and not rf["in_last"]
        ):
            out.append(cand("unresolved", t, key, v, None, dict(base)))
        value_checks(out, base, t, key, v, len(hs), h_type, rf)
    return out


# --- retry -------------------------------------------------------------------------------------------


def topic_kind(key: str) -> str:
    """``main``, ``retry`` (``%RETRY%...``) or ``dlq`` (``%DLQ%...``) by a key's topic."""
    if key.startswith("%RETRY%"):
        return "retry"
    if key.startswith("%DLQ%"):
        return "dlq"
    return "main"


def retry_candidates(ops: list[Row]) -> list[Row]:
    reads = Reads(ops)
    sends: dict[Any, list[Row]] = defaultdict(list)
    backs: dict[tuple[Any, Any], list[Row]] = defaultdict(list)
    acks: dict[Any, list[Row]] = defaultdict(list)
    for o in ops:
        if o["f"] == "send":
            sends[as_long(o["inv_value"])].append({**o, "v": as_long(o["inv_value"])})
        elif o["f"] == "send-back":
            v, a = field_long(o["inv_value"], "value"), field_long(o["inv_value"], "attempt")
            backs[(v, a)].append({**o, "max": field_long(o["inv_value"], "max")})
        elif o["f"] == "ack" and o["type"] == "ok":
            acks[field_long(o["inv_value"], "value")].append(o)
    main: dict[Any, list[Row]] = defaultdict(list)
    copies: dict[tuple[Any, Any], list[Row]] = defaultdict(list)
    dead: dict[Any, list[Row]] = defaultdict(list)
    for e in reads.entries:
        kind = topic_kind(e["key"])
        if kind == "main":
            main[e["v"]].append(e)
        elif kind == "retry":
            copies[(e["v"], e["attempt"])].append(e)
        else:
            dead[e["v"]].append(e)
    retry_final = reads.final_time([k for k in reads.last_drain if topic_kind(k) == "retry"])
    dlq_final = reads.final_time([k for k in reads.last_drain if topic_kind(k) == "dlq"])
    in_dlq = {e["v"] for es in dead.values() for e in es if reads.in_last(e)}
    out: list[Row] = []
    # per value
    copies_of: dict[Any, list[list[Row]]] = defaultdict(list)  # value -> its copies, per try
    for (cv, _), es in copies.items():
        copies_of[cv].append(es)
    every_v = set(sends) | set(main) | set(dead) | set(copies_of) | {v for v, _ in backs} | set(acks)
    for v in every_v:
        ss = sends.get(v, [])
        s = earliest(ss, "inv_index")
        all_es = main.get(v, []) + dead.get(v, []) + [e for es in copies_of.get(v, []) for e in es]
        rf = read_facts(main.get(v, []), reads)
        rf_all = read_facts(all_es, reads)
        s_type = send_type(ss)
        key = s["key"] if s is not None else rf_all["key_read"]
        t = s["inv_time"] if s is not None else rf_all["t_read"]
        ld = reads.last_drain.get(s["key"]) if s is not None else None
        acked = sorted({field_long(a["inv_value"], "attempt") for a in acks.get(v, [])} - {None})
        dlq_n = len(dead.get(v, []))
        dlq_pos = len({(e["key"], e["off"]) for e in dead.get(v, [])})
        copy_pos = max((len({(e["key"], e["off"]) for e in es}) for es in copies_of.get(v, [])), default=0)

        base: dict[str, Any] = {
            "key": key,
            "value": v,
            "send": op_desc(s),
            "reads": rf_all["n_reads"],
            "acked-attempts": acked or None,
            "in-dlq": dlq_n > 0,
        }

        if dlq_n > 0 and acked:
            out.append(cand("dlq-and-success", t, key, v, None, dict(base)))
        if (
            s_type == "ok"
            and s is not None
            and ld is not None
            and s["cmp_time"] is not None
            and ld["inv_time"] > s["cmp_time"]
            and not rf["in_last"]
        ):
            ex = dict(base)
            ex["missing-from-drain"] = {"invoke-index": ld["inv_index"], "invoke-time": ld["inv_time"]}
            out.append(cand("lost", t, key, v, None, ex))
        dup = {"npos": max(rf["npos"], dlq_pos, copy_pos), "n_reads": rf_all["n_reads"]}
        value_checks(out, base, t, key, v, len(ss), s_type, dup)
    # per value and try
    attempts = set(backs) | set(copies)
    for v, a in attempts:
        bs = backs.get((v, a), [])
        ok_back = earliest([b for b in bs if b["type"] == "ok"], "cmp_time", "inv_index")
        m = max((b["max"] for b in bs if b["max"] is not None), default=None)
        cs = copies.get((v, a), [])
        first_copy = earliest(cs, "cmp_time", "inv_index")

        base_a: dict[str, Any] = {
            "key": ok_back["key"] if ok_back is not None else (first_copy["key"] if first_copy else None),
            "value": v,
            "attempt": a,
            "max": m,
            "send-back": op_desc(ok_back),
            "copy": seen_desc(first_copy),
        }

        where = (
            ok_back["key"] if ok_back is not None else (first_copy["key"] if first_copy is not None else None)
        )
        if ok_back is not None and m is not None and a is not None:
            t = ok_back["inv_time"]
            if (
                a < m
                and not copies.get((v, a + 1))
                and retry_final is not None
                and ok_back["cmp_time"] is not None
                and retry_final > ok_back["cmp_time"]
            ):
                out.append(cand("never-redelivered", t, where, v, a, dict(base_a)))
            if (
                a >= m
                and dlq_final is not None
                and ok_back["cmp_time"] is not None
                and dlq_final > ok_back["cmp_time"]
                and v not in in_dlq
            ):
                ex = dict(base_a)
                ex["why"] = "not in the dead-letter drain"
                out.append(cand("past-max-not-in-dlq", t, where, v, a, ex))
        if first_copy is not None and a is not None:
            t = first_copy["inv_time"]
            before = backs.get((v, a - 1), [])
            if a >= 1 and not any(b["type"] in ("ok", "info") for b in before):
                ex = dict(base_a)
                ex["acked-before"] = any(
                    field_long(x["inv_value"], "attempt") == a - 1 for x in acks.get(v, [])
                )
                out.append(cand("redelivered-after-success", t, where, v, a, ex))
            m_any = max((b["max"] for b in before if b["max"] is not None), default=None)
            if m_any is not None and a > m_any:
                ex = dict(base_a)
                ex["max"] = m_any
                ex["why"] = "retried past its last try"
                out.append(cand("past-max-not-in-dlq", t, where, v, a, ex))
    return out


# --- order --------------------------------------------------------------------------------------------


def order_candidates(ops: list[Row], tol: Tolerances) -> list[Row]:
    reads = Reads(ops)
    out: list[Row] = []
    sends: dict[Any, list[Row]] = defaultdict(list)
    ok_by_key: dict[str, list[Row]] = defaultdict(list)
    consumed: dict[str, dict[Any, Row]] = defaultdict(dict)  # key -> offset -> first consumption
    positions: dict[Any, set[tuple[str, Any]]] = defaultdict(set)
    read_es: dict[Any, list[Row]] = defaultdict(list)
    windows: list[Row] = []
    unlocks: list[Row] = []
    for o in ops:
        f = o["f"]
        if f == "send":
            s = {**o, "v": as_long(o["inv_value"]), "off": o["offset"]}
            sends[s["v"]].append(s)
            if o["type"] == "ok" and o["offset"] is not None:
                ok_by_key[o["key"]].append(s)
                positions[s["v"]].add((o["key"], o["offset"]))
        elif f == "consume" and o["type"] == "ok":
            who = field_str(o["inv_value"], "consumer")
            obj = json_object(o["inv_value"]) or {}
            for pos, (off, v, _store, _a) in enumerate(entries(obj.get("messages"))):
                if off is None:
                    continue
                first = {
                    "inv_time": o["inv_time"],
                    "inv_index": o["inv_index"],
                    "pos": pos,
                    "off": off,
                    "consumer": who,
                }
                cur = consumed[o["key"]].get(off)
                if cur is None or (first["inv_time"], first["inv_index"], pos) < (
                    cur["inv_time"],
                    cur["inv_index"],
                    cur["pos"],
                ):
                    consumed[o["key"]][off] = first
                positions[v].add((o["key"], off))
                read_es[v].append({"key": o["key"], "inv_time": o["inv_time"]})
        elif f == "lock" and o["type"] == "ok":
            who = field_str(o["inv_value"], "consumer")
            live = field_long(o["inv_value"], "live-ms")
            for k in strings(o["cmp_value"], "granted"):
                if live is None or o["cmp_time"] is None or who is None:
                    continue
                windows.append(
                    {
                        "key": k,
                        "consumer": who,
                        "inv_time": o["inv_time"],
                        "start": o["cmp_time"],
                        "expiry": o["inv_time"] + (live - tol.lock_ms) * MS,
                    }
                )
        elif f == "unlock":
            who = field_str(o["inv_value"], "consumer")
            for k in strings(o["inv_value"], "queues") if who is not None else []:
                unlocks.append({"key": k, "consumer": who, "inv_time": o["inv_time"]})
    # stored out of order: walk each key's offsets from the top, with the earliest completion above
    for key, ss in ok_by_key.items():
        by_off: dict[Any, list[Row]] = defaultdict(list)
        for s in ss:
            by_off[s["off"]].append(s)
        best: Row | None = None
        for off in sorted(by_off, reverse=True):
            for s in by_off[off]:
                if best is not None and s["inv_time"] is not None and best["cmp_time"] < s["inv_time"]:
                    ex = {
                        "key": key,
                        "kind": "stored",
                        "later-lower": {**op_desc(s), "value": s["v"], "offset": off},  # type: ignore[dict-item]
                        "completed-before": {**op_desc(best), "value": best["v"], "offset": best["off"]},  # type: ignore[dict-item]
                    }
                    out.append(cand("order-broken", s["inv_time"], key, s["inv_index"], 0, ex))
            top = earliest([s for s in by_off[off] if s["cmp_time"] is not None], "cmp_time", "inv_index")
            if top is not None and (
                best is None or (top["cmp_time"], top["inv_index"]) < (best["cmp_time"], best["inv_index"])
            ):
                best = top
    # consumed out of order: a message first consumed after a later one (or never, while one was)
    for key in set(consumed) | {k for k in reads.last_drain}:
        firsts = consumed.get(key, {})
        ld = reads.last_drain.get(key)
        existing = set(firsts)
        if ld is not None:
            existing |= {off for off, *_ in entries(ld["cmp_value"]) if off is not None}
        later: Row | None = None
        for off in sorted(existing, reverse=True):
            mine = firsts.get(off)
            if later is not None and (
                mine is None
                or (mine["inv_time"], mine["inv_index"], mine["pos"])
                > (later["inv_time"], later["inv_index"], later["pos"])
            ):
                ex = {
                    "key": key,
                    "kind": "consumed",
                    "offset": off,
                    "first-consumed": (
                        {
                            "invoke-index": mine["inv_index"],
                            "invoke-time": mine["inv_time"],
                            "consumer": mine["consumer"],
                        }
                        if mine
                        else None
                    ),
                    "overtaken-by": {
                        "offset": later["off"],
                        "invoke-index": later["inv_index"],
                        "invoke-time": later["inv_time"],
                        "consumer": later["consumer"],
                    },
                }
                out.append(cand("order-broken", later["inv_time"], key, off, 1, ex))
            if mine is not None and (
                later is None
                or (mine["inv_time"], mine["inv_index"], mine["pos"])
                < (later["inv_time"], later["inv_index"], later["pos"])
            ):
                later = mine
    out.extend(lock_overlaps(windows, unlocks))
    # per value: lost, duplicate, unexpected, G1a
    for e in reads.entries:
        positions[e["v"]].add((e["key"], e["off"]))
        read_es[e["v"]].append({"key": e["key"], "inv_time": e["inv_time"]})
    in_last = {e["v"] for e in reads.entries if reads.in_last(e)}
    for v in set(sends) | set(read_es):
        ss = sends.get(v, [])
        s = earliest(ss, "inv_index")
        rs = read_es.get(v, [])
        s_type = send_type(ss)
        key = s["key"] if s is not None else min(r["key"] for r in rs)
        t = s["inv_time"] if s is not None else min(r["inv_time"] for r in rs)
        ld = reads.last_drain.get(s["key"]) if s is not None else None

        base: dict[str, Any] = {
            "key": key,
            "value": v,
            "send": op_desc(s),
            "offsets": sorted({off for _, off in positions.get(v, set())} - {None}) or None,
        }

        if (
            s_type == "ok"
            and s is not None
            and ld is not None
            and s["cmp_time"] is not None
            and ld["inv_time"] > s["cmp_time"]
            and v not in in_last
        ):
            ex = dict(base)
            ex["missing-from-drain"] = {"invoke-index": ld["inv_index"], "invoke-time": ld["inv_time"]}
            out.append(cand("lost", t, key, v, None, ex))
        rf = {"npos": len(positions.get(v, set())), "n_reads": len(rs)}
        value_checks(out, base, t, key, v, len(ss), s_type, rf)
    return out


def lock_overlaps(windows: list[Row], unlocks: list[Row]) -> list[Row]:
    """Lock windows per (queue, consumer), merged, then overlaps between two consumers'."""
    unlocked: dict[tuple[str, Any], list[Any]] = defaultdict(list)  # (queue, consumer) -> unlock times
    for u in unlocks:
        unlocked[(u["key"], u["consumer"])].append(u["inv_time"])
    by: dict[tuple[str, Any], list[tuple[Any, Any]]] = defaultdict(list)
    for w in windows:
        ends = [t for t in unlocked.get((w["key"], w["consumer"]), []) if t >= w["inv_time"]]
        end = min([w["expiry"], *ends])
        if end > w["start"]:
            by[(w["key"], w["consumer"])].append((w["start"], end))
    islands: dict[str, list[tuple[Any, Any, Any]]] = defaultdict(list)  # key -> (start, end, consumer)
    for (key, who), spans in by.items():
        spans.sort()
        cur: list[Any] | None = None
        for s, e in spans:
            if cur is not None and s <= cur[1]:
                cur[1] = max(cur[1], e)
            else:
                if cur is not None:
                    islands[key].append((cur[0], cur[1], who))
                cur = [s, e]
        if cur is not None:
            islands[key].append((cur[0], cur[1], who))
    out = []
    for key, isl in islands.items():
        for a in isl:
            for b in isl:
                if a[2] is None or b[2] is None or not a[2] < b[2]:
                    continue
                if a[0] < b[1] and b[0] < a[1]:
                    start, end = max(a[0], b[0]), min(a[1], b[1])
                    ex = {
                        "key": key,
                        "overlap-from": start,
                        "overlap-to": end,
                        "first": {"consumer": a[2], "from": a[0], "to": a[1]},
                        "second": {"consumer": b[2], "from": b[0], "to": b[1]},
                    }
                    out.append(cand("two-consumers-one-queue", start, key, a[0], b[0], ex))
    return out


# --- a whole history --------------------------------------------------------------------------


def stats(workload: str, ops: list[Row]) -> dict[str, Any]:
    """The report's figures (``semantics_checker.stats`` on Spark)."""
    reads = Reads(ops)
    out: dict[str, Any] = {
        "entries-read": len(reads.entries),
        "keys-drained": len(reads.last_drain),
    }
    if workload == "order":
        out["consumers"] = len(
            {field_str(o["inv_value"], "consumer") for o in ops if o["f"] == "consume"} - {None}
        )
    return out


def select(cands: list[Row]) -> dict[str, Any]:
    """Counts and the first EXAMPLES per anomaly by (t, key, i1, i2)."""
    by: dict[str, list[Row]] = defaultdict(list)
    for c in cands:
        by[c["anomaly"]].append(c)
    res: dict[str, Any] = {"anomalies": {}, "counts": {}}
    for name in sorted(by):
        cs = sorted(by[name], key=lambda c: tuple(_nulls_first(c[k]) for k in ("t", "key", "i1", "i2")))
        res["counts"][name] = len(cs)
        res["anomalies"][name] = [dump(c["ex"]) for c in cs[:EXAMPLES]]
    return res


def check_history(
    workload: str, rows: list[Row], tolerances: Tolerances = DEFAULT_TOLERANCES
) -> dict[str, Any]:
    """One history's rows (operations and nemesis events) -> ``{"anomalies", "counts", "stats"}``."""
    ops = [r for r in rows if r["kind"] == "op"]
    if workload == "delay":
        nemesis = [
            (r["inv_index"], r["inv_time"], r["f"], r["inv_value"]) for r in rows if r["kind"] == "nemesis"
        ]
        cands = delay_candidates(ops, fault_windows(nemesis, tolerances.fault_grace_ms), tolerances)
    elif workload == "txn":
        cands = txn_candidates(ops)
    elif workload == "retry":
        cands = retry_candidates(ops)
    elif workload == "order":
        cands = order_candidates(ops, tolerances)
    else:
        raise ValueError(f"no semantics rules for workload {workload!r}")
    return {**select(cands), "stats": stats(workload, ops)}
