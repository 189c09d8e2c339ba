"""AutoRecovery's steps in a ledger's projection: which to keep, which bookies they name,
and what makes them impossible to replay (:func:`bkref.tracecheck.project.project`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from bkref.tracecheck.load import REGISTERED, Line
from bkref.tracecheck.names import CAS, COPY, HANDLES, LOCK, MARKS, REASONS, RELEASE

EXPIRED = "bookie_loses_session"
LOCK_LOST = "worker_loses_lock"
DELETE = "worker_deletes_task"
# Why a worker logs a release whose metadata write its lock check refused.
REFUSED_UNLOCKED = "lost the ledger's lock"


def named(x: Line) -> list[str]:
    """The bookies an AutoRecovery step names: marked replicas, a worker's own bookie,
    a copy's lost bookie and target."""
    if x.action in MARKS:
        return sorted(x.get("replicas", {}))
    if x.action.startswith("worker_"):
        return [str(b) for b in (x.get("lost"), x.get("bookie"), x.get("worker")) if b]
    return []


def steps(lines: list[Line]) -> list[Line]:
    """A node's steps of the ledger without AutoRecovery's no-ops: a worker's metadata
    write that lost to a newer version (it re-reads and writes again: the spec's write
    is that next one), a copy that failed (the spec's copy is one step, whole or not at
    all: the entries a failed copy left on its target are ``LedgerTrace.stray``), and
    then a lock released with nothing done under it (an attempt deferred: the open
    ledger's grace period, a busy repair slot, a back-off)."""
    out: list[Line] = []
    last_worker = -1  # index in ``out`` of the last worker step kept
    for x in lines:
        if x.action == CAS and x.get("outcome") != "written":
            continue
        if x.action == COPY and x.get("outcome") != "copied":
            continue  # its adds (``stray``) stay linked to the target's answers
        if x.action == RELEASE and last_worker >= 0 and out[last_worker].action == LOCK:
            del out[last_worker]
            last_worker = max(
                (i for i, y in enumerate(out) if y.action.startswith("worker_")), default=-1
            )
            continue
        if x.action.startswith("worker_"):
            last_worker = len(out)
        out.append(x)
    return out


def unknown(mine: dict[str, list[Line]]) -> str:
    """Why AutoRecovery's steps of the ledger cannot be replayed, or "" if they can."""
    for lines in mine.values():
        own = {str(x["bookie"]) for x in lines if x.action == LOCK and x.get("bookie")}
        for x in lines:
            if x.action == LOCK and not x.get("bookie"):
                return f"{x.where()}: a dedicated worker (no bookie of its own); the spec's copies"
            if x.action in (COPY, CAS) and str(x["bookie"]) not in own:
                return f"{x.where()}: a copy to {x['bookie']}, not to the worker's own bookie"
            if x.action in MARKS:
                odd = {b: r for b, r in x["replicas"].items() if r not in REASONS}
                if odd:
                    return f"{x.where()}: marks {odd}; the spec's auditor has no such reason"
    return ""


AUDIT = "auditor_marks_ledgers_of_lost_bookies"


@dataclass(frozen=True)
class DeadAudit:
    """The last audit of an auditor process that died: a later process of its node left a
    trace (``autorecovery-B-0`` then ``autorecovery-B-1``)."""

    node: str
    decided: int
    lost: frozenset[str]  # the bookies its logged marks name lost
    ledgers: frozenset[int]  # the ledgers it logged a mark of
    end: Line  # its last logged mark
    next_seq: int  # the process's line number after its last


def dead_audits(nodes: Mapping[str, list[Line]]) -> list[DeadAudit]:
    """Every dead auditor process's last audit (found once per run)."""
    out = []
    for n, lines in nodes.items():
        base, _, k = n.rpartition("-")
        if not n.startswith("autorecovery-") or not k.isdigit():
            continue
        if f"{base}-{int(k) + 1}" not in nodes:
            continue
        audit = [x for x in lines if x.action in MARKS]
        if not audit or audit[-1].action != AUDIT:
            continue
        at = decided(audit[-1])
        audit = [x for x in audit if x.action == AUDIT and decided(x) == at]
        lost = {str(b) for x in audit for b, why in x["replicas"].items() if why == "LOST"}
        ledgers = frozenset(int(x["ledger"]) for x in audit)
        out.append(DeadAudit(n, at, frozenset(lost), ledgers, audit[-1], lines[-1].seq + 1))
    return out


