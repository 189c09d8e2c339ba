"""The search for a spec behaviour that explains one ledger's trace.

A configuration is a position in every lane and a spec state; a move is a trace event
taken as a spec step (``bkref.tracecheck.replay``). The search is depth-first, tries the
lanes' next events in the order of their real times (so a run replays straight through
unless the spec needs another order), and remembers the configurations it has left
behind.

Verdicts: ``explained`` (a behaviour replays every event), ``violation`` (no behaviour
does: reported at the configuration that replayed the most events, with the event that
no move allows, the spec's state there and the actions the spec offered), ``unknown``
(the time budget ran out, or the projection could not be made).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from bkref.spec import protocol as p
from bkref.spec.protocol import State
from bkref.tracecheck.autorecovery import decided
from bkref.tracecheck.names import MARKS
from bkref.tracecheck.project import Event, LedgerTrace
from bkref.tracecheck.replay import NotAllowedError, Replay

# A position in every lane: the next event of each lane of several events (clients),
# and, as the bits of an int, which one-event lanes (bookie steps) are done. A ledger
# has a lane per bookie step: a tuple over them all, copied at every step, made long
# ledgers quadratic.
Cursors = tuple[tuple[int, ...], int]


class _Definite(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised out of the search at a refusal no other order could avoid."""

    def __init__(self, cur: Cursors, s: State, ev: Event, why: str) -> None:
        super().__init__(why)
        self.cur, self.s, self.ev, self.why = cur, s, ev, why


@dataclass
class Verdict:
    ledger: int
    verdict: str  # explained, violation, unknown
    steps: int = 0  # events in the ledger's trace
    replayed: int = 0  # events replayed on the deepest path
    configurations: int = 0
    seconds: float = 0.0
    reason: str = ""  # unknown: why; violation: the refusal
    event: str = ""  # violation: the event no spec behaviour allows
    state: str = ""  # violation: the spec state before it
    offered: list[str] = field(default_factory=list)  # violation: what the spec allowed
    out_of_time: bool = False  # unknown because the time budget ran out

    def render(self) -> str:
        head = f"ledger {self.ledger}: {self.verdict}"
        if self.verdict == "explained":
            return f"{head} ({self.steps} steps, {self.configurations} configurations)"
        if self.verdict == "unknown":
            return f"{head}: {self.reason}"
        lines = [
            f"{head}: no behaviour of the spec explains {self.event}",
            f"  why: {self.reason}",
            f"  replayed {self.replayed} of {self.steps} steps before it; the spec state there:",
            *("    " + x for x in self.state.splitlines()),
            "  the spec allowed there: " + ("; ".join(self.offered) or "nothing"),
        ]
        return "\n".join(lines)


HEARD, EARLY, LOST = "heard", "early", "lost"
_PREFERENCE = {HEARD: 0, LOST: 1, EARLY: 2}


def _when(move: tuple[Event, str], marks_at_decided: bool = True) -> tuple[int, int]:
    """Moves are tried in the order of their real times (a heard answer at the client's
    receipt of it), and an event heard before lost, lost before folded early. A
    bookie's restart goes where it registered (the spec's restart registers at once), a
    crash no earlier than the creation of a ledger the writer put it in
    (``Event.prefer_at``).

    An auditor's mark wrote its task somewhere between ``decided`` (its audit read the
    registrations, then the ledger) and its line, and no order of the two places suits
    every run: a client's ensemble change in between can have replaced the bookie it
    names, so the spec's audit marks it only before that change (a soak run's ledger ran
    out of its budget after 1,117,740 configurations with marks at their lines, and took
    129 with marks at ``decided``); a worker's lock in between read the task version the
    mark had not bumped yet (another's ran out after 2,941,556 with marks at ``decided``,
    and took 502 with marks at their lines). The search tries each order in turn
    (``search``)."""
    ev, how = move
    if ev.line.action in MARKS:
        t = decided(ev.line) if marks_at_decided else ev.t
    elif ev.prefer_at is not None:
        t = ev.prefer_at
    else:
        t = ev.receipt.t if how != LOST and ev.receipt is not None else ev.t
    return (t, _PREFERENCE[how])


