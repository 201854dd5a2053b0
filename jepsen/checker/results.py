"""Assembly of ``results.json`` (the format is in docs/history.md) and the verdict merge.

Validity merges the way Jepsen's does: any ``false`` makes the whole ``false``, then
any ``"unknown"`` makes it ``"unknown"``; only all-``true`` is ``true``. So a key whose
search ran out of time can never be reported as valid.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jepsen.checker import semantics_model
from jepsen.checker.log_checker import ERRORS, EXAMPLES, INFORMATIONAL

Valid = bool | str  # True, False or "unknown"
NONLINEARIZABLE = "nonlinearizable"


def merge_valid(values: list[Valid]) -> Valid:
    """Jepsen's merge: false beats unknown beats true."""
    if any(v is False for v in values):
        return False
    if any(v is not True for v in values):
        return "unknown"
    return True


def log_result(found: dict[str, Any], base_stats: dict[str, Any]) -> dict[str, Any]:
    """results.json for the log workload from the checker's counts and examples."""
    counts: dict[str, int] = found.get("counts", {})
    anomalies: dict[str, list[Any]] = found.get("anomalies", {})
    types = [a for a in ERRORS if counts.get(a)]
    order = [*ERRORS, *INFORMATIONAL]
    return {
        "valid": not types,
        "workload": "log",
        "anomaly-types": types,
        "anomalies": {a: anomalies[a][:EXAMPLES] for a in order if a in anomalies},
        "counts": {a: counts[a] for a in order if counts.get(a)},
        "informational": [a for a in INFORMATIONAL if counts.get(a)],
        "stats": {**base_stats, **found.get("stats", {})},
    }


def semantics_result(workload: str, found: dict[str, Any], base_stats: dict[str, Any]) -> dict[str, Any]:
    """results.json for the delay, txn, retry and order workloads (``semantics_model`` names
    their anomalies), from either checker's counts and examples."""
    counts: dict[str, int] = found.get("counts", {})
    anomalies: dict[str, list[Any]] = found.get("anomalies", {})
    errors = semantics_model.ERRORS[workload]
    informational = semantics_model.INFORMATIONAL
    types = [a for a in errors if counts.get(a)]
    order = [*errors, *informational]
    return {
        "valid": not types,
        "workload": workload,
        "anomaly-types": types,
        "anomalies": {a: anomalies[a][:EXAMPLES] for a in order if a in anomalies},
        "counts": {a: counts[a] for a in order if counts.get(a)},
        "informational": [a for a in informational if counts.get(a)],
        "stats": {**base_stats, **found.get("stats", {})},
    }


def linear_result(
    workload: str, keys: dict[str, dict[str, Any]], base_stats: dict[str, Any]
) -> dict[str, Any]:
    """results.json for register/kv from the per-key search results."""
    valid = merge_valid([k["valid"] for k in keys.values()]) if keys else True
    bad = sorted((k for k, r in keys.items() if r["valid"] is False), key=_key_order)
    unknown = sorted((k for k, r in keys.items() if r["valid"] not in (True, False)), key=_key_order)
    examples = []
    for k in bad[:EXAMPLES]:
        r = keys[k]
        examples.append({"key": k, **(r.get("failure") or {})})
    counts = {NONLINEARIZABLE: len(bad)} if bad else {}
    out: dict[str, Any] = {
        "valid": valid,
        "workload": workload,
        "anomaly-types": [NONLINEARIZABLE] if bad else [],
        "anomalies": {NONLINEARIZABLE: examples} if bad else {},
        "counts": counts,
        "stats": {
            **base_stats,
            "keys": len(keys),
            "linearizable-keys": sum(1 for r in keys.values() if r["valid"] is True),
            "nonlinearizable-keys": len(bad),
            "unknown-keys": len(unknown),
            "search-seconds": round(sum(r.get("seconds", 0.0) for r in keys.values()), 3),
            "configurations-explored": sum(r.get("explored", 0) for r in keys.values()),
        },
    }
    if unknown:
        out["unknown-keys"] = unknown
        out["unknown"] = {k: keys[k].get("error") or "; ".join(keys[k].get("notes", [])) for k in unknown}
    return out


def error_result(message: str, workload: str | None) -> dict[str, Any]:
    """results.json for a history that could not be read: no verdict at all."""
    return {
        "valid": None,
        "workload": workload,
        "error": message,
        "anomaly-types": [],
        "anomalies": {},
        "counts": {},
        "stats": {},
    }


def _key_order(k: str) -> tuple[int, Any]:
    return (0, int(k)) if k.lstrip("-").isdigit() else (1, k)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(path)
