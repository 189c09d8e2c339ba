"""bkref.nemesis: Jepsen-style fault campaigns against a running cluster.

Dependency direction: nemesis imports impl (to run the cluster) and
linearizability (to check what it recorded); never spec or spark_checks.
"""
