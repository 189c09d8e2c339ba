"""The model checker's breadth-first search on Spark, for configs one machine cannot hold.

    bkref spec check --config NAME --spark [--master URL] [--partitions N]

The same search as ``bkref.spec.checker.check`` with fingerprints, level by level
(level-synchronous BFS, as distributed model checkers such as PTLC and DiVinE do):

1. **Expand.** Each executor takes its share of the level's new states (marshal bytes),
   computes their successors with ``next_states``, takes each to its canonical form
   under bookie renaming and fingerprints it. Duplicates within a task are merged
   before the shuffle.
2. **Shuffle by fingerprint.** Successors go to the partition ``fingerprint % P``. The
   visited set is partitioned the same way: partition ``i`` of it is one sorted int64
   array, the fingerprints of every state seen so far that hash to ``i``. Spark zips
   the two partition by partition (no shuffle of the visited set), and each task
   keeps the successors its array does not hold: the next level. The task also checks
   the invariants on those new states, so no state travels back to the driver.
3. **Parent records.** Each level keeps ``(fingerprint, parent fingerprint)`` per new
   state (16 bytes a state, in the executors' storage). On a violation the driver
   walks them back from the violating state, level by level, reading one partition
   per level, and replays the path from the initial state
   (``bkref.spec.checker.concrete_trace``): the trace is a shortest one.

What is the same as the local checker: the distinct states, the depth, completeness,
and on a violation its depth (the trace's length) with an invariant violated at its
last state. Where several states at that depth violate, the local checker reports
the first in its own order and this search the one whose invariant comes first in
``bkref.spec.invariants.INVARIANTS``, then the smallest fingerprint; both are shortest.
``explored`` counts every successor as the local checker does, but a search that
stops at a violation stops at the end of the level here, mid-level there.

Fingerprints are 64-bit BLAKE2b of the marshal bytes, not the local checker's
``hash()``: Python randomises ``hash`` per process, and executors are many processes.
Two states sharing a fingerprint would be taken for one (the result's
``collision_probability``, as for ``--fingerprints``). Liveness needs the state graph
in one place: it stays local (``bkref.spec.liveness``). ``max_states`` is checked
after each level, so a search stops at the end of the level that reaches it.

Memory per state, in the executors: 8 bytes in the visited set and 16 in the parent
records; with the last two levels' states and visited arrays, about 40 bytes a state at
the peak (BENCHMARKS.md, 'Model checking on Spark'). The driver holds only per-level
counts.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import marshal
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from bkref.spec.checker import (
    Result,
    active_invariants,
    concrete_trace,
    first_violation,
    rss_bytes,
)
from bkref.spec.config import Config
from bkref.spec.invariants import INVARIANTS
from bkref.spec.protocol import State, initial_state, next_states
from bkref.spec.symmetry import canonical

if TYPE_CHECKING:
    import numpy as np
    from pyspark import RDD, Accumulator, SparkContext

log = logging.getLogger(__name__)

# A successor before the shuffle: fingerprint -> (marshal bytes, parent fingerprint,
# how many times the task generated it).
Candidate = tuple[int, tuple[bytes, int, int]]
# A state new to its level: (fingerprint, marshal bytes, parent fingerprint).
New = tuple[int, bytes, int]
# A new state that violates an invariant: (the invariant's index in INVARIANTS, the
# state's fingerprint, the invariant's name); the least of a level is the one reported.
Violation = tuple[int, int, str]
# What a merge task returns for its partition: the updated visited array, the new
# states, the successors it received (explored), and its violations.
Merged = tuple["np.ndarray[Any, Any]", list[New], int, list[Violation]]


def stable_fingerprint(blob: bytes) -> int:
    """A state's 64-bit fingerprint, the same in every process (signed, for int64)."""
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little", signed=True)


def encode(s: State) -> bytes:
    return marshal.dumps(tuple(s), 2)


def decode(blob: bytes) -> State:
    return tuple.__new__(State, marshal.loads(blob))  # noqa: S302 - the search's own bytes


def _identity(s: State) -> State:
    return s


def _canon(symmetry: bool) -> Callable[[State], State]:
    return canonical if symmetry else _identity


# What executors receive of a config: its fields. A Config compiled by mypyc (the spec's
# build, bkref.spec.build) has no __dict__ for pickle to restore, so it is rebuilt.
Fields = dict[str, Any]


def config_fields(cfg: Config) -> Fields:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(Config) if f.init}


def _config(fields: Fields) -> Config:
    return Config(**fields)


