"""Where a full-rate failover's time goes: a leader fault's recovery split into its stages.

Runs ``jepsen run --backend local --workload queue --rate max`` with one leader fault
(kill-leader by default) ``--runs`` times (or reads finished run directories given with
``--analyze``) and, for every fault, puts on the history's clock (ms after the fault's start):

- ``signalled``: a kill's SIGKILL sent (the end event's ``signalled_s``);
- ``fault``: the nemesis's end event (the victim dead and reaped, or cut off);
- ``elected``: the first ledger member of the group that became leader after the start;
- ``master``: that broker switched to master (its store applied what was committed);
- ``registered``: it registered as broker id 0 with every nameserver;
- ``first_answer``: the first operation a client completed with the new master (any outcome);
- ``first_ok``: the first ok operation the new master served;
- ``recovery``: as the checker computes it (per key, the first ok operation invoked after the
  start; the latest of those completions over the keys that had an ok in the 10 s before).

Broker logs stamp wall-clock time and the history a monotonic clock from the run's origin:
both are put on one clock with this machine's wall-minus-monotonic offset (the same boot,
so the same offset up to clock slewing).

    python bench/recovery_bench.py [--runs 3] [--time 60] [--nemesis kill-leader] [--groups 1]
    python bench/recovery_bench.py --analyze jepsen-runs/NAME/latest [...]

Ends with one JSON line: per stage the median over faults of each run, then the median of
those over runs (``<stage>_p50_ms``), recovery_p50_ms / recovery_max_ms (medians over runs of
each run's p50 and max), the checker's own figures, runs and faults.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("signalled", "fault", "elected", "master", "registered", "first_answer", "first_ok", "recovery")
RECOVERY_LOOKBACK_NS = 10_000_000_000  # keys with an ok in the 10 s before a fault must recover
RUN_TIMEOUT_S = 1800


def wall_offset_s() -> float:
    """Wall clock minus monotonic clock on this machine now."""
    return time.time() - time.monotonic()


def load_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every history event of the run in time order, from its shards (Parquet parts or JSON
    Lines) or its one history file: ``jepsen.history.read_events``."""
    sys.path.insert(0, str(ROOT))
    from jepsen.history import read_events

    return list(read_events(run_dir))


def clock_origin_ns(run_dir: Path) -> int:
    for path in sorted((run_dir / "workers").glob("worker-*.json")):
        return int(json.loads(path.read_text())["clock_origin_ns"])
    raise RuntimeError(
        f"{run_dir}: no worker spec with the history's clock origin (a --rate max run has them)"
    )


def broker_log_events(run_dir: Path, to_hist_ns: Any) -> list[dict[str, Any]]:
    """The brokers' role, switch and registration lines, on the history's clock."""
    wanted = {"role change", "switched to master", "registered broker with nameservers"}
    out: list[dict[str, Any]] = []
    # one group: cluster/broker-n1/broker.log; several: cluster/broker-a/n1/broker.log
    paths = sorted((run_dir / "cluster").glob("broker-*/n*/broker.log"))
    paths += sorted((run_dir / "cluster").glob("broker-*/broker.log"))
    for path in paths:
        with path.open() as f:
            for line in f:
                if '"msg"' not in line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("msg") in wanted:
                    rec["t"] = to_hist_ns(float(rec["ts"]))
                    out.append(rec)
    out.sort(key=lambda r: r["t"])
    return out


