"""The cost of ledger peer security: the cluster-secret handshake, frame MACs, TLS.

Runs the same append load against a 3-process group in each mode, rotating which mode goes
first in each round, and reports throughput and the CPU time the three node processes
spent per 1,000 committed entries (utime + stime from /proc). The CPU figure is the robust
one on a shared machine: other people's load changes how fast the group goes, much less
how much work each entry costs. Modes:

- ``none``: no cluster secret (the baseline)
- ``handshake``: the secret proven on every connection, no frame MACs (the default)
- ``mac``: the handshake and an HMAC-SHA256 tag on every peer frame (``peer_frame_mac = true``)
- ``tls``: the handshake inside TLS (certificates from a throwaway CA made with ``openssl``)

    python bench/peer_auth_bench.py [--modes none,handshake,mac,tls] [--rounds N] [--seconds S]

Ends with one JSON line: medians per mode and each mode's cost against ``none`` in percent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from ledger.auth import FrameOpener, FrameSealer
from ledger.client import LedgerClient
from ledger.codec import Entry, decode_entries, encode_entries
from ledger.localcluster import LocalCluster
from ledger.messages import AppendRequest, decode_message, encode_message

ENTRY = b"x" * 1024
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


async def load(addresses: list[str], seconds: float, concurrency: int, batch: int, ssl: object = None) -> int:
    done = 0
    payloads = [ENTRY] * batch
    async with LedgerClient(addresses, timeout=10, ssl=ssl) as client:  # type: ignore[arg-type]
        await client.append(b"warm-up")
        end = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                try:
                    await client.append_batch(payloads)
                except Exception:  # noqa: BLE001 - a failed append simply does not count
                    continue
                done += batch

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def make_pki(d: Path) -> dict[str, str]:
    """A throwaway CA and one certificate for 127.0.0.1-3, made with the openssl command."""
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ca_key, ca, key, csr, cert = (
        str(d / n) for n in ("ca.key", "ca.pem", "node.key", "node.csr", "node.pem")
    )
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", ca_key,
        "-out", ca, "-days", "1", "-subj", "/CN=bench CA")  # fmt: skip
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
        "-subj", "/CN=ledger node")  # fmt: skip
    ext = d / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3\n")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "1",
        "-extfile", str(ext))  # fmt: skip
    return {"tls_ca_file": ca, "tls_cert_file": cert, "tls_key_file": key}


def settings_for(mode: str, pki: dict[str, str]) -> dict[str, object] | None:
    if mode == "none":
        return {"cluster_secret": ""}
    if mode == "handshake":
        return {"peer_frame_mac": False}
    if mode == "mac":
        return {"peer_frame_mac": True}
    if mode == "tls":
        return dict(pki)
    raise SystemExit(f"unknown mode {mode!r} (none, handshake, mac, tls)")


def one(mode: str, pki: dict[str, str], seconds: float, batch: int, concurrency: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="peer-auth-bench-") as d:
        cluster = LocalCluster(Path(d), 3, settings=settings_for(mode, pki))
        cluster.start()
        try:
            asyncio.run(cluster.wait_for_leader(30))
            pids = [cluster.pid(n) for n in cluster.ids]
            cpu0 = sum(cpu_seconds(p) for p in pids if p)
            t0 = time.perf_counter()
            entries = asyncio.run(load(cluster.addresses, seconds, concurrency, batch, cluster.client_ssl))
            elapsed = time.perf_counter() - t0
            cpu = sum(cpu_seconds(p) for p in pids if p) - cpu0
        finally:
            cluster.stop()
    return {"entries_per_s": entries / elapsed, "cpu_ms_per_1k_entries": 1e6 * cpu / max(entries, 1)}


def frame_costs(batch: int, repeat: int = 200) -> dict[str, float]:
    """Microseconds per entry that one leader->follower hop spends framing a batch, with and without MACs.

    Encoding on the leader plus decoding on the follower, in one process, so the figure does
    not depend on the machine's other load the way the group's throughput does.
    """
    entries = [Entry(i + 1, 1, ENTRY) for i in range(batch)]
    for e in entries:
        e.raw = None
    m = AppendRequest(1, "n1", "n2", 0, 0, 0, encode_and_reload(entries))
    out = {}
    for name, mac in (("plain", False), ("mac", True)):
        sealer, opener = (FrameSealer(b"k" * 32), FrameOpener(b"k" * 32)) if mac else (None, None)
        t0 = time.perf_counter()
        for _ in range(repeat):
            body = encode_message(m)
            if sealer is not None and opener is not None:
                decode_message(opener.open(body + sealer.tag(body)))
            else:
                decode_message(body)
        out[name] = 1e6 * (time.perf_counter() - t0) / (repeat * batch)
    return out


def encode_and_reload(entries: list[Entry]) -> list[Entry]:
    """Entries as a follower's store would hold them: encoded once, at their positions."""
    return decode_entries(encode_entries(entries, 0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="none,handshake,mac,tls")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="peer-auth-pki-") as pki_dir:
        pki = make_pki(Path(pki_dir)) if "tls" in modes else {}
        for r in range(args.rounds):
            for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
                res = one(mode, pki, args.seconds, args.batch, args.concurrency)
                results[mode].append(res)
                print(
                    f"round {r + 1}/{args.rounds} {mode:>9}: {res['entries_per_s']:,.0f} entries/s, "
                    f"{res['cpu_ms_per_1k_entries']:.1f} CPU ms per 1k entries",
                    flush=True,
                )
    summary: dict[str, float] = {}
    for mode in modes:
        for k in ("entries_per_s", "cpu_ms_per_1k_entries"):
            summary[f"{mode}_{k}"] = round(statistics.median(x[k] for x in results[mode]), 2)
    if "none" in modes:
        for mode in modes:
            if mode != "none":
                tput = summary[f"{mode}_entries_per_s"] / summary["none_entries_per_s"]
                cpu = summary[f"{mode}_cpu_ms_per_1k_entries"] / summary["none_cpu_ms_per_1k_entries"]
                summary[f"{mode}_throughput_cost_pct"] = round(100 * (1 - tput), 1)
                summary[f"{mode}_cpu_cost_pct"] = round(100 * (cpu - 1), 1)
    costs = frame_costs(args.batch)
    print(
        f"one hop, per entry: {costs['plain']:.2f} us framing without MAC, {costs['mac']:.2f} us with "
        f"(+{costs['mac'] - costs['plain']:.2f} us; a 3-node group makes two hops per entry)",
        flush=True,
    )
    summary["hop_us_per_entry_plain"] = round(costs["plain"], 3)
    summary["hop_us_per_entry_mac"] = round(costs["mac"], 3)
    summary["rounds"] = args.rounds
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
