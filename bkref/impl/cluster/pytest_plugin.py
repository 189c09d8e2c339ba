"""pytest fixtures that start real ZooKeeper servers; usable by other projects.

Enable with ``pytest_plugins = ["bkref.impl.cluster.pytest_plugin"]``.

- ``zookeeper``: one standalone server for the whole session.
- ``zk_connect``: a connection string with a fresh chroot on that server, so
  tests do not see each other's znodes.
- ``zookeeper_ensemble``: a 3-server ensemble of the test's own (tests may kill nodes).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble, ZooKeeperSettings

# The tests' server skips the fsync of each transaction (``forceSync=no``): no test
# crashes the machine, and a server a test kills has its writes in the page cache. The
# refinement machine's examples write hundreds of znodes each; fsync took a third of it.
TEST_SETTINGS = ZooKeeperSettings(force_sync=False)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperEnsemble]:
    ensemble = ZooKeeperEnsemble(
        directory=tmp_path_factory.mktemp("zookeeper"),
        size=1,
        settings=TEST_SETTINGS,
        die_with_owner=True,  # a test run killed (a timeout's os._exit) leaves no server
    )
    try:
        ensemble.start()
        yield ensemble
    finally:
        ensemble.stop()


def fresh_chroot(zookeeper: ZooKeeperEnsemble, prefix: str = "bkref-test") -> str:
    """A connection string to ``zookeeper`` with a new, empty chroot."""
    chroot = f"/{prefix}-{uuid.uuid4().hex[:12]}"
    client = KazooClient(hosts=zookeeper.connection_string)
    client.start(timeout=15)
    try:
        client.ensure_path(chroot)
    finally:
        client.stop()
        client.close()
    return zookeeper.connection_string + chroot


@pytest.fixture
def zk_connect(zookeeper: ZooKeeperEnsemble) -> str:
    return fresh_chroot(zookeeper)


@pytest.fixture
def zookeeper_ensemble(tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    ensemble = ZooKeeperEnsemble(
        directory=tmp_path / "zk-ensemble", size=3, settings=TEST_SETTINGS, die_with_owner=True
    )
    try:
        ensemble.start()
        yield ensemble
    finally:
        ensemble.stop()
