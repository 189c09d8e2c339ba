"""Where an add's CPU goes: py-spy samples the client and a bookie at 32 adds in flight.

py-spy (a sampling profiler that reads another process's Python stacks, so the process
runs unchanged) records the bench's own process (the client) and one bookie while a
closed loop of 32 adds runs. It samples a thread only while it holds the GIL (`--gil`):
Python's own CPU, not a thread blocked in fdatasync or in a socket call (the kernel's
share is the processes' system time, which the impl benchmark reports). Each sample's
innermost frame is charged its own time; the tables group those by function and by
area of the code (bkref's modules by name, the event loop, generated code).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bkref.impl import eventloop
from bkref.impl.client.client import BookKeeper
from bkref.impl.cluster.local import LocalCluster
from tests.bench.bench_impl import _adds, _loop

TITLE = "Where an add's CPU goes (py-spy, 32 in flight)"
RATE = 250  # samples per second and process
TOP = 12


def _spy(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes]:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(seconds),
            "--rate",
            str(RATE),
            "--format",
            "raw",
            "--gil",
            "--nonblocking",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _leaf(stack: str) -> tuple[str, str]:
    """(function, area) of a collapsed stack's innermost frame, ``name (file:line)``."""
    frame = stack.rsplit(";", 1)[-1]
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    if path.startswith("bkref/") or "/bkref/" in path:  # relative when run from the checkout
        module = ("/" + path).split("/bkref/", 1)[1].removesuffix(".py").replace("/", ".")
        return f"bkref.{module}.{name}", f"bkref.{module}"
    base = Path(path).name.removesuffix(".py")
    area = {
        "selectors": "event loop (select, epoll)",
        "base_events": "event loop (scheduling)",
        "events": "event loop (scheduling)",
        "selector_events": "event loop (socket I/O)",
        "streams": "asyncio streams",
        "tasks": "asyncio tasks and futures",
        "futures": "asyncio tasks and futures",
        "locks": "asyncio tasks and futures",
        "queues": "asyncio tasks and futures",
        "<string>": "dataclass __init__ (generated)",
        "enum": "Enum lookups (Status(code), Op(code))",
        "threading": "threads (the journal's condition variable)",
    }.get(base, f"{base} (other)")
    return f"{base}.{name}", area


def _tables(raw: Path, who: str) -> list[str]:
    funcs: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        fn, area = _leaf(stack)
        funcs[fn] += int(count)
        areas[area] += int(count)
    total = sum(funcs.values()) or 1
    out = [
        f"{who}: {total:,} samples with a Python stack.",
        "",
        "| area | own time |",
        "|---|---:|",
    ]
    out += [f"| {a} | {n / total:.1%} |" for a, n in areas.most_common(TOP)]
    out += ["", "| function | own time |", "|---|---:|"]
    out += [f"| `{f}` | {n / total:.1%} |" for f, n in funcs.most_common(TOP)]
    return out


def run(quick: bool) -> str:
    seconds = 3 if quick else 10
    n = 40_000 if quick else 150_000  # more than 1 s + the window take at ~10,000/s: cancelled
    loop = os.environ.get(eventloop.ENV, "asyncio")
    with tempfile.TemporaryDirectory(prefix="bkref-profile-") as d, _loop(loop):
        cluster = LocalCluster(Path(d) / "cluster")
        try:
            cluster.up(3)
            bookie = cluster.bookies[0].pid
            assert bookie is not None
            raws = {"client": Path(d) / "client.txt", "bookie": Path(d) / "bookie.txt"}

            async def go() -> None:
                async with BookKeeper(cluster.zk_hosts) as bk:
                    adds = asyncio.ensure_future(_adds(bk, n, 32))
                    await asyncio.sleep(1.0)  # past the ledger's creation
                    spies = [
                        _spy(os.getpid(), seconds, raws["client"]),
                        _spy(bookie, seconds, raws["bookie"]),
                    ]
                    for spy in spies:
                        while spy.poll() is None:
                            await asyncio.sleep(0.2)
                        if spy.returncode != 0:
                            err = spy.stderr.read().decode() if spy.stderr else ""
                            raise RuntimeError(f"py-spy failed ({spy.returncode}): {err[-400:]}")
                    adds.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await adds

            eventloop.run(go())
        finally:
            cluster.down()
        lines = [
            f"{seconds} s of samples at {RATE}/s during a closed loop of 32 adds of 1 KiB "
            f"(E=Wq=3, Aq=2, fsync), loop {loop}; own time of the innermost frame.",
            "",
        ]
        lines += _tables(raws["client"], "The client (this process)")
        lines += ["", *_tables(raws["bookie"], "One bookie")]
    return "\n".join(lines) + "\n"
