"""The auditor's decisions, sans I/O: when to audit, what to mark, which replicas to probe.

The asyncio shell (``bkref/impl/autorecovery/auditor.py``) keeps the ZooKeeper watches
and turns them into events; :class:`AuditorCore` answers with actions through
:meth:`AuditorCore.take_actions`. Time is the ``now_ms`` each event carries (a
monotonic clock the caller chooses), so that a test can run one auditor decision
at a time. The decisions, after BookKeeper's Auditor:

- Election: the lowest surviving vote leads, and its sequence number is the
  epoch. A node without a vote joins (:class:`JoinElection`). A new auditor
  audits at once: bookies may have been lost while nobody led.
- A bookie that disappears from the registrations is audited after
  ``lostBookieRecoveryDelay`` (read from ZooKeeper at that moment:
  :class:`ReadDelay`), at once if more than one bookie that holds data is down,
  or if an audit was already waiting. A bookie that joins is audited at once
  (unless an audit is waiting already). A trigger (the delay znode written, or
  AutoRecovery enabled again) and the periodic bookie check audit at once.
- An audit (:class:`ReadLedgers`, answered by :meth:`AuditorCore.on_ledgers`)
  marks every ledger naming a lost or decommissioning bookie (:class:`Mark`).
- The periodic ledger check (:class:`CheckLedgers`) runs :class:`LedgerCheck`
  over each ledger: it probes each live replica of each immutable segment and
  marks the replicas that miss an entry as ENTRIES_MISSING, and the bookies of
  those segments that are not registered as LOST. Unlike the audit's marks, its
  marks add only bookies the task does not list yet (``Mark.rewrite``).

Spec correspondence (``bkref/spec/protocol.py``): one ``ReadLedgers`` answered and its
``Mark``\\ s performed is ``auditor_marks_ledgers_of_lost_bookies``; one
:class:`LedgerCheck` run to its end is ``auditor_checks_ledger_replicas(ledger)``;
:meth:`AuditorCore.on_session_lost` is ``auditor_loses_session``; becoming the
leader in :meth:`AuditorCore.on_votes` is ``node_wins_auditor_election``.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bkref.impl.core.actions import LocalProtocolError
from bkref.impl.core.digest import Digest, DigestMismatchError
from bkref.impl.core.frames import ReadResponse, Response, Status
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.core.planted import validate as check_plants
from bkref.impl.core.repair import Fragment, Reason, live_replicas, segment_range


@dataclass(frozen=True)
class AuditorConfig:
    """BookKeeper's names; seconds, as in bk_server.conf."""

    lost_bookie_recovery_delay: int = 0  # seconds; the znode, when set, wins
    periodic_check_interval: int = 604800  # seconds; 0 disables
    periodic_bookie_check_interval: int = 86400  # seconds; 0 disables
    verification_percentage: int = 0


# ------------------------------------------------------------------ actions


@dataclass(frozen=True, slots=True)
class JoinElection:
    """Create this node's ephemeral sequential vote; answer with :meth:`AuditorCore.on_votes`."""

    node_id: str


@dataclass(frozen=True, slots=True)
class ReadDelay:
    """Bookies were lost: read ``lostBookieRecoveryDelay`` (the znode, else the config) and
    answer with :meth:`AuditorCore.on_delay`. ``down``: every bookie down now that holds data."""

    lost: frozenset[str]
    down: frozenset[str]


@dataclass(frozen=True, slots=True)
class ReadLedgers:
    """Audit now: read whether AutoRecovery is enabled, the registered and decommissioning
    bookies and every ledger's metadata; answer with :meth:`AuditorCore.on_ledgers`."""


@dataclass(frozen=True, slots=True)
class CheckLedgers:
    """Run the periodic ledger check (:class:`LedgerCheck` per ledger); answer with
    :meth:`AuditorCore.on_checked` when it is over."""


@dataclass(frozen=True, slots=True)
class Mark:
    """Create or rewrite the ledger's under-replication task.

    ``rewrite``: a new version even when the task lists every bookie already. The
    lost-bookie audit needs it: a loss seen after a worker looked at the ledger must
    make that worker's versioned delete fail (the spec's model checker finds the trace
    where an idempotent mark lets the delete succeed while the bookie is down again).
    The periodic check adds only bookies not listed yet, as BookKeeper's
    ``markLedgerUnderreplicated`` does for every mark.
    """

    ledger_id: int
    replicas: Mapping[str, Reason]
    priority: int  # the fewest live replicas an entry has: lower is more at risk
    rewrite: bool = True


