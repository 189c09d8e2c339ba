"""bkref's AutoRecovery (auditor, replication workers, their locks and tasks in ZooKeeper)
held against the spec: every named AutoRecovery config the driver supports; the configs
of the spec's AutoRecovery mutants are in test_bkref_autorecovery_mutant_configs.py, so
that two of `make verify`'s workers share them (test_bkref.py says how the machine
works)."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from tests.refine.test_bkref import AUTORECOVERY_CONFIGS, refines

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


@pytest.mark.parametrize("name", [n for n in AUTORECOVERY_CONFIGS if not n.startswith("m-")])
def test_bkref_refines_the_spec(name: str, zk: KazooClient) -> None:
    refines(name, zk)
