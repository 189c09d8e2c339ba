"""Model checker throughput: distinct states per second and total time per named config."""

from __future__ import annotations

import os

from spec.checker import check
from spec.configs import CONFIGS

TITLE = "Spec model checker: exhaustive BFS per named config"

WORKERS = 2  # processes expanding each large BFS layer (the result is the same for any number)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run(quick: bool) -> str:
    names = ["a-short", "b-short", "c-short"] if quick else ["a", "b", "c", "c-workers"]
    rows = [
        "| config | bounds | distinct states | explored | depth | seconds | distinct states/s "
        "| CPU seconds | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        cfg = CONFIGS[name]
        cpu = _cpu()
        r = check(cfg, workers=WORKERS)
        cpu = _cpu() - cpu
        verdict = "" if r.violation is None else f" (VIOLATION {r.violation})"
        rows.append(
            f"| `{name}`{verdict} | {cfg.bounds()} | {r.distinct:,} | {r.explored:,} | {r.depth} "
            f"| {r.seconds:.1f} | {r.rate:,.0f} | {cpu:.1f} | {os.getloadavg()[0]:.1f} |"
        )
    return (
        "\n".join(rows)
        + f"\n\nPure Python, symmetry over bookies, `--workers {WORKERS}` (layers of 4,000 states "
        "or more are expanded by forked processes; same result as one process). CPU seconds "
        "add the checker's and its workers'; load is the 1-minute load average after each "
        "config: the machine is shared, so seconds and rates vary with it, CPU seconds much less.\n"
    )