def with_unlogged_mark(
    audits: list[DeadAudit], ledger: int, lines_of: Mapping[str, list[Line]]
) -> dict[str, list[Line]]:
    """``lines_of`` (a ledger's lines by node) with the mark an auditor that died in its
    audit may have written for ``ledger`` without logging it: a mark's line follows its
    ZooKeeper write, so a process killed in between leaves a task no line names (a
    netns soak had a worker lock such a task). Such a mark is taken to be the audit's
    lost bookies that the ledger names, its outcome unknown (the replay tries it
    with and without the write), for each of ``audits`` that logged no mark of it."""
    out = {n: list(v) for n, v in lines_of.items()}
    for a in audits:
        replicas = sorted(a.lost & _named_before(lines_of, a.end.t))
        if not replicas or ledger in a.ledgers:
            continue
        args = {"ledger": ledger, "replicas": dict.fromkeys(replicas, "LOST"), "rewrite": True}
        args |= {"decided": a.decided, "outcome": "unknown"}
        out.setdefault(a.node, []).append(Line(a.node, a.next_seq, a.end.t + 1, AUDIT, args))
    return out


def _named_before(lines_of: Mapping[str, list[Line]], t: int) -> set[str]:
    """The bookies the ledger's metadata named by ``t``: its creation's ensemble, the
    writer's replacements, the workers' swaps (none if it was created after ``t``)."""
    named: set[str] = set()
    for lines in lines_of.values():
        for x in lines:
            if x.t >= t:
                continue
            if x.action == "writer_creates_ledger":
                named |= {str(b) for b in x["ensemble"]}
            elif x.action.endswith("_changes_ensemble") and x.get("new"):
                named.add(str(x["new"]))
            elif x.action == CAS and x.get("outcome") == "written":
                named.add(str(x["bookie"]))
    return named


def decided(mark: Line) -> int:
    """When an auditor's mark was decided: when its audit read the registered bookies
    (``decided``; a bookie that registers again after it is still marked lost), or
    when it was logged (traces without the stamp). A periodic check's marks carry the
    time it read them too."""
    return int(mark.get("decided") or mark.t)


def cut_off(restarts: Mapping[str, list[Line]], mine: dict[str, list[Line]]) -> dict[int, set[str]]:
    """Per auditor mark (the ``id`` of its line), the bookies it marked lost that were cut
    off from ZooKeeper rather than crashed: each registered again before it restarted, or
    answered a request of the ledger before it did (its session expired while it ran: a
    pause, a partition from ZooKeeper). For the spec, their sessions expired
    (``bookie_loses_session``); a bookie marked lost otherwise crashed."""
    acts: dict[str, list[int]] = defaultdict(list)  # bookie -> times it answered
    for lines in mine.values():
        for x in lines:
            if x.action in HANDLES:
                acts[str(x["bookie"])].append(x.t)
    out: dict[int, set[str]] = {}
    for lines in mine.values():
        for x in lines:
            if x.action not in MARKS:
                continue
            at = decided(x)
            for b, why in x["replicas"].items():
                if why != "LOST":
                    continue
                back = next((r for r in restarts.get(b, []) if r.t > at), None)
                until = back.t if back is not None else float("inf")
                if (back is not None and back.action == REGISTERED) or any(
                    at < t < until for t in acts.get(b, [])
                ):
                    out.setdefault(id(x), set()).add(b)
    return out


def expiries(
    registrations: list[Line], mine: dict[str, list[Line]], marks_of: Mapping[str, list[Line]]
) -> dict[int, Line]:
    """Per registration (the ``id`` of its line) of a bookie that registered again while
    it ran, with no restart since it last registered, while a worker looked at the
    ledger: its session expired (``bookie_loses_session``, which no node logs), unless
    an audit marked it lost in between and no worker copied its fragments before that
    mark was written (the replay takes the expiry at the mark). Timed before the first
    such worker lock that led to a copy of its fragments (that worker saw it lost), else
    just before it registered again. Unseen by any worker, it changes nothing in the
    ledger. A mark written after such a copy (its audit read the ledger before the swap;
    a soak run's ledger) takes the bookie lost as it is. ``registrations``: a bookie's
    restarts and registrations in order."""
    looks: list[int] = []  # when a worker took a ledger's lock
    copied: list[tuple[int, str]] = []  # (when, the lost bookie) of a lock that led to a copy
    for lines in mine.values():
        lock: Line | None = None
        for x in lines:
            if x.action == LOCK:
                lock = x
                looks.append(x.t)
            elif x.action == COPY and lock is not None:
                copied.append((lock.t, str(x["lost"])))
    out: dict[int, Line] = {}
    prev: Line | None = None
    for x in registrations:
        if x.action == REGISTERED and prev is not None and prev.action == REGISTERED:
            b, since, until = str(x["bookie"]), prev.t, x.t
            looked = any(since < t < until for t in looks)
            seen = [t for t, lost in copied if lost == b and since < t < until]
            marks = [m.t for m in marks_of.get(b, []) if since < decided(m) < until]
            if looked and (not marks or (seen and min(seen) < min(marks))):
                at = min(seen) - 1 if seen else x.t - 1
                out[id(x)] = Line(x.node, x.seq, max(at, prev.t + 1), EXPIRED, {"bookie": b})
        prev = x
    return out


