"""Every fault by its ``--nemesis`` name: a new fault is one class and one line here.

The order is the one ``jepsen run --help`` lists them in.
"""

from __future__ import annotations

from jepsen.faults.base import Fault
from jepsen.faults.disk import (
    CorruptTail,
    DiskFull,
    LoseData,
    LoseDataEmpty,
    LoseDataHardstate,
    LoseDataTruncate,
    LoseDataWipe,
)
from jepsen.faults.forge import ForgePeer
from jepsen.faults.membership import MembershipChange
from jepsen.faults.network import LossyNetwork, SlowNetwork
from jepsen.faults.partition import Bridge, PartitionLeader, PartitionMajoritiesRing, PartitionRandomHalves
from jepsen.faults.process import KillLeader, KillMajority, KillRandom, PauseLeader, PauseRandom, RestartAll
from jepsen.systems.base import Backend, Unsupported

FAULTS: dict[str, type[Fault]] = {
    f.name: f
    for f in (
        KillLeader,
        KillRandom,
        KillMajority,
        PauseLeader,
        PauseRandom,
        PartitionLeader,
        PartitionRandomHalves,
        PartitionMajoritiesRing,
        Bridge,
        RestartAll,
        CorruptTail,
        SlowNetwork,
        LossyNetwork,
        LoseData,
        LoseDataWipe,
        LoseDataTruncate,
        LoseDataEmpty,
        LoseDataHardstate,
        ForgePeer,
        DiskFull,
        MembershipChange,
    )
}


def unknown_faults(names: list[str] | tuple[str, ...]) -> list[str]:
    """The names among ``names`` that are no fault."""
    return [f for f in names if f not in FAULTS]


def check_faults(names: list[str] | tuple[str, ...], backend: Backend) -> None:
    """Refuse (``Unsupported``) the first of ``names``, in registry order, that ``backend`` cannot have."""
    for name, fault in FAULTS.items():
        if name in names:
            reason = fault.refusal(backend)
            if reason:
                raise Unsupported(reason)
