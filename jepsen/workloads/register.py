"""The ``register`` workload: read, write and compare-and-set on a few keys, checked for linearizability per key."""

from __future__ import annotations

import asyncio
from typing import Any

from jepsen.systems.clients import ClientSource, RegisterClient, RegisterReplica
from jepsen.workloads.base import RunContext, Workload, attempt


class RegisterWorkload(Workload):
    """Read / write / compare-and-set on a few keys, checked for linearizability per key."""

    name = "register"
    checker = "register"
    wraps = "register"

    def __init__(self, backend: ClientSource, ctx: RunContext, keys: int = 3, values: int = 5) -> None:
        super().__init__(backend, ctx)
        self.keys = [f"r{i}" for i in range(keys)]
        self.values = values
        self.replicas: list[RegisterReplica] = []

    def client(self, replica: RegisterReplica) -> RegisterClient:
        c = self.backend.register_client(replica)
        return self.ctx.wrap_register_client(c) if self.ctx.wrap_register_client else c

    async def _one(self, proc: int, client: RegisterClient, f: str, key: str) -> str:
        h, ctx, rng = self.ctx.history, self.ctx, self.ctx.rng
        if f == "read":
            h.invoke(proc, "read", None, key=key)
            typ, val, err = await attempt(ctx, client.read(key))
            h.complete(proc, typ, "read", val if typ == "ok" else None, key=key, error=err, node=client.node)
        elif f == "write":
            v = rng.randrange(self.values)
            h.invoke(proc, "write", v, key=key)
            typ, _, err = await attempt(ctx, client.write(key, v))
            h.complete(proc, typ, "write", v, key=key, error=err, node=client.node)
        else:
            old, new = rng.randrange(self.values), rng.randrange(self.values)
            h.invoke(proc, "cas", [old, new], key=key)
            typ, applied, err = await attempt(ctx, client.cas(key, old, new))
            if typ == "ok" and not applied:
                typ, err = "fail", "current value differs from the expected one"
            h.complete(proc, typ, "cas", [old, new], key=key, error=err, node=client.node)
        return typ

    async def worker(self, w: int) -> None:
        h, ctx = self.ctx.history, self.ctx
        replica = self.backend.register_replica()
        self.replicas.append(replica)
        proc = h.new_process()
        client = self.client(replica)
        try:
            while not ctx.done():
                await ctx.pace(w)
                if ctx.done():
                    break
                f = ctx.rng.choices(("read", "write", "cas"), (0.4, 0.3, 0.3))[0]
                typ = await self._one(proc, client, f, ctx.rng.choice(self.keys))
                if typ == "info":
                    proc = h.new_process()
                    await client.close()
                    client = self.client(replica)
        finally:
            await client.close()

    async def final(self) -> None:
        """One read per key once healed: the final state, linearized with everything else."""
        replica = self.backend.register_replica()
        self.replicas.append(replica)
        client = self.client(replica)
        try:
            for key in self.keys:
                for _ in range(5):
                    proc = self.ctx.history.new_process()
                    if await self._one(proc, client, "read", key) == "ok":
                        break
                    await asyncio.sleep(0.5)
        finally:
            await client.close()

    def summary(self) -> dict[str, Any]:
        mism = [m for r in self.replicas for m in r.ack_mismatches]
        return {"ack_mismatches": len(mism), "ack_mismatch_examples": mism[:5]}
