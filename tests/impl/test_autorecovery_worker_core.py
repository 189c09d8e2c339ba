"""The sans-I/O replication worker core, driven event by event: no ZooKeeper, no
bookies, no clock.

Each test feeds the events the worker's shell would (tasks, lock results, ledger
metadata, copy and CAS results, the injected time) and asserts the decisions the core
takes as actions: lock, copy, CAS, verify, complete or defer, unlock.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from bkref.impl.bookie.config import BookieConfig
from bkref.impl.core.actions import LocalProtocolError
from bkref.impl.core.audit import Probe, Verdict
from bkref.impl.core.metadata import Segment
from bkref.impl.core.repair import Fragment, Reason, Scheduling, Task, replace_replica
from bkref.impl.core.repair_run import (
    CAS_ATTEMPTS,
    PLANT_NO_COPY,
    PLANT_OPEN_SEGMENT,
    CasReplica,
    Copy,
    ReadOpenLac,
    RepairRun,
)
from bkref.impl.core.replication import WorkerConfig, WorkerCore, WorkerPhase
from bkref.impl.core.worker_actions import (
    CompleteTask,
    Defer,
    ReadLedger,
    RecordFailure,
    StartRecovery,
    TryLock,
    Unlock,
    Verified,
    WorkerAction,
)
from tests.impl.core_helpers import A, B, C, D, E, ledger_md

_md = functools.partial(ledger_md, password=b"pw")

RACKS = {B: "r2", C: "r3", D: "r4", E: "r5"}  # writable bookies; A is lost
LIVE = frozenset(RACKS)
CLOSED = _md((Segment(0, (A, B, C)),), closed_at=5)
OPEN = _md((Segment(0, (A, B, C)),))


def _task(lid: int = 1, priority: int = 1, replicas: dict[str, Reason] | None = None) -> Task:
    return Task(lid, replicas or {A: Reason.LOST}, priority, 0)


def _locked(
    task: Task | None = None,
    *,
    config: WorkerConfig | None = None,
    plants: frozenset[str] = frozenset(),
    now: int = 0,
) -> WorkerCore:
    """A worker beside bookie D that took the lock of ``task`` (ledger 1, A lost) at
    task version 3."""
    task = task or _task()
    core = WorkerCore("w1", D, config or WorkerConfig(), now, plants)
    core.on_tasks([(task, 3)], now, wall_ms=0)
    assert core.take_actions() == [TryLock(task.ledger_id)]
    core.on_lock(task.ledger_id, True, (task, 3), now)
    assert core.locked == task.ledger_id
    assert core.task_version == 3
    assert core.take_actions() == [ReadLedger(task.ledger_id, live=True, candidates=True)]
    return core


def _pending(core: WorkerCore) -> tuple[int, str, int] | None:
    return core.pending  # read through a call: mypy would keep an earlier narrowing


def _held(core: WorkerCore) -> tuple[int | None, int | None, WorkerPhase]:
    return core.locked, core.task_version, core.phase


def test_lock_copy_cas_verify_delete_unlock_one_step_at_a_time() -> None:
    core = _locked()
    core.on_ledger(CLOSED, 10, 0, live=LIVE, candidates=RACKS)
    [copy] = core.take_actions()
    frag = Fragment(1, 0, 0, 5, (A, B, C), 0)
    assert copy == Copy(CLOSED, frag, D, (B, C, D), frozenset({A}))
    assert core.pending == (0, A, 10)
    core.on_copied(4, 400)
    repaired = replace_replica(CLOSED, 0, A, D)
    assert repaired is not None
    assert core.take_actions() == [CasReplica(1, 0, A, D, repaired, 10)]
    assert core.pending == (0, A, 10)  # recorded only once the CAS lands
    core.on_cas(11)
    assert _pending(core) is None
    assert core.take_actions() == [ReadLedger(1, live=True)]
    core.on_ledger(repaired, 11, 0)
    assert core.take_actions() == [Verified(1), CompleteTask(1, 3, True)]
    core.on_completed(True)
    assert core.take_actions() == [Unlock(1)]
    assert _held(core) == (1, 3, WorkerPhase.UNLOCKING)  # until the shell says it is gone
    core.on_unlocked(0)
    assert _held(core) == (None, None, WorkerPhase.IDLE)
    assert core.take_actions() == []
    assert core.run is None


def test_most_at_risk_first_and_a_busy_lock_or_a_vanished_task_moves_on() -> None:
    safer, riskier, third = _task(1, priority=2), _task(2, priority=1), _task(3, priority=2)
    core = WorkerCore("w1", D, WorkerConfig(), 0)
    core.on_tasks([(safer, 0), (riskier, 0), (third, 0)], 0, wall_ms=0)
    assert core.take_actions() == [TryLock(2)]
    core.on_lock(2, False, None, 0)  # another worker holds it
    assert core.locked is None
    assert core.take_actions() == [TryLock(1)]
    core.on_lock(1, True, None, 0)  # completed by another worker meanwhile
    assert core.take_actions() == [Unlock(1)]
    assert core.attempted == 0
    core.on_unlocked(0)
    assert core.take_actions() == [TryLock(3)]


def test_nothing_is_locked_while_autorecovery_is_disabled() -> None:
    core = WorkerCore("w1", D, WorkerConfig(), 0)
    core.on_enabled(False)
    core.on_tasks([(_task(), 0)], 0, wall_ms=0)
    assert core.take_actions() == []
    assert core.phase is WorkerPhase.IDLE


def test_an_open_ledger_waits_its_grace_period_then_is_fenced() -> None:
    config = WorkerConfig(grace_period_ms=30_000)
    core = _locked(config=config)
    core.on_ledger(OPEN, 10, 0, live=LIVE, candidates=RACKS)
    assert core.take_actions() == [Defer(1, "open or in recovery: grace period started"), Unlock(1)]
    core.on_unlocked(0)

    def again(now: int, version: int) -> list[WorkerAction]:
        core.on_tasks([(_task(), 3)], now, wall_ms=now)
        core.take_actions()
        core.on_lock(1, True, (_task(), 3), now)
        core.take_actions()
        core.on_ledger(OPEN, version, now, live=LIVE, candidates=RACKS)
        return core.take_actions()

    assert again(29_999, 10) == [Defer(1, "open or in recovery: in its grace period"), Unlock(1)]
    core.on_unlocked(29_999)
    # The writer changed the metadata: it is alive, the wait starts over.
    assert again(31_000, 11) == [Defer(1, "open or in recovery: grace period started"), Unlock(1)]
    core.on_unlocked(31_000)
    assert again(61_000, 11) == [StartRecovery(1, b"pw", (A,))]
    core.on_recovered()
    assert core.take_actions() == [ReadLedger(1, live=True, candidates=True)]
    core.on_ledger(CLOSED, 13, 61_000, live=LIVE, candidates=RACKS)  # the recovery closed it
    [copy] = core.take_actions()
    assert isinstance(copy, Copy)
    assert copy.metadata == CLOSED


def test_a_lost_bookie_back_while_its_ledger_was_recovered_is_checked_after_the_close() -> None:
    # Lost, the open ledger fenced and closed by the recovery the worker asked for, and back
    # meanwhile without e5: the look after the close checks it as the first look does
    # (bkref's worker used to drop it as back, found by `bkref refine --config
    # m-open-segment`).
    core = _locked(config=WorkerConfig(grace_period_ms=0))
    core.on_ledger(OPEN, 10, 0, live=LIVE, candidates=RACKS)
    assert core.take_actions() == [StartRecovery(1, b"pw", (A,))]
    core.on_recovered()
    assert core.take_actions() == [ReadLedger(1, live=True, candidates=True)]
    core.on_ledger(CLOSED, 12, 0, live=LIVE | {A}, candidates=RACKS)
    _checked(core, A, frozenset({5}))
    assert core.bad == {A: Reason.ENTRIES_MISSING}
    [copy] = core.take_actions()
    assert isinstance(copy, Copy)
    assert (copy.fragment.bookie, copy.target) == (A, D)


def test_a_grace_period_of_zero_fences_at_the_first_sighting() -> None:
    core = _locked(config=WorkerConfig(grace_period_ms=0))
    core.on_ledger(OPEN, 10, 0, live=LIVE, candidates=RACKS)
    assert core.take_actions() == [StartRecovery(1, b"pw", (A,))]
    core = _locked(config=WorkerConfig(grace_period_ms=1))  # any wait: a first look defers
    core.on_ledger(OPEN, 10, 0, live=LIVE, candidates=RACKS)
    assert core.take_actions() == [Defer(1, "open or in recovery: grace period started"), Unlock(1)]


def test_a_leaving_bookie_in_the_open_segment_waits_for_the_close_without_fencing() -> None:
    core = _locked(_task(replicas={E: Reason.LEAVING}))
    md = _md((Segment(0, (B, C, E)), Segment(4, (B, E, C))))  # the writer still adds to E
    core.on_ledger(md, 10, 0, live=LIVE, candidates=RACKS)
    [copy] = core.take_actions()  # no grace period, no fence: only the closed segment
    assert isinstance(copy, Copy)
    assert (copy.fragment.segment, copy.fragment.bookie, copy.target) == (0, E, D)
    core.on_copied(2, 200)
    [cas] = core.take_actions()
    assert isinstance(cas, CasReplica)
    core.on_cas(11)
    core.take_actions()
    core.on_ledger(cas.metadata, 11, 0)
    assert core.take_actions() == [Defer(1, "the rest is in the open segment"), Unlock(1)]


def test_a_failed_attempt_is_counted_and_the_ledger_backs_off() -> None:
    core = _locked(config=WorkerConfig(backoff_ms=5_000), now=1_000)
    core.on_ledger(CLOSED, 10, 1_000, live=LIVE, candidates=RACKS)
    core.take_actions()
    core.on_failed("RepairError('no verified copy')", 2_000)
    assert core.take_actions() == [
        RecordFailure(1, 3, "RepairError('no verified copy')"),
        Unlock(1),
    ]
    assert core.backoff_until(1) == 7_000
    core.on_unlocked(2_000)
    core.on_tasks([(_task(), 4)], 6_999, wall_ms=0)
    assert core.take_actions() == []  # still backing off
    core.on_tasks([(_task(), 4)], 7_000, wall_ms=0)
    assert core.take_actions() == [TryLock(1)]
    with pytest.raises(LocalProtocolError):
        core.on_failed("nothing under way", 7_000)


def test_a_cas_conflict_retries_on_the_new_metadata_or_gives_up_the_copy() -> None:
    core = _locked()
    core.on_ledger(CLOSED, 10, 0, live=LIVE, candidates=RACKS)
    core.take_actions()
    core.on_copied(4, 400)
    core.take_actions()
    # Someone rewrote the metadata (same segments): the CAS is retried on it.
    touched = replace(CLOSED, custom=(("k", "v"),))
    core.on_cas_conflict(touched, 12)
    retry = replace_replica(touched, 0, A, D)
    assert retry is not None
    assert core.take_actions() == [CasReplica(1, 0, A, D, retry, 12)]
    # And again, now with A already replaced by another bookie: the copy is not recorded.
    moved = replace_replica(CLOSED, 0, A, E)
    assert moved is not None
    core.on_cas_conflict(moved, 13)
    assert core.take_actions() == [ReadLedger(1, live=True)]
    core.on_ledger(moved, 13, 0)
    # A is gone from the metadata: nothing left to do, whoever did it.
    assert core.take_actions() == [
        RecordFailure(1, 3, "ledger 1 not repaired: segment changed meanwhile; copy not recorded"),
        Unlock(1),
    ]


def test_a_metadata_that_keeps_changing_fails_the_attempt() -> None:
    core = _locked()
    core.on_ledger(CLOSED, 10, 0, live=LIVE, candidates=RACKS)
    core.take_actions()
    core.on_copied(4, 400)
    core.take_actions()
    for version in range(11, 11 + CAS_ATTEMPTS - 1):
        core.on_cas_conflict(CLOSED, version)
        [cas] = core.take_actions()
        assert isinstance(cas, CasReplica)
    core.on_cas_conflict(CLOSED, 99)
    assert core.take_actions() == [
        RecordFailure(1, 3, "ledger 1: metadata kept changing under the repair"),
        Unlock(1),
    ]


def test_busy_repair_slots_or_no_room_beside_this_worker_defer_not_fail() -> None:
    core = _locked()
    core.on_ledger(CLOSED, 10, 0, live=LIVE, candidates=RACKS)
    core.take_actions()
    core.on_copy_busy()
    assert core.take_actions() == [ReadLedger(1, live=True)]
    core.on_ledger(CLOSED, 10, 0)
    assert core.take_actions() == [Defer(1, "no free repair slot on b:1, c:1, d:1"), Unlock(1)]

    core = _locked()
    on_d = _md((Segment(0, (A, B, D)),), closed_at=5)  # the local bookie holds a replica
    core.on_ledger(on_d, 10, 0, live=LIVE, candidates=RACKS)
    assert core.take_actions() == [ReadLedger(1, live=True)]
    core.on_ledger(on_d, 10, 0)
    [defer, unlock] = core.take_actions()
    assert isinstance(defer, Defer)
    assert defer.why.startswith("local bookie d:1 cannot hold it")
    assert unlock == Unlock(1)


def _checked(core: WorkerCore, bookie: str, missing: frozenset[int] = frozenset()) -> None:
    """The core's one action is a probe of every entry of ``bookie``'s fragment of CLOSED:
    answer it, the entries in ``missing`` not there and the rest intact."""
    [probe] = core.take_actions()
    assert isinstance(probe, Probe)
    assert core.phase is WorkerPhase.CHECKING
    assert probe.fragment.bookie == bookie
    assert probe.entries == tuple(probe.fragment.entries(CLOSED))
    verdicts = {e: Verdict.MISSING if e in missing else Verdict.INTACT for e in probe.entries}
    core.on_probe(probe, verdicts, 0)


def test_a_live_replica_missing_entries_moves_to_a_new_bookie_as_a_lost_one_does() -> None:
    # BookKeeper's replicateLedgerFragment replaces the bookie; nothing refills in place.
    core = _locked(_task(replicas={B: Reason.ENTRIES_MISSING}))
    core.on_ledger(CLOSED, 10, 0, live=LIVE | {A}, candidates=RACKS)
    _checked(core, B, frozenset({3}))  # the worker checks what the task says, as BookKeeper's does
    assert core.bad == {B: Reason.ENTRIES_MISSING}
    [copy] = core.take_actions()
    assert isinstance(copy, Copy)
    assert (copy.fragment.bookie, copy.target, copy.avoid) == (B, D, frozenset({B}))
    core.on_copied(1, 100)
    moved = replace_replica(CLOSED, 0, B, D)
    assert moved is not None
    assert core.take_actions() == [CasReplica(1, 0, B, D, moved, 10)]
    core.on_cas(11)
    assert core.take_actions() == [ReadLedger(1, live=True)]
    core.on_ledger(moved, 11, 0)
    assert core.take_actions() == [Verified(1), CompleteTask(1, 3, True)]


def test_a_replica_listed_missing_entries_that_has_them_now_needs_nothing() -> None:
    core = _locked(_task(replicas={B: Reason.ENTRIES_MISSING}))
    core.on_ledger(CLOSED, 10, 0, live=LIVE | {A}, candidates=RACKS)
    _checked(core, B)
    assert core.bad == {}
    assert core.take_actions() == [ReadLedger(1, live=True)]
    core.on_ledger(CLOSED, 10, 0)
    assert core.take_actions() == [Verified(1), CompleteTask(1, 3, True)]


def test_a_lost_bookie_back_again_missing_entries_is_repaired_as_one_that_misses_them() -> None:
    # Lost, then back without the entries written meanwhile: the spec's worker repairs a
    # listed live replica that misses entries whatever the task says (_needing_repair),
    # where bkref's worker used to drop every lost bookie that came back.
    core = _locked()
    core.on_ledger(CLOSED, 10, 0, live=LIVE | {A}, candidates=RACKS)
    _checked(core, A, frozenset({5}))
    assert core.bad == {A: Reason.ENTRIES_MISSING}
    [copy] = core.take_actions()
    assert isinstance(copy, Copy)
    assert (copy.fragment.bookie, copy.target) == (A, D)


def test_a_lost_bookie_back_again_needs_nothing_and_a_deleted_ledger_completes() -> None:
    core = _locked()
    core.on_ledger(CLOSED, 10, 0, live=LIVE | {A}, candidates=RACKS)
    _checked(core, A)
    assert core.bad == {}
    assert core.take_actions() == [ReadLedger(1, live=True)]
    core.on_ledger(CLOSED, 10, 0)
    assert core.take_actions() == [Verified(1), CompleteTask(1, 3, True)]

    core = _locked()
    core.on_ledger(None, -1, 0, live=LIVE, candidates=RACKS)
    assert core.take_actions() == [CompleteTask(1, 3, False)]


def test_plant_repair_without_copy_records_the_replica_it_never_copied() -> None:
    core = _locked(plants=frozenset({PLANT_NO_COPY}))
    core.on_ledger(CLOSED, 10, 0, live=LIVE, candidates=RACKS)
    repaired = replace_replica(CLOSED, 0, A, D)
    assert repaired is not None
    assert core.take_actions() == [CasReplica(1, 0, A, D, repaired, 10)]


def test_plant_open_segment_without_fence_copies_the_open_segment_unfenced() -> None:
    core = _locked(plants=frozenset({PLANT_OPEN_SEGMENT}))
    core.on_ledger(OPEN, 10, 0, live=LIVE, candidates=RACKS)
    # No grace period, no StartRecovery: the LAC of the live replicas bounds the copy.
    assert core.take_actions() == [ReadOpenLac(1, (B, C))]
    core.on_open_lac(7)
    [copy] = core.take_actions()
    assert isinstance(copy, Copy)
    assert copy.fragment == Fragment(1, 0, 0, 7, (A, B, C), 0)
    assert copy.target == D
    # Without the plant the same ledger only starts its grace period.
    core = _locked()
    core.on_ledger(OPEN, 10, 0, live=LIVE, candidates=RACKS)
    assert core.take_actions() == [Defer(1, "open or in recovery: grace period started"), Unlock(1)]


def test_manual_recovery_runs_to_a_target_and_events_out_of_turn_are_refused() -> None:
    run = RepairRun(1, CLOSED, 10, {A: Reason.LOST}, RACKS, target=E)
    [copy] = run.take_actions()
    assert isinstance(copy, Copy)
    assert copy.target == E
    with pytest.raises(LocalProtocolError):
        run.on_cas(11)  # no CAS before the copy
    run.on_copied(4, 400)
    run.take_actions()
    run.on_cas(11)
    assert run.done
    assert run.result.complete
    assert [(f.segment, f.bookie, f.target, f.entries) for f in run.result.fragments] == [
        (0, A, E, 4)
    ]
    assert run.result.bytes == 400  # what `recoverbookie` reports as copied
    core = WorkerCore("w1", D, WorkerConfig(), 0)
    with pytest.raises(LocalProtocolError):
        core.on_lock(1, True, (_task(), 3), 0)  # no TryLock asked


@pytest.mark.parametrize("answered", [4, 6])
def test_a_lock_answer_for_a_ledger_the_worker_is_not_locking_is_refused(answered: int) -> None:
    # Trying ledger 5's lock, the worker is told about 4 or 6: a shell that mixed up two
    # answers would otherwise make it repair a ledger whose lock it does not hold.
    core = WorkerCore("w1", D, WorkerConfig(), 0)
    core.on_tasks([(_task(5), 3)], 0, wall_ms=0)
    assert core.take_actions() == [TryLock(5)]
    with pytest.raises(LocalProtocolError, match=f"no lock of {answered} asked"):
        core.on_lock(answered, True, (_task(answered), 3), 0)
    assert core.locked is None


@pytest.mark.parametrize("plant", ["ack-before-fsync", "recovery-reads-without-fence"])
def test_plants_of_other_components_change_no_worker_decision(plant: str) -> None:
    core = _locked(plants=frozenset({plant}))
    core.on_ledger(OPEN, 10, 0, live=LIVE, candidates=RACKS)
    assert core.take_actions() == [Defer(1, "open or in recovery: grace period started"), Unlock(1)]
    core = _locked(plants=frozenset({plant}))
    core.on_ledger(CLOSED, 10, 0, live=LIVE, candidates=RACKS)
    [copy] = core.take_actions()
    assert isinstance(copy, Copy)


def test_a_lost_bookie_the_task_does_not_name_is_repaired_too() -> None:
    # The task names B (entries missing); A was lost since the mark. As BookKeeper's
    # worker checks every fragment, A's is copied first (ensemble order), then B's.
    core = _locked(_task(replicas={B: Reason.ENTRIES_MISSING}))
    core.on_ledger(CLOSED, 10, 0, live=LIVE, candidates=RACKS)
    _checked(core, B, frozenset({0}))
    assert core.bad == {A: Reason.LOST, B: Reason.ENTRIES_MISSING}
    [copy] = core.take_actions()
    assert isinstance(copy, Copy)
    assert (copy.fragment.bookie, copy.target) == (A, D)


def test_a_lost_bookie_in_the_open_segment_after_the_copies_is_fenced_not_waited_for() -> None:
    # Found by `bkref refine --config m-merge-writer`: the writer's ensemble change named a
    # bookie that was lost before the change landed. The worker copied the closed segment
    # (the open one named no lost bookie at its first look); at its check after the copies
    # the open segment names A: it fences the ledger (BookKeeper's worker does so after the
    # grace period) where it used to let the lock go and wait for a close nobody makes.
    md = _md((Segment(0, (A, B, C)), Segment(4, (B, C, E))))
    core = _locked(config=WorkerConfig(grace_period_ms=0))
    core.on_ledger(md, 10, 0, live=LIVE, candidates=RACKS)
    [copy] = core.take_actions()
    assert isinstance(copy, Copy)
    assert copy.fragment.segment == 0
    core.on_copied(4, 400)
    [cas] = core.take_actions()
    assert isinstance(cas, CasReplica)
    core.on_cas(11)
    assert core.take_actions() == [ReadLedger(1, live=True)]
    changed = cas.metadata.with_segment(6, (B, A, E))  # the writer's change, landed
    core.on_ledger(changed, 12, 0, live=LIVE)
    assert core.take_actions() == [StartRecovery(1, b"pw", (A,))]
    assert core.phase is WorkerPhase.RECOVERING


def test_a_bookie_lost_during_the_copies_keeps_the_task() -> None:
    core = _locked()
    core.on_ledger(CLOSED, 10, 0, live=LIVE, candidates=RACKS)
    [copy] = core.take_actions()
    assert isinstance(copy, Copy)
    core.on_copied(5, 500)
    [cas] = core.take_actions()
    assert isinstance(cas, CasReplica)
    core.on_cas(11)
    assert core.take_actions() == [ReadLedger(1, live=True)]
    core.on_ledger(cas.metadata, 11, 0, live=LIVE - {B})  # B went away meanwhile
    defer, unlock = core.take_actions()
    assert isinstance(defer, Defer)
    assert "b:1 lost during the repair" in defer.why
    assert unlock == Unlock(1)


def test_a_worker_whose_bookie_is_not_writable_takes_no_ledger() -> None:
    core = WorkerCore("w1", D, WorkerConfig(), 0)
    core.on_tasks([(_task(), 3)], 0, wall_ms=0, writable={B, C, E})
    assert core.take_actions() == []
    assert core.phase is WorkerPhase.IDLE
    core.on_tasks([(_task(), 3)], 0, wall_ms=0, writable={B, C, D, E})
    assert core.take_actions() == [TryLock(1)]


def test_a_lost_bookie_back_during_the_copies_needs_nothing_more() -> None:
    # A and B lost; A's fragment moves to D (the worker's bookie), B's has nowhere to go
    # (D is in the ensemble now). B comes back before the look at the result: the
    # ledger is repaired, as the spec's worker_verifies_ledger_replicated says.
    core = _locked(_task(replicas={A: Reason.LOST, B: Reason.LOST}))
    core.on_ledger(CLOSED, 10, 0, live=LIVE - {B}, candidates={C: "r3", D: "r4", E: "r5"})
    [copy] = core.take_actions()
    assert isinstance(copy, Copy)
    assert copy.fragment.bookie == A
    core.on_copied(5, 500)
    [cas] = core.take_actions()
    assert isinstance(cas, CasReplica)
    core.on_cas(11)
    assert core.take_actions() == [ReadLedger(1, live=True)]
    core.on_ledger(cas.metadata, 11, 0, live=LIVE)
    assert core.take_actions() == [Verified(1), CompleteTask(1, 3, True)]


def test_a_ledger_read_without_the_bookies_for_its_look_is_refused() -> None:
    # The first look decides from the live bookies (the check) and the writable ones
    # (where copies go): a read that lacks either is the shell's error, not a decision.
    core = _locked()
    with pytest.raises(LocalProtocolError):
        core.on_ledger(CLOSED, 10, 0, live=LIVE)
    with pytest.raises(LocalProtocolError):
        core.on_ledger(CLOSED, 10, 0, candidates=RACKS)


def test_any_other_metadata_version_restarts_the_grace_period_a_lower_one_too() -> None:
    # A read after a new ZooKeeper session may come from a server behind the last one
    # (kazoo starts the new session from zxid 0): version 10 after 11 is no proof that the
    # ledger stood still since the wait started, so the wait starts over.
    core = _locked(config=WorkerConfig(grace_period_ms=30_000))
    core.on_ledger(OPEN, 11, 0, live=LIVE, candidates=RACKS)
    assert core.take_actions() == [Defer(1, "open or in recovery: grace period started"), Unlock(1)]
    core.on_unlocked(0)
    core.on_tasks([(_task(), 3)], 30_000, wall_ms=30_000)
    core.on_lock(1, True, (_task(), 3), 30_000)
    core.take_actions()
    core.on_ledger(OPEN, 10, 30_000, live=LIVE, candidates=RACKS)
    assert core.take_actions() == [Defer(1, "open or in recovery: grace period started"), Unlock(1)]


def test_a_repair_run_that_gives_up_or_copies_nothing_is_incomplete() -> None:
    run = RepairRun(1, CLOSED, 10, {A: Reason.LOST}, RACKS)
    [copy] = run.take_actions()
    assert isinstance(copy, Copy)
    run.on_copied(4, 400)
    with pytest.raises(LocalProtocolError):
        run.on_copied(4, 400)  # its CAS is out: no copy pending
    with pytest.raises(LocalProtocolError):
        run.on_copy_busy()
    for version in range(11, 11 + CAS_ATTEMPTS):
        [cas] = run.take_actions()
        assert isinstance(cas, CasReplica)
        run.on_cas_conflict(CLOSED, version)
    assert run.done
    assert run.failed == "ledger 1: metadata kept changing under the repair"
    assert not run.result.complete
    # Nowhere to copy (the local bookie B is in the ensemble): nothing copied, 0 entries.
    run = RepairRun(1, CLOSED, 10, {A: Reason.LOST}, RACKS, local=B)
    assert run.done
    assert not run.result.complete
    [frag] = run.result.fragments
    assert (frag.bookie, frag.target, frag.entries, frag.bytes) == (A, None, 0, 0)


def test_plant_open_segment_without_fence_copies_an_open_segment_of_one_entry() -> None:
    # The planted bug copies the open segment up to its replicas' LAC, inclusive: a LAC
    # on the segment's first entry is one entry to copy; -1 (no entry confirmed) is none.
    plants = frozenset({PLANT_OPEN_SEGMENT})
    run = RepairRun(1, OPEN, 10, {A: Reason.LOST}, RACKS, local=D, plants=plants)
    assert run.take_actions() == [ReadOpenLac(1, (B, C))]
    run.on_open_lac(0)
    [copy] = run.take_actions()
    assert isinstance(copy, Copy)
    assert copy.fragment == Fragment(1, 0, 0, 0, (A, B, C), 0)
    run = RepairRun(1, OPEN, 10, {A: Reason.LOST}, RACKS, local=D, plants=plants)
    run.take_actions()
    run.on_open_lac(-1)
    assert run.done
    assert run.result.fragments == []


def test_the_worker_config_defaults_are_the_bookie_configs() -> None:
    """A worker built without a config (the shell's tests, an embedding) decides as one a
    bookie's config starts: openLedgerRereplicationGracePeriod, rwRereplicateBackoffMs
    (BookKeeper's defaults), repairSlotsPerBookie and the task priorities."""
    c = BookieConfig()
    assert WorkerConfig() == WorkerConfig(
        c.openLedgerRereplicationGracePeriod,
        c.rwRereplicateBackoffMs,
        c.repairSlotsPerBookie,
        Scheduling(c.repairDeprioritizeAfterFailures, c.repairPromoteAfterMs),
    )
