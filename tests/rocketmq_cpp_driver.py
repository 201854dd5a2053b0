"""Drive Apache RocketMQ's C++ client (PyPI ``rocketmq``, which bundles librocketmq.so) from a
child process, for the compatibility tests.

The C++ client runs its own threads inside the process that loads it, and a client stuck
on a dead broker can hold that process for a long time, so each test step runs this
script as a child with a timeout (killed by PID when it overruns) and reads one JSON
document from its standard output.

    python tests/rocketmq_cpp_driver.py produce NAMESRV TOPIC GROUP MODE COUNT PREFIX [PAUSE_S]
    python tests/rocketmq_cpp_driver.py pull NAMESRV TOPIC GROUP EXPECT TIMEOUT_S
    python tests/rocketmq_cpp_driver.py push NAMESRV TOPIC GROUP EXPECT TIMEOUT_S [EXPRESSION]
    python tests/rocketmq_cpp_driver.py delayed NAMESRV TOPIC GROUP COUNT LEVEL
    python tests/rocketmq_cpp_driver.py failing NAMESRV TOPIC GROUP EXPECT FAILURES TIMEOUT_S
    python tests/rocketmq_cpp_driver.py orderly NAMESRV TOPIC GROUP EXPECT TIMEOUT_S

MODE is sync, async, oneway or batch. Every produced message carries keys, a tag and a user
property derived from its body, so the consumer side can check they arrived intact.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any


def _message(topic: str, body: str) -> Any:
    from rocketmq.client import Message

    msg = Message(topic)
    msg.set_keys(f"key-{body}")
    msg.set_tags("even" if int(body.rsplit("-", 1)[1]) % 2 == 0 else "odd")
    msg.set_property("origin", f"cpp-{body}")
    msg.set_body(body)
    return msg


def produce(namesrv: str, topic: str, group: str, mode: str, count: int, prefix: str, pause_s: float) -> dict:
    from rocketmq.client import Producer

    producer = Producer(group, timeout=3000)
    producer.set_namesrv_addr(namesrv)
    producer.start()
    acked: list[dict[str, Any]] = []
    errors: list[str] = []
    done = threading.Semaphore(0)
    lock = threading.Lock()
    bodies = [f"{prefix}-{i}" for i in range(count)]
    try:
        if mode == "batch":
            result = producer.send_batch([_message(topic, b) for b in bodies])
            acked = [{"body": b, "status": int(result.status), "msg_id": result.msg_id} for b in bodies]
        for body in bodies if mode != "batch" else []:
            msg = _message(topic, body)
            if mode == "sync":
                try:
                    r = producer.send_sync(msg)
                    acked.append(
                        {"body": body, "status": int(r.status), "msg_id": r.msg_id, "offset": r.offset}
                    )
                except Exception as exc:  # noqa: BLE001 - the test counts failures, it does not stop at one
                    errors.append(f"{body}: {exc}")
            elif mode == "oneway":
                producer.send_oneway(msg)
                acked.append({"body": body})
            elif mode == "async":

                def ok(r: Any, body: str = body) -> None:
                    with lock:
                        acked.append({"body": body, "status": int(r.status), "msg_id": r.msg_id})
                    done.release()

                def failed(exc: Exception, body: str = body) -> None:
                    with lock:
                        errors.append(f"{body}: {exc}")
                    done.release()

                producer.send_async(msg, ok, failed)
            else:
                raise SystemExit(f"unknown mode {mode!r}")
            if pause_s:
                time.sleep(pause_s)
        if mode == "async":
            deadline = time.monotonic() + 30
            for _ in bodies:
                if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    errors.append("async callbacks missing after 30 s")
                    break
        if mode == "oneway":
            time.sleep(1.0)  # oneway requests are written by the client's own threads
    finally:
        producer.shutdown()
    return {"acked": acked, "errors": errors}


def _recv(m: Any) -> dict[str, Any]:
    return {
        "body": m.body.decode(),
        "tags": (m.tags or b"").decode(),
        "keys": (m.keys or b"").decode(),
        "origin": (m.get_property("origin") or b"").decode(),
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "id": m.id,
    }


def pull(namesrv: str, topic: str, group: str, expect: int, timeout_s: float) -> dict:
    from rocketmq.client import PullConsumer

    consumer = PullConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    consumer.start()
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < expect and time.monotonic() < deadline:
            for m in consumer.pull(topic):
                got.append(_recv(m))
            if len(got) < expect:
                time.sleep(0.2)
    finally:
        consumer.shutdown()
    return {"messages": got}


def push(
    namesrv: str,
    topic: str,
    group: str,
    expect: int,
    timeout_s: float,
    expression: str,
    orderly: bool = False,
) -> dict:
    """A push consumer; ``orderly``: RocketMQ's orderly one, which locks its queues with
    LOCK_BATCH_MQ before consuming each in order."""
    from rocketmq.client import PushConsumer

    consumer = PushConsumer(group, orderly=orderly)
    consumer.set_namesrv_addr(namesrv)
    got: list[dict[str, Any]] = []
    lock = threading.Lock()

    def on_message(m: Any) -> None:
        with lock:
            got.append(_recv(m))

    consumer.subscribe(topic, on_message, expression)
    consumer.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            with lock:
                if len({g["body"] for g in got}) >= expect:
                    break
            time.sleep(0.1)
        time.sleep(6.0)  # the C++ client persists consumed offsets every 5 s; let it
    finally:
        consumer.shutdown()
    return {"messages": got}


def delayed(namesrv: str, topic: str, group: str, count: int, level: int) -> dict:
    """Sync sends with RocketMQ's delay level set; when each was acknowledged (epoch ms)."""
    from rocketmq.client import Producer

    producer = Producer(group, timeout=3000)
    producer.set_namesrv_addr(namesrv)
    producer.start()
    acked: list[dict[str, Any]] = []
    try:
        for i in range(count):
            msg = _message(topic, f"delayed-{i}")
            msg.set_delay_time_level(level)
            r = producer.send_sync(msg)
            acked.append({"body": f"delayed-{i}", "status": int(r.status), "at_ms": int(time.time() * 1000)})
    finally:
        producer.shutdown()
    return {"acked": acked}


