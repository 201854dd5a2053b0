"""Grow a ``LocalCluster`` by a node started with ``join`` (for tests and benchmarks).

The new node gets its own loopback address, port, data directory, config file and log,
like the cluster's first members; it starts outside the group (``ledger start --join``)
and waits to be added with ``ledger member add`` (or ``LedgerClient.add_learner``). The
cluster reaps it with the others, by PID.
"""

from __future__ import annotations

import shutil
from typing import Any

from common.process import free_port, write_toml

from .localcluster import LocalCluster

#: Loopback addresses 127.0.0.x are handed out up to this x (a cluster's first members start at 1).
MAX_LOOPBACK_HOST = 250


def start_joining_node(cluster: LocalCluster, nid: str, **settings: Any) -> str:
    """Start node ``nid`` with ``join`` = the cluster's current addresses; returns its address.

    ``settings`` override the cluster's (e.g. ``join_timeout_s``). An id used before gets a
    fresh data directory: a replacement for a dead machine, not the same node coming back.
    """
    if nid in cluster.ids:
        raise ValueError(f"{nid!r} is already one of the cluster's nodes")
    if len(cluster.ids) >= MAX_LOOPBACK_HOST:
        raise ValueError(f"no loopback address left (at most {MAX_LOOPBACK_HOST} nodes)")
    used = set(cluster.hosts.values())
    distinct = len(used) > 1
    host = next(f"127.0.0.{i}" for i in range(1, MAX_LOOPBACK_HOST + 1) if f"127.0.0.{i}" not in used)
    if not distinct:
        host = next(iter(used))
    join = list(cluster.addresses)
    cluster.ids.append(nid)
    cluster.hosts[nid] = host
    cluster.ports[nid] = free_port(host)
    d = cluster.base_dir / nid
    shutil.rmtree(d / "data", ignore_errors=True)
    d.mkdir(parents=True, exist_ok=True)
    conf = {
        "id": nid,
        "listen": cluster.address(nid),
        "data_dir": str(d / "data"),
        "join": join,
        **cluster.settings,
        **settings,
    }
    write_toml(cluster.config_path(nid), conf)
    cluster.start_node(nid)
    return cluster.address(nid)


def wipe_node(cluster: LocalCluster, nid: str) -> None:
    """Kill ``nid`` (SIGKILL, reaped) and delete its data: a machine whose disk died."""
    cluster.kill(nid)
    shutil.rmtree(cluster.base_dir / nid / "data", ignore_errors=True)
