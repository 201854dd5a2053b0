"""``jepsen run``: the project's main job, as a click command.

Attach it to the ``jepsen`` click group with ``group.add_command(run_cli.run)``; until
then ``python -m jepsen.run.run_cli`` runs it directly. Exit status: 0 valid,
1 invalid, 2 unknown, 3 not checked (checker missing, or the harness itself failed).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import click

from broker.localcluster import MAX_GROUPS
from jepsen.faults.base import FAULT_SCOPES
from jepsen.faults.registry import FAULTS
from jepsen.net.proxy import ProxyError
from jepsen.ports import (
    DEFAULT_HOST_BASE,
    PortPlanError,
    check_port_base,
    parse_addresses,
    parse_host_base,
)
from jepsen.run.pool import WorkerFailed
from jepsen.run.runner import DEFAULT_NEMESIS, RunConfig
from jepsen.run.runner import run as run_test
from jepsen.systems.base import Unsupported
from jepsen.workloads.registry import WORKLOADS


def _rate(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    if str(value).strip().lower() == "max":
        return math.inf
    try:
        rate = float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither a number nor 'max'") from None
    if not 0.1 <= rate < math.inf:
        raise click.BadParameter(f"{value} is outside 0.1.. (or use 'max')")
    return rate


def _nemesis_list(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.split(",") if v.strip() and v.strip() != "none")
    unknown = [v for v in items if v not in FAULTS]
    if unknown:
        raise click.BadParameter(f"unknown {', '.join(unknown)}; choose from {', '.join(FAULTS)} or none")
    return items


def _fail(message: str) -> None:
    """A bad option value: one line on stderr and exit status 2 (click's usage-error status)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _placement(
    ctx: click.Context,
    system: str,
    groups: int,
    host_base: str | None,
    port_base: int | None,
    addresses: str | None,
) -> dict[str, object]:
    """The broker system's ``--groups``, hosts and ports as backend options (checked here, so a
    bad value is one clear line before anything starts)."""
    if not 1 <= groups <= MAX_GROUPS:
        _fail(f"--groups must be 1..{MAX_GROUPS} (broker groups of 3), got {groups}")
    given = groups != 1 or any(v is not None for v in (host_base, port_base, addresses))
    if not given:
        return {}
    if system not in ("broker", "ledger") or (
        system == "ledger" and ctx.get_parameter_source("system") is not click.core.ParameterSource.DEFAULT
    ):
        _fail("--groups, --host-base, --port-base and --addresses apply to --system broker only")
    if addresses is not None and (host_base is not None or port_base is not None):
        _fail("--addresses stands for --host-base and --port-base: give one or the others")
    try:
        if addresses is not None:
            host_base, port_base = parse_addresses(addresses)
        if host_base is not None:
            parse_host_base(host_base)
        if port_base is not None:
            check_port_base(port_base)
    except PortPlanError as exc:
        _fail(str(exc))
    return {"groups": groups, "host_base": host_base, "port_base": port_base}


