"""Probes of what a broker group does with hostile input beyond the frame layer: its ledger
port without the cluster secret, an entry no replica can apply, a message at the size limit,
a compressed flag on a body that does not inflate, integers out of range and nesting past
any bound, ACL bypasses through the send headers and the message queries, floods of
heartbeats and topic creations, a trickle after one frame, pipelined pulls never read, and a
registration with a nameserver without the cluster proof.

Each probe takes every target and the limits, picks the listeners it applies to and returns
one row per attack (none when no listener of its kind was given); one that needs something
it was not given (the cluster secret, ACL accounts, a topic) raises ``NotRun`` saying what.
Each is registered by one line in ``suite.PROBES``.

These probes leave traces in a real group: messages in ``--topic``, topics named
``JepsenProbeBurst...``, heartbeat entries until they expire, and, with the cluster secret,
two entries in the commit log that every broker skips. Aim them at production with care.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import time
from typing import Any

from client.consumer import PullConsumer, PullStatus
from client.producer import Producer
from client.route import MessageQueue
from ledger.client import LedgerClient
from ledger.transport import HELLO_CLIENT
from ledger.wire import (
    CODE_NAMES,
    WireError,
    decode_response_head,
    encode_append,
    encode_read,
    encode_transfer,
)
from remoting import RemotingCommand, RequestCode, ResponseCode
from remoting.codes import response_code_name
from remoting.exceptions import ProtocolError
from remoting.message import Message, encode_message_batch
from remoting.protocol import FrameDecoder, encode_command

from .base import (
    BROKER,
    LEDGER,
    NAMESRV,
    REACTION_WAIT_S,
    Limits,
    LogWatch,
    NotRun,
    Row,
    Target,
    close_writer,
    closed_within,
    find_master,
    main_brokers,
    open_conn,
    pid_listening_on,
    reaction,
    rss_kib,
    rss_note,
    runtime_info,
    with_serving_check,
)

NOBODY = "jepsen-probe-nobody"  # a member id no group has: a transfer to it moves nothing
TRICKLE_INTERVAL_S = 0.1
NESTING = 100_000
UNAPPLIABLE = (
    b'\x02{"op":"snapshot","topics":[],"offsets":[]}',  # a metadata record of the wrong shape
    b"\x02" + b"[" * NESTING,  # a metadata record nested past any parser's stack
)
OUT_OF_RANGE: tuple[tuple[str, int, str], ...] = (
    ("flag", 1 << 64, "2^64"),
    ("sysFlag", 1 << 64, "2^64"),
    ("bornTimestamp", 1 << 64, "2^64"),
    ("queueId", 1 << 40, "2^40"),
)
CLEAR_REFUSALS = frozenset({ResponseCode.MESSAGE_ILLEGAL, ResponseCode.BAD_REQUEST})
#: requests in flight at once during the client flood: what a flood does (at 200 a 3-broker group
#: of the old O(n) heartbeat table slowed tenfold; at 1000 its master lost its leadership)
FLOOD_IN_FLIGHT = 1000
STEADY_SEND_INTERVAL_S = 0.02
STEADY_SEND_TIMEOUT_S = 5.0


def _send(topic: str, body: bytes, **headers: Any) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": topic, "queueId": 0, **headers}, body)


def _need_topic(limits: Limits) -> str:
    if not limits.topic:
        raise NotRun("needs --topic (a topic the probes may send to)")
    return limits.topic


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


async def _invoke(addr: str, limits: Limits, cmd: RemotingCommand, timeout: float = 10.0) -> RemotingCommand:
    async with limits.remoting_client("probe-broker") as rc:
        return await rc.invoke_sync(addr, cmd, timeout)


def _answer(resp: RemotingCommand) -> str:
    remark = f" ({resp.remark[:120]})" if resp.remark else ""
    return f"{response_code_name(resp.code)}{remark}"


# --- the ledger port ------------------------------------------------------------------------------


def _ledger_frame(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


async def _unauthenticated(t: Target, limits: Limits, request: bytes) -> str:
    """A client hello without the secret, then one request: 'refused' when the node hangs up
    without answering, 'answered <code>' (it took the client) or 'silent'."""
    try:
        reader, writer = await open_conn(t, limits)
    except (OSError, TimeoutError) as exc:
        return f"cannot connect: {exc}"
    try:
        writer.write(_ledger_frame(HELLO_CLIENT) + _ledger_frame(request))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        seen, data = await reaction(reader, REACTION_WAIT_S)
    finally:
        close_writer(writer)
    if seen != "answered":
        return "refused" if seen == "closed" else seen
    try:
        (length,) = struct.unpack_from("<I", data)
        _, code, _ = decode_response_head(data[4 : 4 + length])
    except (struct.error, WireError):
        return "answered"
    return f"answered {CODE_NAMES.get(code, code)}"


async def ledger_unauthenticated(targets: list[Target], limits: Limits) -> list[Row]:
    """A client without the cluster secret asks each ledger listener to read, to transfer the
    leadership and to append: a broker's ledger port must hang up on it before any of them.
    (The append is an empty entry, a no-op to a broker, in case a node takes it.)"""
    expected = "read, transfer-leadership and append without the secret: each refused (hung up)"
    rows = []
    for t in targets:
        if t.kind != LEDGER:
            continue
        if not limits.ledger_client_auth:
            rows.append(Row("ledger-no-secret", t.name, expected, "skipped: --ledger-open-to-clients", None))
            continue
        results = {
            "read": await _unauthenticated(t, limits, encode_read(1, 1, 1, 0, False)),
            "transfer": await _unauthenticated(t, limits, encode_transfer(1, NOBODY)),
            "append": await _unauthenticated(t, limits, encode_append(1, [b""])),
        }
        outcome = ", ".join(f"{op} {what}" for op, what in results.items())
        ok = all(what == "refused" for what in results.values())
        outcome, ok = await with_serving_check(t, limits, outcome, ok)
        rows.append(Row("ledger-no-secret", t.name, expected, outcome, ok))
    return rows


async def unappliable_entry(targets: list[Target], limits: Limits) -> list[Row]:
    """An insider (holding the cluster secret) appends entries no replica can apply, a snapshot
    of the wrong shape and a record nested 100,000 deep: every broker must skip and count them
    (skipped_entries) and the group must acknowledge a normal send afterwards."""
    ledgers = [t for t in targets if t.kind == LEDGER]
    if not ledgers or not main_brokers(targets):
        return []
    if limits.ledger_secret is None:
        raise NotRun("needs the cluster secret (--cluster-secret-file) to append as an insider")
    topic = _need_topic(limits)
    master, _ = await find_master(targets, limits)
    brokers = main_brokers(targets)
    expected = f"{len(UNAPPLIABLE)} entries no replica can apply skipped (skipped_entries) on every broker; a send after them acknowledged"
    watch = LogWatch(limits, [b.addr for b in brokers])
    before = {b.addr: await _skipped(b.addr, limits) for b in brokers}
    try:
        async with LedgerClient(
            [t.addr for t in ledgers], timeout=10.0, secret=limits.ledger_secret, ssl=limits.tls
        ) as insider:
            indexes = [(await insider.append(p))[0] for p in UNAPPLIABLE]
        resp = await _invoke(master.addr, limits, _send(topic, b"after entries no replica can apply"))
    except Exception as exc:  # noqa: BLE001 - the row says what failed
        return [Row("unappliable-entry", master.name, expected, _error(exc), False)]
    after = dict(before)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        after = {b.addr: await _skipped(b.addr, limits) for b in brokers}
        if all(_grew(before[a], after[a]) for a in after):
            break
        await asyncio.sleep(0.2)
    counts = ", ".join(f"{a}: {before[a]} -> {after[a]}" for a in after)
    log, log_ok = watch.note()
    outcome = f"appended at {indexes}; send after them {_answer(resp)}; skipped_entries {counts}; {log}"
    ok = resp.is_success and all(_grew(before[a], after[a]) for a in after) and log_ok
    outcome, ok = await with_serving_check(master, limits, outcome, ok)
    return [Row("unappliable-entry", master.name, expected, outcome, ok)]


async def _skipped(addr: str, limits: Limits) -> int | None:
    """A broker's count of entries it could not apply; None when it does not report one."""
    info = await runtime_info(addr, limits)
    value = (info or {}).get("store", {}).get("skipped_entries")
    return value if isinstance(value, int) else None


