"""The ledger writer: pipelined adds, acks in entry order, ensemble changes, close.

Events come in through the ``add``/``on_*``/``close`` methods; the actions the
shell must perform come out of :meth:`LedgerWriter.take_actions`. Rules:

- An entry is confirmed when Aq bookies of its write set acknowledged it and
  every earlier entry is confirmed: the LAC advances over a contiguous prefix,
  and completions are delivered in entry order.
- A failed bookie is replaced by an ensemble change: a new segment from LAC + 1
  whose ensemble swaps the failed bookie. Completions are held until the
  metadata CAS lands (acking earlier is BOOKKEEPER-1591: an entry could be
  confirmed on a bookie that the metadata does not list). When it lands, the
  replaced position's acks are unset first, and only then are the held
  completions released (releasing them first is apache/bookkeeper#4651: an
  ack of the replaced bookie confirms an entry that is never re-sent to its
  replacement). Then every pending entry whose write set includes the
  replaced position is re-sent.
- A fenced response means a recovery client took the ledger over: every
  pending and later add fails as fenced.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from bkref.impl.core.actions import (
    Action,
    AddCompleted,
    CloseCompleted,
    LocalProtocolError,
    NeedReplacement,
    SendAdd,
    WriteMetadata,
)
from bkref.impl.core.digest import Digest
from bkref.impl.core.frames import Status
from bkref.impl.core.metadata import LedgerMetadata, LedgerState
from bkref.impl.core.planted import active as planted

PLANT_ACKS_BY_INDEX = "acks-from-replaced-bookie-count"
PLANT_UNDO_SWAP = "ensemble-change-undoes-swap"


class WriterState(enum.Enum):
    OPEN = "OPEN"
    CHANGING_ENSEMBLE = "CHANGING_ENSEMBLE"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"
    FENCED = "FENCED"
    FAILED = "FAILED"


@dataclass(slots=True)
class _Pending:
    body: bytes
    length: int
    acked: set[int] = field(default_factory=set)  # ensemble indexes
    sent: dict[int, int] = field(default_factory=dict)  # ensemble index -> tick it was sent


class LedgerWriter:
    def __init__(
        self,
        ledger_id: int,
        metadata: LedgerMetadata,
        version: int,
        digest: Digest,
        *,
        add_timeout_ticks: int | None = None,
        plants: frozenset[str] = frozenset(),
    ) -> None:
        if metadata.state is not LedgerState.OPEN:
            raise LocalProtocolError(
                f"writer of ledger {ledger_id}: metadata is {metadata.state.value}, not OPEN"
            )
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.version = version
        self.digest = digest
        self.quorum = metadata.quorum
        self.state = WriterState.OPEN
        self.lac = metadata.last_entry
        self.length = metadata.length
        self.next_entry = self.lac + 1
        self._pending: dict[int, _Pending] = {}
        self._failed: list[str] = []  # bookies waiting for a replacement, in failure order
        self._proposed: LedgerMetadata | None = None
        self._replaced_index: int | None = None
        self._actions: list[Action] = []
        self.error: str = ""
        # Time is abstract: the shell calls tick(); an add unanswered for add_timeout_ticks
        # ticks counts as a failure of that bookie (BookKeeper's addEntryTimeoutSec).
        self.add_timeout_ticks = add_timeout_ticks
        self.ticks = 0
        # PLANTED BUG switch (test-only, bkref/impl/core/planted.py).
        self._release_before_unset = planted(PLANT_ACKS_BY_INDEX, plants)
        self._retry_on_own_view = planted(PLANT_UNDO_SWAP, plants)

    # ------------------------------------------------------------ outputs

    def take_actions(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def ensemble(self) -> tuple[str, ...]:
        return self.metadata.last_segment.ensemble

    # Read-only views for observers (the refinement harness maps them to the spec's
    # w_change, w_acks, w_sent and w_piggy); nothing here changes the writer.

    @property
    def proposed(self) -> LedgerMetadata | None:
        """The metadata of the ensemble change or close whose CAS is outstanding."""
        return self._proposed

    def pending_replicas(self) -> dict[int, tuple[frozenset[int], frozenset[int]]]:
        """Per unconfirmed entry: the ensemble indexes that acknowledged it, and those it
        was sent to and not yet answered by with an error."""
        return {e: (frozenset(p.acked), frozenset(p.sent)) for e, p in self._pending.items()}

    def pending_bodies(self) -> dict[int, bytes]:
        """Per unconfirmed entry: the signed bytes every send of it carries."""
        return {e: p.body for e, p in self._pending.items()}

    # ------------------------------------------------------------ events

    def add(self, data: bytes) -> int:
        """Queue an add; returns its entry id (assigned now, as BookKeeper's client does)."""
        if self.state in (WriterState.CLOSING, WriterState.CLOSED):
            raise LocalProtocolError(
                f"writer of ledger {self.ledger_id} is {self.state.value}: cannot add"
            )
        entry = self.next_entry
        self.next_entry += 1
        if self.state in (WriterState.FENCED, WriterState.FAILED):
            status = Status.FENCED if self.state is WriterState.FENCED else Status.IO_ERROR
            self._actions.append(AddCompleted(entry, status, self.error))
            return entry
        last = self._pending[entry - 1].length if entry - 1 in self._pending else self.length
        length = last + len(data)
        body = self.digest.sign(self.ledger_id, entry, self.lac, length, data)
        self._pending[entry] = _Pending(body, length)
        if self.state is WriterState.OPEN:
            self._send_missing(entry)
        return entry

    def on_add_response(self, bookie: str, entry_id: int, status: Status) -> None:
        p = self._pending.get(entry_id)
        if p is None or self.state in (WriterState.FENCED, WriterState.FAILED):
            return  # a duplicate, or an answer after the entry completed or failed
        ensemble = self.metadata.ensemble_for(entry_id)
        if bookie not in ensemble:
            return  # from a bookie replaced since: its ack does not count
        idx = ensemble.index(bookie)
        if status is Status.OK:
            p.acked.add(idx)
            self._advance()
        elif status is Status.FENCED:
            self._fail_all(
                WriterState.FENCED,
                Status.FENCED,
                f"ledger {self.ledger_id} was fenced by a recovery client "
                f"(bookie {bookie} refused entry {entry_id}); this writer must stop",
            )
        elif status is Status.UNAUTHORIZED:
            self._fail_all(
                WriterState.FAILED,
                Status.UNAUTHORIZED,
                f"bookie {bookie} rejected the master key of ledger "
                f"{self.ledger_id}: wrong password",
            )
        else:
            p.sent.pop(idx, None)
            self.on_bookie_failed(bookie)

    def tick(self) -> None:
        """One unit of time passed: bookies that left an add unanswered too long failed."""
        self.ticks += 1
        if self.add_timeout_ticks is None or self.state is not WriterState.OPEN:
            return
        slow: list[str] = []
        for entry, p in self._pending.items():
            ensemble = self.metadata.ensemble_for(entry)
            for idx, sent_at in p.sent.items():
                if idx not in p.acked and self.ticks - sent_at >= self.add_timeout_ticks:
                    slow.append(ensemble[idx])
        for bookie in dict.fromkeys(slow):
            for p in self._pending.values():
                ensemble_idx = [i for i, b in enumerate(self.ensemble) if b == bookie]
                for i in ensemble_idx:
                    if i not in p.acked:
                        p.sent.pop(i, None)
            self.on_bookie_failed(bookie)

    def on_bookie_failed(self, bookie: str) -> None:
        """A write to ``bookie`` failed (error response, connection lost, read-only)."""
        if self.state not in (WriterState.OPEN, WriterState.CHANGING_ENSEMBLE):
            return
        if bookie not in self.ensemble or bookie in self._failed:
            return
        self._failed.append(bookie)
        if self.state is WriterState.OPEN:
            self._start_change()

    def replace(self, failed: str, new_bookie: str) -> None:
        """The shell chose ``new_bookie`` for ``failed``: propose the new segment."""
        if self.state is not WriterState.CHANGING_ENSEMBLE or self._failed[:1] != [failed]:
            raise LocalProtocolError(
                f"writer of ledger {self.ledger_id} in {self.state.value}: unexpected "
                f"replacement of {failed}"
            )
        ensemble = self.ensemble
        self._replaced_index = ensemble.index(failed)
        new = tuple(new_bookie if b == failed else b for b in ensemble)
        self._proposed = self.metadata.with_segment(self.lac + 1, new)
        self._actions.append(
            WriteMetadata(
                self._proposed,
                self.version,
                f"ensemble change: {failed} -> {new_bookie} from entry {self.lac + 1}",
            )
        )

    def no_replacement(self, failed: str, reason: str) -> None:
        self._fail_all(
            WriterState.FAILED, Status.IO_ERROR, f"cannot replace failed bookie {failed}: {reason}"
        )

    def on_metadata_written(self, new_version: int) -> None:
        if self.state is WriterState.CHANGING_ENSEMBLE and self._proposed is not None:
            self.metadata, self.version = self._proposed, new_version
            first = self.metadata.last_segment.first_entry
            idx = self._replaced_index
            self._proposed, self._replaced_index = None, None
            self._failed.pop(0)
            if self._release_before_unset:
                # PLANTED BUG: the change is marked done and the held completions released
                # while the replaced position's acks still count.
                self.state = WriterState.OPEN
                self._advance()
            for entry, p in self._pending.items():
                if entry >= first and idx is not None:
                    p.acked.discard(idx)
                    p.sent.pop(idx, None)
            self.state = WriterState.OPEN
            # A bookie that failed meanwhile (still in the new ensemble) needs its own change.
            self._failed = [b for b in self._failed if b in self.ensemble]
            if self._failed:
                self._start_change()
                return
            # Confirm first what the held acks already confirm: only entries still
            # pending go to the replacement (the spec's writer_resends_add, e > LAC).
            self._advance()
            for entry in sorted(self._pending):
                self._send_missing(entry)
        elif self.state is WriterState.CLOSING and self._proposed is not None:
            self.metadata, self.version = self._proposed, new_version
            self._proposed = None
            self.state = WriterState.CLOSED
            self._actions.append(CloseCompleted(True, self.lac, self.length))
        else:
            raise LocalProtocolError(
                f"writer of ledger {self.ledger_id} in {self.state.value}: no metadata write "
                "was outstanding"
            )

    def on_metadata_conflict(self, current: LedgerMetadata, version: int) -> None:
        """The CAS failed: ``current`` (at ``version``) is what ZooKeeper holds now."""
        if self.state is WriterState.CLOSING:
            if current.state is LedgerState.OPEN and current.last_segment == (
                self.metadata.last_segment
            ):
                # A replication worker rewrote an earlier segment: close on its version.
                self._proposed = current.closed(self.lac, self.length)
                self._actions.append(WriteMetadata(self._proposed, version, "close retry"))
                return
            self._proposed = None
            if current.is_closed and current.last_entry == self.lac:
                self.metadata, self.version = current, version
                self.state = WriterState.CLOSED
                self._actions.append(CloseCompleted(True, self.lac, self.length))
            else:
                self.state = WriterState.FENCED
                self.error = (
                    f"ledger {self.ledger_id}: another client changed its open segment "
                    f"(ensemble now {list(current.last_segment.ensemble)}); this writer "
                    f"confirmed up to {self.lac} and will not close on metadata it did "
                    "not write: recover the ledger (open with recovery) to close it"
                    if current.state is LedgerState.OPEN
                    else f"ledger {self.ledger_id} was {current.state.value} by another "
                    f"client (last entry {current.last_entry}); this writer "
                    f"confirmed up to {self.lac}"
                )
                self._actions.append(CloseCompleted(False, self.lac, self.length, self.error))
            return
        if current.state is not LedgerState.OPEN:
            self._fail_all(
                WriterState.FENCED,
                Status.FENCED,
                f"ledger {self.ledger_id} is {current.state.value}: another client "
                "is recovering or closed it",
            )
            return
        # Still open: a replication worker rewrote an earlier segment. Retry on its version,
        # keeping its ensembles for the segments before ours.
        self.version = version
        if self._retry_on_own_view:
            # PLANTED BUG: the retry writes this writer's own view of the earlier segments
            # at the new version, undoing the worker's swap (BOOKKEEPER-667).
            if self.state is WriterState.CHANGING_ENSEMBLE and self._proposed is not None:
                self._actions.append(
                    WriteMetadata(self._proposed, version, "ensemble change retry")
                )
            return
        self.metadata = current.with_segment(
            self.metadata.last_segment.first_entry, self.metadata.last_segment.ensemble
        )
        if self.state is WriterState.CHANGING_ENSEMBLE and self._proposed is not None:
            self._proposed = current.with_segment(
                self._proposed.last_segment.first_entry, self._proposed.last_segment.ensemble
            )
            self._actions.append(WriteMetadata(self._proposed, version, "ensemble change retry"))

    def on_metadata_failed(self, message: str) -> None:
        """A metadata write's outcome is unknown (ZooKeeper unreachable): stop safely."""
        self._proposed = None
        if self.state is WriterState.CLOSING:
            self.state = WriterState.FAILED
            self.error = message
            self._actions.append(CloseCompleted(False, self.lac, self.length, message))
        else:
            self._fail_all(WriterState.FAILED, Status.IO_ERROR, message)

    def close(self) -> None:
        """Fix the last entry at the LAC by a metadata CAS.

        Adds still pending fail first, as BookKeeper's close fails them: the ledger ends
        at the LAC, and an entry the application was never told of is not part of it.
        (The client shell waits for its adds before closing, so it never hits this.)
        """
        if self.state is WriterState.CLOSED:
            self._actions.append(CloseCompleted(True, self.lac, self.length))
            return
        if self.state is not WriterState.OPEN:
            self._actions.append(
                CloseCompleted(False, self.lac, self.length, self.error or self.state.value)
            )
            return
        for entry in sorted(self._pending):
            self._actions.append(
                AddCompleted(
                    entry,
                    Status.IO_ERROR,
                    f"ledger {self.ledger_id} was closed at entry {self.lac} while entry "
                    f"{entry} was in flight; it is not part of the ledger",
                )
            )
        self._pending.clear()
        self.state = WriterState.CLOSING
        self._proposed = self.metadata.closed(self.lac, self.length)
        self._actions.append(WriteMetadata(self._proposed, self.version, "close"))

    # ------------------------------------------------------------ internals

    def _start_change(self) -> None:
        self.state = WriterState.CHANGING_ENSEMBLE
        self._actions.append(NeedReplacement(self._failed[0], self.ensemble))

    def _send_missing(self, entry: int) -> None:
        p = self._pending[entry]
        ensemble = self.metadata.ensemble_for(entry)
        for idx in self.quorum.write_set(entry):
            if idx not in p.sent and idx not in p.acked:
                p.sent[idx] = self.ticks
                self._actions.append(SendAdd(ensemble[idx], self.ledger_id, entry, p.body))

    def _advance(self) -> None:
        if self.state is not WriterState.OPEN:
            return  # held: no completion may overtake an outstanding ensemble change
        while (p := self._pending.get(self.lac + 1)) is not None and self.quorum.is_ack_quorum(
            p.acked, self.lac + 1
        ):
            self.lac += 1
            self.length = p.length
            del self._pending[self.lac]
            self._actions.append(AddCompleted(self.lac, Status.OK))

    def _fail_all(self, state: WriterState, status: Status, message: str) -> None:
        self.state = state
        self.error = message
        for entry in sorted(self._pending):
            self._actions.append(AddCompleted(entry, status, message))
        self._pending.clear()
