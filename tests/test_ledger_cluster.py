"""A real 3-process ledger group on 127.0.0.x: kill -9 the leader under load; nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import time

import pytest

from ledger.client import LedgerClient
from ledger.loadgen import AppendLoad, missing_acks
from ledger.localcluster import LocalCluster
from ledger.wire import TOO_LARGE, LedgerError

pytestmark = pytest.mark.slow


async def _wait_commit(client: LedgerClient, address: str, index: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            st = await client.status(address)
        except LedgerError:  # a restarted node that is not listening yet
            st = {"commit_index": -1}
        if st["commit_index"] >= index:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{address} did not reach commit index {index} within {timeout}s")


def test_kill_leader_during_appends_loses_nothing(tmp_path):
    cluster = LocalCluster(tmp_path, 3)
    cluster.start()
    try:

        async def scenario() -> None:
            old = await cluster.wait_for_leader()
            old_term = (await LedgerClient(cluster.addresses).status(cluster.address(old)))["term"]
            load = AppendLoad(cluster.addresses, workers=6, batch=4)
            task = asyncio.create_task(load.run(30))
            await asyncio.sleep(1.5)
            acked_before = len(load.acks)
            killed_at = time.monotonic()
            cluster.kill(old)
            new = await cluster.wait_for_leader(exclude={old})
            await asyncio.sleep(1.5)
            load.stop()
            await task
            assert acked_before > 0, "no append was acknowledged before the kill"
            after = load.first_ack_after(killed_at, old_term + 1)
            assert after is not None, "no append was acknowledged by the new leader"
            assert new != old

            async with LedgerClient(cluster.addresses) as client:
                top = max(a.index for a in load.acks)
                for nid in cluster.ids:
                    if nid == old:
                        continue
                    await _wait_commit(client, cluster.address(nid), top)
                    lost = await missing_acks(client, load.acks, cluster.address(nid))
                    assert not lost, f"{len(lost)} acknowledged entries missing on {nid}, e.g. {lost[:3]}"

                # The killed node comes back, truncates anything uncommitted and catches up.
                cluster.start_node(old)
                await _wait_commit(client, cluster.address(old), top, timeout=30)
                lost = await missing_acks(client, load.acks, cluster.address(old))
                assert not lost, f"restarted {old} misses {len(lost)} acknowledged entries"

        asyncio.run(scenario())
    finally:
        cluster.stop()


def test_client_errors_and_bad_frames_leave_the_node_serving(tmp_path):
    cluster = LocalCluster(tmp_path, 3, settings={"max_entry_bytes": 4096, "max_frame_bytes": 1 << 20})
    cluster.start()
    try:

        async def scenario() -> None:
            leader = await cluster.wait_for_leader()
            host, port = cluster.address(leader).split(":")
            # Garbage instead of a hello, then an oversize length prefix: each closes only its connection.
            for junk in (b"\x05\x00\x00\x00hello", b"\xff\xff\xff\x7f"):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(junk)
                await writer.drain()
                assert await asyncio.wait_for(reader.read(), 5) == b""
                writer.close()
            async with LedgerClient(cluster.addresses) as client:
                with pytest.raises(LedgerError) as info:
                    await client.append(b"y" * 5000)
                assert info.value.code == TOO_LARGE
                assert "limit is 4096" in info.value.message
                index, _ = await client.append(b"still serving")
                entries = await client.read(index, index, linearizable=True)
                assert [bytes(e.data) for e in entries] == [b"still serving"]
                # A follower redirects a linearizable read to the leader; a local read is served in place.
                follower = next(n for n in cluster.ids if n != leader)
                await _wait_commit(client, cluster.address(follower), index)
                local = await client.read(index, index, address=cluster.address(follower))
                assert [bytes(e.data) for e in local] == [b"still serving"]

        asyncio.run(scenario())
    finally:
        cluster.stop()


def test_leadership_transfer(tmp_path):
    cluster = LocalCluster(tmp_path, 3)
    cluster.start()
    try:

        async def scenario() -> None:
            leader = await cluster.wait_for_leader()
            target = next(n for n in cluster.ids if n != leader)
            async with LedgerClient(cluster.addresses) as client:
                await client.append(b"before transfer")
                await client.transfer_leadership(target)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    st = await client.status(cluster.address(target))
                    if st["role"] == "leader" and st["leader_ready"]:
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError(f"{target} did not take over")
                index, _ = await client.append(b"after transfer")
                assert [bytes(e.data) for e in await client.read(index, index, linearizable=True)] == [
                    b"after transfer"
                ]

        asyncio.run(scenario())
    finally:
        cluster.stop()


def _children(pid: int) -> set[int]:
    """PIDs of the processes whose parent is ``pid`` (from /proc)."""
    import os

    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.add(int(entry))
    return out


def _exists(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_to_local_cluster_stops_its_nodes(tmp_path):
    """``ledger local-cluster`` stops every node it started on SIGTERM, as on Ctrl-C (it once
    died of the signal itself and left its three nodes running)."""
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "ledger", "local-cluster", "--dir", str(tmp_path / "lc")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    nodes: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        line = ""
        while "group up" not in line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "group up" in line, line
        nodes = _children(proc.pid)
        assert len(nodes) == 3, nodes
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        deadline = time.monotonic() + 10
        alive = list(nodes)
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if _exists(p)]
            time.sleep(0.1)
        assert not alive, f"nodes left running: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for p in nodes:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
