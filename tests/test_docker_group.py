"""The docker-compose group in real containers: build, stand up, produce, kill the leader, consume, tear down.

What these tests prove that the 127.0.0.x process tests cannot: the image builds with no
registry (local debootstrap base + host wheelhouse), docker-compose.yml's fixed addresses,
healthchecks, volumes and published ports work, a SIGKILLed *container* fails over and the
nameservers route clients to the new master, iptables partitions and ``docker pause`` move
mastership, a killed container comes back on its volume as a slave, and ``down -v`` leaves
nothing behind.

One group (its own compose project, a /24 no other network uses, free host ports, image tag
``ledgermq:test``) serves the module; it is torn down in a finalizer even when a test fails,
and every container's log is written to a temporary directory that the failure names.
testcontainers is used with Ryuk disabled (its image cannot be pulled here): for the
in-network client container, and for the whole group where ``docker compose`` v2 exists.
Skips, with the reason, where no Docker engine answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # before testcontainers reads its config

from jepsen.docker.compose import (  # noqa: E402
    BROKER_NAME,
    BROKERS,
    LAYOUT,
    NAMESERVERS,
    TOPIC,
    ComposeGroup,
    docker_unavailable_reason,
    free_net_prefix,
    free_port,
)
from jepsen.docker.images import build_image  # noqa: E402
from jepsen.docker.layout import SECRET_FILE  # noqa: E402
from ledger.client import LedgerClient  # noqa: E402
from ledger.wire import LedgerError  # noqa: E402
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode  # noqa: E402
from remoting.acl import RequestSigner  # noqa: E402
from remoting.config import RemotingConfig  # noqa: E402
from remoting.message import decode_stored_messages  # noqa: E402

_REASON = docker_unavailable_reason()
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(_REASON is not None, reason=f"needs a Docker engine and docker-compose: {_REASON}"),
    # The first run on a machine builds the debootstrap base image (~1.5 min) inside the fixture.
    pytest.mark.timeout(1800),
]
IMAGE = "ledgermq:test"
QUEUES = 4


def send_req(body: bytes, queue_id: int) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.SEND_MESSAGE,
        {
            "producerGroup": "docker-pg",
            "topic": TOPIC,
            "queueId": queue_id,
            "bornTimestamp": int(time.time() * 1000),
            "flag": 0,
            "properties": "",
        },
        body,
    )


def pull_req(queue_id: int, offset: int, max_nums: int = 256) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": "docker-cg",
            "topic": TOPIC,
            "queueId": queue_id,
            "queueOffset": offset,
            "maxMsgNums": max_nums,
            "suspendTimeoutMillis": 0,
        },
    )


async def pull_all(client: RemotingClient, addr: str, queue_id: int) -> list:
    """Every message of one queue, from offset 0 to the end (bounded number of round trips)."""
    out: list = []
    offset = 0
    for _ in range(1000):
        resp = await client.invoke_sync(addr, pull_req(queue_id, offset), 10)
        if resp.code == ResponseCode.PULL_NOT_FOUND:
            return out
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
        out.extend(decode_stored_messages(resp.body))
        offset = resp.header_int("nextBeginOffset")
    raise AssertionError(f"queue {queue_id} on {addr}: pull loop did not reach the end")


async def master_from_nameservers(group: ComposeGroup, client: RemotingClient) -> str | None:
    """What a client does: ask the nameservers which address is the group's master (broker id 0)."""
    for addr in (await group.routed_master(client)).values():
        if addr:
            return addr
    return None


@pytest.fixture(scope="module")
def image() -> str:
    """The image built from the current source (the base image and unchanged layers come from cache)."""
    t0 = time.monotonic()
    build_image(IMAGE, log=lambda m: print(f"[docker] {m}"))
    print(f"[docker] image {IMAGE} ready in {time.monotonic() - t0:.0f}s")
    return IMAGE


