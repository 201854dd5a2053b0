"""A ledger follower that lost data on disk is repaired from its peers (storage healing), with real
processes and files: the follower is SIGKILLed, its segment files are emptied or cut short,
and after a restart it must catch up to the leader's commit index with a log identical to
the leader's, while every acknowledged append stays readable.

Before the fix the leader ignored the restarted follower's rejections at or below the match
index it remembered, so the follower sat at commit 0 for as long as that leader led.

Damage a crash cannot explain (a flipped bit or a run of zeros with valid entries after it,
a missing segment) used to stop the node from starting at all. Now the store keeps the valid
prefix, and a log cut short before its durable mark is known to have lost entries too; the
node then defends the log it had (its claim) in votes and never campaigns until a leader has
re-sent what it dropped, since it may have acknowledged those entries.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from ledger.client import LedgerClient
from ledger.codec import HEADER_SIZE, scan_entries
from ledger.config import DEFAULT_DURABLE_MARK_INTERVAL_S
from ledger.localcluster import LocalCluster
from ledger.store import IDX_SUFFIX, SEG_SUFFIX
from ledger.wire import LedgerError

CATCH_UP_S = 20.0


#: How each case damages a stopped follower's files, and whether the node can tell it lost data
#: (then it defends the log it had until repaired); deleted index files lose nothing.
DAMAGE = {
    "emptied": True,  # the log ends before the durable mark (see durable_mark_interval_s)
    "truncated": True,
    "bit-flip-tail": True,  # the marked entry; newer than the last mark it would pass as a torn write
    "bit-flip-middle": True,
    "zeroed-hole": True,
    "index-deleted": False,
}


def _entry_offsets(seg: Path) -> list[int]:
    """Byte offsets of the entries in ``seg`` (read with the codec, as recovery does)."""
    got, _, err = scan_entries(seg.read_bytes(), verify=True)
    assert err is None and got, f"{seg} was not a clean run of entries before the damage: {err}"
    start = int(seg.stem)
    return [e.pos - start for e in got]


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def _wipe(log_dir: Path, how: str) -> None:
    segs = sorted(log_dir.glob("*" + SEG_SUFFIX))
    assert segs, f"no segments in {log_dir}"
    last = segs[-1]
    if how == "emptied":
        for p in [*segs, *log_dir.glob("*" + IDX_SUFFIX)]:
            os.truncate(p, 0)
    elif how == "truncated":
        os.truncate(last, last.stat().st_size // 3)
    elif how == "bit-flip-tail":
        _flip(last, _entry_offsets(last)[-1] + HEADER_SIZE)
    elif how == "bit-flip-middle":
        offsets = _entry_offsets(last)
        _flip(last, offsets[len(offsets) // 2] + HEADER_SIZE + 3)
    elif how == "zeroed-hole":  # a power loss kept later writes but not one page-cache run
        offsets = _entry_offsets(last)
        a, b = offsets[len(offsets) // 3], offsets[len(offsets) // 3 + 3]
        with open(last, "r+b") as f:
            f.seek(a + 7)
            f.write(bytes(b - a))
    elif how == "index-deleted":
        idx = list(log_dir.glob("*" + IDX_SUFFIX))
        assert idx, f"no index files in {log_dir}"
        for p in idx:
            p.unlink()
    else:
        raise ValueError(how)


async def _status(client: LedgerClient, cluster: LocalCluster, nid: str) -> dict:
    return await client.status(cluster.address(nid))


async def _whole_log(client: LedgerClient, address: str, upto: int) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []
    for _ in range(upto + 1):
        if len(out) >= upto:
            break
        got = await client.read(len(out) + 1, upto, address=address)
        assert got, f"{address} returned nothing from {len(out) + 1}"
        out += [(e.index, e.term, bytes(e.data)) for e in got]
    return out


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_follower_that_lost_its_log_is_repaired_from_the_leader(tmp_path: Path, how: str) -> None:
    cluster = LocalCluster(tmp_path, 3)
    cluster.start()
    try:

        async def scenario() -> None:
            leader = await cluster.wait_for_leader(30)
            follower = next(n for n in cluster.ids if n != leader)
            async with LedgerClient(cluster.addresses, timeout=10, secret=cluster.client_secret) as client:
                acked: list[tuple[int, bytes]] = []
                for i in range(40):
                    payload = f"before-{i}".encode() * 20
                    index, _ = await client.append(payload)
                    acked.append((index, payload))
                last = acked[-1][0]
                deadline = time.monotonic() + CATCH_UP_S
                while (await _wait_status(client, cluster.address(follower)))["commit_index"] < last:
                    assert time.monotonic() < deadline, "the follower never caught up the first time"
                    await asyncio.sleep(0.05)
                # One more append, then a quiet mark interval: the follower's tick marks it (a
                # loss within the interval before a crash would pass as a torn write).
                index, _ = await client.append(b"marked")
                acked.append((index, b"marked"))
                while (await _status(client, cluster, follower))["commit_index"] < index:
                    assert time.monotonic() < deadline, "the follower never took the marked entry"
                    await asyncio.sleep(0.05)
                await asyncio.sleep(DEFAULT_DURABLE_MARK_INTERVAL_S + 0.3)

                cluster.kill(follower)
                _wipe(tmp_path / follower / "data" / "log", how)
                cluster.start_node(follower)

                for i in range(5):  # the group keeps taking writes meanwhile
                    payload = f"after-{i}".encode()
                    index, _ = await client.append(payload)
                    acked.append((index, payload))
                last = acked[-1][0]
                deadline = time.monotonic() + CATCH_UP_S
                st: dict = {}
                while time.monotonic() < deadline:
                    try:
                        st = await _status(client, cluster, follower)
                    except Exception:  # noqa: BLE001 - still starting
                        await asyncio.sleep(0.05)
                        continue
                    if st["commit_index"] >= last:
                        break
                    await asyncio.sleep(0.05)
                assert st.get("commit_index", 0) >= last, f"the {how} follower was never repaired: {st}"
                if DAMAGE[how]:
                    assert st["log_damage_found"] is not None, f"the {how} damage went unnoticed: {st}"
                else:
                    assert st["log_damage_found"] is None, f"{how} is not damage the store can tell: {st}"
                while st["recovering"] or st["log_claim"] or st["log_lost_from"] is not None:
                    assert time.monotonic() < deadline, f"the {how} follower never left recovery: {st}"
                    await asyncio.sleep(0.05)
                    st = await _status(client, cluster, follower)

                leader_log = await _whole_log(client, cluster.address(leader), last)
                follower_log = await _whole_log(client, cluster.address(follower), last)
                assert follower_log == leader_log
                by_index = {i: data for i, _, data in leader_log}
                lost = [i for i, payload in acked if by_index.get(i) != payload]
                assert not lost, f"acknowledged entries lost: {lost}"

        asyncio.run(scenario())
    finally:
        cluster.stop()


#: How the follower goes down after its last appends, the mark interval, and whether losing
#: those appends is noticed at restart.
MARK_STOPS = {
    "crash-within-interval": (3600.0, False),  # the residual window: looks like a torn write
    "clean-stop": (3600.0, True),  # a clean stop marks everything durable
    "crash-after-quiet": (0.5, True),  # a quiet interval passed: the owed mark was written
}


@pytest.mark.parametrize("stop", sorted(MARK_STOPS))
def test_entries_lost_after_the_last_mark_are_noticed_unless_within_the_interval(
    tmp_path: Path, stop: str
) -> None:
    """The residual window of the durable mark (see ``ledger/store.py``), with real processes:
    entries fsynced after the last mark and then cut off look like a torn write after a crash
    (SIGKILL) within the interval, but a clean stop (SIGTERM), or a quiet interval before the
    crash, marks them, so the same loss is known and defended. Either way the leader repairs
    the follower and nothing acknowledged is lost."""
    interval, noticed = MARK_STOPS[stop]
    cluster = LocalCluster(tmp_path, 3, settings={"durable_mark_interval_s": interval})
    cluster.start()
    try:

        async def scenario() -> None:
            leader = await cluster.wait_for_leader(30)
            follower = next(n for n in cluster.ids if n != leader)
            address = cluster.address(follower)
            async with LedgerClient(cluster.addresses, timeout=10, secret=cluster.client_secret) as client:
                acked = [await client.append(f"e{i}".encode() * 10) for i in range(30)]
                last = acked[-1][0]
                deadline = time.monotonic() + CATCH_UP_S
                while (await _wait_status(client, address))["commit_index"] < last:
                    assert time.monotonic() < deadline, "the follower never caught up"
                    await asyncio.sleep(0.05)
                if stop == "crash-after-quiet":
                    await asyncio.sleep(interval + 0.3)  # a few ticks past the interval
                cluster.kill(follower, signal.SIGTERM if stop == "clean-stop" else signal.SIGKILL)
                seg = sorted((tmp_path / follower / "data" / "log").glob("*" + SEG_SUFFIX))[-1]
                offsets = _entry_offsets(seg)
                assert len(offsets) >= 25, offsets
                os.truncate(seg, offsets[-5])  # the last 5 entries, fsynced long after the first mark
                cluster.start_node(follower)
                st = await _wait_status(client, address)
                if noticed:  # (its claim may already be met and cleared: the leader repairs fast)
                    assert st["log_damage_found"] is not None, st
                else:
                    assert st["log_damage_found"] is None, f"a loss after the last mark was noticed: {st}"
                acked.append(await client.append(b"after"))
                last = acked[-1][0]
                deadline = time.monotonic() + CATCH_UP_S
                while True:
                    st = await client.status(address)
                    if st["commit_index"] >= last and not st["log_claim"] and st["log_lost_from"] is None:
                        break
                    assert time.monotonic() < deadline, f"the follower was never repaired: {st}"
                    await asyncio.sleep(0.05)
                leader_log = await _whole_log(client, cluster.address(leader), last)
                assert await _whole_log(client, address, last) == leader_log
                by_index = {i: data for i, _, data in leader_log}
                assert all(i in by_index for i, _ in acked)

        asyncio.run(scenario())
    finally:
        cluster.stop()


async def _wait_status(client: LedgerClient, address: str, timeout: float = CATCH_UP_S) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await client.status(address)
        except Exception:  # noqa: BLE001 - the node is still starting
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("loss", ["hardstate-deleted", "bit-flip-middle", "zeroed-hole"])
def test_a_node_that_lost_data_does_not_vote_until_caught_up(tmp_path: Path, loss: str) -> None:
    """Before the fix a node that lost its hard state restarted at term 0 with no vote and could
    vote twice in a term: here it would have elected n2 with n3 down. Now it restarts in its
    term bound (``ledger.hardstate``) with its vote spent, so n2 can win only a term n1 never
    voted in. A node whose log was damaged in the middle did not start at all; kept running
    on its valid prefix it would vote for n2, whose log here ends (cleanly, as if it never had
    them) before entries n1 had acknowledged. Now, knowing how far its damaged log reached,
    n1 votes only for candidates holding at least that much."""
    cluster = LocalCluster(tmp_path, 3)
    cluster.start()
    try:

        async def scenario() -> None:
            await cluster.wait_for_leader(30)
            async with LedgerClient(cluster.addresses, timeout=10, secret=cluster.client_secret) as client:
                acked = [(await client.append(f"e{i}".encode()))[0] for i in range(20)]
                for nid in cluster.ids:
                    deadline = time.monotonic() + CATCH_UP_S
                    while (await _wait_status(client, cluster.address(nid)))["commit_index"] < acked[-1]:
                        assert time.monotonic() < deadline, f"{nid} never committed"
                        await asyncio.sleep(0.05)
                before = await client.status(cluster.address("n1"))
                for nid in cluster.ids:
                    cluster.kill(nid)
                if loss == "hardstate-deleted":
                    (tmp_path / "n1" / "data" / "hardstate").unlink()
                else:
                    _wipe(tmp_path / "n1" / "data" / "log", loss)
                    seg = sorted((tmp_path / "n2" / "data" / "log").glob("*" + SEG_SUFFIX))[-1]
                    os.truncate(seg, _entry_offsets(seg)[-4])  # n2 never had the last 4 entries
                cluster.start_node("n1")
                cluster.start_node("n2")
                st1 = await _wait_status(client, cluster.address("n1"))
                if loss == "hardstate-deleted":
                    assert st1["hard_state_lost"] >= before["term"] and st1["voted_for"] == "n1", (
                        st1,
                        before,
                    )
                    assert not st1["recovering"] and st1["log_damage_found"] is None, st1
                    # n1 and n2 elect a leader at once, in a term n1 never voted in before.
                    leader = await cluster.wait_for_leader(30)
                    st = await client.status(cluster.address(leader))
                    assert leader in ("n1", "n2") and st["term"] > st1["hard_state_lost"] >= before["term"]
                else:
                    assert 1 < st1["log_damage_found"] <= acked[-1] and st1["last_index"] < acked[-1]
                    assert st1["log_claim"] and st1["log_claim"][0] >= acked[-1], st1
                    st2 = await _wait_status(client, cluster.address("n2"))
                    assert st1["last_index"] < st2["last_index"] < acked[-1], (st1, st2)
                await _wait_status(client, cluster.address("n2"))
                end = time.monotonic() + (0 if loss == "hardstate-deleted" else 2.5)
                while time.monotonic() < end:  # several election timeouts: n2 must not win with n1's vote
                    for nid in ("n1", "n2"):
                        st = await client.status(cluster.address(nid))
                        assert st["role"] != "leader", (
                            f"{nid} was elected with the vote of a node that lost its own"
                        )
                    await asyncio.sleep(0.1)

                cluster.start_node("n3")
                leader = await cluster.wait_for_leader(30)
                assert leader in (cluster.ids if loss == "hardstate-deleted" else ("n3",))
                index, _ = await client.append(b"after recovery")
                deadline = time.monotonic() + CATCH_UP_S
                while True:
                    st1 = await client.status(cluster.address("n1"))
                    if st1["commit_index"] >= index and not st1["recovering"] and not st1["log_claim"]:
                        break
                    assert time.monotonic() < deadline, f"n1 never recovered: {st1}"
                    await asyncio.sleep(0.05)
                got = await _whole_log(client, cluster.address("n1"), index)
                by_index = {e[0]: e[2] for e in got}
                assert [by_index.get(i) for i in acked] == [f"e{i}".encode() for i in range(20)]
                assert got == await _whole_log(client, cluster.address(leader), index)

                # Recovery is durable: a restart now is an ordinary one.
                cluster.kill("n1")
                cluster.start_node("n1")
                st1 = await _wait_status(client, cluster.address("n1"))
                assert not st1["recovering"] and not st1["log_claim"] and st1["log_lost_from"] is None, st1
                assert st1["log_damage_found"] is None, st1

        asyncio.run(scenario())
    finally:
        cluster.stop()


def test_damage_behind_a_trusted_index_is_found_on_read_and_repaired(tmp_path: Path) -> None:
    """Recovery trusts a sealed segment's index (verifying only its last entry), so a bit flip in
    the middle of an older segment is first seen when something reads it. Before the fix the
    read failed and the next restart trusted the same index again; now the read drops that
    index and stops the node, and the restart's scan salvages the log and repairs it."""
    cluster = LocalCluster(tmp_path, 3, settings={"segment_bytes": 2048})
    cluster.start()
    try:

        async def scenario() -> None:
            leader = await cluster.wait_for_leader(30)
            follower = next(n for n in cluster.ids if n != leader)
            address = cluster.address(follower)
            async with LedgerClient(cluster.addresses, timeout=10, secret=cluster.client_secret) as client:
                acked = [(await client.append(f"old-{i}".encode() * 30))[0] for i in range(40)]
                deadline = time.monotonic() + CATCH_UP_S
                while (await _wait_status(client, address))["commit_index"] < acked[-1]:
                    assert time.monotonic() < deadline, "the follower never caught up the first time"
                    await asyncio.sleep(0.05)

                cluster.kill(follower)
                log_dir = tmp_path / follower / "data" / "log"
                segs = sorted(log_dir.glob("*" + SEG_SUFFIX))
                assert len(segs) >= 3, f"expected several segments, got {segs}"
                victim = segs[1]
                offsets = _entry_offsets(victim)
                _flip(victim, offsets[len(offsets) // 2] + HEADER_SIZE + 2)
                cluster.start_node(follower)
                st = await _wait_status(client, address)
                assert st["log_damage_found"] is None, "a trusted index hides the damage until a read"
                deadline = time.monotonic() + CATCH_UP_S
                while st["commit_index"] < acked[-1]:  # reads serve committed entries only
                    assert time.monotonic() < deadline, f"the restarted follower never committed: {st}"
                    await asyncio.sleep(0.05)
                    st = await client.status(address)

                async with LedgerClient([address], timeout=2, secret=cluster.client_secret) as direct:
                    with pytest.raises(LedgerError):
                        await direct.read(1, acked[-1], address=address)
                deadline = time.monotonic() + CATCH_UP_S
                while cluster.is_running(follower):
                    assert time.monotonic() < deadline, "the node kept running on a damaged log"
                    await asyncio.sleep(0.05)

                cluster.start_node(follower)
                st = await _wait_status(client, address)
                # the scan truncated at the damage; the leader may already have refilled the tail
                assert st["log_damage_found"] is not None and st["log_damage_found"] <= acked[-1], st
                acked += [(await client.append(f"new-{i}".encode()))[0] for i in range(5)]
                deadline = time.monotonic() + CATCH_UP_S
                while True:
                    st = await client.status(address)
                    if st["commit_index"] >= acked[-1] and not st["recovering"]:
                        break
                    assert time.monotonic() < deadline, f"the follower was never repaired: {st}"
                    await asyncio.sleep(0.05)
                leader_log = await _whole_log(client, cluster.address(leader), acked[-1])
                assert await _whole_log(client, address, acked[-1]) == leader_log
                assert {i for i, _, _ in leader_log} >= set(acked)

        asyncio.run(scenario())
    finally:
        cluster.stop()
