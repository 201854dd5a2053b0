"""Admin statistics a broker answers for RocketMQ's tools: mqadmin topicStatus, consumerProgress,
clusterList and brokerStatus (and our ``ledgermq-admin`` equivalents).

- GET_TOPIC_STATS_INFO (202): per write queue of a topic, min and max offset and when its last
  message was stored (RocketMQ's TopicStatsTable).
- GET_CONSUME_STATS (208): per read queue of the group's topics (or of one topic), the broker's
  max offset, the group's committed offset and when the last message it consumed was stored,
  plus the group's consume rate (RocketMQ's ConsumeStats).
- GET_BROKER_RUNTIME_INFO (28): our runtime document, with RocketMQ's KVTable (``table``:
  string values under RocketMQ's names) added, which is all mqadmin reads of it.

Everything is read from the broker's applied state, so a slave answers from what it has
applied. Rates come from samples the handlers take when asked (bounded), not from a timer:
a broker nobody asks keeps no statistics. "Puts" are the messages the broker's state applied
since it started; "gets" are the offsets consumer groups committed (RocketMQ counts messages
served by pulls, which a ledgermq broker does not count on its pull path).
"""

from __future__ import annotations

import json
import shutil
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from remoting.codes import RequestCode, ResponseCode
from remoting.protocol import RemotingCommand
from remoting.stats_body import (
    ConsumeStats,
    QueueConsumeOffset,
    QueueKey,
    TopicOffset,
    encode_consume_stats,
    encode_topic_stats,
)

from . import codec
from .clients import ClientTable
from .context import Broker

if TYPE_CHECKING:
    from remoting.connection import RemotingConnection

MAX_RATE_SAMPLES = 1024
"""Samples of the put/get totals kept for the runtime rates (one per second at most)."""
RATE_SAMPLE_INTERVAL_S = 1.0
RATE_WINDOWS_S = (10.0, 60.0, 600.0)
"""The windows of RocketMQ's putTps/getTransferedTps triples: 10 s, 1 min, 10 min."""
MAX_TPS_GROUPS = 4096
"""Consumer groups whose last committed total is kept for consumeTps (cleared when full)."""
BROKER_VERSION_DESC = "V4_9_4"
BROKER_VERSION = 401  # MQVersion.Version.V4_9_4.ordinal(): the version our frames carry