def _grew(before: int | None, after: int | None) -> bool:
    return before is not None and after is not None and after - before >= len(UNAPPLIABLE)


# --- what a broker stores: size, compression, numbers, nesting ------------------------------------


async def max_message(targets: list[Target], limits: Limits) -> list[Row]:
    """A message of exactly max_message_bytes, sent by our Producer and pulled back by our
    PullConsumer: what a broker acknowledges, its clients must be able to read."""
    if not main_brokers(targets):
        return []
    topic = _need_topic(limits)
    namesrvs = [t.addr for t in targets if t.kind == NAMESRV]
    if not namesrvs:
        raise NotRun("needs --namesrv (the producer and consumer find the broker through it)")
    size = limits.max_message_bytes
    expected = f"a message of exactly max_message_bytes ({size}) acknowledged and pulled back intact"
    body = os.urandom(size)  # incompressible, whatever a client does
    where = ",".join(t.addr for t in main_brokers(targets))
    producer_instance = limits.client_instance(";".join(namesrvs), "probe-max-message")
    consumer_instance = limits.client_instance(";".join(namesrvs), "probe-max-message-pull")
    try:
        async with Producer(
            "jepsen-probe-max-message",
            instance=producer_instance,
            retries=0,
            send_timeout_s=30,
            max_message_bytes=size,
        ) as producer:
            sent = await producer.send(Message(topic, body))
        where = sent.broker_addr or where
        queue = MessageQueue(topic, sent.broker_name, sent.queue_id)
        async with PullConsumer("jepsen-probe-max-message", instance=consumer_instance) as consumer:
            pulled = await consumer.pull(queue, sent.queue_offset, 1)
    except Exception as exc:  # noqa: BLE001 - the row says what failed
        return [Row("max-message", where, expected, _error(exc), False)]
    finally:
        await producer_instance.close()
        await consumer_instance.close()
    got = pulled.messages[0].body if pulled.status == PullStatus.FOUND and pulled.messages else None
    if got == body:
        outcome, ok = f"sent at {queue.queue_id}:{sent.queue_offset}, pulled back intact", True
    elif got is None:
        outcome, ok = f"sent at {queue.queue_id}:{sent.queue_offset}, pull {pulled.status.name}", False
    else:
        outcome, ok = f"pulled back {len(got)} bytes that differ", False
    brokers = [b for b in main_brokers(targets) if b.addr == where] or main_brokers(targets)[:1]
    outcome, ok = await with_serving_check(brokers[0], limits, outcome, ok)
    return [Row("max-message", brokers[0].name, expected, outcome, ok)]


