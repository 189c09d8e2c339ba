"""An audit whose read of the registrations came before a bookie registered again
(``auditor_marks_from_earlier_view``): its marks name that bookie, up by then. Each
claim is shown on the reachable transitions of config ``c`` (a crash, a restart, audits,
a worker)."""

from __future__ import annotations

import pytest

from bkref.spec import protocol as p
from bkref.spec.config import Config
from bkref.spec.configs import NAMED
from bkref.spec.symmetry import canonical
from tests.spec.test_open_ledgers import Step, _steps

CFG: Config = NAMED["c"]
NAME = "auditor_marks_from_earlier_view"
BACK = ("bookie_restarts", "bookie_registers_again", "bookie_restarts_with_wiped_disk")


@pytest.fixture(scope="module")
def steps() -> list[Step]:
    return list(_steps(CFG))


def _mask(bookies: set[int]) -> int:
    return sum(1 << b for b in bookies)


def _named(s: p.State) -> int:
    return _mask({b for segs in s.meta_segments for _f, ens in segs for b in ens})


def test_the_marks_name_a_bookie_up_again_and_never_less_than_the_audit_of_the_moment(
    steps: list[Step],
) -> None:
    taken = [(s, t) for s, (name, _a), t in steps if name == NAME]
    assert taken
    up_and_marked = 0
    for s, t in taken:
        regular = p._audit(s)
        assert (t.au_stale, t.au_missed, t.au_back) == (0, 0, 0)  # it is the due audit
        for lg in range(CFG.ledgers):
            version, lost = t.meta_task[lg]
            assert regular.meta_task[lg][1] & ~lost == 0
            named = _mask({b for _f, ens in s.meta_segments[lg] for b in ens})
            extra = lost & ~regular.meta_task[lg][1]
            assert extra & ~(s.au_back & named) == 0  # only bookies back since the audit
            down = _mask({b for b in range(CFG.bookies) if s.b_up[b] != p.UP})
            bumped = version == s.meta_task[lg][0] + 1  # a worker's versioned delete fails
            assert bumped == bool(named & (s.au_back | down))
            up_and_marked += any(extra >> b & 1 and s.b_up[b] == p.UP for b in range(CFG.bookies))
    assert up_and_marked


def test_it_needs_a_due_audit_and_a_bookie_back_that_a_ledger_names(steps: list[Step]) -> None:
    enabled = {id(s) for s, (name, _a), _t in steps if name == NAME}
    refused = 0
    for s, _label, _t in steps:
        possible = (
            s.au_stale and p.auditor_node(s) >= 0 and s.meta_autorecovery and s.au_back & _named(s)
        )
        assert (id(s) in enabled) == bool(possible)
        refused += bool(s.au_stale and not s.au_back)
    assert refused  # a due audit alone is not enough


def test_a_bookie_is_back_from_its_registration_until_the_next_audit(steps: list[Step]) -> None:
    for s, (name, args), t in steps:
        if name in BACK and t.b_up[int(str(args[0]))] == p.UP:
            assert t.au_back == s.au_back | 1 << int(str(args[0]))
        elif name.startswith("auditor_marks") or name == "auditor_runs_periodic_bookie_check":
            assert t.au_back == 0
        elif name in ("bookie_crashes", "bookie_loses_session"):
            assert t.au_back == s.au_back & ~(1 << int(str(args[0])))
        else:
            assert t.au_back == s.au_back, name


def test_a_task_a_worker_deleted_comes_back_naming_a_bookie_that_is_up(
    steps: list[Step],
) -> None:
    """The race the step models has an effect: a ledger whose task is gone (a worker
    found it whole) gets a new one naming a registered bookie, which a worker must then
    take, verify and delete."""
    reborn = [
        (s, t)
        for s, (name, _a), t in steps
        if name == NAME
        and any(
            not s.meta_task[lg][1]
            and t.meta_task[lg][1]
            and all(s.b_up[b] == p.UP for b in range(CFG.bookies) if t.meta_task[lg][1] >> b & 1)
            for lg in range(CFG.ledgers)
        )
    ]
    assert reborn
    after = {canonical(t) for _s, t in reborn}
    taken = [s for s, (name, _a), _t in steps if name == "worker_acquires_ledger_lock"]
    assert [s for s in taken if canonical(s) in after]  # a worker may take it at once
