"""Delayed peer links inside a container: ``slow-network`` for the docker backend.

The kernel here has no netem, so a delay cannot be a qdisc. Instead each broker container
that sends on a slowed link runs this relay (``python -m jepsen.net.relay``, started
with ``docker exec``), and iptables sends the node's own new connections to the slowed
peers through it:

* ``nat OUTPUT``: a new connection to a slowed peer's ledger port is REDIRECTed to the
  relay on 127.0.0.1; the relay asks the kernel where it was going (``SO_ORIGINAL_DST``)
  and dials that itself, with a firewall mark (``SO_MARK``, which the container's
  ``NET_ADMIN`` allows) that the rules skip, so its own connection is not redirected again;
* ``filter OUTPUT``: packets of connections to those peers that did not go through the
  relay (opened before the fault) are answered with a TCP reset, so the node reconnects,
  through the relay. A redirected connection no longer matches: its destination is the relay.

The relay holds every chunk, both ways, for the delay plus a uniform jitter, in order (the
link proxies' ``splice``, so local and docker runs shape alike). Healing removes the rules
and stops the relay, whose connections then end and are dialled again directly. The
partition rules (``LEDGERMQ-OUT``) still see the relay's connection to the peer: a cut
link stays cut while slowed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import struct
import sys
from pathlib import Path

from common.cli import run_main
from jepsen.net.proxy import MAX_DELAY_S, LinkState, splice

#: the firewall mark of the relay's own connections (the redirect rules skip it): "LM"
RELAY_MARK = 0x4C4D
#: where the relay listens in its container (REDIRECT sends local traffic to 127.0.0.1)
RELAY_PORT = 29911
#: the relay writes its process id here, so that healing can stop it
PID_FILE = "/tmp/ledgermq-relay.pid"
LOG_FILE = "/tmp/ledgermq-relay.log"
#: connections the relay carries at once; more are refused (the node retries)
MAX_RELAYED = 256
#: seconds the relay gives a peer to accept its connection
CONNECT_TIMEOUT_S = 1.0
NAT_CHAIN = "LEDGERMQ-DELAY"
RESET_CHAIN = "LEDGERMQ-DELAY-RST"

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """Where a REDIRECTed connection was headed before the kernel sent it here."""
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, addr = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(addr), port


class Relay:
    """Accepts redirected connections and relays each, slowed, to where it was going."""

    def __init__(self, delay_ms: float, jitter_ms: float, seed: int, mark: int = RELAY_MARK) -> None:
        if not (0 <= delay_ms <= MAX_DELAY_S * 1000 and 0 <= jitter_ms <= MAX_DELAY_S * 1000):
            raise ValueError(f"delay and jitter must be 0..{MAX_DELAY_S * 1000:.0f} ms")
        self.delay_s, self.jitter_s = delay_ms / 1000, jitter_ms / 1000
        self.seed, self.mark = seed, mark
        self.links: dict[str, LinkState] = {}
        self.open = 0

    def _link(self, host: str, port: int) -> LinkState:
        name = f"{host}:{port}"
        link = self.links.get(name)
        if link is None:  # one seeded stream of jitter per destination, as each proxy link has
            link = LinkState(name, host, (host, port), delay_s=self.delay_s, jitter_s=self.jitter_s)
            link.rng = random.Random(f"{self.seed}:{name}")
            self.links[name] = link
        return link

    async def _dial(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.mark)
            sock.setblocking(False)
            await asyncio.wait_for(
                asyncio.get_running_loop().sock_connect(sock, (host, port)), CONNECT_TIMEOUT_S
            )
            return await asyncio.open_connection(sock=sock)
        except BaseException:
            sock.close()
            raise

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            host, port = original_destination(sock)
        except OSError:
            writer.transport.abort()  # not a redirected connection: nothing to relay it to
            return
        if (host, port) == sock.getsockname()[:2]:
            writer.transport.abort()  # dialled directly (conntrack says "here"): relaying would loop
            return
        if self.open >= MAX_RELAYED:
            writer.transport.abort()
            return
        link = self._link(host, port)
        try:
            up_r, up_w = await self._dial(host, port)
        except (OSError, TimeoutError):
            writer.transport.abort()  # the peer is down or cut off: so is the link
            return
        self.open += 1
        try:
            await splice(link, reader, writer, up_r, up_w)
        finally:
            self.open -= 1


def install_script(peers: list[tuple[str, int]], delay_ms: float, jitter_ms: float, seed: int) -> str:
    """Shell for one container: (re)start the relay and send new connections to ``peers``
    (ip, ledger port) through it; reset the ones opened before. No peers: ``remove_script``."""
    if not peers:
        return remove_script()
    lines = [
        "set -e",
        remove_script(),
        f"setsid python -m jepsen.net.relay --delay-ms {delay_ms:g} --jitter-ms {jitter_ms:g} "
        f"--seed {int(seed)} > {LOG_FILE} 2>&1 < /dev/null &",
        # the redirect is useless before the relay listens: wait for it (bounded)
        "i=0; while ! [ -s " + PID_FILE + " ]; do i=$((i+1)); [ $i -gt 100 ] && "
        "{ echo 'relay did not start:'; cat " + LOG_FILE + "; exit 1; }; sleep 0.05; done",
        f"iptables -w -t nat -N {NAT_CHAIN} 2>/dev/null || true",
        f"iptables -w -t nat -C OUTPUT -j {NAT_CHAIN} 2>/dev/null || iptables -w -t nat -I OUTPUT 1 -j {NAT_CHAIN}",
        f"iptables -w -N {RESET_CHAIN} 2>/dev/null || true",
        f"iptables -w -C OUTPUT -j {RESET_CHAIN} 2>/dev/null || iptables -w -A OUTPUT -j {RESET_CHAIN}",
    ]
    for ip, port in peers:
        match = f"-p tcp -d {ip} --dport {port} -m mark ! --mark {RELAY_MARK}"
        lines.append(f"iptables -w -t nat -A {NAT_CHAIN} {match} -j REDIRECT --to-ports {RELAY_PORT}")
        lines.append(f"iptables -w -A {RESET_CHAIN} {match} -j REJECT --reject-with tcp-reset")
    return "\n".join(lines)


def remove_script() -> str:
    """Shell for one container: no redirect, no resets, no relay (its connections end with it)."""
    return "\n".join(
        [
            f"iptables -w -t nat -F {NAT_CHAIN} 2>/dev/null || true",
            f"iptables -w -F {RESET_CHAIN} 2>/dev/null || true",
            # stop the relay, and wait (bounded) until its port is free for the next one
            f"if [ -s {PID_FILE} ]; then p=$(cat {PID_FILE}); rm -f {PID_FILE}; kill $p 2>/dev/null || true; "
            # (a zombie counts as gone: the container's first process, the broker, reaps no one)
            "i=0; while [ -d /proc/$p ] && [ \"$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null)\" != Z ] "
            "&& [ $i -lt 100 ]; do i=$((i+1)); sleep 0.05; done; fi",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m jepsen.net.relay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=RELAY_PORT)
    ap.add_argument("--pid-file", default=PID_FILE)
    args = ap.parse_args(argv)
    try:
        relay = Relay(args.delay_ms, args.jitter_ms, args.seed)
    except ValueError as exc:
        sys.exit(f"relay: {exc}")

    async def run() -> None:
        server = await asyncio.start_server(relay.handle, "127.0.0.1", args.port, reuse_address=True)
        Path(args.pid_file).write_text(str(os.getpid()))  # listening now: the redirect may begin
        async with server:
            await server.serve_forever()

    try:
        run_main(run())
    except OSError as exc:
        sys.exit(f"relay: cannot listen on 127.0.0.1:{args.port}: {exc}")


if __name__ == "__main__":
    main()
