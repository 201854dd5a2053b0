"""The client adapter interface: what a workload calls, and how system answers become ok / fail / info.

A workload talks to any system through small interfaces, :class:`LogClient` (append-only
log: send, poll), :class:`RegisterClient` (read, write, cas per key) and
:class:`QueueClient` (the log interface per queue of a topic), which it gets from a
:class:`ClientSource` (a backend, or in a worker process the endpoints built from the
backend's ``client_spec``). An adapter raises :class:`Definite` when the operation
certainly did not take effect (history ``fail``) and :class:`Indefinite` when it may have
(``info``); anything else it raises is treated as indefinite too, because guessing
"failed" for an operation that did happen is exactly the bug a Jepsen test exists to catch.

The adapters themselves live with their systems (``ledger``, ``broker``, ``syncobj``);
this module is the one both sides import, so workloads never import a system.
"""

from __future__ import annotations

from typing import Any, Protocol

Pair = tuple[int, Any]  # (offset, value) as the history records it


class Definite(Exception):
    """The operation certainly did not take effect (history ``fail``)."""


class Indefinite(Exception):
    """The operation may or may not have taken effect (history ``info``)."""


def encode_int(value: int) -> bytes:
    """A workload's value as the payload every adapter sends: its decimal text."""
    return str(value).encode()


def decode_value(data: bytes) -> Any:
    """An integer payload, or the raw text when it is not one (the checker then flags it)."""
    text = bytes(data).decode(errors="replace")
    try:
        return int(text)
    except ValueError:
        return text


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


class RegisterReplica(Protocol):
    """What a register client keeps across the reconnects of one logical client.

    A ledger register client replays the committed log into it, so a fresh client after an
    ``info`` goes on from where the last one was. ``ack_mismatches``: acknowledged operations
    whose place in the log held another command (a broken promise the run reports).
    """

    ack_mismatches: list[dict[str, Any]]


class RegisterClient(Protocol):
    """Linearizable registers, one per key, as the ``register`` workload sees them."""

    node: str | None

    async def read(self, key: str) -> Any: ...

    async def write(self, key: str, value: Any) -> None: ...

    async def cas(self, key: str, old: Any, new: Any) -> bool:
        """True if applied; False if the current value was not ``old`` (a definite fail)."""
        ...

    async def close(self) -> None: ...


class QueueClient(Protocol):
    """Producer and consumer of one topic's queues, as the ``queue`` workload sees them.

    Each queue is a log of its own (offsets are its consume-queue offsets); ``send_batch``
    stores several values in one request, which succeeds or fails as a whole.
    """

    node: str | None

    async def send(self, queue_id: int, value: int) -> int: ...

    async def send_batch(self, queue_id: int, values: list[int]) -> tuple[list[int], str | None]:
        """The offsets of ``values`` in order, and the node that stored them."""
        ...

    async def poll(self, queue_id: int, start: int, limit: int) -> list[Pair]: ...

    async def drain(self, queue_id: int) -> list[Pair]: ...

    async def close(self) -> None: ...


class ClientSource(Protocol):
    """Where a workload gets its clients: a backend, or (in a worker process) its endpoints.

    A source offers the clients of the workloads its system runs and refuses the others
    (``Unsupported``). A queue source also has ``topic``, ``queues`` and, with several
    broker groups, ``broker_names``.
    """

    system: str

    def log_client(self) -> LogClient: ...

    def register_replica(self) -> RegisterReplica: ...

    def register_client(self, replica: Any) -> RegisterClient: ...

    def queue_client(self, broker_name: str | None = None) -> QueueClient: ...
