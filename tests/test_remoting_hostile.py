"""Hostile input against the remoting layer, over real sockets on 127.0.0.1: a trickle after one
frame, pipelined requests whose answers are never read, failures that would log a traceback per
request, nesting meant to exhaust the parser, integers out of Java's ranges, request codes a
binary header cannot hold. Each test states the bound and checks it from outside the code.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from broker.localgroup import LocalBrokerGroup
from client.producer import Producer
from remoting import (
    FrameDecoder,
    ProtocolError,
    RemotingClient,
    RemotingCommand,
    RemotingCommandError,
    RemotingConfig,
    RemotingError,
    RemotingServer,
    RequestCode,
    ResponseCode,
    encode_command,
)
from remoting import dispatcher as dispatcher_module
from remoting.dispatcher import Deferred
from remoting.jsonbody import MAX_JSON_DEPTH, json_depth_exceeds, load_body, loads_bounded
from remoting.message import Message
from remoting.protocol import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
)

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")
HB = RequestCode.HEART_BEAT


def run(coro: Awaitable[T], timeout: float = 30.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def echo(conn: Any, req: RemotingCommand) -> RemotingCommand:
    return req.make_response(headers=req.headers, body=req.body)


async def serve(config: RemotingConfig, processors: dict[int, Any] | None = None) -> RemotingServer:
    server = RemotingServer("127.0.0.1", 0, config)
    for code, processor in (processors or {HB: echo}).items():
        server.register_processor(code, processor)
    await server.start()
    return server


def request_frame(code: int = HB, opaque: int = 1, body: bytes = b"", **headers: Any) -> bytes:
    cmd = RemotingCommand.request(code, headers, body)
    cmd.opaque = opaque
    return encode_command(cmd)


async def read_frames(reader: asyncio.StreamReader, n: int, timeout: float = 5.0) -> list[Any]:
    """Read until ``n`` frames are decoded, the peer closes or ``timeout`` passes."""
    dec, out = FrameDecoder(max_body_bytes=64 << 20), []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            chunk = await asyncio.wait_for(reader.read(1 << 20), left)
        except (TimeoutError, ConnectionError):
            break
        if not chunk:
            break
        out += dec.feed(chunk)
    return out


async def closed_by_server(reader: asyncio.StreamReader, within_s: float) -> bool:
    """Whether the server closes the connection within ``within_s`` (reading whatever it sends)."""
    deadline = time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            if not await asyncio.wait_for(reader.read(1 << 20), left):
                return True
        except TimeoutError:
            return False
        except ConnectionError:
            return True
    return False


async def wait_until(cond: Callable[[], bool], within_s: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + within_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(step)
    return True


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# --- 1. a frame once begun must complete in time -------------------------------------------------


def test_a_trickle_after_one_frame_is_cut_and_frees_its_slot() -> None:
    """Each of max_connections peers sends one good frame, then the next one a byte every 0.1 s.
    Before: they outlived idle_timeout (a frame now and then resets it) and locked everyone out.
    Now each is closed once its frame is frame_timeout_s old (its few bytes buy no more time),
    counted in LimitStats, and new clients get in."""

    async def main() -> None:
        cfg = RemotingConfig(
            max_connections=6, handshake_timeout_s=5.0, idle_timeout_s=60.0, frame_timeout_s=1.0
        )
        server = await serve(cfg)
        peers = []
        for i in range(6):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(request_frame(opaque=i))
            assert len(await read_frames(reader, 1)) == 1  # a proper client so far
            peers.append((reader, writer))
        started = time.monotonic()

        async def trickle(writer: asyncio.StreamWriter) -> None:
            for byte in request_frame(opaque=99, body=b"x" * 64)[:-1]:
                try:
                    writer.write(bytes([byte]))
                    await writer.drain()
                except ConnectionError:
                    return
                await asyncio.sleep(0.1)

        tasks = [asyncio.ensure_future(trickle(w)) for _, w in peers]
        try:
            async with RemotingClient() as client:
                with pytest.raises(RemotingError):  # every slot is taken by a trickler
                    await client.invoke_sync(server.address, RemotingCommand.request(HB), 1.0)
                assert await wait_until(lambda: server.limits.frame_timeouts == 6, 5.0), (
                    server.limits.as_dict()
                )
                assert time.monotonic() - started >= 1.0, "cut before its frame_timeout_s"
                for reader, _ in peers:
                    assert await closed_by_server(reader, 1.0)
                resp = await client.invoke_sync(server.address, RemotingCommand.request(HB), 3.0)
                assert resp.is_success
        finally:
            for task in tasks:
                task.cancel()
            for _, writer in peers:
                writer.close()
            await server.stop()

    run(main())


def test_a_large_frame_on_a_slow_honest_link_is_not_cut() -> None:
    """A 160 KiB request sent at ~100 KiB/s takes ~1.6 s, three times frame_timeout_s and
    handshake_timeout_s: as the first frame and as a later one it is served, because every byte
    received buys 1/frame_min_bytes_per_s more seconds."""

    async def main() -> None:
        cfg = RemotingConfig(handshake_timeout_s=0.5, frame_timeout_s=0.5, frame_min_bytes_per_s=64 * 1024)
        server = await serve(cfg)
        body = os.urandom(160 * 1024)
        frame = request_frame(opaque=7, body=body)
        try:
            for first in (True, False):
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                if not first:
                    writer.write(request_frame(opaque=6))
                    assert len(await read_frames(reader, 1)) == 1
                started = time.monotonic()
                for at in range(0, len(frame), 8192):
                    writer.write(frame[at : at + 8192])
                    await writer.drain()
                    await asyncio.sleep(0.08)
                assert time.monotonic() - started > 1.0
                (resp,) = await read_frames(reader, 1)
                assert resp.opaque == 7 and resp.is_success and resp.body == body
                writer.close()
            assert server.limits.frame_timeouts == 0 and server.limits.handshake_timeouts == 0
        finally:
            await server.stop()

    run(main())


def test_a_frame_waiting_while_the_server_holds_reading_is_not_timed_out() -> None:
    """The server stops reading (max_inflight_requests) with half of the next frame in: that
    frame's clock stops with it, so it is not cut for the time the server made it wait."""

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def slow(conn: Any, req: RemotingCommand) -> Deferred:
            later = Deferred()
            loop.call_later(1.2, later.answer, req.make_response())
            return later

        cfg = RemotingConfig(max_inflight_requests=1, frame_timeout_s=0.5)
        server = await serve(cfg, {HB: slow})
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        second = request_frame(opaque=2, body=b"b" * 100)
        writer.write(request_frame(opaque=1) + second[:60])
        await asyncio.sleep(1.4)  # answered at 1.2 s; the half frame has been in for 1.4 s
        writer.write(second[60:])
        frames = await read_frames(reader, 2, timeout=5.0)
        assert [f.opaque for f in frames] == [1, 2], frames
        assert server.limits.frame_timeouts == 0
        writer.close()
        await server.stop()

    run(main())