async def compressed_body(targets: list[Target], limits: Limits) -> list[Row]:
    """SEND_MESSAGE with the compressed flag (sysFlag 1) on a body that is no zlib stream:
    stored, it would fail every consumer that pulls it."""
    if not main_brokers(targets):
        return []
    topic = _need_topic(limits)
    master, _ = await find_master(targets, limits)
    expected = "compressed flag on a body that does not inflate: MESSAGE_ILLEGAL, no traceback"
    watch = LogWatch(limits, [master.addr])
    try:
        resp = await _invoke(master.addr, limits, _send(topic, b"this is not zlib", sysFlag=1))
    except Exception as exc:  # noqa: BLE001 - the row says what failed
        return [Row("compressed-body", master.name, expected, _error(exc), False)]
    log, log_ok = watch.note()
    ok = resp.code == ResponseCode.MESSAGE_ILLEGAL and log_ok
    outcome, ok = await with_serving_check(master, limits, f"{_answer(resp)}; {log}", ok)
    return [Row("compressed-body", master.name, expected, outcome, ok)]


async def integer_range(targets: list[Target], limits: Limits) -> list[Row]:
    """Send headers a record cannot hold (flag, sysFlag, bornTimestamp at 2^64, queueId at
    2^40): each refused with a code that says so and names the header, never a traceback."""
    if not main_brokers(targets):
        return []
    topic = _need_topic(limits)
    master, _ = await find_master(targets, limits)
    rows = []
    for header, value, words in OUT_OF_RANGE:
        expected = f"{header}={words}: MESSAGE_ILLEGAL or BAD_REQUEST naming {header}, no traceback"
        watch = LogWatch(limits, [master.addr])
        try:
            resp = await _invoke(master.addr, limits, _send(topic, b"x", **{header: value}))
        except Exception as exc:  # noqa: BLE001 - the row says what failed
            rows.append(Row("int-range", master.name, expected, _error(exc), False))
            continue
        log, log_ok = watch.note()
        ok = resp.code in CLEAR_REFUSALS and _names(resp.remark, header) and log_ok
        outcome, ok = await with_serving_check(master, limits, f"{_answer(resp)}; {log}", ok)
        rows.append(Row("int-range", master.name, expected, outcome, ok))
    return rows


