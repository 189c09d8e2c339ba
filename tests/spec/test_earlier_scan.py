"""An audit whose read of a ledger came before a worker's swap there
(``auditor_marks_from_earlier_scan``): its mark names the bookie the swap replaced. Each
claim is shown on the reachable states of ``c-short`` (two crashes, swaps, audits)."""

from __future__ import annotations

import pytest

from bkref.spec import protocol as p
from bkref.spec.config import Config
from bkref.spec.configs import NAMED
from tests.spec.test_open_ledgers import Step, _steps

CFG: Config = NAMED["c-short"]
NAME = "auditor_marks_from_earlier_scan"


@pytest.fixture(scope="module")
def steps() -> list[Step]:
    return list(_steps(CFG))


def _replaced_down(s: p.State, ledger: int) -> int:
    return sum(1 << r for _i, _f, r in s.meta_rereplicated[ledger] if r >= 0 and s.b_up[r] != p.UP)


def test_the_mark_names_a_replaced_bookie_the_ledger_no_longer_has(steps: list[Step]) -> None:
    taken = [(s, int(str(a[0])), t) for s, (name, a), t in steps if name == NAME]
    assert taken
    gone = 0
    for s, lg, t in taken:
        stale = _replaced_down(s, lg)
        assert stale
        assert t.meta_task[lg][1] == stale | p._audit(s).meta_task[lg][1]
        assert t.meta_task[lg][0] > s.meta_task[lg][0]  # a worker's versioned delete fails
        now = {b for _f, ens in s.meta_segments[lg] for b in ens}
        gone += any(stale >> b & 1 and b not in now for b in range(CFG.bookies))
    assert gone  # the race has an effect: a task naming a bookie gone from the ledger


def test_it_is_the_due_audit_and_never_marks_less(steps: list[Step]) -> None:
    """The draft that marked from the earlier read alone missed a swapped-in bookie lost
    before the mark (the mutant ``audit-marks-only-its-earlier-scan``): this step marks
    what the audit of the moment marks, in every ledger, and more."""
    taken = [(s, t) for s, (name, _a), t in steps if name == NAME]
    for s, t in taken:
        regular = p._audit(s)
        assert (t.au_stale, t.au_missed) == (0, 0)
        for lg in range(CFG.ledgers):
            assert regular.meta_task[lg][1] & ~t.meta_task[lg][1] == 0


def test_it_needs_a_due_audit_and_a_replaced_bookie_not_up(steps: list[Step]) -> None:
    enabled = {(id(s), int(str(a[0]))) for s, (name, a), _t in steps if name == NAME}
    refused = 0
    for s, _label, _t in steps:
        for lg in range(CFG.ledgers):
            possible = (
                s.au_stale
                and p.auditor_node(s) >= 0
                and s.meta_autorecovery
                and _replaced_down(s, lg) & ~p._audit(s).meta_task[lg][1]
            )
            assert ((id(s), lg) in enabled) == bool(possible)
            refused += bool(s.au_stale and s.meta_rereplicated[lg] and not possible)
    assert refused  # a swap alone is not enough


BOTH = "auditor_marks_from_earlier_view_and_scan"


def test_with_an_earlier_view_too_the_mark_names_a_replaced_bookie_up_again(
    steps: list[Step],
) -> None:
    """Both reads early (netns-29 ledger 9 of the soak): the mark names a bookie the swap
    replaced that is up again by the mark, which neither race alone marks; every other
    mark is the earlier view's."""
    taken = [(s, int(str(a[0])), t) for s, (name, a), t in steps if name == BOTH]
    assert taken
    up_again = 0
    for s, lg, t in taken:
        view = p._audit(s, s.au_back)
        assert s.au_back
        assert (t.au_stale, t.au_back) == (0, 0)
        assert t.meta_task[lg][0] > s.meta_task[lg][0]
        assert view.meta_task[lg][1] & ~t.meta_task[lg][1] == 0
        for other in range(CFG.ledgers):
            if other != lg:
                assert t.meta_task[other] == view.meta_task[other]
        extra = t.meta_task[lg][1] & ~view.meta_task[lg][1]
        replaced = sum(1 << r for _i, _f, r in s.meta_rereplicated[lg] if r >= 0)
        assert extra
        assert extra & ~replaced == 0
        now = {b for _f, ens in s.meta_segments[lg] for b in ens}
        up_again += any(
            extra >> b & 1 and s.b_up[b] == p.UP and b not in now for b in range(CFG.bookies)
        )
    assert up_again  # the race has an effect the two steps apart do not have


def test_both_reads_early_need_a_bookie_back_since_the_last_audit(steps: list[Step]) -> None:
    enabled = {(id(s), int(str(a[0]))) for s, (name, a), _t in steps if name == BOTH}
    assert enabled
    for s, _label, _t in steps:
        if not s.au_back:
            assert all((id(s), lg) not in enabled for lg in range(CFG.ledgers))