@dataclass(frozen=True, slots=True)
class Probe:
    """Read ``entries`` of ``fragment`` from its bookie and verify their digests; answer
    with :meth:`LedgerCheck.on_probe`."""

    fragment: Fragment
    entries: tuple[int, ...]


AuditAction = JoinElection | ReadDelay | ReadLedgers | CheckLedgers | Mark


@dataclass(frozen=True, slots=True)
class AuditView:
    """What an audit reads: the answer to :class:`ReadLedgers` while AutoRecovery is enabled."""

    registered: frozenset[str]
    leaving: frozenset[str]  # decommissioning
    ledgers: Sequence[tuple[int, LedgerMetadata]]


def plan_marks(
    ledgers: Iterable[tuple[int, LedgerMetadata]],
    registered: frozenset[str],
    leaving: frozenset[str],
) -> list[Mark]:
    """A mark for every ledger that names a lost (unregistered) or leaving bookie."""
    out: list[Mark] = []
    for lid, md in ledgers:
        bad: dict[str, Reason] = {}
        for b in sorted(md.bookies()):
            if b not in registered:
                bad[b] = Reason.LOST
            elif b in leaving:
                bad[b] = Reason.LEAVING
        if bad:
            out.append(Mark(lid, bad, live_replicas(md, registered - leaving)))
    return out


# ------------------------------------------------------------------ the auditor


