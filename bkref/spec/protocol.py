"""The BookKeeper ledger protocol and its AutoRecovery as a state machine.

Scope. One writer's ledger through its whole life: creation, adds striped over
the ensemble (E >= Wq >= Aq), acknowledgement at ack quorum and the LAC over a
contiguous prefix, ensemble changes by metadata CAS, the writer's close, and
recovery by other clients, one or several racing (OPEN -> IN_RECOVERY, fencing
LAC reads, recovery reads that also fence, quorum coverage, write-back with
recovery adds, recovery ensemble changes, close by CAS; a close that finds the
ledger closed by another recovery re-reads it; a recovery that error answers
leave undecided gives up and may start again). Readers that open the ledger
without recovery poll the bookies' LAC (one bookie's answer, as the long poll
takes it), read entries up to it and see the close; what they return is held
to the ledger's final close. Beside it, closed ledgers and
AutoRecovery: the elected auditor marks the ledgers of a lost bookie as
under-replicated (and, with ``cfg.periodic_check``, the ledgers whose live
bookies miss entries), a replication worker locks a ledger, copies the closed
segments of the lost bookie to its own bookie, swaps the ensemble by CAS and
deletes the task with a version check; an open last segment is fenced through
recovery before it is replicated. The environment crashes and restarts bookies
(with their synced data, or with a wiped disk that the cookie check refuses),
loses and duplicates messages, and an operator turns AutoRecovery off and on.

Not modelled. Entry payloads and digests (an entry is its id: the writer is
the only source of data, so equal ids mean equal data); readers' unconfirmed
reads and explicit LACs, and readers of closed ledgers other than the writer's
(readability is an invariant over stored data there); more than one writer per
ledger; ledger deletion, garbage collection and compaction; the bookie's
journal, entry log and index as separate structures (a bookie's synced
entries stand for all of them: in the correct
spec, the journal fsync and the reply are one step); time (the grace period
before fencing an open ledger is any interleaving); responses in flight (a
bookie's answer reaches the client in the step that handles the request, or is
lost there: a delayed answer is the same as a later handling of the request,
for every decision the clients make); a recovery whose write-back fails with
no bookie to replace the failed one (it waits for the bookie instead of giving
up). Messages are unordered: every in-flight message is deliverable.

State. One frozen, hashable ``State`` tuple. Bookies are indices ``0..N-1``
and bookie sets are bitmasks; entries are ids ``0..K-1`` and entry sets are
bitmasks. Variables are grouped by owner with a prefix: ``meta_`` (the
metadata store: ledgers, under-replication tasks, locks, the AutoRecovery
switch, the auditor election), ``b_`` (per bookie), ``w_`` (the writer),
``rc`` (the recovery clients of the writer's ledger, one ``Recovery`` record
each), ``wk_`` (the replication workers), ``au_`` (auditor candidates),
``msgs`` (messages in flight) and ``budget`` (faults the environment may still
inject).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import NamedTuple, TypeVar, cast

from bkref.spec.config import Config
from bkref.spec.quorum import (
    contiguous_confirmed,
    fencing_covers_ensemble,
    has_quorum_coverage,
    popcount,
    recovery_start_entry,
)
from bkref.spec.quorum import write_set_positions as _write_set_positions

# Cached: the contracts stay on the plain function that crosshair checks.
write_set_positions = lru_cache(maxsize=4096)(_write_set_positions)

# ------------------------------------------------------------------ constants

# Ledger status in the metadata store (meta_status).
NONE, OPEN, IN_RECOVERY, CLOSED = 0, 1, 2, 3
STATUS_NAMES = ("NONE", "OPEN", "IN_RECOVERY", "CLOSED")

# Writer status (w_status).
W_NONE, W_OPEN, W_CLOSED, W_WITHDRAWN = 0, 1, 2, 3
W_NAMES = ("NONE", "OPEN", "CLOSED", "WITHDRAWN")

# Recovery client phase (Recovery.phase). CLOSED: the ledger is closed, by this client's
# close or by another's (the client then reports the stored last entry, as BookKeeper's).
RC_IDLE, RC_FENCING, RC_READING, RC_WRITING, RC_CLOSED = 0, 1, 2, 3, 4
RC_NAMES = ("IDLE", "FENCING", "READING", "WRITING", "CLOSED")

# A reader's handle on the writer's ledger (State.rd): not opened, opened before the close
# reached it, or closed (it applied CLOSED metadata: its LAC is the stored last entry).
RD_NONE, RD_OPEN, RD_CLOSED = 0, 1, 2
RD_NAMES = ("NONE", "OPEN", "CLOSED")

# Bookie liveness (b_up). UNREGISTERED: running and serving, but its ZooKeeper session
# expired and took its registration: the auditor and the workers' checkers take it for
# lost, while clients' requests still reach it (``bookie_loses_session``).
DOWN, UP, REFUSED, UNREGISTERED = 0, 1, 2, 3
UP_NAMES = ("DOWN", "UP", "REFUSED", "UNREGISTERED")
SERVING = (UP, UNREGISTERED)  # a bookie that takes requests

# Request kinds. A request is (kind, bookie, entry, a, b); all concern the
# writer's ledger. ADD: a = piggybacked LAC, b = sender (0: the writer, c + 1:
# recovery client c). FENCE: the fencing LAC read, b = client. READ: recovery
# read, a = fence flag, b = client. A bookie's answer reaches its client in the
# step that handles the request, or is lost in that step (see the module
# docstring). b = ORPHAN: a request of a recovery attempt that gave up
# (``recovery_client_gives_up``): still handled by its bookie, heard by nobody.
ADD, FENCE, READ = 0, 1, 2
MSG_NAMES = ("add", "fence_lac_read", "recovery_read")
ORPHAN = -1

# Budget slots.
B_LOSS, B_DUP, B_CRASH, B_WIPE, B_ELECT, B_TOGGLE, B_GIVE_UP, B_REPAIR_FAIL = range(8)
B_SESSION, B_LOCK = 8, 9
# The Config field that bounds each slot of ``State.budget``, in ``B_*`` order.
BUDGETS = (
    "losses",
    "duplicates",
    "crashes",
    "wipes",
    "elections",
    "toggles",
    "give_ups",
    "repair_failures",
    "session_losses",
    "lock_losses",
)

Segment = tuple[int, tuple[int, ...]]  # (first entry id, ensemble of bookie indices)
Segments = tuple[Segment, ...]
Msg = tuple[int, int, int, int, int]
# Per bookie, per ledger: (synced entries, unsynced entries, fenced, LAC).
LedgerOnBookie = tuple[int, int, int, int]


class Recovery(NamedTuple):
    """One recovery client of the writer's ledger; field comments say what each variable is.

    ``State.rc`` holds one per client as a plain tuple (states are marshalled);
    ``recovery_of`` reads one as a record and ``with_recovery`` writes it back.
    """

    phase: int  # IDLE / FENCING / READING / WRITING / CLOSED
    version: int  # metadata version after marking IN_RECOVERY (or finding it so)
    segments: Segments  # its copy of the segments, changed locally by recovery ensemble changes
    # The segments as they were when recovery began: what it reads from (BOOKKEEPER-581);
    # a replacement its own write-back brought in never had the entries it reads.
    read_segments: Segments
    base: int  # index of the last segment when recovery started
    fenced: int  # bookies that answered the fencing LAC read
    # Highest LAC among those answers; from reading on, the LAC recovery starts from (LC),
    # which its write-backs carry.
    max_lac: int
    reading: int  # entry being read
    negative: int  # bookies that answered NoSuchEntry for it
    last: int  # last recoverable entry once reading is over (-2 before)
    lac: int  # contiguous prefix of written-back entries at ack quorum
    acks: tuple[int, ...]  # per entry: bookies that acknowledged the recovery add
    sent: tuple[int, ...]  # per entry: bookies the recovery add was sent to
    piggy: tuple[int, ...]  # per entry: the LAC its recovery add carries, fixed at its first send


RecoveryTuple = tuple[
    int,
    int,
    Segments,
    Segments,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
]


class State(NamedTuple):
    """One state of the whole system; field comments say what each variable is."""

    # --- metadata store (ZooKeeper), one slot per ledger
    meta_status: tuple[int, ...]  # NONE / OPEN / IN_RECOVERY / CLOSED
    meta_segments: tuple[Segments, ...]  # segments: first entry id -> ensemble
    meta_last: tuple[int, ...]  # last entry id, set on close (-1: empty)
    meta_version: tuple[int, ...]  # ledger metadata version, bumped by every CAS
    meta_task: tuple[tuple[int, int], ...]  # under-replication task: (version, lost bookies mask)
    meta_lock: tuple[int, ...]  # worker holding the ledger's replication lock, -1: none
    # Ghost (history): each worker swap that landed, (segment, bookie it filled, bookie it
    # replaced); the replaced one is -1 once a later swap filled it back in.
    meta_rereplicated: tuple[tuple[tuple[int, int, int], ...], ...]
    meta_autorecovery: int  # 1 enabled, 0 disabled by the operator
    meta_auditor: tuple[int, int]  # (election epoch, node holding the leader znode or -1)
    # --- bookies, one slot per bookie
    # DOWN / UP / REFUSED (wiped disk, cookie mismatch) / UNREGISTERED (session expired)
    b_up: tuple[int, ...]
    b_ledgers: tuple[tuple[LedgerOnBookie, ...], ...]  # per ledger: synced, unsynced, fenced, LAC
    # Per bookie, per entry of the writer's ledger: the LAC its stored copy is signed with
    # (the one piggybacked on the add that stored it; -2: none stored). A worker's copy
    # carries it to the new replica, whose LAC follows it, as a bookie's LAC follows every
    # entry it stores (BookKeeper's ledger storage reads it from the entry's header).
    b_signed: tuple[tuple[int, ...], ...]
    # --- the writer of the last ledger
    w_status: int  # NONE / OPEN / CLOSED / WITHDRAWN (fenced or lost the CAS)
    w_version: int  # metadata version the writer last wrote or read
    w_segments: Segments  # the writer's view of the segments
    w_change: Segments | None  # segments of an ensemble change whose CAS is in flight
    w_next: int  # next entry id to add (LAP + 1)
    w_lac: int  # last add confirmed: acknowledged to the application
    w_acks: tuple[int, ...]  # per entry: write-set bookies that acknowledged it
    w_sent: tuple[int, ...]  # per entry: bookies the add was sent to
    w_piggy: tuple[int, ...]  # per entry: the LAC its add carries, fixed at its first send
    # --- the recovery clients of the writer's ledger
    rc: tuple[RecoveryTuple, ...]  # one ``Recovery`` (as a plain tuple) per client
    rc_requested: int  # 1 when a replication worker asked for recovery (grace period over)
    # --- readers of the writer's ledger, opened without recovery: (handle, LAC it learned,
    # 1 while a LAC read is in flight, entries it returned to the application (mask))
    rd: tuple[tuple[int, int, int, int], ...]
    # --- replication workers: (own bookie, ledger locked or -1, task version, pending copy)
    wk: tuple[tuple[int, int, int, tuple[int, int, int] | None], ...]
    # Per worker, the bookies of its ledger it found lost when it took the lock (mask; 0
    # without a lock): its checker's view, which it copies from even where a bookie came
    # back since (``worker_copies_fragment``).
    wk_seen: tuple[int, ...]
    # Ghost (history), workers (mask) at work on a ledger whose lock ZooKeeper dropped
    # (``worker_loses_lock``): each goes on unaware until it lets the ledger go.
    wk_unlocked: int
    # --- auditor candidates (one per worker node): epoch it believes it leads, 0 none
    au_leads: tuple[int, ...]
    au_stale: int  # 1 when bookie registrations changed since the auditor's last audit
    # Ghost (history) variable, ledgers (mask) whose metadata named a bookie already down in
    # a write that landed after the auditor's last audit: that audit cannot have marked them,
    # and the next registration change may never come. Only BookKeeper's periodic bookie
    # check finds them (``auditor_runs_periodic_bookie_check``).
    au_missed: int
    # Ghost (history), bookies (mask) registered again since the auditor's last audit (a
    # restart, a new session): an audit that read the registrations before one of them came
    # back marks it lost all the same (``auditor_marks_from_earlier_view``).
    au_back: int
    # --- network and environment
    msgs: tuple[Msg, ...]  # messages in flight, a sorted multiset
    # losses, duplicates, crashes, wipes, elections, disables, recovery give-ups, failed
    # repairs, bookie session losses and worker lock losses left
    budget: tuple[int, ...]


Label = tuple[str, tuple[object, ...]]  # action name and its arguments


R = TypeVar("R", bound=tuple[object, ...])


def _fast_replace(cls: type[R]) -> Callable[..., R]:
    """``cls._replace`` without the generic namedtuple machinery (2x faster).

    Actions build every successor by ``_replace``, often several times; the
    generic version pops every field name from a dict. Same result; an
    unknown field raises ValueError as the generic one does.
    """
    index = {name: i for i, name in enumerate(getattr(cls, "_fields"))}  # noqa: B009

    def replace(self: R, /, **changes: object) -> R:
        values: list[object] = list(self)
        for name, value in changes.items():
            i = index.get(name)
            if i is None:
                raise ValueError(f"Got unexpected field names: {[name]!r}")
            values[i] = value
        return tuple.__new__(cls, values)

    return replace


_replace_fast = _fast_replace(State)
# Methods, assigned after the classes.
setattr(State, "_replace", _replace_fast)  # noqa: B010
setattr(Recovery, "_replace", _fast_replace(Recovery))  # noqa: B010


def recovery_of(s: State, c: int) -> Recovery:
    """Recovery client ``c``'s variables as a record."""
    return tuple.__new__(Recovery, s.rc[c])


def with_recovery(s: State, c: int, r: Recovery) -> tuple[RecoveryTuple, ...]:
    """``s.rc`` with client ``c``'s variables replaced by ``r``."""
    return set_at(s.rc, c, cast(RecoveryTuple, tuple(r)))


def idle_recovery(cfg: Config) -> RecoveryTuple:
    """A recovery client that has not started."""
    zero, none = (0,) * (cfg.entries + 1), (-1,) * (cfg.entries + 1)
    return (RC_IDLE, 0, (), (), 0, 0, -1, 0, 0, -2, -1, zero, zero, none)


Step = tuple[Label, State]


# ------------------------------------------------------------------ helpers


def bit(i: int) -> int:
    return 1 << i


def segment_index_of(segments: Segments, entry: int) -> int:
    """Index of the segment that holds ``entry``: the last one starting at or before it."""
    idx = 0
    for i, (first, _ens) in enumerate(segments):
        if first <= entry:
            idx = i
    return idx


# Write sets by (E, Wq, ensemble, entry): asked for on most steps, of few distinct values.
_WRITE_SETS: dict[tuple[int, int, tuple[int, ...], int], int] = {}


def ensemble_write_set(cfg: Config, ens: tuple[int, ...], entry: int) -> int:
    """Bookies (mask) of ``ens`` that store ``entry`` (round-robin striping)."""
    key = (cfg.ensemble, cfg.write_quorum, ens, entry)
    mask = _WRITE_SETS.get(key)
    if mask is None:
        mask = 0
        for p in write_set_positions(entry, cfg.ensemble, cfg.write_quorum):
            mask |= bit(ens[p])
        if len(_WRITE_SETS) > 100_000:
            _WRITE_SETS.clear()
        _WRITE_SETS[key] = mask
    return mask


