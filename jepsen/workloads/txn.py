"""The ``txn`` workload: a transactional message is seen once committed, never once rolled back,
never before its commit, and every transaction the client can answer gets resolved.

Each worker sends unique integers as transactional messages: a half message, then the client's
decision, ``commit``, ``rollback`` or ``unknown`` (the broker will ask). Every message carries the
outcome its transaction is to have (``JEPSEN_OUTCOME``), so whichever producer of the group a
broker asks answers alike, from any process: the checks are part of the history too. Workers
also poll their queue; once healed, a producer stays to answer checks until the group holds no
half message (or long enough), and every queue is drained. ``docs/history.md`` ("Workload txn")
has the history format and the anomalies the ``txn`` checker names:
``committed-not-visible``, ``rolled-back-visible``, ``half-visible-before-commit``,
``unresolved``, ``duplicate``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jepsen.systems.clients import ClientSource
from jepsen.workloads.base import RunContext, attempt
from jepsen.workloads.semantics import SemanticsClient, SemanticsWorkload, client_cache, closing

#: the share of transactions meant to commit (the rest roll back)
COMMIT_SHARE = 0.6
#: the share of transactions whose client answers ``unknown`` first, leaving them to the checks
UNKNOWN_SHARE = 0.3
#: how long the final phase waits for the group's checks, beyond their timeout and three rounds
SETTLE_S = 20.0


class TxnWorkload(SemanticsWorkload):
    """Transactional sends (commit, roll back, or left to the checks) and polls of each worker's queue."""

    name = "txn"
    checker = "txn"
    wraps = "txn"

    def __init__(self, backend: ClientSource, ctx: RunContext) -> None:
        super().__init__(backend, ctx)
        #: values this process rolled back on its own (a half stored without confirmation):
        #: its checks answer rollback for them, whatever the message says
        self.rolled_back: set[int] = set()
        self.checks = 0

    def checked_client(self, group: str | None) -> SemanticsClient:
        """A client whose producer answers the brokers' checks, each answer an operation."""
        client = self.client(group)
        h = self.ctx.history
        proc = h.new_process()  # checks run one at a time per producer: one process answers them

        def on_check(value: Any, outcome: str) -> str:
            if value in self.rolled_back:
                answer = "rollback"
            elif outcome in ("commit", "rollback"):
                answer = outcome
            else:
                answer = "unknown"
            self.checks += 1
            h.invoke(proc, "check", {"value": value})
            h.complete(proc, "ok", "check", {"value": value, "answer": answer}, node=client.node)
            return answer

        client.set_transaction_checker(on_check)
        return client

    async def worker(self, w: int) -> None:
        h, ctx = self.ctx.history, self.ctx
        group, queue_id = self.slot(w)
        key = self.key(group, queue_id)
        proc = h.new_process()
        client = self.checked_client(group)
        pos = 0
        me = asyncio.current_task()
        try:
            while not ctx.done():
                await ctx.pace(w)
                if ctx.done():
                    break
                if ctx.rng.random() < self.act_ratio:
                    proc, typ = await self._transact(proc, client, me)
                else:
                    got = await self.read(proc, client, key, queue_id, pos, task=me)
                    typ = "ok" if got is not None else "fail"
                    if got:
                        pos = got[-1].offset + 1
                if typ == "info":
                    await client.close()
                    client = self.checked_client(group)
        finally:
            await client.close()

    async def _transact(
        self, proc: int, client: SemanticsClient, me: asyncio.Task[Any] | None
    ) -> tuple[int, str]:
        """One transaction as ``send-half`` then ``end``: the process to go on with, and the last
        outcome (``info`` means a fresh process and client)."""
        h, rng = self.ctx.history, self.ctx.rng
        v = next(self.values)
        outcome = "commit" if rng.random() < COMMIT_SHARE else "rollback"
        decision = "unknown" if rng.random() < UNKNOWN_SHARE else outcome
        ended: list[str] = []
        h.invoke(proc, "send-half", {"value": v, "outcome": outcome})

        def on_half() -> str:
            h.complete(proc, "ok", "send-half", {"value": v, "outcome": outcome}, node=client.node)
            h.invoke(proc, "end", {"value": v, "decision": decision})
            ended.append(decision)
            return decision

        typ, res, err = await attempt(self.ctx, client.send_transactional(v, outcome, on_half), task=me)
        if not ended:
            if typ == "ok" and res is not None:
                # stored without confirmation: the client rolled it back itself (RocketMQ's rule)
                h.complete(
                    proc,
                    "info",
                    "send-half",
                    {"value": v, "outcome": outcome},
                    error=f"stored with status {res.status}; the client rolled it back",
                    node=client.node,
                )
                self.rolled_back.add(v)
                proc = h.new_process()
                h.invoke(proc, "end", {"value": v, "decision": "rollback"})
                end_typ = "info" if res.end_error else "ok"
                h.complete(
                    proc,
                    end_typ,
                    "end",
                    {"value": v, "decision": "rollback"},
                    error=res.end_error or None,
                    node=client.node,
                )
                return (h.new_process() if end_typ == "info" else proc), "info"
            h.complete(proc, typ, "send-half", {"value": v, "outcome": outcome}, error=err, node=client.node)
            return (h.new_process() if typ == "info" else proc), typ
        value: dict[str, Any] = {"value": v, "decision": decision}
        if typ == "ok" and res is not None:
            value["queue"] = self.key(res.broker_name, res.queue_id)
            if res.end_error:
                typ, err = "info", res.end_error  # the broker will ask instead
        elif typ == "fail":
            typ = "info"  # the half is stored: a failure past it says nothing certain of the end
        h.complete(proc, typ, "end", value, error=err, node=client.node)
        return (h.new_process() if typ == "info" else proc), typ

    async def final(self) -> None:
        """A producer answers checks until the group holds no half message (at most the check
        timeout, three check rounds and ``SETTLE_S``), then every queue is drained."""
        clients, get = client_cache(self)
        try:
            first = self.checked_client(self.groups[0])
            clients[self.groups[0]] = first
            t = first.timing
            bound = t.transaction_timeout_s + 3 * t.transaction_check_interval_s + SETTLE_S
            loop = asyncio.get_running_loop()
            until = loop.time() + bound
            while loop.time() < until:  # until it could name its group to the masters
                try:
                    await first.answer_checks()
                    break
                except Exception:  # noqa: BLE001 - no route or master yet: again
                    await asyncio.sleep(0.5)
            await self.wait_held(first, "halves", max(0.0, until - loop.time()))
            await self.drain([(g, q, None) for g, q in await self._every_queue(first)], get)
        finally:
            await closing(clients)

    async def _every_queue(self, client: SemanticsClient) -> list[tuple[str | None, int]]:
        """The queues a transactional message may be in: every queue the topic's route has (the
        producer picks among them all; a group may have more than the backend's ``queues``),
        with the workload's own ones when the route cannot be read."""
        slots = set(self.slots)
        for _ in range(5):
            try:
                routed = await client.route_queues()
            except Exception:  # noqa: BLE001 - no nameserver answer yet: again
                await asyncio.sleep(1.0)
                continue
            names = set(self.groups)
            return sorted(
                slots | {(g if self.multi else None, q) for g, q in routed if not self.multi or g in names},
                key=str,
            )
        return sorted(slots, key=str)

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "checks_answered": self.checks}
