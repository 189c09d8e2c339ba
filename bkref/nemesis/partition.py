"""Network partitions as grudges, in Jepsen's shapes: pure functions, no I/O.

A grudge maps each node to the set of nodes whose packets it drops. Jepsen's
partitioners are the model: isolate one node, split into halves, a ring of
overlapping majorities, and a bridge (two halves that both still see one node).
The cluster backends apply a grudge (iptables inside network namespaces on the
netns backend, inside containers on Docker); these functions only decide it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence

Grudge = dict[str, frozenset[str]]


def complete_grudge(components: Iterable[Iterable[str]]) -> Grudge:
    """Every node drops packets from every node outside its own component."""
    comps = [frozenset(c) for c in components]
    nodes = frozenset().union(*comps) if comps else frozenset()
    if sum(len(c) for c in comps) != len(nodes):
        raise ValueError(f"components overlap: {[sorted(c) for c in comps]}")
    return {n: nodes - c for c in comps for n in c}


def isolate(nodes: Sequence[str], node: str) -> Grudge:
    """Cut ``node`` off from all others, both ways."""
    if node not in nodes:
        raise ValueError(f"{node!r} is not one of the nodes {list(nodes)}")
    return complete_grudge([[node], [n for n in nodes if n != node]])


def halves(nodes: Sequence[str], rng: random.Random) -> Grudge:
    """A random split into two halves (the smaller one has floor(n/2) nodes)."""
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    k = len(shuffled) // 2
    return complete_grudge([shuffled[:k], shuffled[k:]])


def majorities_ring(nodes: Sequence[str], rng: random.Random) -> Grudge:
    """Each node sees a majority (itself and its nearest ring neighbours), no two the same.

    Nodes are placed on a shuffled ring and each keeps links to the nodes
    within distance r on either side, for the smallest r that makes 2r + 1 a
    majority. With 5 nodes every node sees 3, and no majority is shared by
    all: the shape that confuses leader elections. Distance is symmetric, so
    the grudge is too.
    """
    ring = list(nodes)
    rng.shuffle(ring)
    n = len(ring)
    r = -(-(n // 2) // 2)  # ceil(floor(n/2) / 2): then 2r + 1 > n/2
    grudge: Grudge = {}
    for i, node in enumerate(ring):
        dropped = {ring[j] for j in range(n) if min((i - j) % n, (j - i) % n) > r}
        grudge[node] = frozenset(dropped)
    return grudge


def bridge(nodes: Sequence[str], rng: random.Random) -> Grudge:
    """Two halves that cannot see each other, and one bridge node that sees both."""
    if len(nodes) < 3:
        raise ValueError("a bridge needs at least 3 nodes")
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    bridge_node, rest = shuffled[0], shuffled[1:]
    k = len(rest) // 2
    left, right = frozenset(rest[:k]), frozenset(rest[k:])
    grudge: Grudge = {bridge_node: frozenset()}
    grudge.update(dict.fromkeys(left, right))
    grudge.update(dict.fromkeys(right, left))
    return grudge


def symmetric(grudge: Mapping[str, frozenset[str]]) -> Grudge:
    """Make a grudge two-way: if a drops b, b drops a."""
    out = {n: set(g) for n, g in grudge.items()}
    for n, g in grudge.items():
        for m in g:
            out.setdefault(m, set()).add(n)
    return {n: frozenset(g) for n, g in out.items()}


def reachable(grudge: Mapping[str, frozenset[str]], a: str, b: str) -> bool:
    """True if packets flow both ways between ``a`` and ``b`` under ``grudge``."""
    return b not in grudge.get(a, frozenset()) and a not in grudge.get(b, frozenset())
