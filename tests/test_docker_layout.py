"""The compose layout for N broker groups and the harness's ACL credentials, without a Docker engine.

The generated override must carry exactly the settings docker-compose.yml gives its brokers
(so a second group runs like the first), and ``docker-compose config`` must accept the two
files together where the CLI is installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from jepsen.docker.compose import COMPOSE_FILE, ComposeGroup
from jepsen.docker.layout import MAX_GROUPS, broker_service, check_groups, groups_override, layout
from jepsen.systems.broker import QueueEndpoints
from jepsen.systems.credentials import MAX_CREDENTIALS_BYTES, Credentials


def test_generated_broker_service_matches_docker_compose_yml() -> None:
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))  # resolves the file's << merges
    one = layout(1)
    for name in ("broker1", "broker2", "broker3"):
        want = {k: v for k, v in doc["services"][name].items() if k != "build"}
        assert broker_service(one[name], one) == want, name
    assert sorted(doc["services"]) == sorted(one)


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
    assert sorted(proc.stdout.split()) == sorted(layout(3))


def test_compose_env_carries_the_group_credentials_and_no_forced_acl_off(monkeypatch) -> None:
    monkeypatch.delenv("LEDGERMQ_ACL_ENABLE", raising=False)
    g = ComposeGroup("credtest", access_key="ak", secret_key="sk-123", cluster_secret="c" * 32)
    env = g.compose_env()
    assert (env["LEDGERMQ_ACCESS_KEY"], env["LEDGERMQ_SECRET_KEY"]) == ("ak", "sk-123")
    assert env["LEDGERMQ_CLUSTER_SECRET"] == "c" * 32
    assert "LEDGERMQ_ACL_ENABLE" not in env and g.acl_enabled
    monkeypatch.setenv("LEDGERMQ_ACL_ENABLE", "false")
    assert not ComposeGroup("credtest").acl_enabled


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
