"""The replication worker core over a round of tasks and a long fragment, and a repair
run's answers out of turn (the worker core's main tests: test_autorecovery_worker_core)."""

from __future__ import annotations

import pytest

from bkref.impl.core.actions import LocalProtocolError
from bkref.impl.core.audit import Probe
from bkref.impl.core.metadata import Segment
from bkref.impl.core.repair import Reason
from bkref.impl.core.repair_run import PLANT_OPEN_SEGMENT, ReadOpenLac, RepairRun
from bkref.impl.core.replication import WorkerConfig, WorkerPhase
from bkref.impl.core.worker_actions import TryLock
from tests.impl.core_helpers import A, B, C, D, ledger_md
from tests.impl.test_autorecovery_worker_core import CLOSED, LIVE, OPEN, RACKS, _locked, _task


def test_a_ledger_backing_off_is_skipped_and_the_round_goes_on_to_the_next() -> None:
    core = _locked(config=WorkerConfig(backoff_ms=5_000), now=1_000)
    core.on_ledger(CLOSED, 10, 1_000, live=LIVE, candidates=RACKS)
    core.take_actions()
    core.on_failed("RepairError('no verified copy')", 2_000)
    core.take_actions()
    core.on_unlocked(2_000)
    # Ledger 1 is the most at risk, so first in the round, but backs off until 7,000.
    core.on_tasks([(_task(1, priority=0), 4), (_task(2, priority=1), 0)], 3_000, wall_ms=0)
    assert core.take_actions() == [TryLock(2)]


def test_a_replica_the_task_lists_is_checked_at_every_entry_however_long_its_fragment() -> None:
    # The periodic check may sample; the worker's check of what the task names may not:
    # a missing entry it skipped would complete the task with the replica still short.
    long = ledger_md((Segment(0, (A, B, C)),), closed_at=999, password=b"pw")
    core = _locked(_task(replicas={B: Reason.ENTRIES_MISSING}))
    core.on_ledger(long, 10, 0, live=LIVE | {A}, candidates=RACKS)
    [probe] = core.take_actions()
    assert isinstance(probe, Probe)
    assert core.phase is WorkerPhase.CHECKING
    assert probe.fragment.bookie == B
    every = tuple(probe.fragment.entries(long))
    assert len(every) > 600
    assert probe.entries == every


def test_a_second_lac_answer_for_the_open_segment_is_refused() -> None:
    run = RepairRun(
        1, OPEN, 10, {A: Reason.LOST}, RACKS, local=D, plants=frozenset({PLANT_OPEN_SEGMENT})
    )
    assert run.take_actions() == [ReadOpenLac(1, (B, C))]
    run.on_open_lac(3)
    with pytest.raises(LocalProtocolError, match="no LAC read pending"):
        run.on_open_lac(3)
