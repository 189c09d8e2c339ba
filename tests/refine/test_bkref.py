"""bkref's bookies, writer and recovery client held against the spec (real ZooKeeper, real files).

The machine picks spec steps; ``BkrefDriver`` performs them on ``BookieCore``
over ``BookieStorage`` in a temporary directory (journal fsync, entry logs,
index), on ``LedgerWriter`` and ``LedgerRecovery``, with metadata in the
session's ZooKeeper. Every config the driver supports must pass, taking every
step the spec offers; every planted bug the driver can exercise must be caught
within 2,000 examples, and the same seed must pass without the plant.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble
from bkref.impl.core.planted import PLANTS
from bkref.refine.bkref_driver import BkrefDriver
from bkref.refine.machine import run
from bkref.spec.config import MUTANTS
from bkref.spec.configs import NAMED

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

SUPPORTED = [n for n, c in NAMED.items() if not BkrefDriver.unsupported_reasons(c)]

# Every planted bug, and the config that catches it.
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

CAUGHT_IN = {
    "recovery-reads-without-fence": "a-short",
    "ack-before-fsync": "m-journal",
    # Breaks no hand-written invariant and loses nothing a history shows: only the
    # comparison of the bookie's whole state with the spec's sees the forgotten LAC.
    "bookie-forgets-lac-on-replay": "b",
    # The worker's own decision (a CAS with no copy before it) is what the spec refuses.
    "repair-without-copy": "c-short",
    # A worker that meets an open ledger on a lost bookie and does not have it fenced.
    "repair-open-segment-without-fence": "m-open-segment",
    # The spec's mutant of the same name: an ack of the replaced bookie confirms e0.
    "acks-from-replaced-bookie-count": "m-4651",
    # The spec's mutant of the same name: the writer's retry puts the lost bookie back in
    # the segment a worker repaired (NoLostMetadataUpdate, in bkref's own state).
    "ensemble-change-undoes-swap": "m-merge-writer",
    # The write-back's LAC is the spec's message: seen at once, reader or not.
    "recovery-piggybacks-its-own-lac": "a-readers",
}


@pytest.fixture(scope="module")
def zk(zookeeper: ZooKeeperEnsemble) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zookeeper.connection_string)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


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


@pytest.mark.parametrize("name", SUPPORTED)
def test_bkref_refines_the_spec(name: str, zk: KazooClient) -> None:
    stats, found = run(NAMED[name], lambda: BkrefDriver(zk), examples=60, seed=0)
    assert found is None, found.report() if found else ""
    unexpected = set(stats.refused) - REFUSALS
    assert not unexpected, f"steps the implementation cannot take: {stats.refused_why}"
    assert stats.examples >= 60
    # Past the first steps (the machine did not stall); live-check has 36 states in all,
    # and 60 short examples of it reached 14 in one verify run.
    assert len(stats.states) > 5


def test_a_recovery_that_gives_up_fails_in_bkref_where_the_spec_s_does(zk: KazooClient) -> None:
    # D18: the bookies the spec has down answer with errors; bkref's LedgerRecovery must
    # fail then and not before, and the client's next recovery must match the spec's.
    stats, found = run(NAMED["a-give-up"], lambda: BkrefDriver(zk), examples=150, seed=0)
    assert found is None, found.report() if found else ""
    assert stats.actions["recovery_client_gives_up"] >= 1
    assert not set(stats.refused) - REFUSALS


@pytest.mark.parametrize("plant", sorted(CAUGHT_IN))
def test_a_planted_bug_is_caught_and_the_same_seed_passes_without_it(
    plant: str, zk: KazooClient
) -> None:
    cfg = NAMED[CAUGHT_IN[plant]]
    stats, found = run(
        cfg, lambda: BkrefDriver(zk, plants=frozenset({plant})), examples=2000, seed=0
    )
    assert found is not None, f"{plant} not caught in {stats.examples} examples"
    assert stats.first_failure <= 2000
    # Shrunk from examples of up to 60 steps. How far shrinking gets is not guaranteed (a
    # change to the driver changes its path): the shortest counterexamples are 3 to 13 steps
    # (recovery-piggybacks-its-own-lac: two adds, fencing, a read and its write-back at ack
    # quorum, then the read whose write-back carries the wrong LAC), shrunk to 14 at most.
    assert 0 < len(found.trace) <= 20, "shrunk to a short list of spec steps"
    _control, clean = run(cfg, lambda: BkrefDriver(zk), examples=stats.first_failure, seed=0)
    assert clean is None, clean.report() if clean else ""


def test_a_bookie_that_skips_its_cookie_check_is_caught(
    zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec's wiped bookie stays out (REFUSED); one that starts anyway is caught."""
    monkeypatch.setattr("bkref.refine.bkref_bookie.verify_or_create", lambda *a, **k: None)
    stats, found = run(NAMED["m-2612"], lambda: BkrefDriver(zk), examples=2000, seed=0)
    assert found is not None, f"not caught in {stats.examples} examples"
    assert found.trace[-1][0] == "bookie_restarts_with_wiped_disk"
    assert re.search(r"≠ b\d\.up +REFUSED +UP", found.report()), found.report()


def test_the_command_exits_1_with_a_replayable_counterexample(zookeeper: ZooKeeperEnsemble) -> None:
    base = [sys.executable, "-m", "bkref.impl.cli.main", "refine", "--zookeeper"]
    base += [zookeeper.connection_string, "--config", "a-short", "--seed", "0"]
    bad = subprocess.run(
        [*base, "--examples", "300", "--plant", "recovery-reads-without-fence"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert bad.returncode == 1, bad.stderr
    assert "spec steps:" in bad.stdout
    assert "recovery_client_starts_recovery" in bad.stdout
    assert "replay: bkref refine --driver bkref --config a-short --seed 0" in bad.stdout
    good = subprocess.run(
        [*base, "--examples", "20"], capture_output=True, text=True, timeout=600, check=False
    )
    assert good.returncode == 0, good.stdout + good.stderr
    assert "config a-short: " in good.stdout
    assert "distinct abstract states" in good.stdout
