"""Deterministic whole-cluster simulation of the Raft core (see ``ledger/sim.py``).

Hundreds of seeded runs, each a cluster under crashes, partitions, lossy and reordering
networks, slow disks, transfers and retention, checked for Raft's safety properties,
linearizable reads and liveness after healing. A failure prints the seed and the command
that replays it exactly. The checkers themselves are tested by mutation: faults injected into the
production runtime, the simulated disk or the voters (a runtime that acknowledges before
fsync, sends before persisting, serves reads locally; a disk that forgets the vote, and so
on) must be caught, or a green run would prove nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from ledger.config import NodeConfig
from ledger.runtime import DEFAULT_DISK_RETRY_S
from ledger.sim import MUTATIONS, SimOptions, SimResult, Simulation, main, run_seed

THREE_NODE_SEEDS = range(0, 320)
FIVE_NODE_SEEDS = range(0, 60)
# Membership changes in every seed (the default runs above have them in about a third). About
# 25 s together; ``python -m ledger.sim --seeds 5000 --membership always`` for a longer hunt.
MEMBERSHIP_THREE_NODE_SEEDS = range(0, 600)
MEMBERSHIP_FIVE_NODE_SEEDS = range(0, 60)
ROOT = Path(__file__).resolve().parent.parent


def _failures(results: list[SimResult]) -> str:
    bad = [r for r in results if not r.ok]
    return f"{len(bad)} of {len(results)} seeds failed:\n\n" + "\n\n".join(r.describe() for r in bad)


@pytest.fixture(scope="module")
def three_node_results() -> list[SimResult]:
    return [run_seed(s, SimOptions(nodes=3)) for s in THREE_NODE_SEEDS]


@pytest.fixture(scope="module")
def five_node_results() -> list[SimResult]:
    return [run_seed(s, SimOptions(nodes=5)) for s in FIVE_NODE_SEEDS]


@pytest.fixture(scope="module")
def membership_results() -> list[SimResult]:
    three = [run_seed(s, SimOptions(nodes=3, membership="always")) for s in MEMBERSHIP_THREE_NODE_SEEDS]
    return three + [run_seed(s, SimOptions(nodes=5, membership="always")) for s in MEMBERSHIP_FIVE_NODE_SEEDS]


def test_three_node_clusters_stay_safe_and_live(three_node_results: list[SimResult]) -> None:
    assert all(r.ok for r in three_node_results), _failures(three_node_results)


def test_five_node_clusters_stay_safe_and_live(five_node_results: list[SimResult]) -> None:
    assert all(r.ok for r in five_node_results), _failures(five_node_results)


def test_seed_4225_catches_a_follower_up_without_a_message_storm() -> None:
    """Regression: stale acks flipped a probing follower back to REPLICATE (see
    tests/test_raft_core.py::test_a_stale_success_does_not_release_the_window_of_a_probing_follower).

    The leader (32 appends in flight, 200-byte batches) resent its window thousands of
    times to a follower 400 entries behind and ran out of the event budget at t=2654.
    """
    opts = SimOptions(nodes=3, membership="never")  # the scenario as found, before membership changes
    res = run_seed(4225, opts)
    assert res.ok, res.describe()
    budget = opts.events_per_node_tick * opts.nodes * (opts.fault_ticks + 3 * opts.heal_ticks)
    assert res.stats.events < budget // 5, f"{res.stats.events} events of a budget of {budget}"


def test_a_faulted_disk_is_probed_as_often_in_ticks_as_in_production() -> None:
    """Regression (seed 4747): the simulator ran the runtime with production's 1 s disk probe
    on ticks 5x shorter, so a node whose disk came back when the network healed stayed mute
    for up to 100 of the 150 ticks the heal phase allows, and its quorum could not elect."""
    sim = Simulation(4747, SimOptions(nodes=3))
    sim._start(0)
    runtime = sim.nodes[0].runtime
    assert runtime is not None
    production_ticks = DEFAULT_DISK_RETRY_S * 1000 / NodeConfig.tick_ms
    assert runtime.disk_retry_s * 1000 / sim.opts.tick_ms == pytest.approx(production_ticks)
    res = run_seed(4747, SimOptions(nodes=3))
    assert res.ok, res.describe()


def test_the_runs_exercise_every_fault_and_feature(three_node_results: list[SimResult]) -> None:
    """A green run that never crashed a node or confirmed a read would prove nothing."""
    total: dict[str, int] = {}
    for r in three_node_results:
        for k, v in asdict(r.stats).items():
            total[k] = total.get(k, 0) + v
    n = len(three_node_results)
    floors = {  # roughly a third of what the seeds exercised when this test was written
        "crashes": 4 * n,
        "elections": 2 * n,
        "acked_writes": 50 * n,
        "acked_by_deposed": n // 10,  # a deposed leader acknowledging what the next one committed
        "failed_writes": n // 5,  # definite failures: another entry committed at the index
        "unknown_writes": n // 5,  # pending appends expired on the simulated clock
        "reads_ok": 10 * n,
        "reads_dropped": n,  # reads lost with leadership are reported, not silently kept
        "transfers": 2 * n,
        "timeout_now": n // 2,  # transfers that got as far as TimeoutNow
        "install_base": n,  # retention pushed followers behind a leader's first index
        "truncations": n // 5,  # uncommitted suffixes overwritten by a later leader
        "compactions": 2 * n,
        "peer_lost": n,  # connection-lost notices (crashes and cut links) drive fast elections
        "disk_full": n,  # disks refusing writes: the node hands over, goes mute and resumes
        "damaged": n // 10,  # crashes that cut a durable suffix (storage damage, a salvaged log)
        "repaired": n // 10,  # damaged nodes that held their claimed log again
        "lost_state": n // 10,  # crashes that lost term and vote: recovering, no double vote
    }
    low = {k: (total[k], floor) for k, floor in floors.items() if total[k] < floor}
    assert not low, f"the simulation stopped exercising: {low} (totals {total})"


def test_groups_changing_their_members_stay_safe_and_live(membership_results: list[SimResult]) -> None:
    """Learners added (fresh nodes and removed ones coming back), promoted, members removed (the
    leader too), nodes retired, among every other fault: one leader per term, nothing committed
    lost or changed, every node's configuration at a committed index the one committed there."""
    assert all(r.ok for r in membership_results), _failures(membership_results)