class AuditorCore:
    """One autorecovery node's auditor role: election view, audit scheduling, marks."""

    def __init__(
        self,
        node_id: str,
        config: AuditorConfig,
        now_ms: int,
        plants: frozenset[str] = frozenset(),
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.plants = check_plants(plants)  # none applies to the auditor yet
        self.now_ms = now_ms
        self.vote: int | None = None  # our vote's sequence number, once joined
        self.epoch: int | None = None  # set while this node leads
        self._actions: list[AuditAction] = []
        self._known: set[str] | None = None  # registered at the last look of this term
        self._seen: set[str] = set()  # registered at some point of this term
        # Bookies some ledger named at the last audit that read ledgers. Kept across
        # terms, as a lost bookie that holds data stays relevant to the next auditor.
        self._named: set[str] = set()
        self._loss: tuple[int, int] | None = None  # (when, bookies down) awaiting the delay
        self._audit_at: int | None = None
        self._check_at: int | None = None
        self._bookie_check_at: int | None = None

    # ------------------------------------------------------------ observable state

    def take_actions(self) -> list[AuditAction]:
        out, self._actions = self._actions, []
        return out

    @property
    def leading(self) -> bool:
        return self.epoch is not None

    @property
    def stale(self) -> bool:
        """An audit is due (now or after the lost-bookie delay): the spec's ``au_stale``."""
        return self._audit_at is not None

    @property
    def audit_due_at(self) -> int | None:
        return self._audit_at

    @property
    def next_wakeup_ms(self) -> int | None:
        """The earliest time :meth:`tick` has something to do; None: only events matter."""
        due = [t for t in (self._audit_at, self._check_at, self._bookie_check_at) if t is not None]
        return min(due) if due else None

    # ------------------------------------------------------------ election

    def on_votes(self, mine: int | None, lowest: int | None, now_ms: int) -> None:
        """The election as the node sees it: its own vote (None: it has none, e.g. its
        session expired) and the lowest vote alive. The lowest one leads."""
        self._clock(now_ms)
        self.vote = mine
        if mine is None:
            self._step_down()
            self._actions.append(JoinElection(self.node_id))
            return
        if lowest == mine and self.epoch != mine:
            self._step_down()
            self._lead(mine)
        elif lowest != mine:
            self._step_down()

    def on_session_lost(self) -> None:
        """kazoo's LOST, or the vote found gone: stop leading now (the vote died with the
        session; acting on it would make two auditors). The shell also reports a term
        that ended on a ZooKeeper error this way: the next election view starts anew."""
        self.vote = None
        self._step_down()

    def _lead(self, epoch: int) -> None:
        self.epoch = epoch
        self._known = None
        self._seen = set()
        self._loss = None
        # BookKeeper audits on becoming auditor: losses while nobody led are unmarked.
        self._audit_at = self.now_ms
        self._check_at = self._after(self.config.periodic_check_interval)
        self._bookie_check_at = self._after(self.config.periodic_bookie_check_interval)

    def _step_down(self) -> None:
        self.epoch = None
        self._known = None
        self._loss = None
        self._audit_at = self._check_at = self._bookie_check_at = None

    def _after(self, interval_s: int) -> int | None:
        return self.now_ms + interval_s * 1000 if interval_s > 0 else None

    def _clock(self, now_ms: int) -> None:
        self.now_ms = max(self.now_ms, now_ms)

    # ------------------------------------------------------------ what happens to the cluster

    def on_registered(self, bookies: Iterable[str], now_ms: int) -> None:
        """The registered bookies (writable and read-only), read after a change of
        ``/ledgers/available``. The first view of a term only sets the baseline."""
        self._clock(now_ms)
        if not self.leading:
            return
        registered = set(bookies)
        if self._known is None:
            self._known = set(registered)
            self._seen = set(registered)
            return
        lost = self._known - registered
        # Every bookie down now that still holds data (the audits say which): two such
        # bookies may hold both replicas of an entry, so the delay would risk it.
        down = (self._seen - registered) & (self._named | lost)
        joined = registered - self._known
        self._known = registered
        self._seen |= registered
        if lost:
            self._loss = (self.now_ms, len(down))
            self._actions.append(ReadDelay(frozenset(lost), frozenset(down)))
        elif joined and self._audit_at is None and self._loss is None:
            # Any change of the registrations is audited, as BookKeeper's auditor does: a
            # bookie back while another is still down re-marks that one's ledgers, so a
            # worker that found them repaired before the loss cannot delete their task.
            self._audit_at = self.now_ms

    def on_delay(self, seconds: int) -> None:
        """The ``lostBookieRecoveryDelay`` in force when the loss was seen."""
        if self._loss is None:
            raise LocalProtocolError(f"auditor {self.node_id}: a delay without a bookie loss")
        at, down = self._loss
        self._loss = None
        if not self.leading:
            return
        if seconds <= 0 or down > 1 or self._audit_at is not None:
            self._audit_at = at
        else:
            self._audit_at = at + seconds * 1000

    def on_trigger(self, now_ms: int) -> None:
        """The delay znode was written (``bkref shell triggeraudit``): audit now."""
        self._clock(now_ms)
        if self.leading:
            self._audit_at = self.now_ms

    def on_enabled(self, enabled: bool, now_ms: int) -> None:
        """AutoRecovery switched. Enabled: audit now (one skipped while disabled runs, as
        BookKeeper's does). Disabled: nothing here; the audit reads the switch itself
        and publishes nothing."""
        if enabled:
            self.on_trigger(now_ms)
        else:
            self._clock(now_ms)

    def tick(self, now_ms: int) -> None:
        """Time passed: start what is due (the periodic bookie check, an audit, the
        periodic ledger check), in that order."""
        self._clock(now_ms)
        if not self.leading:
            return
        now = self.now_ms
        if self._bookie_check_at is not None and now >= self._bookie_check_at:
            self.on_periodic_bookie_check(now)
        if self._audit_at is not None and now >= self._audit_at:
            self._audit_at = None
            self._actions.append(ReadLedgers())
        if self._check_at is not None and now >= self._check_at:
            self._check_at = None  # rescheduled when this check is over
            self._actions.append(CheckLedgers())

    def on_periodic_bookie_check(self, now_ms: int) -> None:
        """``auditorPeriodicBookieCheckInterval`` is up: an audit is due now, with no
        registration change behind it. It finds a ledger whose metadata named a bookie
        already down after the last audit read it (an ensemble change whose new bookie
        crashed before the CAS landed), which no registration watch reports."""
        self._clock(now_ms)
        if not self.leading:
            return
        self._audit_at = self.now_ms
        self._bookie_check_at = self._after(self.config.periodic_bookie_check_interval)

    # ------------------------------------------------------------ answers

    def on_ledgers(self, view: AuditView | None) -> None:
        """The answer to :class:`ReadLedgers` (None: AutoRecovery is disabled, nothing is
        published). Emits exactly the :class:`Mark` actions of this audit."""
        if view is None:
            return
        self._named = {b for _lid, md in view.ledgers for b in md.bookies()}
        self._actions.extend(plan_marks(view.ledgers, view.registered, view.leaving))

    def on_checked(self, now_ms: int) -> None:
        """The periodic ledger check is over: the next one is an interval from now."""
        self._clock(now_ms)
        if self.leading:
            self._check_at = self._after(self.config.periodic_check_interval)


# ------------------------------------------------------------------ the ledger check


class Verdict(enum.Enum):
    """What reading one entry from one replica showed."""

    INTACT = "intact"  # there, and its digest verifies
    MISSING = "missing"  # no such entry or ledger, unreadable, or a digest that fails
    UNKNOWN = "unknown"  # the bookie did not answer: the bookie audit covers bookies gone


def judge(reply: Response | None, digest: Digest, ledger_id: int, entry: int) -> Verdict:
    """What one replica's answer to a read of ``entry`` shows (None: no answer)."""
    if reply is None:
        return Verdict.UNKNOWN
    # Missing, or there but unreadable (the bookie's own read failed: a corrupt record).
    if reply.status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER, Status.IO_ERROR):
        return Verdict.MISSING
    if isinstance(reply, ReadResponse) and reply.status is Status.OK:
        try:
            digest.verify(reply.body, ledger_id, entry)
        except DigestMismatchError:
            return Verdict.MISSING
    return Verdict.INTACT


