"""How long a restarted broker takes to rebuild its state: a whole replay vs a checkpoint plus the tail.

A single-member embedded ledger (real files, fsync) gets ``--messages`` messages, in batch
entries of ``--batch`` records to ``--queues`` queues, each with its own UNIQ_KEY (as
producers send them). The store checkpoints (``broker.checkpoint``) once ``--tail``
messages before the end; then the broker is restarted twice on the same files:

* replay: no checkpoint, the whole retained log is applied (what a restart did before);
* checkpoint: the checkpoint is loaded and only the tail is applied.

For each: wall time from opening the store to ``caught_up`` (includes the single member's
election), CPU seconds of the process over it, and entries applied. Also the checkpoint's
size, the copy on the event loop (capture) and the encode + write in a worker thread.

Usage: ``python bench/restart_bench.py [--messages N] [--tail N] [--quick]``. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker import checkpoint, codec  # noqa: E402
from broker.message_store import MessageStore  # noqa: E402
from broker.state import BrokerState  # noqa: E402
from common.process import free_port  # noqa: E402
from ledger.config import NodeConfig  # noqa: E402
from ledger.embed import EmbeddedLedger  # noqa: E402
from remoting.message import properties_to_bytes  # noqa: E402

ELECTION_POLLS = 2000
BODY = b"x" * 100


def node_config(data_dir: Path) -> NodeConfig:
    addr = f"127.0.0.1:{free_port()}"
    cfg = NodeConfig(id="n1", listen=addr, peers=[f"n1={addr}"], data_dir=str(data_dir), tick_ms=5)
    cfg.validate()
    return cfg


def batch_entry(first: int, count: int, queue_id: int) -> bytes:
    """One producer batch: ``count`` records to one queue, UNIQ_KEYs first..first+count-1."""
    return b"".join(
        codec.build_stored_record(
            b"BenchTopic",
            queue_id,
            BODY,
            properties_to_bytes({"UNIQ_KEY": f"7F000001{n:024X}"}),
            0,
            0,
            1,
            b"\x00" * 8,
            int(time.time() * 1000),
            b"\x00" * 8,
        )
        for n in range(first, first + count)
    )


async def open_store(cfg: NodeConfig, ckpt: Path | None) -> MessageStore:
    store = MessageStore(EmbeddedLedger(cfg), "bench", checkpoint_path=ckpt)
    await store.ledger.start()
    for _ in range(ELECTION_POLLS):
        if store.ledger.leader_ready:
            await store.caught_up()
            return store
        await asyncio.sleep(0.005)
    raise RuntimeError("the single member did not elect itself")


async def fill(cfg: NodeConfig, ckpt: Path, messages: int, tail: int, batch: int, queues: int) -> dict:
    store = await open_store(cfg, ckpt)
    try:
        sent = 0
        checkpointed = False
        while sent < messages:
            if not checkpointed and sent >= messages - tail:
                assert await store.write_checkpoint(force=True)
                checkpointed = True
            n = min(batch, messages - sent)
            entries = [batch_entry(sent + k * n, n, (sent // n + k) % queues) for k in range(8)]
            await store.append_async(entries)
            sent += 8 * n
        if not checkpointed:
            assert await store.write_checkpoint(force=True)
        stats = store.stats()
        return {
            "messages": stats["dispatched_messages"],
            "entries": stats["applied_index"],
            "dedup_keys": stats["dedup_keys"],
            "checkpoint_index": stats["checkpoint_index"],
            "checkpoint_bytes": stats["checkpoint_bytes"],
            "capture_ms": stats["checkpoint_capture_ms"],
            "encode_write_ms": stats["checkpoint_write_ms"],
        }
    finally:
        await store.ledger.stop()


async def restart(cfg: NodeConfig, ckpt: Path | None, compare: bool = False) -> dict:
    """Open the store again; with ``compare``, also check its state equals a whole replay's."""
    wall, cpu = time.perf_counter(), time.process_time()
    store = await open_store(cfg, ckpt)
    try:
        stats = store.stats()
        out: dict = {
            "wall_s": round(time.perf_counter() - wall, 3),
            "cpu_s": round(time.process_time() - cpu, 3),
            "applied_entries": stats["replayed_entries"],
            "load_ms": round(stats["checkpoint_load_ms"], 1),
        }
        if compare:
            whole = BrokerState()
            while whole.applied < store.state.applied:
                whole.apply(store.ledger.read_payloads(whole.applied + 1, store.state.applied))
            out["same_state"] = checkpoint.encode(whole) == checkpoint.encode(store.state)
        return out
    finally:
        await store.ledger.stop()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=900_000)
    ap.add_argument("--tail", type=int, default=50_000, help="messages written after the checkpoint")
    ap.add_argument("--batch", type=int, default=32, help="records per batch entry")
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="restarts of each kind, alternating")
    ap.add_argument("--quick", action="store_true", help="100k messages, 5k after the checkpoint")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    if args.quick:
        args.messages, args.tail = 100_000, 5_000
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        base = Path(tmp)
        cfg = node_config(base / "ledger")
        ckpt = base / checkpoint.CHECKPOINT_FILE
        t0 = time.perf_counter()
        filled = await fill(cfg, ckpt, args.messages, args.tail, args.batch, args.queues)
        print(f"filled in {time.perf_counter() - t0:.1f} s: {filled}", flush=True)
        runs: dict[str, list[dict]] = {"replay": [], "checkpoint": []}
        for _ in range(args.rounds):
            for kind in ("replay", "checkpoint"):
                # every restart appends its term's no-op: the checkpoint's tail grows by one entry
                got = await restart(cfg, ckpt if kind == "checkpoint" else None)
                runs[kind].append(got)
                print(kind, got, flush=True)
        same = (await restart(cfg, ckpt, compare=True))["same_state"]
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("wall_s", "cpu_s")} for k, v in runs.items()}
    print(
        json.dumps(
            {
                "bench": "restart",
                **filled,
                "tail_messages": args.tail,
                "replay_wall_s": med["replay"]["wall_s"],
                "replay_cpu_s": med["replay"]["cpu_s"],
                "replay_entries": runs["replay"][-1]["applied_entries"],
                "checkpoint_wall_s": med["checkpoint"]["wall_s"],
                "checkpoint_cpu_s": med["checkpoint"]["cpu_s"],
                "checkpoint_entries": runs["checkpoint"][-1]["applied_entries"],
                "checkpoint_load_ms": statistics.median(r["load_ms"] for r in runs["checkpoint"]),
                "same_state": same,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
