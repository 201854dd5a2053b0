"""How many partitions an analysis uses: no more than its keys can fill.

Every check is keyed by (src, key) and the operations are hash-partitioned that way once
(``frames.pair_ops``), so a history with k keys fills at most k partitions whatever their
number; the others are empty tasks in every stage of every job. A full-rate queue run has
two keys (its queues): at the size-based 22 partitions its check ran about 600 empty tasks
of about 15 ms each. So the keys are sampled from the start of each input and, when they
are fewer than the size-based count, the analysis uses the smallest count at which Spark's
own partitioning hash puts every sampled key in a partition of its own (two keys sharing
one would leave a core idle). A key the sample missed still lands in some partition: only
balance, never a verdict, depends on this.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jepsen.checker.frames import Source

SAMPLE_BYTES = 1 << 20  # read from the start of each JSON Lines file


def _key_text(key: Any) -> str:
    """A key as the JSON reader's string column holds it ("" when absent, as pair_ops makes it)."""
    if key is None:
        return ""
    return key if isinstance(key, str) else json.dumps(key, separators=(",", ":"))


def sample_keys(sources: list[Source], enough: int | None = None) -> set[tuple[int, str]] | None:
    """The (src, key) pairs in the first SAMPLE_BYTES of every JSON Lines input file (of a Parquet
    history: the first row group of each shard's first part); None when an input cannot be
    sampled here (another format, or a path only the cluster can read). Stops reading once
    ``enough`` pairs are found (the caller's answer is then settled)."""
    out: set[tuple[int, str]] = set()
    for s in sources:
        if enough is not None and len(out) >= enough:
            break
        if s.events is not None:
            out.update((s.src, _key_text(ev.key)) for ev in s.events)
            continue
        path = Path(s.path)
        if s.fmt == "parquet":
            found = _parquet_keys(path)
            if found is None:
                return None
            out.update((s.src, k) for k in found)
            continue
        if s.fmt != "jsonl":
            return None
        try:
            files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
            for f in files:
                with open(f, "rb") as fh:
                    chunk = fh.read(SAMPLE_BYTES)
                for line in chunk.split(b"\n")[:-1]:  # the last piece may be cut short
                    try:
                        obj = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(obj, dict):
                        out.add((s.src, _key_text(obj.get("key"))))
        except OSError:
            return None
    return out


def _parquet_keys(path: Path) -> set[str] | None:
    """The keys in the first part of each shard of a Parquet history (None: unreadable here)."""
    from jepsen.checker import columnar

    try:
        import pyarrow.parquet as pq

        files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
        if not files:
            return None
        firsts: dict[str, Path] = {}
        for f in files:
            firsts.setdefault(columnar.shard_name(f), f)
        keys: set[str] = set()
        for f in firsts.values():
            with pq.ParquetFile(f) as pf:
                if pf.metadata.num_row_groups:
                    col = pf.read_row_group(0, columns=["key"]).column("key")
                    keys.update(_key_text(k) for k in col.unique().to_pylist())
        return keys
    except Exception:  # noqa: BLE001 - not sampled: the size-based count stands
        return None


# Spark's Murmur3Hash (the hash of its hash partitioning), as Murmur3_x86_32 computes it
_C1, _C2, _MASK = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
SPARK_HASH_SEED = 42


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix_k1(k1: int) -> int:
    return (_rotl((k1 * _C1) & _MASK, 15) * _C2) & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _MASK


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    return h1 ^ (h1 >> 16)


def _hash_int(value: int, seed: int) -> int:
    return _fmix(_mix_h1(seed, _mix_k1(value & _MASK)), 4)


def _hash_bytes(data: bytes, seed: int) -> int:
    """Spark's ``hashUnsafeBytes``: little-endian 4-byte words, then each remaining byte alone
    (sign-extended), unlike the reference Murmur3's tail."""
    h1 = seed
    aligned = len(data) - len(data) % 4
    for i in range(0, aligned, 4):
        h1 = _mix_h1(h1, _mix_k1(int.from_bytes(data[i : i + 4], "little")))
    for b in data[aligned:]:
        h1 = _mix_h1(h1, _mix_k1((b - 256 if b > 127 else b) & _MASK))
    return _fmix(h1, len(data))


def spark_hash(src: int, key: str) -> int:
    """``F.hash(src, key)`` for an int ``src`` and a string ``key``, as a signed 32-bit int:
    which partition Spark's ``repartition(n, "src", "key")`` puts the pair in is
    ``spark_hash % n``. Computed here, the partition count needs no Spark job (a session's
    first job took 6-22 s on a loaded machine, most of it start-up the checks then repeat)."""
    h = _hash_bytes(key.encode("utf-8"), _hash_int(src, SPARK_HASH_SEED))
    return h - (1 << 32) if h & 0x80000000 else h


def partitions(sources: list[Source], upper: int) -> int:
    """At most ``upper`` (the size-based count): fewer when the sampled keys are fewer, as
    few as keep them in partitions of their own."""
    keys = sample_keys(sources, enough=upper)
    if not keys or len(keys) >= upper:
        return upper
    hashes = [spark_hash(src, key) for src, key in sorted(keys)]
    for n in range(max(2, len(hashes)), upper):
        if len({h % n for h in hashes}) == len(hashes):
            return n
    return upper
