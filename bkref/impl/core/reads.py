"""Client reads without I/O: which bookies to ask, and what their answers prove.

Shaped like the writer and the recovery: ``start()``, then the shell performs the
actions of ``take_actions()`` (``SendRead``/``SendReadLac``) and feeds back each
answer (``on_read_response``/``on_read_lac_response``), or that the bookie could not
be asked (``on_bookie_unavailable``), until a completion comes out
(``ReadCompleted``/``ReadLacCompleted``). The LAC reader's coverage is
:class:`bkref.impl.core.quorum.Quorum`'s.

- :class:`EntryReader`, one entry: its write set is asked one replica at a time, in
  :func:`read_order`. The first copy whose digest verifies is the answer. Without
  one, once every replica has answered or failed:

  - NO_SUCH_ENTRY when every replica of the write set said it does not hold it;
  - IO_ERROR otherwise: some replica could not say (down, an error, a corrupt copy),
    so whether the entry exists is unknown.

  This is stricter than BookKeeper's reads, which take Wq - Aq + 1 negatives as
  proof (:meth:`Quorum.is_entry_absent`; recovery uses that rule, as it must). A
  bookie whose disk lost fsynced data (a campaign's victim) answers a negative it
  should not; with a holder of the entry down, coverage would call a confirmed
  entry absent, and a history checker would see a stale read that the faults, not
  the protocol, made. Unanimity leaves such a read unknown.

  Absence is decided only after every replica was asked: a copy that verifies wins
  over any number of negatives (a replica that lost its data under faults beyond
  the model must not hide a copy another replica still holds).
- :class:`LacReader`, the last add confirmed: every bookie of the last segment's
  ensemble is asked at once. Once all have answered or failed, the result is the
  highest LAC reported, provided the bookies that answered cover every write set
  (:meth:`Quorum.is_covered`, Wq - Aq + 1 of each); a closed ledger's LAC is its last
  entry.
"""

from __future__ import annotations

from bkref.impl.core.actions import (
    LocalProtocolError,
    ReadCompleted,
    ReadLacCompleted,
    SendRead,
    SendReadLac,
)
from bkref.impl.core.digest import Digest, DigestMismatchError
from bkref.impl.core.frames import Status
from bkref.impl.core.metadata import LedgerMetadata

# A bookie's "I hold nothing for that": for an entry, a negative; for a LAC, LAC -1.
ABSENT = frozenset({Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER})

EntryReadAction = SendRead | ReadCompleted
LacReadAction = SendReadLac | ReadLacCompleted


def read_order(
    metadata: LedgerMetadata, entry_id: int, avoid: frozenset[str] = frozenset()
) -> list[str]:
    """The entry's write set, first choice first; bookies in ``avoid`` go last."""
    ensemble = metadata.ensemble_for(entry_id)
    order = [ensemble[i] for i in metadata.quorum.write_set(entry_id)]
    return [b for b in order if b not in avoid] + [b for b in order if b in avoid]