# --- 2. back-pressure: requests in flight and unread answers are bounded --------------------------


def test_requests_beyond_max_inflight_wait_unread_and_are_served_in_order() -> None:
    async def main() -> None:
        held: list[tuple[RemotingCommand, Deferred]] = []

        def hold(conn: Any, req: RemotingCommand) -> Deferred:
            later = Deferred()
            held.append((req, later))
            return later

        server = await serve(RemotingConfig(max_inflight_requests=4), {HB: hold})
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"".join(request_frame(opaque=i) for i in range(12)))
        await writer.drain()
        answered = 0
        try:
            for expected in (4, 8, 12):
                assert await wait_until(lambda e=expected: len(held) >= e, 3.0)  # type: ignore[misc]
                await asyncio.sleep(0.2)
                assert len(held) == expected, "dispatched past max_inflight_requests"
                (conn,) = server.connections
                assert conn.inflight_requests == 4 and conn.reading_paused  # at the limit
                for req, later in held[answered:]:
                    later.answer(req.make_response())
                answered = len(held)
            frames = await read_frames(reader, 12)
            assert [f.opaque for f in frames] == list(range(12))
            assert await wait_until(lambda: not conn.reading_paused, 1.0), "reads on once answered"
            assert conn.inflight_requests == 0 and conn.inflight_request_bytes == 0
            assert server.stats.reads_paused == 1  # held from the 4th request until the last was answered
        finally:
            writer.close()
            await server.stop()

    run(main())


