"""What only a master does with the messages its group holds: deliver scheduled ones when
due, and check unresolved transactions with their producers.

Both act through the ledger: a delivery is a derived entry (``codec.encode_derived``) whose
origin is the scheduled position, a discarded transaction a metadata record. Applying them
resolves the pending state on every broker, and a resolution applied twice is a no-op, so a
master that loses leadership mid-way and its successor that picks the same work up store
each message once. Neither keeps anything that must survive it: taken deliveries are given
back when their proposal fails, and transaction check counts start again on a new master
(a producer may be asked once more; RocketMQ's checks are at least once too).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ledger.embed import EmbedError
from remoting.codes import RequestCode
from remoting.message import (
    PROPERTY_TRANSACTION_ID,
    MessageFormatError,
    offset_msg_id,
    serve_records,
)
from remoting.protocol import RemotingCommand

from . import codec, derive
from .clients import ClientTable
from .config import BrokerConfig
from .message_store import MessageStore, Stored
from .meta import txn_end_op

log = logging.getLogger("broker.delivery")

DELIVERY_BATCH = 256  # due messages delivered in one derived entry
IDLE_POLL_S = 0.05  # how often an idle schedule is looked at (a new message due sooner wakes it)
BUSY_POLL_S = 0.005
MAX_CHECKS_PER_ROUND = 10_000  # transaction checks sent in one round (the rest wait for the next)


class ScheduledDelivery:
    """Delivers scheduled messages when due, while this broker is master."""

    def __init__(self, store: MessageStore, config: BrokerConfig, store_host: bytes) -> None:
        self.store = store
        self.config = config
        self.store_host = store_host
        self.delivered = 0
        self.lag_ms: list[float] = []  # how late the last deliveries were (bounded: a window)
        self._taken: dict[int, tuple[int, int]] = {}  # position -> (due, position), proposed
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self, is_master: Callable[[], bool]) -> None:
        schedule = self.store.state.schedule
        try:
            while is_master():
                now = int(time.time() * 1000)
                due = schedule.take_due(now, DELIVERY_BATCH)
                if due:
                    self._deliver(due, now)
                    await asyncio.sleep(0)
                    continue
                nxt = schedule.next_due()
                wait = IDLE_POLL_S if nxt is None else max(BUSY_POLL_S, min(IDLE_POLL_S, (nxt - now) / 1000))
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)
                except TimeoutError:
                    pass
        finally:
            self._give_back_all()

    def _deliver(self, due: list[tuple[int, int]], now: int) -> None:
        items: list[tuple[bytes, bytes]] = []
        taken: list[tuple[int, int]] = []
        levels, max_timer = self.config.delay_levels_ms, int(self.config.max_timer_delay_s * 1000)
        for item in due:
            held = self.store.stored_record(item[1])
            if held is None:
                log.error("scheduled message unreadable; left pending", extra={"position": item[1]})
                continue
            try:
                rec = self._released(held, item[1], now, levels, max_timer)
            except (MessageFormatError, derive.PlacementError) as exc:
                log.error(
                    "scheduled message undeliverable; left pending",
                    extra={"position": item[1], "error": str(exc)},
                )
                continue
            items.append((codec.ORIGIN_SCHEDULED + item[1].to_bytes(8, "big"), rec))
            taken.append(item)
        if not items:
            return
        for item in taken:
            self._taken[item[1]] = item

        def done(results: list[Stored] | None, exc: EmbedError | None) -> None:
            for item in taken:
                self._taken.pop(item[1], None)
            if exc is not None:
                self.store.state.schedule.give_back(taken)  # not stored: due again (if still pending)
                return
            delivered_at = time.time() * 1000
            self.delivered += len(taken)
            self.lag_ms = (self.lag_ms + [delivered_at - d for d, _ in taken])[-4096:]

        try:
            self.store.append([codec.encode_derived(items)], done)
        except EmbedError:
            done(None, EmbedError("not leader"))

    def _released(
        self, held: bytes | memoryview, position: int, now: int, levels: tuple[int, ...], max_timer: int
    ) -> bytes:
        """The record for the real queue of a due message (read in place when it can be)."""
        fast = derive.released_record(
            held, now, levels, max_timer, self.store_host, f"at position {position}"
        )
        if fast is not None:
            return fast[1]
        msg = derive.decode_held(held)
        place = derive.release(msg, now, levels, max_timer)
        return derive.record(
            msg,
            place,
            sys_flag=msg.sys_flag,
            reconsume_times=msg.reconsume_times,
            store_ms=now,
            store_host=self.store_host,
        )

    def _give_back_all(self) -> None:
        taken, self._taken = list(self._taken.values()), {}
        self.store.state.schedule.give_back(taken)

    def stats(self) -> dict[str, Any]:
        lag = sorted(self.lag_ms)
        return {
            "delivered": self.delivered,
            "lateness_p50_ms": round(lag[len(lag) // 2], 1) if lag else None,
            "lateness_p99_ms": round(lag[min(len(lag) - 1, int(len(lag) * 0.99))], 1) if lag else None,
        }


class TransactionChecker:
    """Asks a live producer of the group about each half message left unresolved past the
    transaction timeout, every check interval; discards it after ``transaction_check_max``
    unanswered checks (RocketMQ's TransactionalMessageCheckService)."""

    def __init__(self, store: MessageStore, config: BrokerConfig, clients: ClientTable) -> None:
        self.store = store
        self.config = config
        self.clients = clients
        self.checks: dict[int, int] = {}  # half position -> checks sent by this master
        self.sent = 0
        self.discarded = 0

    async def run(self, is_master: Callable[[], bool]) -> None:
        interval = self.config.transaction_check_interval_s
        while is_master():
            try:
                await asyncio.sleep(interval)
            except asyncio.CancelledError:
                raise
            if is_master():
                self.check_round(int(time.time() * 1000))

    def check_round(self, now_ms: int) -> None:
        halves = self.store.state.halves.pending
        for position in [p for p in self.checks if p not in halves]:
            del self.checks[position]  # resolved since
        timeout_ms = int(self.config.transaction_timeout_s * 1000)
        sent = 0
        for position, half in list(halves.items()):
            if now_ms - half.store_ms < max(timeout_ms, half.immunity_ms):
                continue
            if sent >= MAX_CHECKS_PER_ROUND:
                break
            count = self.checks.get(position, 0)
            if count >= self.config.transaction_check_max:
                self._discard(position)
                continue
            # Every round counts, whether a producer could be asked or not (RocketMQ counts the
            # check before it looks for one): a group gone for good has its halves discarded.
            self.checks[position] = count + 1
            conns = self.clients.live_producer_connections(half.producer_group, time.monotonic())
            if conns and self._send_check(position, conns[0]):
                sent += 1

    def _send_check(self, position: int, conn: Any) -> bool:
        found = self.store.record_at(position)
        if found is None:
            return False
        try:
            msg = derive.decode_held(found[1])
            topic, qid = derive.real_queue(msg)
        except (MessageFormatError, derive.PlacementError):
            return False
        host = bytes.fromhex(msg.offset_msg_id[:16]) if len(msg.offset_msg_id) >= 16 else b"\x00" * 8
        shown = derive.record(  # as RocketMQ shows it: in its real topic and queue
            msg,
            derive.Placement(topic, qid, msg.all_properties()),
            sys_flag=msg.sys_flag,
            reconsume_times=msg.reconsume_times,
            store_ms=msg.store_ms,
            store_host=host,
        )
        headers = {
            "tranStateTableOffset": found[0],
            "commitLogOffset": position,
            "msgId": msg.unique_key or msg.offset_msg_id,
            "transactionId": msg.properties.get(PROPERTY_TRANSACTION_ID)
            or msg.unique_key
            or msg.offset_msg_id,
            "offsetMsgId": offset_msg_id(host, position),
        }
        body = serve_records([(found[0], position, shown)])
        try:
            conn.invoke_oneway(
                RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, headers, bytes(body))
            )
        except Exception as exc:  # noqa: BLE001 - a producer gone since: asked again next round
            log.info("transaction check not sent", extra={"position": position, "error": str(exc)})
            return False
        self.sent += 1
        return True

    def _discard(self, position: int) -> None:
        def done(results: list[Stored] | None, exc: EmbedError | None) -> None:
            if exc is None:
                self.discarded += 1
                self.checks.pop(position, None)

        log.warning("half message discarded after unanswered checks", extra={"position": position})
        try:
            self.store.append([txn_end_op(position, "discard")], done)
        except EmbedError:
            pass

    def stats(self) -> dict[str, Any]:
        return {"checks_sent": self.sent, "discarded": self.discarded, "being_checked": len(self.checks)}