def write_set(cfg: Config, segments: Segments, entry: int) -> int:
    """Bookies (mask) that store ``entry`` according to ``segments``."""
    return ensemble_write_set(cfg, segments[segment_index_of(segments, entry)][1], entry)


def last_ensemble_write_set(cfg: Config, segments: Segments, entry: int) -> int:
    """Write set of ``entry`` in the last segment's ensemble (where new writes go)."""
    return ensemble_write_set(cfg, segments[-1][1], entry)


def ensemble_mask(ens: tuple[int, ...]) -> int:
    m = 0
    for b in ens:
        m |= bit(b)
    return m


def bookies_of(mask: int) -> Iterator[int]:
    i = 0
    while mask:
        if mask & 1:
            yield i
        mask >>= 1
        i += 1


def send(msgs: tuple[Msg, ...], *new: Msg) -> tuple[Msg, ...]:
    out = list(msgs)
    for m in new:
        insort(out, m)
    return tuple(out)


def consume(msgs: tuple[Msg, ...], m: Msg) -> tuple[Msg, ...]:
    i = msgs.index(m)
    return msgs[:i] + msgs[i + 1 :]


T = TypeVar("T")


def set_at(t: tuple[T, ...], i: int, v: T) -> tuple[T, ...]:
    return (*t[:i], v, *t[i + 1 :])


def with_segment_change(segments: Segments, first: int, failed: int, new: int) -> Segments:
    """Segments after replacing ``failed`` by ``new`` from entry ``first`` on.

    A new segment is appended, unless the last segment starts at ``first``
    (nothing of it is confirmed yet), which is replaced in place.
    """
    ens = tuple(new if b == failed else b for b in segments[-1][1])
    if segments[-1][0] == first:
        return (*segments[:-1], (first, ens))
    return (*segments, (first, ens))


def in_flight(msgs: tuple[Msg, ...], kind: int, b: int, entry: int, rec: int | None = None) -> bool:
    for m in msgs:
        if m[0] == kind and m[1] == b and m[2] == entry and (rec is None or m[4] == rec):
            return True
    return False


def ledger_on(s: State, b: int, ledger: int) -> LedgerOnBookie:
    return s.b_ledgers[b][ledger]


def set_ledger_on(
    s: State, b: int, ledger: int, v: LedgerOnBookie
) -> tuple[tuple[LedgerOnBookie, ...], ...]:
    return set_at(s.b_ledgers, b, set_at(s.b_ledgers[b], ledger, v))


def _stored(s: State, b: int, ledger: int) -> int:
    """Entries a bookie holds for a ledger, synced or not."""
    synced, unsynced, _f, _lac = s.b_ledgers[b][ledger]
    return synced | unsynced


def segment_end(s: State, cfg: Config, ledger: int, idx: int) -> int:
    """Last entry id of segment ``idx``: the next segment's first - 1, or the ledger's last."""
    segs = s.meta_segments[ledger]
    if idx + 1 < len(segs):
        return segs[idx + 1][0] - 1
    if s.meta_status[ledger] == CLOSED:
        return s.meta_last[ledger]
    return cfg.entries - 1  # open: anything the writer may have written


def segment_is_closed(s: State, ledger: int, idx: int) -> bool:
    """A segment is closed when a later one exists or the ledger is CLOSED."""
    return idx + 1 < len(s.meta_segments[ledger]) or s.meta_status[ledger] == CLOSED


def auditor_node(s: State) -> int:
    """The node that is auditor now: it holds the leader znode and knows it, else -1."""
    epoch, node = s.meta_auditor
    if node >= 0 and s.au_leads[node] == epoch:
        return node
    return -1


# ------------------------------------------------------------------ initial state


def with_segments(cfg: Config, s: State, ledger: int, segs: Segments) -> State:
    """``s`` after a metadata write that gives ``ledger`` the segments ``segs``.

    A bookie the write names for the first time may have gone down after it
    was chosen; the auditor's audit of that loss read the old metadata, so
    the ledger is recorded in the ghost ``au_missed`` for the periodic bookie
    check.
    """
    missed = s.au_missed
    if cfg.autorecovery:
        before = {b for _f, ens in s.meta_segments[ledger] for b in ens}
        if any(s.b_up[b] != UP for _f, ens in segs for b in ens if b not in before):
            missed |= bit(ledger)
    return s._replace(meta_segments=set_at(s.meta_segments, ledger, segs), au_missed=missed)


def initial_state(cfg: Config) -> State:
    """Closed ledgers fully written on the first E bookies; the writer's ledger not yet created."""
    n_l = cfg.ledgers
    first_ens = tuple(range(cfg.ensemble))
    status = [CLOSED] * cfg.closed_ledgers
    segs: list[Segments] = [((0, first_ens),)] * cfg.closed_ledgers
    last = [cfg.closed_entries - 1] * cfg.closed_ledgers
    per_bookie: list[list[LedgerOnBookie]] = [[(0, 0, 0, -1)] * n_l for _ in range(cfg.bookies)]
    for ledger in range(cfg.closed_ledgers):
        for e in range(cfg.closed_entries):
            for p in write_set_positions(e, cfg.ensemble, cfg.write_quorum):
                m, u, f, lac = per_bookie[first_ens[p]][ledger]
                per_bookie[first_ens[p]][ledger] = (m | bit(e), u, f, max(lac, e - 1))
    signed = [[-2] * cfg.entries for _ in range(cfg.bookies)]
    w_status, w_segments = W_NONE, cast(Segments, ())
    w_next, w_lac, w_acks = 0, -1, (0,) * cfg.entries
    if cfg.writer and cfg.two_segments:
        # The writer confirmed e0 on b0..b2, then replaced b2 by b3 from e1 on.
        seg1 = tuple(b if b != cfg.ensemble - 1 else cfg.ensemble for b in first_ens)
        status.append(OPEN)
        segs.append(((0, first_ens), (1, seg1)))
        w_status, w_segments = W_OPEN, segs[-1]
        wl = len(status) - 1
        written = 0
        for p in write_set_positions(0, cfg.ensemble, cfg.write_quorum):
            per_bookie[first_ens[p]][wl] = (1, 0, 0, -1)
            signed[first_ens[p]][0] = -1
            written |= bit(first_ens[p])
        w_next, w_lac, w_acks = 1, 0, (written,) + (0,) * (cfg.entries - 1)
        last.append(-1)
    elif cfg.writer:
        if cfg.writer_ledger_created:
            status.append(OPEN)
            segs.append(((0, first_ens),))
            w_status, w_segments = W_OPEN, ((0, first_ens),)
            if cfg.first_entry_confirmed:  # e0 on its whole write set, confirmed
                wl = len(status) - 1
                written = 0
                for p in write_set_positions(0, cfg.ensemble, cfg.write_quorum):
                    per_bookie[first_ens[p]][wl] = (1, 0, 0, -1)
                    signed[first_ens[p]][0] = -1
                    written |= bit(first_ens[p])
                w_next, w_lac, w_acks = 1, 0, (written,) + (0,) * (cfg.entries - 1)
        else:
            status.append(NONE)
            segs.append(())
        last.append(-1)
    workers = cfg.workers if cfg.autorecovery else 0
    # Worker nodes run on the last bookies (outside the initial ensembles).
    wk = tuple((cfg.bookies - 1 - w, -1, 0, None) for w in range(workers))
    au_leads = tuple(1 if w == 0 else 0 for w in range(workers))
    return State(
        meta_status=tuple(status),
        meta_segments=tuple(segs),
        meta_last=tuple(last),
        meta_version=tuple(
            (2 if cfg.two_segments and i == cfg.writer_ledger else 1) if st != NONE else 0
            for i, st in enumerate(status)
        ),
        meta_task=((0, 0),) * n_l,
        meta_lock=(-1,) * n_l,
        meta_rereplicated=((),) * n_l,
        meta_autorecovery=1,
        meta_auditor=(1, 0) if workers else (0, -1),
        b_up=(UP,) * cfg.bookies,
        b_ledgers=tuple(tuple(x) for x in per_bookie),
        b_signed=tuple(tuple(x) for x in signed),
        w_status=w_status,
        w_version=(2 if cfg.two_segments else 1) if w_status == W_OPEN else 0,
        w_segments=w_segments,
        w_change=None,
        w_next=w_next,
        w_lac=w_lac,
        w_acks=w_acks,
        w_sent=w_acks,
        w_piggy=(-1,) * cfg.entries,
        rc=(idle_recovery(cfg),) * cfg.recovery_clients,
        rc_requested=0,
        rd=((RD_NONE, -1, 0, 0),) * cfg.readers,
        wk=wk,
        wk_seen=(0,) * len(wk),
        wk_unlocked=0,
        au_leads=au_leads,
        au_stale=0,
        au_missed=0,
        au_back=0,
        msgs=(),
        budget=budget_bounds(cfg),
    )


def budget_bounds(cfg: Config) -> tuple[int, ...]:
    """Each environment budget as the config bounds it, in ``B_*`` order: where it starts."""
    return tuple(getattr(cfg, name) for name in BUDGETS)


# ================================================================== WRITER ACTIONS


def writer_creates_ledger(cfg: Config, s: State, ens: tuple[int, ...]) -> State | None:
    """The writer creates its ledger: metadata OPEN with one segment on ``ens``.

    Key points: a metadata-only step; the ensemble is any E live bookies (the
    checker's symmetry makes every choice one). Guard first, then effect.
    """
    wl = cfg.writer_ledger
    if s.w_status != W_NONE or s.meta_status[wl] != NONE:
        # unreachable: next_states offers it only while the writer is NONE, and the writer's
        # ledger gets metadata only from this action (or starts with it, the writer OPEN).
        return None
    if any(s.b_up[b] != UP for b in ens):
        # unreachable: next_states offers only ensembles of live bookies (``_ensembles``).
        return None
    segs: Segments = ((0, ens),)
    return s._replace(
        meta_status=set_at(s.meta_status, wl, OPEN),
        meta_segments=set_at(s.meta_segments, wl, segs),
        meta_version=set_at(s.meta_version, wl, 1),
        w_status=W_OPEN,
        w_version=1,
        w_segments=segs,
    )


def writer_sends_add(cfg: Config, s: State) -> State | None:
    """The writer sends the next entry to its write set (round-robin striping).

    Key points: the add carries the writer's LAC (piggybacked, bookies store
    it), fixed for every later resend of the entry; at most ``cfg.pipeline``
    adds unconfirmed. An add made while an ensemble change waits for its CAS
    is signed at once (with the LAC, which the change holds) and queued: it
    is sent by ``writer_resends_add``, to the write set in the new ensemble.
    bkref's writer queues it so; BookKeeper's PendingAddOp sends it at once
    to the current ensemble and re-sends it to the replacement after the
    change. Found by trace validation (the spec used to disable adds during
    a change).
    """
    if s.w_status != W_OPEN or s.w_next >= cfg.entries:
        # unreachable: next_states offers it only while the writer is OPEN with an entry left.
        return None
    if s.w_next - s.w_lac > cfg.pipeline:  # at most `pipeline` adds unconfirmed
        # unreachable: next_states tests the pipeline bound first.
        return None
    e = s.w_next
    if s.w_change is not None:
        # Queued: signed now with the LAC, which is held until the change lands; it goes
        # out with ``writer_resends_add`` to the write set of the new ensemble.
        return s._replace(w_next=e + 1, w_piggy=set_at(s.w_piggy, e, s.w_lac))
    ws = last_ensemble_write_set(cfg, s.w_segments, e)
    new = tuple((ADD, b, e, s.w_lac, 0) for b in bookies_of(ws))
    return s._replace(
        w_next=e + 1,
        w_sent=set_at(s.w_sent, e, ws),
        w_piggy=set_at(s.w_piggy, e, s.w_lac),
        msgs=send(s.msgs, *new),
    )


# The mutant acks-from-replaced-bookie-count (apache/bookkeeper#4651).
ACKS_BY_INDEX = "acks-from-replaced-bookie-count"


def _writer_view(s: State) -> Segments:
    return s.w_change if s.w_change is not None else s.w_segments


def _writer_lac(cfg: Config, s: State, acks: tuple[int, ...], view: Segments) -> int:
    # Counted from the LAC on, the only entries contiguous_confirmed reads: an answer costs
    # the same at any length of the ledger (the trace check replays ledgers of 10^5 entries).
    first = s.w_lac + 1
    counts = tuple(popcount(acks[e] & write_set(cfg, view, e)) for e in range(first, s.w_next))
    return first + contiguous_confirmed(-1, counts, cfg.ack_quorum)


def writer_receives_add_response(cfg: Config, s: State, b: int, e: int, ok: int) -> State:
    """The writer takes a bookie's answer to an add (in the bookie's step).

    Key points: a success counts only from a bookie of the entry's current
    write set; the LAC advances over the contiguous prefix at Aq, but not
    while an ensemble change waits for its CAS (acks are held). A fenced
    answer means a recovery has begun: the writer withdraws, unless the
    answer no longer concerns it: the entry is already confirmed, or the
    bookie is not in the entry's write set in the metadata the writer wrote
    (replaced since). BookKeeper ignores such errors too (PendingAddOp).
    """
    if s.w_status != W_OPEN:
        return s  # a late answer to a writer that is done
    if not ok:
        if e <= s.w_lac or not write_set(cfg, s.w_segments, e) & bit(b):
            return s
        return s._replace(w_status=W_WITHDRAWN)
    view = _writer_view(s)
    counted = write_set(cfg, view, e)
    if s.w_change is not None and ACKS_BY_INDEX in cfg.mutants:
        counted |= write_set(cfg, s.w_segments, e)  # the replaced bookie's index still counts
    if not counted & bit(b):
        return s
    acks = set_at(s.w_acks, e, s.w_acks[e] | bit(b))
    lac = s.w_lac
    if s.w_change is None or "acks-before-ensemble-change-lands" in cfg.mutants:
        lac = _writer_lac(cfg, s, acks, view)
    return s._replace(w_acks=acks, w_lac=lac)


def _writer_timed_out(cfg: Config, s: State, b: int) -> bool:
    """An add to ``b`` is unanswered and nothing is in flight for it: a timeout."""
    view = _writer_view(s)
    for e in range(s.w_lac + 1, s.w_next):
        if write_set(cfg, view, e) & s.w_sent[e] & ~s.w_acks[e] & bit(b) and not in_flight(
            s.msgs, ADD, b, e, 0
        ):
            return True
    return False


def writer_changes_ensemble(cfg: Config, s: State, failed: int, new: int) -> State | None:
    """The writer replaces a bookie whose add timed out and CASes the metadata.

    Key points: the new segment starts at LAC + 1 (replacing the last one if
    it starts there); the failed bookie's acks of unconfirmed entries are
    dropped; the CAS is in flight until ``writer_completes_ensemble_change``,
    and until then acks are held.
    """
    if s.w_status != W_OPEN or s.w_change is not None:
        # unreachable: next_states offers it only while the writer is OPEN with no change in
        # flight.
        return None
    last_ens = s.w_segments[-1][1]
    if failed not in last_ens or new in last_ens or s.b_up[new] != UP:
        # unreachable: next_states offers only a bookie of the last ensemble, and a live one
        # outside it.
        return None
    if not _writer_timed_out(cfg, s, failed):
        # unreachable: next_states offers it only for a bookie that timed out (the same test).
        return None
    first = s.w_lac + 1
    change = with_segment_change(s.w_segments, first, failed, new)
    # The new bookie gets every unconfirmed entry once the change lands, even one sent to it
    # before under another index (BookKeeper re-sends by index: unsetSuccessAndSendWriteRequest).
    sent = _without_acks_of(_without_acks_of(s.w_sent, failed, first), new, first)
    if ACKS_BY_INDEX in cfg.mutants:
        # unreachable: only the mutant acks-from-replaced-bookie-count keeps the failed
        # bookie's acks until after the CAS, and coverage checks the correct spec.
        return s._replace(w_change=change, w_sent=sent)
    return s._replace(
        w_change=change, w_acks=_without_acks_of(s.w_acks, failed, first), w_sent=sent
    )


