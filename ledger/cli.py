"""The ``ledger`` command: run a node, or talk to a group (status, append, read, transfer, members)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from common.cli import run_main
from common.settings import ConfigError, load_settings

from .config import NodeConfig

_TLS_CA: list[str] = []  # set by the group options; read by the client commands
_SECRET_FILE: list[str] = []


@click.group()
@click.option(
    "--tls-ca",
    envvar="LEDGER_TLS_CA_FILE",
    type=click.Path(dir_okay=False),
    help="CA file: talk TLS to nodes that have it on (env LEDGER_TLS_CA_FILE)",
)
@click.option(
    "--secret-file",
    envvar="LEDGER_CLUSTER_SECRET_FILE",
    type=click.Path(dir_okay=False),
    help="cluster secret, for nodes with client_auth on (env LEDGER_CLUSTER_SECRET_FILE or LEDGER_CLUSTER_SECRET)",
)
def main(tls_ca: str | None, secret_file: str | None) -> None:
    """A DLedger-style Raft commit log: durable, replicated, linearizable."""
    _TLS_CA[:] = [tls_ca] if tls_ca else []
    _SECRET_FILE[:] = [secret_file] if secret_file else []


@main.command()
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="TOML file ([ledger] or top level)"
)
@click.option("--id", "node_id", help="this node's id (overrides the file; env LEDGER_ID)")
@click.option("--listen", help="host:port to serve peers and clients on")
@click.option("--peers", help="comma-separated id=host:port of every member, this node included")
@click.option("--data-dir", help="directory for the log and hard state")
@click.option(
    "--join",
    help="comma-separated host:port of nodes of a running group: start outside it and wait to be "
    "added (ledger member add ID=HOST:PORT); --peers then needs only this node's own entry",
)
@click.option("--metrics-port", type=int, help="Prometheus port (0: off)")
@click.option("--log-level", help="debug, info, warning or error")
def start(config_path: str | None, **overrides: Any) -> None:
    """Run one ledger node in the foreground until SIGTERM or SIGINT."""
    overrides = {"id" if k == "node_id" else k: v for k, v in overrides.items()}
    try:
        cfg = load_settings(
            NodeConfig, config_path, env_prefix="LEDGER_", overrides=overrides, section="ledger"
        )
    except ConfigError as exc:
        raise click.ClickException(f"bad configuration: {exc}") from None
    from common.logs import setup_logging

    from .node import LedgerNode
    from .transport import ListenError

    setup_logging(cfg.log_level, node=cfg.id)

    async def serve() -> None:
        try:
            node = LedgerNode(cfg)
        except Exception as exc:  # corrupt store, unreadable hard state: say what and where, then exit
            raise click.ClickException(f"cannot open node {cfg.id}: {exc}") from None
        try:
            await node.start()
        except OSError as exc:  # the port is in use, the address is not local, ...: one line, exit 1
            await node.stop()
            why = exc.strerror or str(exc)
            if not isinstance(exc, ListenError) and cfg.metrics_port:
                why = f"cannot serve metrics on {cfg.metrics_host}:{cfg.metrics_port}: {why}"
            raise click.ClickException(f"cannot start node {cfg.id}: {why}") from None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: loop.create_task(node.stop()))
        await node.wait_stopped()
        if node.fatal_reason is not None:
            raise click.ClickException(f"node {cfg.id} stopped: {node.fatal_reason}")

    run_main(serve())


def _nodes_option(f: Any) -> Any:
    return click.option(
        "--nodes",
        envvar="LEDGER_NODES",
        required=True,
        help="comma-separated host:port of the group's nodes (env LEDGER_NODES)",
    )(f)


def _client(nodes: str, timeout: float = 10.0) -> Any:
    from common.tls import client_context

    from .client import LedgerClient

    try:
        ssl = client_context(_TLS_CA[0]) if _TLS_CA else None
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    secret = os.environ.get("LEDGER_CLUSTER_SECRET", "").encode() or None
    if _SECRET_FILE:
        try:
            secret = Path(_SECRET_FILE[0]).read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise click.ClickException(
                f"--secret-file: cannot read {_SECRET_FILE[0]}: {exc.strerror}"
            ) from None
    nodes_list = [n.strip() for n in nodes.split(",") if n.strip()]
    try:
        return LedgerClient(nodes_list, timeout=timeout, ssl=ssl, secret=secret)
    except ValueError as exc:  # a secret shorter than 16 bytes, a bad address
        raise click.ClickException(str(exc)) from None


def _fail(exc: Exception) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


@main.command()
@_nodes_option
def status(nodes: str) -> None:
    """Role, term, leader, commit index and last index of every node."""

    async def go() -> dict[str, Any]:
        async with _client(nodes, timeout=3) as c:
            return await c.status_all()

    click.echo(json.dumps(run_main(go()), indent=2))


@main.command()
@_nodes_option
@click.argument("data", nargs=-1, required=True)
def append(nodes: str, data: tuple[str, ...]) -> None:
    """Append DATA (one entry per argument, as one batch); prints the first index and term."""

    async def go() -> tuple[int, int]:
        async with _client(nodes) as c:
            return await c.append_batch([d.encode() for d in data])

    try:
        first, term = run_main(go())
    except Exception as exc:  # noqa: BLE001 - report any failure to the user plainly
        _fail(exc)
    click.echo(json.dumps({"first_index": first, "last_index": first + len(data) - 1, "term": term}))


@main.command()
@_nodes_option
@click.option("--from", "lo", type=int, default=1, show_default=True)
@click.option("--to", "hi", type=int, default=2**62, help="last index (default: up to the commit index)")
@click.option(
    "--linearizable/--local", default=True, show_default=True, help="confirm leadership first (ReadIndex)"
)
@click.option("--max-bytes", type=int, default=4 << 20, show_default=True)
def read(nodes: str, lo: int, hi: int, linearizable: bool, max_bytes: int) -> None:
    """Print committed entries as JSON lines (index, term, data as text where it decodes)."""

    async def go() -> list[Any]:
        async with _client(nodes) as c:
            return await c.read(lo, hi, linearizable=linearizable, max_bytes=max_bytes)

    try:
        entries = run_main(go())
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    for e in entries:
        data = bytes(e.data)
        try:
            text: Any = data.decode()
        except UnicodeDecodeError:
            text = {"hex": data.hex()}
        click.echo(json.dumps({"index": e.index, "term": e.term, "kind": e.kind, "data": text}))


@main.command()
@_nodes_option
@click.argument("target")
def transfer(nodes: str, target: str) -> None:
    """Ask the leader to hand leadership to TARGET (a member id) once it has caught up."""

    async def go() -> dict[str, Any]:
        async with _client(nodes) as c:
            return await c.transfer_leadership(target)

    try:
        click.echo(json.dumps(run_main(go())))
    except Exception as exc:  # noqa: BLE001
        _fail(exc)


@main.group()
def member() -> None:
    """List or change the members of a running group (one single-server change at a time)."""


def _member_call(nodes: str, call: Any, timeout: float = 10.0) -> None:
    async def go() -> Any:
        async with _client(nodes, timeout=timeout) as c:
            return await call(c)

    try:
        click.echo(json.dumps(run_main(go()), indent=2))
    except Exception as exc:  # noqa: BLE001 - report any failure to the user plainly
        _fail(exc)


@member.command("list")
@_nodes_option
def member_list(nodes: str) -> None:
    """The leader's configuration: voters, learners, and how far behind each member is."""
    _member_call(nodes, lambda c: c.members())


