"""Bookie symmetry: a canonical renaming of bookies, so that states equal up to names count once.

Bookies are interchangeable: renaming them consistently everywhere
(ensembles, masks, messages, per-bookie slots) yields an equivalent state.
``canonical`` renames bookies in order of first appearance in a fixed walk
of the state (metadata segments, the writer's and the recovery client's
views, the workers' bookies); bookies that appear in no ensemble come last,
ordered by everything else the state says about them. Bookies with equal
keys there are indistinguishable, so the result depends only on the orbit
of the state: ``canonical(rename(s, p)) == canonical(s)`` for every
permutation ``p`` (a test checks it on explored states).
"""

from __future__ import annotations

from typing import cast

from bkref.spec.protocol import Msg, Recovery, RecoveryTuple, Segments, State


def _remap_mask(mask: int, perm: tuple[int, ...]) -> int:
    out = 0
    i = 0
    while mask:
        if mask & 1:
            out |= 1 << perm[i]
        mask >>= 1
        i += 1
    return out


def _remap_segments(segs: Segments, perm: tuple[int, ...]) -> Segments:
    return tuple((f, tuple(perm[b] for b in ens)) for f, ens in segs)


def rename(s: State, perm: tuple[int, ...]) -> State:
    """The state with bookie ``b`` renamed ``perm[b]`` everywhere."""
    n = len(perm)
    inv = [0] * n
    for old, new in enumerate(perm):
        inv[new] = old
    mm = _remap_mask
    msgs: list[Msg] = sorted((k, perm[b], e, a, r) for k, b, e, a, r in s.msgs)
    return s._replace(
        meta_segments=tuple(_remap_segments(segs, perm) for segs in s.meta_segments),
        meta_task=tuple((v, mm(lost, perm)) for v, lost in s.meta_task),
        meta_rereplicated=tuple(
            tuple(sorted((i, perm[b], perm[r] if r >= 0 else -1) for i, b, r in rr))
            for rr in s.meta_rereplicated
        ),
        b_up=tuple(s.b_up[inv[i]] for i in range(n)),
        b_ledgers=tuple(s.b_ledgers[inv[i]] for i in range(n)),
        b_signed=tuple(s.b_signed[inv[i]] for i in range(n)),
        w_segments=_remap_segments(s.w_segments, perm),
        w_change=None if s.w_change is None else _remap_segments(s.w_change, perm),
        w_acks=tuple(mm(x, perm) for x in s.w_acks),
        w_sent=tuple(mm(x, perm) for x in s.w_sent),
        rc=tuple(_rename_recovery(r, perm) for r in s.rc),
        wk=tuple(
            # A copy names its lost bookie; the markers VERIFIED and RECOVERING name none.
            (perm[b], lg, v, p if p is None or p[1] < 0 else (p[0], perm[p[1]], p[2]))
            for b, lg, v, p in s.wk
        ),
        wk_seen=tuple(mm(x, perm) for x in s.wk_seen),
        au_back=mm(s.au_back, perm),
        msgs=tuple(msgs),
    )


def _rename_recovery(rt: RecoveryTuple, perm: tuple[int, ...]) -> RecoveryTuple:
    r = Recovery._make(rt)
    mm = _remap_mask
    r = r._replace(
        segments=_remap_segments(r.segments, perm),
        read_segments=_remap_segments(r.read_segments, perm),
        fenced=mm(r.fenced, perm),
        negative=mm(r.negative, perm),
        acks=tuple(mm(x, perm) for x in r.acks),
        sent=tuple(mm(x, perm) for x in r.sent),
    )
    return cast(RecoveryTuple, tuple(r))


def _unreferenced_key(s: State, b: int) -> tuple[object, ...]:
    bb = 1 << b
    return (
        s.b_up[b],
        s.b_ledgers[b],
        s.b_signed[b],
        tuple(bool(x & bb) for x in s.w_acks),
        tuple(bool(x & bb) for x in s.w_sent),
        tuple(
            (
                tuple(bool(x & bb) for x in r.acks),
                tuple(bool(x & bb) for x in r.sent),
                bool(r.fenced & bb),
                bool(r.negative & bb),
            )
            for r in map(Recovery._make, s.rc)
        ),
        tuple(bool(lost & bb) for _v, lost in s.meta_task),
        bool(s.au_back & bb),
        tuple(sorted((k, e, a, r) for k, x, e, a, r in s.msgs if x == b)),
        tuple(tuple(i for i, _f, r in rr if r == b) for rr in s.meta_rereplicated),
    )


_IDENTITY = [list(range(n)) for n in range(9)]


def canonical(s: State) -> State:
    """The representative of ``s`` under renaming of bookies."""
    n = len(s.b_up)
    order: list[int] = []
    rc = s.rc
    # Recovery.segments and .read_segments are fields 2 and 3 of each client's tuple.
    views: tuple[Segments, ...] = (*s.meta_segments, s.w_segments, s.w_change or ())
    if len(rc) == 1:
        views += (rc[0][2], rc[0][3])
    else:
        views += tuple(segs for r in rc for segs in (r[2], r[3]))
    for segs in views:
        for _f, ens in segs:
            for b in ens:
                if b not in order:
                    order.append(b)
        if len(order) == n:  # every bookie named: later views change nothing
            break
    else:
        for b, _lg, _v, _p in s.wk:
            if b not in order:
                order.append(b)
        if len(order) < n:
            rest = [b for b in range(n) if b not in order]
            if len(rest) > 1:
                rest.sort(key=lambda b: _unreferenced_key(s, b))
            order.extend(rest)
    if order == _IDENTITY[n]:
        return s
    perm = [0] * n
    for new, old in enumerate(order):
        perm[old] = new
    return rename(s, tuple(perm))
