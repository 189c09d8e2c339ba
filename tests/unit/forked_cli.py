"""Run many `bkref` commands as processes without paying an interpreter start for each.

``python -m tests.unit.forked_cli`` reads ``{"cases": {id: argv}}`` as JSON on stdin,
imports the dispatcher and every subcommand's module once, then forks one child per
case. A child is what ``bkref ARGV`` is after its imports: its own process, its own
stdout and stderr (files here), ``sys.exit(main(argv))``'s exit status. It prints
``{id: [status, stdout, stderr]}`` as JSON.

Why: tests/unit/test_bad_input.py runs over a hundred commands that must fail before
they start anything; as separate interpreters they cost ~0.45 CPU s each, nearly all
interpreter start and imports (47 CPU s per `make verify`). Forking from one process that
has imported what they import keeps a process per case, with nothing shared between
cases but the imports. The test runs a sample of the cases as real `python -m` processes
too and wants the same results.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path

PARALLEL = 8  # children at once: a few cases wait on a connect timeout


def _child(argv: list[str], out: Path, err: Path) -> None:
    """In the forked child: become `bkref ARGV` with stdout and stderr in files."""
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    from bkref.impl.cli.main import main

    status: object
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's errors, as the interpreter would end them
        status = e.code
    except BaseException:  # what the interpreter would print for an uncaught exception
        import traceback

        traceback.print_exc()
        status = 1
    if status is None:
        code = 0
    elif isinstance(status, int):
        code = status
    else:  # sys.exit("message"): printed, status 1
        print(status, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code & 0xFF)


def run(cases: dict[str, list[str]]) -> dict[str, list[object]]:
    from bkref.impl.cli.main import GROUP

    for command in entry_points(group=GROUP):
        importlib.import_module(command.module)
    results: dict[str, list[object]] = {}
    with tempfile.TemporaryDirectory(prefix="bkref-forked-cli-") as tmp:
        running: dict[int, tuple[str, Path, Path]] = {}
        todo = list(cases.items())

        def reap_one() -> None:
            pid, status = os.wait()
            case, out, err = running.pop(pid)
            results[case] = [os.waitstatus_to_exitcode(status), out.read_text(), err.read_text()]

        for i, (case, argv) in enumerate(todo):
            while len(running) >= PARALLEL:
                reap_one()
            out, err = Path(tmp) / f"{i}.out", Path(tmp) / f"{i}.err"
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(argv, out, err)
            running[pid] = (case, out, err)
        while running:
            reap_one()
    return results


def main() -> int:
    request = json.load(sys.stdin)
    json.dump(run(request["cases"]), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
