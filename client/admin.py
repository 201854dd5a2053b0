"""``ledgermq-admin``: RocketMQ's mqadmin for ledgermq (same command ideas, same short flags).

The nameserver list comes from ``-n/--namesrv`` or NAMESRV_ADDR (``host:port;host:port``).
Exit codes: 0 ok, 1 the operation failed (the message says why), 2 bad usage.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import click

from client.admin_api import AdminClient
from client.errors import ClientError
from client.instance import (
    ACCESS_KEY_ENV,
    SECRET_KEY_ENV,
    TLS_CA_FILE_ENV,
    TLS_CERT_FILE_ENV,
    TLS_ENABLE_ENV,
    TLS_KEY_FILE_ENV,
    ClientInstance,
)
from client.message_props import PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RETRY_TOPIC
from client.namesrv_client import NAMESRV_ADDR_ENV, parse_namesrv_addrs
from client.producer import Producer
from client.route import MessageQueue
from common.cluster_secret import load_cluster_secret
from common.settings import ConfigError
from remoting.exceptions import RemotingError
from remoting.message import Message
from remoting.route import MASTER_ID
from remoting.tls import client_ssl
from remoting.topic import perm_to_string

T = TypeVar("T")


class _Ctx:
    def __init__(
        self,
        namesrv: str | None,
        timeout_s: float,
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.namesrv = namesrv
        self.timeout_s = timeout_s
        self.access_key = access_key
        self.secret_key = secret_key
        self.tls = tls

    def run(self, work: Callable[[AdminClient], Awaitable[T]]) -> T:
        """Run one operation against a fresh AdminClient; failures become a one-line error, exit 1."""
        try:
            addrs = parse_namesrv_addrs(self.namesrv)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'-n' / '--namesrv'") from None
        if not addrs:
            raise click.UsageError(
                f"no nameserver address: pass -n host:port[;host:port] or set {NAMESRV_ADDR_ENV}"
            )

        async def main() -> T:
            instance = None
            if self.tls is not None:
                instance = ClientInstance(
                    addrs,
                    name="admin-cli",
                    access_key=self.access_key,
                    secret_key=self.secret_key,
                    tls=self.tls,
                )
            admin = AdminClient(
                addrs,
                timeout_s=self.timeout_s,
                access_key=self.access_key,
                secret_key=self.secret_key,
                instance=instance,
            )
            try:
                return await work(admin)
            finally:
                await admin.close()
                if instance is not None:
                    await instance.close()

        try:
            return asyncio.run(main())
        except (ClientError, RemotingError) as exc:
            raise click.ClickException(str(exc)) from None


pass_ctx = click.make_pass_decorator(_Ctx)


def _ts(ms: int) -> str:
    if ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def _body(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + body.hex()


def _print_message(m: Message, broker_name: str = "") -> None:
    rows = [
        ("Topic", m.topic),
        ("Broker Name", broker_name or "-"),
        ("Store Host", m.store_host or "-"),
        ("Born Host", m.born_host or "-"),
        ("Queue ID", m.queue_id),
        ("Queue Offset", m.queue_offset),
        ("CommitLog Offset", m.physical_offset),
        ("Ledger Index", m.physical_offset >> 16 if m.physical_offset >= 0 else -1),
        ("Msg ID", m.msg_id or "-"),
        ("Offset Msg ID", m.offset_msg_id or "-"),
        ("Tags", m.tags or "-"),
        ("Keys", " ".join(m.keys) or "-"),
        ("Properties", json.dumps(m.properties, sort_keys=True) if m.properties else "-"),
        ("Flag", m.flag),
        ("Born Timestamp", _ts(m.born_ms)),
        ("Store Timestamp", _ts(m.store_ms)),
        ("Reconsume Times", m.reconsume_times),
        ("Body Size", len(m.body)),
        ("Body", _body(m.body)),
    ]
    for name, value in rows:
        click.echo(f"{name + ':':<18}{value}")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _flatten(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(obj, dict):
        out: list[tuple[str, Any]] = []
        for k in sorted(obj):
            out.extend(_flatten(obj[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        out = []
        for i, x in enumerate(obj):
            out.extend(_flatten(x, f"{prefix}[{i}]"))
        return out
    return [(prefix, json.dumps(obj) if isinstance(obj, list | bool) or obj is None else obj)]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-n",
    "--namesrv",
    envvar=NAMESRV_ADDR_ENV,
    metavar="ADDRS",
    help=f"Nameserver addresses, ';'-separated (default: ${NAMESRV_ADDR_ENV}).",
)
@click.option("--timeout", type=float, default=5.0, show_default=True, help="Per-request timeout in seconds.")
@click.option(
    "--access-key", envvar=ACCESS_KEY_ENV, help=f"ACL access key; signs every request (env {ACCESS_KEY_ENV})."
)
@click.option(
    "--secret-key",
    envvar=SECRET_KEY_ENV,
    help=f"ACL secret key, with --access-key (env {SECRET_KEY_ENV}).",
)
@click.option(
    "--tls/--no-tls",
    "tls_enable",
    envvar=TLS_ENABLE_ENV,
    default=False,
    help=f"Dial nameservers and brokers with TLS (env {TLS_ENABLE_ENV}).",
)
@click.option(
    "--tls-ca-file",
    envvar=TLS_CA_FILE_ENV,
    default="",
    help=f"CA that signed the servers' certificates (env {TLS_CA_FILE_ENV}; default: system CAs).",
)
@click.option("--tls-cert-file", envvar=TLS_CERT_FILE_ENV, default="", help="Client certificate (PEM).")
@click.option("--tls-key-file", envvar=TLS_KEY_FILE_ENV, default="", help="Client certificate's key (PEM).")
@click.pass_context
def main(
    ctx: click.Context,
    namesrv: str | None,
    timeout: float,
    access_key: str | None,
    secret_key: str | None,
    tls_enable: bool,
    tls_ca_file: str,
    tls_cert_file: str,
    tls_key_file: str,
) -> None:
    """Administer a ledgermq cluster: topics, routes, brokers, group members, messages, consumer offsets."""
    if bool(access_key) != bool(secret_key):
        raise click.UsageError("--access-key and --secret-key go together (or neither)")
    try:
        tls = client_ssl(tls_enable, tls_ca_file, tls_cert_file, tls_key_file)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    ctx.obj = _Ctx(namesrv, timeout, access_key or None, secret_key or None, tls)


# --- topics ---------------------------------------------------------------------------------------
@main.command("update-topic")
@click.option("-t", "--topic", required=True)
@click.option("-c", "--cluster", help="Create on every group of this cluster.")
@click.option("-b", "--broker-addr", help="Create on this broker (host:port) only.")
@click.option("-r", "--read-queue-nums", type=click.IntRange(0, 1024), default=8, show_default=True)
@click.option("-w", "--write-queue-nums", type=click.IntRange(0, 1024), default=8, show_default=True)
@click.option("-p", "--perm", type=click.IntRange(0, 15), default=6, show_default=True, help="2=W 4=R 6=RW.")
@pass_ctx
def update_topic(
    ctx: _Ctx,
    topic: str,
    cluster: str | None,
    broker_addr: str | None,
    read_queue_nums: int,
    write_queue_nums: int,
    perm: int,
) -> None:
    """Create or update a topic (on each group's master; every group when neither -c nor -b is given)."""
    if cluster and broker_addr:
        raise click.UsageError("give -c/--cluster or -b/--broker-addr, not both")
    results = ctx.run(
        lambda a: a.update_topic(
            topic,
            read_queue_nums=read_queue_nums,
            write_queue_nums=write_queue_nums,
            perm=perm,
            cluster=cluster,
            broker_addr=broker_addr,
        )
    )
    failed = 0
    for r in results:
        where = f"{r.broker_name or '-'} {r.addr or '-'}"
        if r.ok:
            click.echo(
                f"create topic to {where} success: {topic} r={read_queue_nums} w={write_queue_nums} perm={perm_to_string(perm)}"
            )
        else:
            failed += 1
            click.echo(f"create topic to {where} FAILED: {r.error}", err=True)
    if failed:
        raise click.ClickException(f"topic {topic}: {failed} of {len(results)} broker groups failed")


@main.command("topic-route")
@click.option("-t", "--topic", required=True)
@pass_ctx
def topic_route(ctx: _Ctx, topic: str) -> None:
    """Print a topic's route as the nameserver has it (JSON)."""
    route = ctx.run(lambda a: a.topic_route(topic))
    click.echo(json.dumps(route.to_json(), indent=2, sort_keys=True))


@main.command("topic-list")
@pass_ctx
def topic_list(ctx: _Ctx) -> None:
    """List every topic the nameserver knows."""
    for t in ctx.run(lambda a: a.topic_list()):
        click.echo(t)


@main.command("topic-status")
@click.option("-t", "--topic", required=True)
@pass_ctx
def topic_status(ctx: _Ctx, topic: str) -> None:
    """Per queue of a topic: min and max offset and when its last message was stored (mqadmin topicStatus)."""
    table = ctx.run(lambda a: a.topic_stats(topic))
    rows = [
        (q.broker_name, q.queue_id, o.min_offset, o.max_offset, _ts(o.last_update_timestamp))
        for q, o in sorted(table.items())
    ]
    _table(("#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated"), rows)


# --- cluster and brokers ------------------------------------------------------------------------------
@main.command("cluster-list")
@click.option("-c", "--cluster", help="Only this cluster.")
@pass_ctx
def cluster_list(ctx: _Ctx, cluster: str | None) -> None:
    """Broker groups and their members (broker id 0 is the master)."""
    info = ctx.run(lambda a: a.cluster_info())
    rows = []
    for cname in sorted(info.cluster_addr_table):
        if cluster and cname != cluster:
            continue
        for bname in sorted(info.cluster_addr_table[cname]):
            bd = info.broker_addr_table.get(bname)
            if bd is None:
                continue
            for bid, addr in sorted(bd.broker_addrs.items()):
                rows.append((cname, bname, bid, "MASTER" if bid == MASTER_ID else "SLAVE", addr))
    if cluster and not rows:
        raise click.ClickException(f"cluster {cluster} has no brokers registered")
    _table(("#Cluster", "#BrokerName", "#BID", "#Role", "#Addr"), rows)


@main.command("broker-status")
@click.option("-b", "--broker-addr", help="Broker address host:port.")
@click.option("-c", "--cluster", help="Every member of every group of this cluster.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@pass_ctx
def broker_status(ctx: _Ctx, broker_addr: str | None, cluster: str | None, as_json: bool) -> None:
    """A broker's runtime info (role, ledger status, queue offsets...)."""
    if bool(broker_addr) == bool(cluster):
        raise click.UsageError("give exactly one of -b/--broker-addr or -c/--cluster")

    async def work(a: AdminClient) -> list[tuple[str, dict[str, Any] | str]]:
        if broker_addr:
            return [(broker_addr, await a.broker_runtime_info(broker_addr))]
        groups = await a.broker_groups(cluster)
        addrs = [addr for bd in groups.values() for _bid, addr in sorted(bd.broker_addrs.items())]

        async def one(addr: str) -> tuple[str, dict[str, Any] | str]:
            try:
                return addr, await a.broker_runtime_info(addr)
            except (ClientError, RemotingError) as exc:
                return addr, f"ERROR: {exc}"

        return list(await asyncio.gather(*(one(x) for x in addrs)))

    results = ctx.run(work)
    if as_json:
        click.echo(json.dumps({addr: info for addr, info in results}, indent=2, sort_keys=True))
        return
    for i, (addr, info) in enumerate(results):
        if len(results) > 1:
            click.echo(("\n" if i else "") + f"== {addr}")
        if isinstance(info, str):
            click.echo(info)
            continue
        for key, value in _flatten(info):
            click.echo(f"{key:<36}: {value}")


# --- messages -----------------------------------------------------------------------------------------
@main.command("send-message")
@click.option("-t", "--topic", required=True)
@click.option("-p", "--body", required=True, help="Message body (UTF-8).")
@click.option("-k", "--keys", default="", help="Space-separated keys.")
@click.option("-c", "--tags", default=None, help="Tag.")
@click.option("-b", "--broker-name", default=None, help="Send to this broker group (with -i).")
@click.option("-i", "--queue-id", type=int, default=None)
@click.option(
    "--count", type=click.IntRange(1, 100_000), default=1, show_default=True, help="Send it this many times."
)
@click.option("-g", "--group", default="ledgermq-admin-producer", show_default=True)
@click.option("--idempotent", is_flag=True, help="Use an idempotent producer.")
@pass_ctx
def send_message(
    ctx: _Ctx,
    topic: str,
    body: str,
    keys: str,
    tags: str | None,
    broker_name: str | None,
    queue_id: int | None,
    count: int,
    group: str,
    idempotent: bool,
) -> None:
    """Send a message and print where it was stored."""
    if broker_name is not None and queue_id is None:
        raise click.UsageError("-b/--broker-name needs -i/--queue-id")

    async def work(a: AdminClient) -> list[Any]:
        producer = Producer(group, idempotent=idempotent, send_timeout_s=ctx.timeout_s, instance=a.instance)
        await producer.start()
        try:
            out = []
            for _ in range(count):
                msg = Message(topic, body.encode(), tags=tags, keys=keys.split())
                if broker_name is not None:
                    out.append(
                        await producer.send(msg, queue=MessageQueue(topic, broker_name, queue_id or 0))
                    )
                else:
                    out.append(await producer.send(msg, queue_id))
            return out
        finally:
            await producer.shutdown()

    results = ctx.run(work)
    _table(
        ("#Broker", "#QID", "#Offset", "#MsgId", "#Status", "#Duplicate"),
        [(r.broker_name, r.queue_id, r.queue_offset, r.msg_id, r.status.value, r.duplicate) for r in results],
    )


@main.command("consume-message")
@click.option("-t", "--topic", required=True)
@click.option("-b", "--broker-name", default=None, help="Only this broker group.")
@click.option("-i", "--queue-id", type=int, default=None, help="Only this queue.")
@click.option(
    "-o", "--offset", type=click.IntRange(0), default=None, help="Start offset (default: each queue's min)."
)
@click.option(
    "-c", "--count", type=click.IntRange(1), default=128, show_default=True, help="Print at most this many."
)
@click.option(
    "-g", "--group", default="ledgermq-admin", show_default=True, help="Group (offsets are not committed)."
)
@pass_ctx
def consume_message(
    ctx: _Ctx,
    topic: str,
    broker_name: str | None,
    queue_id: int | None,
    offset: int | None,
    count: int,
    group: str,
) -> None:
    """Print messages of a topic by pulling from explicit offsets (nothing is committed)."""

    async def work(a: AdminClient) -> int:
        queues = [
            q
            for q in await a.fetch_queues(topic)
            if (broker_name is None or q.broker_name == broker_name)
            and (queue_id is None or q.queue_id == queue_id)
        ]
        if not queues:
            raise ClientError(
                f"topic {topic} has no queue matching broker={broker_name or '*'} queue={queue_id if queue_id is not None else '*'}"
            )
        printed = 0
        for q in queues:
            pos = offset if offset is not None else await a.min_offset(q)
            while printed < count:
                result = await a.pull(q, pos, min(32, count - printed), 0)
                if not result.messages:
                    break
                for m in result.messages:
                    click.echo(
                        f"{q.broker_name} queue={m.queue_id} offset={m.queue_offset} msgId={m.msg_id} "
                        f"tags={m.tags or '-'} keys={' '.join(m.keys) or '-'} body={_body(m.body)}"
                    )
                    printed += 1
                pos = result.next_begin_offset
        return printed

    n = ctx.run(work)
    click.echo(f"{n} message(s)", err=True)


@main.command("query-msg-by-offset")
@click.option("-t", "--topic", required=True)
@click.option("-b", "--broker-name", required=True)
@click.option("-i", "--queue-id", type=int, required=True)
@click.option("-o", "--offset", type=click.IntRange(0), required=True)
@pass_ctx
def query_msg_by_offset(ctx: _Ctx, topic: str, broker_name: str, queue_id: int, offset: int) -> None:
    """Show the message at one queue offset."""
    m = ctx.run(lambda a: a.message_at(MessageQueue(topic, broker_name, queue_id), offset))
    if m is None:
        raise click.ClickException(f"no message at offset {offset} of {topic}@{broker_name}:{queue_id}")
    _print_message(m, broker_name)


@main.command("query-msg-by-id")
@click.option("-i", "--msg-id", required=True, help="Message id (<broker name>:<hex ledger index>).")
@pass_ctx
def query_msg_by_id(ctx: _Ctx, msg_id: str) -> None:
    """Show a message by id."""
    _print_message(ctx.run(lambda a: a.view_message(msg_id)))


@main.command("query-msg-by-key")
@click.option("-t", "--topic", required=True)
@click.option("-k", "--key", required=True)
@click.option("-m", "--max-num", type=click.IntRange(1, 1000), default=32, show_default=True)
@pass_ctx
def query_msg_by_key(ctx: _Ctx, topic: str, key: str, max_num: int) -> None:
    """List messages of a topic carrying a key."""
    msgs = ctx.run(lambda a: a.query_message_by_key(topic, key, max_num))
    _table(
        ("#MsgId", "#QID", "#Offset", "#Tags", "#Keys", "#Stored"),
        [
            (m.msg_id, m.queue_id, m.queue_offset, m.tags or "-", " ".join(m.keys), _ts(m.store_ms))
            for m in msgs
        ],
    )


@main.command("get-consumer-offset")
@click.option("-g", "--group", required=True)
@click.option("-t", "--topic", required=True)
@pass_ctx
def get_consumer_offset(ctx: _Ctx, group: str, topic: str) -> None:
    """Per queue: the broker's max offset, the group's committed offset and the lag."""
    progress = ctx.run(lambda a: a.consumer_progress(group, topic))
    rows = []
    total = 0
    for p in sorted(progress, key=lambda p: p.queue):
        lag = p.lag
        total += lag or 0
        rows.append(
            (
                p.queue.broker_name,
                p.queue.queue_id,
                "-" if p.broker_offset is None else p.broker_offset,
                "-" if p.consumer_offset is None else p.consumer_offset,
                "-" if lag is None else lag,
                p.error,
            )
        )
    _table(("#Broker", "#QID", "#BrokerOffset", "#ConsumerOffset", "#Diff", "#Error"), rows)
    click.echo(f"Diff Total: {total}")


@main.command("consumer-progress")
@click.option("-g", "--group", required=True)
@click.option(
    "-t",
    "--topic",
    default=None,
    help="Only this topic (default: every topic the group committed offsets of).",
)
@pass_ctx
def consumer_progress(ctx: _Ctx, group: str, topic: str | None) -> None:
    """Per queue: broker offset, the group's offset, the lag and the store time of the last
    message it consumed, then its consume rate and total lag (mqadmin consumerProgress)."""
    stats = ctx.run(lambda a: a.consume_stats(group, topic))
    rows = [
        (
            q.topic,
            q.broker_name,
            q.queue_id,
            o.broker_offset,
            o.consumer_offset,
            o.diff,
            _ts(o.last_timestamp),
        )
        for q, o in sorted(stats.offsets.items())
    ]
    _table(
        ("#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff", "#LastTime"), rows
    )
    click.echo(f"Consume TPS: {stats.consume_tps:.2f}")
    click.echo(f"Diff Total: {stats.diff_total}")


# --- retries, delays, transactions ---------------------------------------------------------------------
def _masters_work(
    cluster: str | None, broker_addr: str | None, fetch: Callable[[AdminClient, str], Awaitable[T]]
) -> Callable[[AdminClient], Awaitable[list[tuple[str, T | str]]]]:
    """Ask every master (of ``cluster``, or the one broker) with ``fetch``; errors per broker as text."""
    if cluster and broker_addr:
        raise click.UsageError("give -c/--cluster or -b/--broker-addr, not both")

    async def work(a: AdminClient) -> list[tuple[str, T | str]]:
        masters = await a.master_addrs(cluster, broker_addr)

        async def one(name: str, addr: str) -> tuple[str, T | str]:
            try:
                return name, await fetch(a, addr)
            except (ClientError, RemotingError) as exc:
                return name, f"ERROR: {exc}"

        return list(await asyncio.gather(*(one(n, x) for n, x in sorted(masters.items()))))

    return work


@main.command("retry-messages")
@click.option("-g", "--group", required=True, help="Consumer group.")
@click.option("--dlq", is_flag=True, help="The dead-letter topic %DLQ%<group> instead of %RETRY%<group>.")
@click.option("-c", "--count", type=click.IntRange(1, 100_000), default=128, show_default=True)
@pass_ctx
def retry_messages(ctx: _Ctx, group: str, dlq: bool, count: int) -> None:
    """Messages a consumer group sent back: waiting for a retry, or dead (--dlq); nothing is committed."""
    msgs = ctx.run(lambda a: a.group_messages(group, dead=dlq, max_num=count))
    _table(
        ("#Offset", "#QID", "#MsgId", "#Topic", "#Reconsume", "#Origin MsgId", "#Body"),
        [
            (
                m.queue_offset,
                m.queue_id,
                m.msg_id,
                m.properties.get(PROPERTY_RETRY_TOPIC, "-"),
                m.reconsume_times,
                m.properties.get(PROPERTY_ORIGIN_MESSAGE_ID, "-"),
                _body(m.body)[:60],
            )
            for m in msgs
        ],
    )
    click.echo(f"{len(msgs)} message(s)", err=True)


@main.command("delay-offsets")
@click.option("-c", "--cluster", help="Every master of this cluster (default: every master).")
@click.option("-b", "--broker-addr", help="This broker only (host:port).")
@pass_ctx
def delay_offsets(ctx: _Ctx, cluster: str | None, broker_addr: str | None) -> None:
    """The delay schedule's progress per broker and level: delivered offset (GET_ALL_DELAY_OFFSET),
    the schedule queue's max offset and what is still waiting."""
    results = ctx.run(_masters_work(cluster, broker_addr, lambda a, addr: a.schedule_progress(addr)))
    rows: list[tuple[Any, ...]] = []
    for name, progress in results:
        if isinstance(progress, str):
            rows.append((name, "-", "-", "-", "-", progress))
            continue
        for p in progress:
            rows.append(
                (
                    name,
                    p.level,
                    p.delivered,
                    "-" if p.max_offset is None else p.max_offset,
                    "-" if p.pending is None else p.pending,
                    "",
                )
            )
    _table(("#Broker", "#Level", "#Delivered", "#Max Offset", "#Pending", "#Error"), rows)


@main.command("transaction-status")
@click.option("-c", "--cluster", help="Every master of this cluster (default: every master).")
@click.option("-b", "--broker-addr", help="This broker only (host:port).")
@pass_ctx
def transaction_status(ctx: _Ctx, cluster: str | None, broker_addr: str | None) -> None:
    """Half (transactional) messages not yet committed or rolled back, and scheduled (delayed)
    messages, per broker master, as its runtime info reports them."""
    results = ctx.run(_masters_work(cluster, broker_addr, lambda a, addr: a.transaction_status(addr)))
    for i, (name, status) in enumerate(results):
        click.echo(("\n" if i else "") + f"== {name}")
        if isinstance(status, str):
            click.echo(status)
        elif not status:
            click.echo("(the broker reports no transaction or schedule figures)")
        else:
            for key, value in _flatten(status):
                click.echo(f"{key:<36}: {value}")


# --- broker group membership -----------------------------------------------------------------------
CLUSTER_SECRET_FILE_ENV = "LEDGERMQ_CLUSTER_SECRET_FILE"


def _member_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--broker-addr",
        "via",
        metavar="HOST:PORT",
        help="A member of the group to ask first (when the nameservers list none of it).",
    )(f)
    return click.option("-b", "--broker-name", required=True, help="The broker group (e.g. broker-a).")(f)


def _secret_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--cluster-secret-file",
        envvar=CLUSTER_SECRET_FILE_ENV,
        metavar="FILE",
        help=f"The group's cluster secret (the brokers' cluster_secret_file): a change must prove it "
        f"(env {CLUSTER_SECRET_FILE_ENV}).",
    )(f)


