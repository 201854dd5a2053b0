"""Client adapters: what a workload calls, and how system answers become ok / fail / info.

A workload talks to any system through two small interfaces, :class:`LogClient`
(append-only log: send, poll) and :class:`RegisterClient` (read, write, cas per key). An
adapter raises :class:`Definite` when the operation certainly did not take effect
(history ``fail``) and :class:`Indefinite` when it may have (``info``); anything else it
raises is treated as indefinite too, because guessing "failed" for an operation that did
happen is exactly the bug a Jepsen test exists to catch.

Ledger classification (from ``ledger.client.LedgerClient._call``): ``UNKNOWN_OUTCOME`` is
raised whenever an append left the client and no answer came back, and the client never
retries such an append; ``NOT_LEADER`` answers are retried and, when the deadline runs
out, surface as ``UNAVAILABLE`` — which for an append therefore means every attempt was
refused or never sent. ``FAILED`` (overwritten by a newer leader), ``BUSY`` (refused: too many appends await commit),
``BAD_REQUEST`` and ``TOO_LARGE`` are definite. Reads have no effect, so every read error is a ``fail``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ledger.client import LedgerClient
from ledger.codec import KIND_NORMAL, Entry
from ledger.wire import BAD_REQUEST, BUSY, FAILED, NOT_LEADER, TOO_LARGE, UNAVAILABLE, LedgerError

Pair = tuple[int, Any]  # (offset, value) as the history records it


class Definite(Exception):
    """The operation certainly did not take effect (history ``fail``)."""


class Indefinite(Exception):
    """The operation may or may not have taken effect (history ``info``)."""


class LogClient(Protocol):
    """An append-only log with offsets, as the ``log`` workload sees it (one ``key``)."""

    node: str | None  # the node the last request went to, for the history's ``node`` field

    async def send(self, value: int) -> int:
        """Append ``value``; return its offset once acknowledged."""
        ...

    async def poll(self, start: int, limit: int) -> list[Pair]:
        """Up to ``limit`` pairs from ``start`` in offset order; fewer only at the end of the log."""
        ...

    async def drain(self) -> list[Pair]:
        """Every pair in the log, from the start (run after all faults are healed)."""
        ...

    async def close(self) -> None: ...


class RegisterClient(Protocol):
    """Linearizable registers, one per key, as the ``register`` workload sees them."""

    node: str | None

    async def read(self, key: str) -> Any: ...

    async def write(self, key: str, value: Any) -> None: ...

    async def cas(self, key: str, old: Any, new: Any) -> bool:
        """True if applied; False if the current value was not ``old`` (a definite fail)."""
        ...

    async def close(self) -> None: ...


def classify_append_error(exc: BaseException) -> Exception:
    """Map an error from a ledger append to :class:`Definite` or :class:`Indefinite`."""
    if isinstance(exc, LedgerError):
        if exc.code in (FAILED, BAD_REQUEST, TOO_LARGE, NOT_LEADER, UNAVAILABLE, BUSY):
            return Definite(str(exc))
        return Indefinite(str(exc))
    return Indefinite(f"{type(exc).__name__}: {exc}")


class DirectLedgerClient(LedgerClient):
    """A ``LedgerClient`` that reaches nodes directly even when redirected to a proxy address.

    Nodes know each other by the proxied addresses (so partitions can cut them), and name
    those in "not leader" redirects. The harness's clients must not be partitioned with the
    peers, so every connection is made to the node's own address instead.
    """

    def __init__(self, addresses: Sequence[str], direct: dict[str, str], **kw: Any) -> None:
        super().__init__(addresses, **kw)
        self._direct = dict(direct)

    def dial_address(self, address: str) -> str:
        return self._direct.get(address, address)


def encode_int(value: int) -> bytes:
    return str(value).encode()


def decode_value(data: bytes) -> Any:
    """An integer payload, or the raw text when it is not one (the checker then flags it)."""
    text = bytes(data).decode(errors="replace")
    try:
        return int(text)
    except ValueError:
        return text


class LedgerLogClient:
    """The ``log`` workload on the ledger: offsets are ledger indexes.

    Offsets are the ledger's own positions, not renumbered: a new leader's no-op occupies
    an index too, so offsets have gaps where terms begin, as Kafka offsets do. Polls are
    linearizable (ReadIndex) and keep reading past no-ops until they hold ``limit`` pairs
    or a read comes back short, which is the only way a poll returns fewer than ``limit``
    pairs: then it really reached the committed end of the log.
    """

    def __init__(
        self,
        addresses: list[str],
        direct: dict[str, str],
        names: dict[str, str],
        *,
        timeout: float = 5.0,
        attempt_timeout: float = 1.0,
    ) -> None:
        self.client = DirectLedgerClient(addresses, direct, timeout=timeout, attempt_timeout=attempt_timeout)
        self.names = names  # address (direct or proxied) -> node id
        self.node: str | None = None

    def _note_node(self) -> None:
        addr = self.client.leader_address
        self.node = self.names.get(addr) if addr else None

    async def send(self, value: int) -> int:
        try:
            index, _term = await self.client.append(encode_int(value))
        except Exception as exc:  # noqa: BLE001 - classified, never swallowed
            self._note_node()
            raise classify_append_error(exc) from exc
        self._note_node()
        return index

    async def _read(self, lo: int, hi: int) -> list[Entry]:
        try:
            entries = await self.client.read(lo, hi, linearizable=True)
        except Exception as exc:  # noqa: BLE001 - a failed read changed nothing
            self._note_node()
            raise Definite(f"read {lo}..{hi}: {exc}") from exc
        self._note_node()
        return entries

    async def poll(self, start: int, limit: int) -> list[Pair]:
        out: list[Pair] = []
        lo = max(1, start)
        for _ in range(1000):  # bounded: each round covers `limit` indexes
            want = limit - len(out)
            hi = lo + want - 1
            entries = await self._read(lo, hi)
            out.extend((e.index, decode_value(e.data)) for e in entries if e.kind == KIND_NORMAL)
            if len(entries) < hi - lo + 1 or len(out) >= limit:
                return out[:limit]
            lo = hi + 1
        raise Definite(f"poll from {start} did not finish in 1000 reads")

    async def drain(self) -> list[Pair]:
        out: list[Pair] = []
        lo = 1
        chunk = 2000
        for _ in range(100_000):
            entries = await self._read(lo, lo + chunk - 1)
            out.extend((e.index, decode_value(e.data)) for e in entries if e.kind == KIND_NORMAL)
            if len(entries) < chunk:
                return out
            lo += chunk
        raise Definite("drain did not reach the end of the log")

    async def close(self) -> None:
        await self.client.close()


class LedgerRegisterClient:
    """Compare-and-set registers as a deterministic state machine replayed over the ledger.

    Every operation — reads included — is appended as a JSON command, so its place in the
    log is its linearization point. Its outcome follows from replaying the committed log
    up to that index: a ``cas`` applied iff the register held ``old`` just before it, a
    ``read`` returns the value just before it. The replayed state is this client's own
    replica (kept across operations, fed only by committed entries, which never change),
    so each worker checks the log it reads rather than sharing one view.
    """

    def __init__(
        self,
        addresses: list[str],
        direct: dict[str, str],
        names: dict[str, str],
        replica: RegisterReplica,
        *,
        timeout: float = 5.0,
        attempt_timeout: float = 1.0,
    ) -> None:
        self.client = DirectLedgerClient(addresses, direct, timeout=timeout, attempt_timeout=attempt_timeout)
        self.names = names
        self.replica = replica
        self.node: str | None = None
        self.timeout = timeout
        self._tag = uuid.uuid4().hex[:12]  # tells this client's commands from every other's
        self._nonce = 0

    def _note_node(self) -> None:
        addr = self.client.leader_address
        self.node = self.names.get(addr) if addr else None

    async def _submit(self, cmd: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Append ``cmd``; return its index and the state of its key just before it."""
        self._nonce += 1
        cmd = {**cmd, "n": f"{self._tag}-{self._nonce}"}
        try:
            index, _ = await self.client.append(json.dumps(cmd, separators=(",", ":")).encode())
        except Exception as exc:  # noqa: BLE001 - classified
            self._note_node()
            raise classify_append_error(exc) from exc
        self._note_node()
        # The command took effect at `index`; what it saw needs the log up to it.
        try:
            await asyncio.wait_for(self.replica.advance(self.client, index), self.timeout)
        except Exception as exc:  # noqa: BLE001 - applied, but its result is unknown to us
            raise Indefinite(f"applied at {index} but the log before it could not be read: {exc}") from exc
        found = self.replica.commands.get(index)
        if found is None or found.get("n") != cmd["n"]:
            self.replica.ack_mismatches.append({"index": index, "sent": cmd, "found": found})
        return index, cmd

    async def read(self, key: str) -> Any:
        index, _ = await self._submit({"k": key, "f": "read"})
        return self.replica.before(index, key)

    async def write(self, key: str, value: Any) -> None:
        await self._submit({"k": key, "f": "write", "v": value})

    async def cas(self, key: str, old: Any, new: Any) -> bool:
        index, _ = await self._submit({"k": key, "f": "cas", "v": [old, new]})
        return self.replica.before(index, key) == old

    async def close(self) -> None:
        await self.client.close()