class AdminStats:
    """The statistics handlers of one broker; ``handlers()`` is merged into its processor table."""

    def __init__(self, broker: Broker, clients: ClientTable, suspended_pulls: Callable[[], int]) -> None:
        self.broker = broker
        self.store = broker.store
        self.config = broker.config
        self.clients = clients
        self.suspended_pulls = suspended_pulls  # long polls being held, as the pull processor counts them
        self.boot_ms = int(time.time() * 1000)
        self._samples: deque[tuple[float, int, int]] = deque(maxlen=MAX_RATE_SAMPLES)
        self._samples.append((time.monotonic(), *self._totals()))  # rates until the windows fill: since start
        self._group_samples: dict[str, tuple[float, int]] = {}

    def handlers(self) -> dict[int, Callable[[RemotingConnection, RemotingCommand], Any]]:
        return {
            RequestCode.GET_TOPIC_STATS_INFO: self.topic_stats,
            RequestCode.GET_CONSUME_STATS: self.consume_stats,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.runtime_info,
        }

    # --- GET_TOPIC_STATS_INFO ----------------------------------------------------------------------
    def topic_stats(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        topic = req.header_str("topic")
        tc = self.store.topics.get(topic)
        if tc is None:
            return req.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic {topic!r} does not exist on broker {self.config.broker_name}",
            )
        table: dict[QueueKey, TopicOffset] = {}
        for queue_id in range(tc.write_queue_nums):
            lo, hi = self.store.offsets_of(topic, queue_id)
            last = self.store.store_time_at(topic, queue_id, hi - 1) if hi > 0 else None
            table[QueueKey(topic, self.config.broker_name, queue_id)] = TopicOffset(lo, hi, last or 0)
        return req.make_response(body=encode_topic_stats(table))

    # --- GET_CONSUME_STATS -------------------------------------------------------------------------
    def _group_topics(self, group: str) -> set[str]:
        """Topics ``group`` committed an offset of on this broker (RocketMQ's whichTopicByConsumer)."""
        return {topic for g, topic, _q in self.store.offsets if g == group}

    def consume_stats(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """A group without committed offsets here gets an empty table, as from RocketMQ (a tool
        asking every broker must not fail on one that never saw the group), with a remark
        saying so; a topic asked for by name that this broker lacks is refused."""
        group = req.header_str("consumerGroup")
        if not group:
            return req.make_response(
                ResponseCode.BAD_REQUEST, "GET_CONSUME_STATS needs a non-empty consumerGroup"
            )
        asked = req.header_str("topic", "")
        if asked and asked not in self.store.topics:
            return req.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic {asked!r} does not exist on broker {self.config.broker_name}",
            )
        topics = {asked} if asked else self._group_topics(group)
        subscribed = self._subscribed_topics(group)
        offsets = self.store.offsets
        stats = ConsumeStats({})
        for topic in sorted(topics):
            tc = self.store.topics.get(topic)
            if tc is None or (subscribed is not None and topic not in subscribed):
                continue  # deleted since, or the group's live consumers no longer subscribe to it
            for queue_id in range(tc.read_queue_nums):
                _lo, hi = self.store.offsets_of(topic, queue_id)
                consumed = max(offsets.get((group, topic, queue_id), 0), 0)
                last = self.store.store_time_at(topic, queue_id, consumed - 1) if consumed > 0 else None
                key = QueueKey(topic, self.config.broker_name, queue_id)
                stats.offsets[key] = QueueConsumeOffset(hi, consumed, last or 0)
        stats.consume_tps = self._consume_tps(group, sum(o.consumer_offset for o in stats.offsets.values()))
        remark = (
            ""
            if stats.offsets
            else f"consumer group {group!r} has no consume stats on broker {self.config.broker_name}"
        )
        if not stats.offsets and not asked:
            remark += " (no committed offset)"
        return req.make_response(remark=remark, body=encode_consume_stats(stats))

    def _subscribed_topics(self, group: str) -> set[str] | None:
        """Topics the group's live consumers subscribe to (from heartbeats); None when none is online."""
        clients = self.clients.consumers.get(group)
        if not clients:
            return None
        return {topic for info in clients.values() for topic in info.subscriptions}

    def _consume_tps(self, group: str, committed: int) -> float:
        """Committed messages per second since the previous request for the group (0 the first time)."""
        now = time.monotonic()
        before = self._group_samples.get(group)
        if before is None and len(self._group_samples) >= MAX_TPS_GROUPS:
            self._group_samples.clear()
        self._group_samples[group] = (now, committed)
        if before is None or now <= before[0]:
            return 0.0
        return max(committed - before[1], 0) / (now - before[0])

    # --- GET_BROKER_RUNTIME_INFO -------------------------------------------------------------------
    def runtime_info(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        """Our runtime document with RocketMQ's KVTable; ``loopLagSinceMs`` (wall-clock ms, our
        own optional header) limits the event-loop lag figures to samples since then."""
        since_ms = req.header_int("loopLagSinceMs", 0, min_value=0, max_value=1 << 62)
        doc = dict(self.broker.runtime_info(lag_since=since_ms / 1000))
        doc["table"] = self.kv_table()
        return req.make_response(body=json.dumps(doc).encode())

    def _totals(self) -> tuple[int, int]:
        return self.store.dispatched_messages, sum(max(o, 0) for o in self.store.offsets.values())

    def _rates(self, now: float, puts: int, gets: int) -> tuple[str, str]:
        """RocketMQ's "10s 1min 10min" rate triples, from the samples: each over at least its window
        where the samples reach that far back, else since the first sample (the broker's start)."""
        samples = self._samples
        if not samples or now - samples[-1][0] >= RATE_SAMPLE_INTERVAL_S:
            samples.append((now, puts, gets))
        put_rates, get_rates = [], []
        for window in RATE_WINDOWS_S:
            start = samples[0]  # the newest sample at least a window old, else the oldest
            for sample in samples:
                if now - sample[0] < window:
                    break
                start = sample
            elapsed = now - start[0]
            put_rates.append((puts - start[1]) / elapsed if elapsed > 0 else 0.0)
            get_rates.append(max(gets - start[2], 0) / elapsed if elapsed > 0 else 0.0)
        return " ".join(f"{r:.2f}" for r in put_rates), " ".join(f"{r:.2f}" for r in get_rates)

    def _earliest_store_ms(self) -> int | None:
        """When the oldest message still held was stored: the record at the lowest position
        any queue still holds (positions grow with the log), read once, not one per queue."""
        first = self.store.first_position()
        found = None if first is None else self.store.record_at(first)
        if found is None:
            return None
        try:
            return codec.record_store_ms(found[1])
        except codec.CodecError:
            return None

    def kv_table(self) -> dict[str, str]:
        """The KVTable mqadmin clusterList and brokerStatus print (strings, RocketMQ's names)."""
        puts, gets = self._totals()
        put_tps, get_tps = self._rates(time.monotonic(), puts, gets)
        table = {
            "brokerVersionDesc": BROKER_VERSION_DESC,
            "brokerVersion": str(BROKER_VERSION),
            "bootTimestamp": str(self.boot_ms),
            "putTps": put_tps,
            "getTransferedTps": get_tps,  # sic: RocketMQ's name
            "msgPutTotalTodayNow": str(puts),
            "msgGetTotalTodayNow": str(gets),
            "brokerName": self.config.broker_name,
            "brokerAddr": self.config.broker_addr,
            "brokerRole": "MASTER" if self.broker.is_master else "SLAVE",
            "appliedIndex": str(self.store.applied),
            "topicCount": str(len(self.store.topics)),
            "consumerOffsetCount": str(len(self.store.offsets)),
            "suspendedPulls": str(self.suspended_pulls()),
        }
        earliest = self._earliest_store_ms()
        if earliest is not None:
            table["earliestMessageTimeStamp"] = str(earliest)
        try:
            usage = shutil.disk_usage(self.config.data_dir)
            table["commitLogDiskRatio"] = repr(round(usage.used / usage.total, 4)) if usage.total else "0.0"
        except OSError:
            pass  # the data directory is unreadable: the key is left out rather than guessed
        return table
