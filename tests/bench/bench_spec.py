"""Model checker throughput: distinct states per second and total time per named config."""

from __future__ import annotations

import os

from spec.checker import check
from spec.configs import CONFIGS

TITLE = "Spec model checker: exhaustive BFS per named config"


def run(quick: bool) -> str:
    names = ["a-short", "b-short", "c-short"] if quick else ["a", "b", "c", "c-workers"]
    rows = [
        "| config | bounds | distinct states | explored | depth | seconds | distinct states/s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        cfg = CONFIGS[name]
        r = check(cfg)
        verdict = "" if r.violation is None else f" (VIOLATION {r.violation})"
        rows.append(
            f"| `{name}`{verdict} | {cfg.bounds()} | {r.distinct:,} | {r.explored:,} | {r.depth} "
            f"| {r.seconds:.1f} | {r.rate:,.0f} |"
        )
    load = os.getloadavg()[0]
    return (
        "\n".join(rows)
        + f"\n\nOne core, pure Python, symmetry over bookies. Load average at the end: {load:.1f} "
        "(the machine is shared, so rates vary).\n"
    )
