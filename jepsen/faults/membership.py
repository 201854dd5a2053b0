"""The ``membership`` fault: a group's members change through its log while the load runs.

Each start takes the next of three ways of changing a group (in turn, from a random first
one), and its stop completes it:

- ``readd``: remove a member (any, the leader included), kill it and delete its data, then
  (stop) start it again empty under the same id and add it back: a fresh member where the
  old one was, which must catch up from the others;
- ``replace``: add a spare node as a new member (a learner that catches up, then a voter),
  then (stop) remove one of the old members, kill it and delete its data: a machine
  replaced by another on a new address;
- ``grow``: add two spare nodes (the group grows to five voters), then (stop) remove two
  members chosen at random (back to three).

Every change is one nemesis operation, recorded as ``member-remove`` or ``member-add`` with
the nodes it changed; its end event adds the configuration the change committed
(``voters``, ``learners``), so the history says the group's membership over time. A change
is a fault window of its own (``heals`` is None): what it costs the load is measured over
its operation, from the first request to the group to the committed configuration (an add
includes the new member's catch-up). A group between a start and a stop is smaller or
larger, not broken. At the end of the run every group is brought back to at least three
voters if a change failed half-way.

The backend provides the primitives (``jepsen.systems.ledger`` for ledger groups,
``jepsen.systems.broker_membership`` for broker groups): ``group_members``,
``spare_nodes``, ``member_add`` (start empty with ``join``, add, promote) and
``member_remove`` (remove, kill, delete its data); ``membership_refusal`` says why it
cannot (e.g. a docker group laid out without spare services). ``jepsen.systems.docker_membership``
does the same for the docker groups with spare compose services.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from jepsen.faults.base import Fault, FaultContext, Scope
from jepsen.systems.base import Backend

#: the ways a start changes a group, taken in turn
VARIANTS = ("readd", "replace", "grow")
#: voters a group keeps at the least (heal adds spares back up to it)
MIN_VOTERS = 3
#: spares ``grow`` adds (a three-voter group becomes five)
GROW_BY = 2


@runtime_checkable
class MembershipBackend(Protocol):
    """What a backend offers for membership changes (``group`` is one group's current nodes)."""

    def membership_refusal(self) -> str | None: ...

    async def group_members(self, group: Sequence[str]) -> dict[str, Any]: ...

    def spare_nodes(self, group: Sequence[str]) -> list[str]: ...

    async def member_add(self, nid: str) -> dict[str, Any]: ...

    async def member_remove(self, nid: str) -> dict[str, Any]: ...


def _backend(ctx: FaultContext) -> MembershipBackend:
    b = ctx.backend
    assert isinstance(b, MembershipBackend), f"{b.system} has no membership primitives"
    return b


class MembershipChange(Fault):
    """Change a group's members through its log: remove one, wipe it and add it back empty; replace one by a new node; or grow to five and shrink to three."""

    name: ClassVar[str] = "membership"
    breaks: ClassVar[str] = "member-remove"  # and member-add: each change is its own window
    heals: ClassVar[str | None] = None

    def __init__(self) -> None:
        self.turn: int | None = None
        self.pending: list[
            tuple[str, list[str], list[str], dict[str, Any]]
        ] = []  # (variant, group, nodes, info)

    @classmethod
    def refusal(cls, backend: Backend) -> str | None:
        if not isinstance(backend, MembershipBackend):
            return f"{backend.system} on this backend cannot change a group's members (membership)"
        return backend.membership_refusal()

    def _variant(self, ctx: FaultContext) -> str:
        if self.turn is None:
            self.turn = ctx.rng.randrange(len(VARIANTS))
        variant = VARIANTS[self.turn % len(VARIANTS)]
        self.turn += 1
        return variant

    async def _change(
        self, ctx: FaultContext, f: str, nodes: list[str], info: dict[str, Any]
    ) -> dict[str, Any] | None:
        """One recorded operation making the change ``f`` for each of ``nodes`` in turn; its end
        event carries the configuration the last change committed."""
        b = _backend(ctx)
        value = {"nodes": nodes, "fault": self.name, **info}
        step = b.member_add if f == "member-add" else b.member_remove

        async def run() -> dict[str, Any]:
            members: dict[str, Any] = {}
            for nid in nodes:
                members = await step(nid)
            return {**value, **{k: members[k] for k in ("voters", "learners") if k in members}}

        return await ctx.op(f, value, run)

    async def _voters(self, ctx: FaultContext, group: list[str]) -> list[str] | None:
        """The group's voters now, or None (recorded as an error of the run) if it cannot say."""
        try:
            return list((await _backend(ctx).group_members(group))["voters"])
        except Exception as exc:  # noqa: BLE001 - a group without a leader now: skip this change
            ctx.log(f"membership: no configuration from {group}: {exc}")
            ctx.errors.append(f"membership: no configuration from {group}: {exc}")
            return None

    async def start(self, ctx: FaultContext, scope: Scope) -> None:
        b = _backend(ctx)
        self.pending = []
        for group in scope.groups:
            variant = self._variant(ctx)
            voters = await self._voters(ctx, group)
            if not voters:
                continue
            spares = b.spare_nodes(group)
            info: dict[str, Any] = {"variant": variant, **scope.info}
            if variant == "replace" and (not spares or len(voters) < MIN_VOTERS):
                variant = info["variant"] = "readd"  # nothing to replace with: take one out and back
            if variant == "grow" and len(spares) < GROW_BY:
                variant = info["variant"] = "readd"
            if variant == "readd":
                victim = ctx.rng.choice(voters)
                await self._change(ctx, "member-remove", [victim], info)
                self.pending.append((variant, group, [victim], info))
            elif variant == "replace":
                old, new = ctx.rng.choice(voters), ctx.rng.choice(spares)
                await self._change(ctx, "member-add", [new], {**info, "replaces": old})
                self.pending.append((variant, group, [old], info))
            else:
                added = ctx.rng.sample(spares, GROW_BY)
                await self._change(ctx, "member-add", added, info)
                self.pending.append((variant, group, added, info))

    async def stop(self, ctx: FaultContext) -> None:
        pending, self.pending = self.pending, []
        for variant, group, nodes, info in pending:
            if variant == "readd":
                await self._change(ctx, "member-add", nodes, info)
            elif variant == "replace":
                await self._change(ctx, "member-remove", nodes, info)
            else:  # shrink back: any two voters, the leader and the first members included
                voters = await self._voters(ctx, group) or []
                if len(voters) - GROW_BY >= MIN_VOTERS:
                    await self._change(ctx, "member-remove", ctx.rng.sample(voters, GROW_BY), info)

    async def heal(self, ctx: FaultContext) -> None:
        """A change that failed half-way may have left a group short: add spares back to three voters."""
        b = _backend(ctx)
        for group in ctx.backend.node_groups().values():
            voters = await self._voters(ctx, group)
            if voters is None:
                continue
            short = MIN_VOTERS - len(voters)
            for nid in b.spare_nodes(group):  # one at a time: a spare that fails is passed over
                if short <= 0:
                    break
                if await self._change(ctx, "member-add", [nid], {"variant": "heal"}) is not None:
                    short -= 1
