"""The mutants' counterexamples, kept as documented examples in ``bkref/spec/examples/``.

``python -m bkref.spec.examples`` re-runs every mutant's check and rewrites
``bkref/spec/examples/<mutant>.txt``; a test compares each file with a fresh run,
so the examples are always the traces the spec produces today.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bkref.spec.build import require_source
from bkref.spec.checker import Result, check
from bkref.spec.config import MUTANTS
from bkref.spec.configs import MUTANT_CONFIGS, mutant_config
from bkref.spec.invariants import INVARIANTS
from bkref.spec.trace import format_trace

EXAMPLES = Path(__file__).resolve().parent / "examples"


def example_text(mutant: str, result: Result) -> str:
    """The example file's text: the bug, the config, the invariant and the trace."""
    doc = {inv.__name__: inv.__doc__ or "" for inv in INVARIANTS}
    meaning = " ".join(doc.get(result.violation or "", "").split())
    cfg = MUTANT_CONFIGS[mutant]
    return (
        f"Mutant: {mutant}\n"
        f"Bug: {MUTANTS[mutant]}\n"
        f"Config: {cfg.name}: {cfg.description} ({cfg.bounds()})\n"
        f"Caught by: {result.violation}: {meaning}\n"
        f"Shortest trace ({result.depth} steps; found after {result.distinct:,} distinct "
        f"states). Reproduce: bkref spec check --mutant {mutant}\n\n"
        f"{format_trace(result.trace)}\n"
    )


def main() -> int:
    require_source("bkref.spec.examples", [])  # the invariants' docstrings
    EXAMPLES.mkdir(exist_ok=True)
    for mutant in MUTANTS:
        r = check(mutant_config(mutant))
        (EXAMPLES / f"{mutant}.txt").write_text(example_text(mutant, r))
        print(f"{mutant}: {r.violation} in {r.depth} steps, {r.seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
