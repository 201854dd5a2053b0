"""A real broker group whose members change: a wiped master replaced by a fresh broker under
load through ``ledgermq-admin``, and ``broker local-cluster``'s printed replacement commands."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from broker.localgroup import LocalBrokerGroup
from client.admin_api import AdminClient
from client.errors import ClientError
from client.producer import Producer
from common.process import ProcessSet
from jepsen.systems.broker_membership import start_joining_broker
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.message import Message, decode_stored_messages

pytestmark = pytest.mark.slow
TOPIC = "TopicTest"


def admin(namesrv: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "client.admin", "-n", namesrv, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NAMESRV_ADDR": ""},
    )


async def runtime_info(client: RemotingClient, addr: str) -> dict[str, Any] | None:
    try:
        resp = await client.invoke_sync(
            addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 1.0
        )
    except Exception:  # noqa: BLE001 - not up yet
        return None
    return json.loads(bytes(resp.body)) if resp.is_success else None


async def wait_for(what: str, probe: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout}s (last: {last})")


async def messages_on(client: RemotingClient, addr: str, queues: int) -> dict[tuple[int, int], bytes]:
    """Every message of the topic as ``addr`` serves it: (queue, offset) -> body."""
    out: dict[tuple[int, int], bytes] = {}
    for q in range(queues):
        offset = 0
        for _ in range(10_000):
            headers = {
                "consumerGroup": "cg",
                "topic": TOPIC,
                "queueId": q,
                "queueOffset": offset,
                "maxMsgNums": 256,
                "suspendTimeoutMillis": 0,
            }
            resp = await client.invoke_sync(
                addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, headers), 10
            )
            if resp.code == ResponseCode.PULL_NOT_FOUND:
                break
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            for m in decode_stored_messages(resp.body):
                out[(q, m.queue_offset)] = bytes(m.body)
            offset = resp.header_int("nextBeginOffset")
    return out


class Load:
    """Sends numbered messages from a few tasks; remembers every acknowledged (queue, offset, body)."""

    def __init__(self, namesrv: list[str]) -> None:
        self.producer = Producer("membership-pg", namesrv, send_timeout_s=5, retries=2)
        self.acked: list[tuple[int, int, bytes]] = []
        self.errors = 0
        self.stopping = False

    async def run(self, tasks: int = 4) -> None:
        await self.producer.start()
        counter = iter(range(10**9))

        async def one() -> None:
            while not self.stopping:
                body = f"m{next(counter)}".encode()
                try:
                    r = await self.producer.send(Message(TOPIC, body))
                except ClientError:
                    self.errors += 1
                    await asyncio.sleep(0.05)
                    continue
                self.acked.append((r.queue_id, r.queue_offset, body))

        try:
            await asyncio.gather(*(one() for _ in range(tasks)))
        finally:
            await self.producer.shutdown(grace_s=0.5)


def test_a_wiped_master_is_replaced_under_load_and_the_new_broker_serves_as_slave(tmp_path: Path) -> None:
    g = LocalBrokerGroup(tmp_path, settings={"register_interval_s": 10})
    g.start()
    try:
        asyncio.run(_replace_under_load(g))
    finally:
        g.stop()


async def _replace_under_load(g: LocalBrokerGroup) -> None:
    ns, secret = g.namesrv_addr_str, g.cluster_secret_file()
    victim = await g.wait_for_master(30)
    load = Load(g.namesrv_addrs)
    sending = asyncio.create_task(load.run())
    async with RemotingClient() as rc, AdminClient(g.namesrv_addrs) as adm:

        async def sending_well() -> bool:
            return len(load.acked) > 50

        await wait_for("acknowledged sends", sending_well)
        # the master's disk dies: it is gone for good, the group fails over
        g.kill_broker(victim)
        shutil.rmtree(g.base_dir / g.name_of(victim) / "data")
        removed = await asyncio.to_thread(
            admin, ns, "member-remove", "-b", "broker-a", "--cluster-secret-file", secret, "--json", victim
        )
        assert removed.returncode == 0, removed.stderr
        assert victim not in json.loads(removed.stdout)["voters"]

        baddr, laddr = start_joining_broker(g, "n4", "127.0.0.4")
        await wait_for("the joining broker", lambda: runtime_info(rc, baddr))
        unsigned = await asyncio.to_thread(admin, ns, "member-add", "-b", "broker-a", f"n4={baddr}")
        assert unsigned.returncode == 1 and "must prove the group's cluster secret" in unsigned.stderr
        added = await asyncio.to_thread(
            admin, ns, "member-add", "-b", "broker-a", "--cluster-secret-file", secret, f"n4={baddr}"
        )
        assert added.returncode == 0, added.stderr
        assert re.search(rf"n4\s+SLAVE\s+5\s+{re.escape(baddr)}\s+{re.escape(laddr)}", added.stdout), (
            added.stdout
        )

        async def routed() -> dict[int, str] | None:
            bd = (await adm.cluster_info()).broker_addr_table.get("broker-a")
            addrs = dict(bd.broker_addrs) if bd else {}
            ok = addrs.get(5) == baddr and g.broker_addr[victim] not in addrs.values() and 0 in addrs
            return addrs if ok else None

        routes = await wait_for("the routes to follow", routed)
        assert len(routes) == 3, routes
        info = await runtime_info(rc, baddr)
        assert info and info["role"] == "SLAVE" and info["brokerId"] == 5 and info["membership"]["voter"], (
            info
        )

        nobody = await asyncio.to_thread(
            admin, ns, "member-remove", "-b", "broker-a", "--cluster-secret-file", secret, "nobody"
        )
        assert nobody.returncode == 1 and "'nobody' is not a member of the group" in nobody.stderr, (
            nobody.stderr
        )
        listed = await asyncio.to_thread(admin, ns, "member-list", "-b", "broker-a", "--json")
        doc = json.loads(listed.stdout)
        assert set(doc["voters"]) == set(g.node_ids) - {victim} | {"n4"} and not doc["learners"], doc

        # one more old member dies: removing n4 would leave a majority of nobody reachable
        master = next(n for n in g.node_ids if n != victim and routes[0] == g.broker_addr[n])
        other = next(n for n in g.node_ids if n not in (victim, master))
        g.kill_broker(other)
        await asyncio.sleep(2.5)  # its progress goes stale after an election timeout or two
        refused = await asyncio.to_thread(
            admin, ns, "member-remove", "-b", "broker-a", "--cluster-secret-file", secret, "n4"
        )
        assert refused.returncode == 1 and "need 2 to commit anything" in refused.stderr, refused.stderr
        g.start_broker(other)
        await asyncio.sleep(1.0)
        load.stopping = True
        await sending
        assert len(load.acked) > 100, (len(load.acked), load.errors)

        # every acknowledged message, on the master and on the new broker (a slave read)
        for addr in (routes[0], baddr):

            async def complete(addr: str = addr) -> dict[tuple[int, int], bytes] | None:
                held = await messages_on(rc, addr, 4)
                return held if all(held.get((q, o)) == b for q, o, b in load.acked) else None

            await wait_for(f"every acknowledged message on {addr}", complete)


def test_local_cluster_prints_how_to_replace_a_dead_broker_and_the_commands_work(tmp_path: Path) -> None:
    procs = ProcessSet(tmp_path)
    log = tmp_path / "local-cluster.out"
    procs.spawn(
        "local-cluster",
        [
            sys.executable,
            "-m",
            "broker",
            "local-cluster",
            "--dir",
            str(tmp_path / "lc"),
            "--namesrv-port",
            "0",
        ],
        log,
    )
    try:
        text = _wait_text(log, "ready:", 60)
        ns = re.search(r"namesrv=(\S+)", text).group(1)  # type: ignore[union-attr]
        pid_file = tmp_path / "lc" / "broker-a" / "n2" / "broker.pid"
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        text = _wait_text(log, "broker --config", 30)
        commands = [line.strip() for line in text.splitlines() if line.startswith("  ")][-3:]
        assert commands[0].startswith(f"ledgermq-admin -n {ns} member-remove -b broker-a") and commands[
            0
        ].endswith(" n2")
        assert commands[1].startswith("broker --config ") and commands[1].endswith("/n4/broker.toml &")
        for cmd in (commands[0], commands[2]):  # as a user would paste them, the broker in between
            if cmd is commands[2]:
                config = commands[1].split()[2]
                procs.spawn("n4", [sys.executable, "-m", "broker", "--config", config], tmp_path / "n4.log")
                time.sleep(2.0)
            argv = cmd.split()
            argv[0:1] = [sys.executable, "-m", "client.admin"]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (cmd, done.stdout, done.stderr)
        assert re.search(r"n4\s+SLAVE\s+5\s", done.stdout), done.stdout
        listed = subprocess.run(
            [sys.executable, "-m", "client.admin", "-n", ns, "cluster-list"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert re.search(r"broker-a\s+5\s+SLAVE", listed.stdout) and not re.search(
            r"broker-a\s+3\s", listed.stdout
        )
    finally:
        procs.stop()


def _wait_text(path: Path, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if needle in text:
            return text
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} not printed within {timeout}s:\n{text}")


def test_a_removed_broker_that_lives_on_stays_off_the_routes_and_says_why(tmp_path: Path) -> None:
    g = LocalBrokerGroup(tmp_path, settings={"register_interval_s": 10})
    g.start()
    try:
        asyncio.run(_removed_but_alive(g))
    finally:
        g.stop()


async def _removed_but_alive(g: LocalBrokerGroup) -> None:
    master = await g.wait_for_master(30)
    victim = next(n for n in g.node_ids if n != master)
    gone = g.broker_addr[victim]
    removed = await asyncio.to_thread(
        admin, g.namesrv_addr_str, "member-remove", "-b", "broker-a", "--cluster-secret-file",
        g.cluster_secret_file(), victim,
    )  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    async with RemotingClient() as rc, AdminClient(g.namesrv_addrs) as adm:

        async def routes() -> dict[int, str]:
            bd = (await adm.cluster_info()).broker_addr_table.get("broker-a")
            return dict(bd.broker_addrs) if bd else {}

        async def off_the_routes() -> bool:
            return gone not in (await routes()).values()

        async def knows_it() -> dict[str, Any] | None:
            info = await runtime_info(rc, gone)
            return info if info and info["membership"].get("removed") else None

        await wait_for("the removed broker off the routes", off_the_routes)
        info = await wait_for("the removed broker to know it", knows_it)
        assert not info["membership"]["voter"] and not info["membership"]["registered"], info
        # alive, it has a registration round every 10 s: over more than one it stays off
        for _ in range(12):
            await asyncio.sleep(1.0)
            assert await off_the_routes(), await routes()
        assert len(await routes()) == 2
    log = (g.base_dir / g.name_of(victim) / "broker.log").read_text(errors="replace")
    assert "this broker was removed from the group: it no longer registers with the nameservers" in log
