"""The one local launcher (``common.localgroup``): what every ``local-cluster``, test group and
harness backend relies on, checked on real processes, sockets, files and signals."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import sys
from pathlib import Path

import pytest

from common.localgroup import (
    LocalGroup,
    free_port_pair,
    poll_until,
    secret_file_setting,
    stop_requested,
    write_pid_file,
)

#: how long a test child may live at most (it is stopped long before)
CHILD_LIFETIME_S = 60


class Sleepers(LocalGroup):
    """Two sleeping children, each with a config file and a PID file, as a launcher's nodes."""

    names = ("a", "b")

    def write_configs(self) -> None:
        for name in self.names:
            (self.base_dir / name).mkdir(parents=True, exist_ok=True)
            (self.base_dir / name / "node.toml").write_text(f'id = "{name}"\n', encoding="utf-8")

    def start_nodes(self) -> None:
        for name in self.names:
            argv = [sys.executable, "-c", f"import time; time.sleep({CHILD_LIFETIME_S})"]
            self.spawn(name, argv, self.base_dir / name / "node.log")
            self.write_pid(name, self.base_dir / name / "node.pid")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_group_starts_in_order_writes_pids_and_stops_every_process(tmp_path: Path) -> None:
    with Sleepers(tmp_path) as group:
        pids = {n: int((tmp_path / n / "node.pid").read_text()) for n in group.names}
        assert pids == {n: group.pid(n) for n in group.names}
        assert all((tmp_path / n / "node.toml").exists() for n in group.names)
        assert group.dead() == []
        group.kill("a")
        assert group.dead() == ["a"]
    assert not any(_alive(pid) for pid in pids.values())  # reaped, not left as zombies either
    assert all(group.procs[n].returncode is not None for n in group.names)


def test_a_group_is_stopped_when_its_block_raises(tmp_path: Path) -> None:
    group = Sleepers(tmp_path)
    with pytest.raises(RuntimeError), group:
        pid = group.pid("b")
        raise RuntimeError("the test failed half-way")
    assert pid is not None and not _alive(pid)


def test_free_port_pair_leaves_the_fast_channel_free() -> None:
    port = free_port_pair("127.0.0.1")
    assert port - 2 > 1024
    for p in (port, port - 2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # both still bindable


def test_the_secret_file_named_given_inline_kept_or_made(tmp_path: Path) -> None:
    named = {"cluster_secret_file": "/elsewhere/cluster.secret"}
    assert secret_file_setting(named, tmp_path / "s1") == "/elsewhere/cluster.secret"
    assert not (tmp_path / "s1").exists()

    inline = {"cluster_secret": "x" * 32}
    path = secret_file_setting(inline, tmp_path / "s2")
    assert Path(path).read_text() == "x" * 32 + "\n" and "cluster_secret" not in inline
    assert inline["cluster_secret_file"] == path

    fresh: dict[str, str] = {}
    path = secret_file_setting(fresh, tmp_path / "s3")
    made = Path(path).read_text()
    assert len(made.strip()) == 64 and stat.S_IMODE(Path(path).stat().st_mode) == 0o600
    again: dict[str, str] = {}
    assert Path(secret_file_setting(again, tmp_path / "s3")).read_text() == made  # kept


def test_a_pid_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "n.pid"
    write_pid_file(path, 123)
    write_pid_file(path, 456)
    assert path.read_text() == "456\n" and not list(tmp_path.glob("*.tmp"))


def test_sigterm_sets_the_stop_event_and_the_old_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with stop_requested() as stop:
        assert not stop.is_set()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5.0)
    assert signal.getsignal(signal.SIGTERM) is before


def test_poll_until_returns_the_first_answer_or_names_what_did_not_happen() -> None:
    answers = iter([None, None, "n2"])

    async def check() -> str | None:
        return next(answers)

    assert asyncio.run(poll_until(check, 5.0, 0.01, "never")) == "n2"

    async def nothing() -> None:
        return None

    with pytest.raises(TimeoutError, match="no leader within"):
        asyncio.run(poll_until(nothing, 0.1, 0.01, "no leader within 0.1s"))
