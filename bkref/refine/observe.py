"""How the machine compares an implementation's abstract state with the spec's.

Two states are compared after :func:`project`, which keeps every variable a
guard or an invariant reads and forgets the rest:

1. ``bkref.spec.protocol.drop_dead_requests``: requests whose delivery can change
   nothing (the spec's own bisimulation quotient, argued at
   ``bkref.spec.protocol.dead_request``), and what a finished writer or recovery
   client no longer reads;
2. ``w_version`` and each recovery client's ``version``: written by the spec, read by no guard and
   no invariant (the metadata's version, ``meta_version``, is compared);
3. the writer's acks, sends and piggybacked LACs of confirmed entries
   (``e <= w_lac``), and the LACs of entries not sent yet: no guard reads them
   (timeouts and resends look at ``w_lac < e < w_next`` only), and an
   implementation forgets an entry once it is confirmed, as bkref's does;
4. the writer's sends and acks outside the entry's write set in its current
   view, and the recovery client's outside the write set in its last
   ensemble: a replaced bookie's send or ack counts for nothing (every read
   of them is masked by that write set). A recovery send set that would
   become empty is kept whole, since ``next_states`` tests it for non-zero.
5. ``au_stale`` while no node is auditor: only the auditor's audit reads it,
   and a node that wins the election audits at once (``au_stale = 1``), so its
   value in between is never read.
6. Task versions: the spec counts marks; ZooKeeper's znode version restarts
   when a task is deleted and marked again, and a failed attempt bumps it. Every
   guard compares versions only by equality (a worker's delete succeeds when the
   task is still at the version it read under its lock), so a task keeps only
   the set of bookies it names, at version 0, and a worker's version becomes 0
   if it is the task's current one, 1 if not or if the task is gone (another
   worker deleted it while this one had lost its lock: no guard reads a version
   of a deleted task, and ZooKeeper has none), so projecting twice changes
   nothing.
7. ``au_missed``, a ghost (history) variable of the spec with no counterpart in
   an implementation: which ledgers a metadata write gave a bookie already
   down after the last audit. It decides only when the spec lets the periodic
   bookie check run (a reduction; bkref's check may run at any time) and when an
   invariant deems repair quiescent; the implementation's side of both is the
   audit itself, whose marks are compared. The machine judges the invariants
   of the implementation's state with the spec's ``au_missed``.
8. ``au_back``, a ghost (history) variable like ``au_missed``: the bookies registered
   again since the last audit. It decides only when the spec lets an audit mark them
   lost from an earlier read of the registrations
   (``auditor_marks_from_earlier_view``); the driver keeps its own record to take
   that step, and the marks it writes are compared. Only TypeOK reads it.
9. ``wk_seen``, each worker's view of the lost bookies taken with its lock: bkref's
   worker keeps no such mask apart from the fragments it decided to copy
   (``WorkerCore.run``). The spec's guards read the spec's own (the machine moves
   the spec along the implementation's steps), so a copy bkref makes of a bookie it
   saw lost and that came back since is checked against the spec's view; it is
   not compared as a variable.

Each removal keeps the guards' and invariants' verdicts (``au_missed`` given
back), so a projected match is a match for every decision the spec makes.
"""

from __future__ import annotations

from typing import cast

from bkref.spec.config import Config
from bkref.spec.protocol import (
    Recovery,
    RecoveryTuple,
    State,
    auditor_node,
    drop_dead_requests,
    last_ensemble_write_set,
    write_set,
)
from bkref.spec.trace import describe


def project(cfg: Config, s: State) -> State:
    """``s`` without what no guard or invariant reads (see the module docstring)."""
    s = drop_dead_requests(cfg, s)
    view = s.w_change if s.w_change is not None else s.w_segments
    acks, sent, piggy = list(s.w_acks), list(s.w_sent), list(s.w_piggy)
    for e in range(len(acks)):
        if e >= s.w_next:
            piggy[e] = -1  # not sent yet: bkref's writer has no body for it
        if e <= s.w_lac or not view:
            acks[e] = sent[e] = 0
            piggy[e] = -1
        else:
            ws = write_set(cfg, view, e)
            acks[e] &= ws
            sent[e] &= ws
    rc = tuple(_project_recovery(cfg, Recovery._make(r)) for r in s.rc)
    wk = tuple(
        (b, lg, int(lg >= 0 and (tv != s.meta_task[lg][0] or not s.meta_task[lg][1])), p)
        for b, lg, tv, p in s.wk
    )
    return s._replace(
        meta_task=tuple((0, lost) for _v, lost in s.meta_task),
        wk=wk,
        wk_seen=(0,) * len(wk),
        au_stale=s.au_stale if auditor_node(s) >= 0 else 0,
        au_missed=0,
        au_back=0,
        w_version=0,
        w_acks=tuple(acks),
        w_sent=tuple(sent),
        w_piggy=tuple(piggy),
        rc=rc,
    )


def _project_recovery(cfg: Config, r: Recovery) -> RecoveryTuple:
    acks, sent = list(r.acks), list(r.sent)
    if r.segments:
        for e in range(len(sent)):
            ws = last_ensemble_write_set(cfg, r.segments, e)
            acks[e] &= ws
            sent[e] = sent[e] & ws or sent[e]
    projected = r._replace(version=0, acks=tuple(acks), sent=tuple(sent))
    return cast(RecoveryTuple, tuple(projected))


def differences(cfg: Config, spec: State, impl: State) -> list[tuple[str, str, str]]:
    """(variable, spec's value, implementation's value) for each projected difference.

    Named as ``bkref.spec.trace.describe`` names them; a field it does not show is
    named by the ``State`` field itself.
    """
    ps, pi = project(cfg, spec), project(cfg, impl)
    a, b = describe(ps), describe(pi)
    out = [
        (k, a.get(k, "-"), b.get(k, "-")) for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)
    ]
    if not out:
        out = [
            (name, repr(x), repr(y))
            for name, x, y in zip(State._fields, ps, pi, strict=True)
            if x != y
        ]
    return out
