"""Model checker: time, memory and bytes per distinct state, whole states against fingerprints.

Each check runs in a forked child, so that its peak resident memory is its own:
bytes per distinct state are (peak - the child's memory before the check) /
distinct states. Whole states: the visited set holds every canonical state.
Fingerprints (``--fingerprints``): it holds 64-bit fingerprints, and BFS
layers wait on disk.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
from dataclasses import dataclass
from multiprocessing.connection import Connection

from bkref.spec.checker import check, rss_bytes
from bkref.spec.config import Config
from bkref.spec.configs import CONFIGS

TITLE = "Spec model checker: exhaustive BFS per named config"

WORKERS = 2  # processes expanding each large BFS layer (the result is the same for any number)
# Fingerprints are measured in one process: with forked workers, the batch of a layer being
# expanded and its successors add a constant (~100 MiB) that hides the cost per state.
FP_WORKERS = 1


@dataclass
class _Run:
    distinct: int
    explored: int
    depth: int
    seconds: float
    cpu: float
    before: int  # resident bytes before the check
    peak: int  # peak resident bytes of the checker's process
    collision: float
    violation: str | None

    @property
    def per_state(self) -> float:
        return max(0, self.peak - self.before) / max(1, self.distinct)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _child(cfg: Config, fingerprints: bool, out: Connection) -> None:
    before = rss_bytes()
    cpu = _cpu()
    r = check(cfg, workers=FP_WORKERS if fingerprints else WORKERS, fingerprints=fingerprints)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.send(
        _Run(
            r.distinct,
            r.explored,
            r.depth,
            r.seconds,
            _cpu() - cpu,
            before,
            peak,
            r.collision_probability,
            r.violation,
        )
    )


def measure(cfg: Config, fingerprints: bool) -> _Run:
    """One check of ``cfg`` in a forked child (a fresh peak RSS)."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(cfg, fingerprints, send))
    p.start()
    run: _Run = recv.recv()
    p.join()
    return run


def run(quick: bool) -> str:
    names = ["a-short", "b-short", "c"] if quick else ["a", "b", "c", "c-workers", "c-race"]
    rows = [
        "| config | bounds | distinct states | explored | depth | seconds | CPU s | peak MiB "
        "| bytes/state | seconds, fingerprints | peak MiB, fingerprints "
        "| bytes/state, fingerprints | collision probability | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        cfg = CONFIGS[name]
        whole = measure(cfg, fingerprints=False)
        fp = measure(cfg, fingerprints=True)
        verdict = "" if whole.violation is None else f" (VIOLATION {whole.violation})"
        rows.append(
            f"| `{name}`{verdict} | {cfg.bounds()} | {whole.distinct:,} | {whole.explored:,} "
            f"| {whole.depth} | {whole.seconds:.1f} | {whole.cpu:.1f} | {whole.peak / 2**20:,.0f} "
            f"| {whole.per_state:,.0f} | {fp.seconds:.1f} | {fp.peak / 2**20:,.0f} "
            f"| {fp.per_state:,.0f} | {fp.collision:.1e} | {os.getloadavg()[0]:.1f} |"
        )
    return (
        "\n".join(rows)
        + f"\n\nPure Python, symmetry over bookies, `--workers {WORKERS}` (layers of 4,000 states "
        "or more are expanded by forked processes; same result as one process); the "
        f"fingerprint columns with `--workers {FP_WORKERS}` (see bench_spec.py). Each check "
        "runs in a forked child: peak MiB is its peak resident memory, bytes/state the growth "
        "from its memory before the check over the distinct states (the visited set, the "
        "parent pointers and the BFS layers in memory). With fingerprints the visited set "
        "holds a 64-bit fingerprint per state and layers wait on disk; the collision "
        "probability is the birthday estimate n^2 / 2^65 for uniform fingerprints. CPU "
        "seconds add the checker's and its workers'; load is the 1-minute load average after "
        "each config: the machine is shared, so seconds vary with it.\n"
    )
