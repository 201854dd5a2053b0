"""The few rows the report's plots need, per history, from what ``timeline`` collected.

A million-operation history must not be shipped to the driver to draw a scatter
plot: operations are sampled down to a fixed number of points per file, throughput
is binned in Spark, and only nemesis events come back whole (there are few).
Histories without a clock (Jepsen's text logs) get no time plots.
"""

from __future__ import annotations

from typing import Any, Protocol

BINS = 200


class Collected(Protocol):
    """What ``plot_data`` reads of a history's collected timeline (``timeline.Timeline``, which
    sizes its samples and bins by this module's rules, so this module does not import it)."""

    sample: dict[int, list[Any]]
    throughput: dict[int, list[Any]]
    nemesis: dict[int, list[Any]]


def bin_width(ov: dict[str, Any]) -> int:
    """Nanoseconds per throughput bin of one history (its overview's span over BINS)."""
    return max(1, (ov["t1"] - ov["t0"]) // BINS)


def sample_fraction(ov: dict[str, Any], max_points: int) -> float:
    """The share of one history's operations drawn as points."""
    return min(1.0, max_points / max(1, ov["n"]))


def plot_srcs(overview: dict[int, dict[str, Any]]) -> list[int]:
    """The sources that get time plots: those with a clock."""
    return sorted(s for s, ov in overview.items() if ov["timed"] and ov["t0"] is not None)


def plot_data(
    tl: Collected, overview: dict[int, dict[str, Any]], workloads: dict[int, str], max_points: int
) -> dict[int, dict[str, Any]]:
    """{src: {"ops": [...], "throughput": [...], "bin-s": w, "nemesis": [...]}} for timed files."""
    out: dict[int, dict[str, Any]] = {}
    for s in plot_srcs(overview):
        ov = overview[s]
        out[s] = {
            "ops": tl.sample.get(s, []),
            "throughput": tl.throughput.get(s, []),
            "nemesis": [(f, t, v) for _, t, f, v in sorted(tl.nemesis.get(s, []), key=lambda e: e[0])],
            "bin-s": bin_width(ov) / 1e9,
            "t0": ov["t0"],
            "workload": workloads.get(s),
            "sampled": sample_fraction(ov, max_points) < 1.0,
        }
    return out
