"""Explicit-state model checker: breadth-first search, random walks, traces.

``check(cfg)`` explores every state reachable under ``cfg`` breadth first,
identifying states equal up to renaming of bookies (``bkref.spec.symmetry``), and
tests every invariant of ``bkref.spec.invariants`` on every distinct state. The
first violation found is at minimal depth, so its trace is a shortest one.
It reports states explored (transitions), distinct states, depth and states
per second, with a progress line on long runs; ``workers=N`` expands large
layers in forked processes, with the same result. ``walk(cfg, steps, seed)``
follows random enabled actions instead, deeper than BFS can reach.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import random
import resource
import sys
import time
from array import array
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, cast

from bkref.spec.build import running
from bkref.spec.checkpoint import Checkpoint
from bkref.spec.config import Config
from bkref.spec.invariants import INVARIANTS, Invariant
from bkref.spec.protocol import State, Step, format_label, initial_state, next_states
from bkref.spec.symmetry import canonical
from bkref.spec.visited import Layer, Visited, collision_probability, fingerprint


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
    fingerprints: bool = False  # the visited set held 64-bit fingerprints
    rss: int = 0  # the process's resident memory at the end, bytes
    # New distinct states per BFS level, Init's first (the last one partial when the
    # search stopped early): the growth a projection of a config too big to finish reads.
    levels: list[int] = field(default_factory=list)

    @property
    def collision_probability(self) -> float:
        """With fingerprints, the estimated chance that two states were taken for one."""
        return collision_probability(self.distinct) if self.fingerprints else 0.0

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


def rss_bytes() -> int:
    """The process's resident memory now (Linux ``/proc``; else its peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def check(
    cfg: Config,
    *,
    symmetry: bool = True,
    max_states: int | None = None,
    keep_graph: bool = False,
    fingerprints: bool = False,
    progress: TextIO | None = None,
    progress_every: float = 5.0,
    workers: int = 1,
    expand: Callable[[Config, State], list[Step]] = next_states,
    checkpoint: Path | None = None,
) -> Result:
    """Breadth-first exhaustive check of every invariant; stops at the first violation.

    With ``workers`` > 1, forked processes expand each large BFS layer (see
    ``_expand``); the result is the same in every field, trace included.
    ``expand`` computes a state's steps (``bkref.spec.coverage`` passes one that counts
    them); forked workers always use ``next_states``, so it needs ``workers=1``.

    With ``fingerprints``, the visited set holds each state's 64-bit
    ``fingerprint`` instead of the state, as TLC's does, and only the BFS layer
    being expanded and the next one are kept whole: a fraction of the memory.
    Two states that share a fingerprint would be taken for one, so a part of
    the state space could go unexplored; ``Result.collision_probability``
    estimates the chance of that. A trace is rebuilt by replaying successors
    whose fingerprints follow the recorded path. The graph (liveness) needs
    whole states: not with ``keep_graph``.

    With ``checkpoint`` (a directory; fingerprints only), the end of every level is
    saved there, and a search of the same config that finds a checkpoint there goes on
    from it (``bkref.spec.checkpoint``; the result is the uninterrupted run's, seconds
    summed over the runs). It needs a fixed PYTHONHASHSEED, or CheckpointError.
    """
    if checkpoint is not None and not fingerprints:
        raise ValueError("a checkpoint holds fingerprints: use fingerprints=True with it")
    saver = Checkpoint(checkpoint, cfg, symmetry=symmetry) if checkpoint is not None else None
    if expand is not next_states and workers > 1:
        raise ValueError("a custom expand runs in the checker's own process: use workers=1")
    if fingerprints and keep_graph:
        raise ValueError("the state graph needs whole states: no fingerprints with keep_graph")
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
            fingerprints=fingerprints,
            progress=progress,
            progress_every=progress_every,
            workers=workers if workers > 1 and _can_fork() else 1,
            expand=expand,
            checkpoint=saver,
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
    fingerprints: bool,
    progress: TextIO | None,
    progress_every: float,
    workers: int,
    expand: Callable[[Config, State], list[Step]],
    checkpoint: Checkpoint | None,
) -> Result:
    invariants = active_invariants(cfg)
    result = Result(
        config=cfg, skipped=tuple(sorted(cfg.skip_invariants)), fingerprints=fingerprints
    )
    started = time.monotonic()
    init = canon(initial_state(cfg))
    visited = Visited(fingerprints)
    visited.add(visited.encode(init)[0])
    # Whole states by index, unless fingerprints: then only the layer's (``current``).
    states: list[State] = [] if fingerprints else [init]
    parent = array("i", [-1])
    edges: list[list[tuple[int, int]]] = [[]] if keep_graph else []
    action_ids: dict[str, int] = {}
    # The layer being expanded: its states' indices (new states get the next index, so a
    # layer's are consecutive) and the states themselves.
    frontier = range(1)
    current = Layer(on_disk=False)
    current.append(init, None)
    depth = 0
    explored = 0
    last_report = started
    bad = first_violation(cfg, init, invariants)
    bad_index = 0 if bad else -1
    result.levels.append(1)
    saved = checkpoint.load() if checkpoint is not None and bad is None else None
    if saved is not None:  # go on from the end of the level it saved
        visited.restore(saved.fps)
        parent, depth, explored = saved.parent, saved.depth, saved.explored
        result.levels = saved.levels
        current.close()
        count = 0 if saved.complete else saved.levels[-1]
        current = Layer.from_file(saved.layer, count)
        frontier = range(visited.count - count, visited.count)
        started -= saved.seconds
        if progress is not None:
            print(f"  going on from {saved}", file=progress, flush=True)
    while frontier and bad is None:
        next_start = visited.count
        saved_at = checkpoint.layer_path(depth + 1) if checkpoint is not None else None
        next_current = Layer(on_disk=fingerprints, path=saved_at)
        parallel: Generator[_Expanded, None, None] | None = None
        if workers > 1 and len(frontier) >= PARALLEL_MIN_LAYER:
            parallel = _expand(
                cfg,
                canon=canon,
                invariants=invariants,
                visited=visited,
                current=current,
                workers=workers,
                keep_graph=keep_graph,
            )
            layer: Iterator[_Expanded] = parallel
        else:
            layer = _here(current)  # to expand here
        for pos, st, names, succ, verdicts in layer:
            i = frontier[pos]
            if st is not None:  # expand here; else a worker did
                for label, t in expand(cfg, st):
                    c = canon(t)
                    names.append(label[0])
                    key, blob = visited.encode(c)
                    succ.append((key, c, blob))
                    verdicts.append(UNCHECKED)
            for k, item in enumerate(succ):
                explored += 1
                if isinstance(item, int):
                    j = item  # known before the layer (a worker looked it up)
                else:
                    key, new_state, blob = item
                    n = visited.count
                    j = visited.add(key)
                    if j == n:
                        if not fingerprints:
                            states.append(cast(State, new_state))
                        parent.append(i)
                        next_current.append(new_state, blob)
                        if keep_graph:
                            edges.append([])
                        v = verdicts[k]
                        if v == UNCHECKED:  # expanded here, so the state is at hand
                            v = first_violation(cfg, cast(State, new_state), invariants)
                        bad = v
                        if bad is not None:
                            bad_index = j
                if keep_graph:
                    aid = action_ids.setdefault(names[k], len(action_ids))
                    edges[i].append((j, aid))
                if bad_index >= 0:
                    break
            if bad_index >= 0:
                break
            if max_states is not None and visited.count >= max_states:
                break
            if progress is not None and time.monotonic() - last_report >= progress_every:
                last_report = time.monotonic()
                secs = last_report - started
                print(
                    f"  depth {depth + 1}: {visited.count:,} distinct, {explored:,} explored, "
                    f"queue {len(frontier) - pos - 1 + len(next_current):,}, "
                    f"{visited.count / secs:,.0f} states/s, {rss_bytes() / 2**20:,.0f} MiB",
                    file=progress,
                    flush=True,
                )
        # Closed here, not left to its release: a generator compiled by mypyc (the spec's
        # build) does not run its ``finally`` when dropped, and a layer left early (a
        # violation, max_states) would leave its workers' pool open.
        if parallel is not None:
            parallel.close()
        current.close()
        frontier, current = range(next_start, visited.count), next_current
        if frontier:
            result.levels.append(len(frontier))
            if progress is not None:
                print(
                    f"  level {depth + 1} done: {len(frontier):,} new, {visited.count:,} distinct, "
                    f"{explored:,} explored, {time.monotonic() - started:,.1f} s",
                    file=progress,
                    flush=True,
                )
        if bad is not None or (max_states is not None and visited.count >= max_states):
            if frontier:
                depth += 1
            break
        if frontier:
            depth += 1
        if checkpoint is not None and current.path is not None:
            current.sync()
            checkpoint.save(
                depth=depth,
                explored=explored,
                levels=result.levels,
                seconds=time.monotonic() - started,
                fps=visited.fps,
                parent=parent,
                layer=current.path,
                complete=not frontier,
            )
    current.close()
    result.explored = explored
    result.distinct = visited.count
    result.depth = depth
    result.seconds = time.monotonic() - started
    result.complete = bad is None and not frontier
    result.rss = rss_bytes()
    if bad is not None:
        result.violation = bad
        path: list[Any] = []
        k = bad_index
        while k >= 0:
            path.append(visited.fps[k] if fingerprints else states[k])
            k = parent[k]
        result.trace = concrete_trace(
            cfg, path[::-1], (lambda s: fingerprint(canon(s))) if fingerprints else canon
        )
    if keep_graph:
        result.graph = Graph(
            states=states,
            edges=edges,
            actions=sorted(action_ids, key=action_ids.__getitem__),
            parent=parent,
        )
    return result


