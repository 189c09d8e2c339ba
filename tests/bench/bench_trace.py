"""Tracing's cost on the add path, and the trace check's speed.

Adds with tracing off, with tracing on (every bookie and the client write their steps),
and with the code from before tracing existed (commit ``BEFORE``, extracted from git),
in one run: each variant runs in a process of its own with its own cluster, the
variants alternate round by round, and the median of the rounds is reported with the
CPU each add costs the client and the bookies. Then ``bkref trace check`` on the
traced runs' files.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

TITLE = "Tracing: adds with tracing off, on, and before it existed; the trace check"

ROOT = Path(__file__).resolve().parents[2]
# The last commit before any tracing code (the bookie's --trace came in 8a61e3d).
BEFORE = "d02bb08"

_ADDS = textwrap.dedent("""
    import asyncio, json, os, sys, time
    from pathlib import Path
    from bkref.impl.cluster.local import LocalCluster
    from bkref.impl.client.client import BookKeeper

    def cpu(pid):
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    work, n, traces = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    kw = {"trace_dir": Path(traces)} if traces else {}
    cluster = LocalCluster(work / "cluster", **kw)
    cluster.up(3)
    try:
        async def go():
            extra = {}
            if traces:
                from bkref.impl.trace import Tracer
                extra["tracer"] = Tracer(Path(traces), "client")
            async with BookKeeper(cluster.zk_hosts, **extra) as bk:
                h = await bk.create_ledger(3, 3, 2, b"bench")
                payload = os.urandom(1024)
                await asyncio.gather(*(h.add(payload) for _ in range(64)))  # warm up
                await h.close()
                pids = [b.pid for b in cluster.bookies]
                before = [cpu(p) for p in pids]
                t, c = time.perf_counter(), time.process_time()

                async def caller(h, k):
                    for _ in range(k):
                        await h.add(payload)

                for _ in range(n // 1024):  # ledgers of 1,024 entries, as a workload's
                    h = await bk.create_ledger(3, 3, 2, b"bench")
                    await asyncio.gather(*(caller(h, 32) for _ in range(32)))
                    await h.close()
                wall, client = time.perf_counter() - t, time.process_time() - c
                bookies = sum(cpu(p) - b for p, b in zip(pids, before)) / len(pids)
                done = n // 1024 * 1024
                return {"rate": done / wall, "client_us": client / done * 1e6,
                        "bookie_us": bookies / done * 1e6}
        print(json.dumps(asyncio.run(go())))
    finally:
        cluster.down()
""")


def _before_tree(into: Path) -> Path | None:
    """The source tree of ``BEFORE`` (None outside a git checkout that has it)."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", BEFORE, "bkref"],
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _adds(tree: Path, work: Path, n: int, traces: Path | None) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _ADDS, str(work), str(n), str(traces or "")],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(quick: bool) -> str:
    n, rounds = (1024, 1) if quick else (10240, 5)
    variants = ["before", "off", "on"]
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    check_rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bkref-bench-trace-") as d:
        base = Path(d)
        old = _before_tree(base / "before")
        if old is None:
            variants.remove("before")
        for k in range(rounds):
            for v in variants:
                work = base / f"{v}-{k}"
                work.mkdir()
                traces = work / "traces" if v == "on" else None
                results[v].append(_adds(old if v == "before" and old else ROOT, work, n, traces))
                if traces is not None:
                    t0 = time.perf_counter()
                    out = work / "verdicts.json"
                    argv = ["-m", "bkref.tracecheck.cli", "check", str(traces), "--json", str(out)]
                    code = subprocess.run(
                        [sys.executable, *argv], capture_output=True, check=False, cwd=ROOT
                    ).returncode
                    seconds = time.perf_counter() - t0
                    verdicts = json.loads(out.read_text())
                    counted = Counter(x["verdict"] for x in verdicts)
                    steps = sum(x["steps"] for x in verdicts)
                    size = sum(f.stat().st_size for f in traces.iterdir())
                    check_rows.append(
                        f"| {k} | {steps:,} | {size / 2**20:.1f} | {seconds:.1f} | "
                        f"{steps / seconds:,.0f} | exit {code}, "
                        + ", ".join(f"{c} {what}" for what, c in counted.items())
                        + " |"
                    )
    rows = [
        "| code | adds/s (median) | client CPU us/add | bookie CPU us/add | rounds |",
        "|---|---:|---:|---:|---:|",
    ]
    names = {
        "before": f"before tracing ({BEFORE})",
        "off": "tracing off",
        "on": "tracing on (3 bookies + client)",
    }
    for v in variants:
        rs = results[v]
        rows.append(
            f"| {names[v]} | {statistics.median(r['rate'] for r in rs):,.0f} | "
            f"{statistics.median(r['client_us'] for r in rs):.0f} | "
            f"{statistics.median(r['bookie_us'] for r in rs):.0f} | {len(rs)} |"
        )
    if "before" not in variants:
        rows.append("| before tracing | (no git checkout with that commit here) | | | |")
    off = statistics.median(r["rate"] for r in results["off"])
    on = statistics.median(r["rate"] for r in results["on"])
    text = "\n".join(rows) + (
        f"\n\n{n:,} adds of 1 KiB in ledgers of 1,024, E=Wq=3 Aq=2, 32 in flight (each "
        "ledger created and closed in the measured time), per variant and round; each "
        "variant in a fresh process with a fresh 3-bookie cluster, the variants taking turns. "
        f"Tracing on runs at {on / off:.0%} of tracing off in this run. The trace check on "
        "the traced runs:\n\n"
        "| round | steps | trace MiB | check s | steps/s | verdict |\n"
        "|---:|---:|---:|---:|---:|---|\n" + "\n".join(check_rows) + "\n"
    )
    if "before" in variants:
        before = statistics.median(r["rate"] for r in results["before"])
        text += f"\nTracing off runs at {off / before:.0%} of the code before tracing.\n"
    return text + (
        "\nHow the check's time grows with a ledger's length: BENCHMARKS.md, 'Trace check "
        "against a ledger's length'; on campaigns: 'Trace check on campaigns'.\n"
    )
