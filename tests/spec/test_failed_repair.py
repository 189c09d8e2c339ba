"""A repair whose copy fails (``worker_fails_repair``): the spec step on every reachable
state of ``c-merge``, the one config that budgets it."""

from __future__ import annotations

import pytest

from bkref.spec.configs import NAMED
from bkref.spec.protocol import (
    B_REPAIR_FAIL,
    CLOSED,
    RECOVERING,
    VERIFIED,
    worker_copies_fragment,
    worker_fences_open_ledger,
    worker_releases_lock,
    worker_verifies_ledger_replicated,
)
from tests.spec.test_open_ledgers import Step, _steps

CFG = NAMED["c-merge"]


@pytest.fixture(scope="module")
def steps() -> list[Step]:
    return list(_steps(CFG))


def test_a_worker_lets_the_lock_go_with_a_copy_left_only_when_a_repair_fails(
    steps: list[Step],
) -> None:
    failed = [(s, a, t) for s, (name, a), t in steps if name == "worker_fails_repair"]
    assert failed
    deletes = swaps = rereads = 0
    for s, args, t in failed:
        w = int(str(args[0]))
        _bookie, ledger, _tv, pending = s.wk[w]
        assert ledger >= 0
        assert worker_releases_lock(CFG, s, w) is None  # a plain release is refused there
        # The lock is free, the task stays for a later attempt, one failure is spent.
        assert t.meta_lock[ledger] == -1
        assert t.wk[w][1] == -1
        assert t.meta_task == s.meta_task
        assert t.budget[B_REPAIR_FAIL] == s.budget[B_REPAIR_FAIL] - 1
        if pending == VERIFIED:  # its task delete failed on a ZooKeeper error
            deletes += 1
            continue
        if pending is not None and pending != RECOVERING:  # its swap's CAS failed so
            swaps += 1
            # The copy stays on the worker's bookie, named by no metadata.
            assert t.b_ledgers == s.b_ledgers
            assert t.meta_segments == s.meta_segments
            assert t.meta_version == s.meta_version
            continue
        # Nothing of its own under way (or the recovery it asked for has closed the ledger).
        assert pending is None or (pending == RECOVERING and s.meta_status[ledger] == CLOSED)
        # It could have copied a fragment, or found the ledger replicated (its re-read
        # after a swap failed: netns-37 ledger 175 of the soak), or fenced it.
        segments = range(len(s.meta_segments[ledger]))
        if worker_verifies_ledger_replicated(CFG, s, w) is not None:
            rereads += 1
        else:
            assert any(worker_copies_fragment(CFG, s, w, i) is not None for i in segments) or (
                worker_fences_open_ledger(CFG, s, w) is not None
            )
    assert 0 < deletes < len(failed)
    assert 0 < swaps < len(failed)
    assert 0 < rereads < len(failed)


def test_a_failed_repair_is_taken_again_and_completed(steps: list[Step]) -> None:
    """After a failed repair some worker still copies and deletes the task: the failure
    changes what is stored (a later attempt, perhaps after the writer or the recovery
    moved on), not only the lock."""
    # The budget is 1: a state with none left comes after the failure.
    after = {
        name
        for s, (name, _a), _t in steps
        if s.budget[B_REPAIR_FAIL] == 0 and name.startswith("worker_")
    }
    assert CFG.repair_failures == 1
    assert {"worker_copies_fragment", "worker_deletes_task"} <= after
