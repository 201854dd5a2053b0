"""The durable, segmented Raft log: data segments, a derived index, recovery, group-commit fsync.

Layout of the log directory::

    00000000000000000000.seg   entries back to back, in the codec's encoding
    00000000000000000000.idx   one 24-byte record (index, term, pos) per entry of that segment
    00000000000067108908.seg   segments are named by the log position of their first entry,
    ...                        as RocketMQ names its commit log files
    base                       (base_index, base_term, base_pos) after retention or reset, and
                               the membership configuration in effect at the base
    members                    the configuration entries above the base: (index, term, payload)

The data segments are the truth; the index files only save recovery a scan. Positions are
byte offsets in one logical log that continues across segments, so a leader and its
followers agree on every entry's position and a follower can write the leader's encoded
bytes without re-encoding them.

Durability is split between two threads. ``append`` only writes to the page cache (one
``pwrite`` per segment touched), on the event loop thread. ``prepare_sync`` captures what
needs flushing, ``SyncJob.run`` flushes it on a worker thread while the loop keeps
appending, and ``complete_sync`` publishes the new ``durable_index``. Many appends share
one fsync, which is what makes the durable-ack rate independent of the batch size.

Any I/O error while writing or flushing makes the store refuse further writes: after a
failed fsync the kernel may have dropped dirty pages, so the only safe continuation is a
restart and recovery from what is really on disk.

Lost data versus a torn write. Recovery finds damage a crash cannot explain (a corrupt entry
with valid ones after it, a hole, a missing segment) by itself. A log that simply ends early
is told from one whose last writes a crash cut short only by the ``durable-mark`` file: the
(index, term) made durable, recorded by at most one sync per ``mark_interval_s``, by the
node's tick once the log has been quiet that long (``mark_due``), and at a clean stop
(``mark_durable``). A start whose log ends before the mark (by (term, index)) knows it lost
entries it may have acknowledged (``lost_from``, ``lost_claim``). What it cannot tell, exactly:

- a loss confined to the entries made durable in the last interval before a crash (those
  after the last mark: under load, since the last sync that carried one; when quiet, at most
  one interval plus a tick). Cut at an entry boundary, or with the damage in those last
  entries and no valid entry after it, that suffix looks like writes the crash interrupted
  before their fsync, and the node votes as if it never had them;
- a loss together with the mark itself (deleted, or damaged: ignored with a warning), or of
  the whole log directory, which then looks like a log that was never written;
- a log directory restored from an older copy, mark included (consistent, only old).

Closing the first on every group commit would cost one more file write and fsync per
commit; it stays a window of one interval, at one mark write per interval at most
(``tests/test_store.py::test_what_the_durable_mark_can_and_cannot_tell`` pins it down).

Membership. The Raft core needs the latest configuration in the log at every start, and
scanning a whole log for configuration entries would read every byte of it. So every
configuration entry is recorded in the ``members`` file (``save_config``), and the
configuration in effect at the base travels in the base file, written atomically with the
base it belongs to (reset, retention). A record is written by the next sync job, before its
fsyncs, so it is durable no later than the entry it describes (a power loss keeps both or
neither) and the event loop never waits for it. A process crash keeps what was written
without fsync, entries included, before their record: the last segment is scanned entry by
entry on every open anyway, and its configuration entries are taken from that scan; an
earlier segment is never sealed while a record of an entry in it is still unwritten (the
roll writes it). On open, a record counts only if the recovered log still holds an entry
of the record's term at its index (log matching makes that the very entry); a record whose
entry a crash lost, a truncation replaced or a reset dropped is ignored, so the file never
needs rewriting on those paths. Configuration changes are rare: the file holds a few records.
"""

from __future__ import annotations

import logging
import operator
import os
import re
import struct
import sys
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from itertools import islice

import xxhash

from .codec import KIND_CONFIG, MAGIC, Entry, encode_entries, scan_entries
from .invariants import InvariantError

__all__ = ["CorruptLogError", "LogStore", "SyncJob", "write_file_atomically"]

log = logging.getLogger("ledger.store")

SEG_SUFFIX = ".seg"
IDX_SUFFIX = ".idx"
BASE_NAME = "base"
DAMAGE_NAME = "damaged"  # present from a salvage until the node has re-fetched what it dropped
DAMAGE_MAX_BYTES = 4096  # the marker is one line; anything longer is not ours
MARK_NAME = "durable-mark"  # (index, term) known durable here at some moment: what we may have acked
_MARK = struct.Struct("<IqqQ")  # magic, index, term, xxh3 of the rest
_MARK_MAGIC = 0x4B4D514C  # "LQMK"
IDX_RECORD = 24  # index, term, pos: three little-endian int64
_SEG_RE = re.compile(r"^(\d{20})\.(seg|idx)$")
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_BASE = struct.Struct("<IqqqQ")  # magic, base_index, base_term, base_pos, xxh3 of the rest
_BASE_MAGIC = 0x424D514C  # "LQMB"
# A base with the configuration in effect at it: magic, base_index, base_term, base_pos,
# config index, config term, config length, then the config bytes and an xxh3 of all before.
_BASE_CFG = struct.Struct("<IqqqqqI")
_BASE_CFG_MAGIC = 0x434D514C  # "LQMC"
MEMBERS_NAME = "members"
_MEMBERS_HEAD = struct.Struct("<II")  # magic, record count
_MEMBERS_MAGIC = 0x524D514C  # "LQMR"
_MEMBER_REC = struct.Struct("<qqI")  # index, term, payload length, then the payload
#: The most configuration records the members file holds (changes are rare; more is damage).
MAX_CONFIG_RECORDS = 4096
#: The largest members or base file read (records are small; anything larger is not ours).
MAX_MEMBERS_FILE_BYTES = 16 << 20
#: (index, term, encoded configuration) of one configuration entry.
ConfigRecord = tuple[int, int, bytes]
_LITTLE = sys.byteorder == "little"
_MAX_OPEN = 8  # segments whose fds stay open once idle (the active one never counts as idle)
_datasync = getattr(os, "fdatasync", os.fsync)


class CorruptLogError(Exception):
    """The on-disk log is damaged in a way that must not be repaired silently.

    ``path`` is the segment (or index/base) file and ``offset`` the byte offset within it, so
    an operator can look at the exact bytes.
    """

    def __init__(self, path: str | os.PathLike, offset: int, reason: str) -> None:
        super().__init__(f"corrupt log: {os.fspath(path)} at offset {offset}: {reason}")
        self.path = os.fspath(path)
        self.offset = offset
        self.reason = reason