def test_the_membership_runs_change_members_for_real(membership_results: list[SimResult]) -> None:
    total: dict[str, int] = {}
    for r in membership_results:
        for k, v in asdict(r.stats).items():
            total[k] = total.get(k, 0) + v
    n = len(membership_results)
    floors = {  # roughly a third of what the seeds exercised when this test was written
        "config_committed": n // 2,  # changes committed (about 1.9 a seed)
        "config_refused": n // 3,  # one at a time, catch-up, reachable majority
        "nodes_added": n // 3,  # fresh nodes joined as learners
        "readded": n // 8,  # removed nodes added back with their old state
        "removed_leaders": n // 15,  # leaders that removed themselves and handed over
        "retired": n // 8,  # removed nodes shut down for good
        "install_base": n,  # learners behind the leader's retention
        "damaged": n // 20,  # storage damage still happens alongside
        "acked_writes": 40 * n,
    }
    low = {k: (total[k], floor) for k, floor in floors.items() if total[k] < floor}
    assert not low, f"the membership runs stopped exercising: {low} (totals {total})"


def _fingerprint(seed: int, options: SimOptions) -> tuple:
    sim = Simulation(seed, options)
    sim.run()
    logs = tuple(
        (
            n.id,
            n.hard_state,
            n.log.base_index,
            tuple(
                (e.index, e.term, bytes(e.data)) for e in n.log.entries(n.log.first_index, n.log.last_index)
            ),
        )
        for n in sim.nodes
    )
    return (asdict(sim.stats), logs, sim.now)


def test_a_seed_replays_exactly() -> None:
    """Same seed, same run: the whole point of the simulator (no wall clock, no hash order)."""
    opts = SimOptions(nodes=3)
    assert _fingerprint(7, opts) == _fingerprint(7, opts)
    assert _fingerprint(7, opts) != _fingerprint(8, opts)
    changing = SimOptions(nodes=3, membership="always")
    assert _fingerprint(7, changing) == _fingerprint(7, changing)
    assert changing.replay_command(7).endswith("--membership always --trace")