def _expand(
    fields: Fields, symmetry: bool, states: Iterable[tuple[int, bytes]]
) -> Iterator[Candidate]:
    """Successors of a task's states, merged by fingerprint within the task."""
    cfg = _config(fields)
    canon = _canon(symmetry)
    out: dict[int, tuple[bytes, int, int]] = {}
    for parent, blob in states:
        for _label, t in next_states(cfg, decode(blob)):
            b = encode(canon(t))
            f = stable_fingerprint(b)
            seen = out.get(f)
            if seen is None:
                out[f] = (b, parent, 1)
            else:
                out[f] = (b, min(seen[1], parent), seen[2] + 1)
    yield from out.items()


def _merge(fields: Fields, pair: tuple[Any, list[Candidate]]) -> Merged:
    """One partition: its visited array and the successors that hash to it."""
    import numpy as np

    cfg = _config(fields)
    visited, received = pair
    best: dict[int, tuple[bytes, int]] = {}
    explored = 0
    for f, (b, parent, n) in received:
        explored += n
        seen = best.get(f)
        if seen is None or parent < seen[1]:
            best[f] = (b, parent)
    fps = np.fromiter(best, dtype=np.int64, count=len(best))
    fps.sort()
    if len(visited):
        at = np.searchsorted(visited, fps)
        known = (at < len(visited)) & (visited[np.minimum(at, len(visited) - 1)] == fps)
        fresh = fps[~known]
    else:
        fresh = fps
    invariants = active_invariants(cfg)
    order = {inv.__name__: k for k, inv in enumerate(INVARIANTS)}
    new: list[New] = []
    bad: list[Violation] = []
    for f in fresh.tolist():
        b, parent = best[f]
        new.append((f, b, parent))
        name = first_violation(cfg, decode(b), invariants)
        if name is not None:
            bad.append((order[name], f, name))
    return np.union1d(visited, fresh), new, explored, bad


def _merge_counted(
    fields: Fields, pair: tuple[Any, list[Candidate]], runs: Accumulator[int]
) -> Merged:
    runs.add(1)  # a level merges each partition once (the debug log says so)
    return _merge(fields, pair)


def _partition(f: int) -> int:
    return f  # partitionBy takes it modulo the partition count


def check_on_spark(
    cfg: Config,
    *,
    master: str | None = None,
    partitions: int | None = None,
    symmetry: bool = True,
    max_states: int | None = None,
    progress: TextIO | None = None,
    sc: SparkContext | None = None,
) -> Result:
    """Breadth-first check of every invariant on Spark; the fields of the local
    checker's ``Result`` (with fingerprints). ``sc``: a running context; else the
    process's active session (an error if ``master`` names another), else a session on
    ``master`` (default local[*]) started and stopped here."""
    own = None
    if sc is None:
        from pyspark.sql import SparkSession

        from bkref.spark_checks.session import session

        active = SparkSession.getActiveSession()
        if active is not None and master not in (None, active.sparkContext.master):
            # getOrCreate would hand back the active one, and the search would stop it.
            raise ValueError(
                f"a Spark session on {active.sparkContext.master} is active in this process: "
                f"pass sc= or master={active.sparkContext.master!r}, or stop it for {master}"
            )
        if active is not None:
            sc = active.sparkContext
        else:
            own = session(master, app=f"bkref spec check {cfg.name}")
            sc = own.sparkContext
    try:
        parts = partitions or 2 * sc.defaultParallelism
        return _search(
            cfg, sc, parts=parts, symmetry=symmetry, max_states=max_states, progress=progress
        )
    finally:
        if own is not None:
            own.stop()


