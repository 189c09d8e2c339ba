"""The replication worker's decisions, sans I/O: which ledger, fence or wait, what to copy where.

The asyncio shell (``bkref/impl/autorecovery/worker.py`` and ``replicator.py``) takes
the ledger locks, reads ZooKeeper, copies entries between bookies and reports each
outcome as an event; :class:`WorkerCore` answers with actions through
:meth:`WorkerCore.take_actions`, one step at a time, so that a test can run one
worker decision at a time. Time is the ``now_ms`` the events carry (a monotonic
clock the caller chooses); task ages are compared with the wall clock the tasks
were stamped with (``wall_ms``). One round, after BookKeeper's ReplicationWorker
with the StarRocks seed's ordering:

1. Order the tasks most-at-risk first (:func:`bkref.impl.core.repair.order_tasks`); skip a
   ledger in back-off; take the next ledger's lock (:class:`TryLock`).
2. With the lock, check the live replicas the task lists as lost or missing entries
   (:class:`bkref.impl.core.audit.Probe`, every entry of their immutable fragments):
   those that miss an entry are ENTRIES_MISSING, the others need nothing. A bookie
   lost and back may have missed entries meanwhile, and one found missing entries
   may have got them since; BookKeeper's worker too runs its ``LedgerChecker``
   over the ledger (``ReplicationWorker.getUnderreplicatedFragments``) rather than
   trust the task.
3. If the ledger's open last segment uses a lost bookie (or the
   ledger is IN_RECOVERY), wait ``openLedgerRereplicationGracePeriod`` for the
   writer to change ensembles itself (any metadata change restarts the wait: the
   writer is alive), then fence it by a recovery open (:class:`StartRecovery`),
   which closes it. With a grace period of 0 it fences at once.
4. Copy every immutable fragment on a bad bookie
   (:class:`bkref.impl.core.repair_run.RepairRun`: one :class:`Copy`, then one
   :class:`CasReplica` of the new replica, per fragment).
5. Re-read the metadata: once no segment names a bad bookie, delete the task with
   a version check
   (:class:`CompleteTask`): a mark that arrived meanwhile keeps it. Otherwise wait
   (:class:`Defer`) or count a failure (:class:`RecordFailure`) and back off
   ``rwRereplicateBackoffMs``. Every attempt ends with :class:`Unlock`.

Spec correspondence (``bkref/spec/protocol.py``, the ``worker_*`` actions):

===================================  =====================================
core                                 spec
===================================  =====================================
``TryLock`` answered ``got``         ``worker_acquires_ledger_lock``
``Copy`` + ``on_copied``             ``worker_copies_fragment``
``CasReplica`` + ``on_cas``          ``worker_updates_segment_ensemble``
``StartRecovery``                    ``worker_fences_open_ledger``
``Verified``                         ``worker_verifies_ledger_replicated``
``CompleteTask`` + ``Unlock``        ``worker_deletes_task``
``Defer``/``RecordFailure`` +        ``worker_releases_lock``
``Unlock``
===================================  =====================================

``ReadLedger``, ``Probe`` (reads), ``RecordFailure`` (a task version bump) and the
``Unlock`` of a task that vanished under the lock have no spec counterpart. A replica that misses
entries (ENTRIES_MISSING) moves to a new bookie as a lost one does, as
BookKeeper's ``replicateLedgerFragment`` replaces it (research note D11). The
worker keeps the lock through the fence and copies in the same attempt (the spec,
and BookKeeper, unlock after it: D14); it retries a CAS that lost to a concurrent
change instead of copying again (D10).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from bkref.impl.core.actions import LocalProtocolError
from bkref.impl.core.audit import LedgerCheck, Probe, Verdict
from bkref.impl.core.metadata import LedgerMetadata, LedgerState
from bkref.impl.core.planted import validate as check_plants
from bkref.impl.core.repair import (
    Reason,
    Scheduling,
    Task,
    is_repaired,
    needs_fencing,
    newly_lost,
    open_segment_has,
    order_tasks,
    still_bad,
)
from bkref.impl.core.repair_run import PLANT_OPEN_SEGMENT, RepairRun
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


@dataclass(frozen=True)
class WorkerConfig:
    grace_period_ms: int = 30000  # openLedgerRereplicationGracePeriod; 0: fence at once
    backoff_ms: int = 5000  # rwRereplicateBackoffMs
    slots_per_bookie: int = 4  # concurrent repair copies per bookie (the shell's semaphores)
    scheduling: Scheduling = field(default_factory=Scheduling)


# ------------------------------------------------------------------ the worker


class WorkerPhase(enum.Enum):
    IDLE = "IDLE"  # no round under way, or the round found nothing to do
    LOCKING = "LOCKING"  # TryLock out
    READING = "READING"  # the attempt's first look at the ledger
    CHECKING = "CHECKING"  # probes of the listed live replicas out
    RECOVERING = "RECOVERING"  # StartRecovery out
    REREADING = "REREADING"  # a look at the ledger after fencing it
    COPYING = "COPYING"  # a RepairRun under way
    VERIFYING = "VERIFYING"  # the look at the ledger after the copies
    COMPLETING = "COMPLETING"  # CompleteTask out
    UNLOCKING = "UNLOCKING"  # Unlock out


_ATTEMPT = frozenset(
    {
        WorkerPhase.READING,
        WorkerPhase.CHECKING,
        WorkerPhase.RECOVERING,
        WorkerPhase.REREADING,
        WorkerPhase.COPYING,
        WorkerPhase.VERIFYING,
        WorkerPhase.COMPLETING,
    }
)


class WorkerCore:
    """One autorecovery node's replication worker: rounds over the task list."""

    def __init__(
        self,
        node_id: str,
        local: str | None,
        config: WorkerConfig,
        now_ms: int,
        plants: frozenset[str] = frozenset(),
    ) -> None:
        self.node_id = node_id
        self.local = local  # the bookie beside this worker, where copies go; None: dedicated
        self.config = config
        self.plants = check_plants(plants)
        self.now_ms = now_ms
        self.enabled = True
        self.phase = WorkerPhase.IDLE
        self.attempted = 0  # ledgers attempted (locked, task still there) this round
        self.locked: int | None = None  # the ledger whose lock this worker holds
        self.task: Task | None = None
        self.task_version: int | None = None  # the task znode's version read under the lock
        self.run: RepairRun | None = None
        self._actions: list[WorkerAction] = []
        self._round: list[Task] = []
        self._trying: int | None = None
        self._bad: dict[str, Reason] = {}
        self._backoff: dict[int, int] = {}  # ledger -> time to retry at
        self._open_seen: dict[int, tuple[int, int]] = {}  # ledger -> (md version, since)
        # The check of listed live replicas, and the first look it holds up.
        self._check: tuple[LedgerCheck, LedgerMetadata, int, Mapping[str, str]] | None = None

    # ------------------------------------------------------------ observable state

    def take_actions(self) -> list[WorkerAction]:
        out, self._actions = self._actions, []
        return out

    @property
    def pending(self) -> tuple[int, str, int] | None:
        """The copy made and not yet recorded: (segment, bad bookie, metadata version)."""
        return self.run.pending if self.run is not None else None

    @property
    def bad(self) -> Mapping[str, Reason]:
        """The locked task's replicas that still need work."""
        return dict(self._bad)

    def backoff_until(self, ledger_id: int) -> int | None:
        return self._backoff.get(ledger_id)

    # ------------------------------------------------------------ events

    def on_enabled(self, enabled: bool) -> None:
        """AutoRecovery switched: while disabled no new ledger is taken (an attempt under
        way finishes)."""
        self.enabled = enabled

    def on_tasks(
        self,
        tasks: Sequence[tuple[Task, int]],
        now_ms: int,
        wall_ms: int,
        *,
        writable: Collection[str] | None = None,
    ) -> None:
        """A round starts with the task list (``wall_ms``: the wall clock, which task
        ages are measured in). A round an error cut short is dropped. ``writable``: the
        writable bookies; a worker whose own bookie is not among them takes no ledger
        (it has nowhere to copy to; the workers of live bookies do the work)."""
        if self.locked is not None:
            raise LocalProtocolError(
                f"worker {self.node_id}: a new round while ledger {self.locked} is locked"
            )
        self._clock(now_ms)
        self._actions.clear()
        self._reset_attempt()
        self.attempted = 0
        self._round = order_tasks((t for t, _v in tasks), wall_ms, self.config.scheduling)
        if self.local is not None and writable is not None and self.local not in writable:
            self._round = []
        self._next_candidate()

    def on_lock(
        self, ledger_id: int, got: bool, current: tuple[Task, int] | None, now_ms: int
    ) -> None:
        """The answer to :class:`TryLock`: whether we hold the lock, and the task as read
        under it (None: another worker completed it meanwhile)."""
        if self.phase is not WorkerPhase.LOCKING or ledger_id != self._trying:
            raise LocalProtocolError(f"worker {self.node_id}: no lock of {ledger_id} asked")
        self._clock(now_ms)
        self._trying = None
        if not got:
            self._next_candidate()
            return
        self.locked = ledger_id
        if current is None:
            self.phase = WorkerPhase.UNLOCKING
            self._actions.append(Unlock(ledger_id))
            return
        self.task, self.task_version = current
        self.attempted += 1
        self.phase = WorkerPhase.READING
        self._actions.append(ReadLedger(ledger_id, live=True, candidates=True))

    def on_ledger(
        self,
        metadata: LedgerMetadata | None,
        version: int,
        now_ms: int,
        *,
        live: Collection[str] | None = None,
        candidates: Mapping[str, str] | None = None,
    ) -> None:
        """The answer to :class:`ReadLedger` (``metadata`` None: the ledger is deleted)."""
        self._clock(now_ms)
        lid = self._locked_ledger()
        if self.phase in (WorkerPhase.READING, WorkerPhase.REREADING):
            # REREADING: a look at the ledger its recovery closed. The recovery took a while:
            # a listed bookie may be back, missing entries the check must find (found by
            # `bkref refine --config m-open-segment`, example 249 of seed 0), another lost.
            if live is None or candidates is None:
                raise LocalProtocolError(
                    f"worker {self.node_id}: ledger {lid} read without bookies"
                )
            self._look(lid, metadata, version, live, candidates)
        elif self.phase is WorkerPhase.VERIFYING:
            self._verify(lid, metadata, version, live)
        else:
            raise LocalProtocolError(f"worker {self.node_id}: no read pending in {self.phase}")

    def _look(
        self,
        lid: int,
        metadata: LedgerMetadata | None,
        version: int,
        live: Collection[str],
        candidates: Mapping[str, str],
    ) -> None:
        """Decide from a read of the ledger: check the listed live replicas, then look."""
        assert self.task is not None
        # What the live replicas the task lists as lost or missing entries miss is for the
        # check below to say.
        listed = {
            b
            for b, r in self.task.replicas.items()
            if b in live and r in (Reason.LOST, Reason.ENTRIES_MISSING)
        }
        rest = {b: r for b, r in self.task.replicas.items() if b not in listed}
        self._bad = still_bad(rest, live, metadata)
        if metadata is None:
            self._complete(repaired=False)
            return
        if not listed:
            self._first_look(lid, metadata, version, candidates)
            return
        check = LedgerCheck(lid, metadata, live, 100, random.Random(0), only=listed)
        self._check = (check, metadata, version, candidates)
        self.phase = WorkerPhase.CHECKING
        self._checked()

    def on_probe(self, probe: Probe, verdicts: Mapping[int, Verdict], now_ms: int) -> None:
        """The answer to :class:`Probe`: what reading each entry showed."""
        self._in(WorkerPhase.CHECKING)
        self._clock(now_ms)
        assert self._check is not None
        self._check[0].on_probe(probe, verdicts)
        self._checked()

    def _checked(self) -> None:
        """Send the check's next probe, or, once it is done, take the first look."""
        assert self._check is not None
        check, md, version, candidates = self._check
        # Its Mark is the auditor's to write: the worker keeps what it found in ``_bad``.
        self._actions.extend(a for a in check.take_actions() if isinstance(a, Probe))
        if not check.done:
            return
        self._check = None
        self._bad.update(
            (b, Reason.ENTRIES_MISSING) for b, r in check.bad.items() if r is Reason.ENTRIES_MISSING
        )
        self.phase = WorkerPhase.READING
        self._first_look(self._locked_ledger(), md, version, candidates)

    def on_recovered(self) -> None:
        """The recovery open fenced and closed the ledger."""
        lid = self._in(WorkerPhase.RECOVERING)
        self._open_seen.pop(lid, None)
        self.phase = WorkerPhase.REREADING
        self._actions.append(ReadLedger(lid, live=True, candidates=True))

    # The repair run's events, passed on to it.

    def on_open_lac(self, lac: int) -> None:
        self._copying().on_open_lac(lac)
        self._pump()

    def on_copied(self, entries: int, nbytes: int) -> None:
        self._copying().on_copied(entries, nbytes)
        self._pump()

    def on_copy_busy(self) -> None:
        self._copying().on_copy_busy()
        self._pump()

    def on_cas(self, version: int) -> None:
        self._copying().on_cas(version)
        self._pump()

    def on_cas_conflict(self, current: LedgerMetadata, version: int) -> None:
        self._copying().on_cas_conflict(current, version)
        self._pump()

    def on_completed(self, deleted: bool) -> None:
        """The task's versioned delete: ``deleted`` False when a new mark kept it."""
        lid = self._in(WorkerPhase.COMPLETING)
        self.phase = WorkerPhase.UNLOCKING
        self._actions.append(Unlock(lid))

    def on_failed(self, why: str, now_ms: int) -> None:
        """A step of the attempt failed in the shell (a bookie or ZooKeeper error, the
        lock lost, the attempt's time limit): count it and back off."""
        self._clock(now_ms)
        if self.phase not in _ATTEMPT:
            raise LocalProtocolError(f"worker {self.node_id}: no attempt to fail in {self.phase}")
        self._actions.clear()  # whatever the failed step would have led to
        self._fail(why)

    def on_unlocked(self, now_ms: int) -> None:
        """The lock is released (or the shell gave up on it: the next round releases
        what the session still holds). Takes the next ledger of the round."""
        self._clock(now_ms)
        if self.phase is WorkerPhase.LOCKING and self._trying is not None:
            self._trying = None  # taken but never reported: an error cut the round short
        self._actions.clear()
        self._reset_attempt()
        self._next_candidate()

    # ------------------------------------------------------------ decisions

    def _first_look(
        self, lid: int, md: LedgerMetadata, version: int, candidates: Mapping[str, str]
    ) -> None:
        # A ledger in recovery is left to its recovery (whose close CAS a repair of an
        # earlier segment would make fail) until the grace period says it was abandoned.
        # Only a lost bookie justifies fencing: a leaving or entries-missing one still
        # takes the writer's adds, so its open segment waits for the ledger to close.
        lost = {b for b, r in self._bad.items() if r is Reason.LOST}
        # PLANTED BUG: no grace period and no fence; the open segment is copied as it is.
        unfenced = md.state is LedgerState.OPEN and PLANT_OPEN_SEGMENT in self.plants
        if unfenced or not (md.state is LedgerState.IN_RECOVERY or needs_fencing(md, lost)):
            self._start_run(lid, md, version, candidates)
            return
        self._fence_after_grace(lid, md, version)

    def _fence_after_grace(self, lid: int, md: LedgerMetadata, version: int) -> None:
        """Recover the ledger (which fences it) once it has been open, or in recovery, at
        this metadata version for the grace period; until then let the lock go."""
        grace = self.config.grace_period_ms
        if grace > 0:
            seen = self._open_seen.get(lid)
            if seen is None or seen[0] != version:
                self._open_seen[lid] = (version, self.now_ms)
                self._defer("open or in recovery: grace period started")
                return
            if self.now_ms - seen[1] < grace:
                self._defer("open or in recovery: in its grace period")
                return
        self.phase = WorkerPhase.RECOVERING
        bad_here = tuple(sorted(set(md.last_segment.ensemble) & set(self._bad)))
        self._actions.append(StartRecovery(lid, md.password, bad_here))

    def _start_run(
        self, lid: int, md: LedgerMetadata, version: int, candidates: Mapping[str, str]
    ) -> None:
        self.phase = WorkerPhase.COPYING
        self.run = RepairRun(
            lid, md, version, self._bad, candidates, local=self.local, plants=self.plants
        )
        self._pump()

    def _pump(self) -> None:
        run = self.run
        assert run is not None
        self._actions.extend(run.take_actions())
        if not run.done:
            return
        if run.failed:
            self._fail(run.failed)
            return
        self.phase = WorkerPhase.VERIFYING
        self._actions.append(ReadLedger(run.ledger_id, live=True))

    def _verify(
        self, lid: int, md: LedgerMetadata | None, version: int, live: Collection[str] | None
    ) -> None:
        if md is None:
            self._complete(repaired=False)
            return
        assert self.run is not None
        bad: Mapping[str, Reason] = self._bad
        if live is not None:
            lost = newly_lost(md, live, self._bad)
            if lost:
                # A bookie of the ledger was lost during the copies: not repaired, and not
                # this attempt's failure either; the auditor marks it and a later round
                # repairs it (the task must not be deleted now).
                self._defer(f"bookie(s) {', '.join(sorted(lost))} lost during the repair")
                return
            # A lost replica that came back during the copies needs nothing any more: a
            # fragment of it that was skipped does not count.
            bad = still_bad(self._bad, live)
        skipped = [f for f in self.run.result.fragments if f.skipped and f.bookie in bad]
        if not skipped and is_repaired(md, bad):
            self._actions.append(Verified(lid))
            self._complete(repaired=True)
            return
        if not skipped and open_segment_has(md, bad):
            lost_here = {b for b, r in bad.items() if r is Reason.LOST}
            # PLANTED BUG (repair-open-segment-without-fence): no fence here either.
            if needs_fencing(md, lost_here) and PLANT_OPEN_SEGMENT not in self.plants:
                # The closed fragments are copied and the open segment names a lost bookie:
                # fence it out after the grace period, as BookKeeper's worker does then
                # (ReplicationWorker.rereplicate, deferLedgerLockRelease). Letting the lock
                # go instead was found by `bkref refine --config m-merge-writer`.
                self._fence_after_grace(lid, md, version)
                return
            self._defer("the rest is in the open segment")  # it waits for the close
            return
        if skipped and all(f.deferred for f in skipped):
            # Another worker's to do, or slots busy: not a failure.
            self._defer("; ".join(sorted({f.skipped for f in skipped})))
            return
        why = "; ".join(sorted({f.skipped for f in skipped})) or "bookies still named"
        self._fail(f"ledger {lid} not repaired: {why}")

    def _complete(self, *, repaired: bool) -> None:
        lid = self._locked_ledger()
        assert self.task_version is not None
        self.phase = WorkerPhase.COMPLETING
        self._actions.append(CompleteTask(lid, self.task_version, repaired))

    def _defer(self, why: str) -> None:
        lid = self._locked_ledger()
        self.phase = WorkerPhase.UNLOCKING
        self._actions += [Defer(lid, why), Unlock(lid)]

    def _fail(self, why: str) -> None:
        lid = self._locked_ledger()
        assert self.task_version is not None
        self._backoff[lid] = self.now_ms + self.config.backoff_ms
        self.phase = WorkerPhase.UNLOCKING
        self._actions += [RecordFailure(lid, self.task_version, why), Unlock(lid)]

    def _next_candidate(self) -> None:
        while self._round and self.enabled:
            task = self._round.pop(0)
            lid = task.ledger_id
            until = self._backoff.get(lid)
            if until is not None:
                if until > self.now_ms:
                    continue
                del self._backoff[lid]
            self._trying = lid
            self.phase = WorkerPhase.LOCKING
            self._actions.append(TryLock(lid))
            return
        self._round = []
        self.phase = WorkerPhase.IDLE

    # ------------------------------------------------------------ helpers

    def _reset_attempt(self) -> None:
        self.locked = self.task = self.task_version = self.run = self._trying = None
        self._bad = {}
        self._check = None

    def _locked_ledger(self) -> int:
        if self.locked is None:
            raise LocalProtocolError(f"worker {self.node_id}: no ledger locked")
        return self.locked

    def _in(self, phase: WorkerPhase) -> int:
        if self.phase is not phase:
            raise LocalProtocolError(
                f"worker {self.node_id}: event for {phase.value} while {self.phase.value}"
            )
        return self._locked_ledger()

    def _copying(self) -> RepairRun:
        """The repair run an event of the COPYING phase is for."""
        self._in(WorkerPhase.COPYING)
        assert self.run is not None
        return self.run

    def _clock(self, now_ms: int) -> None:
        self.now_ms = max(self.now_ms, now_ms)