def _names(remark: str | None, header: str) -> bool:
    """Whether a refusal's remark names the header (``queueId`` also as "queue id")."""
    squeezed = (remark or "").lower().replace(" ", "").replace("_", "")
    return header.lower() in squeezed


async def nested_heartbeat(targets: list[Target], limits: Limits) -> list[Row]:
    """A heartbeat whose body nests 100,000 arrays deep: answered with a clear error code,
    neither a traceback (a parser's recursion) nor a dropped connection."""
    rows = []
    expected = f"heartbeat nested {NESTING} deep: an error code (not SYSTEM_ERROR), no traceback"
    for t in main_brokers(targets):
        watch = LogWatch(limits, [t.addr])
        body = b"[" * NESTING + b"]" * NESTING
        try:
            resp = await _invoke(t.addr, limits, RemotingCommand.request(RequestCode.HEART_BEAT, body=body))
        except Exception as exc:  # noqa: BLE001 - the row says what failed
            rows.append(Row("nested-heartbeat", t.name, expected, _error(exc), False))
            continue
        log, log_ok = watch.note()
        ok = resp.code not in (ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR) and log_ok
        outcome, ok = await with_serving_check(t, limits, f"{_answer(resp)}; {log}", ok)
        rows.append(Row("nested-heartbeat", t.name, expected, outcome, ok))
    return rows


# --- ACL ------------------------------------------------------------------------------------------


async def acl_bypass(targets: list[Target], limits: Limits) -> list[Row]:
    """With ACL on, an account allowed to send to ``--topic`` only tries every way of naming
    another topic in a send, and the message queries: each must be judged by the topic the
    broker would store into or read from. The admin account creates the forbidden topic if
    it is missing, stores one message there and reads the queues' offsets around the sends."""
    if not main_brokers(targets):
        return []
    if limits.acl_admin is None or limits.acl_user is None:
        raise NotRun("needs --acl-admin and --acl-user (a group with ACL on)")
    allowed = _need_topic(limits)
    forbidden = limits.acl_forbidden_topic
    master, _ = await find_master(targets, limits)
    user = limits.acl_user
    try:
        await _ensure_topic(master.addr, limits, forbidden)
        key = f"jepsen-probe-{os.getpid()}-{time.time_ns()}"
        secret = await _invoke(
            master.addr, limits, _send(forbidden, b"for the admin only", properties=f"KEYS\x01{key}\x02")
        )
        if not secret.is_success:
            raise RuntimeError(f"the admin account could not send to {forbidden}: {_answer(secret)}")
        msg_id = secret.header_str("msgId")
    except Exception as exc:  # noqa: BLE001 - the row says what stopped it
        return [
            Row("acl-bypass", master.name, f"set-up by {limits.acl_admin.access_key}", _error(exc), False)
        ]
    a, f = allowed, forbidden
    batch = encode_message_batch([(0, b"probe", b"")])
    sends: list[tuple[str, int, dict[str, Any], bytes, str]] = [
        (
            f"SEND_MESSAGE_V2 b={a},topic={f}",
            RequestCode.SEND_MESSAGE_V2,
            {"b": a, "topic": f, "e": 0},
            b"m",
            a,
        ),
        (f"SEND_MESSAGE b={f} only", RequestCode.SEND_MESSAGE, {"b": f, "e": 0}, b"m", f),
        (
            f"SEND_BATCH_MESSAGE topic={f} only",
            RequestCode.SEND_BATCH_MESSAGE,
            {"topic": f, "queueId": 0},
            batch,
            f,
        ),
    ]
    rows = []
    async with limits.remoting_client("probe-acl-user", user) as rc:
        for words, code, headers, body, stored_in in sends:
            verdict = "acknowledged, stored in" if stored_in == a else "refused NO_PERMISSION, nothing in"
            expected = f"{words} by {user.access_key}: {verdict} {stored_in}"
            try:
                offsets = await _max_offsets(master.addr, limits, (a, f))
                resp = await rc.invoke_sync(
                    master.addr, RemotingCommand.request(code, dict(headers), body), 10.0
                )
                grown = {
                    t: n - offsets[t] for t, n in (await _max_offsets(master.addr, limits, (a, f))).items()
                }
            except Exception as exc:  # noqa: BLE001 - the row says what failed
                rows.append(Row("acl-bypass", master.name, expected, _error(exc), False))
                continue
            if stored_in == a:
                ok = resp.is_success and grown[a] == 1 and grown[f] == 0
            else:
                ok = resp.code == ResponseCode.NO_PERMISSION and grown[a] == grown[f] == 0
            outcome = f"{_answer(resp)}; new messages: {a} +{grown[a]}, {f} +{grown[f]}"
            rows.append(Row("acl-bypass", master.name, expected, outcome, ok))
        queries = [
            ("QUERY_MESSAGE", RequestCode.QUERY_MESSAGE, {"topic": f, "key": key, "maxNum": 4}),
            ("VIEW_MESSAGE_BY_ID", RequestCode.VIEW_MESSAGE_BY_ID, {"msgId": msg_id}),
        ]
        for words, code, headers in queries:
            expected = f"{words} of a message in {f} by {user.access_key}: refused NO_PERMISSION"
            try:
                resp = await rc.invoke_sync(master.addr, RemotingCommand.request(code, headers), 10.0)
            except Exception as exc:  # noqa: BLE001 - the row says what failed
                rows.append(Row("acl-bypass", master.name, expected, _error(exc), False))
                continue
            leaked = b"for the admin only" in bytes(resp.body or b"")
            outcome = _answer(resp) + ("; the message's body came back" if leaked else "")
            rows.append(
                Row("acl-bypass", master.name, expected, outcome, resp.code == ResponseCode.NO_PERMISSION)
            )
    return rows


