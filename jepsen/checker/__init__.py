"""The consistency checker: histories in (docs/history.md), verdicts and reports out.

``analyze.analyze_files`` is the entry point (the ``jepsen analyze`` command wraps it).
Modules: ``parse`` and ``edn`` read the formats, ``frames`` loads them into Spark and
pairs operations, ``log_checker`` judges the log workload, ``linear`` (with
``linear_spark``) the register and kv workloads, ``results`` writes results.json,
``timeline`` collects in one job what ``recovery`` and the report's ``plotdata`` need,
``keyspread`` picks how many partitions a history's keys fill, ``synth`` makes large test
histories, ``spark`` holds the one Spark session, ``spark_cluster`` starts and stops the
local standalone cluster (``jepsen spark``), ``report`` renders report.html. Small
histories skip Spark: ``inprocess`` pairs and judges them in this process, with
``linear.check_rows`` (the function Spark's groups call) and ``log_rules`` (the log rules
per key, tested to agree with ``log_checker``). The broker's held-message workloads (delay,
txn, retry, order) are judged by ``semantics_checker`` on Spark and ``semantics_rules``
in-process, which share their anomaly names and tolerances in ``semantics_model``.
Importing this package does not start Spark.
"""
