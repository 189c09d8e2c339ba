"""One ledger's trace events as spec steps: the moves the search may take.

A move takes the next event of some lane whose causal needs are done and applies the
spec action it names, with its arguments mapped to the spec's; the move exists only if
the spec's action is enabled and its effect agrees with what the trace logged (the
requests sent, the answer given, the outcome of a metadata write). A refusal says why,
and whether another order of the events could allow it (``NotAllowedError.definite``);
the search over orders is ``bkref.tracecheck.search``.

Environment steps no node logs are taken where the trace implies them:

- a request no bookie ever took is lost as soon as it is sent (``network_loses_message``;
  losing it later would only keep it in flight longer, which no step needs);
- a bookie that answered with an error took nothing: its request is lost there;
- an answer its client never got (or got as a connection error) is a lost reply
  (``reply_lost``); an answer the client got may also be taken as lost, when the client
  ignored it (from a bookie replaced since);
- a bookie's ``bookie_restarts`` is preceded by ``bookie_crashes``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from bkref.spec import protocol as p
from bkref.spec.protocol import Msg, State
from bkref.tracecheck.autorecovery import own_bookie
from bkref.tracecheck.load import Line
from bkref.tracecheck.names import ADD, CAS, COPY, MARKS, RELEASE, TAKEN
from bkref.tracecheck.project import Event, LedgerTrace, Send


class NotAllowedError(Exception):
    """This move is not a spec step here (the message says why).

    ``definite``: no other order of the trace's events could allow it either (what it
    compares depends on its own node's earlier steps only), so the search can stop.
    """

    def __init__(self, message: str, *, definite: bool = False) -> None:
        super().__init__(message)
        self.definite = definite


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
        # (segment, bookie) of every worker swap in the trace: the bookie it wrote in.
        self.swapped_in = {
            (int(ev.line["segment"]), str(ev.line["bookie"]))
            for lane in lt.lanes
            for ev in lane
            if ev.line.action == CAS
        }
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
        elif ev.kind == "crash":
            b = self.lt.bookies.index(str(ev.line["bookie"]))
            t = self._down(s, b)
            if t is None:
                raise NotAllowedError(f"bookie b{b} cannot crash here")
            yield t
        elif ev.kind == "expire":  # an unmarked session expiry: see autorecovery.expiries
            b = self.lt.bookies.index(str(ev.line["bookie"]))
            t = p.bookie_loses_session(self.cfg, s, b) if s.b_up[b] == p.UP else s
            if t is None:
                raise NotAllowedError(f"bookie b{b} cannot lose its session here")
            yield t
        elif ev.kind == "restart":
            yield self._restart(ev, s)
        elif ev.kind == "register":
            yield from self._register(ev, s)
        elif ev.kind == "handle":
            yield from self._handle(ev, s, heard)
        else:
            yield from self._step(ev, s)

    def _down(self, s: State, b: int) -> State | None:
        """``s`` with bookie ``b`` crashed (as it is, if it is down already)."""
        return p.bookie_crashes(self.cfg, s, b) if s.b_up[b] in p.SERVING else s

    def _restart(self, ev: Event, s: State) -> State:
        """``bookie_crashes`` then ``bookie_restarts``; what the bookie replayed must be
        what the spec's bookie kept: every entry it stored, its fence and its LAC."""
        cfg, wl = self.cfg, self.cfg.writer_ledger
        b = self.lt.bookies.index(str(ev.line["bookie"]))
        t = self._down(s, b)
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
            if not sent and str(ev.line["bookie"]) in self.lt.dead_copy:
                continue  # that copy's too, its line lost with the process (``dead_copy``)
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
            # raised by copied entries' LACs: this order may have the worker's copy (its
            # own lane's step) after the restart, so the spec's bookie has not taken it yet
            b_lac = lac
        if lac != b_lac:
            raise NotAllowedError(
                f"b{b} came back with LAC {lac}; the spec's bookie has {b_lac}", definite=True
            )
        return t._replace(
            b_ledgers=p.set_ledger_on(t, b, wl, (synced, unsynced, f, b_lac)),
            b_signed=p.set_at(t.b_signed, b, tuple(signed)),
        )

    def _register(self, ev: Event, s: State) -> Iterator[State]:
        """A bookie registered in ZooKeeper: one whose session expired while it ran
        registers again (the spec's bookie does not restart: it never stopped). One the
        spec has registered lost its session unseen, unless an audit's mark taken after
        this names it lost: then it registers again now, and that audit read the
        registrations before it did (``auditor_marks_from_earlier_view``)."""
        b = self.lt.bookies.index(str(ev.line["bookie"]))
        if s.b_up[b] == p.UP:
            t = p.bookie_loses_session(self.cfg, s, b) if ev.marked_after else None
            if t is not None:
                yield from self._register(ev, t)
            yield s
            return
        t = p.bookie_registers_again(self.cfg, s, b)
        if t is None:
            # The mark before took it for crashed; the other choice is the mark's to try.
            raise NotAllowedError(
                f"b{b} registered again without a restart; the spec has it {p.UP_NAMES[s.b_up[b]]}"
            )
        yield t

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
                + (", ".join(p.show_message(m) for m in got) or "nothing")
                + "; the trace sent "
                + (", ".join(p.show_message(m) for m in want) or "nothing")
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
            if line.get("outcome") == "unknown":
                yield s  # a dead auditor's mark that may not have landed: no step
            yield from self._mark(ev, s)
            return
        if name.startswith("worker_"):
            yield self._worker(ev, s)
            if name == RELEASE and str(line.get("why", "")).startswith("failed"):
                yield from self._recorded(ev, s)
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
        if name == ADD:
            e = s.w_next
            if int(line["entry"]) != e or int(line["lac"]) != t.w_piggy[e]:
                raise NotAllowedError(
                    f"the spec's writer adds e{e} carrying LAC {t.w_piggy[e]}; the trace's "
                    f"adds e{line['entry']} carrying LAC {line['lac']}"
                )
        if outcome is not None and outcome != "unknown":
            self._check_outcome(name, str(outcome), line, s, t, args=args)
        yield self._checked_sends(ev, s, t)

    def _mark(self, ev: Event, s: State) -> Iterator[State]:
        """An auditor's mark. A bookie it marks lost that the spec has registered crashed
        or had its session expire while it ran (neither is logged, both are taken here):
        the projection's guess first (``LedgerTrace.cut_off``), then the other choice.
        One that registered again after the mark was decided may instead be one the audit
        read the registrations without (``auditor_marks_from_earlier_view``): that first."""
        lt, line = self.lt, ev.line
        replicas = {lt.bookies.index(str(b)): str(r) for b, r in line["replicas"].items()}
        lost = [b for b, why in sorted(replicas.items()) if why == "LOST" and s.b_up[b] == p.UP]
        came_back = {lt.bookies.index(b) for b in lt.came_back.get(id(line), ())}
        back = {b for b in lost if s.au_back >> b & 1 and b in came_back}
        cut = {lt.bookies.index(b) for b in lt.cut_off.get(id(line), ())}
        choices = [cut, set(lost) - cut] if lost else [cut]  # which of them lost a session
        tries = [(back, x) for x in choices if back] + [(set(), x) for x in choices]
        refusals: list[NotAllowedError] = []
        for early, expired in tries:
            t: State | None = s
            for b in lost:
                if t is not None and b not in early:
                    fn = p.bookie_loses_session if b in expired else p.bookie_crashes
                    t = fn(self.cfg, t, b)
            if t is None:
                refusals.append(NotAllowedError("a bookie is marked lost, and no fault is left"))
                continue
            try:
                yield self._audit(ev, replicas, t, early=bool(early))
            except NotAllowedError as e:
                refusals.append(e)
        if len(refusals) == len(tries):  # no choice led anywhere
            raise refusals[0]

    def _audit(
        self, ev: Event, replicas: dict[int, str], s: State, *, early: bool = False
    ) -> State:
        """The audit of an auditor's mark, from ``s`` where the bookies it marks lost are
        lost. An audit that no loss or election preceded is the spec's audit all the same:
        the spec's auditor audits only then, a reduction for the model checker (another
        audit marks the same bookies again, with a new task version), which a replay
        cannot assume; so is the audit that read the ledger before a worker's swap
        (``auditor_marks_from_earlier_scan``), where the mark names a bookie it replaced,
        with or without an earlier read of the registrations."""
        cfg, wl, line = self.cfg, self.cfg.writer_ledger, ev.line
        want = sum(1 << b for b in replicas)
        if line.action == "auditor_checks_ledger_replicas" and not want & ~s.meta_task[wl][1]:
            return s  # the check adds only bookies not listed yet: it wrote nothing
        if early:  # it read the registrations before bookies registered again
            ready = p.auditor_node(s) >= 0 and s.meta_autorecovery
            after = p.audit_from_earlier_view(s) if ready else None
            if ready and (after is None or want & ~after.meta_task[wl][1]):
                # and the ledger before a worker's swap: it names a bookie replaced
                after = p.audit_from_earlier_scan(cfg, s, wl, s.au_back) or after
        elif line.action == "auditor_checks_ledger_replicas" and "LOST" not in replicas.values():
            after = p.auditor_checks_ledger_replicas(cfg, s, wl)
        else:  # a bookie lost: what any audit marks
            after = p.auditor_marks_ledgers_of_lost_bookies(
                cfg, s
            ) or p.auditor_runs_periodic_bookie_check(cfg, s)
            if after is None and p.auditor_node(s) >= 0 and s.meta_autorecovery:
                after = p._audit(s)  # the spec's audit, see the docstring
            if after is not None and want & ~after.meta_task[wl][1]:
                # It read the ledger before a worker's swap: it names the bookie replaced.
                after = p.audit_from_earlier_scan(cfg, s, wl) or after
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
        own = own_bookie(line)
        w = self._worker_index(line)
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
                    # A copy is of a closed segment, whose entries no later step changes;
                    # but where a worker's swap brought the lost bookie into it, which
                    # entries it holds there depends on that swap having been replayed.
                    definite=(idx, str(line["lost"])) not in self.swapped_in,
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
        if t is None and name == RELEASE:
            # With fragments it could copy: a copy failed or found its repair slot busy
            # (the spec's environment step; bkref's worker logs why in ``why``).
            t = p.worker_fails_repair(cfg, s, w)
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
            deleted = s.meta_task[wl][0] == s.wk[w][2] and s.meta_task[wl][1] != 0
            if deleted != bool(line["deleted"]):
                raise NotAllowedError(
                    f"the spec's worker {'deletes' if deleted else 'cannot delete'} the task "
                    f"(version {s.meta_task[wl][0]}, read at {s.wk[w][2]}); the trace's "
                    f"{'deleted it' if line['deleted'] else 'did not'}"
                )
        return t

    def _worker_index(self, line: Line) -> int:
        """The spec's worker of a worker's step: the one beside its own bookie."""
        return self.cfg.bookies - 1 - self.lt.bookies.index(own_bookie(line))

    def _recorded(self, ev: Event, s: State) -> Iterator[State]:
        """A failed attempt's release that also counted the failure in the task, at the
        version another worker at work had read too (after a lost lock): it bumps it."""
        w = self._worker_index(ev.line)
        if s.wk[w][1] >= 0 and p.shares_task(s, w):
            t = p.worker_releases_lock(self.cfg, s, w, 1) or p.worker_fails_repair(
                self.cfg, s, w, 1
            )
            if t is not None:
                yield t

    def _check_outcome(
        self, name: str, outcome: str, line: Line, s: State, t: State, *, args: tuple[object, ...]
    ) -> None:
        """The spec's outcome of a metadata write must be the one the trace logged.

        bkref's ``ZkMetadataStore.cas_ledger`` counts a write whose answer was lost with
        the connection as done when it reads back exactly the metadata it wrote: a close
        that another client wrote first, identical, is "closed" for it too (``read_back``
        on its line; two recoveries of one ledger in a campaign's ZooKeeper-wide session
        expiry had one)."""
        last = line.get("last")
        wl = self.cfg.writer_ledger
        if name.startswith("writer_"):
            got = {p.W_OPEN: "written", p.W_CLOSED: "closed", p.W_WITHDRAWN: "withdrawn"}[
                t.w_status
            ]
            mine = (s.w_lac, s.w_segments)
        else:  # the recovery's close: it wrote, or found the ledger closed by another
            got = "closed" if s.meta_status[wl] == p.IN_RECOVERY else "lost"
            r = p.recovery_of(s, int(str(args[0])))
            mine = (r.last, r.segments)
        stored = (s.meta_last[wl], s.meta_segments[wl])
        if outcome == "closed" and line.get("read_back") and s.meta_status[wl] == p.CLOSED:
            got = "closed" if stored == mine else got  # another's identical close: see above
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
            raise NotAllowedError(f"no such request in flight: {p.show_message(m)}")
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
        # keeps before it (``order.conflict``), whatever the other nodes did: a
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
