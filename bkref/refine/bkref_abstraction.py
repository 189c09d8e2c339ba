"""The abstraction function: bkref's real state as a ``bkref.spec.protocol.State``.

Names. Bookie ``i`` of the spec is the harness's bookie ``b{i}`` (its id in
the metadata). The spec's closed ledgers ``0 .. cfg.closed_ledgers - 1`` are the
ledgers the harness wrote and created closed before the first step, in that
order; the spec's ledger ``cfg.writer_ledger`` is the ledger the writer created
(ids come from ZooKeeper's id generator). Worker node ``w`` of the spec is the
harness's ``node{w}``, beside bookie ``cfg.bookies - 1 - w``.

Variable by variable (what is read, from where):

- ``meta_status``, ``meta_segments``, ``meta_last``: each ledger's znode, read
  through ``ZkMetadataStore.read_ledger`` (no znode: NONE, no segments, -1).
- ``meta_version``: the znode's version + 1 (ZooKeeper starts at 0, the spec
  at 1; both add one per CAS). 0 while the ledger does not exist.
- ``meta_task``: the ledger's under-replication task znode
  (``UnderreplicationManager.get``): its znode version and the bookies it
  names (any reason); no znode: (0, none). The spec's version counts marks and
  ZooKeeper's restarts at a re-create: ``bkref.refine.observe`` compares only whether
  a worker's version is the current one.
- ``meta_lock``: the lock znode's owner (``lock_holder``), as a worker index.
- ``meta_rereplicated``: (segment, new bookie, replaced bookie) of every worker CAS
  that landed, recorded by the harness as it lands (the spec's ghost: history, read
  only by the invariants ``NoReplicationLosesAckedEntries`` and ``NoLostMetadataUpdate``).
- ``meta_autorecovery``: whether the ``disable`` znode is absent.
- ``meta_auditor``: (epoch, holder): the lowest live election vote whose node
  knows it leads is the holder (-1: none); epochs are the votes that ever led,
  numbered 1, 2, ... in the order they led (ZooKeeper's sequence numbers skip).
- ``b_up``: the harness's record (UP while the storage is open, DOWN after a
  crash, REFUSED when the cookie check refused a restart on a wiped disk); with
  AutoRecovery, UNREGISTERED where the storage is open and the registration znode
  is gone (its session expired).
- ``b_signed[b][e]``: the LAC in the header of the writer's ledger's entry ``e`` as
  bookie ``b`` stores it (read back from its storage, or from what survived its
  crash); -2 where it stores none.
- ``b_ledgers[b][l]`` = (synced, unsynced, fenced, LAC): while up, the entries
  in the bookie's index (``BookieStorage.index``; every one was journaled and
  fsynced before the bookie replied), the core's fenced flag and piggybacked
  LAC (``BookieCore.ledgers``); while down, what a replay of its files after
  the crash found (the bookie's files go through a ``CrashDisk``, so that is
  exactly what was fsynced; REFUSED: nothing, its disk was wiped). ``unsynced``
  is 0: the correct bookie replies only after its fsync. Under the planted
  ``ack-before-fsync`` the entries are reported as synced while the bookie is
  up; the loss shows at its crash.
- ``w_*``: the ``LedgerWriter``: status (OPEN and CHANGING_ENSEMBLE are OPEN,
  FENCED and FAILED are WITHDRAWN), its metadata's segments, the proposed
  segments of an ensemble change whose CAS is in flight (``w_change``), the
  next entry id, the LAC, and per unconfirmed entry the bookies that
  acknowledged it and that it was sent to (``pending_replicas``) and the LAC
  in the header of its signed body (``w_piggy``, ``pending_bodies``).
- ``rc[c]``: recovery client ``c``'s ``LedgerRecovery``: phase (FENCING,
  READING; CLOSING is the spec's WRITING; DONE is CLOSED), its write-back
  segments and its read segments, the fencing answers, the entry being read
  and its negative answers, the last entry once found (or the stored close's
  if another client closed first), the write-backs' acks and the LAC in each
  one's signed body (``piggy``); ``lac`` is the contiguous prefix of
  write-backs at ack quorum after the entry it recovers from.
- ``wk[w]`` = (bookie, ledger locked, task version, pending): the
  ``WorkerCore``'s locked ledger and the task version it read under the lock;
  pending is the copy made whose ``CasReplica`` is outstanding (segment, lost
  bookie, expected version + 1), VERIFIED once it emitted ``Verified`` and its
  ``CompleteTask`` is outstanding, RECOVERING while it waits in the phase
  RECOVERING for the recovery it asked for (``StartRecovery``).
- ``wk_unlocked``: the workers whose core holds a ledger whose lock znode names
  another node or none (ZooKeeper deleted it: ``worker_loses_lock``).
- ``rc_requested``: a worker's ``StartRecovery`` was performed (the spec's
  recovery client is then the worker's recovery open, driven step by step).
- ``au_leads[w]``: the epoch of the vote ``AuditorCore`` leads with, 0 if none;
  ``au_stale``: the leading ``AuditorCore`` has an audit due (``stale``).
- ``msgs``: the requests in flight in the harness, as spec messages.
- ``budget``: the config's faults minus those the harness injected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from bkref.impl.core.digest import peek_header
from bkref.impl.core.metadata import LedgerMetadata, LedgerState, Segment
from bkref.impl.core.recovery import RecoveryPhase
from bkref.impl.core.repair_run import CasReplica
from bkref.impl.core.replication import WorkerPhase
from bkref.impl.core.worker_actions import CompleteTask
from bkref.impl.core.writer import WriterState
from bkref.refine.bkref_bookie import signed_lac
from bkref.refine.driver import ImplementationError
from bkref.spec import protocol as sp
from bkref.spec.protocol import State

if TYPE_CHECKING:
    from bkref.refine.bkref_driver import BkrefDriver

STATUS = {
    LedgerState.OPEN: sp.OPEN,
    LedgerState.IN_RECOVERY: sp.IN_RECOVERY,
    LedgerState.CLOSED: sp.CLOSED,
}
WRITER = {
    WriterState.OPEN: sp.W_OPEN,
    WriterState.CHANGING_ENSEMBLE: sp.W_OPEN,
    WriterState.CLOSED: sp.W_CLOSED,
    WriterState.FENCED: sp.W_WITHDRAWN,
    WriterState.FAILED: sp.W_WITHDRAWN,
}
PHASE = {
    RecoveryPhase.FENCING: sp.RC_FENCING,
    RecoveryPhase.READING: sp.RC_READING,
    RecoveryPhase.CLOSING: sp.RC_WRITING,
    RecoveryPhase.DONE: sp.RC_CLOSED,
}


def abstract(d: BkrefDriver) -> State:
    cfg = d._cfg()
    index = d.index

    def mask(names: Iterable[str]) -> int:
        m = 0
        for n in names:
            m |= 1 << index[n]
        return m

    def segments(segs: tuple[Segment, ...]) -> sp.Segments:
        return tuple((s.first_entry, tuple(index[b] for b in s.ensemble)) for s in segs)

    def bookies_at(md: LedgerMetadata, e: int, idxs: frozenset[int]) -> int:
        ens = md.ensemble_for(e)
        return mask(ens[i] for i in idxs)

    s = sp.initial_state(cfg)
    # The spec's ledgers, in its order: the closed ones, then the writer's (-1: none yet).
    lids = d.ledger_ids()

    # --- metadata
    status: list[int] = []
    segs: list[sp.Segments] = []
    last: list[int] = []
    version: list[int] = []
    read = d.store.read_ledgers([lid for lid in lids if lid >= 0])
    for lid in lids:
        if lid < 0:
            status.append(sp.NONE)
            segs.append(())
            last.append(-1)
            version.append(0)
            continue
        stored = read[lid]
        if stored is None:
            raise ImplementationError(f"ledger {lid} has no metadata")
        md, zk_version = stored
        status.append(STATUS[md.state])
        segs.append(segments(md.segments))
        last.append(md.last_entry)
        version.append(zk_version + 1)

    # --- bookies
    up, ledgers, signed = [], [], []
    # With AutoRecovery the bookies register in ZooKeeper: one serving without its
    # registration lost its session (``bookie_loses_session``).
    registered = d.autorecovery.registered() if d.autorecovery is not None else None
    for node in d.bookies:
        up.append(
            sp.UNREGISTERED
            if node.up == sp.UP and registered is not None and node.name not in registered
            else node.up
        )
        per_ledger = []
        for lid in lids:
            if node.up == sp.UP:
                assert node.core is not None
                assert node.storage is not None
                info = node.core.ledgers.get(lid)
                ix = node.storage.index.ledgers.get(lid)
                entries = 0 if ix is None else sum(1 << e for e in ix.entries)
                per = (entries, 0, int(info.fenced), info.lac) if info else (entries, 0, 0, -1)
            else:
                got = node.on_disk.get(lid)
                per = (
                    (sum(1 << e for e in got[0]), 0, int(got[1]), got[2]) if got else (0, 0, 0, -1)
                )
            per_ledger.append(per)
        ledgers.append(tuple(per_ledger))
        # The writer's ledger's entries, each with the LAC it is signed with.
        mine = [-2] * cfg.entries
        wlid = lids[-1] if cfg.writer else -1
        if wlid >= 0 and node.up == sp.UP:
            assert node.storage is not None
            ix = node.storage.index.ledgers.get(wlid)
            for e in ix.entries if ix is not None else ():
                mine[e] = signed_lac(node.storage, wlid, e)
        elif wlid >= 0 and node.up == sp.DOWN:
            for (lid, e), lac in node.signed_on_disk.items():
                if lid == wlid:
                    mine[e] = lac
        signed.append(tuple(mine))

    # --- writer
    w = d.writer
    w_segs: sp.Segments = ()
    w_change: sp.Segments | None = None
    w_status, w_next, w_lac = sp.W_NONE, 0, -1
    w_acks, w_sent, w_piggy = [0] * cfg.entries, [0] * cfg.entries, [-1] * cfg.entries
    w_version = 0
    if w is not None:
        if w.state not in WRITER:
            raise ImplementationError(f"the writer is {w.state.value} between steps")
        w_status, w_segs = WRITER[w.state], segments(w.metadata.segments)
        w_next, w_lac, w_version = w.next_entry, w.lac, w.version + 1
        if w.state is WriterState.CHANGING_ENSEMBLE and w.proposed is not None:
            w_change = segments(w.proposed.segments)
        for e, (acked, sent) in w.pending_replicas().items():
            if e < cfg.entries:
                w_acks[e] = bookies_at(w.metadata, e, acked)
                w_sent[e] = bookies_at(w.metadata, e, sent | acked)
        for e, body in w.pending_bodies().items():
            if e < cfg.entries:
                w_piggy[e] = peek_header(body).lac

    # --- recovery client
    for c, rc in enumerate(d.rcs.recoveries):
        if rc is None:
            continue
        if rc.phase not in PHASE:
            raise ImplementationError(f"recovery client {c} is {rc.phase.value}: {rc.message}")
        phase = PHASE[rc.phase]
        read_md = rc.read_metadata
        answers = rc.fencing_answers() if phase == sp.RC_FENCING else {}
        fenced_ens = read_md.last_segment.ensemble
        rc_acks = [0] * (cfg.entries + 1)
        rc_sent = [0] * (cfg.entries + 1)
        wb = rc.writeback_acks()
        rc_piggy = [-1] * (cfg.entries + 1)
        for e, body in rc.writeback_bodies().items():
            rc_piggy[e] = peek_header(body).lac
        for e, acked in wb.items():
            rc_acks[e] = bookies_at(rc.metadata, e, acked)
            rc_sent[e] = bookies_at(rc.metadata, e, frozenset(rc.quorum.write_set(e)))
        if phase == sp.RC_READING:
            reading, top = rc.reading, rc.reading
            negative = bookies_at(read_md, reading, rc.read_negatives())
        elif phase in (sp.RC_WRITING, sp.RC_CLOSED):
            reading, top, negative = rc.last_entry + 1, rc.last_entry + 1, 0
        else:
            reading, top, negative = 0, 0, 0
        rc_lac = rc.recovered_from
        while (
            rc_lac + 1 < top
            and rc_lac + 1 in wb
            and len(wb[rc_lac + 1] & set(rc.quorum.write_set(rc_lac + 1))) >= cfg.ack_quorum
        ):
            rc_lac += 1
        r = sp.Recovery(
            phase=phase,
            version=rc.version + 1,
            segments=segments(rc.metadata.segments),
            read_segments=segments(read_md.segments),
            base=len(read_md.segments) - 1,
            fenced=mask(fenced_ens[i] for i in answers),
            # While reading: LC, the LAC its write-backs carry.
            max_lac=(
                max(answers.values(), default=-1)
                if phase == sp.RC_FENCING
                else rc.recovered_from
                if phase == sp.RC_READING
                else -1
            ),
            reading=reading,
            negative=negative,
            last=rc.last_entry if phase in (sp.RC_WRITING, sp.RC_CLOSED) else -2,
            lac=rc_lac,
            acks=tuple(rc_acks),
            sent=tuple(rc_sent),
            piggy=tuple(rc_piggy),
        )
        s = s._replace(rc=sp.with_recovery(s, c, r))

    budget = tuple(b - u for b, u in zip(sp.budget_bounds(cfg), d.used, strict=True))
    if d.autorecovery is not None:
        s = _autorecovery(d, lids, mask, s)
    return s._replace(
        meta_status=tuple(status),
        meta_segments=tuple(segs),
        meta_last=tuple(last),
        meta_version=tuple(version),
        b_up=tuple(up),
        b_ledgers=tuple(ledgers),
        b_signed=tuple(signed),
        w_status=w_status,
        w_version=w_version,
        w_segments=w_segs,
        w_change=w_change,
        w_next=w_next,
        w_lac=w_lac,
        w_acks=tuple(w_acks),
        w_sent=tuple(w_sent),
        w_piggy=tuple(w_piggy),
        msgs=tuple(sorted(f.msg for f in d.inflight)),
        budget=budget,
        rd=d.readers.abstract(),
    )


def _autorecovery(
    d: BkrefDriver, lids: list[int], mask: Callable[[Iterable[str]], int], s: State
) -> State:
    """The AutoRecovery variables: tasks, locks, the switch, the election, the workers."""
    ar = d.autorecovery
    assert ar is not None
    names = {n.node_id: n.index for n in ar.nodes}
    tasks, locks = [], []
    view = ar.urm.view([lid for lid in lids if lid >= 0])
    for lid in lids:
        got = view.tasks[lid] if lid >= 0 else None
        tasks.append((got[1], mask(got[0].replicas)) if got is not None else (0, 0))
        owner = view.locks[lid] if lid >= 0 else None
        if owner is not None and owner not in names:
            raise ImplementationError(f"ledger {lid} is locked by {owner!r}, no worker")
        locks.append(names[owner] if owner is not None else -1)
    rereplicated = tuple(ar.rereplicated.get(i, ()) for i in range(len(lids)))
    leader = view.auditor
    holder = -1
    leads = []
    for n in ar.nodes:
        a = n.auditor
        leads.append(ar.epochs[a.epoch] if a.epoch is not None else 0)
        if leader is not None and a.leading and a.epoch == leader.epoch == n.vote:
            holder = n.index
    stale = any(n.auditor.leading and n.auditor.stale for n in ar.nodes)
    wk, unlocked = [], 0
    for n in ar.nodes:
        core = n.worker
        locked = d.spec_ledger(core.locked) if core.locked is not None else -1
        pending: tuple[int, int, int] | None = None
        nxt = n.outstanding[0] if n.outstanding else None
        if isinstance(nxt, CasReplica):
            pending = (nxt.segment, d.index[nxt.bookie], nxt.expected_version + 1)
        elif isinstance(nxt, CompleteTask) and nxt.repaired:
            pending = sp.VERIFIED
        elif core.phase is WorkerPhase.RECOVERING:
            pending = sp.RECOVERING
        if locked < 0 and pending is not None:
            raise ImplementationError(f"worker {n.index} has {nxt} outstanding and no lock")
        tv = core.task_version if core.task_version is not None and locked >= 0 else 0
        wk.append((n.bookie, locked, tv, pending))
        if locked >= 0 and locks[locked] != n.index:
            unlocked |= 1 << n.index
    return s._replace(
        meta_task=tuple(tasks),
        meta_lock=tuple(locks),
        meta_rereplicated=rereplicated,
        meta_autorecovery=1 if view.enabled else 0,
        meta_auditor=(max(ar.epochs.values(), default=0), holder),
        wk=tuple(wk),
        wk_seen=(0,) * len(wk),  # not observed: see ``bkref.refine.observe``
        wk_unlocked=unlocked,
        au_leads=tuple(leads),
        au_stale=1 if stale else 0,
        rc_requested=1 if d.recovery_requested else 0,
    )
