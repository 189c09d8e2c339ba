"""bkref's AutoRecovery held against the spec on the m- AutoRecovery configs, each made
as the smallest that catches a spec mutant (run here without it):
test_bkref_autorecovery.py has the others, test_bkref.py says how the machine works."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from tests.refine.test_bkref import AUTORECOVERY_M_CONFIGS, refines

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


@pytest.mark.parametrize("name", AUTORECOVERY_M_CONFIGS)
def test_bkref_refines_the_spec(name: str, zk: KazooClient) -> None:
    refines(name, zk)
