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
  ``auditorLedgerVerificationPercentage`` percent of the rest) and marks a replica
  that lacks one, or holds a copy whose digest fails, as ENTRIES_MISSING.
- While AutoRecovery is disabled the auditor keeps watching but publishes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from kazoo.client import KazooState
from kazoo.exceptions import KazooException

from impl.client.client import BookKeeper
from impl.client.connection import BookieUnavailableError
from impl.core.digest import Digest, DigestMismatchError
from impl.core.frames import ReadRequest, ReadResponse, Status
from impl.core.metadata import LedgerMetadata
from impl.core.repair import Fragment, Reason, live_replicas, segment_range
from impl.meta import layout
from impl.meta.store import NoSuchLedgerError
from impl.meta.underreplication import UnderreplicationManager

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditorConfig:
    lost_bookie_recovery_delay: int = 0  # seconds; the znode, when set, wins
    periodic_check_interval: int = 604800  # seconds; 0 disables
    periodic_bookie_check_interval: int = 86400  # seconds; 0 disables
    verification_percentage: int = 0


@dataclass
class AuditStats:
    audits: int = 0
    checks: int = 0
    marked: int = 0
    last_audit_s: float = 0.0
    last_check_s: float = 0.0


class Auditor:
    def __init__(
        self, bk: BookKeeper, urm: UnderreplicationManager, node_id: str, config: AuditorConfig
    ) -> None:
        self.bk, self.urm, self.node_id, self.config = bk, urm, node_id, config
        self.stats = AuditStats()
        self.epoch: int | None = None  # set while this node is the auditor
        self._vote: str | None = None
        self._wake = asyncio.Event()
        self._bookies_changed = asyncio.Event()
        self._trigger = asyncio.Event()
        self._rng = random.Random()
        self._seen: set[str] = set()  # bookies registered at some point of this term
        self._named: set[str] = set()  # bookies some ledger named at the last audit

    def _threadsafe(self, event: asyncio.Event) -> Callable[[], None]:
        loop = asyncio.get_running_loop()

        def fire() -> None:
            loop.call_soon_threadsafe(event.set)

        return fire

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
                if self._vote is None or await asyncio.to_thread(zk.exists, self._vote) is None:
                    self._vote = await asyncio.to_thread(self.urm.join_election, self.node_id)
                    log.info("%s: joined the auditor election (%s)", self.node_id, self._vote)
                auditor = await asyncio.to_thread(self.urm.auditor)
                mine = int(self._vote.rsplit("_", 1)[-1])
                if auditor is not None and auditor.epoch == mine:
                    await self._lead(mine)
                    continue
            except KazooException as e:
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

    async def _lead(self, epoch: int) -> None:
        zk = self.bk.meta.zk
        self.epoch = epoch
        log.info("%s: elected auditor (epoch %d)", self.node_id, epoch)
        changed = self._threadsafe(self._bookies_changed)
        trigger = self._threadsafe(self._trigger)
        first_delay_event = [True]

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
                trigger()
            return True

        def on_enabled(enabled: bool) -> bool:
            # An audit skipped while disabled runs once enabled, as BookKeeper's does.
            if self.epoch != epoch:
                return False
            if enabled:
                trigger()
            return True

        self.urm.watch_enabled(on_enabled)
        zk.ChildrenWatch(layout.available(self.urm.root), on_bookies)
        zk.ChildrenWatch(layout.readonly(self.urm.root), on_bookies)
        zk.DataWatch(f"{self.urm.base}/lostBookieRecoveryDelay", on_delay)
        try:
            known = await self._registered()
            self._seen = set(known)
            await self.audit()
            now = time.monotonic()
            next_check = self._next(now, self.config.periodic_check_interval)
            next_bookie_check = self._next(now, self.config.periodic_bookie_check_interval)
            audit_at: float | None = None
            while await self._still_elected():
                now = time.monotonic()
                deadline = min(
                    x for x in (next_check, next_bookie_check, audit_at, now + 1.0) if x is not None
                )
                waiters = [
                    asyncio.ensure_future(self._bookies_changed.wait()),
                    asyncio.ensure_future(self._trigger.wait()),
                ]
                await asyncio.wait(waiters, timeout=max(0.0, deadline - now))
                for w in waiters:
                    w.cancel()
                now = time.monotonic()
                if self._bookies_changed.is_set():
                    self._bookies_changed.clear()
                    registered = await self._registered()
                    lost = known - registered
                    # Every bookie down now that still holds data (the audits say which).
                    down = (self._seen - registered) & (self._named | lost)
                    known = registered
                    self._seen |= registered
                    if lost:
                        delay = await asyncio.to_thread(
                            self.urm.lost_bookie_recovery_delay,
                            self.config.lost_bookie_recovery_delay,
                        )
                        log.info(
                            "auditor: bookies lost: %s, %d down in all "
                            "(lostBookieRecoveryDelay %d s)",
                            sorted(lost),
                            len(down),
                            delay,
                        )
                        if delay <= 0 or len(down) > 1 or audit_at is not None:
                            audit_at = now
                        else:
                            audit_at = now + delay
                if self._trigger.is_set():
                    self._trigger.clear()
                    audit_at = now
                if next_bookie_check is not None and now >= next_bookie_check:
                    audit_at = now
                    next_bookie_check = self._next(now, self.config.periodic_bookie_check_interval)
                if audit_at is not None and now >= audit_at:
                    audit_at = None
                    await self.audit()
                if next_check is not None and now >= next_check:
                    await self.check_ledgers()
                    next_check = self._next(time.monotonic(), self.config.periodic_check_interval)
        finally:
            self.epoch = None
            log.info("%s: no longer the auditor (epoch %d)", self.node_id, epoch)

    @staticmethod
    def _next(now: float, interval: int) -> float | None:
        return now + interval if interval > 0 else None

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

    # ------------------------------------------------------------ the audits

    async def audit(self) -> int:
        """Mark every ledger that names a lost or decommissioning bookie; returns how many."""
        if not await asyncio.to_thread(self.urm.is_enabled):
            log.info("auditor: AutoRecovery is disabled; not publishing")
            return 0
        started = time.monotonic()
        registered = await self._registered()
        leaving = await asyncio.to_thread(self.urm.decommissioning)
        marked = 0
        named: set[str] = set()
        for lid, md in await self._ledgers():
            bad: dict[str, Reason] = {}
            named |= md.bookies()
            for b in md.bookies():
                if b not in registered:
                    bad[b] = Reason.LOST
                elif b in leaving:
                    bad[b] = Reason.LEAVING
            if bad:
                await asyncio.to_thread(
                    self.urm.mark, lid, bad, live_replicas(md, registered - leaving)
                )
                marked += 1
        self._named = named
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
        marked = await check_replicas(
            self.bk, self.urm, self.config.verification_percentage, self._rng
        )
        self.stats.checks += 1
        self.stats.last_check_s = time.monotonic() - started
        log.info(
            "auditor: ledger check marked %d ledgers in %.2f s", marked, self.stats.last_check_s
        )
        return marked


