"""Launchers for local clusters: ZooKeeper servers and (later) bookie processes."""