def test_one_read_of_many_requests_is_dispatched_a_turn_at_a_time() -> None:
    """A thousand pipelined requests in one read are handled at most max_dispatch_per_turn per
    event-loop turn, so other callbacks (another peer, a timer, the ledger) run in between."""

    async def main() -> None:
        per_turn: list[int] = [0]
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def tick() -> None:  # a callback that marks each turn the loop takes
            per_turn.append(0)
            if not stop.is_set():
                loop.call_soon(tick)

        def count(conn: Any, req: RemotingCommand) -> RemotingCommand:
            per_turn[-1] += 1
            return req.make_response()

        server = await serve(RemotingConfig(max_dispatch_per_turn=100), {HB: count})
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        loop.call_soon(tick)
        writer.write(b"".join(request_frame(opaque=i) for i in range(1000)))
        await writer.drain()
        try:
            frames = await read_frames(reader, 1000, timeout=10.0)
            assert [f.opaque for f in frames] == list(range(1000))  # all answered, in order
            assert sum(per_turn) == 1000 and max(per_turn) <= 100, max(per_turn)
        finally:
            stop.set()
            writer.close()
            await server.stop()

    run(main())


def test_requests_in_flight_are_bounded_by_their_bodies_too() -> None:
    async def main() -> None:
        held: list[tuple[RemotingCommand, Deferred]] = []

        def hold(conn: Any, req: RemotingCommand) -> Deferred:
            later = Deferred()
            held.append((req, later))
            return later

        server = await serve(RemotingConfig(max_inflight_request_bytes=64 * 1024), {HB: hold})
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"".join(request_frame(opaque=i, body=b"s" * 40_000) for i in range(6)))
        await writer.drain()
        try:
            for expected in (2, 4, 6):  # 2 x 40 KB passes 64 KiB: no third until one is answered
                assert await wait_until(lambda e=expected: len(held) >= e, 3.0)  # type: ignore[misc]
                await asyncio.sleep(0.2)
                assert len(held) == expected
                for req, later in held[expected - 2 :]:
                    later.answer(req.make_response())
            assert [f.opaque for f in await read_frames(reader, 6)] == list(range(6))
        finally:
            writer.close()
            await server.stop()

    run(main())


def test_pipelined_large_answers_never_read_close_the_connection_not_the_memory() -> None:
    """60 pipelined pulls answered with ~4 MiB each, never read. Before: every answer was made
    and queued (240 MB). Now the connection is closed once its queued output passes
    max_output_bytes (64 MiB by default), and the server serves others meanwhile."""

    async def main() -> None:
        big = b"p" * (4 * 1024 * 1024 - 4096)

        async def pull(conn: Any, req: RemotingCommand) -> RemotingCommand:
            await asyncio.sleep(0)  # answered later, as a broker's pull is
            return req.make_response(body=big)

        server = await serve(RemotingConfig(), {RequestCode.PULL_MESSAGE: pull, HB: echo})
        rss0 = peak = rss_mib()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, limit=1 << 20)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        writer.transport.pause_reading()  # this peer never reads
        writer.write(b"".join(request_frame(RequestCode.PULL_MESSAGE, opaque=i) for i in range(60)))
        await writer.drain()
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline and server.limits.output_closed == 0:
            peak = max(peak, rss_mib())
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        peak = max(peak, rss_mib())
        try:
            assert server.limits.output_closed == 1, server.limits.as_dict()
            assert server.connection_count == 0
            assert peak - rss0 < 120, f"memory grew by {peak - rss0:.0f} MiB"
            async with RemotingClient() as client:
                assert (await client.invoke_sync(server.address, RemotingCommand.request(HB), 3.0)).is_success
        finally:
            writer.close()
            await server.stop()

    run(main())


