"""The ``jepsen`` command: a click group so other modules can add commands (``run``).

Only ``analyze`` lives here. Spark is imported inside the command, so ``jepsen
--help`` stays instant.
"""

from __future__ import annotations

import sys

import click

from jepsen.checker.analyze import DEFAULT_BUDGET, FileOutcome, analyze_files


@click.group()
def main() -> None:
    """ledgermq's Jepsen-style harness and consistency checker."""


def _anomaly_summary(o: FileOutcome) -> str:
    if o.error is not None:
        return o.error
    counts = o.result.get("counts", {})
    informational = set(o.result.get("informational", []))
    parts = [f"{k}={v}" for k, v in counts.items() if k not in informational]
    if o.result.get("unknown-keys"):
        parts.append(f"unknown keys={len(o.result['unknown-keys'])}")
    return ", ".join(parts) or "-"


def print_table(outcomes: list[FileOutcome], seconds: float) -> None:
    """A short verdict table, one line per history."""
    rows = [(o.path, o.workload or "?", str(o.ops) if o.error is None else "-", o.verdict, _anomaly_summary(o))
            for o in outcomes]
    head = ("history", "workload", "ops", "verdict", "anomalies")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    for r in [head, *rows]:
        line = "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
        click.echo(line.rstrip())
    valid = sum(1 for o in outcomes if o.valid is True and o.error is None)
    click.echo(f"{len(outcomes)} histories: {valid} valid, "
               f"{sum(1 for o in outcomes if o.valid is False)} invalid, "
               f"{sum(1 for o in outcomes if o.error is None and o.valid not in (True, False))} unknown, "
               f"{sum(1 for o in outcomes if o.error is not None)} unreadable; {seconds:.1f} s")


@main.command()
@click.option("--workload", type=click.Choice(["log", "register", "kv"]), default=None,
              help="Workload of the histories (default: inferred from their operations).")
@click.option("--out", "out_dir", default="store/analysis", show_default=True,
              type=click.Path(file_okay=False),
              help="Writes OUT/<history name>/results.json and report.html, and OUT/summary.json.")
@click.option("--master", default=None,
              help="Spark master: local[N] (default local[2]), spark://host:7077 (standalone) or "
                   "sc://host:15002 (Spark Connect; the server must see the history paths).")
@click.option("--budget", default=DEFAULT_BUDGET, show_default=True, type=float,
              help="Seconds of linearizability search per key; a key that runs out is 'unknown'.")
@click.option("--no-report", is_flag=True, help="Skip report.html (results.json only).")
@click.argument("histories", nargs=-1, required=True, type=click.Path(dir_okay=False))
def analyze(workload: str | None, out_dir: str, master: str | None, budget: float, no_report: bool,
            histories: tuple[str, ...]) -> None:
    """Check HISTORY files (JSON Lines per shared/HISTORY.md, Jepsen etcd text logs, Jepsen EDN).

    \b
    Exit status:
      0  every history is valid
      1  some history is invalid (an anomaly was found)
      2  some history is unknown (a linearizability search ran out of its budget)
      3  some history is unreadable or malformed (the message names file and line;
         the other histories are still checked)
      4  the checker itself could not run (e.g. no Java, Spark master unreachable)
    When several apply, 1 wins over 3, and 3 over 2.
    """
    try:
        res = analyze_files(list(histories), workload=workload, out_dir=out_dir, master=master,
                            budget=budget, report=not no_report)
    except Exception as exc:  # noqa: BLE001 - Spark/Java failures: a message, not a traceback
        click.echo(f"error: the checker could not run: {type(exc).__name__}: {exc}", err=True)
        sys.exit(4)
    print_table(res["files"], res["seconds"])
    for o in res["files"]:
        if o.error is not None:
            click.echo(f"error: {o.error}", err=True)
    sys.exit(res["exit"])


def _attach_run() -> None:
    """``jepsen run`` (the harness) lives in its own module; importing it stays cheap (no Spark)."""
    from jepsen.harness.run_cli import run

    main.add_command(run)


_attach_run()
