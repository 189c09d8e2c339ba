"""Liveness on the explored state graph: fair cycles that avoid the goal.

A liveness property ``<>Goal`` (every behaviour eventually reaches a goal
state) fails exactly when some behaviour stays among non-goal states
forever while respecting fairness. On a finite graph such a behaviour ends
in a strongly connected component (SCC) of non-goal states, or stutters in
one state. Under weak fairness of a set of actions (an action enabled
forever must eventually be taken):

- a state may stutter forever only if no fair action is enabled in it;
- a non-trivial SCC of non-goal states holds a fair cycle iff every fair
  action is taken on some edge inside it or is disabled in one of its
  states (the cycle through all its states and edges is then fair, and no
  sub-cycle is fairer, so the test is exact).

Fairness is per action name, as ``WF_vars(A)`` for ``A`` = the action with
its arguments existentially quantified. With no fair actions, every non-goal
state may stutter forever: liveness fails unless the initial state is a goal.
SCCs come from an iterative Tarjan (no recursion limit).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from bkref.spec.checker import Graph, TraceStep, check, concrete_trace
from bkref.spec.config import Config
from bkref.spec.invariants import GOALS
from bkref.spec.protocol import ENVIRONMENT_ACTIONS, State
from bkref.spec.symmetry import canonical


@dataclass
class LivenessResult:
    """Whether ``<>goal`` holds; if not, a lasso: a prefix and a cycle (or a stutter)."""

    goal: str
    holds: bool
    distinct: int
    fair_actions: tuple[str, ...]
    prefix: list[TraceStep] = field(default_factory=list)
    cycle: list[str] = field(default_factory=list)  # actions around the cycle ([] = stutter)
    reason: str = ""


def strongly_connected_components(n: int, succ: Callable[[int], list[int]]) -> list[list[int]]:
    """Tarjan's algorithm, iterative; components in reverse topological order."""
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    comps: list[list[int]] = []
    counter = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work: list[tuple[int, int]] = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, i = work[-1]
            nbrs = succ(v)
            if i < len(nbrs):
                work[-1] = (v, i + 1)
                w = nbrs[i]
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp.append(w)
                    if w == v:
                        break
                comps.append(comp)
    return comps


def check_liveness(cfg: Config, goal: str | None = None, *, fair: bool = True) -> LivenessResult:
    """Explore ``cfg`` fully and test ``<>goal`` under weak fairness (or none)."""
    goal = goal or cfg.liveness
    predicate = GOALS[goal]
    result = check(cfg, keep_graph=True)
    if result.violation is not None:
        raise ValueError(f"safety fails first ({result.violation}); check safety before liveness")
    graph = result.graph
    assert graph is not None
    fair_ids = {
        i for i, name in enumerate(graph.actions) if fair and name not in ENVIRONMENT_ACTIONS
    }
    fair_names = tuple(sorted(graph.actions[i] for i in fair_ids))
    n = len(graph.states)
    is_goal = [predicate(cfg, s) for s in graph.states]
    out = LivenessResult(goal=goal, holds=True, distinct=n, fair_actions=fair_names)

    def succ(v: int) -> list[int]:
        if is_goal[v]:
            return []
        return [w for w, _a in graph.edges[v] if not is_goal[w]]

    # Stuttering: a non-goal state with no fair action enabled.
    for v in range(n):
        if not is_goal[v] and not any(a in fair_ids for _w, a in graph.edges[v]):
            out.holds = False
            out.reason = "a non-goal state where no fair action is enabled stutters forever"
            out.prefix = _prefix(cfg, graph, v)
            return out
    for comp in strongly_connected_components(n, succ):
        members = set(comp)
        if is_goal[comp[0]]:
            continue
        if len(comp) == 1 and comp[0] not in succ(comp[0]):
            continue
        taken = {a for v in comp for w, a in graph.edges[v] if w in members}
        enabled_everywhere = set(fair_ids)
        for v in comp:
            enabled_everywhere &= {a for _w, a in graph.edges[v]}
        if all(a in taken or a not in enabled_everywhere for a in fair_ids):
            out.holds = False
            out.reason = f"a fair cycle through {len(comp)} non-goal states"
            out.prefix = _prefix(cfg, graph, comp[0])
            out.cycle = _cycle(graph, comp[0], members)
            return out
    return out


def _prefix(cfg: Config, graph: Graph, v: int) -> list[TraceStep]:
    path: list[State] = []
    k = v
    while k >= 0:
        path.append(graph.states[k])
        k = graph.parent[k]
    return concrete_trace(cfg, path[::-1], canonical)


def _cycle(graph: Graph, start: int, members: set[int]) -> list[str]:
    """Action names of a shortest cycle from ``start`` back to itself inside the SCC."""
    prev: dict[int, tuple[int, int]] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w, a in graph.edges[v]:
            if w not in members:
                continue
            if w == start:
                names = [graph.actions[a]]
                k = v
                while k != start:
                    p, pa = prev[k]
                    names.append(graph.actions[pa])
                    k = p
                return names[::-1]
            if w not in prev:
                prev[w] = (v, a)
                queue.append(w)
    return []
