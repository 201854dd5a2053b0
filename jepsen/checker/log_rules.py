"""The ``log`` workload's anomaly rules as plain Python over one key's operations.

``log_checker`` states every rule of docs/history.md as Spark queries, which pays
off from a few hundred thousand operations on. Below that, the JVM and Spark's
start-up cost far more than the check itself (13-17 s for a history Python judges
in a fraction of a second), so small histories are judged here, in-process.

A small history must never be judged by different rules than a large one, so this
module mirrors ``log_checker`` rule by rule, in its vocabulary (candidates with
i1..i4/s1, the same example selection and the same example JSON), and the tests
run both on every anomaly history and on synthetic ones and require identical
counts, verdicts and stats. Every rule is per (file, key), as in the Spark plans,
so one function judges one key and the per-key findings merge by addition.

Operation rows are dicts with the columns of ``frames.pair_ops`` (``process`` as
text, ``inv_value``/``cmp_value`` as the JSON text the history held).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from jepsen.checker.log_checker import EXAMPLES, VALUE_ANOMALIES
from jepsen.checker.sparkjson import as_long, json_field, json_object

Row = dict[str, Any]
# Selection groups: lost-write examples are picked separately for the drain and the
# reach rule (as the Spark path does), then merged.
_LOST_REACH = "lost-write/reach"


def _pairs(text: str | None) -> list[tuple[int | None, int | None]]:
    """``from_json(text, 'array<array<bigint>>')``: malformed parts become nulls."""
    if not text:
        return []
    try:
        obj = json.loads(text)
    except ValueError:
        return []
    if not isinstance(obj, list):
        return []
    out = []
    for p in obj:
        if not isinstance(p, list):
            out.append((None, None))
            continue
        a = p[0] if len(p) > 0 and isinstance(p[0], int) and not isinstance(p[0], bool) else None
        b = p[1] if len(p) > 1 and isinstance(p[1], int) and not isinstance(p[1], bool) else None
        out.append((a, b))
    return out


def _dump(obj: Any) -> str:
    """Spark's ``to_json``: compact, null struct fields left out."""
    return json.dumps(_drop_nulls(obj), separators=(",", ":"), ensure_ascii=False)


def _drop_nulls(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_drop_nulls(v) for v in obj]
    return obj


def send_desc(s: Row) -> dict[str, Any]:
    return {
        "process": s["process"],
        "f": s["f"],
        "type": s["type"],
        "value": s["v"],
        "offset": s["off"],
        "invoke-index": s["inv_index"],
        "invoke-time": s["inv_time"],
        "complete-index": s["cmp_index"],
        "complete-time": s["cmp_time"],
    }


def read_desc(r: Row | None) -> dict[str, Any]:
    r = r or {}
    return {
        "process": r.get("process"),
        "f": r.get("f"),
        "type": "ok",
        "from": r.get("from_"),
        "max": r.get("max_"),
        "returned": r.get("n"),
        "first-offset": r.get("first"),
        "last-offset": r.get("last"),
        "invoke-index": r.get("inv_index"),
        "invoke-time": r.get("inv_time"),
        "complete-index": r.get("cmp_index"),
        "complete-time": r.get("cmp_time"),
    }


def _nulls_first(x: Any) -> tuple[int, Any]:
    return (0, 0) if x is None else (1, x)


