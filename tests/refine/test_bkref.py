"""bkref's bookies, writer and recovery client held against the spec (real ZooKeeper, real files).

The machine picks spec steps; ``BkrefDriver`` performs them on ``BookieCore``
over ``BookieStorage`` in a temporary directory (journal fsync, entry logs,
index), on ``LedgerWriter`` and ``LedgerRecovery``, with metadata in the
session's ZooKeeper. Every config the driver supports must pass, taking every
step the spec offers: the ledger configs here, the AutoRecovery configs in
test_bkref_autorecovery.py and test_bkref_autorecovery_mutant_configs.py; every planted
bug the driver can exercise must be caught within 2,000 examples, and the same steps must
pass without the plant (test_bkref_planted.py). Four modules, so that `make verify`'s
workers share them.
"""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from bkref.impl.core.planted import PLANTS
from bkref.refine.bkref_driver import BkrefDriver
from bkref.refine.machine import run
from bkref.spec.config import MUTANTS
from bkref.spec.configs import NAMED
from tests.refine.test_bkref_planted import CAUGHT_IN

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

SUPPORTED = [n for n, c in NAMED.items() if not BkrefDriver.unsupported_reasons(c)]
LEDGER_CONFIGS = [n for n in SUPPORTED if not NAMED[n].autorecovery]
AUTORECOVERY_CONFIGS = [n for n in SUPPORTED if NAMED[n].autorecovery]  # their own modules
# Split in two modules, so that two of `make verify`'s workers share them: the m- configs,
# each made for a spec mutant, and the others.
AUTORECOVERY_M_CONFIGS = [n for n in AUTORECOVERY_CONFIGS if n.startswith("m-")]
AUTORECOVERY_OTHER_CONFIGS = [n for n in AUTORECOVERY_CONFIGS if not n.startswith("m-")]

# Spec steps bkref has no way to take (docs/refine.md says why): the machine counts them.
REFUSALS = {
    "writer_resends_add",
    "recovery_client_changes_ensemble",
    "recovery_client_resends_add",
    "node_wins_auditor_election",  # only the lowest vote can win (D16)
    # bkref's LAC read takes the maximum of the last ensemble where BookKeeper's long poll
    # takes one bookie's, and its read answer carries no LAC (docs/refine.md).
    "reader_receives_lac",
    "reader_reads_entry",
}


# Examples per config in `make verify`: 20 (60 until 2026-11-29, then 40, then 30 as the
# suite grew). An example costs 0.2-0.5 CPU s; under load it waits several times that on
# ZooKeeper and fsync while bookies start and stop, and these modules were a third of a
# loaded verify's test time. Finding bugs at depth is the job of the planted tests'
# 2,000-example budget and of `make refine` (2,000 per config).
EXAMPLES = 20


def refines(name: str, zk: KazooClient) -> None:
    """EXAMPLES examples of config ``name``: no difference, no step refused but REFUSALS."""
    stats, found = run(NAMED[name], lambda: BkrefDriver(zk), examples=EXAMPLES, seed=0)
    assert found is None, found.report() if found else ""
    unexpected = set(stats.refused) - REFUSALS
    assert not unexpected, f"steps the implementation cannot take: {stats.refused_why}"
    assert stats.examples >= EXAMPLES
    # Past the first steps (the machine did not stall); live-check has 36 states in all,
    # and 60 short examples of it reached 14 in one verify run.
    assert len(stats.states) > 5


def test_every_named_config_is_supported() -> None:
    # Two recovery clients included (a-recoveries): one LedgerRecovery each.
    assert set(SUPPORTED) == set(NAMED)
    assert NAMED["a-recoveries"].recovery_clients == 2
    assert set(CAUGHT_IN) == set(PLANTS)


# Planted bugs that no spec mutant re-creates: the machine catches them by comparing
# states, not by an invariant of a mutated spec (docs/refine.md).
IMPL_ONLY = {"repair-without-copy", "bookie-forgets-lac-on-replay"}


def test_a_bug_has_one_name_in_the_spec_and_the_implementation() -> None:
    # A planted bug re-creating a spec mutant carries the mutant's name, so that a
    # campaign, the refinement machine and the model checker speak of it alike.
    assert set(PLANTS) - IMPL_ONLY <= set(MUTANTS)
    assert not IMPL_ONLY & set(MUTANTS)


@pytest.mark.parametrize("name", LEDGER_CONFIGS)
def test_bkref_refines_the_spec(name: str, zk: KazooClient) -> None:
    refines(name, zk)


def test_a_recovery_that_gives_up_fails_in_bkref_where_the_spec_s_does(zk: KazooClient) -> None:
    # D18: the bookies the spec has down answer with errors; bkref's LedgerRecovery must
    # fail then and not before, and the client's next recovery must match the spec's.
    # The first give-up comes in example 25 at seed 0 (the next in example 108).
    stats, found = run(NAMED["a-give-up"], lambda: BkrefDriver(zk), examples=60, seed=0)
    assert found is None, found.report() if found else ""
    assert stats.actions["recovery_client_gives_up"] >= 1
    assert not set(stats.refused) - REFUSALS
