"""Where every service of the compose setup lives, for one broker group or several.

``docker-compose.yml`` holds two nameservers and one 3-broker group (``broker-a``: services
``broker1``..``broker3``). More groups come from an override file that this module
generates, the way compose users add services to a base file::

    python -m jepsen.docker groups-file 2 -o docker-compose.groups.yml
    docker-compose -f docker-compose.yml -f docker-compose.groups.yml up -d

Group ``g`` (0-based; broker name ``broker-<letter>``) has services ``broker<3g+1>``..
``broker<3g+3>`` at ``<net>.<21+10g>``..``<net>.<23+10g>``. Every group uses the same
container ports (10911/10921/10931, ledger 20911/20921/20931): addresses differ, so ports
need not; only the ports published on the host are distinct. The generated services carry
the same settings as the base file's brokers (``broker_service`` builds both, and a test
compares it with docker-compose.yml), so an override never drifts from the base file; they
mount the base file's ``cluster-secret`` volume too, so every group proves the same secret.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

NAMESRV_PORT = 9876
BROKERS_PER_GROUP = 3
#: groups one compose project can hold: group g's last address is <net>.(23 + 10g) <= 254
MAX_GROUPS = 20
DEFAULT_ACCESS_KEY = "ledgermq-admin"  # docker-compose.yml's defaults for the superuser account
DEFAULT_SECRET_KEY = "ledgermq-admin-secret-change-me"
NET = "${LEDGERMQ_NET:-172.28.10}"
#: where each broker keeps its data (BROKER_DATA_DIR; the ledger lives in its ``ledger/``)
DATA_DIR = "/var/lib/ledgermq"
#: the volume every nameserver and broker mounts at SECRET_DIR: the cluster secret they share
SECRET_VOLUME = "cluster-secret"
SECRET_DIR = "/run/ledgermq"
SECRET_FILE = f"{SECRET_DIR}/cluster.secret"
#: broker settings a compose project may set (``ComposeGroup(broker_settings=...)``): each is a
#: ``BROKER_<KEY>`` variable with no value in the file, so compose passes it from its own
#: environment when set there and leaves it out (the broker's default) otherwise
PASSED_BROKER_SETTINGS = (
    "message_delay_level",
    "transaction_timeout_s",
    "transaction_check_interval_s",
    "lock_max_live_s",
)


def passed_setting_var(key: str) -> str:
    """The container variable a passed broker setting travels in (``BROKER_`` + its key)."""
    return "BROKER_" + key.upper()


def with_secret(argv: list[str]) -> list[str]:
    """A node's command run after ``common.cluster_secret ensure``: SECRET_FILE then holds the
    operator's LEDGERMQ_CLUSTER_SECRET, or the secret the first node to start made (the server
    replaces the ensure step in its process, so it keeps PID 1 and Docker's signals)."""
    return ["python", "-m", "common.cluster_secret", "ensure", SECRET_FILE, "--", *argv]


@dataclass(frozen=True)
class ServiceSpec:
    """One service of the compose setup: its fixed address and ports."""

    name: str
    kind: Literal["namesrv", "broker", "spark"]
    octet: int
    port: int  # namesrv: 9876; broker: main port (fast port = port - 2)
    ledger_port: int = 0
    node_id: str = ""  # the broker's member id in its ledger group
    publish_env: str = ""  # the variable that sets the published host port
    default_published: int = 0
    broker_name: str = ""  # the broker group (``broker-a``...)


SPARK_MASTER_PORT = 7077
SPARK_CONNECT_PORT = 15002
#: docker-compose.spark.yml's services (keep in step with the file): a master, a worker, Connect
SPARK_SERVICES = (
    ServiceSpec(
        "spark-master",
        "spark",
        5,
        SPARK_MASTER_PORT,
        publish_env="LEDGERMQ_SPARK_MASTER_PORT",
        default_published=7077,
    ),
    ServiceSpec("spark-worker", "spark", 6, 8081),
    ServiceSpec(
        "spark-connect",
        "spark",
        7,
        SPARK_CONNECT_PORT,
        publish_env="LEDGERMQ_SPARK_CONNECT_PORT",
        default_published=15002,
    ),
)


def broker_name(group: int) -> str:
    """``broker-a`` for group 0, ``broker-b`` for group 1, ..."""
    return f"broker-{chr(ord('a') + group)}"