def crash_before(lines: list[Line], restart: Line) -> Line:
    """The crash no node logs before a bookie's ``restart``: after the last line the
    bookie logged (of any ledger), which times it for the search's first order. A
    separate step, so that what others did while the bookie was down (a worker copying
    its fragments away) can come between it and the restart."""
    i = restart.seq
    last = lines[i - 1] if 0 < i <= len(lines) and lines[i - 1].seq == i - 1 else None
    t = last.t + 1 if last is not None else restart.t - 1
    return Line(restart.node, restart.seq, t, "bookie_crashes", {"bookie": restart["bookie"]})


def marks_lost(mine: dict[str, list[Line]]) -> tuple[dict[str, int], dict[str, list[Line]]]:
    """Per bookie, when an auditor's mark first named it lost (when the mark was decided),
    and the marks that did."""
    first: dict[str, int] = {}
    marks_of: dict[str, list[Line]] = defaultdict(list)
    for v in mine.values():
        for x in v:
            if x.action in MARKS:
                for b, why in x["replicas"].items():
                    if why == "LOST":
                        at = decided(x)
                        first[b] = min(first.get(b, at), at)
                        marks_of[b].append(x)
    return first, marks_of


def lock_losses(mine: dict[str, list[Line]]) -> tuple[list[tuple[Line, Line]], list[Line]]:
    """Add to the workers' lines the lock losses no node logs; returns (step, loss) pairs,
    each a step that must come after the loss it names, and the copies taken out.

    A ledger's lock is an ephemeral znode. A worker that takes it while another still
    works on the ledger (no release nor delete logged since that one took it) took it
    after ZooKeeper dropped the other's: that one's session expired, or its process died
    (``worker_loses_lock`` just before the new lock). A worker whose release says its
    metadata write was refused for want of the lock lost it before that release. And a
    worker process that died at work on the ledger (a later process of the same
    AutoRecovery node, beside the same bookie, takes it again) let it go when it died:
    its release, added after its lines, is the spec's step of a worker that lost its
    lock (its state is gone with it). A copy a worker made after it lost its lock is
    taken out: its lock check refused the swap, and its adds are a failed copy's."""
    steps = sorted(
        ((n, x) for n, v in mine.items() for x in v if x.action.startswith("worker_")),
        key=lambda nx: nx[1].t,
    )
    holder: str | None = None  # the node whose lock the ledger's znode is, as logged
    at_work: dict[str, str] = {}  # a worker's own bookie -> its process at work
    added: dict[int, list[Line]] = defaultdict(list)  # a logged step (id) -> lines after it
    anchor: dict[str, Line] = {}  # a node's last logged worker step so far
    last: dict[str, Line] = {}  # the same, or a line added after it
    out: list[tuple[Line, Line]] = []

    def add(node: str, action: str, before: Line, **args: object) -> Line:
        prev = last[node]
        at = max(prev.t + 1, before.t - 1)
        x = Line(node, prev.seq, at, action, {"ledger": prev.get("ledger"), **args})
        added[id(anchor[node])].append(x)
        last[node] = x
        return x

    for n, x in steps:
        own = own_bookie(x)
        if x.action == LOCK:
            dead = at_work.get(own)
            if holder is not None and holder != n:
                out.append((x, add(holder, LOCK_LOST, x, worker=own_bookie(last[holder]))))
            if dead is not None and dead != n:
                out.append((x, add(dead, RELEASE, x, worker=own, why="its process died")))
            holder, at_work[own] = n, n
        elif x.action in (RELEASE, DELETE):
            if holder == n and REFUSED_UNLOCKED in str(x.get("why", "")):
                add(n, LOCK_LOST, x, worker=own)
            if holder == n:
                holder = None
            at_work.pop(own, None)
        last[n] = anchor[n] = x
    dropped: list[Line] = []
    for node in {x.node for xs in added.values() for x in xs}:
        kept: list[Line] = []
        unlocked = False
        for y in mine[node]:
            for x in (y, *added.get(id(y), ())):
                if x.action in (LOCK, LOCK_LOST):
                    unlocked = x.action == LOCK_LOST
                (dropped if x.action == COPY and unlocked else kept).append(x)
        mine[node][:] = kept
    return out, dropped


def own_bookie(x: Line) -> str:
    """The bookie of the worker that took step ``x``: a copy's target and a metadata
    write's new replica are its own bookie (``unknown`` sees to that)."""
    return str(x["bookie"] if x.action in (COPY, CAS) else x["worker"])