def _without_acks_of(acks: tuple[int, ...], b: int, first: int) -> tuple[int, ...]:
    """``acks`` with ``b``'s acks of entries ``first`` and later dropped."""
    return tuple(a & ~bit(b) if e >= first else a for e, a in enumerate(acks))


def writer_resends_add(cfg: Config, s: State, e: int, b: int) -> State | None:
    """The writer sends a pending entry to a bookie that joined its write set.

    Key points: after an ensemble change, unconfirmed entries go to the
    replacement bookie once the change's CAS has landed, as BookKeeper's do
    (``LedgerHandle.ensembleChangeLoop`` calls ``unsetSuccessAndSendWriteRequest``
    after the metadata update succeeds; apache/bookkeeper 9590a97f), and
    bkref's. The mutant ``acks-before-ensemble-change-lands`` sends them while
    it is in flight and counts their acks (BOOKKEEPER-1591). The resend
    carries the LAC of the entry's first send, not the writer's current
    one: the entry was signed once, and BookKeeper's PendingAddOp re-sends
    the same buffer (with more than one add in flight the two LACs differ).
    """
    if s.w_status != W_OPEN or not s.w_lac < e < s.w_next:
        # unreachable: next_states offers it only for w_lac < e < w_next while the writer is
        # OPEN.
        return None
    if s.w_change is not None and "acks-before-ensemble-change-lands" not in cfg.mutants:
        # unreachable: next_states offers it while a change is in flight only under the mutant
        # acks-before-ensemble-change-lands, and coverage checks the correct spec.
        return None
    ws = write_set(cfg, _writer_view(s), e)
    if not ws & bit(b) or s.w_sent[e] & bit(b):
        return None
    return s._replace(
        w_sent=set_at(s.w_sent, e, s.w_sent[e] | bit(b)),
        msgs=send(s.msgs, (ADD, b, e, s.w_piggy[e], 0)),
    )


def writer_completes_ensemble_change(cfg: Config, s: State) -> State | None:
    """The ensemble-change CAS lands: the metadata gets the new segments.

    Key points: a version conflict with the ledger still OPEN (a worker
    swapped a bookie of a closed segment) is resolved by re-reading: the
    earlier segments come from the store, the tail from the writer. If the
    ledger is no longer OPEN (recovery began), the writer withdraws. The
    held acks are released: the LAC catches up.
    """
    if s.w_status != W_OPEN or s.w_change is None:
        # unreachable: next_states offers it only while the writer is OPEN with a change in
        # flight.
        return None
    wl = cfg.writer_ledger
    if s.meta_status[wl] != OPEN:
        return s._replace(w_status=W_WITHDRAWN, w_change=None)
    n = len(s.w_segments)
    merged = s.meta_segments[wl][: n - 1] + s.w_change[n - 1 :]
    if "ensemble-change-undoes-swap" in cfg.mutants:
        merged = s.w_change  # its own view of the earlier segments too (not a merge)
    version = s.meta_version[wl] + 1
    s2 = with_segments(cfg, s, wl, merged)._replace(
        meta_version=set_at(s.meta_version, wl, version),
        w_version=version,
        w_segments=merged,
        w_change=None,
    )
    if ACKS_BY_INDEX in cfg.mutants:
        # The mutant's order (BookKeeper's LedgerHandle today): the change is marked done
        # and the held completions released, counting acks by write-set index, before the
        # replaced bookie's acks are unset; entries confirmed so are never resent.
        lac = _writer_lac(cfg, s2, s2.w_acks, s.w_segments)
        (failed,) = set(s.w_segments[-1][1]) - set(merged[-1][1])
        acks = _without_acks_of(s2.w_acks, failed, lac + 1)
        # unreachable: only under the mutant acks-from-replaced-bookie-count, and coverage
        # checks the correct spec.
        return s2._replace(
            w_acks=acks, w_lac=_writer_lac(cfg, s2._replace(w_lac=lac), acks, merged)
        )
    return s2._replace(w_lac=_writer_lac(cfg, s2, s2.w_acks, merged))


def writer_closes_ledger(cfg: Config, s: State) -> State | None:
    """The writer closes its ledger by CAS: CLOSED, last entry = its LAC.

    Key points: only if the ledger is still OPEN in the store; otherwise the
    writer learns it is being recovered and withdraws, or, if a recovery
    already closed it at the writer's own LAC, takes that close as its own
    (BookKeeper's close succeeds on a ledger closed at the same last entry).
    """
    if s.w_status != W_OPEN or s.w_change is not None:
        # unreachable: next_states offers it only while the writer is OPEN with no change in
        # flight.
        return None
    wl = cfg.writer_ledger
    if s.meta_status[wl] != OPEN:
        if s.meta_status[wl] == CLOSED and s.meta_last[wl] == s.w_lac:
            return s._replace(w_status=W_CLOSED, w_version=s.meta_version[wl])
        return s._replace(w_status=W_WITHDRAWN)
    version = s.meta_version[wl] + 1
    return s._replace(
        meta_status=set_at(s.meta_status, wl, CLOSED),
        meta_last=set_at(s.meta_last, wl, s.w_lac),
        meta_version=set_at(s.meta_version, wl, version),
        w_status=W_CLOSED,
        w_version=version,
    )


# ================================================================== BOOKIE ACTIONS


def _handled(s: State, m: Msg, reply_lost: int, **changes: object) -> State | None:
    """Consume request ``m`` and apply ``changes``; a lost reply spends one message loss."""
    if reply_lost:
        if s.budget[B_LOSS] == 0:
            return None
        changes["budget"] = set_at(s.budget, B_LOSS, s.budget[B_LOSS] - 1)
    return _replace_fast(s, msgs=consume(s.msgs, m), **changes)


def bookie_handles_add(cfg: Config, s: State, m: Msg, reply_lost: int) -> State | None:
    """A bookie handles an add: stores the entry and acknowledges, or answers fenced.

    Key points: a fenced ledger rejects the writer's adds but accepts
    recovery adds. The journal is synced before the reply (one step), so an
    acknowledged entry survives a crash; the mutant ``ack-before-fsync``
    replies first and keeps the entry unsynced. The answer goes to the
    writer or the recovery client, unless it is lost.
    """
    kind, b, e, lac, rec = m
    if kind != ADD or s.b_up[b] not in SERVING:
        # unreachable: next_states hands a request only to its kind's handler, and only while
        # its bookie is up.
        return None
    wl = cfg.writer_ledger
    synced, unsynced, fenced, b_lac = ledger_on(s, b, wl)
    ok = 1
    if fenced and not rec:
        ok = 0
        t = _handled(s, m, reply_lost)
    else:
        if "ack-before-fsync" in cfg.mutants and not synced & bit(e):
            unsynced |= bit(e)
        else:
            synced |= bit(e)
        stored = (synced, unsynced, fenced, max(b_lac, lac))
        t = _handled(
            s,
            m,
            reply_lost,
            b_ledgers=set_ledger_on(s, b, wl, stored),
            b_signed=set_at(s.b_signed, b, set_at(s.b_signed[b], e, lac)),
        )
    if t is None:
        # unreachable: ``_handled`` refuses only a lost reply with no loss left, and next_states
        # offers a lost reply only while a loss is left.
        return None
    if reply_lost or rec == ORPHAN:
        return t
    if rec:
        return recovery_client_receives_add_response(cfg, t, rec - 1, b, e)
    return writer_receives_add_response(cfg, t, b, e, ok)


def bookie_syncs_journal(cfg: Config, s: State, b: int) -> State | None:
    """A bookie's journal fsync makes its unsynced entries durable (mutant runs only)."""
    wl = cfg.writer_ledger
    synced, unsynced, fenced, lac = ledger_on(s, b, wl)
    if s.b_up[b] not in SERVING or not unsynced:
        # unreachable: next_states offers it only for a live bookie with unsynced entries.
        return None
    # unreachable: no entry is ever unsynced in the correct spec (``bookie_handles_add`` syncs
    # before it answers); only the mutant ack-before-fsync leaves one, and coverage
    # checks the correct spec.
    return s._replace(b_ledgers=set_ledger_on(s, b, wl, (synced | unsynced, 0, fenced, lac)))


def bookie_handles_fencing_lac_read(cfg: Config, s: State, m: Msg, reply_lost: int) -> State | None:
    """A bookie fences the ledger and answers with its LAC.

    Key points: fencing works for a ledger the bookie has never seen (it must,
    or the old writer could still write to it); the fence is durable.
    """
    kind, b, _e, _a, c = m
    if kind != FENCE or s.b_up[b] not in SERVING:
        # unreachable: next_states hands a request only to its kind's handler, and only while
        # its bookie is up.
        return None
    wl = cfg.writer_ledger
    synced, unsynced, _f, lac = ledger_on(s, b, wl)
    t = _handled(s, m, reply_lost, b_ledgers=set_ledger_on(s, b, wl, (synced, unsynced, 1, lac)))
    if t is None:
        # unreachable: ``_handled`` refuses only a lost reply with no loss left, and next_states
        # offers a lost reply only while a loss is left.
        return None
    # An orphan's answer (a duplicate of a request of an attempt that gave up) goes nowhere.
    unheard = reply_lost or c == ORPHAN
    return t if unheard else recovery_client_receives_fencing_response(cfg, t, c, b, lac)


def bookie_handles_recovery_read(cfg: Config, s: State, m: Msg, reply_lost: int) -> State | None:
    """A bookie answers a recovery read (found or NoSuchEntry), fencing first if asked."""
    kind, b, e, fence, c = m
    if kind != READ or s.b_up[b] not in SERVING:
        # unreachable: next_states hands a request only to its kind's handler, and only while
        # its bookie is up.
        return None
    wl = cfg.writer_ledger
    synced, unsynced, fenced, lac = ledger_on(s, b, wl)
    found = 1 if (synced | unsynced) & bit(e) else 0
    stored = (synced, unsynced, fenced | fence, lac)
    t = _handled(s, m, reply_lost, b_ledgers=set_ledger_on(s, b, wl, stored))
    if t is None:
        # unreachable: ``_handled`` refuses only a lost reply with no loss left, and next_states
        # offers a lost reply only while a loss is left.
        return None
    unheard = reply_lost or c == ORPHAN
    return t if unheard else recovery_client_receives_read_response(cfg, t, c, b, e, found=found)


def _drop_messages_of(msgs: tuple[Msg, ...], b: int) -> tuple[Msg, ...]:
    return tuple(m for m in msgs if m[1] != b)


def bookie_crashes(cfg: Config, s: State, b: int) -> State | None:
    """A bookie crashes: its connections drop (messages to and from it are lost).

    Key points: unsynced entries are lost (none exist in the correct spec);
    fences survive, as the journal holds them; its registration disappears,
    which the auditor notices. The mutant ``fence-lost-on-restart`` forgets
    fences (BOOKKEEPER-500: before its fix, a fence lived only in memory).
    """
    if s.b_up[b] not in SERVING or s.budget[B_CRASH] == 0:
        # unreachable: next_states offers it only for a live bookie while a crash is left.
        return None
    keep = 0 if "fence-lost-on-restart" in cfg.mutants else 1
    ledgers = tuple((sy, 0, f & keep, lac) for sy, _u, f, lac in s.b_ledgers[b])
    signed = s.b_signed[b]
    if cfg.writer and s.b_ledgers[b][cfg.writer_ledger][1]:  # unsynced entries are gone
        synced = s.b_ledgers[b][cfg.writer_ledger][0]
        signed = tuple(x if synced >> e & 1 else -2 for e, x in enumerate(signed))
    return s._replace(
        b_up=set_at(s.b_up, b, DOWN),
        b_ledgers=set_at(s.b_ledgers, b, ledgers),
        b_signed=set_at(s.b_signed, b, signed),
        # an unregistered bookie's crash changes no registration
        au_stale=1 if cfg.autorecovery and s.b_up[b] == UP else s.au_stale,
        au_back=s.au_back & ~bit(b),  # a bookie not up is marked lost as it is
        msgs=_drop_messages_of(s.msgs, b),
        budget=set_at(s.budget, B_CRASH, s.budget[B_CRASH] - 1),
    )


def bookie_restarts(cfg: Config, s: State, b: int) -> State | None:
    """A crashed bookie restarts with its synced data: entries, fences and LACs (journal replay)."""
    if not cfg.restarts or s.b_up[b] != DOWN:
        # unreachable: next_states offers it only for a DOWN bookie, in a config with restarts.
        return None
    return _back(cfg, s, b)


def _back(cfg: Config, s: State, b: int) -> State:
    """``s`` with bookie ``b`` registered (UP): a registration change the auditor audits."""
    if not cfg.autorecovery:
        return s._replace(b_up=set_at(s.b_up, b, UP))
    return s._replace(b_up=set_at(s.b_up, b, UP), au_stale=1, au_back=s.au_back | bit(b))


def bookie_restarts_with_wiped_disk(cfg: Config, s: State, b: int) -> State | None:
    """A crashed bookie restarts on an empty disk.

    Key points: the cookie in the metadata store no longer matches, so the
    bookie refuses to start (REFUSED: it stays out until an operator gives it
    a new identity). The mutant ``wiped-bookie-rejoins`` skips the cookie
    check: the bookie rejoins with no entries and no fences.
    """
    if s.b_up[b] != DOWN or s.budget[B_WIPE] == 0:
        # unreachable: next_states offers it only for a DOWN bookie while a wipe is left.
        return None
    empty = ((0, 0, 0, -1),) * cfg.ledgers
    up = UP if "wiped-bookie-rejoins" in cfg.mutants else REFUSED
    return s._replace(
        b_up=set_at(s.b_up, b, up),
        b_ledgers=set_at(s.b_ledgers, b, empty),
        b_signed=set_at(s.b_signed, b, (-2,) * len(s.b_signed[b])),
        au_stale=1 if cfg.autorecovery and up == UP else s.au_stale,
        au_back=s.au_back | bit(b) if cfg.autorecovery and up == UP else s.au_back,
        budget=set_at(s.budget, B_WIPE, s.budget[B_WIPE] - 1),
    )


def bookie_loses_session(cfg: Config, s: State, b: int) -> State | None:
    """A running bookie's ZooKeeper session expires (a long pause, a partition from
    ZooKeeper alone): its registration goes with it, and it serves on, unregistered.

    Key points: the auditor sees a lost bookie and marks its ledgers; a worker's
    checker takes it for unavailable and copies its fragments elsewhere
    (``LedgerChecker.verifyLedgerFragment`` asks ``BookieWatcherImpl.isBookieUnavailable``,
    which reads the registrations; apache/bookkeeper 9590a97f), while the writer's
    adds, fencing and reads still reach it. Nothing of what it stored or fenced
    changes. It registers again when its client has a new session
    (``bookie_registers_again``; ``BookieStateManager``'s registration listener).
    """
    if s.b_up[b] != UP or s.budget[B_SESSION] == 0:
        # unreachable: next_states offers it only for a registered bookie while one is left.
        return None
    return s._replace(
        b_up=set_at(s.b_up, b, UNREGISTERED),
        au_stale=1 if cfg.autorecovery else 0,
        au_back=s.au_back & ~bit(b),
        budget=set_at(s.budget, B_SESSION, s.budget[B_SESSION] - 1),
    )


