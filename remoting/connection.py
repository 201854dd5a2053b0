"""One TCP connection speaking the frame protocol, used by both the server and the client.

Both directions share one class because RocketMQ's protocol is symmetric: a broker answers a
producer's requests but also asks a client things (CHECK_TRANSACTION_STATE), so either end
may send requests and responses on the same connection.

Hot-path choices, because the broker pushes tens of thousands of frames a second through here:
- an ``asyncio.Protocol`` rather than streams: ``data_received`` decodes in place and resolves
  response futures directly, with no task per frame;
- outgoing frames are queued and written once per event-loop iteration (a server's replies
  also once ``reply_flush_bytes`` wait), so a burst of responses becomes few ``send()`` calls;
- per-call timeouts are deadlines in one heap per connection with one loop timer armed for
  the earliest (RocketMQ scans its response table instead), not a timer handle or a
  ``wait_for`` task per call: an answered call costs a heap push and nothing to cancel.

Back-pressure on a server connection, so that its memory stays bounded whatever the peer does:
- requests in flight (dispatched, not yet answered; remoting.dispatcher counts them) are
  bounded by ``max_inflight_requests`` and by their bodies, ``max_inflight_request_bytes``;
- answers the peer does not take fill the transport past ``write_buffer_high_bytes``.
Either way reading from the peer is paused, and the requests already decoded from the last
read wait undispatched (the backlog: at most one read's worth), until answers are made and
taken; only then are they dispatched and reading resumes. Pausing reads alone was not enough:
a read holds many pipelined requests, and each one dispatched adds its answer to the output
(60 pipelined pulls of a 4 MiB message queued 240 MB for a peer that never read). What is
already dispatched can still overshoot, so a connection whose queued output passes
``max_output_bytes`` is closed.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import socket
import sys
from collections import deque
from collections.abc import Callable
from typing import Protocol

from remoting.codes import ResponseCode, request_code_name
from remoting.config import RemotingConfig
from remoting.exceptions import (
    FrameEncodeError,
    ProtocolError,
    RemotingConnectionClosedError,
    RemotingFrameError,
    RemotingSendRequestError,
    RemotingTimeoutError,
)
from remoting.protocol import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    BadFrame,
    FrameDecoder,
    RemotingCommand,
    encode_parts,
)

log = logging.getLogger("remoting.connection")


class RequestDispatcher(Protocol):
    """Where a server-side connection hands each request (remoting.dispatcher implements it)."""

    def dispatch(self, conn: RemotingConnection, request: RemotingCommand) -> None: ...


def not_supported(request: RemotingCommand) -> RemotingCommand:
    return request.make_response(
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        f"request code {request.code} ({request_code_name(request.code)}) not supported",
    )


ResponseCallback = Callable[[RemotingCommand | None, BaseException | None], None]
"""Called with (response, None) or (None, error) exactly once per async invoke."""

_OPAQUE_MASK = 0x7FFFFFFF  # RocketMQ's opaque is a Java int


class LogBudget:
    """Says whether the n-th occurrence of something a peer can repeat at will gets a log line:
    the first ``first`` do, then one every ``every``, so a flood costs a few lines, never one
    per event. The caller puts the count so far in the line it logs."""

    __slots__ = ("first", "every", "count")

    def __init__(self, first: int = 10, every: int = 1000) -> None:
        self.first = first
        self.every = every
        self.count = 0

    def take(self) -> bool:
        self.count += 1
        return self.count <= self.first or self.count % self.every == 0


# over every connection of the process, so a peer that reconnects gets no fresh budget
_protocol_errors_logged = LogBudget()
_bad_frames_logged = LogBudget()
_output_overflows_logged = LogBudget()


class RemotingStats:
    """Counters shared by the connections of one server or client; read by metrics on scrape."""

    __slots__ = (
        "connections_opened",
        "connections_closed",
        "frames_in",
        "frames_out",
        "writes",
        "bad_frames",
        "protocol_errors",
        "timeouts",
        "reads_paused",
    )

    def __init__(self) -> None:
        self.connections_opened = 0
        self.connections_closed = 0
        self.frames_in = 0
        self.frames_out = 0
        self.writes = 0  # transport writes: frames_out / writes is how well output is coalesced
        self.bad_frames = 0
        self.protocol_errors = 0
        self.timeouts = 0
        self.reads_paused = 0  # times a server stopped reading a peer for back-pressure

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class _Pending:
    __slots__ = ("future", "callback", "code", "timeout_s")

    def __init__(
        self,
        future: asyncio.Future[RemotingCommand] | None,
        callback: ResponseCallback | None,
        code: int,
        timeout_s: float,
    ) -> None:
        self.future = future
        self.callback = callback
        self.code = code
        self.timeout_s = timeout_s

    def complete(self, response: RemotingCommand | None, error: BaseException | None) -> None:
        """Hand the outcome over, then let go of the future and callback: the deadline heap
        keeps answered entries until it is pruned (up to a few hundred), and through the
        future each would keep its whole response alive (a pull's body is up to megabytes)."""
        fut, callback = self.future, self.callback
        self.future = self.callback = None
        if fut is not None:
            if not fut.done():
                if error is None:
                    fut.set_result(response)  # type: ignore[arg-type]
                else:
                    fut.set_exception(error)
        elif callback is not None:
            try:
                callback(response, error)
            except Exception:
                log.exception("response callback raised", extra={"code": request_code_name(self.code)})


class RemotingConnection(asyncio.Protocol):
    """Frame-level connection: decode, dispatch requests, match responses by opaque."""

    # Slots: every frame reads a dozen of these. With more than 30 attributes CPython 3.11 gives
    # an instance its own dict instead of the class's shared keys, and every attribute read on
    # the hot path gets slower (a server connection has 44).
    __slots__ = (
        "config",
        "dispatcher",
        "stats",
        "side",
        "_on_open",
        "_on_lost",
        "_decoder",
        "_loop",
        "_transport",
        "_pending",
        "_next_opaque",
        "_deadlines",
        "_deadline_seq",
        "_deadline_timer",
        "_deadline_at",
        "_out",
        "_out_bytes",
        "_flush_at",
        "_flush_scheduled",
        "_writable",
        "_congested",
        "_output_limit",
        "_max_inflight",
        "_max_inflight_bytes",
        "inflight_requests",
        "inflight_request_bytes",
        "_backlog",
        "_dispatch_budget",
        "reading_paused",
        "_release_scheduled",
        "_closed",
        "_closed_future",
        "_bad_frames",
        "remote_addr",
        "local_addr",
        "close_reason",
        "rpc_hook",
        "__weakref__",
    )

    def __init__(
        self,
        config: RemotingConfig,
        dispatcher: RequestDispatcher | None,
        stats: RemotingStats,
        *,
        side: str,
        on_open: Callable[[RemotingConnection], None] | None = None,
        on_lost: Callable[[RemotingConnection], None] | None = None,
    ) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.stats = stats
        self.side = side
        self._on_open = on_open
        self._on_lost = on_lost
        self._decoder = FrameDecoder(config.max_body_bytes, config.max_header_bytes, config.verify_crc)
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, _Pending] = {}
        self._next_opaque = 1
        # (deadline, sequence, opaque, call) of calls sent; answered ones are dropped lazily
        self._deadlines: list[tuple[float, int, int, _Pending]] = []
        self._deadline_seq = 0
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_at = math.inf  # when the timer fires (inf: not armed)
        self._out: list[bytes | bytearray | memoryview] = []
        self._out_bytes = 0
        # replies are written in pieces of this size (RemotingConfig.reply_flush_bytes); a
        # client's requests wait for the end of the turn, so one read carries them all
        self._flush_at = config.reply_flush_bytes if side == "server" else 0
        self._flush_scheduled = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._congested = False  # the transport holds more than write_buffer_high_bytes unsent
        self._output_limit = config.output_limit_bytes
        # back-pressure (a server's only: a client must always read its responses)
        serving = side == "server"
        self._max_inflight = config.max_inflight_requests if serving else sys.maxsize
        self._max_inflight_bytes = config.max_inflight_request_bytes if serving else sys.maxsize
        self._dispatch_budget = config.max_dispatch_per_turn if serving else sys.maxsize
        self.inflight_requests = 0  # dispatched, not yet answered: remoting.dispatcher counts them
        self.inflight_request_bytes = 0  # ... and their bodies
        self._backlog: deque[RemotingCommand] | None = None  # set while reading is paused
        self.reading_paused = False  # reading from the peer is paused for back-pressure
        self._release_scheduled = False
        self._closed = False
        self._closed_future: asyncio.Future[None] = self._loop.create_future()
        self._bad_frames = 0
        self.remote_addr = "?"
        self.local_addr = "?"
        self.close_reason: str | None = None
        # RocketMQ's RPCHook: called on each request before it is sent (remoting.acl signs with it)
        self.rpc_hook: Callable[[RemotingCommand], None] | None = None

    # --- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        self.remote_addr = _format_addr(transport.get_extra_info("peername"))
        self.local_addr = _format_addr(transport.get_extra_info("sockname"))
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - not every socket family has it
                pass
        transport.set_write_buffer_limits(high=self.config.write_buffer_high_bytes)
        self.stats.connections_opened += 1
        if self._on_open is not None:
            self._on_open(self)

    def data_received(self, data: bytes) -> None:
        try:
            events = self._decoder.feed(data)
        except ProtocolError as exc:
            self.stats.protocol_errors += 1
            if _protocol_errors_logged.take():
                log.warning(
                    "closing connection: %s",
                    exc,
                    extra={
                        "peer": self.remote_addr,
                        "side": self.side,
                        "local": self.local_addr,
                        "so_far": _protocol_errors_logged.count,
                    },
                )
            self.close(f"protocol error: {exc}")
            return
        stats = self.stats
        stats.frames_in += len(events)
        pending = self._pending
        budget = self._dispatch_budget  # requests dispatched in this loop turn, at most
        for ev in events:
            if type(ev) is RemotingCommand:
                if ev.flags & FLAG_RESPONSE:
                    entry = pending.pop(ev.opaque, None)
                    if entry is not None:
                        entry.complete(ev, None)
                    else:
                        log.debug(
                            "response for unknown opaque %d (timed out?)",
                            ev.opaque,
                            extra={"peer": self.remote_addr},
                        )
                elif self._backlog is not None:
                    self._backlog.append(ev)  # reading is paused; this waits its turn
                elif self.dispatcher is not None:
                    self.dispatcher.dispatch(self, ev)
                    budget -= 1
                    if (
                        self.inflight_requests >= self._max_inflight
                        or self.inflight_request_bytes >= self._max_inflight_bytes
                    ):
                        self._hold()
                    elif budget <= 0:  # the rest of this read waits for the next turn
                        self._hold()
                        self.release_soon()
                else:
                    if not ev.flags & FLAG_ONEWAY:
                        self.send(not_supported(ev))
            else:
                self._on_bad_frame(ev)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._writable.set()  # wake writers so they see the closed state
        reason = self.close_reason or (f"{type(exc).__name__}: {exc}" if exc else "closed by peer")
        self.close_reason = reason
        self.stats.connections_closed += 1
        pending, self._pending = self._pending, {}
        self._deadlines.clear()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer, self._deadline_at = None, math.inf
        for opaque, entry in pending.items():
            entry.complete(
                None,
                RemotingConnectionClosedError(
                    f"connection {self.local_addr}->{self.remote_addr} closed ({reason}) while "
                    f"{request_code_name(entry.code)} opaque={opaque} was in flight; outcome unknown"
                ),
            )
        self._out.clear()
        if self._backlog is not None:
            self._backlog.clear()
        if not self._closed_future.done():
            self._closed_future.set_result(None)
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception("connection-lost listener raised", extra={"peer": self.remote_addr})

    def pause_writing(self) -> None:
        # The peer is not reading: stop taking its requests (server) and make callers wait (client).
        self._congested = True
        self._writable.clear()
        if self.side == "server" and self.dispatcher is not None:
            self._hold()

    def resume_writing(self) -> None:
        self._congested = False
        self._writable.set()
        if self._backlog is not None:
            self.release_soon()

    # --- back-pressure (server) -----------------------------------------------------------
    def _hold(self) -> None:
        """Stop reading the peer; requests decoded meanwhile wait in the backlog."""
        if self._backlog is not None:
            return
        self._backlog = deque()
        self.reading_paused = True
        self.stats.reads_paused += 1
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.pause_reading()

    def _can_take(self) -> bool:
        return (
            not self._congested
            and self.inflight_requests < self._max_inflight
            and self.inflight_request_bytes < self._max_inflight_bytes
        )

    def release_soon(self) -> None:
        """A request in flight was answered or output drained: see, on the next loop turn,
        whether waiting requests can go on (the dispatcher calls this while reading is paused)."""
        if not self._release_scheduled:
            self._release_scheduled = True
            self._loop.call_soon(self._release)

    def _release(self) -> None:
        """Dispatch waiting requests while the limits allow, then read on once none wait."""
        self._release_scheduled = False
        backlog = self._backlog
        if backlog is None or self.closing or self.dispatcher is None:
            return
        dispatch = self.dispatcher.dispatch
        budget = self._dispatch_budget
        while backlog:
            if not self._can_take():
                return
            if budget <= 0:  # other callbacks (timers, the ledger, other peers) run first
                self.release_soon()
                return
            dispatch(self, backlog.popleft())
            budget -= 1
            if self.closing:
                return
        if not self._can_take():
            return
        self._backlog = None
        self.reading_paused = False
        transport = self._transport
        if transport is not None:
            transport.resume_reading()

    def _output_overflow(self, queued: int) -> None:
        """Queued output passed ``max_output_bytes``: the peer makes requests whose answers it
        does not take, faster than pausing its reads stops them. Close it; memory comes first."""
        if _output_overflows_logged.take():
            log.warning(
                "closing connection: %d bytes of output queued, over max_output_bytes=%d; "
                "the peer does not read its answers",
                queued,
                self._output_limit,
                extra={
                    "peer": self.remote_addr,
                    "side": self.side,
                    "so_far": _output_overflows_logged.count,
                },
            )
        self.abort(f"{queued} bytes of output queued, over max_output_bytes={self._output_limit}")

    # --- state ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def closing(self) -> bool:
        """Closed, or closing: nothing more can be sent."""
        return self._closed or self._transport is None or self._transport.is_closing()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def writable(self) -> bool:
        return self._writable.is_set()

    async def wait_writable(self) -> None:
        await self._writable.wait()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed_future)

    def close(self, reason: str = "closed locally") -> None:
        """Close after flushing queued output; in-flight calls fail with RemotingConnectionClosedError."""
        if self.close_reason is None:
            self.close_reason = reason
        if self._transport is not None and not self._transport.is_closing():
            self._flush()
            self._transport.close()

    def abort(self, reason: str = "aborted") -> None:
        if self.close_reason is None:
            self.close_reason = reason
        if self._transport is not None:
            self._transport.abort()

    # --- output ---------------------------------------------------------------------------
    def send(self, cmd: RemotingCommand) -> None:
        """Queue a frame (response, or request with opaque set); written at the end of this loop
        turn, or a server's replies once ``reply_flush_bytes`` of them wait."""
        if self.closing:
            raise RemotingSendRequestError(
                f"connection {self.local_addr}->{self.remote_addr} is closed ({self.close_reason or 'closing'})"
            )
        if len(cmd.body) > self.config.max_body_bytes:
            raise FrameEncodeError(
                f"{request_code_name(cmd.code)} body of {len(cmd.body)} bytes exceeds max_body_bytes="
                f"{self.config.max_body_bytes}"
            )
        head, body = encode_parts(cmd, crc=self.config.send_crc, serialize_type=self.config.serialize_type)
        out = self._out
        out.append(head)
        if body:
            out.append(body)
        self.stats.frames_out += 1
        if self._flush_at:
            self._out_bytes += len(head) + len(body)
            if self._out_bytes >= self._flush_at:
                self._write_out()
                return
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._write_out()

    def _write_out(self) -> None:
        """Hand what is queued to the transport (one write)."""
        self._out_bytes = 0
        out = self._out
        if not out:
            return
        transport = self._transport
        if transport is None or transport.is_closing():
            out.clear()
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self.stats.writes += 1
        transport.write(data)
        if self._congested:  # pause_writing ran (maybe in this write): only then can it be over
            queued = transport.get_write_buffer_size()
            if queued > self._output_limit:
                self._output_overflow(queued)

    def _allocate_opaque(self) -> int:
        opaque = self._next_opaque
        while opaque in self._pending:  # only after 2**32 calls with one stuck in flight
            opaque = (opaque + 1) & _OPAQUE_MASK
        self._next_opaque = (opaque + 1) & _OPAQUE_MASK
        return opaque

    def invoke(
        self,
        request: RemotingCommand,
        timeout_s: float,
        callback: ResponseCallback | None = None,
        *,
        call_timeout_s: float | None = None,
    ) -> asyncio.Future[RemotingCommand] | None:
        """Send a request and return a future for its response (or call ``callback`` instead).

        Errors while sending raise here; timeouts and a lost connection arrive through the
        future or the callback.
        """
        if timeout_s <= 0:
            raise RemotingTimeoutError(
                f"no time left to send {request_code_name(request.code)} to {self.remote_addr}"
            )
        opaque = self._allocate_opaque()
        request.opaque = opaque
        request.flags &= ~(FLAG_RESPONSE | FLAG_ONEWAY)
        future = self._loop.create_future() if callback is None else None
        # call_timeout_s: the caller's whole budget (connect time included), shown in the timeout error
        entry = _Pending(
            future, callback, request.code, timeout_s if call_timeout_s is None else call_timeout_s
        )
        if self.rpc_hook is not None:
            self.rpc_hook(request)
        self.send(request)  # raises before registering: nothing to clean up
        pending = self._pending
        pending[opaque] = entry
        deadlines = self._deadlines
        if len(deadlines) > 2 * len(pending) + 256:  # mostly answered calls: keep it small
            deadlines[:] = [d for d in deadlines if pending.get(d[2]) is d[3]]
            heapq.heapify(deadlines)
        deadline = self._loop.time() + timeout_s
        self._deadline_seq += 1
        heapq.heappush(deadlines, (deadline, self._deadline_seq, opaque, entry))
        if deadline < self._deadline_at:
            self._arm(deadline)
        return future

    def _arm(self, when: float) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_at = when
        self._deadline_timer = self._loop.call_at(when, self._expire)

    def _expire(self) -> None:
        """The earliest deadline passed: time out every call still waiting past its own, then
        arm the timer for the earliest call still waiting (answered ones are dropped)."""
        self._deadline_timer, self._deadline_at = None, math.inf
        now = self._loop.time()
        deadlines, pending = self._deadlines, self._pending
        while deadlines:
            deadline, _, opaque, entry = deadlines[0]
            if pending.get(opaque) is not entry:
                heapq.heappop(deadlines)  # answered (or failed) already
            elif deadline <= now:
                heapq.heappop(deadlines)
                self._on_timeout(opaque)
            else:
                self._arm(deadline)
                return

    def invoke_oneway(self, request: RemotingCommand) -> None:
        request.opaque = self._allocate_opaque()
        request.flags = (request.flags | FLAG_ONEWAY) & ~FLAG_RESPONSE
        if self.rpc_hook is not None:
            self.rpc_hook(request)
        self.send(request)

    def _on_timeout(self, opaque: int) -> None:
        entry = self._pending.pop(opaque, None)
        if entry is None:
            return
        self.stats.timeouts += 1
        entry.complete(
            None,
            RemotingTimeoutError(
                f"no response to {request_code_name(entry.code)} opaque={opaque} from {self.remote_addr} "
                f"within {entry.timeout_s:.3g}s; the request may or may not have been processed"
            ),
        )

    # --- refused frames -------------------------------------------------------------------
    def _on_bad_frame(self, bad: BadFrame) -> None:
        self.stats.bad_frames += 1
        self._bad_frames += 1
        if _bad_frames_logged.take():
            log.warning(
                "refused frame: %s",
                bad.reason,
                extra={
                    "peer": self.remote_addr,
                    "side": self.side,
                    "code": bad.code,
                    "opaque": bad.opaque,
                    "response": bad.is_response,
                    "refused_so_far": self._bad_frames,  # on this connection
                    "refused_in_process": _bad_frames_logged.count,
                },
            )
        if bad.is_response:
            entry = self._pending.pop(bad.opaque, None)
            if entry is not None:
                entry.complete(
                    None, RemotingFrameError(f"response from {self.remote_addr} refused: {bad.reason}")
                )
        elif not bad.is_oneway and not self.closing:
            response = RemotingCommand.response(bad.response_code, bad.reason, opaque=bad.opaque)
            response.serialize_type = bad.serialize_type
            self.send(response)


def _format_addr(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = str(addr[0])
        return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"
    return str(addr)
