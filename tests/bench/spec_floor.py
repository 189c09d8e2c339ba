"""The floor under the model checker's rate: the BFS's own bookkeeping on a config's real
transitions, with no protocol logic at all.

    python -m tests.bench.spec_floor CONFIG MAX_STATES    (0: no cap; prints one JSON line)

The checker spends each transition on the protocol (guards, the action, the reductions,
the canonical renaming, invariants) and on bookkeeping no explicit-state BFS escapes:
building the successor and looking it up in the visited set. This measures the second
part alone, so that a target rate can be set against it. It runs a BFS like the checker's
(untimed: the spec as ``BKREF_SPEC`` chooses), and for each expanded state replays, timed,
only the bookkeeping of its canonical successors, in the checker's order:

- ``tuple``: today's representation. The successor is rebuilt from its parent as the
  cheapest ``_replace`` would (a copy of the parent's fields with the changed ones set,
  changed meaning not the same object), then inserted into a visited dict. The nested
  fields the action changed come ready-made: building those is protocol work.
- ``bytes``: the state packed into bytes (its marshal encoding), the cheapest encoding
  Python hashes once and compares with ``memcmp``. The successor is rebuilt from its
  parent's bytes by splicing the part that differs, then inserted into a visited dict.

CPU is the thread's own time (``time.thread_time``) around each batch of replays, so
the BFS that feeds them is not counted.
"""

from __future__ import annotations

import json
import marshal
import sys
import time
from collections.abc import Callable
from typing import Any

from bkref.spec.build import running
from bkref.spec.configs import CONFIGS
from bkref.spec.protocol import State, initial_state, next_states
from bkref.spec.symmetry import canonical

# Expanded states whose successors are replayed together: bounds the memory held between
# the untimed BFS and the timed replay, and the clock is read twice per batch only.
BATCH = 2_000

Change = tuple[tuple[int, object], ...]
Splice = tuple[int, bytes, int]


def _packed(s: State) -> bytes:
    """A state's bytes, as the checker's fingerprints marshal it (``bkref.spec.visited``)."""
    return marshal.dumps(tuple(s), 2)


def _changes(parent: State, child: State) -> Change:
    """The fields of ``child`` that are not its parent's very objects."""
    return tuple((i, v) for i, (p, v) in enumerate(zip(parent, child, strict=True)) if p is not v)


def _splice(parent: bytes, child: bytes) -> Splice:
    """``child`` as ``parent[:head] + middle + parent[tail:]``."""
    n = min(len(parent), len(child))
    head = _longest(lambda k: parent[:k] == child[:k], n)
    tail = _longest(lambda k: parent[len(parent) - k :] == child[len(child) - k :], n - head)
    middle, end = child[head : len(child) - tail], len(parent) - tail
    if parent[:head] + middle + parent[end:] != child:
        raise AssertionError(f"the splice ({head}, {len(middle)} bytes, {end}) is not the child")
    return head, middle, end


def _longest(same: Callable[[int], bool], n: int) -> int:
    """The largest ``k <= n`` with ``same(k)``, for a ``same`` true up to some k (bisection:
    each probe one slice comparison in C, not a Python loop over ~900 bytes)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if same(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _replay_tuples(batch: list[tuple[State, list[Change]]], seen: dict[State, int]) -> None:
    new = tuple.__new__
    for parent, changes in batch:
        for change in changes:
            values: list[object] = list(parent)
            for i, v in change:
                values[i] = v
            seen.setdefault(new(State, values), len(seen))


def _replay_bytes(batch: list[tuple[bytes, list[Splice]]], seen: dict[bytes, int]) -> None:
    for parent, splices in batch:
        for head, middle, tail in splices:
            seen.setdefault(parent[:head] + middle + parent[tail:], len(seen))


def measure(config: str, max_states: int | None) -> dict[str, Any]:
    """The BFS of ``config`` (up to ``max_states`` distinct states) and both floors' CPU s."""
    cfg = CONFIGS[config]
    init = canonical(initial_state(cfg))
    visited: dict[State, int] = {init: 0}
    floors: dict[str, float] = {"tuple": 0.0, "bytes": 0.0}
    seen_t: dict[State, int] = {init: 0}
    seen_b: dict[bytes, int] = {_packed(init): 0}
    layer, explored, full = [init], 0, False
    while layer and not full:
        following: list[State] = []
        for start in range(0, len(layer), BATCH):
            tuples: list[tuple[State, list[Change]]] = []
            packed: list[tuple[bytes, list[Splice]]] = []
            for s in layer[start : start + BATCH]:
                succ = [canonical(t) for _label, t in next_states(cfg, s)]
                blob = _packed(s)
                tuples.append((s, [_changes(s, t) for t in succ]))
                packed.append((blob, [_splice(blob, _packed(t)) for t in succ]))
                explored += len(succ)
                for t in succ:
                    n = len(visited)
                    if visited.setdefault(t, n) == n:
                        following.append(t)
                full = max_states is not None and len(visited) >= max_states
                if full:
                    break
            began = time.thread_time()
            _replay_tuples(tuples, seen_t)
            floors["tuple"] += time.thread_time() - began
            began = time.thread_time()
            _replay_bytes(packed, seen_b)
            floors["bytes"] += time.thread_time() - began
            if max_states is not None and len(visited) >= max_states:
                break
        layer = following
    if not len(seen_t) == len(seen_b) == len(visited):
        raise AssertionError(f"the replays saw {len(seen_t)}, {len(seen_b)}, not {len(visited)}")
    return {"distinct": len(visited), "explored": explored, "floors": floors, "spec": running()}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in CONFIGS or not argv[1].isdigit():
        print("usage: python -m tests.bench.spec_floor CONFIG MAX_STATES (0: all)", file=sys.stderr)
        return 2
    print(json.dumps(measure(argv[0], int(argv[1]) or None)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
