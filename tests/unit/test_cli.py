"""The `bkref` dispatcher: lazy subcommands found through entry points."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

from bkref.impl.cli import main as cli_main
from bkref.impl.cli.main import GROUP, main


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
        "import sys; from bkref.impl.cli.main import main\n"
        "try:\n    main(['history', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('kazoo' in sys.modules, 'bkref.impl.cluster.zookeeper' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "False False"


def _crash(argv: list[str]) -> int:
    raise RuntimeError("kaput\nsecond line")


@pytest.mark.parametrize("trace", ["", "1"])
def test_an_exception_in_a_subcommand_is_one_line_and_exit_2(
    trace: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    crash = EntryPoint(name="crash", value=f"{__name__}:_crash", group=GROUP)
    monkeypatch.setattr(cli_main, "_commands", lambda: {"crash": crash})
    monkeypatch.setenv("BKREF_TRACEBACK", trace)
    assert main(["crash", "x"]) == 2
    err = capsys.readouterr().err
    if trace:
        assert "Traceback" in err
        assert err.splitlines()[-1] == "bkref crash: internal error: RuntimeError: kaput"
    else:
        assert err == (
            "bkref crash: internal error: RuntimeError: kaput "
            "(set BKREF_TRACEBACK=1 for the traceback)\n"
        )


@pytest.mark.parametrize("argv", [["spec", "list"], ["--help"]])
def test_a_reader_that_closed_the_pipe_ends_the_command_quietly(argv: list[str]) -> None:
    # `bkref ... | head`: the reader is gone before the command writes. Not an internal
    # error, not exit 1 (anomalies): the status SIGPIPE would give, and nothing on stderr;
    # the same for bkref's own usage text.
    proc = subprocess.Popen(
        [sys.executable, "-m", "bkref.impl.cli.main", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err.decode()) == (141, "")
