"""The compose layout for N broker groups, the harness's ACL credentials and the cluster secret
the containers share, without a Docker engine.

The generated override must carry exactly the settings docker-compose.yml gives its brokers
(so a second group runs like the first), and ``docker-compose config`` must accept the two
files together where the CLI is installed. Every node runs ``common.cluster_secret ensure``
before its server: nodes starting at once must agree on one secret, made once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.cluster_secret import SECRET_ENV, ensure_cluster_secret, load_cluster_secret
from common.settings import ConfigError
from jepsen.docker.compose import COMPOSE_FILE, ComposeGroup
from jepsen.docker.layout import (
    MAX_GROUPS,
    PASSED_BROKER_SETTINGS,
    SECRET_DIR,
    SECRET_FILE,
    SECRET_VOLUME,
    broker_service,
    check_groups,
    groups_override,
    layout,
    passed_setting_var,
    with_secret,
)
from jepsen.systems.broker import QueueEndpoints
from jepsen.systems.credentials import MAX_CREDENTIALS_BYTES, Credentials

#: services of docker-compose.yml under a profile (not started by a plain ``up``, not group nodes)
PROFILED = {"proxy": "proxy"}


def _group_services(services: dict) -> dict:
    """The services a plain ``up`` starts: the group's nodes (profiled ones are extras)."""
    return {name: svc for name, svc in services.items() if "profiles" not in svc}


def test_generated_broker_service_matches_docker_compose_yml() -> None:
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))  # resolves the file's << merges
    one = layout(1)
    for name in ("broker1", "broker2", "broker3"):
        want = {k: v for k, v in doc["services"][name].items() if k != "build"}
        assert broker_service(one[name], one) == want, name
    assert sorted(_group_services(doc["services"])) == sorted(one)
    # the extras stay out of a plain `up`: each is under its profile
    assert {n: svc.get("profiles") for n, svc in doc["services"].items() if n not in one} == {
        n: [profile] for n, profile in PROFILED.items()
    }


def test_every_node_of_the_compose_files_shares_one_secret_file() -> None:
    """Nameservers and brokers (of every group) run their server after ``ensure`` and read the
    secret from the shared volume; none is given it inline (it would clash with the file)."""
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    override = json.loads(groups_override(2).split("\n", 3)[3])
    services = _group_services({**doc["services"], **override["services"]})
    assert SECRET_VOLUME in doc["volumes"]
    for name, svc in services.items():
        kind = "NAMESRV" if name.startswith("namesrv") else "BROKER"
        server = (
            ["broker"]
            if kind == "BROKER"
            else ["namesrv", "--listen-host", "0.0.0.0", "--listen-port", "9876"]
        )
        assert svc["command"] == with_secret(server), name
        assert f"{SECRET_VOLUME}:{SECRET_DIR}" in svc["volumes"], name
        env = svc["environment"]
        assert env[f"{kind}_CLUSTER_SECRET_FILE"] == SECRET_FILE, name
        assert env[SECRET_ENV] == "${LEDGERMQ_CLUSTER_SECRET:-}", name
        assert f"{kind}_CLUSTER_SECRET" not in env, name


