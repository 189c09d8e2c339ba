"""The order of one bookie's steps of a ledger: which of them the replay must keep in the
bookie's order, and which commute (bkref.tracecheck.project puts each bookie step in a
lane of its own, with the earlier steps it needs)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bkref.tracecheck.project import Event

FAULTS = frozenset({"crash", "restart", "register", "expire"})  # commute with no step


def conflict(x: Event, y: Event) -> bool:
    """Whether two steps of one bookie may change each other's answer or effect.

    Adds commute with adds (entries are a set, the LAC a maximum) and reads with reads
    (fencing is idempotent, and no read changes what another answers). An add and a
    fencing LAC read do not (the fence refuses the writer's adds; the add may raise the
    LAC the read answers), nor an add and a recovery read of the same entry, or of any
    entry if the read fences and the add is the writer's. A restart orders everything.
    A writer's add the bookie refused as fenced commutes with every step but a restart:
    it stores nothing and changes no answer (the spec's ``bookie_handles_add``); all it
    needs is some fence before it (``order_conflicts``).
    """
    if FAULTS & {x.kind, y.kind}:
        return True
    if any(e.line.action == "bookie_handles_add" and refused(e) for e in (x, y)):
        return False
    a, r = (x, y) if x.line.action == "bookie_handles_add" else (y, x)
    if a.line.action != "bookie_handles_add" or r.line.action == "bookie_handles_add":
        return False
    if r.line.action == "bookie_handles_fencing_lac_read":
        return True
    ra, rr = a.request, r.request
    assert ra is not None
    assert rr is not None
    return ra.entry == rr.entry or (ra.sender == "writer" and rr.fence)


def refused(ev: Event) -> bool:
    """A writer's add that the bookie refused as fenced."""
    assert ev.request is not None
    return ev.request.sender == "writer" and ev.line.get("status") == "FENCED"


def order_conflicts(taken: list[Event]) -> None:
    """Each bookie step's ``needs``: the earlier steps (``taken`` is in the bookie's order)
    it ``conflict``s with, up to those an earlier need already orders. A restart orders
    everything, so a step needs the last restart before it and the conflicting steps
    since; the steps before the restart are the restart's needs. Candidates come from
    indexes by kind and entry, each confirmed by ``conflict`` (a long ledger has 10^5
    steps on a bookie: comparing each with all earlier ones took hours)."""
    pos = {id(ev): i for i, ev in enumerate(taken)}
    last: Event | None = None  # the last restart (or registration)
    since: list[Event] = []  # every step since it
    adds: list[Event] = []
    adds_at: dict[int, list[Event]] = defaultdict(list)
    lac_fences: list[Event] = []  # fencing LAC reads
    fence_reads: list[Event] = []  # recovery reads that fence
    reads_at: dict[int, list[Event]] = defaultdict(list)
    first_fence: Event | None = None  # the first fencing step since the last restart
    for ev in taken:
        base = [] if last is None else [last]
        if ev.kind in FAULTS:
            ev.needs = base + since
            last, since, first_fence = ev, [], None
            for index in (adds, lac_fences, fence_reads):
                index.clear()
            adds_at.clear()
            reads_at.clear()
            continue
        req = ev.request
        assert req is not None
        if ev.line.action == "bookie_handles_add" and refused(ev) and first_fence is not None:
            # A writer's add refused as fenced needs a fence before it, the first since
            # the restart, and nothing else (``conflict``). Ordered after every fencing
            # read before it, it waited for one of another entry whose answer the recovery
            # took in after another bookie's, which in turn waited for the add's refusal
            # to reach the writer (netns-61 ledger 269: a cycle, so no order at all).
            ev.needs = [*base, first_fence]
            since.append(ev)
            continue
        if ev.line.action == "bookie_handles_add":
            candidates = [*lac_fences, *reads_at[req.entry], *fence_reads]
            adds.append(ev)
            adds_at[req.entry].append(ev)
        elif ev.line.action == "bookie_handles_fencing_lac_read":
            candidates = adds
            lac_fences.append(ev)
            first_fence = first_fence or ev
        else:
            candidates = [*adds_at[req.entry], *(adds if req.fence else ())]
            reads_at[req.entry].append(ev)
            if req.fence:
                fence_reads.append(ev)
                first_fence = first_fence or ev
        found = {id(x): x for x in candidates if conflict(x, ev)}
        ev.needs = base + sorted(found.values(), key=lambda x: pos[id(x)])
        since.append(ev)
