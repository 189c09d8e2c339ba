"""Metadata in ZooKeeper (through kazoo), laid out after BookKeeper's; every update a CAS."""
