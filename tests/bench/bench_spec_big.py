"""The configs too big for `make spec-check` (``BIG_CONFIGS``), checked with fingerprints."""

from __future__ import annotations

from bkref.spec.configs import BIG_CONFIGS, CONFIGS
from tests.bench.bench_spec import measure

TITLE = "Spec model checker: the big configs, with fingerprints"


def run(quick: bool) -> str:
    configs = {"c": CONFIGS["c"]} if quick else BIG_CONFIGS  # quick: 19k states
    rows = [
        "| config | bounds | distinct states | explored | depth | seconds | peak MiB "
        "| bytes/state | collision probability |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, cfg in configs.items():
        r = measure(cfg, fingerprints=True)
        rows.append(
            f"| `{name}` | {cfg.bounds()} | {r.distinct:,} | {r.explored:,} | {r.depth} "
            f"| {r.seconds:.1f} | {r.peak / 2**20:,.0f} | {r.per_state:,.0f} "
            f"| {r.collision:.1e} |"
        )
    return (
        "\n".join(rows)
        + "\n\nFingerprints, one process (`make spec-big` uses `--workers 2`), each in a "
        "forked child, measured as in the section above.\n"
    )
