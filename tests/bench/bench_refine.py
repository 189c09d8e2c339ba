"""The refinement machine's speed: spec steps per second against bkref, and where time goes."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from kazoo.client import KazooClient

from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble
from bkref.refine.bkref_driver import BkrefDriver
from bkref.refine.machine import run as refine
from bkref.spec.configs import CONFIGS, MUTANT_CONFIGS

TITLE = "Refinement machine: bkref held against the spec (real ZooKeeper, real storage)"

PARTS = ("setup", "implementation", "abstraction", "comparison", "spec")
NAMED = {**CONFIGS, **{c.name: c for c in MUTANT_CONFIGS.values()}}


def _fsync_rate(directory: Path, n: int) -> float:
    """Baseline: fdatasyncs per second of a small append on this disk."""
    path = directory / "fsync-baseline"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            os.write(fd, b"x" * 64)
            os.fdatasync(fd)
        return n / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def _zk_rate(zk: KazooClient, n: int) -> float:
    """Baseline: ZooKeeper reads (one round trip each) per second."""
    zk.ensure_path("/bench-refine")
    t0 = time.perf_counter()
    for _ in range(n):
        zk.get("/bench-refine")
    return n / (time.perf_counter() - t0)


def run(quick: bool) -> str:
    names = ["a-short"] if quick else ["a-short", "b-short", "a-dup", "m-journal", "c-short", "c"]
    examples = 20 if quick else 500
    with tempfile.TemporaryDirectory(prefix="bkref-bench-refine-") as tmp:
        ensemble = ZooKeeperEnsemble(directory=Path(tmp) / "zk", size=1)
        ensemble.start()
        zk = KazooClient(hosts=ensemble.connection_string)
        zk.start(timeout=15)
        try:
            fsyncs = _fsync_rate(Path(tmp), 50 if quick else 500)
            reads = _zk_rate(zk, 50 if quick else 1000)
            rows = [
                "| config | examples | spec steps | distinct abstract states | seconds "
                "| steps/s | " + " | ".join(PARTS) + " | Hypothesis and the rest |",
                "|---|---:|---:|---:|---:|---:|" + "---:|" * (len(PARTS) + 1),
            ]
            for name in names:
                t0 = time.monotonic()
                stats, found = refine(
                    NAMED[name], lambda: BkrefDriver(zk), examples=examples, seed=0
                )
                took = time.monotonic() - t0
                verdict = "" if found is None else " (COUNTEREXAMPLE)"
                shares = [100 * stats.seconds[p] / took for p in PARTS]
                rest = max(0.0, 100 - sum(shares))
                rows.append(
                    f"| `{name}`{verdict} | {stats.examples:,} | {stats.steps:,} "
                    f"| {len(stats.states):,} | {took:.1f} | {stats.steps / took:,.0f} | "
                    + " | ".join(f"{x:.0f}%" for x in shares)
                    + f" | {rest:.0f}% |"
                )
        finally:
            zk.stop()
            zk.close()
            ensemble.stop()
    return (
        "\n".join(rows)
        + f"\n\nBaselines measured in the same run: {fsyncs:,.0f} fdatasyncs/s of a 64-byte "
        f"append in the temp directory, {reads:,.0f} ZooKeeper reads/s (one round trip each, "
        "one client). Seed 0. Per example the driver builds a fresh system (a root znode, "
        "one storage directory per bookie, each opened with a checkpoint) and removes it: "
        "that is `setup`. `implementation` is the spec steps taken on the cores and storage "
        "(each add and fence waits for its journal fsync), `abstraction` reading the state "
        "back (one ZooKeeper read per ledger and step), `comparison` the projection, "
        "invariants and equality, `spec` computing the enabled steps. With AutoRecovery "
        "(`c-short`, `c`) a step also reads each ledger's task and lock, the votes and the "
        "switch (the abstraction's share doubles), the setup writes the closed ledger "
        "through the bookies and registers them, and a worker's turn performs its ZooKeeper "
        "reads and writes and its copies.\n"
    )
