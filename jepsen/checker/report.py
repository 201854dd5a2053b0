"""report.html: one static page per history, readable straight from disk.

What a Jepsen user looks for first: the verdict, which anomalies and concrete
examples of each, then latency and throughput over time with the faults shaded, so a
spike or a gap can be matched to the fault that caused it. Plots are matplotlib PNGs
embedded as data URIs (the page has no external files); the linearizability failure
is drawn as an inline SVG timeline, like Knossos' linear.svg, since it is a diagram of
a handful of operations rather than a chart.
"""

from __future__ import annotations

import base64
import html
import io
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from jepsen.checker import membership
from jepsen.checker.semantics_model import DESCRIPTIONS as SEMANTICS_DESCRIPTIONS

DESCRIPTIONS = {
    "lost-write": "an ok send is missing from the drain (or below the highest offset a later read reached, yet never read)",
    "duplicate": "one value stands at more than one offset",
    "inconsistent-offsets": "one (key, offset) was seen holding different values",
    "G1a": "a failed send's value was read",
    "unexpected": "a read returned a value that no one sent",
    "nonmonotonic-send": "one process's later ok send got a lower offset in the same key",
    "realtime-order": "send A completed before send B was invoked, yet offset(A) > offset(B)",
    "stale-read": "a poll that claimed the end returned less than an offset acknowledged before it was invoked",
    "poll-skip": "a process's next poll jumped over offsets known to exist",
    "nonmonotonic-poll": "a process's next poll went backwards",
    "recovered": "informational: an info send that is in the log",
    "unseen-info": "informational: an info send that is not in the log",
    "nonlinearizable": "no linearization of the key's operations is consistent with the model",
    **SEMANTICS_DESCRIPTIONS,
}

