"""``jepsen campaign``: many short tests, each a random workload under a random pair of faults.

One seed decides everything the campaign chooses (workload, the two nemeses, each run's
own seed), so ``--seed S`` replays the same campaign and the command printed for each run
replays that run alone (``jepsen run ... --seed s``; the faults then hit the same choices
of nodes, although timing, as in any real run, differs). The runs record only; the
histories are then judged together, in one checker session in this process (one call per
checker workload, so a Spark JVM starts once at most), and each run's ``results.json``
and ``report.html`` land in its own directory, as after ``jepsen run``. The campaign
writes ``campaign.json`` and ``campaign.html``: one row per run (workload, nemeses,
verdict, anomalies, recovery p50/max over all its faults) linking to the run's report.

The pool of nemeses holds only faults that today's system is expected to survive with a
valid history and a group that recovers (``CAMPAIGN_NEMESES``): ``lose-data`` in its
default form (a truncated segment, which the leader now repairs), not the wipe, empty-log
and hard-state variants, which find bugs until storage healing is
complete; ``disk-full`` is left out because it needs root and its setup restarts every
node.
"""

from __future__ import annotations

import html
import json
import random
import shlex
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jepsen.run.config import VERDICTS, RunConfig, RunResult
from jepsen.run.runner import run as run_test
from jepsen.workloads.registry import WORKLOADS

#: workload -> system it runs on in a campaign
CAMPAIGN_WORKLOADS: dict[str, str] = {"log": "ledger", "register": "ledger", "queue": "broker"}
#: faults a campaign draws its pairs from: every one is expected to leave the history valid today
CAMPAIGN_NEMESES: tuple[str, ...] = (
    "kill-leader",
    "kill-random",
    "pause-leader",
    "pause-random",
    "partition-leader",
    "partition-random-halves",
    "partition-majorities-ring",
    "bridge",
    "corrupt-tail",
    "slow-network",
    "lossy-network",
    "lose-data",
    "forge-peer",
)
MAX_RUNS = 1000  # a campaign is bounded; split a bigger one into several seeds


@dataclass
class CampaignRun:
    """One planned run: what it tests and the seed that replays it."""

    number: int
    workload: str
    system: str
    nemeses: tuple[str, str]
    seed: int
    time: float
    interval: float
    run_dir: Path | None = None
    history: Path | None = None
    valid: bool | str | None = None
    anomalies: list[str] = field(default_factory=list)
    recovery_p50_ms: float | None = None
    recovery_max_ms: float | None = None
    faults: int = 0
    error: str | None = None

    def replay(self, out: Path) -> str:
        """The ``jepsen run`` command that replays this run on its own."""
        args = [
            "jepsen",
            "run",
            "--system",
            self.system,
            "--workload",
            self.workload,
            "--nemesis",
            ",".join(self.nemeses),
            "--time",
            f"{self.time:g}",
            "--interval",
            f"{self.interval:g}",
            "--seed",
            str(self.seed),
            "--out",
            str(out),
        ]
        return shlex.join(args)

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return "ERROR"
        return {True: "valid", False: "INVALID", "unknown": "unknown"}.get(self.valid, "not checked")  # type: ignore[arg-type]


def plan(runs: int, seed: int, time_s: float, interval: float) -> list[CampaignRun]:
    """The campaign's runs, a pure function of its arguments (so a seed replays it)."""
    if not 1 <= runs <= MAX_RUNS:
        raise ValueError(f"--runs must be 1..{MAX_RUNS}, got {runs}")
    rng = random.Random(seed)
    out = []
    for i in range(runs):
        workload = rng.choice(sorted(CAMPAIGN_WORKLOADS))
        pair = tuple(rng.sample(CAMPAIGN_NEMESES, 2))
        out.append(
            CampaignRun(
                i + 1, workload, CAMPAIGN_WORKLOADS[workload], pair, rng.randrange(1 << 31), time_s, interval
            )
        )  # type: ignore[arg-type]
    return out


def _recovery(result: dict[str, Any]) -> tuple[float | None, float | None, int]:
    rec = [x["recovery_ms"] for x in result.get("faults") or [] if x.get("recovery_ms") is not None]
    if not rec:
        return None, None, len(result.get("faults") or [])
    return round(statistics.median(rec), 1), round(max(rec), 1), len(result.get("faults") or [])


def check_all(runs: list[CampaignRun], scratch: Path, engine: str = "auto") -> None:
    """Judge every recorded history in this process's one checker session; fill in the verdicts."""
    from jepsen.checker.analyze import DEFAULT_BUDGET, analyze_files

    by_checker: dict[str, list[CampaignRun]] = {}
    for r in runs:
        if r.history is not None and r.error is None:
            by_checker.setdefault(WORKLOADS[r.workload].checker, []).append(r)
    for checker, group in sorted(by_checker.items()):
        res = analyze_files(
            [r.history for r in group],  # type: ignore[misc]
            workload=checker,
            out_dir=scratch / checker,
            budget=DEFAULT_BUDGET,
            report=True,
            engine=engine,
        )
        for r, outcome in zip(group, res["files"], strict=True):
            assert r.run_dir is not None
            for name in ("results.json", "report.html"):
                src = outcome.out_dir / name
                if src.exists():
                    shutil.move(str(src), r.run_dir / name)
            if outcome.error is not None:
                r.error = f"checker: {outcome.error}"
                continue
            r.valid = outcome.valid
            r.anomalies = list(outcome.result.get("anomaly-types") or [])
            r.recovery_p50_ms, r.recovery_max_ms, r.faults = _recovery(outcome.result)
            summary_path = r.run_dir / "run.json"
            try:
                summary = json.loads(summary_path.read_text(encoding="utf-8"))
                summary["valid"] = r.valid
                summary["check"] = {"valid": r.valid, "output": outcome.verdict, "campaign": True}
                summary_path.write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
            except (OSError, ValueError):
                pass  # run.json is the run's own record; the campaign table has the verdict anyway
            if r.valid is True:
                for d in (r.run_dir / "cluster").glob("*/data"):
                    shutil.rmtree(d, ignore_errors=True)