class _Search:
    """Depth-first over configurations (lane positions, spec state), remembering the
    configurations it has been to, and the deepest one (for the report).

    Each configuration carries its *frontier*: the events that may be taken there, each
    its lane's next with every step it needs done. A ledger has a lane per bookie step,
    so scanning every lane (or every lane's next event: a bookie's adds wait for the
    writer to send them) would cost the ledger's length per step; an event only becomes
    takeable when its lane reaches it, when the last step it needs is taken, or (a bookie
    step heard at its receipt) when the client's lane reaches the receipt, and the
    frontier follows exactly those. It holds about the requests in flight.
    """

    def __init__(self, lt: LedgerTrace, marks_at_decided: bool = True) -> None:
        self.lt, self.lanes, self.replay = lt, lt.lanes, Replay(lt)
        self.marks_at_decided = marks_at_decided
        # The configuration that replayed the most events, and the moves refused there.
        self.deepest: tuple[int, Cursors, State, list[tuple[Event, str]]] | None = None
        self.dependents: dict[int, list[Event]] = {}
        self.handle_of: dict[int, Event] = {}  # a receipt -> the bookie step it answers
        # Lane -> its slot in the cursor tuple (lanes of several events), or -1 - its bit.
        self.slot: list[int] = []
        multi = single = 0
        for lane in lt.lanes:
            if len(lane) > 1:
                self.slot.append(multi)
                multi += 1
            else:
                self.slot.append(-1 - single)
                single += 1
        self.end: Cursors = (
            tuple(len(lane) for lane in lt.lanes if len(lane) > 1),
            (1 << single) - 1,
        )
        # Per event, its needs in one-event lanes as a mask of bits, and the others.
        self.need_bits: dict[int, int] = {}
        self.need_rest: dict[int, list[Event]] = {}
        for lane in lt.lanes:
            for ev in lane:
                bits, rest = 0, []
                for n in ev.needs:
                    k = self.slot[n.lane]
                    if k < 0:
                        bits |= 1 << (-1 - k)
                    else:
                        rest.append(n)
                self.need_bits[id(ev)], self.need_rest[id(ev)] = bits, rest
        for lane in lt.lanes:
            for ev in lane:
                for n in ev.needs:
                    self.dependents.setdefault(id(n), []).append(ev)
                if ev.receipt is not None:
                    self.handle_of[id(ev.receipt)] = ev

    def at(self, lane: int, cur: Cursors) -> int:
        """How many events of ``lane`` are done."""
        k = self.slot[lane]
        return cur[0][k] if k >= 0 else (cur[1] >> (-1 - k)) & 1

    def advance(self, cur: Cursors, lanes: list[int]) -> Cursors:
        tup, bits = list(cur[0]), cur[1]
        for lane in lanes:
            k = self.slot[lane]
            if k >= 0:
                tup[k] += 1
            else:
                bits |= 1 << (-1 - k)
        return tuple(tup), bits

    @staticmethod
    def depth(cur: Cursors) -> int:
        return sum(cur[0]) + cur[1].bit_count()

    def done(self, ev: Event, cur: Cursors) -> bool:
        return self.at(ev.lane, cur) > ev.pos

    def ready(self, ev: Event, cur: Cursors) -> bool:
        """Whether every step ``ev`` needs is done."""
        bits = self.need_bits[id(ev)]
        return cur[1] & bits == bits and all(self.done(n, cur) for n in self.need_rest[id(ev)])

    def start(self, cur: Cursors) -> frozenset[Event]:
        return frozenset(lane[0] for lane in self.lanes if lane and self.ready(lane[0], cur))

    def candidates(self, cur: Cursors, frontier: frozenset[Event]) -> list[tuple[Event, str]]:
        """Each frontier event that is its lane's next and whose needs are done, with how
        it is taken. A bookie's step whose answer the client took in goes with that
        receipt when the client's lane is there (``heard``); before it (``early``) where
        the bookie answered a later decision first; alone with its answer ``lost`` where
        the trace allows a lost answer. A receipt alone follows a step taken early or
        lost."""
        out: list[tuple[Event, str]] = []
        for ev in frontier:  # each its lane's next, its needs done (``_next_frontier``)
            rc = ev.receipt
            if ev.kind == "handle" and rc is not None:
                if self.at(rc.lane, cur) == rc.pos:
                    out.append((ev, HEARD))
                elif ev.early_ok and self.at(rc.lane, cur) < rc.pos:
                    out.append((ev, EARLY))
            if ev.kind != "handle" or rc is None or ev.lost_ok:
                out.append((ev, LOST))
        return sorted(out, key=lambda m: _when(m, self.marks_at_decided))

    def _next_frontier(
        self, frontier: frozenset[Event], cur: Cursors, taken: list[Event]
    ) -> frozenset[Event]:
        kept = frontier - set(taken)  # still their lanes' next, their needs still done
        new: set[Event] = set()
        for ev in taken:
            lane = self.lanes[ev.lane]
            if ev.pos + 1 < len(lane):
                head = lane[ev.pos + 1]
                new.add(head)
                handle = self.handle_of.get(id(head))
                if handle is not None:
                    new.add(handle)  # the client is at its receipt: it may be heard now
            new.update(self.dependents.get(id(ev), ()))
        return kept.union(
            e for e in new if e not in kept and self.at(e.lane, cur) == e.pos and self.ready(e, cur)
        )

    def expand(
        self, cur: Cursors, s: State, frontier: frozenset[Event]
    ) -> Iterator[tuple[Cursors, State, frozenset[Event]]]:
        refused: list[tuple[Event, str]] = []
        for ev, how in self.candidates(cur, frontier):
            taken = [ev]
            if how == HEARD and ev.receipt is not None:
                taken.append(ev.receipt)
            after = self.advance(cur, [e.lane for e in taken])
            try:
                for t in self.replay.moves(ev, s, how != LOST):
                    yield after, t, self._next_frontier(frontier, after, taken)
            except NotAllowedError as e:
                if e.definite:
                    raise _Definite(cur, s, ev, str(e)) from e
                refused.append((ev, str(e)))
        depth = self.depth(cur)
        if self.deepest is None or depth > self.deepest[0]:
            self.deepest = (depth, cur, s, refused)

    def stuck(self, cur: Cursors) -> str:
        """What the events left wait for, when none can be taken."""
        waits = []
        for i, lane in enumerate(self.lanes):
            if self.at(i, cur) < len(lane):
                ev = lane[self.at(i, cur)]
                need = [n for n in ev.needs if not self.done(n, cur)]
                if ev.receipt is not None and not need:
                    need = [ev.receipt]
                waits.append(f"{ev.describe()} waits for {need[0].describe() if need else '?'}")
        return "every event left waits for another: " + "; ".join(waits[:4])


