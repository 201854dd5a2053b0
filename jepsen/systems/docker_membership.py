"""Membership changes of the docker broker groups: the ``membership`` nemesis's primitives.

A mixin for ``jepsen.systems.docker.DockerBrokerBackend``: when a run names the
``membership`` fault, ``plan_faults`` (before the group starts) gives each group ``SPARES``
spare broker services (``broker-a-n4``.., on addresses and ports of their own; see
``jepsen.docker.layout.membership_override``), which ``up`` does not start. Changes go the
way an operator's do, through the group's master with ``ledgermq-admin``'s client, signed
with the run's superuser account and the cluster secret:

- ``member_add(nid)``: the broker's container and data volume are removed, the container
  created again empty with ``join`` (its ``group``: the group's current members and itself),
  it is added as a learner and promoted once caught up; it then serves as a slave. For a
  first member (``n1``) that was removed, this is the same machine back with an empty disk;
  for a spare, a new machine on a new address;
- ``member_remove(nid)``: the master removes it (and takes it off the nameservers' routes),
  then its container and data volume are removed: a machine that left for good.

``nodes`` follows the groups' configurations, so the other faults (kills, pauses, iptables
partitions, which cover created spares too) aim at current members.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from client.admin_api import AdminClient
from jepsen.docker.compose import ComposeGroup
from jepsen.systems.credentials import Credentials

#: spare brokers per group beyond its first three (grow to five, replace one)
SPARES = 3
#: seconds a broker added by the nemesis has to catch up before it is promoted
PROMOTE_WAIT_S = 30.0


class DockerMembership:
    """Mixin of the docker broker backend: spare broker services and membership changes."""

    group: ComposeGroup
    nodes: list[str]
    killed: set[str]
    paused: set[str]
    credentials: Credentials
    logs_dir: Path
    _up: bool

    @property
    def pool(self) -> list[str]:
        """Every broker the run may start: the first members, then the spares."""
        return [*self.group.node_ids, *(self.group.node_name(s) for s in self.group.spares)]

    def _plan_membership(self, faults: Sequence[str]) -> None:
        if "membership" in faults and not self._up and not self.group.spares:
            self.group.plan_spares(SPARES)

    def membership_refusal(self) -> str | None:
        if not self.group.spares:
            return (
                "membership on the docker backend needs spare broker services, defined when the group "
                "starts: name membership among the run's nemeses (jepsen run --nemesis)"
            )
        return None

    def _member_groups(self) -> dict[str, list[str]]:
        """Broker name -> its current nodes (``nodes`` in pool order)."""
        out: dict[str, list[str]] = {name: [] for name in self.group.broker_names}
        for n in self.nodes:
            out[self._broker_name(n)].append(n)
        return out

    def _broker_name(self, nid: str) -> str:
        return self.group.broker_name_of(self.group.service_of(nid))

    def _admin(self, timeout_s: float = 5.0) -> AdminClient:
        return AdminClient(
            self.group.namesrv_addrs,
            timeout_s=timeout_s,
            group="jepsen-membership",
            access_key=self.credentials.access_key,
            secret_key=self.credentials.secret_key,
        )

    def _secret(self) -> bytes:
        if self.group.cluster_secret:
            return self.group.cluster_secret.encode()
        return self.group.read_cluster_secret()

    def _follow(self, name: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Take group ``name``'s configuration as its nodes; the summary an event records."""
        several = self.group.groups > 1
        full = (lambda n: f"{name}/{n}") if several else (lambda n: n)
        voters = [full(n) for n in doc.get("voters") or {}]
        learners = [full(n) for n in doc.get("learners") or {}]
        others = [n for n in self.nodes if self._broker_name(n) != name]
        self.nodes = [n for n in self.pool if n in others or n in voters or n in learners]
        return {"voters": sorted(voters), "learners": sorted(learners), "leader": doc.get("leader")}

    async def group_members(self, group: Sequence[str]) -> dict[str, Any]:
        name = self._broker_name(group[0])
        async with self._admin() as admin:
            return self._follow(name, await admin.group_members(name))

    def spare_nodes(self, group: Sequence[str]) -> list[str]:
        """Brokers of the group's pool outside it: what can be added fresh (their containers were
        removed with them, or never created)."""
        name = self._broker_name(group[0])
        return [n for n in self.pool if self._broker_name(n) == name and n not in self.nodes]

    def _start_joining(self, nid: str) -> None:
        svc = self.group.service_of(nid)
        name = self._broker_name(nid)
        members = [self.group.service_of(n) for n in self.nodes if self._broker_name(n) == name and n != nid]
        self.group.start_joining(svc, members)
        self.killed.discard(nid)
        self.paused.discard(nid)

    def _remove(self, nid: str) -> None:
        self.group.remove_node(self.group.service_of(nid))
        self.killed.discard(nid)
        self.paused.discard(nid)

    async def member_add(self, nid: str) -> dict[str, Any]:
        """Create ``nid`` empty with ``join``, add it (a learner), promote it once caught up."""
        await asyncio.to_thread(self._start_joining, nid)
        svc, name = self.group.service_of(nid), self._broker_name(nid)
        async with self._admin() as admin:
            try:
                doc = await admin.add_member(
                    name,
                    self.group.node_id(svc),
                    self.group.broker_addr(svc),
                    self.group.ledger_addr(svc),
                    secret=self._secret(),
                    wait_s=PROMOTE_WAIT_S,
                )
            except BaseException:
                await self._refresh(admin, name)
                raise
        return self._follow(name, doc)

    async def member_remove(self, nid: str) -> dict[str, Any]:
        """Remove ``nid`` through the master (its route goes too), then its container and data."""
        name = self._broker_name(nid)
        async with self._admin() as admin:
            try:
                doc = await admin.remove_member(
                    name, self.group.node_id(self.group.service_of(nid)), secret=self._secret()
                )
            except BaseException:
                await self._refresh(admin, name)
                raise
        await asyncio.to_thread(self._remove, nid)
        return self._follow(name, doc)

    async def _refresh(self, admin: AdminClient, name: str) -> None:
        """After a failed change: follow whatever configuration the group has now."""
        try:
            self._follow(name, await admin.group_members(name))
        except Exception:  # noqa: BLE001 - the change's own error is what the history records
            pass
