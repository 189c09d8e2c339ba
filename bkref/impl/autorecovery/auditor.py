"""The auditor: elected among the autorecovery nodes, it finds under-replicated ledgers.

- Election: every node leaves an ephemeral sequential vote under
  ``underreplication/auditorelection``; the lowest vote is the auditor, its sequence
  number the epoch. The others watch the votes and take over when the auditor's
  session ends (its vote disappears with it).
- Bookie audit: on a change of ``/ledgers/available`` the auditor compares the
  registered bookies with those it saw before. A lost bookie is audited after
  ``lostBookieRecoveryDelay`` seconds, at once if more than one bookie that holds
  data is down (counting those lost earlier and not yet back); an audit
  scans every ledger's metadata and marks each ledger that names a lost (or
  decommissioning) bookie. It also runs on election, every
  ``auditorPeriodicBookieCheckInterval`` and whenever the delay znode is written
  (``bkref shell triggeraudit``).
- Ledger check (the Fsck seed's "periodically check ledgers are available"): every
  ``auditorPeriodicCheckInterval`` it reads, from each live bookie of each immutable
  segment, the first and last entry that bookie should hold (plus
  ``auditorLedgerVerificationPercentage`` percent of them, rounded down, from the rest)
  and marks a replica
  that lacks one, or holds a copy whose digest fails, as ENTRIES_MISSING.
- While AutoRecovery is disabled the auditor keeps watching but publishes nothing.

The decisions (who leads, when to audit, what to mark, which replicas to probe) are
made by the sans-I/O :mod:`bkref.impl.core.audit`; this shell keeps the ZooKeeper watches,
feeds their news to the core and performs its actions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from kazoo.client import KazooState
from kazoo.exceptions import KazooException

from bkref.impl.client.client import BookKeeper
from bkref.impl.client.connection import BookieUnavailableError
from bkref.impl.client.errors import ZooKeeperError
from bkref.impl.clock import SYSTEM_CLOCK, Clock
from bkref.impl.core.audit import (
    AuditAction,
    AuditorConfig,
    AuditorCore,
    AuditView,
    CheckLedgers,
    JoinElection,
    LedgerCheck,
    Mark,
    Probe,
    ReadDelay,
    ReadLedgers,
    Verdict,
    judge,
)
from bkref.impl.core.digest import Digest
from bkref.impl.core.frames import ReadRequest
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.meta import layout
from bkref.impl.meta.store import UNKNOWN_OUTCOME, NoSuchLedgerError
from bkref.impl.meta.underreplication import UnderreplicationManager
from bkref.impl.trace import Tracer

__all__ = ["AuditStats", "Auditor", "AuditorConfig", "check_replicas"]

log = logging.getLogger(__name__)


@dataclass
class AuditStats:
    audits: int = 0
    checks: int = 0
    marked: int = 0
    last_audit_s: float = 0.0
    last_check_s: float = 0.0


class Auditor:
    """The shell around :class:`bkref.impl.core.audit.AuditorCore`: it keeps the watches, turns
    them into the core's events and performs the core's actions against ZooKeeper."""

    def __init__(
        self,
        bk: BookKeeper,
        urm: UnderreplicationManager,
        node_id: str,
        config: AuditorConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        plants: frozenset[str] = frozenset(),
        tracer: Tracer | None = None,
    ) -> None:
        self.bk, self.urm, self.node_id, self.config = bk, urm, node_id, config
        self.tracer = tracer  # its elections and marks as the spec's steps (trace validation)
        # The core's time: when a lost bookie's delay is over, when the periodic
        # audit and ledger check are due. (The stats' durations are on time.monotonic.)
        self.clock = clock
        self.core = AuditorCore(node_id, config, self._now_ms(), plants)
        self.stats = AuditStats()
        self._vote: str | None = None
        self._wake = asyncio.Event()
        self._bookies_changed = asyncio.Event()
        self._poked = asyncio.Event()
        self._inbox: list[Callable[[int], None]] = []  # core events from the watches
        self._queue: deque[AuditAction] = deque()
        self._rng = random.Random()
        self._viewed: int | None = None  # when the last audit read the registered bookies

    def _now_ms(self) -> int:
        return self.clock.monotonic_ms()

    @property
    def epoch(self) -> int | None:
        """The election epoch while this node is the auditor, else None."""
        return self.core.epoch

    def _threadsafe(self, event: asyncio.Event) -> Callable[[], None]:
        loop = asyncio.get_running_loop()

        def fire() -> None:
            loop.call_soon_threadsafe(event.set)

        return fire

    def _poster(self) -> Callable[[Callable[[int], None]], None]:
        """``post(f)`` from kazoo's thread: ``f(now_ms)`` runs on the loop before the next
        decision (a core event with no I/O to do first)."""
        loop = asyncio.get_running_loop()

        def deliver(f: Callable[[int], None]) -> None:
            self._inbox.append(f)
            self._poked.set()

        def post(f: Callable[[int], None]) -> None:
            loop.call_soon_threadsafe(deliver, f)

        return post

    # ------------------------------------------------------------ election

    async def run(self) -> None:
        zk = self.bk.meta.zk
        wake = self._threadsafe(self._wake)

        def on_state(state: str) -> None:
            if state in (KazooState.LOST, KazooState.CONNECTED):
                wake()

        zk.add_listener(on_state)

        def on_votes(_children: list[str]) -> None:
            wake()

        zk.ChildrenWatch(f"{self.urm.base}/auditorelection", on_votes)
        while True:
            self._wake.clear()
            try:
                vote = self._vote
                if vote is not None and await asyncio.to_thread(zk.exists, vote) is not None:
                    mine: int | None = _seq(vote)
                else:
                    self.core.on_votes(None, None, self._now_ms())
                    await self._perform_all()
                    mine = _seq(self._vote) if self._vote is not None else None
                auditor = await asyncio.to_thread(self.urm.auditor)
                self.core.on_votes(mine, auditor.epoch if auditor else None, self._now_ms())
                if self.core.leading:
                    await self._lead()
                    continue
            except (KazooException, ZooKeeperError) as e:
                # Keep the vote: it lives as long as the session, and the next round checks
                # it exists (a vote dropped here but alive would block every election).
                log.warning("%s: election: ZooKeeper error %r; retrying", self.node_id, e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 1.0)

    async def _still_elected(self) -> bool:
        zk = self.bk.meta.zk
        if self._vote is None:
            return False
        try:
            return await asyncio.to_thread(zk.exists, self._vote) is not None
        except KazooException:
            return False

    # ------------------------------------------------------------ leading

    async def _lead(self) -> None:
        zk = self.bk.meta.zk
        epoch = self.core.epoch
        assert epoch is not None
        log.info("%s: elected auditor (epoch %d)", self.node_id, epoch)
        if self.tracer is not None:
            self.tracer.step("node_wins_auditor_election", auditor=self.node_id, epoch=epoch)
        changed = self._threadsafe(self._bookies_changed)
        post = self._poster()
        first_delay_event = [True]
        self._inbox.clear()
        self._poked.clear()

        def on_bookies(_children: list[str]) -> bool:
            if self.epoch != epoch:
                return False  # stops the watch
            changed()
            return True

        def on_delay(_data: bytes | None, _stat: object) -> bool:
            if self.epoch != epoch:
                return False
            if first_delay_event[0]:
                first_delay_event[0] = False
            else:
                post(self.core.on_trigger)
            return True

        def on_enabled(enabled: bool) -> bool:
            if self.epoch != epoch:
                return False
            post(partial(self.core.on_enabled, enabled))
            return True

        self.urm.watch_enabled(on_enabled)
        zk.ChildrenWatch(layout.available(self.urm.root), on_bookies)
        zk.ChildrenWatch(layout.readonly(self.urm.root), on_bookies)
        zk.DataWatch(f"{self.urm.base}/lostBookieRecoveryDelay", on_delay)
        try:
            self.core.on_registered(await self._registered(), self._now_ms())
            self.core.tick(self._now_ms())  # the audit of a new auditor
            await self._perform_all()
            while await self._still_elected():
                now = self._now_ms()
                due = self.core.next_wakeup_ms
                deadline = now + 1000 if due is None else min(due, now + 1000)
                waiters = [
                    asyncio.ensure_future(self._bookies_changed.wait()),
                    asyncio.ensure_future(self._poked.wait()),
                ]
                await asyncio.wait(waiters, timeout=max(0.0, (deadline - now) / 1000))
                for w in waiters:
                    w.cancel()
                now = self._now_ms()
                if self._bookies_changed.is_set():
                    self._bookies_changed.clear()
                    self.core.on_registered(await self._registered(), now)
                    await self._perform_all()  # the delay, if bookies were lost
                self._poked.clear()
                inbox, self._inbox = self._inbox, []
                for event in inbox:
                    event(now)
                self.core.tick(now)
                await self._perform_all()
        finally:
            self.core.on_session_lost()
            self._queue.clear()
            if self.tracer is not None:
                self.tracer.step("auditor_loses_session", auditor=self.node_id, epoch=epoch)
            log.info("%s: no longer the auditor (epoch %d)", self.node_id, epoch)

    async def _registered(self) -> set[str]:
        return {b.bookie_id for b in await asyncio.to_thread(self.bk.meta.bookies)}

    async def _ledgers(self) -> list[tuple[int, LedgerMetadata]]:
        out: list[tuple[int, LedgerMetadata]] = []
        for lid in await self.bk.list_ledgers():
            try:
                md, _ = await asyncio.to_thread(self.bk.meta.read_ledger, lid)
            except NoSuchLedgerError:
                continue
            out.append((lid, md))
        return out

    # ------------------------------------------------------------ performing actions

    async def _perform_all(self) -> None:
        """Perform the core's actions in order, and those their answers lead to."""
        while True:
            self._queue.extend(self.core.take_actions())
            if not self._queue:
                return
            await self._perform(self._queue.popleft())

    async def _perform(self, action: AuditAction) -> None:
        if isinstance(action, JoinElection):
            self._vote = await asyncio.to_thread(self.urm.join_election, action.node_id)
            log.info("%s: joined the auditor election (%s)", self.node_id, self._vote)
        elif isinstance(action, ReadDelay):
            delay = await asyncio.to_thread(
                self.urm.lost_bookie_recovery_delay, self.config.lost_bookie_recovery_delay
            )
            log.info(
                "auditor: bookies lost: %s, %d down in all (lostBookieRecoveryDelay %d s)",
                sorted(action.lost),
                len(action.down),
                delay,
            )
            self.core.on_delay(delay)
        elif isinstance(action, ReadLedgers):
            await self.audit()
        elif isinstance(action, CheckLedgers):
            await self.check_ledgers()
            self.core.on_checked(self._now_ms())
        else:  # a Mark outside an audit: the core emits them only in answer to ReadLedgers
            await _mark(
                self.urm, action, self.tracer, "auditor_marks_ledgers_of_lost_bookies", self._viewed
            )

    # ------------------------------------------------------------ the audits

    async def audit(self) -> int:
        """Mark every ledger that names a lost or decommissioning bookie; returns how many."""
        if not await asyncio.to_thread(self.urm.is_enabled):
            log.info("auditor: AutoRecovery is disabled; not publishing")
            self.core.on_ledgers(None)
            return 0
        started = time.monotonic()
        # What the marks decide on: the bookies registered now. The ledgers are read
        # after (seconds, with many), and a bookie may register again meanwhile, before
        # its mark is written: the trace check orders it after the mark then.
        self._viewed = time.monotonic_ns()
        registered = await self._registered()
        leaving = await asyncio.to_thread(self.urm.decommissioning)
        ledgers = await self._ledgers()
        self.core.on_ledgers(AuditView(frozenset(registered), frozenset(leaving), ledgers))
        marked = 0
        for action in self.core.take_actions():
            if not isinstance(action, Mark):
                self._queue.append(action)
                continue
            await _mark(
                self.urm, action, self.tracer, "auditor_marks_ledgers_of_lost_bookies", self._viewed
            )
            marked += 1
        self.stats.audits += 1
        self.stats.marked += marked
        self.stats.last_audit_s = time.monotonic() - started
        log.info(
            "auditor: audit marked %d ledgers under-replicated in %.2f s",
            marked,
            self.stats.last_audit_s,
        )
        return marked

    async def check_ledgers(self) -> int:
        """The periodic ledger check (:func:`check_replicas`); returns how many ledgers
        were marked."""
        if not await asyncio.to_thread(self.urm.is_enabled):
            return 0
        started = time.monotonic()
        marked = len(
            await check_replicas(
                self.bk,
                self.urm,
                self.config.verification_percentage,
                self._rng,
                tracer=self.tracer,
            )
        )
        self.stats.checks += 1
        self.stats.last_check_s = time.monotonic() - started
        log.info(
            "auditor: ledger check marked %d ledgers in %.2f s", marked, self.stats.last_check_s
        )
        return marked


