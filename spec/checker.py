"""Explicit-state model checker: breadth-first search, random walks, traces.

``check(cfg)`` explores every state reachable under ``cfg`` breadth first,
identifying states equal up to renaming of bookies (``spec.symmetry``), and
tests every invariant of ``spec.invariants`` on every distinct state. The
first violation found is at minimal depth, so its trace is a shortest one.
It reports states explored (transitions), distinct states, depth and states
per second, with a progress line on long runs; ``workers=N`` expands large
layers in forked processes, with the same result. ``walk(cfg, steps, seed)``
follows random enabled actions instead, deeper than BFS can reach.
"""

from __future__ import annotations

import gc
import multiprocessing
import random
import sys
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TextIO

from spec.config import Config
from spec.invariants import INVARIANTS, Invariant
from spec.protocol import State, Step, format_label, initial_state, next_states
from spec.symmetry import canonical


@dataclass(frozen=True)
class TraceStep:
    """One step of a trace: the action taken (``"Init"`` first) and the state after it."""

    action: str
    state: State


@dataclass
class Result:
    """What a run found and how much it explored."""

    config: Config
    explored: int = 0  # transitions followed (successor states generated)
    distinct: int = 0  # distinct states after symmetry reduction
    depth: int = 0  # BFS depth reached (length of the longest shortest path)
    seconds: float = 0.0
    complete: bool = False  # the whole reachable state space was explored
    violation: str | None = None  # name of the violated invariant
    trace: list[TraceStep] = field(default_factory=list)
    skipped: tuple[str, ...] = ()  # invariants not checked under this config
    graph: Graph | None = None

    @property
    def rate(self) -> float:
        """Distinct states per second."""
        return self.distinct / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Graph:
    """The explored state graph, kept for liveness checking."""

    states: list[State]
    edges: list[list[tuple[int, int]]]  # per state: (successor index, action id)
    actions: list[str]  # action id -> action name (without arguments)
    parent: array[int]


def active_invariants(cfg: Config) -> list[Invariant]:
    return [inv for inv in INVARIANTS if inv.__name__ not in cfg.skip_invariants]


def first_violation(cfg: Config, s: State, invariants: list[Invariant]) -> str | None:
    for inv in invariants:
        if not inv(cfg, s):
            return inv.__name__
    return None


def check(
    cfg: Config,
    *,
    symmetry: bool = True,
    max_states: int | None = None,
    keep_graph: bool = False,
    progress: TextIO | None = None,
    progress_every: float = 5.0,
    workers: int = 1,
    expand: Callable[[Config, State], list[Step]] = next_states,
) -> Result:
    """Breadth-first exhaustive check of every invariant; stops at the first violation.

    With ``workers`` > 1, forked processes expand each large BFS layer (see
    ``_expand``); the result is the same in every field, trace included.
    ``expand`` computes a state's steps (``spec.coverage`` passes one that counts
    them); forked workers always use ``next_states``, so it needs ``workers=1``.
    """
    if expand is not next_states and workers > 1:
        raise ValueError("a custom expand runs in the checker's own process: use workers=1")
    # States are tuples of ints and tuples: no reference cycles for the cyclic
    # collector to find, yet its passes over millions of live tuples cost a
    # fifth of the run. It is off for the search and restored after.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _bfs(
            cfg,
            canon=canonical if symmetry else _identity,
            max_states=max_states,
            keep_graph=keep_graph,
            progress=progress,
            progress_every=progress_every,
            workers=workers if workers > 1 and _can_fork() else 1,
            expand=expand,
        )
    finally:
        if gc_was_enabled:
            gc.enable()


def _identity(s: State) -> State:
    return s


def _can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


# A layer smaller than this is expanded in the checker's own process: forking
# costs more than it saves.
PARALLEL_MIN_LAYER = 4_000


