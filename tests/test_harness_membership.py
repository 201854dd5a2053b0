"""The ``membership`` nemesis: its changes on a fake group, what combines with it, and short
real runs of the log, register and queue workloads with it (and with leader kills)."""

from __future__ import annotations

import asyncio
import random
import tomllib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from common.ports import PortPlan
from jepsen.faults.base import FaultContext, Scope
from jepsen.faults.membership import MIN_VOTERS, VARIANTS, MembershipChange
from jepsen.faults.registry import FAULTS, check_faults
from jepsen.history import History, read_history, validate_history
from jepsen.run.config import RunConfig, RunResult
from jepsen.run.runner import run
from jepsen.run.validate import validated
from jepsen.systems.base import Unsupported
from jepsen.systems.broker import LocalBrokerBackend, LocalBrokerGroupsBackend
from jepsen.systems.ledger import LocalLedgerBackend
from ledger.client import LedgerClient


class FakeGroup:
    """A backend with the membership primitives over an in-memory configuration."""

    system = "fake"

    def __init__(self) -> None:
        self.nodes = ["n1", "n2", "n3"]
        self.pool = [*self.nodes, "n4", "n5", "n6"]
        self.fail_add: set[str] = set()

    def node_groups(self) -> dict[str, list[str]]:
        return {"": list(self.nodes)}

    def membership_refusal(self) -> str | None:
        return None

    async def group_members(self, group: Sequence[str]) -> dict[str, Any]:
        return {"voters": sorted(self.nodes), "learners": [], "leader": self.nodes[0]}

    def spare_nodes(self, group: Sequence[str]) -> list[str]:
        return [n for n in self.pool if n not in self.nodes]

    async def member_add(self, nid: str) -> dict[str, Any]:
        if nid in self.fail_add:
            raise TimeoutError(f"learner {nid} did not catch up")
        self.nodes.append(nid)
        return await self.group_members(self.nodes)

    async def member_remove(self, nid: str) -> dict[str, Any]:
        self.nodes.remove(nid)
        return await self.group_members(self.nodes)


def _context(backend: FakeGroup, tmp_path: Path) -> tuple[FaultContext, History]:
    history = History(tmp_path / "history.jsonl")
    ctx = FaultContext(backend, history, random.Random(5), tmp_path / "nemesis.log", lose_data="wipe")  # type: ignore[arg-type]
    return ctx, history


def test_each_way_of_changing_a_group_is_recorded_with_the_configuration_it_left(tmp_path: Path) -> None:
    backend = FakeGroup()
    ctx, history = _context(backend, tmp_path)
    fault = MembershipChange()

    async def cycle() -> None:
        for _ in range(len(VARIANTS)):
            await fault.start(ctx, Scope([list(backend.nodes)], {}))
            await fault.stop(ctx)
            assert len(backend.nodes) == MIN_VOTERS

    asyncio.run(cycle())
    history.close()
    events = [e for e in read_history(tmp_path / "history.jsonl") if e["process"] == "nemesis"]
    ends = events[1::2]
    assert {e["f"] for e in events} == {"member-add", "member-remove"} and not ctx.errors
    assert {e["value"]["variant"] for e in ends} == set(VARIANTS)
    for e in ends:  # each change names its nodes and the voters it left
        assert e["value"]["nodes"] and e["value"]["fault"] == "membership"
        assert sorted(e["value"]["voters"]) == e["value"]["voters"]
    grown = next(e for e in ends if e["value"]["variant"] == "grow" and e["f"] == "member-add")
    assert len(grown["value"]["voters"]) == MIN_VOTERS + 2


def test_a_change_that_fails_half_way_is_recorded_and_healed_back_to_three_voters(tmp_path: Path) -> None:
    backend = FakeGroup()
    ctx, history = _context(backend, tmp_path)
    fault = MembershipChange()
    fault.turn = VARIANTS.index("readd")

    async def go() -> None:
        await fault.start(ctx, Scope([list(backend.nodes)], {}))
        victim = fault.pending[0][2][0]
        backend.fail_add.add(victim)
        await fault.stop(ctx)  # the add fails: recorded as the operation's error
        assert len(backend.nodes) == MIN_VOTERS - 1
        await fault.heal(ctx)

    asyncio.run(go())
    history.close()
    assert len(backend.nodes) == MIN_VOTERS and ctx.errors and "did not catch up" in ctx.errors[0]
    events = [e for e in read_history(tmp_path / "history.jsonl") if e["process"] == "nemesis"]
    assert {e["value"].get("variant") for e in events[-4:]} == {"heal"}  # a failed spare, then one that joins


