"""Garbage-collector settings for the project's long-running processes.

Why: CPython's cyclic collector runs a young pass every 700 net allocations of container
objects, a middle pass every 10 young ones and a full pass every 10 middle ones. A broker
allocates several container objects per message (requests, headers, futures, entries), so
under load it ran about 300 young and 3 full passes a second; measured with ``gc.callbacks``,
the collector took 11-15% of each broker's CPU during unbatched sends and about half of a
harness worker's CPU (whose 1,024 clients keep many live objects for a full pass to walk)
at ``--rate max``. Almost none of that work found garbage: what these processes allocate
per request dies by reference counting, not by the collector.

So a process that calls ``tune_gc`` at start-up:

- freezes what start-up made (modules, classes, configuration), which lives as long as the
  process, so no full pass walks it again;
- collects less often (``GC_THRESHOLDS``). Collections still happen, full ones included,
  so cyclic garbage (an exception's traceback, a closed connection's cycles) is still
  freed and memory stays bounded: a young pass holds at most ``GC_THRESHOLDS[0]`` objects.

``LEDGERMQ_GC_THRESHOLDS`` overrides it for measurement: three integers (``10000,20,20``)
or ``default`` for CPython's own settings (nothing frozen).
"""

from __future__ import annotations

import gc
import os
from typing import Final

#: young-generation allocations, young passes per middle pass, middle passes per full pass
GC_THRESHOLDS: Final = (10_000, 20, 20)
GC_ENV: Final = "LEDGERMQ_GC_THRESHOLDS"


def thresholds_from_env(value: str | None) -> tuple[int, int, int] | None:
    """The thresholds ``value`` asks for: None for ``default``, GC_THRESHOLDS when unset."""
    if value is None or not value.strip():
        return GC_THRESHOLDS
    if value.strip().lower() == "default":
        return None
    parts = value.split(",")
    try:
        numbers = tuple(int(p) for p in parts)
    except ValueError:
        numbers = ()
    if len(numbers) != 3 or numbers[0] < 1 or min(numbers) < 0:
        raise ValueError(
            f"{GC_ENV}={value!r}: expected three integers like 10000,20,20 (the first at least 1) "
            "or 'default'"
        )
    return numbers  # type: ignore[return-value]


def tune_gc() -> tuple[int, int, int]:
    """Apply this module's settings (see the module docstring); returns the thresholds in force.

    Raises SystemExit with a one-line message when ``LEDGERMQ_GC_THRESHOLDS`` is malformed.
    """
    try:
        wanted = thresholds_from_env(os.environ.get(GC_ENV))
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if wanted is not None:
        gc.freeze()
        gc.set_threshold(*wanted)
    return gc.get_threshold()  # type: ignore[return-value]
