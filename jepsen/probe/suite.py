"""``jepsen probe``: replay hostile-input probes against a running group and tabulate outcomes.

Every probe is one attack on one listener over a real socket, followed by a normal request
to the same listener; it passes only when the listener reacted as expected (closed the
connection, answered with an error, refused the connection) AND still served that normal
request afterwards. The probes (``PROBES``, in the order they run):

* malformed frames (``garbage``, ``oversize-length``, ``truncated-header``, ``bad-json-header``,
  ``unknown-code``) to every listener: nameserver, broker (main and fast port), ledger;
* ``slowloris``: connections that send part of a frame and stall must be closed by the
  listener's handshake timeout;
* ``flood``: connections past ``max_connections`` (or, on a ledger listener, past its
  unfinished-handshake limit) are closed at once while an established client is still served;
* ``peer-old-hello`` / ``peer-wrong-secret`` against ledger listeners: a forged peer is refused;
* ``ledger-no-secret``: a client without the cluster secret is refused by a ledger listener;
* ``namesrv-register``: a registration without the cluster proof is refused (NO_PERMISSION);
* ``trickle``: one frame, then the next a byte at a time: closed by ``frame_timeout_s``;
* ``compressed-body``, ``int-range``, ``nested-heartbeat``: a compressed flag on a body that
  does not inflate, integers a record cannot hold, JSON nested 100,000 deep: refused with a
  clear code and, where the probe reads the server's log, no traceback;
* ``acl-bypass``: sends that name two topics and message queries, by an account allowed one;
* ``max-message``: a message of exactly ``max_message_bytes`` sent and pulled back;
* ``pipelined-pulls``: pulls of a large message never read: RSS bounded, connection closed;
* ``dedup-growth``: idempotent producers sending more distinct keys than ``dedup_window``;
  the broker keeps at most the window and its RSS (read from /proc when the process runs
  on this machine) grows less than a stated bound;
* ``heartbeat-growth``: heartbeats from more client ids than ``max_heartbeat_clients``; the
  excess is refused (SYSTEM_BUSY) so the table stays bounded;
* ``client-flood``: heartbeats with fresh ids and new topics while sends go on: the master
  keeps its leadership and every send is acknowledged;
* ``unappliable-entry``: entries no replica can apply, appended with the cluster secret, are
  skipped by every broker.

The limits the probes expect are the servers' defaults unless given (``--remoting-max-connections``
and friends); with no address at all, the command stands up a local group itself (one
nameserver, one broker with its ledger member, ACL on, the nameserver holding the cluster
secret) with small limits, probes it and stops it. Against other groups, probes that need
what they were not given (``--cluster-secret-file``, ``--acl-admin``/``--acl-user``,
``--topic``) are listed as not run. With ``--tls-ca-file`` every probe speaks TLS (as the
clients of a ``tls_server_mode`` listener must) except the flood, whose plain sockets must
be bounded all the same. The broker probes leave traces (messages, topics, heartbeat
entries, skipped log entries; see ``broker_probes``): point them at a production group with care.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import secrets
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from broker.localgroup import LocalBrokerGroup
from common.cluster_secret import load_cluster_secret, write_cluster_secret
from common.settings import ConfigError
from jepsen.faults.forge import forged_append, old_hello, wrong_secret  # the attacks themselves
from ledger.auth import PeerAuth
from ledger.client import LedgerClient
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.codes import response_code_name
from remoting.exceptions import ProtocolError, RemotingError
from remoting.protocol import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_HEADER_BYTES, FrameDecoder, encode_command
from remoting.tls import client_ssl

from . import broker_probes
from .base import (
    BROKER,
    LEDGER,
    NAMESRV,
    NEEDS_SECRET,
    REACTION_WAIT_S,
    Account,
    Limits,
    NotRun,
    Row,
    Target,
    close_writer,
    main_brokers,
    needs_secret,
    open_conn,
    pid_listening_on,
    reaction,
    rss_kib,
    rss_note,
    with_serving_check,
)

HTTP_GARBAGE = b"GET / HTTP/1.1\r\nHost: probe\r\nUser-Agent: jepsen-probe\r\n\r\n"
SLOWLORIS_CONNECTIONS = 16
FLOOD_EXTRA = 50  # connections opened past the listener's limit
_FD_MARGIN = 128


# --- malformed frames -----------------------------------------------------------------------------


def _remoting_frame(header: bytes, serialize_type: int = 0) -> bytes:
    return struct.pack(">II", 4 + len(header), (serialize_type << 24) | len(header)) + header


def malformed_payloads(kind: str, limits: Limits) -> dict[str, tuple[list[bytes], set[str], str]]:
    """Per probe name: the frames sent, the acceptable reactions, and what is expected in words.
    The unknown code is signed when the probe has an ACL account (or ACL would answer first)."""
    if kind == LEDGER:
        cut_hello = PeerAuth(b"p" * 32).hello("n1", "n2")[0]
        le = struct.Struct("<I")

        def lf(body: bytes) -> bytes:
            return le.pack(len(body)) + body

        return {
            "garbage": ([HTTP_GARBAGE], {"closed"}, "closed (an HTTP request is no ledger frame)"),
            "oversize-length": ([le.pack(0x7FFFFFF0) + b"\0" * 16], {"closed"}, "closed before buffering"),
            "truncated-header": (
                [lf(cut_hello[: len(cut_hello) // 2])],
                {"closed"},
                "closed (half a peer hello)",
            ),
            "bad-json-header": (
                [lf(b"C"), lf(b'{"op": "status", "broken": ')],
                {"closed", "answered"},
                "closed or error answer",
            ),
            "unknown-code": (
                [lf(b"C"), lf(struct.pack("<BQ", 0x6E, 7))],
                {"closed", "answered"},
                "closed or error answer",
            ),
        }
    unknown = limits.sign(RemotingCommand.request(9999))
    unknown.opaque = 7
    return {
        "garbage": ([HTTP_GARBAGE], {"closed"}, "closed (an HTTP request is no RocketMQ frame)"),
        "oversize-length": (
            [struct.pack(">I", 0x7FFFFFF0) + b"\0" * 16],
            {"closed"},
            "closed before buffering",
        ),
        "truncated-header": (
            [struct.pack(">II", 8, 1000) + b"\0" * 4],
            {"closed", "answered"},
            "closed or error answer (header longer than its frame)",
        ),
        "bad-json-header": (
            [_remoting_frame(b'{"code": 105, "opaque": ')],
            {"closed", "answered"},
            "closed or error answer",
        ),
        "unknown-code": (
            [encode_command(unknown)],
            {"answered:REQUEST_CODE_NOT_SUPPORTED"},
            "answered REQUEST_CODE_NOT_SUPPORTED",
        ),
    }


def _describe_answer(kind: str, data: bytes) -> str:
    """``answered:<response code name>`` for a RocketMQ response frame, else plain ``answered``."""
    if kind == LEDGER:
        return "answered"
    try:
        events = FrameDecoder(DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_HEADER_BYTES, False).feed(data)
    except ProtocolError:
        return "answered"
    for ev in events:
        if isinstance(ev, RemotingCommand):
            return f"answered:{response_code_name(ev.code)}"
    return "answered"


async def probe_malformed(t: Target, limits: Limits) -> list[Row]:
    rows = []
    for name, (frames, accept, expected) in malformed_payloads(t.kind, limits).items():
        try:
            reader, writer = await open_conn(t, limits)
        except (OSError, TimeoutError) as exc:
            rows.append(Row(name, t.name, expected, f"cannot connect: {exc}", False))
            continue
        started = time.monotonic()
        try:
            for f in frames:
                writer.write(f)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            seen, data = await reaction(reader, REACTION_WAIT_S)
        finally:
            close_writer(writer)
        if seen == "answered":
            seen = _describe_answer(t.kind, data)
        ok = seen in accept or seen.split(":")[0] in accept
        outcome = f"{seen} after {time.monotonic() - started:.2f}s"
        outcome, ok = await with_serving_check(t, limits, outcome, ok)
        rows.append(Row(name, t.name, expected, outcome, ok))
    return rows


# --- slowloris ------------------------------------------------------------------------------------


def _partial_frame(kind: str) -> bytes:
    if kind == LEDGER:
        return struct.pack("<I", 200) + b"C"  # promises 200 bytes, sends one
    cmd = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    return encode_command(cmd)[:5]


async def probe_slowloris(t: Target, limits: Limits) -> Row:
    timeout = limits.handshake_timeout(t)
    allowed = timeout + max(2.0, timeout / 2)
    expected = f"{SLOWLORIS_CONNECTIONS} stalled connections closed within {allowed:g}s (handshake timeout {timeout:g}s)"
    conns = []
    try:
        for _ in range(SLOWLORIS_CONNECTIONS):
            reader, writer = await open_conn(t, limits)
            writer.write(_partial_frame(t.kind))
            conns.append((reader, writer))
        started = time.monotonic()

        async def until_closed(reader: asyncio.StreamReader) -> float | None:
            seen, _ = await reaction(reader, allowed)
            while seen == "answered":  # nothing is owed to half a frame, but keep reading
                seen, _ = await reaction(reader, max(0.01, allowed - (time.monotonic() - started)))
            return time.monotonic() - started if seen == "closed" else None

        waits = await asyncio.gather(*(until_closed(r) for r, _ in conns))
    except (OSError, TimeoutError) as exc:
        return Row("slowloris", t.name, expected, f"cannot connect: {exc}", False)
    finally:
        for _, w in conns:
            close_writer(w)
    closed = [w for w in waits if w is not None]
    outcome = f"{len(closed)}/{len(waits)} closed" + (f", slowest {max(closed):.1f}s" if closed else "")
    outcome, ok = await with_serving_check(t, limits, outcome, len(closed) == len(waits))
    return Row("slowloris", t.name, expected, outcome, ok)


# --- connection flood -----------------------------------------------------------------------------


def _fd_room(wanted: int) -> bool:
    """Make room for ``wanted`` more descriptors (raising the soft limit up to the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 64
    need = in_use + wanted + _FD_MARGIN
    if need <= soft:
        return True
    if hard != resource.RLIM_INFINITY and need > hard:
        return False
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return True
    return False


def _open_flood(host: str, port: int, count: int, deadline: float) -> tuple[list[socket.socket], int]:
    """Open up to ``count`` plain connections; returns them and how many could not even connect."""
    socks: list[socket.socket] = []
    failed = 0
    for _ in range(count):
        if time.monotonic() > deadline:
            failed += count - len(socks) - failed
            break
        try:
            socks.append(socket.create_connection((host, port), timeout=1.0))
        except OSError:
            failed += 1
    return socks, failed


def _is_closed(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class _Established:
    """A client connected (and used) before the flood, to show the listener still serves it."""

    def __init__(self, t: Target, limits: Limits) -> None:
        self.t, self.limits = t, limits
        self.ledger: LedgerClient | None = None
        self.remoting: RemotingClient | None = None

    async def call(self) -> str | None:
        t = self.t
        try:
            if t.kind == LEDGER:
                if self.ledger is None:
                    self.ledger = self.limits.ledger_client(t)
                await self.ledger.status(t.addr)
                return None
            if self.remoting is None:
                self.remoting = self.limits.remoting_client("probe-established")
            code = (
                RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER
                if t.kind == NAMESRV
                else RequestCode.GET_BROKER_RUNTIME_INFO
            )
            resp = await self.remoting.invoke_sync(t.addr, RemotingCommand.request(code), 3.0)
            return None if resp.is_success else f"answered {response_code_name(resp.code)}"
        except Exception as exc:  # noqa: BLE001
            return NEEDS_SECRET if needs_secret(t, self.limits, exc) else f"{type(exc).__name__}: {exc}"[:160]

    async def close(self) -> None:
        if self.ledger is not None:
            await self.ledger.close()
        if self.remoting is not None:
            await self.remoting.close()


async def probe_flood(t: Target, limits: Limits) -> Row:
    cap, setting = limits.connection_cap(t)
    total = cap + FLOOD_EXTRA
    expected = f"of {total} connections, >= {FLOOD_EXTRA} past {setting}={cap} closed at once; established client served"
    if not _fd_room(total):
        return Row("flood", t.name, expected, f"skipped: cannot open {total} descriptors here", None)
    established = _Established(t, limits)
    socks: list[socket.socket] = []
    try:
        before = await established.call()
        if before == NEEDS_SECRET:
            return Row("flood", t.name, expected, NEEDS_SECRET, None)
        if before is not None:
            return Row("flood", t.name, expected, f"could not connect before the flood: {before}", False)
        host, port = t.host_port
        socks, failed = await asyncio.to_thread(_open_flood, host, port, total, time.monotonic() + 30)
        await asyncio.sleep(0.5)
        refused = failed + sum(_is_closed(s) for s in socks)
        during = await established.call()
    finally:
        for s in socks:
            s.close()
        await established.close()
    outcome = f"{refused}/{total} refused; established client " + (
        "served" if during is None else f"NOT served ({during})"
    )
    ok = refused >= FLOOD_EXTRA and during is None
    await asyncio.sleep(0.2)  # let the listener see the flood go
    outcome, ok = await with_serving_check(t, limits, outcome, ok)
    return Row("flood", t.name, expected, outcome, ok)


# --- forged ledger peers --------------------------------------------------------------------------


async def _ledger_status(t: Target, limits: Limits) -> dict[str, Any]:
    async with limits.ledger_client(t) as lc:
        return await lc.status(t.addr)


async def probe_peer_hello(t: Target, limits: Limits) -> list[Row]:
    """forge's two peer attacks, each judged by the node hanging up AND by its term: a forged
    append carries the term + 100, so a node that took it in has jumped terms even if it later
    dropped the connection for another reason."""
    expected = "refused: hung up, term unchanged by the forged append (term + 100)"
    rows = []
    attacks: dict[str, Callable[[str, str, bytes], Awaitable[str]]] = {
        "peer-old-hello": lambda claim, _target, forged: old_hello(t.addr, claim, forged),
        "peer-wrong-secret": lambda claim, target, forged: wrong_secret(t.addr, claim, target, forged),
    }
    for name, attack in attacks.items():
        try:
            st = await _ledger_status(t, limits)
            target_id, term = str(st["id"]), int(st.get("term") or 0)
            claim = limits.ledger_claim or str(st.get("leader") or target_id)
            forged = forged_append(term, target_id, claim, int(st.get("last_index") or 0), term)
            verdict = await attack(claim, target_id, forged)
            after = int((await _ledger_status(t, limits)).get("term") or 0)
        except Exception as exc:  # noqa: BLE001 - the row says what stopped the attempt
            if needs_secret(t, limits, exc):
                rows.append(Row(name, t.name, expected, NEEDS_SECRET, None))
            else:
                rows.append(Row(name, t.name, expected, f"{type(exc).__name__}: {exc}"[:200], False))
            continue
        own = ", its own id" if claim == target_id else ""
        outcome = f"{verdict} (claimed {claim}{own}); term {term} -> {after}"
        ok = verdict == "refused" and after < term + 100
        outcome, ok = await with_serving_check(t, limits, outcome, ok)
        rows.append(Row(name, t.name, expected, outcome, ok))
    return rows


# --- broker tables and memory ---------------------------------------------------------------------


async def probe_heartbeats(t: Target, limits: Limits) -> Row:
    cap = limits.max_heartbeat_clients
    count = cap + max(50, cap // 10)
    expected = f"of {count} forged client ids, <= {cap} accepted, the rest SYSTEM_BUSY; RSS +<= {limits.rss_bound_mib:g} MiB"
    pid = pid_listening_on(t.addr)
    before = rss_kib(pid) if pid else None
    codes: dict[int, int] = {}
    run = os.getpid()
    try:
        async with limits.remoting_client("probe-heartbeats") as rc:

            async def beat(i: int) -> None:
                body = json.dumps(
                    {
                        "clientID": f"jepsen-probe-{run}-{i}",
                        "consumerDataSet": [{"groupName": f"jepsen-probe-G{i}", "subscriptionDataSet": []}],
                        "producerDataSet": [],
                    }
                ).encode()
                resp = await rc.invoke_sync(
                    t.addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=body), 5.0
                )
                codes[resp.code] = codes.get(resp.code, 0) + 1

            for lo in range(0, count, 200):
                await asyncio.gather(*(beat(i) for i in range(lo, min(count, lo + 200))))
    except (RemotingError, OSError, TimeoutError) as exc:
        return Row("heartbeat-growth", t.name, expected, f"heartbeats failed: {exc}", False)
    ok_count, busy = codes.get(ResponseCode.SUCCESS, 0), codes.get(ResponseCode.SYSTEM_BUSY, 0)
    rss, rss_ok = rss_note(pid, before, limits.rss_bound_mib)
    outcome = f"{ok_count} accepted, {busy} SYSTEM_BUSY, {count - ok_count - busy} other; {rss}"
    ok = ok_count <= cap and busy >= count - cap and rss_ok
    outcome, ok = await with_serving_check(t, limits, outcome, ok)
    return Row("heartbeat-growth", t.name, expected, outcome, ok)


async def _dedup_keys(addr: str, limits: Limits) -> tuple[str, int] | None:
    async with limits.remoting_client("probe-dedup") as rc:
        resp = await rc.invoke_sync(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 3.0)
    if not resp.is_success:
        return None
    info = json.loads(bytes(resp.body))
    return str(info.get("role")), int(info.get("store", {}).get("dedup_keys", -1))


async def probe_dedup(brokers: list[Target], namesrvs: list[Target], limits: Limits) -> Row:
    from client.producer import Producer
    from remoting.message import Message

    window = limits.dedup_window
    producers = 20
    per_producer = max(1, (window + window // 2) // producers)
    expected = f"{producers * per_producer} idempotent keys kept to <= dedup_window ({window}); RSS +<= {limits.rss_bound_mib:g} MiB"
    target = "?"
    try:
        master = None
        for b in brokers:
            info = await _dedup_keys(b.addr, limits)
            if info is not None and info[0] == "MASTER":
                master = b
        if master is None:
            return Row(
                "dedup-growth",
                ",".join(b.addr for b in brokers),
                expected,
                "no master among the brokers",
                False,
            )
        target = master.name
        pid = pid_listening_on(master.addr)
        before = rss_kib(pid) if pid else None
        ns = ";".join(n.addr for n in namesrvs)
        for p in range(producers):
            instance = limits.client_instance(ns, f"probe-dedup-{p}")
            try:
                async with Producer(
                    f"jepsen-probe-dedup-{p}", instance=instance, idempotent=True
                ) as producer:
                    for lo in range(0, per_producer, 100):
                        n = min(100, per_producer - lo)
                        await producer.send_batch([Message(limits.topic, b"probe") for _ in range(n)])
            finally:
                await instance.close()
        info = await _dedup_keys(master.addr, limits)
    except Exception as exc:  # noqa: BLE001 - report, do not crash the table
        return Row("dedup-growth", target, expected, f"{type(exc).__name__}: {exc}"[:200], False)
    keys = info[1] if info else -1
    rss, rss_ok = rss_note(pid, before, limits.rss_bound_mib)
    outcome = f"{keys} keys kept; {rss}"
    outcome, ok = await with_serving_check(master, limits, outcome, 0 < keys <= window and rss_ok)
    return Row("dedup-growth", target, expected, outcome, ok)


# --- the whole run --------------------------------------------------------------------------------


async def _every_malformed(targets: list[Target], limits: Limits) -> list[Row]:
    rows: list[Row] = []
    for t in targets:
        rows += await probe_malformed(t, limits)
    return rows


async def _every_slowloris(targets: list[Target], limits: Limits) -> list[Row]:
    return list(await asyncio.gather(*(probe_slowloris(t, limits) for t in targets)))


async def _every_flood(targets: list[Target], limits: Limits) -> list[Row]:
    return [await probe_flood(t, limits) for t in targets]


async def _every_peer_hello(targets: list[Target], limits: Limits) -> list[Row]:
    rows: list[Row] = []
    for t in targets:
        if t.kind == LEDGER:
            rows += await probe_peer_hello(t, limits)
    return rows


async def _dedup(targets: list[Target], limits: Limits) -> list[Row]:
    brokers, namesrvs = main_brokers(targets), [t for t in targets if t.kind == NAMESRV]
    if brokers and namesrvs and limits.topic:
        return [await probe_dedup(brokers, namesrvs, limits)]
    return [Row("dedup-growth", "-", "needs --broker, --namesrv and --topic", "skipped", None)]


async def _every_heartbeats(targets: list[Target], limits: Limits) -> list[Row]:
    return [await probe_heartbeats(t, limits) for t in main_brokers(targets)]


#: every probe, in the order they run: each takes all targets (and picks those it applies to)
#: and returns its rows, or raises NotRun when it lacks what it needs (the summary says what).
#: A new probe is one function and one line here. The de-dup and the size probes run before
#: the heartbeat probes fill the broker's client table; the unappliable entries go last.
PROBES: tuple[tuple[str, Callable[[list[Target], Limits], Awaitable[list[Row]]]], ...] = (
    ("malformed", _every_malformed),
    ("slowloris", _every_slowloris),
    ("flood", _every_flood),
    ("peer-hello", _every_peer_hello),
    ("ledger-no-secret", broker_probes.ledger_unauthenticated),
    ("namesrv-register", broker_probes.namesrv_register),
    ("trickle", broker_probes.trickle),
    ("compressed-body", broker_probes.compressed_body),
    ("int-range", broker_probes.integer_range),
    ("nested-heartbeat", broker_probes.nested_heartbeat),
    ("acl-bypass", broker_probes.acl_bypass),
    ("max-message", broker_probes.max_message),
    ("pipelined-pulls", broker_probes.pipelined_pulls),
    ("dedup-growth", _dedup),
    ("heartbeat-growth", _every_heartbeats),
    ("client-flood", broker_probes.client_flood),
    ("unappliable-entry", broker_probes.unappliable_entry),
)


async def run_probes(
    targets: list[Target],
    limits: Limits,
    not_run: dict[str, str] | None = None,
    only: frozenset[str] = frozenset(),
) -> list[Row]:
    """Every probe (of ``only``, when given) that applies to ``targets``; the group is checked
    to serve after each one. Probes that could not run are put in ``not_run`` with the reason."""
    rows: list[Row] = []
    for name, run in PROBES:
        if only and name not in only:
            continue
        try:
            rows += await run(targets, limits)
        except NotRun as exc:
            if not_run is not None:
                not_run[name] = str(exc)
    return rows


def format_table(rows: list[Row]) -> str:
    head = ("probe", "target", "expected", "outcome", "result")
    cells = [head] + [(r.probe, r.target, r.expected, r.outcome, r.verdict) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


# --- a local group to probe -----------------------------------------------------------------------

LOCAL_TOPIC = "ProbeTopic"
LOCAL_FORBIDDEN_TOPIC = "ProbeForbidden"


class ProbeGroup(LocalBrokerGroup):
    """One nameserver and a broker group with small limits, so every probe runs in seconds; ACL
    on (an admin and a user account), and the nameserver holds the cluster secret as well."""

    NAMESRV_SETTINGS: dict[str, Any] = {  # noqa: RUF012
        "max_connections": 64,
        "handshake_timeout_s": 1.5,
        "frame_timeout_s": 2.0,
    }
    signer: Callable[[RemotingCommand], None] | None = None
    """Signs the group's own status requests (its brokers refuse unsigned ones)."""

    def start_namesrv(self, ns: str) -> None:
        from common.process import write_toml

        host, port = self.ns_addr[ns].rsplit(":", 1)
        d = self.base_dir / ns
        d.mkdir(parents=True, exist_ok=True)
        conf = {
            "listen_host": host,
            "listen_port": int(port),
            "node_name": ns,
            "cluster_secret_file": self.cluster_secret_file(),
            **self.NAMESRV_SETTINGS,
        }
        write_toml(d / "namesrv.toml", conf)
        self.spawn(ns, [self.python, "-m", "namesrv", "--config", str(d / "namesrv.toml")], d / "namesrv.log")

    async def runtime_info(self, client: RemotingClient, nid: str) -> dict[str, Any] | None:
        req = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        if self.signer is not None:
            self.signer(req)
        try:
            resp = await client.invoke_sync(self.broker_addr[nid], req, 1.0)
        except Exception:  # noqa: BLE001 - a broker that is down or starting
            return None
        return json.loads(bytes(resp.body)) if resp.is_success else None


LOCAL_LIMITS = Limits(
    remoting_handshake_timeout_s=1.5,
    ledger_handshake_timeout_s=5.0,  # the broker's ledger member keeps the ledger's defaults
    remoting_max_connections=64,
    max_heartbeat_clients=200,
    dedup_window=500,
    rss_bound_mib=48.0,
    frame_timeout_s=2.0,
    max_output_bytes=16 << 20,  # the least remoting allows (twice write_buffer_high_bytes)
    flood_topics=300,
    topic=LOCAL_TOPIC,
    acl_forbidden_topic=LOCAL_FORBIDDEN_TOPIC,
)


def _accounts(base_dir: Path) -> tuple[Path, Account, Account]:
    """An ACL accounts file for the local group: an admin, and a user who may send to and pull
    from the probe topic only; written readable by its owner only."""
    admin = Account("probe-admin", secrets.token_hex(16))
    user = Account("probe-user", secrets.token_hex(16))
    doc = (
        f'[[accounts]]\naccess_key = "{admin.access_key}"\nsecret_key = "{admin.secret_key}"\nadmin = true\n\n'
        f'[[accounts]]\naccess_key = "{user.access_key}"\nsecret_key = "{user.secret_key}"\n'
        f'topic_perms = ["{LOCAL_TOPIC}=PUB|SUB"]\ndefault_group_perm = "SUB"\n'
    )
    path = base_dir / "acl.toml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(doc)
    return path, admin, user


@contextlib.contextmanager
def local_group(base_dir: Path, brokers: int) -> Iterator[tuple[list[Target], Limits]]:
    """Start a ProbeGroup, wait for its master, yield its listeners and the limits to probe them
    with (its secret, accounts and logs among them); always stops every process."""
    base_dir.mkdir(parents=True, exist_ok=True)
    secret = write_cluster_secret(base_dir / "cluster.secret")
    acl_file, admin, user = _accounts(base_dir)
    g = ProbeGroup(
        base_dir,
        brokers=brokers,
        nameservers=1,
        topics=(f"{LOCAL_TOPIC}:2", f"{LOCAL_FORBIDDEN_TOPIC}:1"),
        settings={
            "cluster_secret_file": str(secret),
            "max_connections": LOCAL_LIMITS.remoting_max_connections,
            "handshake_timeout_s": LOCAL_LIMITS.remoting_handshake_timeout_s,
            "frame_timeout_s": LOCAL_LIMITS.frame_timeout_s,
            "max_output_bytes": LOCAL_LIMITS.max_output_bytes,
            "max_heartbeat_clients": LOCAL_LIMITS.max_heartbeat_clients,
            "dedup_window": LOCAL_LIMITS.dedup_window,
            "register_interval_s": 10,
            "acl_enable": True,
            "acl_file": str(acl_file),
        },
    )
    g.signer = admin.signer()
    try:
        g.start()
        asyncio.run(g.wait_for_master(timeout=60))
        targets = [Target(NAMESRV, a) for a in g.namesrv_addrs]
        logs = {a: base_dir / ns / "namesrv.log" for ns, a in g.ns_addr.items()}
        for nid in g.node_ids:
            host, port = g.broker_addr[nid].rsplit(":", 1)
            fast = f"{host}:{int(port) - 2}"
            targets.append(Target(BROKER, g.broker_addr[nid], "broker"))
            targets.append(Target(BROKER, fast, "broker-fast"))
            targets.append(Target(LEDGER, g.ledger_addr[nid]))
            log = base_dir / g.name_of(nid) / "broker.log"
            logs.update({g.broker_addr[nid]: log, fast: log, g.ledger_addr[nid]: log})
        limits = LOCAL_LIMITS.replace(
            ledger_secret=load_cluster_secret("", str(secret)),
            acl_admin=admin,
            acl_user=user,
            log_files=logs,
        )
        yield targets, limits
    finally:
        g.stop()


# --- the command ----------------------------------------------------------------------------------


def _check_addrs(kind: str, addrs: tuple[str, ...]) -> list[Target]:
    out = []
    for a in addrs:
        for one in a.replace(";", ",").split(","):
            one = one.strip()
            host, sep, port = one.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise click.BadParameter(f"expected host:port, got {one!r}", param_hint=f"--{kind}")
            out.append(Target(kind, one))
    return out


def _account(value: str | None, option: str) -> Account | None:
    if not value:
        return None
    try:
        return Account.parse(value, option)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


@click.command()
@click.option(
    "--namesrv", "namesrvs", multiple=True, metavar="HOST:PORT", help="A nameserver to probe (repeatable)."
)
@click.option(
    "--broker", "brokers", multiple=True, metavar="HOST:PORT", help="A broker's main port (repeatable)."
)
@click.option(
    "--ledger", "ledgers", multiple=True, metavar="HOST:PORT", help="A ledger node / broker's ledger port."
)
@click.option("--topic", default="", help="A topic the broker probes may send to (and the ACL user may use).")
@click.option("--remoting-handshake-timeout-s", type=float, default=10.0, show_default=True)
@click.option("--ledger-handshake-timeout-s", type=float, default=5.0, show_default=True)
@click.option("--remoting-max-connections", type=int, default=4096, show_default=True)
@click.option("--ledger-max-connections", type=int, default=1024, show_default=True)
@click.option("--ledger-max-pending-handshakes", type=int, default=128, show_default=True)
@click.option("--max-heartbeat-clients", type=int, default=20_000, show_default=True)
@click.option("--dedup-window", type=int, default=100_000, show_default=True)
@click.option(
    "--rss-bound-mib", type=float, default=64.0, show_default=True, help="Allowed RSS growth per probe."
)
@click.option("--frame-timeout-s", type=float, default=30.0, show_default=True)
@click.option("--max-message-bytes", type=int, default=4 << 20, show_default=True)
@click.option(
    "--max-output-bytes", type=int, default=0, show_default=True, help="0: the servers' automatic value."
)
@click.option(
    "--flood-clients",
    type=int,
    default=0,
    help="Fresh client ids in the client flood (default 3 x the table).",
)
@click.option(
    "--flood-topics", type=int, default=1000, show_default=True, help="New topics in the client flood."
)
@click.option("--tls-ca-file", default="", help="Speak TLS to every listener, trusting this CA (PEM).")
@click.option("--tls-cert-file", default="", help="Client certificate for listeners that require one.")
@click.option("--tls-key-file", default="", help="Key of --tls-cert-file.")
@click.option("--ledger-claim", default="", help="Member id forged peers claim (default: the leader's).")
@click.option(
    "--cluster-secret-file",
    "--ledger-secret-file",
    "ledger_secret_file",
    type=click.Path(dir_okay=False, exists=True),
    help="The deployment's cluster secret: ledger clients prove it; probes that need it run only with it.",
)
@click.option(
    "--ledger-open-to-clients",
    is_flag=True,
    help="The --ledger nodes take clients without the secret (a standalone ledger without client_auth).",
)
@click.option(
    "--acl-admin", metavar="AK:SK|@FILE", help="An ACL superuser: every probe request is signed by it."
)
@click.option(
    "--acl-user", metavar="AK:SK|@FILE", help="An ACL account with PUB|SUB on --topic only (the ACL probe)."
)
@click.option(
    "--acl-forbidden-topic",
    default="JepsenProbeForbidden",
    show_default=True,
    help="A topic --acl-user has no right to (the admin creates it if missing).",
)
@click.option(
    "--only",
    "only",
    multiple=True,
    type=click.Choice([name for name, _ in PROBES]),
    help="Run this probe only (repeatable; default: every probe).",
)
@click.option(
    "--local-brokers",
    type=click.IntRange(1, 3),
    default=1,
    show_default=True,
    help="Brokers of the local group.",
)
@click.option(
    "--work-dir", type=click.Path(file_okay=False), help="Where the local group keeps its files and logs."
)
def probe(
    namesrvs: tuple[str, ...],
    brokers: tuple[str, ...],
    ledgers: tuple[str, ...],
    topic: str,
    ledger_secret_file: str | None,
    ledger_open_to_clients: bool,
    acl_admin: str | None,
    acl_user: str | None,
    only: tuple[str, ...],
    local_brokers: int,
    work_dir: str | None,
    tls_ca_file: str,
    tls_cert_file: str,
    tls_key_file: str,
    **limit_opts: Any,
) -> None:
    """Replay hostile-input probes (malformed frames, slowloris, floods, forged peers and
    clients, entries no replica can apply, size and number limits, ACL bypasses, trickles,
    unread answers, unproven registrations); print a table.

    Without addresses, stands up a local group (nameserver + broker + its ledger member, ACL
    on), probes it and stops it. Exit status 1 when any probe fails.
    """
    targets = _check_addrs(NAMESRV, namesrvs) + _check_addrs(BROKER, brokers) + _check_addrs(LEDGER, ledgers)
    try:
        secret = load_cluster_secret("", ledger_secret_file) if ledger_secret_file else None
        tls = client_ssl(bool(tls_ca_file), tls_ca_file, tls_cert_file, tls_key_file)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    started = time.monotonic()
    not_run: dict[str, str] = {}
    if targets:
        limits = Limits(
            topic=topic,
            ledger_secret=secret,
            ledger_client_auth=not ledger_open_to_clients,
            tls=tls,
            acl_admin=_account(acl_admin, "--acl-admin"),
            acl_user=_account(acl_user, "--acl-user"),
            **limit_opts,
        )
        rows = asyncio.run(run_probes(targets, limits, not_run, frozenset(only)))
    else:
        base = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="jepsen-probe-"))
        click.echo(f"no addresses given: starting a local group in {base}", err=True)
        try:
            with local_group(base, local_brokers) as (local_targets, local_limits):
                rows = asyncio.run(run_probes(local_targets, local_limits, not_run, frozenset(only)))
        except (TimeoutError, OSError, RuntimeError) as exc:
            raise click.ClickException(f"the local group did not start: {exc} (logs in {base})") from None
    click.echo(format_table(rows))
    for name, why in not_run.items():
        click.echo(f"not run: {name}: {why}", err=True)
    failed = sum(1 for r in rows if r.passed is False)
    summary = {
        "probes": [asdict(r) | {"result": r.verdict} for r in rows],
        "passed": sum(1 for r in rows if r.passed),
        "failed": failed,
        "skipped": sum(1 for r in rows if r.passed is None),
        "not_run": not_run,
        "seconds": round(time.monotonic() - started, 1),
    }
    click.echo(json.dumps(summary, sort_keys=True))
    sys.exit(1 if failed else 0)


__all__ = ["PROBES", "Limits", "Row", "Target", "probe", "run_probes"]