class EntryReader:
    """One entry of ``ledger_id``, read by a client (no fencing, no master key)."""

    def __init__(
        self,
        ledger_id: int,
        metadata: LedgerMetadata,
        entry_id: int,
        digest: Digest,
        *,
        avoid: frozenset[str] = frozenset(),
    ) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.digest = digest
        self.ensemble = metadata.ensemble_for(entry_id)
        self.order = read_order(metadata, entry_id, avoid)
        self.negatives: set[int] = set()  # ensemble indexes that said "no such entry"
        self.failures: dict[str, str] = {}  # bookie -> why it could not say
        self.mismatches: list[tuple[str, str]] = []  # (bookie, digest error)
        self.result: ReadCompleted | None = None
        self._asked = 0  # replicas of ``order`` asked so far
        self._answers: list[str] = []  # "bookie: what it said", in order, for messages
        self._actions: list[EntryReadAction] = []

    def take_actions(self) -> list[EntryReadAction]:
        out, self._actions = self._actions, []
        return out

    @property
    def asking(self) -> str | None:
        """The replica whose answer the reader waits for (None before start or once done)."""
        if self.result is not None or self._asked == 0:
            return None
        return self.order[self._asked - 1]

    # ------------------------------------------------------------ events

    def start(self) -> None:
        if self._asked:
            raise LocalProtocolError(
                f"reader of ledger {self.ledger_id} entry {self.entry_id}: started twice"
            )
        self._ask_next()

    def on_read_response(self, bookie: str, status: Status, body: bytes = b"") -> None:
        """``bookie`` answered the read with ``status`` (and, if OK, the signed ``body``)."""
        self._expect(bookie, f"a {status.name} answer")
        if status is Status.OK:
            try:
                entry = self.digest.verify(body, self.ledger_id, self.entry_id)
            except DigestMismatchError as e:
                self.mismatches.append((bookie, str(e)))
                self._failed(bookie, f"corrupt copy ({e})")
            else:
                self.result = ReadCompleted(
                    self.entry_id, Status.OK, entry.data, digest_mismatches=tuple(self.mismatches)
                )
                self._actions.append(self.result)
                return
        elif status in ABSENT:
            self.negatives.add(self.ensemble.index(bookie))
            self._answers.append(f"{bookie}: {status.name}")
        else:
            self._failed(bookie, status.name)
        self._ask_next()

    def on_bookie_unavailable(self, bookie: str, reason: str) -> None:
        """``bookie`` could not be asked (no connection, no answer in time)."""
        self._expect(bookie, "its failure")
        self._failed(bookie, reason)
        self._ask_next()

    # ------------------------------------------------------------ internals

    def _expect(self, bookie: str, what: str) -> None:
        if bookie != self.asking:
            state = "done" if self.result is not None else f"waiting for {self.asking}"
            raise LocalProtocolError(
                f"reader of ledger {self.ledger_id} entry {self.entry_id} ({state}): "
                f"{what} from {bookie}, which it did not ask"
            )

    def _failed(self, bookie: str, why: str) -> None:
        self.failures[bookie] = why
        self._answers.append(f"{bookie}: {why}")

    def _ask_next(self) -> None:
        if self._asked < len(self.order):
            self._asked += 1
            self._actions.append(
                SendRead(self.order[self._asked - 1], self.ledger_id, self.entry_id)
            )
            return
        self.result = self._decide()
        self._actions.append(self.result)

    def _decide(self) -> ReadCompleted:
        where = f"ledger {self.ledger_id} entry {self.entry_id}"
        detail = "; ".join(self._answers)
        mismatches = tuple(self.mismatches)
        if len(self.negatives) == len(self.order):
            return ReadCompleted(
                self.entry_id,
                Status.NO_SUCH_ENTRY,
                message=(
                    f"{where}: every replica of its write set answered that it has no "
                    f"such entry ({detail})"
                ),
                digest_mismatches=mismatches,
            )
        return ReadCompleted(
            self.entry_id,
            Status.IO_ERROR,
            message=(
                f"{where} unreadable: no replica returned a verified copy, and only "
                f"{len(self.negatives)} of the {len(self.order)} replicas answered that they "
                f"have no such entry (absence needs all of them) ({detail}); retry once the "
                "bookies are reachable"
            ),
            digest_mismatches=mismatches,
        )


class LacReader:
    """The last add confirmed of ``ledger_id``, as a client reads it (no fencing)."""

    def __init__(self, ledger_id: int, metadata: LedgerMetadata) -> None:
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.quorum = metadata.quorum
        self.ensemble = metadata.last_segment.ensemble
        self.answers: dict[int, int] = {}  # ensemble index -> the LAC it reported
        self.failures: dict[int, str] = {}  # ensemble index -> why it could not say
        self.result: ReadLacCompleted | None = None
        self._started = False
        self._actions: list[LacReadAction] = []

    def take_actions(self) -> list[LacReadAction]:
        out, self._actions = self._actions, []
        return out

    @property
    def covered(self) -> bool:
        """The bookies that answered cover every write set (so far)."""
        return self.quorum.is_covered(self.answers)

    # ------------------------------------------------------------ events

    def start(self) -> None:
        if self._started:
            raise LocalProtocolError(f"LAC reader of ledger {self.ledger_id}: started twice")
        self._started = True
        self._actions.extend(SendReadLac(b, self.ledger_id) for b in self.ensemble)

    def on_read_lac_response(self, bookie: str, status: Status, lac: int) -> None:
        idx = self._expect(bookie, f"a {status.name} answer")
        if status is Status.OK:
            self.answers[idx] = lac
        elif status in ABSENT:
            self.answers[idx] = -1
        else:
            self.failures[idx] = status.name
        self._maybe_done()

    def on_bookie_unavailable(self, bookie: str, reason: str) -> None:
        idx = self._expect(bookie, "its failure")
        self.failures[idx] = reason
        self._maybe_done()

    # ------------------------------------------------------------ internals

    def _expect(self, bookie: str, what: str) -> int:
        idx = self.ensemble.index(bookie) if bookie in self.ensemble else -1
        if not self._started or idx < 0 or idx in self.answers or idx in self.failures:
            raise LocalProtocolError(
                f"LAC reader of ledger {self.ledger_id}: {what} from {bookie}, which it "
                "did not ask or which answered already"
            )
        return idx

    def _maybe_done(self) -> None:
        if len(self.answers) + len(self.failures) < len(self.ensemble):
            return
        if not self.covered:
            failed = "; ".join(f"{self.ensemble[i]}: {why}" for i, why in self.failures.items())
            self.result = ReadLacCompleted(
                False,
                -1,
                f"ledger {self.ledger_id}: too few bookies answered the LAC read "
                f"({len(self.answers)} of {len(self.ensemble)}; {failed}): the answers "
                f"must cover every write set ({self.quorum.negatives_needed} of each); "
                "retry once more bookies are reachable",
            )
        else:
            md = self.metadata
            lac = max([*self.answers.values(), md.last_segment.first_entry - 1, -1])
            self.result = ReadLacCompleted(True, md.last_entry if md.is_closed else lac)
        self._actions.append(self.result)
