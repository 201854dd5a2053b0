"""The ``forge-peer`` fault: an outsider that tries to join a ledger group and to run broker
admin operations without credentials.

Each attempt is one real connection to a node's real address (not through the link
proxies) and ends in an outcome: ``refused`` (the node hung up, or answered with a
refusal) or ``accepted`` (the node kept talking to us, or did what we asked). The
attempts mirror the hostile-peer probes (``tests/test_ledger_security.py`` tests the same
ground in detail; the harness does not import tests, so the few pieces it needs live
here):

* ``old-hello``: the pre-authentication peer hello (``P`` + a member id, the leader's)
  followed by a forged AppendRequest (term + 100, one foreign entry, commit = last + 1);
* ``wrong-secret``: the authenticated hello with a made-up secret, then its proof and
  the same forged append;
* ``admin-no-credentials`` (brokers with ACL on): an unsigned ``UPDATE_AND_CREATE_TOPIC``.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import client.broker_api as B
from jepsen.faults.base import Fault, FaultContext, Scope
from jepsen.systems.base import Backend, Unsupported
from ledger.auth import PROOF, Handshake, PeerAuth
from ledger.client import LedgerClient
from ledger.codec import Entry
from ledger.messages import AppendRequest, encode_message
from remoting import RemotingClient, ResponseCode
from remoting.codes import RequestCode
from remoting.exceptions import RemotingError
from remoting.protocol import RemotingCommand

_LEN = struct.Struct("<I")
WRONG_SECRET = b"forge-peer: not-the-cluster-secret-000000"
REFUSAL_WAIT_S = 3.0  # how long a node has to hang up on us before the attempt counts as accepted
FORGED_TOPIC = "JepsenForgedTopic"


def frame(body: bytes) -> bytes:
    return _LEN.pack(len(body)) + body


def forged_append(term: int, target: str, src: str, last_index: int, last_term: int) -> bytes:
    """A forged append a hostile peer sends: term + 100, one foreign entry, commit = last + 1."""
    t = term + 100
    e = Entry(last_index + 1, t, b"FORGED", pos=0)
    return encode_message(AppendRequest(t, src, target, last_index, last_term, last_index + 1, [e]))


class RawConn:
    """The attacker's side: raw frames on a socket, and whether the node hung up."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, address: str) -> RawConn:
        host, port = address.rsplit(":", 1)
        return cls(*await asyncio.wait_for(asyncio.open_connection(host, int(port)), 2.0))

    def send(self, *bodies: bytes) -> None:
        for b in bodies:
            self.writer.write(frame(b))

    async def read_frame(self, timeout: float = REFUSAL_WAIT_S) -> bytes:
        head = await asyncio.wait_for(self.reader.readexactly(4), timeout)
        return await asyncio.wait_for(self.reader.readexactly(_LEN.unpack(head)[0]), timeout)

    async def closed_by_peer(self, timeout: float = REFUSAL_WAIT_S) -> bool:
        """True once the node closes the connection (EOF or reset) within ``timeout``."""
        try:
            await self.writer.drain()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                data = await asyncio.wait_for(self.reader.read(65536), max(0.01, deadline - time.monotonic()))
                if not data:
                    return True
        except (ConnectionError, asyncio.IncompleteReadError):
            return True
        except TimeoutError:
            return False
        return False

    def close(self) -> None:
        self.writer.transport.abort()


def _outcome(refused: bool) -> str:
    return "refused" if refused else "accepted"


async def old_hello(address: str, claim: str, forged: bytes) -> str:
    c = await RawConn.open(address)
    try:
        c.send(b"P" + claim.encode(), forged)
        return _outcome(await c.closed_by_peer())
    finally:
        c.close()


async def wrong_secret(address: str, claim: str, target: str, forged: bytes) -> str:
    wrong = PeerAuth(WRONG_SECRET)
    hello, nonce = wrong.hello(claim, target, 0)
    c = await RawConn.open(address)
    try:
        c.send(hello)
        try:
            challenge = await c.read_frame()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            return "refused"  # hung up on the hello already
        hs = Handshake(WRONG_SECRET, claim, target, nonce, challenge[1:33], 0)
        c.send(PROOF + hs.proof(b"dialer"), forged)
        return _outcome(await c.closed_by_peer())
    finally:
        c.close()