@dataclass(slots=True)
class KeyFrames:
    """One key's sends, reads and returned pairs (``log_checker.LogFrames`` for one key)."""

    key: str
    sends: list[Row] = field(default_factory=list)
    ok_sends: list[Row] = field(default_factory=list)
    reads: list[Row] = field(default_factory=list)
    pairs: list[Row] = field(default_factory=list)

    @classmethod
    def build(cls, key: str, ops: list[Row]) -> KeyFrames:
        fr = cls(key)
        for o in ops:
            if o["f"] == "send":
                s = {
                    "process": o["process"],
                    "f": "send",
                    "type": o["type"],
                    "v": as_long(o["inv_value"]),
                    "off": o["offset"],
                    "inv_index": o["inv_index"],
                    "inv_time": o["inv_time"],
                    "cmp_index": o["cmp_index"],
                    "cmp_time": o["cmp_time"],
                }
                fr.sends.append(s)
                if s["type"] == "ok" and s["off"] is not None:
                    fr.ok_sends.append(s)
            elif o["f"] in ("poll", "drain") and o["type"] == "ok":
                args = json_object(o["inv_value"])
                from_ = json_field(None, "from", args) if args is not None else None
                from_ = 0 if from_ is None else from_
                max_ = json_field(None, "max", args) if args is not None else None
                pairs = _pairs(o["cmp_value"])
                n = len(pairs)
                last = pairs[-1][0] if n else None
                r = {
                    "process": o["process"],
                    "f": o["f"],
                    "inv_index": o["inv_index"],
                    "inv_time": o["inv_time"],
                    "cmp_index": o["cmp_index"],
                    "cmp_time": o["cmp_time"],
                    "from_": from_,
                    "max_": max_,
                    "n": n,
                    "first": pairs[0][0] if n else None,
                    "last": last,
                    "reach": last if n else from_ - 1,
                    # a drain page short of its max ends its drain; a drain with no max (one event) too
                    "claims_end": max_ is None or n < max_,
                }
                fr.reads.append(r)
                for pos, (off, v) in enumerate(pairs):
                    fr.pairs.append(
                        {
                            "process": o["process"],
                            "f": o["f"],
                            "inv_index": o["inv_index"],
                            "inv_time": o["inv_time"],
                            "from_": from_,
                            "pos": pos,
                            "off": off,
                            "v": v,
                        }
                    )
        return fr


def _cand(anomaly: str, t: Any, i1=None, i2=None, i3=None, i4=None, s1=None) -> Row:  # noqa: ANN001
    return {"anomaly": anomaly, "t": t, "i1": i1, "i2": i2, "i3": i3, "i4": i4, "s1": s1}


# --- per value ------------------------------------------------------------------------------


def final_drain(reads: list[Row]) -> tuple[Row | None, set[Any]]:
    """The key's last whole drain: its first page, and the invoke indexes of all its pages.

    A drain is an ok ``drain`` from offset 0 and the ok ``drain`` pages of the same process
    after it, up to that process's next drain from 0 (docs/history.md, "Drain pages"); it is
    whole when its last page claims the end (a one-event drain, with no max, always does).
    The last whole drain is the one whose first page was invoked last (``log_checker``'s
    ``last_drains``, the same rule in Spark).
    """
    drains = sorted((r for r in reads if r["f"] == "drain"), key=lambda r: _nulls_first(r["inv_index"]))
    runs: dict[Any, list[Row]] = {}  # process -> its current drain's pages
    whole: list[list[Row]] = []
    for r in drains:
        if r["from_"] == 0:
            runs[r["process"]] = cur = [r]
            whole.append(cur)
        elif r["process"] in runs:
            runs[r["process"]].append(r)
    whole = [d for d in whole if d[-1]["claims_end"]]
    if not whole:
        return None, set()
    last = max(whole, key=lambda d: (d[0]["inv_time"], d[0]["inv_index"]))
    return last[0], {r["inv_index"] for r in last}


