"""The frame codec: RemotingCommand and a sans-I/O decoder, testable byte for byte.

A frame is a fixed 24-byte prelude followed by three variable parts::

    offset size  field
    0      2     magic  b"LM"         (refuses a stray HTTP request or a desynchronised stream)
    2      1     version 1
    3      1     flags  bit0 response, bit1 oneway, bit2 body CRC present
    4      4     code   int32         (request code, or response code in a response)
    8      4     opaque uint32        (request id; a response carries its request's)
    12     2     remark length        uint16, UTF-8 text
    14     2     header-map length    uint16, a flat JSON object of scalars
    16     4     body length          uint32
    20     4     body CRC32           (0 unless flag bit2)
    24     ...   remark, header map, body

All lengths are known from the prelude, so a frame with an oversize body is skipped without
ever being buffered and the stream stays in step: the decoder reports it as a ``BadFrame``
(so the server can answer that request with FRAME_TOO_LARGE) and carries on. Only a bad
magic or version (where we can no longer trust any length) is fatal for the connection.

The header map is JSON, not pickle: nothing read from a socket is ever executed.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from remoting.codes import ResponseCode, request_code_name, response_code_name
from remoting.exceptions import FrameEncodeError, ProtocolError, RemotingCommandError, ResponseError

MAGIC: Final = b"LM"
VERSION: Final = 1
FLAG_RESPONSE: Final = 0x01
FLAG_ONEWAY: Final = 0x02
FLAG_CRC: Final = 0x04
_KNOWN_FLAGS: Final = FLAG_RESPONSE | FLAG_ONEWAY | FLAG_CRC

PRELUDE: Final = struct.Struct("!2sBBiIHHII")
PRELUDE_SIZE: Final = PRELUDE.size  # 24
MAX_REMARK_BYTES: Final = 0xFFFF
MAX_HEADER_WIRE_BYTES: Final = 0xFFFF
DEFAULT_MAX_BODY_BYTES: Final = 4 * 1024 * 1024
DEFAULT_MAX_HEADER_BYTES: Final = 16 * 1024

HeaderValue = str | int | float | bool | None
_SCALARS = (str, int, float, bool)
_REQUIRED: Any = object()
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_loads = json.JSONDecoder().decode


class RemotingCommand:
    """One request or response: code, opaque, flags, a small header map, a remark and a body.

    A plain slotted class rather than a dataclass so construction stays cheap on the hot path
    (the broker decodes tens of thousands of these a second).
    """

    __slots__ = ("code", "opaque", "flags", "headers", "remark", "body")

    def __init__(
        self,
        code: int,
        headers: dict[str, HeaderValue] | None = None,
        body: bytes | bytearray | memoryview = b"",
        remark: str = "",
        opaque: int = 0,
        flags: int = 0,
    ) -> None:
        self.code = code
        self.headers: dict[str, HeaderValue] = headers if headers is not None else {}
        self.body = body
        self.remark = remark
        self.opaque = opaque
        self.flags = flags

    # --- construction ---------------------------------------------------------------
    @classmethod
    def request(
        cls,
        code: int,
        headers: Mapping[str, HeaderValue] | None = None,
        body: bytes | bytearray | memoryview = b"",
        *,
        oneway: bool = False,
    ) -> RemotingCommand:
        """A request; the connection assigns the opaque when it is sent."""
        return cls(int(code), dict(headers) if headers else {}, body, "", 0, FLAG_ONEWAY if oneway else 0)

    @classmethod
    def response(
        cls,
        code: int,
        remark: str = "",
        headers: Mapping[str, HeaderValue] | None = None,
        body: bytes | bytearray | memoryview = b"",
        opaque: int = 0,
    ) -> RemotingCommand:
        return cls(int(code), dict(headers) if headers else {}, body, remark, opaque, FLAG_RESPONSE)

    def make_response(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str = "",
        headers: Mapping[str, HeaderValue] | None = None,
        body: bytes | bytearray | memoryview = b"",
    ) -> RemotingCommand:
        """The response to this request: same opaque so the sender can match it."""
        return RemotingCommand(
            int(code), dict(headers) if headers else {}, body, remark, self.opaque, FLAG_RESPONSE
        )

    # --- flags ----------------------------------------------------------------------
    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flags & FLAG_ONEWAY)

    @property
    def is_success(self) -> bool:
        return self.code == ResponseCode.SUCCESS

    def check_success(self, addr: str = "") -> RemotingCommand:
        """Return self, or raise ResponseError carrying the code and remark."""
        if self.code != ResponseCode.SUCCESS:
            raise ResponseError(self.code, self.remark, addr)
        return self

    # --- typed header access ------------------------------------------------------------
    def _missing(self, name: str) -> RemotingCommandError:
        return RemotingCommandError(f"{request_code_name(self.code)}: required header '{name}' is missing")

    def header_str(self, name: str, default: Any = _REQUIRED) -> str:
        """Header as text; raises RemotingCommandError naming the header when required and absent."""
        value = self.headers.get(name)
        if value is None:
            if default is _REQUIRED:
                raise self._missing(name)
            return default
        if isinstance(value, bool):
            return "true" if value else "false"
        return value if isinstance(value, str) else str(value)

    def header_int(
        self,
        name: str,
        default: Any = _REQUIRED,
        *,
        min_value: int | None = None,
        max_value: int | None = None,
    ) -> int:
        """Header as an int, range-checked; accepts "12" as RocketMQ's string headers do."""
        value = self.headers.get(name)
        if value is None:
            if default is _REQUIRED:
                raise self._missing(name)
            return default
        if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
            raise RemotingCommandError(
                f"{request_code_name(self.code)}: header '{name}' must be an integer, got {value!r}"
            )
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise RemotingCommandError(
                f"{request_code_name(self.code)}: header '{name}' must be an integer, got {value!r}"
            ) from None
        if (min_value is not None and number < min_value) or (max_value is not None and number > max_value):
            raise RemotingCommandError(
                f"{request_code_name(self.code)}: header '{name}'={number} out of range [{min_value}, {max_value}]"
            )
        return number

    def header_bool(self, name: str, default: Any = _REQUIRED) -> bool:
        value = self.headers.get(name)
        if value is None:
            if default is _REQUIRED:
                raise self._missing(name)
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise RemotingCommandError(
            f"{request_code_name(self.code)}: header '{name}' must be true or false, got {value!r}"
        )

    # --- misc ----------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RemotingCommand):
            return NotImplemented
        return (
            self.code == other.code
            and self.opaque == other.opaque
            and self.flags == other.flags
            and self.headers == other.headers
            and self.remark == other.remark
            and bytes(self.body) == bytes(other.body)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kind = "response" if self.is_response else ("oneway" if self.is_oneway else "request")
        name = response_code_name(self.code) if self.is_response else request_code_name(self.code)
        return (
            f"RemotingCommand({kind} {name} opaque={self.opaque} headers={self.headers!r}"
            f"{' remark=' + repr(self.remark) if self.remark else ''} body={len(self.body)}B)"
        )


@dataclass(frozen=True, slots=True)
class BadFrame:
    """A frame whose boundaries were intact but whose content was refused.

    The stream stays usable; the receiver answers a request with ``response_code`` and fails
    the pending call of a response, instead of dropping the whole connection.
    """

    opaque: int
    code: int
    flags: int
    response_code: ResponseCode
    reason: str

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flags & FLAG_ONEWAY)


