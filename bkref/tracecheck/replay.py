"""The search for a spec behaviour that explains one ledger's trace.

A configuration is a position in every lane and a spec state. A move takes the next
event of some lane whose causal needs are done and applies the spec action it names,
with its arguments mapped to the spec's; the move exists only if the spec's action is
enabled and its effect agrees with what the trace logged (the requests sent, the answer
given, the outcome of a metadata write). The search is depth-first, tries the lanes'
next events in the order of their real times (so a run replays straight through unless
the spec needs another order), and remembers the configurations it has left behind.

Environment steps no node logs are taken where the trace implies them:

- a request no bookie ever took is lost as soon as it is sent (``network_loses_message``;
  losing it later would only keep it in flight longer, which no step needs);
- a bookie that answered with an error took nothing: its request is lost there;
- an answer its client never got (or got as a connection error) is a lost reply
  (``reply_lost``); an answer the client got may also be taken as lost, when the client
  ignored it (from a bookie replaced since);
- a bookie's ``bookie_restarts`` is preceded by ``bookie_crashes``.

Verdicts: ``explained`` (a behaviour replays every event), ``violation`` (no behaviour
does: reported at the configuration that replayed the most events, with the event that
no move allows, the spec's state there and the actions the spec offered), ``unknown``
(the time budget ran out, or the projection could not be made).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bkref.spec import protocol as p
from bkref.spec.protocol import Msg, State
from bkref.tracecheck.load import Line
from bkref.tracecheck.project import CAS, COPY, MARKS, TAKEN, Event, LedgerTrace, Send

# A position in every lane: the next event of each lane of several events (clients),
# and, as the bits of an int, which one-event lanes (bookie steps) are done. A ledger
# has a lane per bookie step: a tuple over them all, copied at every step, made long
# ledgers quadratic.
Cursors = tuple[tuple[int, ...], int]


class NotAllowedError(Exception):
    """This move is not a spec step here (the message says why).

    ``definite``: no other order of the trace's events could allow it either (what it
    compares depends on its own node's earlier steps only), so the search can stop.
    """

    def __init__(self, message: str, *, definite: bool = False) -> None:
        super().__init__(message)
        self.definite = definite


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


def _msg(lt: LedgerTrace, s: Send) -> Msg:
    b = lt.bookies.index(s.bookie)
    if s.kind == "add":
        rec = 0 if s.sender == "writer" else lt.recoveries.index(s.sender) + 1
        return (p.ADD, b, s.entry, s.lac, rec)
    c = lt.recoveries.index(s.sender) if s.sender != "writer" else -1
    if s.kind == "lac_read":
        if not s.fence:
            raise NotAllowedError(
                f"a LAC read to {s.bookie} without the fence flag: the spec's recovery fences",
                definite=True,
            )
        return (p.FENCE, b, -1, 0, c)
    return (p.READ, b, s.entry, 1 if s.fence else 0, c)


def _sent(before: State, after: State, consumed: Msg | None = None) -> list[Msg]:
    """The messages ``after`` has that ``before`` had not (a multiset difference)."""
    left = list(before.msgs)
    if consumed is not None:
        left.remove(consumed)
    out: list[Msg] = []
    for m in after.msgs:
        if m in left:
            left.remove(m)
        else:
            out.append(m)
    return out


class Replay:
    def __init__(self, lt: LedgerTrace) -> None:
        assert lt.cfg is not None
        self.lt, self.cfg = lt, lt.cfg
        # Whether any auditor marked the ledger (a worker's lock needs a task).
        self.marked = any(ev.line.action in MARKS for lane in lt.lanes for ev in lane)
        # Adds no bookie logged an answer to, by (spec bookie, entry).
        self.unanswered: dict[tuple[int, int], list[Send]] = {}
        for lane in lt.lanes:
            for ev in lane:
                for x in ev.sends:
                    if x.kind == "add" and x.handled is None:
                        key = (lt.bookies.index(x.bookie), x.entry)
                        self.unanswered.setdefault(key, []).append(x)
        # Per worker metadata write, the worker's last copy since it took the lock or
        # last wrote (None if there is none): BookKeeper's replicator, like the spec's
        # worker, writes a new replica only after copying the fragment to it.
        self.copy_before: dict[int, Line | None] = {}
        for lane in lt.lanes:
            copy: Line | None = None
            for ev in lane:
                if ev.line.action == COPY:
                    copy = ev.line
                elif ev.line.action == CAS:
                    self.copy_before[id(ev)] = copy
                    copy = None
                elif ev.line.action == "worker_acquires_ledger_lock":
                    copy = None

    # ------------------------------------------------------------ moves

    def moves(self, ev: Event, s: State, heard: bool = False) -> Iterator[State]:
        """The spec states ``ev`` may lead to from ``s``; NotAllowedError if none."""
        if ev.kind == "receipt":
            yield s  # its answer was folded into the bookie's step
        elif ev.kind == "restart":
            yield self._restart(ev, s)
        elif ev.kind == "register":
            yield self._register(ev, s)
        elif ev.kind == "handle":
            yield from self._handle(ev, s, heard)
        else:
            yield from self._step(ev, s)

    def _restart(self, ev: Event, s: State) -> State:
        """``bookie_crashes`` then ``bookie_restarts``; what the bookie replayed must be
        what the spec's bookie kept: every entry it stored, its fence and its LAC."""
        cfg, wl = self.cfg, self.cfg.writer_ledger
        b = self.lt.bookies.index(str(ev.line["bookie"]))
        t = p.bookie_crashes(cfg, s, b) if s.b_up[b] == p.UP else s
        t = None if t is None else p.bookie_restarts(cfg, t, b)
        if t is None:
            raise NotAllowedError(f"bookie b{b} cannot crash and restart here")
        came = ev.line.get("ledgers", {}).get(str(self.lt.ledger))
        mask, fenced, lac = (
            (int(came["entries"], 16), came["fenced"], came["lac"]) if came else (0, False, -1)
        )
        synced, unsynced, f, b_lac = p.ledger_on(t, b, wl)
        lost = (synced | unsynced) & ~mask
        if lost:
            raise NotAllowedError(
                f"b{b} came back without {_entries(lost)}, which it had stored and answered "
                "for: the spec's bookie keeps every entry it acknowledged",
                # What it had is its own earlier steps' doing in any order, unless a worker
                # copied to it: the spec's copy stores at once, and a copy its lane made after
                # the restart may stand earlier in this order (a campaign on a random seed
                # had one cry wolf here).
                definite=str(ev.line["bookie"]) not in self.lt.copied_to,
            )
        # Entries a failed copy left on it are not the spec's to compare.
        stray = sum(1 << e for e in self.lt.stray.get(str(ev.line["bookie"]), ()))
        # An entry the bookie made durable but crashed before answering: its request was
        # taken with the reply lost, not lost (the search lost it when it was sent).
        signed = list(t.b_signed[b])
        for e in _bits(mask & ~synced & ~stray):
            sent = [x for x in self.unanswered.get((b, e), []) if not f or x.sender != "writer"]
            if not sent:
                raise NotAllowedError(
                    f"b{b} came back with e{e}, which no client sent it",
                    # A worker's copy (a step of another lane) may yet have brought it.
                    definite=str(ev.line["bookie"]) not in self.lt.copied_to,
                )
            synced |= 1 << e
            b_lac = max(b_lac, sent[0].lac)
            signed[e] = sent[0].lac
        if f and not fenced:
            raise NotAllowedError(
                f"b{b} came back unfenced; the spec's bookie keeps its fence", definite=True
            )
        if str(ev.line["bookie"]) in self.lt.copied_to and lac >= b_lac:
            b_lac = lac  # raised by copied entries' LACs, which the spec's copy leaves out
        if lac != b_lac:
            raise NotAllowedError(
                f"b{b} came back with LAC {lac}; the spec's bookie has {b_lac}", definite=True
            )
        return t._replace(
            b_ledgers=p.set_ledger_on(t, b, wl, (synced, unsynced, f, b_lac)),
            b_signed=p.set_at(t.b_signed, b, tuple(signed)),
        )

    def _register(self, ev: Event, s: State) -> State:
        """A bookie registered in ZooKeeper. One the spec has down was marked lost by the
        auditor while its session had expired (a pause, a partition from ZooKeeper):
        for the spec it crashed then and restarts now, with what it had (where it
        answered in between, the ledger has a ``caveat``: see ``project._cut_off``)."""
        b = self.lt.bookies.index(str(ev.line["bookie"]))
        if s.b_up[b] == p.UP:
            return s
        t = p.bookie_restarts(self.cfg, s, b)
        if t is None:
            raise NotAllowedError(f"b{b} cannot restart here")
        return t

    def _checked_sends(self, ev: Event, s: State, t: State, consumed: Msg | None = None) -> State:
        """``t`` if the spec's step sent what the trace did; a write-back the trace left
        out for a bookie its recovery is replacing is lost, and so is a request no
        bookie took."""
        want = sorted(_msg(self.lt, x) for x in ev.sends)
        got = sorted(_sent(s, t, consumed))
        skips = {self.lt.bookies.index(b) for b in ev.skips if b in self.lt.bookies}
        extra = list(got)
        for m in want:
            if m in extra:
                extra.remove(m)
        if len(got) - len(extra) != len(want) or any(
            m[0] != p.ADD or m[1] not in skips for m in extra
        ):
            raise NotAllowedError(
                "the spec's step sends "
                + (", ".join(p._show(m) for m in got) or "nothing")
                + "; the trace sent "
                + (", ".join(p._show(m) for m in want) or "nothing")
            )
        lost = extra + [_msg(self.lt, x) for x in ev.sends if x.handled is None and x.kind == "add"]
        for m in lost:
            u = p.network_loses_message(self.cfg, t, m)
            if u is None:
                raise NotAllowedError("no message loss left for a request no bookie took")
            t = u
        return t

    def _step(self, ev: Event, s: State) -> Iterator[State]:
        cfg, lt, line = self.cfg, self.lt, ev.line
        name = line.action
        fn: Callable[..., State | None] | None = getattr(p, name, None)
        if fn is None or fn not in p.ACTIONS:
            raise NotAllowedError(f"{name} is not an action of the spec")
        if name in MARKS:
            yield self._mark(ev, s)
            return
        if name.startswith("worker_"):
            yield self._worker(ev, s)
            return
        args: tuple[object, ...] = ()
        if name == "writer_creates_ledger":
            args = (tuple(lt.bookies.index(str(b)) for b in line["ensemble"]),)
        elif name.endswith("_changes_ensemble"):
            args = (lt.bookies.index(str(line["failed"])), lt.bookies.index(str(line["new"])))
        elif name.endswith("_resends_add"):
            args = (int(line["entry"]), lt.bookies.index(str(line["bookie"])))
        if name.startswith("recovery_client_"):
            args = (lt.recoveries.index(str(line["rc"])), *args)
        outcome = line.get("outcome")
        if outcome == "unknown":
            yield s  # the metadata write may not have landed: no step
        t = fn(cfg, s, *args)
        if t is None:
            raise NotAllowedError(f"the spec does not enable {name} here")
        if name == "writer_sends_add":
            e = s.w_next
            if int(line["entry"]) != e or int(line["lac"]) != t.w_piggy[e]:
                raise NotAllowedError(
                    f"the spec's writer adds e{e} carrying LAC {t.w_piggy[e]}; the trace's "
                    f"adds e{line['entry']} carrying LAC {line['lac']}"
                )
        if outcome is not None and outcome != "unknown":
            self._check_outcome(name, str(outcome), line.get("last"), s, t)
        yield self._checked_sends(ev, s, t)

    def _mark(self, ev: Event, s: State) -> State:
        """An auditor's mark. A bookie it marks lost has crashed for the spec (the crash
        no node logs is taken here, if the spec's bookie is still up). An audit that no
        loss or election preceded is the spec's audit all the same: the spec's auditor
        audits only then, a reduction for the model checker (another audit marks the
        same bookies again, with a new task version), which a replay cannot assume."""
        cfg, lt, wl, line = self.cfg, self.lt, self.cfg.writer_ledger, ev.line
        replicas = {lt.bookies.index(str(b)): str(r) for b, r in line["replicas"].items()}
        for b, why in sorted(replicas.items()):
            if why == "LOST" and s.b_up[b] == p.UP:
                t = p.bookie_crashes(cfg, s, b)
                if t is None:
                    raise NotAllowedError(f"b{b} is marked lost, and no crash is left")
                s = t
        want = sum(1 << b for b in replicas)
        if line.action == "auditor_checks_ledger_replicas" and not want & ~s.meta_task[wl][1]:
            return s  # the check adds only bookies not listed yet: it wrote nothing
        if line.action == "auditor_checks_ledger_replicas" and "LOST" not in replicas.values():
            after = p.auditor_checks_ledger_replicas(cfg, s, wl)
        else:  # a bookie lost: what any audit marks
            after = p.auditor_marks_ledgers_of_lost_bookies(
                cfg, s
            ) or p.auditor_runs_periodic_bookie_check(cfg, s)
            if after is None and p.auditor_node(s) >= 0 and s.meta_autorecovery:
                after = p._audit(s)  # the spec's audit, see the docstring
        if after is None:
            raise NotAllowedError(f"the spec does not enable {line.action} here")
        marked = after.meta_task[wl][1]
        if want & ~marked or after.meta_task[wl][0] == s.meta_task[wl][0]:
            raise NotAllowedError(
                f"the spec's task lists {_bookies(marked)} after the mark; the trace marks "
                f"{_bookies(want)}"
            )
        return after

    def _worker(self, ev: Event, s: State) -> State:
        """A replication worker's step; its worker is the one beside its bookie."""
        cfg, lt, wl, line = self.cfg, self.lt, self.cfg.writer_ledger, ev.line
        name = line.action
        own = str(line["bookie"] if name in (COPY, CAS) else line["worker"])
        w = cfg.bookies - 1 - lt.bookies.index(own)
        t: State | None
        if name == COPY:
            idx, lost = int(line["segment"]), lt.bookies.index(str(line["lost"]))
            t = p.worker_copies_fragment(cfg, s, w, idx, lost)
            if t is None:
                raise NotAllowedError(f"the spec's worker cannot copy b{lost}'s fragment here")
            segs = s.meta_segments[wl]
            want = sum(
                1 << e
                for e in range(segs[idx][0], p.segment_end(s, cfg, wl, idx) + 1)
                if p.write_set(cfg, segs, e) >> lost & 1
            )
            got = sum(1 << int(e) for e in line["entries"])
            stored = sum(1 << x.entry for x in ev.copies if x.status == "OK")
            if got != want or stored != want:
                raise NotAllowedError(
                    f"the spec's worker copies {_entries(want)}; the trace's copied "
                    f"{_entries(got)}, of which the target stored {_entries(stored)}",
                    # A copy is of a closed segment, whose entries no later step changes.
                    definite=True,
                )
            return t
        args = (w, wl) if name == "worker_acquires_ledger_lock" else (w,)
        if name == CAS:
            # What the worker copied is its own earlier step: whatever the other nodes
            # did, a write that does not follow a copy of its fragment is refused.
            idx, lost = int(line["segment"]), lt.bookies.index(str(line["lost"]))
            copy = self.copy_before[id(ev)]
            if copy is None:
                raise NotAllowedError(
                    f"the worker wrote itself in place of b{lost} in segment {idx} without "
                    "copying that fragment first (no copy of it since it took the lock or "
                    "last wrote the metadata)",
                    definite=True,
                )
            if (int(copy["segment"]), str(copy["lost"])) != (idx, str(line["lost"])):
                raise NotAllowedError(
                    f"the worker copied segment {copy['segment']} of "
                    f"b{lt.bookies.index(str(copy['lost']))}; its write replaces b{lost} in "
                    f"segment {idx}",
                    definite=True,
                )
        t = getattr(p, name)(cfg, s, *args)
        if t is None and name == "worker_acquires_ledger_lock" and not self.marked:
            raise NotAllowedError(
                "a worker took the lock of a ledger no auditor marked: it has no task",
                definite=True,  # no mark anywhere in the trace: no order makes a task
            )
        if t is None:
            raise NotAllowedError(f"the spec does not enable {name} for worker w{w} here")
        if name == CAS:
            ens = t.meta_segments[wl][idx][1]
            if lt.bookies.index(own) not in ens or lost in ens:
                raise NotAllowedError(
                    f"the spec's segment {idx} is {list(ens)} after the worker's write; the "
                    f"trace's write replaced b{lost} by b{lt.bookies.index(own)}"
                )
        elif name == "worker_deletes_task":
            deleted = s.meta_task[wl][0] == s.wk[w][2]
            if deleted != bool(line["deleted"]):
                raise NotAllowedError(
                    f"the spec's worker {'deletes' if deleted else 'cannot delete'} the task "
                    f"(version {s.meta_task[wl][0]}, read at {s.wk[w][2]}); the trace's "
                    f"{'deleted it' if line['deleted'] else 'did not'}"
                )
        return t

    def _check_outcome(self, name: str, outcome: str, last: object, s: State, t: State) -> None:
        """The spec's outcome of a metadata write must be the one the trace logged."""
        wl = self.cfg.writer_ledger
        if name.startswith("writer_"):
            got = {p.W_OPEN: "written", p.W_CLOSED: "closed", p.W_WITHDRAWN: "withdrawn"}[
                t.w_status
            ]
        else:  # the recovery's close: it wrote, or found the ledger closed by another
            got = "closed" if s.meta_status[wl] == p.IN_RECOVERY else "lost"
        if got != outcome:
            raise NotAllowedError(f"in the spec {name} ends {got}; in the trace it ended {outcome}")
        if outcome == "closed" and last is not None and int(str(last)) != t.meta_last[wl]:
            raise NotAllowedError(
                f"the spec closes the ledger at e{t.meta_last[wl]}; the trace closed it at e{last}"
            )

    def _handle(self, ev: Event, s: State, heard: bool) -> Iterator[State]:
        """The bookie's step, its answer folded into its client (``heard``: at the
        client's receipt of it) or lost (the client never took it in)."""
        cfg, line = self.cfg, ev.line
        assert ev.request is not None
        m = _msg(self.lt, ev.request)
        status = str(line["status"])
        if m not in s.msgs:
            raise NotAllowedError(f"no such request in flight: {p._show(m)}")
        if status not in TAKEN:  # the bookie took nothing: for the spec, a lost request
            if m[0] != p.ADD:
                yield s  # a lost read is one the recovery waits for forever
                return
            t = p.network_loses_message(cfg, s, m)
            if t is None:
                raise NotAllowedError("no message loss left")
            yield t
            return
        if heard and ev.receipt is not None and str(ev.receipt.line["status"]) != status:
            raise NotAllowedError(
                f"the client got {ev.receipt.line['status']}, not this {status} answer"
            )
        # _BOOKIE_OWN: what a bookie answers (stored or fenced, its LAC, found or not)
        # depends only on its own earlier steps of this ledger that the answer's order
        # keeps before it (``project.conflict``), whatever the other nodes did: a
        # disagreement here is definite.
        kind, b = m[0], m[1]
        _synced, _unsynced, fenced, lac = p.ledger_on(s, b, cfg.writer_ledger)
        if kind == p.ADD:
            ok = not fenced or bool(m[4])
            if ok != (status == "OK"):
                raise NotAllowedError(
                    f"the spec's b{b} {'stores' if ok else 'refuses (fenced)'} the add; "
                    f"the bookie answered {status}",
                    definite=True,  # see _BOOKIE_OWN
                )
        elif kind == p.FENCE:
            if line.get("lac") != lac:
                raise NotAllowedError(
                    f"the spec's b{b} has LAC {lac}; the bookie answered {line.get('lac')}",
                    definite=True,
                )
        else:
            stored = p.ledger_on(s, b, cfg.writer_ledger)
            found = bool((stored[0] | stored[1]) >> m[2] & 1)
            if found != bool(line["found"]):
                raise NotAllowedError(
                    f"the spec's b{b} {'has' if found else 'lacks'} e{m[2]}; the bookie "
                    f"answered {'found' if line['found'] else 'no such entry'}",
                    definite=True,
                )
        t = p.HANDLERS[kind](cfg, s, m, 0 if heard else 1)
        if t is None:
            raise NotAllowedError("no message loss left for a lost reply")
        yield self._checked_sends(ev, s, t, consumed=m)


