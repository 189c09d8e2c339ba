"""bkref.linearizability: the history format and the checkers that judge histories.

- ``history``: the format (JSON Lines / Parquet, Jepsen's vocabulary), readers, writers.
- ``wgl``: the generic checker (Wing-Gong search, Lowe's cache, per-key partitions).
- ``models``: register, cas-register, kv, and the ledger model of ``spec.ledger_model``.
- ``ledger_checker``: ledgers checked without search, anomalies in Jepsen's names.
- ``timeline``: self-contained HTML timelines; ``check_cli``: ``bkref check``.
- ``peer``: readers for Jepsen's cas-register logs and EDN kv histories.
- ``generate``: valid ledger histories by simulation, and planted anomalies.

Dependency direction: linearizability may import spec (its models are the
spec's sequential model) and nothing else of bkref.
"""