def test_membership_is_a_registered_fault_that_only_some_backends_have() -> None:
    assert FAULTS["membership"] is MembershipChange
    d = MembershipChange.describe()
    assert d.breaks == "member-remove" and d.heals is None and "grow to five" in d.summary

    class NoMembership:
        system = "nothing"

    with pytest.raises(Unsupported, match="cannot change a group's members"):
        check_faults(["membership"], NoMembership())  # type: ignore[arg-type]


@pytest.mark.parametrize("link_fault", ["partition-leader", "slow-network"])
def test_membership_combines_with_the_link_faults_and_not_with_disk_full(link_fault: str) -> None:
    for cfg in (
        RunConfig(workload="queue", nemesis=("membership", link_fault)),  # brokers: `ledger_dial`
        RunConfig(workload="queue", nemesis=("membership", link_fault), system_options={"groups": 2}),
        RunConfig(workload="log", nemesis=("membership", link_fault)),  # ledger nodes: `dial`
    ):
        validated(cfg)
    validated(RunConfig(workload="log", nemesis=("membership", "kill-leader", "pause-random", "lose-data")))
    with pytest.raises(Unsupported, match="disk-full"):
        validated(RunConfig(workload="queue", nemesis=("membership", "disk-full")))


# ------------------------------------------------------------------ real runs


def _run(tmp_path: Path, **kw: Any) -> RunResult:
    settings: dict[str, Any] = {
        "out": tmp_path,
        "progress": False,
        "time": 14,
        "interval": 1.5,
        "rate": 40,
        "clients": 4,
        "seed": 21,
        **kw,
    }
    return run(RunConfig(**settings))


def _changes(result: RunResult) -> list[dict[str, Any]]:
    events = read_history(result.history)
    assert validate_history(events) == []
    nem = [e for e in events if e["process"] == "nemesis"]
    return [e for e in nem[1::2] if e["f"] in ("member-add", "member-remove")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "nemesis"),
    [
        ("log", ("membership", "kill-leader")),
        ("register", ("membership",)),
        ("queue", ("membership", "kill-leader")),
    ],
)
def test_a_short_run_with_membership_changes_is_valid(
    tmp_path: Path, workload: str, nemesis: tuple[str, ...]
) -> None:
    result = _run(tmp_path, workload=workload, nemesis=nemesis)
    changes = _changes(result)
    assert result.valid is True, result.summary.get("check")
    assert len(changes) >= 2 and not any("error" in e for e in changes), changes
    assert all(len(e["value"]["voters"]) >= 2 for e in changes)
    counts = Counter(e["f"] for e in changes)
    assert counts["member-add"] and counts["member-remove"], counts
    assert "<h2>Membership</h2>" in result.report.read_text(encoding="utf-8")  # the report shows them


@pytest.mark.slow
def test_a_member_added_later_is_dialled_through_the_link_proxies_that_partitions_cut(tmp_path: Path) -> None:
    """Every node dials every other of the pool through its link's proxy (``dial``), whatever
    address the configuration carries: cutting a joined member's links stops its log."""
    backend = LocalLedgerBackend(tmp_path)
    backend.plan_faults(["membership", "partition-leader"])
    backend.start()
    try:

        async def scenario() -> None:
            leader = await backend.wait_for_leader()
            added = await backend.member_add("n4")
            assert "n4" in added["voters"] and backend.nodes == ["n1", "n2", "n3", "n4"]
            links = backend.proxy.stats()  # type: ignore[union-attr]
            assert links[f"{leader}->n4"]["bytes"] > 0 and links[f"n4->{leader}"]["bytes"] > 0
            n4 = backend.cluster.address("n4")
            async with LedgerClient(backend.addresses, timeout=5.0) as client:
                backend.set_cut(
                    {(a, b) for a in backend.nodes for b in backend.nodes if "n4" in (a, b) and a != b}
                )
                before = (await client.status(n4))["commit_index"]
                for i in range(20):
                    await client.append(b"while cut %d" % i)  # n1..n3 are a majority of four
                await asyncio.sleep(0.5)
                assert (await client.status(n4))["commit_index"] == before  # nothing reached it
                backend.set_cut(set())
                for _ in range(100):  # bounded: 10 s
                    if (await client.status(n4))["commit_index"] > before + 20:
                        break
                    await asyncio.sleep(0.1)
                assert (await client.status(n4))["commit_index"] > before + 20  # healed, it caught up

        asyncio.run(scenario())
    finally:
        backend.stop()


