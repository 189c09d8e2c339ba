"""bkref's AutoRecovery (auditor, replication workers, their locks and tasks in ZooKeeper)
held against the spec: every AutoRecovery config the driver supports (test_bkref.py
says how the machine works)."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from bkref.spec.configs import NAMED
from tests.refine.test_bkref import SUPPORTED, refines

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


@pytest.mark.parametrize("name", [n for n in SUPPORTED if NAMED[n].autorecovery])
def test_bkref_refines_the_spec(name: str, zk: KazooClient) -> None:
    refines(name, zk)
