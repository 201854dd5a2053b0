"""``jepsen campaign``: the click command over ``campaign.run_campaign``.

Exit status as ``jepsen run``: 0 every run valid, 1 any invalid, 2 any unknown, 3 any run
not checked (harness or checker failure).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from jepsen.history import SHARD_SUFFIXES
from jepsen.run.campaign import MAX_RUNS, exit_code, run_campaign


@click.command("campaign")
@click.option("--runs", type=click.IntRange(1, MAX_RUNS), default=5, show_default=True, help="how many tests")
@click.option(
    "--seed", type=int, default=None, help="the campaign's seed (printed; the same seed replays it)"
)
@click.option(
    "--time", "time_", type=click.FloatRange(min=2), default=10, show_default=True, help="seconds of each run"
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.5),
    default=None,
    help="seconds each fault lasts, and of calm between faults [default: time / 6, at least 0.5]",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="where the runs and campaign.json/.html go [default: jepsen-runs/campaign-<seed>]",
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "inprocess", "spark"]),
    default="auto",
    show_default=True,
    help="the checker's engine for all histories (auto: small ones in-process, the rest on Spark)",
)
@click.option(
    "--history-format",
    type=click.Choice(list(SHARD_SUFFIXES)),
    default=None,
    help="how every run records its history (as jepsen run's option) [default: "
    "$LEDGERMQ_HISTORY_FORMAT, else parquet]",
)
def campaign(
    runs: int,
    seed: int | None,
    time_: float,
    interval: float | None,
    out: Path | None,
    engine: str,
    history_format: str | None,
) -> None:
    """N short tests, each a random workload under a random pair of nemeses, checked together."""
    if seed is None:
        import random

        seed = random.SystemRandom().randrange(1 << 31)
    out = out or Path("jepsen-runs") / f"campaign-{seed}"
    click.echo(f"campaign  seed {seed}, {runs} runs of {time_:g} s, out {out}")
    doc = run_campaign(
        runs,
        seed,
        time_,
        out,
        interval=interval,
        engine=engine,
        log=click.echo,
        history_format=history_format,
    )
    for row in doc["runs"]:
        rec = (
            "-"
            if row["recovery_max_ms"] is None
            else f"p50 {row['recovery_p50_ms']:,.0f} / max {row['recovery_max_ms']:,.0f} ms"
        )
        click.echo(
            f"run {row['run']:>3}  {row['workload']:<8} {' + '.join(row['nemeses']):<44} "
            f"{row['verdict']:<8} {', '.join(row['anomalies']) or '-':<20} {rec}"
        )
        if row["error"]:
            click.echo(f"          {row['error']}", err=True)
    click.echo(
        f"summary   {doc['valid']} valid, {doc['invalid']} invalid, {doc['other']} other; {out / 'campaign.html'}"
    )
    sys.exit(exit_code(doc))


if __name__ == "__main__":
    campaign()