@pytest.fixture(scope="module")
def group(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeGroup]:
    logs = tmp_path_factory.mktemp("docker-group-logs")
    g = ComposeGroup(
        project=f"ledgermqtest{os.getpid()}",
        log_dir=logs,  # down() saves every container's log here first
        net=free_net_prefix(start=40),
        image=image,
        published_ports={name: free_port() for name in LAYOUT},
        # ACL is on, as docker-compose.yml has it, with a fresh superuser secret; no cluster
        # secret, as a user's plain `docker-compose up`: the nodes make one and share it
        secret_key=secrets.token_hex(24),
        broker_settings={"lock_max_live_s": 20.0},  # one passed setting; the others stay unset
    )
    assert g.acl_enabled, "docker-compose.yml's default is ACL on; the test group must keep it"
    t0 = time.monotonic()
    try:
        g.up(build="never", timeout=240)
        print(f"[docker] group {g.project} healthy in {time.monotonic() - t0:.0f}s")
        yield g
    finally:
        g.down()  # a no-op if test_down_... already tore it down (and saved the logs)
        print(f"[docker] container logs in {logs}")


def test_group_comes_up_healthy_on_its_fixed_addresses(group: ComposeGroup) -> None:
    for name in LAYOUT:
        assert group.state(name) == "running/healthy", name
        assert group.container_ip(name) == group.ip(name)
    # Only the servers' run-time dependencies are in the image: no Spark, no matplotlib.
    out = group.exec(
        "broker1",
        "python",
        "-c",
        "import sys, importlib.util as u; print(sys.version_info[:2], u.find_spec('pyspark'), "
        "u.find_spec('matplotlib'), u.find_spec('uvloop') is not None)",
    )
    assert out.strip() == "(3, 11) None None True", out
    assert "iptables" in group.exec("broker1", "iptables", "--version")

    async def scenario() -> None:
        master = await group.wait_for_master(all_nameservers=True, timeout=60)
        async with group.remoting_client() as client:
            # The nameservers answer through their published ports too, and know all three brokers.
            for ns in NAMESERVERS:
                resp = await client.invoke_sync(
                    group.published_addr(ns), RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), 5
                )
                assert resp.is_success, resp.remark
                addrs = json.loads(bytes(resp.body))["brokerAddrTable"][BROKER_NAME]["brokerAddrs"]
                assert sorted(addrs.values()) == sorted(group.broker_addr(b) for b in BROKERS), addrs
                assert addrs["0"] == group.broker_addr(master)
            # A broker answers on its published port (the main port, same number as inside).
            info = await group.runtime_info(client, master)
            assert info is not None and info["brokerAddr"] == group.broker_addr(master)
            resp = await client.invoke_sync(
                group.published_addr(master), RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 5
            )
            assert json.loads(bytes(resp.body))["role"] == "MASTER"

    asyncio.run(scenario())


def test_the_brokers_get_the_passed_settings_and_no_others(group: ComposeGroup) -> None:
    """A passed setting reaches every broker as its BROKER_ variable; one not passed is not set
    at all (the broker's default), not set empty."""
    for broker in BROKERS:
        assert group.exec(broker, "printenv", "BROKER_LOCK_MAX_LIVE_S").strip() == "20.0", broker
        unset = group.docker(
            "exec", group.container_id(broker), "printenv", "BROKER_TRANSACTION_TIMEOUT_S", check=False
        )
        assert unset.returncode == 1 and not unset.stdout, (broker, unset.stdout)


