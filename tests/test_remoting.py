"""The remoting protocol: the codec byte for byte, then server and client over real sockets."""

from __future__ import annotations

import asyncio
import json
import random
import struct
import sys
import time
import zlib
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

from remoting import (
    FrameDecoder,
    FrameEncodeError,
    ProtocolError,
    RemotingClient,
    RemotingCommand,
    RemotingCommandError,
    RemotingConfig,
    RemotingConnectError,
    RemotingConnectionClosedError,
    RemotingServer,
    RemotingTimeoutError,
    RequestCode,
    ResponseCode,
    encode_command,
)
from remoting.dispatcher import Deferred, RequestDispatcher
from remoting.protocol import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    PARTS_MIN_BODY,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    BadFrame,
)

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")


def run(coro: Awaitable[T], timeout: float = 20.0) -> T:
    """Run one test coroutine on a fresh loop, bounded in time."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def binary_header(
    code: int,
    opaque: int,
    *,
    flags: int = 0,
    remark: bytes = b"",
    ext: list[tuple[bytes, bytes]] | None = None,
    language: int = 3,
    version: int = 401,
) -> bytes:
    """A ROCKETMQ binary header built by hand from RocketMQSerializable's layout."""
    ext_bytes = b"".join(
        struct.pack(">H", len(k)) + k + struct.pack(">i", len(v)) + v for k, v in (ext or [])
    )
    return (
        struct.pack(">hBhii", code, language, version, opaque, flags)
        + struct.pack(">i", len(remark))
        + remark
        + struct.pack(">i", len(ext_bytes))
        + ext_bytes
    )


def frame(header: bytes, body: bytes = b"", *, stype: int = 1, total: int | None = None) -> bytes:
    """A RocketMQ frame: total length, (serialisation << 24 | header length), header, body."""
    length = 4 + len(header) + len(body) if total is None else total
    return struct.pack(">II", length, stype << 24 | len(header)) + header + body


def json_frame(obj: dict[str, Any], body: bytes = b"") -> bytes:
    return frame(json.dumps(obj, separators=(",", ":")).encode(), body, stype=0)


def crc_ext(body: bytes) -> tuple[bytes, bytes]:
    return (b"lmqBodyCrc32", str(zlib.crc32(body)).encode())


# ---------------------------------------------------------------------------------------------
# codec
# ---------------------------------------------------------------------------------------------
def test_binary_encoding_is_rocketmqs_layout() -> None:
    cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}, b"xyz")
    cmd.opaque = 0x01020304
    header = (
        (105).to_bytes(2, "big")  # code
        + bytes([3])  # language PYTHON
        + (401).to_bytes(2, "big")  # version V4_9_4
        + bytes([1, 2, 3, 4])  # opaque
        + (0).to_bytes(4, "big")  # flag
        + (0).to_bytes(4, "big")  # remark length
    )
    ext = b"\x00\x05topic\x00\x00\x00\x01T"
    assert encode_command(cmd, crc=False) == (
        (4 + len(header) + 4 + len(ext) + 3).to_bytes(4, "big")
        + (0x01000000 | len(header) + 4 + len(ext)).to_bytes(4, "big")
        + header
        + len(ext).to_bytes(4, "big")
        + ext
        + b"xyz"
    )
    assert encode_command(cmd) == frame(
        binary_header(105, 0x01020304, ext=[(b"topic", b"T"), crc_ext(b"xyz")]), b"xyz"
    )


def test_json_encoding_is_what_fastjson_writes() -> None:
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"queueId": 3, "flag": True, "skip": None})
    cmd.opaque = 7
    data = encode_command(cmd, serialize_type=SERIALIZE_JSON)
    header = (
        b'{"code":10,"extFields":{"queueId":"3","flag":"true"},"flag":0,"language":"PYTHON",'
        b'"opaque":7,"serializeTypeCurrentRPC":"JSON","version":401}'
    )
    assert data == struct.pack(">II", 4 + len(header), len(header)) + header


def test_decodes_a_java_clients_json_request() -> None:
    # What RocketMQ's Java client writes for a route lookup (fastjson, values as strings).
    data = json_frame(
        {
            "code": 105,
            "extFields": {"topic": "TopicTest"},
            "flag": 0,
            "language": "JAVA",
            "opaque": 3,
            "serializeTypeCurrentRPC": "JSON",
            "version": 401,
        }
    )
    (cmd,) = FrameDecoder().feed(data)
    assert isinstance(cmd, RemotingCommand)
    assert (cmd.code, cmd.opaque, cmd.flags, cmd.language, cmd.version) == (105, 3, 0, "JAVA", 401)
    assert cmd.headers == {"topic": "TopicTest"} and cmd.serialize_type == SERIALIZE_JSON
    # A response goes back in the request's serialisation, with every extField a string.
    resp = cmd.make_response(ResponseCode.TOPIC_NOT_EXIST, "No topic route info", {"n": 1})
    out = encode_command(resp, crc=False)
    assert out[4] == 0  # JSON
    body = json.loads(out[8:])
    assert body == {
        "code": 17,
        "extFields": {"n": "1"},
        "flag": 1,
        "language": "PYTHON",
        "opaque": 3,
        "remark": "No topic route info",
        "serializeTypeCurrentRPC": "JSON",
        "version": 401,
    }