TYPE_COLOURS = {"ok": "#3b8d3b", "fail": "#d62728", "info": "#f0a030"}
FAULT_COLOURS = [
    "#f4a6a6",
    "#a6c8f4",
    "#b8e6a0",
    "#f4d6a0",
    "#d2b0f0",
    "#a0e6dc",
    "#f0b0d8",
    "#c8c8c8",
    "#e6e69c",
    "#9cc0c0",
    "#f0c0a0",
    "#b0b0f0",
]
HEALS = {
    "restart": "kill",
    "start": "kill",
    "resume": "pause",
    "stop-partition": "start-partition",
    "free-disk": "fill-disk",
    "heal": "start-partition",
    "unpause": "pause",
    "stop-clock": "start-clock",
}
STYLE = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:20px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin-bottom:4px}
.verdict{display:inline-block;padding:6px 14px;border-radius:4px;font-weight:bold;color:#fff;font-size:18px}
.v-true{background:#2e7d32}.v-false{background:#c62828}.v-unknown{background:#ef6c00}.v-error{background:#555}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{border:1px solid #ddd;padding:3px 8px;vertical-align:top;text-align:left}
th{background:#f5f5f5} code,.mono{font-family:Menlo,Consolas,monospace;font-size:12px}
.muted{color:#777;font-size:12px} img{max-width:100%} .err{color:#c62828}
"""


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _fmt_time(ns: Any, timed: bool) -> str:
    """Seconds for histories with a clock; histories without one only have event order."""
    if ns is None:
        return "?"
    return f"{ns / 1e9:.6f}s" if timed else f"#{ns}"


def _fmt_op(op: dict[str, Any], timed: bool = True) -> str:
    """One operation as a line: process, f, value, offset, type and its times."""
    parts = [f"p{op['process']}"] if op.get("process") is not None else []
    parts.append(str(op.get("f") or "drain"))
    if "value" in op and op["value"] is not None:
        parts.append(json.dumps(op["value"]))
    if op.get("result") is not None:
        parts.append("-> " + json.dumps(op["result"]))
    if op.get("offset") is not None:
        parts.append(f"@{op['offset']}")
    for k in ("from", "max", "returned", "first-offset", "last-offset", "reach"):
        if op.get(k) is not None:
            parts.append(f"{k}={op[k]}")
    if op.get("type"):
        parts.append(f"[{op['type']}]")
    inv = op.get("invoke-index", op.get("inv_index"))
    cmp = op.get("complete-index", op.get("cmp_index"))
    t0 = op.get("invoke-time", op.get("inv_time"))
    t1 = op.get("complete-time", op.get("cmp_time"))
    when = f"#{inv}" + (f"..#{cmp}" if cmp is not None else "")
    if timed and t0 is not None:
        when += f" t={_fmt_time(t0, timed)}" + (f"..{_fmt_time(t1, timed)}" if t1 is not None else "")
    return _esc(" ".join(parts)) + f' <span class="muted">{_esc(when)}</span>'


def _is_op(v: Any) -> bool:
    return isinstance(v, dict) and ("invoke-index" in v or "inv_index" in v)


def _cell(v: Any, timed: bool = True) -> str:
    if _is_op(v):
        return _fmt_op(v, timed)
    if isinstance(v, list) and v and all(_is_op(x) for x in v):
        return "<br>".join(_fmt_op(x, timed) for x in v)
    if isinstance(v, dict | list):
        return f"<code>{_esc(json.dumps(v))}</code>"
    return _esc(v)


def _examples_table(examples: list[dict[str, Any]], timed: bool) -> str:
    cols: list[str] = []
    for ex in examples:
        for k in ex:
            if k not in cols and k not in ("ops",):
                cols.append(k)
    if any("ops" in ex for ex in examples):
        cols.append("ops")
    head = "".join(f"<th>{_esc(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(ex.get(c, ''), timed)}</td>" for c in cols) + "</tr>" for ex in examples
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _fault_label(f: str, value: Any) -> str:
    """Name a fault by what the nemesis says it was (``kill-leader``), else by its f."""
    try:
        v = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return f
    if isinstance(v, dict) and isinstance(v.get("fault"), str):
        return v["fault"]
    return f


def fault_intervals(nemesis: list[tuple[str, Any, Any]]) -> list[tuple[str, float, float | None]]:
    """Pair fault and heal events into labelled intervals (None end: never healed).

    Each nemesis operation logs a start and an end event with the same ``f``; a fault
    lasts from its first event to the last event of the operation that heals it.
    Faults with no known healer span their own two events.
    """
    open_: dict[str, tuple[float, str]] = {}
    closing: dict[str, int] = {}  # healer f -> interval index its end event extends
    own: dict[str, tuple[float, str]] = {}
    out: list[tuple[str, float, float | None]] = []
    fault_fs = set(HEALS.values())
    for f, t, value in nemesis:
        if f in HEALS:
            fault = HEALS[f]
            if fault in open_:
                start, label = open_.pop(fault)
                out.append((label, start, t))
                closing[f] = len(out) - 1
            elif f in closing:  # the healing operation's own end event
                i = closing.pop(f)
                out[i] = (out[i][0], out[i][1], t)
            continue
        if f in fault_fs:
            open_.setdefault(f, (t, _fault_label(f, value)))
        elif f in own:
            start, label = own.pop(f)
            out.append((label, start, t))
        else:
            own[f] = (t, _fault_label(f, value))
    out.extend((label, start, None) for start, label in open_.values())
    out.extend((label, start, start) for start, label in own.values())
    return out


def _shade(
    ax: Any,
    intervals: list[tuple[str, float, float | None]],
    t0: float,
    t_end: float,
    colours: dict[str, str],
) -> None:
    for name, start, end in intervals:
        x0 = (start - t0) / 1e9
        x1 = ((end if end is not None else t_end) - t0) / 1e9
        ax.axvspan(x0, max(x1, x0 + 1e-3), color=colours[name], alpha=0.45, lw=0, zorder=0)


def _plots(data: dict[str, Any], faults: list[dict[str, Any]] | None = None) -> list[tuple[str, str]]:
    """Latency, throughput and (log workload) offset plots as (title, data URI).

    Every plot is drawn from a fixed-size sample or from binned counts (``plotdata``), so
    its size does not grow with the history; the throughput plot marks where each fault's
    recovery ended (``faults`` from results.json).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, NullFormatter

    t0 = data["t0"]
    ops = data["ops"]
    intervals = fault_intervals(data["nemesis"])
    names = sorted({n for n, _, _ in intervals})
    colours = {n: FAULT_COLOURS[i % len(FAULT_COLOURS)] for i, n in enumerate(names)}
    t_end = max([t for o in ops for t in (o[4], o[5]) if t is not None] + [t0 + 1])
    legend_faults = [Patch(color=colours[n], alpha=0.45, label=n) for n in names]
    out: list[tuple[str, str]] = []

    fs = sorted({o[0] for o in ops})
    if fs:
        fig, axes = plt.subplots(len(fs), 1, figsize=(10, 1.9 * len(fs) + 0.6), sharex=True, squeeze=False)
        for ax, f in zip(axes[:, 0], fs, strict=True):
            _shade(ax, intervals, t0, t_end, colours)
            for typ, colour in TYPE_COLOURS.items():
                pts = [
                    ((o[4] - t0) / 1e9, max((o[5] - o[4]) / 1e6, 1e-3))
                    for o in ops
                    if o[0] == f and o[1] == typ and o[5] is not None
                ]
                if typ == "info":  # no completion time: plot at the top of the range
                    pts += [
                        ((o[4] - t0) / 1e9, None) for o in ops if o[0] == f and o[1] == typ and o[5] is None
                    ]
                if not pts:
                    continue
                finite = [p for p in pts if p[1] is not None]
                top = max([p[1] for p in finite] + [1.0])
                xs = [p[0] for p in pts]
                ys = [p[1] if p[1] is not None else top for p in pts]
                ax.scatter(xs, ys, s=4, c=colour, label=typ, alpha=0.7, lw=0, rasterized=True)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_ylabel(f"{f}\nlatency (ms)", fontsize=8)
            ax.tick_params(labelsize=7)
        kinds = [Line2D([], [], ls="", marker="o", ms=4, color=c, label=t) for t, c in TYPE_COLOURS.items()]
        axes[0, 0].legend(
            handles=[*kinds, *legend_faults], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0)
        )
        axes[-1, 0].set_xlabel("time (s)", fontsize=8)
        sampled = " (sampled)" if data.get("sampled") else ""
        out.append((f"Latency by operation{sampled}", _png(fig)))

    series: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
    for f, typ, b, n in data["throughput"]:
        if b is not None:
            series[(f, typ)][int(b)] = n
    if series:
        w = data["bin-s"]
        last = max(max(b) for b in series.values())
        fig, ax = plt.subplots(figsize=(10, 2.6))
        _shade(ax, intervals, t0, t_end, colours)
        for (f, typ), bins in sorted(series.items()):
            xs = range(last + 1)  # empty bins are zero throughput, not a line across the gap
            ax.plot(
                [x * w for x in xs],
                [bins.get(x, 0) / w for x in xs],
                lw=1,
                ls={"ok": "-", "fail": ":", "info": "--"}.get(typ, "-"),
                label=f"{f} {typ}",
            )
        marks = [x for x in faults or [] if x.get("recovery_ms") is not None]
        for x in marks:
            ax.axvline(x["start_s"] + x["recovery_ms"] / 1e3, color="black", lw=0.8, ls="-.", zorder=3)
        if marks:
            ax.plot([], [], color="black", lw=0.8, ls="-.", label="recovered")
        _mark_membership(ax, data["nemesis"], t0)
        ax.set_ylabel("ops/s", fontsize=8)
        ax.set_xlabel("time (s)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(
            handles=[*ax.get_legend_handles_labels()[0], *legend_faults],
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
        )
        out.append(("Throughput", _png(fig)))

    sends = [o for o in ops if o[0] == "send" and o[1] == "ok" and o[6] is not None and o[5] is not None]
    if data.get("workload") == "log" and sends:
        keys = sorted({o[2] for o in sends}, key=lambda k: (len(k), k))
        shown = keys[:12]
        fig, ax = plt.subplots(figsize=(10, 3))
        _shade(ax, intervals, t0, t_end, colours)
        for k in shown:
            pts = sorted(((o[5] - t0) / 1e9, o[6]) for o in sends if o[2] == k)
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=3, lw=0, label=f"key {k}", rasterized=True)
        ax.set_ylabel("offset acknowledged", fontsize=8)
        ax.set_xlabel("time (s)", fontsize=8)
        ax.tick_params(labelsize=7)
        more = f" (first {len(shown)} of {len(keys)} keys)" if len(keys) > len(shown) else ""
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), markerscale=3)
        out.append((f"Offsets acknowledged over time, per key{more}", _png(fig)))
    return out