@click.command("run")
@click.option(
    "--backend",
    type=click.Choice(["local", "docker"]),
    default="local",
    show_default=True,
    help="local: one OS process per node on 127.0.0.x, partitions through per-link proxies; "
    "docker: the docker-compose.yml group (queue workload), faults through Docker",
)
@click.option(
    "--system",
    type=click.Choice(["ledger", "pysyncobj", "broker", "rocketmq", "rocketmq-rust"]),
    default="ledger",
    show_default=True,
    help="the system under test (pysyncobj: the log workload on a 3-node pysyncobj group; "
    "broker: 2 nameservers + 3 brokers, chosen automatically for the queue workload; "
    "rocketmq: the queue workload against a RocketMQ-protocol cluster you run, see --namesrv; "
    "rocketmq-rust: the queue workload on RocketMQ-Rust's nameserver, master and 2 slaves, "
    "built by scripts/build-rocketmq-rust.sh)",
)
@click.option(
    "--namesrv",
    default=None,
    metavar="HOST:PORT[;HOST:PORT]",
    help="--system rocketmq: the nameserver(s) of the cluster to test (nothing is started)",
)
@click.option(
    "--nodes",
    default=None,
    metavar="NAME[=HOST:PORT],...",
    help="--system rocketmq: the nodes your fault hooks act on; with a broker address the harness "
    "can tell the master (kill-leader) and watch roles",
)
@click.option(
    "--kill-cmd",
    default=None,
    help='--system rocketmq: shell command that kills a node, e.g. "ssh {node} pkill -9 java" '
    "({node}, {addr}, {host} are filled in; also $JEPSEN_NODE...); enables the kill faults",
)
@click.option(
    "--restart-cmd", default=None, help="--system rocketmq: shell command that starts a killed node again"
)
@click.option(
    "--pause-cmd",
    default=None,
    help='--system rocketmq: shell command that pauses a node (e.g. "ssh {node} pkill -STOP java"); '
    "enables the pause faults",
)
@click.option(
    "--resume-cmd", default=None, help="--system rocketmq: shell command that resumes a paused node"
)
@click.option(
    "--topic",
    default=None,
    help="--system rocketmq, rocketmq-rust: the run's topic, created on one group's master "
    "[default: a new JepsenQueue-<time>-<pid>]",
)
@click.option(
    "--queues",
    type=click.IntRange(1, 64),
    default=2,
    show_default=True,
    help="--system rocketmq, rocketmq-rust: queues of the run's topic (one history key each)",
)
@click.option(
    "--broker-name",
    default=None,
    help="--system rocketmq: the broker group holding the topic [default: the first with a master]",
)
@click.option(
    "--groups",
    type=int,
    default=1,
    show_default=True,
    help=f"--system broker: broker groups of 3 behind the nameservers (1..{MAX_GROUPS}); the queue "
    "workload's topic has --queues queues on each, and nodes are named broker-a/n1, broker-b/n2, ...",
)
@click.option(
    "--fault-scope",
    type=click.Choice(FAULT_SCOPES),
    default="one",
    show_default=True,
    help="with --groups > 1: each fault hits one group chosen at random, or every group at once "
    "(kill-leader kills every group's leader together)",
)
@click.option(
    "--host-base",
    default=None,
    metavar="127.0.X.Y",
    help="--system broker: loopback address of the first host; the nodes use it and the next ones "
    f"[default: {DEFAULT_HOST_BASE}]",
)
@click.option(
    "--port-base",
    type=int,
    default=None,
    help="--system broker: every port the run listens on is taken in order from this one "
    "(each checked free), so two runs can share a machine [default: ports the OS picks]",
)
@click.option(
    "--addresses",
    default=None,
    metavar="HOST[:PORT]",
    help="--host-base and --port-base in one option, e.g. 127.0.1.1:21000",
)
@click.option("--workload", type=click.Choice(sorted(WORKLOADS)), default="log", show_default=True)
@click.option(
    "--nemesis",
    default=",".join(DEFAULT_NEMESIS),
    show_default=True,
    callback=_nemesis_list,
    help=f"comma-separated faults, cycled in order, or 'none': {', '.join(FAULTS)}",
)
@click.option(
    "--time",
    "time_",
    type=click.FloatRange(min=1),
    default=40,
    show_default=True,
    help="seconds of load and faults",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.5),
    default=4,
    show_default=True,
    help="seconds each fault lasts, and of calm between faults",
)
@click.option(
    "--rate",
    callback=_rate,
    default="50",
    show_default=True,
    help="operations per second over all clients (open loop), or 'max': closed-loop clients, "
    "each starting its next operation as soon as the last completes, in one worker process per core",
)
@click.option(
    "--clients",
    type=click.IntRange(min=1),
    default=None,
    help="logical clients over all workers [default: 5; with --rate max 1024 per worker for the "
    "queue workload, 64 for log, 4 for register]",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0, max=64),
    default=None,
    help="OS processes running the clients, each recording its own shard of the history "
    "(history/); 0 runs them in the controller (history.jsonl) [default: 0; with --rate max, "
    "the number of cores]",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("jepsen-runs"),
    show_default=True,
    help="results go to OUT/<test>/<timestamp>/",
)
@click.option(
    "--name", default=None, help="test name (the directory under OUT); default from system, workload, nemesis"
)
@click.option("--seed", type=int, default=None, help="seed for choices of operations and fault targets")
@click.option(
    "--op-timeout",
    type=click.FloatRange(min=0.5),
    default=5,
    show_default=True,
    help="seconds before an operation is recorded as info",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=1),
    default=120,
    show_default=True,
    help="seconds the final drain of each queue/log may take (it reads everything sent back)",
)
@click.option(
    "--send-batch",
    type=click.IntRange(min=1, max=1024),
    default=None,
    help="queue workload: sends to one queue within 10 ms of each other go as one batch of up to N "
    "(one ledger entry); each stays its own operation in the history [default: 1; 256 with --rate max]",
)
@click.option("--no-check", is_flag=True, help="record only; skip the checker")
@click.option(
    "--spark-master",
    default=None,
    help="Spark master for the checker: local[N], spark://HOST:PORT or sc://HOST:PORT "
    "[default: $LEDGERMQ_SPARK_MASTER, else a running `jepsen spark start` cluster, else local[2]; "
    "without this option histories up to 8 MB are judged in-process; with it, on this master]",
)
@click.option("--keep-data", is_flag=True, help="keep node data directories even when the run is valid")
@click.option("--no-progress", is_flag=True, help="no progress bar")
@click.option(
    "--broken-adapter",
    type=click.Choice(["ack-unsent", "local-reads"]),
    default=None,
    hidden=True,
    help="harness self-test: a log client that acknowledges sends it never made (ack-unsent), "
    "a register client that reads its own replica (local-reads)",
)
def run(
    backend: str,
    system: str,
    workload: str,
    nemesis: tuple[str, ...],
    time_: float,
    interval: float,
    rate: float,
    clients: int | None,
    workers: int | None,
    out: Path,
    name: str | None,
    seed: int | None,
    op_timeout: float,
    drain_timeout: float,
    send_batch: int | None,
    no_check: bool,
    spark_master: str | None,
    keep_data: bool,
    no_progress: bool,
    broken_adapter: str | None,
    namesrv: str | None,
    nodes: str | None,
    kill_cmd: str | None,
    restart_cmd: str | None,
    pause_cmd: str | None,
    resume_cmd: str | None,
    topic: str | None,
    queues: int,
    broker_name: str | None,
    groups: int,
    fault_scope: str,
    host_base: str | None,
    port_base: int | None,
    addresses: str | None,
) -> None:
    """Load a 3-node group, inject faults, record the history and check it."""
    ctx = click.get_current_context()
    system_options: dict[str, object] = _placement(ctx, system, groups, host_base, port_base, addresses)
    external = (namesrv, nodes, kill_cmd, restart_cmd, pause_cmd, resume_cmd, topic, broker_name)
    if system == "rocketmq":
        from jepsen.systems.rocketmq import Hooks, check_faults, parse_nodes

        if not namesrv:
            raise click.UsageError("--system rocketmq needs --namesrv HOST:PORT (your cluster's nameserver)")
        if ctx.get_parameter_source("workload") is click.core.ParameterSource.DEFAULT:
            workload = "queue"
        if ctx.get_parameter_source("nemesis") is click.core.ParameterSource.DEFAULT:
            nemesis = ()  # a cluster we did not start is broken only as its owner allows
        hooks = Hooks(kill=kill_cmd, restart=restart_cmd, pause=pause_cmd, resume=resume_cmd)
        try:
            node_list = parse_nodes(nodes or "")
            for warning in check_faults(nemesis, hooks, node_list):
                click.echo(f"warning: {warning}", err=True)
        except Unsupported as exc:
            raise click.UsageError(str(exc)) from None
        system_options = {
            "namesrv": namesrv,
            "nodes": node_list,
            "hooks": hooks,
            "topic": topic,
            "queues": queues,
            "broker_name": broker_name,
        }
    elif system == "rocketmq-rust":
        if any(
            v is not None for v in (namesrv, nodes, kill_cmd, restart_cmd, pause_cmd, resume_cmd, broker_name)
        ):
            raise click.UsageError(
                "--system rocketmq-rust starts its own cluster: --namesrv, --nodes, --broker-name and "
                "the --*-cmd hooks apply to --system rocketmq only"
            )
        if ctx.get_parameter_source("workload") is click.core.ParameterSource.DEFAULT:
            workload = "queue"
        system_options = {"topic": topic, "queues": queues}
    elif any(v is not None for v in external):
        raise click.UsageError(
            "--namesrv, --nodes, --topic, --broker-name and the --*-cmd hooks apply to --system rocketmq only"
        )
    if spark_master:
        os.environ["LEDGERMQ_SPARK_MASTER"] = spark_master  # the checker's default, for this run
    # a master named on the command line is where the check runs, however small the history
    check_engine = "spark" if spark_master else "auto"
    cfg = RunConfig(
        workload=workload,
        system=system,
        backend=backend,
        nemesis=nemesis,
        time=time_,
        interval=interval,
        rate=rate,
        clients=clients,
        workers=workers,
        out=out,
        seed=seed,
        op_timeout=op_timeout,
        drain_timeout=drain_timeout,
        send_batch=send_batch,
        check_engine=check_engine,
        progress=not no_progress and sys.stderr.isatty(),
        check=not no_check,
        keep_data=keep_data,
        broken_adapter=broken_adapter,
        name=name,
        system_options=system_options,
        fault_scope=fault_scope,
    )
    try:
        result = run_test(cfg)
    except Unsupported as exc:
        raise click.UsageError(str(exc)) from None
    except PortPlanError as exc:  # a planned port is taken: say which, no traceback
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except (TimeoutError, OSError, ProxyError, WorkerFailed) as exc:  # no group, a port taken, a worker died
        click.echo(f"harness error: {exc}", err=True)
        sys.exit(3)
    s = result.summary
    counts = s.get("counts", {})
    faults = s.get("nemesis", {}).get("ops", {})
    leaders = s.get("leaders", {})
    click.echo(f"test      {cfg.test_name()}")
    click.echo(
        f"ops       ok={counts.get('ok', 0)} fail={counts.get('fail', 0)} info={counts.get('info', 0)}"
    )
    click.echo(f"faults    {', '.join(f'{k}={v}' for k, v in sorted(faults.items())) or 'none'}")
    click.echo(f"leaders   {leaders.get('leader_changes', 0)} changes, terms {leaders.get('terms_seen', [])}")
    check = s.get("check", {})
    results = check.get("results") or {}
    if results.get("anomaly-types"):
        click.echo(f"anomalies {', '.join(results['anomaly-types'])}")
    for kind, r in sorted((results.get("recovery") or {}).items()):
        p50, worst = r["recovery_p50_ms"], r["recovery_max_ms"]
        click.echo(
            f"recovery  {kind}: {r['recovered']}/{r['faults']} recovered, "
            f"p50 {'never' if p50 is None else f'{p50:,.0f} ms'}, max {'never' if worst is None else f'{worst:,.0f} ms'}, "
            f"longest gap {r['gap_max_ms']:,.0f} ms"
        )
        for group, g in sorted((r.get("by_group") or {}).items()):
            worst = g["recovery_max_ms"]
            click.echo(
                f"          {group}: {g['recovered']}/{g['faults']} recovered, "
                f"max {'never' if worst is None else f'{worst:,.0f} ms'}"
            )
    by_group = s.get("workload", {}).get("drained_by_group")
    if by_group:
        click.echo(f"groups    drained {', '.join(f'{g}={n}' for g, n in sorted(by_group.items()))}")
    if s.get("workers"):
        rss = [w.get("peak_rss_mb") for w in s["workers"]]
        click.echo(
            f"workers   {len(s['workers'])} processes, peak memory {max(r or 0 for r in rss):.0f} MB each at most "
            f"(controller {s.get('controller_peak_rss_mb', 0):.0f} MB)"
        )
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
