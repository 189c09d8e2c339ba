"""Stopping a shard's cosmic-ray execs and every test they started, and only returning
once they are gone: a budget that runs out must not leave a test running in the copy,
nor let an exec record a mutant killed by our own signal."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import suppress
from pathlib import Path


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def stop(procs: list[subprocess.Popen[bytes]]) -> set[int]:
    """Stop each exec and the test it runs, and return only when all are gone (the pids of
    the execs it stopped). cosmic-ray
    starts a test in a session of its own, so the exec's process group does not hold it:
    the process groups of every descendant are signalled too. The execs are frozen and
    killed first: an exec that saw its test die of our signal recorded the mutant as
    killed (seen once in a verify run, a budget-stopped job counted as done)."""
    live = [p.pid for p in procs if p.poll() is None]
    for pid in live:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)  # records nothing more, starts no other test
    groups = set(live)
    for pid in live:
        for d in _descendants(pid):
            with suppress(ProcessLookupError):
                groups.add(os.getpgid(d))
    for pid in live:
        with suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in groups:
            with suppress(ProcessLookupError):
                os.killpg(g, sig)
        if _gone(procs, groups, within=30.0):
            break
    for p in procs:
        p.wait()
    return set(live)


def _gone(procs: list[subprocess.Popen[bytes]], groups: set[int], *, within: float) -> bool:
    """Whether every process of ``groups`` ended within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        for p in procs:
            p.poll()  # reap: a zombie still counts as a member of its group
        if not any(_group_alive(g) for g in groups):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