class RegisterReplica:
    """The register state machine applied from the committed ledger, with per-index history."""

    def __init__(self) -> None:
        self.applied = 0
        self.state: dict[str, Any] = {}
        self.commands: dict[int, dict[str, Any] | None] = {}
        self._before: dict[int, Any] = {}  # index -> value of its key just before it
        self.ack_mismatches: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()

    async def advance(self, client: LedgerClient, upto: int) -> None:
        async with self._lock:
            for _ in range(10_000):
                if self.applied >= upto:
                    return
                entries = await client.read(self.applied + 1, upto)
                if not entries:
                    await asyncio.sleep(0.02)
                for e in entries:
                    self._apply(e)

    def _apply(self, e: Entry) -> None:
        assert e.index == self.applied + 1, f"replica at {self.applied} got entry {e.index}"
        self.applied = e.index
        if e.kind != KIND_NORMAL:
            self.commands[e.index] = None
            return
        try:
            cmd = json.loads(bytes(e.data))
            key = cmd["k"]
        except (ValueError, KeyError, TypeError):
            self.commands[e.index] = None
            return
        self.commands[e.index] = cmd
        cur = self.state.get(key)
        self._before[e.index] = cur
        if cmd.get("f") == "write":
            self.state[key] = cmd.get("v")
        elif cmd.get("f") == "cas":
            old, new = cmd.get("v", [None, None])
            if cur == old:
                self.state[key] = new

    def before(self, index: int, key: str) -> Any:
        cmd = self.commands.get(index)
        if cmd is None or cmd.get("k") != key:
            raise Indefinite(f"index {index} does not hold this client's command for {key!r}")
        return self._before[index]


