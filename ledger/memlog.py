"""An in-memory log with the store's semantics, for deterministic simulation.

It behaves like ``LogStore`` as the Raft core sees it, including durability: ``sync()``
marks what survives, and ``crash()`` throws away everything written since, as a power
loss would. Simulations therefore exercise the same acknowledge-only-what-is-durable
rules the real node relies on.

Membership configurations are read from the entries themselves (``config_records``): what a
crash leaves of the log is exactly what ``LogStore``'s records, validated against its
recovered log, leave. The configuration in effect at the base survives ``reset`` and
``compact`` as it does in the store's base file.

An fsync that runs while the log keeps changing is modelled physically rather than by
rule: every append gets a write number, ``write_mark()`` is taken when an fsync starts
and ``sync_through(mark)`` makes durable only the prefix written before it. An entry
rewritten after a truncation carries a newer number, so an fsync that started earlier
never covers it, exactly as a real fsync would not.
"""

from __future__ import annotations

from collections.abc import Sequence

from .codec import HEADER_SIZE, KIND_CONFIG, Entry

#: A configuration record: (index, term, encoded ``Membership``), as ``LogStore`` keeps them.
ConfigRecord = tuple[int, int, bytes]


class MemoryLog:
    def __init__(self) -> None:
        self.base_index = 0
        self.base_term = 0
        self.base_pos = 0
        self._entries: list[Entry] = []
        self._written: list[int] = []  # write number of each entry, parallel to _entries
        self._writes = 0
        self.durable_index = 0
        self.truncations = 0
        self.rewrites = 0  # entries removed or replaced (truncation, reset, crash): never decremented
        self.base_config: ConfigRecord | None = None  # the configuration in effect at the base
        self._configs: list[int] = []  # indexes of the configuration entries held, ascending

    @property
    def first_index(self) -> int:
        return self.base_index + 1

    @property
    def last_index(self) -> int:
        return self.base_index + len(self._entries)

    @property
    def last_term(self) -> int:
        return self._entries[-1].term if self._entries else self.base_term

    def term_at(self, index: int) -> int:
        if index == self.base_index:
            return self.base_term
        if index < self.base_index or index > self.last_index:
            raise IndexError(f"index {index} outside {self.base_index}..{self.last_index}")
        return self._entries[index - self.base_index - 1].term

    def next_pos(self) -> int:
        if not self._entries:
            return self.base_pos
        last = self._entries[-1]
        return last.pos + HEADER_SIZE + len(last.data)

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        if lo < self.first_index:
            raise IndexError(f"index {lo} is before the first retained index {self.first_index}")
        hi = min(hi, self.last_index)
        if max_bytes is None:
            return self._entries[lo - self.base_index - 1 : hi - self.base_index]
        out: list[Entry] = []
        size = 0
        for e in self._entries[lo - self.base_index - 1 : hi - self.base_index]:
            size += HEADER_SIZE + len(e.data)
            if out and max_bytes is not None and size > max_bytes:
                break
            out.append(e)
        return out

    def append(self, entries: Sequence[Entry]) -> None:
        pos = self.next_pos()
        for e in entries:
            if e.index != self.last_index + 1:
                raise ValueError(f"append of index {e.index} after {self.last_index}")
            # Copy: in a simulation the "sent" entry object must not alias the stored one.
            self._entries.append(Entry(e.index, e.term, bytes(e.data), e.kind, pos))
            if e.kind == KIND_CONFIG:
                self._configs.append(e.index)
            pos += HEADER_SIZE + len(e.data)
        self._writes += 1
        self._written.extend([self._writes] * len(entries))

    def truncate_suffix(self, index: int) -> None:
        if index <= self.base_index:
            raise ValueError(f"cannot truncate at {index}: base is {self.base_index}")
        del self._entries[index - self.base_index - 1 :]
        del self._written[index - self.base_index - 1 :]
        self.durable_index = min(self.durable_index, index - 1)
        self.truncations += 1
        self.rewrites += 1
        self._drop_configs_from(index)

    def reset(
        self, base_index: int, base_term: int, base_pos: int, base_config: ConfigRecord | None = None
    ) -> None:
        self.base_index, self.base_term, self.base_pos = base_index, base_term, base_pos
        self.base_config = base_config
        self._entries = []
        self._written = []
        self._configs = []
        self.durable_index = base_index
        self.rewrites += 1

    def compact(self, upto_index: int) -> None:
        """Drop entries below ``upto_index`` (retention), keeping the base consistent."""
        upto = min(upto_index, self.last_index)
        if upto <= self.first_index:
            return
        n = upto - self.first_index
        while self._configs and self._configs[0] < upto:
            e = self._entries[self._configs.pop(0) - self.base_index - 1]
            self.base_config = (e.index, e.term, bytes(e.data))
        last_dropped = self._entries[n - 1]
        self.base_term = last_dropped.term
        self.base_pos = last_dropped.pos + HEADER_SIZE + len(last_dropped.data)
        self.base_index = last_dropped.index
        del self._entries[:n]
        del self._written[:n]

    def save_config(self, index: int, term: int, data: bytes) -> None:
        """A configuration entry is about to be appended: nothing to record, the entry is the record."""

    def config_records(self) -> list[ConfigRecord]:
        """The configuration at the base (if known), then every configuration entry in the log."""
        out = [] if self.base_config is None else [self.base_config]
        for index in self._configs:
            e = self._entries[index - self.base_index - 1]
            out.append((e.index, e.term, bytes(e.data)))
        return out

    def _drop_configs_from(self, index: int) -> None:
        configs = self._configs
        while configs and configs[-1] >= index:
            configs.pop()

    def sync(self) -> int:
        self.durable_index = self.last_index
        return self.durable_index

    def write_mark(self) -> int:
        """The number of the latest write; an fsync starting now covers writes up to it."""
        return self._writes

    def sync_through(self, mark: int) -> int:
        """An fsync that started at ``mark`` completes: the prefix written before it is durable."""
        i = max(0, self.durable_index - self.base_index)
        written = self._written
        while i < len(written) and written[i] <= mark:
            i += 1
        self.durable_index = max(self.durable_index, self.base_index + i)
        return self.durable_index

    def crash(self) -> None:
        """Lose everything not yet synced."""
        if self.durable_index < self.last_index:
            del self._entries[self.durable_index - self.base_index :]
            del self._written[self.durable_index - self.base_index :]
            self.rewrites += 1
            self._drop_configs_from(self.durable_index + 1)
