"""Every mutant re-creates its bug: an invariant catches it, fast, with a shortest trace."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from bkref.spec import checker
from bkref.spec.config import MUTANTS
from bkref.spec.configs import MUTANT_CONFIGS, NAMED, mutant_config
from bkref.spec.examples import example_text

EXAMPLES = Path(__file__).resolve().parents[2] / "bkref" / "spec" / "examples"

# One check per config in this module: the mutant's config is checked by two tests (its
# documented trace, and the leaked LAC's), 85 s on a loaded machine.
check = functools.cache(checker.check)

CAUGHT_BY = {
    "recovery-reads-without-fence": "NoDivergenceBetweenClientAndMetaData",
    "recovery-from-lac-minus-one": "OnlyValidFragments",
    "recovery-reads-from-new-ensemble": "NoDivergenceBetweenClientAndMetaData",
    "acks-before-ensemble-change-lands": "NoDivergenceBetweenClientAndMetaData",
    "acks-from-replaced-bookie-count": "AllCommittedEntriesReachAckQuorum",
    "negative-read-without-coverage": "NoDivergenceBetweenClientAndMetaData",
    "repair-open-segment-without-fence": "NoReplicationLosesAckedEntries",
    "delete-task-without-version-check": "AllClosedLedgersRepairedWhenQuiescent",
    "ack-before-fsync": "AllCommittedEntriesReachAckQuorum",
    "fence-lost-on-restart": "NoDivergenceBetweenClientAndMetaData",
    "wiped-bookie-rejoins": "NoDivergenceBetweenClientAndMetaData",
    "open-segment-without-entries-skipped": "AllClosedLedgersRepairedWhenQuiescent",
    "ensemble-change-undoes-swap": "NoLostMetadataUpdate",
    "recovery-close-undoes-swap": "NoLostMetadataUpdate",
    "worker-skips-ledger-lock": "AtMostOneWorkerHoldsLedgerLock",
    "release-deletes-any-lock": "AtMostOneWorkerHoldsLedgerLock",
    "auditor-without-election": "OneAuditorPerElectionEpoch",
    "auditor-acts-after-session-loss": "OneAuditorPerElectionEpoch",
    "audit-marks-only-its-earlier-scan": "AllClosedLedgersRepairedWhenQuiescent",
    "recovery-piggybacks-its-own-lac": "ReadersSeeOnlyTheClosedLedger",
}


def test_every_mutant_has_an_expectation() -> None:
    assert CAUGHT_BY.keys() == MUTANTS.keys()


# Its config takes about 47 CPU s: verify catches the mutant on a-readers (about 20) in
# test_a_leaked_lac_is_caught_in_store_with_a_reader_modelled, and `make verify-full`
# checks its documented trace as every other mutant's.
LONG_TO_CATCH = {"recovery-piggybacks-its-own-lac"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "mutant",
    [pytest.param(m, marks=pytest.mark.full) if m in LONG_TO_CATCH else m for m in sorted(MUTANTS)],
)
def test_mutant_is_caught_by_its_invariant_with_its_documented_trace(mutant: str) -> None:
    r = check(mutant_config(mutant))
    assert r.violation == CAUGHT_BY[mutant]
    assert r.trace[0].action == "Init"
    assert len(r.trace) == r.depth + 1
    # The documented example is this very trace.
    assert (EXAMPLES / f"{mutant}.txt").read_text() == example_text(mutant, r)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mutant",
    [
        # Config m-581 is the one config with two adds in flight: the spec before
        # BOOKKEEPER-581's read view failed it (recovery read from its own replacement).
        # About 34 CPU s, over 2 minutes of a worker in a loaded verify: `make spec-check`
        # checks it whole, as every named config, and verify catches the mutant on it.
        pytest.param("recovery-reads-from-new-ensemble", marks=pytest.mark.full),
        "negative-read-without-coverage",
        "delete-task-without-version-check",
        "worker-skips-ledger-lock",
        "auditor-acts-after-session-loss",
        # Its config (m-two-recoveries, about 120 CPU s) ran past the suite's 300 s in a
        # loaded verify; `make spec-check` checks it whole, as every named config.
        pytest.param("recovery-piggybacks-its-own-lac", marks=pytest.mark.full),
    ],
)
def test_the_same_config_without_the_mutant_is_correct(mutant: str) -> None:
    r = check(MUTANT_CONFIGS[mutant])
    assert r.violation is None
    assert r.complete


def _leak_in_store() -> checker.Result:
    """The LAC-leaking mutant on a-readers: about 20 CPU s."""
    return check(NAMED["a-readers"].with_mutant("recovery-piggybacks-its-own-lac"))


# Fixed work of about 20 CPU s: beside two busy loops a verify run's checks of this mutant
# took past the suite's 300 s (wall time).
@pytest.mark.timeout(900)
@pytest.mark.slow
def test_a_leaked_lac_is_caught_in_store_with_a_reader_modelled() -> None:
    # The mutant's own config, where a reader returns the leaked entry, is checked whole
    # by `make verify-full` and `make spec-check` (about 47 CPU s): the stored-LAC
    # invariant is what catches it here.
    assert _leak_in_store().violation == "NoDirtyReads"


@pytest.mark.full  # the mutant's own config: about 47 CPU s more
@pytest.mark.timeout(900)
@pytest.mark.slow
def test_a_leaked_lac_is_caught_in_store_before_a_reader_returns_the_entry() -> None:
    # The stored-LAC invariant says what the reader's observation does not: the leak, in
    # every config, with no reader modelled, and before a reader acts on it.
    stored = _leak_in_store()
    observed = check(mutant_config("recovery-piggybacks-its-own-lac"))
    assert stored.violation == "NoDirtyReads"
    assert observed.violation == "ReadersSeeOnlyTheClosedLedger"
    assert stored.depth < observed.depth
    # The reader's last step returns an entry the close excludes.
    assert observed.trace[-1].action.startswith(("reader_reads_entry", "recovery_client_closes"))
