"""A reader for the small subset of EDN that Jepsen histories use.

Jepsen writes operations as EDN maps (``{:process 0, :type :ok, :f :read, :value 3}``).
A full EDN library would be a heavy dependency for what amounts to maps, vectors,
keywords, strings, numbers and ``nil``; this reader covers exactly that subset and
refuses anything else with a position, so a malformed history is reported rather
than guessed at. Nothing here evaluates input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Keyword:
    """An EDN keyword such as ``:ok``; kept distinct from strings so ``:ok`` != ``"ok"``."""

    name: str

    def __str__(self) -> str:
        return self.name


class EdnError(ValueError):
    """Raised with the character position where the text stops being EDN we understand."""

    def __init__(self, message: str, pos: int) -> None:
        super().__init__(f"{message} at column {pos + 1}")
        self.pos = pos


_WS = " \t\r\n,"
_DELIMS = _WS + '{}[]()";'
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip_ws(self) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            ch = text[self.pos]
            if ch in _WS:
                self.pos += 1
            elif ch == ";":  # comment to end of line
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
            else:
                break

    def read(self) -> Any:
        self.skip_ws()
        if self.pos >= len(self.text):
            raise EdnError("unexpected end of input", self.pos)
        ch = self.text[self.pos]
        if ch == "{":
            return self._read_map()
        if ch == "[":
            return self._read_seq("]")
        if ch == "(":
            return self._read_seq(")")
        if ch == '"':
            return self._read_string()
        if ch == "#":
            if self.text.startswith("#{", self.pos):
                self.pos += 1
                return self._read_seq("}")
            raise EdnError("tagged literals are not supported", self.pos)
        if ch in "}])":
            raise EdnError(f"unexpected {ch!r}", self.pos)
        return self._read_atom()

    def _read_seq(self, close: str) -> list[Any]:
        self.pos += 1
        items: list[Any] = []
        while True:
            self.skip_ws()
            if self.pos >= len(self.text):
                raise EdnError(f"missing {close!r}", self.pos)
            if self.text[self.pos] == close:
                self.pos += 1
                return items
            items.append(self.read())

    def _read_map(self) -> dict[Any, Any]:
        start = self.pos
        items = self._read_seq("}")
        if len(items) % 2:
            raise EdnError("map with an odd number of forms", start)
        out: dict[Any, Any] = {}
        for k, v in zip(items[::2], items[1::2], strict=True):
            if isinstance(k, list):
                k = tuple(k)
            out[k] = v
        return out

    def _read_string(self) -> str:
        text, n = self.text, len(self.text)
        self.pos += 1
        parts: list[str] = []
        start = self.pos
        while self.pos < n:
            ch = text[self.pos]
            if ch == '"':
                parts.append(text[start : self.pos])
                self.pos += 1
                return "".join(parts)
            if ch == "\\":
                parts.append(text[start : self.pos])
                if self.pos + 1 >= n:
                    break
                esc = text[self.pos + 1]
                if esc == "u":
                    hexdigits = text[self.pos + 2 : self.pos + 6]
                    try:
                        parts.append(chr(int(hexdigits, 16)))
                    except ValueError:
                        raise EdnError("bad \\u escape", self.pos) from None
                    self.pos += 6
                elif esc in _ESCAPES:
                    parts.append(_ESCAPES[esc])
                    self.pos += 2
                else:
                    raise EdnError(f"bad escape \\{esc}", self.pos)
                start = self.pos
            else:
                self.pos += 1
        raise EdnError("unterminated string", n)

    def _read_atom(self) -> Any:
        text, n, start = self.text, len(self.text), self.pos
        while self.pos < n and text[self.pos] not in _DELIMS:
            self.pos += 1
        tok = text[start : self.pos]
        if tok.startswith(":"):
            if len(tok) == 1:
                raise EdnError("empty keyword", start)
            return Keyword(tok[1:])
        if tok == "nil":
            return None
        if tok == "true":
            return True
        if tok == "false":
            return False
        num = tok[:-1] if tok.endswith(("N", "M")) else tok
        try:
            return int(num)
        except ValueError:
            pass
        try:
            return float(num)
        except ValueError:
            pass
        raise EdnError(f"unsupported token {tok!r}", start)


def loads(text: str) -> Any:
    """Read exactly one EDN form from ``text``; trailing non-whitespace is an error."""
    reader = _Reader(text)
    value = reader.read()
    reader.skip_ws()
    if reader.pos != len(text):
        raise EdnError("trailing characters after the form", reader.pos)
    return value


def to_plain(value: Any) -> Any:
    """Turn EDN values into JSON-shaped Python values (keywords become their names)."""
    if isinstance(value, Keyword):
        return value.name
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(to_plain(k)): to_plain(v) for k, v in value.items()}
    return value
