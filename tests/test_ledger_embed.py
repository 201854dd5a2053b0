"""The embedding API (``ledger.embed``) over real in-process ledger members (real sockets, files, fsync)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from common.process import free_port
from ledger.config import NodeConfig
from ledger.embed import (
    CommittedEntry,
    EmbeddedLedger,
    EntriesCompacted,
    NotLeaderError,
    Proposal,
    Role,
    RoleChange,
)


def configs(tmp_path: Path, n: int, **extra: object) -> list[NodeConfig]:
    addrs = {f"n{i + 1}": f"127.0.0.1:{free_port()}" for i in range(n)}
    peers = [f"{k}={v}" for k, v in addrs.items()]
    out = []
    for nid, addr in addrs.items():
        cfg = NodeConfig(id=nid, listen=addr, peers=peers, data_dir=str(tmp_path / nid), tick_ms=10, **extra)  # type: ignore[arg-type]
        cfg.validate()
        out.append(cfg)
    return out


async def until(cond, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def test_single_member_propose_stream_read_and_events(tmp_path: Path) -> None:
    async def main() -> None:
        (cfg,) = configs(tmp_path, 1)
        ledger = EmbeddedLedger(cfg)
        roles: list[RoleChange] = []
        ready: list[int] = []
        commits: list[int] = []
        ledger.on_role(roles.append)
        ledger.on_role(lambda change: 1 / 0)  # a failing listener must not starve the others
        ledger.on_leader_ready(ready.append)
        ledger.on_commit(commits.append)
        await ledger.start()
        try:
            await until(lambda: ledger.leader_ready, "leadership")
            assert ready and ready[-1] == roles[-1].term
            assert roles[-1].role is Role.LEADER and roles[-1].leader_id == "n1"
            assert roles[-1].leader_address == cfg.listen

            outcomes: list[tuple[Proposal, object]] = []
            p = ledger.propose([b"a", b"b", b"c"], lambda prop, err: outcomes.append((prop, err)))
            assert p.last_index == p.first_index + 2 and p.term == ledger.status()["term"]
            await until(lambda: outcomes, "the commit of the proposal")
            assert outcomes == [(p, None)]
            assert ledger.commit_index >= p.last_index and commits[-1] >= p.last_index

            order: list[str] = []
            ledger.on_commit(lambda c: order.append(f"commit {c}"))
            q = ledger.propose([b"d"], lambda prop, err: order.append(f"ack {prop.last_index}"))
            await until(lambda: f"ack {q.last_index}" in order, "the acknowledgement")
            assert q.first_index == p.last_index + 1
            assert order.index(f"commit {q.last_index}") < order.index(f"ack {q.last_index}"), (
                "an acknowledgement must come after the commit listeners saw its index"
            )

            entries = ledger.read(1, ledger.commit_index)
            assert entries[0].noop and entries[0].index == 1
            assert [bytes(e.payload) for e in entries if not e.noop] == [b"a", b"b", b"c", b"d"]
            assert [e.index for e in entries] == list(range(1, ledger.commit_index + 1))
            assert ledger.read_payloads(1, ledger.commit_index) == [(e.index, e.payload) for e in entries]
            assert ledger.read_payloads(2, 3) == [(2, b"a"), (3, b"b")]

            cursor = ledger.cursor(p.first_index + 1)
            got: list[CommittedEntry] = []
            async for batch in cursor:
                got.extend(batch)
                if cursor.caught_up:
                    break
            assert [bytes(e.payload) for e in got] == [b"b", b"c", b"d"]
            assert cursor.poll() == []

            index = await ledger.read_barrier(5.0)
            assert index >= q.last_index
            st = ledger.status()
            assert st["role"] == "leader" and st["commit_index"] == ledger.commit_index
        finally:
            await ledger.stop()

    asyncio.run(main())


def test_followers_refuse_with_the_leader_and_replay_the_log(tmp_path: Path) -> None:
    async def main() -> None:
        ledgers = [EmbeddedLedger(c) for c in configs(tmp_path, 3)]
        for led in ledgers:
            await led.start()
        try:
            await until(lambda: any(x.leader_ready for x in ledgers), "a ready leader")
            leader = next(x for x in ledgers if x.leader_ready)
            follower = next(x for x in ledgers if not x.is_leader)
            await until(lambda: follower.leader_id == leader.node_id, "the follower learning its leader")
            with pytest.raises(NotLeaderError) as info:
                follower.propose([b"x"])
            assert info.value.leader_id == leader.node_id
            assert info.value.leader_address == leader.members[leader.node_id]
            with pytest.raises(NotLeaderError):
                await follower.read_barrier(2.0)

            proposals = [await leader.append([f"m{i}".encode()]) for i in range(5)]
            last = proposals[-1].last_index
            await until(lambda: follower.commit_index >= last, "the follower's commit")
            seen = [e for e in follower.read(1, last) if not e.noop]
            assert [bytes(e.payload) for e in seen] == [f"m{i}".encode() for i in range(5)]
            assert [e.index for e in seen] == [p.first_index for p in proposals]
            assert {e.term for e in seen} == {proposals[0].term}
        finally:
            for led in ledgers:
                await led.stop()

    asyncio.run(main())


def test_retention_shows_as_compacted_reads_and_skipping_cursors(tmp_path: Path) -> None:
    async def main() -> None:
        (cfg,) = configs(tmp_path, 1, segment_bytes=4096, retention_bytes=8192)
        ledger = EmbeddedLedger(cfg)
        await ledger.start()
        try:
            await until(lambda: ledger.leader_ready, "leadership")
            for _ in range(20):
                await ledger.append([b"z" * 1000, b"y" * 1000])
            first = ledger.run_retention()
            assert first > 1 and ledger.first_index == first
            with pytest.raises(EntriesCompacted) as info:
                ledger.read(1, 5)
            assert info.value.first_index == first
            cursor = ledger.cursor(1)
            batch = cursor.poll()
            assert batch[0].index == first and cursor.skipped == first - 1
        finally:
            await ledger.stop()

    asyncio.run(main())


def test_a_failing_fsync_stops_the_member_and_never_acknowledges(tmp_path: Path, monkeypatch) -> None:
    import ledger.store as store_mod
    from ledger.embed import OutcomeUnknown

    async def main() -> None:
        (cfg,) = configs(tmp_path, 1)
        ledger = EmbeddedLedger(cfg)
        await ledger.start()
        try:
            await until(lambda: ledger.leader_ready, "leadership")

            def broken(fd: int) -> None:
                raise OSError(5, "Input/output error")

            monkeypatch.setattr(store_mod, "_datasync", broken)
            with pytest.raises(OutcomeUnknown):
                await asyncio.wait_for(ledger.append([b"never durable"]), 10)
            await asyncio.wait_for(ledger._node.wait_stopped(), 10)
            assert ledger.commit_index < ledger.status()["last_index"]
        finally:
            monkeypatch.undo()
            await ledger.stop()

    asyncio.run(main())
