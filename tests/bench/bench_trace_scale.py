"""The trace check against a ledger's length: one traced ledger of N entries (32 adds in
flight, E=Wq=3 Aq=2, the writer stops without closing, a second client recovers it:
fencing reads, recovery reads, the close), then ``bkref trace check`` on its traces in a
process of its own, timed, with its CPU and peak memory."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TITLE = "Trace check against a ledger's length"

_WRITE = textwrap.dedent("""
    import asyncio, os, sys
    from pathlib import Path
    from bkref.impl.client.client import BookKeeper
    from bkref.impl.cluster.local import LocalCluster
    from bkref.impl.trace import Tracer

    work, n = Path(sys.argv[1]), int(sys.argv[2])
    traces = work / "traces"
    cluster = LocalCluster(work / "cluster", trace_dir=traces)
    cluster.up(3)
    try:
        async def go():
            async with BookKeeper(cluster.zk_hosts, tracer=Tracer(traces, "writer")) as bk:
                h = await bk.create_ledger(3, 3, 2, b"pw")
                payload = os.urandom(64)
                async def caller(k):
                    for _ in range(k):
                        await h.add(payload)
                await asyncio.gather(*(caller(n // 32) for _ in range(32)))
                lid = h.ledger_id
            # The writer is gone with its ledger open: another client recovers it.
            async with BookKeeper(cluster.zk_hosts, tracer=Tracer(traces, "recoverer")) as bk:
                await bk.open_ledger(lid, b"pw")
        asyncio.run(go())
    finally:
        cluster.down()
""")

# The check in a child that reports its own CPU seconds and peak resident memory.
_CHECK = textwrap.dedent("""
    import json, resource, sys, time
    from pathlib import Path
    from bkref.tracecheck.cli import check
    t = time.perf_counter()
    (v,) = check(Path(sys.argv[1]), float(sys.argv[2]), None)
    print(json.dumps({
        "seconds": time.perf_counter() - t,
        "cpu": time.process_time(),
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "steps": v.steps, "verdict": v.verdict, "reason": v.reason,
    }))
""")


def _one(work: Path, n: int, budget: float) -> dict[str, object]:
    subprocess.run(
        [sys.executable, "-c", _WRITE, str(work), str(n)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    traces = work / "traces"
    size = sum(f.stat().st_size for f in traces.iterdir())
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, str(traces), str(budget)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:  # the kernel's OOM killer, at 24 GiB: a row all the same
        why = f"exit {done.returncode}" + (" (SIGKILL: out of memory)" * (done.returncode == -9))
        return {
            "steps": 0,
            "seconds": 0.0,
            "cpu": 0.0,
            "peak_mib": 0.0,
            "verdict": why,
            "reason": done.stderr.strip()[-200:],
            "trace_mib": size / 2**20,
        }
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    out["trace_mib"] = size / 2**20
    return out


def run(quick: bool) -> str:
    lengths = (1000,) if quick else (1000, 3000, 10_000)
    budget = 60.0 if quick else 1200.0
    rows = [
        "| entries | steps | trace MiB | check s | CPU s | steps/s | peak MiB | verdict |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="bkref-bench-trace-scale-") as d:
        for n in lengths:
            work = Path(d) / str(n)
            work.mkdir()
            r = _one(work, n, budget)
            print(f"  {n:,} entries: {r['verdict']} in {r['seconds']:.1f} s", flush=True)
            steps, seconds = int(str(r["steps"])), float(str(r["seconds"]))
            verdict = str(r["verdict"])
            if seconds == 0:
                rows.append(
                    f"| {n:,} | - | {float(str(r['trace_mib'])):.1f} | - | - | - | - | {verdict} |"
                )
                break  # a longer ledger needs more still
            if verdict != "explained":
                verdict += f" ({str(r['reason'])[:80]})"
            rows.append(
                f"| {n:,} | {steps:,} | {float(str(r['trace_mib'])):.1f} | {seconds:.1f} | "
                f"{float(str(r['cpu'])):.1f} | {steps / seconds:,.0f} | "
                f"{float(str(r['peak_mib'])):,.0f} | {verdict} |"
            )
    return "\n".join(rows) + (
        "\n\nThe search takes each step in time independent of the ledger's length (its "
        "frontier holds the events that may go next, about the requests in flight). The "
        "spec's state does not: the writer's acks and piggybacked LACs are tuples of one "
        "slot per entry, copied at each step that changes them and hashed at each "
        "configuration the search remembers, and every configuration on the search's path "
        "stays in memory. Time and memory therefore grow with the square of the length, "
        "with a small constant (docs/trace.md, 'How long a check takes').\n"
    )