def _bfs(
    cfg: Config,
    *,
    canon: Callable[[State], State],
    max_states: int | None,
    keep_graph: bool,
    progress: TextIO | None,
    progress_every: float,
    workers: int,
    expand: Callable[[Config, State], list[Step]],
) -> Result:
    invariants = active_invariants(cfg)
    result = Result(config=cfg, skipped=tuple(sorted(cfg.skip_invariants)))
    started = time.monotonic()
    init = canon(initial_state(cfg))
    index: dict[State, int] = {init: 0}
    states: list[State] = [init]
    parent = array("i", [-1])
    edges: list[list[tuple[int, int]]] = [[]] if keep_graph else []
    action_ids: dict[str, int] = {}
    frontier = [0]
    depth = 0
    explored = 0
    last_report = started
    bad = first_violation(cfg, init, invariants)
    bad_index = 0 if bad else -1
    while frontier and bad is None:
        next_frontier: list[int] = []
        if workers > 1 and len(frontier) >= PARALLEL_MIN_LAYER:
            layer: Iterator[tuple[int, list[str], list[int | State], list[str | None]]] = _expand(
                cfg,
                canon=canon,
                invariants=invariants,
                index=index,
                states=states,
                frontier=frontier,
                workers=workers,
                keep_graph=keep_graph,
            )
        else:
            layer = ((i, [], [], []) for i in frontier)
        for i, names, succ, verdicts in layer:
            if not names and not succ:  # expand here; else a worker did
                for label, t in expand(cfg, states[i]):
                    names.append(label[0])
                    succ.append(canon(t))
                    verdicts.append(UNCHECKED)
            for k, c in enumerate(succ):
                explored += 1
                if isinstance(c, int):
                    j = c  # known before the layer (a worker looked it up)
                else:
                    j = index.setdefault(c, len(states))  # one hash of the state, not two
                    if j == len(states):
                        states.append(c)
                        parent.append(i)
                        next_frontier.append(j)
                        if keep_graph:
                            edges.append([])
                        v = verdicts[k]
                        bad = first_violation(cfg, c, invariants) if v == UNCHECKED else v
                        if bad is not None:
                            bad_index = j
                if keep_graph:
                    aid = action_ids.setdefault(names[k], len(action_ids))
                    edges[i].append((j, aid))
                if bad_index >= 0:
                    break
            if bad_index >= 0:
                break
            if max_states is not None and len(states) >= max_states:
                break
            if progress is not None and time.monotonic() - last_report >= progress_every:
                last_report = time.monotonic()
                secs = last_report - started
                print(
                    f"  depth {depth + 1}: {len(states):,} distinct, {explored:,} explored, "
                    f"queue {len(next_frontier):,}, {len(states) / secs:,.0f} states/s",
                    file=progress,
                    flush=True,
                )
        if bad is not None or (max_states is not None and len(states) >= max_states):
            if next_frontier:
                depth += 1
            break
        frontier = next_frontier
        if frontier:
            depth += 1
    result.explored = explored
    result.distinct = len(states)
    result.depth = depth
    result.seconds = time.monotonic() - started
    result.complete = bad is None and not frontier
    if bad is not None:
        result.violation = bad
        path = []
        k = bad_index
        while k >= 0:
            path.append(states[k])
            k = parent[k]
        result.trace = concrete_trace(cfg, path[::-1], canon)
    if keep_graph:
        result.graph = Graph(
            states=states,
            edges=edges,
            actions=sorted(action_ids, key=action_ids.__getitem__),
            parent=parent,
        )
    return result


# A verdict not computed yet (a worker's verdicts are None or an invariant's name).
UNCHECKED = ""

# One chunk of a layer, expanded by a worker: per frontier state its number of
# successors; per successor (in next_states order) the index of a state known
# before the layer, or -1 - k for the chunk's k-th state new to the layer; those
# states (plain tuples: cheaper to pickle) and their first violated invariants;
# the action names when the graph is kept.
Chunk = tuple[list[int], list[int], list[tuple[object, ...]], list["str | None"], list[str]]

# What forked workers read: set before the pool forks, inherited copy-on-write.
_LAYER: tuple[
    Config, Callable[[State], State], list[Invariant], dict[State, int], list[State], bool
]


