"""The proxy process: a gRPC server with the MessagingService, until SIGTERM or Ctrl-C.

    python -m proxy --namesrv 127.0.0.1:9876                 # listens on 0.0.0.0:8081
    python -m proxy --namesrv ns1:9876;ns2:9876 --listen 127.0.0.1:0 --acl-file acl.toml \
        --tls-cert cert.pem --tls-key key.pem

Once it serves it prints ``proxy=HOST:PORT`` (the port it bound, when 0 was asked).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from common.settings import ConfigError

DEFAULT_PORT = 8081
#: what consumers are told: a first delivery and the brokers' default max_reconsume_times (16,
#: broker.config) retries, as RocketMQ 5's proxy tells them a group's retry count + 1
DEFAULT_MAX_DELIVERY_ATTEMPTS = 17
#: RPCs served at once (a long-polling ReceiveMessage holds one until it is answered)
DEFAULT_MAX_CONCURRENT_RPCS = 4096
#: a gRPC message's size: the largest body plus room for its properties
GRPC_MESSAGE_SLACK = 1 << 20
GRACE_S = 2.0
#: consumer groups --fifo-groups may name
MAX_FIFO_GROUPS = 10_000

log = logging.getLogger("proxy")


@dataclass
class ProxyOptions:
    namesrv: str
    listen: str = f"0.0.0.0:{DEFAULT_PORT}"
    advertise: str = ""
    acl_file: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    access_key: str | None = None
    secret_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    max_concurrent_rpcs: int = DEFAULT_MAX_CONCURRENT_RPCS
    route_ttl_s: float = 3.0
    max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS
    fifo_groups: frozenset[str] = frozenset()


def listen_addr(value: str) -> tuple[str, int]:
    """``host:port`` to listen on; port 0 binds any free one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"--listen: expected host:port, got {value!r}")
    return host, int(port)


async def serve(opts: ProxyOptions, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set. Imports the message types here: building them may download."""
    import grpc

    from remoting.acl import load_accounts

    from .auth import Authenticator
    from .backend import Backend
    from .service import MessagingService, ServiceConfig, add_to_server

    host, port = listen_addr(opts.listen)
    accounts = load_accounts(opts.acl_file) if opts.acl_file else None
    backend = Backend(
        opts.namesrv, route_ttl_s=opts.route_ttl_s, access_key=opts.access_key, secret_key=opts.secret_key
    )
    size = opts.max_body_bytes + GRPC_MESSAGE_SLACK
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", 4 * size)],
        maximum_concurrent_rpcs=opts.max_concurrent_rpcs,
    )
    if opts.tls_cert or opts.tls_key:
        if not (opts.tls_cert and opts.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        creds = grpc.ssl_server_credentials(
            [(Path(opts.tls_key).read_bytes(), Path(opts.tls_cert).read_bytes())]
        )
        bound = server.add_secure_port(f"{host}:{port}", creds)
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise ConfigError(f"cannot listen on {host}:{port}")
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    config = ServiceConfig(
        max_body_bytes=opts.max_body_bytes,
        max_delivery_attempts=opts.max_delivery_attempts,
        fifo_groups=opts.fifo_groups,
        advertised=opts.advertise or f"{shown}:{bound}",
    )
    add_to_server(server, MessagingService(backend, config, Authenticator(accounts)))
    await backend.start()
    await server.start()
    print(f"proxy={shown}:{bound}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop(GRACE_S)
        await backend.close()


def parse_args(argv: list[str] | None) -> ProxyOptions:
    p = argparse.ArgumentParser(
        prog="python -m proxy", description="RocketMQ 5 gRPC proxy in front of ledgermq"
    )
    p.add_argument("--namesrv", default=os.environ.get("NAMESRV_ADDR", ""), help="host:port[;host:port...]")
    p.add_argument(
        "--listen", default=f"0.0.0.0:{DEFAULT_PORT}", help="host:port to serve gRPC on (port 0: any)"
    )
    p.add_argument("--advertise", default="", help="host:port put in routes when a client names none")
    p.add_argument("--acl-file", default=os.environ.get("LEDGERMQ_ACL_FILE", ""), help="ACL accounts (TOML)")
    p.add_argument("--tls-cert", default="", help="PEM certificate chain: serve TLS")
    p.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    p.add_argument("--max-concurrent-rpcs", type=int, default=DEFAULT_MAX_CONCURRENT_RPCS)
    p.add_argument("--route-ttl", type=float, default=3.0, help="seconds a topic's route is reused")
    p.add_argument(
        "--max-delivery-attempts",
        type=int,
        default=DEFAULT_MAX_DELIVERY_ATTEMPTS,
        help="what consumers are told: the brokers' max_reconsume_times + 1 (the first delivery)",
    )
    p.add_argument(
        "--fifo-groups",
        default=os.environ.get("LEDGERMQ_FIFO_GROUPS", ""),
        help="comma-separated consumer groups that consume in order (RocketMQ 5's FIFO groups): "
        "a queue's next message only once the previous ones are acked",
    )
    a = p.parse_args(argv)
    fifo = frozenset(g.strip() for g in a.fifo_groups.split(",") if g.strip())
    if len(fifo) > MAX_FIFO_GROUPS:
        p.error(f"--fifo-groups names at most {MAX_FIFO_GROUPS} groups")
    if not a.namesrv:
        p.error("--namesrv (or NAMESRV_ADDR) is required")
    if min(a.max_body_bytes, a.max_concurrent_rpcs, a.max_delivery_attempts) < 1 or a.route_ttl <= 0:
        p.error(
            "--max-body-bytes, --max-concurrent-rpcs, --max-delivery-attempts and --route-ttl must be positive"
        )
    return ProxyOptions(
        namesrv=a.namesrv,
        listen=a.listen,
        advertise=a.advertise,
        acl_file=a.acl_file,
        tls_cert=a.tls_cert,
        tls_key=a.tls_key,
        access_key=os.environ.get("LEDGERMQ_ACCESS_KEY") or None,
        secret_key=os.environ.get("LEDGERMQ_SECRET_KEY") or None,
        max_body_bytes=a.max_body_bytes,
        max_concurrent_rpcs=a.max_concurrent_rpcs,
        route_ttl_s=a.route_ttl,
        max_delivery_attempts=a.max_delivery_attempts,
        fifo_groups=fifo,
    )


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(opts, stop)

    try:
        asyncio.run(run())
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the protocol build's error, say it plainly
        if type(exc).__name__ == "ProtocolBuildError":
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise
    return 0
