"""The test of one mutant of the protocol core (bkref/impl/core): its tests, then the
refinement machine.

    python -m tests.mutation.core_kill BASELINE.json [--configs A,B] [--examples N]
    python -m tests.mutation.core_kill --baseline BASELINE.json [--configs A,B]
        [--examples N] [--jobs N]

cosmic-ray runs this in a copy of the tree holding one mutant. Exit 1 (killed) when a
test of the core fails, or when `bkref refine` (bkref's bookies, writer, recovery and
AutoRecovery held to the spec step by step, on a ZooKeeper it starts itself) finds a
difference or the mutated core raises (its exit 1); 0 (survived) when everything
passes. When the machine cannot run at all (its exit 2) the verdict is "error",
counted apart from kills (tests/mutation/score.py). The tests come first: they take
seconds and kill most mutants; the machine runs only for what they let through.

Test selection, as for the spec (tests/mutation/selection.py): the baseline records,
under coverage.py, the lines of bkref/impl/core each test file and each refinement
config executed on the unmutated core, one per process; a mutant runs only the test
files and configs that executed a statement it changed. The refinement runs are
seeded (seed 0), so the unmutated run is the one the baseline measured up to the
first step the mutant changes. An error here can only run too much or leave a kill
unfound (the score errs low), never make a survivor look killed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tests.mutation import selection

# The core's own tests: no servers, seconds each (tests/impl).
CORE_TESTS = [
    "tests/impl/test_quorum_digest.py",
    "tests/impl/test_frames.py",
    "tests/impl/test_bookie_core.py",
    "tests/impl/test_writer_recovery.py",
    "tests/impl/test_two_recoveries.py",
    "tests/impl/test_reads.py",
    "tests/impl/test_repair.py",
    "tests/impl/test_autorecovery_auditor_core.py",
    "tests/impl/test_autorecovery_worker_core.py",
    "tests/impl/test_storage.py",
    "tests/impl/test_crashdisk.py",
    "tests/impl/test_clock.py",
    "tests/impl/test_writer_metadata.py",
    "tests/impl/test_recovery_events.py",
    "tests/impl/test_metadata_format.py",
    "tests/impl/test_core_values.py",
    "tests/impl/test_worker_core_rounds.py",
]
# Configs of the refinement machine that exercise every core module: writes and
# recovery (a-short, b-short), reads (a-readers), AutoRecovery (c-short, c-workers).
REFINE_CONFIGS = "a-short,b-short,a-readers,c-short,c-workers"
REFINE_EXAMPLES = "40"
CORE = "bkref/impl/core"


def _core_modules(tree: Path) -> tuple[str, ...]:
    return tuple(str(p.relative_to(tree)) for p in sorted((tree / CORE).glob("*.py")))


def _refine_argv(configs: str, examples: str) -> list[str]:
    return ["refine", "--config", configs, "--examples", examples, "--seed", "0"]


def _measure_tests(path: str, modules: tuple[str, ...]) -> dict[str, Any]:
    import pytest

    argv = ["-q", "-p", "no:cacheprovider", path]
    status, lines = selection.measure(selection.tree(), modules, lambda: pytest.main(argv))
    if status != 0:
        raise SystemExit(f"baseline: {path} fails on the unmutated core (exit {status})")
    return {"lines": lines}


def _measure_config(name: str, examples: str, modules: tuple[str, ...]) -> dict[str, Any]:
    from bkref.impl.cli.main import main as bkref_main

    argv = _refine_argv(name, examples)
    started = time.monotonic()
    status, lines = selection.measure(selection.tree(), modules, lambda: bkref_main(argv))
    if status != 0:
        raise SystemExit(f"baseline: bkref refine --config {name} exits {status} unmutated")
    return {"lines": lines, "seconds": round(time.monotonic() - started, 1)}


def measure_baseline(
    configs: list[str], examples: str, jobs: int, test_files: list[str]
) -> dict[str, Any]:
    """Run the core test files and refinement configs on the core as it is, recording
    the lines of bkref/impl/core each executed."""
    modules = _core_modules(selection.tree())
    # What importing the core executed, every stage executed: measured here, before the
    # stages fork from this process (a worker process runs several stages).
    at_import = selection.measure_import(selection.tree(), modules)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        tests = {t: pool.submit(_measure_tests, t, modules) for t in test_files}
        refine = {c: pool.submit(_measure_config, c, examples, modules) for c in configs}
        return {
            "tests": {t: f.result() for t, f in tests.items()},
            "configs": {c: f.result() for c, f in refine.items()},
            "examples": examples,
            "sources": {m: (selection.tree() / m).read_text() for m in modules},
            "import": at_import,
        }


def _verdict(
    base: dict[str, Any] | None, configs: list[str], examples: str, test_files: list[str]
) -> dict[str, Any]:
    if base is None:
        module, stmts, why = "", selection.ALL, "no baseline: every test and config"
    else:
        module, stmts, why = selection.selected(base, selection.tree())

    def runs(stage: dict[str, Any]) -> bool:
        return selection.runs(stage["lines"], base["import"] if base else {}, module, stmts)

    tests = [t for t in test_files if base is None or runs(base["tests"][t])]
    refine = [c for c in configs if base is None or runs(base["configs"][c])]
    ran = tests + refine
    if tests:
        # A mutant may make a test loop (a CAS that never lands, retried forever). The
        # signal method of pytest-timeout raises inside the test, where Hypothesis takes it
        # for a failure to shrink and runs the loop again; the thread method ends pytest
        # (exit 1) once one test passed the timeout: a hang is a failed test.
        argv = ["-x", "-q", "-p", "no:cacheprovider", "--timeout-method=thread", *tests]
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *argv], capture_output=True, text=True, check=False
        )
        if done.returncode in (1, 2):  # failed, or a module did not even collect
            failed = [ln for ln in done.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
            if not failed and "Timeout" in done.stdout + done.stderr:
                failed = ["a test passed pytest-timeout's limit (it hung)"]
            return {"verdict": "killed", "by": "core tests: " + "; ".join(failed[:2])[:300]}
        if done.returncode == 4 and "ImportError while loading conftest" in done.stderr:
            # The conftest imports the core: the mutated core raised as it was imported (a
            # module-level `A | B` made `A * B`), so every test fails.
            where = " ".join(done.stderr.strip().splitlines()[-1:])[:200]
            return {"verdict": "killed", "by": f"core tests: the core does not import: {where}"}
        if done.returncode != 0:  # pytest's own error, a usage error, no tests
            tail = " ".join(done.stdout.strip().splitlines()[-1:])[:300]
            return {"verdict": "error", "by": f"pytest exit {done.returncode}: {tail}"}
    if refine:
        argv = _refine_argv(",".join(refine), examples)
        done = subprocess.run(
            [sys.executable, "-m", "bkref.impl.cli.main", *argv],
            capture_output=True,
            text=True,
            check=False,
        )
        last = " ".join((done.stdout + done.stderr).strip().splitlines()[-1:])[:300]
        if done.returncode == 1:  # a difference, or the mutated core raised
            return {"verdict": "killed", "by": "bkref refine: " + last}
        if done.returncode != 0:  # 2: it could not run (no ZooKeeper, say)
            return {"verdict": "error", "by": f"bkref refine exit {done.returncode}: {last}"}
    return {"verdict": "survived", "ran": ran, "selected": why}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.mutation.core_kill",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "file", nargs="?", type=Path, help="the baseline to select by (none: run everything)"
    )
    p.add_argument("--baseline", type=Path, help="measure the unmutated tree into this file")
    p.add_argument("--configs", default=REFINE_CONFIGS, help=f"default {REFINE_CONFIGS}")
    p.add_argument("--examples", default=REFINE_EXAMPLES, help=f"default {REFINE_EXAMPLES}")
    p.add_argument(
        "--tests",
        default=",".join(CORE_TESTS),
        help="the core test files to run, comma-separated (default: all of CORE_TESTS; "
        "fewer for a smoke run of this machinery)",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="stages at once")
    args = p.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    test_files = [t for t in args.tests.split(",") if t]
    unknown = sorted(set(test_files) - set(CORE_TESTS))
    if unknown:
        p.error(f"--tests: not core test files (CORE_TESTS): {', '.join(unknown)}")
    if args.baseline is not None:
        measured = measure_baseline(configs, args.examples, max(1, args.jobs), test_files)
        args.baseline.write_text(json.dumps(measured, indent=1) + "\n")
        return 0
    started = time.monotonic()
    base = json.loads(args.file.read_text()) if args.file is not None else None
    verdict: dict[str, Any]
    if base is not None and (
        set(configs) - set(base["configs"])
        or set(test_files) - set(base["tests"])
        or base["examples"] != args.examples
    ):
        verdict = {
            "verdict": "error",
            "by": "the baseline measured other configs, test files or examples",
        }
    else:
        try:
            verdict = _verdict(base, configs, args.examples, test_files)
        except Exception as e:  # this script's own failure: no verdict on the mutant
            verdict = {"verdict": "error", "by": f"core_kill: {type(e).__name__}: {e}"}
    verdict["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(verdict), flush=True)
    return {"killed": 1, "survived": 0}.get(verdict["verdict"], 2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
