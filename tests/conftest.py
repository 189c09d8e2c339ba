"""Shared fixtures: real ZooKeeper servers come from the package's pytest plugin."""

pytest_plugins = ["impl.cluster.pytest_plugin"]