def _ensure(path: Path, value: str | None = None, *command: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if value is not None:
        env[SECRET_ENV] = value
    argv = [sys.executable, "-m", "common.cluster_secret", "ensure", str(path)]
    argv += ["--", *command] if command else []
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_nodes_starting_at_once_agree_on_one_secret_made_once(tmp_path: Path) -> None:
    path = tmp_path / "run" / "cluster.secret"
    starters = [_ensure(path) for _ in range(8)]
    results = [(p.wait(60), p.stderr.read()) for p in starters if p.stderr is not None]
    assert all(code == 0 for code, _ in results), results
    assert sum("(created)" in err for _, err in results) == 1, results  # the rest adopted it
    assert path.stat().st_mode & 0o777 == 0o600
    assert os.listdir(path.parent) == ["cluster.secret"]  # no temporary file left behind
    secret = load_cluster_secret("", str(path))
    assert len(secret) == 64
    assert ensure_cluster_secret(path) == "kept" and load_cluster_secret("", str(path)) == secret


def test_a_given_secret_is_written_a_bad_one_refused_and_the_server_run(tmp_path: Path) -> None:
    path = tmp_path / "cluster.secret"
    ensure_cluster_secret(path)
    given = "an-operator-chosen-secret-0123456789"
    assert ensure_cluster_secret(path, given) == "given"
    assert path.read_text() == given + "\n" and path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ConfigError, match=f"{SECRET_ENV}: .* at least 16 bytes"):
        ensure_cluster_secret(path, "short")
    assert path.read_text() == given + "\n"  # a refused value changes nothing
    path.write_text("tiny\n")
    with pytest.raises(ConfigError, match="holds no secret of at least 16 bytes"):
        ensure_cluster_secret(path)
    path.unlink()
    ran = _ensure(path, given, sys.executable, "-c", "import os; print(os.getpid())")
    out, err = ran.communicate(timeout=60)
    assert ran.returncode == 0, err
    assert int(out) == ran.pid  # the server replaces the ensure step: it keeps the container's PID 1
    assert "Traceback" not in err and given not in err and "(given)" in err
    bad = _ensure(path, "short", "true")
    _, err = bad.communicate(timeout=60)
    assert bad.returncode == 2 and err.count("\n") == 1 and "at least 16 bytes" in err


def test_two_groups_addresses_names_and_ports() -> None:
    two = layout(2)
    brokers = [s for s in two.values() if s.kind == "broker"]
    assert [s.name for s in brokers] == [f"broker{k}" for k in range(1, 7)]
    assert [s.broker_name for s in brokers] == ["broker-a"] * 3 + ["broker-b"] * 3
    assert len({s.octet for s in two.values()}) == len(two)
    assert len({s.default_published for s in two.values()}) == len(two)
    g = ComposeGroup("layouttest", groups=2)
    assert g.node_ids[3:] == ["broker-b/n1", "broker-b/n2", "broker-b/n3"]
    assert g.service_of("broker-b/n2") == "broker5"
    assert g.members("broker-b") == ("broker4", "broker5", "broker6")
    env = broker_service(two["broker5"], two)["environment"]
    assert env["BROKER_BROKER_NAME"] == "broker-b" and env["BROKER_NODE_ID"] == "n2"
    assert env["BROKER_GROUP"].count("@") == 3 and ".31:10911@" in env["BROKER_GROUP"]
    override = json.loads(groups_override(2).split("\n", 3)[3])
    assert sorted(override["services"]) == ["broker4", "broker5", "broker6"]
    assert sorted(override["volumes"]) == ["broker4-data", "broker5-data", "broker6-data"]


def test_groups_out_of_range_is_one_clear_error() -> None:
    assert check_groups(MAX_GROUPS) == MAX_GROUPS
    for bad in (0, MAX_GROUPS + 1):
        with pytest.raises(ValueError, match=r"broker groups must be 1\.\.20"):
            layout(bad)
    last = [s for s in layout(MAX_GROUPS).values() if s.kind == "broker"][-1]
    assert last.octet <= 254


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (v1) is not installed")
def test_docker_compose_accepts_base_plus_override(tmp_path: Path) -> None:
    override = tmp_path / "groups.yml"
    override.write_text(groups_override(3), encoding="utf-8")
    proc = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE_FILE), "-f", str(override), "config", "--services"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == sorted([*layout(3), *PROFILED])


