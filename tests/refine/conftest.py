"""The refinement tests' ZooKeeper client: one per module, on the session's ensemble."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble


@pytest.fixture(scope="module")
def zk(zookeeper: ZooKeeperEnsemble) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zookeeper.connection_string)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()
