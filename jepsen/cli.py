"""The ``jepsen`` command: a click group so other modules can add commands (``run``).

Only ``analyze`` lives here. Spark is imported inside the command, so ``jepsen
--help`` stays instant.
"""

from __future__ import annotations

import os
import sys

import click

from common.gc_tuning import tune_gc
from jepsen.checker.analyze import DEFAULT_BUDGET, FileOutcome, analyze_files


class _LazyGroup(click.Group):
    """``jepsen run``, ``jepsen campaign`` and ``jepsen probe`` (the harness) are imported only when asked for: every other command,
    ``jepsen analyze`` above all, then starts without loading the harness and its clients."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), "run", "campaign", "probe"})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "run" and "run" not in self.commands:
            from jepsen.run.run_cli import run

            self.add_command(run)
        if cmd_name == "campaign" and "campaign" not in self.commands:
            from jepsen.run.campaign_cli import campaign

            self.add_command(campaign)
        if cmd_name == "probe" and "probe" not in self.commands:
            from jepsen.probe.suite import probe

            self.add_command(probe)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup)
def main() -> None:
    """ledgermq's Jepsen-style harness and consistency checker."""
    tune_gc()  # a run's controller and the checker allocate per operation too (common.gc_tuning)


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
    rows = [
        (o.path, o.workload or "?", str(o.ops) if o.error is None else "-", o.verdict, _anomaly_summary(o))
        for o in outcomes
    ]
    head = ("history", "workload", "ops", "verdict", "anomalies")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    for r in [head, *rows]:
        line = "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
        click.echo(line.rstrip())
    valid = sum(1 for o in outcomes if o.valid is True and o.error is None)
    click.echo(
        f"{len(outcomes)} histories: {valid} valid, "
        f"{sum(1 for o in outcomes if o.valid is False)} invalid, "
        f"{sum(1 for o in outcomes if o.error is None and o.valid not in (True, False))} unknown, "
        f"{sum(1 for o in outcomes if o.error is not None)} unreadable; {seconds:.1f} s"
    )


