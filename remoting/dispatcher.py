"""Route incoming requests to processors by request code, RocketMQ's processor table.

A processor is any callable ``(connection, request) -> response``. It may return:
- a RemotingCommand or None: sent at once, with no task created (the nameserver's case);
- an ``asyncio.Future``: answered from its done-callback, still no task (a broker can hand
  back the future of a ledger append and let the commit complete it);
- a coroutine or other awaitable: run as a task.
None means "no response" (the processor answered itself, or will later via ``conn.send``).

A processor may be given its own ProcessorPool, RocketMQ's per-processor executor: a bound
on concurrency plus a bounded queue, beyond which requests are answered SYSTEM_BUSY instead of
piling up, and optionally a thread executor for processors that block.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from remoting.codes import ResponseCode, request_code_name
from remoting.exceptions import RemotingCommandError, RemotingError
from remoting.protocol import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand

if TYPE_CHECKING:
    from remoting.connection import RemotingConnection

log = logging.getLogger("remoting.dispatcher")

ProcessorResult = RemotingCommand | None | Awaitable[RemotingCommand | None]
Processor = Callable[["RemotingConnection", RemotingCommand], ProcessorResult]


def not_supported(request: RemotingCommand) -> RemotingCommand:
    return request.make_response(
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        f"request code {request.code} ({request_code_name(request.code)}) not supported",
    )


def error_response(request: RemotingCommand, exc: BaseException) -> RemotingCommand:
    """BAD_REQUEST for a request the processor refused as malformed, SYSTEM_ERROR for anything else."""
    if isinstance(exc, RemotingCommandError):
        return request.make_response(ResponseCode.BAD_REQUEST, str(exc))
    return request.make_response(
        ResponseCode.SYSTEM_ERROR, f"{request_code_name(request.code)} failed: {type(exc).__name__}: {exc}"
    )


class ProcessorPool:
    """Concurrency limit plus bounded queue for one or more processors (RocketMQ's executor per processor)."""

    def __init__(
        self,
        name: str,
        max_concurrency: int = 16,
        max_queue: int = 10_000,
        executor: Executor | None = None,
    ) -> None:
        if max_concurrency < 1 or max_queue < 0:
            raise ValueError(f"pool {name}: max_concurrency must be >= 1 and max_queue >= 0")
        self.name = name
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.executor = executor
        self._sem: asyncio.Semaphore | None = None
        self.admitted = 0  # running + queued
        self.rejected = 0

    @property
    def full(self) -> bool:
        return self.admitted >= self.max_concurrency + self.max_queue

    async def run(self, processor: Processor, conn: RemotingConnection, request: RemotingCommand) -> Any:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.max_concurrency)
        async with self._sem:
            if self.executor is not None:
                # Blocking processors run in threads; they must not touch ``conn`` (not thread-safe).
                result = await asyncio.get_running_loop().run_in_executor(
                    self.executor, processor, conn, request
                )
            else:
                result = processor(conn, request)
            if inspect.isawaitable(result):
                result = await result
            return result


class _Entry:
    __slots__ = ("processor", "pool", "reject")

    def __init__(self, processor: Processor, pool: ProcessorPool | None) -> None:
        self.processor = processor
        self.pool = pool
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

    def register(self, code: int, processor: Processor, pool: ProcessorPool | None = None) -> None:
        """Handle ``code`` with ``processor``; a later registration for the same code replaces it."""
        self._table[int(code)] = _Entry(processor, pool)

    def register_default(self, processor: Processor, pool: ProcessorPool | None = None) -> None:
        """Handle every code without its own processor (instead of REQUEST_CODE_NOT_SUPPORTED)."""
        self._default = _Entry(processor, pool)

    def dispatch(self, conn: RemotingConnection, request: RemotingCommand) -> None:
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
        pool = entry.pool
        if pool is not None:
            if pool.full:
                pool.rejected += 1
                self.busy += 1
                self._reply(
                    conn,
                    request,
                    request.make_response(
                        ResponseCode.SYSTEM_BUSY,
                        f"[OVERLOAD] pool {pool.name} has {pool.admitted} requests in progress or queued, try again later",
                    ),
                )
                return
            pool.admitted += 1
            self._spawn(conn, request, pool.run(entry.processor, conn, request), pool)
            return
        try:
            result = entry.processor(conn, request)
        except Exception as exc:
            self._failed(conn, request, exc)
            return
        if result is None or type(result) is RemotingCommand:
            self._reply(conn, request, result)  # type: ignore[arg-type]
        elif isinstance(result, asyncio.Future):
            result.add_done_callback(lambda fut: self._future_done(conn, request, fut))
        elif inspect.isawaitable(result):
            self._spawn(conn, request, result, None)
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
        pool: ProcessorPool | None,
    ) -> None:
        task = asyncio.ensure_future(self._await(conn, request, awaitable, pool))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _await(
        self,
        conn: RemotingConnection,
        request: RemotingCommand,
        awaitable: Awaitable[Any],
        pool: ProcessorPool | None,
    ) -> None:
        try:
            result = await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(conn, request, exc)
            return
        finally:
            if pool is not None:
                pool.admitted -= 1
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
        if isinstance(exc, RemotingCommandError):
            log.info("bad request: %s", exc, extra={"peer": conn.remote_addr, "code": request.code})
        else:
            log.error(
                "processor for %s raised",
                request_code_name(request.code),
                exc_info=exc,
                extra={"peer": conn.remote_addr, "code": request.code, "server": self.name},
            )
        self._reply(conn, request, error_response(request, exc))

    def _reply(
        self, conn: RemotingConnection, request: RemotingCommand, response: RemotingCommand | None
    ) -> None:
        if response is None or request.flags & FLAG_ONEWAY or conn.closing:
            return
        if type(response) is not RemotingCommand:
            response = error_response(
                request, TypeError(f"processor returned {type(response).__name__}, not a RemotingCommand")
            )
        response.opaque = request.opaque
        response.flags |= FLAG_RESPONSE
        try:
            conn.send(response)
        except RemotingError as exc:
            if conn.closing:
                return
            # e.g. the response body is over the limit: tell the caller instead of leaving it to time out
            self.errors += 1
            log.error("cannot send response: %s", exc, extra={"peer": conn.remote_addr, "code": request.code})
            conn.send(request.make_response(ResponseCode.SYSTEM_ERROR, f"response could not be sent: {exc}"))

    async def shutdown(self) -> None:
        """Cancel requests still being processed (their callers see the connection close)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