def value_facts(fr: KeyFrames) -> tuple[dict[Any, Row], Row | None]:
    """Per value: how it was sent and where it was seen; and the key's last drain."""
    ld, ld_pages = final_drain(fr.reads)
    facts: dict[Any, Row] = {}

    def fact(v: Any) -> Row:
        f = facts.get(v)
        if f is None:
            f = facts[v] = {
                "v": v,
                "n_sends": 0,
                "tc": 0,
                "ack_off": None,
                "ack_t": None,
                "t": None,
                "n_reads": 0,
                "lo": None,
                "hi": None,
                "in_last": 0,
            }
        return f

    def upd(f: Row, name: str, x: Any, pick: Any) -> None:
        if x is not None:
            f[name] = x if f[name] is None else pick(f[name], x)

    code = {"ok": 3, "info": 2, "fail": 1}
    for s in fr.sends:
        f = fact(s["v"])
        f["n_sends"] += 1
        f["tc"] = max(f["tc"], code.get(s["type"], 0))
        ok = s["type"] == "ok"
        off = s["off"] if ok else None
        upd(f, "ack_off", off, max)
        upd(f, "ack_t", s["cmp_time"] if ok else None, max)
        upd(f, "t", s["inv_time"], min)
        upd(f, "lo", off, min)
        upd(f, "hi", off, max)
    for p in fr.pairs:
        f = fact(p["v"])
        f["n_reads"] += 1
        upd(f, "t", p["inv_time"], min)
        upd(f, "lo", p["off"], min)
        upd(f, "hi", p["off"], max)
        if p["f"] == "drain" and p["inv_index"] in ld_pages:
            f["in_last"] = 1
    for f in facts.values():
        f["s_type"] = {3: "ok", 2: "info", 1: "fail"}.get(f.pop("tc"))
    return facts, ld


def value_candidates(facts: dict[Any, Row], ld: Row | None) -> list[Row]:
    out = []
    for f in facts.values():
        read = f["n_reads"] > 0
        st = f["s_type"]
        flags = []
        if f["lo"] is not None and f["hi"] is not None and f["lo"] != f["hi"]:
            flags.append("duplicate")
        if read and f["n_sends"] == 0:
            flags.append("unexpected")
        if read and st == "fail":
            flags.append("G1a")
        if (
            st == "ok"
            and ld is not None
            and f["ack_t"] is not None
            and ld["inv_time"] > f["ack_t"]
            and f["in_last"] == 0
        ):
            flags.append("lost-write")
        if read and st == "info":
            flags.append("recovered")
        if not read and st == "info":
            flags.append("unseen-info")
        for a in flags:
            lost = a == "lost-write"
            out.append(
                _cand(
                    a,
                    f["t"],
                    i1=f["v"],
                    i2=ld["inv_index"] if lost and ld else None,
                    i3=ld["inv_time"] if lost and ld else None,
                    s1="drain" if lost else None,
                )
            )
    return out


def lost_by_reach(fr: KeyFrames, facts: dict[Any, Row], ld: Row | None) -> list[Row]:
    unread = [
        f
        for f in facts.values()
        if f["s_type"] == "ok"
        and f["n_reads"] == 0
        and f["ack_off"] is not None
        and (ld is None or f["ack_t"] is None or ld["inv_time"] <= f["ack_t"])
    ]
    if not unread or not fr.reads:
        return []
    # reads by invoke time, descending; a suffix maximum of (reach, index) per position
    reads = sorted(fr.reads, key=lambda r: r["inv_time"], reverse=True)
    best: list[tuple[Any, Any]] = []
    cur: tuple[Any, Any] | None = None
    for r in reads:
        c = (_nulls_first(r["reach"]), _nulls_first(r["inv_index"]))
        cur = c if cur is None or c > cur else cur
        best.append(cur)
    times = [r["inv_time"] for r in reads]
    out = []
    for f in unread:
        t = f["ack_t"]
        if t is None:
            continue
        # the reads invoked strictly after the ack: a prefix of the descending list
        lo, hi = 0, len(times)
        while lo < hi:
            mid = (lo + hi) // 2
            if times[mid] > t:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            continue
        (rf, reach), (xf, idx) = best[lo - 1]
        if rf and reach >= f["ack_off"]:
            out.append(_cand("lost-write", t, i1=f["v"], i2=idx if xf else None, i3=reach, s1="reach"))
    return out


