"""The fault-injection harness: stand up a group, load it, inject faults, record a history.

The harness records and the checker judges; the two meet only in ``history.jsonl``
(``shared/HISTORY.md``). Modules: ``history`` (the recorder), ``proxy`` (cuttable TCP
links for partitions without root), ``backends`` / ``syncobj`` (the systems under test and
their fault primitives), ``clients`` (adapters that turn system answers into ok/fail/info),
``workloads``, ``nemesis``, ``monitor`` (who led when), ``check`` (the Spark checker on the
result), ``runner`` (orchestration) and ``run_cli`` (``jepsen run``).
"""