def _read_secret(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        return load_cluster_secret("", path) or None
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="'--cluster-secret-file'") from None


def _print_members(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    rows = []
    for kind in ("voters", "learners"):
        for nid, m in (doc.get(kind) or {}).items():
            bid = m.get("brokerId")
            lag = m.get("lag")
            rows.append(
                (
                    nid,
                    str(m.get("role", "-")).upper(),
                    "-" if bid is None else bid,
                    m.get("brokerAddr") or "-",
                    m.get("ledgerAddr") or "-",
                    "-" if lag is None else lag,
                )
            )
    _table(("#Node", "#Role", "#BID", "#BrokerAddr", "#LedgerAddr", "#Lag"), rows)
    state = "committed" if doc.get("committed") else "not committed yet"
    click.echo(
        f"{doc.get('brokerName', '?')}: leader {doc.get('leader') or '-'}; configuration of log index "
        f"{doc.get('index')} ({state})"
    )


@main.command("member-list")
@_member_options
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@pass_ctx
def member_list(ctx: _Ctx, broker_name: str, via: str | None, as_json: bool) -> None:
    """A broker group's members, as its master sees them: role, broker id, addresses, lag."""
    _print_members(ctx.run(lambda a: a.group_members(broker_name, via=via)), as_json)


@main.command("member-add")
@_member_options
@_secret_option
@click.option("--no-promote", is_flag=True, help="Leave it a learner (member-promote later).")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(0, 600),
    default=60.0,
    show_default=True,
    help="Seconds to catch up.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.argument("member_spec", metavar="ID=BROKER_HOST:PORT[@LEDGER_HOST:PORT]")
@pass_ctx
def member_add(
    ctx: _Ctx,
    broker_name: str,
    via: str | None,
    cluster_secret_file: str | None,
    no_promote: bool,
    wait_s: float,
    as_json: bool,
    member_spec: str,
) -> None:
    """Add a broker started with --join to the group: a learner that catches up, then (unless
    --no-promote) a voter serving as slave. Its ledger address is asked of it unless given."""
    nid, sep, rest = member_spec.partition("=")
    baddr, _, laddr = rest.partition("@")
    if not sep or not nid or not baddr:
        raise click.BadParameter(
            f"expected ID=BROKER_HOST:PORT[@LEDGER_HOST:PORT], got {member_spec!r}", param_hint="MEMBER_SPEC"
        )
    secret = _read_secret(cluster_secret_file)
    doc = ctx.run(
        lambda a: a.add_member(
            broker_name,
            nid,
            baddr,
            laddr or None,
            secret=secret,
            promote=not no_promote,
            wait_s=wait_s,
            via=via,
        )
    )
    _print_members(doc, as_json)


@main.command("member-promote")
@_member_options
@_secret_option
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(0, 600),
    default=60.0,
    show_default=True,
    help="Seconds to catch up.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.argument("node_id", metavar="ID")
@pass_ctx
def member_promote(
    ctx: _Ctx,
    broker_name: str,
    via: str | None,
    cluster_secret_file: str | None,
    wait_s: float,
    as_json: bool,
    node_id: str,
) -> None:
    """Make a learner of the group a voter (a slave), once it has caught up."""
    secret = _read_secret(cluster_secret_file)
    _print_members(
        ctx.run(lambda a: a.promote_member(broker_name, node_id, secret=secret, wait_s=wait_s, via=via)),
        as_json,
    )


@main.command("member-remove")
@_member_options
@_secret_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.argument("node_id", metavar="ID")
@pass_ctx
def member_remove(
    ctx: _Ctx, broker_name: str, via: str | None, cluster_secret_file: str | None, as_json: bool, node_id: str
) -> None:
    """Remove a broker from the group (the nameservers drop its route); refused if the voters
    left that answer would not be a majority."""
    secret = _read_secret(cluster_secret_file)
    _print_members(ctx.run(lambda a: a.remove_member(broker_name, node_id, secret=secret, via=via)), as_json)


if __name__ == "__main__":  # pragma: no cover
    main()