def check_groups(groups: int) -> int:
    """``groups`` if compose can hold that many broker groups, else a one-line ValueError."""
    if not isinstance(groups, int) or not 1 <= groups <= MAX_GROUPS:
        raise ValueError(f"broker groups must be 1..{MAX_GROUPS} (MAX_GROUPS), got {groups!r}")
    return groups


def layout(groups: int = 1, *, spark: bool = False) -> dict[str, ServiceSpec]:
    """Service name -> spec for two nameservers, ``groups`` broker groups of three and, with
    ``spark``, docker-compose.spark.yml's services."""
    check_groups(groups)
    specs = [
        ServiceSpec(
            "namesrv1",
            "namesrv",
            11,
            NAMESRV_PORT,
            publish_env="LEDGERMQ_NAMESRV1_PORT",
            default_published=9876,
        ),
        ServiceSpec(
            "namesrv2",
            "namesrv",
            12,
            NAMESRV_PORT,
            publish_env="LEDGERMQ_NAMESRV2_PORT",
            default_published=9877,
        ),
    ]
    for g in range(groups):
        for i in range(1, BROKERS_PER_GROUP + 1):
            k = BROKERS_PER_GROUP * g + i
            specs.append(
                ServiceSpec(
                    f"broker{k}",
                    "broker",
                    21 + 10 * g + (i - 1),
                    10911 + 10 * (i - 1),
                    20911 + 10 * (i - 1),
                    f"n{i}",
                    f"LEDGERMQ_BROKER{k}_PORT",
                    10911 + 10 * (k - 1),
                    broker_name(g),
                )
            )
    if spark:
        specs.extend(SPARK_SERVICES)
    return {s.name: s for s in specs}


def _var(name: str, default: str) -> str:
    return "${" + name + ":-" + default + "}"


def broker_service(spec: ServiceSpec, services: dict[str, ServiceSpec]) -> dict[str, Any]:
    """The compose service of one broker, as docker-compose.yml writes broker1..3 (anchors resolved)."""
    members = [s for s in services.values() if s.kind == "broker" and s.broker_name == spec.broker_name]
    group = ",".join(f"{m.node_id}={NET}.{m.octet}:{m.port}@{NET}.{m.octet}:{m.ledger_port}" for m in members)
    namesrv = ",".join(f"{NET}.{s.octet}:{s.port}" for s in services.values() if s.kind == "namesrv")
    access = _var("LEDGERMQ_ACCESS_KEY", DEFAULT_ACCESS_KEY)
    secret = _var("LEDGERMQ_SECRET_KEY", DEFAULT_SECRET_KEY)
    return {
        "image": _var("LEDGERMQ_IMAGE", "ledgermq:latest"),
        "cap_add": ["NET_ADMIN"],
        "stop_grace_period": "10s",
        "command": with_secret(["broker"]),
        "depends_on": {
            s.name: {"condition": "service_healthy"} for s in services.values() if s.kind == "namesrv"
        },
        "hostname": spec.name,
        "environment": {
            "LEDGERMQ_ACCESS_KEY": access,
            "LEDGERMQ_SECRET_KEY": secret,
            "LEDGERMQ_CLUSTER_SECRET": _var("LEDGERMQ_CLUSTER_SECRET", ""),
            "BROKER_ACL_ENABLE": _var("LEDGERMQ_ACL_ENABLE", "true"),
            "BROKER_ACL_ADMIN_ACCESS_KEY": access,
            "BROKER_ACL_ADMIN_SECRET_KEY": secret,
            "BROKER_ACCESS_KEY": access,
            "BROKER_SECRET_KEY": secret,
            "BROKER_BROKER_NAME": spec.broker_name,
            "BROKER_CLUSTER_NAME": "DefaultCluster",
            "BROKER_GROUP": group,
            "BROKER_NAMESRV_ADDR": namesrv,
            "BROKER_LISTEN_HOST": "0.0.0.0",
            "BROKER_DATA_DIR": DATA_DIR,
            "BROKER_TOPICS": "TopicTest:4",
            "BROKER_REGISTER_INTERVAL_S": "10",
            "BROKER_CLUSTER_SECRET_FILE": SECRET_FILE,
            "BROKER_NODE_ID": spec.node_id,
            **dict.fromkeys(map(passed_setting_var, PASSED_BROKER_SETTINGS)),
        },
        "healthcheck": {
            "test": ["CMD", "python", "-m", "jepsen.docker.healthcheck", "broker", f"127.0.0.1:{spec.port}"],
            "interval": "2s",
            "timeout": "5s",
            "retries": 30,
            "start_period": "5s",
        },
        "networks": {"ledgermq": {"ipv4_address": f"{NET}.{spec.octet}"}},
        "ports": [
            f"{_var('LEDGERMQ_PUBLISH_HOST', '127.0.0.1')}:"
            f"{_var(spec.publish_env, str(spec.default_published))}:{spec.port}"
        ],
        "volumes": [f"{spec.name}-data:{DATA_DIR}", f"{SECRET_VOLUME}:{SECRET_DIR}"],
    }


