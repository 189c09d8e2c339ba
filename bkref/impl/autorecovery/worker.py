"""The replication worker: takes under-replicated ledgers from the task list and repairs them.

One round (after BookKeeper's ReplicationWorker, with the StarRocks seed's ordering):

1. While AutoRecovery is disabled, wait.
2. Order the tasks most-at-risk first (:func:`bkref.impl.core.repair.order_tasks`); skip a
   ledger in back-off or whose lock another worker holds.
3. With the lock held: if the ledger's open last segment uses a bad bookie, wait
   ``openLedgerRereplicationGracePeriod`` for the writer to change ensembles itself
   (any metadata change restarts the wait: the writer is alive); then fence it by a
   recovery open, which closes it. A grace period of 0 fences at the first look.
4. Copy every immutable fragment on a bad bookie (:mod:`.replicator`), under the
   per-bookie repair slots, and CAS each new replica into the metadata.
5. Once no segment names a bad bookie, delete the task with a version check: a mark
   that arrived meanwhile keeps it.
   Otherwise count a failure and back off ``rwRereplicateBackoffMs``.

Every decision is made by the sans-I/O :class:`bkref.impl.core.replication.WorkerCore`;
this shell takes the locks, reads ZooKeeper, fences and copies, and reports each
outcome to the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from contextlib import AsyncExitStack
from dataclasses import dataclass

from kazoo.exceptions import KazooException

from bkref.impl.autorecovery.auditor import probe_fragment
from bkref.impl.autorecovery.replicator import RepairError, perform_repair_step
from bkref.impl.client.client import BookKeeper
from bkref.impl.client.errors import BKError
from bkref.impl.clock import SYSTEM_CLOCK, Clock
from bkref.impl.core.actions import LocalProtocolError
from bkref.impl.core.audit import Probe
from bkref.impl.core.digest import Digest
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.core.repair import Task
from bkref.impl.core.repair_run import CasReplica, Copy, ReadOpenLac
from bkref.impl.core.replication import WorkerConfig, WorkerCore
from bkref.impl.core.worker_actions import (
    CompleteTask,
    Defer,
    ReadLedger,
    RecordFailure,
    StartRecovery,
    TryLock,
    Verified,
    WorkerAction,
)
from bkref.impl.meta.store import NoSuchLedgerError
from bkref.impl.meta.underreplication import UnderreplicationManager
from bkref.impl.trace import Tracer

__all__ = ["ReplicationWorker", "WorkerConfig", "WorkerStats"]

log = logging.getLogger(__name__)

POLL = 0.5  # seconds between looks at the task list when idle
REPAIR_TIMEOUT = 600.0  # one ledger's repair (copies, fencing) may not hold its lock longer


@dataclass
class WorkerStats:
    repaired: int = 0
    fenced: int = 0
    failures: int = 0
    bytes: int = 0
    entries: int = 0
    lock_busy: int = 0  # tasks skipped because another worker held the ledger's lock


class ReplicationWorker:
    """The shell around :class:`bkref.impl.core.replication.WorkerCore`."""

    def __init__(
        self,
        bk: BookKeeper,
        urm: UnderreplicationManager,
        node_id: str,
        local: str | None,
        config: WorkerConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        plants: frozenset[str] = frozenset(),
        tracer: Tracer | None = None,
    ) -> None:
        # ``tracer``: the spec steps of its attempts (``worker_*``), for trace validation.
        self.tracer = tracer
        self.bk, self.urm, self.node_id, self.local, self.config = (
            bk,
            urm,
            node_id,
            local,
            config,
        )
        # The core's time: the open-ledger grace period, back-offs, task ages. (The
        # idle poll and REPAIR_TIMEOUT are real-time intervals of the shell's I/O.)
        self.clock = clock
        self.core = WorkerCore(node_id, local, config, self._now_ms(), plants)
        self.stats = WorkerStats()
        self._ledger_md: LedgerMetadata | None = None  # the locked ledger as last read
        self._queue: deque[WorkerAction] = deque()
        self._why = ""  # why the attempt under way let (or will let) the lock go
        self._deferred: dict[int, str] = {}  # ledger -> why it was last left for later
        self._enabled = asyncio.Event()
        self._enabled.set()

    def _now_ms(self) -> int:
        return self.clock.monotonic_ms()

    def watch_enabled(self) -> None:
        loop = asyncio.get_running_loop()

        def changed(enabled: bool) -> None:
            loop.call_soon_threadsafe(self._set_enabled, enabled)

        self.urm.watch_enabled(changed)

    def _set_enabled(self, enabled: bool) -> None:
        if enabled:
            self._enabled.set()
        else:
            self._enabled.clear()
        self.core.on_enabled(enabled)

    async def run(self) -> None:
        self.watch_enabled()
        while True:
            await self._enabled.wait()
            try:
                worked = await self.run_once()
            except Exception:  # one bad round must not stop repairs (nor, in-process, the bookie)
                log.exception("worker %s: round failed; retrying", self.node_id)
                worked = 0
            if not worked:
                await asyncio.sleep(POLL)

    async def run_once(self) -> int:
        """One pass over the task list; returns how many ledgers were attempted."""
        # Locks and repair slots this session still holds from an earlier round (a
        # release that failed while ZooKeeper was out of reach): none is held on purpose
        # between rounds, and a leftover keeps every worker off a ledger or a bookie.
        leaked = await asyncio.to_thread(self.urm.release_leaked)
        if leaked:
            log.warning("worker %s: released %d leftover lock(s)/slot(s)", self.node_id, leaked)
        tasks = await asyncio.to_thread(self.urm.tasks)
        writable = None
        if tasks and self.local is not None:
            writable = set(await asyncio.to_thread(self.bk.meta.writable_bookies))
        self._queue.clear()
        self.core.on_tasks(tasks, self._now_ms(), self.clock.wall_ms(), writable=writable)
        attempted = 0
        while (action := self._next()) is not None:
            if not isinstance(action, TryLock):
                raise LocalProtocolError(f"worker {self.node_id}: {action} between ledgers")
            lid = action.ledger_id
            if not await asyncio.to_thread(self.urm.try_lock, lid, self.node_id):
                self.stats.lock_busy += 1
                self.core.on_lock(lid, False, None, self._now_ms())
                continue
            started = completed = False  # an attempt (a task under the lock); its delete
            try:
                # Another worker may have completed it between our listing and our lock.
                current = await asyncio.to_thread(self.urm.get, lid)
                self.core.on_lock(lid, True, current, self._now_ms())
                if current is None:
                    continue
                started = True
                if self.tracer is not None:
                    self.tracer.step(
                        "worker_acquires_ledger_lock",
                        ledger=lid,
                        worker=self.node_id,
                        bookie=self.local,
                        version=current[1],
                    )
                attempted += 1
                completed = await self._attempt(*current)
            finally:
                if self.tracer is not None and started and not completed:
                    # why: for a reader of the trace, a failed or deferred repair (the
                    # spec's worker_fails_repair) or one with nothing left to do here.
                    self.tracer.step(
                        "worker_releases_lock", ledger=lid, worker=self.node_id, why=self._why
                    )
                await self._end_attempt(lid)
        return attempted

    def _next(self) -> WorkerAction | None:
        self._queue.extend(self.core.take_actions())
        return self._queue.popleft() if self._queue else None

    async def _end_attempt(self, lid: int) -> None:
        """Release ``lid``'s lock whatever happened: this performs the core's Unlock, and
        drops whatever else an error left queued."""
        self._queue.clear()
        self.core.take_actions()
        await self._unlock(lid)
        self.core.on_unlocked(self._now_ms())

    async def _unlock(self, lid: int) -> None:
        """Release a ledger's lock; if ZooKeeper is out of reach, the next round does."""
        try:
            await asyncio.to_thread(self.urm.unlock, lid)
        except KazooException as e:
            log.warning("worker %s: ledger %d: unlock failed (%r)", self.node_id, lid, e)

    async def _attempt(self, task: Task, version: int) -> bool:
        """Repair ``task``; True when its task was deleted (the lock with it)."""
        self._why = ""
        try:
            done = await asyncio.wait_for(self.repair(task, version), REPAIR_TIMEOUT)
        except (RepairError, BKError, KazooException, TimeoutError) as e:
            log.warning("worker %s: ledger %d: %r", self.node_id, task.ledger_id, e)
            self._why = f"failed: {e!r}"
            done = self._failed(repr(e))
        except Exception as e:  # e.g. the ledger deleted mid-repair, ZooKeeper gone for long
            log.exception("worker %s: ledger %d: repair failed", self.node_id, task.ledger_id)
            self._why = f"failed: {e!r}"
            done = self._failed(repr(e))
        if done is None:  # deferred: grace period running, or nothing this worker can do
            return False
        if not done:
            action = self._next()
            if not isinstance(action, RecordFailure):
                raise LocalProtocolError(f"worker {self.node_id}: {action} after a failure")
            self.stats.failures += 1
            await asyncio.to_thread(self.urm.record_failure, action.ledger_id, action.version)
        return done

    def _complete(self, lid: int, version: int) -> bool:
        """Delete the task (if still at ``version``) and log it in the same thread: an
        attempt cancelled meanwhile (its time out) cannot leave an unlogged delete."""
        deleted = self.urm.complete(lid, version)
        if self.tracer is not None:
            self.tracer.step(
                "worker_deletes_task", ledger=lid, worker=self.node_id, version=version,
                deleted=deleted,
            )  # fmt: skip
        return deleted

    def _failed(self, why: str) -> bool:
        self._queue.clear()
        self.core.on_failed(why, self._now_ms())
        return False

    async def repair(self, task: Task, version: int) -> bool | None:
        """Perform the core's steps of the attempt on ``task`` (read at ``version``, which
        the core holds since the lock): True when the task was completed; False on
        failure; None when deferred."""
        lid = task.ledger_id
        while (action := self._next()) is not None:
            if isinstance(action, ReadLedger):
                await self._read_ledger(action)
            elif isinstance(action, StartRecovery):
                log.info(
                    "worker %s: ledger %d still open on %s after the grace period: fencing it",
                    self.node_id,
                    lid,
                    list(action.bookies),
                )
                if self.tracer is not None:  # its recovery's steps are its client's
                    self.tracer.step("worker_fences_open_ledger", ledger=lid, worker=self.node_id)
                await self.bk.open_ledger(lid, action.password, recovery=True)
                self.stats.fenced += 1
                self.core.on_recovered()
            elif isinstance(action, Probe):
                md = self._ledger_md
                assert md is not None  # a probe follows the read of the ledger
                verdicts = await probe_fragment(
                    self.bk, Digest(md.digest_type, md.password), action
                )
                self.core.on_probe(action, verdicts, self._now_ms())
            elif isinstance(action, Copy | CasReplica | ReadOpenLac):
                entries, nbytes = await perform_repair_step(
                    self.bk,
                    action,
                    self.core,
                    slots=self._slots,
                    owns_lock=functools.partial(self.urm.owns_lock, lid),
                    tracer=self.tracer,
                )
                self.stats.entries += entries
                self.stats.bytes += nbytes
            elif isinstance(action, Verified):
                self._deferred.pop(lid, None)
                if self.tracer is not None:
                    self.tracer.step(
                        "worker_verifies_ledger_replicated", ledger=lid, worker=self.node_id
                    )
            elif isinstance(action, CompleteTask):
                deleted = await asyncio.to_thread(self._complete, lid, action.version)
                if deleted and action.repaired:
                    self.stats.repaired += 1
                    log.info("worker %s: ledger %d repaired", self.node_id, lid)
                self.core.on_completed(deleted)
                return True
            elif isinstance(action, Defer):
                self._why = f"deferred: {action.why}"
                self._defer(lid, action.why)
                return None
            elif isinstance(action, RecordFailure):
                self._why = f"failed: {action.why}"
                log.info("worker %s: %s", self.node_id, action.why)
                self._queue.appendleft(action)  # performed by _attempt
                return False
            else:
                raise LocalProtocolError(f"worker {self.node_id}: {action} during an attempt")
        raise LocalProtocolError(f"worker {self.node_id}: ledger {lid}: the attempt stalled")

    async def _read_ledger(self, action: ReadLedger) -> None:
        lid = action.ledger_id
        live = None
        if action.live:
            live = {b.bookie_id for b in await asyncio.to_thread(self.bk.meta.bookies)}
        try:
            md, version = await asyncio.to_thread(self.bk.meta.read_ledger, lid)
        except NoSuchLedgerError:
            md, version = None, -1
        self._ledger_md = md
        candidates = None
        if action.candidates:
            candidates = await asyncio.to_thread(self.bk.meta.writable_bookies)
        self.core.on_ledger(md, version, self._now_ms(), live=live, candidates=candidates)

    def _defer(self, lid: int, why: str) -> None:
        """Leave the ledger for now; say why once per change of reason (a ledger that
        never makes progress must be explainable from the log)."""
        if self._deferred.get(lid) != why:
            self._deferred[lid] = why
            log.info("worker %s: ledger %d deferred: %s", self.node_id, lid, why)

    async def _slots(self, bookies: list[str]) -> AsyncExitStack | None:
        stack = AsyncExitStack()
        for b in bookies:
            sem = self.urm.slot(b, self.node_id, self.config.slots_per_bookie)
            got = await asyncio.to_thread(sem.acquire, False)
            if not got:
                await stack.aclose()
                return None
            stack.push_async_callback(_release, sem)
        return stack


async def _release(sem: object) -> None:
    release = getattr(sem, "release")  # noqa: B009 - kazoo's Semaphore is untyped
    with contextlib.suppress(KazooException):  # a lease left behind: the next round reaps it
        await asyncio.to_thread(release)
