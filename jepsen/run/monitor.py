"""Watches every node's role, term and leader during a run, to prove faults really bit.

A fault schedule that never moved leadership tests little, so the run records each
node's observed ``(role, term, leader)`` whenever it changes (``leaders.jsonl``, on the
history's clock) and summarises the terms and leaders seen. This is kept out of the
history on purpose: the history contract has no event for it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from jepsen.history import History
from jepsen.systems.base import Backend


class LeaderMonitor:
    def __init__(self, backend: Backend, history: History, path: Path, period: float = 0.25) -> None:
        self.backend = backend
        self.history = history
        self.path = path
        self.period = period
        self.last: dict[str, tuple[Any, ...] | None] = {}
        self.leaders: list[tuple[int, str]] = []  # (term, leader) in the order first seen
        self.terms: set[int] = set()

    def _record(self, nid: str, st: dict[str, Any] | None, fh: Any) -> None:
        now = None if st is None else (st.get("role"), st.get("term"), st.get("leader"))
        if now == self.last.get(nid, ()):
            return
        self.last[nid] = now
        doc = {"time": self.history.now_ns(), "node": nid}
        doc.update({"reachable": False} if st is None else {"role": now[0], "term": now[1], "leader": now[2]})
        fh.write(json.dumps(doc) + "\n")
        if st is not None and st.get("term") is not None:
            self.terms.add(int(st["term"]))
            if st.get("role") == "leader" and (int(st["term"]), nid) not in self.leaders:
                self.leaders.append((int(st["term"]), nid))

    async def poll_once(self) -> None:
        statuses = await self.backend.statuses()
        with open(self.path, "a", encoding="utf-8") as fh:
            for nid, st in statuses.items():
                self._record(nid, st, fh)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.poll_once()
            except Exception:  # noqa: BLE001 - observation only; never fail the run for it
                pass
            try:
                await asyncio.wait_for(stop.wait(), self.period)
            except TimeoutError:
                pass

    def summary(self) -> dict[str, Any]:
        # each replication group's first leader is no change (several broker groups: one each)
        groups = self.backend.node_groups()
        led = {g for g, members in groups.items() for _, n in self.leaders if n in members}
        return {
            "terms_seen": sorted(self.terms),
            "leaders": [[t, n] for t, n in sorted(self.leaders)],
            "leader_changes": max(0, len(self.leaders) - max(1, len(led))),
        }
