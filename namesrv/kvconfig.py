"""The nameserver's KV config area (RocketMQ's KVConfigManager): namespace -> key -> value.

Used for cluster-wide settings such as ORDER_TOPIC_CONFIG (which brokers and queue counts an
ordered topic uses). Unlike the route table it is not rebuilt by broker registrations, so it is
persisted: written atomically (temp file + rename) on every change, loaded at start-up.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("namesrv.kvconfig")

ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"
MAX_NAME_LEN = 255
MAX_VALUE_LEN = 64 * 1024


class KVConfigError(ValueError):
    """The persisted file is unreadable, or a namespace/key/value is invalid."""


class KVPersistError(KVConfigError):
    """A change could not be written to disk; it was not applied (nothing unpersisted is served)."""


class KVConfigManager:
    """In-memory table with optional JSON persistence at ``path`` (empty: memory only)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path else None
        self.table: dict[str, dict[str, str]] = {}
        self.generation = 0
        """Bumped on every change, so answers that include KV entries (routes) can be cached."""

    def load(self) -> None:
        """Read the persisted table; a corrupt file stops start-up rather than silently losing config."""
        if self.path is None or not self.path.exists():
            return
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise KVConfigError(f"kv config file {self.path}: cannot read: {exc}") from None
        table = doc.get("configTable") if isinstance(doc, dict) else None
        if not isinstance(table, dict):
            raise KVConfigError(f"kv config file {self.path}: expected an object with 'configTable'")
        loaded: dict[str, dict[str, str]] = {}
        for ns, entries in table.items():
            if not isinstance(entries, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in entries.items()
            ):
                raise KVConfigError(
                    f"kv config file {self.path}: namespace {ns!r} must map strings to strings"
                )
            loaded[ns] = dict(entries)
        self.table = loaded
        self.generation += 1
        log.info("kv config loaded", extra={"path": str(self.path), "namespaces": len(loaded)})

    def _persist(self, table: dict[str, dict[str, str]]) -> None:
        """Write ``table`` durably, or raise KVPersistError; callers install it only afterwards."""
        if self.path is None:
            return
        data = json.dumps({"configTable": table}, indent=2, sort_keys=True)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".kvConfig.", dir=self.path.parent)
        except OSError as exc:
            raise KVPersistError(f"kv config file {self.path}: cannot write: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the rename itself survives a crash
            finally:
                os.close(dir_fd)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise KVPersistError(f"kv config file {self.path}: cannot write: {exc.strerror or exc}") from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @staticmethod
    def _check(namespace: str, key: str, value: str | None = None) -> None:
        for what, item in (("namespace", namespace), ("key", key)):
            if not item or len(item) > MAX_NAME_LEN:
                raise KVConfigError(f"kv config {what} must be 1..{MAX_NAME_LEN} chars, got {item!r}")
        if value is not None and len(value) > MAX_VALUE_LEN:
            raise KVConfigError(
                f"kv config value for {namespace}/{key} is {len(value)} chars, over {MAX_VALUE_LEN}"
            )

    def put(self, namespace: str, key: str, value: str) -> None:
        self._check(namespace, key, value)
        old = self.table.get(namespace, {}).get(key)
        table = {**self.table, namespace: {**self.table.get(namespace, {}), key: value}}
        self._persist(table)  # raises before anything changes: an unpersisted value is never served
        self.table = table
        self.generation += 1
        log.info(
            "kv config %s" % ("created" if old is None else "updated"),
            extra={"namespace": namespace, "key": key, "value": value},
        )

    def get(self, namespace: str, key: str) -> str | None:
        return self.table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> bool:
        ns = self.table.get(namespace)
        if ns is None or key not in ns:
            return False
        table = dict(self.table)
        rest = {k: v for k, v in ns.items() if k != key}
        if rest:
            table[namespace] = rest
        else:
            del table[namespace]
        self._persist(table)  # raises before anything changes
        self.table = table
        self.generation += 1
        log.info("kv config deleted", extra={"namespace": namespace, "key": key})
        return True

    def get_namespace(self, namespace: str) -> dict[str, str] | None:
        ns = self.table.get(namespace)
        return dict(ns) if ns is not None else None
