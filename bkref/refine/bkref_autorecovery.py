"""bkref's AutoRecovery as refinement actors: the auditor and worker cores, one decision a step.

Each worker node of the spec (``wk[w]``, auditor candidate ``w``) is one
``WorkerCore`` and one ``AuditorCore``, the sans-I/O cores that bkref's
``autorecovery`` process runs, beside bookie ``cfg.bookies - 1 - w``. Their
actions are performed here against the real ZooKeeper (tasks, locks, the
election's votes, the disable switch, ledger metadata, bookie registrations,
through ``bkref.impl.meta``) and the real bookies of the driver (copies are recovery
adds to the target's ``BookieCore`` over its real storage).

Who decides. The spec offers every enabled step of every actor; the machine
picks one. For the operator, the network and crashes the spec decides. A
worker decides for itself: any ``worker_*`` step of worker ``w`` gives that
worker a *turn*, in which it performs its pending actions until it has taken
one step the spec can see, and the driver reports that step as what was
decided (the machine checks the spec enables it). A worker's outstanding
action stays unperformed between turns, so that its next decision sees the
cluster as it is at its next turn (a ``ReadLedger`` answered late is a look at
the ledger taken late). Implementation steps with no spec counterpart
(``ReadLedger``, ``RecordFailure``, an ``Unlock`` of a task gone under the lock)
are taken within a turn; the abstraction must not change across them.

The election: every node votes at the start, node 0 first (the spec's initial
auditor). A session loss deletes the auditor's vote; each node looks at the
votes only when the spec says one wins, and only the node with the lowest vote
alive can (bkref's rule; the spec lets any node win: D16, refused and counted).
The workers share this harness's ZooKeeper session; a lock's owner is the
worker's node id, which ``try_lock`` compares.

Time is a clock this harness advances by an hour per step: every backoff and
grace period has elapsed whenever a worker gets its turn, as the spec, which
has no clocks, lets any interleaving happen. ``lostBookieRecoveryDelay`` is 0.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from bkref.impl.core.audit import (
    AuditorConfig,
    AuditorCore,
    AuditView,
    JoinElection,
    LedgerCheck,
    Mark,
    Probe,
    ReadDelay,
    ReadLedgers,
    Verdict,
    judge,
    plan_marks,
)
from bkref.impl.core.frames import (
    ReadRequest,
)
from bkref.impl.core.metadata import Segment
from bkref.impl.core.repair_run import CasReplica, Copy, ReadOpenLac
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
from bkref.impl.meta import layout
from bkref.impl.meta.store import MetadataConflictError, NoSuchLedgerError
from bkref.impl.meta.underreplication import UnderreplicationManager, lock_path
from bkref.refine.bkref_copies import CopyFailedError, copy_fragment, open_lac
from bkref.refine.driver import ImplementationError
from bkref.spec import protocol as sp
from bkref.spec.protocol import Label

if TYPE_CHECKING:
    from bkref.refine.bkref_driver import BkrefDriver

HOUR_MS = 3_600_000
RACK = "rack"  # one failure domain each: placement never stands in the spec's way


class CannotDecideError(Exception):
    """The worker has no decision to take now (the reason); the step is refused."""


@dataclass
class Node:
    """One AutoRecovery node: its worker and its auditor candidate."""

    index: int  # the spec's worker and auditor-candidate index
    node_id: str
    bookie: int  # the spec index of the bookie beside it
    worker: WorkerCore
    auditor: AuditorCore
    outstanding: deque[WorkerAction] = field(default_factory=deque)
    vote: int | None = None  # its election vote's sequence number
    # Its failure count written into a task another worker at work had read at the same
    # version (a lost lock's doing): the spec's release with ``record``.
    recorded: bool = False


class AutoRecoveryActors:
    """The AutoRecovery half of :class:`bkref.refine.bkref_driver.BkrefDriver`."""

    def __init__(self, d: BkrefDriver) -> None:
        self.d = d
        cfg = d._cfg()
        self.urm = UnderreplicationManager(d.zk, d.root)
        self.urm.ensure_layout()
        self.now = HOUR_MS
        self.epochs: dict[int, int] = {}  # a vote's sequence number -> the spec's epoch
        # (segment, filled, replaced bookie index) of each repair: the spec's ghost
        # meta_rereplicated, recorded as the worker's CAS lands (history, not state).
        self.rereplicated: dict[int, tuple[tuple[int, int, int], ...]] = {}
        # Bookies registered again since the last audit (the spec's ghost au_back), and the
        # registrations at the last change, to tell who came back.
        self.back: set[str] = set()
        self.last_registered: set[str] | None = None
        worker_config = WorkerConfig(grace_period_ms=0, backoff_ms=HOUR_MS // 2)
        auditor_config = AuditorConfig(
            lost_bookie_recovery_delay=0,
            periodic_check_interval=0,
            periodic_bookie_check_interval=0,
        )
        self.nodes = []
        for w in range(cfg.workers):
            bookie = cfg.bookies - 1 - w
            node_id = f"node{w}"
            self.nodes.append(
                Node(
                    w,
                    node_id,
                    bookie,
                    WorkerCore(node_id, d.bookies[bookie].name, worker_config, self.now, d.plants),
                    AuditorCore(node_id, auditor_config, self.now, d.plants),
                )
            )
        for i in range(len(d.bookies)):
            self.register(i)
        # The spec's initial state: every node has a vote, node 0's the lowest, and node 0
        # won the first election and audited (nothing was lost).
        for n in self.nodes:
            self._join(n)
        if self.nodes:
            self._audit(self.nodes[0])

    # ------------------------------------------------------------ time and views

    def register(self, b: int) -> None:
        """Bookie ``b`` registers (it is up); each bookie is its own failure domain."""
        name = self.d.bookies[b].name
        self.d.store.register(name, rack=f"{RACK}-{name}", readonly=False)

    def _tick(self) -> int:
        self.now += HOUR_MS
        return self.now

    def registered(self) -> set[str]:
        return self.d.store.bookie_ids()

    def bookies_changed(self) -> None:
        """A bookie crashed or restarted (its registration went or came): each auditor
        that leads sees the registrations; a loss's delay is read at once."""
        registered = self.registered()
        if self.last_registered is not None:
            self.back |= registered - self.last_registered
        self.last_registered = registered
        for n in self.nodes:
            a = n.auditor
            a.on_registered(registered, self._tick())
            for act in a.take_actions():
                if isinstance(act, ReadDelay):
                    a.on_delay(self.urm.lost_bookie_recovery_delay(0))
                else:
                    raise ImplementationError(f"auditor {n.node_id} asked for {act} on a change")

    # ------------------------------------------------------------ election

    def _join(self, n: Node) -> None:
        path = self.urm.join_election(n.node_id)
        n.vote = int(path.rsplit("_", 1)[1])
        self._look_at_votes(n)

    def _look_at_votes(self, n: Node) -> None:
        """``n``'s watch on the votes fires: it leads if its vote is the lowest alive; a
        new leader sets its baseline of registered bookies, as the shell's first look
        does. When each node looks is the environment's choice: the others look only
        when the spec says one of them wins (``node_wins_auditor_election``)."""
        leader = self.urm.auditor()
        lowest = leader.epoch if leader is not None else None
        was = n.auditor.leading
        n.auditor.on_votes(n.vote, lowest, self._tick())
        for act in n.auditor.take_actions():
            if not isinstance(act, JoinElection):
                raise ImplementationError(f"auditor {n.node_id} asked for {act}")
        if n.auditor.leading and not was:
            assert n.auditor.epoch is not None
            self.epochs.setdefault(n.auditor.epoch, len(self.epochs) + 1)
            n.auditor.on_registered(self.registered(), self.now)

    def auditor_loses_session(self) -> tuple[Label, ...]:
        n = self._leader()
        if n is None:
            raise CannotDecideError("no node is auditor")
        # The auditor's session expires: its ephemeral vote goes with it.
        assert n.vote is not None
        self.d.zk.delete(f"{layout.underreplication(self.d.root)}/auditorelection/V_{n.vote:010d}")
        n.vote = None
        n.auditor.on_session_lost()
        self.d.used[sp.B_ELECT] += 1
        return ()

    def node_wins_auditor_election(self, node: int) -> tuple[Label, ...]:
        n = self.nodes[node]
        leader = self.urm.auditor()
        if leader is not None and (n.vote is None or leader.epoch != n.vote):
            # bkref's election: the lowest vote alive leads, and a node that lost its
            # session votes again after every vote still alive (D16).
            raise CannotDecideError(f"{leader.node_id}'s vote is the lowest: only it can win")
        if n.vote is None:
            self._join(n)
        else:
            self._look_at_votes(n)
        if not n.auditor.leading:
            raise ImplementationError(f"{n.node_id} has the lowest vote and does not lead")
        return ()

    def _leader(self) -> Node | None:
        for n in self.nodes:
            if n.auditor.leading:
                return n
        return None

    # ------------------------------------------------------------ auditing

    def auditor_marks_ledgers_of_lost_bookies(self) -> tuple[Label, ...]:
        n = self._leader()
        if n is None or not n.auditor.stale:
            raise CannotDecideError("no auditor has an audit due")
        self._audit(n)
        return ()

    def auditor_marks_from_earlier_scan(self, ledger: int) -> tuple[Label, ...]:
        """The due audit, then the marks bkref's audit writes for ``ledger`` when it read the
        ledger before the worker's swaps landed: ``plan_marks`` over the metadata as it was
        before them (each replaced bookie back in place), written with the auditor's mark.
        bkref's one audit does both from one read; the driver splits it in two calls."""
        return self._audit_earlier_scan(ledger, self.registered())

    def auditor_marks_from_earlier_view_and_scan(self, ledger: int) -> tuple[Label, ...]:
        """Both of the above in one audit: the registrations read before the bookies back
        since the last audit came back, ``ledger`` read before the worker's swaps."""
        if not self.back:
            raise ImplementationError("no bookie came back since the last audit")
        return self._audit_earlier_scan(ledger, self.registered() - self.back)

    def _audit_earlier_scan(self, ledger: int, registered: set[str]) -> tuple[Label, ...]:
        n = self._leader()
        if n is None or not n.auditor.stale:
            raise CannotDecideError("no auditor has an audit due")
        self._audit(n, registered)
        d = self.d
        lid = d.ledger_ids()[ledger]
        md, _version = d.store.read_ledger(lid)
        now = tuple((g.first_entry, tuple(d.index[b] for b in g.ensemble)) for g in md.segments)
        before = sp.segments_before_swaps(now, self.rereplicated.get(ledger, ()))
        segments = tuple(Segment(f, tuple(d.bookies[b].name for b in ens)) for f, ens in before)
        earlier = replace(md, segments=segments)
        for act in plan_marks([(lid, earlier)], frozenset(registered), frozenset()):
            self.urm.mark(act.ledger_id, act.replicas, act.priority, rewrite=act.rewrite)
        return ()

    def auditor_marks_from_earlier_view(self) -> tuple[Label, ...]:
        """The due audit, its registrations read before the bookies back since the last
        audit came back (bkref's audit reads them once, then the ledgers). The audit their
        watch makes due after that read is the spec's to leave out (a reduction): the
        driver gave the core those registrations before this audit."""
        n = self._leader()
        if n is None or not n.auditor.stale:
            raise CannotDecideError("no auditor has an audit due")
        if not self.back:
            raise ImplementationError("no bookie came back since the last audit")
        self._audit(n, self.registered() - self.back)
        return ()

    def auditor_runs_periodic_bookie_check(self) -> tuple[Label, ...]:
        n = self._leader()
        if n is None:
            raise CannotDecideError("no node is auditor")
        if n.auditor.stale:
            raise ImplementationError(f"{n.auditor.node_id} has an audit due already")
        n.auditor.on_periodic_bookie_check(self._tick())
        self._audit(n)
        return ()

    def _audit(self, n: Node, registered: set[str] | None = None) -> None:
        """``n``'s due audit: read the ledgers and perform its marks (``registered``: the
        registrations it read, if not those of now)."""
        n.auditor.tick(max(self._tick(), n.auditor.audit_due_at or 0))
        acts = n.auditor.take_actions()
        if acts != [ReadLedgers()]:
            raise ImplementationError(f"auditor {n.node_id}: {acts} instead of an audit")
        if not self.urm.is_enabled():
            raise ImplementationError("an audit while AutoRecovery is disabled")
        ledgers = []
        for lid in self.d.store.list_ledgers():
            md, _version = self.d.store.read_ledger(lid)
            ledgers.append((lid, md))
        if registered is None:
            registered = self.registered()
        self.back = set()
        view = AuditView(frozenset(registered), frozenset(), ledgers)
        n.auditor.on_ledgers(view)
        for act in n.auditor.take_actions():
            if not isinstance(act, Mark):
                raise ImplementationError(f"auditor {n.node_id} asked for {act} in an audit")
            self.urm.mark(act.ledger_id, act.replicas, act.priority, rewrite=act.rewrite)

    def auditor_checks_ledger_replicas(self, ledger: int) -> tuple[Label, ...]:
        """The leader's check of one ledger, every entry read (verification at 100%): a
        ``LedgerCheck`` whose probes read the bookies' cores, then its mark. The schedule
        (``CheckLedgers`` every ``auditorPeriodicCheckInterval``) is the spec's choice."""
        n = self._leader()
        if n is None or not self.urm.is_enabled():
            raise CannotDecideError("no auditor, or AutoRecovery is disabled")
        d = self.d
        lid = d.ledger_ids()[ledger]
        md, _version = d.store.read_ledger(lid)
        check = LedgerCheck(lid, md, self.registered(), 100, random.Random(0))
        actions = deque(check.take_actions())
        while actions:
            act = actions.popleft()
            if isinstance(act, Probe):
                check.on_probe(act, self._verdicts(act))
                actions.extend(check.take_actions())
            else:
                self.urm.mark(act.ledger_id, act.replicas, act.priority, rewrite=act.rewrite)
        return ()

    def _verdicts(self, probe: Probe) -> dict[int, Verdict]:
        """A probe's reads, answered by its bookie's core (no answer: it is down), judged
        with the digest every ledger of the driver is written with."""
        d, lid = self.d, probe.fragment.ledger_id
        node = d.bookies[d.index[probe.fragment.bookie]]
        return {
            e: judge(
                node.serve(ReadRequest(d._next_id(), lid, e)) if node.core else None,
                d.digest,
                lid,
                e,
            )
            for e in probe.entries
        }

    # ------------------------------------------------------------ operator

    def operator_disables_autorecovery(self) -> tuple[Label, ...]:
        self.urm.set_enabled(False)
        self.d.used[sp.B_TOGGLE] += 1
        self._enabled(False)
        return ()

    def operator_enables_autorecovery(self) -> tuple[Label, ...]:
        self.urm.set_enabled(True)
        self._enabled(True)
        return ()

    def _enabled(self, on: bool) -> None:
        for n in self.nodes:
            n.worker.on_enabled(on)
            n.auditor.on_enabled(on, self._tick())
            if n.auditor.take_actions():
                raise ImplementationError(f"auditor {n.node_id} acted on the switch itself")

    # ------------------------------------------------------------ workers

    def worker_turn(self, w: int, *, fail_copies: bool = False) -> tuple[Label, ...]:
        """Worker ``w`` performs its actions until it took one step the spec can see.

        ``fail_copies`` (the spec's ``worker_fails_repair``): every copy of this turn finds
        a repair slot busy, its check before a verdict or the task's delete fails on a
        ZooKeeper error, so the worker lets the lock go: that release is the failed
        repair."""
        seen = self._turn(w, fail_copies)
        if fail_copies and len(seen) == 1 and seen[0][0] == "worker_releases_lock":
            self.d.used[sp.B_REPAIR_FAIL] += 1
            return (("worker_fails_repair", seen[0][1]),)
        return seen

    def worker_loses_lock(self, w: int) -> tuple[Label, ...]:
        """ZooKeeper deletes the lock of the ledger worker ``w`` works on, as it deletes an
        expired session's ephemeral nodes; the worker's core is not told."""
        n = self.nodes[w]
        lid = n.worker.locked
        if lid is None or self.urm.lock_holder(lid) != n.node_id:
            raise CannotDecideError(f"worker {w} holds no lock to lose")
        self.urm.zk.delete(lock_path(self.urm.root, lid))
        self.d.used[sp.B_LOCK] += 1
        return ()

    def _turn(self, w: int, fail_copies: bool) -> tuple[Label, ...]:
        n = self.nodes[w]
        core = n.worker
        if not n.outstanding and core.phase is WorkerPhase.RECOVERING:
            # The recovery it asked for is the spec's recovery client, driven step by step
            # by the machine; the worker's recovery open returns once the ledger is closed
            # (by that recovery, or by the writer first).
            lid = core.locked
            assert lid is not None
            if not self.d.store.read_ledger(lid)[0].is_closed:
                raise CannotDecideError(f"worker {w}: the recovery it asked for is running")
            core.on_recovered()
            n.outstanding.extend(core.take_actions())
        if not n.outstanding and core.phase is WorkerPhase.IDLE:
            tasks = self.urm.tasks()
            writable = set(self.d.store.writable_bookies())
            core.on_tasks(tasks, self._tick(), self.now, writable=writable)
            n.outstanding.extend(core.take_actions())
            if not n.outstanding:
                raise CannotDecideError(f"worker {w} finds no ledger it can take")
        for _ in range(100):
            if not n.outstanding:
                if core.phase is WorkerPhase.IDLE:
                    return ()  # it looked and found nothing it could take: a stutter
                raise ImplementationError(f"worker {w} stalled in {core.phase.value}")
            act = n.outstanding.popleft()
            seen = self._perform(n, act, fail_copies)
            n.outstanding.extend(core.take_actions())
            if seen is not None:
                return seen
        raise ImplementationError(f"worker {w} took 100 actions without a spec step")

    def _perform(
        self, n: Node, act: WorkerAction, fail_copies: bool = False
    ) -> tuple[Label, ...] | None:
        """Perform one of ``n``'s actions; the spec step it completes, if any."""
        core, w = n.worker, n.index
        d = self.d
        if isinstance(act, TryLock):
            got = self.urm.try_lock(act.ledger_id, n.node_id)
            current = self.urm.get(act.ledger_id) if got else None
            core.on_lock(act.ledger_id, got, current, self._tick())
            if got and current is not None:
                return (("worker_acquires_ledger_lock", (w, d.spec_ledger(act.ledger_id))),)
            return None
        if isinstance(act, ReadLedger):
            try:
                md, version = d.store.read_ledger(act.ledger_id)
            except NoSuchLedgerError:
                md, version = None, -1
            core.on_ledger(
                md,
                version,
                self._tick(),
                live=self.registered() if act.live else None,
                candidates=d.store.writable_bookies() if act.candidates else None,
            )
            return None
        if isinstance(act, Probe):
            core.on_probe(act, self._verdicts(act), self._tick())
            return None
        if isinstance(act, Copy | CasReplica) and self.urm.lock_holder(act.ledger_id) != n.node_id:
            # bkref's worker asks before each copy and metadata write (``owns_lock``) and
            # gives the attempt up; its release is the step the spec sees.
            core.on_failed(f"ledger {act.ledger_id}: lost the ledger's lock", self._tick())
            return None
        if isinstance(act, Copy):
            if fail_copies:
                core.on_copy_busy()
                return None
            try:
                entries, nbytes = copy_fragment(self.d, act)
            except CopyFailedError as e:
                core.on_failed(str(e), self._tick())
                return None
            core.on_copied(entries, nbytes)
            # The fragment bkref chose: the spec's model checker copies the first one
            # (a reduction); bkref's check may order them otherwise.
            lost = d.index[act.fragment.bookie]
            return (("worker_copies_fragment", (w, act.fragment.segment, lost)),)
        if isinstance(act, CasReplica):
            try:
                version = d.store.write_ledger(act.ledger_id, act.metadata, act.expected_version)
            except MetadataConflictError as e:
                if e.current is None:
                    raise ImplementationError(f"ledger {act.ledger_id} vanished") from e
                # The spec's CAS re-reads and retries in one step: the retry the core asks
                # for next (in this turn) is the step, not this conflict.
                core.on_cas_conflict(e.current, e.version)
                return None
            else:
                ledger = d.spec_ledger(act.ledger_id)
                seg, target = act.segment, d.index[act.target]
                self.rereplicated[ledger] = sp.with_swap(
                    self.rereplicated.get(ledger, ()), seg, target, d.index[act.bookie]
                )
                core.on_cas(version)
            return (("worker_updates_segment_ensemble", (w,)),)
        if isinstance(act, Verified) and fail_copies:
            # Its re-read of the ledger or the registrations failed on a ZooKeeper error
            # before the verdict (after a swap, say): a failure, the lock let go.
            n.outstanding.clear()  # the delete the verdict queued is not reached
            core.on_failed("ZooKeeper connection lost re-reading the ledger", self._tick())
            return None
        if isinstance(act, Verified):
            return (("worker_verifies_ledger_replicated", (w,)),)
        if isinstance(act, CompleteTask) and fail_copies:
            # The delete fails on a ZooKeeper error (connection loss): the worker counts a
            # failure and lets the lock go, the task kept (the spec's worker_fails_repair).
            core.on_failed("ZooKeeper connection lost deleting the task", self._tick())
            return None
        if isinstance(act, CompleteTask):
            core.on_completed(self.urm.complete(act.ledger_id, act.version))
            unlock = core.take_actions()
            if unlock != [Unlock(act.ledger_id)]:
                raise ImplementationError(f"worker {w}: {unlock} after completing a task")
            self._unlock(n, act.ledger_id)
            return (("worker_deletes_task", (w,)),) if act.repaired else ()
        if isinstance(act, RecordFailure):
            shared = any(
                m is not n
                and m.worker.locked == act.ledger_id
                and m.worker.task_version == act.version
                for m in self.nodes
            )
            self.urm.record_failure(act.ledger_id, act.version)
            after = self.urm.get(act.ledger_id)
            n.recorded = shared and after is not None and after[1] != act.version
            return None
        if isinstance(act, Defer):
            return None
        if isinstance(act, Unlock):
            attempted = core.task is not None  # else the task was gone under the lock
            args = (w, 1) if n.recorded else (w,)
            n.recorded = False
            self._unlock(n, act.ledger_id)
            return (("worker_releases_lock", args),) if attempted else ()
        if isinstance(act, StartRecovery):
            if d.spec_ledger(act.ledger_id) != d._cfg().writer_ledger:
                raise ImplementationError(f"worker {w} fences ledger {act.ledger_id}, not open")
            d.recovery_requested = True
            return (("worker_fences_open_ledger", (w,)),)
        if isinstance(act, ReadOpenLac):  # the planted bug's unfenced look at the LAC
            core.on_open_lac(open_lac(self.d, act))
            return None
        raise ImplementationError(f"worker {w}: unknown action {act}")

    def _unlock(self, n: Node, ledger_id: int) -> None:
        # The nodes share one ZooKeeper session here; bkref's unlock deletes only the lock
        # its own session holds, never the one a worker took after this one lost it.
        if self.urm.lock_holder(ledger_id) == n.node_id:
            self.urm.unlock(ledger_id)
        n.worker.on_unlocked(self._tick())
