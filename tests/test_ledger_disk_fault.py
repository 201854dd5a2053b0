"""A leader whose disk refuses writes (ENOSPC) hands over, reports it, and resumes later (storage healing).

Three real ledger nodes (sockets, files, fsync) run in this process so a fault-injecting
file layer can fail exactly one node's writes: ``os.pwrite`` as the log store sees it is
wrapped to raise ENOSPC for files under that node's data directory. Before the fix the
leader stayed leader and every append failed, even after space was freed.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path

import pytest

import ledger.store as store_mod
from common.process import free_port
from ledger.config import NodeConfig
from ledger.node import LedgerNode
from ledger.wire import LedgerError

BOUND_S = 15.0


class FullDisk:
    """``os.pwrite`` for the store, failing with ENOSPC for files under ``root`` while ``full``."""

    def __init__(self, real) -> None:  # noqa: ANN001 - os.pwrite
        self.real = real
        self.root: str | None = None
        self.full = False

    def __call__(self, fd: int, data, offset: int) -> int:  # noqa: ANN001 - bytes or memoryview
        if self.full and self.root and os.readlink(f"/proc/self/fd/{fd}").startswith(self.root):
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(fd, data, offset)


async def _until(cond, what: str) -> None:  # noqa: ANN001 - a predicate
    deadline = time.monotonic() + BOUND_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.02)


def _leader(nodes: dict[str, LedgerNode]) -> LedgerNode | None:
    ready = [n for n in nodes.values() if n.leader_ready]
    return ready[0] if len(ready) == 1 else None


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to map fds to files")
def test_a_leader_with_a_full_disk_hands_over_and_resumes_when_space_is_back(
    tmp_path: Path, monkeypatch
) -> None:
    disk = FullDisk(os.pwrite)
    monkeypatch.setattr(store_mod.os, "pwrite", disk)
    hosts = {f"n{i}": f"127.0.0.{i}" for i in (1, 2, 3)}
    peers = [f"{nid}={h}:{free_port(h)}" for nid, h in hosts.items()]
    configs = {}
    for item in peers:
        nid, _, addr = item.partition("=")
        cfg = NodeConfig(
            id=nid, listen=addr, peers=peers, data_dir=str(tmp_path / nid), cluster_secret="s" * 32
        )
        cfg.validate()
        configs[nid] = cfg

    async def scenario() -> None:
        nodes = {nid: LedgerNode(cfg) for nid, cfg in configs.items()}
        try:
            for n in nodes.values():
                await n.start()
            await _until(lambda: _leader(nodes) is not None, "a leader is ready")
            old = _leader(nodes)
            assert old is not None
            for i in range(10):
                await old.append([f"before-{i}".encode()])

            disk.root = str(tmp_path / old.config.id)
            disk.full = True
            with pytest.raises((LedgerError, Exception)):
                await old.append([b"refused"])
            st = old.status()
            assert st["disk_fault"] and "No space" in st["disk_fault_reason"] and st["role"] != "leader"
            assert old.metrics.disk_fault._value.get() == 1
            await _until(lambda: (n := _leader(nodes)) is not None and n is not old, "another node leads")
            new = _leader(nodes)
            assert new is not None
            first, _ = await new.append([b"while the old leader's disk is full"])
            for _ in range(20):  # the faulty node neither campaigns nor is elected meanwhile
                await asyncio.sleep(0.05)
                assert not old.is_leader

            disk.full = False
            await _until(lambda: not old.status()["disk_fault"], "the node resumes once writes succeed")
            assert old.metrics.disk_fault._value.get() == 0
            last, _ = await new.append([b"after"])
            await _until(lambda: old.commit_index >= last, "the resumed node catches up")
            got = [bytes(e.data) for e in old.committed_entries(first, last)]
            assert got[0] == b"while the old leader's disk is full" and got[-1] == b"after"
        finally:
            for n in nodes.values():
                await n.stop()

    asyncio.run(scenario())
