"""Route incoming requests to processors by request code, RocketMQ's processor table.

A processor is any callable ``(connection, request) -> response``. It may return:
- a RemotingCommand or None: sent at once, with no task created (the nameserver's case);
- an ``asyncio.Future``: answered from its done-callback, still no task (a broker can hand
  back the future of a ledger append and let the commit complete it);
- a ``Deferred``: answered when the processor calls its ``answer`` from some callback,
  with no future, task or loop turn in between (a broker answers a send from the ledger's
  commit callback this way: it is on the path of every message);
- a coroutine or other awaitable: run as a task.
None means "no response" (the processor answered itself, or will later via ``conn.send``).

Every request is counted on its connection from dispatch until its answer is made (whatever
the kind of result; a processor answering later through ``conn.send`` is done when it
returns None): a server stops reading a connection with too many (remoting.connection).

A failing processor costs a bounded amount of log whatever a peer sends: the first failure
at each place in the code is logged with its traceback, later ones only counted, and the
counts are logged in one summary line per ``ERROR_SUMMARY_PERIOD_S``. Refused requests
(RemotingCommandError, answered BAD_REQUEST) are bounded the same way, without tracebacks.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from remoting.codes import ResponseCode, request_code_name
from remoting.connection import RemotingConnection, not_supported
from remoting.exceptions import RemotingCommandError, RemotingError
from remoting.protocol import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand

log = logging.getLogger("remoting.dispatcher")

ERROR_SUMMARY_PERIOD_S = 60.0
"""Failures past the logged ones are summed up in one line at most this often."""
MAX_TRACEBACK_SITES = 64
"""Distinct (exception type, raising line) pairs whose first failure is logged with a traceback;
the set is bounded by the code, not by what peers send, but capped all the same."""
MAX_LOGGED_BAD_REQUESTS = 10
"""Refused requests (BAD_REQUEST), and answers that could not be sent, logged one by one before
only the summary counts them."""
_SUMMARY_KINDS_MAX = 32  # distinct kinds named in one summary line; the rest are summed as "other"


def error_response(request: RemotingCommand, exc: BaseException) -> RemotingCommand:
    """BAD_REQUEST for a request the processor refused as malformed, SYSTEM_ERROR for anything else."""
    if isinstance(exc, RemotingCommandError):
        return request.make_response(ResponseCode.BAD_REQUEST, str(exc))
    return request.make_response(
        ResponseCode.SYSTEM_ERROR, f"{request_code_name(request.code)} failed: {type(exc).__name__}: {exc}"
    )


class Deferred:
    """A response a processor gives later: ``answer(response)`` sends it exactly as a returned
    one would be sent (the request's opaque and serialisation; nothing for a oneway request
    or a closed connection). Only the first answer counts; one given before the processor
    has returned is sent when the dispatcher takes the Deferred back."""

    __slots__ = ("_dispatcher", "_conn", "_request", "_early", "answered")

    def __init__(self) -> None:
        self._dispatcher: RequestDispatcher | None = None
        self._conn: RemotingConnection | None = None
        self._request: RemotingCommand | None = None
        self._early: RemotingCommand | None = None
        self.answered = False

    def answer(self, response: RemotingCommand) -> None:
        if self.answered:
            return
        self.answered = True
        if self._dispatcher is None:
            self._early = response
        else:
            self._dispatcher._reply(self._conn, self._request, response)  # type: ignore[arg-type]

    def _bind(
        self, dispatcher: RequestDispatcher, conn: RemotingConnection, request: RemotingCommand
    ) -> None:
        self._dispatcher, self._conn, self._request = dispatcher, conn, request
        early, self._early = self._early, None
        if early is not None:
            dispatcher._reply(conn, request, early)


ProcessorResult = RemotingCommand | None | Deferred | Awaitable[RemotingCommand | None]
Processor = Callable[["RemotingConnection", RemotingCommand], ProcessorResult]


class _Entry:
    __slots__ = ("processor", "reject")

    def __init__(self, processor: Processor) -> None:
        self.processor = processor
        reject = getattr(processor, "reject_request", None)
        self.reject: Callable[[], bool] | None = reject if callable(reject) else None


class RequestDispatcher:
    """Processor table keyed by request code, with a default processor and per-code counters."""

    def __init__(self, name: str = "remoting") -> None:
        self.name = name
        self._table: dict[int, _Entry] = {}
        self._default: _Entry | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.requests_by_code: dict[int, int] = {}
        self.errors = 0
        self.busy = 0
        self.unsupported = 0
        self.bad_requests = 0
        self.unsendable = 0  # answers that could not be sent (e.g. a body over max_body_bytes)
        self._traceback_sites: set[tuple[str, str, int]] = set()
        self._unlogged: Counter[str] = Counter()  # failures not logged one by one, since the last summary
        self._summary: asyncio.TimerHandle | None = None

    def register(self, code: int, processor: Processor) -> None:
        """Handle ``code`` with ``processor``; a later registration for the same code replaces it."""
        self._table[int(code)] = _Entry(processor)

    def register_default(self, processor: Processor) -> None:
        """Handle every code without its own processor (instead of REQUEST_CODE_NOT_SUPPORTED)."""
        self._default = _Entry(processor)

    def dispatch(self, conn: RemotingConnection, request: RemotingCommand) -> None:
        conn.inflight_requests += 1  # until _reply: every outcome below passes through it once
        conn.inflight_request_bytes += len(request.body)
        code = request.code
        counts = self.requests_by_code
        counts[code] = counts.get(code, 0) + 1
        entry = self._table.get(code) or self._default
        if entry is None:
            self.unsupported += 1
            if (
                self.unsupported <= 10 or self.unsupported % 1000 == 0
            ):  # a broken client must not flood the log
                log.info(
                    "request code not supported",
                    extra={
                        "code": code,
                        "peer": conn.remote_addr,
                        "server": self.name,
                        "so_far": self.unsupported,
                    },
                )
            self._reply(conn, request, not_supported(request))
            return
        if entry.reject is not None and entry.reject():
            self.busy += 1
            self._reply(
                conn,
                request,
                request.make_response(
                    ResponseCode.SYSTEM_BUSY, "[REJECTREQUEST]system busy, try again later"
                ),
            )
            return
        try:
            result = entry.processor(conn, request)
        except Exception as exc:
            self._failed(conn, request, exc)
            return
        if result is None or type(result) is RemotingCommand:
            self._reply(conn, request, result)  # type: ignore[arg-type]
        elif type(result) is Deferred:
            result._bind(self, conn, request)
        elif isinstance(result, asyncio.Future):
            result.add_done_callback(lambda fut: self._future_done(conn, request, fut))
        elif inspect.isawaitable(result):
            self._spawn(conn, request, result)
        else:
            self._failed(
                conn, request, TypeError(f"processor returned {type(result).__name__}, not a RemotingCommand")
            )

    # --- completion -------------------------------------------------------------------------
    def _spawn(
        self,
        conn: RemotingConnection,
        request: RemotingCommand,
        awaitable: Awaitable[Any],
    ) -> None:
        task = asyncio.ensure_future(self._await(conn, request, awaitable))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _await(
        self,
        conn: RemotingConnection,
        request: RemotingCommand,
        awaitable: Awaitable[Any],
    ) -> None:
        try:
            result = await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(conn, request, exc)
            return
        self._reply(conn, request, result)

    def _future_done(
        self, conn: RemotingConnection, request: RemotingCommand, fut: asyncio.Future[Any]
    ) -> None:
        if fut.cancelled():
            self._failed(conn, request, RemotingError("processing was cancelled"))
            return
        exc = fut.exception()
        if exc is not None:
            self._failed(conn, request, exc)
        else:
            self._reply(conn, request, fut.result())

    def _failed(self, conn: RemotingConnection, request: RemotingCommand, exc: BaseException) -> None:
        self.errors += 1
        name = request_code_name(request.code)
        if isinstance(exc, RemotingCommandError):
            self.bad_requests += 1
            if self.bad_requests <= MAX_LOGGED_BAD_REQUESTS:
                log.info(
                    "bad request: %s",
                    exc,
                    extra={"peer": conn.remote_addr, "code": request.code, "server": self.name},
                )
            else:
                self._count_unlogged(f"{name}: bad request")
        else:
            site = _raise_site(exc)
            if site in self._traceback_sites or len(self._traceback_sites) >= MAX_TRACEBACK_SITES:
                self._count_unlogged(f"{name}: {site[0]} at {site[1]}:{site[2]}")
            else:
                self._traceback_sites.add(site)
                log.error(
                    "processor for %s raised (first time at this place: later ones are counted "
                    "in a summary every %gs)",
                    name,
                    ERROR_SUMMARY_PERIOD_S,
                    exc_info=exc,
                    extra={"peer": conn.remote_addr, "code": request.code, "server": self.name},
                )
        self._reply(conn, request, error_response(request, exc))

    def _count_unlogged(self, kind: str) -> None:
        unlogged = self._unlogged
        if kind not in unlogged and len(unlogged) >= _SUMMARY_KINDS_MAX:
            kind = "other"
        unlogged[kind] += 1
        if self._summary is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called outside the event loop (a test): say it now
                self.log_summary()
                return
            self._summary = loop.call_later(ERROR_SUMMARY_PERIOD_S, self.log_summary)

    def log_summary(self) -> None:
        """Log the failures counted since the last summary, in one line (the timer calls it)."""
        self._summary = None
        counts, self._unlogged = self._unlogged, Counter()
        if counts:
            log.warning(
                "requests failed (not logged one by one): %d in the last %gs; %s",
                sum(counts.values()),
                ERROR_SUMMARY_PERIOD_S,
                "; ".join(f"{kind} x{n}" for kind, n in counts.most_common()),
                extra={"server": self.name, "errors_so_far": self.errors},
            )

    def _reply(
        self, conn: RemotingConnection, request: RemotingCommand, response: RemotingCommand | None
    ) -> None:
        conn.inflight_requests -= 1
        conn.inflight_request_bytes -= len(request.body)
        if conn.reading_paused:
            conn.release_soon()
        if response is None or request.flags & FLAG_ONEWAY or conn.closing:
            return
        if type(response) is not RemotingCommand:
            response = error_response(
                request, TypeError(f"processor returned {type(response).__name__}, not a RemotingCommand")
            )
        response.opaque = request.opaque
        response.flags |= FLAG_RESPONSE
        response.serialize_type = request.serialize_type  # answer in the request's serialisation
        try:
            conn.send(response)
        except RemotingError as exc:
            if conn.closing:
                return
            # e.g. the response body is over the limit: tell the caller instead of leaving it to time out
            self.errors += 1
            self.unsendable += 1
            if self.unsendable <= MAX_LOGGED_BAD_REQUESTS:
                log.error(
                    "cannot send response: %s", exc, extra={"peer": conn.remote_addr, "code": request.code}
                )
            else:
                self._count_unlogged(f"{request_code_name(request.code)}: response could not be sent")
            conn.send(request.make_response(ResponseCode.SYSTEM_ERROR, f"response could not be sent: {exc}"))

    async def shutdown(self) -> None:
        """Cancel requests still being processed (their callers see the connection close)."""
        if self._summary is not None:
            self._summary.cancel()
            self.log_summary()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def _raise_site(exc: BaseException) -> tuple[str, str, int]:
    """(exception type, file, line) where ``exc`` was raised: failures from one place in the
    code get one traceback between them."""
    tb = exc.__traceback__
    if tb is None:
        return (type(exc).__name__, "?", 0)
    while tb.tb_next is not None:
        tb = tb.tb_next
    return (type(exc).__name__, os.path.basename(tb.tb_frame.f_code.co_filename), tb.tb_lineno)