def bookie_registers_again(cfg: Config, s: State, b: int) -> State | None:
    """An unregistered bookie registers under a new session (weakly fair: ZooKeeper comes
    back). The auditor sees the registration change, as at a restart."""
    if s.b_up[b] != UNREGISTERED:
        # unreachable: next_states offers it only for an unregistered bookie.
        return None
    return _back(cfg, s, b)


# ================================================================== NETWORK ACTIONS


def network_loses_message(cfg: Config, s: State, m: Msg) -> State | None:
    """The network drops an add in flight (the sender will time out).

    Key points: only adds are lost. A lost fencing LAC read or recovery read
    is sent again by the recovery client (``recovery_client_retries_request``),
    which is the same as a delayed one: modelling their loss adds states but
    no behaviour. A lost add leads to an ensemble change instead.
    """
    if s.budget[B_LOSS] == 0 or m[0] != ADD:
        # unreachable: next_states offers it only for an add while a loss is left.
        return None
    return s._replace(
        msgs=consume(s.msgs, m), budget=set_at(s.budget, B_LOSS, s.budget[B_LOSS] - 1)
    )


def network_duplicates_message(cfg: Config, s: State, m: Msg) -> State | None:
    """The network delivers a message twice."""
    if s.budget[B_DUP] == 0:
        # unreachable: next_states offers it only while a duplicate is left.
        return None
    return s._replace(msgs=send(s.msgs, m), budget=set_at(s.budget, B_DUP, s.budget[B_DUP] - 1))


# ================================================================== RECOVERY CLIENT ACTIONS


def recovery_client_starts_recovery(cfg: Config, s: State, c: int) -> State | None:
    """A client opens the writer's ledger with recovery.

    Key points: metadata OPEN -> IN_RECOVERY by CAS (the writer's next CAS
    fails); a ledger already IN_RECOVERY (another client's recovery) is
    recovered as it is, with no write, as BookKeeper's recovery open does; a
    fencing LAC read goes to every bookie of the last segment. In
    AutoRecovery configs only a replication worker starts it (after the
    open ledger's grace period).
    """
    wl = cfg.writer_ledger
    r = recovery_of(s, c)
    if r.phase != RC_IDLE or s.meta_status[wl] not in (OPEN, IN_RECOVERY):
        return None
    if not (cfg.recovery_client or s.rc_requested):
        return None
    segs = s.meta_segments[wl]
    version = s.meta_version[wl]
    if s.meta_status[wl] == OPEN:
        version += 1
    fences = tuple((FENCE, b, -1, 0, c) for b in segs[-1][1])
    r = r._replace(
        phase=RC_FENCING, version=version, segments=segs, read_segments=segs, base=len(segs) - 1
    )
    return s._replace(
        meta_status=set_at(s.meta_status, wl, IN_RECOVERY),
        meta_version=set_at(s.meta_version, wl, version),
        rc=with_recovery(s, c, r),
        msgs=send(s.msgs, *fences),
    )


def _read_segments(cfg: Config, r: Recovery) -> Segments:
    """The segments recovery reads from and counts negatives in: as they were when it
    began, not as its own ensemble changes made them (the mutant reads the latter)."""
    if "recovery-reads-from-new-ensemble" in cfg.mutants:
        return r.segments
    return r.read_segments


def _read_requests(cfg: Config, r: Recovery, c: int, e: int) -> tuple[Msg, ...]:
    fence = 0 if "recovery-reads-without-fence" in cfg.mutants else 1
    segs = _read_segments(cfg, r)
    return tuple((READ, b, e, fence, c) for b in bookies_of(write_set(cfg, segs, e)))


def recovery_client_receives_fencing_response(
    cfg: Config, s: State, c: int, b: int, lac: int
) -> State:
    """The recovery client notes a bookie fenced and its LAC; late answers are dropped."""
    r = recovery_of(s, c)
    if r.phase != RC_FENCING:
        return s
    r = r._replace(fenced=r.fenced | bit(b), max_lac=max(r.max_lac, lac))
    return s._replace(rc=with_recovery(s, c, r))


def recovery_client_completes_fencing(cfg: Config, s: State, c: int) -> State | None:
    """Fencing covers the last ensemble: reading starts at the last confirmed entry.

    Key points: fencing is complete when every write set of the last ensemble
    has Wq - Aq + 1 fenced bookies (no ack quorum left unfenced). Entries
    before max(LAC + 1, first entry of the last segment) are confirmed (earlier
    segments are committed); recovery writes back only from there. It reads
    the confirmed entry just before it first (bkref learns the ledger's exact
    length from that entry's header; BookKeeper reads from LAC + 1 and takes
    the length from the fencing answers, inexactly when the ledger ends at
    the LAC). Each recovery read also fences.
    """
    r = recovery_of(s, c)
    if r.phase != RC_FENCING:
        # unreachable: next_states offers it only while the recovery client is FENCING.
        return None
    ens = r.segments[-1][1]
    positions = sum(bit(p) for p, b in enumerate(ens) if r.fenced & bit(b))
    if not fencing_covers_ensemble(positions, cfg.ensemble, cfg.write_quorum, cfg.ack_quorum):
        return None
    if "recovery-from-lac-minus-one" in cfg.mutants:
        start = r.max_lac + 1
    else:
        start = recovery_start_entry(r.max_lac, r.segments[-1][0])
    first = max(start - 1, 0)
    r = r._replace(phase=RC_READING, reading=first, lac=start - 1, max_lac=start - 1)
    return s._replace(
        rc=with_recovery(s, c, r), msgs=send(s.msgs, *_read_requests(cfg, r, c, first))
    )


def recovery_client_receives_read_response(
    cfg: Config, s: State, c: int, b: int, e: int, *, found: int
) -> State:
    """The recovery client decides about the entry it reads.

    Key points: one positive answer makes the entry recoverable: it is
    written back with recovery adds to its write set in the last ensemble
    (with the recovery's own ensemble changes) and the next entry is read.
    Negatives decide only with quorum coverage of the write set (Wq - Aq + 1)
    in the segments as they were when recovery began: then the previous entry
    is the last. The confirmed entry read first is not written back, and
    negatives about it end the ledger at it, never before (a confirmed entry
    stays in the ledger even if copies of it were lost). Answers for other
    entries are dropped. A write-back carries the LAC recovery started from
    (LC), not the recovery's own LAC: with two recoveries racing, a LAC that
    grew with one's write-backs can pass the last entry the other closes the
    ledger at, and a tailing reader returns the entry (BookKeeper's recovery
    adds carry the handle's growing LAC: the mutant
    ``recovery-piggybacks-its-own-lac``, docs/findings/two-recoveries.md).
    """
    r = recovery_of(s, c)
    if r.phase != RC_READING or e != r.reading:
        return s
    if e <= r.lac and found:  # the confirmed entry: its length, no write-back
        r = r._replace(reading=e + 1, negative=0)
        return s._replace(
            rc=with_recovery(s, c, r), msgs=send(s.msgs, *_read_requests(cfg, r, c, e + 1))
        )
    if found:
        ws = last_ensemble_write_set(cfg, r.segments, e)
        # The write-back carries the LAC recovery started from, never its own: a LAC that
        # grew with its write-backs can pass the last entry of a close by another client.
        lac = r.lac if "recovery-piggybacks-its-own-lac" in cfg.mutants else r.max_lac
        adds = tuple((ADD, x, e, lac, c + 1) for x in bookies_of(ws))
        r = r._replace(
            sent=set_at(r.sent, e, ws),
            piggy=set_at(r.piggy, e, lac),
            reading=e + 1,
            negative=0,
        )
        return s._replace(
            rc=with_recovery(s, c, r),
            msgs=send(s.msgs, *adds, *_read_requests(cfg, r, c, e + 1)),
        )
    neg = r.negative | bit(b)
    count = popcount(neg & write_set(cfg, _read_segments(cfg, r), e))
    if "negative-read-without-coverage" in cfg.mutants:
        decided = count >= 1
    else:
        decided = has_quorum_coverage(count, cfg.write_quorum, cfg.ack_quorum)
    if not decided:
        return s._replace(rc=with_recovery(s, c, r._replace(negative=neg)))
    r = r._replace(phase=RC_WRITING, negative=0, last=max(e - 1, r.lac))
    return s._replace(rc=with_recovery(s, c, r))


def recovery_client_retries_request(cfg: Config, s: State, c: int, b: int) -> State | None:
    """A fencing LAC read or recovery read to a live bookie was lost: it is sent again."""
    if s.b_up[b] not in SERVING:
        # unreachable: ``_emit_retries`` offers only live bookies.
        return None
    r = recovery_of(s, c)
    if r.phase == RC_FENCING:
        if not ensemble_mask(r.segments[-1][1]) & bit(b) & ~r.fenced:
            # unreachable: ``_emit_retries`` offers only unfenced bookies of the last ensemble.
            return None
        if in_flight(s.msgs, FENCE, b, -1, c):
            return None
        return s._replace(msgs=send(s.msgs, (FENCE, b, -1, 0, c)))
    if r.phase == RC_READING:
        e = r.reading
        if not write_set(cfg, _read_segments(cfg, r), e) & bit(b) & ~r.negative:
            # unreachable: ``_emit_retries`` offers only bookies of the entry's write set
            # without a negative answer.
            return None
        if in_flight(s.msgs, READ, b, e, c):
            return None
        fence = 0 if "recovery-reads-without-fence" in cfg.mutants else 1
        return s._replace(msgs=send(s.msgs, (READ, b, e, fence, c)))
    # unreachable: next_states offers it only while the recovery client is FENCING or READING.
    return None


def recovery_client_gives_up(cfg: Config, s: State, c: int) -> State | None:
    """Error answers leave the recovery client unable to decide: it fails, and may start again.

    Key points: a request to a bookie that is down fails at once (its
    connection is refused). While fencing, every bookie of the last ensemble
    has answered or failed and the answers do not cover the ensemble; while
    reading, every bookie of the entry's write set has answered NoSuchEntry
    or failed, too few to prove the entry absent. The recovery fails, as
    BookKeeper's does (apache/bookkeeper 9590a97f): ``ReadLastConfirmedOp.
    readEntryComplete`` reports the last error once no response is pending
    and the coverage set is not covered, and ``LedgerRecoveryOp.initiate``
    fails the open; ``PendingReadOp.ParallelReadRequest.logErrorAndReattemptRead``
    fails an entry read with its first error once every replica answered
    without Wq - Aq + 1 NoSuchEntry, and ``LedgerRecoveryOp.onEntryComplete``
    fails the open on any error but NoSuchEntry and NoSuchLedger. bkref's
    ``LedgerRecovery`` fails on the same two conditions. The ledger stays
    IN_RECOVERY; the client (the application opening it again, or a worker's
    next attempt) may start a new recovery, which recovers it as it is. The
    failed attempt's requests to live bookies are still delivered (a fencing
    read still fences, a write-back still stores its entry), but nobody hears
    the answers (ORPHAN). A write-back that fails with no bookie to replace
    it also fails a recovery in both; the spec's write-back waits instead.
    """
    if s.budget[B_GIVE_UP] == 0:
        # unreachable: next_states offers it only while a give-up is left.
        return None
    r = recovery_of(s, c)
    up = s.b_up
    if r.phase == RC_FENCING:
        ens = r.segments[-1][1]
        unanswered = ensemble_mask(ens) & ~r.fenced
        positions = sum(bit(p) for p, b in enumerate(ens) if r.fenced & bit(b))
        if fencing_covers_ensemble(positions, cfg.ensemble, cfg.write_quorum, cfg.ack_quorum):
            return None  # fencing is complete: the client reads on
    elif r.phase == RC_READING:
        unanswered = write_set(cfg, _read_segments(cfg, r), r.reading) & ~r.negative
    else:
        # unreachable: next_states offers it only while the recovery client is FENCING or
        # READING.
        return None
    if not unanswered or any(up[b] in SERVING for b in bookies_of(unanswered)):
        return None  # an answer may still come
    msgs = []
    for m in s.msgs:
        if m[4] != (c + 1 if m[0] == ADD else c):
            msgs.append(m)
        elif up[m[1]] in SERVING:
            msgs.append((m[0], m[1], m[2], m[3], ORPHAN))
    return s._replace(
        rc=with_recovery(s, c, Recovery._make(idle_recovery(cfg))),
        msgs=tuple(sorted(msgs)),
        budget=set_at(s.budget, B_GIVE_UP, s.budget[B_GIVE_UP] - 1),
    )


def _rc_lac(cfg: Config, r: Recovery, acks: tuple[int, ...]) -> int:
    top = r.reading if r.phase == RC_READING else r.last + 1
    counts = tuple(
        popcount(acks[e] & last_ensemble_write_set(cfg, r.segments, e)) if e < top else 0
        for e in range(len(acks))
    )
    return contiguous_confirmed(r.lac, counts, cfg.ack_quorum)


def recovery_client_receives_add_response(cfg: Config, s: State, c: int, b: int, e: int) -> State:
    """The recovery client counts an acknowledged recovery add (recovery adds are never fenced)."""
    r = recovery_of(s, c)
    if r.phase not in (RC_READING, RC_WRITING):
        return s
    if not last_ensemble_write_set(cfg, r.segments, e) & bit(b):
        return s
    acks = set_at(r.acks, e, r.acks[e] | bit(b))
    return s._replace(rc=with_recovery(s, c, r._replace(acks=acks, lac=_rc_lac(cfg, r, acks))))


def _rc_timed_out(cfg: Config, s: State, c: int, r: Recovery, b: int) -> bool:
    """A recovery add of client ``c`` (whose variables are ``r``) to ``b`` is unanswered
    and not in flight: a timeout."""
    for e in range(len(r.sent)):
        if last_ensemble_write_set(cfg, r.segments, e) & r.sent[e] & ~r.acks[e] & bit(
            b
        ) and not in_flight(s.msgs, ADD, b, e, c + 1):
            return True
    return False


def recovery_client_changes_ensemble(
    cfg: Config, s: State, c: int, failed: int, new: int
) -> State | None:
    """A recovery add timed out: the recovery client replaces the bookie locally.

    Key points: the new segment starts after the recovery client's own
    confirmed prefix (never before the recovery start); the change is only
    written to the store with the close, so a failed recovery leaves no trace.
    Once every write-back is at ack quorum the close is decided, and a later
    timeout changes nothing: BookKeeper's LedgerRecoveryOp starts
    ``closeRecovered`` from the last write-back's ``addComplete``, and a
    failure handled after that reaches the close only if its metadata
    transform has not run yet (``ReadOnlyLedgerHandle.handleBookieFailure``
    records ``newEnsemblesFromRecovery``; apache/bookkeeper 9590a97f); the
    spec takes the order where it has, as bkref's recovery does (its close is
    computed at that moment).
    """
    r = recovery_of(s, c)
    if r.phase not in (RC_READING, RC_WRITING):
        # unreachable: next_states offers it only while the recovery client is READING or
        # WRITING.
        return None
    if r.phase == RC_WRITING and r.lac >= r.last:
        # unreachable: next_states offers it only before every write-back is at ack quorum.
        return None
    last_ens = r.segments[-1][1]
    if failed not in last_ens or new in last_ens or s.b_up[new] != UP:
        # unreachable: next_states offers only a bookie of the last ensemble, and a live one
        # outside it.
        return None
    if not _rc_timed_out(cfg, s, c, r, failed):
        # unreachable: next_states offers it only for a bookie that timed out (the same test).
        return None
    first = r.lac + 1
    segs = with_segment_change(r.segments, first, failed, new)
    acks = _without_acks_of(r.acks, failed, first)
    return s._replace(rc=with_recovery(s, c, r._replace(segments=segs, acks=acks)))