def failing(namesrv: str, topic: str, group: str, expect: int, failures: int, timeout_s: float) -> dict:
    """A push consumer whose listener raises for each message's first ``failures`` deliveries:
    the client sends it back (CONSUMER_SEND_MSG_BACK) and the broker redelivers it later."""
    from rocketmq.client import PushConsumer

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    deliveries: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def on_message(m: Any) -> None:  # raising is RECONSUME_LATER for this binding
        body = m.body.decode()
        with lock:
            seen[body] = seen.get(body, 0) + 1
            deliveries.append({**_recv(m), "at_ms": int(time.time() * 1000), "reconsume": m.reconsume_times})
            fail = seen[body] <= failures
        if fail:
            raise RuntimeError(f"listener fails {body} on purpose")

    consumer.subscribe(topic, on_message)
    consumer.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            with lock:
                if len(seen) >= expect and all(n > failures for n in seen.values()):
                    break
            time.sleep(0.1)
        time.sleep(6.0)  # the C++ client persists consumed offsets every 5 s; let it
    finally:
        consumer.shutdown()
    return {"deliveries": deliveries}


def main(argv: list[str]) -> int:
    cmd, namesrv, topic, group, *rest = argv
    if cmd == "produce":
        mode, count, prefix, *pause = rest
        out = produce(namesrv, topic, group, mode, int(count), prefix, float(pause[0]) if pause else 0.0)
    elif cmd == "pull":
        out = pull(namesrv, topic, group, int(rest[0]), float(rest[1]))
    elif cmd == "push":
        out = push(namesrv, topic, group, int(rest[0]), float(rest[1]), rest[2] if len(rest) > 2 else "*")
    elif cmd == "delayed":
        out = delayed(namesrv, topic, group, int(rest[0]), int(rest[1]))
    elif cmd == "failing":
        out = failing(namesrv, topic, group, int(rest[0]), int(rest[1]), float(rest[2]))
    elif cmd == "orderly":
        out = push(namesrv, topic, group, int(rest[0]), float(rest[1]), "*", orderly=True)
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