def _row(r: CampaignRun, out: Path) -> dict[str, Any]:
    return {
        "run": r.number,
        "workload": r.workload,
        "system": r.system,
        "nemeses": list(r.nemeses),
        "seed": r.seed,
        "verdict": r.verdict,
        "valid": r.valid,
        "anomalies": r.anomalies,
        "faults": r.faults,
        "recovery_p50_ms": r.recovery_p50_ms,
        "recovery_max_ms": r.recovery_max_ms,
        "error": r.error,
        "run_dir": str(r.run_dir) if r.run_dir else None,
        "report": str((r.run_dir / "report.html").relative_to(out))
        if r.run_dir and (r.run_dir / "report.html").exists()
        else None,
        "replay": r.replay(out),
    }


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def write_summary(out: Path, seed: int, runs: list[CampaignRun], seconds: float) -> dict[str, Any]:
    """``campaign.json`` and ``campaign.html`` in ``out``; returns the JSON document."""
    rows = [_row(r, out) for r in runs]
    doc = {
        "seed": seed,
        "runs": rows,
        "valid": sum(r.valid is True and r.error is None for r in runs),
        "invalid": sum(r.valid is False for r in runs),
        "other": sum(r.valid not in (True, False) or r.error is not None for r in runs),
        "seconds": round(seconds, 1),
    }
    (out / "campaign.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    e = html.escape
    h = [
        "<!doctype html><meta charset='utf-8'><title>jepsen campaign</title>",
        "<style>body{font-family:sans-serif;margin:24px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}.bad{color:#b00;font-weight:bold}"
        "code{font-size:11px}</style>",
        f"<h1>jepsen campaign, seed {seed}</h1>",
        f"<p>{len(rows)} runs: {doc['valid']} valid, {doc['invalid']} invalid, {doc['other']} other; "
        f"{seconds:,.0f} s</p>",
        "<table><tr><th>run</th><th>workload</th><th>nemeses</th><th>verdict</th><th>anomalies</th>"
        "<th>faults</th><th>recovery p50 (ms)</th><th>recovery max (ms)</th><th>replay</th></tr>",
    ]
    for row in rows:
        verdict = e(row["verdict"]) + (f" ({e(row['error'])})" if row["error"] else "")
        link = f"<a href='{e(row['report'])}'>{row['run']}</a>" if row["report"] else str(row["run"])
        cls = "" if row["verdict"] == "valid" else " class='bad'"
        h.append(
            f"<tr><td>{link}</td><td>{e(row['workload'])}</td><td>{e(' + '.join(row['nemeses']))}</td>"
            f"<td{cls}>{verdict}</td><td>{e(', '.join(row['anomalies'])) or '-'}</td><td>{row['faults']}</td>"
            f"<td>{_ms(row['recovery_p50_ms'])}</td><td>{_ms(row['recovery_max_ms'])}</td>"
            f"<td><code>{e(row['replay'])}</code></td></tr>"
        )
    h.append("</table>")
    (out / "campaign.html").write_text("\n".join(h), encoding="utf-8")
    return doc


def run_campaign(
    runs: int,
    seed: int,
    time_s: float,
    out: Path,
    *,
    interval: float | None = None,
    engine: str = "auto",
    log: Any = print,
    progress: bool = False,
    history_format: str | None = None,
) -> dict[str, Any]:
    """Plan, record every run, check them all, write the summary; returns ``campaign.json``'s document.

    ``history_format``: every run's (``RunConfig.history_format``; None: the runs' default)."""
    interval = interval if interval is not None else max(0.5, round(time_s / 6, 1))
    planned = plan(runs, seed, time_s, interval)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for r in planned:
        log(
            f"run {r.number}/{len(planned)}: {r.workload} under {' + '.join(r.nemeses)}; replay: {r.replay(out)}"
        )
        cfg = RunConfig(
            workload=r.workload,
            system=r.system,
            nemesis=r.nemeses,
            time=r.time,
            interval=r.interval,
            out=out,
            seed=r.seed,
            check=False,
            progress=progress,
            history_format=history_format,
        )
        try:
            result: RunResult = run_test(cfg)
        except Exception as exc:  # noqa: BLE001 - one broken run is a row of the table, not the end
            r.error = f"{type(exc).__name__}: {exc}"
            log(f"run {r.number}: harness error: {r.error}")
            continue
        r.run_dir, r.history = result.run_dir, result.history
        problems = result.summary.get("history_problems")
        if problems:
            r.error = f"history breaks the contract: {problems[0]}"
        harness = result.summary.get("harness_anomalies")
        if harness:
            r.valid, r.anomalies = False, sorted(harness)
    scratch = out / ".campaign-check"
    try:
        check_all([r for r in planned if r.valid is None], scratch, engine=engine)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return write_summary(out, seed, planned, time.monotonic() - started)


def exit_code(doc: dict[str, Any]) -> int:
    """0 all valid, 1 any invalid, 2 any unknown, 3 any not checked or failed."""
    rows = doc["runs"]
    if any(r["valid"] is False for r in rows):
        return VERDICTS[False]
    if any(r["error"] or r["valid"] not in (True, False, "unknown") for r in rows):
        return 3
    if any(r["valid"] == "unknown" for r in rows):
        return VERDICTS["unknown"]
    return 0
