"""Hands a recorded history to the Spark checker and puts its verdict next to the history.

The checker runs in this process through ``jepsen.checker.analyze.analyze_files``: the
nodes are already stopped by then, and its Spark session is built once per process and
reused, so a test session (or a batch of runs) pays the JVM start-up once. The checker
writes ``<out>/<history stem>/results.json`` and ``report.html``; those two are moved
into the run directory so a run keeps one flat layout.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jepsen.checker.spark import SessionWarmUp


def warm_up_checker(history: Path, engine: str = "auto") -> SessionWarmUp | None:
    """Start the checker's Spark session on a thread when ``history`` will be judged on Spark.

    Returns the ``SessionWarmUp`` (its ``seconds`` once started), or None when the history
    is judged in this process (the analysis's own ``split_by_engine`` decides) or the
    checker is not importable. The caller then validates the shards while the JVM starts,
    so the verdict comes that much sooner.
    """
    try:
        from jepsen.checker import shards
        from jepsen.checker.analyze import split_by_engine
        from jepsen.checker.frames import Source
        from jepsen.checker.spark import SessionWarmUp
    except ImportError:
        return None
    try:
        path, fmt = shards.resolve(history)
    except Exception:  # noqa: BLE001 - an unreadable history is the checker's to report
        return None
    _, on_spark = split_by_engine([Source(0, str(path), fmt)], engine)
    return SessionWarmUp() if on_spark else None


def run_checker(
    history: Path,
    workload: str,
    run_dir: Path,
    *,
    master: str | None = None,
    budget: float | None = None,
    engine: str = "auto",
) -> dict[str, Any]:
    """Check ``history``; returns ``{"valid", "results", "output"}``.

    ``valid`` is the checker's True / False / "unknown", or None when it could not run
    (the reason is in ``output``).
    """
    try:
        from jepsen.checker.analyze import DEFAULT_BUDGET, analyze_files
    except ImportError as exc:
        return {"valid": None, "results": None, "output": f"the checker is not importable: {exc}"}
    scratch = Path(tempfile.mkdtemp(prefix=".check-", dir=run_dir))
    try:
        try:
            res = analyze_files(
                [history],
                workload=workload,
                out_dir=scratch,
                master=master,
                budget=budget if budget is not None else DEFAULT_BUDGET,
                report=True,
                engine=engine,
            )
        except Exception as exc:  # noqa: BLE001 - no Java, Spark failure: reported, not a verdict
            return {
                "valid": None,
                "results": None,
                "output": f"the checker failed: {type(exc).__name__}: {exc}",
            }
        outcome = res["files"][0]
        for name in ("results.json", "report.html"):
            src = outcome.out_dir / name
            if src.exists():
                shutil.move(str(src), run_dir / name)
        valid = outcome.valid if outcome.error is None else None
        return {
            "valid": valid,
            "results": outcome.result,
            "output": outcome.error or outcome.verdict,
            "seconds": round(res["seconds"], 3),
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
