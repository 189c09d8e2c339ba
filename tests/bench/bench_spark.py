"""Spark checks: time and peak memory of `bkref spark-check` on local[2], by history size.

Beside it, the single-process checkers on the same history (the ledger checker
and the durability check, reading the same Parquet file) as a baseline, up to
2 x 10^7 lines (beyond, they would hold the whole history: ~60 GB at 10^8).
The histories come from `bkref gen-history`'s columnar generator (1,000
ledgers; fewer in quick mode). Sizes: 10^6, 10^7 and 10^8 operations in a
full run (10^8: ~1.1 GB of Parquet, under a minute to generate, about 7
minutes to check on an idle 2-core machine); BKREF_BENCH_SPARK_OPS (for
example ``1e6,1e7``) chooses others.
"""

from __future__ import annotations

import itertools
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bkref.linearizability.columnar import columnar_history, write_columnar

TITLE = "Spark checks (spark_checks): throughput and peak memory on local[2]"
BASELINE_MAX = 20_000_000  # lines: the single-process checkers hold them all in memory

# The single-process baseline runs in a fresh interpreter so that its peak
# memory (VmHWM) is its own.
_BASELINE = """
import sys, time
from bkref.linearizability.durability import check_durability
from bkref.linearizability.history_files import read_parquet
from bkref.linearizability.ledger_checker import check_ledgers
t = time.perf_counter()
ops = list(read_parquet(sys.argv[1], check=False))
r = check_ledgers(ops)
d = check_durability(ops)
s = time.perf_counter() - t
hwm = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
print(r.verdict, d["valid"], len(ops), s, hwm)
"""


def _tree_usage(root: int) -> tuple[int, float]:
    """Resident memory (KiB) and CPU seconds so far (with reaped children's) of a
    process and all its descendants."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    cpu: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            status = (d / "status").read_text()
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        pid, ppid = int(d.name), int(fields.get("PPid", "0").strip() or 0)
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0]) if "VmRSS" in fields else 0
        cpu[pid] = sum(int(x) for x in stat[11:15])  # utime stime cutime cstime
    total, ticks, stack = 0, 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        ticks += cpu.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total, ticks / os.sysconf("SC_CLK_TCK")


def _measure(cmd: list[str]) -> tuple[float, int, float, str, str, int]:
    """Run ``cmd``; wall seconds, peak RSS of its process tree (KiB), its CPU
    seconds (sampled: the machine is shared, CPU time is the steadier figure),
    stdout, stderr, rc."""
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, cpu = 0, 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, cpu
        while not done.is_set():
            rss, used = _tree_usage(proc.pid)
            peak, cpu = max(peak, rss), max(cpu, used)
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    waited = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return time.perf_counter() - started, peak, max(cpu, waited), out, err, proc.returncode


def _stages(stderr: str) -> list[float]:
    """Seconds since start at the end of each progress line ``[k/n] ... (12.3 s)``:
    the session up, history read and paired, checks done, tables written, summary."""
    return [
        float(line.rsplit("(", 1)[1].split()[0])
        for line in stderr.splitlines()
        if line.startswith("bkref spark-check: [") and line.rstrip().endswith("s)")
    ]


def _sizes(quick: bool) -> list[int]:
    if quick:
        return [5_000]
    env = os.environ.get("BKREF_BENCH_SPARK_OPS")
    if env:
        return [int(float(x)) for x in env.split(",")]
    return [1_000_000, 10_000_000, 100_000_000]


def run(quick: bool) -> str:
    bkref = str(Path(sys.executable).with_name("bkref"))
    rows = [
        "| ops | ledgers | Spark: check s | CPU s | startup s | read+pair s | checks s "
        "| tables s | ops/s | peak RSS | load | single process: s | ops/s | peak RSS |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for n in _sizes(quick):
        ledgers = 20 if quick else 1000
        with tempfile.TemporaryDirectory(prefix="bkref-bench-spark-") as d:
            history, out = Path(d) / "history.parquet", Path(d) / "out"
            t = time.perf_counter()
            ops = write_columnar(columnar_history(n, ledgers, seed=1), history)
            gen = time.perf_counter() - t
            cmd = [bkref, "spark-check", str(history), "--master", "local[2]", "--out", str(out)]
            load0 = os.getloadavg()[0]
            wall, peak, cpu, _, err, rc = _measure(cmd)
            load1 = os.getloadavg()[0]
            if rc != 0:
                raise RuntimeError(f"spark-check exited {rc} on a valid history:\n{err[-2000:]}")
            marks = _stages(err)
            start = marks[0] if marks else 0.0
            check = wall - start
            # per stage: read and pair, the checks, tables and summary
            split = [b - a for a, b in itertools.pairwise(marks)] + [0.0] * 3
            baseline = "| - | - | - |"
            if ops <= BASELINE_MAX:
                _, b_peak, _, b_out, b_err, b_rc = _measure(
                    [sys.executable, "-c", _BASELINE, str(history)]
                )
                if b_rc != 0:
                    raise RuntimeError(f"baseline failed:\n{b_err[-2000:]}")
                verdict, durable, _, b_s, _ = b_out.split()
                if (verdict, durable) != ("valid", "True"):
                    raise RuntimeError(f"the baseline says {verdict}, durable {durable}")
                b_s_f = float(b_s)
                baseline = f"| {b_s_f:.1f} | {ops / b_s_f:,.0f} | {b_peak / 2**20:.2f} GiB |"
            rows.append(
                f"| {ops:,} | {ledgers:,} | {check:.1f} | {cpu:.0f} | {start:.1f} | "
                f"{split[0]:.1f} | {split[1]:.1f} | {sum(split[2:]):.1f} | {ops / check:,.0f} | "
                f"{peak / 2**20:.2f} GiB | {load0:.1f}-{load1:.1f} {baseline}"
            )
            notes.append(f"{ops:,} ops generated in {gen:.0f} s")
    load = os.getloadavg()
    return (
        "\n".join(rows)
        + "\n\nSpark: `bkref spark-check` in a subprocess (ledger linearizability and durability,"
        " tables, summary and page written); check s = wall time minus the session's start;"
        " CPU s: CPU time of the whole process tree, start included (sampled every 0.5 s);"
        " read+pair, checks, tables: the job's progress lines (reading and pairing the"
        " history; the ledger and durability checks up to the anomaly table; the other"
        " tables and the summary); load: the 1-minute load average before and after;"
        " peak RSS of the process tree (driver, JVM, Python workers) sampled every 0.5 s."
        " JVM options: "
        + repr(os.environ.get("BKREF_SPARK_JAVA_OPTS", "the default (sized by the history)"))
        + "."
        " Single process: `check_ledgers` + `check_durability` after reading the same Parquet"
        " file, in a fresh interpreter (VmHWM); not run beyond"
        f" {BASELINE_MAX:,} lines. Histories by `bkref gen-history --seed 1`: "
        + "; ".join(notes)
        + f". Load average at the end: {load[0]:.1f} (the machine is shared).\n"
    )