def _mark_membership(ax: Any, nemesis: list[Any], t0: int) -> None:
    """Label each ended membership change at its end on a plot: the nodes added (+) or removed
    (-), and the number of voters it left, or that it failed."""
    for c in membership.changes(nemesis):
        if c.end is None:
            continue
        sign = "+" if c.f == "member-add" else "-"
        after = f" ({len(c.voters)} voters)" if c.ok and c.voters is not None else " (failed)"
        x = (c.end - t0) / 1e9
        ax.axvline(x, color="#555", lw=0.6, ls=":", zorder=2)
        ax.text(
            x,
            0.98,
            sign + ",".join(c.nodes) + after,
            transform=ax.get_xaxis_transform(),
            rotation=90,
            fontsize=6,
            va="top",
            ha="right",
            color="#333",
        )


def _timeline_svg(failure: dict[str, Any]) -> str:
    """The operations around a linearizability failure, one lane per process."""
    ops = failure.get("ops", []) + [failure["op"]]
    if not ops:
        return ""
    lo = min(o["invoke-index"] for o in ops)
    last = failure.get("last-index", lo)
    hi = max([last] + [o.get("complete-index") or o["invoke-index"] for o in ops]) + 1
    procs = sorted({str(o["process"]) for o in ops}, key=lambda p: (len(p), p))
    lane = {p: i for i, p in enumerate(procs)}
    width, left, row = 900, 60, 26
    scale = (width - left - 10) / max(1, hi - lo)
    h = row * len(procs) + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" '
        f'font-family="Menlo,Consolas,monospace" font-size="10">'
    ]
    for p, i in lane.items():
        parts.append(f'<text x="4" y="{i * row + 17}">p{_esc(p)}</text>')
    culprit = failure["op"]
    for o in ops:
        x0 = left + (o["invoke-index"] - lo) * scale
        end = o.get("complete-index")
        # info ops may take effect any time after their invoke, so they run to the edge
        pending = o.get("type") == "info" or end is None or end > last
        x1 = left + ((hi if pending or end is None else min(end, last)) - lo) * scale
        y = lane[str(o["process"])] * row + 4
        is_culprit = o is culprit or (
            o.get("invoke-index") == culprit.get("invoke-index")
            and o.get("process") == culprit.get("process")
        )
        fill = (
            "#f4b4b4"
            if is_culprit
            else "#fff3d6"
            if pending
            else "#e4e4e4"
            if o.get("type") == "fail"
            else "#d8ecd8"
        )
        label = f"{o['f']} {json.dumps(o.get('value'))}"
        if o.get("result") is not None:
            label += f" -> {json.dumps(o['result'])}"
        parts.append(
            f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 3):.1f}" height="{row - 8}" '
            f'fill="{fill}" stroke="#666" stroke-dasharray="{"3,2" if pending else "none"}">'
            f"<title>{_esc(label)} [{_esc(o.get('type'))}] #{o['invoke-index']}..#{end}</title></rect>"
        )
        parts.append(f'<text x="{x0 + 3:.1f}" y="{y + 12}">{_esc(label[:40])}</text>')
    xl = left + (last - lo) * scale
    parts.append(
        f'<line x1="{xl:.1f}" y1="0" x2="{xl:.1f}" y2="{h - 20}" stroke="#c62828" stroke-width="1.5"/>'
    )
    parts.append(
        f'<text x="{left}" y="{h - 6}" fill="#555">event #{lo} .. #{hi - 1}; red line: the '
        f"completion that no linearization can explain; dashed: info or pending; grey: failed "
        f"(did not happen)</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


def render(path: str, result: dict[str, Any], plot_data: dict[str, Any] | None) -> str:
    """The whole page as a string."""
    valid = result.get("valid")
    if result.get("error"):
        badge, cls = "ERROR", "v-error"
    else:
        badge, cls = {True: ("VALID", "v-true"), False: ("INVALID", "v-false")}.get(
            valid, ("UNKNOWN", "v-unknown")
        )  # type: ignore[arg-type]
    h: list[str] = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_esc(Path(path).name)}"
        f" - {badge}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_esc(path)}</h1>",
        f"<p><span class='verdict {cls}'>{badge}</span> &nbsp; workload "
        f"<b>{_esc(result.get('workload'))}</b> <span class='muted'>checked "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}</span></p>",
    ]
    if result.get("error"):
        h.append(f"<p class='err'>{_esc(result['error'])}</p></body></html>")
        return "".join(h)
    counts = result.get("counts", {})
    timed = bool(result.get("stats", {}).get("timed", True))
    if counts:
        h.append("<h2>Anomalies</h2><table><tr><th>anomaly</th><th>count</th><th>meaning</th></tr>")
        for name, n in counts.items():
            info = name in result.get("informational", [])
            h.append(
                f"<tr><td><a href='#{_esc(name)}'>{_esc(name)}</a>{' (info)' if info else ''}</td>"
                f"<td>{n}</td><td>{_esc(DESCRIPTIONS.get(name, ''))}</td></tr>"
            )
        h.append("</table>")
    else:
        h.append("<p>No anomalies found.</p>")
    if result.get("unknown-keys"):
        h.append(
            "<h2>Undecided keys</h2><p>The search ran out of its time budget for these keys, so "
            "the history cannot be called valid:</p><table><tr><th>key</th><th>why</th></tr>"
        )
        for k in result["unknown-keys"][:50]:
            h.append(f"<tr><td>{_esc(k)}</td><td>{_esc(result.get('unknown', {}).get(k, ''))}</td></tr>")
        h.append("</table>")
    stats = result.get("stats", {})
    if stats:
        h.append("<h2>Statistics</h2><table>")
        for k, v in stats.items():
            h.append(f"<tr><th>{_esc(k)}</th><td>{_cell(v)}</td></tr>")
        h.append("</table>")
    if result.get("faults"):
        h.append(_recovery_tables(result["faults"], result.get("recovery", {})))
    if plot_data:
        h.append(_membership_section(membership.by_group(plot_data.get("nemesis", [])), plot_data["t0"]))
        for title, uri in _plots(plot_data, result.get("faults")):
            h.append(f"<h2>{_esc(title)}</h2><img alt='{_esc(title)}' src='{uri}'>")
    for name, examples in result.get("anomalies", {}).items():
        if not examples:
            continue
        n = counts.get(name, len(examples))
        h.append(
            f"<h2 id='{_esc(name)}'>{_esc(name)}: {n}</h2><p class='muted'>"
            f"{_esc(DESCRIPTIONS.get(name, ''))}; showing {len(examples)}</p>"
        )
        if name == "nonlinearizable":
            for ex in examples:
                minimal = (
                    "" if ex.get("minimal", True) else " (not proven minimal: narrowing ran out of time)"
                )
                h.append(
                    f"<h3>key {_esc(ex.get('key') or '(none)')}</h3><p>Shortest prefix that cannot be linearized: "
                    f"{ex.get('prefix-events')} events, ending with the completion of "
                    f"{_fmt_op(ex['op'], timed)}{_esc(minimal)}</p>"
                    if "op" in ex
                    else ""
                )
                if "op" in ex:
                    h.append(_timeline_svg(ex))
                    h.append(_examples_table([{"ops": ex.get("ops", [])}], timed))
        else:
            h.append(_examples_table(examples, timed))
    h.append("</body></html>")
    return "".join(h)


