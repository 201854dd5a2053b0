"""``analyze``: many histories, one Spark session, one results.json + report.html each.

Kept separate from the CLI so the harness can call :func:`analyze_files` in-process
right after a run. A history that cannot be read is reported with its file and line
and does not stop the others from being checked.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jepsen.checker import parse, recovery, shards
from jepsen.checker.frames import Source
from jepsen.checker.results import error_result, linear_result, log_result, semantics_result, write_json
from jepsen.checker.semantics_model import DEFAULT_TOLERANCES, Tolerances

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

EXIT_VALID, EXIT_INVALID, EXIT_UNKNOWN, EXIT_MALFORMED = 0, 1, 2, 3
DEFAULT_BUDGET = 10.0
PLOT_POINTS = 50_000


@dataclass(slots=True)
class FileOutcome:
    """What happened to one input file."""

    path: str
    out_dir: Path
    workload: str | None = None
    valid: bool | str | None = None  # None: unreadable or malformed
    error: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    ops: int = 0
    engine: str | None = None  # "in-process" or "spark <master>": which path judged it

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return "ERROR"
        return {True: "valid", False: "INVALID"}.get(self.valid, "unknown")  # type: ignore[arg-type]


def exit_code(outcomes: list[FileOutcome]) -> int:
    """1 if any history is invalid, else 3 if any is unreadable, else 2 if any is unknown."""
    if any(o.valid is False for o in outcomes):
        return EXIT_INVALID
    if any(o.error is not None for o in outcomes):
        return EXIT_MALFORMED
    if any(o.valid not in (True, False) for o in outcomes):
        return EXIT_UNKNOWN
    return EXIT_VALID


def _out_dirs(paths: list[str], out_dir: Path) -> list[Path]:
    """DIR/<file name without extension>, made unique when two inputs share a name."""
    seen: dict[str, int] = {}
    dirs = []
    for p in paths:
        stem = Path(p).stem or "history"
        n = seen.get(stem, 0) + 1
        seen[stem] = n
        dirs.append(out_dir / (stem if n == 1 else f"{stem}-{n}"))
    return dirs


SPARK_READS = ("jsonl", "parquet")  # formats Spark reads itself (the others are parsed in Python)
SMALL_INPUT_BYTES = 512 << 20  # below this (about 2M operations) the checks cut lineage (spark.materialize)


def input_bytes(sources: list[Source]) -> int:
    """The inputs' weight in JSON Lines bytes (``shards.weight_bytes``): what the size-based
    choices below were measured against."""
    return sum(shards.weight_bytes(s.path) for s in sources)


def partitions_for(sources: list[Source]) -> int:
    """Partitions for the cached operations and for shuffles, from the input size: an upper
    bound that ``keyspread.partitions`` lowers to what the history's keys can fill.

    Small inputs get two (one per core of local[2]): stages, not data, cost there.
    Larger ones get at least 16, so that many keys of unequal size spread over several
    partitions per core; beyond that one per 32 MB.
    """
    size = input_bytes(sources)
    if size < (16 << 20):
        return 2
    return max(16, min(128, size // (32 << 20) + 1))


def _collect_overview(ops: DataFrame) -> dict[int, dict[str, Any]]:
    """One small job: op counts by f/type, time span, first malformed row, per source."""
    from pyspark.sql import functions as F

    # fixed-width aggregates only (hash aggregation); the bad rows' text comes separately
    rows = (
        ops.groupBy("src", "kind", "f", "type")
        .agg(
            F.count("*").alias("n"),
            F.min("inv_time").alias("t0"),
            F.max(F.greatest("inv_time", "cmp_time")).alias("t1"),
            F.max(F.col("timed").cast("int")).alias("timed"),
        )
        .collect()
    )
    bad_srcs = sorted({r["src"] for r in rows if r["kind"] == "bad"})
    bad_rows = (
        (
            ops.filter((F.col("kind") == "bad") & F.col("src").isin(bad_srcs))
            .groupBy("src")
            .agg(F.min(F.struct(F.coalesce("inv_index", F.lit(-1)).alias("i"), "problem")).alias("bad"))
            .collect()
        )
        if bad_srcs
        else []
    )
    first_bad = {r["src"]: (r["bad"]["i"], r["bad"]["problem"]) for r in bad_rows}
    out: dict[int, dict[str, Any]] = {}
    for r in rows:
        o = out.setdefault(
            r["src"],
            {
                "ops": {},
                "fs": set(),
                "t0": None,
                "t1": None,
                "bad": None,
                "timed": False,
                "nemesis": 0,
                "n": 0,
                "spans": [],  # (f, latest time) per f and type: recovery.load_end_of
            },
        )
        if r["kind"] == "bad":
            o["bad"] = first_bad.get(r["src"], (-1, "malformed event"))
            continue
        o["timed"] = o["timed"] or bool(r["timed"])
        if r["kind"] == "nemesis":
            o["nemesis"] += r["n"]
            continue
        o["fs"].add(r["f"])
        o["spans"].append((r["f"], r["t1"]))
        o["ops"].setdefault(r["f"], {})[r["type"]] = r["n"]
        o["n"] += r["n"]
        for k, pick in (("t0", min), ("t1", max)):
            if r[k] is not None:
                o[k] = r[k] if o[k] is None else pick(o[k], r[k])
    return out


def _locate_problem(src: Source, spark_problem: tuple[int, str], shown: str) -> str:
    """Spark knows a row is bad but not its line; re-read the file to name the line."""
    try:
        shards.read_events(src.path, src.fmt)
    except parse.HistoryError as exc:
        return str(parse.HistoryError(shown, exc.line, exc.message))
    index, problem = spark_problem
    where = f" (event index {index})" if index >= 0 else ""
    return f"{shown}: {problem}{where}"


def _choose_workload(requested: str | None, fs: set[str], path: str) -> str:
    if requested:
        known = {"log": parse.LOG_FS, "register": parse.REGISTER_FS, "kv": parse.KV_FS, **parse.SEMANTICS_FS}[
            requested
        ]
        stray = sorted(fs - known)
        if stray:
            raise parse.HistoryError(
                path,
                None,
                f"operation(s) {', '.join(stray)} are not part of the "
                f"{requested} workload ({', '.join(sorted(known))})",
            )
        return requested
    found = parse.infer_workload(fs)
    if found is None:
        raise parse.HistoryError(
            path,
            None,
            f"cannot tell the workload from operations {', '.join(sorted(fs)) or '(none)'}; pass --workload",
        )
    return found


def analyze_files(
    paths: list[str | Path],
    workload: str | None = None,
    out_dir: str | Path = "store/analysis",
    master: str | None = None,
    budget: float = DEFAULT_BUDGET,
    report: bool = True,
    engine: str = "auto",
    history_uris: list[str] | None = None,
    ship: bool | None = None,
    tolerances: Tolerances = DEFAULT_TOLERANCES,
) -> dict[str, Any]:
    """Check every history; write results.json/report.html per file and summary.json.

    ``engine``: ``auto`` judges files up to ``inprocess.FAST_PATH_MAX_BYTES`` in this
    process (no JVM) and the rest on Spark; ``inprocess`` or ``spark`` forces one path
    for all. Returns ``{"files": [FileOutcome...], "summary": {path: valid}, "exit":
    code, "seconds": s}`` where ``valid`` is null for an unreadable history.

    Histories checked on a cluster must be readable by its executors: ``history_uris``
    (one per path) names where they can (a shared path or any Hadoop URI); otherwise a
    master on another host (or ``ship=True``) gets the history sent through the session.

    ``tolerances``: how far the delay and order checks give clocks and faults
    (``semantics_model.Tolerances``).
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r} (one of {', '.join(ENGINES)})")
    if history_uris is not None and len(history_uris) != len(paths):
        raise ValueError(f"{len(history_uris)} history URIs for {len(paths)} histories: give one per history")
    started = time.monotonic()
    out_root = Path(out_dir)
    str_paths = [str(p) for p in paths]
    outcomes = [FileOutcome(p, d) for p, d in zip(str_paths, _out_dirs(str_paths, out_root), strict=True)]
    sources: list[Source] = []
    for i, o in enumerate(outcomes):
        try:
            path, fmt = shards.resolve(o.path)  # a file, a folder of shards or a run folder
            events = None if fmt in SPARK_READS else parse.read_events(path, fmt)
            sources.append(Source(i, str(Path(path).resolve()), fmt, events))
        except parse.HistoryError as exc:
            o.error = str(exc)
    plots: dict[int, dict[str, Any]] = {}
    if history_uris:
        engine = "spark"  # the user named where the cluster reads them
    small, large = split_by_engine(sources, engine)
    if small:
        _check_in_process(small, outcomes, workload, budget, plots, report, tolerances)
    if large:
        large = _reach_cluster(large, outcomes, master, history_uris, ship)
    if large:
        _check_sources(large, outcomes, workload, master, budget, plots, report, tolerances)
    for i, o in enumerate(outcomes):
        if o.error is not None:
            o.result = error_result(o.error, o.workload or workload)
        if o.engine is not None:
            o.result["engine"] = o.engine
        write_json(o.out_dir / "results.json", o.result)
        if report:
            from jepsen.checker import report as rep

            rep.write_report(o.out_dir / "report.html", o.path, o.result, plots.get(i))
    summary = {o.path: o.valid if o.error is None else None for o in outcomes}
    write_json(out_root / "summary.json", summary)
    return {
        "files": outcomes,
        "summary": summary,
        "exit": exit_code(outcomes),
        "seconds": time.monotonic() - started,
    }