def test_decodes_a_hand_built_binary_request_and_response() -> None:
    header = binary_header(
        11,
        99,
        flags=2,
        remark="r\u00e9".encode(),
        ext=[(b"queueId", b"2"), (b"topic", b"orders")],
        language=0,
    )
    (cmd,) = FrameDecoder().feed(frame(header, b"body"))
    assert isinstance(cmd, RemotingCommand)
    assert (cmd.code, cmd.opaque, cmd.flags, cmd.remark, cmd.body) == (11, 99, 2, "r\u00e9", b"body")
    assert cmd.is_oneway and cmd.language == "JAVA" and cmd.serialize_type == SERIALIZE_ROCKETMQ
    assert cmd.headers == {"queueId": "2", "topic": "orders"}
    assert cmd.header_int("queueId") == 2


def test_decoder_handles_every_split_point() -> None:
    cmds = [
        RemotingCommand(
            RequestCode.SEND_MESSAGE, {"topic": "orders", "queueId": 3, "flag": True}, b"m" * 300, "", 1, 0
        ),
        RemotingCommand(ResponseCode.SUCCESS, {}, b"", "ok \u00e9", 1, FLAG_RESPONSE, SERIALIZE_JSON),
        RemotingCommand(RequestCode.HEART_BEAT, {"x": None, "f": 1.5}, b"", "", 77, FLAG_ONEWAY),
    ]
    stream = b"".join(encode_command(c) for c in cmds)
    expected = [
        RemotingCommand(
            c.code,
            {
                k: str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in c.headers.items()
                if v is not None
            },
            c.body,
            c.remark,
            c.opaque,
            c.flags,
        )
        for c in cmds
    ]
    for cut in range(len(stream) + 1):
        dec = FrameDecoder()
        got = dec.feed(stream[:cut]) + dec.feed(stream[cut:])
        assert got == expected, f"split at {cut}"
        assert dec.buffered == 0
    dec = FrameDecoder()
    got = []
    for i in range(len(stream)):
        got += dec.feed(stream[i : i + 1])
    assert got == expected
    assert [c.serialize_type for c in got] == [SERIALIZE_ROCKETMQ, SERIALIZE_JSON, SERIALIZE_ROCKETMQ]


def test_unknown_serialisation_is_fatal_and_stays_fatal() -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError, match="unknown header serialisation type 47 .* stream offset 0"):
        dec.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(ProtocolError):
        dec.feed(frame(binary_header(10, 1)))


def test_bad_frame_after_good_frames_reports_offset() -> None:
    good = frame(binary_header(10, 1), b"abc")
    dec = FrameDecoder()
    assert len(dec.feed(good)) == 1
    with pytest.raises(ProtocolError, match=f"stream offset {len(good)}"):
        dec.feed(struct.pack(">II", 10, 50) + b"\x00" * 30)  # header longer than the frame


def test_unreadable_json_header_closes_the_connection() -> None:
    with pytest.raises(ProtocolError, match="unreadable JSON header"):
        FrameDecoder().feed(frame(b"{nope", stype=0))
    with pytest.raises(ProtocolError, match="shorter than its 21-byte minimum"):
        FrameDecoder().feed(frame(b"\x00\x0a\x00", stype=1))


def test_oversize_body_is_refused_before_it_is_buffered() -> None:
    dec = FrameDecoder(max_body_bytes=1024)
    header = binary_header(10, 42)
    # Only the prefix and header of a frame announcing a 1 GiB body: refused at once, nothing buffered.
    (bad,) = dec.feed(frame(header, total=4 + len(header) + (1 << 30)))
    assert isinstance(bad, BadFrame)
    assert bad.opaque == 42 and bad.response_code == ResponseCode.FRAME_TOO_LARGE
    assert "1073741824 bytes exceeds the 1024-byte limit" in bad.reason
    assert dec.buffered == 0 and dec.skipping == 1 << 30


def test_oversize_frame_is_skipped_and_the_stream_continues() -> None:
    dec = FrameDecoder(max_body_bytes=1024)
    stream = frame(binary_header(10, 1), b"x" * 5000) + frame(binary_header(11, 2), b"ok")
    out: list[Any] = []
    for i in range(0, len(stream), 700):
        out += dec.feed(stream[i : i + 700])
        assert dec.buffered <= 700 + 64
    assert isinstance(out[0], BadFrame) and out[0].opaque == 1
    assert isinstance(out[1], RemotingCommand) and out[1].opaque == 2 and out[1].body == b"ok"


def test_oversize_header_closes_the_connection() -> None:
    dec = FrameDecoder(max_header_bytes=100)
    header = binary_header(10, 5, ext=[(b"k", b"v" * 200)])
    with pytest.raises(ProtocolError, match="header of 228 bytes exceeds the 100-byte limit"):
        dec.feed(frame(header))