async def _ensure_topic(addr: str, limits: Limits, topic: str) -> None:
    """Create ``topic`` (one queue) as the admin unless the broker has it: an existing topic is
    left as it is (UPDATE_AND_CREATE_TOPIC would also change its queues)."""
    have = await _invoke(addr, limits, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG))
    if have.is_success:
        with contextlib.suppress(ValueError, AttributeError):
            if topic in (json.loads(bytes(have.body)).get("topicConfigTable") or {}):
                return
    created = await _invoke(
        addr,
        limits,
        RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": topic, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6},
        ),
    )
    if not created.is_success:
        raise RuntimeError(f"the admin account could not create {topic}: {_answer(created)}")


async def _max_offsets(addr: str, limits: Limits, topics: tuple[str, ...]) -> dict[str, int]:
    """Queue 0's max offset of each topic (every probe send goes to queue 0), read by the admin."""
    out = {}
    async with limits.remoting_client("probe-offsets") as rc:
        for topic in topics:
            resp = await rc.invoke_sync(
                addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": 0}), 5.0
            )
            if not resp.is_success:
                raise RuntimeError(f"GET_MAX_OFFSET of {topic}: {_answer(resp)}")
            out[topic] = resp.header_int("offset")
    return out


# --- floods ---------------------------------------------------------------------------------------