def faults(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """(start, end, value) of each nemesis fault (restarts and heals are not faults).

    Nemesis operations run one at a time, so each start event is followed by its own end
    event (the end's value may say more than the start's: ``signalled_s`` of a kill)."""
    out: list[dict[str, Any]] = []
    nemesis = [e for e in events if e.get("process") == "nemesis"]
    for start, end in zip(nemesis[::2], nemesis[1::2], strict=False):
        if start["f"] in ("restart", "heal", "resume", "stop-partition") or end["f"] != start["f"]:
            continue
        value = end.get("value") if isinstance(end.get("value"), dict) else start.get("value")
        out.append({"f": start["f"], "start": start["time"], "end": end["time"], "value": value or {}})
    return out


def fault_groups(value: dict[str, Any]) -> set[str]:
    groups = set(value.get("broker_groups") or [])
    for node in value.get("nodes") or []:
        if "/" in str(node):
            groups.add(str(node).split("/")[0])
    return groups


def stages_of(
    fault: dict[str, Any],
    logs: list[dict[str, Any]],
    completions: list[tuple[int, int, str, str, str]],
    keys_ok_before: Any,
    first_ok_after: Any,
) -> dict[str, float | None]:
    start = fault["start"]
    groups = fault_groups(fault["value"])
    ms: dict[str, float | None] = dict.fromkeys(STAGES)
    ms["fault"] = (fault["end"] - start) / 1e6
    signalled = fault["value"].get("signalled_s")
    if isinstance(signalled, int | float):
        ms["signalled"] = signalled * 1e3 - start / 1e6

    def after(pred: Any, since: int) -> dict[str, Any] | None:
        return next((r for r in logs if r["t"] >= since and pred(r)), None)

    def in_group(r: dict[str, Any]) -> bool:
        return not groups or str(r.get("node", "")).split("/")[0] in groups

    leader = after(lambda r: r["msg"] == "role change" and r.get("role") == "leader" and in_group(r), start)
    if leader is not None:
        node = leader["node"]
        ms["elected"] = (leader["t"] - start) / 1e6
        master = after(lambda r: r["msg"] == "switched to master" and r.get("node") == node, start)
        if master is not None:
            ms["master"] = (master["t"] - start) / 1e6
            reg = after(
                lambda r: (
                    r["msg"].startswith("registered") and r.get("node") == node and r.get("broker_id") == 0
                ),
                master["t"],
            )
            if reg is not None:
                ms["registered"] = (reg["t"] - start) / 1e6
        # the history names a one-group run's nodes without their group (n2, not broker-a/n2)
        short = (
            node.split("/", 1)[1] if "/" in node and not any("/" in c[4] for c in completions[:1]) else node
        )
        for t, _inv, typ, _key, n in completions:
            if t < start or n not in (node, short):
                continue
            if ms["first_answer"] is None:
                ms["first_answer"] = (t - start) / 1e6
            if typ == "ok":
                ms["first_ok"] = (t - start) / 1e6
                break
    keys = keys_ok_before(start, groups)
    ends = [first_ok_after(k, start) for k in keys]
    if keys and all(x is not None for x in ends):
        ms["recovery"] = (max(ends) - start) / 1e6  # type: ignore[type-var]
    return ms


def analyze(run_dir: Path) -> dict[str, Any]:
    """Stages of every fault of one finished run directory."""
    run_dir = run_dir.resolve()
    events = load_events(run_dir)
    origin = clock_origin_ns(run_dir)
    offset = wall_offset_s()

    def to_hist_ns(wall_s: float) -> int:
        return int((wall_s - offset) * 1e9) - origin

    logs = broker_log_events(run_dir, to_hist_ns)
    invoked: dict[Any, int] = {}
    # (completed at, invoked at, type, key, node) of every client operation
    completions: list[tuple[int, int, str, str, str]] = []
    for e in events:
        proc = e.get("process")
        if proc == "nemesis" or e.get("f") == "drain":
            continue
        if e["type"] == "invoke":
            invoked[proc] = e["time"]
        else:
            completions.append(
                (e["time"], invoked.pop(proc, e["time"]), e["type"], str(e.get("key")), str(e.get("node")))
            )
    completions.sort()
    oks = [(t, inv, key) for t, inv, typ, key, _n in completions if typ == "ok"]

    def keys_ok_before(start: int, groups: set[str]) -> set[str]:
        return {
            k
            for t, _i, k in oks
            if start - RECOVERY_LOOKBACK_NS <= t < start
            and (not groups or any(f"/{g}/" in k for g in groups))
        } or {k for t, _i, k in oks if start - RECOVERY_LOOKBACK_NS <= t < start}

    def first_ok_after(key: str, start: int) -> int | None:
        return min((t for t, inv, k in oks if k == key and inv >= start), default=None)

    found = [stages_of(f, logs, completions, keys_ok_before, first_ok_after) for f in faults(events)]
    checker: dict[str, Any] = {}
    results = run_dir / "results.json"
    if results.exists():
        checker = json.loads(results.read_text()).get("recovery") or {}
    return {"run_dir": str(run_dir), "faults": found, "checker": checker}


def run_once(args: argparse.Namespace, out: Path, tree: Path = ROOT) -> Path:
    argv = [
        sys.executable,
        "-m",
        "jepsen",
        "run",
        "--backend",
        "local",
        "--workload",
        "queue",
        "--nemesis",
        args.nemesis,
        "--rate",
        "max",
        "--time",
        str(args.time),
        "--groups",
        str(args.groups),
        "--out",
        str(out),
        "--name",
        "recovery-bench",
        "--no-progress",
    ]
    if args.addresses:
        argv += ["--addresses", args.addresses]
    if args.no_check:
        argv.append("--no-check")
    env = {**os.environ, "PYTHONPATH": str(tree)}  # every process of the run imports that tree's code
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tree, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith(("recovery", "verdict", "ops")):
            print(f"  {line}", flush=True)
    run_dir = out / "recovery-bench" / "latest"
    if proc.returncode not in (0, 1, 2):
        if not (run_dir / "history").is_dir():
            raise RuntimeError(f"jepsen run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        # recorded, but not checked: the stages (recovery included) come from the history alone
        print(f"  (jepsen run exited {proc.returncode}: {proc.stderr.strip()[-300:]})", flush=True)
    return run_dir


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 1) if xs else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per run the median of each stage over its faults; then medians over runs."""
    per_run: list[dict[str, float | None]] = []
    for r in runs:
        row: dict[str, float | None] = {}
        for s in STAGES:
            row[s] = _median([f[s] for f in r["faults"] if f[s] is not None])
        recs = [f["recovery"] for f in r["faults"] if f["recovery"] is not None]
        row["recovery_max"] = round(max(recs), 1) if recs else None
        per_run.append(row)
    out: dict[str, Any] = {}
    for s in (*STAGES, "recovery_max"):
        vals = [row[s] for row in per_run if row[s] is not None]
        out[f"{s}_p50_ms" if s != "recovery_max" else "recovery_max_ms"] = _median(vals)  # type: ignore[arg-type]
    out["recovery_p50_ms"] = out.pop("recovery_p50_ms")
    checker_p50 = [v.get("recovery_p50_ms") for r in runs for v in r["checker"].values()]
    checker_max = [v.get("recovery_max_ms") for r in runs for v in r["checker"].values()]
    out["checker_recovery_p50_ms"] = _median([x for x in checker_p50 if x is not None])
    out["checker_recovery_max_ms"] = _median([x for x in checker_max if x is not None])
    out["runs"] = len(runs)
    out["faults"] = sum(len(r["faults"]) for r in runs)
    return out


def print_run(r: dict[str, Any]) -> None:
    print(f"{r['run_dir']}")
    print("  " + " ".join(f"{s:>12}" for s in STAGES) + "   (ms after the fault's start)")
    for f in r["faults"]:
        print("  " + " ".join(f"{'-' if f[s] is None else round(f[s]):>12}" for s in STAGES))
    for kind, v in r["checker"].items():
        print(f"  checker {kind}: p50 {v.get('recovery_p50_ms')} ms, max {v.get('recovery_max_ms')} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--time", type=float, default=60.0, help="seconds of load and faults per run")
    ap.add_argument("--nemesis", default="kill-leader", help="kill-leader or partition-leader")
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--addresses", default="", help="HOST:PORT where the runs listen (see jepsen run)")
    ap.add_argument(
        "--no-check",
        action="store_true",
        help="record only (the stages and the recovery come from the history; no checker figures)",
    )
    ap.add_argument("--analyze", nargs="*", type=Path, default=None, help="finished run directories instead")
    ap.add_argument("--keep", type=Path, default=None, help="keep the runs' directories under this one")
    ap.add_argument(
        "--tree", type=Path, default=ROOT, help="the source tree whose code runs [default: this one]"
    )
    ap.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="a source tree of the code to compare with (e.g. 'git archive REV | tar -x -C DIR'): "
        "its runs alternate with this tree's, and the JSON line gets baseline_* figures",
    )
    args = ap.parse_args()
    runs: list[dict[str, Any]] = []
    base: list[dict[str, Any]] = []
    if args.analyze:
        for d in args.analyze:
            runs.append(analyze(d))
            print_run(runs[-1])
    else:
        with tempfile.TemporaryDirectory(prefix="recovery-bench-") as tmp:
            if args.keep is not None:
                tmp = str(args.keep)
            for i in range(args.runs):
                what = f"{args.nemesis}, {args.groups} group(s), {args.time:.0f} s"
                print(f"run {i + 1}/{args.runs}: {what}", flush=True)
                runs.append(analyze(run_once(args, Path(tmp) / f"run-{i}", args.tree.resolve())))
                print_run(runs[-1])
                if args.baseline_tree is not None:
                    print(f"baseline run {i + 1}/{args.runs}: {what}", flush=True)
                    base.append(
                        analyze(run_once(args, Path(tmp) / f"base-{i}", args.baseline_tree.resolve()))
                    )
                    print_run(base[-1])
    out = summarize(runs)
    if base:
        out.update({f"baseline_{k}": v for k, v in summarize(base).items()})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
