"""The ``namesrv`` console script: load config, run a NamesrvController until SIGTERM/SIGINT.

Exit codes: 0 after a clean shutdown, 2 for a configuration error (the message names the key
and its source), 1 when start-up fails (port in use, unreadable KV file).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

import click

from common.cli import run_main
from common.logs import JsonFormatter, setup_logging
from common.settings import ConfigError
from namesrv.config import NamesrvConfig, load_config
from namesrv.controller import NamesrvController
from namesrv.kvconfig import KVConfigError

log = logging.getLogger("namesrv")


async def run(config: NamesrvConfig) -> None:
    """Serve until a termination signal; shut down cleanly (listener closed, connections flushed)."""
    controller = NamesrvController(config)
    try:
        await controller.start()
    except BaseException:  # e.g. the metrics port in use after the listener bound: stop what started
        await controller.shutdown()
        raise
    if not config.node_name:  # with --listen-port 0 the real port is only known now
        for handler in logging.getLogger().handlers:
            if isinstance(handler.formatter, JsonFormatter):
                handler.formatter.node = f"namesrv-{controller.server.port}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(
            sig, lambda s=sig: (log.info("signal received", extra={"signal": s.name}), stop.set())
        )
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await controller.shutdown()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--listen-host", help="Address to bind (default 127.0.0.1).")
@click.option("--listen-port", type=int, help="Port to bind (default 9876; 0 = any free port).")
@click.option("--metrics-host", help="Address of the Prometheus endpoint.")
@click.option("--metrics-port", type=int, help="Prometheus /metrics port (0 = disabled).")
@click.option(
    "--broker-expire-s", type=float, help="Remove brokers silent for longer than this (default 120)."
)
@click.option("--scan-interval-s", type=float, help="Inactive-broker scan period (default 10).")
@click.option("--kv-config-path", help="File persisting the KV config area.")
@click.option(
    "--order-message-enable/--no-order-message-enable",
    default=None,
    help="Attach order topic config to routes.",
)
@click.option(
    "--cluster-secret-file",
    type=click.Path(dir_okay=False),
    help="File holding the cluster secret brokers must prove to register (their cluster_secret).",
)
@click.option("--log-level", help="debug, info, warning or error.")
@click.option("--node-name", help="Name put in every log line.")
def main(config_path: str | None, **overrides: Any) -> None:
    """Run a ledgermq nameserver (brokers register here; clients look up topic routes)."""
    try:
        config = load_config(config_path, overrides)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    setup_logging(config.log_level, node=config.node_name or f"namesrv-{config.listen_port}")
    try:
        run_main(run(config))
    except OSError as exc:
        log.error(
            "namesrv failed to start: %s", exc, extra={"host": config.listen_host, "port": config.listen_port}
        )
        click.echo(f"namesrv: cannot start on {config.listen_host}:{config.listen_port}: {exc}", err=True)
        sys.exit(1)
    except (ConfigError, KVConfigError) as exc:  # accounts or KV file: one line naming the file
        log.error("namesrv failed to start: %s", exc)
        click.echo(f"namesrv: cannot start: {exc}", err=True)
        sys.exit(1)
    except Exception as exc:
        log.exception("namesrv failed")
        click.echo(f"namesrv: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
