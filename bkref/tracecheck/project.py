"""A run's traces projected on one ledger: lanes of events, and the spec config they need.

The spec models one writer's ledger, so a run is checked ledger by ledger. For ledger
``L`` the projection keeps the steps that name ``L`` (and the bookies' restarts), and
turns them into *lanes*, one per node, each in the node's own order:

- a client step (``writer_*``, ``recovery_client_*``) is one spec step, with the requests
  it sent;
- a bookie's step (``bookie_handles_*``) and the client's receipt of its answer
  (``*_receives_*``, same request) are one spec step: the spec folds the answer into the
  bookie's step. It sits in the bookie's lane and needs the request's send; the
  receipt stays in the client's lane as a marker that needs the bookie's step. So the
  joined step may fall anywhere between the send and the receipt, as a delayed answer
  may;
- a bookie's ``bookie_restarts`` (a crash before it is never logged), and its
  registrations in ZooKeeper (one after the auditor saw it lost is its coming back);
- AutoRecovery's steps of the ledger: an auditor's marks (one lane per auditor node)
  and a worker's attempts (one lane per worker), less their no-ops
  (``bkref.tracecheck.autorecovery.steps``); a copy's adds are part of the copy step.

Real names become the spec's: bookies are numbered in the order they enter the ledger
(the first ensemble, then replacements), recovery clients in the order they start.
What cannot be projected faithfully makes the ledger *unknown*, with the reason, never a
violation (a client that left no trace took steps or created it; two writers).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

from bkref.spec.config import Config
from bkref.tracecheck import autorecovery
from bkref.tracecheck.bounds import trace_config
from bkref.tracecheck.load import CONNECTED, REGISTERED, REPLACEMENT, STOPPED, Line
from bkref.tracecheck.names import COPY, HANDLES, MARKS, RECEIPTS, TAKEN
from bkref.tracecheck.order import order_conflicts

Key = tuple[str, str, int]  # (client node, bookie, request id): one request
NOT_DESCRIBED = ("sends", "peer", "ledger", "ledgers")  # a restart's ledgers: every ledger's


@dataclass
class Send:
    """A request as its client logged it."""

    key: Key
    kind: str  # add, read, lac_read
    bookie: str
    entry: int
    lac: int
    fence: bool
    sender: str  # "writer", or the recovery's name
    by: Event | None = None  # the spec step that sends it
    handled: Event | None = None  # the bookie's step that takes it, if any
    status: str = ""  # a copy's add: how the target answered ("": no answer logged)


@dataclass(eq=False)
class Event:
    kind: str  # step, handle, receipt, crash, restart, register, expire
    line: Line
    lane: int = -1
    pos: int = -1
    sends: list[Send] = field(default_factory=list)  # requests the spec step must send
    # Bookies a recovery has decided to replace and not yet replaced: the spec's step may
    # send them write-backs that the trace leaves out (lost on the way, for the spec).
    skips: list[str] = field(default_factory=list)
    request: Send | None = None  # handle: the request it takes
    receipt: Event | None = None  # handle: the client's receipt of the answer
    # handle: whether its answer may count as lost although the client got it: the
    # client timed the bookie out (replaced it) before it took the answer in.
    lost_ok: bool = True
    # handle: whether its answer may be folded in before the client's receipt of it: the
    # bookie answered a later decision of its first (a fence's answer waits for the
    # journal, a refusal does not), and the client took that one in first.
    early_ok: bool = False
    # register: a mark decided before it and logged after it names its bookie lost (that
    # audit read the registrations before the bookie came back).
    marked_after: bool = False
    needs: list[Event] = field(default_factory=list)
    copies: list[Send] = field(default_factory=list)  # a worker's copy: the adds it sent
    # When the search tries it first, where that is not its line's time: a restart where
    # its bookie registered after it (the spec's restart registers at once); a crash no
    # earlier than the ledger's creation when the writer chose the bookie then.
    prefer_at: int | None = None

    @property
    def t(self) -> int:
        return self.line.t

    def describe(self) -> str:
        args = {k: v for k, v in self.line.args.items() if k not in NOT_DESCRIBED}
        shown = ", ".join(f"{k}={v}" for k, v in args.items())
        return f"{self.line.where()} {self.line.action}({shown})"


@dataclass
class LedgerTrace:
    ledger: int
    lanes: list[list[Event]] = field(default_factory=list)
    bookies: list[str] = field(default_factory=list)  # spec bookie index -> bookie id
    recoveries: list[str] = field(default_factory=list)  # recovery client index -> name
    cfg: Config | None = None
    unknown: str = ""  # why the ledger cannot be checked, if it cannot
    # Auditor mark (``id`` of its line) -> bookies it marked lost whose ZooKeeper session
    # had expired while they ran (``autorecovery.cut_off``): the rest had crashed.
    cut_off: dict[int, set[str]] = field(default_factory=dict)
    # Auditor mark (``id`` of its line) -> bookies it marked lost that registered again
    # after it was decided and before it was logged: it read the registrations before.
    came_back: dict[int, set[str]] = field(default_factory=dict)
    # Bookie id -> entries that copies which then failed left on it: no metadata names
    # them there and the spec's copy never made them (it is whole or not at all).
    stray: dict[str, set[int]] = field(default_factory=dict)
    # Bookies copies were sent to: a copied entry carries the LAC it was written with,
    # which raises the target's LAC; the spec's copy leaves the LAC as it was.
    copied_to: set[str] = field(default_factory=set)
    # Bookies a copy was under way to when its worker died (their adds of the ledger
    # answered, no copy logged): their handle lines follow the journal's fsync, so the
    # last adds' lines may have died with the process (the bookie's own, when one process
    # ran both) while a restart replays the entries.
    dead_copy: set[str] = field(default_factory=set)
    steps: int = 0

    def bookie(self, bookie_id: str) -> int:
        if bookie_id not in self.bookies:
            self.bookies.append(bookie_id)
        return self.bookies.index(bookie_id)


def _with(x: Line, **args: object) -> Line:
    return Line(x.node, x.seq, x.t, x.action, x.args | args)


def _steps(lines: list[Line], ledger: int) -> list[Line]:
    """A client's spec steps for ``ledger``.

    An ensemble change is logged when it is decided, and a ``replacement`` line names
    the bookie chosen later; a change for which none was found never happened (the
    client gave up). The writer holds its acks and sends nothing from the decision on,
    so its change is the spec step there. A recovery keeps writing back meanwhile, to
    every bookie but the failed one, and sends to the new one when it is chosen: its
    change is the spec step at the choice, and the write-backs it left out before are
    requests the spec sends and the network loses (``skips``). A writer whose change
    found no bookie stops at the decision.
    """
    out: list[Line] = []
    pending: dict[tuple[object, object], int] = {}
    skipping: dict[object, set[str]] = defaultdict(set)  # recovery -> failed bookies
    dropped: set[int] = set()
    stopped: set[object] = set()  # recoveries that gave up: their later lines are unheard
    for x in lines:
        if x.get("ledger") != ledger or x.action == CONNECTED:
            continue
        rc, failed = x.get("rc"), x.get("failed")
        if x.action == STOPPED:
            stopped.add(rc)
        if rc is not None and rc in stopped:
            continue
        step = x
        if x.action == "writer_changes_ensemble":
            pending[(rc, failed)] = len(out)
        elif x.action == "recovery_client_changes_ensemble":
            skipping[rc].add(str(failed))
            continue
        elif x.action == REPLACEMENT:
            skipping[rc].discard(str(failed))
            i = pending.pop((rc, failed), None)
            if i is not None and x["new"] is not None:  # the writer's: at its decision
                out[i] = _with(out[i], new=x["new"])
            elif i is not None:
                dropped.add(i)
            if i is not None or x["new"] is None or rc is None:
                continue
            step = Line(x.node, x.seq, x.t, "recovery_client_changes_ensemble", x.args)
        if skipping.get(rc):
            step = _with(step, skips=sorted(skipping[rc]))
        out.append(step)
    # A writer that found no replacement fails (its adds fail, it closes nothing), and
    # from its decision on it held its acks and sent nothing: for the spec it stopped
    # there, its answers unheard. A recovery carries on without the bookie.
    gave_up = set(pending.values()) | dropped
    stop = min((i for i in gave_up if out[i].get("rc") is None), default=len(out))
    return [
        x for i, x in enumerate(out) if i not in gave_up and (i < stop or x.get("rc") is not None)
    ]


def _is_bookie(lines: list[Line]) -> bool:
    return any(x.action.startswith("bookie_") for x in lines)


class _Peers:
    """(bookie, client end) -> the client node that opened that connection, at a time.

    Behind NAT (the netns and Docker backends forward each bookie's address) the bookie
    sees another address than the client's own end, usually with the same port: the
    port alone is tried next."""

    def __init__(self, nodes: dict[str, list[Line]]) -> None:
        self._by: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
        for node, lines in nodes.items():
            for x in lines:
                if x.action == CONNECTED:
                    bookie, local = str(x["bookie"]), str(x["local"])
                    self._by[(bookie, local)].append((x.t, node))
                    self._by[(bookie, ":" + local.rsplit(":", 1)[-1])].append((x.t, node))
        for v in self._by.values():
            v.sort()

    def nodes(self, bookie: str, peer: str, t: int, *, every: bool = False) -> list[str]:
        """The client nodes that may have sent from ``peer``: by address, then by port,
        the last to open such a connection before ``t`` first (or the first after).
        ``every``: then all the others, latest first. Two nodes in different network
        namespaces can both open 127.0.0.1:P to a bookie, and the bookie sees the later
        one's through NAT (netns soak seed 75: the last opener was not the sender)."""
        out: list[str] = []
        for key in ((bookie, peer), (bookie, ":" + peer.rsplit(":", 1)[-1])):
            opened = self._by.get(key, [])
            i = bisect.bisect_right(opened, (t, "\uffff"))
            last = opened[max(i - 1, 0) : i or 1]  # the last before t, or the first after
            order = [*reversed(opened[:i]), *opened[i:]] if every else last
            out += [n for _, n in order if n not in out]
        return out


def _answers(x: Line, send: Send) -> bool:
    """Whether bookie step ``x`` can be the handling of request ``send``."""
    if x.action == "bookie_handles_add":
        return send.kind == "add" and send.entry == x["entry"]
    if x.action == "bookie_handles_recovery_read":
        return send.kind == "read" and send.entry == x["entry"]
    return send.kind == "lac_read"


class Run:
    """A run's traces, read once: every node's lines, indexed by ledger."""

    def __init__(self, nodes: dict[str, list[Line]]) -> None:
        self.nodes = nodes
        self.peers = _Peers(nodes)
        self.bookies = {n for n, lines in nodes.items() if _is_bookie(lines)}
        self.dead = autorecovery.dead_audits(nodes)  # auditors killed in an audit
        self.by_ledger: dict[int, dict[str, list[Line]]] = defaultdict(lambda: defaultdict(list))
        # Bookie node -> its restarts and its registrations in ZooKeeper.
        self.restarts: dict[str, list[Line]] = defaultdict(list)
        for n, lines in nodes.items():
            for x in lines:
                if "ledger" in x.args:
                    self.by_ledger[int(x["ledger"])][n].append(x)
                elif x.action in ("bookie_restarts", REGISTERED):
                    self.restarts[n].append(x)

    def ledgers(self) -> list[int]:
        return sorted(self.by_ledger)


def project(run: Run, ledger: int) -> LedgerTrace:
    """The lanes of ``ledger``, or a trace marked unknown with the reason."""
    lt = LedgerTrace(ledger)
    peers = run.peers
    lines_of = autorecovery.with_unlogged_mark(run.dead, ledger, run.by_ledger.get(ledger, {}))
    mine = {
        n: lines if n in run.bookies else _steps(lines, ledger) for n, lines in lines_of.items()
    }
    copies = [
        (n, x) for n, v in mine.items() if n not in run.bookies for x in v if x.action == COPY
    ]
    lt.copied_to = {str(x["bookie"]) for _, x in copies}
    failed = [(n, x) for n, x in copies if x.get("outcome") != "copied"]
    for n, v in mine.items():
        if n not in run.bookies:
            mine[n] = autorecovery.steps(v)
    why = autorecovery.unknown(mine)
    if why:
        lt.unknown = why
        return lt
    lt.cut_off = autorecovery.cut_off(run.restarts, mine)
    mine = {n: v for n, v in mine.items() if v}
    after_loss, unlocked_copies = autorecovery.lock_losses(mine)
    failed += [(x.node, x) for x in unlocked_copies]
    bookie_nodes = {n for n in mine if n in run.bookies}
    creates = [x for n, v in mine.items() for x in v if x.action == "writer_creates_ledger"]
    if len(creates) != 1:
        lt.unknown = (
            "created by a client that left no trace"
            if not creates
            else f"created {len(creates)} times in the trace"
        )
        return lt
    create = creates[0]
    writers = {n for n, v in mine.items() for x in v if x.action.startswith("writer_")}
    if len(writers) > 1:
        lt.unknown = f"several writers ({', '.join(sorted(writers))}); the spec has one"
        return lt
    for b in create["ensemble"]:
        lt.bookie(str(b))
    for x in sorted((x for v in mine.values() for x in v), key=lambda x: x.t):
        if x.action.endswith("_changes_ensemble"):
            lt.bookie(str(x["new"]))
        if x.get("rc") is not None and x["rc"] not in lt.recoveries:
            lt.recoveries.append(str(x["rc"]))
        for b in autorecovery.named(x):
            lt.bookie(b)

    sends: dict[Key, Send] = {}
    lanes: list[list[Event]] = []
    receipts: dict[Key, Event] = {}
    # One lane per actor: a process may host the writer and recovery clients of one
    # ledger, and it takes in their answers in an order of its own (callbacks, tasks).
    actors: dict[tuple[str, str], list[Event]] = {}
    mark_event: dict[int, Event] = {}  # an auditor's mark line (its id) -> its event
    for n in sorted(mine):
        if n in bookie_nodes:
            continue
        for x in mine[n]:
            kind = "receipt" if x.action in RECEIPTS else "step"
            ev = Event(kind, x, skips=list(x.get("skips", [])))
            sender = _actor(x)
            lane = actors.setdefault((n, sender), [])
            for s in x.get("sends", []):
                key = (n, str(s["bookie"]), int(s["rid"]))
                send = Send(
                    key,
                    str(s["kind"]),
                    str(s["bookie"]),
                    int(s.get("entry", -1)),
                    int(s.get("lac", -1)),
                    bool(s.get("fence", False)),
                    sender,
                    by=ev,
                )
                sends[key] = send
                lt.bookie(send.bookie)
                if x.action == COPY:  # no message of the spec: its copy is one step
                    send.sender = "copy"
                    ev.copies.append(send)
                    continue
                ev.sends.append(send)
            if kind == "receipt":
                receipts[(n, str(x["bookie"]), int(x["rid"]))] = ev
            if x.action in MARKS:
                mark_event[id(x)] = ev
            lane.append(ev)
    lanes.extend(actors.values())
    event_of = {id(ev.line): ev for lane in lanes for ev in lane}
    for x, loss in after_loss:
        event_of[id(x)].needs.append(event_of[id(loss)])
    for n, x in failed:  # their adds answer no spec step; the target may keep them
        for a in x["sends"]:
            key = (n, str(a["bookie"]), int(a["rid"]))
            sends[key] = Send(key, "add", str(a["bookie"]), int(a["entry"]), -1, False, "stray")
            # Stored, or maybe stored: a target that crashed may have made it durable
            # without logging its answer.
            lt.stray.setdefault(str(a["bookie"]), set()).add(int(a["entry"]))

    # A registration matters only after a mark of the bookie as lost (it is back then),
    # counted from when the mark was decided: a bookie that registered again while the
    # auditor read its ledgers is marked lost all the same; the spec's audit comes before
    # the registration, or after it from the registrations read before (``marked_after``).
    marked_lost, marks_of = autorecovery.marks_lost(mine)
    overtaken: list[Event] = []  # registrations: a mark decided before may be logged after
    # A bookie marked lost crashes at the mark for the spec, and must come back at its
    # restart or registration even if it took no step of the ledger (its adds timed out).
    for n in sorted(bookie_nodes | (set(marked_lost) & run.bookies)):
        taken: list[Event] = []
        bookie_id = None
        expired = autorecovery.expiries(run.restarts[n], mine, marks_of)
        for x in sorted(run.restarts[n] + mine.get(n, []), key=lambda x: x.seq):
            if id(x) in expired and create.t < x.t:  # after an expiry no audit marked
                taken.append(Event("expire", expired[id(x)]))
            elif x.action == REGISTERED and not x.t > marked_lost.get(str(x["bookie"]), x.t):
                continue
            if x.action == "bookie_restarts":
                crash = Event("crash", autorecovery.crash_before(run.nodes[n], x))
                if str(x["bookie"]) in create["ensemble"] and crash.t < create.t < x.t:
                    # Its last line came before the creation: it was up for the writer.
                    crash.prefer_at = create.t + 1
                taken.append(crash)
            if x.action in ("bookie_restarts", REGISTERED):
                bookie_id = bookie_id or str(x["bookie"])
                ev = Event("restart" if x.action != REGISTERED else "register", x)
                if x.action != REGISTERED:
                    ev.prefer_at = next(
                        (r.t for r in run.restarts[n] if r.action == REGISTERED and r.seq > x.seq),
                        None,
                    )
                taken.append(ev)
                if x.action == REGISTERED:
                    overtaken.append(ev)
                continue
            if x.get("ledger") != ledger or x.action not in HANDLES:
                continue
            bookie_id, rid = str(x["bookie"]), int(x["rid"])
            asked = next(
                (
                    sends[k]
                    for c in peers.nodes(bookie_id, str(x["peer"]), x.t, every=True)
                    if (k := (c, bookie_id, rid)) in sends and _answers(x, sends[k])
                ),
                None,
            )
            if (
                asked is None
                and x.action == "bookie_handles_add"
                and any(
                    c.startswith("autorecovery-")
                    for c in peers.nodes(bookie_id, str(x["peer"]), x.t)
                )
            ):  # a copy whose worker died before logging it: a failed copy's adds
                lt.stray.setdefault(bookie_id, set()).add(int(x["entry"]))
                lt.copied_to.add(bookie_id)
                lt.dead_copy.add(bookie_id)
                continue
            if asked is None:
                lt.unknown = (
                    f"{x.where()} ({x.action}) answered a request of a client that left no "
                    f"trace of it (peer {x['peer']}, request {x['rid']})"
                )
                return lt
            if asked.sender in ("copy", "stray"):  # a worker's copy: no message of the spec
                asked.status = str(x["status"])
                continue
            ev = Event("handle", x, request=asked)
            asked.handled = ev
            ev.receipt = receipts.pop(asked.key, None)
            taken.append(ev)
        if not any(e.kind == "handle" for e in taken) and bookie_id not in lt.bookies:
            continue  # no step of this ledger, and no copy of it to compare at a restart
        lt.bookie(str(bookie_id))
        # A bookie's steps keep its order only where the order can change an answer
        # (``conflict``); the rest commute, and each is a lane of its own. The order is
        # the core's decisions' (a step is logged at its answer, and a fence's answer
        # waits for the journal while the adds it refuses are answered at once).
        taken.sort(key=lambda e: (e.line.get("decided") or e.t, e.line.seq))
        order_conflicts(taken)
        lanes.extend([ev] for ev in taken)
    # A registration after marks decided before it and logged after it may come before
    # them, the audit having read the registrations before it
    # (``auditor_marks_from_earlier_view``), or after them: a cut-off bookie's session
    # expired unseen, a restarted one's restart comes after them too (netns-45 ledger
    # 416: a periodic check read the registrations while a bookie restarted, then the
    # ledger after a recovery had put that bookie in it).
    for ev in overtaken:
        b = str(ev.line["bookie"])
        for m in marks_of[b]:
            if not autorecovery.decided(m) < ev.t < m.t:
                continue
            lt.came_back.setdefault(id(m), set()).add(b)  # its audit may have read it gone
            ev.marked_after = True

    for key, r in receipts.items():  # answers no bookie logged
        asked = sends.get(key)
        if asked is not None and asked.kind != "add" and not asked.fence:
            continue  # an unfenced read is no bookie step (the send itself is checked)
        if r.line["status"] in TAKEN:
            lt.unknown = (
                f"{r.line.where()} got a {r.line['status']} answer from {key[1]} that the "
                "bookie did not log (is its trace missing?)"
            )
            return lt
    for lane_no, lane in enumerate(lanes):
        for pos, ev in enumerate(lane):
            ev.lane, ev.pos = lane_no, pos
    # Per lane, its ensemble changes (a bookie replaced while a request to it was out).
    changes = [
        [e.line for e in lane if e.line.action.endswith("_changes_ensemble")] for lane in lanes
    ]
    for lane in lanes:
        for ev in lane:
            if ev.kind == "handle":
                assert ev.request is not None
                assert ev.request.by is not None
                ev.needs.insert(0, ev.request.by)
                if ev.receipt is not None:
                    ev.receipt.needs.append(ev)
                    ev.lost_ok = _replaced_before(changes[ev.receipt.lane], ev)
                    # A receipt's sends (a recovery's write-backs and next reads) are
                    # sent by the spec step that folds the answer in: the bookie's.
                    for s in ev.receipt.sends:
                        s.by = ev
                    ev.sends, ev.receipt.sends = ev.receipt.sends, []
                    ev.skips = ev.receipt.skips
    _mark_overtaken(lanes)
    lt.lanes = lanes
    lt.steps = sum(len(lane) for lane in lanes)
    lt.cfg = trace_config(lt, create, sends)
    return lt


def _actor(x: Line) -> str:
    """The actor of a client node's step: its lane (a process's writer, each of its
    recoveries, its auditor and its replication worker take steps in orders of their own)."""
    if x.action.startswith("worker_"):
        return "worker"
    if x.action in MARKS:
        return "auditor"
    return str(x["rc"]) if x.get("rc") is not None else "writer"


def _mark_overtaken(lanes: list[list[Event]]) -> None:
    """``early_ok`` for each bookie step whose answer was taken in after the answer to a
    later decision of the same bookie (by any client): a fence's answer waits for the
    journal while the adds it refuses are answered at once."""
    by_bookie: dict[str, list[Event]] = defaultdict(list)
    for events in lanes:
        for ev in events:
            if ev.kind == "handle" and ev.receipt is not None:
                by_bookie[str(ev.line["bookie"])].append(ev)
    for evs in by_bookie.values():
        evs.sort(key=lambda e: (e.line.get("decided") or e.t, e.line.seq))
        first = None  # the earliest receipt of the later decisions
        for ev in reversed(evs):
            assert ev.receipt is not None
            if first is not None and first < ev.receipt.t:
                ev.early_ok = True
            first = ev.receipt.t if first is None else min(first, ev.receipt.t)


def _replaced_before(changes: list[Line], ev: Event) -> bool:
    """Whether the client replaced ``ev``'s bookie between sending it the request and
    taking in its answer (a timeout while the request was still in flight)."""
    assert ev.request is not None
    assert ev.receipt is not None
    by = ev.request.by
    sent_at = by.receipt.line.seq if by is not None and by.receipt is not None else -1
    if by is not None and by.kind == "step":
        sent_at = by.line.seq
    return any(
        x["failed"] == ev.request.bookie and sent_at < x.seq < ev.receipt.line.seq for x in changes
    )
