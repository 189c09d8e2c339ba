"""Shared fixtures: real ZooKeeper servers come from the package's pytest plugin.

Hypothesis runs without per-example deadlines: a deadline is a timing
assertion, and this suite runs on shared, noisy machines. Performance is
measured by the benchmarks, never asserted by tests.
"""

from hypothesis import settings

settings.register_profile("bkref", deadline=None)
settings.load_profile("bkref")

pytest_plugins = ["impl.cluster.pytest_plugin"]
