"""The replication worker: takes under-replicated ledgers from the task list and repairs them.

One round (after BookKeeper's ReplicationWorker, with the StarRocks seed's ordering):

1. While AutoRecovery is disabled, wait.
2. Order the tasks most-at-risk first (:func:`impl.core.repair.order_tasks`); skip a
   ledger in back-off or whose lock another worker holds.
3. With the lock held: if the ledger's open last segment uses a bad bookie, wait
   ``openLedgerRereplicationGracePeriod`` for the writer to change ensembles itself
   (any metadata change restarts the wait: the writer is alive); then fence it by a
   recovery open, which closes it.
4. Copy every immutable fragment on a bad bookie (:mod:`.replicator`), under the
   per-bookie repair slots, and CAS each new replica into the metadata.
5. Once no segment names a lost or leaving bookie (and in-place refills succeeded),
   delete the task with a version check: a mark that arrived meanwhile keeps it.
   Otherwise count a failure and back off ``rwRereplicateBackoffMs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from kazoo.exceptions import KazooException

from impl.autorecovery.replicator import RepairError, repair_ledger
from impl.client.client import BKError, BookKeeper
from impl.core.metadata import LedgerState
from impl.core.planted import active as planted
from impl.core.repair import (
    Reason,
    Scheduling,
    Task,
    is_repaired,
    needs_fencing,
    open_segment_has,
    order_tasks,
)
from impl.meta.store import NoSuchLedgerError
from impl.meta.underreplication import UnderreplicationManager

log = logging.getLogger(__name__)

POLL = 0.5  # seconds between looks at the task list when idle
REPAIR_TIMEOUT = 600.0  # one ledger's repair (copies, fencing) may not hold its lock longer


@dataclass(frozen=True)
class WorkerConfig:
    grace_period_ms: int = 30000  # openLedgerRereplicationGracePeriod
    backoff_ms: int = 5000  # rwRereplicateBackoffMs
    slots_per_bookie: int = 4
    scheduling: Scheduling = field(default_factory=Scheduling)


@dataclass
class WorkerStats:
    repaired: int = 0
    fenced: int = 0
    failures: int = 0
    bytes: int = 0
    entries: int = 0
    lock_busy: int = 0  # tasks skipped because another worker held the ledger's lock


class ReplicationWorker:
    def __init__(
        self,
        bk: BookKeeper,
        urm: UnderreplicationManager,
        node_id: str,
        local: str | None,
        config: WorkerConfig,
    ) -> None:
        self.bk, self.urm, self.node_id, self.local, self.config = (
            bk,
            urm,
            node_id,
            local,
            config,
        )
        self.stats = WorkerStats()
        self._backoff: dict[int, float] = {}  # ledger -> monotonic time to retry at
        self._open_seen: dict[int, tuple[int, float]] = {}  # ledger -> (md version, since)
        self._deferred: dict[int, str] = {}  # ledger -> why it was last left for later
        self._enabled = asyncio.Event()
        self._enabled.set()

    def watch_enabled(self) -> None:
        loop = asyncio.get_running_loop()

        def changed(enabled: bool) -> None:
            loop.call_soon_threadsafe(self._enabled.set if enabled else self._enabled.clear)

        self.urm.watch_enabled(changed)

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
        now_ms = int(time.time() * 1000)
        attempted = 0
        for task in order_tasks((t for t, _ in tasks), now_ms, self.config.scheduling):
            if not self._enabled.is_set():
                break
            if self._backoff.get(task.ledger_id, 0.0) > time.monotonic():
                continue
            if not await asyncio.to_thread(self.urm.try_lock, task.ledger_id, self.node_id):
                self.stats.lock_busy += 1
                continue
            try:
                # Another worker may have completed it between our listing and our lock.
                current = await asyncio.to_thread(self.urm.get, task.ledger_id)
                if current is None:
                    continue
                attempted += 1
                await self._attempt(*current)
            finally:
                await self._unlock(task.ledger_id)
        return attempted

    async def _unlock(self, lid: int) -> None:
        """Release a ledger's lock; if ZooKeeper is out of reach, the next round does."""
        try:
            await asyncio.to_thread(self.urm.unlock, lid)
        except KazooException as e:
            log.warning("worker %s: ledger %d: unlock failed (%r)", self.node_id, lid, e)

    async def _attempt(self, task: Task, version: int) -> None:
        try:
            done = await asyncio.wait_for(self.repair(task, version), REPAIR_TIMEOUT)
        except (RepairError, BKError, KazooException, TimeoutError) as e:
            log.warning("worker %s: ledger %d: %r", self.node_id, task.ledger_id, e)
            done = False
        except Exception:  # e.g. the ledger deleted mid-repair, ZooKeeper gone for long
            log.exception("worker %s: ledger %d: repair failed", self.node_id, task.ledger_id)
            done = False
        if done is None:  # deferred: grace period running, or nothing this worker can do
            return
        if not done:
            self.stats.failures += 1
            await asyncio.to_thread(self.urm.record_failure, task.ledger_id, version)
            self._backoff[task.ledger_id] = time.monotonic() + self.config.backoff_ms / 1000

    async def _bad(self, task: Task) -> dict[str, Reason]:
        """The task's replicas that still need work: lost ones that are still gone,
        leaving and entries-missing ones."""
        live = {b.bookie_id for b in await asyncio.to_thread(self.bk.meta.bookies)}
        return {b: r for b, r in task.replicas.items() if r is not Reason.LOST or b not in live}

    async def repair(self, task: Task, version: int) -> bool | None:
        """True when the task was completed; False on failure; None when deferred."""
        lid = task.ledger_id
        bad = await self._bad(task)
        try:
            md, md_version = await asyncio.to_thread(self.bk.meta.read_ledger, lid)
        except NoSuchLedgerError:
            await asyncio.to_thread(self.urm.complete, lid, version)
            return True
        # A ledger in recovery is left to its recovery (whose close CAS a repair of an
        # earlier segment would make fail) until the grace period says it was abandoned.
        # Only a lost bookie justifies fencing: a leaving or entries-missing one still
        # takes the writer's adds, so its open segment waits for the ledger to close.
        lost = {b: r for b, r in bad.items() if r is Reason.LOST}
        # PLANTED BUG switch (test-only, impl/core/planted.py): no grace period, no fence.
        unfenced = md.state is LedgerState.OPEN and planted("repair-open-segment-without-fence")
        if not unfenced and (md.state is LedgerState.IN_RECOVERY or needs_fencing(md, lost)):
            seen = self._open_seen.get(lid)
            now = time.monotonic()
            if seen is None or seen[0] != md_version:
                self._open_seen[lid] = (md_version, now)
                self._defer(lid, "open or in recovery: grace period started")
                return None
            if now - seen[1] < self.config.grace_period_ms / 1000:
                self._defer(lid, "open or in recovery: in its grace period")
                return None
            log.info(
                "worker %s: ledger %d still open on %s after the grace period: fencing it",
                self.node_id,
                lid,
                sorted(set(md.last_segment.ensemble) & set(bad)),
            )
            await self.bk.open_ledger(lid, md.password, recovery=True)
            self.stats.fenced += 1
            self._open_seen.pop(lid, None)
        candidates = await asyncio.to_thread(self.bk.meta.writable_bookies)
        result = await repair_ledger(
            self.bk,
            lid,
            bad,
            candidates,
            local=self.local,
            slots=self._slots,
            owns_lock=functools.partial(self.urm.owns_lock, lid),
        )
        self.stats.bytes += result.bytes
        self.stats.entries += sum(f.entries for f in result.fragments)
        try:
            md, _ = await asyncio.to_thread(self.bk.meta.read_ledger, lid)
        except NoSuchLedgerError:
            await asyncio.to_thread(self.urm.complete, lid, version)
            return True
        if not (result.complete and is_repaired(md, bad)):
            if result.complete and open_segment_has(md, bad):
                # The rest is the open segment: it waits for the ledger to close.
                self._defer(lid, "the rest is in the open segment")
                return None
            skipped = [f for f in result.fragments if f.skipped]
            if skipped and all(f.deferred for f in skipped):
                # Another worker's to do, or slots busy: not a failure.
                self._defer(lid, "; ".join(sorted({f.skipped for f in skipped})))
                return None
            return False
        self._deferred.pop(lid, None)
        if await asyncio.to_thread(self.urm.complete, lid, version):
            self.stats.repaired += 1
            log.info("worker %s: ledger %d repaired", self.node_id, lid)
        return True

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
