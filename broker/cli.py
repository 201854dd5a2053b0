"""The ``broker`` command: run one broker of a group (it embeds that member's ledger node)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import click

from common.cli import run_main
from common.settings import ConfigError, load_settings
from ledger.embed import EmbedError

from .config import BrokerConfig


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-c", "--config", "config_path", type=click.Path(dir_okay=False), help="TOML file ([broker] or top level)"
)
@click.option("--broker-name", help="the group's broker name (all members share it)")
@click.option("--node-id", help="this member's id in 'group' (e.g. n1)")
@click.option("--namesrv-addr", help="nameservers, ';' or ',' separated host:port (env BROKER_NAMESRV_ADDR)")
@click.option("--data-dir", help="directory for the ledger and metadata")
@click.option(
    "--group",
    help="the group's members as comma-separated id=broker_host:port@ledger_host:port, this broker included",
)
@click.option(
    "--join",
    is_flag=True,
    default=None,
    help="start outside a running group (asking the others in --group for its configuration) and wait "
    "to be added: ledgermq-admin member-add --broker-name NAME ID=BROKER_HOST:PORT",
)
@click.option("--metrics-port", type=int, help="Prometheus port (0: off)")
@click.option("--log-level", help="debug, info, warning or error")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, **overrides: Any) -> None:
    """Run a broker until SIGTERM or SIGINT; it becomes master when its ledger node leads.

    ``broker local-cluster`` instead starts a whole local cluster (see its --help).
    """
    if ctx.invoked_subcommand is not None:
        return
    if overrides.get("namesrv_addr"):
        overrides["namesrv_addr"] = overrides["namesrv_addr"].replace(";", ",")
    try:
        cfg = load_settings(
            BrokerConfig, config_path, env_prefix="BROKER_", overrides=overrides, section="broker"
        )
    except ConfigError as exc:
        raise click.ClickException(f"bad configuration: {exc}") from None
    from common.logs import setup_logging

    from .controller import BrokerController

    setup_logging(cfg.log_level, node=f"{cfg.broker_name}/{cfg.node_id}")

    async def serve() -> None:
        controller = BrokerController(cfg)
        try:
            controller.initialize()
        except Exception as exc:  # a corrupt store or a bad address: say what and where, then exit
            raise click.ClickException(
                f"cannot initialize broker {cfg.broker_name}/{cfg.node_id}: {exc}"
            ) from None
        try:
            await controller.start()
        except (OSError, EmbedError) as exc:  # e.g. a port in use: stop what did start, say why
            await controller.shutdown()
            raise click.ClickException(
                f"cannot start broker {cfg.broker_name}/{cfg.node_id} on {cfg.listen_host} "
                f"(ports {cfg.listen_port}, {cfg.fast_port}; ledger {cfg.me.ledger_addr}): "
                f"{getattr(exc, 'strerror', None) or exc}"
            ) from None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # RocketMQ's shutdown hook
            loop.add_signal_handler(sig, lambda: loop.create_task(controller.shutdown()))
        await controller.wait_stopped()

    run_main(serve())


@main.command("local-cluster")
@click.option(
    "--groups", type=click.IntRange(1, 26), default=1, show_default=True, help="3-broker groups to start"
)
@click.option(
    "--dir",
    "base_dir",
    type=click.Path(file_okay=False),
    default="./ledgermq-local",
    show_default=True,
    help="where data and logs go",
)
@click.option(
    "--namesrv-port", type=click.IntRange(0, 65535), default=9876, show_default=True, help="0: any free port"
)
def local_cluster(groups: int, base_dir: str, namesrv_port: int) -> None:
    """A nameserver and N 3-broker groups on loopback, like RocketMQ's quick start.

    Prints ``namesrv=HOST:PORT`` first, then each group's master; Ctrl-C or SIGTERM stops them all.
    """
    from pathlib import Path

    from .localcluster import run

    try:
        code = run(Path(base_dir).resolve(), groups, namesrv_port)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot start the local cluster: {exc}") from None
    raise SystemExit(code)
