"""Fixtures: local clusters of real bookie processes on the session's ZooKeeper, and
the test's own ZooKeeper view of one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from bkref.impl.cluster.local import LocalCluster
from bkref.impl.meta.store import ZkMetadataStore
from bkref.impl.meta.underreplication import UnderreplicationManager
from bkref.impl.testing import Clusters, zookeeper_view

MakeCluster = Callable[..., LocalCluster]
ZkView = Callable[[LocalCluster], tuple[ZkMetadataStore, UnderreplicationManager]]


@pytest.fixture
def make_cluster(tmp_path: Path, zk_connect: str) -> Iterator[MakeCluster]:
    """``make_cluster(n, **bookie_config)``: n bookies registered under a fresh chroot."""
    with Clusters(tmp_path, zk_connect) as make:
        yield make


@pytest.fixture
def zk_view() -> Iterator[ZkView]:
    """``zk_view(cluster)``: the test's own ZooKeeper view of the cluster (metadata and
    AutoRecovery state), closed after the test."""
    with ExitStack() as views:
        yield lambda cluster: views.enter_context(zookeeper_view(cluster.zk_hosts))