@pytest.mark.slow
def test_a_short_log_run_with_membership_and_partitions_is_valid(tmp_path: Path) -> None:
    result = _run(tmp_path, workload="log", nemesis=("membership", "partition-random-halves"), seed=4)
    changes = _changes(result)
    assert result.valid is True, result.summary.get("check")
    assert changes and not any("error" in e for e in changes), changes
    nem = {e["f"] for e in read_history(result.history) if e["process"] == "nemesis"}
    assert "start-partition" in nem, nem


@pytest.mark.slow
def test_a_short_queue_run_with_membership_and_partitions_is_valid(tmp_path: Path) -> None:
    """Brokers added later are dialled through the link proxies too (``ledger_dial``): the
    partitions the history records are the ones the brokers see, and the run checks out."""
    result = _run(tmp_path, workload="queue", nemesis=("membership", "partition-random-halves"), time=12)
    changes = _changes(result)
    assert result.valid is True, result.summary.get("check")
    assert changes and not any("error" in e for e in changes), changes
    nem = {e["f"] for e in read_history(result.history) if e["process"] == "nemesis"}
    assert "start-partition" in nem, nem
    confs = sorted(tmp_path.rglob("broker.toml"))  # the first three and every broker added
    assert len(confs) >= 4 and any(e["f"] == "member-add" for e in changes), confs
    for conf in confs:  # each dials the five others of the pool through their links' proxies
        dial = tomllib.loads(conf.read_text(encoding="utf-8"))["ledger_dial"]
        assert len(dial) == 5 and conf.parent.name.removeprefix("broker-") not in {
            d.split("=")[0] for d in dial
        }


@pytest.mark.slow
def test_a_broker_added_later_is_dialled_through_the_link_proxies_that_partitions_cut(tmp_path: Path) -> None:
    """Every broker dials every other of the pool through its link's proxy (``ledger_dial``),
    whatever address the group's configuration carries: cutting a joined broker's links stops
    its ledger, healing them lets it catch up."""
    backend = LocalBrokerBackend(tmp_path)
    backend.plan_faults(["membership", "partition-leader"])
    backend.start()
    try:

        async def commit_index(nid: str) -> int:
            st = await backend.status(nid)
            return int((st or {}).get("commit_index") or 0)

        async def scenario() -> None:
            leader = await backend.wait_for_leader()
            added = await backend.member_add("n4")
            assert "n4" in added["voters"] and backend.nodes == ["n1", "n2", "n3", "n4"]
            links = backend.proxy.stats()  # type: ignore[union-attr]
            assert links[f"{leader}->n4"]["bytes"] > 0 and links[f"n4->{leader}"]["bytes"] > 0
            client = backend.queue_client()
            try:
                backend.set_cut(
                    {(a, "n4") for a in ("n1", "n2", "n3")} | {("n4", a) for a in ("n1", "n2", "n3")}
                )
                before = await commit_index("n4")
                for i in range(10):
                    await client.send(0, i)  # n1..n3 are a majority of four
                await asyncio.sleep(0.5)
                assert await commit_index("n4") == before  # nothing reached it
                target = await commit_index(leader)
                backend.set_cut(set())
                for _ in range(100):  # bounded: 10 s
                    if await commit_index("n4") >= target:
                        break
                    await asyncio.sleep(0.1)
                assert await commit_index("n4") >= target > before  # healed, it caught up
            finally:
                await client.close()

        asyncio.run(scenario())
    finally:
        backend.stop()


def test_several_groups_plan_their_spares_links_and_ports_within_each_group(tmp_path: Path) -> None:
    """With several groups the proxy fronts every link within a group, spares' too, each on
    a port of the plan (so the run's range is known before anything starts)."""
    base = 20000 + random.Random().randrange(0, 20000, 1000)
    backend = LocalBrokerGroupsBackend(tmp_path, groups=2, ports=PortPlan(port_base=base))
    backend.plan_faults(["membership", "partition-random-halves"])
    links, ports = backend.proxy_links(), backend.proxy_ports()
    assert links is not None and ports is not None and set(links) == set(ports)
    pool = backend.pool
    assert len(pool) == 12 and len(links) == len(set(links)) == 2 * 6 * 5  # 6 brokers a group
    assert all(a.split("/")[0] == b.split("/")[0] for a, b in links)  # within a group only
    assert ("broker-b/n4", "broker-b/n1") in ports and len(set(ports.values())) == len(ports)
    assert set(backend.peer_addresses()) == set(pool)