def _bits(mask: int) -> list[int]:
    return [e for e in range(mask.bit_length()) if mask >> e & 1]


def _entries(mask: int) -> str:
    return ", ".join(f"e{e}" for e in _bits(mask)) or "nothing"


def _bookies(mask: int) -> str:
    return "[" + ", ".join(f"b{b}" for b in _bits(mask)) + "]"


HEARD, EARLY, LOST = "heard", "early", "lost"
_PREFERENCE = {HEARD: 0, LOST: 1, EARLY: 2}


def _when(move: tuple[Event, str]) -> tuple[int, int]:
    """Moves are tried in the order of their real times (a heard answer at the client's
    receipt of it), and an event heard before lost, lost before folded early."""
    ev, how = move
    t = ev.receipt.t if how != LOST and ev.receipt is not None else ev.t
    return (t, _PREFERENCE[how])


class _Search:
    """Depth-first over configurations (lane positions, spec state), remembering the
    configurations it has been to, and the deepest one (for the report).

    Each configuration carries its *frontier*: the events that may be taken there. A
    ledger has a lane per bookie step, so scanning every lane for its next event would
    cost the number of events per step; an event only becomes takeable when its lane
    reaches it, when a step it needs is taken, or (a bookie step heard at its receipt)
    when the client's lane reaches the receipt, and the frontier follows exactly those.
    """

    def __init__(self, lt: LedgerTrace) -> None:
        self.lt, self.lanes, self.replay = lt, lt.lanes, Replay(lt)
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

    def start(self) -> frozenset[Event]:
        return frozenset(lane[0] for lane in self.lanes if lane)

    def candidates(self, cur: Cursors, frontier: frozenset[Event]) -> list[tuple[Event, str]]:
        """Each frontier event that is its lane's next and whose needs are done, with how
        it is taken. A bookie's step whose answer the client took in goes with that
        receipt when the client's lane is there (``heard``); before it (``early``) where
        the bookie answered a later decision first; alone with its answer ``lost`` where
        the trace allows a lost answer. A receipt alone follows a step taken early or
        lost."""
        out: list[tuple[Event, str]] = []
        for ev in frontier:
            if self.at(ev.lane, cur) != ev.pos or not self.ready(ev, cur):
                continue
            rc = ev.receipt
            if ev.kind == "handle" and rc is not None:
                if self.at(rc.lane, cur) == rc.pos:
                    out.append((ev, HEARD))
                elif ev.early_ok and self.at(rc.lane, cur) < rc.pos:
                    out.append((ev, EARLY))
            if ev.kind != "handle" or rc is None or ev.lost_ok:
                out.append((ev, LOST))
        return sorted(out, key=_when)

    def _next_frontier(
        self, frontier: frozenset[Event], cur: Cursors, taken: list[Event]
    ) -> frozenset[Event]:
        new = set(frontier) - set(taken)
        for ev in taken:
            lane = self.lanes[ev.lane]
            if ev.pos + 1 < len(lane):
                head = lane[ev.pos + 1]
                new.add(head)
                handle = self.handle_of.get(id(head))
                if handle is not None:
                    new.add(handle)  # the client is at its receipt: it may be heard now
            new.update(self.dependents.get(id(ev), ()))
        return frozenset(e for e in new if self.at(e.lane, cur) == e.pos)

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
    """Decide whether some behaviour of the spec explains ``lt`` (within ``budget`` s)."""
    v = Verdict(lt.ledger, "unknown", steps=lt.steps)
    if lt.unknown:
        v.reason = lt.unknown
        return v
    if lt.steps == 0:
        v.verdict = "explained"
        return v
    assert lt.cfg is not None
    start = time.monotonic()
    sr = _Search(lt)
    cur0: Cursors = ((0,) * len(sr.end[0]), 0)
    s0 = p.initial_state(lt.cfg)
    seen: set[tuple[Cursors, State]] = {(cur0, s0)}
    stack = [sr.expand(cur0, s0, sr.start())]
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
                if lt.caveat:  # what may be why no order was found in time
                    v.reason = f"{lt.caveat}; {v.reason}"
                v.seconds, v.configurations = time.monotonic() - start, len(seen)
                return v
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                continue
            after, t, frontier = nxt
            if (after, t) in seen:
                continue
            seen.add((after, t))
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
    # Never cry wolf where the model and the run part ways, unless no order of the other
    # nodes' steps could matter (a definite refusal: a bookie's own answers and replay).
    if lt.caveat and not definite:
        v.verdict = "unknown"
        v.reason = f"{lt.caveat}; no order found explains {v.event}: {v.reason}"
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
    lines.append("in flight: " + (", ".join(p._show(m) for m in s.msgs) or "nothing"))
    return "\n".join(lines)
