"""Synthetic ``log`` histories of any size, correct by construction (or with planted bugs).

The benchmark and the scale tests need histories far larger than a test cluster
produces in a reasonable time. A discrete-event simulation of producers and
consumers against an ideal log gives one: every operation takes effect at its
completion instant, so offsets follow real time, polls see everything acknowledged
before they began, and the history is linearizable. ``anomalies=True`` then plants
known bugs (a lost write, a duplicate, an aborted write made visible) so a checker
that finds nothing is caught.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(slots=True)
class SynthStats:
    """What was generated, for the benchmark's report and for test expectations."""

    ops: int = 0
    events: int = 0
    sends: int = 0
    polls: int = 0
    info: int = 0
    fail: int = 0
    planted: dict[str, int] = field(default_factory=dict)


def generate_log_history(
    path: str | Path,
    n_ops: int,
    *,
    keys: int = 8,
    producers: int = 16,
    consumers_per_key: int = 1,
    poll_max: int = 32,
    seed: int = 1,
    anomalies: bool = False,
    nemesis: bool = True,
) -> SynthStats:
    """Write a JSON Lines ``log`` history of about ``n_ops`` operations to ``path``."""
    rng = random.Random(seed)
    log: list[list[int]] = [[] for _ in range(keys)]
    st = SynthStats()
    lines: list[str] = []
    out = open(path, "w", buffering=1 << 20)  # noqa: SIM115 - closed below
    index = 0

    def emit(line: str) -> None:
        nonlocal index
        lines.append(line)
        index += 1
        if len(lines) >= 50_000:
            out.write("".join(lines))
            lines.clear()

    # process id -> role; consumers carry (key, position)
    next_pid = 0
    roles: dict[int, tuple[str, int]] = {}
    position: dict[int, int] = {}
    heap: list[tuple[int, int, int]] = []  # (time ns, seq, pid) for the next invoke

    def spawn(role: str, key: int, t: int) -> None:
        nonlocal next_pid
        pid = next_pid
        next_pid += 1
        roles[pid] = (role, key)
        heapq.heappush(heap, (t, pid, pid))

    for i in range(producers):
        spawn("producer", i % keys, rng.randrange(1_000_000))
    for k in range(keys):
        for _ in range(consumers_per_key):
            spawn("consumer", k, rng.randrange(1_000_000))
            position[next_pid - 1] = 0
    pending: list[tuple[int, int, int, str, int, int]] = []  # completions: (t, seq, pid, kind, a, b)
    value = 0
    seq = 0
    budget = max(0, n_ops - keys)
    started = 0
    nemesis_at = {int(budget * f) for f in (0.3, 0.6)} if nemesis else set()
    fail_value: dict[int, int] = {}
    now = 0
    while heap or pending:
        # next event: the earliest invoke or completion
        if pending and (not heap or pending[0][0] <= heap[0][0]):
            t, _, pid, kind, a, b = heapq.heappop(pending)
            now = t
            role, key = roles[pid]
            if kind == "send":
                r = rng.random()
                if r < 0.002:  # unknown outcome; half of these still land
                    if rng.random() < 0.5:
                        log[key].append(a)
                    emit(
                        f'{{"index":{index},"time":{t},"process":{pid},"type":"info","f":"send",'
                        f'"key":"{key}","value":{a},"error":"timeout"}}\n'
                    )
                    st.info += 1
                    spawn("producer", key, t + rng.randrange(100_000, 1_000_000))  # a new process id
                    continue
                if r < 0.004:
                    emit(
                        f'{{"index":{index},"time":{t},"process":{pid},"type":"fail","f":"send",'
                        f'"key":"{key}","value":{a},"error":"not-leader"}}\n'
                    )
                    st.fail += 1
                    fail_value[key] = a
                else:
                    off = len(log[key])
                    log[key].append(a)
                    emit(
                        f'{{"index":{index},"time":{t},"process":{pid},"type":"ok","f":"send",'
                        f'"key":"{key}","value":{a},"offset":{off}}}\n'
                    )
            else:  # poll
                frm = a
                got = log[key][frm : frm + poll_max]
                position[pid] = frm + len(got)
                pairs = ",".join(f"[{frm + i},{v}]" for i, v in enumerate(got))
                emit(
                    f'{{"index":{index},"time":{t},"process":{pid},"type":"ok","f":"poll",'
                    f'"key":"{key}","value":[{pairs}]}}\n'
                )
            if started < budget:
                seq += 1
                heapq.heappush(heap, (t + rng.randrange(50_000, 2_000_000), seq, pid))
            continue
        if not heap:
            continue
        t, _, pid = heapq.heappop(heap)
        if started >= budget:
            continue
        now = t
        if started in nemesis_at:
            node = f"n{rng.randrange(1, 4)}"
            emit(
                f'{{"index":{index},"time":{t},"process":"nemesis","type":"info","f":"kill","value":["{node}"]}}\n'
            )
            emit(
                f'{{"index":{index},"time":{t + 1000},"process":"nemesis","type":"info","f":"kill","value":["{node}"]}}\n'
            )
            emit(
                f'{{"index":{index},"time":{t + 2000},"process":"nemesis","type":"info","f":"restart","value":["{node}"]}}\n'
            )
            emit(
                f'{{"index":{index},"time":{t + 3000},"process":"nemesis","type":"info","f":"restart","value":["{node}"]}}\n'
            )
            t += 4000
        started += 1
        st.ops += 1
        role, key = roles[pid]
        latency = rng.randrange(200_000, 5_000_000)
        seq += 1
        if role == "producer":
            value += 1
            emit(
                f'{{"index":{index},"time":{t},"process":{pid},"type":"invoke","f":"send",'
                f'"key":"{key}","value":{value}}}\n'
            )
            heapq.heappush(pending, (t + latency, seq, pid, "send", value, 0))
            st.sends += 1
        else:
            frm = position[pid]
            emit(
                f'{{"index":{index},"time":{t},"process":{pid},"type":"invoke","f":"poll",'
                f'"key":"{key}","value":{{"from":{frm},"max":{poll_max}}}}}\n'
            )
            heapq.heappush(pending, (t + latency, seq, pid, "poll", frm, 0))
            st.polls += 1
    t_end = now + 10_000_000
    for k in range(keys):
        pid = next_pid
        next_pid += 1
        entries = list(enumerate(log[k]))
        if anomalies and k == 0 and len(entries) > 10:
            del entries[len(entries) // 2]  # lost-write: the drain skips one acknowledged entry
            st.planted["lost-write"] = 1
        if anomalies and k == 1 and entries:
            entries.append((entries[-1][0] + 1, entries[0][1]))  # duplicate: a value at a second offset
            st.planted["duplicate"] = 1
        if anomalies and k in fail_value and "G1a" not in st.planted:
            entries.append(
                (entries[-1][0] + 1 if entries else 0, fail_value[k])
            )  # G1a: a failed send shows up
            st.planted["G1a"] = 1
        pairs = ",".join(f"[{i},{v}]" for i, v in entries)
        emit(
            f'{{"index":{index},"time":{t_end},"process":{pid},"type":"invoke","f":"drain",'
            f'"key":"{k}","value":{{"from":0}}}}\n'
        )
        emit(
            f'{{"index":{index},"time":{t_end + 500_000},"process":{pid},"type":"ok","f":"drain",'
            f'"key":"{k}","value":[{pairs}]}}\n'
        )
        t_end += 1_000_000
        st.ops += 1
    out.write("".join(lines))
    out.close()
    st.events = index
    return st