def _here(current: Layer) -> Iterator[_Expanded]:
    """The layer's states, one at a time, to expand in the checker's own process.

    A generator function, not a generator expression: mypyc (the spec's build) evaluates
    a generator expression eagerly, into a list, so the whole layer (read back from its
    file, with fingerprints) sat in memory at once: about 3.3 KB a state on a-crash.
    """
    for pos, st in enumerate(current):
        yield pos, st, [], [], []


# A verdict not computed yet (a worker's verdicts are None or an invariant's name).
UNCHECKED = ""

# A successor new to the checker's visited set when it was generated: its key there
# (the state, or its fingerprint), its canonical state (None when a worker sends it
# with fingerprints: only the layer file reads it) and, with fingerprints, its
# marshal bytes.
Fresh = tuple["State | int", "State | None", "bytes | None"]

# A layer's state as the BFS merges it: its position in the layer, the state itself if
# the checker is to expand it (None: a worker did), and when a worker did, the action
# names, successors (an index if known before the layer) and their verdicts.
_Expanded = tuple[int, "State | None", list[str], list["int | Fresh"], list["str | None"]]

# One chunk of a layer, expanded by a worker: per frontier state its number of
# successors; per successor (in next_states order) the index of a state known
# before the layer (0 for any, with fingerprints), or -1 - k for the chunk's k-th
# state new to the layer; those states (plain tuples: cheaper to pickle), their
# fingerprints (with fingerprints) and first violated invariants; the action
# names when the graph is kept.
Chunk = tuple[
    list[int],
    list[int],
    list["tuple[object, ...] | bytes"],
    list[int],
    list["str | None"],
    list[str],
]

