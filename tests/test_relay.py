"""The docker backend's delay relay (``jepsen.net.relay``) with real iptables rules, in a
network namespace of this test's own: what the scripts do inside a broker container."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jepsen.net import relay

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("iptables") or not shutil.which("ip"),
    reason="needs root, ip and iptables (a network namespace with NAT rules of its own)",
)

PEER = ("10.77.0.2", 20921)

ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(16)
import threading
def serve(c):
    while (d := c.recv(65536)):
        c.sendall(d)
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# one round trip on a new connection, or (with a file name) one before and one after the file appears
CLIENT = """
import os, socket, sys, time
def rtt(c):
    t = time.monotonic(); c.sendall(b"x" * 10); got = c.recv(64); assert got, "closed"
    return round((time.monotonic() - t) * 1000, 1)
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
print(rtt(c), flush=True)
if len(sys.argv) > 3:
    for _ in range(400):
        if os.path.exists(sys.argv[3]):
            break
        time.sleep(0.025)
    try:
        print(rtt(c), flush=True)
    except OSError as exc:
        print(type(exc).__name__, flush=True)
"""


def test_relay_slows_new_connections_resets_old_ones_and_heals(tmp_path: Path) -> None:
    ns = f"lmqrelay{os.getpid()}"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])

    def in_ns(*argv: str, **kw) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, env=env, timeout=30, **kw
        )

    def rtt_ms() -> float:
        out = in_ns(sys.executable, "-c", CLIENT, *map(str, PEER))
        assert out.returncode == 0, out.stderr
        return float(out.stdout.split()[0])

    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    started: list[subprocess.Popen[str]] = []
    try:
        for cmd in (
            "ip link set lo up",
            f"ip addr add {PEER[0]}/32 dev lo",  # the peer's address (a second one on loopback)
        ):
            assert in_ns(*cmd.split()).returncode == 0, cmd
        echo = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", ECHO, *map(str, PEER)], text=True
        )
        started.append(echo)
        for _ in range(100):  # bounded wait for the echo server
            if in_ns(sys.executable, "-c", CLIENT, *map(str, PEER)).returncode == 0:
                break
            time.sleep(0.05)
        assert rtt_ms() < 100

        # a connection opened before the fault, held across it
        go = tmp_path / "go"
        held = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, *map(str, PEER), str(go)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        started.append(held)
        assert held.stdout is not None
        assert float(held.stdout.readline()) < 100

        out = in_ns("sh", "-c", relay.install_script([PEER], delay_ms=150, jitter_ms=0, seed=1))
        assert out.returncode == 0, out.stdout + out.stderr
        go.touch()
        assert held.stdout.readline().strip() in ("ConnectionResetError", "ConnectionRefusedError")
        slow = [rtt_ms() for _ in range(3)]
        assert all(300 <= ms < 2000 for ms in slow), slow  # 150 ms each way, through the relay

        # installing again (a new seed, a restarted node) replaces the relay, not adds one
        out = in_ns("sh", "-c", relay.install_script([PEER], delay_ms=150, jitter_ms=0, seed=2))
        assert out.returncode == 0, out.stdout + out.stderr
        assert rtt_ms() >= 300

        out = in_ns("sh", "-c", relay.remove_script())
        assert out.returncode == 0, out.stdout + out.stderr
        assert rtt_ms() < 100
        assert not Path(relay.PID_FILE).exists()
        nat = in_ns("iptables", "-w", "-t", "nat", "-S", relay.NAT_CHAIN).stdout
        assert "REDIRECT" not in nat, nat
    finally:
        pids = subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30
        ).stdout.split()
        for pid in pids:  # the echo server and any relay left behind: this namespace's processes only
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, ValueError):
                pass
        for p in started:
            p.kill()
            p.wait(timeout=10)
        subprocess.run(["ip", "netns", "del", ns], timeout=30)
        Path(relay.PID_FILE).unlink(missing_ok=True)
