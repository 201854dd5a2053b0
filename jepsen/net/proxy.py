"""Cuttable TCP links between local nodes: network partitions without root or namespaces.

Every directed peer link ``src -> dst`` gets its own listening port on ``dst``'s loopback
address; ``src`` is configured to reach ``dst`` through it. Cutting the link aborts every
connection on it and refuses new ones (accept, then abort), so the sender sees a dead peer
exactly as with a dropped network, and no frame is ever delivered half-way: a TCP proxy
cannot drop single packets without corrupting the stream, so a cut link carries nothing
at all until it is healed. Clients of the harness bypass the proxies (they talk to the
nodes' own addresses), the way Jepsen's control node keeps reaching every node.

A link can also be *shaped* (``slow-network``, ``lossy-network``): a delay (plus uniform
jitter) holds every chunk for that long before it is forwarded, in order, so throughput
is kept and latency grows; a drop probability is applied per forwarded chunk and per new
connection. A TCP stream cannot lose a chunk and stay intact, so a "lost" chunk ends its
connection (both sides see a reset, as after retransmissions gave up) and a "lost" new
connection is refused: the nodes see what heavy loss does to TCP, never a corrupt frame.
The choices come from a ``random.Random`` seeded by the harness, so a run can be replayed.

The links run in their own process (``python -m jepsen.net.proxy``), not in the
harness, so a busy client event loop never delays heartbeats. The process is driven by
JSON lines on stdin and answers on stdout; it exits when stdin closes, so it cannot
outlive the harness that started it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import select
import subprocess
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from common.cli import run_main

Link = tuple[str, str]  # (src, dst) node ids


# ---------------------------------------------------------------------------------- the process


@dataclass
class LinkState:
    name: str
    host: str
    target: tuple[str, int]
    cut: bool = False
    conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = field(default_factory=set)
    accepted: int = 0
    refused: int = 0
    bytes: int = 0
    delay_s: float = 0.0
    jitter_s: float = 0.0
    drop: float = 0.0  # probability that a chunk or a new connection is lost
    dropped: int = 0
    rng: random.Random = field(default_factory=random.Random)
    server: asyncio.base_events.Server | None = None

    def lose(self) -> bool:
        if self.drop > 0 and self.rng.random() < self.drop:
            self.dropped += 1
            return True
        return False


MAX_DELAY_S = 10.0  # a shaped link never holds a chunk longer than this
MAX_QUEUED_CHUNKS = 4096  # per direction: beyond this the reader waits (back-pressure)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: LinkState) -> None:
    if link.delay_s <= 0 and link.jitter_s <= 0:
        while True:
            data = await src.read(1 << 16)
            if not data or link.cut or link.lose():
                return
            link.bytes += len(data)
            dst.write(data)
            await dst.drain()
            if link.delay_s > 0 or link.jitter_s > 0:
                break  # shaped while running: continue below, with the delay
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(MAX_QUEUED_CHUNKS)

    async def deliver() -> None:
        last = 0.0
        while True:
            item = await queue.get()
            if item is None:
                return
            due, data = item
            due = max(due, last)  # chunks leave in order, never earlier than the one before
            last = due
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if link.cut:
                return
            dst.write(data)
            await dst.drain()

    sender = asyncio.ensure_future(deliver())
    try:
        while not sender.done():
            data = await src.read(1 << 16)
            if not data or link.cut or link.lose():
                break
            link.bytes += len(data)
            extra = link.rng.uniform(0, link.jitter_s) if link.jitter_s > 0 else 0.0
            await queue.put((loop.time() + min(MAX_DELAY_S, link.delay_s + extra), data))
        if not sender.done():
            await queue.put(None)
            await sender
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)


async def splice(
    link: LinkState,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_r: asyncio.StreamReader,
    up_w: asyncio.StreamWriter,
) -> None:
    """Carry one accepted connection both ways over ``link`` (its cut, delay and loss) until
    either direction ends, then abort both ends: a link proxy's and a docker relay's connection."""
    link.accepted += 1
    pair = (writer, up_w)
    link.conns.add(pair)
    tasks = [
        asyncio.ensure_future(_pipe(reader, up_w, link)),
        asyncio.ensure_future(_pipe(up_r, writer, link)),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        pass
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        link.conns.discard(pair)
        writer.transport.abort()
        up_w.transport.abort()


async def _handle(link: LinkState, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    if link.cut or link.lose():
        link.refused += 1
        writer.transport.abort()
        return
    try:
        up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*link.target), 1.0)
    except (OSError, TimeoutError):
        writer.transport.abort()  # the node behind the link is down: so is the link
        return
    if link.cut:  # cut while connecting
        up_w.transport.abort()
        writer.transport.abort()
        return
    await splice(link, reader, writer, up_r, up_w)


def _apply_shape(links: dict[str, LinkState], cmd: dict[str, Any]) -> list[str]:
    """Shape the named links (every other link goes back to no delay and no loss)."""
    names = set(cmd["links"])
    unknown = names - set(links)
    if unknown:
        raise ValueError(f"no such links: {sorted(unknown)}")
    delay = float(cmd.get("delay_ms", 0)) / 1000
    jitter = float(cmd.get("jitter_ms", 0)) / 1000
    drop = float(cmd.get("drop", 0))
    if not (0 <= delay <= MAX_DELAY_S and 0 <= jitter <= MAX_DELAY_S and 0 <= drop <= 1):
        raise ValueError(f"delay/jitter must be 0..{MAX_DELAY_S * 1000:.0f} ms and drop 0..1, got {cmd}")
    seed = int(cmd.get("seed", 0))
    for name, link in sorted(links.items()):
        on = name in names
        link.delay_s, link.jitter_s, link.drop = (delay, jitter, drop) if on else (0.0, 0.0, 0.0)
        link.rng = random.Random(f"{seed}:{name}")
    return sorted(names)


def _apply_cuts(links: dict[str, LinkState], cut: set[str]) -> int:
    closed = 0
    for name, link in links.items():
        link.cut = name in cut
        if link.cut:
            for a, b in list(link.conns):
                a.transport.abort()
                b.transport.abort()
                closed += 1
            link.conns.clear()
    return closed


async def _serve(spec: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    links: dict[str, LinkState] = {}
    bound: dict[str, str] = {}
    # The nodes' own ports were picked but are not bound yet: never take one of them (a link
    # listening on its own target forwards to itself; one on a node's port keeps it from starting).
    avoid = {item["target"] for item in spec["links"]} | set(spec["avoid"])
    for item in spec["links"]:
        host, port = item["target"].rsplit(":", 1)
        link = LinkState(item["name"], item["host"], (host, int(port)))
        wanted = int(item.get("port") or 0)  # a port the harness planned (--port-base), else any
        for _ in range(1 if wanted else 100):
            server = await asyncio.start_server(
                lambda r, w, link=link: _handle(link, r, w), item["host"], wanted, reuse_address=True
            )
            addr = f"{item['host']}:{server.sockets[0].getsockname()[1]}"
            if addr not in avoid:
                break
            server.close()
        link.server = server
        links[link.name] = link
        bound[link.name] = addr
    print(json.dumps({"ready": bound}), flush=True)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            return  # the harness is gone: so are we
        try:
            cmd = json.loads(line)
            if "cut" in cmd:
                closed = _apply_cuts(links, set(cmd["cut"]))
                reply: dict[str, Any] = {
                    "ok": True,
                    "cut": sorted(n for n, s in links.items() if s.cut),
                    "closed": closed,
                }
            elif "shape" in cmd:
                reply = {"ok": True, "shaped": _apply_shape(links, cmd["shape"])}
            elif cmd.get("op") == "stats":
                reply = {
                    "ok": True,
                    "links": {
                        n: {
                            "cut": s.cut,
                            "open": len(s.conns),
                            "accepted": s.accepted,
                            "refused": s.refused,
                            "bytes": s.bytes,
                            "delay_ms": s.delay_s * 1000,
                            "drop": s.drop,
                            "dropped": s.dropped,
                        }
                        for n, s in links.items()
                    },
                }
            else:
                reply = {"ok": False, "error": f"unknown command {cmd!r}"}
        except (ValueError, TypeError, KeyError) as exc:
            reply = {"ok": False, "error": str(exc)}
        print(json.dumps(reply), flush=True)


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        run_main(_serve(spec))  # uvloop and a tuned collector, as the servers
    except KeyboardInterrupt:
        pass


# ---------------------------------------------------------------------------------- the controller


def link_name(src: str, dst: str) -> str:
    return f"{src}->{dst}"


class ProxyError(RuntimeError):
    """The proxy process did not start or did not answer."""


class LinkProxy:
    """Starts the proxy process for a set of directed links and cuts/heals them.

    ``targets`` maps a node id to its real ``host:port``; every ordered pair of distinct
    nodes gets a link listening on the destination's host, unless ``links`` names the pairs
    that talk (several broker groups: only the members of one group dial each other).
    ``ports`` gives each link's listening port where the harness planned them
    (``--port-base``); otherwise the OS picks one that is neither a target nor in ``avoid``
    (the other ``host:port``s the nodes will listen on, picked but not yet bound). Thread-safe: the nemesis may call it from a
    worker thread.
    """

    def __init__(
        self,
        targets: dict[str, str],
        *,
        log_path: str | os.PathLike[str] | None = None,
        python: str = sys.executable,
        links: Iterable[Link] | None = None,
        ports: dict[Link, int] | None = None,
        avoid: Iterable[str] = (),
    ) -> None:
        self.targets = dict(targets)
        self.links: list[Link] = (
            [(a, b) for a in targets for b in targets if a != b] if links is None else list(links)
        )
        self.addresses: dict[Link, str] = {}
        self.cut: set[Link] = set()
        self._lock = threading.Lock()
        links_spec = [
            {
                "name": link_name(a, b),
                "host": targets[b].rsplit(":", 1)[0],
                "target": targets[b],
                **({"port": ports[(a, b)]} if ports and (a, b) in ports else {}),
            }
            for a, b in self.links
        ]
        spec = {"links": links_spec, "avoid": sorted(set(avoid))}
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [python, "-m", "jepsen.net.proxy", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        try:
            ready = self._read_reply(timeout=20)
            bound = ready["ready"]
            self.addresses = {(a, b): bound[link_name(a, b)] for a, b in self.links}
        except BaseException:
            self.close()
            raise

    def address(self, src: str, dst: str) -> str:
        """Where ``src`` must dial to reach ``dst`` through the cuttable link."""
        return self.addresses[(src, dst)]

    def _read_reply(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise ProxyError(f"link proxy (pid {self.proc.pid}) did not answer within {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            raise ProxyError(f"link proxy (pid {self.proc.pid}) exited with {self.proc.poll()}")
        return json.loads(line)

    def _command(self, cmd: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError) as exc:
                raise ProxyError(f"link proxy (pid {self.proc.pid}) is gone: {exc}") from None
            reply = self._read_reply(timeout=10)
        if not reply.get("ok"):
            raise ProxyError(f"link proxy refused {cmd}: {reply.get('error')}")
        return reply

    def set_cut(self, links: Iterable[Link]) -> dict[str, Any]:
        """Make exactly ``links`` cut (every other link heals); returns the proxy's answer."""
        want = set(links)
        unknown = want - set(self.links)
        if unknown:
            raise ValueError(f"no such links: {sorted(unknown)}")
        reply = self._command({"cut": [link_name(a, b) for a, b in sorted(want)]})
        self.cut = want
        return reply

    def set_shape(
        self,
        links: Iterable[Link],
        *,
        delay_ms: float = 0,
        jitter_ms: float = 0,
        drop: float = 0,
        seed: int = 0,
    ) -> dict[str, Any]:
        """Delay and/or drop on exactly ``links`` (all others unshaped); ``seed`` makes drops replayable."""
        want = set(links)
        unknown = want - set(self.links)
        if unknown:
            raise ValueError(f"no such links: {sorted(unknown)}")
        shape = {
            "links": [link_name(a, b) for a, b in sorted(want)],
            "delay_ms": delay_ms,
            "jitter_ms": jitter_ms,
            "drop": drop,
            "seed": seed,
        }
        return self._command({"shape": shape})

    def heal(self) -> dict[str, Any]:
        return self.set_cut(())

    def stats(self) -> dict[str, Any]:
        return self._command({"op": "stats"})["links"]

    def close(self) -> None:
        """Stop the proxy process (closing stdin ends it; SIGKILL if it lingers) and reap it."""
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(timeout=3)
            except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
                self.proc.kill()
                self.proc.wait(timeout=10)
        for fh in (self.proc.stdout,):
            if fh is not None:
                fh.close()
        if self._log is not subprocess.DEVNULL:
            self._log.close()  # type: ignore[union-attr]

    def __enter__(self) -> LinkProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    main()