class LedgerCheck:
    """The periodic check of one ledger (the seed's "periodically check ledgers are
    available"): one :class:`Probe` at a time, per live replica of each immutable
    segment, then a :class:`Mark` of the replicas that miss entries (ENTRIES_MISSING)
    and of the bookies of those segments that are not registered (LOST).

    A probe reads the fragment's first and last entry plus ``percentage`` percent of
    its entries, rounded down, from the rest (100: every entry), as BookKeeper's
    ``LedgerChecker.verifyLedgerFragment`` does: a share that rounds down to no entry
    reads the first and last alone. With Aq < Wq an acknowledged entry may reach only Aq
    bookies and the writer's ensemble change starts after the LAC: only this check
    finds such a gap, and only when it samples the missing entry.
    """

    def __init__(
        self,
        ledger_id: int,
        metadata: LedgerMetadata,
        registered: Iterable[str],
        percentage: int,
        rng: random.Random,
        *,
        only: Iterable[str] | None = None,
    ) -> None:
        """``only``: probe the replicas of these bookies alone (a worker's check of the
        replicas its task lists); by default every live replica."""
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.registered = frozenset(registered)
        self.percentage = percentage
        self.rng = rng
        self.bad: dict[str, Reason] = {}
        self.done = False
        self._actions: list[Probe | Mark] = []
        self._todo: list[Fragment] = []
        keep = None if only is None else frozenset(only)
        for i, seg in enumerate(metadata.segments):
            first, last = segment_range(metadata, i)
            if last is None:
                continue  # open: it may still grow
            # A bookie that is not registered cannot answer: its replica counts as lost,
            # as BookKeeper's checker counts an unavailable bookie (without the delay the
            # lost-bookie audit waits).
            self.bad.update((b, Reason.LOST) for b in seg.ensemble if b not in self.registered)
            if last < first:
                continue  # empty: nothing to read
            self._todo.extend(
                Fragment(ledger_id, i, first, last, seg.ensemble, idx)
                for idx in range(len(seg.ensemble))
                if keep is None or seg.ensemble[idx] in keep
            )
        self._probing: Probe | None = None
        self._next()

    def take_actions(self) -> list[Probe | Mark]:
        out, self._actions = self._actions, []
        return out

    def on_probe(self, probe: Probe, verdicts: Mapping[int, Verdict]) -> None:
        """Verdicts per entry of ``probe``. An unknown one counts as intact: a bookie that
        does not answer is not evidence that it lacks the entry."""
        if probe != self._probing:
            raise LocalProtocolError(f"ledger check {self.ledger_id}: no probe {probe} pending")
        self._probing = None
        if any(verdicts.get(e) is Verdict.MISSING for e in probe.entries):
            self.bad[probe.fragment.bookie] = Reason.ENTRIES_MISSING
        self._next()

    def _next(self) -> None:
        while self._todo:
            frag = self._todo.pop(0)
            if frag.bookie in self.bad:  # found bad, or not registered (counted lost)
                continue
            entries = self._sample(frag)
            if not entries:
                continue
            self._probing = Probe(frag, entries)
            self._actions.append(self._probing)
            return
        self.done = True
        if self.bad:
            self._actions.append(
                Mark(
                    self.ledger_id,
                    dict(self.bad),
                    live_replicas(self.metadata, self.registered) - 1,
                    rewrite=False,
                )
            )

    def _sample(self, frag: Fragment) -> tuple[int, ...]:
        entries = frag.entries(self.metadata)
        if not entries:
            return ()
        sample = {entries[0], entries[-1]}
        k = min(len(entries) * self.percentage // 100, len(entries) - 2)
        if k > 0:
            sample.update(self.rng.sample(entries[1:-1], k))
        return tuple(sorted(sample))
