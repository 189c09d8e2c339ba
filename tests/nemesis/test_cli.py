"""`bkref campaign` arguments: refusals are clear and exit 2, before any cluster starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkref.nemesis.cli import _fault_length, _quorum, main


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--backend", "local", "--faults", "partition"], "cannot inject ['partition']"),
        (["--backend", "local", "--faults", "lose-unsynced"], "cannot inject ['lose-unsynced']"),
        (["--faults", "meteor"], "unknown fault kind(s) ['meteor']"),
        (["--quorum", "2,3,2"], "need E >= Wq >= Aq >= 1"),
        (["--quorum", "3,2"], "--quorum wants E,Wq,Aq (three integers), got '3,2'"),
        (["--quorum", "5,3,2", "--bookies", "4"], "the ensemble is larger than --bookies 4"),
        (["--fault-length", "6"], "--fault-length wants MIN,MAX in seconds, got '6'"),
        (["--fault-length", "8,2"], "--fault-length needs 0 < MIN <= MAX, got 8,2"),
        (["--fault-length", "1,inf"], "--fault-length needs finite seconds, got 1,inf"),
        (["--trace", "--trace-budget", "0"], "--trace-budget 0.0: must be positive"),
    ],
)
def test_bad_arguments_exit_2_with_the_reason(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert said in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "out").exists()  # nothing was started


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--bookies", "2"], "argument --bookies: expected an integer >= 3, got '2'"),
        (["--time", "0"], "argument --time: expected a number > 0, got '0'"),
        (["--time", "nan"], "argument --time: expected a number > 0, got 'nan'"),
        (["--runs", "0"], "argument --runs: expected an integer >= 1, got '0'"),
        (["--readers", "-1"], "argument --readers: expected an integer >= 0, got '-1'"),
    ],
)
def test_numbers_out_of_range_are_usage_errors(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--out", str(tmp_path / "out")])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_quorum_defaults_to_wq_above_aq_when_a_disk_loses_synced_data() -> None:
    assert _quorum(None, ("kill", "pause")) == (3, 2, 2)
    assert _quorum(None, ("kill", "truncate")) == (3, 3, 2)
    assert _quorum("5,3,2", ("truncate",)) == (5, 3, 2)


def test_fault_length_is_min_and_max_seconds() -> None:
    assert _fault_length("1,6") == (1.0, 6.0)
    assert _fault_length("8.5,8.5") == (8.5, 8.5)
