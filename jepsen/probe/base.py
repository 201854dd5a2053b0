"""What every probe shares: the listeners probed (``Target``), what they are configured with
and what the probe holds (``Limits``: the servers' limits, the cluster secret, ACL accounts),
one table row (``Row``), raw sockets, the "still serves afterwards" check, and the readings
of a local process (RSS from /proc, new tracebacks in its log).

Kept apart from ``suite`` (the registry, the local group and the command) so that probe
modules import it without importing each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledger.client import LedgerClient
from ledger.wire import UNAVAILABLE, LedgerError
from remoting import RemotingClient, RemotingCommand, RequestCode
from remoting.acl import RequestSigner
from remoting.codes import response_code_name
from remoting.config import RemotingConfig
from remoting.message import MAX_PULL_FRAME_BYTES

NAMESRV, BROKER, LEDGER = "namesrv", "broker", "ledger"
REACTION_WAIT_S = 3.0  # how long a listener has to react to a malformed frame
LOG_TAIL_LIMIT = 8 << 20  # bytes of a log read for new tracebacks (a probe's own lines fit easily)
_AUTO_OUTPUT_FLOOR = 64 << 20  # remoting.config's automatic max_output_bytes never goes below this
_WRITE_BUFFER_HIGH = 8 << 20  # remoting.config's default write_buffer_high_bytes
_RECORD_OVERHEAD = 64 << 10  # what a broker's frame limit adds to its largest message or batch
_DEFAULT_MAX_BATCH_BYTES = 8 << 20  # broker.config's default max_batch_bytes


@dataclass(frozen=True)
class Target:
    kind: str  # NAMESRV, BROKER or LEDGER
    addr: str
    label: str = ""

    @property
    def name(self) -> str:
        return f"{self.label or self.kind}@{self.addr}"

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.addr.rsplit(":", 1)
        return host.strip("[]"), int(port)


@dataclass(frozen=True)
class Account:
    """An ACL account the probe signs with (``--acl-admin``, ``--acl-user``)."""

    access_key: str
    secret_key: str = field(repr=False)

    @classmethod
    def parse(cls, text: str, what: str) -> Account:
        """``ACCESS_KEY:SECRET_KEY``, or ``@FILE`` holding that on its first line (which keeps the
        secret out of the process list). ValueError names ``what`` and says what is wrong."""
        if text.startswith("@"):
            try:
                text = Path(text[1:]).read_text(encoding="utf-8").splitlines()[0].strip()
            except (OSError, IndexError, UnicodeDecodeError) as exc:
                raise ValueError(f"{what}: cannot read an account from {text[1:]}: {exc}") from None
        access_key, sep, secret_key = text.partition(":")
        if not sep or not access_key or not secret_key:
            raise ValueError(f"{what}: expected ACCESS_KEY:SECRET_KEY (or @FILE holding it)")
        return cls(access_key, secret_key)

    def signer(self) -> RequestSigner:
        return RequestSigner(self.access_key, self.secret_key)


@dataclass
class Limits:
    """What the probed servers are configured with (defaults: the servers' own defaults) and
    what the probe holds (the cluster secret, ACL accounts, the local processes' logs)."""

    remoting_handshake_timeout_s: float = 10.0
    ledger_handshake_timeout_s: float = 5.0
    remoting_max_connections: int = 4096
    ledger_max_connections: int = 1024
    ledger_max_pending_handshakes: int = 128
    max_heartbeat_clients: int = 20_000
    dedup_window: int = 100_000
    rss_bound_mib: float = 64.0
    frame_timeout_s: float = 30.0
    max_message_bytes: int = 4 << 20
    max_output_bytes: int = 0
    """0: what a broker with default settings computes (remoting.config.output_limit_bytes)."""
    flood_clients: int = 0
    """Heartbeats with fresh client ids in the client flood; 0: three times max_heartbeat_clients."""
    flood_topics: int = 1000
    topic: str = ""
    ledger_secret: bytes | None = field(default=None, repr=False)
    """The deployment's cluster secret: ledger ports take clients that prove it, nameservers
    given it take registrations only with its proof (probes that need it run only with it)."""
    ledger_claim: str = ""
    """Member id a forged peer claims; default the leader's (the node's own id when it leads)."""
    ledger_client_auth: bool = True
    """Ledger listeners must refuse clients without the secret (a broker's ledger port always does)."""
    tls: ssl.SSLContext | None = field(default=None, repr=False)
    """Set: the probes speak TLS to every listener (as its clients must), floods stay plain TCP."""
    acl_admin: Account | None = None
    """Signs every request of the probes (a group with ACL on refuses unsigned ones)."""
    acl_user: Account | None = None
    """An account with PUB|SUB on ``topic`` and nothing on ``acl_forbidden_topic`` (ACL probe)."""
    acl_forbidden_topic: str = "JepsenProbeForbidden"
    log_files: dict[str, Path] = field(default_factory=dict)
    """Listener address -> the log of the local process serving it (read for tracebacks)."""

    @property
    def output_limit_bytes(self) -> int:
        if self.max_output_bytes:
            return self.max_output_bytes
        body = max(_DEFAULT_MAX_BATCH_BYTES, self.max_message_bytes) + _RECORD_OVERHEAD
        return max(_AUTO_OUTPUT_FLOOR, _WRITE_BUFFER_HIGH + 2 * body)

    @property
    def flood_heartbeats(self) -> int:
        return self.flood_clients or 3 * self.max_heartbeat_clients

    def signer(self, account: Account | None = None) -> RequestSigner | None:
        """The signer of ``account`` (default the admin's), None without one."""
        account = account or self.acl_admin
        return account.signer() if account else None

    def sign(self, cmd: RemotingCommand) -> RemotingCommand:
        """``cmd`` signed by the admin account when the probe has one (for raw-socket frames)."""
        signer = self.signer()
        if signer is not None:
            signer(cmd)
        return cmd

    def remoting_client(self, name: str, account: Account | None = None) -> RemotingClient:
        """A client that signs with ``account`` (default the admin's) and reads frames as large as
        a pull answer of the broker's largest message (RocketMQ's 16 MiB)."""
        signer = self.signer(account)
        config = RemotingConfig(
            client_ssl=self.tls, max_body_bytes=MAX_PULL_FRAME_BYTES, send_crc=signer is None
        )
        return RemotingClient(config, name=name, rpc_hook=signer)

    def client_instance(self, namesrv: str, name: str) -> Any:
        """A client.instance.ClientInstance for producers and consumers, signing as the admin."""
        from client.instance import ClientInstance

        admin = self.acl_admin
        return ClientInstance(
            namesrv,
            name=name,
            tls=self.tls,
            access_key=admin.access_key if admin else None,
            secret_key=admin.secret_key if admin else None,
        )

    def ledger_client(self, t: Target, authenticated: bool = True) -> LedgerClient:
        """A client of ``t``, proving the cluster secret when the probe has it and ``authenticated``."""
        secret = self.ledger_secret if authenticated else None
        return LedgerClient([t.addr], timeout=3.0, attempt_timeout=3.0, secret=secret, ssl=self.tls)

    def handshake_timeout(self, t: Target) -> float:
        return self.ledger_handshake_timeout_s if t.kind == LEDGER else self.remoting_handshake_timeout_s

    def connection_cap(self, t: Target) -> tuple[int, str]:
        """Connections that say nothing the listener holds before refusing new ones at once, and
        the setting that bounds them (a ledger listener caps unfinished handshakes first)."""
        if t.kind == LEDGER:
            if self.ledger_max_pending_handshakes < self.ledger_max_connections:
                return self.ledger_max_pending_handshakes, "max_pending_handshakes"
            return self.ledger_max_connections, "max_connections"
        return self.remoting_max_connections, "max_connections"

    def replace(self, **changes: Any) -> Limits:
        return dataclasses.replace(self, **changes)


@dataclass
class Row:
    probe: str
    target: str
    expected: str
    outcome: str
    passed: bool | None  # None: skipped (cannot run here), neither pass nor fail

    @property
    def verdict(self) -> str:
        return "skip" if self.passed is None else "pass" if self.passed else "FAIL"


class NotRun(Exception):
    """A probe that cannot run with what it was given (a missing option); the summary lists why."""


# --- sockets --------------------------------------------------------------------------------------


async def open_conn(t: Target, limits: Limits) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = t.host_port
    tls = limits.tls
    return await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=tls, server_hostname=host if tls else None), 3.0
    )


