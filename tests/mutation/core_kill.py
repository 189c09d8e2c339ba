"""The test of one mutant of the protocol core (bkref/impl/core): its tests, then the
refinement machine.

    python -m tests.mutation.core_kill [--configs A,B] [--examples N]

cosmic-ray runs this in a copy of the tree holding one mutant. Exit 1 (killed) when a
test of the core fails, or when `bkref refine` (bkref's bookies, writer, recovery and
AutoRecovery held to the spec step by step, on a ZooKeeper it starts itself) finds a
difference or the mutated core raises (its exit 1); 0 (survived) when everything
passes. When the machine cannot run at all (its exit 2) the verdict is "error",
counted apart from kills (tests/mutation/score.py). The tests come first: they take
seconds and kill most mutants; the machine runs only for what they let through.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

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
]
# Configs of the refinement machine that exercise every core module: writes and
# recovery (a-short, b-short), reads (a-readers), AutoRecovery (c-short, c-workers).
REFINE_CONFIGS = "a-short,b-short,a-readers,c-short,c-workers"
REFINE_EXAMPLES = "40"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.mutation.core_kill",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--configs", default=REFINE_CONFIGS, help=f"default {REFINE_CONFIGS}")
    p.add_argument("--examples", default=REFINE_EXAMPLES, help=f"default {REFINE_EXAMPLES}")
    args = p.parse_args(argv)
    started = time.monotonic()
    verdict: dict[str, Any]
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *CORE_TESTS],
        capture_output=True,
        text=True,
        check=False,
    )
    if tests.returncode in (1, 2):  # failed, or a module did not even collect
        failed = [ln for ln in tests.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        verdict = {"verdict": "killed", "by": "core tests: " + "; ".join(failed[:2])[:300]}
    elif tests.returncode != 0:  # pytest's own error, a usage error, no tests
        tail = " ".join(tests.stdout.strip().splitlines()[-1:])[:300]
        verdict = {"verdict": "error", "by": f"pytest exit {tests.returncode}: {tail}"}
    else:
        refine_argv = ["refine", "--config", args.configs, "--examples", args.examples]
        refine = subprocess.run(
            [sys.executable, "-m", "bkref.impl.cli.main", *refine_argv, "--seed", "0"],
            capture_output=True,
            text=True,
            check=False,
        )
        last = " ".join((refine.stdout + refine.stderr).strip().splitlines()[-1:])[:300]
        if refine.returncode == 0:
            verdict = {"verdict": "survived"}
        elif refine.returncode == 1:  # a difference, or the mutated core raised
            verdict = {"verdict": "killed", "by": "bkref refine: " + last}
        else:  # 2: it could not run (no ZooKeeper, say): no verdict on the mutant
            verdict = {"verdict": "error", "by": f"bkref refine exit {refine.returncode}: {last}"}
    verdict["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(verdict), flush=True)
    return 1 if verdict["verdict"] == "killed" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
