"""Spec coverage: the branches found, the counts measured, and the unexplained ones named."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import pytest

from bkref.spec.checker import check
from bkref.spec.cli import main
from bkref.spec.configs import NAMED, mutant_config
from bkref.spec.coverage import (
    RACES,
    ConfigCoverage,
    Report,
    _reason,
    branches,
    effects,
    measure,
    races,
    report,
)
from bkref.spec.protocol import (
    ACTIONS,
    BUDGETS,
    initial_state,
    next_states,
    recovery_client_starts_recovery,
    writer_sends_add,
)


def test_every_action_has_branches_and_each_is_a_guard_or_a_path() -> None:
    found = branches()
    by_action = Counter(b.action for b in found)
    assert set(by_action) == {fn.__name__ for fn in ACTIONS}
    kinds = {(b.action, b.kind) for b in found}
    assert ("writer_sends_add", "guard") in kinds
    assert ("writer_sends_add", "path") in kinds
    assert all(b.text.startswith("return") for b in found)
    assert len({b.line for b in found}) == len(found)


def test_a_reason_is_read_on_the_line_or_in_the_comment_block_above() -> None:
    lines = [
        "    if x:",
        "        # unreachable: next_states emits it only when",
        "        # the writer is OPEN.",
        "        return None",
        "    return None  # unreachable: y is never 0",
        "    return s",
    ]
    assert _reason(lines, 4) == "next_states emits it only when the writer is OPEN."
    assert _reason(lines, 5) == "y is never 0"
    assert _reason(lines, 6) is None


def test_enabled_counts_are_the_distinct_states_each_action_leaves() -> None:
    # Counted independently from the checker's own graph of the same config.
    cfg = NAMED["c"]
    cov = measure(cfg)
    r = check(cfg, keep_graph=True)
    assert r.graph is not None
    assert cov.distinct == r.distinct
    enabled: Counter[str] = Counter()
    fired: Counter[str] = Counter()
    for edges in r.graph.edges:
        names = [r.graph.actions[aid] for _j, aid in edges]
        fired.update(names)
        enabled.update(set(names))
    assert cov.enabled == enabled
    assert cov.fired == fired


def test_reached_branches_are_those_the_configs_take() -> None:
    cov = measure(NAMED["c"])  # one entry already confirmed: the writer sends nothing
    lines = {b.line: b for b in branches()}
    reached = {(lines[k].action, lines[k].kind) for k in cov.reached}
    assert ("worker_fences_open_ledger", "path") in reached
    assert ("worker_copies_fragment", "path") in reached
    assert not any(action == "writer_sends_add" for action, _kind in reached)


def test_a_lost_add_reply_is_reached_by_config_a_reply() -> None:
    # Found by coverage: no config set reply_losses, so no check explored a lost reply.
    cov = measure(NAMED["a-reply"])
    lost_reply = next(
        b for b in branches() if b.action == "bookie_handles_add" and b.text == "return t"
    )
    assert lost_reply.line in cov.reached
    assert cov.fired["bookie_handles_add"] > cov.enabled["bookie_handles_add"]


def test_a_branch_no_config_reaches_without_a_reason_is_unexplained() -> None:
    r = report([NAMED["c"]])
    unexplained = r.unexplained()
    assert any(b.action == "writer_sends_add" and b.kind == "path" for b in unexplained)
    data = r.to_json()
    assert data["unexplained"] == len(unexplained)
    row = next(
        b
        for b in data["branches"]
        if b["action"] == "worker_fences_open_ledger" and b["kind"] == "path"
    )
    assert row["reached_by"] == ["c"]


def test_the_command_exits_1_and_names_the_unexplained_branches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["coverage", "--config", "c", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "UNREACHED, no reason recorded" in out
    assert "writer_sends_add" in out
    assert main(["coverage", "--config", "nonesuch"]) == 2


def test_a_write_over_a_held_read_is_a_race_and_over_a_stale_one_is_not() -> None:
    cfg = NAMED["m-581"]  # the writer's ledger already OPEN, a recovery client
    s = initial_state(cfg)
    t = recovery_client_starts_recovery(cfg, s, 0)
    assert t is not None
    assert list(races(cfg, s, "recovery_client_starts_recovery", t)) == [
        ("recovery_client", "writer")
    ]
    stale = s._replace(w_version=s.w_version - 1)  # the writer's next CAS fails anyway
    t = recovery_client_starts_recovery(cfg, stale, 0)
    assert t is not None
    assert list(races(cfg, stale, "recovery_client_starts_recovery", t)) == []
    # A step that writes neither metadata nor task races with no one.
    t = writer_sends_add(cfg, s)
    assert t is not None
    assert list(races(cfg, s, "writer_sends_add", t)) == []


def test_without_autorecovery_only_the_writer_and_the_recovery_client_race() -> None:
    r = report([NAMED["a-short"]])
    assert set(r.raced_by(("writer", "recovery_client"))) == {"a-short"}
    assert len(r.unraced()) == len(RACES) - 1
    data = r.to_json()
    assert data["unraced"] == len(RACES) - 1
    row = next(x for x in data["races"] if x["actors"] == ["writer", "recovery_client"])
    assert row["directions"]["recovery_client writes while writer holds"] == ["a-short"]


@functools.cache
def _measured(name: str) -> ConfigCoverage:
    return measure(NAMED[name])


def _report(*names: str) -> Report:
    """``report`` over named configs, each measured once in this module: c-race's
    exhaustive measurement is ~30 CPU s, and two tests read it."""
    return Report([_measured(n) for n in names], branches())


def test_config_c_race_has_every_pair_of_metadata_writers_racing() -> None:
    r = _report("c-race")
    assert r.unraced() == []
    periodic = [b for b in branches() if b.action == "auditor_runs_periodic_bookie_check"]
    assert any(r.reached_by(b) == ["c-race"] for b in periodic if b.kind == "path")


def test_a_merge_that_keeps_a_worker_swap_is_an_effect_and_one_over_a_fresh_view_is_not() -> None:
    # The mutant's counterexample ends with the writer's CAS over the worker's swap.
    r = check(mutant_config("ensemble-change-undoes-swap"))
    before = r.trace[-2].state
    cfg = NAMED["c-merge"]
    label = ("writer_completes_ensemble_change", ())
    (t,) = [t for (name, _a), t in next_states(cfg, before) if name == label[0]]
    assert list(effects(cfg, before, label, t)) == [("worker", "writer")]
    # The same CAS by a writer whose view already has the swap changes nothing it would not.
    wl = cfg.writer_ledger
    fresh = before._replace(w_segments=before.meta_segments[wl])
    (t,) = [t for (name, _a), t in next_states(cfg, fresh) if name == label[0]]
    assert list(effects(cfg, fresh, label, t)) == []


# About 70 CPU s of fixed work when c-race is not measured yet: beside two busy loops a
# verify run's took past the suite's 300 s (wall time).
@pytest.mark.timeout(900)
def test_configs_c_race_and_c_merge_give_every_race_an_effect() -> None:
    r = _report("c-race", "c-merge")
    assert r.without_effect() == []
    assert set(r.effect_by(("writer", "worker"))) == {"c-merge"}
    assert set(r.effect_by(("recovery_client", "worker"))) == {"c-merge"}
    data = r.to_json()
    assert data["without_effect"] == 0
    row = next(x for x in data["races"] if x["actors"] == ["writer", "worker"])
    assert row["effect_directions"]["writer keeps what worker wrote"] == ["c-merge"]


def test_without_autorecovery_no_race_but_the_recovery_s_has_an_effect() -> None:
    r = report([NAMED["a-short"]])
    assert len(r.without_effect()) == len(RACES) - 1
    assert set(r.effect_by(("writer", "recovery_client"))) == {"a-short"}


def test_the_coverage_page_lists_every_branch_and_race_of_the_spec_as_it_is() -> None:
    # docs/coverage.md is written by `make spec-check` (minutes); this keeps it from going
    # stale: every return statement of today's spec, in order, and every race, reached.
    page = (Path(__file__).parents[2] / "docs" / "coverage.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `") and "` | " in line]
    listed = [
        (cells[0].strip(" `"), cells[1].strip(), cells[2].strip(" `").replace("\\|", "|"))
        for cells in (row.strip("|").split(" | ") for row in rows)
        if len(cells) == 4
    ]
    assert listed == [(b.action, b.kind, b.text) for b in branches()], (
        "docs/coverage.md is stale: run `make spec-check`"
    )
    assert "UNREACHED" not in page
    assert "NO EFFECT" not in page
    assert "NEVER SPENT" not in page
    for a, b in RACES:
        assert f"| {a} / {b} | `" in page


def test_budget_slots_are_named_by_the_config_fields_that_bound_them() -> None:
    for cfg in NAMED.values():
        assert initial_state(cfg).budget == tuple(getattr(cfg, b) for b in BUDGETS)


def test_a_budget_is_spent_where_a_reachable_state_has_it_at_0() -> None:
    cov = measure(NAMED["live-check"])
    assert cov.bounded == {"elections", "toggles"}
    assert cov.spent == {"elections", "toggles"}
    assert measure(NAMED["a-short"]).bounded == frozenset()


def test_a_budget_some_config_sets_and_none_spends_bounds_nothing() -> None:
    """A recovery that gives up without counting it: its budget is set, never spent, and
    the command exits 1 on it as on an unreached branch."""
    set_only = ConfigCoverage("x", bounded=frozenset({"give_ups"}), spent=frozenset())
    spent = ConfigCoverage("y", bounded=frozenset({"losses"}), spent=frozenset({"losses"}))
    r = Report([set_only, spent], [])
    assert r.unspent() == ["give_ups"]
    assert r.to_json()["bounds"]["give_ups"] == {"set_by": ["x"], "spent_by": []}
    assert r.to_json()["unspent"] == 1
    assert Report([spent], []).unspent() == []