def test_compose_env_carries_the_group_credentials_and_no_forced_acl_off(monkeypatch) -> None:
    monkeypatch.delenv("LEDGERMQ_ACL_ENABLE", raising=False)
    g = ComposeGroup("credtest", access_key="ak", secret_key="sk-123", cluster_secret="c" * 32)
    env = g.compose_env()
    assert (env["LEDGERMQ_ACCESS_KEY"], env["LEDGERMQ_SECRET_KEY"]) == ("ak", "sk-123")
    assert env["LEDGERMQ_CLUSTER_SECRET"] == "c" * 32
    assert "LEDGERMQ_ACL_ENABLE" not in env and g.acl_enabled
    monkeypatch.setenv("LEDGERMQ_ACL_ENABLE", "false")
    assert not ComposeGroup("credtest").acl_enabled


def test_compose_env_passes_the_held_message_settings_and_refuses_others(monkeypatch) -> None:
    """Only the passed settings, as BROKER_<KEY> for compose to hand to every broker (the file
    names them without a value); unset, the brokers keep their defaults."""
    for key in PASSED_BROKER_SETTINGS:
        monkeypatch.delenv(passed_setting_var(key), raising=False)
    g = ComposeGroup(
        "settest", broker_settings={"transaction_timeout_s": 1.0, "message_delay_level": "1s 2s"}
    )
    env = g.compose_env()
    assert env["BROKER_TRANSACTION_TIMEOUT_S"] == "1.0" and env["BROKER_MESSAGE_DELAY_LEVEL"] == "1s 2s"
    assert "BROKER_LOCK_MAX_LIVE_S" not in env
    assert "BROKER_LOCK_MAX_LIVE_S" not in ComposeGroup("settest").compose_env()
    with pytest.raises(ValueError, match="segment_bytes cannot be passed"):
        ComposeGroup("settest", broker_settings={"segment_bytes": 1})
    env_of = broker_service(layout(2)["broker5"], layout(2))["environment"]
    assert all(env_of[passed_setting_var(k)] is None for k in PASSED_BROKER_SETTINGS)


def test_the_docker_backend_runs_the_short_held_message_timing(tmp_path: Path) -> None:
    from jepsen.docker.compose import docker_unavailable_reason
    from jepsen.systems.broker_semantics import SEMANTICS_SETTINGS, BrokerTiming
    from jepsen.systems.docker import DockerBrokerBackend

    reason = docker_unavailable_reason()  # the backend picks a free network among Docker's
    if reason:
        pytest.skip(f"needs a Docker engine: {reason}")

    backend = DockerBrokerBackend(tmp_path)
    assert backend.group.broker_settings == SEMANTICS_SETTINGS
    assert backend.timing == BrokerTiming.from_settings(SEMANTICS_SETTINGS)
    assert (
        backend.client_spec()["timing"]["transaction_timeout_s"]
        == SEMANTICS_SETTINGS["transaction_timeout_s"]
    )
    assert backend.forge_targets()["secured"] is True


def test_credentials_file_round_trip_private_and_bad_files(tmp_path: Path) -> None:
    creds = Credentials("jepsen-admin", "s3cret-value")
    path = creds.write(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert Credentials.read(path) == creds
    assert "s3cret-value" not in repr(creds)
    spec = {"namesrv": ["127.0.0.1:1"], "names": {}, "topic": "T", "queues": 1, "timeout": 1.0}
    spec["broker_name"] = None
    assert QueueEndpoints({**spec, "credentials_file": str(path)}).credentials == creds
    assert "s3cret-value" not in json.dumps(spec)
    cases = {
        "missing": (None, "cannot read ACL credentials"),
        "binary": (b"\xff\xfe\x00", "not JSON"),
        "list": (b"[1]", "expected an object"),
        "empty": (b'{"access_key": "", "secret_key": "x"}', "non-empty strings"),
        "huge": (b" " * (MAX_CREDENTIALS_BYTES + 1), "larger than"),
    }
    for name, (content, message) in cases.items():
        p = tmp_path / name
        if content is not None:
            p.write_bytes(content)
        with pytest.raises(ValueError, match=message) as info:
            Credentials.read(p)
        assert str(p) in str(info.value) and "\n" not in str(info.value)
