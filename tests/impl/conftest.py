"""Fixtures: a local cluster of real bookie processes on the session's ZooKeeper."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from impl.cluster.local import LocalCluster

MakeCluster = Callable[..., LocalCluster]


@pytest.fixture
def make_cluster(tmp_path: Path, zk_connect: str) -> Iterator[MakeCluster]:
    """``make_cluster(n, **bookie_config)``: n bookies registered under a fresh chroot."""
    made: list[LocalCluster] = []

    def make(bookies: int, *, autorecovery: bool = False, **overrides: object) -> LocalCluster:
        c = LocalCluster(
            tmp_path / f"cluster{len(made)}", dict(overrides), autorecovery=autorecovery
        )
        made.append(c)
        c.up(bookies, zk_connect=zk_connect)
        return c

    yield make
    for c in made:
        c.down()