def search(lt: LedgerTrace, budget: float = 60.0) -> Verdict:
    """Decide whether some behaviour of the spec explains ``lt`` (within ``budget`` s).

    With auditors' marks, half the budget goes to the order that tries each mark at
    ``decided``, and what is left, if that runs out, to the order that tries it at its
    line (``_when``). Either order is a whole search: a verdict from one is the verdict."""
    v = Verdict(lt.ledger, "unknown", steps=lt.steps)
    if lt.unknown:
        v.reason = lt.unknown
        return v
    if lt.steps == 0:
        v.verdict = "explained"
        return v
    marks = any(ev.line.action in MARKS for lane in lt.lanes for ev in lane)
    start = time.monotonic()
    first = _search(lt, budget / 2 if marks else budget, marks_at_decided=True)
    if not first.out_of_time or not marks:
        return first
    second = _search(lt, budget - (time.monotonic() - start), marks_at_decided=False)
    second.seconds += first.seconds
    second.configurations += first.configurations
    if second.out_of_time:
        second.reason = (
            f"the time budget ({budget:g} s) ran out after {second.configurations} "
            f"configurations, in two orders; with marks at decided: {first.reason}"
        )
    return second


def _search(lt: LedgerTrace, budget: float, *, marks_at_decided: bool) -> Verdict:
    """The depth-first search in one order of the moves (``_when``)."""
    v = Verdict(lt.ledger, "unknown", steps=lt.steps)
    assert lt.cfg is not None
    start = time.monotonic()
    sr = _Search(lt, marks_at_decided)
    cur0: Cursors = ((0,) * len(sr.end[0]), 0)
    s0 = p.initial_state(lt.cfg)
    seen: set[tuple[Cursors, State]] = {(cur0, s0)}
    stack = [sr.expand(cur0, s0, sr.start(cur0))]
    end = sr.end
    try:
        while stack:
            if time.monotonic() - start > budget:
                v.reason = (
                    f"the time budget ({budget:g} s) ran out after {len(seen)} configurations"
                )
                if sr.deepest is not None and sr.deepest[3]:
                    ev, why = sr.deepest[3][0]
                    v.reason += (
                        f"; deepest refusal after {sr.deepest[0]} steps: {ev.describe()}: {why}"
                    )
                v.seconds, v.configurations = time.monotonic() - start, len(seen)
                v.out_of_time = True
                return v
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                continue
            after, t, frontier = nxt
            known = len(seen)
            seen.add((after, t))  # hashed once: a state's hash costs the ledger's length
            if len(seen) == known:
                continue
            if after == end:
                v.verdict, v.replayed = "explained", lt.steps
                v.seconds, v.configurations = time.monotonic() - start, len(seen)
                return v
            stack.append(sr.expand(after, t, frontier))
    except _Definite as d:  # no order of the other events could allow this step
        sr.deepest = (sr.depth(d.cur), d.cur, d.s, [(d.ev, d.why)])
        definite = True
    else:
        definite = False
    v.seconds, v.configurations = time.monotonic() - start, len(seen)
    assert sr.deepest is not None
    depth, cur, s, refused = sr.deepest
    v.verdict, v.replayed = "violation", depth
    if refused:
        ev, why = refused[0]
        v.event, v.reason = ev.describe(), why
    else:
        v.event, v.reason = "the rest of the trace", sr.stuck(cur)
    v.state = _show_state(lt, s)
    v.offered = [p.format_label(label) for label, _t in p.next_states(lt.cfg, s)][:40]
    # A worker decides on a view it read before (the ledger, the live bookies), the spec's
    # worker on the state of the moment: a bookie back since, a copy already made. A
    # worker step no order explains is that gap, not a finding, unless it is definite.
    if not definite and refused and refused[0][0].line.action.startswith(("worker_", "auditor_")):
        v.verdict = "unknown"
        v.reason = (
            "an AutoRecovery step decided on a view read earlier (the spec's worker sees the "
            f"state of the moment); no order found explains {v.event}: {v.reason}"
        )
    return v


