"""Drive the top-level docker-compose.yml group: stand up, inspect, break, tear down.

``ComposeGroup`` is what the container tests and the harness's ``docker`` backend use. It
shells out to ``docker compose`` (v2) or ``docker-compose`` (v1, what Debian ships), because
testcontainers' ``DockerCompose`` speaks only v2 (``ps --format json``) and this project's
machines have v1. Containers are found by the compose labels
(``com.docker.compose.project`` / ``.service``), so a group started by anyone (v1, v2,
testcontainers, a user's shell) can be driven, and faults go through the plain ``docker``
CLI: ``kill``, ``start``, ``pause``/``unpause``, and iptables inside the containers
(they run with ``cap_add: NET_ADMIN``) for partitions.

The addresses are fixed by docker-compose.yml: every service has
``<LEDGERMQ_NET>.<octet>`` on the project network; :data:`LAYOUT` mirrors the file and
:meth:`ComposeGroup.up` checks that the containers really got those addresses.

Partitions are directed, as the harness's local backend models them: cutting ``a -> b``
drops a's packets to b both where they leave (OUTPUT in a) and where they arrive (INPUT in
b), so the cut holds while either end is paused or restarting; rules live in the
``LEDGERMQ-IN``/``LEDGERMQ-OUT`` chains and are put back after a restart or unpause (a
restarted container gets a fresh network namespace). TCP needs both directions, so a
one-way cut stops a connection both ways in practice; what one-way cuts add is that new
connections in the other direction fail differently (SYN dropped vs SYN-ACK dropped).

Example::

    group = ComposeGroup(project="ledgermq-dev")
    group.up()                                      # build if missing, wait healthy
    master = asyncio.run(group.wait_for_master())   # "broker1" (routed by the nameservers)
    group.kill(master)                              # SIGKILL the container
    new = asyncio.run(group.wait_for_master(exclude={master}))
    group.partition([new], ["broker1", "broker2", "broker3"])   # isolate the new master
    group.heal()
    group.logs(Path("logs"))
    group.down()                                    # containers, network, volumes
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from remoting import RemotingClient
    from remoting.acl import RequestSigner

from .images import DEFAULT_IMAGE, ROOT, build_image, build_spark_image, image_exists
from .layout import (
    DATA_DIR,
    DEFAULT_ACCESS_KEY,
    DEFAULT_SECRET_KEY,
    NAMESRV_PORT,
    PASSED_BROKER_SETTINGS,
    SECRET_FILE,
    SPARK_CONNECT_PORT,
    SPARK_MASTER_PORT,
    ServiceSpec,
    broker_name,
    check_groups,
    disk_holder,
    groups_override,
    layout,
    member_vars,
    membership_override,
    passed_setting_var,
    small_disks_override,
    spare_layout,
)

COMPOSE_FILE = ROOT / "docker-compose.yml"
SPARK_COMPOSE_FILE = ROOT / "docker-compose.spark.yml"
DEFAULT_SPARK_IMAGE = "ledgermq-spark:latest"
DEFAULT_RUNS_DIR = Path("/tmp/ledgermq-runs")
DEFAULT_NET = "172.28.10"


LAYOUT: dict[str, ServiceSpec] = layout(1)  # docker-compose.yml on its own
NAMESERVERS = tuple(n for n, s in LAYOUT.items() if s.kind == "namesrv")
BROKERS = tuple(n for n, s in LAYOUT.items() if s.kind == "broker")
TOPIC = "TopicTest"  # created by the first master (BROKER_TOPICS in docker-compose.yml)
BROKER_NAME = "broker-a"
#: seconds one fill or free of a small disk may take (a fill writes at most the disk's size, in RAM)
DISK_OP_TIMEOUT_S = 60.0

#: Run inside a disk holder: append zeros to the filler (argv[1]) until ENOSPC, 1 MiB blocks and
#: then 4 KiB ones for the last pages, at most argv[2] bytes per block size; prints what it did.
FILL_SCRIPT = """
import errno, json, os, sys
path, limit = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
try:
    for chunk in (1 << 20, 4096):
        block = bytes(chunk)
        for _ in range(limit // chunk):
            try:
                if os.write(fd, block) < chunk:
                    break
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
finally:
    os.close(fd)
st = os.statvfs(os.path.dirname(path))
print(json.dumps({"filler_bytes": os.stat(path).st_size, "free_bytes": st.f_bavail * st.f_frsize,
                  "disk_bytes": st.f_blocks * st.f_frsize}))
"""
#: Run inside a disk holder: delete the filler (argv[1]); prints how many bytes that freed.
FREE_SCRIPT = """
import json, os, sys
try:
    size = os.stat(sys.argv[1]).st_size
    os.unlink(sys.argv[1])
except FileNotFoundError:
    size = 0
print(json.dumps({"freed": size}))
"""

Link = tuple[str, str]


class ComposeError(RuntimeError):
    """A docker or compose command failed, or the group did not reach the wanted state in time."""


def compose_command() -> list[str]:
    """The compose CLI: ``$LEDGERMQ_COMPOSE`` if set, else ``docker compose`` (v2), else ``docker-compose`` (v1)."""
    override = os.environ.get("LEDGERMQ_COMPOSE")
    if override:
        return override.split()
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise ComposeError("neither `docker compose` (v2) nor `docker-compose` (v1) is installed")


def docker_unavailable_reason() -> str | None:
    """None if a Docker engine answers and a compose CLI exists; otherwise why not (for skips)."""
    if not shutil.which("docker"):
        return "the docker CLI is not installed"
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if info.returncode != 0:
        return f"no Docker engine answers (`docker info`: {(info.stderr or info.stdout).strip()[:200]})"
    try:
        compose_command()
    except ComposeError as exc:
        return str(exc)
    return None


def free_net_prefix(start: int = 10) -> str:
    """A ``172.28.N`` prefix whose /24 overlaps no existing Docker network (for parallel groups)."""
    ids = subprocess.run(
        ["docker", "network", "ls", "-q"], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    used: list[ipaddress.IPv4Network] = []
    if ids:
        out = subprocess.run(
            ["docker", "network", "inspect", *ids], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        for net in json.loads(out):
            for cfg in (net.get("IPAM") or {}).get("Config") or []:
                try:
                    used.append(ipaddress.ip_network(cfg.get("Subnet", ""), strict=False))
                except ValueError:
                    continue
    for n in [*range(start, 255), *range(0, start)]:
        cand = ipaddress.ip_network(f"172.28.{n}.0/24")
        if not any(cand.overlaps(u) for u in used if u.version == 4):
            return f"172.28.{n}"
    raise ComposeError("no free 172.28.N.0/24 for the group's network")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (for publishing a test group beside a user's)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ComposeGroup:
    """The 2 nameservers and the broker group(s) of docker-compose.yml as one compose project.

    ``project`` names the compose project (containers, network and volumes carry it), so
    several groups can run side by side when each gets its own ``net`` prefix and published
    ports. ``groups`` > 1 adds broker groups through a generated override file
    (:func:`jepsen.docker.layout.groups_override`). All waits are bounded and raise
    :class:`ComposeError` naming what was not reached.

    ACL: docker-compose.yml turns it on by default, so everything this class asks the brokers
    signs with the superuser account the containers get (``access_key``/``secret_key``; by
    default ``LEDGERMQ_ACCESS_KEY``/``LEDGERMQ_SECRET_KEY`` from ``env`` or the environment,
    else the file's defaults), which :meth:`compose_env` hands to compose.
    """

    def __init__(
        self,
        project: str = "ledgermq",
        *,
        net: str | None = None,
        image: str | None = None,
        publish_host: str = "127.0.0.1",
        published_ports: Mapping[str, int] | None = None,
        compose_file: Path = COMPOSE_FILE,
        compose_cmd: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        groups: int = 1,
        access_key: str | None = None,
        secret_key: str | None = None,
        cluster_secret: str | None = None,
        spark: bool = False,
        runs_dir: Path | None = None,
        small_disk_bytes: int | None = None,
        broker_settings: Mapping[str, Any] | None = None,
        spares: int = 0,
    ) -> None:
        """``net``: first three octets of the network (default from ``$LEDGERMQ_NET`` or 172.28.10);
        ``published_ports``: service -> host port (defaults as in docker-compose.yml);
        ``env``: extra variables for compose (e.g. ``LEDGERMQ_BASE_IMAGE``);
        ``log_dir``: where :meth:`down` saves every container's log before removing it;
        ``groups``: broker groups of three; ``access_key``/``secret_key``: the superuser account
        (see the class docstring); ``cluster_secret``: the secret every node proves to the others
        (LEDGERMQ_CLUSTER_SECRET; None: the nodes make one on their first start and share it in
        the project's ``cluster-secret`` volume, as a plain ``docker-compose up`` does, and
        :meth:`read_cluster_secret` reads it);
        ``spark``: add docker-compose.spark.yml's master, worker and Connect server, which see
        ``runs_dir`` (absolute; default /tmp/ledgermq-runs) at the same path as this host;
        ``small_disk_bytes``: put each broker's data on a tmpfs volume of that size, kept mounted
        by a holder service (:func:`jepsen.docker.layout.small_disks_override`), so that
        :meth:`fill_disk` can make its writes fail with ENOSPC (None: plain volumes);
        ``broker_settings``: broker settings every broker gets, of
        :data:`~jepsen.docker.layout.PASSED_BROKER_SETTINGS` (delay levels, transaction checks,
        lock lifetime; the others are the file's), handed to compose as ``BROKER_<KEY>``;
        ``spares``: spare brokers a group for membership changes
        (:func:`jepsen.docker.layout.membership_override`): defined, not started by :meth:`up`;
        :meth:`start_joining` creates one (or re-creates a wiped member) empty with ``join``."""
        self.project = project
        self.groups = check_groups(groups)
        self.spark = spark
        self.runs_dir = Path(runs_dir or DEFAULT_RUNS_DIR).resolve()
        self.layout = layout(self.groups, spark=spark)
        #: the services faults (kills, pauses, cuts) are aimed at: the message system, not Spark
        self.system_services = tuple(n for n, s in self.layout.items() if s.kind != "spark")
        self.brokers = tuple(n for n, s in self.layout.items() if s.kind == "broker")
        #: spare broker services (not started by ``up``), and the compose variables that set each
        #: broker's ``group``/``join`` when ``start_joining`` (re)creates it
        self.spare_layout: dict[str, ServiceSpec] = {}
        self.spares: tuple[str, ...] = ()
        self.member_env: dict[str, str] = {}
        #: spares whose container exists (cuts cover them)
        self.created_spares: set[str] = set()
        #: services whose removed containers' logs are already in ``log_dir`` (``remove_node``)
        self.removed_logs: set[str] = set()
        #: broker services whose container ``remove_node`` deleted (no cuts to write there)
        self.removed: set[str] = set()
        self.plan_spares(spares)
        self.broker_names = tuple(broker_name(g) for g in range(self.groups))
        self.net = net or os.environ.get("LEDGERMQ_NET") or DEFAULT_NET
        self.image = image or os.environ.get("LEDGERMQ_IMAGE") or DEFAULT_IMAGE
        self.publish_host = publish_host
        self.published_ports = {s.name: s.default_published for s in self.layout.values()}
        self.published_ports.update(published_ports or {})
        self.compose_file = Path(compose_file)
        self._compose_cmd = list(compose_cmd) if compose_cmd else None
        self.extra_env = dict(env or {})
        lookup = {**os.environ, **self.extra_env}
        self.access_key = access_key or lookup.get("LEDGERMQ_ACCESS_KEY") or DEFAULT_ACCESS_KEY
        self.secret_key = secret_key or lookup.get("LEDGERMQ_SECRET_KEY") or DEFAULT_SECRET_KEY
        self.cluster_secret = cluster_secret
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.small_disk_bytes = small_disk_bytes
        unknown = sorted(set(broker_settings or {}) - set(PASSED_BROKER_SETTINGS))
        if unknown:
            raise ValueError(
                f"broker settings {', '.join(unknown)} cannot be passed to the compose group "
                f"(it takes {', '.join(PASSED_BROKER_SETTINGS)})"
            )
        self.broker_settings = dict(broker_settings or {})
        if small_disk_bytes is not None:
            small_disks_override(self.groups, small_disk_bytes)  # a bad size fails here, not at `up`
        self.killed: set[str] = set()
        self.paused: set[str] = set()
        self.cut_links: set[Link] = set()

    # ------------------------------------------------------------------ addresses

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(self.layout)

    @property
    def acl_enabled(self) -> bool:
        """Whether the brokers refuse unsigned requests (``LEDGERMQ_ACL_ENABLE``, default true)."""
        flag = self.compose_env().get("LEDGERMQ_ACL_ENABLE", "true").strip().lower()
        return flag not in ("0", "false", "no", "off")

    @property
    def signer(self) -> RequestSigner:
        """Signs requests as the superuser the containers were given (harmless when ACL is off)."""
        from remoting.acl import RequestSigner

        return RequestSigner(self.access_key, self.secret_key)

    def remoting_client(self, name: str = "compose-group") -> RemotingClient:
        """A remoting client that signs every request as the group's superuser.

        Without the body CRC field: it would be added after signing, and a broker checking
        signatures over every field would see one the signature does not cover.
        """
        from remoting import RemotingClient
        from remoting.config import RemotingConfig

        return RemotingClient(RemotingConfig(send_crc=False), name=name, rpc_hook=self.signer)

    def ip(self, service: str) -> str:
        """The service's fixed address on the project network."""
        return f"{self.net}.{self._spec(service).octet}"

    @property
    def namesrv_addrs(self) -> list[str]:
        """Nameserver addresses as brokers and in-network clients use them (reachable from a Linux host too)."""
        return [f"{self.ip(n)}:{NAMESRV_PORT}" for n in NAMESERVERS]

    @property
    def spark_master_url(self) -> str:
        """The standalone master as executors and drivers on the network reach it."""
        return f"spark://{self.ip('spark-master')}:{SPARK_MASTER_PORT}"

    @property
    def spark_connect_url(self) -> str:
        """The Spark Connect server (``jepsen analyze --master``, ``jepsen run --spark-master``)."""
        return f"sc://{self.ip('spark-connect')}:{SPARK_CONNECT_PORT}"

    def broker_name_of(self, service: str) -> str:
        """The broker group (``broker-a``...) a broker service belongs to."""
        return self._spec(service).broker_name

    def members(self, name: str) -> tuple[str, ...]:
        """The broker services of one broker group, in order."""
        return tuple(b for b in self.brokers if self.layout[b].broker_name == name)

    @property
    def namesrv_addr_str(self) -> str:
        return ";".join(self.namesrv_addrs)

    def broker_addr(self, service: str) -> str:
        """The broker's address as registered with the nameservers (container IP : main port)."""
        spec = self._spec(service)
        return f"{self.ip(service)}:{spec.port}"

    def ledger_addr(self, service: str) -> str:
        spec = self._spec(service)
        return f"{self.ip(service)}:{spec.ledger_port}"

    def published_addr(self, service: str) -> str:
        """``host:port`` where the Docker host reaches the service through its published port."""
        host = "127.0.0.1" if self.publish_host in ("0.0.0.0", "") else self.publish_host
        return f"{host}:{self.published_ports[service]}"

    def node_id(self, service: str) -> str:
        return self._spec(service).node_id

    def node_name(self, service: str) -> str:
        """The harness's name for a broker: its member id (``n2``) with one group, else
        ``<broker name>/<member id>`` (``broker-b/n2``), as the local backend names them."""
        spec = self._spec(service)
        return spec.node_id if self.groups == 1 else f"{spec.broker_name}/{spec.node_id}"

    @property
    def node_ids(self) -> list[str]:
        """Every broker's :meth:`node_name` (``n1``..``n3`` with one group), in broker order."""
        return [self.node_name(b) for b in self.brokers]

    @property
    def ledger_addrs(self) -> dict[str, str]:
        """Node name -> ledger address (for ``ledger.client.LedgerClient`` status calls from the host)."""
        return {self.node_name(b): self.ledger_addr(b) for b in self.brokers}

    @property
    def broker_addrs(self) -> dict[str, str]:
        """Node name -> broker address (as the nameservers route it)."""
        return {self.node_name(b): self.broker_addr(b) for b in self.brokers}

    def service_of(self, node_or_addr: str) -> str:
        """The broker service for a node name (``n2``, ``broker-b/n2``), a service or a broker address."""
        for name in (*self.brokers, *self.spares):
            if node_or_addr in (self.node_name(name), self.broker_addr(name), name):
                return name
        raise KeyError(f"no broker service for {node_or_addr!r}")

    def _spec(self, service: str) -> ServiceSpec:
        try:
            return self.layout.get(service) or self.spare_layout[service]
        except KeyError:
            raise KeyError(f"unknown service {service!r}; services: {', '.join(self.layout)}") from None

    # ------------------------------------------------------------------ commands

    @property
    def compose_cmd(self) -> list[str]:
        if self._compose_cmd is None:
            self._compose_cmd = compose_command()
        return self._compose_cmd

    def compose_env(self) -> dict[str, str]:
        """The variables docker-compose.yml reads, for this group (plus the caller's environment)."""
        env = {**os.environ, **self.extra_env}
        env.update(
            LEDGERMQ_NET=self.net,
            LEDGERMQ_IMAGE=self.image,
            LEDGERMQ_PUBLISH_HOST=self.publish_host,
            COMPOSE_PROJECT_NAME=self.project,
            LEDGERMQ_ACCESS_KEY=self.access_key,
            LEDGERMQ_SECRET_KEY=self.secret_key,
        )
        if self.cluster_secret is not None:
            env["LEDGERMQ_CLUSTER_SECRET"] = self.cluster_secret
        for key, value in self.broker_settings.items():
            env[passed_setting_var(key)] = str(value)
        env.update(self.member_env)
        if self.spark:
            env["LEDGERMQ_RUNS_DIR"] = str(self.runs_dir)
            env.setdefault("LEDGERMQ_SPARK_IMAGE", DEFAULT_SPARK_IMAGE)
        for s in self.layout.values():
            if s.publish_env:
                env[s.publish_env] = str(self.published_ports[s.name])
        return env

    def compose(
        self, *args: str, timeout: float = 300.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run one compose subcommand on this project (``-p``/``-f`` added)."""
        files = ["-f", str(self.compose_file)]
        if self.groups > 1:
            files += ["-f", str(self.groups_file())]
        if self.spark:
            files += ["-f", str(SPARK_COMPOSE_FILE)]
        if self.small_disk_bytes is not None:
            files += ["-f", str(self.small_disks_file())]
        if self.spares:
            files += ["-f", str(self.membership_file())]
        argv = [*self.compose_cmd, "-p", self.project, *files, *args]
        return self._run(argv, timeout=timeout, check=check, env=self.compose_env())

    def groups_file(self) -> Path:
        """The override file adding groups 2..N, written beside the logs (or in the temp dir)."""
        return self._override_file(f"groups-{self.groups}", groups_override(self.groups))

    def plan_spares(self, spares: int) -> None:
        """Define ``spares`` spare brokers a group (before :meth:`up`; 0: none, no override file)."""
        self.spare_layout = spare_layout(self.groups, spares) if spares else {}
        self.spares = tuple(self.spare_layout)

    def membership_file(self) -> Path:
        """The override file defining the spare brokers and every broker's settable group/join."""
        return self._override_file(
            "membership", membership_override(self.groups, len(self.spares) // self.groups, self.net)
        )

    def small_disks_file(self) -> Path:
        """The override file putting the brokers' data on small tmpfs volumes, beside the groups file."""
        assert self.small_disk_bytes is not None
        return self._override_file("small-disks", small_disks_override(self.groups, self.small_disk_bytes))

    def _override_file(self, kind: str, text: str) -> Path:
        """``<project>.<kind>.yml`` holding ``text``, beside the logs (or in the temp dir); left
        alone when it already holds it."""
        folder = self.log_dir.parent if self.log_dir is not None else Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.project}.{kind}.yml"
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        return path

    @staticmethod
    def _run(
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                env=dict(env) if env is not None else None,
            )
        except subprocess.TimeoutExpired as exc:
            raise ComposeError(f"{' '.join(argv)} did not finish within {timeout:.0f}s") from exc
        if check and proc.returncode != 0:
            raise ComposeError(
                f"{' '.join(argv)} exited with {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-3000:]}"
            )
        return proc

    def docker(
        self, *args: str, timeout: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self._run(["docker", *args], timeout=timeout, check=check)

    # ------------------------------------------------------------------ lifecycle

    def build(self, *, base_image: str | None = None, log: Any = print) -> str:
        """Build the image (base image, wheelhouse, classic ``docker build``); cached layers make it quick."""
        return build_image(
            self.image, base_image=base_image or self.extra_env.get("LEDGERMQ_BASE_IMAGE"), log=log
        )

    def up(
        self,
        *,
        build: Literal["always", "missing", "never"] = "missing",
        timeout: float = 180.0,
        log: Any = print,
    ) -> None:
        """Start every service (``up -d``), then wait until all are healthy and have their fixed addresses.

        ``build="always"`` rebuilds the image from the current source first (what tests want);
        ``"missing"`` builds only when the image does not exist.
        """
        if build == "always" or (build == "missing" and not image_exists(self.image)):
            self.build(log=log)
        if self.spark:
            spark_image = self.compose_env()["LEDGERMQ_SPARK_IMAGE"]
            if build == "always" or (build == "missing" and not image_exists(spark_image)):
                build_spark_image(spark_image, base_image=self.extra_env.get("LEDGERMQ_BASE_IMAGE"), log=log)
            self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.compose("up", "-d", "--no-build", *(self.layout if self.spares else ()), timeout=timeout)
        self.killed.clear()
        self.paused.clear()
        self.wait_healthy(timeout=timeout)
        for name in self.layout:
            got = self.container_ip(name)
            if got != self.ip(name):
                raise ComposeError(f"{name} has address {got}, docker-compose.yml says {self.ip(name)}")

    def down(self, *, volumes: bool = True, logs: Path | None = None, timeout: float = 120.0) -> list[str]:
        """Remove containers, the network and (``volumes``) the named volumes; returns what had to be forced.

        ``logs`` (default ``log_dir``): write every container's log there first (they vanish
        with the containers).
        Paused containers are unpaused first (stopping a frozen process hangs until the
        timeout). If compose fails, anything left with this project's label is removed
        directly, so a broken run never leaks containers, networks or volumes.
        """
        logs = logs if logs is not None else self.log_dir
        if logs is not None and self._ids():
            try:
                self.logs(logs)
            except (ComposeError, OSError):
                pass  # logs are a courtesy; the teardown must still happen
        for cid in self._ids(paused_only=True):
            self.docker("unpause", cid, check=False)
        args = ["down", "--remove-orphans", "-t", "3"] + (["-v"] if volumes else [])
        self.compose(*args, timeout=timeout, check=False)
        forced: list[str] = []
        label = f"label=com.docker.compose.project={self.project}"
        left = self.docker("ps", "-aq", "--filter", label, check=False).stdout.split()
        if left:
            self.docker("rm", "-f", "-v", *left, check=False)
            forced += [f"container {c}" for c in left]
        nets = self.docker("network", "ls", "-q", "--filter", label, check=False).stdout.split()
        if nets:
            self.docker("network", "rm", *nets, check=False)
            forced += [f"network {n}" for n in nets]
        if volumes:
            vols = self.docker("volume", "ls", "-q", "--filter", label, check=False).stdout.split()
            if vols:
                self.docker("volume", "rm", "-f", *vols, check=False)
                forced += [f"volume {v}" for v in vols]
        self.killed.clear()
        self.paused.clear()
        self.cut_links.clear()
        self.removed.clear()
        return forced

    def leftovers(self) -> list[str]:
        """Containers, networks and volumes still carrying this project's label (empty after ``down``)."""
        label = f"label=com.docker.compose.project={self.project}"
        out = []
        for kind, args in (
            ("container", ["ps", "-aq"]),
            ("network", ["network", "ls", "-q"]),
            ("volume", ["volume", "ls", "-q"]),
        ):
            out += [f"{kind} {x}" for x in self.docker(*args, "--filter", label, check=False).stdout.split()]
        return out

    def __enter__(self) -> ComposeGroup:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ------------------------------------------------------------------ containers

    def _ids(self, service: str | None = None, *, paused_only: bool = False) -> list[str]:
        args = ["ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            args += ["--filter", f"label=com.docker.compose.service={service}"]
        if paused_only:
            args += ["--filter", "status=paused"]
        return self.docker(*args).stdout.split()

    def container_id(self, service: str) -> str:
        """The container of ``service`` in this project (running or not)."""
        self._spec(service)
        ids = self._ids(service)
        if len(ids) != 1:
            raise ComposeError(f"expected one container for {service} in project {self.project}, found {ids}")
        return ids[0]

    def inspect(self, service: str) -> dict[str, Any]:
        return json.loads(self.docker("inspect", self.container_id(service)).stdout)[0]

    def state(self, service: str) -> str:
        """``running``, ``paused``, ``exited``...; with ``/healthy`` etc. appended when there is a healthcheck."""
        st = self.inspect(service)["State"]
        health = (st.get("Health") or {}).get("Status")
        return f"{st['Status']}/{health}" if health else st["Status"]

    def network_name(self) -> str:
        """The Docker network of the group (``<project>_ledgermq``), to attach client containers to."""
        nets = self.inspect(self.brokers[0])["NetworkSettings"]["Networks"]
        if len(nets) != 1:
            raise ComposeError(f"{self.brokers[0]} is on {len(nets)} networks, expected one: {sorted(nets)}")
        return next(iter(nets))

    def container_ip(self, service: str) -> str:
        nets = self.inspect(service)["NetworkSettings"]["Networks"]
        ips = [n.get("IPAddress") for n in nets.values() if n.get("IPAddress")]
        return ips[0] if ips else ""

    def wait_healthy(self, services: Iterable[str] | None = None, *, timeout: float = 180.0) -> None:
        """Wait until each service's container is running and its healthcheck says healthy."""
        want = list(services or self.layout)
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while True:
            states = {s: self.state(s) for s in want}
            bad = {s: st for s, st in states.items() if st != "running/healthy"}
            if not bad:
                return
            dead = {s: st for s, st in bad.items() if not st.startswith("running")}
            if time.monotonic() > deadline or dead:
                why = "; ".join(f"{s}: {st}: {self._health_log(s)}" for s, st in bad.items())
                raise ComposeError(f"not healthy within {timeout:.0f}s: {why}")
            time.sleep(0.5)

    def _health_log(self, service: str) -> str:
        try:
            st = self.inspect(service)["State"]
        except ComposeError as exc:
            return str(exc)
        entries = (st.get("Health") or {}).get("Log") or []
        last = entries[-1]["Output"].strip() if entries else "no healthcheck result yet"
        tail = self.docker("logs", "--tail", "5", self.container_id(service), check=False)
        return f"{last[:300]} | last log lines: {(tail.stdout + tail.stderr).strip()[-600:]}"

    def exec(self, service: str, *argv: str, timeout: float = 60.0, check: bool = True) -> str:
        """Run a command inside the service's container (e.g. ``ledgermq-admin``, ``iptables -S``)."""
        return self.docker("exec", self.container_id(service), *argv, timeout=timeout, check=check).stdout

    # ------------------------------------------------------------------ faults

    def kill(self, service: str, signal: str = "KILL") -> None:
        """Send ``signal`` (default SIGKILL) to the container's main process and wait until it is gone."""
        cid = self.container_id(service)
        if service in self.paused:
            self.unpause(service)
        self.docker("kill", "--signal", signal, cid)
        if signal.upper() in ("KILL", "SIGKILL", "9"):
            self.docker("wait", cid, timeout=30, check=False)
            self.killed.add(service)

    def stop(self, service: str, timeout_s: int = 10) -> None:
        """Graceful stop (SIGTERM, SIGKILL after ``timeout_s``): the broker unregisters itself."""
        self.docker("stop", "-t", str(timeout_s), self.container_id(service), timeout=timeout_s + 30)
        self.killed.add(service)

    def restart(self, service: str, *, wait_healthy: bool = True, timeout: float = 90.0) -> None:
        """Start a killed or stopped container again (same volume, same address) and put its cuts back."""
        self.docker("start", self.container_id(service))
        self.killed.discard(service)
        self.paused.discard(service)
        self._apply_cuts([service])
        if wait_healthy:
            self.wait_healthy([service], timeout=timeout)

    def remove_node(self, service: str) -> None:
        """Remove a broker's container and its data volume: a machine that left for good."""
        self._spec(service)
        for cid in self._ids(service):
            if self.log_dir is not None:  # its log would go with it: keep it beside the others
                self._save_log(cid, self.log_dir / f"{service}.log")
                self.removed_logs.add(service)
            self.docker("rm", "-f", "-v", cid, timeout=60)
        label = f"label=com.docker.compose.project={self.project}"
        vols = self.docker(
            "volume",
            "ls",
            "-q",
            "--filter",
            label,
            "--filter",
            f"label=com.docker.compose.volume={service}-data",
        ).stdout.split()
        if vols:
            self.docker("volume", "rm", "-f", *vols)
        self.killed.discard(service)
        self.paused.discard(service)
        self.created_spares.discard(service)
        self.removed.add(service)

    def start_joining(self, service: str, members: Sequence[str], *, timeout: float = 120.0) -> None:
        """(Re)create ``service`` empty (container and data volume removed first) with ``join``,
        its ``group`` listing ``members`` (services: the group's members now) and itself, so it
        asks them to be added. Needs ``spares`` (the membership override file)."""
        if not self.spares:
            raise ComposeError("the group was started without spares: no membership override file")
        spec = self._spec(service)
        if spec.kind != "broker":
            raise ComposeError(f"{service} is no broker")
        self.remove_node(service)
        group_var, join_var = member_vars(service)
        listed = [self._spec(m) for m in members if m != service] + [spec]
        self.member_env[group_var] = ",".join(
            f"{m.node_id}={self.ip(m.name)}:{m.port}@{self.ip(m.name)}:{m.ledger_port}" for m in listed
        )
        self.member_env[join_var] = "true"
        self.compose("up", "-d", "--no-build", "--no-deps", service, timeout=timeout)
        self.removed.discard(service)
        if service in self.spare_layout:
            self.created_spares.add(service)
        self._apply_cuts([service])

    def pause(self, service: str) -> None:
        """Freeze every process of the container (cgroup freezer), like SIGSTOP on the whole node."""
        self.docker("pause", self.container_id(service))
        self.paused.add(service)

    def unpause(self, service: str) -> None:
        self.docker("unpause", self.container_id(service))
        self.paused.discard(service)
        self._apply_cuts([service])

    def cut(self, links: Iterable[Link]) -> dict[str, Any]:
        """Make exactly ``links`` (directed ``(src, dst)`` service pairs) cut; every other link carries traffic.

        Returns ``{"cut": [[src, dst], ...], "unapplied": {service: reason}}``; a service that
        is down or paused is listed under ``unapplied`` and gets its rules when it comes back
        (the other end of each link already enforces them).
        """
        wanted = set()
        for src, dst in links:
            self._spec(src)
            self._spec(dst)
            if src != dst:
                wanted.add((src, dst))
        self.cut_links = wanted
        present = [s for s in (*self.system_services, *sorted(self.created_spares)) if s not in self.removed]
        unapplied = self._apply_cuts(present)
        return {"cut": sorted([list(link) for link in wanted]), "unapplied": unapplied}

    def partition(self, *sides: Iterable[str]) -> dict[str, Any]:
        """Cut every link (both directions) between services on different sides.

        ``partition(["broker1"], ["broker2", "broker3", "namesrv1", "namesrv2"])`` isolates
        broker1. Services named on no side keep talking to everyone.
        """
        groups = [list(s) for s in sides]
        links = {
            (a, b)
            for i, ga in enumerate(groups)
            for j, gb in enumerate(groups)
            if i != j
            for a in ga
            for b in gb
        }
        return self.cut(links)

    def isolate(self, service: str, from_: Iterable[str] | None = None) -> dict[str, Any]:
        """Cut ``service`` off from ``from_`` (default: every other service), both directions."""
        others = [s for s in (from_ or self.system_services) if s != service]
        return self.partition([service], others)

    def heal(self) -> dict[str, Any]:
        """Remove every cut."""
        return self.cut(set())

    def _apply_cuts(self, services: Sequence[str]) -> dict[str, str]:
        """Rewrite the LEDGERMQ-IN/OUT chains of ``services`` from ``self.cut_links``; returns failures."""

        def script(service: str) -> str:
            lines = [
                "set -e",
                "for c in LEDGERMQ-IN LEDGERMQ-OUT; do iptables -w -N $c 2>/dev/null || true; iptables -w -F $c; done",
                "iptables -w -C INPUT -j LEDGERMQ-IN 2>/dev/null || iptables -w -I INPUT 1 -j LEDGERMQ-IN",
                "iptables -w -C OUTPUT -j LEDGERMQ-OUT 2>/dev/null || iptables -w -I OUTPUT 1 -j LEDGERMQ-OUT",
            ]
            for src, dst in sorted(self.cut_links):
                if dst == service:
                    lines.append(f"iptables -w -A LEDGERMQ-IN -s {self.ip(src)} -j DROP")
                if src == service:
                    lines.append(f"iptables -w -A LEDGERMQ-OUT -d {self.ip(dst)} -j DROP")
            return "\n".join(lines)

        def apply(service: str) -> tuple[str, str | None]:
            if service in self.removed:
                return service, "removed"
            if service in self.killed:
                return service, "not running"
            if service in self.paused:
                return service, "paused"
            proc = self.docker("exec", self.container_id(service), "sh", "-c", script(service), check=False)
            if proc.returncode != 0:
                return service, (proc.stderr or proc.stdout).strip()[-300:] or f"exit {proc.returncode}"
            return service, None

        with ThreadPoolExecutor(max_workers=len(services) or 1) as pool:
            results = list(pool.map(apply, services))
        return {s: why for s, why in results if why}

    def _holder_exec(self, service: str, script: str, *args: str) -> dict[str, Any]:
        """Run a Python snippet in the broker's disk holder; its last output line is JSON."""
        if self.small_disk_bytes is None:
            raise ComposeError(f"{service} has no small disk: the group was started without small_disk_bytes")
        self._spec(service)
        holder = disk_holder(service)
        ids = self._ids(holder)
        if len(ids) != 1:
            raise ComposeError(f"expected one {holder} container in project {self.project}, found {ids}")
        out = self.docker("exec", ids[0], "python", "-c", script, *args, timeout=DISK_OP_TIMEOUT_S).stdout
        lines = out.strip().splitlines()
        try:
            return dict(json.loads(lines[-1]))
        except (IndexError, ValueError) as exc:
            raise ComposeError(f"{holder}: unexpected output {out[-300:]!r}") from exc

    def fill_disk(self, service: str, filler: str, max_bytes: int) -> dict[str, Any]:
        """Fill the broker's small disk to the last page with ``filler`` (a name in its data
        directory), at most ``max_bytes``; the broker keeps running and its writes now fail.
        Returns ``filler_bytes``, ``free_bytes`` (what is left: 0 on a full tmpfs), ``disk_bytes``."""
        return self._holder_exec(service, FILL_SCRIPT, f"{DATA_DIR}/{filler}", str(max_bytes))

    def free_disk(self, service: str, filler: str) -> dict[str, Any]:
        """Delete the filler again; returns ``freed`` (its size, 0 if there was none)."""
        return self._holder_exec(service, FREE_SCRIPT, f"{DATA_DIR}/{filler}")

    def rules(self, service: str) -> str:
        """The container's current LEDGERMQ chains (``iptables -S``), for reports and tests."""
        return self.exec(
            service, "sh", "-c", "iptables -w -S LEDGERMQ-IN; iptables -w -S LEDGERMQ-OUT", check=False
        )

    # ------------------------------------------------------------------ logs

    def logs(self, dest: Path) -> dict[str, Path]:
        """Write each container's stdout+stderr to ``dest/<service>.log`` (killed containers included)."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        out: dict[str, Path] = {}
        for name in (*self.layout, *self.spares):
            ids = self._ids(name)
            if not ids:
                continue
            path = dest / f"{name}.log"
            if name in self.removed_logs and path.exists():  # an earlier container's log is in it
                self._save_log(ids[0], path)
            else:
                proc = self.docker("logs", "--timestamps", ids[0], timeout=120, check=False)
                path.write_text(proc.stdout + proc.stderr, encoding="utf-8", errors="replace")
            out[name] = path
        return out

    def _save_log(self, cid: str, path: Path) -> None:
        """Append a container's log to ``path`` (a member re-created later adds its own after it)."""
        proc = self.docker("logs", "--timestamps", cid, timeout=120, check=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8", errors="replace") as f:
            f.write(f"===== container {cid[:12]}, removed =====\n{proc.stdout}{proc.stderr}")

    def read_cluster_secret(self, service: str | None = None) -> bytes:
        """The cluster secret a running node holds (``service``, default the first nameserver),
        as its server reads it: for clients of the ledger ports, which take none without it."""
        raw = self.exec(service or NAMESERVERS[0], "cat", SECRET_FILE)
        secret = raw.rstrip("\r\n").encode()
        if not secret:
            raise ComposeError(f"{service or NAMESERVERS[0]}: {SECRET_FILE} is empty")
        return secret

    # ------------------------------------------------------------------ the brokers, over the protocol

    async def runtime_info(self, client: Any, service: str, timeout_s: float = 1.0) -> dict[str, Any] | None:
        """GET_BROKER_RUNTIME_INFO of a broker (``role``, ``masterAddr``, ``ledger``...), None if unreachable."""
        from remoting import RemotingCommand, RequestCode

        try:
            resp = await client.invoke_sync(
                self.broker_addr(service),
                RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO),
                timeout_s,
            )
        except Exception:  # noqa: BLE001 - a broker that is down, paused or cut off
            return None
        return json.loads(bytes(resp.body)) if resp.is_success else None

    async def route(
        self, client: Any, namesrv: str, topic: str = TOPIC, timeout_s: float = 1.0
    ) -> dict[str, Any] | None:
        """The topic route one nameserver gives (``brokerDatas``, ``queueDatas``), None if it has none."""
        from remoting import RemotingCommand, RequestCode

        try:
            resp = await client.invoke_sync(
                namesrv,
                RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}),
                timeout_s,
            )
        except Exception:  # noqa: BLE001
            return None
        return json.loads(bytes(resp.body)) if resp.is_success else None

    async def routed_master(
        self, client: Any, topic: str = TOPIC, group: str = BROKER_NAME
    ) -> dict[str, str | None]:
        """Nameserver address -> the broker address it routes as master (id 0) of ``group``, or None."""
        out: dict[str, str | None] = {}
        for ns in self.namesrv_addrs:
            route = await self.route(client, ns, topic)
            master = None
            for bd in (route or {}).get("brokerDatas") or []:
                if bd.get("brokerName") == group:
                    master = (bd.get("brokerAddrs") or {}).get("0")
            out[ns] = master
        return out

    async def wait_for_master(
        self,
        *,
        exclude: Iterable[str] = (),
        timeout: float = 60.0,
        topic: str = TOPIC,
        all_nameservers: bool = False,
        group: str = BROKER_NAME,
    ) -> str:
        """Wait until a broker of ``group`` (not in ``exclude``) says MASTER and a nameserver routes
        ``topic`` to it.

        ``all_nameservers=True`` waits until every nameserver routes to it. Returns the service name.
        """
        excluded = set(exclude)
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        async with self.remoting_client() as client:
            while time.monotonic() < deadline:
                routes = await self.routed_master(client, topic, group)
                for name in self.members(group):
                    if name in excluded or name in self.killed or name in self.paused:
                        continue
                    info = await self.runtime_info(client, name)
                    last[name] = info and info.get("role")
                    if not info or info.get("role") != "MASTER":
                        continue
                    hits = [ns for ns, addr in routes.items() if addr == self.broker_addr(name)]
                    if hits and (not all_nameservers or len(hits) == len(routes)):
                        return name
                last["routes"] = routes
                await asyncio.sleep(0.2)
        raise ComposeError(
            f"{group}: no routed master (excluding {sorted(excluded)}) within {timeout:.0f}s; last seen {last}"
        )

    async def status(self) -> dict[str, Any]:
        """Each service's container state and address; brokers add role/term/leader from runtime info."""
        out: dict[str, Any] = {}
        async with self.remoting_client() as client:
            for name, spec in self.layout.items():
                try:
                    state = self.state(name)
                except ComposeError as exc:
                    state = f"missing ({exc})"
                entry: dict[str, Any] = {
                    "state": state,
                    "ip": self.ip(name),
                    "published": self.published_addr(name),
                }
                if spec.kind == "broker":
                    entry["addr"] = self.broker_addr(name)
                    entry["group"] = spec.broker_name
                    info = await self.runtime_info(client, name) if state.startswith("running") else None
                    if info:
                        ledger = info.get("ledger") or {}
                        entry.update(
                            role=info.get("role"),
                            master=info.get("masterAddr"),
                            term=ledger.get("term"),
                            leader=ledger.get("leader"),
                        )
                out[name] = entry
            out["routes"] = {g: await self.routed_master(client, group=g) for g in self.broker_names}
        return out