# ------------------------------------------------------------------ deliberately broken adapters


class AckUnsentLogClient:
    """A broken adapter for the harness's own tests: acknowledges some sends it never made.

    Every ``every``-th send returns ``ok`` with a plausible offset without touching the
    system, the way a client that acks before replicating would. A sound checker must find
    those values missing from the final drain (``lost-write``).
    """

    def __init__(self, inner: LogClient, every: int = 5) -> None:
        self.inner = inner
        self.every = every
        self.count = 0
        self.last_offset = 1

    @property
    def node(self) -> str | None:
        return self.inner.node

    async def send(self, value: int) -> int:
        self.count += 1
        if self.count % self.every == 0:
            return self.last_offset + 1
        offset = await self.inner.send(value)
        self.last_offset = max(self.last_offset, offset)
        return offset

    async def poll(self, start: int, limit: int) -> list[Pair]:
        return await self.inner.poll(start, limit)

    async def drain(self) -> list[Pair]:
        return await self.inner.drain()

    async def close(self) -> None:
        await self.inner.close()


class LocalReadRegisterClient:
    """A broken adapter for the harness's own tests: reads from the client's own replica.

    Writes and cas go through the log, but a read returns whatever this client last
    replayed, without ordering the read in the log: a stale read as soon as another
    client wrote since. The linearizability checker must reject the history.
    """

    def __init__(self, inner: LedgerRegisterClient) -> None:
        self.inner = inner

    @property
    def node(self) -> str | None:
        return self.inner.node

    async def read(self, key: str) -> Any:
        return self.inner.replica.state.get(key)

    async def write(self, key: str, value: Any) -> None:
        await self.inner.write(key, value)

    async def cas(self, key: str, old: Any, new: Any) -> bool:
        return await self.inner.cas(key, old, new)

    async def close(self) -> None:
        await self.inner.close()


BROKEN_ADAPTERS: dict[str, Callable[[LogClient], LogClient]] = {
    "ack-unsent": lambda inner: AckUnsentLogClient(inner),
}
BROKEN_REGISTER_ADAPTERS: dict[str, Callable[[Any], RegisterClient]] = {
    "local-reads": lambda inner: LocalReadRegisterClient(inner),
}