ENGINES = ("auto", "inprocess", "spark")
IN_PROCESS_FORMATS = ("jsonl", "edn", "etcd", "parquet")  # what the Python readers parse


def split_by_engine(sources: list[Source], engine: str) -> tuple[list[Source], list[Source]]:
    """(judged in-process, judged on Spark): small regular files go in-process under ``auto``."""
    from jepsen.checker.inprocess import FAST_PATH_MAX_BYTES, FAST_PATH_TOTAL_BYTES

    if engine == "spark":
        return [], list(sources)
    if engine == "inprocess":
        return list(sources), []
    small, large, total = [], [], 0
    for s in sources:
        p = Path(s.path)
        size = shards.weight_bytes(p) if s.fmt in IN_PROCESS_FORMATS else None
        if size is not None and size <= FAST_PATH_MAX_BYTES and total + size <= FAST_PATH_TOTAL_BYTES:
            small.append(s)
            total += size
        else:
            large.append(s)
    return small, large


SHIP_MAX_BYTES = 256 << 20  # larger histories must be put where the cluster reads them


def _reach_cluster(
    sources: list[Source],
    outcomes: list[FileOutcome],
    master: str | None,
    history_uris: list[str] | None,
    ship: bool | None,
) -> list[Source]:
    """Make each history readable by the cluster's executors; returns the sources still to check.

    A named URI replaces the local path. Otherwise, when the master runs on another host
    (or ``ship`` is set), the history is parsed here and goes to Spark as rows of the
    session (Arrow batches on Spark Connect), never as a path the executors cannot open.
    """
    from jepsen.checker.spark import is_remote_master, resolve_master

    m = resolve_master(master)
    send = ship if ship is not None else is_remote_master(m)
    out = []
    for s in sources:
        o = outcomes[s.src]
        if history_uris:
            s.path = history_uris[s.src]
        elif send and s.events is None:
            size = shards.weight_bytes(s.path)
            if s.fmt not in IN_PROCESS_FORMATS or size > SHIP_MAX_BYTES:
                o.error = (
                    f"{o.path}: cannot ship a {s.fmt} history of {size >> 20} MB to {m} (limit "
                    f"{SHIP_MAX_BYTES >> 20} MB of JSON Lines): put it where the cluster can read it "
                    "and pass --history-uri"
                )
                continue
            try:
                s.events = shards.read_events(s.path, s.fmt)
            except parse.HistoryError as exc:
                o.error = str(parse.HistoryError(o.path, exc.line, exc.message))
                continue
        out.append(s)
    return out


