"""The `bkref` dispatcher: lazy subcommands found through entry points."""

from __future__ import annotations

import subprocess
import sys

import pytest

from impl.cli.main import main


def test_help_lists_registered_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "zookeeper" in out
    assert "history" in out
    assert "Validate histories" in out  # the summary is the module docstring's first line


def test_unknown_command_exits_2_and_names_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err
    assert "zookeeper" in err


def test_dispatch_imports_only_the_chosen_area() -> None:
    # `bkref history` must not drag in impl's ZooKeeper launcher or kazoo.
    code = (
        "import sys; from impl.cli.main import main\n"
        "try:\n    main(['history', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('kazoo' in sys.modules, 'impl.cluster.zookeeper' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "False False"