def inconsistent_offsets(fr: KeyFrames, facts: dict[Any, Row]) -> list[Row]:
    by_off: dict[Any, list[Any]] = {}

    def add(off: Any, v: Any, t: Any) -> None:
        e = by_off.setdefault(off, [None, None, None])
        if v is not None:
            e[0] = v if e[0] is None else min(e[0], v)
            e[1] = v if e[1] is None else max(e[1], v)
        if t is not None:
            e[2] = t if e[2] is None else min(e[2], t)

    multi = set()
    for f in facts.values():
        if f["lo"] is None or f["hi"] is None:
            continue
        if f["lo"] == f["hi"]:
            add(f["lo"], f["v"], f["t"])
        elif f["v"] is not None:
            multi.add(f["v"])
    if multi:
        for s in fr.ok_sends:
            if s["v"] in multi:
                add(s["off"], s["v"], s["inv_time"])
        for p in fr.pairs:
            if p["v"] in multi:
                add(p["off"], p["v"], p["inv_time"])
    return [
        _cand("inconsistent-offsets", t, i1=off)
        for off, (lo, hi, t) in by_off.items()
        if lo is not None and hi is not None and lo != hi
    ]


def realtime_and_stale(fr: KeyFrames) -> list[Row]:
    """Walk offsets top-down with the earliest completion of any strictly higher point."""
    pts = [(s["off"], 1, s["cmp_time"], s["inv_time"], s["inv_index"], s["process"]) for s in fr.ok_sends]
    pts += [
        (r["reach"], 0, None, r["inv_time"], r["inv_index"], r["process"])
        for r in fr.reads
        if r["claims_end"]
    ]
    # offsets descending (nulls last), polls before acks at one offset
    pts.sort(key=lambda p: (p[0] is None, -(p[0] or 0), p[1], p[4]))
    out = []
    first_ack = None
    for off, ordn, ack_t, inv_time, idx, process in pts:
        if first_ack is not None and inv_time is not None and first_ack < inv_time:
            name = "realtime-order" if ordn == 1 else "stale-read"
            out.append(_cand(name, inv_time, i1=idx, i2=first_ack, i3=off, s1=process))
        if ack_t is not None:
            first_ack = ack_t if first_ack is None else min(first_ack, ack_t)
    return out


def nonmonotonic_sends(fr: KeyFrames) -> list[Row]:
    out = []
    by_proc: dict[str, list[Row]] = defaultdict(list)
    for s in fr.ok_sends:
        by_proc[s["process"]].append(s)
    for sends in by_proc.values():
        sends.sort(key=lambda s: s["inv_index"])
        for prev, s in zip(sends, sends[1:], strict=False):
            if s["off"] < prev["off"]:
                out.append(_cand("nonmonotonic-send", s["inv_time"], i1=s["inv_index"], i2=prev["inv_index"]))
    return out


def poll_order(fr: KeyFrames) -> list[Row]:
    out = []
    by_proc: dict[str, list[Row]] = defaultdict(list)
    for p in fr.pairs:
        if p["f"] == "poll":
            by_proc[p["process"]].append(p)
    for pairs in by_proc.values():
        pairs.sort(key=lambda p: (p["inv_index"], p["pos"]))
        prev: Row | None = None
        for p in pairs:
            prev_off = prev["off"] if prev is not None else None
            prev_index = prev["inv_index"] if prev is not None else None
            prev = p
            off = p["off"]
            lb = prev_off + 1 if prev_off is not None else p["from_"]
            if off is None:
                continue
            if prev_off is not None and off <= prev_off:
                out.append(
                    _cand(
                        "nonmonotonic-poll",
                        p["inv_time"],
                        i1=p["inv_index"],
                        i2=prev_index,
                        i3=off,
                        i4=prev_off,
                    )
                )
            elif lb is not None and off > lb:
                out.append(
                    _cand("poll-skip?", p["inv_time"], i1=p["inv_index"], i2=prev_index, i3=off, i4=lb)
                )
    return out