def _check_in_process(
    sources: list[Source],
    outcomes: list[FileOutcome],
    workload: str | None,
    budget: float,
    plots: dict[int, dict[str, Any]],
    report: bool,
    tolerances: Tolerances = DEFAULT_TOLERANCES,
) -> None:
    """The same checks as ``_check_sources``, in this process (see ``inprocess``)."""
    from jepsen.checker import inprocess, log_rules, semantics_rules
    from jepsen.checker.plotdata import BINS

    for s in sources:
        o = outcomes[s.src]
        o.engine = "in-process"
        try:
            events = s.events if s.events is not None else shards.read_events(s.path, s.fmt)
        except parse.HistoryError as exc:
            o.error = str(parse.HistoryError(o.path, exc.line, exc.message))
            continue
        rows = inprocess.pair(s.src, events)
        ov = inprocess.overview(rows)
        if ov["n"] == 0:
            o.error = f"{o.path}: no operations found"
            continue
        try:
            w = _choose_workload(workload, ov["fs"], o.path)
        except parse.HistoryError as exc:
            o.error = str(exc)
            continue
        o.workload, o.ops = w, ov["n"]
        base = _base_stats(ov, s.fmt)
        ops = [r for r in rows if r["kind"] == "op"]
        if w == "log":
            o.result = log_result(log_rules.check_history(ops), base)
        elif w in parse.SEMANTICS_FS:
            o.result = semantics_result(w, semantics_rules.check_history(w, rows, tolerances), base)
        else:
            o.result = linear_result(w, inprocess.check_linear(ops, w, budget), base)
        o.valid = o.result["valid"]
        if ov["timed"]:
            recovery.attach(o.result, recovery.faults_from_rows(rows))
        if report and ov["timed"] and ov["t0"] is not None:
            plots[s.src] = inprocess.plot_data(rows, ov, w, PLOT_POINTS, BINS)


