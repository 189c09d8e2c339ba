"""bkref's AutoRecovery (auditor, replication workers, their locks and tasks in ZooKeeper)
held against the spec: every AutoRecovery config the driver supports but the m- ones,
which test_bkref_autorecovery_mutant_configs.py runs (test_bkref.py says how the machine
works)."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from tests.refine.test_bkref import AUTORECOVERY_OTHER_CONFIGS, refines

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


@pytest.mark.parametrize("name", AUTORECOVERY_OTHER_CONFIGS)
def test_bkref_refines_the_spec(name: str, zk: KazooClient) -> None:
    refines(name, zk)