# --------------------------------------------------------------------------------------
# encoding
# --------------------------------------------------------------------------------------
def encode_parts(cmd: RemotingCommand, *, crc: bool = True) -> tuple[bytes, bytes | bytearray | memoryview]:
    """Prelude+remark+header map, and the body kept separate so a large body is not copied."""
    headers = cmd.headers
    if headers:
        try:
            header_bytes = _dumps(headers).encode()
        except (TypeError, ValueError) as exc:
            raise FrameEncodeError(
                f"header map of {request_code_name(cmd.code)} is not JSON-encodable: {exc}"
            ) from None
        if len(header_bytes) > MAX_HEADER_WIRE_BYTES:
            raise FrameEncodeError(
                f"header map of {request_code_name(cmd.code)} is {len(header_bytes)} bytes, over {MAX_HEADER_WIRE_BYTES}"
            )
    else:
        header_bytes = b""
    remark_bytes = cmd.remark.encode("utf-8", "replace") if cmd.remark else b""
    if len(remark_bytes) > MAX_REMARK_BYTES:
        # A remark is for humans; cutting it is better than refusing to answer at all.
        remark_bytes = remark_bytes[: MAX_REMARK_BYTES - 3].decode("utf-8", "ignore").encode() + b"..."
    body = cmd.body
    body_len = len(body)
    flags = cmd.flags & ~FLAG_CRC
    body_crc = 0
    if crc and body_len:
        body_crc = zlib.crc32(body)
        flags |= FLAG_CRC
    try:
        head = PRELUDE.pack(
            MAGIC,
            VERSION,
            flags,
            cmd.code,
            cmd.opaque,
            len(remark_bytes),
            len(header_bytes),
            body_len,
            body_crc,
        )
    except struct.error as exc:
        raise FrameEncodeError(f"cannot encode {cmd!r}: {exc}") from None
    if remark_bytes or header_bytes:
        head = b"".join((head, remark_bytes, header_bytes))
    return head, body


