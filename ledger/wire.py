"""Client requests and responses of a ledger node (the peer protocol is in ``messages``).

Requests: ``u8 op | u64 request id | body``; responses: ``u8 RESPONSE | u64 request id |
u8 code | body``. Many requests may be in flight on one connection; responses carry the
id they answer. Read responses carry entries in their stored encoding, so the client
verifies the leader's checksums end to end.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .codec import Entry, decode_entries
from .membership import MembershipChange, MembershipError

OP_APPEND, OP_READ, OP_STATUS, OP_TRANSFER, OP_MEMBER = 1, 2, 3, 4, 5
#: The body of a membership request is a small JSON object; anything larger is refused.
MAX_MEMBER_REQUEST_BYTES = 4096
MEMBER_LIST = "list"
RESPONSE = 0x80

OK = 0
NOT_LEADER = 1  # certainly not appended; try the leader named in the response
UNKNOWN_OUTCOME = 2  # may or may not have been appended (leadership lost, timeout)
BAD_REQUEST = 3
TOO_LARGE = 4
FAILED = 5  # certainly not appended (overwritten by a new leader)
UNAVAILABLE = 6
BUSY = 7  # certainly not appended: too many appends await commit; try again shortly

CODE_NAMES = {
    OK: "ok",
    NOT_LEADER: "not leader",
    UNKNOWN_OUTCOME: "unknown outcome",
    BAD_REQUEST: "bad request",
    TOO_LARGE: "too large",
    FAILED: "failed",
    UNAVAILABLE: "unavailable",
    BUSY: "busy",
}

_HEAD = struct.Struct("<BQ")
_RESP_HEAD = struct.Struct("<BQB")
_U32 = struct.Struct("<I")
_READ = struct.Struct("<QQIB")
_APPEND_OK = struct.Struct("<QQI")


class WireError(ValueError):
    """A client frame is malformed."""


class LedgerError(Exception):
    """An error response from a node; ``code`` is one of this module's codes."""

    def __init__(self, code: int, message: str, leader: str | None = None, leader_address: str | None = None):
        super().__init__(f"{CODE_NAMES.get(code, code)}: {message}")
        self.code = code
        self.message = message
        self.leader = leader
        self.leader_address = leader_address


@dataclass(slots=True)
class Request:
    op: int
    req_id: int
    payloads: list[bytes] | None = None
    lo: int = 0
    hi: int = 0
    max_bytes: int = 0
    linearizable: bool = False
    target: str = ""
    change: MembershipChange | None = None  # OP_MEMBER: the change, or None to list the members


def encode_append(req_id: int, payloads: Sequence[bytes]) -> bytes:
    parts = [_HEAD.pack(OP_APPEND, req_id), _U32.pack(len(payloads))]
    for p in payloads:
        parts.append(_U32.pack(len(p)))
        parts.append(p)
    return b"".join(parts)


def encode_read(req_id: int, lo: int, hi: int, max_bytes: int, linearizable: bool) -> bytes:
    return _HEAD.pack(OP_READ, req_id) + _READ.pack(lo, hi, max_bytes, linearizable)


def encode_status(req_id: int) -> bytes:
    return _HEAD.pack(OP_STATUS, req_id)


def encode_transfer(req_id: int, target: str) -> bytes:
    return _HEAD.pack(OP_TRANSFER, req_id) + target.encode()


def encode_member(req_id: int, op: str, node_id: str = "", address: str = "") -> bytes:
    """A membership request: ``op`` is ``list`` or a ``MembershipChange`` op (add, promote, remove)."""
    doc = {"op": op, "id": node_id, "address": address}
    return _HEAD.pack(OP_MEMBER, req_id) + json.dumps(doc, separators=(",", ":")).encode()


