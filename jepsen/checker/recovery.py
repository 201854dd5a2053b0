"""Recovery per fault, from the history alone: OpenChaos' "failure recovery time" and more.

For every fault in a history (``docs/history.md``, "Faults and recovery"), how long until every key
that was being served before it was served again (``recovery_ms``), the longest stretch
with no successful operation at all (``gap_ms``), and the ok throughput before, during and
after. Nothing but the history is used, so it works for any system's history that records
its faults, Jepsen's own included.

The inputs are small aggregates, never the operations themselves, so a history of
millions of operations costs two grouped queries (in ``timeline.collect``'s one job) or one
pass in Python (``faults_from_rows``):

* per key and millisecond of invocation, the earliest completion of an ok operation
  invoked in that millisecond (so "the first ok invoked after the start" is a suffix
  minimum: operations invoked in the same millisecond as the fault starts are left out,
  which can only make a recovery look later, by under a millisecond of invocations);
* per key and millisecond of completion, how many ok operations completed.

Faults are read from the nemesis events: an operation is a start event and an end event
with the same ``f`` (the harness's and Jepsen's convention); a fault opens with a breaking
operation (``kill``, ``pause``, ``start-partition``, Jepsen's ``start``, ...) and closes
when the matching healing operation (``restart``, ``resume``, ``stop-partition``,
``stop``, ...) ends. Operations that neither break nor heal (``corrupt`` of an already
stopped node) are annotations of the fault in force; any other ``f`` is a fault of its own
lasting as long as its operation.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jepsen.checker.timeline import Timeline

WINDOW_NS = 10_000_000_000  # "the 10 s before it", "end + 10 s" (docs/history.md)
BUCKET_NS = 1_000_000  # aggregates are per millisecond
MS = 1e6

#: breaking f -> the f(s) that heal it
HEALS: dict[str, tuple[str, ...]] = {
    "kill": ("restart", "start"),
    "pause": ("resume",),
    "start-partition": ("stop-partition",),
    "fill-disk": ("free-disk",),
    "start": ("stop",),
    "partition": ("heal",),
    "bump-clock": ("reset-clock",),
    "strobe-clock": ("reset-clock",),
}
HEALING = frozenset(f for fs in HEALS.values() for f in fs)
#: operations of a run's final phase (docs/history.md: a drain runs after every fault is healed)
FINAL_READS = frozenset({"drain"})
ANNOTATIONS = frozenset({"corrupt"})


@dataclass
class Fault:
    """One fault window, in the history's clock (nanoseconds)."""

    f: str
    kind: str
    nodes: list[str]
    start: int
    end: int | None = None
    heal_f: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)


def _value(text: Any) -> Any:
    if isinstance(text, str) and text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _nodes(value: Any) -> list[str]:
    if isinstance(value, dict):
        nodes = value.get("nodes") or value.get("node") or []
        return [str(n) for n in (nodes if isinstance(nodes, list) else [nodes])]
    return []


def faults_from_nemesis(events: Iterable[tuple[int, int, str, Any]]) -> list[Fault]:
    """Fault windows from nemesis events ``(index, time, f, value)`` (any order)."""
    evs = sorted(events)
    ops: list[tuple[str, int, int, Any]] = []  # (f, start time, end time, value of the end event)
    i = 0
    while i < len(evs):
        _, t, f, v = evs[i]
        if i + 1 < len(evs) and evs[i + 1][2] == f:
            ops.append(
                (f, t, evs[i + 1][1], _value(evs[i + 1][3]) if evs[i + 1][3] is not None else _value(v))
            )
            i += 2
        else:
            ops.append((f, t, t, _value(v)))
            i += 1
    faults: list[Fault] = []
    open_: list[Fault] = []
    for f, t_start, t_end, value in ops:
        if f in HEALING and any(f in x.heal_f for x in open_):
            nodes = set(_nodes(value))
            match = [x for x in open_ if f in x.heal_f]
            # the earliest open fault this heals, preferring one on the same nodes
            pick = next((x for x in match if nodes and nodes & set(x.nodes)), match[0])
            pick.end = t_end
            open_.remove(pick)
            # one heal that covers several open faults of the same kind (heal-all) closes them all
            for x in [x for x in match if x is not pick and nodes and set(x.nodes) <= nodes]:
                x.end = t_end
                open_.remove(x)
            continue
        if f in HEALING and f not in HEALS:
            continue  # a heal with nothing open (e.g. a restart of a node that was never killed)
        if f in ANNOTATIONS:
            if open_:
                open_[-1].notes.append(f)
            continue
        kind = value.get("fault", f) if isinstance(value, dict) else f
        fault = Fault(f, str(kind), _nodes(value), t_start, heal_f=HEALS.get(f, ()))
        faults.append(fault)
        if fault.heal_f:
            open_.append(fault)
        else:
            fault.end = t_end
    return faults