async def client_flood(targets: list[Target], limits: Limits) -> list[Row]:
    """Heartbeats from fresh client ids (three times the table) and a burst of new topics at the
    master, while one producer sends every 20 ms: the master keeps its leadership (the ledger
    term and the master of every broker's runtime info unchanged) and every steady send is
    acknowledged; its latency is reported."""
    if not main_brokers(targets):
        return []
    topic = _need_topic(limits)
    master, _ = await find_master(targets, limits)
    brokers = main_brokers(targets)
    beats, topics = limits.flood_heartbeats, limits.flood_topics
    expected = (
        f"{beats} heartbeats (fresh ids) + {topics} new topics: leader and term unchanged, "
        "every steady send acknowledged"
    )
    before = await _leadership(brokers, limits)
    run = f"{os.getpid()}-{time.time_ns() % 10**9}"
    latencies: list[float] = []
    failures: list[str] = []
    stop = asyncio.Event()
    codes: dict[str, int] = {}

    async def steady(rc: Any) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                resp = await rc.invoke_sync(master.addr, _send(topic, b"steady"), STEADY_SEND_TIMEOUT_S)
                if resp.is_success:
                    latencies.append(time.monotonic() - started)
                else:
                    failures.append(response_code_name(resp.code))
            except Exception as exc:  # noqa: BLE001 - counted: the finding
                failures.append(type(exc).__name__)
            await asyncio.sleep(STEADY_SEND_INTERVAL_S)

    def count(resp: RemotingCommand | BaseException) -> None:
        name = type(resp).__name__ if isinstance(resp, BaseException) else response_code_name(resp.code)
        codes[name] = codes.get(name, 0) + 1

    try:
        async with (
            limits.remoting_client("probe-steady") as steady_rc,
            limits.remoting_client("probe-flood") as rc,
        ):
            sender = asyncio.create_task(steady(steady_rc))
            try:
                for lo in range(0, beats, FLOOD_IN_FLIGHT):
                    batch = [
                        rc.invoke_sync(master.addr, _heartbeat(f"jepsen-probe-flood-{run}-{i}"), 10.0)
                        for i in range(lo, min(beats, lo + FLOOD_IN_FLIGHT))
                    ]
                    for r in await asyncio.gather(*batch, return_exceptions=True):
                        count(r)
                for lo in range(0, topics, FLOOD_IN_FLIGHT):
                    batch = [
                        rc.invoke_sync(master.addr, _send(f"JepsenProbeBurst{run}-{i}", b"new topic"), 20.0)
                        for i in range(lo, min(topics, lo + FLOOD_IN_FLIGHT))
                    ]
                    for r in await asyncio.gather(*batch, return_exceptions=True):
                        count(r)
            finally:
                stop.set()
                await sender
    except Exception as exc:  # noqa: BLE001 - the row says what failed
        return [Row("client-flood", master.name, expected, _error(exc), False)]
    after = await _leadership(brokers, limits)
    latencies.sort()
    lat = (
        f"steady sends {len(latencies)} acknowledged, p50 {latencies[len(latencies) // 2] * 1000:.0f} ms, "
        f"max {latencies[-1] * 1000:.0f} ms"
        if latencies
        else "no steady send acknowledged"
    )
    failed = f", {len(failures)} failed ({', '.join(sorted(set(failures)))})" if failures else ""
    answers = ", ".join(f"{n} {c}" for c, n in sorted(codes.items()))
    kept = before == after and before.get("master") == master.addr
    leadership = "leader and term unchanged" if kept else f"leadership CHANGED: {before} -> {after}"
    outcome = f"{lat}{failed}; flood answers: {answers}; {leadership}"
    ok = kept and latencies and not failures and all(c in ("SUCCESS", "SYSTEM_BUSY") for c in codes)
    outcome, ok = await with_serving_check(master, limits, outcome, bool(ok))
    return [Row("client-flood", master.name, expected, outcome, ok)]


def _heartbeat(client_id: str) -> RemotingCommand:
    doc = {
        "clientID": client_id,
        "producerDataSet": [{"groupName": "jepsen-probe-flood"}],
        "consumerDataSet": [],
    }
    return RemotingCommand.request(RequestCode.HEART_BEAT, body=json.dumps(doc).encode())


async def _leadership(brokers: list[Target], limits: Limits) -> dict[str, Any]:
    """Which broker is master and every broker's ledger term, from their runtime info."""
    out: dict[str, Any] = {"master": None}
    for b in brokers:
        info = await runtime_info(b.addr, limits)
        if info is None:
            out[b.addr] = "no answer"
            continue
        if info.get("role") == "MASTER":
            out["master"] = b.addr
        out[b.addr] = (info.get("ledger") or {}).get("term")
    return out


# --- connections that take without giving -------------------------------------------------------


def _normal_request(t: Target, limits: Limits, opaque: int, body: bytes = b"") -> bytes:
    code = (
        RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER
        if t.kind == NAMESRV
        else RequestCode.GET_BROKER_RUNTIME_INFO
    )
    cmd = limits.sign(RemotingCommand.request(code, body=body))
    cmd.opaque = opaque
    return encode_command(cmd)