def recovery_client_resends_add(cfg: Config, s: State, c: int, e: int, b: int) -> State | None:
    """The recovery client writes a recovered entry to a bookie that joined its write set.

    Key points: the add carries the LAC of the entry's first send, as the
    writer's resend does (``writer_resends_add``): BookKeeper's recovery adds
    are pending adds of the recovery's handle, signed once.
    """
    r = recovery_of(s, c)
    if r.phase not in (RC_READING, RC_WRITING) or not r.sent[e]:
        # unreachable: next_states offers it only while READING or WRITING, for an entry already
        # sent.
        return None
    ws = last_ensemble_write_set(cfg, r.segments, e)
    if not ws & bit(b) or r.sent[e] & bit(b):
        # unreachable: next_states offers only write-set bookies the entry was not sent to.
        return None
    r = r._replace(sent=set_at(r.sent, e, r.sent[e] | bit(b)))
    add = (ADD, b, e, r.piggy[e], c + 1)
    return s._replace(rc=with_recovery(s, c, r), msgs=send(s.msgs, add))


def recovery_client_closes_ledger(cfg: Config, s: State, c: int) -> State | None:
    """Recovery is over: CLOSED by CAS with the last recovered entry and its segments.

    Key points: all written-back entries reached Aq. A version conflict with
    the ledger still IN_RECOVERY (a worker swapped a bookie of an earlier,
    closed segment) is merged: earlier segments from the store, the rest from
    the recovery client. A ledger another recovery client closed meanwhile is
    re-read and left as it is: this recovery is done and reports the stored
    last entry, whatever it recovered itself. That is BookKeeper's
    ``ReadOnlyLedgerHandle.closeRecovered`` (9590a97): its ``MetadataUpdateLoop``
    re-reads the metadata on the version conflict, ``setLedgerMetadata`` sets
    the handle's LAC to the stored last entry, and the loop's predicate (state
    IN_RECOVERY) no longer holds, so it completes without a write.
    """
    wl = cfg.writer_ledger
    r = recovery_of(s, c)
    if r.phase != RC_WRITING:
        # unreachable: next_states offers it only while WRITING.
        return None
    if r.lac < r.last:
        return None
    if s.meta_status[wl] != IN_RECOVERY:
        if s.meta_status[wl] != CLOSED:
            # unreachable: the ledger is IN_RECOVERY from a recovery's start until a recovery
            # closes it (the writer's steps need it OPEN; workers change segments, not the
            # status).
            return None
        r = r._replace(phase=RC_CLOSED, last=s.meta_last[wl], version=s.meta_version[wl])
        return s._replace(rc=with_recovery(s, c, r))
    segs = s.meta_segments[wl][: r.base] + r.segments[r.base :]
    if "recovery-close-undoes-swap" in cfg.mutants:
        segs = r.segments  # its own view of the earlier segments too (not a merge)
    version = s.meta_version[wl] + 1
    return with_segments(cfg, s, wl, segs)._replace(
        meta_status=set_at(s.meta_status, wl, CLOSED),
        meta_last=set_at(s.meta_last, wl, r.last),
        meta_version=set_at(s.meta_version, wl, version),
        rc=with_recovery(s, c, r._replace(phase=RC_CLOSED, version=version)),
    )


# ================================================================== READER ACTIONS
#
# BookKeeper's readers, apache/bookkeeper 9590a97f (client/ unless said otherwise; the
# code path is traced in docs/findings/two-recoveries.md). A reader's handle checks the
# metadata only when a call is made, takes the LACs bookies report with a max-only update
# (``LedgerHandle.updateLastConfirmed``) that never looks at the metadata, and reads any
# entry up to its own LAC. What it returns to the application is recorded (``rd``) and
# held to the ledger's final close (``ReadersSeeOnlyTheClosedLedger``).


def _with_reader(s: State, r: int, rd: tuple[int, int, int, int]) -> State:
    """``s`` with reader ``r`` set to ``rd``: (handle, LAC, LAC read in flight, returned)."""
    return s._replace(rd=set_at(s.rd, r, rd))


def reader_opens_ledger(cfg: Config, s: State, r: int) -> State | None:
    """A client opens the writer's ledger without recovery, to read it.

    Key points: ``LedgerOpenOp.initiateWithoutRecovery``: a CLOSED ledger's
    handle starts with the stored last entry as its LAC; an OPEN or
    IN_RECOVERY one reads the LAC from the bookies and assigns the answer
    (``openWithMetadata``), so the open leaves a LAC read in flight. The
    handle watches the metadata from then on (``reader_sees_close``).
    """
    wl = cfg.writer_ledger
    if s.rd[r][0] != RD_NONE or s.meta_status[wl] == NONE:
        # unreachable: next_states offers it only to a reader that has not opened the ledger,
        # once the ledger exists.
        return None
    if s.meta_status[wl] == CLOSED:
        return _with_reader(s, r, (RD_CLOSED, s.meta_last[wl], 0, 0))
    return _with_reader(s, r, (RD_OPEN, -1, 1, 0))


def reader_reads_lac(cfg: Config, s: State, r: int) -> State | None:
    """The reader asks the bookies for the LAC (a poll, or the long poll of a tailing reader).

    Key points: ``readLastAddConfirmed``, ``tryReadLastAddConfirmed`` and
    ``readLastAddConfirmedAndEntry`` check ``isClosed()`` when called: a
    handle that applied the close answers with the stored last entry and asks
    no bookie (no step here). Otherwise the request is in flight until a
    bookie answers, and stays so if the close reaches the handle meanwhile
    (nothing cancels it).
    """
    handle, lac, polling, returned = s.rd[r]
    if handle != RD_OPEN or polling:
        return None
    return _with_reader(s, r, (handle, lac, 1, returned))


def _ledger_bookies(s: State, ledger: int) -> int:
    mask = 0
    for _first, ens in s.meta_segments[ledger]:
        mask |= ensemble_mask(ens)
    return mask


def reader_receives_lac(cfg: Config, s: State, r: int, b: int) -> State | None:
    """A live bookie answers the reader's LAC read with its own LAC; the reader's only rises.

    Key points: the long poll completes on the first single answer above the
    handle's LAC (``ReadLastConfirmedAndEntryOp.readEntryComplete``), as does
    ``TryReadLastConfirmedOp``; ``readLastAddConfirmed`` takes the maximum
    over the first answers that cover the ensemble (``ReadLastConfirmedOp``,
    ``PendingReadLacOp``), which is one bookie's LAC too: one step per bookie
    covers all three. Bookies answer whether or not the ledger is fenced. Any
    bookie the ledger's segments name may answer (the handle's last ensemble
    is one of those the metadata went through).
    """
    wl = cfg.writer_ledger
    handle, lac, polling, returned = s.rd[r]
    if not polling or s.b_up[b] not in SERVING or not _ledger_bookies(s, wl) >> b & 1:
        # unreachable: next_states offers it only while a LAC read is in flight, for a live
        # bookie the segments name.
        return None
    return _with_reader(s, r, (handle, max(lac, s.b_ledgers[b][wl][3]), 0, returned))


def reader_reads_entry(cfg: Config, s: State, r: int, e: int, b: int) -> State | None:
    """The reader reads entry ``e``, at most its LAC, from a live bookie that has it.

    Key points: ``LedgerHandle.readEntries`` and ``readAsync`` check the
    entry against the handle's own LAC only, never against a closed
    ledger's last entry; the read completes on the first replica that
    returns the entry, which goes to the application (``rd``'s returned
    entries). Every V3 read answer carries the bookie's LAC, which raises the
    handle's (``PendingReadOp.readEntryComplete`` calls
    ``updateLastConfirmed``), on a closed handle too.
    """
    wl = cfg.writer_ledger
    handle, lac, polling, returned = s.rd[r]
    if handle == RD_NONE or e > lac or s.b_up[b] not in SERVING or not _stored(s, b, wl) >> e & 1:
        # unreachable: next_states offers it only to an open handle, for an entry up to its
        # LAC and a live bookie that stores it.
        return None
    return _with_reader(s, r, (handle, max(lac, s.b_ledgers[b][wl][3]), polling, returned | bit(e)))


def reader_sees_close(cfg: Config, s: State, r: int) -> State | None:
    """The metadata watch delivers the close: the handle's LAC becomes the stored last entry.

    Key points: ``ReadOnlyLedgerHandle.onChanged`` runs ``setLedgerMetadata``,
    which sets the LAC to the closed ledger's last entry, down as well as up;
    a LAC read in flight stays in flight and may raise it again.
    """
    wl = cfg.writer_ledger
    handle, _lac, polling, returned = s.rd[r]
    if handle != RD_OPEN or s.meta_status[wl] != CLOSED:
        return None
    return _with_reader(s, r, (RD_CLOSED, s.meta_last[wl], polling, returned))


# ================================================================== AUDITOR ACTIONS


def auditor_marks_ledgers_of_lost_bookies(cfg: Config, s: State) -> State | None:
    """The auditor's watch on bookie registrations fires: it marks the ledgers of lost bookies.

    Key points: only the elected auditor, only with AutoRecovery enabled; it
    compares the registered bookies with every ledger's ensembles and marks
    each ledger that uses a lost bookie, creating its under-replication task
    or rewriting it with a new version, even when the bookie is already
    listed: a loss seen after a worker checked the ledger must make that
    worker's versioned delete fail. (An idempotent mark that skips the write
    lets the delete succeed while the bookie is down again; the model checker
    finds that trace.)
    """
    if not s.au_stale or auditor_node(s) < 0 or not s.meta_autorecovery:
        return None
    return _audit(s)


def _audit(s: State, back: int = 0) -> State:
    """An audit's marks: every ledger that names a bookie that is not up (or in ``back``,
    up again since the audit read the registrations)."""
    tasks = list(s.meta_task)
    for ledger, segs in enumerate(s.meta_segments):
        version, lost = tasks[ledger]
        missing = 0
        for _f, ens in segs:
            for b in ens:
                if s.b_up[b] != UP or back >> b & 1:
                    missing |= bit(b)
        if missing:
            tasks[ledger] = (version + 1, lost | missing)
    return s._replace(meta_task=tuple(tasks), au_stale=0, au_missed=0, au_back=0)


def auditor_marks_from_earlier_view(cfg: Config, s: State) -> State | None:
    """The due audit, whose read of the registrations came before a bookie registered
    again: its marks also name that bookie, up by the time they are written.

    Key points: the auditor reads the registered bookies, then every ledger,
    and writes its marks after (seconds, with many ledgers); a bookie that
    comes back in between (a restart, a new ZooKeeper session) is marked lost
    all the same. A worker may have found the bookie's ledgers whole and
    deleted their tasks before the marks land: each such mark makes a new task
    a worker must find nothing to do in. An over-approximation: any bookie
    that came back since the last audit (``au_back``) may be one the read
    missed, not only those back after it. A reduction: the step is the due
    audit (``au_stale`` cleared), though the registration after its read is a
    change that BookKeeper's auditor audits again; that audit would mark
    again only bookies lost now, each already marked here with a new task
    version (the spec's step marks by the state of the moment), as the
    periodic bookie check's would.
    """
    if not s.au_stale or auditor_node(s) < 0 or not s.meta_autorecovery:
        return None
    return audit_from_earlier_view(s)


def audit_from_earlier_view(s: State) -> State | None:
    """An audit's marks with the bookies back since the last audit taken for lost, if a
    ledger names one. The trace check takes it at any time, as it takes :func:`_audit`."""
    named = 0
    for segs in s.meta_segments:
        for _f, ens in segs:
            named |= ensemble_mask(ens)
    if not s.au_back & named:
        return None
    return _audit(s, s.au_back)


def auditor_marks_from_earlier_scan(cfg: Config, s: State, ledger: int) -> State | None:
    """The due audit, whose read of ``ledger`` came before a worker's swap there: its mark
    also names the bookie the swap replaced, if that bookie is not up.

    Key points: the auditor reads the registered bookies, then every ledger's
    metadata one by one (seconds, with many), and writes its marks after; a
    worker's swap that lands in between leaves the mark naming a bookie the
    ledger no longer has. Such a mark bumps the task's version (a worker's
    versioned delete fails) or creates a task a worker must then find
    nothing to do in. The step is the audit of the moment (every loss marked,
    the due audit done) plus the bookies the swaps replaced: a mark from the
    earlier read alone, taken as the due audit, misses a swapped-in bookie
    lost before it (the mutant ``audit-marks-only-its-earlier-scan``; in
    bkref that loss is a registration change, audited again). An
    over-approximation: any bookie a swap replaced, not only those replaced
    while the audit ran (the spec keeps no ghost of when it read).
    """
    if not s.au_stale or auditor_node(s) < 0 or not s.meta_autorecovery:
        return None
    return audit_from_earlier_scan(cfg, s, ledger)


def auditor_marks_from_earlier_view_and_scan(cfg: Config, s: State, ledger: int) -> State | None:
    """The due audit, whose read of the registrations came before bookies registered again
    and whose read of ``ledger`` came before a worker's swap there: both races at once.

    Key points: the two reads are seconds apart from the marks (every
    registration, then every ledger), so both may be early in one audit. Its
    mark names the bookie a swap replaced when that bookie is not up or came
    back after the read of the registrations (``au_back``): a worker may
    have copied the bookie's fragment, swapped it out and deleted the task
    before the mark lands, and the mark then makes a task in which a worker
    must find nothing to do. The marks of the other ledgers are those of
    ``auditor_marks_from_earlier_view``; the same over-approximations as the
    two steps apart.
    """
    if not s.au_stale or not s.au_back or auditor_node(s) < 0 or not s.meta_autorecovery:
        return None
    return audit_from_earlier_scan(cfg, s, ledger, s.au_back)


def audit_from_earlier_scan(cfg: Config, s: State, ledger: int, back: int = 0) -> State | None:
    """An audit's marks with ``ledger``'s replaced bookies (not up, or in ``back``, up again
    since the audit read the registrations) added, if that adds any. The trace check takes
    it for a mark at any time, as it takes :func:`_audit`."""
    stale = 0
    for _idx, _filled, replaced in s.meta_rereplicated[ledger]:
        if replaced >= 0 and (s.b_up[replaced] != UP or back >> replaced & 1):
            stale |= bit(replaced)
    t = _audit(s, back)
    if "audit-marks-only-its-earlier-scan" in cfg.mutants:
        u = _audit(_before_swaps(s, ledger), back)._replace(meta_segments=s.meta_segments)
        return u if u != t else None
    version, lost = t.meta_task[ledger]
    if not stale & ~lost:
        return None  # the audit of the moment marks as much
    if version == s.meta_task[ledger][0]:
        version += 1  # the audit of the moment left this ledger's task alone
    return t._replace(meta_task=set_at(t.meta_task, ledger, (version, lost | stale)))