CHECK_CONCURRENCY = 64  # reads in flight per replica while checking it


async def check_replicas(
    bk: BookKeeper, urm: UnderreplicationManager, percentage: int, rng: random.Random
) -> int:
    """Read from every live replica of every immutable segment its first and last entry,
    plus ``percentage`` percent of the rest (100: every entry); mark replicas that miss
    entries or hold corrupt ones as ENTRIES_MISSING. Returns how many ledgers were marked.

    The auditor runs it every ``auditorPeriodicCheckInterval``; ``bkref shell
    checkledgers`` and the campaigns' convergence run it on demand. With Aq < Wq an
    acknowledged entry may reach only Aq bookies (the others crashed before their
    fsync), and the writer's ensemble change starts after the LAC: only this check
    finds such a gap, and only when it samples the missing entries."""
    registered = {b.bookie_id for b in await asyncio.to_thread(bk.meta.bookies)}
    marked = 0
    for lid in await bk.list_ledgers():
        try:
            md, _ = await asyncio.to_thread(bk.meta.read_ledger, lid)
        except NoSuchLedgerError:
            continue
        digest = Digest(md.digest_type, md.password)
        bad: dict[str, Reason] = {}
        for i, seg in enumerate(md.segments):
            first, last = segment_range(md, i)
            if last is None or last < first:
                continue
            for idx, b in enumerate(seg.ensemble):
                if b not in registered or b in bad:
                    continue
                frag = Fragment(lid, i, first, last, seg.ensemble, idx)
                if not await _fragment_intact(bk, md, digest, frag, percentage=percentage, rng=rng):
                    bad[b] = Reason.ENTRIES_MISSING
        if bad:
            log.warning("ledger check: ledger %d: replicas missing entries: %s", lid, sorted(bad))
            await asyncio.to_thread(urm.mark, lid, bad, live_replicas(md, registered) - 1)
            marked += 1
    return marked


async def _fragment_intact(
    bk: BookKeeper,
    md: LedgerMetadata,
    digest: Digest,
    frag: Fragment,
    *,
    percentage: int,
    rng: random.Random,
) -> bool:
    entries = frag.entries(md)
    if not entries:
        return True
    sample = {entries[0], entries[-1]}
    if percentage > 0 and len(entries) > 2:
        k = max(1, len(entries) * percentage // 100)
        sample.update(rng.sample(entries[1:-1], min(k, len(entries) - 2)))
    sem = asyncio.Semaphore(CHECK_CONCURRENCY)

    async def intact(e: int) -> bool:
        async with sem:
            try:
                resp = await bk.request(frag.bookie, partial(_read, frag.ledger_id, e))
            except BookieUnavailableError:
                return True  # cannot tell; the bookie audit covers bookies that are gone
        # Missing, or there but unreadable (the bookie's own read failed: a corrupt record).
        if resp.status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER, Status.IO_ERROR):
            return False
        if isinstance(resp, ReadResponse) and resp.status is Status.OK:
            try:
                digest.verify(resp.body, frag.ledger_id, e)
            except DigestMismatchError:
                return False
        return True

    return all(await asyncio.gather(*(intact(e) for e in sorted(sample))))


def _read(ledger_id: int, entry: int, rid: int) -> ReadRequest:
    return ReadRequest(rid, ledger_id, entry)