def test_large_bodies_collected_over_many_reads_equal_the_whole_stream() -> None:
    """Bodies from PARTS_MIN_BODY up arrive over many reads and are joined once; whatever the
    reads (sizes, bytes or buffers, frames sharing a read), the frames are those of the whole
    stream, and a large body whose CRC does not match is refused, with the stream going on."""
    rng = random.Random(7)
    big = bytes(rng.getrandbits(8) for _ in range(4096)) * 40  # 160 KiB
    cmds = [
        RemotingCommand(RequestCode.PULL_MESSAGE, {"queueId": "1"}, big, "", 1, FLAG_RESPONSE),
        RemotingCommand(RequestCode.HEART_BEAT, {}, b"small", "", 2, 0),
        RemotingCommand(RequestCode.PULL_MESSAGE, {}, big[:PARTS_MIN_BODY], "", 3, FLAG_RESPONSE),
        RemotingCommand(RequestCode.PULL_MESSAGE, {}, big[::-1], "", 4, FLAG_RESPONSE),
    ]
    frames = [bytearray(encode_command(c)) for c in cmds]
    frames[3][-1] ^= 0xFF  # the last body no longer matches its CRC
    stream = b"".join(frames)
    whole = FrameDecoder().feed(stream)
    assert [type(f) for f in whole] == [RemotingCommand, RemotingCommand, RemotingCommand, BadFrame]
    assert [f.body for f in whole[:3]] == [big, b"small", big[:PARTS_MIN_BODY]]
    assert whole[3].response_code == ResponseCode.BODY_CRC_MISMATCH and whole[3].opaque == 4
    for trial in range(30):
        dec = FrameDecoder()
        got, pos = [], 0
        while pos < len(stream):
            n = rng.choice([1, 7, 100, 4096, 65536, 200_000])
            piece = stream[pos : pos + n]
            got += dec.feed(rng.choice([bytes, bytearray, memoryview])(piece))
            pos += n
            assert dec.buffered <= len(stream)
        assert got == whole, f"trial {trial}"
        assert dec.buffered == 0


def test_crc_mismatch_is_refused_unless_verification_is_off() -> None:
    data = bytearray(frame(binary_header(10, 3, ext=[crc_ext(b"hello world")]), b"hello world"))
    data[-1] ^= 0xFF
    (bad,) = FrameDecoder().feed(bytes(data))
    assert isinstance(bad, BadFrame) and bad.response_code == ResponseCode.BODY_CRC_MISMATCH
    assert "CRC32 mismatch" in bad.reason
    (cmd,) = FrameDecoder(verify_crc=False).feed(bytes(data))
    assert isinstance(cmd, RemotingCommand) and "lmqBodyCrc32" not in cmd.headers


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (json_frame({"code": 10, "opaque": 8, "extFields": [1]}), "'extFields' must be an object"),
        (
            json_frame({"code": 10, "opaque": 8, "extFields": {"a": {"b": 1}}}),
            "extField 'a' must be a string",
        ),
        (json_frame({"code": 10, "opaque": 8, "remark": 5}), "'remark' must be a string"),
        (frame(binary_header(10, 8, ext=[(b"\xff", b"v")])), "not UTF-8"),
        (frame(binary_header(10, 8)[:-4] + struct.pack(">i", 50) + b"\x00" * 50), "extField name runs past"),
        (frame(binary_header(10, 8)[:13] + struct.pack(">i", 999) + b"\x00" * 8), "remark length 999"),
    ],
)
def test_malformed_header_content_is_a_bad_request(data: bytes, reason: str) -> None:
    out = FrameDecoder().feed(data + frame(binary_header(10, 9)))
    assert isinstance(out[0], BadFrame) and out[0].response_code == ResponseCode.BAD_REQUEST
    assert out[0].opaque == 8 and reason in out[0].reason
    assert isinstance(out[1], RemotingCommand) and out[1].opaque == 9


def test_numbers_in_json_extfields_are_tolerated_as_text() -> None:
    (cmd,) = FrameDecoder().feed(
        json_frame({"code": 10, "opaque": 1, "extFields": {"queueId": 4, "b": False}})
    )
    assert isinstance(cmd, RemotingCommand) and cmd.headers == {"queueId": "4", "b": "false"}


def test_encoder_refuses_what_it_cannot_send() -> None:
    with pytest.raises(FrameEncodeError, match="header 'x' of SEND_MESSAGE must be a string"):
        encode_command(RemotingCommand.request(10, {"x": object()}))  # type: ignore[dict-item]
    with pytest.raises(FrameEncodeError, match="header 'x' of SEND_MESSAGE must be a string"):
        encode_command(RemotingCommand.request(10, {"x": [1]}), serialize_type=SERIALIZE_JSON)  # type: ignore[dict-item]
    with pytest.raises(FrameEncodeError, match="code 2147483648 does not fit a Java int"):
        encode_command(RemotingCommand.request(1 << 31))
    long_remark = RemotingCommand.response(1, "e" * 100_000)
    (decoded,) = FrameDecoder().feed(encode_command(long_remark))
    assert decoded.remark.endswith("...") and len(decoded.remark) == 4096


