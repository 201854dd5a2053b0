"""Faults: what the nemesis breaks and heals, and the schedule that cycles them.

The faults act only through a system's primitives (kill, pause, cut links, fill a disk,
forge a peer); every action is recorded as nemesis events in the history.
"""