# --- examples -------------------------------------------------------------------------------


def _first(cands: list[Row], key: str) -> list[Row]:
    """The first EXAMPLES by (t, key, i1), as ``log_checker._first`` orders them."""
    return sorted(cands, key=lambda c: (_nulls_first(c["t"]), key, _nulls_first(c["i1"])))[:EXAMPLES]


def _sightings(fr: KeyFrames, on: str, what: Any) -> tuple[list[Any], list[str]]:
    """(sorted distinct offsets or values, the first EXAMPLES operations as JSON text)."""
    seen: set[Any] = set()
    ops: list[tuple[Any, str]] = []
    other = "off" if on == "v" else "v"
    for s in fr.sends if on == "v" else fr.ok_sends:
        if s[on] == what:
            if s[other] is not None:
                seen.add(s[other])
            ops.append((s["inv_time"], _dump(send_desc(s))))
    for p in fr.pairs:
        if p[on] == what:
            if p[other] is not None:
                seen.add(p[other])
            desc = {
                "process": p["process"],
                "f": p["f"],
                "type": "ok",
                "value": p["v"],
                "offset": p["off"],
                "invoke-index": p["inv_index"],
                "invoke-time": p["inv_time"],
            }
            ops.append((p["inv_time"], _dump(desc)))
    ops.sort(key=lambda x: (_nulls_first(x[0]), x[1]))
    return sorted(seen), [o for _, o in ops[:EXAMPLES]]


def _earliest_higher_ack(fr: KeyFrames, c: Row) -> Row | None:
    acks = [a for a in fr.ok_sends if a["cmp_time"] == c["i2"] and c["i3"] is not None and a["off"] > c["i3"]]
    if not acks:
        return None
    return min(acks, key=lambda a: (-a["off"], a["inv_index"]))


class _Key:
    """One key's lookups by invoke index."""

    def __init__(self, fr: KeyFrames) -> None:
        self.fr = fr
        self.ok_by_index = {s["inv_index"]: s for s in fr.ok_sends}
        self.read_by_index = {r["inv_index"]: r for r in fr.reads}


Found = tuple[Any, Any, str]  # (selection order, t, example JSON text)