class OkIndex:
    """The per-key, per-millisecond aggregates of ok operations that recovery needs.

    Held as sorted numpy arrays (per key, and one for all keys) and searched by bisection: a
    history of hours at a low rate has a bucket for nearly every operation, and Python lists
    of them cost the driver more than the check's Spark jobs (10M operations over 2.8 hours:
    7.4M buckets each way, 13.6 s to index in lists).
    """

    def __init__(
        self,
        first_ok: Iterable[tuple[str, int, int]],
        done: Iterable[tuple[str, int, int]],
    ) -> None:
        """``first_ok``: (key, invoke ms, earliest completion ns); ``done``: (key, completion ms, count)."""
        self._build(_lists_by_key(first_ok), _lists_by_key(done))

    @classmethod
    def from_columns(cls, first_ok: Columns | None, done: Columns | None) -> OkIndex:
        """From the same aggregates as columns (keys, buckets, values), each None when empty."""
        idx = cls.__new__(cls)
        idx._build(_columns_by_key(first_ok), _columns_by_key(done))
        return idx

    def _build(self, inv: dict[str, tuple[Any, Any]], done: dict[str, tuple[Any, Any]]) -> None:
        import numpy as np

        self.inv_buckets: dict[str, Any] = {}
        self.suffix_min: dict[str, Any] = {}
        for key, (b, t) in inv.items():
            order = np.argsort(b, kind="stable")
            self.inv_buckets[key] = b[order]
            self.suffix_min[key] = np.minimum.accumulate(t[order][::-1])[::-1]
        self.done_buckets = {k: np.sort(b) for k, (b, _) in done.items()}
        every = [b for b, _ in done.values()]
        counts = [n for _, n in done.values()]
        self.buckets = np.unique(np.concatenate(every)) if every else np.zeros(0, np.int64)
        total = np.zeros(len(self.buckets), np.int64)
        if every:
            np.add.at(total, np.searchsorted(self.buckets, np.concatenate(every)), np.concatenate(counts))
        self.prefix = np.concatenate([np.zeros(1, np.int64), np.cumsum(total)])

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> OkIndex:
        """From paired operation rows (``frames.pair_ops`` columns; only ok ops with times count)."""
        first: dict[tuple[str, int], int] = {}
        done: dict[tuple[str, int], int] = defaultdict(int)
        for r in rows:
            if r["kind"] != "op" or r["type"] != "ok" or r["cmp_time"] is None or r["inv_time"] is None:
                continue
            key = r["key"] or ""
            k = (key, r["inv_time"] // BUCKET_NS)
            t = r["cmp_time"]
            if k not in first or t < first[k]:
                first[k] = t
            done[(key, t // BUCKET_NS)] += 1
        return cls(((k, b, t) for (k, b), t in first.items()), ((k, b, n) for (k, b), n in done.items()))

    def keys_active(self, lo: int, hi: int) -> list[str]:
        """Keys with an ok completion in [lo, hi) (ns, at millisecond resolution)."""
        blo, bhi = lo // BUCKET_NS, hi // BUCKET_NS
        out = []
        for key, bs in self.done_buckets.items():
            j = int(bs.searchsorted(blo))
            if j < len(bs) and bs[j] < bhi:
                out.append(key)
        return out

    def first_ok_after(self, key: str, start: int) -> int | None:
        """Earliest completion of an ok operation on ``key`` invoked after ``start``."""
        bs = self.inv_buckets.get(key)
        if bs is None or not len(bs):
            return None
        j = int(bs.searchsorted(-(-start // BUCKET_NS)))
        return int(self.suffix_min[key][j]) if j < len(bs) else None

    def count(self, lo: int, hi: int) -> int:
        """ok completions in [lo, hi)."""
        a = int(self.buckets.searchsorted(lo // BUCKET_NS))
        b = int(self.buckets.searchsorted(hi // BUCKET_NS))
        return int(self.prefix[b] - self.prefix[a])

    def longest_gap(self, lo: int, hi: int) -> float:
        """The longest stretch in [lo, hi) with no ok completion, in ms (millisecond resolution)."""
        blo, bhi = lo // BUCKET_NS, hi // BUCKET_NS
        a = int(self.buckets.searchsorted(blo))
        b = int(self.buckets.searchsorted(bhi))
        inside = self.buckets[a:b]
        if not len(inside):
            return (hi - lo) / MS
        first, last = int(inside[0]), int(inside[-1])
        gap = max((first * BUCKET_NS - lo) / MS, (hi - (last + 1) * BUCKET_NS) / MS)
        if len(inside) > 1:
            gap = max(gap, float(int((inside[1:] - inside[:-1]).max()) - 1))
        return max(0.0, gap)


#: aggregates as columns: (keys: an Arrow string array or a list, buckets, values: int64 arrays)
Columns = tuple[Any, Any, Any]


def _lists_by_key(rows: Iterable[tuple[str, int, int]]) -> dict[str, tuple[Any, Any]]:
    import numpy as np

    lists: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    for key, b, v in rows:
        lists[key][0].append(int(b))
        lists[key][1].append(int(v))
    return {k: (np.array(b, np.int64), np.array(v, np.int64)) for k, (b, v) in lists.items()}


def _columns_by_key(cols: Columns | None) -> dict[str, tuple[Any, Any]]:
    """Columns split per key (a missing key reads as "", as ``from_rows`` has it)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if cols is None or not len(cols[1]):
        return {}
    keys, b, v = cols
    keys = pa.array(keys, pa.string()) if isinstance(keys, list) else keys
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    enc = pc.dictionary_encode(pc.fill_null(keys, ""))
    codes, names = enc.indices.to_numpy(), enc.dictionary.to_pylist()
    b, v = np.asarray(b, np.int64), np.asarray(v, np.int64)
    order = np.argsort(codes, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(codes[order])) + 1)
    return {names[codes[g[0]]]: (b[g], v[g]) for g in groups}


def key_group(key: str) -> str | None:
    """The broker group a key lives on, where the harness wrote it as ``<topic>/<broker name>/<queue>``
    (several broker groups, ``jepsen run --groups``); None for any other key."""
    parts = key.split("/")
    return parts[1] if len(parts) == 3 and parts[1] else None


def node_group(node: str) -> str | None:
    """The broker group in a node name written ``<broker name>/<node>`` (``broker-b/n2``)."""
    group, sep, rest = node.partition("/")
    return group if sep and group and rest else None


def _by_group(keys: list[str], firsts: list[int | None], start: int) -> dict[str, float | None]:
    """Recovery per broker group: the latest first-ok of the group's keys (None if one never recovers)."""
    out: dict[str, float | None] = {}
    for key, t in zip(keys, firsts, strict=True):
        g = key_group(key)
        if g is None:
            continue
        if t is None or (g in out and out[g] is None):
            out[g] = None
        else:
            out[g] = max(out.get(g) or 0.0, round((t - start) / MS, 3))
    return dict(sorted(out.items()))


def compute(
    faults: list[Fault], idx: OkIndex, t0: int, t1: int, load_end: int | None = None
) -> list[dict[str, Any]]:
    """The ``faults`` list of results.json for a history spanning [t0, t1] (ns).

    ``load_end``: where the load stopped, when the history goes on with final reads (the
    latest time of any other operation, see ``load_end_of``). A fault's "after" window and
    its gap end there: the pause between the load and the final reads (the harness healing,
    waiting for a leader, starting the drain) is the harness's, not the system's. Without
    it, a fault in a run's last 10 s showed that pause, seconds long, as its ``gap_ms``.
    """
    out = []
    for x in faults:
        s = x.start
        end = x.end if x.end is not None else t1
        before_lo = max(t0, s - WINDOW_NS)
        keys = idx.keys_active(before_lo, s)
        recovery: float | None = None
        entry: dict[str, Any] = {}
        if not keys:
            entry["note"] = "no ok operation in the 10 s before the fault: nothing to recover"
        else:
            firsts = [idx.first_ok_after(k, s) for k in keys]
            by_group = _by_group(keys, firsts, s)
            if len(by_group) > 1:  # keys spread over broker groups: say how each group fared
                entry["recovery_ms_by_group"] = by_group
            if all(t is not None for t in firsts):
                recovery = round((max(t for t in firsts if t is not None) - s) / MS, 3)
            else:
                entry["unrecovered_keys"] = sorted(k for k, t in zip(keys, firsts, strict=True) if t is None)[
                    :8
                ]
        after_hi = min(t1, end + WINDOW_NS)
        if load_end is not None and load_end > end:
            after_hi = min(after_hi, load_end)
        gap_hi = max(s, after_hi)
        groups = sorted({g for g in map(node_group, x.nodes) if g})
        if groups:  # the broker groups the fault hit (nodes named ``<group>/<node>``)
            entry["groups"] = groups
        out.append(
            {
                "f": x.f,
                "kind": x.kind,
                "nodes": x.nodes,
                "start_s": round((s - t0) / 1e9, 3),
                "end_s": None if x.end is None else round((x.end - t0) / 1e9, 3),
                "recovery_ms": recovery,
                "gap_ms": round(idx.longest_gap(s, gap_hi), 3),
                "ok_per_s_before": _rate(idx.count(before_lo, s), s - before_lo),
                "ok_per_s_during": _rate(idx.count(s, end), end - s),
                "ok_per_s_after": _rate(idx.count(end, after_hi), after_hi - end),
                "keys": len(keys),
                **({"notes": x.notes} if x.notes else {}),
                **entry,
            }
        )
    return out


def _rate(n: int, span_ns: int) -> float:
    return round(n / (span_ns / 1e9), 1) if span_ns > 0 else 0.0


def summarize(faults: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per fault kind: how many, how many recovered, p50 / max recovery and the longest gap."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for x in faults:
        by[x["kind"]].append(x)
    out = {}
    for kind, xs in by.items():
        rec = [x["recovery_ms"] for x in xs if x["recovery_ms"] is not None]
        out[kind] = {
            "faults": len(xs),
            "recovered": len(rec),
            "recovery_p50_ms": round(statistics.median(rec), 3) if rec else None,
            "recovery_max_ms": max(rec) if rec else None,
            "gap_max_ms": max(x["gap_ms"] for x in xs),
        }
        groups = _summarize_groups(xs)
        if groups:
            out[kind]["by_group"] = groups
    return out


def _summarize_groups(faults: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per broker group a fault hit: how many of those faults, and how long that group's keys took
    to recover (faults on several groups at once count for each)."""
    rec: dict[str, list[float | None]] = defaultdict(list)
    for x in faults:
        per = x.get("recovery_ms_by_group") or {}
        for g in x.get("groups") or []:
            if g in per:
                rec[g].append(per[g])
    out = {}
    for g, values in sorted(rec.items()):
        done = [v for v in values if v is not None]
        out[g] = {
            "faults": len(values),
            "recovered": len(done),
            "recovery_p50_ms": round(statistics.median(done), 3) if done else None,
            "recovery_max_ms": max(done) if done else None,
        }
    return out


def faults_from_rows(rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``faults`` list from paired operation rows of one history (the in-process path)."""
    nem = [
        (r["inv_index"], r["inv_time"], r["f"], r["inv_value"])
        for r in rows
        if r["kind"] == "nemesis" and r["inv_time"] is not None
    ]
    if not nem:
        return []
    times = [t for r in rows for t in (r["inv_time"], r.get("cmp_time")) if t is not None]
    spans = (
        (r["f"], max(r["inv_time"], r.get("cmp_time") or 0))
        for r in rows
        if r["kind"] == "op" and r["inv_time"] is not None
    )
    end = load_end_of(spans)
    return compute(faults_from_nemesis(nem), OkIndex.from_rows(rows), min(times), max(times), end)


def load_end_of(spans: Iterable[tuple[str, int | None]]) -> int | None:
    """From (f, latest time) of operations: the latest time of any that is not a final read,
    when the history has final reads (None otherwise: its load ran to its end)."""
    end: int | None = None
    final = False
    for f, t in spans:
        if f in FINAL_READS:
            final = True
        elif t is not None and (end is None or t > end):
            end = t
    return end if final else None


def faults_from_timeline(
    tl: Timeline,
    srcs: list[int],
    bounds: dict[int, tuple[int, int]],
    load_ends: Mapping[int, int | None] | None = None,
) -> dict[int, list[dict[str, Any]]]:
    """The ``faults`` list per source with nemesis events, from what ``timeline.collect``
    gathered; ``bounds``: each source's (first, last) time and ``load_ends`` its
    ``load_end_of``, both from the caller's overview."""
    out = {}
    for s in srcs:
        events = tl.nemesis.get(s)
        if not events:
            continue
        t0, t1 = bounds[s]
        times = [t for _, t, _, _ in events]
        t0, t1 = min([t0, *times]), max([t1, *times])
        end = (load_ends or {}).get(s)
        idx = OkIndex.from_columns(tl.first_ok.get(s), tl.done.get(s))
        out[s] = compute(faults_from_nemesis(events), idx, t0, t1, end)
    return out


def attach(result: dict[str, Any], faults: list[dict[str, Any]]) -> None:
    """Put the ``faults`` list and its per-kind summary into a results.json document."""
    result["faults"] = faults
    if faults:
        result["recovery"] = summarize(faults)
