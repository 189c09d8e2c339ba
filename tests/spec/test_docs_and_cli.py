"""The generated reviewer page is fresh; the `bkref spec` command line behaves as documented."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bkref.spec import docs, protocol
from bkref.spec.cli import main
from bkref.spec.config import MUTANTS
from bkref.spec.configs import BIG_CONFIGS, CONFIGS
from bkref.spec.invariants import INVARIANTS


def test_docs_spec_md_is_regenerated_from_the_docstrings() -> None:
    assert docs.OUT.read_text() == docs.render(), "run `python -m bkref.spec.docs`"


def test_docs_name_every_action_invariant_variable_and_mutant() -> None:
    text = docs.render()
    for fn in protocol.ACTIONS:
        assert f"### `{fn.__name__}(" in text
    for inv in INVARIANTS:
        assert f"### `{inv.__name__}`" in text
    for field in protocol.State._fields:
        assert f"- `{field}`" in text
    for mutant in MUTANTS:
        assert f"### `{mutant}`" in text


def test_every_action_has_a_docstring_and_is_listed() -> None:
    for fn in protocol.ACTIONS:
        assert fn.__doc__, fn.__name__
    names = {fn.__name__ for fn in protocol.ACTIONS}
    cfg = CONFIGS["a-short"]
    s = protocol.initial_state(cfg)
    assert {name for (name, _a), _t in protocol.next_states(cfg, s)} <= names


def test_list_prints_one_line_per_config_and_mutant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == [f"config {c}" for c in CONFIGS] + [
        f"big config {c}" for c in BIG_CONFIGS
    ] + [f"mutant {m}" for m in MUTANTS]


def test_check_exits_0_without_violation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", "b-short", "--quiet"]) == 0
    assert "no invariant violated" in capsys.readouterr().out


def test_check_of_a_mutant_alone_uses_its_config_and_exits_1_with_a_trace(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "--mutant", "negative-read-without-coverage", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATION of NoDivergenceBetweenClientAndMetaData" in out
    assert "recovery_client_closes_ledger" in out
    assert "meta[L0].status: IN_RECOVERY -> CLOSED" in out  # the state diff


def test_check_json_carries_the_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--mutant", "ack-before-fsync", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["violation"] == "AllCommittedEntriesReachAckQuorum"
    assert result["trace"][0]["action"] == "Init"
    assert result["trace"][-1]["action"].startswith("bookie_crashes")


def test_walk_mode_reports_steps_and_the_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", "a-short", "--walk", "500", "--seed", "4", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "(seed 4)" in out
    assert " distinct states, " in out
    assert main(["check", "--config", "a-short", "--walk", "500", "--seed", "4", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert 1 < summary["distinct"] <= 501
    assert 0 < summary["collision_probability"] < 1e-9


@pytest.mark.parametrize(
    "argv",
    [
        ["check"],
        ["check", "--config", "nope"],
        ["check", "--mutant", "nope"],
        ["check", "--config", "a", "--walk", "x"],
        ["frobnicate"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "bkref spec" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--help"]) == 0
    assert "--mutant" in capsys.readouterr().out


def test_a_config_naming_an_unknown_mutant_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"unknown mutants: \['no-such-mutant'\]"):
        replace(CONFIGS["a"], mutants=frozenset({"no-such-mutant", next(iter(MUTANTS))}))