def examples(fr: KeyFrames, cands: list[Row]) -> tuple[dict[str, int], dict[str, list[Found]]]:
    """Counts per anomaly and each selection group's first examples as (selection order, t, JSON).

    The selection order is the Spark path's: (t, key, i1) for the candidates' first
    examples, (t, example) for the confirmed anomalies.
    """
    k = fr.key
    idx = _Key(fr)
    by: dict[str, list[Row]] = defaultdict(list)
    for c in cands:
        by[c["anomaly"]].append(c)
    counts = {a: len(cs) for a, cs in by.items() if a not in ("realtime-order", "poll-skip?")}
    ex: dict[str, list[Found]] = defaultdict(list)

    def sel(c: Row) -> Any:
        return (_nulls_first(c["t"]), k, _nulls_first(c["i1"]))

    for a in VALUE_ANOMALIES:
        top = _first([c for c in by.get(a, []) if c["s1"] in (None, "drain")], k)
        for c in top:
            if c["i1"] is None:
                continue
            seen_at, ops = _sightings(fr, "v", c["i1"])
            lost = a == "lost-write"
            example = {
                "key": k,
                "value": c["i1"],
                "offsets": seen_at if a == "duplicate" else None,
                "missing-from-drain": {"invoke-index": c["i2"], "invoke-time": c["i3"]} if lost else None,
                "ops_json": ops,
            }
            ex[a].append((sel(c), c["t"], _dump(example)))
    for c in _first([c for c in by.get("lost-write", []) if c["s1"] == "reach"], k):
        r = idx.read_by_index.get(c["i2"])
        if r is None:
            continue
        for s in fr.sends:
            if s["v"] == c["i1"]:
                example = {
                    "key": k,
                    "value": s["v"],
                    "why": "never read, though a read invoked after the ack reached past its offset",
                    "send": send_desc(s),
                    "read": read_desc(r),
                }
                ex[_LOST_REACH].append((sel(c), c["t"], _dump(example)))
    for c in _first(by.get("inconsistent-offsets", []), k):
        values, ops = _sightings(fr, "off", c["i1"])
        example = {"key": k, "offset": c["i1"], "values": values, "ops_json": ops}
        ex["inconsistent-offsets"].append((sel(c), c["t"], _dump(example)))
    for c in _first(by.get("stale-read", []), k):
        a = _earliest_higher_ack(fr, c)
        r = idx.read_by_index.get(c["i1"])
        if a is None or r is None:
            continue
        example = {"key": k, "reached": c["i3"], "read": read_desc(r), "acknowledged-before": send_desc(a)}
        ex["stale-read"].append((sel(c), c["t"], _dump(example)))
    for c in _first(by.get("nonmonotonic-send", []), k):
        later, earlier = idx.ok_by_index.get(c["i1"]), idx.ok_by_index.get(c["i2"])
        if later is None or earlier is None:
            continue
        example = {"key": k, "earlier": send_desc(earlier), "later": send_desc(later)}
        ex["nonmonotonic-send"].append((sel(c), c["t"], _dump(example)))
    for c in _first(by.get("nonmonotonic-poll", []), k):
        r = idx.read_by_index.get(c["i1"])
        if r is None:
            continue
        example = {
            "key": k,
            "previous-offset": c["i4"],
            "offset": c["i3"],
            "earlier-poll": read_desc(idx.read_by_index.get(c["i2"])),
            "poll": read_desc(r),
        }
        ex["nonmonotonic-poll"].append((sel(c), c["t"], _dump(example)))
    confirmed = _confirm_realtime(fr, idx, by.get("realtime-order", []))
    if confirmed:
        counts["realtime-order"] = len(confirmed)
        ex["realtime-order"] = confirmed
    skips = _confirm_poll_skips(fr, idx, by.get("poll-skip?", []))
    if skips:
        counts["poll-skip"] = len(skips)
        ex["poll-skip"] = skips
    return counts, dict(ex)


def _confirm_realtime(fr: KeyFrames, idx: _Key, cands: list[Row]) -> list[Found]:
    """A later-lower send counts only if another process acknowledged higher before it began."""
    out = []
    for c in cands:
        a = _earliest_higher_ack(fr, c)
        b = idx.ok_by_index.get(c["i1"])
        if a is None or b is None:
            continue
        if a["process"] == b["process"]:
            others = [
                x
                for x in fr.ok_sends
                if x["process"] != b["process"]
                and x["cmp_time"] is not None
                and b["inv_time"] is not None
                and x["cmp_time"] < b["inv_time"]
                and x["off"] > b["off"]
            ]
            if not others:
                continue
            a = min(others, key=lambda x: (-x["off"], x["inv_index"]))
        example = {"key": fr.key, "completed-before": send_desc(a), "later-lower": send_desc(b)}
        text = _dump(example)
        out.append(((_nulls_first(b["inv_time"]), text), b["inv_time"], text))
    return out


def _confirm_poll_skips(fr: KeyFrames, idx: _Key, cands: list[Row]) -> list[Found]:
    """Keep the jumps over an offset known to exist (acknowledged or read)."""
    if not cands:
        return []
    import bisect

    known = sorted({s["off"] for s in fr.ok_sends} | {p["off"] for p in fr.pairs if p["off"] is not None})
    out = []
    for c in cands:
        below_lb = bisect.bisect_left(known, c["i4"])
        below_hi = bisect.bisect_left(known, c["i3"])
        if below_hi <= below_lb:
            continue
        r = idx.read_by_index.get(c["i1"])
        if r is None:
            continue
        example = {
            "key": fr.key,
            "expected-from": c["i4"],
            "got": c["i3"],
            "skipped-known-offsets": below_hi - below_lb,
            "earlier-poll": read_desc(idx.read_by_index.get(c["i2"])),
            "poll": read_desc(r),
        }
        text = _dump(example)
        out.append(((_nulls_first(c["t"]), text), c["t"], text))
    return out


