"""A worker's lock dropped by ZooKeeper (``worker_loses_lock``): the spec step and what a
worker that lost its lock may still do, on every reachable state of ``c-lock``, the one
config that budgets it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bkref.spec.checker import check
from bkref.spec.configs import NAMED
from bkref.spec.invariants import AtMostOneWorkerHoldsLedgerLock
from bkref.spec.protocol import (
    B_LOCK,
    RECOVERING,
    VERIFIED,
    State,
    initial_state,
    set_at,
    shares_task,
    worker_copies_fragment,
    worker_loses_lock,
    worker_releases_lock,
)
from tests.spec.test_open_ledgers import Step, _steps

CFG = NAMED["c-lock"]


@pytest.fixture(scope="module")
def steps() -> list[Step]:
    return list(_steps(CFG))


def _unlocked(s: State, w: int) -> bool:
    return bool(s.wk_unlocked >> w & 1)


def test_a_lost_lock_frees_the_ledger_and_keeps_the_worker_at_work(steps: list[Step]) -> None:
    losses = [(s, int(str(a[0])), t) for s, (name, a), t in steps if name == "worker_loses_lock"]
    assert losses
    for s, w, t in losses:
        ledger = s.wk[w][1]
        assert s.meta_lock[ledger] == w
        assert not _unlocked(s, w)
        assert t.meta_lock[ledger] == -1
        assert t.wk == s.wk
        assert t.wk_seen == s.wk_seen
        assert _unlocked(t, w)
        assert t.budget[B_LOCK] == s.budget[B_LOCK] - 1
    # Only a holder loses a lock, and only while the budget lasts. c-lock's one loss is
    # spent by the time another worker holds the lock the first one still works on, so
    # each non-holder is asked again with a loss left: its guard must refuse it alone.
    for s, _label, _t in steps:
        for w in range(len(s.wk)):
            holds = s.wk[w][1] >= 0 and s.meta_lock[s.wk[w][1]] == w
            if not holds or not s.budget[B_LOCK]:
                assert worker_loses_lock(CFG, s, w) is None
            if not holds:
                left = s._replace(budget=set_at(s.budget, B_LOCK, 1))
                assert worker_loses_lock(CFG, left, w) is None


def test_another_worker_takes_the_ledger_and_the_first_release_leaves_its_lock(
    steps: list[Step],
) -> None:
    beside = [
        (s, t)
        for s, (name, a), t in steps
        if name == "worker_acquires_ledger_lock"
        and any(_unlocked(s, v) and s.wk[v][1] == a[1] for v in range(len(s.wk)))
    ]
    assert beside, "no worker took a ledger another one still worked on"
    releases = 0
    for s, (name, a), t in steps:
        if name not in ("worker_releases_lock", "worker_deletes_task", "worker_fails_repair"):
            continue
        w = int(str(a[0]))
        ledger = s.wk[w][1]
        assert t.wk[w][1] == -1
        assert not _unlocked(t, w)
        if _unlocked(s, w):
            releases += 1
            assert t.meta_lock[ledger] == s.meta_lock[ledger]  # not its lock to delete
        else:
            assert t.meta_lock[ledger] == -1
    assert releases
    assert all(AtMostOneWorkerHoldsLedgerLock(CFG, t) for _s, _label, t in steps)


def test_a_lock_kept_by_a_worker_that_let_its_ledger_go_is_a_violation(
    steps: list[Step],
) -> None:
    # A lock is held by the worker at work on its ledger: a release that kept the znode
    # would leave the ledger locked for good, and no worker would repair it again.
    held = [
        (s, w)
        for s, _label, _t in steps
        for w, (_b, ledger, _v, _p) in enumerate(s.wk)
        if ledger >= 0 and s.meta_lock[ledger] == w
    ]
    assert held
    for s, w in held:
        idle = set_at(s.wk, w, (s.wk[w][0], -1, 0, None))
        kept = s._replace(wk=idle, wk_seen=set_at(s.wk_seen, w, 0))
        assert AtMostOneWorkerHoldsLedgerLock(CFG, s)
        assert not AtMostOneWorkerHoldsLedgerLock(CFG, kept)


def test_a_failure_counted_beside_another_worker_on_the_task_fails_the_other_s_delete(
    steps: list[Step],
) -> None:
    # A worker lost its lock and another took the ledger, both with a read of the same
    # task version. Either one letting go and counting its failed attempt writes the task
    # at that version: the version moves on under the other, whose versioned delete fails.
    counted = 0
    for s, (name, a), t in steps:
        if name not in ("worker_releases_lock", "worker_fails_repair") or len(a) < 2 or not a[1]:
            continue
        counted += 1
        w = int(str(a[0]))
        _b, ledger, tv, _p = s.wk[w]
        others = [v for v, (_b2, lg, vtv, _p2) in enumerate(s.wk) if v != w and lg == ledger]
        assert [v for v in others if s.wk[v][2] == tv], "nobody else read the version"
        assert any(_unlocked(s, v) for v in (w, *others))
        assert s.meta_task[ledger][0] == tv
        assert t.meta_task[ledger] == (tv + 1, s.meta_task[ledger][1])
    assert counted, "no worker that lost its lock counted its failure beside another"


def test_a_worker_that_lost_its_lock_copies_no_more_but_may_write_its_copied_swap(
    steps: list[Step],
) -> None:
    swaps = dropped = 0
    for s, (name, a), t in steps:
        w = int(str(a[0])) if name.startswith("worker_") else -1
        if w < 0 or not _unlocked(s, w):
            continue
        ledger = s.wk[w][1]
        segments = range(len(s.meta_segments[ledger]))
        assert all(worker_copies_fragment(CFG, s, w, i) is None for i in segments)
        assert worker_releases_lock(CFG, s, w) is not None  # it may let go at any point
        if name == "worker_updates_segment_ensemble":
            if t.meta_segments[ledger] != s.meta_segments[ledger]:
                swaps += 1
            else:  # the other worker's swap replaced its lost bookie first
                dropped += 1
    assert swaps
    assert dropped


def test_the_mutant_that_deletes_any_lock_is_caught_on_c_lock() -> None:
    r = check(CFG.with_mutant("release-deletes-any-lock"))
    assert r.violation == "AtMostOneWorkerHoldsLedgerLock"


def test_workers_share_a_task_only_on_the_same_ledger() -> None:
    # Task versions are numbered per ledger: workers on two ledgers whose tasks happen to
    # be at the same version share nothing (neither's count can fail the other's delete).
    cfg = replace(CFG, closed_ledgers=2, workers=2)
    s = initial_state(cfg)
    assert cfg.ledgers >= 2
    tasks = set_at(set_at(s.meta_task, 0, (1, 1)), 1, (1, 1))
    (b0, _l0, _v0, _p0), (b1, _l1, _v1, _p1) = s.wk[:2]
    apart = s._replace(meta_task=tasks, wk=((b0, 1, 1, None), (b1, 0, 1, None), *s.wk[2:]))
    assert not shares_task(apart, 0)
    assert not shares_task(apart, 1)
    same = apart._replace(wk=((b0, 1, 1, None), (b1, 1, 1, None), *s.wk[2:]))
    assert shares_task(same, 0)
    assert shares_task(same, 1)


def test_a_worker_s_pending_step_is_a_marker_or_a_copy(steps: list[Step]) -> None:
    # What a worker holds besides its lock: nothing, one of two markers (VERIFIED,
    # RECOVERING: no bookie in them, so the symmetry reduction renames none), or a copy
    # of a segment from a lost bookie at a metadata version.
    kinds: set[object] = set()
    for s, _label, _t in steps:
        for _b, _ledger, _tv, pending in s.wk:
            if pending is None or pending in (VERIFIED, RECOVERING):
                kinds.add(pending)
                continue
            idx, lost, version = pending
            assert idx >= 0, pending
            assert 0 <= lost < len(s.b_up), pending
            assert version >= 0, pending
            kinds.add("copy")
    assert {None, VERIFIED, "copy"} <= kinds  # c-lock recovers no open ledger