def test_typed_header_access_names_the_field() -> None:
    cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, {"brokerId": "2", "n": "1.5", "b": "true"})
    assert cmd.header_int("brokerId") == 2
    assert cmd.header_bool("b") is True
    with pytest.raises(
        RemotingCommandError, match="REGISTER_BROKER: required header 'brokerName' is missing"
    ):
        cmd.header_str("brokerName")
    with pytest.raises(RemotingCommandError, match="header 'n' must be an integer"):
        cmd.header_int("n")
    with pytest.raises(RemotingCommandError, match="out of range"):
        cmd.header_int("brokerId", max_value=1)
    assert cmd.header_str("missing", "dflt") == "dflt"


# ---------------------------------------------------------------------------------------------
# server and client over sockets
# ---------------------------------------------------------------------------------------------
def echo(conn: Any, req: RemotingCommand) -> RemotingCommand:
    return req.make_response(headers=req.headers, body=req.body, remark="echo")


async def start_server(**kwargs: Any) -> RemotingServer:
    server = RemotingServer("127.0.0.1", 0, **kwargs)
    server.register_processor(RequestCode.HEART_BEAT, echo)
    await server.start()
    return server


async def raw_exchange(port: int, data: bytes, expect: int, timeout: float = 5.0) -> list[Any]:
    """Send raw bytes, read until ``expect`` decoded frames arrive (or the server closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    dec = FrameDecoder()
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < expect and time.monotonic() < deadline:
        chunk = await asyncio.wait_for(reader.read(65536), deadline - time.monotonic())
        if not chunk:
            break
        out += dec.feed(chunk)
    writer.close()
    return out


def test_sync_invoke_round_trip() -> None:
    async def main() -> None:
        server = await start_server()
        async with RemotingClient() as client:
            resp = await client.invoke_sync(
                server.address,
                RemotingCommand.request(RequestCode.HEART_BEAT, {"a": "b", "n": 3}, b"body"),
                3.0,
            )
            assert resp.is_response and resp.code == ResponseCode.SUCCESS
            assert resp.headers == {"a": "b", "n": "3"} and resp.body == b"body" and resp.remark == "echo"
        await server.stop()

    run(main())


def test_json_client_gets_json_answers_from_a_server_speaking_binary() -> None:
    async def main() -> None:
        server = await start_server()
        async with RemotingClient(RemotingConfig(serialize_type=SERIALIZE_JSON)) as client:
            resp = await client.invoke_sync(
                server.address,
                RemotingCommand.request(RequestCode.HEART_BEAT, {"n": 7, "ok": True}, b"body"),
                3.0,
            )
            assert resp.serialize_type == SERIALIZE_JSON and resp.language == "PYTHON"
            assert resp.headers == {"n": "7", "ok": "true"} and resp.body == b"body"
        async with RemotingClient() as client:
            resp = await client.invoke_sync(
                server.address, RemotingCommand.request(RequestCode.HEART_BEAT), 3.0
            )
            assert resp.serialize_type == SERIALIZE_ROCKETMQ
        with pytest.raises(ValueError, match="serialize_type"):
            RemotingConfig(serialize_type=7)
        await server.stop()

    run(main())


def test_unknown_request_code_is_answered_not_supported() -> None:
    async def main() -> None:
        server = await start_server()
        async with RemotingClient() as client:
            resp = await client.invoke_sync(server.address, RemotingCommand.request(4242), 3.0)
            assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            assert resp.remark == "request code 4242 (UNKNOWN(4242)) not supported"
            # the connection is still good
            ok = await client.invoke_sync(
                server.address, RemotingCommand.request(RequestCode.HEART_BEAT), 3.0
            )
            assert ok.is_success
        assert server.dispatcher.unsupported == 1
        await server.stop()

    run(main())


def test_default_processor_takes_unregistered_codes() -> None:
    async def main() -> None:
        server = await start_server()
        server.register_default_processor(lambda c, r: r.make_response(remark=f"default {r.code}"))
        async with RemotingClient() as client:
            resp = await client.invoke_sync(server.address, RemotingCommand.request(4242), 3.0)
            assert resp.is_success and resp.remark == "default 4242"
        await server.stop()

    run(main())


def test_processor_errors_become_responses() -> None:
    def broken(conn: Any, req: RemotingCommand) -> RemotingCommand:
        raise KeyError("boom")

    def picky(conn: Any, req: RemotingCommand) -> RemotingCommand:
        req.header_str("topic")
        return req.make_response()

    async def main() -> None:
        server = await start_server()
        server.register_processor(1, broken)
        server.register_processor(2, picky)
        async with RemotingClient() as client:
            resp = await client.invoke_sync(server.address, RemotingCommand.request(1), 3.0)
            assert resp.code == ResponseCode.SYSTEM_ERROR and "KeyError: 'boom'" in resp.remark
            resp = await client.invoke_sync(server.address, RemotingCommand.request(2), 3.0)
            assert (
                resp.code == ResponseCode.BAD_REQUEST and "required header 'topic' is missing" in resp.remark
            )
        await server.stop()

    run(main())


def test_async_processors_coroutine_and_future() -> None:
    async def coro(conn: Any, req: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(0.01)
        return req.make_response(remark="coro")

    def fut(conn: Any, req: RemotingCommand) -> asyncio.Future[RemotingCommand]:
        f: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, f.set_result, req.make_response(remark="future"))
        return f

    async def main() -> None:
        server = await start_server()
        server.register_processor(1, coro)
        server.register_processor(2, fut)
        async with RemotingClient() as client:
            a, b = await asyncio.gather(
                client.invoke_sync(server.address, RemotingCommand.request(1), 3.0),
                client.invoke_sync(server.address, RemotingCommand.request(2), 3.0),
            )
            assert (a.remark, b.remark) == ("coro", "future")
        await server.stop()

    run(main())


def test_many_requests_in_flight_on_one_connection_are_matched_by_opaque() -> None:
    async def shuffled(conn: Any, req: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(random.random() * 0.05)  # answers come back out of order
        return req.make_response(body=req.body)

    async def main() -> None:
        server = await start_server()
        server.register_processor(1, shuffled)
        async with RemotingClient() as client:
            n = 500
            resps = await asyncio.gather(
                *(
                    client.invoke_sync(server.address, RemotingCommand.request(1, body=str(i).encode()), 5.0)
                    for i in range(n)
                )
            )
            assert [r.body for r in resps] == [str(i).encode() for i in range(n)]
            assert client.connected_addresses == [server.address]
            assert server.stats.connections_opened == 1
        await server.stop()

    run(main())


@pytest.mark.parametrize("flush_bytes", [0, 4096])
def test_a_burst_of_replies_is_written_in_pieces_of_reply_flush_bytes(flush_bytes: int) -> None:
    """Replies made in one turn go out once reply_flush_bytes of them wait (so the client can
    start on the first ones), or all at the turn's end with 0; in order either way."""
    n, body = 200, b"x" * 1000

    async def main() -> None:
        server = await start_server(config=RemotingConfig(reply_flush_bytes=flush_bytes))
        frames = b"".join(
            encode_command(RemotingCommand(RequestCode.HEART_BEAT, {}, body, "", i + 1, 0)) for i in range(n)
        )
        got = await raw_exchange(server.port, frames, n)
        assert [r.opaque for r in got] == list(range(1, n + 1))
        assert all(r.body == body for r in got)
        reply_bytes = n * (len(body) + 40)
        if flush_bytes:  # at least one write per reply_flush_bytes (each a little over it)
            assert server.stats.writes >= reply_bytes // (2 * flush_bytes)
        else:  # one write per turn: no more writes than socket reads (each at least 16 KiB)
            assert server.stats.writes <= len(frames) // (16 << 10) + 1
        await server.stop()

    run(main())