def _decode_member(req_id: int, raw: bytes) -> Request:
    if len(raw) > MAX_MEMBER_REQUEST_BYTES:
        raise LedgerError(
            BAD_REQUEST, f"membership request of {len(raw)} bytes exceeds {MAX_MEMBER_REQUEST_BYTES}"
        )
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise LedgerError(BAD_REQUEST, f"membership request is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("op"), str):
        raise LedgerError(BAD_REQUEST, "membership request needs an 'op'")
    if doc["op"] == MEMBER_LIST:
        return Request(OP_MEMBER, req_id)
    node_id, address = doc.get("id", ""), doc.get("address", "")
    if not isinstance(node_id, str) or not isinstance(address, str):
        raise LedgerError(BAD_REQUEST, "membership request: 'id' and 'address' must be strings")
    try:
        change = MembershipChange(doc["op"], node_id, address)
    except MembershipError as exc:
        raise LedgerError(BAD_REQUEST, str(exc)) from None
    return Request(OP_MEMBER, req_id, change=change)


def decode_request(body: bytes, max_entry: int) -> Request:
    """Parse a request; ``WireError`` for malformed ones, with the reason."""
    if len(body) < _HEAD.size:
        raise WireError("request shorter than its header")
    op, req_id = _HEAD.unpack_from(body, 0)
    off = _HEAD.size
    if op == OP_APPEND:
        if len(body) < off + 4:
            raise WireError("append without an entry count")
        (count,) = _U32.unpack_from(body, off)
        off += 4
        payloads: list[bytes] = []
        mv = memoryview(body)
        n = len(body)
        for i in range(count):
            if off + 4 > n:
                raise WireError(f"append entry {i} of {count}: truncated length")
            (size,) = _U32.unpack_from(body, off)
            off += 4
            if size > max_entry:
                raise LedgerError(TOO_LARGE, f"entry {i} has {size} bytes, the limit is {max_entry}")
            if off + size > n:
                raise WireError(f"append entry {i} of {count}: truncated body")
            payloads.append(bytes(mv[off : off + size]))
            off += size
        if off != n:
            raise WireError(f"{n - off} trailing bytes after {count} entries")
        if not payloads:
            raise WireError("append of zero entries")
        return Request(op, req_id, payloads)
    if op == OP_READ:
        if len(body) != off + _READ.size:
            raise WireError("read request has the wrong size")
        lo, hi, max_bytes, lin = _READ.unpack_from(body, off)
        return Request(op, req_id, lo=lo, hi=hi, max_bytes=max_bytes, linearizable=bool(lin))
    if op == OP_STATUS:
        return Request(op, req_id)
    if op == OP_TRANSFER:
        return Request(op, req_id, target=body[off:].decode(errors="replace"))
    if op == OP_MEMBER:
        return _decode_member(req_id, body[off:])
    raise WireError(f"unknown request op {op}")


def request_id_of(body: bytes) -> int:
    return _HEAD.unpack_from(body, 0)[1] if len(body) >= _HEAD.size else 0


def ok_append(req_id: int, first: int, term: int, count: int) -> bytes:
    return _RESP_HEAD.pack(RESPONSE, req_id, OK) + _APPEND_OK.pack(first, term, count)


def ok_entries(req_id: int, blob: bytes) -> bytes:
    return _RESP_HEAD.pack(RESPONSE, req_id, OK) + blob


def ok_json(req_id: int, doc: dict[str, Any]) -> bytes:
    return _RESP_HEAD.pack(RESPONSE, req_id, OK) + json.dumps(doc).encode()


def error(
    req_id: int, code: int, message: str, leader: str | None = None, address: str | None = None
) -> bytes:
    doc = {"message": message, "leader": leader, "leader_address": address}
    return _RESP_HEAD.pack(RESPONSE, req_id, code) + json.dumps(doc).encode()


def decode_response_head(body: bytes) -> tuple[int, int, memoryview]:
    """Return (request id, code, payload)."""
    if len(body) < _RESP_HEAD.size or body[0] != RESPONSE:
        raise WireError("malformed response")
    _, req_id, code = _RESP_HEAD.unpack_from(body, 0)
    return req_id, code, memoryview(body)[_RESP_HEAD.size :]


def parse_error(code: int, payload: memoryview) -> LedgerError:
    try:
        doc = json.loads(bytes(payload))
    except ValueError:
        doc = {"message": bytes(payload).decode(errors="replace")}
    return LedgerError(code, doc.get("message", ""), doc.get("leader"), doc.get("leader_address"))


def parse_append_ok(payload: memoryview) -> tuple[int, int, int]:
    return _APPEND_OK.unpack_from(payload, 0)


def parse_entries(payload: memoryview) -> list[Entry]:
    return decode_entries(payload, verify=True, copy=True)
