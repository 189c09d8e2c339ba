"""Processes we started: liveness, ownership by command line, stop by PID, log tails.

Launchers record PIDs in state files so that another process can stop what
they started. Before signalling a recorded PID we check that it still runs a
command line naming our config file: PIDs are re-used, and we must never
signal a process we did not start.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie, dead but not yet reaped, counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


def runs_with(pid: int, marker: str | Path) -> bool:
    """True if ``pid``'s command line has an argument containing ``marker``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    needle = str(marker).encode()
    return any(needle in arg for arg in argv)


def stop_pid(
    pid: int,
    *,
    child: subprocess.Popen[bytes] | None = None,
    sig: signal.Signals = signal.SIGTERM,
    grace: float = 5.0,
) -> None:
    """Send ``sig``, wait up to ``grace`` seconds, then SIGKILL; reap ``child`` if ours."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)

    def gone() -> bool:
        return (child is not None and child.poll() is not None) or not pid_alive(pid)

    deadline = time.monotonic() + grace
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not gone():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if child is not None:
        child.wait()
    else:
        while pid_alive(pid):
            time.sleep(0.05)


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def write_state(path: Path, state: object) -> None:
    """Write a JSON state file atomically: another process never reads half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)


def read_state(path: Path, missing: str, what: str) -> dict[str, Any]:
    """A state file that :func:`write_state` wrote: a JSON object. Raises
    :class:`StateFileError`: ``missing`` when there is none; otherwise what is
    wrong with it, and that it should hold ``what``."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StateFileError(missing) from None
    except (OSError, ValueError) as e:
        why = (
            "not UTF-8 text"
            if isinstance(e, UnicodeDecodeError)
            else f"not JSON ({e})"
            if isinstance(e, ValueError)
            else f"cannot read it: {e.strerror or e}"
        )
        raise StateFileError(f"{path}: {why}; expected {what}") from None
    if not isinstance(state, dict):
        raise StateFileError(f"{path}: not a JSON object; expected {what}")
    return state


class StateFileError(Exception):
    """A state file is missing or unreadable; the message says which and why."""


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
