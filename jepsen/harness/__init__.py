"""The fault-injection harness: stand up a group, load it, inject faults, record a history.

The harness records and the checker judges; the two meet only in the history
(``shared/HISTORY.md``: ``history.jsonl``, or a ``history/`` folder of shards). Modules:
``history`` (the recorder of one shard), ``proxy`` (cuttable TCP links for partitions
without root), ``relay`` (slowed peer links inside a docker container), ``backends`` / ``queue`` / ``syncobj`` / ``docker_backend`` (the systems under
test and their fault primitives), ``systems`` (which backend runs which system, and the
clients a worker process builds from a backend's addresses), ``clients`` (adapters that turn
system answers into ok/fail/info), ``workloads``, ``nemesis``, ``monitor`` (who led when),
``worker`` / ``pool`` (clients in OS processes for ``--rate max``), ``check`` (the checker on
the result), ``runner`` (orchestration) and ``run_cli`` (``jepsen run``).
"""