@main.command()
@click.option(
    "--workload",
    type=click.Choice(["log", "register", "kv", "delay", "txn", "retry", "order"]),
    default=None,
    help="Workload of the histories (default: inferred from their operations).",
)
@click.option(
    "--out",
    "out_dir",
    default="store/analysis",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Writes OUT/<history name>/results.json and report.html, and OUT/summary.json.",
)
@click.option(
    "--master",
    default=None,
    help="Spark master: local[N], spark://host:7077 (standalone) or sc://host:15002 (Spark "
    "Connect). Default: $LEDGERMQ_SPARK_MASTER, else the cluster `jepsen spark start` runs, "
    "else local[2].",
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "inprocess", "spark"]),
    default="auto",
    show_default=True,
    help="auto: histories up to 8 MB (about 30k operations) are judged in this process by the "
    "same rules, larger ones on Spark; inprocess/spark: force one path.",
)
@click.option(
    "--history-uri",
    "history_uris",
    multiple=True,
    help="Where the cluster's executors read each history (a shared path or any Hadoop URI: "
    "hdfs://, s3a://, file:///shared/...), one per HISTORY in order; implies --engine spark.",
)
@click.option(
    "--ship-history/--no-ship-history",
    "ship",
    default=None,
    help="Send the histories to Spark through the session (Arrow batches on Spark Connect) "
    "instead of a path [default: ship when the master is on another host and no --history-uri].",
)
@click.option(
    "--budget",
    default=DEFAULT_BUDGET,
    show_default=True,
    type=float,
    help="Seconds of linearizability search per key; a key that runs out is 'unknown'.",
)
@click.option("--no-report", is_flag=True, help="Skip report.html (results.json only).")
@click.argument("histories", nargs=-1, required=True, type=click.Path())
def analyze(
    workload: str | None,
    out_dir: str,
    master: str | None,
    engine: str,
    history_uris: tuple[str, ...],
    ship: bool | None,
    budget: float,
    no_report: bool,
    histories: tuple[str, ...],
) -> None:
    """Check HISTORY files (JSON Lines per docs/history.md, Jepsen etcd text logs, Jepsen EDN).

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
    if history_uris and len(history_uris) != len(histories):
        raise click.UsageError(
            f"{len(history_uris)} --history-uri for {len(histories)} histories: give one per history"
        )
    _print_crash_notes(histories)
    try:
        res = analyze_files(
            list(histories),
            workload=workload,
            out_dir=out_dir,
            master=master,
            budget=budget,
            report=not no_report,
            engine=engine,
            history_uris=list(history_uris) or None,
            ship=ship,
        )
    except Exception as exc:  # noqa: BLE001 - Spark/Java failures: a message, not a traceback
        # one line: a Java stack trace says nothing a user can act on
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        click.echo(f"error: the checker could not run: {type(exc).__name__}: {first}", err=True)
        if type(exc).__name__ == "SparkUnavailable":
            # a Spark Connect client that never got an answer keeps retrying in pool
            # threads that interpreter shutdown would wait for: leave now
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(4)
        sys.exit(4)
    print_table(res["files"], res["seconds"])
    for o in res["files"]:
        print_recovery(o.path, o.result)
    for o in res["files"]:
        if o.error is not None:
            click.echo(f"error: {o.error}", err=True)
    sys.exit(res["exit"])


def _print_crash_notes(histories: tuple[str, ...] | list[str]) -> None:
    """A note on stderr for each part a killed recorder left half-written (the checker reads
    only whole parts, so such a history is judged without that part's events)."""
    from jepsen.checker.shards import crash_notes

    for h in histories:
        for note in crash_notes(h):
            click.echo(f"note: {note}", err=True)


def print_recovery(path: str, result: dict) -> None:
    """Recovery per fault kind (p50 / max over the faults of that kind), when the history has faults."""
    rec = result.get("recovery") or {}
    for kind, r in sorted(rec.items()):

        def ms(v: float | None) -> str:
            return "never" if v is None else f"{v:,.0f} ms"

        click.echo(
            f"recovery  {kind}: {r['recovered']}/{r['faults']} recovered, p50 {ms(r['recovery_p50_ms'])}, "
            f"max {ms(r['recovery_max_ms'])}, longest gap {ms(r['gap_max_ms'])}  ({path})"
        )


@main.group()
def history() -> None:
    """Work with recorded histories (files or folders of shards)."""


@history.command("export")
@click.argument("run_dir", type=click.Path(exists=True))
@click.option(
    "-o",
    "--output",
    default=None,
    help="file to write (default RUN_DIR/history-export.jsonl; '-' for standard output); "
    "with --parquet a folder (default RUN_DIR/history-parquet)",
)
@click.option(
    "--parquet",
    is_flag=True,
    help="write a JSON Lines history as Parquet parts instead (a shard per JSON Lines shard; 10-20x smaller, "
    "read by jepsen analyze without parsing JSON)",
)
def history_export(run_dir: str, output: str | None, parquet: bool) -> None:
    """Write RUN_DIR's history (a run folder, a folder of shards or a file; JSON Lines or Parquet) as one
    JSON Lines file ordered by time, or with --parquet as a folder of Parquet parts."""
    from pathlib import Path

    from jepsen.checker import parse, shards

    _print_crash_notes([run_dir])
    try:
        if parquet:
            given = Path(run_dir)
            is_run = any((given / name).exists() for name in shards.RUN_HISTORY)
            folder = Path(output) if output else (given if is_run else given.parent) / "history-parquet"
            if folder.exists() and any(folder.iterdir()):
                raise click.ClickException(f"{folder} is not empty: name a new folder with -o")
            n = shards.to_parquet(run_dir, folder)
            click.echo(f"{n} events -> {folder}", err=True)
            return
        if output == "-":
            n = shards.export(run_dir, sys.stdout)
            return
        given = Path(run_dir)
        is_run = any((given / name).exists() for name in shards.RUN_HISTORY)
        base = given if is_run else given.parent  # never inside a shard folder: it would become a shard
        target = Path(output) if output else base / "history-export.jsonl"
        tmp = target.with_name(target.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            n = shards.export(run_dir, fh)
        tmp.replace(target)
    except parse.HistoryError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot write {output or 'the export'}: {exc}") from None
    click.echo(f"{n} events -> {target}", err=True)


@main.group()
def spark() -> None:
    """A local standalone Spark cluster and Spark Connect server for the checker (from pip's pyspark)."""


_STATE_DIR_OPTION = click.option(
    "--state-dir",
    default=None,
    help="Where PIDs, ports and logs are kept (default $LEDGERMQ_SPARK_STATE or ~/.ledgermq/spark).",
)


@spark.command("start")
@_STATE_DIR_OPTION
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address the master, worker and server bind."
)
@click.option("--master-port", type=int, default=None, help="Master port (default: a free one).")
@click.option("--connect-port", type=int, default=None, help="Spark Connect port (default: a free one).")
@click.option(
    "--cores",
    type=click.IntRange(min=1),
    default=None,
    help="Cores to use (default: all); the worker offers twice as many task slots, half for the Connect server.",
)
@click.option("--memory", default="3g", show_default=True, help="Worker memory for all executors.")
@click.option("--no-connect", is_flag=True, help="Only the master and worker, no Spark Connect server.")
def spark_start(
    state_dir: str | None,
    host: str,
    master_port: int | None,
    connect_port: int | None,
    cores: int | None,
    memory: str,
    no_connect: bool,
) -> None:
    """Start a master, a worker and a Spark Connect server in the background."""
    from jepsen.checker import spark_cluster

    try:
        c = spark_cluster.start(
            state_dir,
            host=host,
            master_port=master_port,
            connect_port=connect_port,
            cores=cores,
            memory=memory,
            with_connect=not no_connect,
        )
    except spark_cluster.ClusterError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(4)
    click.echo(f"master  {c.master}")
    if c.connect:
        click.echo(f"connect {c.connect}")
    click.echo(
        f"logs    {c.state_dir / 'logs'}  (jepsen analyze uses this cluster until `jepsen spark stop`)"
    )


@spark.command("status")
@_STATE_DIR_OPTION
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"master": "spark://...", "connect": "sc://..."}.'
)
def spark_status(state_dir: str | None, as_json: bool) -> None:
    """Show the cluster's URLs; exit 1 when it is not (fully) running."""
    import json

    from jepsen.checker import spark_cluster

    c = spark_cluster.load(state_dir)
    up = spark_cluster.alive(c) if c is not None else {}
    if c is None or not up or not all(up.values()):
        down = ", ".join(r for r, ok in up.items() if not ok)
        click.echo(
            f"no Spark cluster running (state in {spark_cluster.state_dir(state_dir)})"
            + (f": {down} down" if down else ""),
            err=True,
        )
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(c.urls()))
        return
    for role, pid in c.pids.items():
        click.echo(f"{role:8}pid {pid}  log {c.logs.get(role, '-')}")
    click.echo(f"master  {c.master}")
    if c.connect:
        click.echo(f"connect {c.connect}")


@spark.command("stop")
@_STATE_DIR_OPTION
def spark_stop(state_dir: str | None) -> None:
    """Stop the processes `jepsen spark start` started (by their recorded PIDs)."""
    from jepsen.checker import spark_cluster

    stopped = spark_cluster.stop(state_dir)
    click.echo(f"stopped {', '.join(stopped)}" if stopped else "nothing was running")
