"""Partition shapes (grudges) in Jepsen's vocabulary."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkref.nemesis.partition import (
    bridge,
    complete_grudge,
    halves,
    isolate,
    majorities_ring,
    reachable,
    symmetric,
)

NODES = ["n1", "n2", "n3", "n4", "n5"]


def _sees(grudge: dict[str, frozenset[str]], node: str, nodes: list[str]) -> set[str]:
    return {m for m in nodes if m == node or reachable(grudge, node, m)}


def test_isolate_cuts_one_node_both_ways() -> None:
    g = isolate(NODES, "n3")
    assert g["n3"] == frozenset(NODES) - {"n3"}
    assert all(not reachable(g, "n3", m) for m in NODES if m != "n3")
    assert reachable(g, "n1", "n5")
    with pytest.raises(ValueError, match="not one of the nodes"):
        isolate(NODES, "n9")


@given(st.integers(2, 9), st.integers(0, 2**32))
def test_halves_split_into_two_disconnected_components(n: int, seed: int) -> None:
    nodes = [f"n{i}" for i in range(n)]
    g = halves(nodes, random.Random(seed))
    components = {frozenset(_sees(g, m, nodes)) for m in nodes}
    assert len(components) == 2
    assert sorted(len(c) for c in components) == [n // 2, n - n // 2]


@given(st.integers(4, 9), st.integers(0, 2**32))
def test_majorities_ring_gives_every_node_a_distinct_majority(n: int, seed: int) -> None:
    nodes = [f"n{i}" for i in range(n)]
    g = majorities_ring(nodes, random.Random(seed))
    assert g == symmetric(g)
    views = [frozenset(_sees(g, m, nodes)) for m in nodes]
    assert all(len(v) > n / 2 for v in views)
    assert len(set(views)) == n  # no two nodes share their majority
    assert frozenset.intersection(*views) != frozenset(nodes)  # it is a partition at all


@given(st.integers(3, 9), st.integers(0, 2**32))
def test_bridge_node_sees_both_halves_that_do_not_see_each_other(n: int, seed: int) -> None:
    nodes = [f"n{i}" for i in range(n)]
    g = bridge(nodes, random.Random(seed))
    [b] = [m for m in nodes if _sees(g, m, nodes) == set(nodes)]
    others = [m for m in nodes if m != b]
    assert any(not reachable(g, x, y) for x in others for y in others)


def test_complete_grudge_rejects_overlapping_components() -> None:
    with pytest.raises(ValueError, match="overlap"):
        complete_grudge([["a", "b"], ["b", "c"]])