def _base_stats(ov: dict[str, Any], fmt: str) -> dict[str, Any]:
    base = {
        "ops": ov["n"],
        "by-f": ov["ops"],
        "nemesis-events": ov["nemesis"],
        "format": fmt,
        "timed": ov["timed"],
    }
    if ov["timed"] and ov["t0"] is not None and ov["t1"] is not None:
        base["duration-s"] = round((ov["t1"] - ov["t0"]) / 1e9, 3)
    return base


def _check_sources(
    sources: list[Source],
    outcomes: list[FileOutcome],
    workload: str | None,
    master: str | None,
    budget: float,
    plots: dict[int, dict[str, Any]],
    report: bool,
    tolerances: Tolerances = DEFAULT_TOLERANCES,
) -> None:
    from jepsen.checker import frames, keyspread
    from jepsen.checker.spark import get_spark, master_in_use, materialize, release

    spark = get_spark(master)
    for s in sources:
        outcomes[s.src].engine = f"spark {master_in_use()}"
    parts = keyspread.partitions(sources, partitions_for(sources))
    conf = analysis_conf(parts, input_bytes(sources))
    excluded = spark.conf.get("spark.sql.optimizer.excludedRules", None)
    if excluded and EXCLUDED_RULE not in excluded:
        conf["spark.sql.optimizer.excludedRules"] = f"{excluded},{EXCLUDED_RULE}"
    with session_conf(spark, conf):
        small = input_bytes(sources) < SMALL_INPUT_BYTES
        # filled by the overview's job (its first action), not by a job of its own
        ops = materialize(frames.pair_events(spark, sources, parts), small, eager=False)
        try:
            _check_ops(spark, ops, sources, outcomes, workload, budget, plots, report, small, tolerances)
        finally:
            release(ops)


EXCLUDED_RULE = "org.apache.spark.sql.catalyst.optimizer.FoldablePropagation"


#: inputs up to this size cache their frames uncompressed (see ``analysis_conf``); in local mode
#: up to half the driver's heap when that is more (``uncompressed_cache_bytes``)
UNCOMPRESSED_CACHE_BYTES = 1 << 30


