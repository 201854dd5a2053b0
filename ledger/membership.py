"""Group membership: who votes, who only follows, and how the group changes online.

A configuration (``Membership``) is two ordered maps of member id to peer address: the
*voters*, whose majority elects leaders and commits entries, and the *learners*, which
receive the log like any follower but neither vote nor count toward any quorum. Changes
go through the log as entries of kind ``codec.KIND_CONFIG`` whose payload is the whole new
configuration (ids *and* addresses, so every node, a freshly joined one included, can dial
every member). There are three single-server changes (``MembershipChange``):

- ``add``: a new learner. It catches up like any lagging follower (InstallBase when the
  leader's retention removed what it needs, then the log), without affecting any quorum,
  so adding a node that cannot be reached never blocks the group.
- ``promote``: learner -> voter, refused until the learner has caught up.
- ``remove``: a voter or a learner leaves. A leader that removes itself keeps leading
  (without counting itself) until the change commits, then hands over and steps down.

Replacing a node is add, promote, remove.

Safety argument (Ongaro's thesis, section 4.1, single-server changes):

1. *A configuration is in effect as soon as it is in a node's log*, committed or not,
   for everything that node decides: whom it replicates to, which votes and
   acknowledgements count, whether it may campaign. When a log is truncated past a
   configuration entry the node reverts to the previous one (``RaftCore._truncate``).
2. *Adjacent configurations overlap.* Each change adds or removes at most one voter
   (a learner change adds or removes none), so any majority of C_old and any majority of
   C_new share at least one voter: two leaders cannot be elected for one term, one by a
   majority of each, and an entry committed by a majority of one is known to every
   majority of the other (leader completeness holds across the change).
3. *Only adjacent configurations can be in use at once.* A leader proposes a change only
   when (a) an entry of its own term is committed (its no-op) and (b) the latest
   configuration in its log is committed. (b) is "one change at a time": a change is
   proposed only after the previous one is on a majority of the configuration it created,
   so no node can still be deciding by the one before. (a) is the fix Ongaro published
   for the single-server algorithm: without it a new leader could propose C_new on top of
   an uncommitted configuration of a deposed leader of an earlier term that it does not
   hold, and two disjoint "adjacent" changes (C -> C+D by one leader, C -> C-E by
   another) could each commit with majorities that do not overlap. Committing an entry of
   its term first makes every earlier configuration in its log committed, and means
   no other configuration of an earlier term can commit afterwards.
4. *Learners are outside every quorum*, so adding or removing one never changes which
   sets are majorities; promoting one is an ordinary add-one-voter change (point 2).
5. *The configuration survives restarts and retention.* ``LogStore`` records every
   configuration entry durably before the entry itself is written (a record whose entry
   was then lost is dropped on load, since it no longer matches the log's term at that
   index), and the configuration in effect at the log's base is kept in the base file
   itself, so a trimmed log (retention, InstallBase, which carries the leader's
   configuration at its base) still knows its members. Only a log with no configuration
   entry at all falls back to the node's config file (``peers``).

Disruption. A removed node cannot disturb the group: members that hold its removal ignore
its vote requests (its term never reaches them); a member whose *committed* configuration
removed it answers "removed" instead (``RaftCore.answer_departed``), and the node stops
campaigning (``RaftCore.removed_by``): a node removed while it was down learns it is out. A configuration
names the ids removed from the group (``removed``, the latest ``MAX_REMOVED`` of them, an id
added back leaves the list), so this holds however far the log was trimmed since. Once a
removed node holds its removal itself it no longer campaigns once the removal is committed.
(A removed node that never received its removal campaigns on its old configuration until a
member holding the removal committed answers it; with PreVote, the default, that moves no
term. Without it, and with only members that have not seen the removal committed to ask, it
can take their votes term after term and delay elections: shut removed nodes down.) The
leader keeps
sending to a removed node until it holds its removal, so it learns it is out instead of
campaigning against a group that ignores it. A node that holds its own removal while it
is not yet committed still stands for election, pre-vote first (it may hold the longest
log: a leader that removed itself and lost leadership before the change committed; the
voters still on the previous configuration would refuse everyone else), counting only the
votes of the new configuration's voters.

Votes are *granted* regardless of the granting node's own configuration, and requests from
ids a node has never heard of are answered: a lagging voter or learner may be asked by a
candidate added by a configuration it does not hold yet, and ignoring it could leave that
configuration unable to elect anyone. A candidate counts only the votes of the voters in
its own configuration. (Safety never depended on who may stand: one vote per voter per
term, and majorities of adjacent configurations overlap.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ADD",
    "MAX_CONFIG_BYTES",
    "MAX_MEMBERS",
    "MAX_MEMBER_ID_BYTES",
    "OPS",
    "PROMOTE",
    "REMOVE",
    "Membership",
    "MembershipChange",
    "MembershipError",
    "check_member_id",
]

#: The most members (voters and learners together) one configuration may hold.
MAX_MEMBERS = 64
#: The longest member id, in UTF-8 bytes (the peer wire carries it with a one-byte length).
MAX_MEMBER_ID_BYTES = 64
#: The longest peer address kept in a configuration.
MAX_ADDRESS_CHARS = 255
#: The largest encoded configuration accepted from the log, the wire or a client.
MAX_CONFIG_BYTES = 64 << 10
#: How many removed ids a configuration remembers (members ignore their vote requests).
MAX_REMOVED = 64

ADD, PROMOTE, REMOVE = "add", "promote", "remove"
OPS = (ADD, PROMOTE, REMOVE)


class MembershipError(ValueError):
    """A membership change was refused; the message says why.

    ``retryable`` is true when the same request may succeed shortly without anyone doing
    anything (the leader has not committed an entry of its term yet, another change is in
    progress, the learner is still catching up); false when it needs a different request
    or a repaired group (the id exists, would leave no reachable majority, ...).
    """

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


def check_member_id(node_id: object) -> str:
    """``node_id`` if it is a usable member id, else ``MembershipError`` saying why."""
    if not isinstance(node_id, str) or not node_id:
        raise MembershipError(f"a member id must be a non-empty string, got {node_id!r}")
    if len(node_id.encode()) > MAX_MEMBER_ID_BYTES or not node_id.isprintable():
        raise MembershipError(
            f"member id {node_id[:80]!r} must be printable and at most {MAX_MEMBER_ID_BYTES} bytes"
        )
    if "=" in node_id or "," in node_id:
        raise MembershipError(f"member id {node_id!r} must not contain '=' or ','")
    return node_id


def _check_address(node_id: str, address: object) -> str:
    if not isinstance(address, str) or len(address) > MAX_ADDRESS_CHARS or not address.isprintable():
        raise MembershipError(f"member {node_id!r}: address must be printable text of at most 255 characters")
    return address


class Membership:
    """One configuration: ordered ``voters`` and ``learners``, each id -> address (read-only).

    Order is kept (insertion order: the config file's, then additions at the end), so every
    node walks its peers in the same order and a simulation replays exactly.
    """

    __slots__ = ("voters", "learners", "removed", "_ids")

    def __init__(
        self,
        voters: Mapping[str, str],
        learners: Mapping[str, str] | None = None,
        removed: Iterable[str] = (),
    ) -> None:
        self.voters: dict[str, str] = dict(voters)
        self.learners: dict[str, str] = dict(learners or {})
        both = self.voters.keys() & self.learners.keys()
        if both:
            raise MembershipError(f"{sorted(both)} cannot be both voter and learner")
        if len(self.voters) + len(self.learners) > MAX_MEMBERS:
            raise MembershipError(f"a group holds at most {MAX_MEMBERS} members (MAX_MEMBERS)")
        self._ids = (*self.voters, *self.learners)
        # Ids removed from the group, oldest first (members ignore their vote requests).
        gone = [r for r in removed if r not in self.voters and r not in self.learners]
        self.removed: tuple[str, ...] = tuple(gone[-MAX_REMOVED:])

    @classmethod
    def of_ids(cls, voters: Iterable[str]) -> Membership:
        """Voters without known addresses (tests and simulations route by id)."""
        return cls({v: "" for v in voters})

    @property
    def ids(self) -> tuple[str, ...]:
        """Every member, voters first."""
        return self._ids

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def is_member(self, node_id: str) -> bool:
        return node_id in self.voters or node_id in self.learners

    def address(self, node_id: str) -> str | None:
        return self.voters.get(node_id) or self.learners.get(node_id)

    def addresses(self) -> dict[str, str]:
        return {**self.voters, **self.learners}

    def to_json(self) -> dict[str, Any]:
        return {"voters": dict(self.voters), "learners": dict(self.learners), "removed": list(self.removed)}

    # ------------------------------------------------------------------ encoding

    def encode(self) -> bytes:
        """The payload of a configuration entry: compact JSON, order preserved."""
        doc: dict[str, Any] = {
            "voters": [[k, v] for k, v in self.voters.items()],
            "learners": [[k, v] for k, v in self.learners.items()],
        }
        if self.removed:
            doc["removed"] = list(self.removed)
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> Membership:
        """Parse and check an encoded configuration; ``MembershipError`` for anything malformed."""
        if len(data) > MAX_CONFIG_BYTES:
            raise MembershipError(f"configuration of {len(data)} bytes exceeds {MAX_CONFIG_BYTES}")
        try:
            doc = json.loads(bytes(data))
        except (ValueError, UnicodeDecodeError) as exc:
            raise MembershipError(f"unreadable configuration: {exc}") from None
        if not isinstance(doc, dict):
            raise MembershipError("a configuration must be a JSON object")
        maps: list[dict[str, str]] = []
        for key in ("voters", "learners"):
            pairs = doc.get(key, [])
            if not isinstance(pairs, list) or len(pairs) > MAX_MEMBERS:
                raise MembershipError(f"configuration field {key!r} must be a list of [id, address]")
            out: dict[str, str] = {}
            for pair in pairs:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise MembershipError(f"configuration field {key!r} must be a list of [id, address]")
                node_id = check_member_id(pair[0])
                if node_id in out:
                    raise MembershipError(f"member {node_id!r} listed twice")
                out[node_id] = _check_address(node_id, pair[1])
            maps.append(out)
        removed = doc.get("removed", [])
        if not isinstance(removed, list) or len(removed) > MAX_REMOVED:
            raise MembershipError(
                f"configuration field 'removed' must be a list of at most {MAX_REMOVED} ids"
            )
        return cls(maps[0], maps[1], [check_member_id(r) for r in removed])

    @classmethod
    def from_json(cls, doc: object) -> Membership:
        """The inverse of ``to_json`` (a node's status), checked as strictly as ``decode``."""
        if not isinstance(doc, dict):
            raise MembershipError("a membership must be a JSON object")
        pairs: dict[str, Any] = {"removed": doc.get("removed", [])}
        for key in ("voters", "learners"):
            members = doc.get(key, {})
            if not isinstance(members, dict):
                raise MembershipError(f"membership field {key!r} must map ids to addresses")
            pairs[key] = [[k, v] for k, v in members.items()]
        return cls.decode(json.dumps(pairs).encode())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Membership):
            return NotImplemented
        return (
            list(self.voters.items()) == list(other.voters.items())
            and list(self.learners.items()) == list(other.learners.items())
            and self.removed == other.removed
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        removed = f", removed={list(self.removed)}" if self.removed else ""
        return f"Membership(voters={list(self.voters)}, learners={list(self.learners)}{removed})"


@dataclass(frozen=True, slots=True)
class MembershipChange:
    """One single-server change: ``op`` is ``add`` (a learner, needs ``address``), ``promote`` or ``remove``."""

    op: str
    node_id: str
    address: str = ""

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise MembershipError(f"unknown membership change {self.op!r}; one of {', '.join(OPS)}")
        check_member_id(self.node_id)
        if self.op == ADD:
            if not self.address:
                raise MembershipError(f"adding {self.node_id!r} needs its address (id=host:port)")
            _check_address(self.node_id, self.address)

    def apply(self, m: Membership) -> Membership:
        """The configuration after this change, or ``MembershipError`` if it does not apply to ``m``."""
        nid = self.node_id
        if self.op == ADD:
            if m.is_member(nid):
                kind = "voter" if nid in m.voters else "learner"
                raise MembershipError(f"{nid!r} is already a {kind} of the group (at {m.address(nid)})")
            taken = [k for k, v in m.addresses().items() if v and v == self.address]
            if taken:
                raise MembershipError(f"address {self.address} already belongs to member {taken[0]!r}")
            return Membership(m.voters, {**m.learners, nid: self.address}, m.removed)
        if self.op == PROMOTE:
            if nid in m.voters:
                raise MembershipError(f"{nid!r} is already a voter")
            if nid not in m.learners:
                raise MembershipError(f"{nid!r} is not a learner of the group; add it first")
            learners = dict(m.learners)
            address = learners.pop(nid)
            return Membership({**m.voters, nid: address}, learners, m.removed)
        removed = (*(r for r in m.removed if r != nid), nid)
        if nid in m.learners:
            return Membership(m.voters, {k: v for k, v in m.learners.items() if k != nid}, removed)
        if nid not in m.voters:
            raise MembershipError(f"{nid!r} is not a member of the group")
        if len(m.voters) == 1:
            raise MembershipError(f"{nid!r} is the group's last voter; add and promote another first")
        return Membership({k: v for k, v in m.voters.items() if k != nid}, m.learners, removed)

    def describe(self) -> str:
        return f"{self.op} {self.node_id}" + (f"={self.address}" if self.address else "")