def test_seeds_without_membership_changes_replay_as_before_they_existed() -> None:
    """The membership profile is drawn from a stream of its own: a seed it leaves off runs the
    exact events it ran before membership changes existed (its recorded replay stays valid)."""
    seed = next(s for s in range(100) if not Simulation(s, SimOptions(nodes=3)).profile.membership)
    assert _fingerprint(seed, SimOptions(nodes=3)) == _fingerprint(
        seed, SimOptions(nodes=3, membership="never")
    )


def test_a_seed_replays_across_hash_seeds() -> None:
    """String hashing is randomised per process; a run must not depend on set or dict hash order."""
    code = (
        "import hashlib, sys; from ledger.sim import Simulation, SimOptions; "
        "s = Simulation(11, SimOptions(nodes=5)); st = s.run(); "
        "logs = [(n.id, n.hard_state, [(e.index, e.term, bytes(e.data)) for e in "
        "n.log.entries(n.log.first_index, n.log.last_index)]) for n in s.nodes]; "
        "print(hashlib.sha256(repr((st, logs, s.now)).encode()).hexdigest())"
    )
    digests = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1


# Each mutation breaks one rule the runtime or the core must keep; the checker must notice.
# (mutation, words one of which the first violation found must contain, seeds to try)
MUTANTS = [
    ("forget_vote", ("election safety", "leader completeness", "state machine"), range(120)),
    ("ack_on_append", ("durability", "acknowledged write", "state machine"), range(40)),
    ("vote_any_log", ("leader completeness", "state machine", "log matching"), range(60)),
    ("local_reads", ("linearizability",), range(60)),
    ("no_durable_notice", ("liveness",), range(10)),
    ("naive_async_sync", ("durability", "acknowledged write"), range(400)),
    ("send_before_persist", ("persisted",), range(40)),
    (
        "forget_damage",
        ("durability", "leader completeness", "acknowledged write", "state machine"),
        range(60),
    ),
    # A double vote needs a lost hard state, the right crash and a split vote: about one seed in
    # 500 has all three, so the window is placed on one that does: seed 1204 (before and after
    # the stale-ack fix of seed 4225; that fix changed seed 276's traffic, which had caught it).
    ("forget_lost_state", ("election safety", "leader completeness", "state machine"), range(1150, 1250)),
    # Membership mutations run with changes in every seed.
    ("keep_removed_config", ("membership",), range(80)),
    ("learners_count", ("durability", "acknowledged write"), range(40)),
]
MEMBERSHIP_MUTANTS = {"keep_removed_config", "learners_count"}


def test_every_mutation_is_covered() -> None:
    assert {m for m, _, _ in MUTANTS} == set(MUTATIONS) - {"none"}


@pytest.mark.parametrize(("mutation", "expected", "seeds"), MUTANTS, ids=[m for m, _, _ in MUTANTS])
def test_checkers_catch_a_broken_runtime(mutation: str, expected: tuple[str, ...], seeds: range) -> None:
    opts = SimOptions(
        nodes=3, mutation=mutation, membership="always" if mutation in MEMBERSHIP_MUTANTS else "swarm"
    )
    for seed in seeds:
        res = run_seed(seed, opts)
        if not res.ok:
            assert res.error is not None
            headline = res.error.splitlines()[0]
            assert any(word in headline for word in expected), f"seed {seed}: unexpected failure {headline}"
            return
    pytest.fail(f"mutation {mutation!r} went unnoticed in seeds {seeds}: the checkers are too weak")


def test_the_replay_command_reproduces_a_failure(capsys: pytest.CaptureFixture[str]) -> None:
    """The command printed for a failing seed must fail the same way when run."""
    opts = SimOptions(nodes=3, mutation="forget_vote")
    failing = next(r for r in (run_seed(s, opts) for s in range(120)) if not r.ok)
    assert failing.error is not None
    command = opts.replay_command(failing.seed)
    assert f"--seed {failing.seed}" in command and "--mutation forget_vote" in command
    args = command.split()[3:]  # drop "python -m ledger.sim"
    args.remove("--trace")
    assert main(args) == 1
    printed = capsys.readouterr().out
    assert failing.error.splitlines()[0] in printed