def _show_state(lt: LedgerTrace, s: State) -> str:
    """The spec state, projected on what a reader of this trace needs."""
    cfg = lt.cfg
    assert cfg is not None
    wl = cfg.writer_ledger
    lines = [
        f"metadata: {p.STATUS_NAMES[s.meta_status[wl]]} v{s.meta_version[wl]} "
        f"segments {list(s.meta_segments[wl])} last e{s.meta_last[wl]}",
        f"writer: {p.W_NAMES[s.w_status]} next e{s.w_next} LAC {s.w_lac}"
        + (f" change {list(s.w_change)}" if s.w_change is not None else ""),
    ]
    for b, name in enumerate(lt.bookies):
        synced, unsynced, fenced, lac = s.b_ledgers[b][wl]
        have = [e for e in range(cfg.entries) if (synced | unsynced) >> e & 1]
        lines.append(
            f"b{b} ({name}): {p.UP_NAMES[s.b_up[b]]} entries {have}"
            f"{' fenced' if fenced else ''} LAC {lac}"
        )
    for c, name in enumerate(lt.recoveries):
        r = p.recovery_of(s, c)
        lines.append(f"recovery {c} ({name}): {p.RC_NAMES[r.phase]} reading e{r.reading}")
    lines.append("in flight: " + (", ".join(p.show_message(m) for m in s.msgs) or "nothing"))
    return "\n".join(lines)
