"""ledgermq's Jepsen-style harness and its consistency checker.

Laid out by the field's axes, each floor importing only the floors below it
(``tests/test_harness_layers.py`` holds the list):

- ``cli`` — the ``jepsen`` command (``run``, ``campaign``, ``analyze``, ``history``,
  ``spark``, ``probe``);
- ``run/`` — one run (``runner``: validate, record, judge), worker processes, the leader
  monitor, the checker hand-off, campaigns, and the ``run``/``campaign`` commands; beside
  it ``probe/``, hostile-input probes against a running group;
- ``workloads/`` — one module per workload: its operations and the checker that judges it;
  beside them ``faults/``, one small object per fault, registered by name, and the schedule;
- ``systems/`` — one module per system under test: its nodes, fault primitives, clients;
- ``net/`` (link proxies and relays) and ``docker/`` (the compose group); local groups of
  processes are the launchers' below the harness (``common.localgroup`` with the node specs
  of ``ledger.localcluster`` and ``broker.localgroup``), as is ``common.ports``;
- ``history`` (the recorder of ``docs/history.md``'s format);
- ``checker/`` — histories in, verdicts and reports out; it imports nothing of the harness:
  the two meet only in the history.
"""