def test_acl_is_on_unsigned_requests_are_refused_signed_ones_served(group: ComposeGroup) -> None:
    """docker-compose.yml's ACL: unsigned admin operations (broker topic creation, nameserver KV
    put) and unsigned broker requests are refused; the superuser's signed ones are served."""

    def create_topic() -> RemotingCommand:
        return RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": "AclProbeTopic", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6},
        )

    def kv_put() -> RemotingCommand:
        return RemotingCommand.request(
            RequestCode.PUT_KV_CONFIG, {"namespace": "acl-probe", "key": "k", "value": "v"}
        )

    async def scenario() -> None:
        master = await group.wait_for_master(all_nameservers=True, timeout=60)
        addr = group.broker_addr(master)
        ns = group.namesrv_addrs[0]
        async with RemotingClient() as anon, group.remoting_client() as admin:
            for req in (create_topic(), RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)):
                resp = await anon.invoke_sync(addr, req, 5)
                assert resp.code == ResponseCode.NO_PERMISSION, (req.code, resp.code, resp.remark)
            resp = await anon.invoke_sync(ns, kv_put(), 5)
            assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)
            wrong = RemotingClient(
                RemotingConfig(send_crc=False), rpc_hook=RequestSigner(group.access_key, "wrong-secret")
            )
            async with wrong:
                resp = await wrong.invoke_sync(addr, create_topic(), 5)
                assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)
            assert (await admin.invoke_sync(addr, create_topic(), 5)).code == ResponseCode.SUCCESS
            assert (await admin.invoke_sync(ns, kv_put(), 5)).code == ResponseCode.SUCCESS

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_nodes_share_the_secret_the_first_one_made_and_prove_it(group: ComposeGroup) -> None:
    """With no LEDGERMQ_CLUSTER_SECRET, every node holds the one secret the first to start made
    (readable by its owner only); the nameservers refuse a registration without its proof, and
    a broker's ledger port serves a client that proves it and no other."""
    held = {name: group.read_cluster_secret(name) for name in (*NAMESERVERS, *BROKERS)}
    assert len(set(held.values())) == 1, "the nodes disagree on the cluster secret"
    secret = held[NAMESERVERS[0]]
    assert len(secret) == 64
    assert group.exec(BROKERS[0], "stat", "-c", "%a", SECRET_FILE).strip() == "600"
    forged = {"brokerName": "forged", "brokerAddr": "192.0.2.1:10911", "clusterName": "c", "brokerId": 0}

    async def scenario() -> None:
        async with group.remoting_client() as admin:  # signed, so that ACL is not what refuses it
            for ns in group.namesrv_addrs:
                resp = await admin.invoke_sync(
                    ns, RemotingCommand.request(RequestCode.REGISTER_BROKER, forged), 5
                )
                assert resp.code == ResponseCode.NO_PERMISSION and "cluster secret" in resp.remark, (
                    resp.remark
                )
        ledger = group.ledger_addr(BROKERS[0])
        async with LedgerClient([ledger], timeout=5.0, secret=secret) as insider:
            assert (await insider.status(ledger))["id"] == group.node_id(BROKERS[0])
        async with LedgerClient([ledger], timeout=3.0, attempt_timeout=1.0) as stranger:
            with pytest.raises(LedgerError):
                await stranger.status(ledger)

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_produce_kill_leader_container_failover_through_nameserver_consume_all(group: ComposeGroup) -> None:
    async def scenario() -> None:
        old = await group.wait_for_master(all_nameservers=True, timeout=60)
        acked: dict[bytes, tuple[int, int]] = {}
        stop = False
        async with group.remoting_client() as client:

            async def producer(q: int) -> None:
                n = 0
                target = await master_from_nameservers(group, client)
                while not stop:
                    body = f"docker-q{q}-{n}".encode()
                    n += 1
                    resp = None
                    if target:
                        try:
                            resp = await client.invoke_sync(target, send_req(body, q), 3)
                        except Exception:  # noqa: BLE001 - the kill resets connections: outcome unknown
                            resp = None
                    if resp is not None and resp.code == ResponseCode.SUCCESS:
                        acked[body] = (q, resp.header_int("queueOffset"))
                        continue
                    # Failover as a client sees it: back to the nameservers for the master's address.
                    await asyncio.sleep(0.1)
                    target = await master_from_nameservers(group, client)

            tasks = [asyncio.create_task(producer(q)) for q in range(QUEUES)]
            await asyncio.sleep(2.0)
            before = len(acked)
            t_kill = time.monotonic()
            group.kill(old)  # docker kill: SIGKILL of the container's broker (and its ledger node)
            new = await group.wait_for_master(exclude={old}, all_nameservers=True, timeout=60)
            failover_s = time.monotonic() - t_kill
            deadline = time.monotonic() + 30
            while len(acked) < before + 50 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            stop = True
            await asyncio.gather(*tasks)
            print(
                f"[docker] {old} killed; {new} routed as master after {failover_s:.1f}s; {len(acked)} acked"
            )
            assert before >= 20, f"only {before} sends acknowledged before the kill"
            assert len(acked) >= before + 50, (
                f"the new master acknowledged too little: {before} -> {len(acked)}"
            )

            # Both nameservers route the topic to the new master, not the killed one.
            routes = await group.routed_master(client)
            assert set(routes.values()) == {group.broker_addr(new)}, routes

            # Consume everything from the master the nameservers name: every ack, at its offset, once.
            addr = await master_from_nameservers(group, client)
            assert addr == group.broker_addr(new)
            stored: dict[bytes, tuple[int, int]] = {}
            for q in range(QUEUES):
                msgs = await pull_all(client, addr, q)
                assert [m.queue_offset for m in msgs] == list(range(len(msgs))), f"queue {q} has gaps"
                for m in msgs:
                    assert m.body not in stored, f"duplicate {m.body!r}"
                    stored[m.body] = (q, m.queue_offset)
            lost = {b: v for b, v in acked.items() if stored.get(b) != v}
            assert not lost, f"{len(lost)} acknowledged messages lost or moved, e.g. {list(lost.items())[:3]}"

            # The killed container comes back on its volume, as a slave of the new master, and catches up.
            group.restart(old, timeout=90)
            deadline = time.monotonic() + 60
            info: dict | None = None
            master_info: dict | None = None
            while time.monotonic() < deadline:
                info = await group.runtime_info(client, old)
                master_info = await group.runtime_info(client, new)
                if (
                    info
                    and master_info
                    and info["role"] == "SLAVE"
                    and info["masterAddr"] == group.broker_addr(new)
                    and info["ledger"]["commit_index"] >= master_info["ledger"]["commit_index"]
                ):
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(
                    f"{old} did not rejoin as a caught-up slave: {info} / master {master_info}"
                )
            assert info["ledger"]["commit_index"] > 0

    asyncio.run(scenario())


