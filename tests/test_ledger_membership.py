"""Membership changes on real ledger members: in-process (the embedding API) and as OS processes.

The in-process tests grow a one-member group by a node started with ``join``, promote it and
remove the first member, through ``EmbeddedLedger``. The process tests replace a node whose
disk died with a fresh one under load, through the ``ledger member`` commands, and remove a
leader, losing nothing acknowledged; every process is reaped by PID, every wait bounded.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.process import free_port
from ledger.client import LedgerClient
from ledger.config import NodeConfig
from ledger.embed import EmbeddedLedger, MembershipRefused, MembershipView, NotLeaderError
from ledger.loadgen import AppendLoad, missing_acks
from ledger.localcluster import LocalCluster
from ledger.localjoin import start_joining_node, wipe_node
from ledger.wire import BAD_REQUEST, LedgerError

ROOT = Path(__file__).resolve().parent.parent


def node_config(tmp_path: Path, nid: str, addr: str, **extra: object) -> NodeConfig:
    cfg = NodeConfig(id=nid, listen=addr, data_dir=str(tmp_path / nid), tick_ms=10, **extra)  # type: ignore[arg-type]
    cfg.validate()
    return cfg


async def until(cond, what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


# ---------------------------------------------------------------------- in process


def test_a_group_grows_by_a_joining_node_and_hands_over_to_it(tmp_path: Path) -> None:
    async def main() -> None:
        a1, a2 = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        first = EmbeddedLedger(node_config(tmp_path, "n1", a1, peers=[f"n1={a1}"]))
        second = EmbeddedLedger(node_config(tmp_path, "n2", a2, join=[a1]))
        seen: list[MembershipView] = []
        second.on_membership(seen.append)
        await first.start()
        await second.start()
        try:
            await until(lambda: first.leader_ready, "the first member to lead")
            for i in range(50):
                await first.append([b"before %d" % i])
            await until(lambda: "n1" in second.membership.voters, "the joiner to learn the group")
            assert second.membership.index == 0 and not second.status()["voter"]

            with pytest.raises(MembershipRefused) as info:
                await first.add_learner("n1", a2)
            assert not info.value.retryable and "already a voter" in str(info.value)
            with pytest.raises(NotLeaderError):
                await second.add_learner("n3", "127.0.0.1:1")

            view = await first.add_learner("n2", a2)
            assert view.learners == {"n2": a2} and view.committed
            await until(lambda: second.commit_index >= view.index, "the learner to catch up")
            assert second.read(view.index, view.index)[0].noop  # a configuration is nothing to apply
            assert second.read_payloads(view.index, view.index) == [(view.index, b"")]

            view = await first.promote("n2", wait_s=10)
            assert list(view.voters) == ["n1", "n2"] and not view.learners
            view = await first.remove_member("n1")
            assert list(view.voters) == ["n2"] and view.committed
            await until(lambda: second.leader_ready, "the remaining member to lead")
            assert not first.is_leader and not first.status()["voter"]
            proposal = await second.append([b"after"])
            assert second.read(proposal.first_index, proposal.first_index)[0].payload == b"after"
            assert [list(v.voters) for v in seen if v.index] == [["n1"], ["n1", "n2"], ["n2"]]
            assert second.members == {"n2": a2}
        finally:
            await second.stop()
            await first.stop()

        # Restarted, the remaining member knows its group from its own log, not from its file.
        again = EmbeddedLedger(node_config(tmp_path, "n2", a2, join=[a1]))
        await again.start()
        try:
            await until(lambda: again.leader_ready, "the restarted member to lead alone")
            assert list(again.membership.voters) == ["n2"]
        finally:
            await again.stop()

    asyncio.run(main())


def test_joining_under_the_id_of_a_voter_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        a1, a2 = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        first = EmbeddedLedger(node_config(tmp_path, "n1", a1, peers=[f"n1={a1}", f"n2={a2}"]))
        impostor = EmbeddedLedger(node_config(tmp_path / "wiped", "n2", a2, join=[a1]))
        await first.start()
        await impostor.start()
        try:
            node = impostor._node
            await until(lambda: node.fatal_reason is not None, "the joiner to give up")
            assert "already has a voter 'n2'" in str(node.fatal_reason)
        finally:
            await impostor.stop()
            await first.stop()

    asyncio.run(main())


@pytest.mark.parametrize("secret", ["", "s3cret-" * 6], ids=["plain", "cluster-secret"])
def test_a_node_removed_while_it_was_down_learns_it_and_stops_campaigning(
    tmp_path: Path, secret: str
) -> None:
    """Its dials are refused (it was removed), and the members holding the committed removal
    answer it through their own dial: it stops standing for election and says why."""

    async def main() -> None:
        addrs = {n: f"127.0.0.1:{free_port()}" for n in ("n1", "n2", "n3")}
        peers = [f"{n}={a}" for n, a in addrs.items()]

        def member(nid: str) -> EmbeddedLedger:
            return EmbeddedLedger(node_config(tmp_path, nid, addrs[nid], peers=peers, cluster_secret=secret))

        nodes = {n: member(n) for n in addrs}
        for node in nodes.values():
            await node.start()
        try:
            await until(lambda: any(n.leader_ready for n in nodes.values()), "a leader")
            leader = next(n for n in nodes.values() if n.leader_ready)
            victim = next(n for n in addrs if n != leader.node_id)
            await nodes[victim].stop()
            view = await leader.remove_member(victim)
            assert victim not in view.voters and view.committed
            await asyncio.sleep(0.5)  # past the leader's last attempts to tell it (an election timeout)
            term = leader.status()["term"]
            nodes[victim] = back = member(victim)  # back on its old log: a voter of the old group
            told: list[str] = []
            back.on_removed(told.append)
            await back.start()
            assert back.status()["voter"]
            await until(lambda: back.status()["removed_by"] is not None, "the removed node to be told", 10)
            assert back.status()["removed_by"] in addrs and back.status()["voter"]
            assert told == [back.removed_by]  # the embedding process is told once (a broker unregisters)
            roles = []
            back.on_role(lambda change: roles.append(change))
            await asyncio.sleep(0.6)  # several of its election timeouts
            assert not roles and back.status()["role"] == "follower"  # it no longer stands
            assert leader.is_leader and leader.status()["term"] == term  # nobody was disturbed
        finally:
            for node in nodes.values():
                await node.stop()

    asyncio.run(main())


# ---------------------------------------------------------------------- real processes


def run_cli(*args: str, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledger", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def ledger_cli(cluster: LocalCluster, *args: str, timeout: float = 90.0) -> dict:
    """Run ``ledger member ...`` against the cluster; its JSON answer."""
    out = run_cli(*args, timeout=timeout)
    assert out.returncode == 0, f"ledger {' '.join(args)} failed: {out.stderr.strip()}"
    return json.loads(out.stdout)


async def wait_status(client: LedgerClient, address: str, cond, what: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    st: dict = {}
    while time.monotonic() < deadline:
        try:
            st = await client.status(address)
        except LedgerError:
            st = {}
        if st and cond(st):
            return st
        await asyncio.sleep(0.05)
    raise AssertionError(f"{address}: {what} not within {timeout}s (last status {st})")


@pytest.mark.slow
def test_a_node_whose_disk_died_is_replaced_under_load_losing_nothing(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 3)
    cluster.start()
    try:

        async def scenario() -> None:
            leader = await cluster.wait_for_leader()
            victim = next(n for n in cluster.ids if n != leader)
            load = AppendLoad(cluster.addresses, workers=6, batch=4)
            task = asyncio.create_task(load.run(120))
            await asyncio.sleep(1.0)
            wipe_node(cluster, victim)  # its disk died: nothing of it is left
            await asyncio.sleep(0.5)
            nodes = ",".join(cluster.addresses)
            address = start_joining_node(cluster, "n4")
            added = await asyncio.to_thread(
                ledger_cli, cluster, "member", "add", "--nodes", nodes, f"n4={address}", "--promote"
            )
            assert added["voters"]["n4"] == address, added
            removed = await asyncio.to_thread(
                ledger_cli, cluster, "member", "remove", "--nodes", nodes, victim
            )
            assert victim not in removed["voters"] and victim in removed["removed"], removed
            members = await asyncio.to_thread(ledger_cli, cluster, "member", "list", "--nodes", nodes)
            assert set(members["voters"]) == set(cluster.ids) - {victim}, members
            assert all(p["active"] for p in members["progress"].values() if not p["leaving"]), members
            bad = await asyncio.to_thread(run_cli, "member", "remove", "--nodes", nodes, "nobody")
            assert bad.returncode == 1 and "'nobody' is not a member of the group" in bad.stderr, bad.stderr
            bad = await asyncio.to_thread(run_cli, "member", "add", "--nodes", nodes, "n9")
            assert bad.returncode != 0 and "expected ID=HOST:PORT" in bad.stderr, bad.stderr
            acked_at_change = len(load.acks)
            await asyncio.sleep(1.0)
            assert len(load.acks) > acked_at_change, "appends stopped after the replacement"

            # The new member restarts and still knows its group (from its own log).
            cluster.kill("n4")
            cluster.start_node("n4")
            async with LedgerClient(cluster.addresses) as client:
                st = await wait_status(
                    client, address, lambda s: s.get("membership", {}).get("voters"), "n4's configuration"
                )
                assert set(st["membership"]["voters"]) == set(cluster.ids) - {victim}
            await asyncio.sleep(0.5)
            load.stop()
            await task
            assert load.acks, "nothing was acknowledged"

            async with LedgerClient([cluster.address(n) for n in cluster.ids if n != victim]) as client:
                top = max(a.index for a in load.acks)
                for nid in cluster.ids:
                    if nid == victim:
                        continue
                    await wait_status(
                        client, cluster.address(nid), lambda s: s["commit_index"] >= top, "catch-up"
                    )
                    lost = await missing_acks(client, load.acks, cluster.address(nid))
                    assert not lost, f"{len(lost)} acknowledged entries missing on {nid}, e.g. {lost[:3]}"

        asyncio.run(scenario())
    finally:
        cluster.stop()


@pytest.mark.slow
def test_removing_the_leader_under_load_hands_over_and_loses_nothing(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 3)
    cluster.start()
    try:

        async def scenario() -> None:
            leader = await cluster.wait_for_leader()
            load = AppendLoad(cluster.addresses, workers=6, batch=4)
            task = asyncio.create_task(load.run(60))
            await asyncio.sleep(1.0)
            async with LedgerClient(cluster.addresses) as client:
                removed_at = time.monotonic()
                view = await client.remove_member(leader)
                assert leader not in view["voters"]
                st = await wait_status(
                    client,
                    cluster.address(leader),
                    lambda s: s["role"] != "leader",
                    "the removed leader to step down",
                )
                assert st["voter"] is False
                new = await cluster.wait_for_leader(exclude={leader})
                assert new != leader
                with pytest.raises(LedgerError) as info:  # one change at a time is fine, but not a stranger
                    await client.promote("nobody")
                assert info.value.code == BAD_REQUEST and "not a learner" in info.value.message
                await asyncio.sleep(1.0)
                load.stop()
                await task
                after = [a for a in load.acks if a.at > removed_at]
                assert after, "no append was acknowledged after the leader was removed"
                top = max(a.index for a in load.acks)
                for nid in cluster.ids:
                    if nid == leader:
                        continue
                    await wait_status(
                        client, cluster.address(nid), lambda s: s["commit_index"] >= top, "catch-up"
                    )
                    lost = await missing_acks(client, load.acks, cluster.address(nid))
                    assert not lost, f"{len(lost)} acknowledged entries missing on {nid}"
                # The removed node stays quiet: the group's term does not move.
                term = (await client.status(cluster.address(new)))["term"]
                await asyncio.sleep(1.5)
                assert (await client.status(cluster.address(new)))["term"] == term

        asyncio.run(scenario())
    finally:
        cluster.stop()


@pytest.mark.parametrize(
    ("dial", "words"),
    [
        (["n2"], "expected id=host:port"),
        (["n2=nohost"], "dial"),
        (["n2=127.0.0.1:1", "n2=127.0.0.1:2"], "twice"),
    ],
)
def test_a_bad_dial_override_is_refused_with_the_key_named(
    tmp_path: Path, dial: list[str], words: str
) -> None:
    from ledger.config import ConfigError

    with pytest.raises(ConfigError, match=words):
        node_config(tmp_path, "n1", "127.0.0.1:1", peers=["n1=127.0.0.1:1"], dial=dial)
    ok = node_config(tmp_path, "n1", "127.0.0.1:1", peers=["n1=127.0.0.1:1"], dial=["n4=127.0.0.9:7"])
    assert ok.dial_overrides == {"n4": "127.0.0.9:7"}
