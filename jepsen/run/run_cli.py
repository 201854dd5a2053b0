"""``jepsen run``: the project's main job, as a click command.

Attach it to the ``jepsen`` click group with ``group.add_command(run_cli.run)``; until
then ``python -m jepsen.run.run_cli`` runs it directly. Exit status: 0 valid,
1 invalid, 2 unknown, 3 not checked (checker missing, or the harness itself failed).

The command turns its options into a :class:`~jepsen.run.config.RunConfig` (what combines
with what is ``validate``'s to say), runs it, and prints the run's summary.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from broker.localgroup import MAX_GROUPS
from common.ports import (
    DEFAULT_HOST_BASE,
    PortPlanError,
    check_port_base,
    parse_addresses,
    parse_host_base,
)
from jepsen.faults.base import FAULT_SCOPES
from jepsen.faults.registry import FAULTS
from jepsen.history import SHARD_SUFFIXES
from jepsen.net.proxy import ProxyError
from jepsen.run.config import DEFAULT_NEMESIS, RunConfig, RunResult
from jepsen.run.pool import WorkerFailed
from jepsen.run.runner import run as run_test
from jepsen.run.validate import EXTERNAL_OPTIONS, external_refusal, placement_refusal
from jepsen.systems.base import Unsupported
from jepsen.systems.broken import BROKEN_ADAPTERS
from jepsen.systems.registry import SYSTEMS
from jepsen.workloads.base import DRAIN_PAGE
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


@dataclass(frozen=True)
class RunOptions:
    """``jepsen run``'s options as click parses them."""

    backend: str
    system: str
    workload: str
    nemesis: tuple[str, ...]
    time_: float
    interval: float
    rate: float
    clients: int | None
    workers: int | None
    history_format: str | None
    out: Path
    name: str | None
    seed: int | None
    op_timeout: float
    drain_timeout: float
    drain_page: int
    send_batch: int | None
    no_check: bool
    spark_master: str | None
    keep_data: bool
    no_progress: bool
    broken_adapter: str | None
    namesrv: str | None
    nodes: str | None
    kill_cmd: str | None
    restart_cmd: str | None
    pause_cmd: str | None
    resume_cmd: str | None
    topic: str | None
    queues: int
    broker_name: str | None
    groups: int
    fault_scope: str
    host_base: str | None
    port_base: int | None
    addresses: str | None

    def external_given(self) -> list[str]:
        """The ``--system rocketmq`` options given (see ``validate.EXTERNAL_OPTIONS``)."""
        return [k for k in EXTERNAL_OPTIONS if getattr(self, k) is not None]


def _defaulted(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) is click.core.ParameterSource.DEFAULT


def _placement(ctx: click.Context, o: RunOptions) -> dict[str, object]:
    """The broker system's ``--groups``, hosts and ports as backend options (checked here, so a
    bad value is one clear line before anything starts)."""
    if not 1 <= o.groups <= MAX_GROUPS:
        _fail(f"--groups must be 1..{MAX_GROUPS} (broker groups of 3), got {o.groups}")
    host_base, port_base = o.host_base, o.port_base
    given = o.groups != 1 or any(v is not None for v in (host_base, port_base, o.addresses))
    if not given:
        return {}
    refusal = placement_refusal(o.system, system_given=not _defaulted(ctx, "system"))
    if refusal:
        _fail(refusal)
    if o.addresses is not None and (host_base is not None or port_base is not None):
        _fail("--addresses stands for --host-base and --port-base: give one or the others")
    try:
        if o.addresses is not None:
            host_base, port_base = parse_addresses(o.addresses)
        if host_base is not None:
            parse_host_base(host_base)
        if port_base is not None:
            check_port_base(port_base)
    except PortPlanError as exc:
        _fail(str(exc))
    return {"groups": o.groups, "host_base": host_base, "port_base": port_base}


def _rocketmq_options(ctx: click.Context, o: RunOptions) -> dict[str, object]:
    """``--system rocketmq``'s backend options: the user's cluster, and the hooks its faults run."""
    from jepsen.systems.rocketmq import Hooks, check_faults, parse_nodes

    hooks = Hooks(kill=o.kill_cmd, restart=o.restart_cmd, pause=o.pause_cmd, resume=o.resume_cmd)
    try:
        node_list = parse_nodes(o.nodes or "")
        for warning in check_faults(_nemesis(ctx, o), hooks, node_list):
            click.echo(f"warning: {warning}", err=True)
    except Unsupported as exc:
        raise click.UsageError(str(exc)) from None
    return {
        "namesrv": o.namesrv,
        "nodes": node_list,
        "hooks": hooks,
        "topic": o.topic,
        "queues": o.queues,
        "broker_name": o.broker_name,
    }


def _workload(ctx: click.Context, o: RunOptions) -> str:
    """The workload: as given, or the queue workload on a RocketMQ system when left at its default."""
    if o.system in ("rocketmq", "rocketmq-rust", "ledgermq-proxy") and _defaulted(ctx, "workload"):
        return "queue"
    return o.workload


def _nemesis(ctx: click.Context, o: RunOptions) -> tuple[str, ...]:
    """The faults: as given; none by default on a cluster we did not start (it is broken only
    as its owner allows)."""
    if o.system == "rocketmq" and _defaulted(ctx, "nemesis"):
        return ()
    return o.nemesis