def _before_swaps(s: State, ledger: int) -> State:
    """``s`` with ``ledger``'s segments as before the recorded swaps (for the mutant)."""
    segs = segments_before_swaps(s.meta_segments[ledger], s.meta_rereplicated[ledger])
    return s._replace(meta_segments=set_at(s.meta_segments, ledger, segs))


def segments_before_swaps(segments: Segments, swaps: tuple[tuple[int, int, int], ...]) -> Segments:
    """``segments`` as a read before the recorded worker swaps (``meta_rereplicated``) saw
    them: each replaced bookie back where the swap put another."""
    segs = list(segments)
    undo = [(i, f, r) for i, f, r in swaps if r >= 0]
    for _ in undo:  # a chain of swaps in one segment is undone one link per round
        for idx, filled, replaced in undo:
            first, ens = segs[idx]
            segs[idx] = (first, tuple(replaced if b == filled else b for b in ens))
    return tuple(segs)


def auditor_runs_periodic_bookie_check(cfg: Config, s: State) -> State | None:
    """The auditor's periodic bookie check (``auditorPeriodicBookieCheckInterval``): an audit
    with no registration change behind it.

    Key points: it finds the ledgers the last audit could not mark, because
    a metadata write named a bookie that was already down after that audit
    read the metadata (a writer's ensemble change or a worker's swap whose
    new bookie crashed before the CAS landed). The spec runs it only then
    (``au_missed``), a reduction: at any other time it would rewrite tasks that
    already list every lost bookie, as the audit of their loss did.
    """
    if not s.au_missed or s.au_stale or auditor_node(s) < 0 or not s.meta_autorecovery:
        return None
    return _audit(s)


def auditor_checks_ledger_replicas(cfg: Config, s: State, ledger: int) -> State | None:
    """The auditor's periodic check of a ledger's closed segments, the ledger open or
    closed: it marks live bookies that miss entries.

    Key points: the seed's open question "periodically check ledgers are
    available"; only with ``cfg.periodic_check``, by the elected auditor with
    AutoRecovery enabled. It reads from each live bookie of each segment the
    entries of its write sets; a bookie lacking one, or not answering (lost),
    is added to the ledger's task (ENTRIES_MISSING) with a new version. A
    replica lost without a bookie loss (an add that never arrived) is found
    only this way. Bookies already listed are not marked again. An open
    ledger's closed segments are checked too, as BookKeeper's are
    (``AuditorCheckAllLedgersTask.checkAllLedgers`` opens every ledger without
    recovery and ``LedgerChecker.checkLedger`` builds a fragment of every
    segment before the last; apache/bookkeeper 9590a97f), and the worker
    repairs them while the writer goes on, racing its ensemble change and a
    recovery's close. Not modelled: BookKeeper also checks the open last
    segment up to the LAC the check reads (``LedgerChecker.checkLedger``); a
    bookie found missing an entry there makes the worker fence the ledger
    after the grace period. bkref's ``LedgerCheck`` skips that segment too.
    """
    if not cfg.periodic_check or auditor_node(s) < 0 or not s.meta_autorecovery:
        return None
    version, lost = s.meta_task[ledger]  # a ledger not created yet has no segment to check
    missing = 0
    for idx, (_f, ens) in enumerate(s.meta_segments[ledger]):
        if not segment_is_closed(s, ledger, idx):
            continue  # the open last segment: see the docstring
        for b in ens:
            if s.b_up[b] != UP or missing_entries(cfg, s, ledger, idx, b):
                missing |= bit(b)  # a lost bookie cannot answer the check's reads either
    if not missing & ~lost:
        return None
    return s._replace(meta_task=set_at(s.meta_task, ledger, (version + 1, lost | missing)))


def auditor_loses_session(cfg: Config, s: State) -> State | None:
    """The auditor's ZooKeeper session expires: its leader znode goes, and it stops auditing.

    Key points: kazoo's LOST state; a node must not act as auditor after it
    (the mutant ``auditor-acts-after-session-loss`` does).
    """
    node = auditor_node(s)
    if node < 0 or s.budget[B_ELECT] == 0:
        return None
    epoch, _ = s.meta_auditor
    # The mutant misses the LOST state: the node still believes it leads.
    keeps = "auditor-acts-after-session-loss" in cfg.mutants
    return s._replace(
        meta_auditor=(epoch, -1),
        au_leads=s.au_leads if keeps else set_at(s.au_leads, node, 0),
        budget=set_at(s.budget, B_ELECT, s.budget[B_ELECT] - 1),
    )


def node_wins_auditor_election(cfg: Config, s: State, node: int) -> State | None:
    """A node creates the leader znode: it is auditor of the next election epoch.

    Key points: only when no node holds the znode. The new auditor audits at
    once (``au_stale``), as BookKeeper's does: bookies lost while nobody led
    were marked by no one. The mutant ``auditor-without-election`` lets a node
    that is not auditor believe it leads the current epoch without creating the
    znode.
    """
    epoch, holder = s.meta_auditor
    if s.au_leads[node]:
        return None
    if holder >= 0:
        if "auditor-without-election" not in cfg.mutants:
            return None
        # unreachable: only the mutant auditor-without-election lets a node lead while another
        # node holds the znode; coverage checks the correct spec.
        return s._replace(au_leads=set_at(s.au_leads, node, epoch))
    return s._replace(
        meta_auditor=(epoch + 1, node), au_leads=set_at(s.au_leads, node, epoch + 1), au_stale=1
    )


# ================================================================== WORKER ACTIONS


def _segment_needs_repair(
    cfg: Config, s: State, ledger: int, idx: int, seen: int = 0, *, listed: int = -1
) -> int:
    """The first bookie of the segment that a worker may repair (``_needing_repair``), or -1."""
    return next(_needing_repair(cfg, s, ledger, idx, seen, listed=listed), -1)


def _needing_repair(
    cfg: Config, s: State, ledger: int, idx: int, seen: int = 0, *, listed: int = -1
) -> Iterator[int]:
    """The bookies of the segment a worker may repair, in ensemble order: the lost (not
    registered) ones, those of ``seen`` (the worker's view, ``State.wk_seen``) back since,
    then the live ones of a closed segment that its task lists and that miss entries of the segment
    (ENTRIES_MISSING). The worker checks those replicas itself, whichever audit listed
    them and why: a bookie listed as lost that came back missing entries is repaired,
    one the check found missing entries that has them now is not. BookKeeper's
    ``ReplicationWorker.rereplicate`` (9590a97) runs its ``LedgerChecker`` over the ledger
    (``getUnderreplicatedFragments``) rather than trust the task, once: it then
    replicates every fragment that check found, a bookie back since or not. ``listed``:
    the task's bookies as the worker read them (-1: as they are now)."""
    ens = s.meta_segments[ledger][idx][1]
    for b in ens:
        if s.b_up[b] != UP:
            if "open-segment-without-entries-skipped" in cfg.mutants and not _checker_sees(
                cfg, s, ledger, idx, b
            ):
                continue
            yield b
    # Those back since, after: a worker that looked later (bkref's reads the ledger and
    # the registrations after taking the lock) copies the lost ones first, or only them.
    for b in ens:
        if seen >> b & 1 and s.b_up[b] == UP:
            yield b
    if segment_is_closed(s, ledger, idx):
        listed = s.meta_task[ledger][1] if listed < 0 else listed
        for b in ens:
            if listed & bit(b) and missing_entries(cfg, s, ledger, idx, b):
                yield b


def _checker_sees(cfg: Config, s: State, ledger: int, idx: int, b: int) -> bool:
    """Whether the mutant ``open-segment-without-entries-skipped`` sees lost ``b``.

    The mutant finds under-replication only in fragments it can read, as
    BookKeeper's LedgerChecker did before BOOKKEEPER-742: in the open last
    segment, a lost bookie counts only if some entry of its write sets is
    stored on a live bookie of the segment. A lost bookie that got nothing yet
    (E > Wq, few entries) is missed, and the worker drops the task; the fix
    recovers the ledger whenever its open last segment names a lost bookie.
    """
    if segment_is_closed(s, ledger, idx):
        return True
    segs = s.meta_segments[ledger]
    live = [x for x in segs[idx][1] if s.b_up[x] == UP]
    return any(
        write_set(cfg, segs, e) & bit(b) and any(_stored(s, x, ledger) & bit(e) for x in live)
        for e in range(segs[idx][0], segment_end(s, cfg, ledger, idx) + 1)
    )


def missing_entries(cfg: Config, s: State, ledger: int, idx: int, b: int) -> int:
    """Entries of segment ``idx`` that ``b`` should hold (its write sets) but does not."""
    segs = s.meta_segments[ledger]
    held = _stored(s, b, ledger)
    out = 0
    for e in range(segs[idx][0], segment_end(s, cfg, ledger, idx) + 1):
        if write_set(cfg, segs, e) & bit(b) and not held & bit(e):
            out |= bit(e)
    return out


def worker_acquires_ledger_lock(cfg: Config, s: State, w: int, ledger: int) -> State | None:
    """An idle worker takes the lock of a ledger with an under-replication task.

    Key points: the lock is an ephemeral znode created only if absent, so a
    locked ledger is skipped (the mutant ``worker-skips-ledger-lock`` takes
    it anyway and two workers repair it at once).
    """
    bookie, locked, _v, _p = s.wk[w]
    if locked >= 0 or not s.meta_autorecovery or s.b_up[bookie] not in SERVING:
        return None
    version, lost = s.meta_task[ledger]
    if not lost:
        return None
    if s.meta_lock[ledger] >= 0 and "worker-skips-ledger-lock" not in cfg.mutants:
        return None
    seen = 0
    for _f, ens in s.meta_segments[ledger]:
        for b in ens:
            if s.b_up[b] != UP:
                seen |= bit(b)
    return s._replace(
        meta_lock=set_at(s.meta_lock, ledger, w),
        wk=set_at(s.wk, w, (bookie, ledger, version, None)),
        wk_seen=set_at(s.wk_seen, w, seen),
    )


def worker_copies_fragment(cfg: Config, s: State, w: int, idx: int, lost: int = -1) -> State | None:
    """The worker copies a closed segment's entries of a lost bookie to its own bookie.

    Key points: only closed segments (the open last segment must be fenced
    first); the worker's bookie must not be in the ensemble; every entry the
    lost bookie held is read from a live bookie of its write set. The
    worker records the metadata version it read (its CAS no longer needs it:
    it retries on newer metadata, see ``worker_updates_segment_ensemble``).
    With several bookies of the segment to repair, the model checker copies
    the first one's fragment (``lost`` = -1), a reduction: each is copied in
    turn, alike; a replayed trace (``bkref.tracecheck``) names the one it copied.

    A worker whose lock ZooKeeper dropped (``worker_loses_lock``) copies no more:
    bkref's worker asks whether it owns the lock before each copy and each metadata
    write, so only a copy made before the loss may still become a swap (a copy under
    way when the session expired leaves its entries on the target, named by no
    metadata, as a failed copy's). Without that, two workers that each saw the other's
    bookie lost would swap each other in and out for ever. BookKeeper's worker
    (``ReplicationWorker.rereplicate``, apache/bookkeeper 9590a97f) does not ask, but
    copies each fragment of the plan it made at the lock once.
    """
    bookie, ledger, tv, _pending = s.wk[w]
    if not _worker_ready(s, w) or s.b_up[bookie] not in SERVING or s.wk_unlocked >> w & 1:
        return None
    if not segment_is_closed(s, ledger, idx) and (
        "repair-open-segment-without-fence" not in cfg.mutants or s.meta_status[ledger] == NONE
    ):
        return None
    seen = s.wk_seen[w]
    if lost < 0:
        lost = _segment_needs_repair(cfg, s, ledger, idx, seen)
    elif lost not in tuple(_needing_repair(cfg, s, ledger, idx, seen)):
        # unreachable: next_states never names the lost bookie; only a replayed trace
        # (bkref.tracecheck) does, and a refusal there is a finding of the replay. A tuple:
        # mypyc's generators (bkref/spec/build.py) have no ``in``.
        return None
    ens = s.meta_segments[ledger][idx][1]
    if lost < 0 or bookie in ens:
        return None
    segs = s.meta_segments[ledger]
    copied = 0
    synced, unsynced, fenced, lac = ledger_on(s, bookie, ledger)
    mine = list(s.b_signed[bookie])
    for e in range(segs[idx][0], segment_end(s, cfg, ledger, idx) + 1):
        ws = write_set(cfg, segs, e)
        if not ws & bit(lost):
            continue
        sources = [
            x for x in bookies_of(ws) if s.b_up[x] in SERVING and _stored(s, x, ledger) & bit(e)
        ]
        if sources:
            copied |= bit(e)
            signed = _signed_lac(cfg, s, ledger, e, sources)
            lac = max(lac, signed)
            if ledger == cfg.writer_ledger:
                mine[e] = signed
        elif segment_is_closed(s, ledger, idx):
            return None  # a committed entry has no live copy: cannot repair now
    return s._replace(
        b_ledgers=set_ledger_on(s, bookie, ledger, (synced | copied, unsynced, fenced, lac)),
        b_signed=set_at(s.b_signed, bookie, tuple(mine)),
        wk=set_at(s.wk, w, (bookie, ledger, tv, (idx, lost, s.meta_version[ledger]))),
    )


def _signed_lac(cfg: Config, s: State, ledger: int, e: int, sources: list[int]) -> int:
    """The LAC the copy of ``e`` a worker reads is signed with: the highest among its live
    sources' copies (they differ only when a recovery's write-back and the writer's add
    were signed with different LACs; the spec takes the highest, a choice of source). The
    closed ledgers' entries were written in order, each signed with the one before."""
    if ledger != cfg.writer_ledger:
        return e - 1
    return max(s.b_signed[x][e] for x in sources)


def worker_updates_segment_ensemble(cfg: Config, s: State, w: int) -> State | None:
    """The worker CASes the segment's ensemble: its bookie replaces the lost one.

    Key points: if the metadata changed since the copy (the writer's ensemble
    change, a recovery's close), the CAS fails and the worker re-reads it and
    tries again on it, as BookKeeper's replicator does, while the copied segment
    still names the lost bookie and not the worker's (a closed segment's entries
    and start never change); otherwise the copy is dropped, to be redone.
    """
    bookie, ledger, tv, pending = s.wk[w]
    if pending is None or pending in (VERIFIED, RECOVERING):
        return None
    idx, lost, _version = pending
    wk = set_at(s.wk, w, (bookie, ledger, tv, None))
    segs = s.meta_segments[ledger]
    first, ens = segs[idx]
    if lost not in ens or bookie in ens:
        # Another worker's swap landed since the copy: only a worker that took the lock
        # after this one lost it (worker_loses_lock) or took it beside it (the mutant
        # worker-skips-ledger-lock) changes a closed segment; the writer's ensemble change
        # and a recovery's close rewrite only the segment that was last when they began,
        # which a copy never touches (it was not closed).
        return s._replace(wk=wk)
    new_segs = set_at(segs, idx, (first, tuple(bookie if b == lost else b for b in ens)))
    rerepl = with_swap(s.meta_rereplicated[ledger], idx, bookie, lost)
    return with_segments(cfg, s, ledger, new_segs)._replace(
        meta_version=set_at(s.meta_version, ledger, s.meta_version[ledger] + 1),
        meta_rereplicated=set_at(s.meta_rereplicated, ledger, rerepl),
        wk=wk,
    )


