"""bkref: a formally specified, model-checked reference implementation of the Apache
BookKeeper ledger protocol and its AutoRecovery.

One namespace, one area per subpackage (the dependency direction is an import-linter
contract in pyproject.toml):

- :mod:`bkref.spec`: the executable spec (stdlib only) and its model checker.
- :mod:`bkref.impl`: the real system: bookies, client, ZooKeeper metadata, AutoRecovery.
- :mod:`bkref.linearizability`: the history format and the checkers.
- :mod:`bkref.nemesis`: fault campaigns on real clusters.
- :mod:`bkref.spark_checks`: the same verdicts on PySpark, for very large histories.
- :mod:`bkref.refine`: the spec held against the implementation, step by step.

``docs/api.md`` is the public API, with examples (run by the test suite).
"""