def test_a_peer_that_never_reads_is_closed_at_idle_timeout_not_held_by_its_output() -> None:
    """Its reading paused, a peer that takes none of its answers delivers no frames, so
    idle_timeout_s applies; closing it must not wait for output it will never read (a close
    that flushes first kept the connection, and its slot, for ever)."""

    async def main() -> None:
        answer = b"a" * (256 * 1024)
        cfg = RemotingConfig(write_buffer_high_bytes=64 * 1024, idle_timeout_s=1.0)
        server = await serve(cfg, {RequestCode.PULL_MESSAGE: lambda c, r: r.make_response(body=answer)})
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.transport.pause_reading()
        writer.write(b"".join(request_frame(RequestCode.PULL_MESSAGE, opaque=i) for i in range(40)))
        await writer.drain()
        try:
            assert await wait_until(lambda: server.connection_count == 1, 2.0)
            (conn,) = server.connections
            assert await wait_until(lambda: conn.reading_paused, 2.0)
            assert await wait_until(lambda: server.connection_count == 0, 4.0), "held by its unsent output"
            assert server.limits.idle_closed == 1 and server.limits.output_closed == 0
        finally:
            writer.close()
            await server.stop()

    run(main())


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBrokerGroup]:
    g = LocalBrokerGroup(tmp_path, brokers=1, nameservers=1, topics=("BigTopic:1",))
    g.start()
    try:
        asyncio.run(g.wait_for_master(timeout=40))
        yield g
    finally:
        g.stop()


@pytest.mark.slow
def test_a_broker_bounds_a_consumer_that_pipelines_pulls_and_never_reads(broker: LocalBrokerGroup) -> None:
    """The reported case, against a real broker: 60 pipelined pulls of one 4 MiB message, never
    read, grew the master by 243 MB. Now its growth stays under max_output_bytes plus slack and
    the connection is closed."""
    addr = broker.broker_addr["n1"]
    pid = broker.pid(broker.name_of("n1"))
    assert pid is not None

    async def scenario() -> None:
        async with Producer("big-producer", broker.namesrv_addr_str) as producer:
            await producer.send(Message("BigTopic", os.urandom(4 * 1024 * 1024 - 64 * 1024)), queue_id=0)
        await asyncio.sleep(0.5)
        rss0 = peak = rss_mib(pid)
        host, port = addr.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        writer.transport.pause_reading()
        pull = {
            "consumerGroup": "G",
            "topic": "BigTopic",
            "queueId": 0,
            "queueOffset": 0,
            "maxMsgNums": 1,
            "sysFlag": 0,
        }
        writer.write(b"".join(request_frame(RequestCode.PULL_MESSAGE, opaque=i, **pull) for i in range(60)))
        await writer.drain()
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:
            peak = max(peak, rss_mib(pid))
            await asyncio.sleep(0.02)
        writer.transport.resume_reading()
        assert await closed_by_server(reader, 5.0), (
            "the broker kept the connection of a peer that never reads"
        )
        writer.close()
        assert peak - rss0 < 120, f"the broker grew by {peak - rss0:.0f} MiB"

    asyncio.run(asyncio.wait_for(scenario(), 60))


# --- 3. bounded logs, bounded integers, bounded nesting ------------------------------------------


