"""bkref.linearizability: the history format and the checkers that judge histories.

- ``history``: the format (Jepsen's vocabulary), its records, validation, pairing;
  ``history_files``: its JSON Lines and Parquet readers and writers.
- ``anomalies``: every anomaly kind and the templates of its messages.
- ``wgl``: the generic checker (Wing-Gong search, Lowe's cache, per-key partitions).
- ``models``: register, cas-register, kv, and the ledger model of ``bkref.spec.ledger_model``.
- ``ledger_checker``: ledgers checked without search, anomalies in Jepsen's names.
- ``timeline``: self-contained HTML timelines; ``check_cli``: ``bkref check``.
- ``peer``: readers for Jepsen's cas-register logs and EDN kv histories.
- ``durability``, ``replication``: acknowledged entries against final reads; bookie dumps.
- ``generate``: valid ledger histories by simulation; ``columnar``: whole ledgers as
  arrays; ``plant``: planted anomalies; ``testing``: a history builder for tests.

Dependency direction: linearizability may import spec (its models are the
spec's sequential model) and nothing else of bkref.
"""