async def reaction(reader: asyncio.StreamReader, timeout: float) -> tuple[str, bytes]:
    """('closed', b'') when the peer hung up, ('answered', first bytes) when it wrote, ('silent', b'')."""
    try:
        data = await asyncio.wait_for(reader.read(65536), timeout)
    except TimeoutError:
        return "silent", b""
    except (ConnectionError, OSError):
        return "closed", b""
    return ("answered", data) if data else ("closed", b"")


async def closed_within(reader: asyncio.StreamReader, within_s: float) -> float | None:
    """Seconds until the peer closed the connection (reading and dropping what it sends), or None
    when it was still open after ``within_s``."""
    started = time.monotonic()
    deadline = started + within_s
    while (left := deadline - time.monotonic()) > 0:
        what, _ = await reaction(reader, left)
        if what == "closed":
            return time.monotonic() - started
        if what == "silent":
            return None
    return None


def close_writer(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.transport.abort()


# --- normal requests ------------------------------------------------------------------------------


async def serving(t: Target, limits: Limits) -> tuple[bool, str]:
    """Whether the listener answers a normal request on a fresh connection, in words for a row.

    A ledger listener that takes no client without the cluster secret, probed without it,
    can only be seen to accept connections; the words say so."""
    try:
        if t.kind == LEDGER:
            try:
                async with limits.ledger_client(t) as lc:
                    await lc.status(t.addr)
            except LedgerError as exc:
                if not needs_secret(t, limits, exc):
                    raise
                _, writer = await open_conn(t, limits)
                close_writer(writer)
                return True, "still accepts connections (no cluster secret to ask more)"
            return True, "still serves"
        code = (
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER
            if t.kind == NAMESRV
            else RequestCode.GET_BROKER_RUNTIME_INFO
        )
        async with limits.remoting_client("probe") as rc:
            resp = await rc.invoke_sync(t.addr, RemotingCommand.request(code), 3.0)
        if resp.is_success:
            return True, "still serves"
        return False, f"NOT serving afterwards (answered {response_code_name(resp.code)})"
    except Exception as exc:  # noqa: BLE001 - any failure is the finding
        return False, f"NOT serving afterwards ({type(exc).__name__}: {exc})"[:200]


def needs_secret(t: Target, limits: Limits, exc: BaseException) -> bool:
    """Whether ``exc`` is a ledger node hanging up on a client that could not prove the secret."""
    return (
        t.kind == LEDGER
        and limits.ledger_secret is None
        and isinstance(exc, LedgerError)
        and exc.code == UNAVAILABLE
    )


NEEDS_SECRET = "skipped: the node takes no client without the cluster secret (--cluster-secret-file)"


async def with_serving_check(t: Target, limits: Limits, outcome: str, ok: bool) -> tuple[str, bool]:
    still, words = await serving(t, limits)
    return f"{outcome}; {words}", ok and still


async def runtime_info(addr: str, limits: Limits) -> dict[str, Any] | None:
    """A broker's GET_BROKER_RUNTIME_INFO (signed when the probe has an admin account), or None."""
    try:
        async with limits.remoting_client("probe-info") as rc:
            resp = await rc.invoke_sync(
                addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 3.0
            )
    except Exception:  # noqa: BLE001 - down or unreachable: the caller says what it needed
        return None
    if not resp.is_success:
        return None
    with contextlib.suppress(ValueError):
        info = json.loads(bytes(resp.body))
        return info if isinstance(info, dict) else None
    return None


def main_brokers(targets: list[Target]) -> list[Target]:
    """The brokers' main listeners among ``targets`` (the fast port takes no sends or heartbeats)."""
    return [t for t in targets if t.kind == BROKER and not t.label.endswith("fast")]


async def find_master(targets: list[Target], limits: Limits) -> tuple[Target, dict[str, Any]]:
    """The main listener of the broker that is MASTER, and its runtime info; NotRun without one."""
    brokers = main_brokers(targets)
    if not brokers:
        raise NotRun("needs --broker")
    for b in brokers:
        info = await runtime_info(b.addr, limits)
        if info is not None and info.get("role") == "MASTER":
            return b, info
    raise NotRun("no master among the brokers (or their runtime info is refused: --acl-admin?)")


# --- a local process: memory and log --------------------------------------------------------------


def _proc_net_ip(host: str) -> set[str]:
    """How /proc/net/tcp spells ``host`` as a listener's address (and the wildcard that covers it)."""
    try:
        packed = socket.inet_aton(socket.gethostbyname(host))
    except OSError:
        return set()
    return {packed[::-1].hex().upper(), "00000000"}  # little-endian IPv4, or 0.0.0.0


def pid_listening_on(addr: str) -> int | None:
    """The PID of a process of this machine listening on ``addr`` (via /proc), else None.

    A listening socket on this host and port (or the wildcard address) is looked up in
    /proc/net/tcp, then the process holding that socket in /proc/<pid>/fd; a remote
    address, or a process of another user, gives None.
    """
    try:
        host, port_text = addr.rsplit(":", 1)
        port, ips = int(port_text), _proc_net_ip(host.strip("[]"))
        inodes = set()
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                ip, _, hex_port = cols[1].partition(":")
                if cols[3] == "0A" and ip in ips and int(hex_port, 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{cols[9]}]")
        if not inodes:
            return None
        for pid in filter(str.isdigit, os.listdir("/proc")):
            fd_dir = f"/proc/{pid}/fd"
            with contextlib.suppress(OSError):
                for fd in os.listdir(fd_dir):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"{fd_dir}/{fd}") in inodes:
                            return int(pid)
    except (ValueError, IndexError, OSError):
        return None
    return None


