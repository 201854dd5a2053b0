"""Ledger peers and listeners under attack and misuse: forged peers, floods, TLS, bad configs.

Real node processes on 127.0.0.x; the attacker is this test speaking raw frames on a socket.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.settings import ConfigError, load_settings
from common.tls import client_context
from ledger.auth import FLAG_FRAME_MAC, PROOF, AuthError, FrameOpener, FrameSealer, Handshake, PeerAuth
from ledger.client import LedgerClient
from ledger.codec import Entry
from ledger.config import NodeConfig
from ledger.localcluster import LocalCluster
from ledger.messages import AppendRequest, encode_message
from ledger.wire import LedgerError

_LEN = struct.Struct("<I")
SECRET = b"s3cret-of-this-test-cluster-0123456789"


def frame(body: bytes) -> bytes:
    return _LEN.pack(len(body)) + body


# ---------------------------------------------------------------------- the handshake itself


def _handshake(dialer_secret: bytes, listener_secret: bytes):
    d, lst = PeerAuth(dialer_secret), PeerAuth(listener_secret)
    hello, nonce = d.hello("n1", "n2")
    dialer, target, challenge, hs = lst.challenge(hello)
    assert (dialer, target) == ("n1", "n2")
    proof, sealer = d.answer_challenge("n1", "n2", nonce, challenge)
    return proof, sealer, hs


def test_handshake_proves_the_secret_both_ways_and_macs_every_frame():
    proof, sealer, hs = _handshake(SECRET, SECRET)
    opener = PeerAuth.check_proof(hs, proof)
    bodies = [b"first", b"second" * 100, b""]
    framed = [b + sealer.tag(b) for b in bodies]
    assert [bytes(opener.open(f)) for f in framed] == bodies
    # an altered, replayed or reordered frame fails
    for bad in (framed[0][:-1] + bytes([framed[0][-1] ^ 1]), framed[1], b"x" * 40):
        with pytest.raises(AuthError, match="failed authentication|too short"):
            FrameOpener(hs.frame_key()).open(bad) if bad is framed[1] else opener.open(bad)


def test_a_listener_with_another_secret_is_caught_by_the_dialer():
    with pytest.raises(AuthError, match="does not match our cluster secret"):
        _handshake(SECRET, b"another-secret-of-16+bytes")


def test_a_dialer_with_another_secret_is_caught_by_the_listener():
    d, lst = PeerAuth(b"another-secret-of-16+bytes"), PeerAuth(SECRET)
    hello, nonce = d.hello("n1", "n2")
    _, _, challenge, hs = lst.challenge(hello)
    forged = Handshake(b"another-secret-of-16+bytes", "n1", "n2", nonce, challenge[1:33])
    with pytest.raises(AuthError, match="wrong cluster secret"):
        PeerAuth.check_proof(hs, PROOF + forged.proof(b"dialer"))
    # the listener's own proof cannot be reflected back as the dialer's
    with pytest.raises(AuthError, match="wrong cluster secret"):
        PeerAuth.check_proof(hs, PROOF + challenge[33:])


def test_sealer_and_opener_sequence_numbers_bind_order():
    key = b"k" * 32
    sealer, opener = FrameSealer(key), FrameOpener(key)
    a, b = b"a" + sealer.tag(b"a"), b"b" + sealer.tag(b"b")
    with pytest.raises(AuthError):
        opener.open(b)  # b before a
    opener = FrameOpener(key)
    opener.open(a)
    with pytest.raises(AuthError):
        opener.open(a)  # replay


# ---------------------------------------------------------------------- configuration


def _config(tmp_path: Path, text: str) -> NodeConfig:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return load_settings(NodeConfig, path, env_prefix="LEDGER_", environ={}, section="ledger")


BASE = 'id = "n1"\nlisten = "127.0.0.1:7001"\ndata_dir = "d"\n'
PEERS = 'peers = ["n1=127.0.0.1:7001", "n2=127.0.0.1:7002"]\n'


@pytest.mark.parametrize(
    "text,words",
    [
        (
            BASE + 'peers = ["n1=127.0.0.1:7001", "n2=127.0.0.1:7001"]\n',
            "'n1' and 'n2' have the same address",
        ),
        (BASE + 'peers = ["n1=127.0.0.1:7001", "n2=LOCALHOST:7002", "n3=localhost:7002"]\n', "same address"),
        (BASE + 'peers = ["n1=127.0.0.1:7001", "n1=127.0.0.1:7002"]\n', "member 'n1' listed twice"),
        (BASE + PEERS + 'cluster_secret = "short"\n', "at least 16 bytes"),
        (BASE + PEERS + 'cluster_secret = "0123456789abcdef"\ncluster_secret_file = "x"\n', "not both"),
        (BASE + PEERS + 'cluster_secret_file = "/nonexistent/secret"\n', "cannot read /nonexistent/secret"),
        (BASE + PEERS + 'tls_cert_file = "c.pem"\n', "TLS needs all of"),
        (
            BASE + PEERS + 'tls_cert_file = "/no/c.pem"\ntls_key_file = "k"\ntls_ca_file = "ca"\n',
            "does not exist",
        ),
        (BASE + PEERS + "max_handshake_frame_bytes = 10\n", "max_handshake_frame_bytes"),
        (BASE + PEERS + "max_buffered_bytes = 1000\n", "max_buffered_bytes"),
        (BASE + PEERS + "idle_timeout_s = 0\n", "idle_timeout_s"),
        (BASE + PEERS + "client_auth = true\n", "'client_auth' needs a cluster_secret"),
        (BASE + PEERS + 'cluster_secret_accepted = "0123456789abcdef"\n', "'cluster_secret_accepted' needs"),
        (BASE + f'peers = ["n1=127.0.0.1:7001", "{"x" * 65}=127.0.0.1:7002"]\n', "at most 64 bytes"),
    ],
)
def test_bad_security_settings_are_refused_with_the_key_named(tmp_path, text, words):
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, text)
    assert words in str(info.value)


def test_secret_from_file_or_env_and_never_in_repr(tmp_path):
    (tmp_path / "secret").write_text("from-a-file-0123456789\n")
    cfg = _config(tmp_path, BASE + PEERS + f'cluster_secret_file = "{tmp_path / "secret"}"\n')
    assert cfg.secret == b"from-a-file-0123456789"
    path = tmp_path / "env.toml"
    path.write_text(BASE + PEERS)
    cfg = load_settings(NodeConfig, path, env_prefix="LEDGER_", environ={"LEDGER_CLUSTER_SECRET": "e" * 20})
    assert cfg.secret == b"e" * 20
    assert "eeee" not in repr(cfg)


def test_binary_config_file_is_one_clear_error(tmp_path):
    path = tmp_path / "node.toml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary")
    with pytest.raises(ConfigError, match=f"config file {path} is not UTF-8 text"):
        load_settings(NodeConfig, path)
    out = subprocess.run(
        [sys.executable, "-m", "ledger", "start", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and f"config file {path} is not UTF-8 text" in out.stderr


def test_start_with_the_port_in_use_is_one_line_and_nonzero(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        addr = f"127.0.0.1:{s.getsockname()[1]}"
        out = subprocess.run(
            [sys.executable, "-m", "ledger", "start", "--id", "n1", "--listen", addr, "--peers", f"n1={addr}"]
            + ["--data-dir", str(tmp_path / "d")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode != 0
    errors = [ln for ln in out.stderr.splitlines() if not ln.startswith("{")]  # JSON lines are the node's log
    assert "Traceback" not in out.stderr
    assert len(errors) == 1 and f"cannot start node n1: cannot listen on {addr}" in errors[0], out.stderr
    assert "in use" in errors[0]


# ---------------------------------------------------------------------- a forged peer against a real group


class RawConn:
    """The attacker's side: raw frames on a socket, and whether the node hung up."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, address: str) -> RawConn:
        host, port = address.rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)))

    def send(self, *bodies: bytes) -> None:
        for b in bodies:
            self.writer.write(frame(b))

    async def read_frame(self, timeout: float = 5.0) -> bytes:
        head = await asyncio.wait_for(self.reader.readexactly(4), timeout)
        return await asyncio.wait_for(self.reader.readexactly(_LEN.unpack(head)[0]), timeout)

    async def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True once the node closes the connection (EOF or reset) within ``timeout``."""
        try:
            await self.writer.drain()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                data = await asyncio.wait_for(self.reader.read(65536), max(0.01, deadline - time.monotonic()))
                if not data:
                    return True
        except (ConnectionError, asyncio.IncompleteReadError):
            return True
        except TimeoutError:
            return False
        return False

    def close(self) -> None:
        self.writer.close()


def log_lines(cluster: LocalCluster, nid: str) -> list[dict]:
    out = []
    for ln in (cluster.base_dir / nid / "node.log").read_text(errors="replace").splitlines():
        if ln.startswith("{"):
            try:
                out.append(json.loads(ln))
            except ValueError:
                pass
    return out


def refusals(cluster: LocalCluster, nid: str) -> list[str]:
    return [d["msg"] for d in log_lines(cluster, nid) if d["msg"].startswith("refused ")]


async def wait_all_commit(
    client: LedgerClient, cluster: LocalCluster, index: int, timeout: float = 15
) -> None:
    deadline = time.monotonic() + timeout
    for nid in cluster.ids:
        while True:
            st = await client.status(cluster.address(nid))
            if st["commit_index"] >= index:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{nid} did not reach commit {index}: {st}")
            await asyncio.sleep(0.05)


async def whole_log(client: LedgerClient, address: str, upto: int) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []
    while len(out) < upto:
        got = await client.read(len(out) + 1, upto, address=address)
        assert got, f"{address} returned nothing from {len(out) + 1}"
        out += [(e.index, e.term, bytes(e.data)) for e in got]
    return out


def forged_append(status: dict, last: Entry, src: str) -> bytes:
    """The probe from the issue: term + 100, one foreign entry, commit = last + 1."""
    term = status["term"] + 100
    e = Entry(last.index + 1, term, b"FORGED", pos=last.pos + len(last.raw))
    m = AppendRequest(term, src, status["id"], last.index, last.term, last.index + 1, [e])
    return encode_message(m)


@pytest.mark.slow
@pytest.mark.parametrize("frame_mac", [False, True], ids=["handshake", "frame-mac"])
def test_forged_peers_are_refused_and_logged_and_the_logs_stay_identical(tmp_path, frame_mac):
    cluster = LocalCluster(tmp_path, 3, settings={"peer_frame_mac": frame_mac})
    secret = Path(cluster.settings["cluster_secret_file"]).read_bytes().strip()
    cluster.start()
    try:

        async def scenario() -> None:
            leader = await cluster.wait_for_leader()
            follower = next(n for n in cluster.ids if n != leader)
            other = next(n for n in cluster.ids if n not in (leader, follower))
            target = cluster.address(follower)
            async with LedgerClient(cluster.addresses) as client:
                acked = [await client.append(f"ack-{i}".encode()) for i in range(20)]
                top = acked[-1][0]
                await wait_all_commit(client, cluster, top)
                st = await client.status(target)
                last = (await client.read(st["last_index"], st["last_index"], address=target))[0]
                forged = forged_append(st, last, leader)

                # 1. the old unauthenticated hello, claiming to be the leader, then the forged append
                c = await RawConn.open(target)
                c.send(b"P" + leader.encode(), forged)
                assert await c.closed_by_peer(), "an unauthenticated peer hello was not refused"
                c.close()

                # 2. the authenticated hello with a wrong secret, claiming to be the leader
                flags = FLAG_FRAME_MAC if frame_mac else 0
                wrong = PeerAuth(b"not-the-cluster-secret-0000")
                hello, nonce = wrong.hello(leader, follower, flags)
                c = await RawConn.open(target)
                c.send(hello)
                challenge = await c.read_frame()
                hs = Handshake(
                    b"not-the-cluster-secret-0000", leader, follower, nonce, challenge[1:33], flags
                )
                with pytest.raises(AuthError):  # and the node's proof does not match our (wrong) secret
                    wrong.answer_challenge(leader, follower, nonce, challenge, flags)
                tag = FrameSealer(hs.frame_key()).tag(forged) if frame_mac else b""
                c.send(PROOF + hs.proof(b"dialer"), forged + tag)
                assert await c.closed_by_peer(), "a peer with the wrong secret was not refused"
                c.close()

                # 3. a made-up member id (accepted only if it proves the secret: it could be a
                # member added by a configuration this node does not hold yet)
                hello, nonce = wrong.hello("n9", follower, flags)
                c = await RawConn.open(target)
                c.send(hello)
                challenge = await c.read_frame()
                hs = Handshake(b"not-the-cluster-secret-0000", "n9", follower, nonce, challenge[1:33], flags)
                c.send(PROOF + hs.proof(b"dialer"))
                assert await c.closed_by_peer()
                c.close()

                good = PeerAuth(secret)
                if frame_mac:
                    # 4. the right secret but a tampered frame: the per-frame MAC catches it
                    hello, nonce = good.hello(other, follower, FLAG_FRAME_MAC)
                    c = await RawConn.open(target)
                    c.send(hello)
                    proof, sealer = good.answer_challenge(other, follower, nonce, await c.read_frame())
                    assert sealer is not None
                    tag = sealer.tag(forged)
                    c.send(proof, forged[:-1] + b"X" + tag)
                    assert await c.closed_by_peer(), "a frame with a bad MAC was accepted"
                    c.close()
                else:
                    # 4. the right secret, but asking for frame MACs this group does not use: refused
                    hello, nonce = good.hello(other, follower, FLAG_FRAME_MAC)
                    c = await RawConn.open(target)
                    c.send(hello)
                    assert await c.closed_by_peer()
                    c.close()

                # the group keeps working; nothing foreign was committed anywhere
                acked += [await client.append(f"after-{i}".encode()) for i in range(5)]
                top = acked[-1][0]
                await wait_all_commit(client, cluster, top)
                logs = {n: await whole_log(client, cluster.address(n), top) for n in cluster.ids}
            assert logs[cluster.ids[0]] == logs[cluster.ids[1]] == logs[cluster.ids[2]]
            assert all(data != b"FORGED" for _, _, data in logs[follower])
            by_index = {i: (t, d) for i, t, d in logs[follower]}
            for n, (index, term) in enumerate(acked):
                want = f"ack-{n}" if n < 20 else f"after-{n - 20}"
                assert by_index[index] == (term, want.encode()), f"acknowledged entry {index} lost"

            lines = refusals(cluster, follower)
            assert any(
                f"refused peer '{leader}'" in m and "unauthenticated peer hello" in m for m in lines
            ), lines
            assert any(f"refused peer '{leader}'" in m and "wrong cluster secret" in m for m in lines), lines
            assert any("refused peer 'n9'" in m and "wrong cluster secret" in m for m in lines), lines
            assert all(" from 127.0.0." in m for m in lines), lines
            assert not any("hung up" in m for m in lines), lines  # one line per refusal, not two
            if frame_mac:
                assert any(
                    "failed authentication" in d["msg"] and d.get("conn") == f"from {other}"
                    for d in log_lines(cluster, follower)
                )
            else:
                assert any(f"refused peer '{other}'" in m and "frame MACs" in m for m in lines), lines

        asyncio.run(scenario())
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_group_without_a_secret_still_runs_but_warns(tmp_path):
    cluster = LocalCluster(tmp_path, 3, settings={"cluster_secret": ""})
    cluster.start()
    try:
        leader = asyncio.run(cluster.wait_for_leader())
        assert any("peer authentication is OFF" in d["msg"] for d in log_lines(cluster, leader))
    finally:
        cluster.stop()


@pytest.mark.slow
def test_nodes_with_different_secrets_never_form_a_group(tmp_path):
    cluster = LocalCluster(tmp_path, 3)
    cluster.write_configs()
    cfg = cluster.config_path("n3")
    (tmp_path / "other.secret").write_text("a-different-secret-0123456789\n")
    cfg.write_text(
        cfg.read_text().replace(cluster.settings["cluster_secret_file"], str(tmp_path / "other.secret"))
    )
    for nid in cluster.ids:
        cluster.start_node(nid)
    try:
        leader = asyncio.run(cluster.wait_for_leader())
        assert leader != "n3"

        async def n3_status() -> dict:
            async with LedgerClient(cluster.addresses) as client:
                await client.append(b"x")
                await asyncio.sleep(1.0)
                return await client.status(cluster.address("n3"))

        st = asyncio.run(n3_status())
        assert st["commit_index"] == 0 and st["leader"] is None, st
        assert any("a different cluster_secret" in m for m in refusals(cluster, "n3")), refusals(
            cluster, "n3"
        )
        assert any(
            "cannot connect to peer n3" in d["msg"] and "does not match our cluster secret" in d["msg"]
            for d in log_lines(cluster, leader)
        )
    finally:
        cluster.stop()


# ---------------------------------------------------------------------- bounds on the listener


def rss_kb(pid: int) -> int:
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_listener_bounds(tmp_path):
    settings = {
        "max_connections": 30,
        "max_pending_handshakes": 10,
        "handshake_timeout_s": 1.0,
        "idle_timeout_s": 1.5,
        "max_entry_bytes": 1 << 20,
        "max_frame_bytes": 2 << 20,
        "max_buffered_bytes": 3 << 20,
        "max_read_bytes": 8192,
    }
    cluster = LocalCluster(tmp_path, 1, settings=settings)
    cluster.start()
    addr = cluster.address("n1")
    pid = cluster.pid("n1")
    assert pid is not None
    try:

        async def scenario() -> None:
            await cluster.wait_for_leader()

            def reasons() -> list[str]:
                return [d.get("reason") or d["msg"] for d in log_lines(cluster, "n1")]

            # a big frame before any hello: refused at its length word, nothing buffered
            before = rss_kb(pid)
            conns = []
            for _ in range(8):
                c = await RawConn.open(addr)
                c.writer.write(_LEN.pack(64 << 20) + b"\0" * (1 << 20))
                conns.append(c)
            assert all([await c.closed_by_peer() for c in conns])
            for c in conns:
                c.close()
            assert rss_kb(pid) - before < 20_000, (before, rss_kb(pid))
            assert any("exceeds the limit of 1024" in r for r in reasons())

            # a connection that never says hello is closed after the handshake timeout
            c = await RawConn.open(addr)
            assert await c.closed_by_peer(timeout=5)
            c.close()
            assert any("no complete hello within handshake_timeout_s = 1" in r for r in reasons())

            # a client that says hello and then nothing is closed after the idle timeout
            c = await RawConn.open(addr)
            c.send(b"C")
            assert await c.closed_by_peer(timeout=6)
            c.close()
            assert any("idle_timeout_s = 1.5" in r for r in reasons())

            # unfinished handshakes beyond the limit are refused at once
            conns = [await RawConn.open(addr) for _ in range(14)]
            closed = await asyncio.gather(*(c.closed_by_peer(timeout=0.5) for c in conns))
            assert sum(closed) >= 4, closed
            for c in conns:
                c.close()
            assert any("max_pending_handshakes = 10" in r for r in reasons())

            # connections beyond max_connections are refused at once; the node serves again after
            await asyncio.sleep(0.2)
            conns = []
            for _ in range(36):
                c = await RawConn.open(addr)
                c.send(b"C")
                conns.append(c)
                await asyncio.sleep(0.005)
            closed = await asyncio.gather(*(c.closed_by_peer(timeout=0.5) for c in conns))
            assert 6 <= sum(closed) <= 12, closed
            for c in conns:
                c.close()
            assert any("max_connections = 30" in r for r in reasons())

            # partly sent frames of all connections together are capped by max_buffered_bytes
            await asyncio.sleep(0.3)  # let the node see the closes above
            conns = []
            for _ in range(2):
                c = await RawConn.open(addr)
                c.send(b"C")
                c.writer.write(_LEN.pack((2 << 20) - 64) + b"\0" * (1800 << 10))
                conns.append(c)
            closed = await asyncio.gather(*(c.closed_by_peer(timeout=1.0) for c in conns))
            assert any(closed), closed
            for c in conns:
                c.close()
            assert any("max_buffered_bytes" in r for r in reasons()), reasons()[-5:]

            # the node still serves; and a read asking for max_bytes=0 gets at most max_read_bytes
            async with LedgerClient([addr]) as client:
                first, _ = await client.append_batch([b"r" * 1000] * 40)
                got = await client.read(first, first + 39, max_bytes=0)
            assert 1 <= len(got) < 40 and sum(len(e.raw) for e in got) <= 8192 + 1100

        asyncio.run(scenario())
    finally:
        cluster.stop()


# ---------------------------------------------------------------------- TLS


def make_ca_and_cert(d: Path, hosts: list[str]) -> dict[str, str]:
    """A throwaway CA and one node certificate for the given IP addresses (PEM files in ``d``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ledger test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ledger node")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(h)) for h in hosts]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    d.mkdir(parents=True, exist_ok=True)
    files = {"tls_ca_file": d / "ca.pem", "tls_cert_file": d / "node.pem", "tls_key_file": d / "node.key"}
    files["tls_ca_file"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["tls_cert_file"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files["tls_key_file"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return {k: str(v) for k, v in files.items()}


@pytest.mark.slow
def test_tls_group_serves_tls_clients_and_refuses_plain_and_untrusted_ones(tmp_path):
    pytest.importorskip("cryptography")
    tls = make_ca_and_cert(tmp_path / "pki", ["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    other = make_ca_and_cert(tmp_path / "other-pki", ["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    cluster = LocalCluster(tmp_path / "group", 3, settings=tls)
    cluster.start()
    try:

        async def scenario() -> None:
            await cluster.wait_for_leader()
            async with LedgerClient(cluster.addresses, ssl=cluster.client_ssl) as client:
                index, _ = await client.append(b"over tls")
                await wait_all_commit(client, cluster, index)
                for nid in cluster.ids:
                    got = await client.read(index, index, address=cluster.address(nid))
                    assert bytes(got[0].data) == b"over tls"
            async with LedgerClient(cluster.addresses, timeout=1.5, attempt_timeout=0.5) as plain:
                with pytest.raises(LedgerError):
                    await plain.status(cluster.address("n1"))
            untrusted = client_context(other["tls_ca_file"])
            async with LedgerClient(cluster.addresses, timeout=1.5, attempt_timeout=0.5, ssl=untrusted) as c:
                with pytest.raises((LedgerError, OSError)):
                    await c.status(cluster.address("n1"))

        asyncio.run(scenario())
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "ledger",
                "--tls-ca",
                tls["tls_ca_file"],
                "status",
                "--nodes",
                cluster.address("n1"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0 and json.loads(out.stdout)[cluster.address("n1")]["id"] == "n1", out
    finally:
        cluster.stop()


# ---------------------------------------------------------------------- client authentication


@pytest.mark.slow
def test_client_auth_refuses_clients_without_the_secret(tmp_path):
    cluster = LocalCluster(tmp_path, 1, settings={"client_auth": True})
    cluster.start()
    addr = cluster.address("n1")
    secret_file = cluster.settings["cluster_secret_file"]
    try:

        async def scenario() -> None:
            await cluster.wait_for_leader()  # LocalCluster's own client proves the secret
            async with LedgerClient([addr], timeout=1.5, attempt_timeout=0.5) as anonymous:
                with pytest.raises(LedgerError):
                    await anonymous.append(b"anonymous")
            async with LedgerClient([addr], timeout=1.5, attempt_timeout=0.5, secret=b"w" * 20) as wrong:
                with pytest.raises(LedgerError, match="does not match our cluster secret"):
                    await wrong.status(addr)
            c = await RawConn.open(addr)  # the forged request never reaches the handler
            c.send(b"C", b"\x01" + bytes(40))
            assert await c.closed_by_peer()
            c.close()
            async with LedgerClient([addr], secret=cluster.client_secret) as good:
                index, _ = await good.append(b"authenticated")
                assert bytes((await good.read(index, index))[0].data) == b"authenticated"

        asyncio.run(scenario())
        lines = refusals(cluster, "n1")
        assert any("client did not authenticate" in m and "client_auth = true" in m for m in lines), lines
        assert any("refused client from 127.0.0.1:" in m and "hung up" in m for m in lines), lines

        def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "ledger", *args],
                capture_output=True,
                text=True,
                timeout=60,
                env={k: v for k, v in (env or os.environ).items() if not k.startswith("LEDGER_")},
            )

        out = cli("--secret-file", secret_file, "append", "--nodes", addr, "from-cli")
        assert out.returncode == 0 and json.loads(out.stdout)["first_index"] > 0, out
        out = cli("append", "--nodes", addr, "anonymous")
        assert out.returncode != 0 and "Traceback" not in out.stderr, out
    finally:
        cluster.stop()


def test_max_connections_is_fitted_to_the_open_file_limit(tmp_path):
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (400, 400))

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledger", "start", "--id", "n1", "--listen", addr, "--peers", f"n1={addr}"]
        + ["--data-dir", str(tmp_path / "d")],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=low_limit,
    )
    try:
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline:
            line = proc.stderr.readline() if proc.stderr else ""
            if not line:
                break
            seen.append(line)
            if "ledger node started" in line:
                break
        assert any("max_connections = 1024 does not fit the open-file limit 400" in ln for ln in seen), seen
        assert any("accepting at most 144 connections" in ln for ln in seen), seen
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_secret_rotation_dialer_accepts_either_secret():
    old, new = b"the-old-cluster-secret-0001", b"the-new-cluster-secret-0002"

    def connects(dialer: PeerAuth, listener: PeerAuth) -> bool:
        hello, nonce = dialer.hello("n1", "n2", 0)
        _, _, challenge, hs = listener.challenge(hello)
        try:
            proof, _ = dialer.answer_challenge("n1", "n2", nonce, challenge, 0)
            PeerAuth.check_proof(hs, proof)
        except AuthError:
            return False
        return True

    mid = [PeerAuth(old, (new,)), PeerAuth(new, (old,))]  # the states a rolling rotation passes through
    assert all(connects(a, b) for a in mid for b in mid)
    assert connects(PeerAuth(new, (old,)), PeerAuth(old))
    assert not connects(PeerAuth(new), PeerAuth(old)) and not connects(PeerAuth(old), PeerAuth(new))


@pytest.mark.slow
def test_a_group_in_the_middle_of_a_secret_rotation_works(tmp_path):
    cluster = LocalCluster(tmp_path, 3)
    old = cluster.settings["cluster_secret_file"]
    new = tmp_path / "new.secret"
    new.write_text("the-new-cluster-secret-0123456789\n")
    cluster.write_configs()
    for nid in cluster.ids:  # n1 has switched to the new secret; n2 and n3 only accept it so far
        cfg = cluster.config_path(nid)
        text = cfg.read_text()
        if nid == "n1":
            text = text.replace(old, str(new)) + f'cluster_secret_accepted_file = "{old}"\n'
        else:
            text += f'cluster_secret_accepted_file = "{new}"\n'
        cfg.write_text(text)
        cluster.start_node(nid)
    # Clients in the middle of the rotation accept both secrets, as n1 does from its peers:
    # with only the old one they could never see a leader n1.
    cluster.client_accepted_secrets = (new.read_bytes().rstrip(b"\n"),)
    try:

        async def scenario() -> None:
            await cluster.wait_for_leader()
            async with LedgerClient(cluster.addresses) as client:
                index, _ = await client.append(b"during rotation")
                await wait_all_commit(client, cluster, index)

        asyncio.run(scenario())
        for nid in cluster.ids:
            peers_refused = [m for m in refusals(cluster, nid) if m.startswith("refused peer")]
            assert peers_refused == [], (nid, peers_refused)
    finally:
        cluster.stop()
