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
   config, by the invariant tests/spec/test_mutants.py expects, with the trace its
   example (``bkref/spec/examples/``) documents: a mutant that changes a trace's
   steps, or how a trace names them, fails that test. The number of states the search
   took is left out: a reduction that merges fewer states changes it, and no step;
4. what else `make verify` holds the spec to: the spec's own tests (``SUITE``: each
   step's meaning, shown on the reachable states of a config), the traces of real runs
   that it must explain (tests/tracecheck/test_soak_ledgers.py), and the refinement
   machine (`bkref refine`, bkref's components driven by the spec's steps: a step whose
   result the mutant changed no longer matches bkref's, which follows BookKeeper's).
   The tests that compare a generated page or example with the source are left out:
   they fail on any edit of the source, a mutant's or not.

How the exceptional outcomes count (docs/mutation.md):

- the spec raising at a reachable state (a TypeError, an IndexError): killed, as
  ``crashed``. `make spec-check` fails on it, as TLC reports an error evaluating the
  next-state relation, with the state it happened in;
- a config exploding past its bound (``EXPLOSION`` times its baseline's distinct
  states, at least ``EXPLOSION_FLOOR``): not killed. Nothing the checker says fails,
  so the mutant survives, marked ``exploded``; its reachable states differ, so it
  cannot be judged equivalent;
- the whole run exceeding cosmic-ray's timeout: cosmic-ray records it as killed with
  the output ``timeout``; the report counts those apart and never as kills;
- a spec test passing pytest-timeout's limit (300 s of wall time): ``timeout`` as
  well, not a kill. The test would fail `make verify`, but so would a busy machine's,
  and a kill must say the mutant was wrong.

The last line of the output is one JSON object: the verdict, what killed the mutant,
and for a survivor every config whose distinct-state count differs from the baseline's
(the first clue to whether a survivor is equivalent).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
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
# ... or this many, if more: a small config that grows a few times over is still searched
# whole (seconds), so that its liveness goal is judged (a recovery that never learns its
# write-backs landed: a-short grows from 2,592 states to 25,328 and never closes).
EXPLOSION_FLOOR = 50_000


def _bound(distinct: int) -> int:
    """The states a config's search may reach before it counts as exploded."""
    return max(EXPLOSION * distinct + 1_000, EXPLOSION_FLOOR)


MEASURED = "bkref/spec/protocol.py"  # the modules whose lines the baseline records
# Verdict 4: test files, the tests of them that compare generated text with the source,
# and the refinement machine's configs and examples (seeded: the run is the same each
# time up to the first step the mutant changes).
SUITE = [
    "tests/spec/test_protocol.py",
    "tests/spec/test_guards.py",
    "tests/spec/test_quorum.py",
    "tests/spec/test_checker.py",
    "tests/spec/test_reduction.py",
    "tests/spec/test_liveness.py",
    "tests/spec/test_coverage.py",
    "tests/spec/test_docs_and_cli.py",
    "tests/spec/test_open_ledgers.py",
    "tests/spec/test_earlier_scan.py",
    "tests/spec/test_earlier_view.py",
    "tests/spec/test_failed_repair.py",
    "tests/spec/test_give_up.py",
    "tests/spec/test_lock_loss.py",
    "tests/spec/test_session_loss.py",
    "tests/spec/test_labels.py",
    "tests/spec/test_typeok.py",
    "tests/tracecheck/test_soak_ledgers.py",
]
NOT_BEHAVIOUR = [
    "tests/spec/test_coverage.py::test_the_coverage_page_lists_every_branch_and_race_of_the_spec_as_it_is",
    "tests/spec/test_docs_and_cli.py::test_docs_spec_md_is_regenerated_from_the_docstrings",
]
REFINE = ("a-short,b-short,a-readers,c-short,c-workers", "40")


