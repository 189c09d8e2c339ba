"""The generic linearizability checker: Wing-Gong search with Lowe's memoisation.

The history is split by the model's key (P-compositionality: a history is
linearizable iff each key's sub-history is) and each part is searched alone,
in worker processes when several parts take long.

The search (Wing and Gong 1993, with Lowe's 2017 cache, as Porcupine does it):
events (invocations and completions) sit in a doubly linked list in real-time
order, which is the order of history indices. Walking from the head, an
invocation may be linearized now if the model lets it take effect in the
current state; it is then lifted out of the list (its invocation and its
completion) and the walk restarts from the head. Reaching a completion means
that operation should have taken effect before it and did not: undo the last
choice and try the next candidate. The cache holds every (set of linearized
operations, model state) already explored, so no configuration is searched
twice. A set is stored as the number of leading operations (in invocation
order) that are all linearized plus a bitset (a Python int) of the ones after:
the bitset spans the operations from the oldest one not linearized, usually
those in flight, so it stays a few machine words however long the history
(Porcupine hashes a bitset of the whole history on every step). An unknown
operation never linearized holds that oldest one back, as a full bitset would.

Operations whose outcome is unknown (``info``, or never completed) have no
completion event: they may take effect at any point after their invocation or
never, so the search succeeds as soon as every operation with a known outcome
is linearized. Deterministic models (``Model.step1``) are searched over single
states; others over sets of states (the subset construction), so one step per
linearized operation either way.

A time budget bounds the whole check; past it the verdict is ``unknown``.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Callable, Generator, Hashable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

from bkref.linearizability.history import Operation
from bkref.linearizability.models import MODELS, NO, Model

Verdict = Literal["valid", "invalid", "unknown"]

# Worker processes pay only for hard keys. Searching an easy key costs about
# what sending its operations to a worker and the verdict back does (10 keys x
# 10^5 kv ops: 0.85 s of search against 0.45 s to start a forkserver pool and
# about 1 s of pickling), so the size of a history says little: keys still open
# after PARALLEL_AFTER seconds in this process go to workers instead.
PARALLEL_AFTER = 2.0
PARALLEL_MIN_OPS = math.inf  # a history this big goes to workers at once
_SLICE = 512  # search steps between yields


class Call(NamedTuple):
    """One operation of a partition, as the search sees it."""

    call: int  # history index of the invocation
    ret: float  # history index of the completion; inf if the outcome is unknown
    input: Any  # the model's input
    op: int  # position of the operation in the checked list (for reports)


@dataclass(frozen=True)
class PartitionResult:
    """The verdict for one key. For an invalid key, the longest linearizable
    prefix found and the operation that could not be placed after it."""

    key: Hashable
    verdict: Verdict
    calls: tuple[Call, ...]
    linearization: tuple[int, ...] = ()  # positions in ``calls``, in order
    blocked: int | None = None  # position in ``calls`` of the op that could not be placed
    explored: int = 0  # configurations cached
    seconds: float = 0.0
    note: str = ""  # why the verdict is unknown
    # Engines that prove a verdict of invalid (unique.py): the operations that show
    # it (positions in ``calls``) and why, in words.
    proof: tuple[int, ...] = ()
    reason: str = ""
    engine: Literal["search", "unique"] = "search"  # what decided it

    @property
    def window(self) -> tuple[int, float] | None:
        """History indices from the blocked op's invocation to its completion."""
        if self.blocked is None:
            return None
        c = self.calls[self.blocked]
        return c.call, c.ret


