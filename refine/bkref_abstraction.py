"""The abstraction function: bkref's real state as a ``spec.protocol.State``.

Names. Bookie ``i`` of the spec is the harness's bookie ``b{i}`` (its id in
the metadata). The spec's ledger ``cfg.writer_ledger`` is the ledger the
writer created (its id comes from ZooKeeper's id generator).

Variable by variable (what is read, from where):

- ``meta_status``, ``meta_segments``, ``meta_last``: the ledger's znode, read
  through ``ZkMetadataStore.read_ledger`` (no znode: NONE, no segments, -1).
- ``meta_version``: the znode's version + 1 (ZooKeeper starts at 0, the spec
  at 1; both add one per CAS). 0 while the ledger does not exist.
- ``meta_task``, ``meta_lock``, ``meta_rereplicated``, ``meta_autorecovery``,
  ``meta_auditor``: their initial values (no AutoRecovery in the configs this
  adapter runs; it refuses the others).
- ``b_up``: the harness's record (UP while the storage is open, DOWN after a
  crash).
- ``b_ledgers[b][l]`` = (synced, unsynced, fenced, LAC): while up, the entries
  in the bookie's index (``BookieStorage.index``; every one was journaled and
  fsynced before the bookie replied), the core's fenced flag and piggybacked
  LAC (``BookieCore.ledgers``); while down, what a replay of its files after
  the crash found (the bookie's files go through a ``CrashDisk``, so that is
  exactly what was fsynced). ``unsynced`` is 0: the correct bookie replies only
  after its fsync. Under the planted ``ack-before-fsync`` the entries are
  reported as synced while the bookie is up; the loss shows at its crash.
- ``w_*``: the ``LedgerWriter``: status (OPEN and CHANGING_ENSEMBLE are OPEN,
  FENCED and FAILED are WITHDRAWN), its metadata's segments, the proposed
  segments of an ensemble change whose CAS is in flight (``w_change``), the
  next entry id, the LAC, and per unconfirmed entry the bookies that
  acknowledged it and that it was sent to (``pending_replicas``).
- ``rc_*``: the ``LedgerRecovery``: phase (FENCING, READING; CLOSING is the
  spec's WRITING; DONE is CLOSED), its write-back segments and its read
  segments, the fencing answers, the entry being read and its negative
  answers, the last entry once found, the write-backs' acks; ``rc_lac`` is
  the contiguous prefix of write-backs at ack quorum after the entry it
  recovers from.
- ``wk``, ``au_leads``, ``au_stale``: empty (no AutoRecovery).
- ``msgs``: the requests in flight in the harness, as spec messages.
- ``budget``: the config's faults minus those the harness injected.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from impl.core.metadata import LedgerMetadata, LedgerState, Segment
from impl.core.recovery import RecoveryPhase
from impl.core.writer import WriterState
from impl.meta.store import NoSuchLedgerError
from refine.driver import ImplementationError
from spec import protocol as sp
from spec.protocol import State

if TYPE_CHECKING:
    from refine.bkref_driver import BkrefDriver

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

    wl, lid = cfg.writer_ledger, d.ledger_id
    s = sp.initial_state(cfg)

    # --- metadata
    segs: sp.Segments = ()
    status, last, version = sp.NONE, -1, 0
    if lid >= 0:
        try:
            md, zk_version = d.store.read_ledger(lid)
        except NoSuchLedgerError:
            raise ImplementationError(f"the writer's ledger {lid} has no metadata") from None
        status, segs, last = STATUS[md.state], segments(md.segments), md.last_entry
        version = zk_version + 1

    # --- bookies
    up, ledgers = [], []
    for node in d.bookies:
        up.append(node.up)
        if node.up == sp.UP:
            assert node.core is not None
            assert node.storage is not None
            info = node.core.ledgers.get(lid)
            ix = node.storage.index.ledgers.get(lid)
            entries = 0 if ix is None else sum(1 << e for e in ix.entries)
            per = (entries, 0, int(info.fenced), info.lac) if info else (entries, 0, 0, -1)
        else:
            got = node.on_disk.get(lid)
            per = (sum(1 << e for e in got[0]), 0, int(got[1]), got[2]) if got else (0, 0, 0, -1)
        ledgers.append((per,))

    # --- writer
    w = d.writer
    w_segs: sp.Segments = ()
    w_change: sp.Segments | None = None
    w_status, w_next, w_lac = sp.W_NONE, 0, -1
    w_acks, w_sent = [0] * cfg.entries, [0] * cfg.entries
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

    # --- recovery client
    rc = d.recovery
    if rc is not None:
        if rc.phase not in PHASE:
            raise ImplementationError(f"the recovery client is {rc.phase.value}: {rc.message}")
        phase = PHASE[rc.phase]
        read_md = rc.read_metadata
        answers = rc.fencing_answers() if phase == sp.RC_FENCING else {}
        fenced_ens = read_md.last_segment.ensemble
        rc_acks = [0] * (cfg.entries + 1)
        rc_sent = [0] * (cfg.entries + 1)
        wb = rc.writeback_acks()
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
        s = s._replace(
            rc_phase=phase,
            rc_version=rc.version + 1,
            rc_segments=segments(rc.metadata.segments),
            rc_read_segments=segments(read_md.segments),
            rc_base=len(read_md.segments) - 1,
            rc_fenced=mask(fenced_ens[i] for i in answers),
            rc_max_lac=max(answers.values(), default=-1),
            rc_reading=reading,
            rc_negative=negative,
            rc_last=rc.last_entry if phase in (sp.RC_WRITING, sp.RC_CLOSED) else -2,
            rc_lac=rc_lac,
            rc_acks=tuple(rc_acks),
            rc_sent=tuple(rc_sent),
        )

    budget = (
        cfg.losses - d.used[sp.B_LOSS],
        cfg.duplicates - d.used[sp.B_DUP],
        cfg.crashes - d.used[sp.B_CRASH],
        cfg.wipes - d.used[sp.B_WIPE],
        cfg.elections - d.used[sp.B_ELECT],
        cfg.toggles - d.used[sp.B_TOGGLE],
    )
    return s._replace(
        meta_status=sp.set_at(s.meta_status, wl, status),
        meta_segments=sp.set_at(s.meta_segments, wl, segs),
        meta_last=sp.set_at(s.meta_last, wl, last),
        meta_version=sp.set_at(s.meta_version, wl, version),
        b_up=tuple(up),
        b_ledgers=tuple(ledgers),
        w_status=w_status,
        w_version=w_version,
        w_segments=w_segs,
        w_change=w_change,
        w_next=w_next,
        w_lac=w_lac,
        w_acks=tuple(w_acks),
        w_sent=tuple(w_sent),
        msgs=tuple(sorted(f.msg for f in d.inflight)),
        budget=budget,
    )
