"""Linearizability checkers: the ledger checker on big histories, the generic search on peers."""

from __future__ import annotations

import csv
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bkref.linearizability import wgl
from bkref.linearizability.generate import ledger_history, many_ledgers, to_ops
from bkref.linearizability.history import Op, pair
from bkref.linearizability.history_files import write_jsonl
from bkref.linearizability.ledger_checker import check_ledgers
from bkref.linearizability.peer import read_edn_kv, read_jepsen_log

TITLE = "Linearizability checkers"
PEER = Path(__file__).resolve().parents[1] / "data" / "peer-histories"

# Runs in a fresh interpreter so that its peak memory (VmHWM: ru_maxrss would
# carry over the parent's across exec) is the check's own.
_CHILD = """
import sys, time
from bkref.linearizability.history_files import read_jsonl
from bkref.linearizability.ledger_checker import check_ledgers
t, c = time.perf_counter(), time.process_time()
r = check_ledgers(read_jsonl(sys.argv[1]))
s, cpu = time.perf_counter() - t, time.process_time() - c
status = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
print(r.verdict, r.ops, s, cpu, status)
"""


def _single(n: int, seed: int) -> list[Op]:
    """About ``n`` ops of one ledger: 20 concurrent readers, 50 adds in flight."""
    events = ledger_history(
        random.Random(seed),
        adds=n // 5,
        reads=3 * n // 10,
        readers=20,
        in_flight=50,
        end="recover",
        crash=0.001,
        end_early=0.0,
    )
    return to_ops(events)


def _file_check(path: Path) -> tuple[str, int, float, float, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)], check=True, capture_output=True, text=True
    ).stdout.split()
    return out[0], int(out[1]), float(out[2]), float(out[3]), int(out[4]) / 1024


def _ledger_rows(quick: bool) -> list[str]:
    rows = [
        "| history | ops | ledgers | verdict | parse + check: wall (s) | CPU (s) | ops/CPU s "
        "| check only: CPU (s) | peak RSS (MiB) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    sizes = (10_000,) if quick else (10_000, 100_000, 1_000_000)
    # Made one at a time: two histories of 10^6 ops in memory would slow the others.
    cases: list[tuple[str, Callable[[], list[Op]]]] = [
        (f"one ledger, 20 readers, 50 adds in flight, 10^{len(str(n)) - 1}", partial(_single, n, n))
        for n in sizes
    ]
    ledgers, per = (10, 1_000) if quick else (100, 10_000)
    cases.append(
        (
            f"{ledgers} ledgers x {per:,} ops, interleaved",
            partial(
                many_ledgers,
                random.Random(5),
                ledgers,
                per,
                readers=20,
                in_flight=50,
                crash=0.001,
                end_early=0.0,
            ),
        )
    )
    with tempfile.TemporaryDirectory() as d:
        for label, make in cases:
            ops = make()
            path = Path(d) / "h.jsonl"
            write_jsonl(ops, path)
            c = time.process_time()
            mem = check_ledgers(ops)
            check_only = time.process_time() - c
            verdict, count, secs, cpu, rss = _file_check(path)
            assert verdict == "valid" == mem.verdict, label
            rows.append(
                f"| {label} | {count:,} | {len(mem.ledgers)} | {verdict} | {secs:.2f} | "
                f"{cpu:.2f} | {count / cpu:,.0f} | {check_only:.2f} | {rss:,.0f} |"
            )
            del ops
    return rows


JEPSEN = "jepsen etcd logs (cas-register)"


def peer_groups(quick: bool) -> tuple[dict[str, bool], dict[str, list[str]]]:
    """The peer suite's expected verdicts, and its files by table row: the Jepsen logs
    as one row, each kv history alone (quick: 10 Jepsen logs, no c50 histories)."""
    with open(PEER / "verdicts.tsv", encoding="utf-8") as f:
        verdicts = {name: flag == "true" for name, flag in list(csv.reader(f, delimiter="\t"))[1:]}
    groups: dict[str, list[str]] = {JEPSEN: []}
    for name in verdicts:
        if name.startswith("jepsen/"):
            groups[JEPSEN].append(name)
        else:
            groups[name] = [name]
    if quick:
        groups[JEPSEN] = groups[JEPSEN][:10]
        groups = {k: v for k, v in groups.items() if "c50" not in k}
    return verdicts, groups


def _peer_rows(quick: bool) -> list[str]:
    verdicts, groups = peer_groups(quick)
    rows = [
        "| peer history | files | operations | expected verdicts met | seconds (1 job) "
        "| seconds (2 jobs) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, names in groups.items():
        ops_total, met = 0, 0
        timings = []
        for jobs in (1, 2):
            t = time.perf_counter()
            met = ops_total = 0
            for name in names:
                reader = read_jepsen_log if name.startswith("jepsen/") else read_edn_kv
                model = "cas-register" if name.startswith("jepsen/") else "kv"
                operations = pair(reader(PEER / name))
                ops_total += len(operations)
                r = wgl.check(model, operations, budget=300, jobs=jobs, parallel_min_ops=0)
                met += r.verdict == ("valid" if verdicts[name] else "invalid")
            timings.append(time.perf_counter() - t)
        rows.append(
            f"| {label} | {len(names)} | {ops_total:,} | {met}/{len(names)} | "
            f"{timings[0]:.2f} | {timings[1]:.2f} |"
        )
    return rows


def _agreement_rows(quick: bool) -> list[str]:
    """The generic search on ledger histories, for scale against the ledger checker."""
    rows = [
        "| ledger history | ops | generic search | ledger checker |",
        "|---|---:|---:|---:|",
    ]
    for n in (200, 1_000) if quick else (200, 1_000, 2_000, 4_000):
        ops = _single(n, 7)
        t = time.perf_counter()
        g = wgl.check("ledger", pair(ops), budget=60, jobs=1)
        gs = time.perf_counter() - t
        t = time.perf_counter()
        f = check_ledgers(ops)
        fs = time.perf_counter() - t
        assert f.verdict == "valid"
        assert g.verdict in ("valid", "unknown")
        generic = f"{gs:.2f} s" if g.verdict == "valid" else f"unknown after {gs:.0f} s"
        rows.append(
            f"| one ledger, 20 readers, 50 adds in flight | {len(ops):,} | {generic} | {fs:.3f} s |"
        )
    return rows


def run(quick: bool) -> str:
    before = os.getloadavg()[0]
    body = _body(quick)
    after = os.getloadavg()[0]
    return (
        f"{body}\n\nLoad average (1 min) at start and end: {before:.1f}, {after:.1f} "
        f"on {os.cpu_count()} cores; other jobs on the machine slow every row alike.\n"
    )


def _body(quick: bool) -> str:
    return "\n".join(
        [
            "Ledger checker (no search). *parse + check*: a fresh process reads the JSON Lines "
            "file, validates it and checks it, on one core (wall clock, and the CPU time it "
            "used, which other jobs on a shared machine disturb less); *check only*: the same "
            "ops from memory. Histories come from `bkref.linearizability.generate` (valid by "
            "construction).",
            "",
            *_ledger_rows(quick),
            "",
            "Generic WGL search on Porcupine's peer histories (expected verdicts from "
            "`tests/data/peer-histories/verdicts.tsv`).",
            "",
            *_peer_rows(quick),
            "",
            "The generic search over `bkref.spec.ledger_model` against the ledger checker, "
            "same histories.",
            "",
            *_agreement_rows(quick),
        ]
    )