def _search(
    cfg: Config,
    sc: SparkContext,
    *,
    parts: int,
    symmetry: bool,
    max_states: int | None,
    progress: TextIO | None,
) -> Result:
    import numpy as np
    from pyspark import StorageLevel

    started = time.monotonic()
    canon = _canon(symmetry)
    result = Result(config=cfg, skipped=tuple(sorted(cfg.skip_invariants)), fingerprints=True)
    fields = config_fields(cfg)
    init = encode(canon(initial_state(cfg)))
    init_fp = stable_fingerprint(init)
    bad0 = first_violation(cfg, decode(init), active_invariants(cfg))
    levels: list[RDD[Parents]] = []  # per level >= 1, kept to rebuild a trace
    distinct, explored, depth = 1, 0, 0
    result.levels.append(1)
    violation: Violation | None = None if bad0 is None else (0, init_fp, bad0)
    home = init_fp % parts
    visited: RDD[Any] = sc.parallelize(range(parts), parts).map(
        lambda i: np.array([init_fp] if i == home else [], dtype=np.int64)
    )
    frontier: RDD[tuple[int, bytes]] = sc.parallelize([(init_fp, init)], 1)
    previous: RDD[Merged] | None = None
    merges = sc.accumulator(0)
    width = 1
    while width and violation is None and (max_states is None or distinct < max_states):
        succ = frontier.mapPartitions(lambda it: _expand(fields, symmetry, it))
        shuffled = succ.partitionBy(parts, _partition).glom()
        merged = visited.zip(shuffled).map(lambda pair: _merge_counted(fields, pair, merges))
        # Kept, and its lineage back through every earlier level cut: the next level's
        # visited set and frontier read it. Persisted before ``parents`` is derived from
        # it: PySpark fuses a map into an uncached parent's, and ``parents`` built first
        # ran the merge itself, leaving ``merged`` to be computed (with every earlier
        # level's merge, whose cache was gone) by the next level's job: quadratic in the
        # depth (a-reply, 20 levels: 355 s on Spark, 66 s once fixed, 7 s locally).
        merged.persist(StorageLevel.MEMORY_AND_DISK)
        merged.localCheckpoint()
        # Only ``merged`` is marked: Spark checkpoints the last marked RDD of a job's
        # lineage, not its ancestors. The parent records stay cached after ``merged``
        # goes (its own cached blocks, not its lineage, are what a trace reads).
        parents = merged.map(_parents)
        parents.persist(StorageLevel.MEMORY_AND_DISK)
        stats = parents.map(lambda r: r[2:]).collect()
        log.debug("level %d: %d merge tasks for %d partitions", depth + 1, merges.value, parts)
        merges.value = 0
        if previous is not None:
            previous.unpersist()  # read by this level only; its parent records stay
        previous = merged
        width = sum(n for n, _, _ in stats)
        explored += sum(e for _, e, _ in stats)
        bad = [v for _, _, vs in stats for v in vs]
        if width:
            depth += 1
            distinct += width
            levels.append(parents)
            result.levels.append(width)
        if bad:
            violation = min(bad)
        visited = merged.map(lambda m: m[0])
        frontier = merged.flatMap(lambda m: [(f, b) for f, b, _ in m[1]])
        if progress is not None:
            secs = time.monotonic() - started
            print(
                f"  depth {depth}: {distinct:,} distinct, {explored:,} explored, "
                f"level {width:,}, {distinct / max(secs, 1e-9):,.0f} states/s",
                file=progress,
                flush=True,
            )
    result.explored, result.distinct, result.depth = explored, distinct, depth
    result.complete = violation is None and width == 0
    if violation is not None:
        result.violation = violation[2]
        path = _path_back(sc, levels, parts, violation[1])
        result.trace = concrete_trace(cfg, path, lambda s: stable_fingerprint(encode(canon(s))))
    if previous is not None:
        previous.unpersist()
    for level in levels:
        level.unpersist()
    result.seconds = time.monotonic() - started
    result.rss = rss_bytes()
    return result


# A level's parent records in one partition: its new states' fingerprints (sorted), each
# one's parent fingerprint, then the partition's (new states, explored, violations).
Parents = tuple["np.ndarray[Any, Any]", "np.ndarray[Any, Any]", int, int, list[Violation]]


def _parents(m: Merged) -> Parents:
    import numpy as np

    _, new, explored, bad = m
    fps = np.fromiter((f for f, _, _ in new), dtype=np.int64, count=len(new))
    up = np.fromiter((p for _, _, p in new), dtype=np.int64, count=len(new))
    return fps, up, len(new), explored, bad


def _parent_of(f: int, it: Iterable[Parents]) -> list[int]:
    out: list[int] = []
    for fps, up, *_ in it:
        k = int(fps.searchsorted(f))
        if k < len(fps) and fps[k] == f:
            out.append(int(up[k]))
    return out


def _path_back(sc: SparkContext, levels: list[RDD[Parents]], parts: int, last: int) -> list[int]:
    """Fingerprints from the initial state to ``last``, a state of the last level, read
    back from the parent records: one partition per level, the one its fingerprint
    hashes to."""
    path = [last]
    for level in reversed(levels):
        f = path[-1]
        [parent] = sc.runJob(level, functools.partial(_parent_of, f), [f % parts])
        path.append(parent)
    return path[::-1]