def test_async_invoke_calls_back_with_response_or_error() -> None:
    async def never(conn: Any, req: RemotingCommand) -> None:
        await asyncio.sleep(10)

    async def main() -> None:
        server = await start_server()
        server.register_processor(1, never)
        async with RemotingClient() as client:
            got: list[tuple[Any, Any]] = []
            done = asyncio.Event()

            def callback(resp: RemotingCommand | None, err: BaseException | None) -> None:
                got.append((resp, err))
                if len(got) == 2:
                    done.set()

            await client.invoke_async(
                server.address, RemotingCommand.request(RequestCode.HEART_BEAT), 3.0, callback
            )
            await client.invoke_async(server.address, RemotingCommand.request(1), 0.2, callback)
            await asyncio.wait_for(done.wait(), 3.0)
            ok = next(r for r, e in got if r is not None)
            err = next(e for r, e in got if e is not None)
            assert ok.is_success
            assert isinstance(err, RemotingTimeoutError)
        await server.stop()

    run(main())


def test_oneway_gets_no_response() -> None:
    async def main() -> None:
        seen = asyncio.Event()

        def record(conn: Any, req: RemotingCommand) -> RemotingCommand:
            assert req.is_oneway
            seen.set()
            return req.make_response(remark="must not be sent")

        server = await start_server()
        server.register_processor(1, record)
        async with RemotingClient() as client:
            await client.invoke_oneway(server.address, RemotingCommand.request(1, {"k": "v"}))
            await asyncio.wait_for(seen.wait(), 3.0)
            await asyncio.sleep(0.05)
            assert client.stats.frames_in == 0 and server.stats.frames_out == 0
        await server.stop()

    run(main())