# --- one key, then a whole history ------------------------------------------------------------


def check_key(key: str, ops: list[Row]) -> tuple[dict[str, int], dict[str, list[Found]], int]:
    """Every log rule on one key's operations: (counts, first examples per selection group, pairs read)."""
    fr = KeyFrames.build(key, ops)
    facts, ld = value_facts(fr)
    cands = [
        *value_candidates(facts, ld),
        *lost_by_reach(fr, facts, ld),
        *inconsistent_offsets(fr, facts),
        *realtime_and_stale(fr),
        *nonmonotonic_sends(fr),
        *poll_order(fr),
    ]
    counts, found = examples(fr, cands)
    return counts, found, len(fr.pairs)


def stats(ops: list[Row], pairs_read: int) -> dict[str, Any]:
    """The report's figures (``log_checker._stats``): only the groups that have rows."""
    out: dict[str, Any] = {}
    sends = [o for o in ops if o["f"] == "send"]
    if sends:
        offs = [o["offset"] for o in sends if o["offset"] is not None]
        out.update(
            {
                "keys": len({o["key"] for o in sends}),
                "sends-ok": sum(1 for o in sends if o["type"] == "ok"),
                "sends-ok-without-offset": sum(1 for o in sends if o["type"] == "ok" and o["offset"] is None),
                "sends-info": sum(1 for o in sends if o["type"] == "info"),
                "sends-fail": sum(1 for o in sends if o["type"] == "fail"),
                "max-offset": max(offs) if offs else None,
            }
        )
    reads = [o for o in ops if o["f"] in ("poll", "drain") and o["type"] == "ok"]
    if reads:
        out.update(
            {
                "polls-ok": sum(1 for o in reads if o["f"] == "poll"),
                "drains-ok": sum(1 for o in reads if o["f"] == "drain"),
                "keys-drained": len({o["key"] for o in reads if o["f"] == "drain"}),
                "pairs-read": pairs_read,
            }
        )
    return out


def check_history(ops: list[Row]) -> dict[str, Any]:
    """One history's operations (``kind`` op) -> ``{"anomalies", "counts", "stats"}`` like ``log_checker.check``."""
    from jepsen.checker.log_checker import _example

    by_key: dict[str, list[Row]] = defaultdict(list)
    for o in ops:
        by_key[o["key"]].append(o)
    counts: dict[str, int] = defaultdict(int)
    groups: dict[str, list[Found]] = defaultdict(list)
    pairs_read = 0
    for key in sorted(by_key):
        c, ex, n_pairs = check_key(key, by_key[key])
        pairs_read += n_pairs
        for a, n in c.items():
            counts[a] += n
        for g, found in ex.items():
            groups[g].extend(found)
    found_by: dict[str, list[tuple[Any, str]]] = defaultdict(list)
    for g, found in groups.items():
        # each group's first EXAMPLES across keys, then the anomaly's union is cut again
        name = "lost-write" if g == _LOST_REACH else g
        found_by[name].extend((t, text) for _, t, text in sorted(found, key=lambda e: e[0])[:EXAMPLES])
    res: dict[str, Any] = {"anomalies": {}, "counts": {}, "stats": stats(ops, pairs_read)}
    for anomaly, found in sorted(found_by.items()):
        res["counts"][anomaly] = counts.get(anomaly, len(found))
        first = sorted(found, key=lambda e: (e[0] if e[0] is not None else -1, e[1]))[:EXAMPLES]
        res["anomalies"][anomaly] = [_example(text) for _, text in first]
    return res