async def attack_ledger(
    target: str, address: str, claim: str, term: int, last: tuple[int, int]
) -> list[dict[str, Any]]:
    """Both peer attacks on one node; each attempt's outcome (or the error that stopped it)."""
    forged = forged_append(term, target, claim, *last)
    out: list[dict[str, Any]] = []
    for name, attempt in (
        ("old-hello", lambda: old_hello(address, claim, forged)),
        ("wrong-secret", lambda: wrong_secret(address, claim, target, forged)),
    ):
        try:
            outcome = await attempt()
        except (OSError, TimeoutError) as exc:
            outcome = f"error: {type(exc).__name__}: {exc}"
        out.append({"attempt": name, "target": target, "as": claim, "outcome": outcome})
    return out


async def attack_admin(address: str) -> dict[str, Any]:
    """An unsigned topic creation on a broker: NO_PERMISSION is a refusal, SUCCESS an acceptance."""
    headers = {B.TOPIC: FORGED_TOPIC, B.READ_QUEUE_NUMS: 1, B.WRITE_QUEUE_NUMS: 1, B.PERM: 6}
    rc = RemotingClient()
    try:
        resp = await rc.invoke_sync(
            address, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, headers), 3.0
        )
        outcome = {ResponseCode.SUCCESS: "accepted", ResponseCode.NO_PERMISSION: "refused"}.get(
            resp.code, f"answered code {resp.code}"
        )
        detail = f"code {resp.code}: {resp.remark or ''}"[:200]
    except (RemotingError, OSError, TimeoutError) as exc:
        outcome, detail = f"error: {type(exc).__name__}", str(exc)[:200]
    finally:
        await rc.close()
    return {"attempt": "admin-no-credentials", "target": address, "outcome": outcome, "detail": detail}


class ForgePeer(Fault):
    """Attack one group as an outsider: a forged peer on a ledger node, unsigned admin requests to brokers with ACL on.

    Its one operation (``forge-peer``) records each attempt and whether it was refused; it
    breaks nothing that needs healing.
    """

    name = "forge-peer"
    breaks = "forge-peer"
    heals = None
    single_group = True

    @classmethod
    def refusal(cls, backend: Backend) -> str | None:
        try:
            backend.forge_targets()
        except Unsupported as exc:  # nothing to attack on this backend
            return str(exc)
        return None

    async def start(self, ctx: FaultContext, scope: Scope) -> None:
        nodes = scope.nodes
        leader = await ctx.leader(nodes)
        value = {"fault": self.name, "nodes": sorted(nodes), "leader": leader, **scope.info}
        await ctx.op(self.name, value, lambda: asyncio.run(self._forge(ctx, leader)))

    async def stop(self, ctx: FaultContext) -> None:
        return None

    async def _forge(self, ctx: FaultContext, leader: str | None) -> dict[str, Any]:
        """Every forge attempt against this group (run in a thread, on its own event loop)."""
        t = ctx.backend.forge_targets()
        attempts: list[dict[str, Any]] = []
        ledger = t.get("ledger") or {}
        claim = leader or ctx.rng.choice(sorted(ledger))
        targets = [n for n in sorted(ledger) if n != claim] or sorted(ledger)
        target = ctx.rng.choice(targets)
        term, last = 1, (0, 0)
        try:  # the real term and last entry make the forged append as plausible as possible
            async with LedgerClient(list(ledger.values()), timeout=1.0, attempt_timeout=1.0) as lc:
                st = await lc.status(ledger[target])
                term, last = (
                    int(st.get("term") or 1),
                    (int(st.get("last_index") or 0), int(st.get("term") or 0)),
                )
        except Exception:  # noqa: BLE001 - a forged append with made-up numbers is still a probe
            pass
        attempts += await attack_ledger(target, ledger[target], claim, term, last)
        if t.get("acl"):
            for addr in t.get("admin") or []:
                attempts.append(await attack_admin(addr))
        return {
            "fault": self.name,
            "nodes": [target],
            "secured": bool(t.get("secured")),
            "acl": bool(t.get("acl")),
            "attempts": attempts,
            "refused": sum(a["outcome"] == "refused" for a in attempts),
            "accepted": sum(a["outcome"] == "accepted" for a in attempts),
        }
