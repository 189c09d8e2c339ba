"""bkref.spark_checks: PySpark jobs that check very large recorded histories.

Dependency direction: spark_checks imports linearizability and spec; it never
touches the running system (impl, nemesis).
"""