def rss_kib(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def rss_note(pid: int | None, before: int | None, bound_mib: float) -> tuple[str, bool]:
    """The RSS growth since ``before`` against ``bound_mib``, and whether it kept within it."""
    if pid is None or before is None:
        return "RSS not measured (process not on this machine)", True
    after = rss_kib(pid)
    if after is None:
        return "RSS not measured (process gone?)", False
    grown = (after - before) / 1024
    return f"RSS {grown:+.1f} MiB (bound {bound_mib:g})", grown <= bound_mib


class LogWatch:
    """New tracebacks in the logs of the local processes behind some listeners, since creation.

    A probe of hostile input passes only if the server answered it without a traceback; that
    can be read only where the probe knows the log (the local group it stood up)."""

    def __init__(self, limits: Limits, addrs: list[str]) -> None:
        self.marks: dict[Path, int] = {}
        for addr in addrs:
            path = limits.log_files.get(addr)
            if path is not None and path not in self.marks:
                self.marks[path] = path.stat().st_size if path.exists() else 0

    def note(self) -> tuple[str, bool]:
        """("log: ...", no new traceback); ("log not read ...", True) when no log is known."""
        if not self.marks:
            return "log not read (not a local process)", True
        found = 0
        for path, mark in self.marks.items():
            try:
                with open(path, "rb") as f:
                    f.seek(max(mark, f.seek(0, os.SEEK_END) - LOG_TAIL_LIMIT))
                    found += f.read().count(b"Traceback")
            except OSError as exc:
                return f"log unreadable: {exc.strerror}", False
        return ("log: no traceback", True) if not found else (f"log: {found} NEW TRACEBACK(S)", False)
