"""One ledger's re-replication, sans I/O: copy each fragment on a bad bookie, then CAS
the new replica into the ledger's metadata.

:class:`RepairRun` decides and its shell performs: ``bkref/impl/autorecovery/replicator.py``
copies the entries between bookies and writes the metadata, both for the replication
worker (:class:`bkref.impl.core.replication.WorkerCore` runs one RepairRun per ledger it
locks) and for manual recovery (``bkref shell recover``). Which fragments, and which
bookie each goes to, come from the planning functions of :mod:`bkref.impl.core.repair`.

Research notes: a CAS that lost to a concurrent change is retried on the current
metadata instead of copying again (D10); a replica that misses entries
(ENTRIES_MISSING) moves to a new bookie as a lost one does (D11).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from bkref.impl.core.actions import LocalProtocolError
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.core.planted import validate as check_plants
from bkref.impl.core.repair import Fragment, Reason, choose_target, fragments, replace_replica

# Planted bugs (test-only, bkref/impl/core/planted.py) that change a worker decision.
PLANT_NO_COPY = "repair-without-copy"
PLANT_OPEN_SEGMENT = "repair-open-segment-without-fence"

CAS_ATTEMPTS = 20  # metadata CASes of one new replica before the repair gives up


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


# ------------------------------------------------------------------ actions


@dataclass(frozen=True, slots=True)
class ReadOpenLac:
    """PLANTED BUG (test-only): read the LAC of the open segment's ``bookies`` without
    fencing; answer with the highest one (-1: none) through ``on_open_lac``."""

    ledger_id: int
    bookies: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Copy:
    """Copy ``fragment``'s entries to ``target`` with recovery adds, read from the other
    replicas (those in ``avoid`` last), holding the repair slots of ``involved``.
    Answer with ``on_copied``, or ``on_copy_busy`` when a slot is taken."""

    metadata: LedgerMetadata
    fragment: Fragment
    target: str
    involved: tuple[str, ...]
    avoid: frozenset[str]

    @property
    def ledger_id(self) -> int:
        return self.fragment.ledger_id


@dataclass(frozen=True, slots=True)
class CasReplica:
    """CAS the metadata from ``expected_version`` to ``metadata``, where ``target``
    replaces ``bookie`` in segment ``segment``; the lock must still be ours. Answer with
    ``on_cas`` or ``on_cas_conflict``."""

    ledger_id: int
    segment: int
    bookie: str
    target: str
    metadata: LedgerMetadata
    expected_version: int


RepairAction = Copy | CasReplica | ReadOpenLac


# ------------------------------------------------------------------ one ledger's repair


@dataclass(slots=True)
class _Step:
    fragment: Fragment
    target: str
    result: FragmentResult
    involved: tuple[str, ...]
    cas_tries: int = 0
    proposed: LedgerMetadata | None = None  # the metadata of the CAS in flight


class RepairRun:
    """One ledger's re-replication: for each immutable fragment on a bad bookie, a
    :class:`Copy` and then a :class:`CasReplica` that names the new replica, in that
    order (a metadata change before the copy would name a bookie without the entries;
    a copy never recorded is harmless garbage). One step at a time.

    Bad replicas (lost, leaving, or missing entries) move to ``target`` if given, else
    to ``local`` (a worker beside a bookie), else to a bookie the placement rules choose
    among ``candidates`` (bookie -> failure domain). A CAS
    that meets a concurrent change is retried on the current metadata while the segment
    still starts where it did and names the bad bookie (the order of a closed segment's
    entries cannot change); constructing the run plans its first step.
    """

    def __init__(
        self,
        ledger_id: int,
        metadata: LedgerMetadata,
        version: int,
        bad: Mapping[str, Reason],
        candidates: Mapping[str, str],
        *,
        local: str | None = None,
        target: str | None = None,
        plants: frozenset[str] = frozenset(),
    ) -> None:
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.version = version
        self.bad = dict(bad)
        self.candidates = dict(candidates)
        self.local = local
        self.target = target
        self.plants = check_plants(plants)
        self.result = LedgerRepair(ledger_id)
        self.done = False
        self.failed = ""  # why the run gave up (the shell raises it as an error)
        # (segment, bad bookie, metadata version) of the copy made and not yet recorded.
        self.pending: tuple[int, str, int] | None = None
        self._actions: list[RepairAction] = []
        self._todo = fragments(metadata, ledger_id, self.bad)
        # Bookies each segment gains in this run: two lost replicas of one segment must
        # not both move to the same bookie (the metadata would name it twice).
        self._gained: dict[int, set[str]] = {}
        self._incomplete = False
        self._step: _Step | None = None
        self._awaiting_lac = False
        if not metadata.is_closed and PLANT_OPEN_SEGMENT in self.plants:
            # PLANTED BUG: the open last segment is copied too, up to its replicas' LAC.
            ensemble = metadata.last_segment.ensemble
            self._awaiting_lac = True
            self._actions.append(
                ReadOpenLac(ledger_id, tuple(b for b in ensemble if b not in self.bad))
            )
        else:
            self._next()

    def take_actions(self) -> list[RepairAction]:
        out, self._actions = self._actions, []
        return out

    # ------------------------------------------------------------ events

    def on_open_lac(self, lac: int) -> None:
        if not self._awaiting_lac:
            raise LocalProtocolError(f"repair of ledger {self.ledger_id}: no LAC read pending")
        self._awaiting_lac = False
        md = self.metadata
        seg = len(md.segments) - 1
        first, ensemble = md.last_segment.first_entry, md.last_segment.ensemble
        self._todo += [
            Fragment(self.ledger_id, seg, first, lac, ensemble, idx)
            for idx, b in enumerate(ensemble)
            if b in self.bad and lac >= first
        ]
        self._next()

    def on_copied(self, entries: int, nbytes: int) -> None:
        step = self._expect("a copy")
        step.result.entries, step.result.bytes = entries, nbytes
        self._cas(step)

    def on_copy_busy(self) -> None:
        """A repair slot of a bookie involved is taken: another repair's turn first."""
        step = self._expect("a copy")
        step.result.skipped = "no free repair slot on " + ", ".join(step.involved)
        step.result.deferred = True
        self._incomplete = True
        self._finish_step()

    def on_cas(self, version: int) -> None:
        step = self._expect("a CAS")
        assert step.proposed is not None
        self.metadata, self.version = step.proposed, version
        self._gained.setdefault(step.fragment.segment, set()).add(step.target)
        self._finish_step()

    def on_cas_conflict(self, current: LedgerMetadata, version: int) -> None:
        """Someone changed the metadata first (the writer's ensemble change, a recovery's
        close): retry on what is there now, if the copy still fits it."""
        step = self._expect("a CAS")
        step.proposed = None
        self.metadata, self.version = current, version
        self._cas(step)

    # ------------------------------------------------------------ steps

    def _expect(self, what: str) -> _Step:
        step = self._step
        copying = what == "a copy"
        if step is None or self._awaiting_lac or (step.proposed is None) != copying:
            raise LocalProtocolError(f"repair of ledger {self.ledger_id}: no {what} pending")
        return step

    def _next(self) -> None:
        only = self.target if self.target is not None else self.local
        while self._todo:
            frag = self._todo.pop(0)
            taken = self._gained.setdefault(frag.segment, set())
            dest = choose_target(
                frag, self.candidates, local=only, exclude=set(self.bad) | taken, joining=taken
            )
            res = FragmentResult(frag.segment, frag.bookie, dest)
            self.result.fragments.append(res)
            if dest is None:
                res.deferred = self.local is not None and self.target is None
                res.skipped = (
                    f"{'target' if self.target else 'local'} bookie {only} cannot hold it (in "
                    "the ensemble already, not writable, or its failure domain is used)"
                    if only is not None
                    else "no writable bookie outside the ensemble in an unused failure domain"
                )
                self._incomplete = True
                continue
            involved = tuple(sorted({dest, *(b for b in frag.ensemble if b != frag.bookie)}))
            step = _Step(frag, dest, res, involved)
            self._step = step
            self.pending = (frag.segment, frag.bookie, self.version)
            if PLANT_NO_COPY not in self.plants:
                self._actions.append(Copy(self.metadata, frag, dest, involved, frozenset(self.bad)))
                return
            # PLANTED BUG: the new replica is recorded without copying the fragment.
            self._cas(step)
            return
        self._step = self.pending = None
        self.result.complete = not self._incomplete
        self.done = True

    def _cas(self, step: _Step) -> None:
        frag = step.fragment
        md = self.metadata
        new = replace_replica(md, frag.segment, frag.bookie, step.target)
        if new is None or md.segments[frag.segment].first_entry != frag.first:
            step.result.skipped = "segment changed meanwhile; copy not recorded"
            self._incomplete = True
            self._finish_step()
            return
        if step.cas_tries >= CAS_ATTEMPTS:
            self._step = self.pending = None
            self.failed = f"ledger {self.ledger_id}: metadata kept changing under the repair"
            self.done = True
            return
        step.cas_tries += 1
        step.proposed = new
        self._actions.append(
            CasReplica(self.ledger_id, frag.segment, frag.bookie, step.target, new, self.version)
        )

    def _finish_step(self) -> None:
        self._step = self.pending = None
        self._next()