def test_partition_and_pause_move_mastership_and_heal(group: ComposeGroup) -> None:
    async def scenario() -> None:
        first = await group.wait_for_master(all_nameservers=True, timeout=60)
        others = [b for b in BROKERS if b != first]
        # Cut the master off from the other brokers (it still reaches the nameservers).
        result = group.partition([first], others)
        assert result["unapplied"] == {}, result
        assert f"-s {group.ip(others[0])}/32 -j DROP" in group.rules(first)
        second = await group.wait_for_master(exclude={first}, all_nameservers=True, timeout=60)
        async with group.remoting_client() as client:
            # The isolated broker lost its quorum: it must not still claim to be master.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                info = await group.runtime_info(client, first)
                if info and info["role"] == "SLAVE":
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"isolated {first} still claims MASTER: {info}")
            group.heal()
            assert "DROP" not in group.rules(first)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                info = await group.runtime_info(client, first)
                if info and info["masterAddr"] == group.broker_addr(second):
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"after heal {first} does not follow {second}: {info}")

            # Freeze the master's container: the others elect a new one; it follows after unpause.
            group.pause(second)
            try:
                third = await group.wait_for_master(exclude={second}, all_nameservers=True, timeout=60)
            finally:
                group.unpause(second)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                info = await group.runtime_info(client, second)
                if info and info["role"] == "SLAVE" and info["masterAddr"] == group.broker_addr(third):
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"unpaused {second} does not follow {third}: {info}")
            resp = await client.invoke_sync(group.broker_addr(third), send_req(b"after-pause", 0), 5)
            assert resp.code == ResponseCode.SUCCESS, resp.remark

    asyncio.run(scenario())


CLIENT_SCRIPT = r"""
import asyncio, json, os, sys
from client.instance import make_signer
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.config import RemotingConfig
from remoting.message import decode_stored_messages

async def main():
    # signs as LEDGERMQ_ACCESS_KEY / LEDGERMQ_SECRET_KEY say: the brokers refuse unsigned requests
    async with RemotingClient(RemotingConfig(send_crc=False), rpc_hook=make_signer()) as c:
        master = None
        for ns in os.environ["NAMESRV_ADDR"].split(";"):
            r = await c.invoke_sync(ns, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}), 5)
            if r.is_success:
                master = json.loads(bytes(r.body))["brokerDatas"][0]["brokerAddrs"].get("0")
                break
        offsets = []
        for i in range(5):
            r = await c.invoke_sync(master, RemotingCommand.request(RequestCode.SEND_MESSAGE, {
                "producerGroup": "in-net", "topic": "TopicTest", "queueId": 3, "bornTimestamp": 0, "flag": 0,
                "properties": ""}, f"in-net-{i}".encode()), 5)
            assert r.code == ResponseCode.SUCCESS, r.remark
            offsets.append(r.header_int("queueOffset"))
        r = await c.invoke_sync(master, RemotingCommand.request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": "in-net", "topic": "TopicTest", "queueId": 3, "queueOffset": offsets[0],
            "maxMsgNums": 5, "suspendTimeoutMillis": 0}), 5)
        bodies = [m.body.decode() for m in decode_stored_messages(r.body)]
        print(json.dumps({"master": master, "offsets": offsets, "bodies": bodies}))

asyncio.run(main())
"""


