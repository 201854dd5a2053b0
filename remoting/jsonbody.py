"""Strict helpers for the JSON bodies of requests and responses.

Bodies come from the network, so every field is type-checked and a failure names the exact
path (``topicConfigTable.orders.perm``): a broker sending a bad registration must learn what
to fix, and the nameserver must never be left holding half-parsed state.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping
from typing import Any

from remoting.exceptions import RemotingCommandError

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def dump_body(obj: Any) -> bytes:
    return _dumps(obj).encode()


def load_body(body: bytes | bytearray | memoryview, what: str) -> Any:
    """Parse a JSON body; RemotingCommandError (BAD_REQUEST) names ``what`` on failure."""
    if not body:
        raise RemotingCommandError(f"{what}: body is empty, expected JSON")
    try:
        return json.loads(bytes(body))
    except (ValueError, RecursionError) as exc:
        try:  # Java RocketMQ (fastjson) writes integer map keys unquoted: {"brokerAddrs":{0:"..."}}
            return json.loads(quote_numeric_keys(bytes(body).decode("utf-8")))
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
