"""The generic linearizability checker: Wing-Gong search with Lowe's memoisation.

The history is split by the model's key (P-compositionality: a history is
linearizable iff each key's sub-history is) and each part is searched alone,
in worker processes when there are several big parts.

The search (Wing and Gong 1993, with Lowe's 2017 cache, as Porcupine does it):
events (invocations and completions) sit in a doubly linked list in real-time
order, which is the order of history indices. Walking from the head, an
invocation may be linearized now if the model lets it take effect in the
current state; it is then lifted out of the list (its invocation and its
completion) and the walk restarts from the head. Reaching a completion means
that operation should have taken effect before it and did not: undo the last
choice and try the next candidate. The cache holds every (set of linearized
operations, model state) already explored, so no configuration is searched
twice; the sets are bitsets (Python ints).

Operations whose outcome is unknown (``info``, or never completed) have no
completion event: they may take effect at any point after their invocation or
never, so the search succeeds as soon as every operation with a known outcome
is linearized. Nondeterministic models are searched over sets of states (the
subset construction), so one step per linearized operation.

A time budget bounds the whole check; past it the verdict is ``unknown``.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Callable, Generator, Hashable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from bkref.linearizability.history import Operation
from bkref.linearizability.models import MODELS, Model

Verdict = Literal["valid", "invalid", "unknown"]

# Below this many operations in all, worker processes cost more than they save
# (measured on Porcupine's kv histories of 2,000 ops: see BENCHMARKS.md).
PARALLEL_MIN_OPS = 10_000
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
    step = model.step
    # Nodes: 0 is the head; events 1..m in index order; m + 1 is the tail.
    events = sorted(
        [(c.call, i, False) for i, c in enumerate(calls)]
        + [(int(c.ret), i, True) for i, c in enumerate(calls) if c.ret != math.inf]
    )
    m = len(events)
    ev_op = [-1] + [e[1] for e in events] + [-1]
    ev_ret = [False] + [e[2] for e in events] + [False]
    nxt = list(range(1, m + 3))
    prv = list(range(-1, m + 1))
    call_node = [0] * n
    ret_node = [0] * n
    for node in range(1, m + 1):
        if ev_ret[node]:
            ret_node[ev_op[node]] = node
        else:
            call_node[ev_op[node]] = node
    inputs = [c.input for c in calls]
    remaining = sum(1 for c in calls if c.ret != math.inf)

    states: frozenset[Any] = frozenset(model.init(inputs))
    linearized = 0
    stack: list[tuple[int, frozenset[Any]]] = []
    cache: set[tuple[int, frozenset[Any]]] = set()
    best: tuple[tuple[int, ...], int | None] = ((), None)
    ticks = 0
    node = nxt[0]
    while remaining:
        ticks += 1
        if ticks % _SLICE == 0:
            yield
        op = ev_op[node]
        if not ev_ret[node]:
            inp = inputs[op]
            if len(states) == 1:
                (only,) = states
                after = step(only, inp)
                new = frozenset(after) if after else None
            else:
                acc: set[Any] = set()
                for s in states:
                    after = step(s, inp)
                    if after:
                        acc |= after
                new = frozenset(acc) if acc else None
            if new is not None:
                bits = linearized | (1 << op)
                cfg = (bits, new)
                if cfg not in cache:
                    cache.add(cfg)
                    stack.append((op, states))
                    states, linearized = new, bits
                    c = call_node[op]
                    nxt[prv[c]] = nxt[c]
                    prv[nxt[c]] = prv[c]
                    r = ret_node[op]
                    if r:
                        nxt[prv[r]] = nxt[r]
                        prv[nxt[r]] = prv[r]
                        remaining -= 1
                    node = nxt[0]
                    continue
            node = nxt[node]
            continue
        # A completion: its operation had to take effect by now. Backtrack.
        if len(stack) >= len(best[0]):
            best = (tuple(o for o, _ in stack), op)
        if not stack:
            return PartitionResult(key, "invalid", tuple(calls), *best, len(cache), _since(started))
        op, states = stack.pop()
        linearized ^= 1 << op
        r = ret_node[op]
        if r:
            nxt[prv[r]] = r
            prv[nxt[r]] = r
            remaining += 1
        c = call_node[op]
        nxt[prv[c]] = c
        prv[nxt[c]] = c
        node = nxt[c]
    order = tuple(o for o, _ in stack)
    return PartitionResult(key, "valid", tuple(calls), order, None, len(cache), _since(started))


def _since(started: float) -> float:
    return time.monotonic() - started


def partition(model: Model, operations: Iterable[Operation]) -> dict[Hashable, list[Call]]:
    """Split by the model's key; drops operations that certainly did not happen."""
    parts: dict[Hashable, list[Call]] = {}
    for i, op in enumerate(operations):
        prepared = model.prepare(op)
        if prepared is None:
            continue
        key, inp, known = prepared
        ret = op.ret if known else math.inf
        parts.setdefault(key, []).append(Call(op.call, ret, inp, i))
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
        if time.monotonic() > deadline:
            why = why or "out of time"
        elif stop():
            why = why or "not finished: another key is not linearizable"
        if progress is not None:
            progress(len(results), len(parts))
    for i in active:
        key, calls = parts[i]
        results[i] = _cut_short(key, calls, why)
    return [results[i] for i in range(len(parts))]


