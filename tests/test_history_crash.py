"""A recorder killed mid-run leaves a history that reads back up to its last whole batch.

Each test starts a real recording process, SIGKILLs it while it records, and reads what it
left with the tools a user has: ``jepsen.history.read_events`` (tests, benches), ``jepsen
analyze RUN_DIR`` (the checker) and ``jepsen history export``. Every Parquet part closed
before the kill must come back whole; the part its writer was still on is skipped with a
note, never a traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jepsen.history import read_events, read_history, validate_shards

ROOT = Path(__file__).resolve().parents[1]
#: events per Parquet part in the child (two per operation: parts close on whole operations)
PART_EVENTS = 500
#: the part whose fsync never returns: parts 1..STALL_PART-1 are whole when the child is killed
STALL_PART = 4
WAIT_S = 60.0  # the most the child may take to reach the point where it is killed

# The child records ``send`` operations of the log workload (value k, offset k) into shard 0 of
# ``history/``. Its parts close every PART_EVENTS events; the fsync of part STALL_PART never
# returns (a disk that stopped answering), so that part stays under its temporary name with
# its bytes on disk when the SIGKILL comes, and recording blocks on the next roll.
PARQUET_CHILD = """
import os, sys, time
from pathlib import Path
import jepsen.history as hmod
from jepsen.history import History

folder, part_events, stall_part = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
hmod.ROLL_EVENTS = part_events
real_fsync, calls = os.fsync, [0]

def fsync(fd):
    calls[0] += 1
    if calls[0] >= stall_part:
        time.sleep(3600)
    real_fsync(fd)

os.fsync = fsync
h = History(folder / "shard-00.parquet")
p = h.new_process()
for k in range(10**7):
    h.invoke(p, "send", k, key="k")
    h.complete(p, "ok", "send", k, key="k", offset=k)
"""

# The child records JSON Lines through a small buffer and no timed flush, so what reaches the
# file is cut wherever the buffer filled: mid-line, as a killed recorder leaves it.
JSONL_CHILD = """
import sys
from pathlib import Path
import jepsen.history as hmod
from jepsen.history import History

hmod.BUFFER_BYTES = 4096
h = History(Path(sys.argv[1]), flush_every_s=3600.0)
p = h.new_process()
for k in range(5000):
    h.invoke(p, "send", k, key="k")
    h.complete(p, "ok", "send", k, key="k", offset=k)
print("recorded", flush=True)
sys.stdin.read()
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the child by its PID and reap it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _wait_for(cond, proc: subprocess.Popen[str], what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the recorder exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {WAIT_S} s")
        time.sleep(0.05)


@pytest.fixture
def killed_parquet_run(tmp_path: Path) -> Path:
    """A run folder whose Parquet recorder was SIGKILLed while writing part STALL_PART."""
    run = tmp_path / "run"
    hist = run / "history"
    hist.mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", PARQUET_CHILD, str(hist), str(PART_EVENTS), str(STALL_PART)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        tmp_part = hist / f".shard-00.{STALL_PART:06d}.parquet.tmp"
        _wait_for(tmp_part.exists, proc, "part being written")
        time.sleep(0.3)  # the next part's rows fill up in memory: lost with the process
    finally:
        _kill(proc)
    assert proc.returncode == -signal.SIGKILL
    return run


def test_parts_closed_before_a_kill_read_back_whole(killed_parquet_run: Path) -> None:
    hist = killed_parquet_run / "history"
    whole = sorted(p.name for p in hist.glob("*.parquet"))
    assert whole == [f"shard-00.{n:06d}.parquet" for n in range(1, STALL_PART)]
    notes: list[str] = []
    events = list(read_events(killed_parquet_run, notes.append))
    n = (STALL_PART - 1) * PART_EVENTS
    assert [e["index"] for e in events] == list(range(n))  # nothing missing, nothing extra
    assert [e["value"] for e in events] == [i // 2 for i in range(n)]
    assert [e["type"] for e in events[:2]] == ["invoke", "ok"] and events[1]["offset"] == 0
    assert len(notes) == 1 and "half-written history part skipped" in notes[0], notes
    assert f".shard-00.{STALL_PART:06d}.parquet.tmp" in notes[0]
    assert len(read_history(hist)) == n  # the folder of shards, as the tests read it
    assert validate_shards(hist) == []  # the parts end on whole operations: the contract holds


def _analyze(run: Path, out_dir: Path, engine: str) -> None:
    """``jepsen analyze RUN`` on ``engine``: checked (not unreadable), with every whole part's
    operations, and the half-written part named in a note rather than a traceback."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "jepsen",
            "analyze",
            "--workload",
            "log",
            "--engine",
            engine,
            "--no-report",
            "--out",
            str(out_dir),
            str(run),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "Traceback" not in out.stderr, out.stderr
    assert "note:" in out.stderr and "half-written history part skipped" in out.stderr, out.stderr
    assert out.returncode in (0, 1, 2), (out.returncode, out.stdout, out.stderr)  # checked, not unreadable
    ops = str((STALL_PART - 1) * PART_EVENTS // 2)
    row = next(line for line in out.stdout.splitlines() if line.startswith(str(run)))
    assert ops in row.split(), row


@pytest.mark.slow
def test_the_spark_checker_reads_a_killed_run_with_a_note(killed_parquet_run: Path, tmp_path: Path) -> None:
    _analyze(killed_parquet_run, tmp_path / "analysis", "spark")


def test_the_checker_and_export_read_a_killed_run_with_a_note(
    killed_parquet_run: Path, tmp_path: Path
) -> None:
    _analyze(killed_parquet_run, tmp_path / "analysis", "inprocess")

    exported = subprocess.run(
        [sys.executable, "-m", "jepsen", "history", "export", str(killed_parquet_run), "-o", "-"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0 and "Traceback" not in exported.stderr, exported.stderr
    assert "half-written history part skipped" in exported.stderr
    assert len(exported.stdout.splitlines()) == (STALL_PART - 1) * PART_EVENTS


def test_a_json_lines_shard_cut_mid_line_reads_up_to_its_last_whole_line(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", JSONL_CHILD, str(path)],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "recorded", proc.stderr.read() if proc.stderr else ""
    finally:
        _kill(proc)
    raw = path.read_bytes()
    whole = raw.count(b"\n")
    assert 0 < whole < 10_000  # the buffer's tail never reached the file
    notes: list[str] = []
    events = list(read_events(path, notes.append))
    assert [e["index"] for e in events] == list(range(whole))
    if raw.endswith(b"\n"):  # the buffer happened to end on a line: nothing to say
        assert notes == []
    else:
        assert len(notes) == 1 and f"{path}:{whole + 1}: partial last line skipped" in notes[0], notes


def test_a_damaged_part_before_the_last_is_an_error_naming_it(killed_parquet_run: Path) -> None:
    """Parts are renamed into place only once whole: a bad one before the last is damage,
    reported with its name rather than skipped."""
    first = killed_parquet_run / "history" / "shard-00.000001.parquet"
    first.write_bytes(first.read_bytes()[:100])
    with pytest.raises(ValueError, match="shard-00.000001.parquet"):
        list(read_events(killed_parquet_run, lambda note: None))
