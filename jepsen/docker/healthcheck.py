"""Container healthcheck: ``python -m jepsen.docker.healthcheck {namesrv|broker} [host:port]``.

An open port is not enough to call a server healthy (the listener opens before the
nameserver tables or the broker's store are ready), so the check asks a real question over
the remoting protocol: a nameserver must answer GET_BROKER_CLUSTER_INFO, a broker
GET_BROKER_RUNTIME_INFO. A broker is healthy as master or slave: a group with no master yet
is the normal start of an election, and the tests wait for the master separately.
Exit status 0 = healthy, 1 = not (Docker's convention); one line says why.
"""

from __future__ import annotations

import asyncio
import json
import sys

DEFAULT_ADDR = {"namesrv": "127.0.0.1:9876", "broker": "127.0.0.1:10911"}


async def check(kind: str, addr: str, timeout_s: float = 2.0) -> str:
    """Return a short status line, or raise if the server does not answer as it should."""
    from client.instance import make_signer
    from remoting import RemotingClient, RemotingCommand, RequestCode

    code = RequestCode.GET_BROKER_CLUSTER_INFO if kind == "namesrv" else RequestCode.GET_BROKER_RUNTIME_INFO
    # signs with LEDGERMQ_ACCESS_KEY/LEDGERMQ_SECRET_KEY when set (docker-compose sets them): a broker
    # with ACL on refuses unsigned requests
    async with RemotingClient(name="healthcheck", rpc_hook=make_signer()) as client:
        resp = await client.invoke_sync(addr, RemotingCommand.request(code), timeout_s)
    if not resp.is_success:
        raise RuntimeError(f"{kind} at {addr} answered code {resp.code}: {resp.remark}")
    if kind == "broker":
        info = json.loads(bytes(resp.body))
        return f"broker {info.get('brokerAddr')} {info.get('role')} (master {info.get('masterAddr')})"
    return f"namesrv at {addr} answers"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in DEFAULT_ADDR:
        print("usage: python -m jepsen.docker.healthcheck {namesrv|broker} [host:port]", file=sys.stderr)
        return 2
    kind = args[0]
    addr = args[1] if len(args) > 1 else DEFAULT_ADDR[kind]
    try:
        print(asyncio.run(asyncio.wait_for(check(kind, addr), 5.0)))
    except Exception as exc:  # noqa: BLE001 - any failure means "unhealthy"; say which
        print(f"unhealthy: {kind} at {addr}: {type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
