"""Liveness under weak fairness on small configs, and its failure without fairness."""

from __future__ import annotations

from dataclasses import replace

from bkref.spec.configs import CONFIGS
from bkref.spec.liveness import check_liveness, strongly_connected_components


def test_tarjan_finds_components_in_reverse_topological_order() -> None:
    graph = {0: [1], 1: [2], 2: [0, 3], 3: [4], 4: [3], 5: []}
    comps = strongly_connected_components(6, lambda v: graph[v])
    assert sorted(map(sorted, comps)) == [[0, 1, 2], [3, 4], [5]]
    order = [min(c) for c in comps]
    assert order.index(3) < order.index(0)  # {3,4} is reached from {0,1,2}: it comes first


def test_tarjan_is_iterative_on_a_long_chain() -> None:
    n = 50_000  # far beyond Python's recursion limit
    comps = strongly_connected_components(n, lambda v: [v + 1] if v + 1 < n else [])
    assert len(comps) == n


def test_the_ledger_is_eventually_closed_under_weak_fairness() -> None:
    r = check_liveness(CONFIGS["a-short"], "ledger-closed")
    assert r.holds, r.reason
    assert "writer_closes_ledger" in r.fair_actions


def test_without_fairness_the_ledger_may_stay_open_forever() -> None:
    r = check_liveness(CONFIGS["a-short"], "ledger-closed", fair=False)
    assert not r.holds
    assert r.prefix[0].action == "Init"


def test_under_replication_is_eventually_repaired_under_weak_fairness() -> None:
    r = check_liveness(CONFIGS["live-c"], "repaired")
    assert r.holds, r.reason


def test_without_fairness_repair_may_never_happen() -> None:
    r = check_liveness(CONFIGS["live-c"], "repaired", fair=False)
    assert not r.holds


def test_the_periodic_check_repairs_a_replica_lost_without_a_bookie_loss() -> None:
    r = check_liveness(CONFIGS["live-check"], "fully-replicated")
    assert r.holds, r.reason
    assert "auditor_checks_ledger_replicas" in r.fair_actions


def test_without_the_periodic_check_a_missing_replica_stays_missing() -> None:
    cfg = replace(CONFIGS["live-check"], periodic_check=False)
    r = check_liveness(cfg, "fully-replicated")
    assert not r.holds
    # The writer closed with its third add undelivered: a bookie of the ensemble misses e0.
    assert r.prefix[-1].action == "writer_closes_ledger"
