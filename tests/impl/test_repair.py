"""The pure repair planning of AutoRecovery (bkref/impl/core/repair.py)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from bkref.impl.core.metadata import LedgerState, Segment
from bkref.impl.core.repair import (
    Fragment,
    Health,
    Reason,
    Scheduling,
    Task,
    choose_target,
    fragments,
    health,
    is_repaired,
    live_replicas,
    needs_fencing,
    order_tasks,
    replace_replica,
    segment_range,
)
from tests.impl.core_helpers import A, B, C, D, E, ledger_md

RACKS = {A: "r1", B: "r2", C: "r3", D: "r4", E: "r5"}


def test_open_last_segment_is_never_a_fragment_to_copy_but_earlier_ones_are() -> None:
    md = ledger_md((Segment(0, (A, B, C)), Segment(10, (A, B, D))))
    assert segment_range(md, 0) == (0, 9)
    assert segment_range(md, 1) == (10, None)
    frags = fragments(md, 7, {A})
    assert [(f.segment, f.first, f.last, f.bookie) for f in frags] == [(0, 0, 9, A)]
    assert needs_fencing(md, {A})
    assert not needs_fencing(md, {C})
    closed = replace(md, state=LedgerState.CLOSED, last_entry=14)
    assert [(f.segment, f.last) for f in fragments(closed, 7, {A})] == [(0, 9), (1, 14)]
    assert not needs_fencing(closed, {A})


def test_fragment_entries_are_those_whose_write_set_holds_the_index() -> None:
    md = ledger_md((Segment(0, (A, B, C)),), closed_at=8)
    frag = Fragment(1, 0, 0, 8, (A, B, C), 0)
    # E=3, Wq=2: entry e is on indexes e%3 and (e+1)%3; index 0 holds e%3 in {0, 2}.
    assert frag.entries(md) == [0, 2, 3, 5, 6, 8]
    assert frag.sources(md, 0) == [B]
    assert frag.sources(md, 2) == [C]


def test_a_copy_reads_from_the_other_replicas_bad_ones_last_never_the_target() -> None:
    md = ledger_md((Segment(0, (C, D, E)),), closed_at=8, wq=3)
    frag = Fragment(1, 0, 0, 8, (C, D, E), 0)  # C lost; D and E hold every entry
    # Whatever the bookie ids' order, the target (B, which sorts first) is never a source.
    assert frag.copy_sources(md, 4, B, ()) == [D, E]
    assert frag.copy_sources(md, 4, B, {D}) == [E, D]  # D is bad: it may still serve
    assert frag.copy_sources(md, 4, E, ()) == [D]  # E named already: not a source for E


@given(st.integers(1, 5), st.data())
def test_every_entry_of_a_closed_ledger_is_in_exactly_wq_fragments(
    e: int, data: st.DataObject
) -> None:
    wq = data.draw(st.integers(1, e))
    last = data.draw(st.integers(-1, 30))
    ens = tuple(f"b{i}:1" for i in range(e))
    md = ledger_md((Segment(0, ens),), closed_at=last, e=e, wq=wq, aq=1)
    counts = [0] * (last + 1)
    for f in fragments(md, 1, set(ens)):
        for x in f.entries(md):
            counts[x] += 1
    assert counts == [wq] * (last + 1)


def test_live_replicas_and_health() -> None:
    md = ledger_md((Segment(0, (A, B, C)),), closed_at=20)
    assert live_replicas(md, {A, B, C}) == 2
    assert live_replicas(md, {A, B}) == 1  # entries on (B, C) and (C, A) lost one
    assert health(md, {A, B, C}) is Health.HEALTHY
    assert health(md, {A, B}) is Health.REPLICA_MISSING
    assert health(md, {A, B, C}, entries_missing=[B]) is Health.ENTRIES_MISSING
    assert health(md, {A, B, C}, leaving=[C]) is Health.RELOCATING
    assert health(md, {A, B, C}, redundant=[D]) is Health.REDUNDANT
    assert health(md, {A, B, C}, redundant=[A]) is Health.HEALTHY  # named: not redundant
    # An empty segment (the ledger was closed before it got an entry) holds nothing.
    empty = ledger_md((Segment(0, (A, B, C)), Segment(5, (A, B, D))), closed_at=4)
    assert live_replicas(empty, {A, B, C}) == 2
    # A segment of one entry (first == last) holds it: D's loss leaves that entry short.
    one = ledger_md((Segment(0, (A, B, C)), Segment(5, (A, B, D))), closed_at=5)
    assert live_replicas(one, {A, B, C}) == 1


def test_choose_target_keeps_failure_domains_apart_and_prefers_local_or_target() -> None:
    frag = Fragment(1, 0, 0, 9, (A, B, C), 0)
    assert choose_target(frag, RACKS) == D
    assert choose_target(frag, RACKS, prefer=[E]) == E
    assert choose_target(frag, RACKS, local=E) == E
    assert choose_target(frag, RACKS, local=B) is None  # already in the ensemble
    same_rack = {**RACKS, D: "r2", E: "r3"}  # D shares B's rack, E shares C's
    assert choose_target(frag, same_rack) is None
    assert choose_target(frag, same_rack, local=D) is None
    # The lost bookie's own rack is free again.
    assert choose_target(frag, {**RACKS, D: "r1"}) == D
    assert choose_target(frag, RACKS, exclude={D}) == E
    # Another replica of the segment already moves to D in this repair: not D again, and
    # not D's failure domain either.
    assert choose_target(frag, RACKS, exclude={D}, joining={D}) == E
    assert choose_target(frag, {**RACKS, E: "r4"}, exclude={D}, joining={D}) is None


def test_replace_replica_only_where_the_segment_still_names_the_bookie() -> None:
    md = ledger_md((Segment(0, (A, B, C)), Segment(10, (A, B, D))), closed_at=12)
    new = replace_replica(md, 0, A, E)
    assert new is not None
    assert new.segments == (Segment(0, (E, B, C)), Segment(10, (A, B, D)))
    assert replace_replica(new, 0, A, D) is None
    assert replace_replica(md, 5, A, E) is None
    assert replace_replica(md, 2, A, E) is None  # no segment 2 (any more)
    assert replace_replica(md, 0, A, B) is None  # B would hold two replicas of segment 0
    assert not is_repaired(new, {A: Reason.LOST})
    done = replace_replica(new, 1, A, C)
    assert done is not None
    assert is_repaired(done, {A: Reason.LOST})
    assert not is_repaired(md, {A: Reason.ENTRIES_MISSING})  # it moves as a lost one does
    assert is_repaired(done, {A: Reason.ENTRIES_MISSING})


def test_a_replica_missing_entries_in_an_empty_segment_only_is_repaired() -> None:
    # Found by `bkref refine --config c-open-check`: the ledger closed before its second
    # segment got an entry; the periodic check listed D (it missed an entry of segment 0),
    # segment 0 was repaired, and the empty segment 1 still names D. Nothing is left to
    # copy, so the task is done; waiting for D to leave segment 1 kept it forever.
    md = ledger_md((Segment(0, (A, B, E)), Segment(5, (A, C, D))), closed_at=4)
    assert segment_range(md, 1) == (5, 4)  # empty
    assert is_repaired(md, {D: Reason.ENTRIES_MISSING})
    assert not is_repaired(md, {D: Reason.LOST})  # a lost bookie still moves out of it
    assert not is_repaired(md, {E: Reason.ENTRIES_MISSING})  # segment 0 has entries


def test_most_at_risk_first_with_failures_deprioritised_and_old_tasks_promoted() -> None:
    s = Scheduling(deprioritize_after_failures=5, promote_after_ms=1000)
    now = 10_000
    one_left = Task(1, {A: Reason.LOST}, 1, now - 10)
    two_left = Task(2, {A: Reason.LOST}, 2, now - 20)
    older_two = Task(3, {A: Reason.LOST}, 2, now - 30)
    assert [t.ledger_id for t in order_tasks([two_left, older_two, one_left], now, s)] == [1, 3, 2]
    failing = replace(one_left, failures=5)
    assert [t.ledger_id for t in order_tasks([failing, two_left], now, s)] == [2, 1]
    waited = replace(two_left, ctime_ms=now - 5000)  # promoted to the tier of one_left
    assert [t.ledger_id for t in order_tasks([one_left, waited], now, s)] == [2, 1]


def test_a_new_task_has_failed_no_attempt_yet() -> None:
    # A task the auditor just marked runs in its tier even where one failure
    # deprioritises: only the failed one goes behind every other tier.
    s = Scheduling(deprioritize_after_failures=1, promote_after_ms=10**9)
    fresh = Task(1, {A: Reason.LOST}, 2, 0)
    failed = Task(2, {A: Reason.LOST}, 1, 0, failures=1)
    assert fresh.failures == 0
    assert [t.ledger_id for t in order_tasks([failed, fresh], 0, s)] == [1, 2]
