"""The test of one spec mutant: `make spec-check`'s verdicts, smallest config first.

    python -m tests.mutation.spec_kill [--only C1,C2] BASELINE.json
    python -m tests.mutation.spec_kill [--only C1,C2] --baseline BASELINE.json

cosmic-ray runs this in a copy of the tree whose ``bkref/spec/protocol.py`` holds one
mutant. It exits 1 (killed) at the first verdict that differs from the unmutated
spec's, 0 (survived) when every verdict is the same. The verdicts, in order:

1. every named config (``bkref.spec.configs.NAMED``, what `make spec-check` checks),
   smallest first by the baseline's distinct states: no invariant violated, and the
   liveness goal of a config that has one holds;
2. every hand-written mutant (``bkref.spec.config.MUTANTS``) is still caught by its
   config, by the invariant tests/spec/test_mutants.py expects.

How the exceptional outcomes count (docs/mutation.md):

- the spec raising at a reachable state (a TypeError, an IndexError): killed, as
  ``crashed``. `make spec-check` fails on it, as TLC reports an error evaluating the
  next-state relation, with the state it happened in;
- a config exploding past its bound (``EXPLOSION`` times its baseline's distinct
  states): not killed. Nothing the checker says fails, so the mutant survives, marked
  ``exploded``; its reachable states differ, so it cannot be judged equivalent;
- the whole run exceeding cosmic-ray's timeout: cosmic-ray records it as killed with
  the output ``timeout``; the report counts those apart and never as kills.

The last line of the output is one JSON object: the verdict, what killed the mutant,
and for a survivor every config whose distinct-state count differs from the baseline's
(the first clue to whether a survivor is equivalent).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

EXPLOSION = 3  # a config may reach this many times its baseline's distinct states


def baseline(path: Path) -> dict[str, dict[str, Any]]:
    """Per named config of the unmutated spec: distinct states, seconds, liveness."""
    data: dict[str, dict[str, Any]] = json.loads(path.read_text())
    return data


def measure_baseline(only: frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
    """Check every named config (or those in ``only``) of the spec as it is (run on the
    unmutated tree)."""
    from bkref.spec.checker import check
    from bkref.spec.configs import NAMED
    from bkref.spec.liveness import check_liveness

    out: dict[str, dict[str, Any]] = {}
    for name, cfg in NAMED.items():
        if only and name not in only:
            continue
        started = time.monotonic()
        r = check(cfg)
        if r.violation is not None or not r.complete:
            raise SystemExit(f"baseline: config {name} is not clean ({r.violation}): fix the spec")
        out[name] = {"distinct": r.distinct}
        if cfg.liveness:
            out[name]["liveness"] = check_liveness(cfg).holds
        out[name]["seconds"] = time.monotonic() - started
        print(f"baseline {name}: {r.distinct:,} states", file=sys.stderr, flush=True)
    return out


def _verdict(base: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from bkref.spec.checker import check
    from bkref.spec.configs import NAMED, mutant_config
    from bkref.spec.liveness import check_liveness
    from tests.spec.test_mutants import CAUGHT_BY

    changed: dict[str, list[int]] = {}
    exploded: list[str] = []
    for name in sorted(base, key=lambda n: base[n]["distinct"]):
        cfg = NAMED[name]
        before = base[name]["distinct"]
        r = check(cfg, max_states=EXPLOSION * before + 1_000)
        print(f"{name}: {r.distinct:,} states (baseline {before:,})", flush=True)
        if r.violation is not None:
            return {"verdict": "killed", "by": f"{name} violates {r.violation}"}
        if r.distinct != before or not r.complete:
            changed[name] = [before, r.distinct]
        if not r.complete:
            exploded.append(name)
            continue
        if cfg.liveness and check_liveness(cfg).holds != base[name].get("liveness"):
            return {"verdict": "killed", "by": f"{name}: liveness <>{cfg.liveness} fails"}
    for mutant, expected in CAUGHT_BY.items():
        cfg = mutant_config(mutant)
        if cfg.name not in base:  # outside --only
            continue
        r = check(cfg, max_states=EXPLOSION * base[cfg.name]["distinct"] + 1_000)
        if r.violation is None and not r.complete:  # not found within the bound: exploded
            exploded.append(f"{cfg.name} with {mutant}")
            continue
        if r.violation != expected:
            return {
                "verdict": "killed",
                "by": f"hand-written mutant {mutant} caught by {r.violation}, not {expected}",
            }
    return {"verdict": "survived", "changed": changed, "exploded": exploded}


def main(argv: list[str]) -> int:
    only: frozenset[str] = frozenset()
    if argv[:1] == ["--only"] and len(argv) > 1:
        only, argv = frozenset(argv[1].split(",")), argv[2:]
    if argv[:1] == ["--baseline"] and len(argv) == 2:
        Path(argv[1]).write_text(json.dumps(measure_baseline(only), indent=1) + "\n")
        return 0
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        verdict = _verdict(baseline(Path(argv[0])))
    except Exception as e:  # the mutated spec raised at a reachable state
        last = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{Path(last.filename).name}:{last.lineno}"
        verdict = {"verdict": "killed", "by": f"crashed: {type(e).__name__}: {e} ({where})"}
    verdict["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(verdict), flush=True)
    return 1 if verdict["verdict"] == "killed" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