@dataclass
class CheckResult:
    model: str
    verdict: Verdict
    partitions: list[PartitionResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def invalid(self) -> list[PartitionResult]:
        return [p for p in self.partitions if p.verdict == "invalid"]


def search(
    model: Model, calls: Sequence[Call], key: Hashable = None, deadline: float = math.inf
) -> PartitionResult:
    """Decide one partition; ``calls`` sorted by invocation index."""
    steps = _search_steps(model, calls, key)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: PartitionResult = done.value
            return result
        if time.monotonic() > deadline:
            return _cut_short(key, calls, "out of time")


def _cut_short(key: Hashable, calls: Sequence[Call], why: str) -> PartitionResult:
    return PartitionResult(key, "unknown", tuple(calls), note=why)


def _search_steps(
    model: Model, calls: Sequence[Call], key: Hashable
) -> Generator[None, None, PartitionResult]:
    """The search, yielding every few hundred steps so a caller can interleave
    partitions, watch the clock, or stop."""
    started = time.monotonic()
    n = len(calls)
    # Nodes: 0 is the head; events 1..m in index order; m + 1 is the tail, never
    # reached (a known op's completion stops every walk before it). ``ev`` holds
    # the op of an invocation and ~op (negative) of a completion.
    events = sorted(
        [(c.call, i) for i, c in enumerate(calls)]
        + [(int(c.ret), ~i) for i, c in enumerate(calls) if c.ret != math.inf]
    )
    m = len(events)
    ev = [0] + [e[1] for e in events] + [n]
    nxt = list(range(1, m + 3))
    prv = list(range(-1, m + 1))
    call_node = [0] * n
    ret_node = [0] * n
    for node in range(1, m + 1):
        op = ev[node]
        if op < 0:
            ret_node[~op] = node
        else:
            call_node[op] = node
    inputs = [c.input for c in calls]
    remaining = sum(1 for c in calls if c.ret != math.inf)

    initial = model.init(inputs)
    advance: Callable[[Any, Any], Any]
    state: Any
    if model.step1 is not None and len(initial) == 1:
        advance = model.step1
        (state,) = initial
    else:
        advance = _set_step(model.step)
        state = frozenset(initial)
    # The set of linearized ops as (k, w): ops 0..k-1 are all linearized, op k
    # is not, and bit i of w is op k + i. Ops are numbered in invocation order,
    # so w spans only the ops in flight: small ints that hash fast, where one
    # bit per op of the history would make every cache entry O(n).
    is_read = model.is_read
    reads = [is_read(i) for i in inputs] if is_read is not None else [False] * n
    k = w = 0
    cfg: tuple[int, int, Any] = (0, 0, state)
    cache: set[tuple[int, int, Any]] = set()
    stack: list[tuple[int, int, Any]] = []  # the configuration before each lin[i]
    lin: list[int] = []  # the ops linearized, in order
    # The longest prefix found and the op it blocked on; best[:low] == lin[:low],
    # so a new best copies only what changed since the last one.
    best: list[int] = []
    blocked: int | None = None
    low = 0
    ticks = _SLICE
    # Entering a configuration, the walk scans the whole frontier for a read
    # (``Model.is_read``) that the state allows: it is taken at once and for
    # good. Moving it to the front of any linearization from here keeps that a
    # linearization (it changes no state, and nothing not yet linearized
    # completed before it was invoked), so if the configuration after it
    # fails, this one fails too and no other candidate is tried. Without one,
    # the first op whose configuration is new (``pick``) is taken. After a
    # backtrack the walk goes on from the undone op and takes the first op
    # whose configuration is new: the scan found no read to take here.
    has_reads = any(reads)
    scan = has_reads
    pick = -1  # scanning: the op to take if none keeps the state
    pick_cfg = cfg
    node = nxt[0]
    while remaining:
        ticks -= 1
        if not ticks:
            ticks = _SLICE
            yield
        op = ev[node]
        if op >= 0:
            if pick >= 0 and not reads[op]:  # scanning on for a read
                node = nxt[node]
                continue
            new = advance(state, inputs[op])
            if new is NO:
                node = nxt[node]
                continue
            # Over sets of states a read may drop some: then it is no shortcut.
            keeps = scan and reads[op] and (new is state or new == state)
            if pick >= 0 and not keeps:
                node = nxt[node]
                continue
            d = op - k
            if d:
                ncfg = (k, w | (1 << d), new)
            else:  # the lowest op: shift out the run of linearized ops it ends
                nw = w | 1
                t = (~nw & (nw + 1)).bit_length() - 1
                ncfg = (k + t, nw >> t, new)
            take = ncfg not in cache
            if not take and not keeps:
                node = nxt[node]
                continue
            if take and scan and not keeps:
                pick, pick_cfg = op, ncfg
                node = nxt[node]
                continue
            # else: take it, or (explored and failed, and it keeps the state)
            # this configuration fails as well.
        elif pick >= 0:
            op, ncfg, keeps, take = pick, pick_cfg, False, True
        else:
            # A completion: its operation had to take effect by now. Backtrack.
            take = False
            depth = len(lin)
            if depth >= len(best):
                del best[low:]
                best += lin[low:]
                low = depth
                blocked = ~op
        if take:
            cache.add(ncfg)
            stack.append(cfg)
            lin.append(~op if keeps else op)  # ~: taken for good, no alternative
            cfg = ncfg
            k, w, state = ncfg
            c = call_node[op]
            nxt[prv[c]] = nxt[c]
            prv[nxt[c]] = prv[c]
            r = ret_node[op]
            if r:
                nxt[prv[r]] = nxt[r]
                prv[nxt[r]] = prv[r]
                remaining -= 1
            node = nxt[0]
            scan = has_reads
            pick = -1
            continue
        # Undo the last choice, and every choice before it that was for good.
        while True:
            if not lin:
                return PartitionResult(
                    key, "invalid", tuple(calls), _ops(best), blocked, len(cache), _since(started)
                )
            op = lin.pop()
            cfg = stack.pop()
            low = min(low, len(lin))
            forced = op < 0
            if forced:
                op = ~op
            r = ret_node[op]
            if r:
                nxt[prv[r]] = r
                prv[nxt[r]] = r
                remaining += 1
            c = call_node[op]
            nxt[prv[c]] = c
            prv[nxt[c]] = c
            if not forced:
                break
        k, w, state = cfg
        node = nxt[c]
        scan = False
        pick = -1
    return PartitionResult(key, "valid", tuple(calls), _ops(lin), None, len(cache), _since(started))


def _ops(lin: list[int]) -> tuple[int, ...]:
    """Positions in ``calls`` of a prefix (ops taken for good are stored as ~op)."""
    return tuple(o if o >= 0 else ~o for o in lin)


def _set_step(step: Callable[[Any, Any], AbstractSet[Any] | None]) -> Callable[[Any, Any], Any]:
    """One step of the subset construction: the union of the states every
    current state can step to, or ``NO``."""

    def advance(states: frozenset[Any], inp: object) -> object:
        if len(states) == 1:
            (only,) = states
            after = step(only, inp)
            return frozenset(after) if after else NO
        acc: set[Any] = set()
        for s in states:
            after = step(s, inp)
            if after:
                acc |= after
        return frozenset(acc) if acc else NO

    return advance


def _since(started: float) -> float:
    return time.monotonic() - started


def partition(model: Model, operations: Iterable[Operation]) -> dict[Hashable, list[Call]]:
    """Split by the model's key; drops operations that certainly did not happen."""
    parts: dict[Hashable, list[Call]] = {}
    prepare, new, inf = model.prepare, tuple.__new__, math.inf
    for i, op in enumerate(operations):
        prepared = prepare(op)
        if prepared is None:
            continue
        key, inp, known = prepared
        calls = parts.get(key)
        if calls is None:
            calls = parts[key] = []
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (10^5 calls: a fifth
        # of the partition's time).
        calls.append(new(Call, (op.call, op.ret if known else inf, inp, i)))
    for calls in parts.values():
        calls.sort()
    return parts


def interleave(
    model: Model,
    parts: Sequence[tuple[Hashable, Sequence[Call]]],
    deadline: float = math.inf,
    *,
    exhaustive: bool = False,
    stop: Callable[[], bool] = lambda: False,
    progress: Callable[[int, int], None] | None = None,
) -> list[PartitionResult]:
    """Search every partition in turns, a slice each, so that one hard key does
    not hide an easy violation in another. The first invalid key ends the
    search (the others become unknown) unless ``exhaustive``; so do the
    deadline and ``stop()``."""
    active = {i: _search_steps(model, calls, key) for i, (key, calls) in enumerate(parts)}
    results: dict[int, PartitionResult] = {}
    why = _rounds(
        active, results, len(parts), deadline, exhaustive=exhaustive, stop=stop, progress=progress
    )
    for i in active:
        key, calls = parts[i]
        results[i] = _cut_short(key, calls, why)
    return [results[i] for i in range(len(parts))]


Searches = dict[int, Generator[None, None, PartitionResult]]


def _rounds(
    active: Searches,
    results: dict[int, PartitionResult],
    parts: int,
    deadline: float,
    *,
    exhaustive: bool,
    stop: Callable[[], bool] = lambda: False,
    progress: Callable[[int, int], None] | None = None,
    pause: float = math.inf,
) -> str:
    """Run the ``active`` searches in turns, moving each one that ends to
    ``results``; why the others did not end, or "" if it is past ``pause``."""
    why = ""
    while active and not why:
        for i, steps in list(active.items()):
            try:
                next(steps)
            except StopIteration as done:
                results[i] = done.value
                del active[i]
                if results[i].verdict == "invalid" and not exhaustive:
                    why = "not finished: another key is not linearizable"
                    break
        now = time.monotonic()
        if now > deadline:
            why = why or "out of time"
        elif stop():
            why = why or "not finished: another key is not linearizable"
        if progress is not None:
            progress(len(results), parts)
        if not why and now > pause:
            break
    return why


_stop_event: Any = None  # set in worker processes: another worker found a violation


def _init_worker(event: object) -> None:
    global _stop_event  # noqa: PLW0603 - per-process state of the pool's workers
    _stop_event = event


def _interleave_in_worker(
    name: str, parts: list[tuple[Hashable, Sequence[Call]]], deadline: float, exhaustive: bool
) -> list[PartitionResult]:
    event = _stop_event
    results = interleave(
        MODELS[name],
        parts,
        deadline,
        exhaustive=exhaustive,
        stop=lambda: event is not None and event.is_set(),
    )
    if event is not None and not exhaustive and any(r.verdict == "invalid" for r in results):
        event.set()
    # The parent has the calls: sending them back would cost as much as sending them.
    return [replace(r, calls=()) for r in results]


def _in_workers(
    name: str,
    parts: Sequence[tuple[Hashable, Sequence[Call]]],
    deadline: float,
    exhaustive: bool,
    jobs: int,
) -> list[PartitionResult]:
    """:func:`interleave` over ``parts`` shared among worker processes."""
    ctx = multiprocessing.get_context("forkserver")
    event = ctx.Event()
    n = min(jobs, len(parts))
    shares = [list(parts[i::n]) for i in range(n)]
    with ProcessPoolExecutor(
        max_workers=n, mp_context=ctx, initializer=_init_worker, initargs=(event,)
    ) as pool:
        futures = [
            pool.submit(_interleave_in_worker, name, share, deadline, exhaustive)
            for share in shares
        ]
        done = [f.result() for f in futures]
    by_key = {r.key: r for rs in done for r in rs}
    return [replace(by_key[key], calls=tuple(calls)) for key, calls in parts]


def check(
    model: Model | str,
    operations: Iterable[Operation],
    *,
    budget: float | None = None,
    jobs: int | None = None,
    exhaustive: bool = False,
    progress: Callable[[int, int], None] | None = None,
    parallel_min_ops: float = PARALLEL_MIN_OPS,
) -> CheckResult:
    """Check paired operations against ``model``; ``budget`` in seconds.

    ``jobs``: worker processes (default: the CPUs); the keys still open after
    ``PARALLEL_AFTER`` seconds, if more than one, are searched anew in parallel,
    and all keys are from the start in a history of ``parallel_min_ops``
    operations or more. The first key found not linearizable settles the
    verdict unless ``exhaustive``. ``progress`` is called with (keys decided,
    keys) between rounds (in-process search only).
    """
    started = time.monotonic()
    m = MODELS[model] if isinstance(model, str) else model
    deadline = math.inf if budget is None else time.monotonic() + budget
    parts = sorted(partition(m, operations).items(), key=lambda kv: kv[1][0].call if kv[1] else 0)
    results = search_parts(
        m,
        parts,
        deadline,
        jobs=jobs,
        exhaustive=exhaustive,
        progress=progress,
        parallel_min_ops=parallel_min_ops,
    )
    return CheckResult(m.name, overall(results), results, _since(started))


def overall(results: Iterable[PartitionResult]) -> Verdict:
    """A history's verdict from its keys': invalid if one is, else unknown if one is."""
    verdicts = {r.verdict for r in results}
    return "invalid" if "invalid" in verdicts else "unknown" if "unknown" in verdicts else "valid"


def search_parts(
    m: Model,
    parts: Sequence[tuple[Hashable, Sequence[Call]]],
    deadline: float,
    *,
    jobs: int | None = None,
    exhaustive: bool = False,
    progress: Callable[[int, int], None] | None = None,
    parallel_min_ops: float = PARALLEL_MIN_OPS,
) -> list[PartitionResult]:
    """The search of :func:`check` over partitions already made (in its order)."""
    jobs = jobs if jobs is not None else (os.cpu_count() or 1)
    total = sum(len(c) for _, c in parts)
    parallel = jobs > 1 and len(parts) > 1 and MODELS.get(m.name) is m
    if parallel and total >= parallel_min_ops:
        return _in_workers(m.name, parts, deadline, exhaustive, jobs)
    # In this process first: most histories are decided before workers
    # would have started. Keys still open after PARALLEL_AFTER are hard
    # ones; if there are several, workers search them again from the start.
    active = {i: _search_steps(m, calls, key) for i, (key, calls) in enumerate(parts)}
    done: dict[int, PartitionResult] = {}
    pause = time.monotonic() + PARALLEL_AFTER if parallel else math.inf
    why = _rounds(
        active, done, len(parts), deadline, exhaustive=exhaustive, progress=progress, pause=pause
    )
    if not why and len(active) > 1:
        hard = list(active)
        again = _in_workers(m.name, [parts[i] for i in hard], deadline, exhaustive, jobs)
        done.update(zip(hard, again, strict=True))
        active.clear()
    elif not why:
        why = _rounds(active, done, len(parts), deadline, exhaustive=exhaustive, progress=progress)
    for i in active:
        key, calls = parts[i]
        done[i] = _cut_short(key, calls, why)
    return [done[i] for i in range(len(parts))]
