"""The pure quorum helpers: striping, coverage, recovery start, LAC advance."""

from __future__ import annotations

import itertools

import pytest

from bkref.spec.quorum import (
    contiguous_confirmed,
    fencing_covers_ensemble,
    has_quorum_coverage,
    quorum_coverage,
    recovery_start_entry,
    write_set_positions,
)


def test_write_sets_stripe_round_robin_over_the_ensemble() -> None:
    assert [write_set_positions(e, 4, 3) for e in range(5)] == [
        (0, 1, 2),
        (1, 2, 3),
        (2, 3, 0),
        (3, 0, 1),
        (0, 1, 2),
    ]


def test_with_e_equal_wq_every_entry_goes_to_the_whole_ensemble() -> None:
    assert {frozenset(write_set_positions(e, 3, 3)) for e in range(6)} == {frozenset({0, 1, 2})}


@pytest.mark.parametrize(("wq", "aq", "need"), [(3, 2, 2), (3, 3, 1), (3, 1, 3), (5, 3, 3)])
def test_quorum_coverage_is_wq_minus_aq_plus_one(wq: int, aq: int, need: int) -> None:
    assert quorum_coverage(wq, aq) == need
    assert has_quorum_coverage(need, wq, aq)
    assert not has_quorum_coverage(need - 1, wq, aq)


def test_coverage_means_every_ack_quorum_is_hit() -> None:
    # Brute force: a set covers a cohort of size Wq iff it meets every Aq-subset.
    for wq, aq in [(3, 2), (4, 2), (4, 3), (5, 3)]:
        cohort = range(wq)
        for size in range(wq + 1):
            chosen = set(range(size))
            meets_all = all(chosen & set(q) for q in itertools.combinations(cohort, aq))
            assert has_quorum_coverage(size, wq, aq) == meets_all


def test_fencing_must_cover_each_write_set_when_striping() -> None:
    # E=4, Wq=3, Aq=2: each write set needs 2 fenced members. {0, 1, 2} meets all
    # four write sets twice; {0, 2} leaves (1, 2, 3) with one; with E=Wq=3, {0, 1} suffices.
    assert fencing_covers_ensemble(0b0111, 4, 3, 2)
    assert not fencing_covers_ensemble(0b0101, 4, 3, 2)
    assert fencing_covers_ensemble(0b0011, 3, 3, 2)


def test_recovery_starts_after_lac_but_never_before_the_last_segment() -> None:
    assert recovery_start_entry(-1, 0) == 0
    assert recovery_start_entry(4, 2) == 5
    assert recovery_start_entry(-1, 1) == 1  # BOOKKEEPER-2615: not 0


def test_lac_advances_over_the_contiguous_prefix_at_ack_quorum_only() -> None:
    assert contiguous_confirmed(-1, (2, 1, 2), 2) == 0
    assert contiguous_confirmed(-1, (2, 2, 2), 2) == 2
    assert contiguous_confirmed(0, (2, 0, 3), 2) == 0
    assert contiguous_confirmed(-1, (), 2) == -1