def test_a_failing_processor_logs_one_traceback_then_a_summary(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 requests that make a processor raise, 300 it refuses: before, 300 tracebacks and 300
    info lines. Now one traceback (one place in the code), ten refusals, then counts in one
    summary line per ERROR_SUMMARY_PERIOD_S (and one at shutdown for what is left)."""

    def encode_flag(conn: Any, req: RemotingCommand) -> RemotingCommand:
        struct.pack(">i", int(req.headers["flag"]))  # what an unchecked out-of-range flag ends in
        return req.make_response()

    def refuse(conn: Any, req: RemotingCommand) -> RemotingCommand:
        raise RemotingCommandError("no")

    async def main() -> None:
        server = await serve(RemotingConfig(), {RequestCode.SEND_MESSAGE: encode_flag, HB: refuse})
        caplog.set_level(logging.INFO, logger="remoting.dispatcher")
        try:
            async with RemotingClient() as client:
                for code in (RequestCode.SEND_MESSAGE, HB):
                    calls = [
                        client.invoke_sync(
                            server.address, RemotingCommand.request(code, {"flag": str(1 << 40)}), 5.0
                        )
                        for _ in range(300)
                    ]
                    answers = await asyncio.gather(*calls)
                    assert {a.code for a in answers} == (
                        {ResponseCode.SYSTEM_ERROR}
                        if code == RequestCode.SEND_MESSAGE
                        else {ResponseCode.BAD_REQUEST}
                    )
        finally:
            await server.stop()  # logs the summary of what the period has not yet

    run(main())
    records = [r for r in caplog.records if r.name == "remoting.dispatcher"]
    assert sum(1 for r in records if r.exc_info) == 1, "one traceback for one place in the code"
    assert sum(1 for r in records if r.getMessage().startswith("bad request")) == 10
    (summary,) = [r.getMessage() for r in records if "not logged one by one" in r.getMessage()]
    assert "589 in the last" in summary and "SEND_MESSAGE: error at" in summary and "x299" in summary
    assert "HEART_BEAT: bad request x290" in summary
    assert len(records) == 12
    assert sum(len(r.getMessage()) for r in records) < 4000

    async def periodic() -> list[str]:  # while failures go on, one summary per period
        monkeypatch.setattr(dispatcher_module, "ERROR_SUMMARY_PERIOD_S", 0.3)
        server = await serve(RemotingConfig(), {HB: refuse})
        caplog.clear()
        try:
            async with RemotingClient() as client:
                for _ in range(8):
                    await asyncio.gather(
                        *(
                            client.invoke_sync(server.address, RemotingCommand.request(HB), 3.0)
                            for _ in range(50)
                        )
                    )
                    await asyncio.sleep(0.1)
            return [r.getMessage() for r in caplog.records if "not logged one by one" in r.getMessage()]
        finally:
            await server.stop()

    summaries = run(periodic())
    assert 2 <= len(summaries) <= 4, summaries


def test_header_int_refuses_out_of_range_values_naming_header_and_range() -> None:
    async def main() -> None:
        def send(conn: Any, req: RemotingCommand) -> RemotingCommand:
            flag = req.header_int("flag", 0, min_value=INT32_MIN, max_value=INT32_MAX)
            born = req.header_int("bornTimestamp", 0, min_value=0, max_value=INT64_MAX)
            return req.make_response(headers={"flag": flag, "born": born})

        server = await serve(RemotingConfig(), {RequestCode.SEND_MESSAGE: send})
        try:
            async with RemotingClient() as client:

                async def call(**headers: Any) -> RemotingCommand:
                    req = RemotingCommand.request(RequestCode.SEND_MESSAGE, headers)
                    return await client.invoke_sync(server.address, req, 3.0)

                ok = await call(flag=-(1 << 31), bornTimestamp=(1 << 63) - 1)
                assert ok.is_success and ok.headers == {"flag": str(-(1 << 31)), "born": str((1 << 63) - 1)}
                bad = await call(flag=1 << 40)
                assert bad.code == ResponseCode.BAD_REQUEST
                assert bad.remark == (
                    "SEND_MESSAGE: header 'flag'=1099511627776 out of range: "
                    "it must be in -2147483648..2147483647"
                )
                bad = await call(bornTimestamp=-1)
                assert bad.remark.endswith(
                    "header 'bornTimestamp'=-1 out of range: it must be in 0..9223372036854775807"
                )
                bad = await call(bornTimestamp="9" * 5000)  # past int()'s digit limit: still a clear refusal
                assert (
                    bad.code == ResponseCode.BAD_REQUEST
                    and "'bornTimestamp' must be an integer" in bad.remark
                )
            assert server.dispatcher.errors == 3
        finally:
            await server.stop()

    run(main())
    cmd = RemotingCommand.request(10, {"n": "5"})
    with pytest.raises(RemotingCommandError, match=r"'n'=5 out of range: it must be at most 4$"):
        cmd.header_int("n", max_value=4)
    with pytest.raises(RemotingCommandError, match=r"'n'=5 out of range: it must be at least 6$"):
        cmd.header_int("n", min_value=6)


def test_json_nesting_is_bounded_before_parsing() -> None:
    deep = MAX_JSON_DEPTH + 1
    assert not json_depth_exceeds("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    assert json_depth_exceeds("[" * deep + "]" * deep)
    assert json_depth_exceeds(b'{"a":' * deep + b"1" + b"}" * deep)
    assert not json_depth_exceeds('["' + "[{" * 500 + '"]'), "brackets inside strings do not count"
    assert not json_depth_exceeds('["\\"[[[' + "[" * 100 + '"]'), "nor after an escaped quote"
    assert json_depth_exceeds("[" * 1_000_000), "unmatched openers count (no recursion, no error)"
    assert not json_depth_exceeds(b"[" + b"{},[]," * 10_000 + b"1]"), "wide is not deep"
    for body in (b"[" * deep + b"]" * deep, b"[" * 200_000, b'{"a":' * 5000 + b"1" + b"}" * 5000):
        for parse in (load_body, loads_bounded):
            with pytest.raises(
                RemotingCommandError, match=f"HEART_BEAT: JSON nests deeper than {MAX_JSON_DEPTH}"
            ):
                parse(body, "HEART_BEAT")
    assert loads_bounded(b'{"a":[1,{"b":"[["}]}', "x") == {"a": [1, {"b": "[["}]}
    assert load_body(b'{"brokerAddrs":{0:"a"}}', "x") == {"brokerAddrs": {"0": "a"}}
    with pytest.raises(RemotingCommandError, match="x: body is not valid JSON"):
        loads_bounded(b"{oops", "x")
    with pytest.raises(RemotingCommandError, match="shallow: JSON nests deeper than 2"):
        loads_bounded("[[[1]]]", "shallow", max_depth=2)


def test_deeply_nested_json_is_a_bad_request_or_a_closed_stream_never_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        def heartbeat(conn: Any, req: RemotingCommand) -> RemotingCommand:
            load_body(req.body, "HEART_BEAT")
            return req.make_response()

        server = await serve(RemotingConfig(), {HB: heartbeat})
        try:
            async with RemotingClient() as client:
                for body in (b"[" * 100 + b"]" * 100, b'{"consumerDataSet":' * 200_000):
                    resp = await client.invoke_sync(
                        server.address, RemotingCommand.request(HB, body=body), 5.0
                    )
                    assert resp.code == ResponseCode.BAD_REQUEST
                    assert (
                        resp.remark
                        == f"HEART_BEAT: JSON nests deeper than {MAX_JSON_DEPTH} levels of objects and arrays; refused"
                    )
            # a JSON header nested past the bound closes that stream (its opaque cannot be trusted)
            header = b'{"code":34,"opaque":1,"flag":0,"extFields":{"a":' + b"[" * 100 + b"]" * 100 + b"}}"
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(struct.pack(">II", 4 + len(header), len(header)) + header)
            assert await closed_by_server(reader, 3.0)
            writer.close()
            assert server.stats.protocol_errors == 1
        finally:
            await server.stop()

    caplog.set_level(logging.INFO)
    run(main())
    assert not [r for r in caplog.records if r.exc_info], "no traceback for bad input"
    with pytest.raises(ProtocolError, match="JSON header nests deeper than 64"):
        header = b'{"code":34,"opaque":1,"x":' + b"[" * 65 + b"]" * 65 + b"}"
        FrameDecoder().feed(struct.pack(">II", 4 + len(header), len(header)) + header)
    with pytest.raises(ProtocolError, match="JSON header field 'flag'=1099511627776 does not fit a Java int"):
        header = b'{"code":34,"opaque":1,"flag":1099511627776}'
        FrameDecoder().feed(struct.pack(">II", 4 + len(header), len(header)) + header)


# --- 4. every request code RocketMQ uses crosses the wire -----------------------------------------

# RocketMQ 5's RequestCode, ResponseCode and RemotingSysResponseCode values (remoting module).
ROCKETMQ_REQUEST_CODES = (
    *(10, 11, 12, 13, 14, 15, 17, 18, 21, 22, 23, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36),
    *(37, 38, 39, 40, 41, 42, 43, 45, 46, 47, 60, 61, 100, 101, 102, 103, 104, 105, 106),
    *range(200, 226),
    *range(300, 330),
    *(343, 345, 351, 352, 353, 354, 355, 361, 370, 400, 401, 402, 513),
    *range(901, 909),
    *range(1001, 1014),
    *range(2001, 2005),
    *range(3001, 3011),
    *(200050, 200051, 200052, 200053, 200054, 200055, 200056, 200151),  # POP (RocketMQ 5)
)
ROCKETMQ_RESPONSE_CODES = (
    *range(0, 30),
    *range(200, 216),
    *(501, 604, 1500),
    *range(2000, 2017),
    *(3001, 3002),
    *(-1000, -1002, -1004, -1006),  # the Java client's own RPC_* codes
)


@pytest.mark.parametrize("stype", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ])
def test_every_rocketmq_code_round_trips_in_both_serialisations(stype: int) -> None:
    decoder = FrameDecoder()
    for code in ROCKETMQ_REQUEST_CODES:
        frame = encode_command(RemotingCommand.request(code, {"k": "v"}, b"body"), serialize_type=stype)
        (got,) = decoder.feed(frame)
        assert (got.code, got.headers, got.body, got.is_response) == (code, {"k": "v"}, b"body", False)
        # a binary header holds a Java short: a code beyond it is sent with a JSON header
        # (Java's writeShort would keep the low 16 bits: 200050 would arrive as 3442)
        fits = -(1 << 15) <= code < 1 << 15
        assert got.serialize_type == (stype if fits else SERIALIZE_JSON)
        assert frame[4] == got.serialize_type
    for code in ROCKETMQ_RESPONSE_CODES:
        resp = RemotingCommand.response(code, "why", opaque=5)
        (got,) = decoder.feed(encode_command(resp, serialize_type=stype))
        assert (got.code, got.remark, got.opaque, got.is_response) == (code, "why", 5, True)


def test_a_pop_code_is_served_to_a_binary_client() -> None:
    async def main() -> None:
        seen: list[int] = []

        def pop(conn: Any, req: RemotingCommand) -> RemotingCommand:
            seen.append(req.code)
            return req.make_response(headers={"got": req.code})

        server = await serve(RemotingConfig(), {200050: pop, 200151: pop})
        try:
            async with RemotingClient(RemotingConfig(serialize_type=SERIALIZE_ROCKETMQ)) as client:
                for code in (200050, 200151):
                    resp = await client.invoke_sync(server.address, RemotingCommand.request(code), 3.0)
                    assert resp.is_success and resp.headers["got"] == str(code)
            assert seen == [200050, 200151]
        finally:
            await server.stop()

    run(main())
