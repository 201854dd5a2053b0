"""The image build's source digest: what decides whether the project wheel is built again."""

from __future__ import annotations

from pathlib import Path

from jepsen.docker.images import source_digest


def _tree(root: Path) -> None:
    (root / "ledger").mkdir(parents=True)
    (root / "ledger" / "raft.py").write_text("TERM = 1\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")


def test_the_digest_follows_the_source_and_ignores_caches(tmp_path: Path) -> None:
    _tree(tmp_path)
    first = source_digest(tmp_path)
    assert source_digest(tmp_path) == first
    cache = tmp_path / "ledger" / "__pycache__"
    cache.mkdir()
    (cache / "raft.cpython-311.pyc").write_bytes(b"\x00compiled")
    (tmp_path / "ledger" / ".ruff_cache").mkdir()
    (tmp_path / "ledger" / ".ruff_cache" / "x").write_text("y")
    assert source_digest(tmp_path) == first
    (tmp_path / "ledger" / "raft.py").write_text("TERM = 2\n")
    assert source_digest(tmp_path) != first
    (tmp_path / "ledger" / "raft.py").write_text("TERM = 1\n")
    assert source_digest(tmp_path) == first
    (tmp_path / "ledger" / "raft.py").rename(tmp_path / "ledger" / "log.py")  # same bytes, new path
    assert source_digest(tmp_path) != first
