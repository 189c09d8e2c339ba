"""A ZooKeeper ensemble in private namespaces under a real partition."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from bkref.impl.cluster.netns import run_in_netns
from bkref.impl.cluster.process import wait_until
from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble
from bkref.nemesis.netns import NamespaceNetwork, namespaces_supported
from bkref.nemesis.partition import isolate

SUPPORTED, WHY = namespaces_supported()
pytestmark = [
    pytest.mark.zookeeper,
    pytest.mark.skipif(not SUPPORTED, reason=f"no network namespaces here: {WHY}"),
]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[NamespaceNetwork, ZooKeeperEnsemble]]:
    net = NamespaceNetwork(["zk1", "zk2", "zk3", "client"], registry_dir=tmp_path / "registry")
    net.setup()
    placement = [(net.nodes[n].netns, net.nodes[n].ip) for n in ("zk1", "zk2", "zk3")]
    ensemble = ZooKeeperEnsemble(directory=tmp_path / "zk", placement=placement)
    try:
        ensemble.start()
        yield net, ensemble
    finally:
        ensemble.stop()
        net.teardown()


def test_isolated_leader_loses_leadership_and_the_majority_elects_another(
    cluster: tuple[NamespaceNetwork, ZooKeeperEnsemble],
) -> None:
    net, ensemble = cluster
    assert {s.host for s in ensemble.servers.values()} == {
        net.nodes[n].ip for n in ("zk1", "zk2", "zk3")
    }
    old = ensemble.leader()
    assert old is not None
    old_node = f"zk{old}"

    # The client lives in its own namespace: its threads and sockets stay there.
    zk = run_in_netns(net.nodes["client"].netns, lambda: KazooClient(ensemble.connection_string))
    run_in_netns(net.nodes["client"].netns, lambda: zk.start(timeout=15))
    try:
        zk.create("/ledgers/L1", b"before", makepath=True)

        net.apply_grudge(isolate(list(net.nodes), old_node))
        assert wait_until(lambda: ensemble.leader() not in {None, old}, timeout=30), (
            "the two connected servers did not elect a new leader"
        )
        # Cut off from the quorum, the old leader stops serving.
        assert wait_until(lambda: ensemble.mode(old) is None, timeout=30)

        zk.retry(zk.set, "/ledgers/L1", b"during")
        assert zk.retry(zk.get, "/ledgers/L1")[0] == b"during"

        net.heal()
        assert wait_until(lambda: ensemble.mode(old) == "follower", timeout=30)
    finally:
        zk.stop()
        zk.close()
