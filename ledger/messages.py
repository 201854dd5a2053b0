"""Raft messages between ledger nodes and their binary encoding.

The Raft core produces and consumes these dataclasses; the transport turns them into
frames. Entries travel in the same encoding they have on disk (see ``codec``), so the
frame body of an append is a fixed header followed by the leader's stored bytes.

Frame body layout: ``u8 type`` then a type-specific fixed struct, then the sender and
receiver ids (``u8`` length + UTF-8 each), then for appends the entry blob.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .codec import Entry, decode_entries, encode_entries


class MessageError(ValueError):
    """A peer frame could not be decoded; the transport closes that connection."""


@dataclass(slots=True)
class VoteRequest:
    term: int
    src: str
    dst: str
    last_index: int
    last_term: int
    pre_vote: bool = False
    transfer: bool = False  # sent after TimeoutNow: voters ignore leader stickiness


@dataclass(slots=True)
class VoteResponse:
    term: int
    src: str
    dst: str
    granted: bool
    pre_vote: bool = False
    # The answering member holds a committed configuration that removed the candidate: it
    # stops campaigning (a node removed while it was down learns it is out). On the wire, a
    # trailing byte that older nodes do not read.
    removed: bool = False


@dataclass(slots=True)
class AppendRequest:
    term: int
    src: str
    dst: str
    prev_index: int
    prev_term: int
    commit: int
    entries: list[Entry] = field(default_factory=list)
    seq: int = 0  # heartbeat round, echoed back; confirms leadership for ReadIndex


@dataclass(slots=True)
class AppendResponse:
    term: int
    src: str
    dst: str
    success: bool
    match_index: int  # on success: the follower durably holds the leader's log up to here
    reject_index: int = 0  # on reject: the prev_index that did not match
    hint_index: int = 0  # on reject: where the leader should look for the agreement point
    hint_term: int = 0
    seq: int = 0


@dataclass(slots=True)
class TimeoutNow:
    """Leadership transfer: the target starts an election at once (Raft thesis 3.10)."""

    term: int
    src: str
    dst: str


@dataclass(slots=True)
class InstallBase:
    """The leader no longer holds the entries a follower needs (retention removed them).

    The follower restarts its log just after ``base_index`` (all of which is committed),
    the log-only analogue of InstallSnapshot: the commit log is the state. The snapshot's
    part beyond the log is the membership configuration in effect at the base (``config``,
    an encoded ``Membership``, from the entry at ``config_index``/``config_term``; index 0
    is the configuration the group started with), so a follower whose log is trimmed still
    knows every member. Empty ``config`` means the sender did not say (an older node).
    """

    term: int
    src: str
    dst: str
    base_index: int
    base_term: int
    base_pos: int
    seq: int = 0
    config_index: int = 0
    config_term: int = 0
    config: bytes = b""


Message = VoteRequest | VoteResponse | AppendRequest | AppendResponse | TimeoutNow | InstallBase

_VOTE_REQ = struct.Struct("<QQQBB")
_VOTE_RESP = struct.Struct("<QBB")
_APPEND_REQ = struct.Struct("<QQQQQI")
_APPEND_RESP = struct.Struct("<QBQQQQQ")
_TIMEOUT_NOW = struct.Struct("<Q")
_INSTALL_BASE = struct.Struct("<QQQQQ")
_INSTALL_BASE_CONFIG = struct.Struct("<QQ")  # after the ids, then the configuration bytes

T_VOTE_REQ, T_VOTE_RESP, T_APPEND_REQ, T_APPEND_RESP, T_TIMEOUT_NOW, T_INSTALL_BASE = range(1, 7)


def _ids(src: str, dst: str) -> bytes:
    s, d = src.encode(), dst.encode()
    if len(s) > 255 or len(d) > 255:
        raise MessageError("node id longer than 255 bytes")
    return bytes((len(s),)) + s + bytes((len(d),)) + d


def encode_message(m: Message) -> bytes:
    """Encode a message into a frame body (the transport adds the length prefix)."""
    if isinstance(m, AppendRequest):
        blob = encode_entries(m.entries, m.entries[0].pos if m.entries and m.entries[0].pos >= 0 else 0)
        head = _APPEND_REQ.pack(m.term, m.prev_index, m.prev_term, m.commit, m.seq, len(m.entries))
        return b"".join((bytes((T_APPEND_REQ,)), head, _ids(m.src, m.dst), blob))
    if isinstance(m, AppendResponse):
        head = _APPEND_RESP.pack(
            m.term, m.success, m.match_index, m.reject_index, m.hint_index, m.hint_term, m.seq
        )
        return bytes((T_APPEND_RESP,)) + head + _ids(m.src, m.dst)
    if isinstance(m, VoteRequest):
        head = _VOTE_REQ.pack(m.term, m.last_index, m.last_term, m.pre_vote, m.transfer)
        return bytes((T_VOTE_REQ,)) + head + _ids(m.src, m.dst)
    if isinstance(m, VoteResponse):
        body = bytes((T_VOTE_RESP,)) + _VOTE_RESP.pack(m.term, m.granted, m.pre_vote) + _ids(m.src, m.dst)
        return body + b"\x01" if m.removed else body
    if isinstance(m, TimeoutNow):
        return bytes((T_TIMEOUT_NOW,)) + _TIMEOUT_NOW.pack(m.term) + _ids(m.src, m.dst)
    if isinstance(m, InstallBase):
        head = _INSTALL_BASE.pack(m.term, m.base_index, m.base_term, m.base_pos, m.seq)
        body = bytes((T_INSTALL_BASE,)) + head + _ids(m.src, m.dst)
        if m.config:  # trailing: older nodes read the message and ignore it
            body += _INSTALL_BASE_CONFIG.pack(m.config_index, m.config_term) + m.config
        return body
    raise TypeError(f"not a raft message: {m!r}")


def _read_ids(buf: memoryview, off: int) -> tuple[str, str, int]:
    try:
        n = buf[off]
        src = bytes(buf[off + 1 : off + 1 + n]).decode()
        off += 1 + n
        n = buf[off]
        dst = bytes(buf[off + 1 : off + 1 + n]).decode()
        off += 1 + n
    except (IndexError, UnicodeDecodeError) as exc:
        raise MessageError(f"bad node ids: {exc}") from None
    if off > len(buf):
        raise MessageError("truncated node ids")
    return src, dst, off


def decode_message(body: bytes | memoryview) -> Message:
    """Decode a frame body; raises ``MessageError`` for anything malformed (never trusts sizes)."""
    buf = memoryview(body)
    if not buf:
        raise MessageError("empty frame")
    kind = buf[0]
    try:
        if kind == T_APPEND_REQ:
            term, prev_index, prev_term, commit, seq, count = _APPEND_REQ.unpack_from(buf, 1)
            src, dst, off = _read_ids(buf, 1 + _APPEND_REQ.size)
            try:
                entries = decode_entries(buf[off:], copy=False)
            except ValueError as exc:
                raise MessageError(f"append from {src}: {exc}") from None
            if len(entries) != count:
                raise MessageError(f"append from {src}: header says {count} entries, body has {len(entries)}")
            return AppendRequest(term, src, dst, prev_index, prev_term, commit, entries, seq)
        if kind == T_APPEND_RESP:
            term, ok, match, rej, hint, hint_term, seq = _APPEND_RESP.unpack_from(buf, 1)
            src, dst, _ = _read_ids(buf, 1 + _APPEND_RESP.size)
            return AppendResponse(term, src, dst, bool(ok), match, rej, hint, hint_term, seq)
        if kind == T_VOTE_REQ:
            term, li, lt, pre, transfer = _VOTE_REQ.unpack_from(buf, 1)
            src, dst, _ = _read_ids(buf, 1 + _VOTE_REQ.size)
            return VoteRequest(term, src, dst, li, lt, bool(pre), bool(transfer))
        if kind == T_VOTE_RESP:
            term, granted, pre = _VOTE_RESP.unpack_from(buf, 1)
            src, dst, off = _read_ids(buf, 1 + _VOTE_RESP.size)
            removed = off < len(buf) and buf[off] == 1
            return VoteResponse(term, src, dst, bool(granted) and not removed, bool(pre), removed)
        if kind == T_TIMEOUT_NOW:
            (term,) = _TIMEOUT_NOW.unpack_from(buf, 1)
            src, dst, _ = _read_ids(buf, 1 + _TIMEOUT_NOW.size)
            return TimeoutNow(term, src, dst)
        if kind == T_INSTALL_BASE:
            term, bi, bt, bp, seq = _INSTALL_BASE.unpack_from(buf, 1)
            src, dst, off = _read_ids(buf, 1 + _INSTALL_BASE.size)
            if off == len(buf):
                return InstallBase(term, src, dst, bi, bt, bp, seq)
            ci, ct = _INSTALL_BASE_CONFIG.unpack_from(buf, off)
            config = bytes(buf[off + _INSTALL_BASE_CONFIG.size :])
            if not config:
                raise MessageError(f"install base from {src}: empty configuration")
            return InstallBase(term, src, dst, bi, bt, bp, seq, ci, ct, config)
    except struct.error as exc:
        raise MessageError(f"truncated message of type {kind}: {exc}") from None
    raise MessageError(f"unknown message type {kind}")
