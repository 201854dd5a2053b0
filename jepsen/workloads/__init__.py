"""Workloads: what a run's clients do, recorded as history operations, and which checker judges them.

``base`` holds the run context and one operation's outcome (``attempt``); one module per
workload (``log``, ``register``, ``queue``, and the broker's held-message ones ``delay``, ``txn``,
``retry``, ``order``, which share ``semantics``). A workload reaches a system only through the client adapter interface
(``jepsen.systems.clients``).
"""