def uncompressed_cache_bytes() -> int:
    """The largest input whose frames are cached uncompressed. In local mode the caches live in
    the driver's heap, which grows with the machine (``spark.driver_memory``): half of it. A
    cluster's executors' memory is not known here, so the fixed bound holds there."""
    from jepsen.checker.spark import local_heap_bytes, master_in_use

    if (master_in_use() or "").startswith("local"):
        return max(UNCOMPRESSED_CACHE_BYTES, local_heap_bytes() // 2)
    return UNCOMPRESSED_CACHE_BYTES


def analysis_conf(parts: int, size: int = 0) -> dict[str, str]:
    """Session settings for one analysis (restored afterwards: the session is shared).

    Every check is keyed by (src, key, ...), so the operations are partitioned that
    way once and later joins, windows and aggregates reuse it instead of shuffling
    again (Spark would otherwise want all join keys for co-partitioning, and would
    forget the partitioning of cached plans). Adaptive execution is off: the plans
    are wide (a dozen checks in one job) and re-planning after each of their many
    small stages cost more than it saved; partition counts are chosen from the input
    size instead.

    Cached frames (inputs past SMALL_INPUT_BYTES; smaller ones are checkpointed) of an input
    up to ``uncompressed_cache_bytes()`` are kept uncompressed:
    encoding them took a tenth of the analysis (a 2.96M-operation, 750 MB history: 90-92 s
    instead of 100-107 s, alternating runs in one session). Larger inputs keep Spark's column
    compression, lest their caches outgrow the driver's storage memory and spill to disk.
    """
    compress = size > uncompressed_cache_bytes()
    return {
        "spark.sql.inMemoryColumnarStorage.compressed": str(compress).lower(),
        "spark.sql.shuffle.partitions": str(parts),
        # With one input file `src` is a literal, and propagating it into the plans
        # drops it from their partitioning: every (src, key) step would shuffle again.
        "spark.sql.optimizer.excludedRules": EXCLUDED_RULE,
        # several splits per core when reading big JSON files, not one per 128 MB
        "spark.sql.files.maxPartitionBytes": str(32 << 20),
        "spark.sql.requireAllClusterKeysForCoPartition": "false",
        "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "false",
        "spark.sql.adaptive.enabled": "false",
    }


@contextmanager
def session_conf(spark: Any, conf: dict[str, str]) -> Iterator[None]:
    """Set runtime SQL settings for the duration of a block, then put back the old ones."""
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def _check_ops(
    spark: Any,
    ops: DataFrame,
    sources: list[Source],
    outcomes: list[FileOutcome],
    workload: str | None,
    budget: float,
    plots: dict[int, dict[str, Any]],
    report: bool,
    small: bool,
    tolerances: Tolerances = DEFAULT_TOLERANCES,
) -> None:
    from pyspark.sql import functions as F

    from jepsen.checker import linear_spark, log_checker, plotdata, semantics_checker, timeline

    overview = _collect_overview(ops)
    by_src = {s.src: s for s in sources}
    chosen: dict[int, str] = {}
    for src, s in by_src.items():
        o = outcomes[src]
        ov = overview.get(src)
        if ov is None or ov["n"] == 0 and ov["bad"] is None:
            o.error = f"{o.path}: no operations found"
            continue
        if ov["bad"] is not None:
            o.error = _locate_problem(s, ov["bad"], o.path)
            continue
        try:
            chosen[src] = _choose_workload(workload, ov["fs"], o.path)
        except parse.HistoryError as exc:
            o.error = str(exc)
        o.workload = chosen.get(src)
        o.ops = ov["n"]
    good = ops.filter(F.col("src").isin(list(chosen))) if chosen else None
    log_srcs = [s for s, w in chosen.items() if w == "log"]
    sem_srcs = {s: w for s, w in chosen.items() if w in parse.SEMANTICS_FS}
    lin_srcs = {s: w for s, w in chosen.items() if w != "log" and w not in parse.SEMANTICS_FS}
    found_log = log_checker.check(good.filter(F.col("src").isin(log_srcs)), small) if log_srcs else {}
    found_lin = linear_spark.check(spark, good, lin_srcs, budget) if lin_srcs and good is not None else {}
    found_sem = (
        semantics_checker.check(spark, good, sem_srcs, tolerances, small)
        if sem_srcs and good is not None
        else {}
    )
    for src, w in chosen.items():
        o, ov = outcomes[src], overview[src]
        base = _base_stats(ov, by_src[src].fmt)
        if w == "log":
            o.result = log_result(found_log.get(src, {}), base)
        elif src in sem_srcs:
            o.result = semantics_result(w, found_sem.get(src, {}), base)
        else:
            o.result = linear_result(w, found_lin.get(src, {}), base)
        o.valid = o.result["valid"]
    timed = {
        s: (overview[s]["t0"], overview[s]["t1"])
        for s in chosen
        if overview[s]["timed"] and overview[s]["t0"] is not None
    }
    load_ends = {s: recovery.load_end_of(overview[s]["spans"]) for s in timed}
    with_faults = [s for s in sorted(timed) if overview[s]["nemesis"]]
    chosen_ov = {s: overview[s] for s in chosen}
    to_plot = plotdata.plot_srcs(chosen_ov) if report else []
    tl = timeline.collect(ops, with_faults, to_plot, chosen_ov, PLOT_POINTS, recovery.BUCKET_NS)
    found = recovery.faults_from_timeline(tl, with_faults, timed, load_ends)
    for src in timed:  # an empty list for a timed history without faults, as in-process
        recovery.attach(outcomes[src].result, found.get(src, []))
    if to_plot:
        plots.update(plotdata.plot_data(tl, chosen_ov, chosen, PLOT_POINTS))
