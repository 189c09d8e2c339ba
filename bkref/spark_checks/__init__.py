"""bkref.spark_checks: PySpark jobs that check very large recorded histories.

Dependency direction: spark_checks imports linearizability and spec; it never
touches the running system (impl, nemesis).

- ``job``: ``bkref spark-check`` (also ``spark-submit bkref/spark_checks/job.py``);
- ``session``: the SparkSession (local[*] by default, quiet, the venv's Python);
- ``load``: histories into Spark (Parquet, JSON Lines converted), pairing, validation;
- ``ledger``: per-ledger linearizability, the ledger checker's algorithm in Spark SQL;
- ``durability``: acknowledged adds against the final reads;
- ``generic``: the generic search per key through applyInPandas (registers, kv);
- ``replication``: the audit of bookie dumps (the dump format is documented there);
- ``messages``: anomaly messages from ``bkref.linearizability.anomalies``' templates, as
  Spark expressions;
- ``report``: Parquet tables, summary.json, index.html.

Each check decides exactly what its single-process counterpart in
``linearizability`` decides; tests/spark_checks holds them together.
"""
