"""`bkref`: one command, a subcommand per area, each loaded only when it runs.

Subcommands are registered as entry points in the group ``bkref.commands``
(see pyproject.toml). The dispatcher reads their names from the installed
metadata and imports a subcommand's module only when it is invoked, so this
module imports nothing of bkref and the dependency direction stays intact:
``bkref spec ...`` runs spec's CLI without impl importing spec. Another
package can add a subcommand by declaring an entry point in the same group.

Each subcommand is a callable ``main(argv: list[str]) -> int`` whose module
docstring's first line is its one-line help.

Exit statuses, the same for every command: 0 done (valid); 1 the command ran
and found something wrong (a checker's anomalies, a cluster process down, no
auditor elected); 2 it could not do what was asked (bad input, a server that
failed or could not be reached, an internal error). The dispatcher is the last
line of defence: an exception that escapes a subcommand (a bug in bkref, or bad
input it failed to word) must not end in a traceback and exit 1. It prints one
line, ``bkref CMD: internal error: TYPE: MESSAGE``, and exits 2;
``BKREF_TRACEBACK=1`` prints the traceback as well. A reader that closes the
pipe early (``bkref check ... | head``) ends the command quietly, as SIGPIPE
would (status 141).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points

GROUP = "bkref.commands"

Subcommand = Callable[[list[str]], int]


def _commands() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def _summary(ep: EntryPoint) -> str:
    try:
        module = importlib.import_module(ep.module)
    except ImportError as e:  # a broken install must not hide the other commands
        return f"(cannot be loaded: {e})"
    doc = (module.__doc__ or "").strip().splitlines()
    return doc[0] if doc else ""


def _usage(commands: dict[str, EntryPoint]) -> str:
    lines = [
        "usage: bkref COMMAND [ARGS...]",
        "",
        "bkref: a model-checked reference implementation of the BookKeeper ledger protocol.",
        "",
        "commands:",
    ]
    width = max((len(name) for name in commands), default=0)
    lines += [f"  {name.ljust(width)}  {_summary(ep)}" for name, ep in sorted(commands.items())]
    lines += ["", "Run `bkref COMMAND --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        return _dispatch(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:
        # The reader is gone (`bkref ... | head`): flushing stdout at exit would raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _dispatch(args: list[str]) -> int:
    commands = _commands()
    if not commands:
        print(
            "bkref: no subcommands are registered; the package metadata is missing.\n"
            "Re-install the project (`make setup`, or `pip install -e .`).",
            file=sys.stderr,
        )
        return 2
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage(commands))
        return 0
    name, rest = args[0], args[1:]
    if name not in commands:
        known = ", ".join(sorted(commands))
        print(f"bkref: unknown command {name!r}; the commands are: {known}", file=sys.stderr)
        return 2
    try:
        run: Subcommand = commands[name].load()
        return run(rest)
    except BrokenPipeError:
        raise  # main() ends quietly
    except Exception as e:  # SystemExit (argparse's usage errors) and Ctrl-C pass through
        return _internal_error(name, e)


def _internal_error(name: str, e: Exception) -> int:
    text = str(e).strip()
    message = f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__
    if os.environ.get("BKREF_TRACEBACK", "") not in ("", "0"):
        traceback.print_exc()
        print(f"bkref {name}: internal error: {message}", file=sys.stderr)
    else:
        print(
            f"bkref {name}: internal error: {message} (set BKREF_TRACEBACK=1 for the traceback)",
            file=sys.stderr,
        )
    return 2


if __name__ == "__main__":
    sys.exit(main())
