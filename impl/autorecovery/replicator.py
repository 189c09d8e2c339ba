"""Copying fragments: read each entry from a surviving replica, verify its digest, and
write it to the target bookie with a recovery add (which a fence does not stop).

Shared by the replication worker and manual recovery (``bkref shell recover``). The
order of a repair is the protocol's: copy first, then CAS the new ensemble into the
metadata. A copy that is never recorded is harmless (garbage on the target); a
metadata change before the copy would name a bookie without the entries.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from impl.client.client import BKError, BookKeeper
from impl.client.connection import BookieUnavailableError
from impl.core.digest import Digest, DigestMismatchError, master_key
from impl.core.frames import (
    AddRequest,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Status,
)
from impl.core.metadata import LedgerMetadata
from impl.core.planted import active as planted
from impl.core.repair import Fragment, Reason, choose_target, fragments, replace_replica
from impl.meta.store import MetadataConflictError, NoSuchLedgerError
from impl.meta.underreplication import UnderreplicationManager

log = logging.getLogger(__name__)

COPY_CONCURRENCY = 32  # entries in flight per fragment copy


class RepairError(RuntimeError):
    """A fragment could not be copied; the message says which entry and why."""


@dataclass
class FragmentResult:
    segment: int
    bookie: str
    target: str | None
    entries: int = 0
    bytes: int = 0
    skipped: str = ""  # why nothing was copied, if so
    deferred: bool = False  # skipped, but not a failure: another worker's job, or slots busy


@dataclass
class LedgerRepair:
    ledger_id: int
    fragments: list[FragmentResult] = field(default_factory=list)
    complete: bool = False
    message: str = ""

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.fragments)


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


async def _has_verified(
    bk: BookKeeper, digest: Digest, bookie: str, ledger_id: int, entry: int
) -> bool:
    try:
        resp = await bk.request(bookie, lambda rid: ReadRequest(rid, ledger_id, entry))
    except BookieUnavailableError:
        return False
    if not (isinstance(resp, ReadResponse) and resp.status is Status.OK):
        return False
    try:
        digest.verify(resp.body, ledger_id, entry)
    except DigestMismatchError:
        return False
    return True


async def copy_fragment(
    bk: BookKeeper,
    md: LedgerMetadata,
    frag: Fragment,
    target: str,
    *,
    avoid: Collection[str] = (),
    only_missing: bool = False,
) -> tuple[int, int]:
    """Copy ``frag``'s entries to ``target``; returns (entries, bytes) written.

    Sources are the entry's other replicas, those in ``avoid`` last. With
    ``only_missing`` (an in-place repair) entries the target holds intact are skipped.
    """
    digest = Digest(md.digest_type, md.password)
    key = master_key(md.password)
    lid = frag.ledger_id
    copied = [0, 0]
    sem = asyncio.Semaphore(COPY_CONCURRENCY)

    async def one(entry: int) -> None:
        async with sem:
            if only_missing and await _has_verified(bk, digest, target, lid, entry):
                return
            srcs = [b for b in frag.sources(md, entry) if b != target]
            srcs = [b for b in srcs if b not in avoid] + [b for b in srcs if b in avoid]
            body = await _read_verified(bk, digest, lid, entry, srcs)
            try:
                resp = await bk.request(
                    target, lambda rid: AddRequest(rid, lid, entry, key, body, recovery=True)
                )
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


async def record_replacement(
    bk: BookKeeper,
    ledger_id: int,
    frag: Fragment,
    target: str,
    owns_lock: Callable[[], bool] | None = None,
) -> LedgerMetadata | None:
    """CAS ``target`` into the segment in place of ``frag.bookie``. Retries on a
    concurrent change; None if the segment no longer names the bookie, or already
    names ``target``. ``owns_lock`` is asked before each write: a worker whose
    ZooKeeper session expired no longer holds the ledger's lock and must not write."""
    for _ in range(20):
        md, version = await asyncio.to_thread(bk.meta.read_ledger, ledger_id)
        new = replace_replica(md, frag.segment, frag.bookie, target)
        if new is None or md.segments[frag.segment].first_entry != frag.first:
            return None
        if owns_lock is not None and not await asyncio.to_thread(owns_lock):
            raise RepairError(f"ledger {ledger_id}: lost the ledger's lock (session expired?)")
        try:
            await asyncio.to_thread(bk.meta.cas_ledger, ledger_id, new, version)
        except MetadataConflictError:
            continue
        log.info(
            "ledger %d segment %d: replica %s replaced by %s",
            ledger_id,
            frag.segment,
            frag.bookie,
            target,
        )
        return new
    raise RepairError(f"ledger {ledger_id}: metadata kept changing under the repair")