def _names(nodes: Any) -> str:
    return "?" if nodes is None else ", ".join(nodes) or "(none)"


def _membership_section(groups: list[membership.GroupMembership], t0: int) -> str:
    """Each group's first members and every membership change (empty without changes)."""
    if not groups:
        return ""
    h = [
        "<h2>Membership</h2><p class='muted'>From the history's member-add / member-remove events: "
        "a change is ok when its end event holds the configuration it committed; voters and "
        "learners are those after the change.</p>"
    ]
    for g in groups:
        title = f"group {g.group}" if g.group else "the group"
        h.append(
            f"<h3>{_esc(title)}</h3><p>First members: <b>{_esc(_names(g.initial))}</b> "
            f"<span class='muted'>({_esc(g.initial_from)})</span></p><table><tr><th>start (s)</th>"
            "<th>end (s)</th><th>change</th><th>nodes</th><th>variant</th><th>outcome</th>"
            "<th>voters</th><th>learners</th></tr>"
        )
        for c in g.changes[:MAX_FAULT_ROWS]:
            end = "never ended" if c.end is None else f"{(c.end - t0) / 1e9:.3f}"
            outcome = (
                "unknown"
                if c.ok is None
                else "ok"
                if c.ok
                else "failed" + (f": {c.error}" if c.error else "")
            )
            h.append(
                f"<tr><td>{(c.start - t0) / 1e9:.3f}</td><td>{end}</td><td>{_esc(c.f)}</td>"
                f"<td>{_esc(', '.join(c.nodes))}</td><td>{_esc(c.variant or '')}</td>"
                f"<td>{_esc(outcome)}</td><td>{_esc(_names(c.voters))}</td>"
                f"<td>{_esc(_names(c.learners))}</td></tr>"
            )
        h.append("</table>")
    return "".join(h)