def baseline(path: Path) -> dict[str, Any]:
    """The unmutated spec's verdicts and lines: ``configs`` (per named config: distinct
    states, liveness, seconds, lines per module), ``mutants`` (per hand-written mutant:
    lines per module) and ``sources`` (each measured module as it was)."""
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _reach(cov: ConfigCoverage) -> dict[str, list[str]]:
    """What spec-check's coverage conditions read of one config's check: the branches it
    reached (``action#k``, the k-th return of the action: line numbers move with a
    mutant that removes a line), the pairs of writers that raced, those whose race
    had an effect (``a/b``, either direction), and the budgets spent to 0."""
    keys = {line: key for key, (line, _reason) in _branches().items()}
    return {
        "branches": sorted(keys[line] for line in cov.reached if line in keys),
        "races": sorted({"/".join(sorted(p)) for p, n in cov.races.items() if n}),
        "effects": sorted({"/".join(sorted(p)) for p, n in cov.effects.items() if n}),
        "bounds": sorted(cov.spent),
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


def _measure_suite(path: str, modules: tuple[str, ...]) -> dict[str, Any]:
    import pytest

    argv = ["-q", "-p", "no:cacheprovider", *(f"--deselect={t}" for t in NOT_BEHAVIOUR), path]
    status, lines = selection.measure(selection.tree(), modules, lambda: pytest.main(argv))
    if status != 0:
        raise SystemExit(f"baseline: {path} fails on the unmutated spec (exit {status})")
    return {"lines": lines}


def _refine_argv(config: str) -> list[str]:
    return ["refine", "--config", config, "--examples", REFINE[1], "--seed", "0"]


def _measure_refine(config: str, modules: tuple[str, ...]) -> dict[str, Any]:
    from bkref.impl.cli.main import main as bkref_main

    argv = _refine_argv(config)
    status, lines = selection.measure(selection.tree(), modules, lambda: bkref_main(argv))
    if status != 0:
        raise SystemExit(f"baseline: bkref refine --config {config} exits {status} unmutated")
    return {"lines": lines}


def measure_baseline(
    only: frozenset[str] = frozenset(),
    modules: tuple[str, ...] = (MEASURED,),
    jobs: int = 1,
    suite: tuple[str, ...] = tuple(SUITE),
    refine: tuple[str, ...] = tuple(REFINE[0].split(",")),
) -> dict[str, Any]:
    """Check every named config (or those in ``only``) and every hand-written mutant
    of those configs on the spec as it is (run on the unmutated tree), run the test
    files of ``suite`` and the refinement configs of ``refine``, recording the lines of
    ``modules`` each executed."""
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
        tests = {t: pool.submit(_measure_suite, t, modules) for t in suite}
        machine = {c: pool.submit(_measure_refine, c, modules) for c in refine}
        return {
            "configs": {n: f.result() for n, f in configs.items()},
            "mutants": {m: f.result() for m, f in marked.items()},
            "suite": {t: f.result() for t, f in tests.items()},
            "refine": {c: f.result() for c, f in machine.items()},
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
        ("bounds", "no config spends its budget of {} to 0 now"),
    ):
        before = {x for c in configs.values() for x in c["reach"].get(kind, ())}
        after = {x for r in now.values() for x in r.get(kind, ())}
        for x in sorted(before - after):
            if kind == "branches" and reasons.get(x) is not None:
                continue  # its line says why no config reaches it: spec-check accepts that
            return what.format(x)
    return None


def _trace_of(example: str) -> str:
    """A documented example without the number of states its search took: a reduction
    that merges fewer states changes that number and no step of the trace."""
    return re.sub(r"found after [\d,]+ distinct states", "found after N distinct states", example)


def _verdict(base: dict[str, Any]) -> dict[str, Any]:
    from bkref.spec.checker import check
    from bkref.spec.configs import NAMED, mutant_config
    from bkref.spec.coverage import ViolationError, measure
    from bkref.spec.examples import EXAMPLES, example_text
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
            cov = measure(cfg, max_states=_bound(before))
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
        r = check(cfg, max_states=_bound(configs[cfg.name]["distinct"]))
        if r.violation is None and not r.complete:  # not found within the bound: exploded
            exploded.append(f"{cfg.name} with {mutant}")
            continue
        if r.violation != expected:
            return {
                "verdict": "killed",
                "by": f"hand-written mutant {mutant} caught by {r.violation}, not {expected}",
            }
        if _trace_of(example_text(mutant, r)) != _trace_of(
            (EXAMPLES / f"{mutant}.txt").read_text()
        ):
            return {"verdict": "killed", "by": f"hand-written mutant {mutant}: its trace differs"}

    def runs(stage: dict[str, Any]) -> bool:
        return selection.runs(stage["lines"], at_import, module, stmts)

    suite = [t for t, v in base.get("suite", {}).items() if runs(v)]
    if suite:
        ran += suite
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
            + [f"--deselect={t}" for t in NOT_BEHAVIOUR]
            + suite,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode in (1, 2):  # failed, or a module did not even collect
            failed = [ln for ln in done.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
            if "from pytest-timeout" in done.stdout:  # slow, or a slow machine: not a kill
                why = "; ".join(failed[:1])[:250]
                return {"verdict": "timeout", "by": f"spec tests: {why}: past pytest-timeout"}
            return {"verdict": "killed", "by": "spec tests: " + "; ".join(failed[:2])[:300]}
        if done.returncode != 0:  # pytest's own error, a usage error, no tests
            tail = " ".join(done.stdout.strip().splitlines()[-1:])[:300]
            return {"verdict": "error", "by": f"pytest exit {done.returncode}: {tail}"}
    machine = [c for c, v in base.get("refine", {}).items() if runs(v)]
    if machine:
        ran += [f"bkref refine --config {c}" for c in machine]
        done = subprocess.run(
            [sys.executable, "-m", "bkref.impl.cli.main", *_refine_argv(",".join(machine))],
            capture_output=True,
            text=True,
            check=False,
        )
        last = " ".join((done.stdout + done.stderr).strip().splitlines()[-1:])[:300]
        if done.returncode == 1:  # bkref's step differs from the mutated spec's, or it raised
            return {"verdict": "killed", "by": "bkref refine: " + last}
        if done.returncode != 0:  # 2: it could not run (no ZooKeeper, say)
            return {"verdict": "error", "by": f"bkref refine exit {done.returncode}: {last}"}
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
    p.add_argument(
        "--suite",
        help="test files of verdict 4, comma-separated (default: SUITE; none with --only)",
    )
    p.add_argument("--refine", help=f"refinement configs (default: {REFINE[0]}; none with --only)")
    args = p.parse_args(argv)
    if args.baseline is not None:
        only = frozenset(c for c in args.only.split(",") if c)
        modules = tuple(m for m in args.measure.split(",") if m)
        suite = SUITE if args.suite is None and not only else (args.suite or "").split(",")
        refine = REFINE[0] if args.refine is None and not only else args.refine or ""
        measured = measure_baseline(
            only,
            modules,
            max(1, args.jobs),
            tuple(t for t in suite if t),
            tuple(c for c in refine.split(",") if c),
        )
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
    return {"killed": 1, "survived": 0}.get(verdict["verdict"], 2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
