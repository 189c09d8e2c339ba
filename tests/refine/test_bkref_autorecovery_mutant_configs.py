"""bkref's AutoRecovery held against the spec on the configs of the spec's AutoRecovery
mutants, without the mutants (each config is the smallest that catches its mutant):
test_bkref_autorecovery.py has the named configs, test_bkref.py says how the machine
works."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from tests.refine.test_bkref import AUTORECOVERY_CONFIGS, refines

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


@pytest.mark.parametrize("name", [n for n in AUTORECOVERY_CONFIGS if n.startswith("m-")])
def test_bkref_refines_the_spec(name: str, zk: KazooClient) -> None:
    refines(name, zk)