def test_client_container_on_the_group_network(group: ComposeGroup) -> None:
    """A client in its own container (testcontainers) on the compose network: how clients off Linux hosts connect."""
    from testcontainers.core.container import DockerContainer

    asyncio.run(group.wait_for_master(all_nameservers=True, timeout=60))
    container = (
        DockerContainer(IMAGE)
        .with_command(["python", "-c", CLIENT_SCRIPT])
        .with_env("NAMESRV_ADDR", group.namesrv_addr_str)
        .with_env("LEDGERMQ_ACCESS_KEY", group.access_key)
        .with_env("LEDGERMQ_SECRET_KEY", group.secret_key)
        .with_kwargs(network=group.network_name())
    )
    container.start()
    try:
        status = container.get_wrapped_container().wait(timeout=60)
        stdout, stderr = container.get_logs()
    finally:
        container.stop()
    assert status["StatusCode"] == 0, stderr.decode(errors="replace")[-2000:]
    doc = json.loads(stdout.decode().strip().splitlines()[-1])
    assert doc["master"] in {group.broker_addr(b) for b in BROKERS}
    assert doc["bodies"] == [f"in-net-{i}" for i in range(5)]
    assert doc["offsets"] == list(range(doc["offsets"][0], doc["offsets"][0] + 5))


def test_down_removes_containers_network_and_volumes(group: ComposeGroup) -> None:
    """Runs last in this module: tear down and check nothing of the project is left."""
    volumes = [m["Name"] for m in group.inspect("broker1")["Mounts"] if m.get("Type") == "volume"]
    assert volumes, "broker1 has no named volume"
    network = group.network_name()
    forced = group.down()
    assert forced == [], f"compose down left these behind (removed by force): {forced}"
    assert group.leftovers() == []
    for vol in volumes:
        assert subprocess.run(["docker", "volume", "inspect", vol], capture_output=True).returncode != 0
    assert subprocess.run(["docker", "network", "inspect", network], capture_output=True).returncode != 0


def _compose_v2_missing() -> str | None:
    if _REASON is not None:
        return f"needs a Docker engine and docker compose v2: {_REASON}"
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0:
        return "docker compose v2 is not installed here (only docker-compose v1, which the tests above use)"
    return None


_V2_MISSING = _compose_v2_missing()


@pytest.mark.skipif(_V2_MISSING is not None, reason=_V2_MISSING or "")
def test_compose_v2_via_testcontainers_kill_leader(monkeypatch: pytest.MonkeyPatch, image: str) -> None:
    """`docker compose up --wait` (v2) on docker-compose.yml through testcontainers' DockerCompose, then a failover."""
    from testcontainers.compose import DockerCompose

    g = ComposeGroup(
        project=f"ledgermqv2test{os.getpid()}",
        net=free_net_prefix(start=80),
        image=image,
        published_ports={name: free_port() for name in LAYOUT},
    )
    for key, value in g.compose_env().items():
        if key.startswith(("LEDGERMQ_", "COMPOSE_")):
            monkeypatch.setenv(key, value)
    compose = DockerCompose(
        context=str(Path(g.compose_file).parent), compose_file_name=g.compose_file.name, wait=True
    )
    try:
        compose.start()
        for name in LAYOUT:
            assert g.state(name) == "running/healthy", name
        old = asyncio.run(g.wait_for_master(all_nameservers=True, timeout=60))
        g.kill(old)
        new = asyncio.run(g.wait_for_master(exclude={old}, all_nameservers=True, timeout=60))
        assert new != old
    finally:
        compose.stop()
        g.down()
    assert g.leftovers() == []