def encode_command(cmd: RemotingCommand, *, crc: bool = True) -> bytes:
    """The whole frame as one bytes object."""
    head, body = encode_parts(cmd, crc=crc)
    return head + bytes(body) if body else head


# --------------------------------------------------------------------------------------
# decoding
# --------------------------------------------------------------------------------------
def _decode_headers(raw: bytes) -> dict[str, HeaderValue]:
    """Parse the header map; ValueError says what is wrong with it."""
    try:
        value = _loads(raw.decode("utf-8"))  # str input skips json's encoding sniffing
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"header map is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"header map must be a JSON object, got {type(value).__name__}")
    for key, item in value.items():
        if item is not None and not isinstance(item, _SCALARS):
            raise ValueError(
                f"header '{key}' must be a string, number, boolean or null, got {type(item).__name__}"
            )
    return value


class FrameDecoder:
    """Feed bytes in, get RemotingCommand / BadFrame objects out; no I/O, no clocks.

    Memory is bounded by one prelude plus the largest acceptable frame: sizes are checked as
    soon as the 24-byte prelude is in, before any of the frame is buffered.
    """

    __slots__ = (
        "max_body_bytes",
        "max_header_bytes",
        "verify_crc",
        "_buf",
        "_need",
        "_skip",
        "_error",
        "_offset",
    )

    def __init__(
        self,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        verify_crc: bool = True,
    ) -> None:
        if max_body_bytes < 0 or max_header_bytes < 0:
            raise ValueError("frame limits must be non-negative")
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = min(max_header_bytes, MAX_HEADER_WIRE_BYTES)
        self.verify_crc = verify_crc
        self._buf = bytearray()
        self._need = PRELUDE_SIZE  # bytes the buffer must hold before parsing is worth trying
        self._skip = 0  # bytes of an oversize frame still to discard
        self._error: str | None = None
        self._offset = 0  # stream offset of the buffer's first byte, for error messages

    @property
    def buffered(self) -> int:
        """Bytes held waiting for the rest of a frame."""
        return len(self._buf)

    @property
    def skipping(self) -> int:
        """Bytes of a refused frame still to be discarded."""
        return self._skip

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand | BadFrame]:
        """Consume ``data``; return every complete frame. Raises ProtocolError when the stream is unusable."""
        if self._error is not None:
            self._buf.clear()
            raise ProtocolError(self._error)
        out: list[RemotingCommand | BadFrame] = []
        with memoryview(data) as view:
            if self._skip:
                n = min(self._skip, len(view))
                self._skip -= n
                self._offset += n
                if self._skip or n == len(view):
                    return out
                view = view[n:]
            buf = self._buf
            if buf:
                buf += view
                if len(buf) < self._need:
                    return out
                consumed = self._parse(buf, out)
                del buf[:consumed]
            else:
                if len(view) < PRELUDE_SIZE:
                    buf += view
                    return out
                consumed = self._parse(view, out)
                if consumed < len(view):
                    buf += view[consumed:]
            self._offset += consumed
        return out

    def _fail(self, reason: str) -> ProtocolError:
        self._error = reason  # the buffer is still exported here; feed() drops it on the next call
        return ProtocolError(reason)

    def _parse(self, src: bytearray | memoryview, out: list[RemotingCommand | BadFrame]) -> int:
        """Parse whole frames from ``src``; return how many bytes were consumed."""
        unpack = PRELUDE.unpack_from
        end = len(src)
        pos = 0
        with memoryview(src) as mv:
            while True:
                if end - pos < PRELUDE_SIZE:
                    self._need = PRELUDE_SIZE
                    return pos
                magic, version, flags, code, opaque, rlen, hlen, blen, crc = unpack(mv, pos)
                if magic != MAGIC:
                    raise self._fail(
                        f"bad frame magic {bytes(magic)!r} at stream offset {self._offset + pos} "
                        f"(expected {MAGIC!r}): not a ledgermq peer or a desynchronised stream"
                    )
                if version != VERSION:
                    raise self._fail(
                        f"unsupported protocol version {version} at stream offset {self._offset + pos} (we speak {VERSION})"
                    )
                rest = rlen + hlen + blen
                if blen > self.max_body_bytes or hlen > self.max_header_bytes:
                    what = (
                        f"body of {blen} bytes exceeds the {self.max_body_bytes}-byte limit"
                        if blen > self.max_body_bytes
                        else f"header map of {hlen} bytes exceeds the {self.max_header_bytes}-byte limit"
                    )
                    out.append(
                        BadFrame(opaque, code, flags, ResponseCode.FRAME_TOO_LARGE, f"frame refused: {what}")
                    )
                    avail = end - pos - PRELUDE_SIZE
                    if avail >= rest:
                        pos += PRELUDE_SIZE + rest
                        continue
                    self._skip = rest - avail
                    self._need = PRELUDE_SIZE
                    return end
                total = PRELUDE_SIZE + rest
                if end - pos < total:
                    self._need = total
                    return pos
                a = pos + PRELUDE_SIZE
                remark = str(mv[a : a + rlen], "utf-8", "replace") if rlen else ""
                a += rlen
                raw_headers = bytes(mv[a : a + hlen]) if hlen else b""
                a += hlen
                body = bytes(mv[a : pos + total]) if blen else b""
                pos += total
                if flags & ~_KNOWN_FLAGS:
                    out.append(
                        BadFrame(
                            opaque, code, flags, ResponseCode.BAD_REQUEST, f"unknown flag bits 0x{flags:02x}"
                        )
                    )
                    continue
                if flags & FLAG_CRC and self.verify_crc and zlib.crc32(body) != crc:
                    out.append(
                        BadFrame(
                            opaque,
                            code,
                            flags,
                            ResponseCode.BODY_CRC_MISMATCH,
                            f"body CRC32 mismatch: frame says {crc:#010x}, body of {blen} bytes has {zlib.crc32(body):#010x}",
                        )
                    )
                    continue
                headers: dict[str, HeaderValue]
                if raw_headers:
                    try:
                        headers = _decode_headers(raw_headers)
                    except ValueError as exc:
                        out.append(BadFrame(opaque, code, flags, ResponseCode.BAD_REQUEST, str(exc)))
                        continue
                else:
                    headers = {}
                out.append(RemotingCommand(code, headers, body, remark, opaque, flags))