def _system_options(ctx: click.Context, o: RunOptions) -> dict[str, object]:
    """The backend options of ``--system``, its own options refused where they do not apply."""
    placement = _placement(ctx, o)
    refusal = external_refusal(o.system, o.external_given())
    if refusal:
        raise click.UsageError(refusal)
    if o.system == "rocketmq":
        return _rocketmq_options(ctx, o)
    if o.system == "rocketmq-rust":
        return {"topic": o.topic, "queues": o.queues}
    return placement


def _run_config(ctx: click.Context, o: RunOptions) -> RunConfig:
    """The run the options ask for."""
    system_options = _system_options(ctx, o)
    if o.spark_master:
        os.environ["LEDGERMQ_SPARK_MASTER"] = o.spark_master  # the checker's default, for this run
    return RunConfig(
        workload=_workload(ctx, o),
        system=o.system,
        backend=o.backend,
        nemesis=_nemesis(ctx, o),
        time=o.time_,
        interval=o.interval,
        rate=o.rate,
        clients=o.clients,
        workers=o.workers,
        history_format=o.history_format,
        out=o.out,
        seed=o.seed,
        op_timeout=o.op_timeout,
        drain_timeout=o.drain_timeout,
        drain_page=o.drain_page,
        send_batch=o.send_batch,
        # a master named on the command line is where the check runs, however small the history
        check_engine="spark" if o.spark_master else "auto",
        progress=not o.no_progress and sys.stderr.isatty(),
        check=not o.no_check,
        keep_data=o.keep_data,
        broken_adapter=o.broken_adapter,
        name=o.name,
        system_options=system_options,
        fault_scope=o.fault_scope,
    )


def _run_or_exit(cfg: RunConfig) -> RunResult:
    """Run ``cfg``; a run that cannot start or whose harness fails is one line and an exit status."""
    try:
        return run_test(cfg)
    except Unsupported as exc:
        raise click.UsageError(str(exc)) from None
    except PortPlanError as exc:  # a planned port is taken: say which, no traceback
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except (TimeoutError, OSError, ProxyError, WorkerFailed) as exc:  # no group, a port taken, a worker died
        click.echo(f"harness error: {exc}", err=True)
        sys.exit(3)


def _ms(v: float | None) -> str:
    return "never" if v is None else f"{v:,.0f} ms"


def _print_recovery(results: dict[str, Any]) -> None:
    """Recovery per fault kind, and per broker group where there are several."""
    for kind, r in sorted((results.get("recovery") or {}).items()):
        click.echo(
            f"recovery  {kind}: {r['recovered']}/{r['faults']} recovered, "
            f"p50 {_ms(r['recovery_p50_ms'])}, max {_ms(r['recovery_max_ms'])}, "
            f"longest gap {r['gap_max_ms']:,.0f} ms"
        )
        for group, g in sorted((r.get("by_group") or {}).items()):
            click.echo(
                f"          {group}: {g['recovered']}/{g['faults']} recovered, max {_ms(g['recovery_max_ms'])}"
            )


def _print_result(cfg: RunConfig, result: RunResult) -> None:
    """The run's summary: operations, faults, leaders, anomalies, recovery, verdict, where its files are."""
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
    _print_recovery(results)
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
    for note in s.get("history_notes") or []:
        click.echo(f"note      {note}", err=True)
    click.echo(f"report    {result.report if result.report.exists() else result.run_dir}")


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
    type=click.Choice(list(SYSTEMS)),
    default="ledger",
    show_default=True,
    help="the system under test (pysyncobj: the log workload on a 3-node pysyncobj group; "
    "broker: 2 nameservers + 3 brokers, chosen automatically for the queue workload; "
    "rocketmq: the queue workload against a RocketMQ-protocol cluster you run, see --namesrv; "
    "rocketmq-rust: the queue workload on RocketMQ-Rust's nameserver, master and 2 slaves, "
    "built by scripts/build-rocketmq-rust.sh; ledgermq-proxy: the queue workload through RocketMQ 5's "
    "gRPC proxy, receive and ack instead of pulls)",
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
    "(history/); 0 runs them in the controller (one shard; history.jsonl with --history-format "
    "jsonl) [default: 0; with --rate max, the number of cores]",
)
@click.option(
    "--history-format",
    type=click.Choice(list(SHARD_SUFFIXES)),
    default=None,
    help="how the history is recorded: parquet (parts closed every 2 s, about 15 bytes an "
    "operation; a killed run loses at most its last 2 s) or jsonl (about 277 bytes an operation, "
    "for jq; `jepsen history export` turns any run into it) [default: $LEDGERMQ_HISTORY_FORMAT, "
    "else parquet]",
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
    "--drain-page",
    type=click.IntRange(min=1),
    default=DRAIN_PAGE,
    show_default=True,
    help="pairs per drain event: the final drain of a queue/log is recorded page by page as it "
    "is read, so the controller holds a page per queue, not the whole log",
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
    type=click.Choice(list(BROKEN_ADAPTERS)),
    default=None,
    hidden=True,
    help="harness self-test: the run's clients broken in one known way, which the checker must "
    "catch (one per workload; see docs/harness.md)",
)
def run(**options: Any) -> None:
    """Load a 3-node group, inject faults, record the history and check it."""
    cfg = _run_config(click.get_current_context(), RunOptions(**options))
    result = _run_or_exit(cfg)
    _print_result(cfg, result)
    sys.exit(result.exit_code)


if __name__ == "__main__":
    run()
