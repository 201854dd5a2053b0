"""A final drain recorded in pages (docs/history.md, "Drain pages"), without brokers.

The log workload's drain against a client that reads the log page by page, the fallback
for clients that drain at once, a page that fails (the next drain starts again from 0),
the in-process checker's reading of the pages, and the Parquet recorder's bound on the
pairs it buffers.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from jepsen import history as hmod
from jepsen.checker.analyze import analyze_files
from jepsen.history import History, read_history, validate_history
from jepsen.systems.clients import Definite, Pair
from jepsen.workloads.base import RunContext
from jepsen.workloads.log import LogWorkload, pages_of


class PagedLog:
    """A log of ``n`` values (value = offset + 1, except the ``drop``ped offsets' values, which
    are read back as missing) read page by page; ``fail_at``: drains whose page of that number
    fails (a definite error), counted from 0 over every drain."""

    node = "n1"

    def __init__(
        self, n: int, *, drop: frozenset[int] = frozenset(), fail_at: set[int] | None = None
    ) -> None:
        self.n = n
        self.drop = drop
        self.fail_at = fail_at or set()
        self.pages_served = 0
        self.largest_held = 0

    def log(self) -> list[Pair]:
        return [(o, o + 1) for o in range(self.n) if o not in self.drop]

    async def drain(self) -> list[Pair]:
        return self.log()

    async def drain_pages(self, page: int) -> AsyncIterator[list[Pair]]:
        for p in pages_of(self.log(), page):
            k, self.pages_served = self.pages_served, self.pages_served + 1
            if k in self.fail_at:
                raise Definite(f"page {k} failed")
            self.largest_held = max(self.largest_held, len(p))
            yield p
            await asyncio.sleep(0)

    async def close(self) -> None:
        return None


class WholeLog(PagedLog):
    """A client with no ``drain_pages``: it drains the whole log at once."""

    drain_pages = None  # type: ignore[assignment]


class Source:
    system = "fake"

    def __init__(self, client: PagedLog) -> None:
        self.c = client

    def log_client(self) -> PagedLog:
        return self.c


def _drain(tmp_path: Path, client: PagedLog, page: int, sends: int | None = None) -> tuple[Path, LogWorkload]:
    """Record ``sends`` ok sends of the client's log (all by default), then the final drain."""
    path = tmp_path / "history.jsonl"

    async def go() -> LogWorkload:
        with History(path) as h:
            ctx = RunContext(
                history=h, rng=random.Random(1), deadline=0.0, rate=1.0, clients=1, drain_page=page
            )
            w = LogWorkload(Source(client), ctx)  # type: ignore[arg-type]
            p = h.new_process()
            for o in range(client.n if sends is None else sends):
                h.invoke(p, "send", o + 1, key=w.key)
                h.complete(p, "ok", "send", o + 1, key=w.key, offset=o)
            await w.final()
            return w

    return path, asyncio.run(go())


