"""A broker group whose membership changes at run time: who serves, at which broker address.

The ledger changes its configuration through the log, one server at a time (add a
learner, promote it once it has caught up, remove a member; ``ledger.membership``). A
broker group follows it:

- **Broker addresses travel through the log.** The ledger's configuration names each
  member's *ledger* address; clients need its *broker* address (the master's, when a
  slave redirects them; a removed member's, to take it off the nameservers' routes). So
  every change that brings in a broker first appends a ``brokers`` metadata record
  (``broker.meta.BrokerAddrOp``: node id -> broker host:port) that every broker of the
  group applies in log order (``BrokerState.broker_addrs``). The static ``group`` of the
  config only bootstraps the table: the log's entry wins, and a master fills in, once,
  any member the table lacks from its own ``group``. With retention on, the table is
  re-stated with the other metadata checkpoints.
- **Broker ids follow roles and node numbers, as before.** The master registers as broker
  id 0, a voter that follows as its node number + 1 (``n4`` -> 5). A *learner* (catching
  up) does not register at all: it is no replica a client may read from until it is
  promoted. A member removed from the group unregisters itself when it learns so, and the
  master unregisters it too (a dead one cannot), so the nameservers' routes follow the
  change at once instead of after their 120 s expiry. A removed broker that lives on
  never registers again (``BrokerOuterAPI.withhold``; its log says so): whatever path
  asks for a registration round, a broker off the configuration must not come back into
  the routes as a slave of a group that no longer replicates to it.
- **Changes go through the master** (``ledgermq-admin member-add/-promote/-remove/-list``,
  request codes ``ADD_GROUP_MEMBER`` and co., admin-only under ACL). A change must also
  prove the cluster secret (``ClusterTime``/``ClusterSignature``, as a registration does):
  the ledger's own member commands need it on the ledger port, and a broker request that
  did not would be a way around that.

Refusals come from the ledger and are passed on word for word (``MEMBERSHIP_REFUSED``,
header ``retryable``): the id exists, a change is in progress, the learner has not caught
up, or the change would leave fewer than a majority of reachable voters.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ledger.embed import (
    AppendFailed,
    MembershipRefused,
    MembershipView,
    NotLeaderError,
    OutcomeUnknown,
)
from remoting.cluster_auth import DEFAULT_MAX_SKEW_S, proof_problem
from remoting.codes import RequestCode, ResponseCode
from remoting.protocol import RemotingCommand

from .meta import broker_addrs_op
from .registration import BrokerIdentity

if TYPE_CHECKING:
    from remoting.connection import RemotingConnection

    from .controller import BrokerController

log = logging.getLogger("broker.membership")

# request headers of the membership codes
NODE_ID = "nodeId"
BROKER_ADDR = "brokerAddr"
LEDGER_ADDR = "ledgerAddr"
PROMOTE = "promote"
WAIT_MS = "waitMs"
RETRYABLE = "retryable"

#: the longest a request may ask the master to wait for a learner to catch up
MAX_WAIT_MS = 600_000
#: a broker's node id: a letter, then letters, digits, _ or -, ending in its number (broker id - 1)
NODE_ID_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,62}?(\d+)")
#: seconds an unregistration of a removed member may take (fire and forget; nameservers expire it anyway)
UNREGISTER_TIMEOUT_S = 3.0
#: how often a master looks at a learner's progress before promoting it
CATCH_UP_POLL_S = 0.02
#: seconds a master waits for a removal it saw appended to commit before unregistering the member
COMMIT_WAIT_S = 60.0

MEMBER_CODES = (
    RequestCode.GET_GROUP_MEMBERS,
    RequestCode.ADD_GROUP_MEMBER,
    RequestCode.PROMOTE_GROUP_MEMBER,
    RequestCode.REMOVE_GROUP_MEMBER,
)


def node_number(node_id: str) -> int | None:
    """The number a node id ends in (``n4`` -> 4), or None if it is no broker node id."""
    m = NODE_ID_RE.fullmatch(node_id)
    return int(m.group(1)) if m else None


def host_port_error(addr: str) -> str | None:
    """Why ``addr`` is not ``host:port`` (None: it is)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"{addr!r} is not host:port"
    if len(addr) > 255 or not addr.isprintable() or any(c in host for c in " /@,="):
        return f"{addr[:80]!r} is not host:port"
    return None