async def repair_ledger(
    bk: BookKeeper,
    ledger_id: int,
    bad: Mapping[str, Reason],
    candidates: Mapping[str, str],
    *,
    local: str | None = None,
    target: str | None = None,
    slots: Callable[[list[str]], Awaitable[AsyncExitStack | None]] | None = None,
    owns_lock: Callable[[], bool] | None = None,
) -> LedgerRepair:
    """Copy every immutable fragment on a bad bookie and record each copy's new home.

    ``candidates`` are the writable bookies (id -> failure domain). Lost and leaving
    replicas move to ``target`` if given, else to ``local`` (a worker beside a
    bookie), else to a bookie the placement rules choose; entries-missing replicas are
    refilled in place. ``slots(bookies)`` returns the held repair slots of those
    bookies as an exit stack, or None when one of them has no free slot.
    """
    out = LedgerRepair(ledger_id)
    try:
        md, _ = await asyncio.to_thread(bk.meta.read_ledger, ledger_id)
    except NoSuchLedgerError:
        out.complete, out.message = True, "ledger deleted"
        return out
    incomplete = False
    # Bookies each segment gains in this repair: two lost replicas of one segment must
    # not both move to the same bookie (the metadata would name it twice).
    gained: dict[int, set[str]] = {}
    frags = fragments(md, ledger_id, bad)
    if not md.is_closed and planted("repair-open-segment-without-fence"):
        frags += await _open_fragments(bk, md, ledger_id, bad)
    for frag in frags:
        reason = bad[frag.bookie]
        in_place = reason is Reason.ENTRIES_MISSING
        only = target if target is not None else local
        if in_place:
            dest: str | None = frag.bookie
        else:
            taken = gained.setdefault(frag.segment, set())
            dest = choose_target(
                frag, candidates, local=only, exclude=set(bad) | taken, joining=taken
            )
        res = FragmentResult(frag.segment, frag.bookie, dest)
        out.fragments.append(res)
        if dest is None:
            res.deferred = local is not None and target is None
            res.skipped = (
                f"{'target' if target else 'local'} bookie {only} cannot hold it (in the "
                "ensemble already, not writable, or its failure domain is used)"
                if only is not None
                else "no writable bookie outside the ensemble in an unused failure domain"
            )
            incomplete = True
            continue
        involved = sorted({dest, *(b for b in frag.ensemble if b != frag.bookie)})
        guard = await slots(involved) if slots is not None else AsyncExitStack()
        if guard is None:
            res.skipped = "no free repair slot on " + ", ".join(involved)
            res.deferred = True
            incomplete = True
            continue
        async with guard:
            # PLANTED BUG switch (test-only, impl/core/planted.py): skip the copy.
            if not planted("repair-without-copy"):
                res.entries, res.bytes = await copy_fragment(
                    bk, md, frag, dest, avoid=set(bad), only_missing=in_place
                )
        if not in_place:
            if await record_replacement(bk, ledger_id, frag, dest, owns_lock) is None:
                res.skipped = "segment changed meanwhile; copy not recorded"
                incomplete = True
            else:
                gained[frag.segment].add(dest)
    out.complete = not incomplete
    return out


async def _open_fragments(
    bk: BookKeeper, md: LedgerMetadata, ledger_id: int, bad: Mapping[str, Reason]
) -> list[Fragment]:
    """PLANTED BUG (test-only): the open last segment's fragments on bad bookies, up to
    the highest LAC its other bookies report, read without fencing."""
    seg = len(md.segments) - 1
    ensemble = md.last_segment.ensemble
    lac = -1
    for b in ensemble:
        if b in bad:
            continue
        try:
            resp = await bk.request(b, lambda rid: ReadLacRequest(rid, ledger_id))
        except BookieUnavailableError:
            continue
        if isinstance(resp, ReadLacResponse) and resp.status is Status.OK:
            lac = max(lac, resp.lac)
    first = md.last_segment.first_entry
    return [
        Fragment(ledger_id, seg, first, lac, ensemble, idx)
        for idx, b in enumerate(ensemble)
        if b in bad and lac >= first
    ]


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
    urm = UnderreplicationManager(bk.meta.zk, bk.root)
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
        if not await _lock(urm, lid, owner, lock_patience):
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


async def _lock(urm: UnderreplicationManager, lid: int, owner: str, patience: float) -> bool:
    deadline = time.monotonic() + patience
    while not await asyncio.to_thread(urm.try_lock, lid, owner):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True