def _expand(
    cfg: Config,
    *,
    canon: Callable[[State], State],
    invariants: list[Invariant],
    index: dict[State, int],
    states: list[State],
    frontier: list[int],
    workers: int,
    keep_graph: bool,
) -> Iterator[tuple[int, list[str], list[int | State], list[str | None]]]:
    """Expand a BFS layer in ``workers`` forked processes, yielding in frontier order.

    Each worker takes chunks of the frontier and does what costs: the
    successors, their canonical forms, the look-up among the states known
    before the layer (its forked copy of ``index``) and the invariants of
    the others. The checker merges the chunks in frontier order, numbering
    new states as a sequential run would: the same states, depths, counts
    and traces. Only states new to the layer travel back (pickled).
    """
    global _LAYER  # noqa: PLW0603 - how a forked worker sees the layer
    _LAYER = (cfg, canon, invariants, index, states, keep_graph)
    size = max(500, len(frontier) // (workers * 16))
    chunks = [frontier[k : k + size] for k in range(0, len(frontier), size)]
    new = tuple.__new__
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for chunk, (counts, codes, fresh, verdicts, names) in zip(
            chunks, pool.imap(_expand_chunk, chunks), strict=True
        ):
            fresh_states = [new(State, t) for t in fresh]
            pos = 0
            for i, n in zip(chunk, counts, strict=True):
                succ: list[int | State] = []
                checked: list[str | None] = []
                for code in codes[pos : pos + n]:
                    if code >= 0:
                        succ.append(code)
                        checked.append(None)
                    else:
                        succ.append(fresh_states[-1 - code])
                        checked.append(verdicts[-1 - code])
                yield i, names[pos : pos + n] if keep_graph else [""] * n, succ, checked
                pos += n


def _expand_chunk(chunk: list[int]) -> Chunk:
    cfg, canon, invariants, index, states, keep_graph = _LAYER
    counts: list[int] = []
    codes: list[int] = []
    fresh: list[tuple[object, ...]] = []
    verdicts: list[str | None] = []
    names: list[str] = []
    seen: dict[State, int] = {}  # new to the layer: code (one per state and chunk)
    for i in chunk:
        steps = next_states(cfg, states[i])
        counts.append(len(steps))
        for label, t in steps:
            c = canon(t)
            code = index.get(c)
            if code is None:
                code = seen.get(c)
                if code is None:
                    code = seen[c] = -1 - len(fresh)
                    fresh.append(tuple(c))
                    verdicts.append(first_violation(cfg, c, invariants))
            codes.append(code)
            if keep_graph:
                names.append(label[0])
    return counts, codes, fresh, verdicts, names


def concrete_trace(
    cfg: Config, path: list[State], canon: Callable[[State], State]
) -> list[TraceStep]:
    """Replay a path of canonical states from the real initial state, with action labels."""
    cur = initial_state(cfg)
    trace = [TraceStep("Init", cur)]
    for target in path[1:]:
        for label, t in next_states(cfg, cur):
            if canon(t) == target:
                trace.append(TraceStep(format_label(label), t))
                cur = t
                break
        else:  # pragma: no cover - a bug in symmetry or in the search
            raise AssertionError("trace replay lost the path")
    return trace


@dataclass
class WalkResult:
    """What random walks found."""

    config: Config
    seed: int
    steps: int = 0
    walks: int = 0
    max_depth: int = 0
    seconds: float = 0.0
    violation: str | None = None
    trace: list[TraceStep] = field(default_factory=list)


def walk(cfg: Config, steps: int, seed: int, max_depth: int = 10_000) -> WalkResult:
    """Random walks from the initial state, ``steps`` actions in all, one seed.

    Each walk follows uniformly chosen enabled actions until none is enabled
    (or ``max_depth``), then a new walk starts. Reproduce a run with the same
    seed. A violation's trace is the walk's prefix, not a shortest one.
    """
    rng = random.Random(seed)
    invariants = active_invariants(cfg)
    out = WalkResult(config=cfg, seed=seed)
    started = time.monotonic()
    while out.steps < steps and out.violation is None:
        out.walks += 1
        cur = initial_state(cfg)
        trace = [TraceStep("Init", cur)]
        for _ in range(max_depth):
            succ = list(next_states(cfg, cur))
            if not succ or out.steps >= steps:
                break
            label, cur = rng.choice(succ)
            out.steps += 1
            trace.append(TraceStep(format_label(label), cur))
            bad = first_violation(cfg, cur, invariants)
            if bad is not None:
                out.violation = bad
                out.trace = trace
                break
        out.max_depth = max(out.max_depth, len(trace) - 1)
    out.seconds = time.monotonic() - started
    return out


def print_progress_header(cfg: Config, stream: TextIO = sys.stderr) -> None:
    print(f"checking config {cfg.name}: {cfg.bounds()}", file=stream, flush=True)
