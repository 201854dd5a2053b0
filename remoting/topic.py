"""Topic configuration and data versions as they travel between broker and nameserver.

Wire names are RocketMQ's (``topicConfigTable``, ``dataVersion``, ``readQueueNums``...) so
that dumps look familiar to RocketMQ users and tools.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from remoting.exceptions import RemotingCommandError
from remoting.jsonbody import Fields, dump_body

PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1
PERM_READ_WRITE = PERM_READ | PERM_WRITE

TOPIC_MAX_LENGTH = 127
MAX_QUEUE_NUMS = 1024
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def perm_to_string(perm: int) -> str:
    """RocketMQ's ``RW-`` style, for logs and admin output."""
    return (
        ("R" if perm & PERM_READ else "-")
        + ("W" if perm & PERM_WRITE else "-")
        + ("X" if perm & PERM_INHERIT else "-")
    )


def topic_name_error(name: object) -> str | None:
    """Why ``name`` is not a valid topic name, or None if it is."""
    if not isinstance(name, str) or not name:
        return "topic name must be a non-empty string"
    if len(name) > TOPIC_MAX_LENGTH:
        return f"topic name is {len(name)} chars, longer than {TOPIC_MAX_LENGTH}"
    if not _TOPIC_RE.match(name):
        return f"topic name {name!r} may only contain letters, digits, '%', '|', '_' and '-'"
    return None


@dataclass(frozen=True, slots=True)
class DataVersion:
    """Version of a broker's topic configuration; the nameserver compares it to skip re-registration."""

    timestamp: int = 0
    counter: int = 0

    def next(self, now_ms: int | None = None) -> DataVersion:
        """The version after a configuration change."""
        return DataVersion(int(time.time() * 1000) if now_ms is None else now_ms, self.counter + 1)

    def to_json(self) -> dict[str, Any]:
        return {"timestamp": self.timestamp, "counter": self.counter}

    @classmethod
    def from_json(cls, obj: Any, path: str = "dataVersion") -> DataVersion:
        f = Fields(obj, path)
        return cls(f.get_int("timestamp", 0, lo=0), f.get_int("counter", 0, lo=0))


@dataclass(frozen=True, slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": self.topic_filter_type,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }

    @classmethod
    def from_json(cls, obj: Any, path: str) -> TopicConfig:
        f = Fields(obj, path)
        name = f.get_str("topicName", max_len=TOPIC_MAX_LENGTH)
        problem = topic_name_error(name)
        if problem:
            raise RemotingCommandError(f"{path}.topicName: {problem}")
        return cls(
            topic_name=name,
            read_queue_nums=f.get_int("readQueueNums", 16, lo=0, hi=MAX_QUEUE_NUMS),
            write_queue_nums=f.get_int("writeQueueNums", 16, lo=0, hi=MAX_QUEUE_NUMS),
            perm=f.get_int("perm", PERM_READ_WRITE, lo=0, hi=15),
            topic_filter_type=f.get_str("topicFilterType", "SINGLE_TAG", max_len=32),
            topic_sys_flag=f.get_int("topicSysFlag", 0, lo=0, hi=0x7FFFFFFF),
            order=f.get_bool("order", False),
        )


@dataclass(frozen=True, slots=True)
class TopicConfigWrapper:
    """A broker's whole topic table plus its version: the body of REGISTER_BROKER."""

    topic_config_table: dict[str, TopicConfig] = field(default_factory=dict)
    data_version: DataVersion = field(default_factory=DataVersion)
    # each topic's entry already encoded (``topic_entry_json``), by a holder that keeps them as
    # its topics change: a broker registers its whole table every round, and encoding 10,000
    # topics afresh took 45 ms of its event loop each time
    encoded_entries: tuple[bytes, ...] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "topicConfigTable": {name: tc.to_json() for name, tc in self.topic_config_table.items()},
            "dataVersion": self.data_version.to_json(),
        }

    def body(self) -> bytes:
        """The JSON body of REGISTER_BROKER (``to_json`` encoded), from the encoded entries if given."""
        if self.encoded_entries is None:
            return dump_body(self.to_json())
        version = dump_body(self.data_version.to_json())
        return (
            b'{"topicConfigTable":{' + b",".join(self.encoded_entries) + b'},"dataVersion":' + version + b"}"
        )

    @classmethod
    def from_json(cls, obj: Any, path: str = "body") -> TopicConfigWrapper:
        f = Fields(obj, path)
        raw_table = f.get_obj("topicConfigTable", {})
        table: dict[str, TopicConfig] = {}
        for name, raw in raw_table.items():
            tc = TopicConfig.from_json(raw, f"{path}.topicConfigTable.{name}")
            if tc.topic_name != name:
                raise RemotingCommandError(
                    f"{path}.topicConfigTable.{name}: topicName {tc.topic_name!r} differs from its key"
                )
            table[name] = tc
        version = DataVersion.from_json(f.get_obj("dataVersion", {}), f"{path}.dataVersion")
        return cls(table, version)


def topic_entry_json(tc: TopicConfig) -> bytes:
    """One topic's ``"name":{...}`` in a REGISTER_BROKER body, as ``to_json`` would encode it."""
    return dump_body(tc.topic_name) + b":" + dump_body(tc.to_json())


class LazyTopicConfigWrapper:
    """A received topic table whose entries are validated only when first read.

    The nameserver reads the table only when a master's data version changed, so the common
    re-registration (every 30 s, same version) costs one JSON parse and no per-topic checks.
    """

    __slots__ = ("data_version", "_raw", "_path", "_table")

    def __init__(self, raw_table: Mapping[str, Any], data_version: DataVersion, path: str) -> None:
        self.data_version = data_version
        self._raw = raw_table
        self._path = path
        self._table: dict[str, TopicConfig] | None = None

    @classmethod
    def from_json(cls, obj: Any, path: str = "body") -> LazyTopicConfigWrapper:
        f = Fields(obj, path)
        raw_table = f.get_obj("topicConfigTable", {})
        version = DataVersion.from_json(f.get_obj("dataVersion", {}), f"{path}.dataVersion")
        return cls(raw_table, version, path)

    @property
    def topic_config_table(self) -> dict[str, TopicConfig]:
        """Parsed and validated on first access; RemotingCommandError names the bad field."""
        if self._table is None:
            self._table = TopicConfigWrapper.from_json(
                {"topicConfigTable": self._raw, "dataVersion": self.data_version.to_json()}, self._path
            ).topic_config_table
        return self._table