def groups_override(groups: int) -> str:
    """The override file (YAML; written in JSON's flow style, which YAML reads) adding groups 2..N."""
    services = layout(groups)
    base = layout(1)
    extra = {name: broker_service(s, services) for name, s in services.items() if name not in base}
    doc = {
        "version": "2.4",
        "services": extra,
        "volumes": {f"{name}-data": {} for name in extra},
    }
    header = (
        f"# Generated by `python -m jepsen.docker groups-file {groups}`: broker groups "
        f"{', '.join(broker_name(g) for g in range(1, groups))} beside docker-compose.yml's broker-a.\n"
        "# Use: docker-compose -f docker-compose.yml -f THIS_FILE up -d   (same variables as the base file;\n"
        "# LEDGERMQ_BROKER<k>_PORT publishes broker<k>). Regenerate rather than edit.\n"
    )
    return header + json.dumps(doc, indent=2) + "\n"


#: suffix of the service that holds a broker's small disk mounted (``broker1-disk``)
DISK_HOLDER_SUFFIX = "-disk"
#: largest small disk the override accepts: tmpfs pages are RAM, and a fill writes all of it
MAX_SMALL_DISK_BYTES = 4 << 30


def disk_holder(broker: str) -> str:
    """The service that keeps ``broker``'s small disk mounted (see :func:`small_disks_override`)."""
    return broker + DISK_HOLDER_SUFFIX


def small_disks_override(groups: int, size_bytes: int) -> str:
    """The override file (JSON-style YAML) that puts every broker's data volume on a tmpfs of
    ``size_bytes``, for the ``disk-full`` nemesis: filling it makes the broker's writes fail with
    ENOSPC, as a full disk would.

    Why a holder service per broker: Docker's local volume driver mounts a volume with driver
    options when its first container starts and unmounts it when its last one stops, so a tmpfs
    volume used by the broker alone would come back empty after ``docker kill`` + ``docker start``
    (measured: the file was gone), which would turn every kill into a wipe. ``<broker>-disk``
    mounts the same volume and just sleeps, so the tmpfs lives as long as the project: a killed
    broker restarts on its data, as it does on a plain volume. The holder has no network and dies
    on SIGKILL (it holds nothing that needs a clean stop); the harness fills and frees the disk
    through it, which works whatever state the broker is in (running, paused or killed).
    """
    if not isinstance(size_bytes, int) or not 1 << 20 <= size_bytes <= MAX_SMALL_DISK_BYTES:
        raise ValueError(f"small disk size must be 1 MiB..{MAX_SMALL_DISK_BYTES} bytes, got {size_bytes!r}")
    brokers = [s.name for s in layout(groups).values() if s.kind == "broker"]
    holders = {
        disk_holder(b): {
            "image": _var("LEDGERMQ_IMAGE", "ledgermq:latest"),
            "command": ["sleep", "infinity"],
            "network_mode": "none",
            "stop_signal": "SIGKILL",
            "volumes": [f"{b}-data:{DATA_DIR}"],
        }
        for b in brokers
    }
    volumes = {
        f"{b}-data": {
            "driver": "local",
            "driver_opts": {"type": "tmpfs", "device": "tmpfs", "o": f"size={size_bytes}"},
        }
        for b in brokers
    }
    doc = {"version": "2.4", "services": holders, "volumes": volumes}
    header = (
        f"# Generated for the disk-full nemesis: each broker's data on a {size_bytes}-byte tmpfs volume,\n"
        "# kept mounted across broker restarts by a <broker>-disk holder. Regenerate rather than edit.\n"
    )
    return header + json.dumps(doc, indent=2) + "\n"