def change_proof_problem(
    secrets: tuple[bytes, ...], request: RemotingCommand, max_skew_s: float
) -> str | None:
    """Why a membership change does not prove the group's secret (None: it does), in the
    words an operator needs: the admin tool signs with ``--cluster-secret-file``."""
    return proof_problem(
        secrets,
        request,
        int(max_skew_s * 1000),
        int(time.time() * 1000),
        "membership changes must prove the group's cluster secret: give ledgermq-admin "
        "--cluster-secret-file (the file the brokers' cluster_secret_file names)",
    )


class GroupMembership:
    """The group's membership as this broker follows it; on the master, the change requests.

    ``broker`` is the controller (its ledger, store, config, registration and outer API).
    """

    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self.config = broker.config
        self.view: MembershipView | None = None
        self.registered = False  # whether this broker's last registration round ran (it serves)
        self._change_lock = asyncio.Lock()  # one change at a time through this master
        self._tasks: set[asyncio.Task[Any]] = set()
        self.changes = 0  # changes this broker committed as master

    # ------------------------------------------------------------------ addresses and roles

    def attach(self) -> None:
        """Follow the ledger's configuration (call once the ledger exists)."""
        ledger = self.broker.ledger
        assert ledger is not None
        self.view = ledger.membership
        ledger.on_membership(self._on_view)
        ledger.on_removed(self._on_told_removed)
        self.broker.outer_api.withhold = self.withhold_reason

    @property
    def is_removed(self) -> bool:
        """Whether the configuration in effect here removed this broker (its removal reached it).
        Going by the configuration's ``removed`` ids, not by absence: a joining broker replays
        older configurations that predate it while it catches up, and is not removed by them."""
        v = self.view
        return (v is not None and self.config.node_id in v.removed) or self.told_removed_by is not None

    @property
    def told_removed_by(self) -> str | None:
        """A member that told this broker's ledger the group removed it while it was down (its own
        log does not hold the change; ``ledger.raft.RaftCore.removed_by``): cleared by the ledger
        when a leader replicates to it again (added back under its id)."""
        ledger = getattr(self.broker, "ledger", None)
        return ledger.removed_by if ledger is not None else None

    def withhold_reason(self) -> str | None:
        """Why this broker must not register (None: it may): it was removed from the group."""
        v = self.view
        if v is None or not self.is_removed:
            return None
        if self.config.node_id not in v.removed:
            return (
                f"removed from group {self.config.broker_name} while it was down: member "
                f"{self.told_removed_by} holds the committed change; shut this broker down"
            )
        return (
            f"removed from group {self.config.broker_name} by the configuration at log index "
            f"{v.index} (voters {', '.join(v.voters)}): shut this broker down"
        )

    def broker_addr(self, node_id: str) -> str | None:
        """``node_id``'s broker address: as the log says it, else as the config's ``group`` does."""
        addr = self.broker.store.state.broker_addrs.get(node_id)
        if addr is not None:
            return addr
        member = self.config.members.get(node_id)
        return member.broker_addr if member else None

    @property
    def is_voter(self) -> bool:
        """Whether this broker votes in the configuration in effect (it serves: master or slave)."""
        return self.view is not None and self.config.node_id in self.view.voters

    @property
    def is_learner(self) -> bool:
        return self.view is not None and self.config.node_id in self.view.learners

    def _on_view(self, view: MembershipView) -> None:
        before, self.view = self.view, view
        me = self.config.node_id
        was = before is not None and me in before.voters
        now = me in view.voters
        if was != now:
            log.info(
                "this broker %s the group's voters" % ("joined" if now else "left"),
                extra={"voters": list(view.voters), "learners": list(view.learners), "index": view.index},
            )
            if now:
                self.broker.trigger_register()
            else:  # a learner again, or removed: off the routes at once
                self._spawn(self.unregister_self())
        if me in view.removed and (before is None or me not in before.removed):
            log.warning(
                "this broker was removed from the group: it no longer registers with the nameservers",
                extra={"voters": list(view.voters), "index": view.index},
            )
        if before is not None and self.broker.is_master:
            gone = sorted(before.members.keys() - view.members.keys())
            if gone:
                self._spawn(self._unregister_when_committed(view.index, gone))

    def _on_told_removed(self, member: str) -> None:
        """A member says the group removed this broker (made while it was down): off the routes."""
        log.warning(
            "this broker was removed from the group while it was down (member %s holds the committed "
            "change): it no longer registers with the nameservers",
            member,
            extra={"removed_by": member},
        )
        self._spawn(self.unregister_self())

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def unregister_self(self) -> None:
        """Off every nameserver's routes (this broker is a learner again, or was removed)."""
        if not self.registered:
            return
        self.registered = False
        await self.broker.outer_api.unregister_broker_all(
            self.broker.identity(), timeout_s=UNREGISTER_TIMEOUT_S
        )

    async def _unregister_when_committed(self, index: int, gone: list[str]) -> None:
        """Once the removal at ``index`` is applied here (committed), unregister the members it
        removed that are still out: a removal made with ``ledger member remove`` (or by another
        master's request) takes its broker off the routes too. A reverted removal is left alone."""
        try:
            await asyncio.wait_for(self.broker.store.applied_through(index), COMMIT_WAIT_S)
        except TimeoutError:
            return
        view = self.view
        for nid in gone:
            if view is not None and nid not in view.members:
                await self.unregister_member(nid)

    async def unregister_member(self, node_id: str) -> None:
        """Take a removed member off every nameserver's routes (it may be dead and unable to)."""
        addr, number = self.broker_addr(node_id), node_number(node_id)
        if addr is None or number is None or node_id == self.config.node_id:
            return
        cfg = self.config
        identity = BrokerIdentity(cfg.cluster_name, cfg.broker_name, addr, number + 1)
        log.info("unregistering removed member", extra={"node": node_id, "broker_addr": addr})
        await self.broker.outer_api.unregister_broker_all(identity, timeout_s=UNREGISTER_TIMEOUT_S)

    def missing_addresses(self) -> dict[str, str]:
        """Members of the configuration whose broker address the log lacks but this broker's
        ``group`` names: what a new master writes once, so that members that joined later (whose
        config may list only some of the group) learn every address from the log."""
        if self.view is None:
            return {}
        table = self.broker.store.state.broker_addrs
        return {
            nid: self.config.members[nid].broker_addr
            for nid in self.view.members
            if nid not in table and nid in self.config.members
        }

    def table_record(self) -> bytes | None:
        """The members' broker addresses as one record (a retention checkpoint), or None."""
        if self.view is None:
            return None
        entries = {nid: a for nid in self.view.members if (a := self.broker_addr(nid)) is not None}
        return broker_addrs_op(entries) if entries else None

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def status(self) -> dict[str, Any]:
        """What runtime info reports: this broker's standing and the configuration in effect."""
        v = self.view
        if v is None:
            return {}
        return {
            "voter": self.is_voter,
            "learner": self.is_learner,
            "registered": self.registered,
            "removed": self.is_removed,
            "index": v.index,
            "committed": v.committed,
            "voters": list(v.voters),
            "learners": list(v.learners),
            "brokerAddrs": {nid: self.broker_addr(nid) for nid in v.members},
        }

    def describe(self, view: MembershipView) -> dict[str, Any]:
        """A configuration as the admin tool shows it: each member's ledger and broker address,
        broker id, and (on the leader) how far behind it is."""
        ledger = self.broker.ledger
        assert ledger is not None
        progress = ledger.member_progress() if ledger.is_leader else {}
        leader = ledger.leader_id

        def member(nid: str, addr: str, voter: bool) -> dict[str, Any]:
            number = node_number(nid)
            broker_id = 0 if nid == leader and self.broker.is_master else (number + 1 if number else None)
            return {
                "role": ("master" if broker_id == 0 else "slave") if voter else "learner",
                "brokerAddr": self.broker_addr(nid),
                "ledgerAddr": addr,
                "brokerId": broker_id if voter else None,
                **(
                    {"lag": progress[nid].get("lag"), "active": progress[nid].get("active")}
                    if nid in progress
                    else {}
                ),
            }

        return {
            "brokerName": self.config.broker_name,
            "leader": leader,
            "index": view.index,
            "committed": view.committed,
            "voters": {n: member(n, a, True) for n, a in view.voters.items()},
            "learners": {n: member(n, a, False) for n, a in view.learners.items()},
        }

    # ------------------------------------------------------------------ requests (the master)

    def register(self, server: Any) -> None:
        handlers: dict[int, Callable[[RemotingConnection, RemotingCommand], Any]] = {
            RequestCode.GET_GROUP_MEMBERS: self.list_members,
            RequestCode.ADD_GROUP_MEMBER: self.add_member,
            RequestCode.PROMOTE_GROUP_MEMBER: self.promote_member,
            RequestCode.REMOVE_GROUP_MEMBER: self.remove_member,
        }
        for code, fn in handlers.items():
            server.register_processor(code, fn)

    def _refusal(self, req: RemotingCommand, change: bool) -> RemotingCommand | None:
        """The answer to a request this broker must not serve: no proof of the secret, not master."""
        if change:
            cfg = self.config
            problem = change_proof_problem((cfg.secret,), req, DEFAULT_MAX_SKEW_S)
            if problem is not None:
                return req.make_response(ResponseCode.NO_PERMISSION, problem)
        if not self.broker.is_master:
            return self.broker.processors.ctx.not_master(req)
        return None

    def _answer(
        self, req: RemotingCommand, view: MembershipView, extra: dict[str, Any] | None = None
    ) -> RemotingCommand:
        body = {**self.describe(view), **(extra or {})}
        return req.make_response(body=json.dumps(body).encode())

    def _failure(self, req: RemotingCommand, what: str, exc: Exception) -> RemotingCommand:
        if isinstance(exc, NotLeaderError):
            return self.broker.processors.ctx.not_master(req)
        if isinstance(exc, MembershipRefused):
            return req.make_response(
                ResponseCode.MEMBERSHIP_REFUSED, f"{what}: {exc}", {RETRYABLE: exc.retryable}
            )
        if isinstance(exc, OutcomeUnknown):
            return req.make_response(
                ResponseCode.REPLICATION_TIMEOUT,
                f"{what}: not known to have committed ({exc}); see member-list before trying again",
            )
        if isinstance(exc, AppendFailed):
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"{what}: not committed ({exc}); try again")
        raise exc

    def list_members(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        refused = self._refusal(req, change=False)
        if refused is not None:
            return refused
        ledger = self.broker.ledger
        assert ledger is not None
        return self._answer(req, ledger.membership)

    @staticmethod
    def _wait_s(req: RemotingCommand) -> float:
        return req.header_int(WAIT_MS, 0, min_value=0, max_value=MAX_WAIT_MS) / 1000

    def _bad(self, req: RemotingCommand, text: str) -> RemotingCommand:
        return req.make_response(ResponseCode.BAD_REQUEST, text)

    async def add_member(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """Add a broker as a learner (its broker address into the log first), then, if asked,
        promote it once it has caught up. A retry after a lost answer finds it a learner (or
        voter) at the same address and goes on from there."""
        refused = self._refusal(req, change=True)
        if refused is not None:
            return refused
        nid, baddr, laddr = req.header_str(NODE_ID), req.header_str(BROKER_ADDR), req.header_str(LEDGER_ADDR)
        promote, wait_s = req.header_bool(PROMOTE, False), self._wait_s(req)
        number = node_number(nid)
        if number is None:
            return self._bad(
                req,
                f"node id {nid[:80]!r} must be a letter, then letters or digits, ending in a number (e.g. n4)",
            )
        for addr in (baddr, laddr):
            problem = host_port_error(addr)
            if problem:
                return self._bad(req, f"adding {nid}: {problem}")
        ledger = self.broker.ledger
        assert ledger is not None
        async with self._change_lock:
            view = ledger.membership
            for other in view.members:
                if other == nid:
                    continue
                if node_number(other) == number:
                    return req.make_response(
                        ResponseCode.MEMBERSHIP_REFUSED,
                        f"{nid} would register as broker id {number + 1}, which member {other} has: "
                        f"choose another number",
                        {RETRYABLE: False},
                    )
                if self.broker_addr(other) == baddr:
                    return req.make_response(
                        ResponseCode.MEMBERSHIP_REFUSED,
                        f"broker address {baddr} belongs to member {other}",
                        {RETRYABLE: False},
                    )
            current = view.members.get(nid)
            if current is not None and current != laddr:
                return req.make_response(
                    ResponseCode.MEMBERSHIP_REFUSED,
                    f"{nid} is already a member (ledger at {current}): remove it first",
                    {RETRYABLE: False},
                )
            try:
                if self.broker.store.state.broker_addrs.get(nid) != baddr:
                    await self.broker.store.append_async([broker_addrs_op({nid: baddr})])
                if current is None:
                    view = await ledger.add_learner(nid, laddr)
                    self.changes += 1
                    log.info("member added as a learner", extra={"node": nid, "broker_addr": baddr})
                if promote and nid not in view.voters:
                    await self._caught_up(nid, wait_s)
                    view = await ledger.promote(nid, wait_s=wait_s)
                    self.changes += 1
                    log.info("member promoted", extra={"node": nid})
            except MembershipRefused as exc:
                if promote and exc.retryable and nid in ledger.membership.learners:
                    return req.make_response(
                        ResponseCode.MEMBERSHIP_REFUSED,
                        f"{nid} was added as a learner but not promoted within {wait_s:g} s ({exc}); "
                        f"promote it later (member-promote)",
                        {RETRYABLE: True},
                    )
                return self._failure(req, f"adding {nid}", exc)
            except Exception as exc:  # noqa: BLE001 - the ledger's errors become answers
                return self._failure(req, f"adding {nid}", exc)
        return self._answer(req, view)

    async def _caught_up(self, nid: str, wait_s: float) -> None:
        """Wait (up to ``wait_s``) until learner ``nid`` holds the log as far as it was committed
        when asked: only then is it promoted. The ledger promotes a learner whose lag is under
        ``promote_max_lag_entries`` even if it never answered (a young log), and a voter that
        never started then both weakens the quorum and is refused its own join."""
        ledger = self.broker.ledger
        assert ledger is not None
        target = ledger.commit_index
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            if nid not in ledger.membership.learners:
                return  # a voter already, or gone: promote says which
            if not ledger.is_leader:
                raise NotLeaderError("leadership moved", ledger.leader_id, ledger.leader_address)
            match = ledger.member_progress().get(nid, {}).get("match", 0)
            if match >= target:
                return
            if loop.time() >= deadline:
                raise MembershipRefused(
                    f"learner {nid} holds the log up to {match}, not yet {target} (still catching up)",
                    retryable=True,
                )
            await asyncio.sleep(CATCH_UP_POLL_S)

    async def promote_member(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        refused = self._refusal(req, change=True)
        if refused is not None:
            return refused
        nid, wait_s = req.header_str(NODE_ID), self._wait_s(req)
        ledger = self.broker.ledger
        assert ledger is not None
        async with self._change_lock:
            try:
                await self._caught_up(nid, wait_s)
                view = await ledger.promote(nid, wait_s=wait_s)
            except Exception as exc:  # noqa: BLE001 - the ledger's errors become answers
                return self._failure(req, f"promoting {nid}", exc)
            self.changes += 1
        return self._answer(req, view)

    async def remove_member(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """Remove a member; once committed, its broker is taken off the nameservers' routes
        before the answer (the master itself, if removed, hands over and unregisters)."""
        refused = self._refusal(req, change=True)
        if refused is not None:
            return refused
        nid = req.header_str(NODE_ID)
        ledger = self.broker.ledger
        assert ledger is not None
        async with self._change_lock:
            try:
                view = await ledger.remove_member(nid)
            except Exception as exc:  # noqa: BLE001 - the ledger's errors become answers
                return self._failure(req, f"removing {nid}", exc)
            self.changes += 1
        log.info("member removed", extra={"node": nid})
        try:
            await self.unregister_member(nid)
        except Exception as exc:  # noqa: BLE001 - the nameservers expire it anyway
            log.warning("could not unregister removed member", extra={"node": nid, "error": str(exc)})
        return self._answer(req, view)
