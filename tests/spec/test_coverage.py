"""Spec coverage: the branches found, the counts measured, and the unexplained ones named."""

from __future__ import annotations

from collections import Counter

import pytest

from spec.checker import check
from spec.cli import main
from spec.configs import NAMED
from spec.coverage import _reason, branches, measure, report
from spec.protocol import ACTIONS


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
