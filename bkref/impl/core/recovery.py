"""Ledger recovery: fence, find the last entry, write back, close.

The steps, after BookKeeper's recovery (the seed's LC, LR, re-replicate):

1. Metadata OPEN -> IN_RECOVERY by CAS (skipped when it is already IN_RECOVERY:
   a previous recovery client died part-way).
2. Fencing LAC reads to every bookie of the last segment. A fenced bookie
   refuses the old writer's adds, so once ack quorum coverage is reached
   (Wq - Aq + 1 bookies of every write set fenced) the writer cannot confirm
   another entry. The highest LAC they report is LC.
3. Recovery reads, which also fence, from LC onwards, one entry at a time:
   one positive (a copy whose digest verifies) proves the entry may have been
   confirmed and it is written back to its write set with recovery adds
   (which bypass the fence, and piggyback LC, never recovery's own LAC); Wq - Aq + 1
   negatives from its write set prove it was never confirmed, and the previous
   entry is the last (LR). LC itself is read first only for its header, which
   gives the ledger's exact length there; it is never written back.
4. When every write-back has Aq acks, close by CAS with the last entry and length.
   A write-back bookie that fails is replaced as a writer would replace it, but the
   new segment goes into the metadata only with the close: until then the metadata
   keeps naming the bookies that hold the entries, for any recovery that follows.

A read that errors (bookie down, digest mismatch) is neither positive nor
negative; if an entry's write set has answered and neither is proven, the
recovery fails with a message saying so (retry once more bookies are up).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from bkref.impl.core.actions import (
    Action,
    LocalProtocolError,
    NeedReplacement,
    RecoveryCompleted,
    SendAdd,
    SendRead,
    SendReadLac,
    WriteMetadata,
)
from bkref.impl.core.digest import Digest, DigestMismatchError, Entry
from bkref.impl.core.frames import Status
from bkref.impl.core.metadata import LedgerMetadata, LedgerState
from bkref.impl.core.planted import active as planted


class RecoveryPhase(enum.Enum):
    MARKING = "MARKING"  # OPEN -> IN_RECOVERY CAS outstanding
    FENCING = "FENCING"
    READING = "READING"
    CLOSING = "CLOSING"
    DONE = "DONE"
    FAILED = "FAILED"


@dataclass(slots=True)
class _Read:
    positive: bytes | None = None
    negatives: set[int] = field(default_factory=set)
    errors: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _WriteBack:
    entry: Entry
    body: bytes  # signed once, with the LAC of its first send: every resend carries it
    acked: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)


class LedgerRecovery:
    def __init__(
        self,
        ledger_id: int,
        metadata: LedgerMetadata,
        version: int,
        digest: Digest,
        *,
        plants: frozenset[str] = frozenset(),
    ) -> None:
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.version = version
        self.digest = digest
        self.quorum = metadata.quorum
        self.phase = RecoveryPhase.MARKING
        self._actions: list[Action] = []
        self._lac_answers: dict[int, int] = {}  # ensemble index -> LAC it reported
        self._lac_failed: set[int] = set()
        self._reading: int = -1
        self._read = _Read()
        self._writebacks: dict[int, _WriteBack] = {}
        self.last_entry = -1
        self.length = 0
        self.message = ""
        self._proposed = metadata
        self._closing_sent = False
        self._lc = -1
        # Recovery's own LAC: the contiguous prefix after LC whose write-backs reached Aq.
        # Write-backs do not piggyback it (``_piggyback``), unlike BookKeeper's.
        self.lac = -1
        # Reads and fencing use the ensembles as the writer left them; write-backs go to
        # self.metadata, which gains a segment if a write-back bookie has to be replaced.
        self._read_md = metadata
        self._failed: list[str] = []  # write-back bookies awaiting replacement, in order
        self._changing = False
        self._replaced_index: int | None = None
        self._unreplaceable: set[str] = set()
        self._no_spare_reason = ""
        # PLANTED BUG switch (test-only, bkref/impl/core/planted.py): recovery reads without fence.
        self._fence = not planted("recovery-reads-without-fence", plants)
        # PLANTED BUG switch: write-backs carry recovery's own LAC (BookKeeper's behaviour).
        self._own_lac = planted("recovery-piggybacks-its-own-lac", plants)

    def take_actions(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

    @property
    def ensemble(self) -> tuple[str, ...]:
        return self.metadata.last_segment.ensemble

    # Read-only views for observers (the refinement harness maps them to the spec's
    # Recovery record); nothing here changes the recovery.

    @property
    def read_metadata(self) -> LedgerMetadata:
        """The segments recovery fences and reads from: as they were when it began."""
        return self._read_md

    @property
    def recovered_from(self) -> int:
        """The entry before the first one recovery may write back (LC, or the entry
        before the last segment); -1 until fencing is complete."""
        return self._lc

    @property
    def reading(self) -> int:
        """The entry being read (-1 before reading, -2 once the end is found)."""
        return self._reading

    def fencing_answers(self) -> dict[int, int]:
        """Ensemble index (of the read metadata's last segment) -> the LAC it reported."""
        return dict(self._lac_answers)

    def read_negatives(self) -> frozenset[int]:
        """Ensemble indexes that answered "no such entry" for the entry being read."""
        return frozenset(self._read.negatives)

    def writeback_acks(self) -> dict[int, frozenset[int]]:
        """Per written-back entry: the ensemble indexes that acknowledged it."""
        return {e: frozenset(w.acked) for e, w in self._writebacks.items()}

    def writeback_bodies(self) -> dict[int, bytes]:
        """Per written-back entry: the signed body its recovery adds carry."""
        return {e: w.body for e, w in self._writebacks.items()}

    # ------------------------------------------------------------ events

    def start(self) -> None:
        if self.metadata.is_closed:
            self.last_entry, self.length = self.metadata.last_entry, self.metadata.length
            self._finish(True, "already closed")
            return
        if self.metadata.state is LedgerState.IN_RECOVERY:
            self._start_fencing()
            return
        self._proposed = replace(self.metadata, state=LedgerState.IN_RECOVERY)
        self._actions.append(WriteMetadata(self._proposed, self.version, "mark IN_RECOVERY"))

    def on_metadata_written(self, new_version: int) -> None:
        self.version = new_version
        self.metadata = self._proposed
        if self.phase is RecoveryPhase.MARKING:
            self._start_fencing()
        elif self.phase is RecoveryPhase.CLOSING:
            self._finish(True, "")

    def on_metadata_conflict(self, current: LedgerMetadata, version: int) -> None:
        """Someone else changed the metadata: a closed ledger means another recovery won; a
        ledger still in recovery at the close means a replication worker swapped a bookie
        of an earlier segment: close again on its version, keeping its segments."""
        if current.is_closed:
            self.metadata, self.version = current, version
            self.last_entry, self.length = current.last_entry, current.length
            self._finish(True, "closed by another client")
        elif self.phase is RecoveryPhase.MARKING or current.state is LedgerState.OPEN:
            # The writer changed its ensemble meanwhile: start over on the new metadata.
            self.metadata, self.version = current, version
            self._read_md = current
            self.phase = RecoveryPhase.MARKING
            self._lac_answers.clear()
            self._lac_failed.clear()
            self.start()
        elif self.phase is RecoveryPhase.CLOSING and current.state is LedgerState.IN_RECOVERY:
            # The segments before the one recovery read from are the store's (a worker's
            # swap), the rest are this recovery's, as BookKeeper's closeRecovered applies
            # its change to the metadata it re-reads (BOOKKEEPER-584). Failing here instead
            # was found by `bkref refine --config c-merge`.
            base = len(self._read_md.segments) - 1
            merged = replace(
                self.metadata, segments=current.segments[:base] + self.metadata.segments[base:]
            )
            self.metadata, self.version = merged, version
            self._proposed = merged.closed(self.last_entry, self.length)
            self._actions.append(WriteMetadata(self._proposed, version, "recovery close retry"))
        else:
            self._fail(f"metadata changed under recovery (now {current.state.value}); retry")

    def on_metadata_failed(self, message: str) -> None:
        self._fail(message)

    def on_read_lac_response(self, bookie: str, status: Status, lac: int) -> None:
        fenced = self._read_md.last_segment.ensemble
        if self.phase is not RecoveryPhase.FENCING or bookie not in fenced:
            return
        idx = fenced.index(bookie)
        if status in (Status.OK, Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY):
            self._lac_answers[idx] = lac if status is Status.OK else -1
        elif status is Status.UNAUTHORIZED:
            self._fail(f"bookie {bookie} rejected the master key: wrong password")
            return
        else:
            self._lac_failed.add(idx)
        if self.quorum.is_covered(self._lac_answers):
            self._start_reading(max(self._lac_answers.values()))
        elif len(self._lac_answers) + len(self._lac_failed) == len(fenced):
            self._fail(
                f"could not fence ledger {self.ledger_id}: {len(self._lac_failed)} "
                "bookies of its last ensemble did not answer and the rest do not cover "
                "every write set; retry when more bookies are up"
            )

    def on_read_response(self, bookie: str, entry_id: int, status: Status, body: bytes) -> None:
        if self.phase is not RecoveryPhase.READING or entry_id != self._reading:
            return
        ensemble = self._read_md.ensemble_for(entry_id)
        if bookie not in ensemble:
            return
        idx = ensemble.index(bookie)
        r = self._read
        if status is Status.OK:
            try:
                e = self.digest.verify(body, self.ledger_id, entry_id)
            except DigestMismatchError:
                r.errors.add(idx)
            else:
                if r.positive is None:
                    r.positive = body
                    self._entry_found(e)
                return
        elif status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER):
            r.negatives.add(idx)
        elif status is Status.UNAUTHORIZED:
            self._fail(f"bookie {bookie} rejected the master key: wrong password")
            return
        else:
            r.errors.add(idx)
        if r.positive is not None:
            return
        if self.quorum.is_entry_absent(r.negatives, entry_id):
            self._end_of_ledger()
        elif len(r.negatives) + len(r.errors) >= self.quorum.write_quorum:
            self._fail(
                f"entry {entry_id}: {len(r.negatives)} bookies lack it and "
                f"{len(r.errors)} failed or returned a bad digest; cannot tell whether "
                "it was confirmed; retry when more bookies are up"
            )

    def on_add_response(self, bookie: str, entry_id: int, status: Status) -> None:
        wb = self._writebacks.get(entry_id)
        if wb is None or self.phase not in (RecoveryPhase.READING, RecoveryPhase.CLOSING):
            return
        ensemble = self.metadata.ensemble_for(entry_id)
        if bookie not in ensemble:
            return  # replaced since
        idx = ensemble.index(bookie)
        if status is Status.OK:
            wb.acked.add(idx)
            self._advance()
        elif status is Status.UNAUTHORIZED:
            self._fail(f"bookie {bookie} rejected the master key: wrong password")
            return
        else:
            wb.failed.add(idx)
            if bookie not in self.ensemble:
                return  # a late error for an entry of an earlier segment, already at Aq
            # BookKeeper's recovery changes the ensemble like a writer would.
            if bookie in self._unreplaceable:
                self._check_reachable()
                return
            if bookie not in self._failed:
                self._failed.append(bookie)
                if not self._changing:
                    self._changing = True
                    self._actions.append(NeedReplacement(bookie, self.ensemble))
            return
        self._maybe_close()

    def replace(self, failed: str, new_bookie: str) -> None:
        """The shell chose ``new_bookie`` for the failed write-back bookie ``failed``."""
        if not self._changing or self._failed[:1] != [failed]:
            raise LocalProtocolError(
                f"recovery of ledger {self.ledger_id}: unexpected replacement of {failed}"
            )
        # The new segment starts after recovery's own LAC: what reached Aq stays put.
        first = max(self.lac + 1, self.metadata.last_segment.first_entry)
        self._replaced_index = self.ensemble.index(failed)
        new = tuple(new_bookie if b == failed else b for b in self.ensemble)
        # Kept here, and written only with the close. Were it written now and this
        # recovery then failed, the next one would read entries >= first from the
        # replacement, which may not have them yet: its "no such entry" answers would
        # close the ledger before acknowledged entries (found by a power-loss campaign).
        self.metadata = self.metadata.with_segment(first, new)
        self._ensemble_changed()

    def no_replacement(self, failed: str, reason: str) -> None:
        """No spare bookie: carry on if every write-back can still reach Aq without it."""
        self._unreplaceable.add(failed)
        self._failed = [b for b in self._failed if b != failed]
        self._changing = False
        self._no_spare_reason = reason
        if self._failed:
            self._changing = True
            self._actions.append(NeedReplacement(self._failed[0], self.ensemble))
            return
        if self._check_reachable():
            self._maybe_close()

    def _check_reachable(self) -> bool:
        for entry, wb in self._writebacks.items():
            if len(wb.acked) >= self.quorum.ack_quorum:
                continue
            if self.quorum.write_quorum - len(wb.failed) < self.quorum.ack_quorum:
                self._fail(
                    f"write-back of entry {entry} cannot reach ack quorum: "
                    f"{len(wb.failed)} bookies of its write set failed and none can "
                    f"replace them ({self._no_spare_reason})"
                )
                return False
        return True

    def _ensemble_changed(self) -> None:
        first = self.metadata.last_segment.first_entry
        idx = self._replaced_index
        self._failed.pop(0)
        self._changing = False
        self._failed = [b for b in self._failed if b in self.ensemble]
        for entry, wb in sorted(self._writebacks.items()):
            if entry < first or idx is None:
                continue
            wb.acked.discard(idx)
            wb.failed.discard(idx)
            if idx in self.quorum.write_set(entry):
                self._actions.append(self._write_back(self.ensemble[idx], wb))
        if self._failed:
            self._changing = True
            self._actions.append(NeedReplacement(self._failed[0], self.ensemble))
            return
        self._maybe_close()

    # ------------------------------------------------------------ internals

    def _start_fencing(self) -> None:
        self.phase = RecoveryPhase.FENCING
        self._read_md = self.metadata
        for b in self.ensemble:
            self._actions.append(SendReadLac(b, self.ledger_id, fence=self._fence))

    def _start_reading(self, lc: int) -> None:
        self.phase = RecoveryPhase.READING
        # Entries before the last segment were confirmed before it was created.
        start = max(lc, self._read_md.last_segment.first_entry - 1)
        self._lc = self.lac = start
        self.last_entry = start
        # Read LC itself first (it is confirmed, never written back): its header has the
        # ledger's length there, so the close's length is exact even if LC is the last.
        self._read_entry(max(start, 0))

    def _read_entry(self, entry_id: int) -> None:
        self._reading = entry_id
        self._read = _Read()
        ensemble = self._read_md.ensemble_for(entry_id)
        for idx in self.quorum.write_set(entry_id):
            self._actions.append(
                SendRead(ensemble[idx], self.ledger_id, entry_id, fence=self._fence)
            )

    def _entry_found(self, e: Entry) -> None:
        entry_id = e.entry_id
        self.last_entry, self.length = entry_id, e.length
        if entry_id > self._lc:
            ensemble = self.metadata.ensemble_for(entry_id)
            body = self.digest.sign(self.ledger_id, entry_id, self._piggyback, e.length, e.data)
            wb = self._writebacks[entry_id] = _WriteBack(e, body)
            for idx in self.quorum.write_set(entry_id):
                if self._changing and ensemble[idx] in self._failed:
                    continue  # sent once the replacement lands
                self._actions.append(self._write_back(ensemble[idx], wb))
        self._read_entry(entry_id + 1)

    @property
    def _piggyback(self) -> int:
        """The LAC a write-back carries: LC, the LAC recovery started from. Not its own
        LAC, as BookKeeper's recovery adds carry: that one grows as write-backs reach Aq,
        and with two recoveries racing it can pass the last entry the other one closes the
        ledger at, which a tailing reader then returns (docs/findings/two-recoveries.md)."""
        return self.lac if self._own_lac else self._lc

    def _write_back(self, bookie: str, wb: _WriteBack) -> SendAdd:
        """A recovery add of ``wb``'s entry: its body as first signed, as BookKeeper's
        pending adds re-send the same buffer (a LAC signed in later could pass the
        last entry that a concurrent recovery closes the ledger at)."""
        return SendAdd(bookie, self.ledger_id, wb.entry.entry_id, wb.body, recovery=True)

    def _advance(self) -> None:
        aq = self.quorum.ack_quorum
        while (wb := self._writebacks.get(self.lac + 1)) is not None and len(wb.acked) >= aq:
            self.lac += 1

    def _end_of_ledger(self) -> None:
        self._reading = -2
        self.phase = RecoveryPhase.CLOSING
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self.phase is not RecoveryPhase.CLOSING or self._closing_sent or self._changing:
            return
        if all(len(w.acked) >= self.quorum.ack_quorum for w in self._writebacks.values()):
            self._closing_sent = True
            self._proposed = self.metadata.closed(self.last_entry, self.length)
            self._actions.append(
                WriteMetadata(
                    self._proposed, self.version, f"recovery close at entry {self.last_entry}"
                )
            )

    def _finish(self, ok: bool, message: str) -> None:
        self.phase = RecoveryPhase.DONE if ok else RecoveryPhase.FAILED
        self.message = message
        self._actions.append(RecoveryCompleted(ok, self.last_entry, self.length, message))

    def _fail(self, message: str) -> None:
        if self.phase in (RecoveryPhase.DONE, RecoveryPhase.FAILED):
            return
        self._finish(False, f"recovery of ledger {self.ledger_id} failed: {message}")
