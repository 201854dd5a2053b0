"""``jepsen run``: the project's main job, as a click command.

Attach it to the ``jepsen`` click group with ``group.add_command(run_cli.run)``; until
then ``python -m jepsen.harness.run_cli`` runs it directly. Exit status: 0 valid,
1 invalid, 2 unknown, 3 not checked (checker missing, or the harness itself failed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .backends import Unsupported
from .nemesis import FAULTS
from .proxy import ProxyError
from .runner import DEFAULT_NEMESIS, RunConfig
from .runner import run as run_test
from .workloads import WORKLOADS


def _nemesis_list(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.split(",") if v.strip() and v.strip() != "none")
    unknown = [v for v in items if v not in FAULTS]
    if unknown:
        raise click.BadParameter(f"unknown {', '.join(unknown)}; choose from {', '.join(FAULTS)} or none")
    return items


@click.command("run")
@click.option("--backend", type=click.Choice(["local", "docker"]), default="local", show_default=True,
              help="local: one OS process per node on 127.0.0.x, partitions through per-link proxies; "
                   "docker: the docker-compose.yml group (queue workload), faults through Docker")
@click.option("--system", type=click.Choice(["ledger", "pysyncobj", "broker"]), default="ledger", show_default=True,
              help="the system under test (pysyncobj: the log workload on a 3-node pysyncobj group; "
                   "broker: 2 nameservers + 3 brokers, chosen automatically for the queue workload)")
@click.option("--workload", type=click.Choice(sorted(WORKLOADS)), default="log", show_default=True)
@click.option("--nemesis", default=",".join(DEFAULT_NEMESIS), show_default=True, callback=_nemesis_list,
              help=f"comma-separated faults, cycled in order, or 'none': {', '.join(FAULTS)}")
@click.option("--time", "time_", type=click.FloatRange(min=1), default=40, show_default=True,
              help="seconds of load and faults")
@click.option("--interval", type=click.FloatRange(min=0.5), default=4, show_default=True,
              help="seconds each fault lasts, and of calm between faults")
@click.option("--rate", type=click.FloatRange(min=0.1), default=50, show_default=True,
              help="operations per second over all clients")
@click.option("--clients", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("jepsen-runs"),
              show_default=True, help="results go to OUT/<test>/<timestamp>/")
@click.option("--name", default=None, help="test name (the directory under OUT); default from system, workload, nemesis")
@click.option("--seed", type=int, default=None, help="seed for choices of operations and fault targets")
@click.option("--op-timeout", type=click.FloatRange(min=0.5), default=5, show_default=True,
              help="seconds before an operation is recorded as info")
@click.option("--send-batch", type=click.IntRange(min=1, max=1024), default=1, show_default=True,
              help="queue workload: sends to one queue within 10 ms of each other go as one batch of up to N "
                   "(one ledger entry); each stays its own operation in the history")
@click.option("--no-check", is_flag=True, help="record only; skip the checker")
@click.option("--keep-data", is_flag=True, help="keep node data directories even when the run is valid")
@click.option("--no-progress", is_flag=True, help="no progress bar")
@click.option("--broken-adapter", type=click.Choice(["ack-unsent", "local-reads"]), default=None, hidden=True,
              help="harness self-test: a log client that acknowledges sends it never made (ack-unsent), "
                   "a register client that reads its own replica (local-reads)")
def run(backend: str, system: str, workload: str, nemesis: tuple[str, ...], time_: float, interval: float,
        rate: float, clients: int, out: Path, name: str | None, seed: int | None, op_timeout: float, send_batch: int,
        no_check: bool,
        keep_data: bool, no_progress: bool, broken_adapter: str | None) -> None:
    """Load a 3-node group, inject faults, record the history and check it."""
    cfg = RunConfig(workload=workload, system=system, backend=backend, nemesis=nemesis, time=time_,
                    interval=interval, rate=rate, clients=clients, out=out, seed=seed, op_timeout=op_timeout,
                    send_batch=send_batch,
                    progress=not no_progress and sys.stderr.isatty(), check=not no_check,
                    keep_data=keep_data, broken_adapter=broken_adapter, name=name)
    try:
        result = run_test(cfg)
    except Unsupported as exc:
        raise click.UsageError(str(exc)) from None
    except (TimeoutError, OSError, ProxyError) as exc:  # the group never came up, a port was taken, ...
        click.echo(f"harness error: {exc}", err=True)
        sys.exit(3)
    s = result.summary
    counts = s.get("counts", {})
    faults = s.get("nemesis", {}).get("ops", {})
    leaders = s.get("leaders", {})
    click.echo(f"test      {cfg.test_name()}")
    click.echo(f"ops       ok={counts.get('ok', 0)} fail={counts.get('fail', 0)} info={counts.get('info', 0)}")
    click.echo(f"faults    {', '.join(f'{k}={v}' for k, v in sorted(faults.items())) or 'none'}")
    click.echo(f"leaders   {leaders.get('leader_changes', 0)} changes, terms {leaders.get('terms_seen', [])}")
    check = s.get("check", {})
    results = check.get("results") or {}
    if results.get("anomaly-types"):
        click.echo(f"anomalies {', '.join(results['anomaly-types'])}")
    if s.get("harness_anomalies"):
        click.echo(f"harness   {s['harness_anomalies']}")
    verdict = {True: "VALID", False: "INVALID", "unknown": "UNKNOWN"}.get(result.valid, "NOT CHECKED")  # type: ignore[arg-type]
    click.echo(f"verdict   {verdict}")
    if result.valid is None and check.get("output"):
        click.echo(f"checker   {check['output'][-1500:]}", err=True)
    click.echo(f"history   {result.history}")
    click.echo(f"report    {result.report if result.report.exists() else result.run_dir}")
    sys.exit(result.exit_code)


if __name__ == "__main__":
    run()