#: spare brokers a group may have beyond its first three (octets 24..30 + 10g are free)
MAX_SPARES = 7


def spare_name(group: int, member: int) -> str:
    """The service of a spare broker: ``broker-a-n4`` (group 0's fourth member)."""
    return f"{broker_name(group)}-n{member}"


def spare_layout(groups: int, spares: int) -> dict[str, ServiceSpec]:
    """Service name -> spec of ``spares`` spare brokers per group, for the ``membership``
    nemesis: member ``n4``.. at ``<net>.<24+10g>``.., each on ports of its own (10941/20941 for
    n4, as n1..n3 use 10911/20911..), published on no host port (the harness dials container
    addresses). They are not started with the group: :func:`membership_override` defines them."""
    check_groups(groups)
    if not isinstance(spares, int) or not 0 <= spares <= MAX_SPARES:
        raise ValueError(f"spare brokers must be 0..{MAX_SPARES} a group (MAX_SPARES), got {spares!r}")
    specs: dict[str, ServiceSpec] = {}
    for g in range(groups):
        for i in range(BROKERS_PER_GROUP + 1, BROKERS_PER_GROUP + spares + 1):
            name = spare_name(g, i)
            specs[name] = ServiceSpec(
                name,
                "broker",
                21 + 10 * g + (i - 1),
                10911 + 10 * (i - 1),
                20911 + 10 * (i - 1),
                f"n{i}",
                broker_name=broker_name(g),
            )
    return specs


def member_vars(service: str) -> tuple[str, str]:
    """The compose variables that set a broker's ``group`` and ``join`` when its container is
    (re)created: ``LEDGERMQ_GROUP_BROKER_A_N4``, ``LEDGERMQ_JOIN_BROKER_A_N4``."""
    key = service.upper().replace("-", "_")
    return f"LEDGERMQ_GROUP_{key}", f"LEDGERMQ_JOIN_{key}"


def group_value(members: list[ServiceSpec], net: str) -> str:
    """``BROKER_GROUP``'s value for these members on network ``net`` (``n1=IP:PORT@IP:LEDGER_PORT,...``)."""
    return ",".join(f"{m.node_id}={net}.{m.octet}:{m.port}@{net}.{m.octet}:{m.ledger_port}" for m in members)


def membership_override(groups: int, spares: int, net: str) -> str:
    """The override file (JSON-style YAML) for the ``membership`` nemesis: the spare brokers
    (started empty with ``join``, their group's first members and themselves in ``group``), and
    for every broker a ``group`` and a ``join`` that the harness sets when it re-creates the
    container (:func:`member_vars`; the defaults are what docker-compose.yml gives the first
    members, so a plain ``up`` starts the same group). A member taken out, wiped and added back
    is re-created with ``join`` and the group's members at that time. The addresses are on
    ``net`` written out (compose v1 does not nest a variable in another's default)."""
    base = layout(groups)
    extra = spare_layout(groups, spares)
    services: dict[str, Any] = {}
    for name, spec in {**base, **extra}.items():
        if spec.kind != "broker":
            continue
        first = [s for s in base.values() if s.kind == "broker" and s.broker_name == spec.broker_name]
        group_var, join_var = member_vars(name)
        if name in extra:
            service = broker_service(spec, {**base, name: spec})
            del service["ports"]
            service["volumes"] = [f"{name}-data:{DATA_DIR}", f"{SECRET_VOLUME}:{SECRET_DIR}"]
            default_group, default_join = group_value([*first, spec], net), "true"
        else:
            service = {}
            default_group, default_join = group_value(first, net), "false"
        env = service.setdefault("environment", {})
        env["BROKER_GROUP"] = _var(group_var, default_group)
        env["BROKER_JOIN"] = _var(join_var, default_join)
        services[name] = service
    doc = {"version": "2.4", "services": services, "volumes": {f"{name}-data": {} for name in extra}}
    header = (
        f"# Generated for the membership nemesis: {spares} spare broker(s) a group, and every broker's\n"
        "# group/join settable when the harness re-creates it. Regenerate rather than edit.\n"
    )
    return header + json.dumps(doc, indent=2) + "\n"
