"""A bookie process's start: it registers in ZooKeeper before it listens for requests, as
BookKeeper's does, so a restarted bookie serves nothing while it is still lost to the
auditor and the workers (the spec's restart registers and serves at once)."""

from __future__ import annotations

import socket
import time

import pytest
from kazoo.client import KazooClient

from bkref.impl.meta import layout
from tests.impl.conftest import MakeCluster

pytestmark = pytest.mark.zookeeper


def _owner(zk: KazooClient, path: str) -> int | None:
    stat = zk.exists(path)
    return None if stat is None else int(stat.ephemeralOwner)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def test_a_restarted_bookie_listens_only_once_its_new_session_registered_it(
    make_cluster: MakeCluster,
) -> None:
    # A SIGKILLed bookie's registration lingers until its session expires (4 s here); the
    # restarted process cannot register before then, and must not serve meanwhile.
    cluster = make_cluster(1, zkTimeout=4000)
    b = cluster.bookies[0]
    path = f"{layout.available(cluster.zk_root)}/{b.bookie_id}"
    zk = KazooClient(hosts=cluster.zk_hosts)
    zk.start(timeout=15)
    try:
        old = _owner(zk, path)
        assert old is not None
        cluster.kill_bookie(0)
        cluster.start_bookie(0, wait=False)
        deadline = time.monotonic() + 60
        while not _listening(b.port):
            assert time.monotonic() < deadline, "the restarted bookie never listened"
            time.sleep(0.02)
        new = _owner(zk, path)
        assert new is not None, "the bookie listens, unregistered"
        assert new != old, "the bookie listens while only its killed process's session has it"
    finally:
        zk.stop()
        zk.close()
    cluster.wait_registered([0])