def test_timeout_then_connection_still_usable() -> None:
    async def slow(conn: Any, req: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(0.5)
        return req.make_response(remark="late")

    async def main() -> None:
        server = await start_server()
        server.register_processor(1, slow)
        async with RemotingClient() as client:
            t0 = time.monotonic()
            with pytest.raises(
                RemotingTimeoutError, match=r"within 0.1s; the request may or may not have been processed"
            ):
                await client.invoke_sync(server.address, RemotingCommand.request(1), 0.1)
            assert time.monotonic() - t0 < 0.45  # the timer fired, not the 0.5 s answer
            await asyncio.sleep(0.5)  # the late answer arrives and is dropped
            resp = await client.invoke_sync(
                server.address, RemotingCommand.request(RequestCode.HEART_BEAT), 3.0
            )
            assert resp.is_success and client.stats.timeouts == 1
        await server.stop()

    run(main())


def test_timeouts_fire_in_deadline_order_among_many_answered_calls() -> None:
    """Per-call deadlines live in one heap per connection: answered calls leave it (bounded),
    a short timeout sent after a long one still fires first, and each fires on time."""
    never: list[asyncio.Future[None]] = []

    async def hold(conn: Any, req: RemotingCommand) -> RemotingCommand:
        fut = asyncio.get_running_loop().create_future()
        never.append(fut)
        await fut
        return req.make_response()

    async def main() -> None:
        server = await start_server()
        server.register_processor(1, hold)
        async with RemotingClient() as client:
            long_call = asyncio.ensure_future(
                client.invoke_sync(server.address, RemotingCommand.request(1), 30.0)
            )
            for _ in range(5):
                await asyncio.gather(
                    *(
                        client.invoke_sync(
                            server.address, RemotingCommand.request(RequestCode.HEART_BEAT), 20.0
                        )
                        for _ in range(400)
                    )
                )
            (conn,) = client._conns.values()  # noqa: SLF001 - the bound is internal
            assert len(conn._deadlines) <= 2 * conn.in_flight + 256 + 400  # noqa: SLF001
            t0 = time.monotonic()
            with pytest.raises(RemotingTimeoutError, match=r"within 0.2s"):
                await client.invoke_sync(server.address, RemotingCommand.request(1), 0.2)
            assert 0.18 <= time.monotonic() - t0 < 1.0
            assert not long_call.done() and client.stats.timeouts == 1
            long_call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await long_call
        for fut in never:
            fut.cancel()
        await server.stop()

    run(main())


def test_an_answered_call_keeps_no_response_alive() -> None:
    """Answered calls wait in the deadline heap until it is pruned; they must not keep their
    responses (a pull's body is up to megabytes) alive there once the caller has let go."""

    def big(conn: Any, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(body=b"b" * 65536)

    async def main() -> None:
        server = await start_server()
        server.register_processor(1, big)
        async with RemotingClient() as client:
            held = []
            for _ in range(20):
                resp = await client.invoke_sync(server.address, RemotingCommand.request(1), 3.0)
                assert len(resp.body) == 65536
                await asyncio.sleep(0)  # the loop lets go of the call's last callback
                held.append(sys.getrefcount(resp) - 2)  # less this name and the call's argument
                del resp
            (conn,) = client._conns.values()  # noqa: SLF001 - the heap is internal
            assert len(conn._deadlines) >= 20  # noqa: SLF001 - answered entries, not yet pruned
            assert held == [0] * 20, f"other references held to each answered response: {held}"
        await server.stop()

    run(main())


def test_malformed_stream_drops_only_that_connection() -> None:
    async def main() -> None:
        server = await start_server()
        async with RemotingClient() as client:
            await client.invoke_sync(server.address, RemotingCommand.request(RequestCode.HEART_BEAT), 3.0)
            out = await raw_exchange(server.port, b"GET / HTTP/1.1\r\nHost: nameserver\r\n\r\n", expect=1)
            assert out == []  # closed without an answer
            assert server.stats.protocol_errors == 1
            resp = await client.invoke_sync(
                server.address, RemotingCommand.request(RequestCode.HEART_BEAT), 3.0
            )
            assert resp.is_success
        await server.stop()

    run(main())


def test_oversize_body_is_answered_and_the_connection_goes_on() -> None:
    async def main() -> None:
        server = await start_server(config=RemotingConfig(max_body_bytes=64 * 1024))
        data = frame(binary_header(RequestCode.HEART_BEAT, 11), b"z" * 100_000) + frame(
            binary_header(RequestCode.HEART_BEAT, 12), b"fine"
        )
        out = await raw_exchange(server.port, data, expect=2)
        assert [r.opaque for r in out] == [11, 12]
        assert out[0].code == ResponseCode.FRAME_TOO_LARGE
        assert "body of 100000 bytes exceeds the 65536-byte limit" in out[0].remark
        assert out[1].code == ResponseCode.SUCCESS and out[1].body == b"fine"
        assert server.stats.bad_frames == 1
        await server.stop()

    run(main())


def test_crc_mismatch_and_bad_header_are_answered() -> None:
    async def main() -> None:
        server = await start_server()
        corrupt = frame(
            binary_header(RequestCode.HEART_BEAT, 21, ext=[(b"lmqBodyCrc32", b"1234")]), b"payload"
        )
        bad_header = json_frame({"code": RequestCode.HEART_BEAT, "opaque": 22, "extFields": "nope"})
        out = await raw_exchange(server.port, corrupt + bad_header, expect=2)
        assert [(r.opaque, r.code) for r in out] == [
            (21, ResponseCode.BODY_CRC_MISMATCH),
            (22, ResponseCode.BAD_REQUEST),
        ]
        await server.stop()

    run(main())


def test_client_refuses_to_send_an_oversize_body() -> None:
    async def main() -> None:
        server = await start_server()
        async with RemotingClient(RemotingConfig(max_body_bytes=1024)) as client:
            with pytest.raises(FrameEncodeError, match="exceeds max_body_bytes=1024"):
                await client.invoke_sync(server.address, RemotingCommand.request(1, body=b"x" * 2000), 3.0)
        await server.stop()

    run(main())


def test_connect_errors_name_the_address() -> None:
    async def main() -> None:
        probe = await start_server()
        port = probe.port
        await probe.stop()  # nothing listens there now
        async with RemotingClient() as client:
            with pytest.raises(RemotingConnectError, match=f"connect to 127.0.0.1:{port} failed"):
                await client.invoke_sync(f"127.0.0.1:{port}", RemotingCommand.request(1), 2.0)
            with pytest.raises(RemotingConnectError, match="expected host:port"):
                await client.invoke_sync("no-port-here", RemotingCommand.request(1), 2.0)

    run(main())


def test_a_connect_outlived_by_its_caller_fails_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """A call's own timeout shorter than the connect timeout: the caller gets its error, and the
    connect attempt, failing later, is not logged by asyncio as an exception never retrieved."""
    import gc
    import socket

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    addr = hole.getsockname()
    filler = []
    for _ in range(4):  # a full accept queue: further connects hang until they time out
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(addr)
        except BlockingIOError:
            pass
        filler.append(c)

    async def main() -> None:
        async with RemotingClient(RemotingConfig(connect_timeout_s=0.4)) as client:
            with pytest.raises(RemotingConnectError, match=r"timed out after 0\.\d+s"):
                await client.invoke_sync(f"127.0.0.1:{addr[1]}", RemotingCommand.request(1), 0.1)
            await asyncio.sleep(0.6)  # the shared attempt fails meanwhile

    try:
        with caplog.at_level("ERROR", logger="asyncio"):
            run(main())
            gc.collect()
    finally:
        for c in filler:
            c.close()
        hole.close()
    assert "never retrieved" not in caplog.text, caplog.text


def test_in_flight_calls_fail_when_the_connection_closes_and_client_reconnects() -> None:
    async def main() -> None:
        closed: list[str] = []

        async def hang(conn: Any, req: RemotingCommand) -> None:
            await asyncio.sleep(30)

        server = await start_server()
        server.register_processor(1, hang)
        server.add_connection_listener(on_closed=lambda c: closed.append(c.remote_addr))
        port = server.port
        async with RemotingClient() as client:
            call = asyncio.ensure_future(client.invoke_sync(server.address, RemotingCommand.request(1), 10.0))
            await asyncio.sleep(0.1)
            await server.stop()
            with pytest.raises(RemotingConnectionClosedError, match="outcome unknown"):
                await call
            assert len(closed) == 1
            # same port, new server: the client's cache notices the dead connection and reconnects
            server2 = RemotingServer("127.0.0.1", port)
            server2.register_processor(RequestCode.HEART_BEAT, echo)
            await server2.start()
            resp = await client.invoke_sync(
                f"127.0.0.1:{port}", RemotingCommand.request(RequestCode.HEART_BEAT), 3.0
            )
            assert resp.is_success
            await server2.stop()

    run(main())


def test_server_can_invoke_the_client_on_the_same_connection() -> None:
    async def main() -> None:
        async def ask_back(conn: Any, req: RemotingCommand) -> RemotingCommand:
            fut = conn.invoke(RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, {"tx": "42"}), 3.0)
            answer = await fut
            return req.make_response(remark=f"client said {answer.remark}")

        server = await start_server()
        server.register_processor(RequestCode.END_TRANSACTION, ask_back)
        async with RemotingClient() as client:
            client.register_processor(
                RequestCode.CHECK_TRANSACTION_STATE,
                lambda c, r: r.make_response(remark=f"commit {r.header_str('tx')}"),
            )
            resp = await client.invoke_sync(
                server.address, RemotingCommand.request(RequestCode.END_TRANSACTION), 3.0
            )
            assert resp.remark == "client said commit 42"
        await server.stop()

    run(main())


def test_large_bodies_and_pipelined_batches() -> None:
    async def main() -> None:
        server = await start_server()
        async with RemotingClient() as client:
            big = bytes(random.getrandbits(8) for _ in range(1000)) * 3000  # 3 MB
            resp = await client.invoke_sync(
                server.address, RemotingCommand.request(RequestCode.HEART_BEAT, body=big), 5.0
            )
            assert resp.body == big
            resps = await asyncio.gather(
                *(
                    client.invoke_sync(
                        server.address, RemotingCommand.request(RequestCode.HEART_BEAT, body=b"%d" % i), 5.0
                    )
                    for i in range(2000)
                )
            )
            assert all(r.body == b"%d" % i for i, r in enumerate(resps))
        await server.stop()

    run(main())


def test_client_callers_wait_while_the_socket_is_congested() -> None:
    async def main() -> None:
        stalled: list[asyncio.StreamWriter] = []

        async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            stalled.append(writer)
            await asyncio.sleep(30)

        sink = await asyncio.start_server(never_read, "127.0.0.1", 0)
        addr = f"127.0.0.1:{sink.sockets[0].getsockname()[1]}"
        config = RemotingConfig(write_buffer_high_bytes=64 * 1024)
        async with RemotingClient(config) as client:
            body = b"b" * (1024 * 1024)
            with pytest.raises(RemotingTimeoutError, match="send buffer still full"):
                for _ in range(200):  # kernel buffers take a few MB, then the transport's fills
                    await client.invoke_async(
                        addr,
                        RemotingCommand.request(RequestCode.SEND_MESSAGE, body=body),
                        0.3,
                        lambda r, e: None,
                    )
                    await asyncio.sleep(0)  # let the queued frame reach the transport
            conn = await client.get_connection(addr)
            assert not conn.writable
        for w in stalled:
            w.close()
        sink.close()
        await sink.wait_closed()

    run(main())


def test_server_stops_reading_a_peer_that_does_not_read_and_serves_others() -> None:
    async def main() -> None:
        big = b"r" * (256 * 1024)
        server = RemotingServer("127.0.0.1", 0, RemotingConfig(write_buffer_high_bytes=64 * 1024))
        server.register_processor(RequestCode.PULL_MESSAGE, lambda c, r: r.make_response(body=big))
        server.register_processor(RequestCode.HEART_BEAT, echo)
        await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        pull = RemotingCommand.request(RequestCode.PULL_MESSAGE)
        for i in range(200):  # 50 MB of answers this peer never reads
            pull.opaque = i
            writer.write(encode_command(pull))
        await writer.drain()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and all(c.writable for c in server.connections):
            await asyncio.sleep(0.02)
        (stalled,) = server.connections
        assert not stalled.writable  # reading from it is paused, so its answers stop piling up
        async with RemotingClient() as client:
            resp = await client.invoke_sync(
                server.address, RemotingCommand.request(RequestCode.HEART_BEAT), 3.0
            )
            assert resp.is_success
        writer.close()
        await server.stop()

    run(main())


def test_processor_closing_its_connection_mid_batch_is_harmless() -> None:
    async def main() -> None:
        def hang_up(conn: Any, req: RemotingCommand) -> RemotingCommand:
            conn.close("processor hung up")
            return req.make_response()

        server = await start_server()
        server.register_processor(1, hang_up)
        bye = (
            frame(binary_header(1, 1))
            + frame(binary_header(RequestCode.HEART_BEAT, 2))
            + frame(binary_header(RequestCode.HEART_BEAT, 3))
        )
        out = await raw_exchange(server.port, bye, expect=3, timeout=2.0)
        assert out == []  # closed before any answer was flushed; nothing raised on the way
        assert server.dispatcher.errors == 0
        async with RemotingClient() as client:
            assert (
                await client.invoke_sync(server.address, RemotingCommand.request(RequestCode.HEART_BEAT))
            ).is_success
        await server.stop()

    run(main())


class _Conn:
    """Just what the dispatcher needs of a connection: where replies go."""

    remote_addr = "127.0.0.1:1"
    closing = False
    reading_paused = False

    def __init__(self) -> None:
        self.sent: list[RemotingCommand] = []
        self.inflight_requests = 0  # the dispatcher counts requests until answered
        self.inflight_request_bytes = 0

    def send(self, cmd: RemotingCommand) -> None:
        self.sent.append(cmd)


def test_a_deferred_response_is_sent_once_as_a_returned_one_would_be() -> None:
    later: list[Deferred] = []

    def deferring(conn: Any, req: RemotingCommand) -> Deferred:
        d = Deferred()
        if req.headers.get("early"):
            d.answer(req.make_response(remark="early"))  # answered before the processor returns
        later.append(d)
        return d

    dispatcher = RequestDispatcher("test")
    dispatcher.register(10, deferring)
    conn = _Conn()
    req = RemotingCommand(10, {}, opaque=41, serialize_type=SERIALIZE_JSON)
    dispatcher.dispatch(conn, req)  # type: ignore[arg-type]
    assert conn.sent == [], "nothing is sent before the processor answers"
    later[0].answer(RemotingCommand(0, remark="done"))
    later[0].answer(RemotingCommand(0, remark="again"))
    (resp,) = conn.sent
    assert resp.remark == "done" and resp.opaque == 41 and resp.is_response
    assert resp.serialize_type == SERIALIZE_JSON, "answered in the request's serialisation"

    dispatcher.dispatch(conn, RemotingCommand(10, {"early": "1"}, opaque=42))  # type: ignore[arg-type]
    assert [r.remark for r in conn.sent[1:]] == ["early"] and conn.sent[1].opaque == 42

    oneway = RemotingCommand(10, {}, opaque=43, flags=FLAG_ONEWAY)
    dispatcher.dispatch(conn, oneway)  # type: ignore[arg-type]
    later[-1].answer(RemotingCommand(0))
    assert len(conn.sent) == 2, "a oneway request gets no answer"
    assert conn.inflight_requests == 0, "every request dispatched is counted done once answered"
