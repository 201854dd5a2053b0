"""Operation timeouts by one sweeper per loop (jepsen.workloads.op_deadlines) and ``attempt``'s
use of them: a hung operation becomes info (fail for a read), a finished one is untouched,
and a shutdown's cancellation is never mistaken for a timeout."""

from __future__ import annotations

import asyncio
import random

import pytest

from jepsen.history import History
from jepsen.systems.clients import Definite
from jepsen.workloads.base import RunContext, attempt
from jepsen.workloads.op_deadlines import OpDeadlines

pytestmark = pytest.mark.timeout(60)


def context(tmp_path, op_timeout: float) -> RunContext:  # type: ignore[no-untyped-def]
    return RunContext(
        History(tmp_path / "h.jsonl"),
        random.Random(1),
        deadline=0.0,
        rate=0.0,
        clients=1,
        op_timeout=op_timeout,
    )


async def hang() -> int:
    await asyncio.sleep(3600)
    return 1


async def value(v: int, delay: float = 0.0) -> int:
    await asyncio.sleep(delay)
    return v


async def definite() -> int:
    raise Definite("refused")


def test_hung_operations_time_out_as_info_or_fail_and_others_are_untouched(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ctx = context(tmp_path, op_timeout=0.2)

    async def main() -> list[tuple[str, object, object]]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = await asyncio.gather(
            attempt(ctx, hang()),
            attempt(ctx, hang(), read_only=True),
            attempt(ctx, value(7, 0.05)),
            attempt(ctx, definite()),
        )
        elapsed = loop.time() - started
        assert 0.2 <= elapsed < 0.2 + 0.1 + 0.5  # the timeout plus at most one resolution (and slack)
        # a finished operation leaves no cancellation behind: the same task sleeps on undisturbed
        after = await attempt(ctx, value(8, 0.1))
        assert after == ("ok", 8, None)
        await asyncio.sleep(0.3)
        assert ctx.op_deadlines()._sweeper is None  # nothing running: the sweeper ended
        return list(results)

    hung, hung_read, ok, failed = asyncio.run(main())
    assert hung[0] == "info" and "timed out after 0.2s" in str(hung[2])
    assert hung_read[0] == "fail"
    assert ok == ("ok", 7, None)
    assert failed == ("fail", None, "refused")
    assert ctx.op_deadlines().expired_total == 2


def test_a_shutdown_cancel_propagates_even_when_the_deadline_also_passed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ctx = context(tmp_path, op_timeout=0.1)

    async def main() -> None:
        op = asyncio.create_task(attempt(ctx, hang()))
        await asyncio.sleep(0.02)
        op.cancel()  # a shutdown, before the deadline
        with pytest.raises(asyncio.CancelledError):
            await op

        deadlines = ctx.op_deadlines()
        second = asyncio.create_task(attempt(ctx, hang()))
        await asyncio.sleep(0.02)
        assert deadlines.expire_due(asyncio.get_running_loop().time() + 1) == 1  # its deadline passed...
        second.cancel()  # ...and a shutdown asks too, before the task could run
        with pytest.raises(asyncio.CancelledError):
            await second

    asyncio.run(main())


def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        OpDeadlines(0)


def test_an_operation_with_its_own_timeout_outlives_the_op_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A final drain reads the whole log back (millions of pairs at full rate: seconds), so it has
    its own limit (``--drain-timeout``); the per-operation timeout must not cut it short."""
    ctx = context(tmp_path, op_timeout=0.1)

    async def main() -> list[tuple[str, object, object]]:
        return list(
            await asyncio.gather(
                attempt(ctx, value(5, 0.4), read_only=True, timeout=2.0),  # 4x the op timeout: ok
                attempt(ctx, hang(), read_only=True, timeout=0.3),
                attempt(ctx, hang(), timeout=0.3),
                attempt(ctx, definite(), read_only=True, timeout=1.0),
            )
        )

    slow, hung_read, hung, failed = asyncio.run(main())
    assert slow == ("ok", 5, None)
    assert hung_read == ("fail", None, "timed out after 0.3s")
    assert hung == ("info", None, "timed out after 0.3s")
    assert failed == ("fail", None, "refused")
    assert ctx.op_deadlines().expired_total == 0  # none of them went through the sweeper