def with_swap(
    swaps: tuple[tuple[int, int, int], ...], idx: int, filled: int, replaced: int
) -> tuple[tuple[int, int, int], ...]:
    """The ghost ``meta_rereplicated`` of a ledger after a swap in segment ``idx``: the
    swap recorded, and ``filled`` no longer a replaced bookie there (it is back in)."""
    kept = {(i, f, -1 if (i, r) == (idx, filled) else r) for i, f, r in swaps}
    return tuple(sorted(kept | {(idx, filled, replaced)}))


def worker_fences_open_ledger(cfg: Config, s: State, w: int) -> State | None:
    """The grace period is over and the last segment is still open: recover it first.

    Key points: the worker has the ledger opened with recovery (fenced and
    closed by the recovery client) and keeps the lock until the ledger is
    closed, as BookKeeper's worker does; it then goes on with the same task
    (the segment, closed now, is copied like any other).

    A ledger already in recovery (an application's) may be fenced whatever
    segment needs repair, or its closed segments copied first: the spec allows
    both. BookKeeper's worker treats a fragment of an unclosed ledger as open
    unless the LAC it reads reaches the last segment's first entry - 1
    (``LedgerFragment.isClosed``), and then defers and, after the grace
    period, opens the ledger with recovery (``ReplicationWorker.rereplicate``,
    ``deferLedgerLockRelease``; the recovery of an IN_RECOVERY ledger writes
    no metadata; apache/bookkeeper 9590a97f); bkref's worker leaves any ledger
    in recovery to its recovery until the grace period ends. With one recovery
    client, that client's recovery stands for the worker's (``a-recoveries``
    races two).
    """
    bookie, ledger, tv, _pending = s.wk[w]
    if ledger != cfg.writer_ledger or not _worker_ready(s, w):
        return None
    last = len(s.meta_segments[ledger]) - 1
    status = s.meta_status[ledger]
    if status != IN_RECOVERY and (
        status != OPEN or _segment_needs_repair(cfg, s, ledger, last, s.wk_seen[w]) < 0
    ):
        return None
    return s._replace(rc_requested=1, wk=set_at(s.wk, w, (bookie, ledger, tv, RECOVERING)))


# A worker's pending markers besides a copy (segment, lost bookie, metadata version):
VERIFIED = (-1, -1, -1)  # it found the ledger fully replicated
RECOVERING = (-2, -2, -2)  # it asked for the ledger's recovery and waits for it to close


def _worker_ready(s: State, w: int) -> bool:
    """The worker holds a ledger's lock and nothing of its own is under way: no copy
    awaits its CAS, no verdict its delete, no recovery it asked for still runs."""
    _b, ledger, _tv, pending = s.wk[w]
    if ledger < 0:
        return False
    return pending is None or (pending == RECOVERING and s.meta_status[ledger] == CLOSED)


def worker_verifies_ledger_replicated(cfg: Config, s: State, w: int) -> State | None:
    """The worker checks the ledger: every segment's bookies are live (nothing to copy).

    Key points: the live replicas it checks for missing entries are those its task
    listed when it took the lock (bkref's ``WorkerCore`` reads the task once, under the
    lock). A mark since (the periodic check's) bumped the task's version, and the
    worker's versioned delete fails whatever it decides: where the version moved on,
    the spec lets it verify without those replicas (found by ``bkref refine --config
    c-check-crash --seed 2``: a check listed a replica after the worker's lock).
    """
    bookie, ledger, tv, _pending = s.wk[w]
    if not _worker_ready(s, w):
        return None
    if not _replicated(
        cfg, s, ledger, s.meta_task[ledger][1] if s.meta_task[ledger][0] == tv else 0
    ):
        return None
    return s._replace(wk=set_at(s.wk, w, (bookie, ledger, tv, VERIFIED)))


def _replicated(cfg: Config, s: State, ledger: int, listed: int) -> bool:
    """No segment of ``ledger`` needs repair, the task listing the bookies ``listed``."""
    return all(
        _segment_needs_repair(cfg, s, ledger, i, listed=listed) < 0
        for i in range(len(s.meta_segments[ledger]))
    )


def worker_deletes_task(cfg: Config, s: State, w: int) -> State | None:
    """Having found the ledger replicated, the worker deletes its task and releases the lock.

    Key points: the delete carries the task version the worker read; if the
    auditor recorded a new loss since, the delete fails and the task stays
    (the mutant ``delete-task-without-version-check`` deletes anyway).
    """
    _bookie, ledger, tv, pending = s.wk[w]
    if pending != VERIFIED:
        return None
    version, _lost = s.meta_task[ledger]
    if version == tv or "delete-task-without-version-check" in cfg.mutants:
        s = s._replace(meta_task=set_at(s.meta_task, ledger, (version, 0)))
    return _lets_go(cfg, s, w)


def worker_releases_lock(cfg: Config, s: State, w: int, record: int = 0) -> State | None:
    """The worker cannot repair the ledger now (no target, no source), or waits for its
    open last segment to close: it lets the lock go.

    Key points: a live bookie the task lists as missing entries (the periodic
    check's ENTRIES_MISSING) that is also in the open last segment still takes
    the writer's adds; bkref's worker leaves such a ledger until it is closed,
    and the spec allows that beside marking it replicated. BookKeeper's worker
    re-checks the open segment up to the LAC it reads and marks the ledger
    replicated if nothing is missing (``ReplicationWorker.rereplicate``;
    apache/bookkeeper 9590a97f). A lost bookie there is no reason to wait: the
    worker fences the ledger (after the grace period). Likewise a worker whose
    own bookie the task lists may decline to copy to it (bkref's placement never
    targets a bookie known to miss entries; BookKeeper's worker copies to its
    local bookie regardless): the spec allows both.

    A worker whose lock ZooKeeper dropped (``worker_loses_lock``) may let go at any
    point: bkref's worker asks whether it still owns the lock before each copy and
    metadata write and gives the attempt up when not, a pending copy's CAS included. With ``record``
    (see ``_lets_go``) the release also counts a failed attempt in the task.
    """
    bookie, ledger, _tv, _pending = s.wk[w]
    if ledger >= 0 and s.wk_unlocked >> w & 1:
        return _lets_go(cfg, s, w, record)
    if not _worker_ready(s, w):
        return None
    declines = bool(s.meta_task[ledger][1] & bit(bookie))  # see the docstring
    for idx in range(len(s.meta_segments[ledger])):
        if not declines and worker_copies_fragment(cfg, s, w, idx) is not None:
            return None
    # Replicated by the listing of now, it must verify: by the one it read under the lock
    # (listing less, if a mark came since), it may (``worker_verifies_ledger_replicated``).
    if not _waits_for_close(s, ledger) and (
        worker_fences_open_ledger(cfg, s, w) is not None
        or _replicated(cfg, s, ledger, s.meta_task[ledger][1])
    ):
        return None
    return _lets_go(cfg, s, w, record)


def worker_fails_repair(cfg: Config, s: State, w: int, record: int = 0) -> State | None:
    """A copy the worker needs fails, and it lets the lock go with fragments left.

    Key points: BookKeeper's worker (``ReplicationWorker.rereplicate``, apache/bookkeeper
    9590a97f) skips a fragment whose faulty entries it cannot read or whose
    ``replicateLedgerFragment`` throws (a bookie handle not available, not enough
    bookies), and if fragments remain it releases the lock
    (``deferLedgerLockReleaseOfFailedLedger``); bkref's worker does the same on a failed
    copy or a busy repair slot (``RepairRun.on_copy_busy``). The task stays for a later
    attempt. So does a worker whose versioned delete of the task fails on a ZooKeeper
    error after it found the ledger replicated: ``rereplicate``'s ``markLedgerReplicated``
    throws, and its ``finally`` releases the lock; bkref's worker counts a failure and
    lets the lock go. And one whose metadata write fails on a ZooKeeper error after its
    copy (a connection lost, its session kept or not): ``replicateLedgerFragment``
    throws from its ensemble update and the fragment stays to repair, the copy left on
    the worker's bookie, named by no metadata (a soak run's worker had its CAS fail with
    ConnectionLoss). And one whose re-read of the ledger fails after its swap landed,
    before it found the ledger replicated: ``rereplicate`` reads the metadata and the
    registrations again to check the fragments it replicated, and a ZooKeeper error
    there throws too (a soak run's worker lost its connection right after its swap).
    An environment step, bounded by ``cfg.repair_failures``, wherever the worker holds
    the lock with a copy or a verdict of its own or could go on (elsewhere
    ``worker_releases_lock`` is the same step).
    """
    _bookie, ledger, _tv, pending = s.wk[w]
    if s.budget[B_REPAIR_FAIL] == 0 or ledger < 0:
        return None
    swapping = pending is not None and pending not in (VERIFIED, RECOVERING)  # copied
    if (
        pending != VERIFIED
        and not swapping
        and (not _worker_ready(s, w) or worker_releases_lock(cfg, s, w) is not None)
    ):
        return None
    return _lets_go(cfg, s, w, record)._replace(
        budget=set_at(s.budget, B_REPAIR_FAIL, s.budget[B_REPAIR_FAIL] - 1)
    )


def _lets_go(cfg: Config, s: State, w: int, record: int = 0) -> State:
    """``s`` with worker ``w`` idle again and the lock of its ledger released: deleted
    only while it is ``w``'s own. bkref's ``unlock`` deletes the znode only if its
    session owns it, never the lock another worker took after ``w`` lost its own (the
    mutant ``release-deletes-any-lock`` deletes it anyway, as BookKeeper's
    ``ZkLedgerUnderreplicationManager.releaseUnderreplicatedLedger`` does, at any
    version; apache/bookkeeper 9590a97f).

    With ``record``, the worker also counts its failed attempt in the task, as bkref's
    ``record_failure`` does: a write at the task version it read, which bumps that
    version. Only another worker at work on the ledger, with a read of the same version,
    can tell (its delete then fails), and that takes a lost lock; ``next_states``
    offers it only then (``shares_task``)."""
    bookie, ledger, tv, _pending = s.wk[w]
    if record and s.meta_task[ledger][0] == tv and s.meta_task[ledger][1]:
        version, lost = s.meta_task[ledger]
        s = s._replace(meta_task=set_at(s.meta_task, ledger, (version + 1, lost)))
    locks = s.meta_lock
    if locks[ledger] == w or "release-deletes-any-lock" in cfg.mutants:
        locks = set_at(locks, ledger, -1)
    return s._replace(
        meta_lock=locks,
        wk=set_at(s.wk, w, (bookie, -1, 0, None)),
        wk_seen=set_at(s.wk_seen, w, 0),
        wk_unlocked=s.wk_unlocked & ~bit(w),
    )


def shares_task(s: State, w: int) -> bool:
    """Another worker works on ``w``'s ledger with a read of the task version ``w`` read,
    and the task is still there at that version."""
    _b, ledger, tv, _p = s.wk[w]
    return (
        s.meta_task[ledger][0] == tv
        and s.meta_task[ledger][1] != 0
        and any(v != w and lg == ledger and vtv == tv for v, (_b2, lg, vtv, _p2) in enumerate(s.wk))
    )


def worker_loses_lock(cfg: Config, s: State, w: int) -> State | None:
    """ZooKeeper drops the lock of the ledger worker ``w`` works on: its session expired
    (a long pause, a partition from ZooKeeper alone) or its process died.

    Key points: the lock is an ephemeral znode, and another worker may take it
    now. The worker keeps its state and goes on unaware (a dead one never acts
    again, one of the orders this allows) until it lets the ledger go
    (``worker_releases_lock``). bkref's worker asks ZooKeeper whether it still owns
    the lock before each copy and metadata write, but the answer can be stale when
    the CAS lands, and BookKeeper's worker does not ask: the swap of a copy made
    before the loss, a check and the versioned task delete may still land (it copies
    no more: ``worker_copies_fragment``). What keeps the ledger safe is the versioned
    CAS, not the lock: a swap whose lost bookie another swap replaced is dropped
    (``worker_updates_segment_ensemble``). An environment step, bounded by
    ``cfg.lock_losses``.
    """
    ledger = s.wk[w][1]
    if ledger < 0 or s.meta_lock[ledger] != w or s.budget[B_LOCK] == 0:
        # unreachable: next_states offers it only to a lock holder while one is left.
        return None
    return s._replace(
        meta_lock=set_at(s.meta_lock, ledger, -1),
        wk_unlocked=s.wk_unlocked | bit(w),
        budget=set_at(s.budget, B_LOCK, s.budget[B_LOCK] - 1),
    )


def _waits_for_close(s: State, ledger: int) -> bool:
    """The ledger is not closed and its last segment names a live bookie its task lists."""
    if s.meta_status[ledger] == CLOSED:
        return False
    listed = s.meta_task[ledger][1]
    return any(listed & bit(b) and s.b_up[b] == UP for b in s.meta_segments[ledger][-1][1])


# ================================================================== OPERATOR ACTIONS


def operator_disables_autorecovery(cfg: Config, s: State) -> State | None:
    """The operator disables AutoRecovery (maintenance): workers take no new ledgers."""
    if s.budget[B_TOGGLE] == 0 or not s.meta_autorecovery:
        return None
    return s._replace(
        meta_autorecovery=0, budget=set_at(s.budget, B_TOGGLE, s.budget[B_TOGGLE] - 1)
    )


def operator_enables_autorecovery(cfg: Config, s: State) -> State | None:
    """The operator enables AutoRecovery again (weakly fair: maintenance ends).

    Key points: the auditor audits at once (``au_stale``): a loss it saw while
    disabled published nothing.
    """
    if s.meta_autorecovery:
        return None
    return s._replace(meta_autorecovery=1, au_stale=1)


# ================================================================== NEXT

# Actions of the environment: no fairness applies to them (they may never happen).
ENVIRONMENT_ACTIONS = frozenset(
    {
        "bookie_crashes",
        "bookie_restarts",
        "bookie_restarts_with_wiped_disk",
        "bookie_loses_session",
        "network_loses_message",
        "network_duplicates_message",
        "auditor_loses_session",
        "operator_disables_autorecovery",
        # Caused by a bookie that is down: it may never happen.
        "recovery_client_gives_up",
        # A copy that fails: a bookie that does not answer, a busy repair slot.
        "worker_fails_repair",
    }
)