def _seq(vote: str) -> int:
    return int(vote.rsplit("_", 1)[-1])


CHECK_CONCURRENCY = 64  # reads in flight per replica while checking it


async def check_replicas(
    bk: BookKeeper,
    urm: UnderreplicationManager,
    percentage: int,
    rng: random.Random,
    *,
    tracer: Tracer | None = None,
) -> list[Mark]:
    """Run :class:`bkref.impl.core.audit.LedgerCheck` over every ledger: read from every live
    replica of every immutable segment its first and last entry, plus ``percentage``
    percent of its entries, rounded down, from the rest (100: every entry); mark
    replicas that miss entries or hold corrupt ones as ENTRIES_MISSING, and bookies not
    registered as LOST. Returns the marks, one per ledger it found replicas missing in.

    The auditor runs it every ``auditorPeriodicCheckInterval``; ``bkref shell
    checkledgers`` and the campaigns' convergence run it on demand."""
    viewed = time.monotonic_ns()  # its marks decide by the registrations read now
    registered = {b.bookie_id for b in await asyncio.to_thread(bk.meta.bookies)}
    marked: list[Mark] = []
    for lid in await bk.list_ledgers():
        try:
            md, _ = await asyncio.to_thread(bk.meta.read_ledger, lid)
        except NoSuchLedgerError:
            continue
        check = LedgerCheck(lid, md, registered, percentage, rng)
        digest = Digest(md.digest_type, md.password)
        actions = deque(check.take_actions())
        while actions:
            action = actions.popleft()
            if isinstance(action, Probe):
                check.on_probe(action, await probe_fragment(bk, digest, action))
                actions.extend(check.take_actions())
                continue
            log.warning(
                "ledger check: ledger %d: replicas missing entries: %s",
                lid,
                sorted(action.replicas),
            )
            await _mark(urm, action, tracer, "auditor_checks_ledger_replicas", viewed)
            marked.append(action)
    return marked