_stop_event: Any = None  # set in worker processes: another worker found a violation


def _init_worker(event: object) -> None:
    global _stop_event  # noqa: PLW0603 - per-process state of the pool's workers
    _stop_event = event


def _interleave_in_worker(
    name: str, parts: list[tuple[Hashable, list[Call]]], deadline: float, exhaustive: bool
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
    return results


def check(
    model: Model | str,
    operations: Iterable[Operation],
    *,
    budget: float | None = None,
    jobs: int | None = None,
    exhaustive: bool = False,
    progress: Callable[[int, int], None] | None = None,
    parallel_min_ops: int = PARALLEL_MIN_OPS,
) -> CheckResult:
    """Check paired operations against ``model``; ``budget`` in seconds.

    ``jobs``: worker processes (default: the CPUs); partitions run in parallel
    only when the history has ``parallel_min_ops`` operations or more. The first key found
    not linearizable settles the verdict unless ``exhaustive``. ``progress``
    is called with (keys decided, keys) between rounds (in-process search only).
    """
    started = time.monotonic()
    m = MODELS[model] if isinstance(model, str) else model
    deadline = math.inf if budget is None else time.monotonic() + budget
    parts = sorted(partition(m, operations).items(), key=lambda kv: kv[1][0].call if kv[1] else 0)
    jobs = jobs if jobs is not None else (os.cpu_count() or 1)
    total = sum(len(c) for _, c in parts)
    if jobs > 1 and len(parts) > 1 and total >= parallel_min_ops and MODELS.get(m.name) is m:
        ctx = multiprocessing.get_context("forkserver")
        event = ctx.Event()
        n = min(jobs, len(parts))
        shares = [parts[i::n] for i in range(n)]
        with ProcessPoolExecutor(
            max_workers=n, mp_context=ctx, initializer=_init_worker, initargs=(event,)
        ) as pool:
            futures = [
                pool.submit(_interleave_in_worker, m.name, share, deadline, exhaustive)
                for share in shares
            ]
            done = [f.result() for f in futures]
        by_key = {r.key: r for rs in done for r in rs}
        results = [by_key[key] for key, _ in parts]
    else:
        results = interleave(m, parts, deadline, exhaustive=exhaustive, progress=progress)
    verdicts = {r.verdict for r in results}
    verdict: Verdict = (
        "invalid" if "invalid" in verdicts else "unknown" if "unknown" in verdicts else "valid"
    )
    return CheckResult(m.name, verdict, results, _since(started))
