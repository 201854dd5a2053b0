"""Strict helpers for the JSON bodies of requests and responses.

Bodies come from the network, so every field is type-checked and a failure names the exact
path (``topicConfigTable.orders.perm``): a broker sending a bad registration must learn what
to fix, and the nameserver must never be left holding half-parsed state.

Nesting is bounded before anything is parsed (``MAX_JSON_DEPTH``): Python's JSON parser
recurses once per level, so a body of a few KiB of ``[`` would otherwise end in a
RecursionError (or, under a raised recursion limit, a crashed interpreter) deep inside the
parser. ``loads_bounded`` is the one parse every network JSON in the project should go through.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping
from typing import Any

from remoting.exceptions import RemotingCommandError

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_loads = json.JSONDecoder().decode


def dump_body(obj: Any) -> bytes:
    return _dumps(obj).encode()


MAX_JSON_DEPTH = 64
"""Deepest nesting of objects and arrays a JSON body or header from the network may have.
RocketMQ's deepest bodies (routes, consumer running info, registrations) nest 4-5 levels."""

_JSON_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')  # deleted by bytes.translate
_INNERMOST_PAIR = re.compile(rb"[\[{][\]}]")


def json_depth_exceeds(data: bytes | bytearray | memoryview | str, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON ``data`` nests objects and arrays deeper than ``max_depth``.

    Decided without recursion, by C-speed passes over the bytes (UTF-8 never puts the ASCII
    bytes it looks at inside a multi-byte character): data with no more opening brackets than
    ``max_depth`` cannot be deeper (two counts, the usual case); otherwise escapes are removed,
    then everything but brackets and quotes, then the strings (what lies between a pair of
    quotes), and the brackets left are peeled one level of innermost pairs per pass, at most
    ``max_depth`` + 1 passes. Brackets left unmatched (invalid JSON, which the parse then
    refuses) count as levels too, so ``[[[[...`` is refused as too deep. About a quarter of
    the parse's own time on a large body with many brackets; nothing on a small one.
    """
    if isinstance(data, str):
        if data.count("{") + data.count("[") <= max_depth:
            return False
        raw = data.encode()
    else:
        raw = data if type(data) is bytes else bytes(data)
        if raw.count(b"{") + raw.count(b"[") <= max_depth:
            return False
    if b"\\" in raw:
        raw = _JSON_ESCAPE.sub(b"", raw)
    kept = raw.translate(None, _NOT_STRUCTURE)
    if b'"' in kept:
        kept = b"".join(kept.split(b'"')[::2])  # the even pieces lie outside strings
    depth = 0
    while kept:
        kept, pairs = _INNERMOST_PAIR.subn(b"", kept)
        if not pairs:  # only unmatched brackets are left: each opener is one more level
            return depth + kept.count(b"{") + kept.count(b"[") > max_depth
        depth += 1
        if depth > max_depth:
            return True
    return False


def _bounded_text(data: bytes | bytearray | memoryview | str, what: str, max_depth: int) -> str:
    """``data`` as text, refused unless UTF-8 and nested at most ``max_depth`` deep."""
    if json_depth_exceeds(data, max_depth):
        raise RemotingCommandError(
            f"{what}: JSON nests deeper than {max_depth} levels of objects and arrays; refused"
        )
    try:
        return data if isinstance(data, str) else bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RemotingCommandError(f"{what}: body is not valid UTF-8 JSON: {exc}") from None


def loads_bounded(
    data: bytes | bytearray | memoryview | str, what: str, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """Parse JSON from the network: RemotingCommandError (answered BAD_REQUEST) naming ``what``
    when it is not UTF-8 JSON or nests deeper than ``max_depth``; never a RecursionError."""
    text = _bounded_text(data, what, max_depth)
    try:
        return _loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: only under a tiny recursion limit
        raise RemotingCommandError(f"{what}: body is not valid JSON: {exc}") from None


def load_body(body: bytes | bytearray | memoryview, what: str) -> Any:
    """Parse a JSON body as ``loads_bounded`` does, also taking fastjson's unquoted integer
    map keys; RemotingCommandError (BAD_REQUEST) names ``what`` on failure."""
    if not body:
        raise RemotingCommandError(f"{what}: body is empty, expected JSON")
    text = _bounded_text(body, what, MAX_JSON_DEPTH)
    try:
        return _loads(text)
    except (ValueError, RecursionError) as exc:
        try:  # Java RocketMQ (fastjson) writes integer map keys unquoted: {"brokerAddrs":{0:"..."}}
            return _loads(quote_numeric_keys(text))
        except (ValueError, RecursionError):
            pass
        raise RemotingCommandError(f"{what}: body is not valid UTF-8 JSON: {exc}") from None


_STRING_OR_NUMERIC_KEY = re.compile(r'"(?:[^"\\]|\\.)*"|([{,]\s*)(-?\d+)(\s*:)')


def quote_numeric_keys(text: str) -> str:
    """fastjson's ``{0:"a"}`` -> ``{"0":"a"}``; string contents are left alone."""

    def fix(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return match.group(0)
        return f'{match.group(1)}"{match.group(2)}"{match.group(3)}'

    return _STRING_OR_NUMERIC_KEY.sub(fix, text)


def inflate(body: bytes | bytearray | memoryview, limit: int, what: str) -> bytes:
    """Decompress a zlib body, refusing to expand past ``limit`` bytes (a zip bomb costs us nothing)."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(bytes(body), limit)
    except zlib.error as exc:
        raise RemotingCommandError(f"{what}: compressed body is not valid zlib data: {exc}") from None
    if d.unconsumed_tail or not d.eof:
        if d.unconsumed_tail:
            raise RemotingCommandError(f"{what}: compressed body expands past the {limit}-byte limit")
        raise RemotingCommandError(f"{what}: compressed body is truncated")
    return out


def deflate(data: bytes) -> bytes:
    return zlib.compress(data, 5)


class Fields:
    """Typed access to one JSON object, with errors that give the field's path."""

    __slots__ = ("obj", "path")

    def __init__(self, obj: Any, path: str) -> None:
        if not isinstance(obj, Mapping):
            raise RemotingCommandError(f"{path} must be a JSON object, got {type(obj).__name__}")
        self.obj = obj
        self.path = path

    def _err(self, key: str, expected: str, value: Any) -> RemotingCommandError:
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return RemotingCommandError(f"{self.path}.{key} must be {expected}, got {shown}")

    def get_str(self, key: str, default: Any = ..., *, allow_empty: bool = False, max_len: int = 1024) -> Any:
        value = self.obj.get(key)
        if value is None:
            if default is ...:
                raise RemotingCommandError(f"{self.path}.{key} is missing")
            return default
        if not isinstance(value, str) or (not allow_empty and not value) or len(value) > max_len:
            raise self._err(
                key, f"a {'' if allow_empty else 'non-empty '}string of at most {max_len} chars", value
            )
        return value

    def get_int(self, key: str, default: Any = ..., *, lo: int | None = None, hi: int | None = None) -> Any:
        value = self.obj.get(key)
        if value is None:
            if default is ...:
                raise RemotingCommandError(f"{self.path}.{key} is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._err(key, "an integer", value)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self._err(key, f"an integer in [{lo}, {hi}]", value)
        return value

    def get_bool(self, key: str, default: Any = ...) -> Any:
        value = self.obj.get(key)
        if value is None:
            if default is ...:
                raise RemotingCommandError(f"{self.path}.{key} is missing")
            return default
        if not isinstance(value, bool):
            raise self._err(key, "true or false", value)
        return value

    def get_obj(self, key: str, default: Any = ...) -> Any:
        value = self.obj.get(key)
        if value is None:
            if default is ...:
                raise RemotingCommandError(f"{self.path}.{key} is missing")
            return default
        if not isinstance(value, Mapping):
            raise self._err(key, "a JSON object", value)
        return value

    def get_list(self, key: str, default: Any = ...) -> Any:
        value = self.obj.get(key)
        if value is None:
            if default is ...:
                raise RemotingCommandError(f"{self.path}.{key} is missing")
            return default
        if not isinstance(value, list):
            raise self._err(key, "a JSON array", value)
        return value
