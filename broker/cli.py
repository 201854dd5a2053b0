"""The ``broker`` command: run one broker of a group (it embeds that member's ledger node)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import click

from ledger.cli import _run
from ledger.settings import ConfigError, load_settings

from .config import BrokerConfig


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False), help="TOML file ([broker] or top level)")
@click.option("--broker-name", help="the group's broker name (all members share it)")
@click.option("--node-id", help="this member's id in 'group' (e.g. n1)")
@click.option("--namesrv-addr", help="nameservers, ';' or ',' separated host:port (env BROKER_NAMESRV_ADDR)")
@click.option("--data-dir", help="directory for the ledger and metadata")
@click.option("--metrics-port", type=int, help="Prometheus port (0: off)")
@click.option("--log-level", help="debug, info, warning or error")
def main(config_path: str | None, **overrides: Any) -> None:
    """Run a broker until SIGTERM or SIGINT; it becomes master when its ledger node leads."""
    if overrides.get("namesrv_addr"):
        overrides["namesrv_addr"] = overrides["namesrv_addr"].replace(";", ",")
    try:
        cfg = load_settings(BrokerConfig, config_path, env_prefix="BROKER_", overrides=overrides, section="broker")
    except ConfigError as exc:
        raise click.ClickException(f"bad configuration: {exc}") from None
    from ledger.logs import setup_logging

    from .controller import BrokerController

    setup_logging(cfg.log_level, node=f"{cfg.broker_name}/{cfg.node_id}")

    async def serve() -> None:
        controller = BrokerController(cfg)
        try:
            controller.initialize()
        except Exception as exc:  # a corrupt store or a bad address: say what and where, then exit
            raise click.ClickException(f"cannot initialize broker {cfg.broker_name}/{cfg.node_id}: {exc}") from None
        await controller.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # RocketMQ's shutdown hook
            loop.add_signal_handler(sig, lambda: loop.create_task(controller.shutdown()))
        await controller.wait_stopped()

    _run(serve())
