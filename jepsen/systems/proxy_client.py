"""The queue workload's client through RocketMQ 5's gRPC proxy: SendMessage, ReceiveMessage, AckMessage.

A 5.x client has no pull offsets: it receives what its consumer group has not yet
consumed, each message invisible to the group for a while, and acks it; a message received
and not acked comes back once its invisible time is over (at least once). The queue
workload judges each queue as a log (docs/history.md): a ``poll`` from offset ``from``
returns the pairs from there, in order, fewer than asked only at the end. This client keeps
that contract honestly over receive/ack:

- Every history key (queue) is one topic of one queue on the brokers (``queue_topic``), so a
  receive of that topic reads exactly that queue (the proxy receives from every queue of a
  topic at once, as RocketMQ's does).
- Each position a worker polls from is one consumer group, positioned there by its own acks
  (a group sees every message of the topic, as RocketMQ's groups each consume everything).
  A poll takes the group that stands at ``from`` (a fresh one at offset 0), receives until it
  holds the run from ``from`` on, returns and acks that run, and puts the group back at the
  run's end. Received messages past the run stay buffered (in flight) for the next poll.
- A redelivery is an un-acked message coming back: when it lies below ``from`` the worker has
  already read it in an ``ok`` poll whose ack was lost, so it is acked again and counted
  (``redelivered``), not reported again; at or above ``from`` it is simply read. A message the
  group never gets while later ones arrive is reported as it is: a poll past the gap, which
  the checker calls ``poll-skip``, once the gap outlived two invisible times.
- ``drain`` reads the whole queue with a fresh group.

Sends map the proxy's status codes to ``ok``/``fail``/``info``: only an answer saying the
message was refused before it was stored (a bad request, an unknown topic) is a definite
failure; a timeout, a lost connection or the proxy's PROXY_TIMEOUT (the brokers' outcome
unknown) is indefinite.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from jepsen.systems.clients import Definite, Indefinite, Pair, decode_value, encode_int

#: how long a received, un-acked message stays invisible to its group (the proxy's minimum is 1 s)
INVISIBLE_MS = 1_500
#: the longest a receive waits for a message when none is there yet (a gap being waited out)
GAP_POLL_MS = 500
#: a gap (a later offset received, an earlier one not) waited out this long is reported as it is
GAP_WAIT_S = 2 * INVISIBLE_MS / 1000 + 0.5
#: messages one ReceiveMessage asks for (the proxy's bound) and entries one AckMessage names
RECEIVE_BATCH = 32
ACK_BATCH = 1024
#: messages one SendMessage carries (the proxy's bound): larger batches go as several requests
SEND_CHUNK = 64
#: receives one poll may make before it answers with what it holds
MAX_RECEIVES_PER_POLL = 64
#: consumer groups one client keeps positions for (one per worker position in use)
MAX_GROUPS = 1024
#: messages a group may hold received and not yet returned
MAX_BUFFERED = 4 * RECEIVE_BATCH
#: offsets per group whose ack was not confirmed, remembered to tell a lost ack's redelivery
#: from an acked message coming back
MAX_UNCONFIRMED = 4096
#: receives a drain may make (each up to RECEIVE_BATCH messages)
MAX_DRAIN_RECEIVES = 200_000
#: empty receives in a row after which a drain with no gap is complete
DRAIN_EMPTY_ROUNDS = 2
#: status codes saying the proxy refused the message before storing it (a definite failure)
DEFINITE_SEND_CODES = frozenset(
    {
        "BAD_REQUEST",
        "ILLEGAL_TOPIC",
        "ILLEGAL_MESSAGE_ID",
        "ILLEGAL_MESSAGE_TAG",
        "ILLEGAL_MESSAGE_KEY",
        "ILLEGAL_MESSAGE_GROUP",
        "ILLEGAL_MESSAGE_PROPERTY_KEY",
        "MESSAGE_PROPERTIES_TOO_LARGE",
        "MESSAGE_BODY_TOO_LARGE",
        "TOPIC_NOT_FOUND",
        "UNAUTHORIZED",
        "FORBIDDEN",
        "MESSAGE_CORRUPTED",
    }
)


def queue_topic(topic: str, queue_id: int) -> str:
    """The brokers' topic that holds the history key ``<topic>/<queue_id>``: one queue each."""
    return f"{topic}-q{queue_id}"


@dataclass
class _Delivery:
    value: Any
    message_id: str
    handle: str