def drop_dead_requests(cfg: Config, s: State) -> State:
    """Forget what can no longer change any decision (applied after every action).

    A writer that is no longer OPEN keeps only its LAC and next entry id; a
    recovery client forgets the fencing answers once it reads, and all but
    its last entry once it has closed the ledger (all but its phase once it
    failed).

    Once the writer is no longer OPEN it sends nothing and reads no answer,
    so fences matter only to a recovery client still fencing, and recovery
    reads only for the entry it is reading. Once, moreover, the ledger is
    CLOSED and no recovery client is still at work, every request left could
    only add fences or copies of entries up to the last one: they are dropped
    (a state-space reduction; the behaviours lost are ones where those
    requests are never delivered anyway).
    """
    w_status = s.w_status
    if w_status not in (W_OPEN, W_NONE) and (s.w_segments or any(s.w_acks)):
        # A writer that is done keeps only what the invariants read: LAC and next id.
        zero, none = (0,) * cfg.entries, (-1,) * cfg.entries
        s = s._replace(w_segments=(), w_change=None, w_acks=zero, w_sent=zero, w_piggy=none)
    rc = s.rc
    for c, rt in enumerate(rc):
        if rt[0] >= RC_READING:  # Recovery.phase
            r = _forget_used(cfg, tuple.__new__(Recovery, rt))
            if r != rt:
                rc = set_at(rc, c, cast(RecoveryTuple, tuple(r)))
    if rc is not s.rc:
        s = s._replace(rc=rc)
    msgs = s.msgs
    if not msgs:
        return s
    reduce = cfg.reduce_dead_requests
    if w_status == W_OPEN:
        # Adds are never dead while the writer is OPEN (it counts their answers), and
        # they sort first (ADD is the lowest kind): all adds, nothing to drop.
        if not reduce or msgs[-1][0] == ADD:
            return s
        keep = [m for m in msgs if m[0] == ADD or not dead_request(cfg, s, m)]
    elif s.meta_status[cfg.writer_ledger] == CLOSED and not any(
        RC_FENCING <= r[0] <= RC_WRITING for r in rc
    ):
        return s._replace(msgs=())
    else:
        keep = [
            m
            for m in msgs
            if (
                m[0] == ADD
                or (m[0] == FENCE and m[4] != ORPHAN and rc[m[4]][0] == RC_FENCING)
                or (
                    m[0] == READ
                    and m[4] != ORPHAN
                    and rc[m[4]][0] == RC_READING
                    and m[2] == rc[m[4]][7]
                )
            )
            and not (reduce and dead_request(cfg, s, m))
        ]
    return s if len(keep) == len(msgs) else s._replace(msgs=tuple(keep))


def _forget_used(cfg: Config, r: Recovery) -> Recovery:
    """A recovery client past fencing without what it no longer reads."""
    if r.fenced:
        r = r._replace(fenced=0)  # fencing answers are used up
    if r.phase >= RC_WRITING and r.max_lac != -1:
        r = r._replace(max_lac=-1)  # write-backs are sent while reading only
    if r.phase >= RC_WRITING and r.read_segments:
        r = r._replace(read_segments=())  # reading is over
    if r.phase == RC_CLOSED and r.segments:
        zero, none = (0,) * (cfg.entries + 1), (-1,) * (cfg.entries + 1)
        r = r._replace(segments=(), reading=0, lac=-1, acks=zero, sent=zero, piggy=none)
    return r


def dead_request(cfg: Config, s: State, m: Msg) -> bool:
    """A request whose delivery changes nothing but the multiset of messages, now and later.

    The state-space reduction ``drop_dead_requests`` forgets such requests
    (with ``cfg.reduce_dead_requests``, the default). Its argument: the map
    that removes dead requests from a state is a bisimulation quotient for
    every invariant, because

    1. delivering a dead request ``m`` to bookie ``b`` leaves every variable
       but ``msgs`` unchanged: the bookie (UP) already has the ledger fenced
       (or the read does not fence), stores nothing new and keeps its LAC,
       and the client ignores the answer (the recovery client is past the
       phase or the entry it asked about, or gave up: ORPHAN; the writer is
       no longer OPEN);
    2. a dead request stays dead until it is delivered or dropped: a fence
       is lost only by a crash, which drops every request to the bookie;
       the recovery client's phase and entry only move forward; a writer
       that is not OPEN never is again; a bookie's entries and LAC only grow
       while it is up;
    3. no guard reads a dead request: the timeouts and retries look for
       in-flight requests of an OPEN writer, of recovery adds, and of the
       fencing or the entry being read;
    4. no invariant reads ``msgs``.

    Losing or duplicating a dead request spends a fault on nothing; the
    behaviours after it are those of the state with the fault unspent, minus
    that fault, so no invariant violation is missed. Hence exactly the
    invariant violations of the unreduced model are reachable (a test
    compares the verdicts of both on every small config and mutant).
    """
    kind, b, e, a, rec = m
    if s.b_up[b] not in SERVING:
        return False  # the disk may yet be wiped: a later delivery could fence it again
    synced, _u, fenced, lac = s.b_ledgers[b][cfg.writer_ledger]
    if kind != ADD:
        if rec == ORPHAN:  # nobody hears the answer: only the fence matters
            return bool(fenced) or (kind == READ and not a)
        rt = s.rc[rec]  # 0: phase, 7: reading (no record built: called on every request)
        if kind == FENCE:
            return bool(fenced) and rt[0] != RC_FENCING  # fencing is over: answer ignored
        return (bool(fenced) or not a) and (rt[0] != RC_READING or e != rt[7])
    if rec or s.w_status == W_OPEN:
        return False  # the client counts the answer
    return bool(fenced) or (bool(synced >> e & 1) and lac >= a)


HANDLERS = (bookie_handles_add, bookie_handles_fencing_lac_read, bookie_handles_recovery_read)


# Actions whose first argument is a message in flight (a plain 5-tuple, as an ensemble of
# five bookies is: a label is read by its action's name, never by the shape of a tuple).
MESSAGE_ACTIONS = frozenset(
    [*(h.__name__ for h in HANDLERS), "network_loses_message", "network_duplicates_message"]
)


def show_message(m: Msg) -> str:
    """A message in flight, in words."""
    kind, b, e, a, r = m
    # Recovery client 0 goes unnumbered: most configs have no other.
    if kind == ADD:
        if r == ORPHAN:
            who = "a recovery that gave up"
        else:
            who = "writer" if not r else "recovery client" + (f" {r - 1}" if r > 1 else "")
        return f"add e{e} to b{b} from {who} (lac {a})"
    by = f" by recovery client {r}" if r else ""
    if r == ORPHAN:
        by = " by a recovery that gave up"
    if kind == FENCE:
        return f"fencing LAC read to b{b}{by}"
    return f"recovery read e{e} to b{b}{' (fencing)' if a else ''}{by}"


def format_label(label: Label) -> str:
    """``name(arg, ...)`` with messages spelled out."""
    name, args = label
    if not args:
        return name
    shown = [str(a) for a in args]
    if name in MESSAGE_ACTIONS:
        shown[0] = show_message(cast(Msg, args[0]))
    return f"{name}({', '.join(shown)})"


def next_states(cfg: Config, s: State) -> list[Step]:
    """Every enabled action with its arguments, and the state it leads to.

    The loops below test the cheap parts of some actions' guards before
    calling them (the actions test their whole guard again): a call whose
    guard fails returns None, so skipping it changes neither the steps nor
    their order, only the time spent.
    """
    n = cfg.bookies
    up = s.b_up

    out: list[Step] = []

    def emit(fn: Callable[..., State | None], *args: object) -> None:
        t = fn(cfg, s, *args)
        if t is not None:
            out.append(((fn.__name__, args), drop_dead_requests(cfg, t)))

    # writer
    if cfg.writer:
        if s.w_status == W_NONE:
            for ens in _ensembles(cfg, s):
                emit(writer_creates_ledger, ens)
        if s.w_status == W_OPEN:
            if s.w_next < cfg.entries and s.w_next - s.w_lac <= cfg.pipeline:
                emit(writer_sends_add)
            if s.w_change is None:
                if cfg.writer_closes:
                    emit(writer_closes_ledger)
            else:
                emit(writer_completes_ensemble_change)
            if s.w_change is None or "acks-before-ensemble-change-lands" in cfg.mutants:
                for e in range(s.w_lac + 1, s.w_next):
                    for b in _writer_view(s)[-1][1]:
                        emit(writer_resends_add, e, b)
            if s.w_change is None:
                last_ens = s.w_segments[-1][1]
                for failed in last_ens:
                    if _writer_timed_out(cfg, s, failed):
                        for new in range(n):
                            if up[new] == UP and new not in last_ens:
                                emit(writer_changes_ensemble, failed, new)
        # recovery clients
        for c in range(len(s.rc)):
            r = recovery_of(s, c)
            phase = r.phase
            if phase == RC_IDLE:
                emit(recovery_client_starts_recovery, c)
            elif phase == RC_FENCING:
                emit(recovery_client_completes_fencing, c)
                _emit_retries(emit, up, c, ensemble_mask(r.segments[-1][1]) & ~r.fenced)
            elif phase == RC_READING:
                ws = write_set(cfg, _read_segments(cfg, r), r.reading)
                _emit_retries(emit, up, c, ws & ~r.negative)
            if s.budget[B_GIVE_UP] and phase in (RC_FENCING, RC_READING):
                emit(recovery_client_gives_up, c)
            if phase in (RC_READING, RC_WRITING):
                if phase == RC_WRITING:
                    emit(recovery_client_closes_ledger, c)
                last_ens = r.segments[-1][1]
                decided = phase == RC_WRITING and r.lac >= r.last  # the close is decided
                for failed in () if decided else last_ens:
                    if _rc_timed_out(cfg, s, c, r, failed):
                        for new in range(n):
                            if up[new] == UP and new not in last_ens:
                                emit(recovery_client_changes_ensemble, c, failed, new)
                for e, sent in enumerate(r.sent):
                    if sent:
                        missing = last_ensemble_write_set(cfg, r.segments, e) & ~sent
                        for b in last_ens:
                            if missing >> b & 1:
                                emit(recovery_client_resends_add, c, e, b)
        # readers
        wl = cfg.writer_ledger
        for i, (handle, lac, polling, _returned) in enumerate(s.rd):
            if handle == RD_NONE:
                if s.meta_status[wl] != NONE:
                    emit(reader_opens_ledger, i)
                continue
            if handle == RD_OPEN:
                emit(reader_reads_lac, i)
                emit(reader_sees_close, i)
            if polling:
                for b in bookies_of(_ledger_bookies(s, wl)):
                    if up[b] in SERVING:
                        emit(reader_receives_lac, i, b)
            for e in range(lac + 1):
                for b in range(n):
                    if up[b] in SERVING and _stored(s, b, wl) >> e & 1:
                        emit(reader_reads_entry, i, e, b)
    # messages: each distinct message once
    loss = s.budget[B_LOSS]
    dup = s.budget[B_DUP]
    prev: Msg | None = None
    for m in s.msgs:
        if m == prev:
            continue
        prev = m
        handler = HANDLERS[m[0]]
        if up[m[1]] in SERVING:  # a request to a bookie that is not up waits
            emit(handler, m, 0)
            if m[0] == ADD and loss and cfg.reply_losses:  # stored, but unheard
                emit(handler, m, 1)
        if loss and m[0] == ADD:
            emit(network_loses_message, m)
        if dup:
            emit(network_duplicates_message, m)
    # bookies
    wl = cfg.writer_ledger
    crash = s.budget[B_CRASH]
    wipe = s.budget[B_WIPE]
    session = s.budget[B_SESSION]
    for b in range(n):
        if up[b] in SERVING:
            if s.b_ledgers[b][wl][1]:
                emit(bookie_syncs_journal, b)
            if crash:
                emit(bookie_crashes, b)
            if up[b] == UNREGISTERED:
                emit(bookie_registers_again, b)
            elif session:
                emit(bookie_loses_session, b)
        elif up[b] == DOWN:
            if cfg.restarts:
                emit(bookie_restarts, b)
            if wipe:
                emit(bookie_restarts_with_wiped_disk, b)
    # auditor and workers
    if cfg.autorecovery:
        emit(auditor_marks_ledgers_of_lost_bookies)
        if s.au_back:
            emit(auditor_marks_from_earlier_view)
        if s.au_stale:
            for lg in range(cfg.ledgers):
                if s.meta_rereplicated[lg]:
                    emit(auditor_marks_from_earlier_scan, lg)
                    if s.au_back:
                        emit(auditor_marks_from_earlier_view_and_scan, lg)
        emit(auditor_runs_periodic_bookie_check)
        if cfg.periodic_check:
            for lg in range(cfg.ledgers):
                emit(auditor_checks_ledger_replicas, lg)
        emit(auditor_loses_session)
        for node in range(len(s.au_leads)):
            emit(node_wins_auditor_election, node)
        for w in range(len(s.wk)):
            ledger = s.wk[w][1]
            if ledger < 0:
                for lg in range(cfg.ledgers):
                    emit(worker_acquires_ledger_lock, w, lg)
                continue
            for idx in range(len(s.meta_segments[ledger])):
                emit(worker_copies_fragment, w, idx)
            emit(worker_updates_segment_ensemble, w)
            emit(worker_fences_open_ledger, w)
            emit(worker_verifies_ledger_replicated, w)
            emit(worker_deletes_task, w)
            emit(worker_releases_lock, w)
            emit(worker_fails_repair, w)
            if s.wk_unlocked and shares_task(s, w):
                emit(worker_releases_lock, w, 1)
                emit(worker_fails_repair, w, 1)
            if s.budget[B_LOCK] and s.meta_lock[ledger] == w:
                emit(worker_loses_lock, w)
        emit(operator_disables_autorecovery)
        emit(operator_enables_autorecovery)
    return out


def _emit_retries(emit: Callable[..., None], up: tuple[int, ...], c: int, candidates: int) -> None:
    """``recovery_client_retries_request`` of client ``c`` for the live bookies among
    ``candidates`` (a mask)."""
    for b in bookies_of(candidates):
        if up[b] in SERVING:
            emit(recovery_client_retries_request, c, b)


def _ensembles(cfg: Config, s: State) -> Iterator[tuple[int, ...]]:
    """Ensembles for a new ledger: E live bookies in increasing order.

    Before creation the bookies of the writer's ledger are interchangeable,
    so every ordered ensemble is a renaming of a sorted one; the checker's
    bookie symmetry identifies them, and sorted tuples are enough.
    """
    from itertools import combinations

    live = [b for b in range(cfg.bookies) if s.b_up[b] == UP]
    yield from combinations(live, cfg.ensemble)


# Every action of the spec, grouped by actor (the docs list them in this order).
# The *_receives_* functions run inside the bookie's step that answers them.
ACTIONS: tuple[Callable[..., State | None], ...] = (
    writer_creates_ledger,
    writer_sends_add,
    writer_receives_add_response,
    writer_changes_ensemble,
    writer_resends_add,
    writer_completes_ensemble_change,
    writer_closes_ledger,
    bookie_handles_add,
    bookie_handles_fencing_lac_read,
    bookie_handles_recovery_read,
    bookie_syncs_journal,
    bookie_crashes,
    bookie_restarts,
    bookie_restarts_with_wiped_disk,
    bookie_loses_session,
    bookie_registers_again,
    network_loses_message,
    network_duplicates_message,
    recovery_client_starts_recovery,
    recovery_client_receives_fencing_response,
    recovery_client_completes_fencing,
    recovery_client_receives_read_response,
    recovery_client_retries_request,
    recovery_client_gives_up,
    recovery_client_receives_add_response,
    recovery_client_changes_ensemble,
    recovery_client_resends_add,
    recovery_client_closes_ledger,
    reader_opens_ledger,
    reader_reads_lac,
    reader_receives_lac,
    reader_reads_entry,
    reader_sees_close,
    auditor_marks_ledgers_of_lost_bookies,
    auditor_marks_from_earlier_scan,
    auditor_marks_from_earlier_view,
    auditor_marks_from_earlier_view_and_scan,
    auditor_runs_periodic_bookie_check,
    auditor_checks_ledger_replicas,
    auditor_loses_session,
    node_wins_auditor_election,
    worker_acquires_ledger_lock,
    worker_copies_fragment,
    worker_updates_segment_ensemble,
    worker_fences_open_ledger,
    worker_verifies_ledger_replicated,
    worker_deletes_task,
    worker_releases_lock,
    worker_fails_repair,
    worker_loses_lock,
    operator_disables_autorecovery,
    operator_enables_autorecovery,
)
