"""The test of one spec mutant: `make spec-check`'s verdicts, smallest config first.

    python -m tests.mutation.spec_kill BASELINE.json
    python -m tests.mutation.spec_kill --baseline BASELINE.json [--only C1,C2]
        [--measure bkref/spec/protocol.py,...] [--jobs N]

cosmic-ray runs this in a copy of the tree whose ``bkref/spec/protocol.py`` holds one
mutant. It exits 1 (killed) at the first verdict that differs from the unmutated
spec's, 0 (survived) when every verdict is the same. Only the configs whose check
executed a statement the mutant changed are run (tests/mutation/selection.py: the
others cannot see it); the baseline records those lines, under coverage.py, one
config per process. The verdicts, in order:

1. every named config (``bkref.spec.configs.NAMED``, what `make spec-check` checks),
   smallest first by the baseline's distinct states: no invariant violated, and the
   liveness goal of a config that has one holds;
2. `make spec-check`'s coverage conditions over every config (``bkref.spec.coverage``):
   each branch of an action the unmutated spec reaches is still reached by some config
   (or its line says why not), and each pair of metadata writers still races and still
   with an effect. A mutant that only takes behaviour away (a guard that refuses more)
   breaks no invariant; spec-check fails on the branch or race it leaves unreached;
3. every hand-written mutant (``bkref.spec.config.MUTANTS``) is still caught by its
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

import argparse
import json
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.mutation import selection

if TYPE_CHECKING:
    from bkref.spec.coverage import ConfigCoverage

EXPLOSION = 3  # a config may reach this many times its baseline's distinct states
MEASURED = "bkref/spec/protocol.py"  # the modules whose lines the baseline records


def baseline(path: Path) -> dict[str, Any]:
    """The unmutated spec's verdicts and lines: ``configs`` (per named config: distinct
    states, liveness, seconds, lines per module), ``mutants`` (per hand-written mutant:
    lines per module) and ``sources`` (each measured module as it was)."""
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _reach(cov: ConfigCoverage) -> dict[str, list[str]]:
    """What spec-check's coverage conditions read of one config's check: the branches it
    reached (``action#k``, the k-th return of the action: line numbers move with a
    mutant that removes a line), the pairs of writers that raced, and those whose race
    had an effect (``a/b``, either direction)."""
    keys = {line: key for key, (line, _reason) in _branches().items()}
    return {
        "branches": sorted(keys[line] for line in cov.reached if line in keys),
        "races": sorted({"/".join(sorted(p)) for p, n in cov.races.items() if n}),
        "effects": sorted({"/".join(sorted(p)) for p, n in cov.effects.items() if n}),
    }


def _branches() -> dict[str, tuple[int, str | None]]:
    """Per branch of the spec in this tree, ``action#k`` (its place among its action's
    returns): its line and why no config reaches it, if its line says."""
    from bkref.spec.coverage import branches

    out: dict[str, tuple[int, str | None]] = {}
    seen: dict[str, int] = {}
    for b in branches():
        k = seen[b.action] = seen.get(b.action, -1) + 1
        out[f"{b.action}#{k}"] = (b.line, b.reason)
    return out


def _measure_config(name: str, modules: tuple[str, ...]) -> dict[str, Any]:
    from bkref.spec.configs import NAMED
    from bkref.spec.coverage import ViolationError, measure
    from bkref.spec.liveness import check_liveness

    cfg = NAMED[name]

    def verdicts() -> dict[str, Any]:
        try:
            cov = measure(cfg)
        except ViolationError as e:
            raise SystemExit(f"baseline: config {name} is not clean ({e}): fix the spec") from e
        out: dict[str, Any] = {"distinct": cov.distinct, "reach": _reach(cov)}
        if cfg.liveness:
            out["liveness"] = check_liveness(cfg).holds
        return out

    started = time.monotonic()
    out, lines = selection.measure(selection.tree(), modules, verdicts)
    out["seconds"] = round(time.monotonic() - started, 1)  # under coverage's tracer
    out["lines"] = lines
    print(f"baseline {name}: {out['distinct']:,} states", file=sys.stderr, flush=True)
    return out


def _measure_mutant(mutant: str, modules: tuple[str, ...]) -> dict[str, Any]:
    from bkref.spec.checker import check
    from bkref.spec.configs import mutant_config

    _r, lines = selection.measure(selection.tree(), modules, lambda: check(mutant_config(mutant)))
    return {"lines": lines}


def measure_baseline(
    only: frozenset[str] = frozenset(), modules: tuple[str, ...] = (MEASURED,), jobs: int = 1
) -> dict[str, Any]:
    """Check every named config (or those in ``only``) and every hand-written mutant
    of those configs on the spec as it is (run on the unmutated tree), recording the
    lines of ``modules`` each check executed."""
    # What the import executed (module code, and function bodies a module calls as it
    # is built) every config executed: measured before the checks fork from here.
    at_import = selection.measure_import(selection.tree(), modules)
    from bkref.spec.configs import MUTANT_CONFIGS, NAMED
    from tests.spec.test_mutants import CAUGHT_BY

    names = [n for n in NAMED if not only or n in only]
    mutants = [m for m in CAUGHT_BY if MUTANT_CONFIGS[m].name in names]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        configs = {n: pool.submit(_measure_config, n, modules) for n in names}
        marked = {m: pool.submit(_measure_mutant, m, modules) for m in mutants}
        return {
            "configs": {n: f.result() for n, f in configs.items()},
            "mutants": {m: f.result() for m, f in marked.items()},
            "sources": {m: (selection.tree() / m).read_text() for m in modules},
            "import": at_import,
        }


def _unreached(base: dict[str, Any], reach: dict[str, dict[str, list[str]]]) -> str | None:
    """The first coverage condition of spec-check the mutant breaks, over every config:
    ``reach`` holds what the configs that ran reached (an exploded one keeps its
    baseline's: its check stopped early), the baseline what every other did."""
    configs: dict[str, dict[str, Any]] = base["configs"]
    now = {n: reach.get(n, c["reach"]) for n, c in configs.items()}
    reasons = {key: reason for key, (_line, reason) in _branches().items()}
    for kind, what in (
        ("branches", "no config reaches the branch {} now"),
        ("races", "no config has {} racing now"),
        ("effects", "no config has a race of {} with an effect now"),
    ):
        before = {x for c in configs.values() for x in c["reach"][kind]}
        after = {x for r in now.values() for x in r[kind]}
        for x in sorted(before - after):
            if kind == "branches" and reasons.get(x) is not None:
                continue  # its line says why no config reaches it: spec-check accepts that
            return what.format(x)
    return None


def _verdict(base: dict[str, Any]) -> dict[str, Any]:
    from bkref.spec.checker import check
    from bkref.spec.configs import NAMED, mutant_config
    from bkref.spec.coverage import ViolationError, measure
    from bkref.spec.liveness import check_liveness
    from tests.spec.test_mutants import CAUGHT_BY

    module, stmts, why = selection.selected(base, selection.tree())
    at_import = base["import"]
    configs: dict[str, dict[str, Any]] = base["configs"]
    ran: list[str] = []
    changed: dict[str, list[int]] = {}
    exploded: list[str] = []
    reach: dict[str, dict[str, list[str]]] = {}
    for name in sorted(configs, key=lambda n: configs[n]["distinct"]):
        if not selection.runs(configs[name]["lines"], at_import, module, stmts):
            continue
        ran.append(name)
        cfg = NAMED[name]
        before = configs[name]["distinct"]
        try:
            cov = measure(cfg, max_states=EXPLOSION * before + 1_000)
        except ViolationError as e:
            return {"verdict": "killed", "by": f"{name} violates {e.violation}"}
        print(f"{name}: {cov.distinct:,} states (baseline {before:,})", flush=True)
        if cov.distinct != before or not cov.complete:
            changed[name] = [before, cov.distinct]
        if not cov.complete:
            exploded.append(name)
            continue
        reach[name] = _reach(cov)
        if cfg.liveness and check_liveness(cfg).holds != configs[name].get("liveness"):
            return {"verdict": "killed", "by": f"{name}: liveness <>{cfg.liveness} fails"}
    lost = _unreached(base, reach)
    if lost is not None:
        return {"verdict": "killed", "by": f"spec-check's coverage: {lost}"}
    for mutant, expected in CAUGHT_BY.items():
        if mutant not in base["mutants"]:  # its config is outside --only
            continue
        if not selection.runs(base["mutants"][mutant]["lines"], at_import, module, stmts):
            continue
        cfg = mutant_config(mutant)
        ran.append(f"{cfg.name} with {mutant}")
        r = check(cfg, max_states=EXPLOSION * configs[cfg.name]["distinct"] + 1_000)
        if r.violation is None and not r.complete:  # not found within the bound: exploded
            exploded.append(f"{cfg.name} with {mutant}")
            continue
        if r.violation != expected:
            return {
                "verdict": "killed",
                "by": f"hand-written mutant {mutant} caught by {r.violation}, not {expected}",
            }
    return {
        "verdict": "survived",
        "changed": changed,
        "exploded": exploded,
        "ran": ran,
        "selected": why,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.mutation.spec_kill", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("file", nargs="?", type=Path, help="the baseline to judge the tree against")
    p.add_argument("--baseline", type=Path, help="measure the unmutated tree into this file")
    p.add_argument("--only", default="", help="named configs to measure (default: all)")
    p.add_argument("--measure", default=MEASURED, help="modules whose lines to record")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="configs at once")
    args = p.parse_args(argv)
    if args.baseline is not None:
        only = frozenset(c for c in args.only.split(",") if c)
        modules = tuple(m for m in args.measure.split(",") if m)
        measured = measure_baseline(only, modules, max(1, args.jobs))
        args.baseline.write_text(json.dumps(measured, indent=1) + "\n")
        return 0
    if args.file is None:
        p.error("give a baseline file, or --baseline FILE to measure one")
    started = time.monotonic()
    try:
        verdict = _verdict(baseline(args.file))
    except Exception as e:  # the mutated spec raised at a reachable state
        last = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{Path(last.filename).name}:{last.lineno}"
        verdict = {"verdict": "killed", "by": f"crashed: {type(e).__name__}: {e} ({where})"}
    verdict["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(verdict), flush=True)
    return 1 if verdict["verdict"] == "killed" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