def _pages(path: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    out, inv = [], {}
    for e in read_history(path):
        if e["f"] == "drain":
            if e["type"] == "invoke":
                inv[e["process"]] = e
            else:
                out.append((inv[e["process"]], e))
    return out


def _verdict(path: Path, out: Path) -> dict[str, Any]:
    res = analyze_files([path], workload="log", out_dir=out, engine="inprocess", report=False)
    assert res["files"][0].error is None, res["files"][0].error
    return res["files"][0].result


@pytest.mark.parametrize("n", [0, 7, 20, 23])
def test_a_drain_is_recorded_as_pages_ending_with_a_short_one(tmp_path: Path, n: int) -> None:
    client = PagedLog(n)
    path, w = _drain(tmp_path, client, page=5)
    pages = _pages(path)
    assert validate_history(read_history(path)) == []
    assert len(pages) == n // 5 + 1  # a multiple of the page size ends with an empty page
    start = 0
    for i, (inv, ok) in enumerate(pages):
        assert ok["type"] == "ok" and inv["value"] == {"from": start, "max": 5}
        assert len(ok["value"]) == (5 if i < len(pages) - 1 else n % 5)
        start = ok["value"][-1][0] + 1 if ok["value"] else start
    assert [v for _, ok in pages for _, v in ok["value"]] == list(range(1, n + 1))
    assert w.drained == n and client.largest_held <= 5
    assert _verdict(path, tmp_path / "out")["valid"] is True


def test_a_client_that_drains_at_once_is_cut_into_the_same_pages(tmp_path: Path) -> None:
    path, w = _drain(tmp_path, WholeLog(12), page=5)
    assert [len(ok["value"]) for _, ok in _pages(path)] == [5, 5, 2]
    assert w.drained == 12


def test_a_failed_page_starts_the_drain_again_from_zero(tmp_path: Path) -> None:
    """Page 2 of the first drain fails: the second drain starts from 0 and is the one judged."""
    client = PagedLog(12, fail_at={1})
    path, w = _drain(tmp_path, client, page=5)
    pages = _pages(path)
    assert [(inv["value"]["from"], ok["type"]) for inv, ok in pages] == [
        (0, "ok"),
        (5, "fail"),
        (0, "ok"),
        (5, "ok"),
        (10, "ok"),
    ]
    assert w.drained == 12
    assert _verdict(path, tmp_path / "out")["valid"] is True


def test_a_value_missing_from_a_later_page_is_a_lost_write(tmp_path: Path) -> None:
    """Sends acknowledged at offsets 0..11; offset 8 (page 2 of 5-pair pages) is not read back."""
    path, _ = _drain(tmp_path, PagedLog(12, drop=frozenset({8})), page=5, sends=12)
    r = _verdict(path, tmp_path / "out")
    assert r["valid"] is False and r["counts"]["lost-write"] == 1
    assert r["anomalies"]["lost-write"][0]["value"] == 9
    first_page = _pages(path)[0][0]
    assert r["anomalies"]["lost-write"][0]["missing-from-drain"]["invoke-index"] == first_page["index"]


def test_parquet_recorder_rolls_a_part_once_it_holds_roll_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages come faster than a part's time roll: a part closes once its rows hold ROLL_PAIRS
    pairs, so the recorder buffers a bounded number of pairs, and the parts read back whole."""
    monkeypatch.setattr(hmod, "ROLL_PAIRS", 100)
    with History(tmp_path / "h" / "shard-00.parquet") as h:
        p = h.new_process()
        start = 0
        for _ in range(6):
            h.invoke(p, "drain", {"from": start, "max": 40}, key="q")
            h.complete(p, "ok", "drain", [[o, o + 1] for o in range(start, start + 40)], key="q")
            start += 40
            assert h._part_pairs < 100
    assert len(list((tmp_path / "h").glob("*.parquet"))) == 2  # closed at 120 pairs each
    events = read_history(tmp_path / "h")
    assert [len(e["value"]) for e in events if e["type"] == "ok"] == [40] * 6


class _Polled:
    """What ``BrokerQueueClient._gather`` returns: messages with an offset and a body."""

    def __init__(self, offset: int) -> None:
        self.queue_offset = offset
        self.body = str(offset * 10).encode()


@pytest.mark.parametrize("n", [0, 5, 2 * 32 * 32, 2 * 32 * 32 + 7])
def test_broker_client_drain_is_the_concatenation_of_its_pages(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One poll loop: ``drain`` is ``drain_pages`` joined, and both walk the queue a poll of
    ``DRAIN_POLL`` at a time from the offset after the last one read, ending at a short poll."""
    from jepsen.systems import broker as bmod

    monkeypatch.setattr(bmod, "DRAIN_POLL", 32)
    client = bmod.BrokerQueueClient(["127.0.0.1:1"], {}, "T")
    asked: list[tuple[int, int]] = []

    async def gather(queue_id: int, start: int, limit: int, topic: str) -> list[_Polled]:
        assert topic == "T" and queue_id == 3
        asked.append((start, limit))
        return [_Polled(o) for o in range(start, min(n, start + limit))]

    monkeypatch.setattr(client, "_gather", gather)

    async def go() -> tuple[list[Pair], list[list[Pair]]]:
        whole = await client.drain(3)
        pages = [p async for p in client.drain_pages(3, 100)]
        return whole, pages

    whole, pages = asyncio.run(go())
    assert whole == [(o, o * 10) for o in range(n)]
    assert [pair for p in pages for pair in p] == whole
    assert [len(p) for p in pages] == [100] * (n // 100) + [n % 100]
    polls = n // 32 + 1  # the last one short (possibly empty)
    assert asked == [(32 * k, 32) for k in range(polls)] * 2


def test_broker_client_drain_is_bounded_in_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    from jepsen.systems import broker as bmod
    from jepsen.systems.clients import Indefinite

    monkeypatch.setattr(bmod, "DRAIN_POLL", 2)
    monkeypatch.setattr(bmod, "MAX_DRAIN_POLLS", 5)
    client = bmod.BrokerQueueClient(["127.0.0.1:1"], {}, "T")

    async def endless(queue_id: int, start: int, limit: int, topic: str) -> list[_Polled]:
        return [_Polled(start), _Polled(start + 1)]

    monkeypatch.setattr(client, "_gather", endless)
    with pytest.raises(Indefinite, match="5 polls of 2"):
        asyncio.run(client.drain(0))