async def _trickle_one(t: Target, limits: Limits) -> Row:
    timeout = limits.frame_timeout_s
    allowed = timeout + max(2.0, timeout / 2)
    expected = f"one frame answered, then the next trickled a byte per {TRICKLE_INTERVAL_S:g}s: closed within {allowed:g}s (frame_timeout_s {timeout:g})"
    try:
        reader, writer = await open_conn(t, limits)
    except (OSError, TimeoutError) as exc:
        return Row("trickle", t.name, expected, f"cannot connect: {exc}", False)
    # long enough that it cannot complete before the deadline, even a byte at a time
    slow = _normal_request(t, limits, 2, b"t" * int(allowed / TRICKLE_INTERVAL_S + 64))
    trickler: asyncio.Task[None] | None = None
    try:
        writer.write(_normal_request(t, limits, 1))
        seen, _ = await reaction(reader, REACTION_WAIT_S)
        if seen != "answered":
            return Row(
                "trickle", t.name, expected, f"the first, complete frame was not answered: {seen}", False
            )

        async def trickle() -> None:
            for byte in slow[:-1]:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(TRICKLE_INTERVAL_S)

        trickler = asyncio.create_task(trickle())
        waited = await closed_within(reader, allowed)
    except (OSError, TimeoutError) as exc:
        return Row("trickle", t.name, expected, _error(exc), False)
    finally:
        if trickler is not None:
            trickler.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await trickler
        close_writer(writer)
    outcome = (
        f"closed after {waited:.1f}s of trickle" if waited is not None else f"still open after {allowed:g}s"
    )
    outcome, ok = await with_serving_check(t, limits, outcome, waited is not None)
    return Row("trickle", t.name, expected, outcome, ok)


async def trickle(targets: list[Target], limits: Limits) -> list[Row]:
    """On every broker listener at once (main and fast port): a connection that sent one
    complete frame then trickles the next a byte at a time must be closed by frame_timeout_s,
    or a few such peers hold every connection slot (a complete frame now and then keeps
    resetting idle_timeout_s). Nameservers share the remoting layer; they are left out so
    that a run against nameservers alone stays as short as their frame probes."""
    return list(await asyncio.gather(*(_trickle_one(t, limits) for t in targets if t.kind == BROKER)))


async def pipelined_pulls(targets: list[Target], limits: Limits) -> list[Row]:
    """A consumer pipelines pulls of a large message and never reads the answers: the broker
    must close the connection once its queued output passes max_output_bytes, its RSS growing
    by no more than that plus --rss-bound-mib, instead of building every answer in memory."""
    if not main_brokers(targets):
        return []
    topic = _need_topic(limits)
    master, _ = await find_master(targets, limits)
    size = limits.max_message_bytes - (64 << 10)
    limit_mib = limits.output_limit_bytes / (1 << 20)
    bound_mib = limit_mib + limits.rss_bound_mib
    pulls = int(2 * bound_mib * (1 << 20) / size) + 1  # answers worth twice the bound
    expected = (
        f"{pulls} pipelined pulls of a {size >> 10} KiB message never read: connection closed, "
        f"RSS +<= {bound_mib:g} MiB (max_output_bytes {limit_mib:g} MiB + {limits.rss_bound_mib:g})"
    )
    try:
        sent = await _invoke(master.addr, limits, _send(topic, os.urandom(size)), 30.0)
        if not sent.is_success:
            raise RuntimeError(f"the large message was not stored: {_answer(sent)}")
        offset = sent.header_int("queueOffset")
    except Exception as exc:  # noqa: BLE001 - the row says what failed
        return [Row("pipelined-pulls", master.name, expected, _error(exc), False)]
    pid = pid_listening_on(master.addr)
    before = rss_kib(pid) if pid else None
    peak = before
    try:
        reader, writer = await open_conn(master, limits)
    except (OSError, TimeoutError) as exc:
        return [Row("pipelined-pulls", master.name, expected, f"cannot connect: {exc}", False)]
    try:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        writer.transport.pause_reading()  # this consumer never reads
        headers = {
            "consumerGroup": "jepsen-probe-pulls",
            "topic": topic,
            "queueId": 0,
            "queueOffset": offset,
            "maxMsgNums": 1,
            "sysFlag": 0,
            "commitOffset": 0,
            "suspendTimeoutMillis": 0,
            "subscription": "*",
            "subVersion": 0,
        }
        frames = []
        for i in range(pulls):
            cmd = limits.sign(RemotingCommand.request(RequestCode.PULL_MESSAGE, dict(headers)))
            cmd.opaque = 1000 + i
            frames.append(encode_command(cmd))
        writer.write(b"".join(frames))
        with contextlib.suppress(ConnectionError):
            await asyncio.wait_for(writer.drain(), 10.0)
        watch_until = time.monotonic() + 4.0
        while time.monotonic() < watch_until:
            if pid is not None:
                now = rss_kib(pid)
                if now is not None and peak is not None:
                    peak = max(peak, now)
            await asyncio.sleep(0.02)
        writer.transport.resume_reading()
        answered, waited = await _count_answers(reader, 10.0)
    finally:
        close_writer(writer)
    rss, rss_ok = rss_note(pid, before, bound_mib) if peak is None else _peak_note(before, peak, bound_mib)
    closed = waited is not None
    outcome = f"{answered} answers read, then " + ("closed" if closed else "STILL OPEN") + f"; peak {rss}"
    outcome, ok = await with_serving_check(master, limits, outcome, closed and rss_ok)
    return [Row("pipelined-pulls", master.name, expected, outcome, ok)]


