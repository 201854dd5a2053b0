"""The one encoding of a log entry, shared by the on-disk segments and the replication wire.

A leader encodes an entry once, when its store appends it; the same bytes are written to
the segment file and sent to every follower, which verifies them and writes them as they
came. Keeping disk and wire identical avoids re-encoding on the hot path and means a
checksum computed by the leader protects the entry all the way into every replica.

Layout (little endian), 44-byte header then the body::

    magic u32 | body size u32 | index u64 | term u64 | pos u64 | kind u32 | checksum u64

``pos`` is the entry's byte offset in the logical log (segments are named by the position
of their first entry, as RocketMQ and DLedger name theirs). ``checksum`` is xxh3-64 of the
body seeded with xxh3-64 of the first 36 header bytes, so a flipped bit anywhere in header
or body is caught. Unlike DLedger, whose CRC fields are never filled in, every read and
every recovery verifies it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

MAGIC = 0x4C4D5131  # "LMQ1"
HEADER = struct.Struct("<IIQQQIQ")
HEADER_SIZE = HEADER.size  # 44
_PREFIX = struct.Struct("<IIQQQI")  # the checksummed part of the header
_PREFIX_SIZE = _PREFIX.size  # 36

KIND_NORMAL = 0
KIND_NOOP = 1  # appended by a new leader; commits its term (Raft section 5.4.2)
KIND_CONFIG = 2  # a membership configuration (``ledger.membership``); in effect once appended

_h = xxhash.xxh3_64_intdigest


class ChecksumError(ValueError):
    """An entry's bytes do not match its checksum or header; ``offset`` is relative to the buffer."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} at offset {offset}")
        self.reason = reason
        self.offset = offset


class Entry:
    """One log entry. ``raw`` caches the encoded bytes so they are produced once per entry."""

    __slots__ = ("index", "term", "kind", "data", "pos", "raw")

    def __init__(
        self,
        index: int,
        term: int,
        data: bytes = b"",
        kind: int = KIND_NORMAL,
        pos: int = -1,
        raw: bytes | memoryview | None = None,
    ) -> None:
        self.index = index
        self.term = term
        self.kind = kind
        self.data = data
        self.pos = pos
        self.raw = raw

    @property
    def size(self) -> int:
        """Encoded size in bytes."""
        return HEADER_SIZE + len(self.data)

    def __repr__(self) -> str:
        return f"Entry(index={self.index}, term={self.term}, kind={self.kind}, len={len(self.data)})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Entry):
            return NotImplemented
        return (self.index, self.term, self.kind, bytes(self.data)) == (
            other.index,
            other.term,
            other.kind,
            bytes(other.data),
        )

    __hash__ = None  # type: ignore[assignment]


def encode_entry(entry: Entry, pos: int) -> bytes:
    """Encode ``entry`` at log position ``pos``; sets ``entry.pos`` and ``entry.raw``."""
    data = entry.data
    prefix = _PREFIX.pack(MAGIC, len(data), entry.index, entry.term, pos, entry.kind)
    raw = prefix + _h(data, _h(prefix)).to_bytes(8, "little") + data
    entry.pos = pos
    entry.raw = raw
    return raw


def encode_entries(entries: Sequence[Entry], pos: int) -> bytes:
    """Encode a run of entries starting at ``pos`` into one contiguous blob.

    Entries that already carry ``raw`` bytes at the right position are reused as they are,
    which is how a follower writes what the leader sent without re-encoding.
    """
    parts = []
    for e in entries:
        raw = e.raw
        if raw is None or e.pos != pos:
            raw = encode_entry(e, pos)
        parts.append(raw)
        pos += len(raw)
    return b"".join(parts)


def decode_entries(buf: bytes | memoryview, verify: bool = True, copy: bool = True) -> list[Entry]:
    """Decode a blob of back-to-back entries, verifying each checksum.

    Raises ``ChecksumError`` naming the offset of the first bad entry; a truncated final
    entry is also an error here (stores handle torn tails themselves, via ``scan_entries``).
    With ``copy=False`` the entries' ``data``/``raw`` are memoryviews into ``buf``.
    """
    entries, end, err = scan_entries(buf, verify=verify, copy=copy)
    if err is not None:
        raise ChecksumError(err, end)
    return entries


def scan_entries(
    buf: bytes | memoryview, verify: bool = True, copy: bool = True, limit: int | None = None
) -> tuple[list[Entry], int, str | None]:
    """Decode as many whole, valid entries as ``buf`` holds.

    Returns ``(entries, end, error)``: ``end`` is the offset just past the last good entry and
    ``error`` says why decoding stopped early (None when the buffer ended exactly on an entry
    boundary). Recovery uses this to tell a torn tail from corruption in the middle.
    """
    mv = memoryview(buf)
    n = len(mv)
    off = 0
    out: list[Entry] = []
    unpack = HEADER.unpack_from
    while off < n:
        if limit is not None and len(out) >= limit:
            break
        if n - off < HEADER_SIZE:
            return out, off, "truncated header"
        magic, size, index, term, pos, kind, checksum = unpack(mv, off)
        if magic != MAGIC:
            return out, off, f"bad magic 0x{magic:08x}"
        end = off + HEADER_SIZE + size
        if end > n:
            return out, off, "truncated body"
        body = mv[off + HEADER_SIZE : end]
        if verify and _h(body, _h(mv[off : off + _PREFIX_SIZE])) != checksum:
            return out, off, f"checksum mismatch in entry {index}"
        if copy:
            raw = bytes(mv[off:end])
            e = Entry(index, term, raw[HEADER_SIZE:], kind, pos, raw)
        else:
            e = Entry(index, term, body, kind, pos, mv[off:end])
        out.append(e)
        off = end
    return out, off, None
