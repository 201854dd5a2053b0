"""``jepsen run --backend docker``: the queue workload on the docker-compose.yml group.

Faults go through Docker (``docker kill``, ``docker start``, ``docker pause``, iptables
inside the containers for partitions), via ``jepsen.docker.compose.ComposeGroup``. Each
run gets its own compose project, network prefix and published ports, so it never touches
a group a user already runs, and the group is torn down (volumes included) afterwards,
with every container's log saved beside the history.

The group runs as docker-compose.yml has it: ACL on and the ledger peers authenticated, with
the local backend's short held-message timing (``SEMANTICS_SETTINGS``: delay levels,
transaction checks, lock lifetime), so the delay, txn and order workloads judge it in a run
of seconds as they do a local group. Each
run makes its own superuser secret and cluster secret and hands them to compose; the
harness's clients (status calls, the workload's producers and consumers, in this process and
in the workers) sign with that account. ``groups`` > 1 (``--groups``) adds broker groups
through the generated override file; nodes are then named ``<broker name>/<member>``
(``broker-b/n2``) and the workload spreads its queues over every group, as with the local
backend.

``membership``: when the run's nemeses include it (``plan_faults``), each group gets spare
broker services that join empty (``jepsen.systems.docker_membership``).

``disk-full``: when the run's nemeses include it (``plan_faults``, before the group starts),
each broker's data volume is a tmpfs of ``SMALL_DISK_MB`` kept mounted by a holder container
(``jepsen.docker.layout.small_disks_override``: a tmpfs volume alone would be emptied by every
kill), and the nemesis fills and frees it like the local backend's tmpfs, with the same
``fill-disk``/``free-disk`` events. Other runs keep the plain volumes of docker-compose.yml: a
tmpfs costs RAM and caps the data, which only this fault wants.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jepsen.docker.compose import (
    TOPIC,
    ComposeGroup,
    docker_unavailable_reason,
    free_net_prefix,
    free_port,
)
from jepsen.net import relay
from jepsen.net.proxy import Link
from jepsen.systems.base import FILLER, SMALL_DISK_MB, SMALL_DISK_MB_MAX, Backend, Unsupported
from jepsen.systems.broker import BrokerQueueClient, broker_status, queue_spec
from jepsen.systems.broker_semantics import SEMANTICS_SETTINGS, BrokerTiming
from jepsen.systems.clients import LogClient
from jepsen.systems.credentials import Credentials
from jepsen.systems.docker_membership import DockerMembership

LOSS_CHAIN = "LEDGERMQ-LOSS"


def loss_script(peers: list[str], drop: float) -> str:
    """Shell for one container: drop incoming packets from each peer with probability ``drop``.

    iptables's ``statistic`` match in ``random`` mode; its choices come from the kernel, so
    unlike the local proxies they cannot be seeded. ``drop`` 0 (or no peers) empties the chain.
    """
    lines = [
        "set -e",
        f"iptables -w -N {LOSS_CHAIN} 2>/dev/null || true",
        f"iptables -w -F {LOSS_CHAIN}",
        f"iptables -w -C INPUT -j {LOSS_CHAIN} 2>/dev/null || iptables -w -I INPUT 1 -j {LOSS_CHAIN}",
    ]
    if drop > 0:
        lines += [
            f"iptables -w -A {LOSS_CHAIN} -s {ip} -m statistic --mode random --probability {drop:.4f} -j DROP"
            for ip in peers
        ]
    return "\n".join(lines)


class DockerBrokerBackend(DockerMembership, Backend):
    system = "broker"
    client_timeout = 4.0
    topic = TOPIC
    supports_loss = True  # iptables statistic match
    supports_delay = True  # a relay in the sending container (jepsen.net.relay): no netem here

    small_disks_from_start = True  # the volumes are laid out by ``start``; no set-up restarts

    def __init__(self, base_dir: Path, queues: int = 2, *, groups: int = 1) -> None:
        super().__init__(base_dir)
        self.queues = queues
        self.logs_dir = self.base_dir / "logs"
        self.credentials = Credentials("jepsen-admin", secrets.token_hex(24))
        self.group = ComposeGroup(
            f"jepsen{os.getpid()}t{int(time.time())}",
            net=free_net_prefix(),
            log_dir=self.logs_dir,
            groups=groups,
            access_key=self.credentials.access_key,
            secret_key=self.credentials.secret_key,
            cluster_secret=secrets.token_hex(32),
            broker_settings=SEMANTICS_SETTINGS,
        )
        #: what the held-message workloads must know of the group's timing (in the client spec)
        self.timing = BrokerTiming.from_settings(SEMANTICS_SETTINGS)
        self.group.published_ports = {name: free_port() for name in self.group.services}
        self.nodes = list(self.group.node_ids)
        #: several groups: the workload spreads its queues over these (None: one group)
        self.broker_names = list(self.group.broker_names) if groups > 1 else None
        #: the shaping in force on ``self.shaped`` (set_shape), applied again after a restart
        self._shape: dict[str, float] = {"delay_ms": 0.0, "jitter_ms": 0.0, "drop": 0.0, "seed": 0}
        self._credentials_file: Path | None = None
        self._rc = self.loop_client(lambda: self.group.remoting_client("jepsen-status"))  # signs: ACL is on
        self._up = False

    def plan_faults(self, faults: Sequence[str]) -> None:
        """With ``disk-full`` among the faults, start the brokers on small tmpfs volumes."""
        if "disk-full" in faults and not self._up:
            self.group.small_disk_bytes = SMALL_DISK_MB << 20
        self._plan_membership(faults)

    def small_disk_refusal(self) -> str | None:
        if self.group.small_disk_bytes is None:
            return (
                "disk-full on the docker backend needs the brokers' data on small volumes, laid out "
                "when the group starts: name disk-full among the run's nemeses (jepsen run --nemesis)"
            )
        return None

    def fill_disk(self, nid: str) -> dict[str, Any]:
        """Fill the broker's tmpfs volume to the last page (through its holder; the broker keeps running)."""
        info = self.group.fill_disk(self.group.service_of(nid), FILLER, SMALL_DISK_MB_MAX << 20)
        return {"node": nid, **info}

    def free_disk(self, nid: str) -> dict[str, Any]:
        return {"node": nid, **self.group.free_disk(self.group.service_of(nid), FILLER)}

    def start(self) -> None:
        reason = docker_unavailable_reason()
        if reason:
            raise Unsupported(f"--backend docker needs a Docker engine: {reason}")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._credentials_file = self.credentials.write(self.base_dir)
        self._up = True
        self.group.up(build="always", log=lambda *a: None)  # test the code as it is now

    def stop(self) -> None:
        if self._up:
            self._up = False
            self.group.down(logs=self.logs_dir)

    async def status(self, nid: str) -> dict[str, Any] | None:
        service = self.group.service_of(nid)
        st = broker_status(await self.group.runtime_info(self._rc.get(), service))
        if st is not None and st.get("leader") and self.group.groups > 1:
            st["leader"] = f"{self.group.broker_name_of(service)}/{st['leader']}"  # the ledger's member id
        return st

    def node_groups(self) -> dict[str, list[str]]:
        if self.group.groups == 1:
            return super().node_groups()
        return self._member_groups()  # the groups' current members (membership changes them)

    async def wait_for_leader(self, timeout: float = 30.0) -> str:
        """Every group has a ready master (the run needs all its queues); returns them, comma-separated."""
        if self.group.groups == 1:
            return await super().wait_for_leader(timeout)
        return await self.wait_for_every_leader(timeout)

    def forge_targets(self) -> dict[str, Any]:
        """The containers' real ledger and broker addresses (reachable from a Linux host)."""
        return {
            "ledger": dict(self.group.ledger_addrs),
            "secured": True,  # every compose node runs with the cluster secret (made if none is given)
            "admin": [self.group.broker_addr(s) for s in self.group.brokers],
            "acl": self.group.acl_enabled,
        }

    def kill(self, nid: str) -> None:
        self.group.kill(self.group.service_of(nid))
        self.killed.add(nid)
        self.paused.discard(nid)

    def restart(self, nid: str) -> None:
        self.group.restart(self.group.service_of(nid), wait_healthy=False)
        self.killed.discard(nid)
        if self.shaped:  # a new container network namespace: its shaping rules are gone
            self._apply_shape([nid])

    def pause(self, nid: str) -> None:
        self.group.pause(self.group.service_of(nid))
        self.paused.add(nid)

    def resume(self, nid: str) -> None:
        self.group.unpause(self.group.service_of(nid))
        self.paused.discard(nid)

    def set_cut(self, links: set[Link]) -> dict[str, Any]:
        svc = self.group.service_of
        reply = self.group.cut({(svc(a), svc(b)) for a, b in links})
        self.cut = set(links)
        return reply

    def set_shape(
        self, links: set[Link], *, delay_ms: float = 0, jitter_ms: float = 0, drop: float = 0, seed: int = 0
    ) -> dict[str, Any]:
        """Slow and/or lossy peer links: loss by iptables's ``statistic`` match at each link's
        destination, delay by a relay in each link's source container (``jepsen.net.relay``:
        this kernel has no netem). Kept, and applied again to a node that restarts."""
        self.shaped = set(links)
        self._shape = {"delay_ms": delay_ms, "jitter_ms": jitter_ms, "drop": drop, "seed": seed}
        failed = self._apply_shape(list(self.nodes))
        if failed and links:
            raise RuntimeError(f"network shaping not applied on {failed}")
        return {
            "shaped": sorted([a, b] for a, b in links),
            "drop": drop,
            "delay_ms": delay_ms,
            "jitter_ms": jitter_ms,
            "unapplied": failed,
        }

    def _apply_shape(self, nids: list[str]) -> dict[str, str]:
        """Write the shaping rules (and relay) of ``nids``; returns the nodes where that failed."""
        svc = self.group.service_of
        shape = self._shape
        slow = shape["delay_ms"] > 0 or shape["jitter_ms"] > 0
        failed: dict[str, str] = {}
        for nid in nids:
            if nid in self.killed:
                continue  # applied when it restarts
            inbound = sorted(self.group.ip(svc(a)) for a, b in self.shaped if b == nid)
            outbound = sorted(
                tuple(self.group.ledger_addr(svc(b)).rsplit(":", 1))
                for a, b in self.shaped
                if a == nid and slow
            )
            script = "\n".join(
                [
                    loss_script(inbound, shape["drop"]),
                    relay.install_script(
                        [(ip, int(port)) for ip, port in outbound],
                        shape["delay_ms"],
                        shape["jitter_ms"],
                        int(shape["seed"]) * len(self.nodes) + self.nodes.index(nid),  # a stream per sender
                    ),
                ]
            )
            proc = self.group.docker(
                "exec", self.group.container_id(svc(nid)), "sh", "-c", script, check=False
            )
            if proc.returncode != 0:
                failed[nid] = (proc.stderr or proc.stdout).strip()[-300:] or f"exit {proc.returncode}"
        return failed

    def log_client(self) -> LogClient:
        raise Unsupported("the docker group runs brokers: use --workload queue")

    def _names(self) -> dict[str, str]:
        return {self.group.broker_addr(self.group.service_of(n)): n for n in self.pool}

    def queue_client(self, broker_name: str | None = None) -> BrokerQueueClient:
        return BrokerQueueClient(
            self.group.namesrv_addrs,
            self._names(),
            self.topic,
            timeout=self.client_timeout,
            broker_name=broker_name,
            credentials=self.credentials,
        )

    def client_spec(self) -> dict[str, Any]:
        if self._credentials_file is None:
            self._credentials_file = self.credentials.write(self.base_dir)
        spec = queue_spec(self, self._names(), self.group.namesrv_addrs, self._credentials_file)
        if self.broker_names:
            spec["broker_names"] = list(self.broker_names)
        return spec

    def log_files(self) -> dict[str, Path]:
        return {
            n: path
            for n in self.pool
            if (path := self.logs_dir / f"{self.group.service_of(n)}.log").exists() or n in self.nodes
        }

    def cleanup_data(self) -> None:
        """Nothing to do: ``down -v`` already removed the containers' volumes."""


def docker_broker_backend(
    base_dir: Path,
    *,
    groups: int | None = 1,
    host_base: str | None = None,
    port_base: int | None = None,
    **kw: Any,
) -> DockerBrokerBackend:
    """The docker group for ``--backend docker``: ``groups`` broker groups; the group has its own
    network and publishes free ports, so there is no host or port base to take (a run that
    names one is refused before this)."""
    del host_base, port_base
    return DockerBrokerBackend(base_dir, groups=int(groups or 1), **kw)