def _peak_note(before: int | None, peak: int, bound_mib: float) -> tuple[str, bool]:
    if before is None:
        return "RSS not measured", True
    grown = (peak - before) / 1024
    return f"RSS {grown:+.1f} MiB (bound {bound_mib:g})", grown <= bound_mib


async def _count_answers(reader: asyncio.StreamReader, within_s: float) -> tuple[int, float | None]:
    """Frames read until the peer closes (and after how long), or None when still open after ``within_s``."""
    decoder = FrameDecoder(64 << 20)
    frames = 0
    started = time.monotonic()
    deadline = started + within_s
    while (left := deadline - time.monotonic()) > 0:
        seen, data = await reaction(reader, left)
        if seen == "closed":
            return frames, time.monotonic() - started
        if seen == "silent":
            break
        with contextlib.suppress(ProtocolError):
            frames += sum(isinstance(ev, RemotingCommand) for ev in decoder.feed(data))
    return frames, None


# --- nameservers ----------------------------------------------------------------------------------


async def namesrv_register(targets: list[Target], limits: Limits) -> list[Row]:
    """REGISTER_BROKER of a forged broker without the cluster proof: a nameserver that holds the
    secret refuses it (NO_PERMISSION), else anyone who reaches it could route clients' sends
    to an address of their choosing. Signed by the admin account when the probe has one, so
    that ACL passes it and the refusal is the proof's. A registration that is taken is
    withdrawn at once."""
    namesrvs = [t for t in targets if t.kind == NAMESRV]
    if not namesrvs:
        return []
    if limits.ledger_secret is None:
        raise NotRun(
            "needs --cluster-secret-file (a nameserver without the secret takes registrations by design)"
        )
    forged = {
        "brokerName": "jepsen-probe-forged",
        "brokerAddr": "192.0.2.1:10911",  # TEST-NET-1: routes nowhere
        "clusterName": "JepsenProbeForged",
        "brokerId": 0,
        "haServerAddr": "192.0.2.1:10912",
    }
    expected = "REGISTER_BROKER without the cluster proof: NO_PERMISSION"
    rows = []
    for t in namesrvs:
        try:
            resp = await _invoke(
                t.addr, limits, RemotingCommand.request(RequestCode.REGISTER_BROKER, dict(forged))
            )
        except Exception as exc:  # noqa: BLE001 - the row says what failed
            rows.append(Row("namesrv-register", t.name, expected, _error(exc), False))
            continue
        outcome = _answer(resp)
        by_acl = "not signed" in (resp.remark or "") or "admin operation" in (resp.remark or "")
        if resp.is_success:
            with contextlib.suppress(Exception):
                await _invoke(
                    t.addr, limits, RemotingCommand.request(RequestCode.UNREGISTER_BROKER, dict(forged))
                )
            rows.append(
                Row("namesrv-register", t.name, expected, f"{outcome}: the forged broker was routed", False)
            )
            continue
        if resp.code == ResponseCode.NO_PERMISSION and by_acl:
            rows.append(
                Row(
                    "namesrv-register",
                    t.name,
                    expected,
                    f"{outcome}: refused by ACL first (--acl-admin)",
                    None,
                )
            )
            continue
        outcome, ok = await with_serving_check(t, limits, outcome, resp.code == ResponseCode.NO_PERMISSION)
        rows.append(Row("namesrv-register", t.name, expected, outcome, ok))
    return rows


__all__ = [
    "acl_bypass",
    "client_flood",
    "compressed_body",
    "integer_range",
    "ledger_unauthenticated",
    "max_message",
    "namesrv_register",
    "nested_heartbeat",
    "pipelined_pulls",
    "trickle",
    "unappliable_entry",
]