# What forked workers read: set before the pool forks, inherited copy-on-write.
_LAYER: tuple[Config, Callable[[State], State], list[Invariant], Visited, list[State], bool]


def _expand(
    cfg: Config,
    *,
    canon: Callable[[State], State],
    invariants: list[Invariant],
    visited: Visited,
    current: Layer,
    workers: int,
    keep_graph: bool,
) -> Generator[_Expanded, None, None]:
    """Expand a BFS layer in ``workers`` forked processes, yielding in frontier order.

    Each worker takes chunks of the frontier and does what costs: the
    successors, their canonical forms (and fingerprints), the look-up among
    the states known before the layer (its forked copy of the visited set) and
    the invariants of the others. The checker merges the chunks in frontier
    order, numbering new states as a sequential run would: the same states,
    depths, counts and traces. Only states new to the layer travel back
    (pickled). A layer on disk is read and expanded a batch at a time.
    """
    global _LAYER  # noqa: PLW0603 - how a forked worker sees the layer
    states = iter(current)
    for offset in range(0, len(current), LAYER_BATCH):
        batch = list(itertools.islice(states, LAYER_BATCH))
        _LAYER = (cfg, canon, invariants, visited, batch, keep_graph)
        batches = _expand_batch(workers, batch, visited)
        try:
            for pos, names, succ, verdicts in batches:
                yield offset + pos, None, names if keep_graph else [""] * len(succ), succ, verdicts
        finally:
            batches.close()  # its pool: see _bfs's close of the layer
    _LAYER = (cfg, canon, invariants, visited, [], keep_graph)


# States of a layer expanded by one pool of forked workers: bounds the memory a layer
# on disk takes while it is expanded.
LAYER_BATCH = 25_000


