"""Copying fragments: read each entry from a surviving replica, verify its digest, and
write it to the target bookie with a recovery add (which a fence does not stop).

Shared by the replication worker and manual recovery (``bkref shell recover``). The
order of a repair is the protocol's: copy first, then CAS the new ensemble into the
metadata. A copy that is never recorded is harmless (garbage on the target); a
metadata change before the copy would name a bookie without the entries.

What to copy where, and when to CAS, is decided by the sans-I/O
:class:`bkref.impl.core.repair_run.RepairRun`; this module performs its steps
(:func:`perform_repair_step`) against the bookies and ZooKeeper.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Collection, Mapping
from contextlib import AsyncExitStack
from typing import Protocol

from bkref.impl.client.client import BookKeeper
from bkref.impl.client.connection import BookieUnavailableError
from bkref.impl.client.errors import BKError
from bkref.impl.clock import Clock
from bkref.impl.core.digest import Digest, DigestMismatchError, master_key
from bkref.impl.core.frames import (
    AddRequest,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Status,
)
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.core.repair import Fragment, Reason
from bkref.impl.core.repair_run import (
    CasReplica,
    Copy,
    FragmentResult,
    LedgerRepair,
    ReadOpenLac,
    RepairAction,
    RepairRun,
)
from bkref.impl.meta.store import MetadataConflictError, NoSuchLedgerError
from bkref.impl.meta.underreplication import UnderreplicationManager
from bkref.impl.trace import Tracer

__all__ = [
    "FragmentResult",
    "LedgerRepair",
    "RepairError",
    "copy_fragment",
    "perform_repair_step",
    "recover_bookie",
    "repair_ledger",
]

log = logging.getLogger(__name__)

COPY_CONCURRENCY = 32  # entries in flight per fragment copy
LOCK_POLL = 0.2  # seconds between tries of a ledger lock another holder keeps


class RepairError(RuntimeError):
    """A fragment could not be copied; the message says which entry and why."""


async def _read_verified(
    bk: BookKeeper, digest: Digest, ledger_id: int, entry: int, sources: list[str]
) -> bytes:
    reasons: list[str] = []
    for b in sources:
        try:
            resp = await bk.request(b, lambda rid: ReadRequest(rid, ledger_id, entry))
        except BookieUnavailableError as e:
            reasons.append(f"{b}: {e}")
            continue
        if isinstance(resp, ReadResponse) and resp.status is Status.OK:
            try:
                digest.verify(resp.body, ledger_id, entry)
            except DigestMismatchError as e:
                reasons.append(f"{b}: {e}")
                continue
            return resp.body
        reasons.append(f"{b}: {resp.status.name}")
    raise RepairError(
        f"ledger {ledger_id} entry {entry}: no verified copy on any other replica "
        f"({'; '.join(reasons) or 'no other replica'})"
    )


async def copy_fragment(
    bk: BookKeeper,
    md: LedgerMetadata,
    frag: Fragment,
    target: str,
    *,
    avoid: Collection[str] = (),
    sent: list[tuple[int, int]] | None = None,
) -> tuple[int, int]:
    """Copy ``frag``'s entries to ``target``; returns (entries, bytes) written.

    Sources are the entry's other replicas, those in ``avoid`` last. ``sent`` collects
    (request id, entry) of every add sent to ``target`` (trace validation links the
    target's answers to the copy by them).
    """
    digest = Digest(md.digest_type, md.password)
    key = master_key(md.password)
    lid = frag.ledger_id
    copied = [0, 0]
    sem = asyncio.Semaphore(COPY_CONCURRENCY)

    async def one(entry: int) -> None:
        async with sem:
            body = await _read_verified(
                bk, digest, lid, entry, frag.copy_sources(md, entry, target, avoid)
            )

            def add(rid: int) -> AddRequest:
                if sent is not None:
                    sent.append((rid, entry))
                return AddRequest(rid, lid, entry, key, body, recovery=True)

            try:
                resp = await bk.request(target, add)
            except BookieUnavailableError as e:
                raise RepairError(f"ledger {lid} entry {entry}: target {target}: {e}") from e
            if resp.status is not Status.OK:
                raise RepairError(
                    f"ledger {lid} entry {entry}: target {target} refused the copy: "
                    f"{resp.status.name}"
                )
            copied[0] += 1
            copied[1] += len(body)

    await asyncio.gather(*(one(e) for e in frag.entries(md)))
    return copied[0], copied[1]


class RepairEvents(Protocol):
    """Who hears how a repair step went: a :class:`RepairRun`, or the worker core."""

    def on_open_lac(self, lac: int) -> None: ...
    def on_copied(self, entries: int, nbytes: int) -> None: ...
    def on_copy_busy(self) -> None: ...
    def on_cas(self, version: int) -> None: ...
    def on_cas_conflict(self, current: LedgerMetadata, version: int) -> None: ...


Slots = Callable[[list[str]], Awaitable[AsyncExitStack | None]]


async def perform_repair_step(
    bk: BookKeeper,
    action: RepairAction,
    core: RepairEvents,
    *,
    slots: Slots | None = None,
    owns_lock: Callable[[], bool] | None = None,
    tracer: Tracer | None = None,
) -> tuple[int, int]:
    """Perform one step a repair core asked for and tell ``core`` how it went; returns
    the entries and bytes it copied.

    ``slots(bookies)`` returns the held repair slots of those bookies as an exit stack,
    or None when one of them has no free slot. ``owns_lock`` is asked before each copy
    and each metadata write: a worker whose ZooKeeper session expired no longer holds
    the ledger's lock, and another worker may be repairing the ledger. It must not
    write the metadata, and copies no more: a copy it could never swap in only loads
    the bookies (and two workers that each saw the other's bookie lost would otherwise
    keep swapping each other's replicas in and out). Errors (a copy that cannot be
    made, the lock lost, the ledger deleted) are raised, not reported.

    With a ``tracer``, a copy and a metadata write are logged as the spec's
    ``worker_copies_fragment`` (the adds sent, and whether the copy completed) and
    ``worker_updates_segment_ensemble`` (written or in conflict)."""
    writes = isinstance(action, Copy | CasReplica)
    if writes and owns_lock is not None and not await asyncio.to_thread(owns_lock):
        raise RepairError(f"ledger {action.ledger_id}: lost the ledger's lock (session expired?)")
    if isinstance(action, Copy):
        guard = await slots(list(action.involved)) if slots is not None else AsyncExitStack()
        if guard is None:
            core.on_copy_busy()
            return 0, 0
        sent: list[tuple[int, int]] = []
        try:
            async with guard:
                entries, nbytes = await copy_fragment(
                    bk,
                    action.metadata,
                    action.fragment,
                    action.target,
                    avoid=action.avoid,
                    sent=sent,
                )
        except BaseException as e:
            if tracer is not None:  # adds of a failed copy may have landed: log them too
                _trace_copy(tracer, action, sent, f"failed: {e!r}")
            raise
        if tracer is not None:
            _trace_copy(tracer, action, sent, "copied")
        core.on_copied(entries, nbytes)
        return entries, nbytes
    if isinstance(action, CasReplica):
        lid = action.ledger_id

        def cas() -> int:
            # Written and logged in one thread: a repair cancelled meanwhile (its time
            # out) cannot leave a metadata write that no trace line explains.
            version = bk.meta.cas_ledger(lid, action.metadata, action.expected_version)
            if tracer is not None:
                _trace_cas(tracer, action, "written", version)
            return version

        try:
            version = await asyncio.to_thread(cas)
        except MetadataConflictError as e:
            if e.current is None:
                raise NoSuchLedgerError(lid) from None
            if tracer is not None:
                _trace_cas(tracer, action, "conflict", e.version)
            core.on_cas_conflict(e.current, e.version)
            return 0, 0
        log.info(
            "ledger %d segment %d: replica %s replaced by %s",
            lid,
            action.segment,
            action.bookie,
            action.target,
        )
        core.on_cas(version)
        return 0, 0
    core.on_open_lac(await _open_lac(bk, action))
    return 0, 0


def _trace_copy(tracer: Tracer, action: Copy, sent: list[tuple[int, int]], outcome: str) -> None:
    frag = action.fragment
    tracer.step(
        "worker_copies_fragment",
        ledger=frag.ledger_id,
        segment=frag.segment,
        lost=frag.bookie,
        bookie=action.target,
        entries=frag.entries(action.metadata),
        sends=[
            {"kind": "add", "bookie": action.target, "rid": rid, "entry": e}
            for rid, e in sorted(sent)
        ],
        outcome=outcome,
    )


def _trace_cas(tracer: Tracer, action: CasReplica, outcome: str, version: int) -> None:
    tracer.step(
        "worker_updates_segment_ensemble",
        ledger=action.ledger_id,
        segment=action.segment,
        lost=action.bookie,
        bookie=action.target,
        expected=action.expected_version,
        version=version,
        outcome=outcome,
    )


async def repair_ledger(
    bk: BookKeeper,
    ledger_id: int,
    bad: Mapping[str, Reason],
    candidates: Mapping[str, str],
    *,
    local: str | None = None,
    target: str | None = None,
    slots: Slots | None = None,
    owns_lock: Callable[[], bool] | None = None,
) -> LedgerRepair:
    """Copy every immutable fragment on a bad bookie and record each copy's new home
    (:class:`bkref.impl.core.repair_run.RepairRun` decides; this performs).

    ``candidates`` are the writable bookies (id -> failure domain). Bad replicas (lost,
    leaving, or missing entries) move to ``target`` if given, else to ``local`` (a
    worker beside a bookie), else to a bookie the placement rules choose. The planted
    bugs are the client's (``bk.plants``).
    """
    try:
        md, version = await asyncio.to_thread(bk.meta.read_ledger, ledger_id)
    except NoSuchLedgerError:
        return LedgerRepair(ledger_id, complete=True, message="ledger deleted")
    run = RepairRun(
        ledger_id,
        md,
        version,
        bad,
        candidates,
        local=local,
        target=target,
        plants=bk.plants,
    )
    while not run.done:
        actions = run.take_actions()
        if not actions:
            raise RepairError(f"ledger {ledger_id}: the repair stalled (no step to take)")
        for action in actions:
            await perform_repair_step(bk, action, run, slots=slots, owns_lock=owns_lock)
    if run.failed:
        raise RepairError(run.failed)
    return run.result


async def _open_lac(bk: BookKeeper, action: ReadOpenLac) -> int:
    """PLANTED BUG (test-only): the highest LAC the open segment's good bookies report,
    read without fencing."""
    lac = -1
    for b in action.bookies:
        try:
            resp = await bk.request(b, lambda rid: ReadLacRequest(rid, action.ledger_id))
        except BookieUnavailableError:
            continue
        if isinstance(resp, ReadLacResponse) and resp.status is Status.OK:
            lac = max(lac, resp.lac)
    return lac


async def recover_bookie(
    bk: BookKeeper,
    bookie: str,
    *,
    target: str | None = None,
    progress: Callable[[LedgerRepair], None] | None = None,
    lock_patience: float = 60.0,
) -> list[LedgerRepair]:
    """Manual recovery (``bkref shell recover``): re-replicate every ledger with a segment
    on ``bookie``, to ``target`` if given. An open ledger is first recovered (fenced and
    closed), as BookKeeper's recoverBookieData does, so that its last segment can move."""
    live = {b.bookie_id for b in await asyncio.to_thread(bk.meta.bookies)}
    reason = Reason.LEAVING if bookie in live else Reason.LOST
    urm = UnderreplicationManager(bk.meta.zk, bk.root, clock=bk.clock)
    await asyncio.to_thread(urm.ensure_layout)
    out: list[LedgerRepair] = []
    for lid in await bk.list_ledgers():
        try:
            md, _ = await asyncio.to_thread(bk.meta.read_ledger, lid)
        except NoSuchLedgerError:
            continue
        if bookie not in md.bookies():
            continue
        # The ledger's lock, as a worker takes it: no worker or bookie GC acts meanwhile.
        owner = f"manual-recovery-{os.getpid()}"
        if not await _lock(urm, lid, owner, lock_patience, bk.clock):
            holder = await asyncio.to_thread(urm.lock_holder, lid)
            result = LedgerRepair(lid, message=f"locked by {holder} for {lock_patience:.0f} s")
        else:
            try:
                if not md.is_closed:
                    await bk.open_ledger(lid, md.password, recovery=True)
                candidates = await asyncio.to_thread(bk.meta.writable_bookies)
                candidates.pop(bookie, None)
                result = await repair_ledger(bk, lid, {bookie: reason}, candidates, target=target)
                md, _ = await asyncio.to_thread(bk.meta.read_ledger, lid)
                result.complete = result.complete and bookie not in md.bookies()
            except (RepairError, BKError) as e:
                result = LedgerRepair(lid, message=str(e))
            finally:
                await asyncio.to_thread(urm.unlock, lid)
        out.append(result)
        if progress is not None:
            progress(result)
    return out


async def _lock(
    urm: UnderreplicationManager, lid: int, owner: str, patience: float, clock: Clock
) -> bool:
    """Take ``lid``'s lock, waiting up to ``patience`` seconds of ``clock`` for its holder."""
    deadline = clock.monotonic_ms() + round(patience * 1000)
    while not await asyncio.to_thread(urm.try_lock, lid, owner):
        if clock.monotonic_ms() > deadline:
            return False
        await asyncio.sleep(LOCK_POLL)
    return True