@member.command("add")
@_nodes_option
@click.argument("member_spec", metavar="ID=HOST:PORT")
@click.option("--promote", is_flag=True, help="then wait for it to catch up and make it a voter")
@click.option(
    "--wait", "wait_s", type=float, default=60.0, show_default=True, help="seconds to wait for catch-up"
)
def member_add(nodes: str, member_spec: str, promote: bool, wait_s: float) -> None:
    """Add a learner (start it with `ledger start --join`); it receives the log but does not vote."""
    node_id, sep, address = member_spec.partition("=")
    if not sep or not node_id or not address:
        raise click.BadParameter(f"expected ID=HOST:PORT, got {member_spec!r}", param_hint="ID=HOST:PORT")

    async def call(c: Any) -> Any:
        added = await c.add_learner(node_id, address)
        if not promote:
            return added
        return await c.promote(node_id, wait_s=wait_s)

    _member_call(nodes, call, timeout=max(10.0, wait_s + 10.0) if promote else 10.0)


@member.command("promote")
@_nodes_option
@click.argument("node_id", metavar="ID")
@click.option(
    "--wait", "wait_s", type=float, default=60.0, show_default=True, help="seconds to wait for catch-up"
)
def member_promote(nodes: str, node_id: str, wait_s: float) -> None:
    """Make a learner a voter, once it has caught up with the leader's log."""
    _member_call(nodes, lambda c: c.promote(node_id, wait_s=wait_s), timeout=max(10.0, wait_s + 10.0))


@member.command("remove")
@_nodes_option
@click.argument("node_id", metavar="ID")
def member_remove(nodes: str, node_id: str) -> None:
    """Remove a voter or learner; refused if the voters left that answer would not be a majority."""
    _member_call(nodes, lambda c: c.remove_member(node_id))


@main.command("local-cluster")
@click.option("--nodes", "n", type=int, default=3, show_default=True)
@click.option(
    "--dir", "base_dir", type=click.Path(file_okay=False), default="ledger-cluster", show_default=True
)
def local_cluster(n: int, base_dir: str) -> None:
    """Run an N-node group of local processes on 127.0.0.x until Ctrl-C."""
    from common.localgroup import stop_requested

    from .localcluster import LocalCluster

    # SIGTERM and SIGINT stop the group (by PID) and the command: a handler notes the signal
    # (sigwait without the signals blocked let SIGTERM kill this process and orphan the nodes)
    with stop_requested() as stop:
        cluster = LocalCluster(Path(base_dir), n)
        try:
            cluster.start()
            leader = run_main(cluster.wait_for_leader())
            click.echo(f"group up: nodes {','.join(cluster.addresses)}; leader {leader}; data in {base_dir}")
            click.echo(f"peers authenticate with the secret in {cluster.settings['cluster_secret_file']}")
            click.echo(f"try: ledger append --nodes {','.join(cluster.addresses)} hello")
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            cluster.stop()
