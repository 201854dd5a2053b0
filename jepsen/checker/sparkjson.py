"""Spark's reads of JSON text, in plain Python: ``cast('long')`` and ``get_json_object``.

The in-process rules and the Arrow pairing must read a value exactly as the Spark
checks do, or the two paths disagree on odd histories; so there is one reader of each,
here, in a leaf module that every one of them can import.
"""

from __future__ import annotations

import json
from typing import Any


def as_long(text: Any) -> int | None:
    """Spark's cast of a JSON text column to long: an integer, else null."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text
    if not isinstance(text, str):
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def json_object(text: str | None) -> dict[str, Any] | None:
    """``text`` decoded when it is a JSON object, else None."""
    if not text or not text.lstrip().startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def json_field(text: str | None, name: str, obj: dict[str, Any] | None = None) -> int | None:
    """``get_json_object(text, '$.name')`` cast to long (``obj``: ``text`` already decoded)."""
    obj = obj if obj is not None else json_object(text)
    if obj is None:
        return None
    v = obj.get(name)
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        return as_long(v)
    return None


def offset_in(value: str | None) -> int | None:
    """A send's offset inside an object value (``$.offset``), as ``frames.pair_ops`` reads it."""
    if value is None or not value.startswith("{"):
        return None
    return json_field(value, "offset")
