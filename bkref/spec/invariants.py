"""Named safety invariants of the protocol spec, and the liveness goals.

Each invariant is a predicate over one ``State``; its docstring says what a
violation means. ``INVARIANTS`` lists them in the order the checker tests
them; ``GOALS`` names the predicates liveness wants to hold eventually.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

from bkref.spec.config import Config
from bkref.spec.protocol import (
    CLOSED,
    NONE,
    RC_CLOSED,
    REFUSED,
    SERVING,
    UP,
    W_CLOSED,
    W_NONE,
    Recovery,
    State,
    _stored,
    auditor_node,
    bit,
    bookies_of,
    budget_bounds,
    segment_index_of,
    write_set,
)
from bkref.spec.quorum import popcount

Invariant = Callable[[Config, State], bool]

# Verdicts of the costlier parts of some invariants, by the exact values they
# read (a part is a pure function of them), for one config at a time: the
# checker tests millions of states that share a few thousand such values.
_MEMO: dict[tuple[object, ...], bool] = {}
_MEMO_CONFIG: list[Config] = []


def _memo(cfg: Config) -> dict[tuple[object, ...], bool]:
    if not _MEMO_CONFIG or _MEMO_CONFIG[0] is not cfg or len(_MEMO) > 1_000_000:
        _MEMO.clear()
        _MEMO_CONFIG[:] = [cfg]
    return _MEMO


def TypeOK(cfg: Config, s: State) -> bool:
    """Every variable holds a value of its type and range.

    A violation is a bug in the spec itself: an action built a malformed state.
    """
    n, k = cfg.bookies, cfg.entries
    memo = _memo(cfg)
    key = (TypeOK, s.meta_status, s.meta_segments, s.meta_last, s.b_ledgers, s.b_signed)
    ok = memo.get(key)
    if ok is None:
        ok = memo[key] = _metadata_and_bookies_ok(cfg, s)
    # Each budget within its config's bound: a few budget tuples per config, memoized too.
    budgets_ok = memo.get((budget_bounds, s.budget))
    if budgets_ok is None:
        budgets_ok = memo[(budget_bounds, s.budget)] = all(
            0 <= c <= bound for c, bound in zip(s.budget, budget_bounds(cfg), strict=True)
        )
    return (
        ok
        and len(s.b_up) == n
        and -1 <= s.w_lac <= s.w_next - 1
        and 0 <= s.w_next <= k
        and budgets_ok
        and all(-1 <= lk < len(s.wk) for lk in s.meta_lock)
        and all(s.wk[w][1] >= 0 for w in range(len(s.wk)) if s.wk_unlocked >> w & 1)
        and s.wk_unlocked >> len(s.wk) == 0
        and s.au_back >> n == 0
        and (not s.au_back or s.au_stale == 1)
    )


def _metadata_and_bookies_ok(cfg: Config, s: State) -> bool:
    """TypeOK's part about the metadata and the bookies' ledgers."""
    n, n_l, k = cfg.bookies, cfg.ledgers, cfg.entries
    return (
        len(s.meta_status) == n_l
        and all(0 <= x <= CLOSED for x in s.meta_status)
        # A ledger has segments once created: the create writes its first with OPEN.
        and len(s.meta_segments) == n_l
        and all(
            (st == NONE) == (not segs)
            for st, segs in zip(s.meta_status, s.meta_segments, strict=True)
        )
        and all(
            len(ens) == cfg.ensemble
            and len(set(ens)) == cfg.ensemble
            and all(0 <= b < n for b in ens)
            for segs in s.meta_segments
            for _f, ens in segs
        )
        and all(-1 <= x < max(k, cfg.closed_entries) for x in s.meta_last)
        and all(len(per) == n_l for per in s.b_ledgers)
        and all(
            0 <= sy < 1 << (k + 1) and f in (0, 1) and -1 <= lac < max(k, cfg.closed_entries)
            for per in s.b_ledgers
            for sy, _u, f, lac in per
        )
        and (not cfg.writer or all(_signed_ok(cfg, s, b) for b in range(n)))
    )


def _signed_ok(cfg: Config, s: State, b: int) -> bool:
    """Bookie ``b`` holds a signed LAC (an LAC, -1 up) for each entry of the writer's
    ledger it stores, and -2 (none stored) for each it does not (``State.b_signed``;
    without a writer, no ledger's entries are signed)."""
    synced, unsynced, _f, _lac = s.b_ledgers[b][cfg.writer_ledger]
    signed = s.b_signed[b]
    return len(signed) == cfg.entries and all(
        (x >= -1 if (synced | unsynced) >> e & 1 else x == -2) for e, x in enumerate(signed)
    )


def NoDivergenceBetweenClientAndMetaData(cfg: Config, s: State) -> bool:
    """Once the ledger is closed, the writer confirmed nothing beyond its last entry.

    A violation is ledger truncation: an entry acknowledged to the
    application is cut off by the close, which is data loss. A recovery
    client that closed it closed it at the entry it recovered.
    """
    if not cfg.writer:
        return True
    wl = cfg.writer_ledger
    if s.meta_status[wl] != CLOSED:
        return True
    last = s.meta_last[wl]
    if s.w_lac > last:
        return False
    return not any(r.phase == RC_CLOSED and r.last != last for r in map(Recovery._make, s.rc))


def _readable(s: State, b: int, ledger: int, e: int) -> bool:
    synced, unsynced, _f, _lac = s.b_ledgers[b][ledger]
    if s.b_up[b] == REFUSED:
        return False
    return bool(synced & bit(e)) or (s.b_up[b] in SERVING and bool(unsynced & bit(e)))


def AllAckedEntriesAreReadable(cfg: Config, s: State) -> bool:
    """Every entry the writer confirmed is held by a bookie of its write set in the metadata.

    A violation means an acknowledged entry can no longer be read from the
    bookies the metadata names for it: data loss, or metadata that points
    readers to the wrong bookies.
    """
    if not cfg.writer or s.w_status == W_NONE:
        return True
    wl = cfg.writer_ledger
    segs = s.meta_segments[wl]
    memo = _memo(cfg)
    key = (AllAckedEntriesAreReadable, s.w_lac, segs, s.b_up, s.b_ledgers)
    ok = memo.get(key)
    if ok is None:
        ok = memo[key] = all(
            any(_readable(s, b, wl, e) for b in bookies_of(write_set(cfg, segs, e)))
            for e in range(s.w_lac + 1)
        )
    return ok


def AllCommittedEntriesReachAckQuorum(cfg: Config, s: State) -> bool:
    """Every entry of a closed ledger is held by at least Aq bookies of its write set.

    A violation means the close committed an entry that fewer than Aq
    bookies hold: one more failure loses it.
    """
    for ledger, status in enumerate(s.meta_status):
        if status != CLOSED:
            continue
        segs = s.meta_segments[ledger]
        for e in range(s.meta_last[ledger] + 1):
            ws = write_set(cfg, segs, e)
            held = sum(1 for b in bookies_of(ws) if _readable(s, b, ledger, e))
            if held < cfg.ack_quorum:
                return False
    return True


def NoOutOfOrderEntries(cfg: Config, s: State) -> bool:
    """Bookies hold only entries the writer created, and LACs never run ahead of them.

    Entry ids are assigned by the single writer in order; an entry id stands
    for its data. A violation is an entry (or an LAC naming one) that the
    writer never added: recovery or replication invented or reordered data.
    """
    if not cfg.writer:
        return True
    wl = cfg.writer_ledger
    created = (1 << s.w_next) - 1
    for per in s.b_ledgers:
        synced, unsynced, _f, lac = per[wl]
        if (synced | unsynced) & ~created or lac >= s.w_next:
            return False
    return s.w_lac < s.w_next


def NoDirtyReads(cfg: Config, s: State) -> bool:
    """No bookie's LAC (what readers trust) lies beyond the closed ledger's last entry.

    A reader may read every entry up to a bookie's LAC. A violation means a
    reader could have read an entry that the close then cut off: it read
    data that, for the ledger, never existed.
    """
    if not cfg.writer:
        return True
    wl = cfg.writer_ledger
    if s.meta_status[wl] != CLOSED:
        return True
    last = s.meta_last[wl]
    return all(per[wl][3] <= last for b, per in enumerate(s.b_ledgers) if s.b_up[b] != REFUSED)


def ReadersSeeOnlyTheClosedLedger(cfg: Config, s: State) -> bool:
    """Once the ledger is closed, no reader has ever returned an entry after its last one.

    The observation behind ``NoDirtyReads``: an application read an entry
    (``reader_reads_entry``) that the ledger, as finally closed, does not
    contain. Entries are their ids in the spec (one writer is the only source
    of data), so an entry a reader returned at or before the last one is the
    closed ledger's. ``NoDirtyReads`` stays: it holds in every config, most of
    which have no reader, and fails as soon as a bookie's LAC passes the last
    entry, before any reader acts on it.
    """
    if not s.rd:
        return True
    wl = cfg.writer_ledger
    if s.meta_status[wl] != CLOSED:
        return True
    beyond = ~((1 << (s.meta_last[wl] + 1)) - 1)
    return not any(returned & beyond for _h, _lac, _p, returned in s.rd)


def OnlyValidFragments(cfg: Config, s: State) -> bool:
    """Segments start at strictly increasing entry ids, each on E distinct bookies.

    A violation is an invalid fragment sequence in the metadata: some entry
    ids map to the wrong ensemble, so readers look for entries where they
    were never written (BOOKKEEPER-2615).
    """
    memo = _memo(cfg)
    key = (OnlyValidFragments, s.meta_segments, s.meta_status, s.meta_last)
    ok = memo.get(key)
    if ok is None:
        ok = memo[key] = _fragments_valid(cfg, s)
    return ok


def _fragments_valid(cfg: Config, s: State) -> bool:
    for ledger, segs in enumerate(s.meta_segments):
        firsts = [f for f, _ens in segs]
        if any(a >= b for a, b in pairwise(firsts)):
            return False
        if any(len(set(ens)) != cfg.ensemble for _f, ens in segs):
            return False
        if s.meta_status[ledger] == CLOSED and segs and firsts[-1] > s.meta_last[ledger] + 1:
            return False
    return True


def repair_quiescent(cfg: Config, s: State) -> bool:
    """AutoRecovery has nothing left to do that it knows of.

    Enabled, an auditor elected that has audited since the last change of
    bookie registrations, no ledger left for its periodic bookie check (the
    ghost ``au_missed``: a metadata write named a bookie already down after the
    last audit), no under-replication task, no lock outstanding and no worker at work
    (one whose lock ZooKeeper dropped may still have a swap to write).
    """
    if not cfg.autorecovery or not s.meta_autorecovery or auditor_node(s) < 0:
        return False
    if s.au_stale or s.au_missed:
        return False
    return (
        all(lost == 0 for _v, lost in s.meta_task)
        and all(lk < 0 for lk in s.meta_lock)
        and all(lg < 0 for _b, lg, _v, _p in s.wk)
    )


def AllClosedLedgersRepairedWhenQuiescent(cfg: Config, s: State) -> bool:
    """Once repair quiesces, closed ledgers use only live bookies and keep their copies.

    When AutoRecovery believes it is done, no segment of a closed ledger may
    still name a lost bookie, and each entry must be on Wq live bookies of
    its write set if it had them when the ledger closed (entries closed at
    exactly Aq, whose other adds were lost, are topped up only by the
    periodic check, whose liveness goal is ``EventuallyFullyReplicated``:
    for them Aq). A violation means
    the auditor or a worker dropped a repair: the ledger stays degraded while
    everyone thinks it is healthy.
    """
    if not repair_quiescent(cfg, s):
        return True
    for ledger, status in enumerate(s.meta_status):
        if status != CLOSED:
            continue
        segs = s.meta_segments[ledger]
        if any(s.b_up[b] != UP for _f, ens in segs for b in ens):
            return False
        need = cfg.write_quorum if ledger < cfg.closed_ledgers else cfg.ack_quorum
        for e in range(s.meta_last[ledger] + 1):
            ws = write_set(cfg, segs, e)
            if (
                popcount(sum(bit(b) for b in bookies_of(ws) if _stored(s, b, ledger) & bit(e)))
                < need
            ):
                return False
    return True


def NoReplicationLosesAckedEntries(cfg: Config, s: State) -> bool:
    """A bookie a worker put into a segment holds every acknowledged entry it should.

    For each (segment, bookie) a worker filled, the bookie holds every entry
    of the segment's range in its write sets that is acknowledged (up to the
    closed ledger's last entry, or the writer's LAC while open). A violation
    means re-replication swapped in a bookie that misses acknowledged data,
    e.g. it copied an open segment that the writer kept writing to.
    """
    for ledger, filled in enumerate(s.meta_rereplicated):
        segs = s.meta_segments[ledger]
        if not filled:
            continue
        if s.meta_status[ledger] == CLOSED:
            acked = s.meta_last[ledger]
        elif cfg.writer and ledger == cfg.writer_ledger:
            acked = s.w_lac
        else:
            continue
        for idx, b, _replaced in filled:
            if b not in segs[idx][1]:
                continue
            end = segs[idx + 1][0] - 1 if idx + 1 < len(segs) else acked
            for e in range(segs[idx][0], min(end, acked) + 1):
                if (
                    segment_index_of(segs, e) == idx
                    and write_set(cfg, segs, e) & bit(b)
                    and not _stored(s, b, ledger) & bit(e)
                ):
                    return False
    return True


def NoLostMetadataUpdate(cfg: Config, s: State) -> bool:
    """No metadata CAS undid what an earlier one wrote: every CAS kept the other writers' changes.

    Three writers rewrite a ledger's metadata concurrently (the writer's ensemble
    change, a recovery's close, a replication worker's swap), each by a CAS from
    its own read and, on a version conflict, by merging its change into the
    store's newer metadata. A merge that writes its own stale view instead
    loses the other's update: a bookie a worker swapped out of a segment is
    back in it, or a ledger a client closed is open again or closed at another
    entry. A violation is that lost update, seen at the CAS that made it, not
    degraded redundancy that the next audit quietly repairs.
    """
    for ledger, swaps in enumerate(s.meta_rereplicated):
        segs = s.meta_segments[ledger]
        for idx, _filled, replaced in swaps:
            if replaced >= 0 and replaced in segs[idx][1]:
                return False
    if not cfg.writer:
        return True
    wl = cfg.writer_ledger
    closes = [r.last for r in map(Recovery._make, s.rc) if r.phase == RC_CLOSED]
    if s.w_status == W_CLOSED:
        closes.append(s.w_lac)
    return all(s.meta_status[wl] == CLOSED and s.meta_last[wl] == last for last in closes)


def AtMostOneWorkerHoldsLedgerLock(cfg: Config, s: State) -> bool:
    """No two workers work on the same ledger under its lock, a worker at work holds
    its lock unless ZooKeeper dropped it (``worker_loses_lock``), and a lock is held by
    the worker at work on its ledger.

    A violation means a worker took a lock another held (two then copy and swap
    the same segment at once with no session lost), a release deleted a lock
    its worker no longer held, letting a third worker in beside the holder, or a
    worker let its ledger go and kept the lock (no worker repairs that ledger again).
    """
    for ledger, holder in enumerate(s.meta_lock):
        if holder >= 0 and s.wk[holder][1] != ledger:
            return False
        working = [
            w
            for w, (_b, lg, _v, _p) in enumerate(s.wk)
            if lg == ledger and not s.wk_unlocked >> w & 1
        ]
        if len(working) > 1 or (working and working != [holder]):
            return False
    return True


def OneAuditorPerElectionEpoch(cfg: Config, s: State) -> bool:
    """At most one node believes it is auditor, and of no epoch later than the election's.

    One auditor per election epoch, and none left over from an earlier
    epoch once a new one is elected. A violation means two auditors could
    publish tasks concurrently from different views of the cluster (split
    brain): a node that audits without winning, or after losing its session.
    """
    epochs = [e for e in s.au_leads if e]
    return len(epochs) <= 1 and all(e <= s.meta_auditor[0] for e in epochs)


INVARIANTS: tuple[Invariant, ...] = (
    TypeOK,
    NoDivergenceBetweenClientAndMetaData,
    AllAckedEntriesAreReadable,
    AllCommittedEntriesReachAckQuorum,
    NoOutOfOrderEntries,
    NoDirtyReads,
    ReadersSeeOnlyTheClosedLedger,
    OnlyValidFragments,
    AllClosedLedgersRepairedWhenQuiescent,
    NoReplicationLosesAckedEntries,
    NoLostMetadataUpdate,
    AtMostOneWorkerHoldsLedgerLock,
    OneAuditorPerElectionEpoch,
)


def EventuallyLedgerClosed(cfg: Config, s: State) -> bool:
    """Goal: the writer's ledger is CLOSED in the metadata store (by the writer or by recovery)."""
    return s.meta_status[cfg.writer_ledger] == CLOSED


def EventuallyRepaired(cfg: Config, s: State) -> bool:
    """Goal: repair has quiesced and no segment of any ledger names a lost bookie."""
    if not repair_quiescent(cfg, s):
        return False
    return all(
        s.b_up[b] == UP
        for ledger, segs in enumerate(s.meta_segments)
        if s.meta_status[ledger] != NONE
        for _f, ens in segs
        for b in ens
    )


def EventuallyFullyReplicated(cfg: Config, s: State) -> bool:
    """Goal: every ledger is CLOSED and each entry is on every live bookie of its write set.

    With the periodic check, a replica lost without a bookie loss (an entry
    missing on a live bookie) is found and repaired; without it, nothing
    ever notices.
    """
    for ledger, status in enumerate(s.meta_status):
        if status == NONE:
            continue
        if status != CLOSED:
            return False
        segs = s.meta_segments[ledger]
        for e in range(s.meta_last[ledger] + 1):
            for b in bookies_of(write_set(cfg, segs, e)):
                if s.b_up[b] != UP or not _stored(s, b, ledger) & bit(e):
                    return False
    return True


GOALS: dict[str, Invariant] = {
    "ledger-closed": EventuallyLedgerClosed,
    "repaired": EventuallyRepaired,
    "fully-replicated": EventuallyFullyReplicated,
}