def fsync_dir(path: str | os.PathLike) -> None:
    """Make creations, renames and deletions in ``path`` durable (POSIX needs the directory synced)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content.

    The temporary file is fsynced before the rename and the directory after it; without
    both, a power loss can leave an empty file or the old name pointing at nothing.
    """
    path = os.fspath(path)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _pwrite_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """``pwrite`` until done: a regular file only writes short on errors, but never assume."""
    n = os.pwrite(fd, data, offset)
    if n == len(data):
        return
    view = memoryview(data)
    while n < len(view):
        n += os.pwrite(fd, view[n:], offset + n)


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    """``pread`` that survives the kernel's ~2 GiB per-call limit; short only at end of file."""
    buf = os.pread(fd, size, offset)
    if len(buf) == size or not buf:
        return buf
    parts = [buf]
    got = len(buf)
    while got < size:
        chunk = os.pread(fd, size - got, offset + got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _mark_bytes(index: int, term: int) -> bytes:
    """The durable mark's file content: (index, term) and their checksum."""
    body = _MARK.pack(_MARK_MAGIC, index, term, 0)[:-8]
    return body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")


def _index_records(first_index: int, terms: Sequence[int], positions: Sequence[int]) -> bytes:
    """Interleave the index records with C-level slice assignment: no per-entry Python work."""
    n = len(terms)
    rec = array("q", bytes(IDX_RECORD * n))
    rec[0::3] = array("q", range(first_index, first_index + n))
    rec[1::3] = array("q", terms)
    rec[2::3] = array("q", positions)
    if not _LITTLE:
        rec.byteswap()
    return rec.tobytes()


def _increasing(values: Sequence[int], strict: bool) -> bool:
    op = operator.lt if strict else operator.le
    return all(map(op, values, islice(values, 1, None)))


class _Segment:
    """One data file and its index file; fds are opened lazily and may be closed when idle."""

    __slots__ = ("start", "path", "idx_path", "first_index", "count", "size", "fd", "ifd", "dirty", "holds")

    def __init__(self, directory: str, start: int, first_index: int) -> None:
        name = os.path.join(directory, f"{start:020d}")
        self.start = start  # log position of the first entry
        self.path = name + SEG_SUFFIX
        self.idx_path = name + IDX_SUFFIX
        self.first_index = first_index
        self.count = 0
        self.size = 0
        self.fd: int | None = None
        self.ifd: int | None = None
        self.dirty = False  # written (or truncated) since the last prepare_sync
        self.holds = 0  # sync jobs in flight that will fsync our fds

    @property
    def last_index(self) -> int:
        return self.first_index + self.count - 1


class SyncJob:
    """The fsyncs owed for everything appended up to ``target``; ``run`` may be called on any thread.

    ``run`` touches nothing but the fds captured by ``prepare_sync`` (which stay open until
    ``complete_sync``), so the loop thread can keep appending while it runs.
    """

    __slots__ = ("target", "_fds", "_segments", "done", "error", "mark", "mark_error", "members")

    def __init__(self, target: int, fds: list[int], segments: list[_Segment]) -> None:
        self.target = target
        self._fds = fds
        self._segments = segments
        self.done = False
        self.error: OSError | None = None
        self.mark: tuple[str, bytes] | None = None  # a durable mark to write once the data is flushed
        self.mark_error: OSError | None = None
        self.members: tuple[str, bytes] | None = None  # configuration records, written before the data

    def run(self) -> None:
        """Flush the captured files; the last fd, when a segment was created or removed, is the directory.

        A mark that cannot be written (a full disk) does not fail the job: the data is durable,
        and a mark only helps find a lost tail later; ``complete_sync`` owes it again. The
        configuration records are different: their entries may not be acknowledged without
        them, so failing to write them fails the job as a failed fsync does.
        """
        try:
            if self.members is not None:
                write_file_atomically(*self.members)
            for fd in self._fds:
                _datasync(fd)
        except OSError as exc:
            self.error = exc
            self.done = True
            raise
        if self.mark is not None:
            try:
                write_file_atomically(*self.mark)
            except OSError as exc:
                self.mark_error = exc
        self.done = True


class LogStore:
    """The Raft log on disk, with an in-memory tail cache and O(1) term lookups."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        segment_bytes: int = 64 << 20,
        cache_bytes: int = 64 << 20,
        retention_bytes: int | None = None,
        retention_seconds: float | None = None,
        salvage: bool = False,
        mark_interval_s: float | None = None,
    ) -> None:
        if segment_bytes <= 0:
            raise ValueError(f"segment_bytes must be positive, got {segment_bytes}")
        self.directory = os.fspath(directory)
        self.segment_bytes = segment_bytes
        self.cache_bytes = max(0, cache_bytes)
        self.retention_bytes = retention_bytes
        self.retention_seconds = retention_seconds
        # With ``salvage`` recovery keeps the valid prefix of a damaged log instead of refusing
        # to open it; ``lost_from`` then names the first index it may have lost (see _salvage).
        self.salvage = salvage
        self.lost_from: int | None = None
        # (index, term) of the last valid entry the damaged part still showed: the log this node
        # may have acknowledged, which its votes must keep defending until it holds it again.
        self.lost_claim: tuple[int, int] | None = None
        self.lost_reason = ""
        # Every ``mark_interval_s`` a sync also records the (index, term) it made durable, so a
        # later start can tell a log cut short (emptied, truncated) from one never written.
        self.mark_interval_s = mark_interval_s
        self._mark_at = float("-inf")
        self._marked: tuple[int, int] | None = None  # (index, term) of the last mark written or owed
        self._mark_path = os.path.join(self.directory, MARK_NAME)
        os.makedirs(self.directory, exist_ok=True)
        self._base_path = os.path.join(self.directory, BASE_NAME)
        self._dir_fd: int | None = os.open(self.directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        self._segs: list[_Segment] = []
        self._seg_firsts: list[int] = []  # first_index of each segment, for bisect
        self._active: _Segment | None = None
        self._open: dict[int, _Segment] = {}  # segments holding open fds, least recently used first
        self._dirty: list[_Segment] = []
        self._dir_dirty = False
        self._jobs: deque[SyncJob] = deque()  # in flight, in prepare order
        self._zombies: list[_Segment] = []  # deleted while a job still fsyncs their fds
        self._failed: BaseException | None = None
        self._damage_path = os.path.join(self.directory, DAMAGE_NAME)
        self._members_path = os.path.join(self.directory, MEMBERS_NAME)
        self._base_config: ConfigRecord | None = None
        self._configs: list[ConfigRecord] = []  # configuration entries above the base, in log order
        self._configs_dirty = False  # records not yet written: the next sync job (or roll) writes them
        self._scanned_configs: list[ConfigRecord] = []  # found by recovery's scan of the last segment
        self._base_index, self._base_term, self._base_pos = self._load_base()
        self._clear_memory()
        try:
            self._recover()
            if self.lost_from is None:
                self._load_damage()
            self._check_mark()
            self._load_configs()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ public state

    @property
    def failed(self) -> bool:
        """A failed fsync (or a write that could not be undone) poisoned the store until a restart."""
        return self._failed is not None

    @property
    def base_index(self) -> int:
        return self._base_index

    @property
    def base_term(self) -> int:
        return self._base_term

    @property
    def base_pos(self) -> int:
        return self._base_pos

    def next_pos(self) -> int:
        """Log position where the next appended entry will be written."""
        return self._next_pos

    def size_bytes(self) -> int:
        """Bytes of entry data held in the segments (index files not counted)."""
        return self._next_pos - self._base_pos

    def term_at(self, index: int) -> int:
        """Term of entry ``index``; the base index answers with the base term (Raft's prevLogTerm)."""
        i = index - self.first_index
        if i < 0:
            if i == -1:
                return self._base_term
            raise IndexError(f"index {index} is before the log base {self._base_index}")
        try:
            return self._terms[i]
        except IndexError:
            raise IndexError(f"index {index} is after the last index {self.last_index}") from None

    # ------------------------------------------------------------------ appending

    def append(self, entries: Sequence[Entry]) -> None:
        """Write ``entries`` (contiguous, after ``last_index``) to the page cache; ``sync`` makes them durable."""
        n = len(entries)
        if n == 0:
            return
        self._check_writable()
        first = self.last_index + 1
        if entries[0].index != first or [e.index for e in entries] != list(range(first, first + n)):
            raise ValueError(
                f"append must be contiguous from index {first}, got {entries[0].index}..{entries[-1].index}"
            )
        terms = [e.term for e in entries]
        if terms[0] < self.last_term or not _increasing(terms, strict=False):
            raise ValueError(
                f"terms must not decrease (last term {self.last_term}, batch {terms[0]}..{terms[-1]})"
            )
        start = self._next_pos
        blob = encode_entries(entries, start)
        positions = [e.pos for e in entries]
        end = start + len(blob)
        mark = self._write_mark()
        try:
            self._write_batch(blob, first, terms, positions, end)
        except OSError:
            self._undo_write(mark)  # e.g. ENOSPC: the log stays as it was and takes later writes
            raise
        except BaseException as exc:
            self._failed = exc
            raise
        self._pos.fromlist(positions)
        self._terms.fromlist(terms)
        self.last_index = first + n - 1
        self.last_term = terms[-1]
        self._next_pos = end
        self._cache_add(entries)
        self._check_shape()

    def _write_mark(self) -> tuple[int, _Segment | None, int, int]:
        """Where the files end now, so a failed batch can be cut off again (``_undo_write``)."""
        seg = self._active
        return len(self._segs), seg, seg.size if seg else 0, seg.count if seg else 0

    def _undo_write(self, mark: tuple[int, _Segment | None, int, int]) -> None:
        """Cut a batch whose write failed (a full disk) back to the mark: files and bookkeeping.

        Nothing of the batch was acknowledged or published (``last_index`` did not move), so
        removing its partial bytes is what a crash right now would leave to recovery anyway.
        ftruncate and unlink need no free space; if they fail too the store refuses writes
        until a restart re-reads the files (the sticky ``_failed``).
        """
        nsegs, seg, size, count = mark
        try:
            for later in reversed(self._segs[nsegs:]):
                self._delete_segment(later)
            del self._segs[nsegs:]
            del self._seg_firsts[nsegs:]
            if seg is not None:
                os.ftruncate(self._fd(seg), size)
                os.ftruncate(self._ifd(seg), count * IDX_RECORD)
                seg.size, seg.count = size, count
                self._mark_dirty(seg)
            self._active = seg
        except BaseException as exc:
            self._failed = exc
            raise

    def _check_shape(self) -> None:
        """Cheap, always on: one term and one position per retained entry, durability within the log."""
        if not len(self._terms) == len(self._pos) == self.last_index - self.first_index + 1:
            raise InvariantError(
                f"log store {self.directory}: {len(self._terms)} terms and {len(self._pos)} positions "
                f"for entries {self.first_index}..{self.last_index}"
            )
        if self.durable_index > self.last_index:
            raise InvariantError(
                f"log store {self.directory}: durable index {self.durable_index} beyond last index {self.last_index}"
            )

    def _write_batch(self, blob: bytes, first: int, terms: list[int], positions: list[int], end: int) -> None:
        """Write the encoded batch into as few segments as possible: one pwrite per segment touched."""
        n = len(positions)
        positions.append(end)  # sentinel: entry k ends where k + 1 starts
        try:
            base = positions[0]
            i = 0
            while i < n:
                seg = self._active
                if seg is None:
                    seg = self._roll(positions[i], first + i)
                limit = seg.start + self.segment_bytes
                j = bisect_right(positions, limit, i + 1, n + 1) - 1  # entries i..j-1 fit
                if j == i:
                    if seg.size:
                        self._roll(positions[i], first + i)
                        continue
                    j = i + 1  # larger than a segment: it gets one of its own
                a, b = positions[i] - base, positions[j] - base
                data = blob if b - a == len(blob) else memoryview(blob)[a:b]
                _pwrite_all(self._fd(seg), data, seg.size)
                _pwrite_all(
                    self._ifd(seg),
                    _index_records(first + i, terms[i:j], positions[i:j]),
                    seg.count * IDX_RECORD,
                )
                seg.count += j - i
                seg.size += b - a
                self._mark_dirty(seg)
                i = j
        finally:
            positions.pop()

    def _roll(self, start: int, first_index: int) -> _Segment:
        """Start a new segment at ``start``; the old one still gets fsynced (index included) by the next job."""
        if self._configs_dirty:
            self._flush_configs()  # recovery scans only the last segment: seal none with an entry unrecorded
        old = self._active
        if old is not None:
            self._mark_dirty(old)
        seg = _Segment(self.directory, start, first_index)
        seg.fd = os.open(seg.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        seg.ifd = os.open(seg.idx_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._open[start] = seg
        self._segs.append(seg)
        self._seg_firsts.append(first_index)
        self._active = seg
        self._dir_dirty = True
        self._evict_fds()
        return seg

    def _mark_dirty(self, seg: _Segment) -> None:
        if not seg.dirty:
            seg.dirty = True
            self._dirty.append(seg)

    def _check_writable(self) -> None:
        if self._dir_fd is None:
            raise ValueError(f"log store {self.directory} is closed")
        if self._failed is not None:
            raise OSError(
                f"log store {self.directory} failed an earlier write or fsync ({self._failed!r}); "
                "restart the node so recovery can re-read what is really on disk"
            )

    # ------------------------------------------------------------------ group commit

    def prepare_sync(self) -> SyncJob:
        """Capture (on the loop thread) the fds written since the last job and the index they cover."""
        self._check_writable()
        data: list[int] = []
        idx: list[int] = []
        segs = self._dirty
        for seg in segs:
            seg.dirty = False
            seg.holds += 1
            data.append(self._fd(seg))
            # The active segment's index is rebuilt from a full scan on recovery, so only a
            # sealed segment's index (trusted on recovery) is worth an fsync.
            if seg is not self._active:
                idx.append(self._ifd(seg))
        fds = data + idx
        if self._dir_dirty and self._dir_fd is not None:
            fds.append(self._dir_fd)
            self._dir_dirty = False
        self._dirty = []
        job = SyncJob(self.last_index, fds, segs)
        if self._configs_dirty:
            self._configs_dirty = False
            job.members = (self._members_path, self._configs_bytes())
        if self.mark_interval_s is not None and self.last_index > self._base_index:
            now = time.monotonic()
            if now - self._mark_at >= self.mark_interval_s:  # once per interval, not per entry
                self._mark_at = now
                self._marked = (self.last_index, self.last_term)
                job.mark = (self._mark_path, _mark_bytes(self.last_index, self.last_term))
        self._jobs.append(job)
        return job

    def complete_sync(self, job: SyncJob) -> int:
        """Publish a finished job: ``durable_index`` only advances past jobs that all finished, in order."""
        if not job.done:
            raise RuntimeError("complete_sync called before SyncJob.run finished")
        for seg in job._segments:
            seg.holds -= 1
        self._bury_zombies()
        if job.error is not None:
            self._failed = job.error
            self._jobs = deque(j for j in self._jobs if j is not job)
            raise job.error
        if job.mark_error is not None:
            self.mark_failed()  # owed again after the interval, as a quiet log's mark is
            log.warning(
                "could not record the durable mark: %s", job.mark_error, extra={"path": self.directory}
            )
        while self._jobs and self._jobs[0].done:
            head = self._jobs.popleft()
            if head.error is not None:  # an earlier job failed and nobody completed it yet
                self._failed = head.error
                raise OSError(f"an earlier fsync of {self.directory} failed") from head.error
            self.durable_index = max(self.durable_index, min(head.target, self.last_index))
        self._evict_fds()
        self._check_shape()
        return self.durable_index

    def mark_due(self) -> bool:
        """Whether an idle log owes a mark: its newest entries are flushed but unmarked, and the
        interval has passed since the last mark. Called on every tick, so cheap when not due.

        Under load a sync records the mark itself; this covers the log going quiet right after
        a sync that did not (the interval had not passed), which would otherwise leave those
        entries unmarked until the next append, however late. Nothing may be unflushed or in
        flight: the mark must never name an entry that is not yet on disk.
        """
        return (
            self.mark_interval_s is not None
            and self.durable_index == self.last_index > self._base_index
            and not self._jobs
            and not self._dirty
            and self._failed is None
            and self._marked != (self.last_index, self.last_term)
            and time.monotonic() - self._mark_at >= self.mark_interval_s
        )

    def prepare_mark(self) -> tuple[str, bytes]:
        """(path, content) of the mark owed when ``mark_due``: the caller writes it atomically,
        on the thread that runs the sync jobs so no job's own mark can race it."""
        self._mark_at = time.monotonic()
        self._marked = (self.last_index, self.last_term)
        return self._mark_path, _mark_bytes(self.last_index, self.last_term)

    def mark_failed(self) -> None:
        """A mark write failed (a full disk, say): owe it again after the interval."""
        self._marked = None

    def mark_durable(self) -> None:
        """Record ``durable_index`` as the durable mark now, on the calling thread (a clean stop).

        A loss while the node is down (the operator's slip, a restore from an old copy) is then
        told from a torn write whatever the mark interval: one file write per stop, none per
        append. Skipped while a sync job may still write its own mark, and on a failed store.
        """
        if self.mark_interval_s is None or self._failed is not None or self._dir_fd is None or self._jobs:
            return
        index = self.durable_index
        if index <= self._base_index or self._marked == (index, self.term_at(index)):
            return
        write_file_atomically(self._mark_path, _mark_bytes(index, self.term_at(index)))
        self._marked = (index, self.term_at(index))

    def sync(self) -> int:
        """Flush everything appended so far on the calling thread; returns ``durable_index``.

        If an older job is still running elsewhere, the result stops short of ``last_index``
        until that job completes (its files are not known to be flushed yet).
        """
        job = self.prepare_sync()
        try:
            job.run()
        except OSError:
            pass  # complete_sync re-raises it once the job's fds are released
        return self.complete_sync(job)

    # ------------------------------------------------------------------ reading

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries ``lo..hi`` inclusive, at most ``max_bytes`` of them encoded (but at least one)."""
        if lo < self.first_index:
            raise IndexError(f"index {lo} is before the first retained index {self.first_index}")
        hi = min(hi, self.last_index)
        if lo > hi:
            return []
        if max_bytes is not None:
            hi = self._clip_by_bytes(lo, hi, max_bytes)
        cf = self._cache_first
        if lo >= cf:
            return self._cache[lo - cf : hi - cf + 1]
        out = self._read_disk(lo, min(hi, cf - 1))
        if hi >= cf:
            out.extend(self._cache[: hi - cf + 1])
        return out

    def _end_pos(self, i: int) -> int:
        """End position of the entry at array slot ``i``."""
        return self._pos[i + 1] if i + 1 < len(self._pos) else self._next_pos

    def _clip_by_bytes(self, lo: int, hi: int, max_bytes: int) -> int:
        i, j = lo - self.first_index, hi - self.first_index
        limit = self._pos[i] + max_bytes
        if self._end_pos(j) <= limit:
            return hi
        k = bisect_right(self._pos, limit, i + 1, j + 1)  # entries i..k-2 end at or before limit
        return lo + max(k - 1 - i, 1) - 1

    def _read_disk(self, lo: int, hi: int) -> list[Entry]:
        out: list[Entry] = []
        si = bisect_right(self._seg_firsts, lo) - 1
        index = lo
        while index <= hi:
            seg = self._segs[si]
            b = min(hi, seg.last_index)
            self._read_segment(seg, index, b, out)
            index = b + 1
            si += 1
        return out

    def _read_segment(self, seg: _Segment, a: int, b: int, out: list[Entry]) -> None:
        """Read and verify entries a..b of one segment; any mismatch names the file and offset."""
        first = self.first_index
        off = self._pos[a - first] - seg.start
        size = self._end_pos(b - first) - seg.start - off
        buf = _pread_all(self._fd(seg), size, off)
        got, stop, err = scan_entries(buf, verify=True, copy=True)
        if err is not None:
            self._distrust_index(seg)
            raise CorruptLogError(seg.path, off + stop, err)
        if len(got) != b - a + 1:
            self._distrust_index(seg)
            raise CorruptLogError(seg.path, off + stop, f"expected {b - a + 1} entries, found {len(got)}")
        for k, e in enumerate(got, a - first):
            if e.index != k + first or e.term != self._terms[k] or e.pos != self._pos[k]:
                self._distrust_index(seg)
                raise CorruptLogError(
                    seg.path,
                    self._pos[k] - seg.start,
                    f"index/data mismatch: index says entry {k + first} term {self._terms[k]} at position "
                    f"{self._pos[k]}, data has entry {e.index} term {e.term} position {e.pos}",
                )
        out.extend(got)

    def _distrust_index(self, seg: _Segment) -> None:
        """A read found damage that recovery trusted the index past: drop the index, so the next
        start scans the segment, finds the damage and salvages the log before it (``salvage``)."""
        log.error(
            "damage found on read in %s; its index is dropped so a restart rescans it",
            seg.path,
            extra={"path": seg.path},
        )
        try:
            os.unlink(seg.idx_path)
            fsync_dir(self.directory)
        except OSError as exc:  # the read still fails; a later read tries again
            log.warning("could not drop index %s: %s", seg.idx_path, exc, extra={"path": seg.idx_path})

    # ------------------------------------------------------------------ tail cache

    def _cache_add(self, entries: Sequence[Entry]) -> None:
        """Keep the newest ``cache_bytes`` of entries so replication and dispatch never read the disk."""
        if self.cache_bytes == 0:
            self._cache_first = self.last_index + 1
            return
        self._cache.extend(entries)
        k0 = self._cache_first - self.first_index
        if self._next_pos - self._pos[k0] <= self.cache_bytes + (self.cache_bytes >> 2):
            return  # trimming in slack-sized steps keeps the list's memmove off the per-append path
        k = bisect_left(self._pos, self._next_pos - self.cache_bytes, k0, len(self._pos))
        del self._cache[: k - k0]
        self._cache_first += k - k0

    def _cache_cut_suffix(self, index: int) -> None:
        if index <= self._cache_first:
            self._cache = []
            self._cache_first = index
        else:
            del self._cache[index - self._cache_first :]

    def _cache_cut_prefix(self, first_index: int) -> None:
        if first_index > self._cache_first:
            del self._cache[: first_index - self._cache_first]
            self._cache_first = first_index

    # ------------------------------------------------------------------ truncation, reset, retention

    def truncate_suffix(self, index: int) -> None:
        """Remove entries ``>= index`` (a follower dropping a conflicting, uncommitted suffix)."""
        if index <= self._base_index:
            raise ValueError(f"cannot truncate at {index}: the log base is {self._base_index}")
        if index > self.last_index:
            return
        self._check_writable()
        k = index - self.first_index
        cut = self._pos[k]
        si = bisect_right(self._seg_firsts, index) - 1
        seg = self._segs[si]
        for later in reversed(self._segs[si + 1 :]):  # newest first: every crash point leaves a prefix
            self._delete_segment(later)
        del self._segs[si + 1 :]
        del self._seg_firsts[si + 1 :]
        keep = index - seg.first_index
        try:
            os.ftruncate(self._fd(seg), cut - seg.start)
            os.ftruncate(self._ifd(seg), keep * IDX_RECORD)
        except BaseException as exc:
            self._failed = exc
            raise
        seg.count = keep
        seg.size = cut - seg.start
        self._mark_dirty(seg)
        self._active = seg
        del self._pos[k:]
        del self._terms[k:]
        self._cache_cut_suffix(index)
        self.last_index = index - 1
        self.last_term = self.term_at(index - 1)
        self._next_pos = cut
        self._clip_jobs(index - 1)
        self.durable_index = min(self.durable_index, index - 1)
        self._drop_configs_from(index)
        self._check_shape()

    def reset(
        self, base_index: int, base_term: int, base_pos: int, base_config: ConfigRecord | None = None
    ) -> None:
        """Drop the whole log and restart it after (base_index, base_term) at position ``base_pos``.

        Segments go first (newest first), then the base file, so a crash in between leaves
        either a prefix of the old log on its old base or the empty new log, never a mix.
        ``base_config`` is the configuration in effect at the new base (the leader's), saved
        in the base file with it. The call blocks on fsyncs; it is rare (a follower too far
        behind the leader's retention).
        """
        if base_index < 0 or base_term < 0 or base_pos < 0:
            raise ValueError(f"invalid base ({base_index}, {base_term}, {base_pos})")
        self._check_writable()
        for seg in reversed(self._segs):
            self._delete_segment(seg)
        self._segs = []
        self._seg_firsts = []
        self._active = None
        fsync_dir(self.directory)
        self._dir_dirty = False
        self._save_base(base_index, base_term, base_pos, base_config)
        self._clear_memory()
        self._clip_jobs(base_index)
        self.durable_index = base_index
        if self._configs:
            self._configs = []
            self._configs_dirty = True  # stale records are harmless (ignored on load): no hurry

    def apply_retention(self, upto_index: int, now: float | None = None) -> int:
        """Delete old segments wholly below ``upto_index`` while over the size or age limit.

        The new base is persisted before any file is removed, so a crash part-way leaves
        segments that recovery recognises as already retained (they end before the base).
        """
        if self.retention_bytes is None and self.retention_seconds is None:
            return self.first_index
        self._check_writable()
        victims = self._retention_victims(upto_index, time.time() if now is None else now)
        if not victims:
            return self.first_index
        new_first = victims[-1].last_index + 1
        survivor = self._segs[len(victims)]
        base_config = self._base_config
        kept = [r for r in self._configs if r[0] >= new_first]
        if len(kept) < len(self._configs):
            base_config = self._configs[len(self._configs) - len(kept) - 1]
        self._save_base(new_first - 1, self.term_at(new_first - 1), survivor.start, base_config)
        self._configs = kept  # the members file keeps the retained ones too: ignored on load
        for seg in victims:
            self._delete_segment(seg)
        n = len(victims)
        del self._segs[:n]
        del self._seg_firsts[:n]
        del self._pos[: new_first - self.first_index]
        del self._terms[: new_first - self.first_index]
        self.first_index = new_first
        self._cache_cut_prefix(new_first)
        log.info(
            "retention removed %d segment(s); log now starts at index %d",
            n,
            new_first,
            extra={"path": self.directory, "first_index": new_first},
        )
        return new_first

    def _retention_victims(self, upto_index: int, now: float) -> list[_Segment]:
        limit = min(upto_index, self.last_index)  # never the segment holding last_index
        total = self.size_bytes()
        victims: list[_Segment] = []
        for seg in self._segs[:-1]:
            if seg.count == 0 or seg.last_index >= limit:
                break
            over_size = self.retention_bytes is not None and total > self.retention_bytes
            too_old = (
                self.retention_seconds is not None
                and now - os.stat(seg.path).st_mtime > self.retention_seconds
            )
            if not (over_size or too_old):
                break
            victims.append(seg)
            total -= seg.size
        return victims

    def _clip_jobs(self, index: int) -> None:
        """Jobs in flight must not vouch for entries that were replaced after they were prepared."""
        for job in self._jobs:
            job.target = min(job.target, index)

    def _delete_segment(self, seg: _Segment) -> None:
        """Unlink a segment; fds a running job still fsyncs are closed when that job completes."""
        if seg.dirty:
            seg.dirty = False
            self._dirty.remove(seg)
        if seg.holds:
            if self._open.get(seg.start) is seg:
                del self._open[seg.start]
            self._zombies.append(seg)
        else:
            self._close_fds(seg)
        if seg is self._active:
            self._active = None
        for path in (seg.path, seg.idx_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._dir_dirty = True

    def _bury_zombies(self) -> None:
        if self._zombies:
            alive = []
            for seg in self._zombies:
                if seg.holds:
                    alive.append(seg)
                else:
                    self._close_fds(seg)
            self._zombies = alive

    # ------------------------------------------------------------------ fds

    def _fd(self, seg: _Segment) -> int:
        fd = seg.fd
        if fd is None:
            fd = seg.fd = os.open(seg.path, os.O_RDWR)
            self._track_open(seg)
        return fd

    def _ifd(self, seg: _Segment) -> int:
        fd = seg.ifd
        if fd is None:
            fd = seg.ifd = os.open(seg.idx_path, os.O_RDWR | os.O_CREAT, 0o644)
            self._track_open(seg)
        return fd

    def _track_open(self, seg: _Segment) -> None:
        self._open.pop(seg.start, None)
        self._open[seg.start] = seg
        self._evict_fds(keep=seg)

    def _evict_fds(self, keep: _Segment | None = None) -> None:
        """Close idle segments' fds beyond ``_MAX_OPEN``; never one a sync still owes a flush to."""
        if len(self._open) <= _MAX_OPEN:
            return
        for seg in list(self._open.values()):
            if len(self._open) <= _MAX_OPEN:
                break
            if seg is not self._active and seg is not keep and not seg.dirty and not seg.holds:
                self._close_fds(seg)

    def _close_fds(self, seg: _Segment) -> None:
        if self._open.get(seg.start) is seg:
            del self._open[seg.start]
        for fd in (seg.fd, seg.ifd):
            if fd is not None:
                os.close(fd)
        seg.fd = seg.ifd = None

    def close(self) -> None:
        """Close every fd; unsynced appends stay in the page cache (call ``sync`` first to keep them)."""
        if self._configs_dirty and self._failed is None and self._dir_fd is not None:
            try:
                self._flush_configs()
            except OSError as exc:  # recovery's scan of the last segment finds them anyway
                log.warning("could not write the membership records at close: %s", exc)
        for seg in list(self._open.values()) + self._zombies:
            self._close_fds(seg)
        self._zombies = []
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"LogStore({self.directory!r}, first={self.first_index}, last={self.last_index}, "
            f"durable={self.durable_index}, segments={len(self._segs)})"
        )

    # ------------------------------------------------------------------ base file

    def _load_base(self) -> tuple[int, int, int]:
        try:
            with open(self._base_path, "rb") as f:
                raw = f.read(MAX_MEMBERS_FILE_BYTES + 1)
        except FileNotFoundError:
            return 0, 0, 0
        if len(raw) == _BASE.size:
            magic, index, term, pos, checksum = _BASE.unpack(raw)
            if magic != _BASE_MAGIC or xxhash.xxh3_64_intdigest(raw[:-8]) != checksum:
                raise CorruptLogError(self._base_path, 0, "base file checksum mismatch")
            return index, term, pos
        if len(raw) < _BASE_CFG.size + 8 or len(raw) > MAX_MEMBERS_FILE_BYTES:
            raise CorruptLogError(self._base_path, 0, f"base file is {len(raw)} bytes, expected {_BASE.size}")
        magic, index, term, pos, cfg_index, cfg_term, size = _BASE_CFG.unpack_from(raw)
        if (
            magic != _BASE_CFG_MAGIC
            or len(raw) != _BASE_CFG.size + size + 8
            or xxhash.xxh3_64_intdigest(raw[:-8]) != int.from_bytes(raw[-8:], "little")
        ):
            raise CorruptLogError(self._base_path, 0, "base file checksum mismatch")
        self._base_config = (cfg_index, cfg_term, bytes(raw[_BASE_CFG.size : -8]))
        return index, term, pos

    def _save_base(self, index: int, term: int, pos: int, config: ConfigRecord | None = None) -> None:
        """Persist the base, with the configuration in effect at it when there is one (the old,
        shorter format otherwise, which earlier versions read too)."""
        if config is None:
            body = _BASE.pack(_BASE_MAGIC, index, term, pos, 0)[:-8]
        else:
            body = _BASE_CFG.pack(_BASE_CFG_MAGIC, index, term, pos, config[0], config[1], len(config[2]))
            body += config[2]
        write_file_atomically(self._base_path, body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little"))
        self._base_index, self._base_term, self._base_pos = index, term, pos
        self._base_config = config

    # ------------------------------------------------------------------ membership configurations

    def save_config(self, index: int, term: int, data: bytes) -> None:
        """Record the configuration entry (index, term), about to be appended.

        Called by the Raft core right before the ``append`` that writes the entry. The next
        sync job writes the record before it flushes the entry (see the module docstring); if
        the append never happens or a crash loses it, the record no longer matches the log and
        is ignored on the next open.
        """
        self._check_writable()
        self._drop_configs_from(index)
        self._configs.append((index, term, bytes(data)))
        self._configs_dirty = True

    def config_records(self) -> list[ConfigRecord]:
        """The configuration at the base (when known), then every configuration entry in the log."""
        out = [] if self._base_config is None else [self._base_config]
        out.extend(self._configs)
        return out

    def _drop_configs_from(self, index: int) -> None:
        configs = self._configs
        while configs and configs[-1][0] >= index:
            configs.pop()

    def _configs_bytes(self) -> bytes:
        parts = [_MEMBERS_HEAD.pack(_MEMBERS_MAGIC, len(self._configs))]
        for index, term, data in self._configs:
            parts.append(_MEMBER_REC.pack(index, term, len(data)))
            parts.append(data)
        body = b"".join(parts)
        return body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")

    def _flush_configs(self) -> None:
        """Write the records now, on the calling thread (a roll; a reset; closing)."""
        try:
            write_file_atomically(self._members_path, self._configs_bytes())
        except BaseException as exc:
            self._failed = exc  # an entry may be durable without its record: only a restart is safe
            raise
        self._configs_dirty = False

    def _load_configs(self) -> None:
        """Read the members file and keep the records whose entries the recovered log still holds."""
        path = self._members_path
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_MEMBERS_FILE_BYTES + 1)
        except FileNotFoundError:
            self._adopt_configs([])
            return
        if (
            len(raw) < _MEMBERS_HEAD.size + 8
            or len(raw) > MAX_MEMBERS_FILE_BYTES
            or xxhash.xxh3_64_intdigest(raw[:-8]) != int.from_bytes(raw[-8:], "little")
        ):
            raise CorruptLogError(path, 0, "members file checksum mismatch or bad size")
        magic, count = _MEMBERS_HEAD.unpack_from(raw)
        if magic != _MEMBERS_MAGIC or count > MAX_CONFIG_RECORDS:
            raise CorruptLogError(
                path, 0, f"members file has a bad header (magic 0x{magic:08x}, {count} records)"
            )
        off, end = _MEMBERS_HEAD.size, len(raw) - 8
        records: list[ConfigRecord] = []
        for _ in range(count):
            if off + _MEMBER_REC.size > end:
                raise CorruptLogError(path, off, "members file ends inside a record")
            index, term, size = _MEMBER_REC.unpack_from(raw, off)
            off += _MEMBER_REC.size
            if off + size > end:
                raise CorruptLogError(path, off, "members file ends inside a record")
            records.append((index, term, bytes(raw[off : off + size])))
            off += size
        if off != end:
            raise CorruptLogError(path, off, "members file has bytes after its last record")
        self._adopt_configs(records)

    def _adopt_configs(self, records: list[ConfigRecord]) -> None:
        """Keep the records (and those recovery's scan found) that the recovered log still holds."""
        kept: dict[int, ConfigRecord] = {}
        for rec in [*records, *self._scanned_configs]:
            index, term = rec[0], rec[1]
            if self._base_index < index <= self.last_index and self.term_at(index) == term:
                kept[index] = rec  # a later record of one index wins (they agree: same term)
        self._configs = [kept[i] for i in sorted(kept)]
        self._scanned_configs = []

    # ------------------------------------------------------------------ recovery

    def _clear_memory(self) -> None:
        """An empty log after the base."""
        self.first_index = self._base_index + 1
        self.last_index = self._base_index
        self.last_term = self._base_term
        self.durable_index = self._base_index
        self._next_pos = self._base_pos
        self._pos = array("q")
        self._terms = array("q")
        self._cache: list[Entry] = []
        self._cache_first = self.first_index

    def _recover(self) -> None:
        """Rebuild the in-memory view from disk, repairing only what a crash can explain."""
        starts = self._list_segments()
        if not starts:
            return
        if starts[0] != self._base_pos and not self.salvage:
            raise CorruptLogError(
                self._seg_path(starts[0]),
                0,
                f"first segment starts at position {starts[0]} but the log base is at {self._base_pos} "
                "(a segment or the base file is missing)",
            )
        for i, start in enumerate(starts):
            try:
                if start == starts[-1]:
                    self._recover_last(start)
                else:
                    self._recover_sealed(start)
            except CorruptLogError as exc:
                if not self.salvage:
                    raise
                self._salvage(starts[i:], exc)
                break
        os.fsync(self._dir_fd)  # type: ignore[arg-type]
        self.durable_index = self.last_index
        self._cache_first = self.last_index + 1

    def _seg_path(self, start: int) -> str:
        return os.path.join(self.directory, f"{start:020d}{SEG_SUFFIX}")

    def _list_segments(self) -> list[int]:
        """Segment starts in order, after removing what a crash during retention or deletion left."""
        segs: set[int] = set()
        idxs: set[int] = set()
        for name in os.listdir(self.directory):
            m = _SEG_RE.match(name)
            if m:
                (segs if m.group(2) == "seg" else idxs).add(int(m.group(1)))
        for start in sorted(idxs - segs):
            os.unlink(os.path.join(self.directory, f"{start:020d}{IDX_SUFFIX}"))
        starts = sorted(segs)
        for start in [s for s in starts if s < self._base_pos]:
            # Retention persists the new base before deleting, so these are already retained.
            log.info("removing segment retained before the base", extra={"path": self._seg_path(start)})
            for path in (self._seg_path(start), self._seg_path(start)[: -len(SEG_SUFFIX)] + IDX_SUFFIX):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        return [s for s in starts if s >= self._base_pos]

    def _check_segment_start(self, seg: _Segment) -> None:
        if seg.start != self._next_pos:
            raise CorruptLogError(
                seg.path,
                0,
                f"segment starts at position {seg.start} but the previous one ends at {self._next_pos} "
                "(data missing between segments)",
            )

    def _adopt(self, seg: _Segment, terms: array, positions: array, size: int) -> None:
        """Append a recovered segment to the in-memory view."""
        seg.count = len(terms)
        seg.size = size
        self._segs.append(seg)
        self._seg_firsts.append(seg.first_index)
        self._pos.extend(positions)
        self._terms.extend(terms)
        self.last_index += seg.count
        if seg.count:
            self.last_term = terms[-1]
        self._next_pos = seg.start + size

    def _recover_sealed(self, start: int) -> None:
        """A segment that is not the last: trust its index once cheaply validated, else rebuild it by scanning."""
        seg = _Segment(self.directory, start, self.last_index + 1)
        self._check_segment_start(seg)
        fd = self._fd(seg)
        size = os.fstat(fd).st_size
        cols = self._load_index(seg, size)
        if cols is None:
            log.warning(
                "index %s missing or inconsistent with its segment; rebuilding it by scanning",
                seg.idx_path,
                extra={"path": seg.idx_path},
            )
            buf = _pread_all(fd, size, 0)
            got, end, err = scan_entries(buf, verify=True, copy=False)
            if err is not None:
                raise CorruptLogError(seg.path, end, f"{err} (in a segment that is not the last)")
            if not got:
                raise CorruptLogError(seg.path, 0, "empty segment that is not the last")
            cols = self._check_run(seg, got)
            del got, buf
            self._rewrite_index(seg, *cols)
        os.fsync(fd)
        self._adopt(seg, cols[0], cols[1], size)
        self._close_fds(seg)

    def _load_index(self, seg: _Segment, size: int) -> tuple[array, array] | None:
        """The index's (terms, positions) if it agrees with the segment; None means rebuild."""
        try:
            with open(seg.idx_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        n = len(raw) // IDX_RECORD
        if n == 0 or len(raw) % IDX_RECORD:
            return None
        rec = array("q", raw)
        if not _LITTLE:
            rec.byteswap()
        indexes, terms, positions = rec[0::3], rec[1::3], rec[2::3]
        if indexes != array("q", range(seg.first_index, seg.first_index + n)):
            return None
        if positions[0] != seg.start or terms[0] < self.last_term:
            return None
        if not (_increasing(positions, strict=True) and _increasing(terms, strict=False)):
            return None
        last_off = positions[-1] - seg.start
        if last_off >= size:
            return None
        got, end, err = scan_entries(_pread_all(self._fd(seg), size - last_off, last_off), verify=True)
        if err is not None or len(got) != 1 or last_off + end != size:
            return None
        e = got[0]
        if (e.index, e.term, e.pos) != (indexes[-1], terms[-1], positions[-1]):
            return None
        return terms, positions

    def _recover_last(self, start: int) -> None:
        """Verify every entry of the last segment; cut a torn tail, refuse corruption followed by data."""
        seg = _Segment(self.directory, start, self.last_index + 1)
        self._check_segment_start(seg)
        fd = self._fd(seg)
        buf = _pread_all(fd, os.fstat(fd).st_size, 0)
        got, end, err = scan_entries(buf, verify=True, copy=False)
        terms, positions = self._check_run(seg, got)
        self._scanned_configs = [(e.index, e.term, bytes(e.data)) for e in got if e.kind == KIND_CONFIG]
        del got
        if err is not None:
            if _valid_entry_after(buf, end, seg.start):
                raise CorruptLogError(seg.path, end, f"{err}, followed by valid entries")
            log.warning(
                "truncating torn tail of %s at offset %d (%s, %d bytes dropped)",
                seg.path,
                end,
                err,
                len(buf) - end,
                extra={"path": seg.path, "offset": end, "reason": err},
            )
            os.ftruncate(fd, end)
        os.fsync(fd)
        self._rewrite_index(seg, terms, positions, only_if_different=True)
        self._adopt(seg, terms, positions, end)
        self._active = seg

    def _salvage(self, starts: list[int], exc: CorruptLogError) -> None:
        """Keep the log up to the first damaged entry of segment ``starts[0]``; drop the rest.

        Corruption is data this node wrote, may have acknowledged, and no longer has. It is
        not repaired here (only peers hold the lost entries): the valid prefix stays, the
        segments from the damage on are cut or removed (newest first, so a crash part-way
        leaves a prefix), and ``lost_from`` tells the node it must not vote or count towards
        a quorum until a leader has brought it back up to date (protocol-aware recovery).
        """
        for start in starts:
            stale = self._open.get(start)
            if stale is not None:
                self._close_fds(stale)
        first_lost = self.last_index + 1
        start = starts[0]
        seg: _Segment | None = None
        if start == self._next_pos:  # else a gap before it: none of it can be placed
            seg = _Segment(self.directory, start, first_lost)
            fd = self._fd(seg)
            buf = _pread_all(fd, os.fstat(fd).st_size, 0)
            got, _, _ = scan_entries(buf, verify=True, copy=False)
            keep = self._run_length(seg, got)
            terms = array("q", [e.term for e in got[:keep]])
            positions = array("q", [e.pos for e in got[:keep]])
            end = (positions[-1] - start + len(got[keep - 1].raw)) if keep else 0  # type: ignore[arg-type]
            first_lost += keep
            del got, buf
        claim = self._last_valid_entry(starts)
        if claim is not None and claim[0] < first_lost:
            claim = None  # nothing valid beyond what is kept
        self.lost_claim = claim
        claim_text = "-" if claim is None else f"{claim[0]} {claim[1]}"
        # Durable before anything is cut: a crash mid-salvage must not forget the loss.
        write_file_atomically(self._damage_path, f"{first_lost}\n{claim_text}\n{exc}\n".encode())
        for later in reversed(starts[1:]):
            self._unlink_segment_files(later)
        if seg is None:
            self._unlink_segment_files(start)
            if self._segs:
                self._active = self._segs[-1]
        else:
            os.ftruncate(fd, end)
            os.fsync(fd)
            self._rewrite_index(seg, terms, positions)
            self._adopt(seg, terms, positions, end)
            self._active = seg
        self.lost_from = self.last_index + 1
        self.lost_reason = str(exc)
        log.error(
            "log damaged (%s): kept entries up to %d, dropped the rest; "
            "the node must re-fetch them from its peers",
            exc,
            self.last_index,
            extra={"path": exc.path, "offset": exc.offset, "last_index": self.last_index},
        )

    def _load_damage(self) -> None:
        """A salvage before a restart still counts until ``forget_damage``: the entries are still missing."""
        try:
            with open(self._damage_path, "rb") as f:
                raw = f.read(DAMAGE_MAX_BYTES)
        except FileNotFoundError:
            return
        lines = raw.decode("utf-8", "replace").split("\n", 2)
        first = lines[0]
        self.lost_from = int(first) if first.isdigit() else self.last_index + 1
        claim = lines[1].split() if len(lines) > 1 else []
        if len(claim) == 2 and all(c.isdigit() for c in claim):
            self.lost_claim = (int(claim[0]), int(claim[1]))
        reason = lines[2].strip() if len(lines) > 2 else ""
        self.lost_reason = reason or f"unreadable damage marker {self._damage_path}"

    def _check_mark(self) -> None:
        """A log that ends before what an earlier sync made durable lost entries (emptied or cut
        short): the same salvage state as damage found by a scan, claiming the marked entry."""
        try:
            with open(self._mark_path, "rb") as f:
                raw = f.read(_MARK.size + 1)
        except FileNotFoundError:
            return
        if len(raw) != _MARK.size:
            log.warning("ignoring durable mark %s: %d bytes", self._mark_path, len(raw))
            return
        magic, index, term, checksum = _MARK.unpack(raw)
        if magic != _MARK_MAGIC or xxhash.xxh3_64_intdigest(raw[:-8]) != checksum:
            log.warning("ignoring durable mark %s: checksum mismatch", self._mark_path)
            return
        if (self.last_term, self.last_index) >= (term, index):
            self._marked = (index, term)
            return
        claim = (index, term)
        if self.lost_claim is not None:
            claim = max(claim, self.lost_claim, key=lambda c: (c[1], c[0]))
        if self.lost_from is None or self.lost_claim != claim:
            self.lost_from = min(self.lost_from or self.last_index + 1, self.last_index + 1)
            self.lost_claim = claim
            reason = f"log ends at index {self.last_index} term {self.last_term}, before {claim} made durable earlier"
            self.lost_reason = self.lost_reason or reason
            write_file_atomically(
                self._damage_path, f"{self.lost_from}\n{claim[0]} {claim[1]}\n{self.lost_reason}\n".encode()
            )
            log.error("log lost entries it had made durable: %s", reason, extra={"path": self.directory})

    def forget_damage(self) -> None:
        """The node re-fetched what a salvage dropped (a leader caught it up): the log is whole again."""
        self.lost_from = None
        self.lost_claim = None
        self.lost_reason = ""
        try:
            os.unlink(self._damage_path)
        except FileNotFoundError:
            return
        fsync_dir(self.directory)

    def _last_valid_entry(self, starts: list[int]) -> tuple[int, int] | None:
        """(index, term) of the last whole, checksummed entry at its own position in these segments.

        Entries past the damage are still evidence of what this node wrote (and may have
        acknowledged), though they can no longer be kept: the log has a hole before them.
        """
        for start in reversed(starts):
            try:
                with open(self._seg_path(start), "rb") as f:
                    buf = f.read()
            except FileNotFoundError:
                continue
            best: Entry | None = None
            view = memoryview(buf)
            i = buf.find(_MAGIC_BYTES)
            while i != -1:
                got, _, _ = scan_entries(view[i:], verify=True, copy=False)
                k, pos = 0, start + i
                while k < len(got) and got[k].pos == pos:
                    pos += len(got[k].raw)  # type: ignore[arg-type]
                    k += 1
                if k:
                    best = got[k - 1]
                i = buf.find(_MAGIC_BYTES, pos - start if k else i + 1)
            if best is not None:
                return best.index, best.term
        return None

    def _unlink_segment_files(self, start: int) -> None:
        for path in (self._seg_path(start), self._seg_path(start)[: -len(SEG_SUFFIX)] + IDX_SUFFIX):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def _run_length(self, seg: _Segment, got: list[Entry]) -> int:
        """How many of ``got`` sit where the log says: contiguous indexes and positions, terms not decreasing."""
        index, pos, term = seg.first_index, seg.start, self.last_term
        for k, e in enumerate(got):
            if e.index != index or e.pos != pos or e.term < term:
                return k
            index += 1
            pos += len(e.raw)  # type: ignore[arg-type]
            term = e.term
        return len(got)

    def _check_run(self, seg: _Segment, got: list[Entry]) -> tuple[array, array]:
        """Entries with valid checksums must also be where the log says: contiguous indexes, positions, terms."""
        k = self._run_length(seg, got)
        if k < len(got):
            e = got[k]
            pos = seg.start if k == 0 else got[k - 1].pos + len(got[k - 1].raw)  # type: ignore[arg-type]
            term = self.last_term if k == 0 else got[k - 1].term
            raise CorruptLogError(
                seg.path,
                pos - seg.start,
                f"entry header says index {e.index} term {e.term} position {e.pos}; "
                f"expected index {seg.first_index + k} position {pos} term >= {term}",
            )
        return array("q", [e.term for e in got]), array("q", [e.pos for e in got])

    def _rewrite_index(
        self, seg: _Segment, terms: array, positions: array, only_if_different: bool = False
    ) -> None:
        want = _index_records(seg.first_index, terms, positions)
        ifd = self._ifd(seg)
        if only_if_different:
            have = _pread_all(ifd, os.fstat(ifd).st_size, 0)
            if have == want:
                return
            if not (want.startswith(have) or have.startswith(want)):  # else a crash cut one short
                log.warning(
                    "index %s disagreed with its segment; rewritten",
                    seg.idx_path,
                    extra={"path": seg.idx_path},
                )
        os.ftruncate(ifd, 0)
        _pwrite_all(ifd, want, 0)
        os.fsync(ifd)


def _valid_entry_after(buf: bytes, offset: int, seg_start: int) -> bool:
    """Whether a whole, checksummed entry sits at its own position anywhere past ``offset``.

    That is what tells corruption (data we wrote and later lost the middle of) from a torn
    tail (the unfinished end of the last write, or garbage after it). The position check
    rules out stray copies of entries inside payloads.
    """
    view = memoryview(buf)
    i = buf.find(_MAGIC_BYTES, offset + 1)
    while i != -1:
        got, _, _ = scan_entries(view[i:], verify=True, copy=False, limit=1)
        if got and got[0].pos == seg_start + i:
            return True
        i = buf.find(_MAGIC_BYTES, i + 1)
    return False
