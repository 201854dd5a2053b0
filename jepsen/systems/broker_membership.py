"""Membership changes of the local broker groups: the ``membership`` nemesis's primitives.

A mixin for the local broker backends (``jepsen.systems.broker``): when a run names the
``membership`` fault, ``plan_faults`` gives each group ``SPARES`` more brokers up front,
with their addresses and ports for the whole run (so the clients' address book and the
ports the link proxy must avoid are known before anything starts). Changes go the way an
operator's do, through the group's master with ``ledgermq-admin``'s client
(``AdminClient.add_member``/``remove_member``, signed with the cluster secret):

- ``member_add(nid)``: the broker's data is deleted, its config written with ``join =
  true`` (the group's current members in ``group``), it is started, added as a learner,
  and promoted once caught up; it then registers as a slave (broker id = its number + 1);
- ``member_remove(nid)``: the master removes it (and takes it off the nameservers' routes),
  then it is killed and its data deleted: a machine that left for good.

``nodes`` follows the groups' configurations, so the other faults aim at current members.
The link proxy fronts every link within a group of the pool, spares included, and every
broker's ``ledger_dial`` names every other broker of its group's pool at its link's proxy: a
broker added later is dialled through the link a partition cuts, not at the address the
group's configuration carries, so the link faults combine with ``membership``.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker.localgroup import LocalBrokerGroup, LocalBrokerGroups, broker_argv, broker_config
from client.admin_api import AdminClient
from common.localgroup import free_port_pair
from common.process import free_port

#: brokers planned per group beyond its first three (grow to five, replace one)
SPARES = 3
#: seconds a broker added by the nemesis has to catch up before it is promoted
PROMOTE_WAIT_S = 30.0


def start_joining_broker(g: LocalBrokerGroup, nid: str, host: str) -> tuple[str, str]:
    """Grow ``g`` by broker ``nid`` on ``host`` (new ports), started empty with ``join = true``;
    returns its broker and ledger addresses. ``g`` reaps it with the others (tests, benchmarks)."""
    if nid in g.broker_addr:
        raise ValueError(f"{nid!r} is already one of the group's brokers")
    g.broker_addr[nid], g.ledger_addr[nid] = f"{host}:{free_port_pair(host)}", f"{host}:{free_port(host)}"
    d = g.base_dir / g.name_of(nid)
    shutil.rmtree(d, ignore_errors=True)
    broker_config(
        d,
        broker_name=g.broker_name,
        node_id=nid,
        group=[f"{n}={g.broker_addr[n]}@{g.ledger_addr[n]}" for n in g.broker_addr],
        namesrv_addrs=g.namesrv_addrs,
        listen_host=host,
        settings={
            "topics": g.topics,
            **g.settings,
            "cluster_secret_file": g.cluster_secret_file(),
            "join": True,
        },
    )
    g.start_broker(nid)
    return g.broker_addr[nid], g.ledger_addr[nid]


class BrokerMembership:
    """Mixin of a local broker backend (a ``ProcessBackend`` whose ``group`` is a
    ``LocalBrokerGroup`` or ``LocalBrokerGroups``): spare brokers and membership changes."""

    group: LocalBrokerGroup | LocalBrokerGroups
    nodes: list[str]
    base_dir: Path
    killed: set[str]
    paused: set[str]
    # the several-group backend's planned proxy links (and their ports with --port-base)
    _links: list[tuple[str, str]]
    _link_ports: dict[tuple[str, str], int] | None

    # ------------------------------------------------------------------ layout

    @property
    def _several(self) -> bool:
        return isinstance(self.group, LocalBrokerGroups)

    @property
    def spares(self) -> list[str]:
        return list(getattr(self, "_spares", []))

    @property
    def pool(self) -> list[str]:
        """Every broker the run may start: the first members, then the spares."""
        return [*self.group.node_ids, *self.spares]

    def broker_name_of(self, nid: str) -> str:
        return nid.split("/", 1)[0] if self._several else self.group.broker_name  # type: ignore[union-attr]

    def _short(self, nid: str) -> str:
        """The node id within its group (``broker-b/n4`` -> ``n4``)."""
        return nid.split("/", 1)[1] if self._several else nid

    def _full(self, name: str, short: str) -> str:
        return f"{name}/{short}" if self._several else short

    def _node_dir(self, nid: str) -> Path:
        if isinstance(self.group, LocalBrokerGroups):
            return self.group.node_dir(nid)
        return self.base_dir / self.group.name_of(nid)

    def plan_faults(self, faults: Sequence[str]) -> None:
        super().plan_faults(faults)  # type: ignore[misc]
        if "membership" in faults and not self.spares:
            self._plan_spares()

    def _plan_spares(self) -> None:
        """Addresses for ``SPARES`` more brokers per group, on hosts of their own (as n1..n3 are)."""
        g = self.group
        spares: list[str] = []
        names = g.broker_names if isinstance(g, LocalBrokerGroups) else [g.broker_name]
        for name in names:
            first = sum(1 for n in g.node_ids if self.broker_name_of(n) == name)
            for k in range(first, first + SPARES):
                nid = self._full(name, f"n{k + 1}")
                if isinstance(g, LocalBrokerGroups):
                    g.plan_broker(nid, k)
                    self._plan_links(
                        nid, [*g.members[name], *(p for p in spares if self.broker_name_of(p) == name)]
                    )
                else:
                    host = f"127.0.0.{k + 1}"
                    g.broker_addr[nid] = f"{host}:{free_port_pair(host)}"
                    g.ledger_addr[nid] = f"{host}:{free_port(host)}"
                spares.append(nid)
        self._spares = spares

    def _plan_links(self, nid: str, peers: Sequence[str]) -> None:
        """Several groups: the proxy carries only the links it was planned with (``_links``,
        and their ports with ``--port-base``): add spare ``nid``'s links to its group's
        ``peers``, so that the proxy fronts them from the start."""
        g = self.group
        assert isinstance(g, LocalBrokerGroups)
        for p in peers:
            for a, b in ((p, nid), (nid, p)):
                self._links.append((a, b))
                if self._link_ports is not None:
                    self._link_ports[(a, b)] = g.ports.port(g.ledger_addr[b].rsplit(":", 1)[0])

    def launch(self) -> None:
        self.group.pool = tuple(self.pool)  # type: ignore[union-attr] # its ledger_dial covers the pool
        super().launch()  # type: ignore[misc]

    def node_groups(self) -> dict[str, list[str]]:
        if not self._several:
            return super().node_groups()  # type: ignore[misc]
        out: dict[str, list[str]] = {name: [] for name in self.group.broker_names}  # type: ignore[union-attr]
        for n in self.nodes:
            out[self.broker_name_of(n)].append(n)
        return out

    def client_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = super().client_spec()  # type: ignore[misc]
        spec["names"] = {**spec.get("names", {}), **{self.group.broker_addr[n]: n for n in self.spares}}
        return spec

    def log_files(self) -> dict[str, Path]:
        files: dict[str, Path] = super().log_files()  # type: ignore[misc]
        for n in self.spares:
            log = self._node_dir(n) / "broker.log"
            if log.exists():
                files.setdefault(n, log)
        return files

    def cleanup_data(self) -> None:
        super().cleanup_data()  # type: ignore[misc]
        for n in self.pool:
            shutil.rmtree(self._node_dir(n) / "data", ignore_errors=True)

    def forge_targets(self) -> dict[str, Any]:
        targets: dict[str, Any] = super().forge_targets()  # type: ignore[misc]
        targets["ledger"] = {n: a for n, a in targets["ledger"].items() if n in self.nodes}
        targets["admin"] = [self.group.broker_addr[n] for n in self.nodes]
        return targets

    # ------------------------------------------------------------------ the nemesis's primitives

    def membership_refusal(self) -> str | None:
        return None if self.spares else "no spare brokers were planned (plan_faults without 'membership')"

    def _admin(self, timeout_s: float = 5.0) -> AdminClient:
        return AdminClient(self.group.namesrv_addrs, timeout_s=timeout_s, group="jepsen-membership")

    def _secret(self) -> bytes:
        return Path(self.group.cluster_secret_file()).read_bytes().rstrip(b"\r\n")

    def _follow(self, name: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Take group ``name``'s configuration as its nodes; the summary an event records."""
        voters = [self._full(name, n) for n in doc.get("voters") or {}]
        learners = [self._full(name, n) for n in doc.get("learners") or {}]
        others = [n for n in self.nodes if self.broker_name_of(n) != name]
        mine = [n for n in self.pool if n in voters or n in learners]
        self.nodes = [n for n in self.pool if n in others or n in mine]
        return {"voters": sorted(voters), "learners": sorted(learners), "leader": doc.get("leader")}

    async def group_members(self, group: Sequence[str]) -> dict[str, Any]:
        name = self.broker_name_of(group[0])
        async with self._admin() as admin:
            return self._follow(name, await admin.group_members(name))

    def spare_nodes(self, group: Sequence[str]) -> list[str]:
        """Brokers of the group's pool outside it and not running: what can be added fresh."""
        name = self.broker_name_of(group[0])
        return [
            n
            for n in self.pool
            if self.broker_name_of(n) == name
            and n not in self.nodes
            and not self.procs.is_running(self.process_name(n))  # type: ignore[attr-defined]
        ]

    def wipe(self, nid: str) -> None:
        """SIGKILL the broker and delete its data: a machine whose disk is gone (nothing to heal)."""
        self.procs.kill(self.process_name(nid))  # type: ignore[attr-defined]
        self.killed.discard(nid)
        self.paused.discard(nid)
        shutil.rmtree(self._node_dir(nid) / "data", ignore_errors=True)

    def _start_joining(self, nid: str) -> None:
        """Start ``nid`` empty with ``join = true``, its group's current members in ``group``."""
        self.wipe(nid)
        g, name = self.group, self.broker_name_of(nid)
        members = [n for n in self.nodes if self.broker_name_of(n) == name and n != nid] + [nid]
        d = self._node_dir(nid)
        config = broker_config(
            d,
            broker_name=name,
            node_id=self._short(nid),
            group=[f"{self._short(n)}={g.broker_addr[n]}@{g.ledger_addr[n]}" for n in members],
            namesrv_addrs=g.namesrv_addrs,
            listen_host=g.broker_addr[nid].rsplit(":", 1)[0],
            settings={
                "topics": g.topics,
                **g.settings,
                **g.node_settings(nid),
                "cluster_secret_file": g.cluster_secret_file(),
                "join": True,
            },
        )
        g.spawn(self.process_name(nid), broker_argv(sys.executable, config), d / "broker.log")  # type: ignore[attr-defined]

    async def member_add(self, nid: str) -> dict[str, Any]:
        """Start ``nid`` empty, add it (a learner), promote it once caught up: it serves as a slave."""
        await asyncio.to_thread(self._start_joining, nid)
        name, g = self.broker_name_of(nid), self.group
        async with self._admin() as admin:
            try:
                doc = await admin.add_member(
                    name,
                    self._short(nid),
                    g.broker_addr[nid],
                    g.ledger_addr[nid],
                    secret=self._secret(),
                    wait_s=PROMOTE_WAIT_S,
                )
            except BaseException:
                await self._refresh(admin, name)
                raise
        return self._follow(name, doc)

    async def member_remove(self, nid: str) -> dict[str, Any]:
        """Remove ``nid`` through the master (its route goes too), then kill it and delete its data."""
        name = self.broker_name_of(nid)
        async with self._admin() as admin:
            try:
                doc = await admin.remove_member(name, self._short(nid), secret=self._secret())
            except BaseException:
                await self._refresh(admin, name)
                raise
        await asyncio.to_thread(self.wipe, nid)
        return self._follow(name, doc)

    async def _refresh(self, admin: AdminClient, name: str) -> None:
        """After a failed change: follow whatever configuration the group has now."""
        try:
            self._follow(name, await admin.group_members(name))
        except Exception:  # noqa: BLE001 - the change's own error is what the history records
            pass