@dataclass
class _Group:
    """One consumer group and what it holds received but not yet returned by a poll."""

    name: str
    buffer: dict[int, _Delivery] = field(default_factory=dict)
    #: offsets returned by a poll whose ack was not confirmed: they may come back
    unconfirmed: set[int] = field(default_factory=set)
    #: more than MAX_UNCONFIRMED were unconfirmed at once: any redelivery is let through
    lenient: bool = False
    #: acked messages that came back, reported with the next pairs this group returns
    returned: list[Pair] = field(default_factory=list)


class ProxyQueueClient:
    """Producer and simple consumer of the run's queues through one or more gRPC proxies.

    One instance per harness process (``shared``): its channels, and the consumer groups it
    has positioned, serve every worker of the process. ``proxies``: name -> ``host:port``;
    requests go round-robin, and a proxy that does not answer is left for the next one.
    """

    def __init__(self, proxies: dict[str, str], topic: str, timeout: float) -> None:
        if not proxies:
            raise ValueError("no proxy to talk to")
        self.proxies = dict(proxies)
        self.topic = topic
        self.timeout = timeout
        self.node: str | None = None
        self.redelivered = 0  # messages received again below a poll's start (their ack was lost)
        self.ack_failures = 0
        self._tag = f"jepsen-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._serial = itertools.count(1)
        self._ids = itertools.count(1)
        self._rr = itertools.cycle(sorted(self.proxies))
        self._stubs: dict[str, Any] = {}
        self._channels: list[Any] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        #: (queue, position) -> groups standing there, free to take
        self._free: dict[tuple[int, int], list[_Group]] = {}
        self._groups = 0

    # ------------------------------------------------------------------ channels
    def _stub(self) -> tuple[str, Any]:
        """The next proxy's stub (channels are made on the running loop, once)."""
        import grpc

        from proxy.protocol import sgrpc

        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._stubs.clear()
            self._channels.clear()
            self._loop = loop
        name = next(self._rr)
        stub = self._stubs.get(name)
        if stub is None:
            channel = grpc.aio.insecure_channel(self.proxies[name])
            self._channels.append(channel)
            stub = self._stubs[name] = sgrpc.MessagingServiceStub(channel)
        self.node = name
        return name, stub

    async def close(self) -> None:
        """Nothing per call: the shared instance's channels close with ``close_all``."""

    async def close_all(self) -> None:
        channels, self._channels = self._channels, []
        self._stubs.clear()
        for ch in channels:
            await ch.close()

    # ------------------------------------------------------------------ sends
    def _message(self, topic: str, value: int) -> Any:
        from proxy.protocol import pb

        m = pb.Message(topic=pb.Resource(name=topic), body=encode_int(value))
        m.system_properties.message_id = f"01{self._tag[7:].replace('-', 'F')}{next(self._ids):016X}".upper()
        m.system_properties.message_type = pb.MessageType.NORMAL
        m.system_properties.body_encoding = pb.Encoding.IDENTITY
        return m

    async def send(self, queue_id: int, value: int) -> int:
        offsets, _node = await self.send_batch(queue_id, [value])
        return offsets[0]

    async def send_batch(self, queue_id: int, values: list[int]) -> tuple[list[int], str | None]:
        """Offsets of ``values``; the proxy stores each message of a request on its own, so a
        batch larger than one request, or one with mixed outcomes, is indefinite as a whole."""
        chunks = [values[i : i + SEND_CHUNK] for i in range(0, len(values), SEND_CHUNK)]
        results = await asyncio.gather(
            *(self._send_chunk(queue_id, c) for c in chunks), return_exceptions=True
        )
        offsets: list[int] = []
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            if len(errors) == len(results) and all(isinstance(e, Definite) for e in errors):
                raise errors[0]
            first = errors[0]
            raise first if isinstance(first, Indefinite) else Indefinite(f"{type(first).__name__}: {first}")
        for r in results:
            assert isinstance(r, list)
            offsets += r
        return offsets, self.node

    async def _send_chunk(self, queue_id: int, values: list[int]) -> list[int]:
        import grpc

        from proxy.protocol import pb, spb

        topic = queue_topic(self.topic, queue_id)
        req = spb.SendMessageRequest(messages=[self._message(topic, v) for v in values])
        _name, stub = self._stub()
        try:
            resp = await stub.SendMessage(req, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise Indefinite(f"SendMessage: {exc.code().name}: {exc.details()}") from None
        codes = [pb.Code.Name(e.status.code) for e in resp.entries]
        if len(resp.entries) != len(values):
            raise Indefinite(f"SendMessage answered {len(resp.entries)} entries for {len(values)} messages")
        if all(c == "OK" for c in codes):
            return [int(e.offset) for e in resp.entries]
        bad = next(e.status for e in resp.entries if e.status.code != pb.Code.OK)
        why = f"SendMessage: {pb.Code.Name(bad.code)}: {bad.message}"
        if all(c in DEFINITE_SEND_CODES for c in codes):
            raise Definite(why)
        raise Indefinite(why)

    # ------------------------------------------------------------------ receive / ack
    async def _receive(self, group: str, topic: str, batch: int, poll_ms: int) -> list[tuple[int, _Delivery]]:
        """One ReceiveMessage: (queue offset, delivery) of what came, in the order it came."""
        import grpc

        from proxy.protocol import pb, spb

        req = spb.ReceiveMessageRequest(
            group=pb.Resource(name=group),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
            filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
            batch_size=max(1, min(batch, RECEIVE_BATCH)),
        )
        req.invisible_duration.FromMilliseconds(INVISIBLE_MS)
        req.long_polling_timeout.FromMilliseconds(poll_ms)
        _name, stub = self._stub()
        out: list[tuple[int, _Delivery]] = []
        status = None
        try:
            async for answer in stub.ReceiveMessage(req, timeout=poll_ms / 1000 + self.timeout):
                if answer.HasField("status"):
                    status = answer.status
                elif answer.HasField("message"):
                    m = answer.message
                    sp = m.system_properties
                    out.append(
                        (
                            int(sp.queue_offset),
                            _Delivery(decode_value(m.body), sp.message_id, sp.receipt_handle),
                        )
                    )
        except grpc.aio.AioRpcError as exc:
            raise Indefinite(f"ReceiveMessage: {exc.code().name}: {exc.details()}") from None
        code = pb.Code.Name(status.code) if status is not None else "NO_STATUS"
        if code in ("OK", "MESSAGE_NOT_FOUND"):
            return out
        raise Indefinite(f"ReceiveMessage: {code}: {status.message if status is not None else ''}")

    async def _ack(self, group: str, topic: str, deliveries: list[_Delivery]) -> set[str]:
        """Ack ``deliveries``; the receipt handles whose ack was not confirmed (such a message
        comes back: counted, never an error of the poll that read it)."""
        failed: set[str] = set()
        import grpc

        from proxy.protocol import pb, spb

        for i in range(0, len(deliveries), ACK_BATCH):
            part = deliveries[i : i + ACK_BATCH]
            req = spb.AckMessageRequest(
                group=pb.Resource(name=group),
                topic=pb.Resource(name=topic),
                entries=[spb.AckMessageEntry(message_id=d.message_id, receipt_handle=d.handle) for d in part],
            )
            _name, stub = self._stub()
            try:
                resp = await stub.AckMessage(req, timeout=self.timeout)
            except grpc.aio.AioRpcError:
                failed.update(d.handle for d in part)
                continue
            ok = {e.receipt_handle for e in resp.entries if e.status.code == pb.Code.OK}
            failed.update(d.handle for d in part if d.handle not in ok)
        self.ack_failures += len(failed)
        return failed

    def _take(self, queue_id: int, start: int) -> _Group:
        """The group standing at ``start`` in ``queue_id`` (a fresh one at 0), taken out."""
        free = self._free.get((queue_id, start))
        if free:
            group = free.pop()
            if not free:
                del self._free[(queue_id, start)]
            return group
        if start != 0:
            raise Definite(
                f"no consumer group of this client stands at offset {start} of queue {queue_id} "
                "(positions are the client's own: a new client starts at 0)"
            )
        if self._groups >= MAX_GROUPS:
            raise Definite(f"this client already positions {MAX_GROUPS} consumer groups")
        self._groups += 1
        return _Group(f"{self._tag}-q{queue_id}-{next(self._serial)}")

    def _put(self, queue_id: int, position: int, group: _Group) -> None:
        self._free.setdefault((queue_id, position), []).append(group)

    async def poll(self, queue_id: int, start: int, limit: int) -> list[Pair]:
        group = self._take(queue_id, start)
        run: list[Pair] = []
        try:
            run = await self._read_run(group, queue_topic(self.topic, queue_id), start, limit)
        finally:
            self._put(queue_id, run[-1][0] + 1 if run else start, group)
        return run

    async def _read_run(self, group: _Group, topic: str, start: int, limit: int) -> list[Pair]:
        """Receive until the group holds ``limit`` messages from ``start`` on, or the end of the
        queue; return them and ack them (a gap outliving GAP_WAIT_S is returned as it is)."""
        first_gap: float | None = None
        for _ in range(MAX_RECEIVES_PER_POLL):
            run_len = _run_length(group.buffer, start, limit)
            if run_len >= limit:
                break
            # a later offset held while the next one is missing: it is in flight (an answer that
            # was lost) and comes back once its invisible time is over
            waiting = any(o >= start + run_len for o in group.buffer)
            room = max(1, min(limit - run_len, MAX_BUFFERED - len(group.buffer)))
            got = await self._receive(group.name, topic, room, GAP_POLL_MS if waiting else 0)
            stale = [(o, d) for o, d in got if o < start]
            if stale:
                await self._settle(group, topic, stale)
            for o, d in got:
                if o >= start:
                    group.buffer[o] = d  # a redelivery replaces the old handle
            if got:
                continue
            if not waiting:
                break  # nothing more: the end of the queue as the master sees it now
            first_gap = first_gap if first_gap is not None else time.monotonic()
            if time.monotonic() - first_gap >= GAP_WAIT_S:
                break
        offsets = sorted(group.buffer)
        if not offsets:
            back, group.returned = group.returned, []
            return back
        begin = start if start in group.buffer else offsets[0]
        taken: list[Pair] = []
        deliveries: list[_Delivery] = []
        o = begin
        while o in group.buffer and len(taken) < limit:
            d = group.buffer.pop(o)
            taken.append((o, d.value))
            deliveries.append(d)
            o += 1
        failed = await self._ack(group.name, topic, deliveries)
        self._remember(group, [o for (o, _), d in zip(taken, deliveries, strict=True) if d.handle in failed])
        back, group.returned = group.returned, []
        return [*back, *taken]

    async def _settle(self, group: _Group, topic: str, stale: list[tuple[int, _Delivery]]) -> None:
        """Messages below the poll's start came back. One whose ack was not confirmed is a
        redelivery (at least once): acked again, counted. One whose ack was confirmed is an acked
        message coming back, which 5.x promises never happens: it is reported in the poll's
        answer, before the pairs from ``start``, where the checker sees the poll go backwards."""
        again = [(o, d) for o, d in stale if group.lenient or o in group.unconfirmed]
        broken = [(o, d) for o, d in stale if not (group.lenient or o in group.unconfirmed)]
        self.redelivered += len(again)
        failed = await self._ack(group.name, topic, [d for _, d in stale])
        for o, d in again:
            if d.handle not in failed:
                group.unconfirmed.discard(o)
        group.returned += [(o, d.value) for o, d in broken]

    def _remember(self, group: _Group, offsets: list[int]) -> None:
        if len(group.unconfirmed) + len(offsets) > MAX_UNCONFIRMED:
            group.lenient = True
            group.unconfirmed.clear()
        elif not group.lenient:
            group.unconfirmed.update(offsets)

    async def drain(self, queue_id: int) -> list[Pair]:
        """Every message of the queue, read by a fresh consumer group until nothing more comes
        and no offset below the highest read is missing (or the receive bound is spent)."""
        topic = queue_topic(self.topic, queue_id)
        name = f"{self._tag}-drain-q{queue_id}-{next(self._serial)}"
        seen: dict[int, Any] = {}
        empty = 0
        for _ in range(MAX_DRAIN_RECEIVES):
            gap = bool(seen) and len(seen) <= max(seen)
            got = await self._receive(name, topic, RECEIVE_BATCH, GAP_POLL_MS if gap else 0)
            if got:
                empty = 0
                for o, d in got:
                    seen[o] = d.value
                await self._ack(name, topic, [d for _, d in got])
                continue
            empty += 1
            if not gap and empty >= DRAIN_EMPTY_ROUNDS:
                break
            if gap and empty * GAP_POLL_MS / 1000 >= GAP_WAIT_S * 2:
                break  # the checker judges the hole
        return sorted(seen.items())


def _run_length(buffer: dict[int, _Delivery], start: int, limit: int) -> int:
    """How many consecutive offsets from ``start`` the buffer holds (up to ``limit``)."""
    n = 0
    while n < limit and start + n in buffer:
        n += 1
    return n