def _ms(v: Any) -> str:
    return "never" if v is None else f"{v:,.0f}"


def _recovery_tables(faults: list[dict[str, Any]], by_kind: dict[str, dict[str, Any]]) -> str:
    """Recovery per fault kind, then every fault (at most ``MAX_FAULT_ROWS`` rows)."""
    h = [
        "<h2>Recovery</h2><p class='muted'>From the history alone: recovery = from the fault's start "
        "until every key served in the 10 s before it completed an ok operation invoked after the "
        "start; gap = the longest stretch with no ok completion from the start to 10 s after the "
        "end.</p><table><tr><th>fault</th><th>count</th><th>recovered</th><th>p50 recovery (ms)</th>"
        "<th>max recovery (ms)</th><th>longest gap (ms)</th></tr>"
    ]
    for kind, r in sorted(by_kind.items()):
        h.append(
            f"<tr><td>{_esc(kind)}</td><td>{r['faults']}</td><td>{r['recovered']}</td>"
            f"<td>{_ms(r['recovery_p50_ms'])}</td><td>{_ms(r['recovery_max_ms'])}</td>"
            f"<td>{_ms(r['gap_max_ms'])}</td></tr>"
        )
    h.append(
        "</table><table><tr><th>fault</th><th>nodes</th><th>start (s)</th><th>end (s)</th>"
        "<th>recovery (ms)</th><th>gap (ms)</th><th>ok/s before</th><th>ok/s during</th>"
        "<th>ok/s after</th></tr>"
    )
    for x in faults[:MAX_FAULT_ROWS]:
        end = "never healed" if x.get("end_s") is None else f"{x['end_s']:.3f}"
        h.append(
            f"<tr><td>{_esc(x.get('kind'))}</td><td>{_esc(', '.join(x.get('nodes') or []))}</td>"
            f"<td>{x['start_s']:.3f}</td><td>{end}</td><td>{_ms(x.get('recovery_ms'))}</td>"
            f"<td>{_ms(x.get('gap_ms'))}</td><td>{_ms(x.get('ok_per_s_before'))}</td>"
            f"<td>{_ms(x.get('ok_per_s_during'))}</td><td>{_ms(x.get('ok_per_s_after'))}</td></tr>"
        )
    h.append("</table>")
    if len(faults) > MAX_FAULT_ROWS:
        h.append(f"<p class='muted'>{len(faults) - MAX_FAULT_ROWS} more faults in results.json</p>")
    return "".join(h)


MAX_FAULT_ROWS = 200  # the report stays readable; results.json has every fault


def write_report(path: Path, history: str, result: dict[str, Any], plot_data: dict[str, Any] | None) -> None:
    """Write report.html for one history."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(history, result, plot_data), encoding="utf-8")