def _expand_batch(
    workers: int, batch: list[State], visited: Visited
) -> Generator[tuple[int, list[str], list[int | Fresh], list[str | None]], None, None]:
    # Chunks of the batch, not of the layer: a chunk as big as the batch keeps a worker idle.
    size = max(500, len(batch) // (workers * 16))
    chunks = [range(k, min(k + size, len(batch))) for k in range(0, len(batch), size)]
    fps = visited.fingerprints
    pool = multiprocessing.get_context("fork").Pool(workers)
    results = pool.imap(_expand_chunk, chunks)
    try:
        yield from _merge(chunks, results, fps)
    finally:
        # Never Pool.terminate() (what ``with`` does) while workers may still be sending
        # results: its result thread stops reading, a worker blocked on a full pipe keeps
        # the queue's lock, and terminate() waits for it forever (seen on a loaded
        # machine, when a violation ended the layer early). Let them finish, then close.
        pool.close()
        pool.join()


def _merge(
    chunks: list[range], results: Iterator[Chunk], fps: bool
) -> Iterator[tuple[int, list[str], list[int | Fresh], list[str | None]]]:
    """The workers' answers per state of the batch, as the serial expansion gives them."""
    new = tuple.__new__
    for chunk, (counts, codes, fresh, keys, verdicts, names) in zip(chunks, results, strict=True):
        pos = 0
        for i, n in zip(chunk, counts, strict=True):
            succ: list[int | Fresh] = []
            checked: list[str | None] = []
            for code in codes[pos : pos + n]:
                if code >= 0:
                    succ.append(code)
                    checked.append(None)
                else:
                    # With fingerprints a new state stays marshalled for the layer file.
                    f = fresh[-1 - code]
                    if fps:
                        succ.append((keys[-1 - code], None, cast(bytes, f)))
                    else:
                        st = new(State, f)
                        succ.append((st, st, None))
                    checked.append(verdicts[-1 - code])
            yield i, names[pos : pos + n], succ, checked
            pos += n


def _expand_chunk(chunk: range) -> Chunk:
    cfg, canon, invariants, visited, current, keep_graph = _LAYER
    counts: list[int] = []
    codes: list[int] = []
    fresh: list[tuple[object, ...] | bytes] = []
    keys: list[int] = []
    verdicts: list[str | None] = []
    names: list[str] = []
    seen: dict[State | int, int] = {}  # new to the layer: code (one per state and chunk)
    for pos in chunk:
        steps = next_states(cfg, current[pos])
        counts.append(len(steps))
        for label, t in steps:
            c = canon(t)
            key, blob = visited.encode(c)
            code = visited.known(key)
            if code is None:
                code = seen.get(key)
                if code is None:
                    code = seen[key] = -1 - len(fresh)
                    if blob is not None:
                        fresh.append(blob)  # sent as is, and written as is
                        keys.append(cast(int, key))
                    else:
                        fresh.append(tuple(c))
                    verdicts.append(first_violation(cfg, c, invariants))
            codes.append(code)
            if keep_graph:
                names.append(label[0])
    return counts, codes, fresh, keys, verdicts, names


def concrete_trace(
    cfg: Config, path: list[State] | list[int], key: Callable[[State], object]
) -> list[TraceStep]:
    """Replay a path from the real initial state, with action labels: ``path`` holds the
    key of each state (its canonical form, or its fingerprint) and ``key`` computes it."""
    cur = initial_state(cfg)
    trace = [TraceStep("Init", cur)]
    for target in path[1:]:
        for label, t in next_states(cfg, cur):
            if key(t) == target:
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
    # Distinct states the walks saw, counted as the BFS counts them (up to symmetry), by
    # 64-bit fingerprint, as TLC's simulation mode does: how much of the space they covered.
    distinct: int = 0


def walk(cfg: Config, steps: int, seed: int, max_depth: int = 10_000) -> WalkResult:
    """Random walks from the initial state, ``steps`` actions in all, one seed.

    Each walk follows uniformly chosen enabled actions until none is enabled
    (or ``max_depth``), then a new walk starts. Reproduce a run with the same
    seed. A violation's trace is the walk's prefix, not a shortest one. The
    states seen are counted by the fingerprint of their canonical form
    (``WalkResult.distinct``): at most the BFS's distinct count, for which
    :func:`bkref.spec.visited.collision_probability` gives the chance of a
    fingerprint shared by two of them.
    """
    rng = random.Random(seed)
    invariants = active_invariants(cfg)
    out = WalkResult(config=cfg, seed=seed)
    seen: set[int] = set()
    started = time.monotonic()
    while out.steps < steps and out.violation is None:
        out.walks += 1
        cur = initial_state(cfg)
        seen.add(fingerprint(canonical(cur)))
        trace = [TraceStep("Init", cur)]
        for _ in range(max_depth):
            succ = list(next_states(cfg, cur))
            if not succ or out.steps >= steps:
                break
            label, cur = rng.choice(succ)
            out.steps += 1
            seen.add(fingerprint(canonical(cur)))
            trace.append(TraceStep(format_label(label), cur))
            bad = first_violation(cfg, cur, invariants)
            if bad is not None:
                out.violation = bad
                out.trace = trace
                break
        out.max_depth = max(out.max_depth, len(trace) - 1)
    out.seconds = time.monotonic() - started
    out.distinct = len(seen)
    return out


def print_progress_header(cfg: Config, stream: TextIO = sys.stderr) -> None:
    print(f"checking config {cfg.name}: {cfg.bounds()}; spec {running()}", file=stream, flush=True)
