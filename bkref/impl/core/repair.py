"""Repair planning for AutoRecovery: which fragments to copy, where, in what order.

Pure decisions, no I/O; the auditor and the replication workers
(``bkref/impl/autorecovery``) perform them against ZooKeeper and the bookies.

Vocabulary. A *segment* (BookKeeper: fragment of the ledger metadata) maps a
first entry id to an ensemble. A *fragment* here is the part of one segment
that one replica of the ensemble stores: the entries of the segment whose
write set contains that ensemble index. A replica is *bad* when its bookie is
lost (not registered), leaving (being decommissioned) or known to miss
entries (found by the auditor's periodic check).

Safety rules the planner encodes, each from the protocol:

- The last segment of a ledger that is not CLOSED may still grow: it is never
  copied. The worker waits ``openLedgerRereplicationGracePeriod`` for the
  writer to change its ensemble itself, then fences the ledger by a recovery
  open, which closes it; only then is the last segment copied.
- Every other segment is immutable: its range ends before the next segment's
  first entry, all of which were confirmed before the writer moved on.
- A copy goes to a bookie outside the segment's ensemble, in a failure domain
  (rack) that no other replica of the segment uses.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from bkref.impl.core.metadata import LedgerMetadata, LedgerState, Segment


class Health(enum.Enum):
    """A ledger's replica health, after the replica management of the StarRocks seed.

    Ordered from worst to best: a ledger takes the first that applies.
    """

    REPLICA_MISSING = "REPLICA_MISSING"  # a segment has fewer live replicas than Wq
    ENTRIES_MISSING = "ENTRIES_MISSING"  # a live replica lacks entries (VERSION_INCOMPLETE)
    RELOCATING = "RELOCATING"  # a replica is on a decommissioning bookie
    REDUNDANT = "REDUNDANT"  # a bookie holds a copy no segment names (its GC drops it)
    HEALTHY = "HEALTHY"


class Reason(enum.Enum):
    """Why a replica must be repaired, as recorded in an under-replication task."""

    LOST = "lost"  # the bookie is not registered: copy its fragments elsewhere
    LEAVING = "leaving"  # decommissioned: copy elsewhere (it may still serve reads)
    ENTRIES_MISSING = "entries-missing"  # live but incomplete: its fragments move


@dataclass(frozen=True, slots=True)
class Fragment:
    """The entries ``first..last`` of segment ``segment`` that ensemble index ``index`` stores."""

    ledger_id: int
    segment: int
    first: int
    last: int  # inclusive; last < first for an empty segment
    ensemble: tuple[str, ...]
    index: int

    @property
    def bookie(self) -> str:
        return self.ensemble[self.index]

    def entries(self, metadata: LedgerMetadata) -> list[int]:
        """The entry ids of this fragment: those whose write set contains ``index``."""
        q = metadata.quorum
        return [e for e in range(self.first, self.last + 1) if self.index in q.write_set(e)]

    def sources(self, metadata: LedgerMetadata, entry_id: int) -> list[str]:
        """The other replicas of ``entry_id``, in write-set order."""
        ws = metadata.quorum.write_set(entry_id)
        return [self.ensemble[i] for i in ws if i != self.index]

    def copy_sources(
        self, metadata: LedgerMetadata, entry_id: int, target: str, avoid: Collection[str]
    ) -> list[str]:
        """Where a copy of ``entry_id`` to ``target`` reads from: the other replicas,
        those in ``avoid`` (bad ones, which may still serve what they hold) last."""
        srcs = [b for b in self.sources(metadata, entry_id) if b != target]
        return [b for b in srcs if b not in avoid] + [b for b in srcs if b in avoid]


def segment_range(metadata: LedgerMetadata, i: int) -> tuple[int, int | None]:
    """First and last (inclusive) entry of segment ``i``; last is None while it may grow."""
    segs = metadata.segments
    first = segs[i].first_entry
    if i + 1 < len(segs):
        return first, segs[i + 1].first_entry - 1
    if metadata.is_closed:
        return first, metadata.last_entry
    return first, None


def open_segment_has(metadata: LedgerMetadata, bad: Collection[str]) -> bool:
    """The ledger is not closed and its last (growing) segment uses a bad bookie."""
    return not metadata.is_closed and any(b in bad for b in metadata.last_segment.ensemble)


def fragments(metadata: LedgerMetadata, ledger_id: int, bad: Collection[str]) -> list[Fragment]:
    """Fragments on bad bookies of every segment that can no longer grow."""
    out: list[Fragment] = []
    for i, seg in enumerate(metadata.segments):
        first, last = segment_range(metadata, i)
        if last is None:
            continue  # the open last segment: the grace period and fencing come first
        out.extend(
            Fragment(ledger_id, i, first, last, seg.ensemble, idx)
            for idx, b in enumerate(seg.ensemble)
            if b in bad
        )
    return out


def live_replicas(metadata: LedgerMetadata, live: Collection[str]) -> int:
    """The fewest live replicas any entry of the ledger has (by metadata)."""
    q = metadata.quorum
    fewest = q.write_quorum
    for i, seg in enumerate(metadata.segments):
        first, last = segment_range(metadata, i)
        if last is not None and last < first:
            continue  # an empty segment holds nothing
        for ws in q.write_sets():
            fewest = min(fewest, sum(1 for idx in ws if seg.ensemble[idx] in live))
    return fewest


def health(
    metadata: LedgerMetadata,
    live: Collection[str],
    *,
    leaving: Collection[str] = (),
    entries_missing: Collection[str] = (),
    redundant: Collection[str] = (),
) -> Health:
    """``redundant``: bookies that hold a copy of the ledger although no segment names them."""
    bookies = metadata.bookies()
    if live_replicas(metadata, live) < metadata.write_quorum:
        return Health.REPLICA_MISSING
    if bookies & set(entries_missing):
        return Health.ENTRIES_MISSING
    if bookies & set(leaving):
        return Health.RELOCATING
    if set(redundant) - bookies:
        return Health.REDUNDANT
    return Health.HEALTHY


def replace_replica(
    metadata: LedgerMetadata, segment: int, old: str, new: str
) -> LedgerMetadata | None:
    """Metadata with ``old`` replaced by ``new`` in segment ``segment``; None if that segment
    no longer names ``old`` (someone else repaired it, or the segments changed), or already
    names ``new`` (one bookie must not hold two replicas of a segment)."""
    segs = list(metadata.segments)
    if segment >= len(segs) or old not in segs[segment].ensemble or new in segs[segment].ensemble:
        return None
    ens = tuple(new if b == old else b for b in segs[segment].ensemble)
    segs[segment] = Segment(segs[segment].first_entry, ens)
    return replace(metadata, segments=tuple(segs))


def choose_target(
    fragment: Fragment,
    candidates: Mapping[str, str],
    *,
    local: str | None = None,
    exclude: Collection[str] = (),
    prefer: Iterable[str] = (),
    joining: Collection[str] = (),
) -> str | None:
    """Where to copy ``fragment``: a writable bookie (``candidates``: bookie -> failure
    domain) outside the segment's ensemble whose domain no other replica uses.

    ``joining``: bookies this repair already moves into the segment (not chosen again,
    and their domains are used). A worker beside a bookie (``local``) copies only to
    that bookie, as BookKeeper's
    does; a dedicated worker (``local`` None) takes the first of ``prefer`` that fits,
    else the fitting bookie that sorts first. None when no bookie fits.
    """
    others = [b for i, b in enumerate(fragment.ensemble) if i != fragment.index]
    others += [b for b in joining if b not in others]  # chosen for the segment's other repairs
    used = {candidates.get(b, f"?{b}") for b in others}

    def fits(b: str) -> bool:
        return (
            b in candidates
            and b not in fragment.ensemble
            and b not in exclude
            and candidates[b] not in used
        )

    if local is not None:
        return local if fits(local) else None
    for b in prefer:
        if fits(b):
            return b
    return next((b for b in sorted(candidates) if fits(b)), None)


@dataclass(frozen=True, slots=True)
class Task:
    """One under-replicated ledger as the worker sees it in the task list."""

    ledger_id: int
    replicas: Mapping[str, Reason]  # bad bookie -> why
    priority: int  # the fewest live replicas an entry has: lower is more at risk
    ctime_ms: int
    failures: int = 0  # consecutive failed attempts


@dataclass(frozen=True, slots=True)
class Scheduling:
    deprioritize_after_failures: int = 5
    promote_after_ms: int = 30 * 60 * 1000


def effective_priority(task: Task, now_ms: int, s: Scheduling) -> int:
    """Lower runs first. A task that failed ``deprioritize_after_failures`` times in a row
    goes behind every other tier; one that waited ``promote_after_ms`` moves up a tier."""
    p = task.priority
    if task.failures >= s.deprioritize_after_failures:
        p += 1000
    if now_ms - task.ctime_ms >= s.promote_after_ms:
        p -= 1
    return p


def order_tasks(tasks: Iterable[Task], now_ms: int, s: Scheduling) -> list[Task]:
    """Most at-risk first; among equals the oldest, then the lowest ledger id."""
    return sorted(tasks, key=lambda t: (effective_priority(t, now_ms, s), t.ctime_ms, t.ledger_id))


def is_repaired(metadata: LedgerMetadata, replicas: Mapping[str, Reason]) -> bool:
    """Nothing left to do for this task: no segment names a bad bookie (lost, leaving,
    or missing entries: each moves to a new bookie). A replica missing entries that only
    segments without entries name (an empty last segment of a closed ledger) misses
    nothing: there is nothing to copy, and waiting for it would keep the task forever
    (found by ``bkref refine --config c-open-check``; the spec's worker, like
    BookKeeper's checker, finds such a fragment replicated)."""
    for i, seg in enumerate(metadata.segments):
        first, last = segment_range(metadata, i)
        empty = last is not None and last < first
        for b in seg.ensemble:
            reason = replicas.get(b)
            if reason is not None and not (empty and reason is Reason.ENTRIES_MISSING):
                return False
    return True


def needs_fencing(metadata: LedgerMetadata, bad: Collection[str]) -> bool:
    """The open last segment uses a bad bookie: after the grace period, recover the ledger."""
    return metadata.state is not LedgerState.CLOSED and open_segment_has(metadata, bad)


def newly_lost(
    metadata: LedgerMetadata, live: Collection[str], known: Mapping[str, Reason]
) -> dict[str, Reason]:
    """Bookies the ledger's segments name that are not registered now and ``known`` does
    not list yet."""
    return {b: Reason.LOST for b in sorted(metadata.bookies()) if b not in live and b not in known}


def still_bad(
    bad: Mapping[str, Reason], live: Collection[str], metadata: LedgerMetadata | None = None
) -> dict[str, Reason]:
    """``bad`` without the lost replicas that are live again, and, given the ledger's
    metadata, with its bookies lost since (as BookKeeper's worker checks every fragment
    of the ledger, not only the bookies its task names). Whether a replica back again
    misses entries is not for this to say: the worker's first look probes the live
    replicas its task lists (``WorkerCore.on_ledger``)."""
    out = {b: r for b, r in bad.items() if r is not Reason.LOST or b not in live}
    if metadata is not None:
        out.update(newly_lost(metadata, live, out))
    return out