async def probe_fragment(bk: BookKeeper, digest: Digest, probe: Probe) -> dict[int, Verdict]:
    """Read the probe's entries from its bookie (concurrently) and judge each copy (the
    auditor's ledger check, and a worker's check of the replicas its task lists)."""
    frag = probe.fragment
    sem = asyncio.Semaphore(CHECK_CONCURRENCY)

    async def verdict(e: int) -> Verdict:
        async with sem:
            try:
                resp = await bk.request(frag.bookie, partial(_read, frag.ledger_id, e))
            except BookieUnavailableError:
                return Verdict.UNKNOWN
        return judge(resp, digest, frag.ledger_id, e)

    got = await asyncio.gather(*(verdict(e) for e in probe.entries))
    return dict(zip(probe.entries, got, strict=True))


async def _mark(
    urm: UnderreplicationManager,
    m: Mark,
    tracer: Tracer | None = None,
    action: str = "",
    viewed: int | None = None,
) -> None:
    """Write the mark, and log it as the spec step ``action`` in the same thread: an audit
    cancelled meanwhile (its session lost) cannot leave a task in ZooKeeper that no
    trace line explains (a traced Docker campaign had a worker lock such a task). A
    write that failed on the connection may still have landed (ZooKeeper applied it,
    the answer was lost): it is logged with its outcome unknown, and the trace check
    tries it both ways (a Docker soak run had a worker lock a task no line named)."""

    def write() -> None:
        try:
            urm.mark(m.ledger_id, m.replicas, m.priority, rewrite=m.rewrite)
        except UNKNOWN_OUTCOME:
            if tracer is not None:
                _trace_mark(tracer, action, m, viewed, outcome="unknown")
            raise
        if tracer is not None:
            _trace_mark(tracer, action, m, viewed)

    await asyncio.to_thread(write)


def _trace_mark(
    tracer: Tracer, action: str, m: Mark, viewed: int | None = None, outcome: str | None = None
) -> None:
    """A mark as the spec's step: the ledger and the replicas it lists, with why, and
    (``decided``) when the audit read the registered bookies it marks lost by."""
    extra: dict[str, object] = {} if viewed is None else {"decided": viewed}
    if outcome is not None:
        extra["outcome"] = outcome
    tracer.step(
        action,
        ledger=m.ledger_id,
        replicas={b: r.name for b, r in sorted(m.replicas.items())},
        rewrite=m.rewrite,
        **extra,
    )


def _read(ledger_id: int, entry: int, rid: int) -> ReadRequest:
    return ReadRequest(rid, ledger_id, entry)
