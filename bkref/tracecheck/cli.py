"""bkref trace check DIR: does a behaviour of the spec explain a run's traces?

Reads the ``trace-*.jsonl`` files that bookies and clients started with ``--trace DIR``
wrote, and replays each ledger's steps through the executable spec
(docs/trace.md). Exit 0: every ledger is explained; 1: some ledger's trace has a step
that no behaviour of the spec allows (printed with the spec's state before it and what
the spec allowed there); 2: bad input, or some ledger could not be decided (its reason
is printed: the time budget ran out, or a client left no trace).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bkref.tracecheck.load import TraceError, read_dir
from bkref.tracecheck.project import Run, project
from bkref.tracecheck.search import Verdict, search

PROGRESS_EVERY = 10.0
LEDGER_SHARE = 10.0  # seconds a ledger may search while the budget has that much left


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bkref trace", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="replay a run's traces through the spec", description=__doc__)
    c.add_argument("directory", type=Path, help="the run's trace directory")
    c.add_argument(
        "--budget",
        type=float,
        default=300.0,
        help="seconds for the whole check (default 300); a ledger may search for its share "
        "of what is left, or 10 s if more; ledgers left undecided are unknown",
    )
    c.add_argument("--ledger", type=int, action="append", default=[], help="check only these")
    c.add_argument("--json", type=Path, default=None, help="also write the verdicts here")
    return p


def check(directory: Path, budget: float, only: list[int]) -> list[Verdict]:
    run = Run(read_dir(directory))
    ledgers = [lg for lg in run.ledgers() if not only or lg in only]
    start = last = time.monotonic()
    out: list[Verdict] = []
    for i, ledger in enumerate(ledgers):
        now = time.monotonic()
        if now - last > PROGRESS_EVERY:
            print(f"trace check: {i}/{len(ledgers)} ledgers", file=sys.stderr, flush=True)
            last = now
        left = budget - (now - start)
        if left <= 0:
            v = Verdict(ledger, "unknown", reason=f"the time budget ({budget:g} s) ran out")
            v.out_of_time = True
        else:
            # One hard ledger may not starve the others: each gets its share of what is
            # left, and at least LEDGER_SHARE seconds while that much is left.
            share = max(left / (len(ledgers) - i), min(left, LEDGER_SHARE))
            v = search(project(run, ledger), share)
        out.append(v)
    # What the first pass left of the budget goes to the ledgers that ran out of their
    # share (the search starts again: its visited set is not kept between passes).
    again = [i for i, v in enumerate(out) if v.out_of_time]
    for k, i in enumerate(again):
        left = budget - (time.monotonic() - start)
        if left <= LEDGER_SHARE:
            break
        v = search(project(run, out[i].ledger), left / (len(again) - k))
        if not v.out_of_time or v.configurations > out[i].configurations:
            out[i] = v
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        verdicts = check(args.directory, args.budget, args.ledger)
    except TraceError as e:
        print(f"bkref trace check: {e}", file=sys.stderr)
        return 2
    for v in verdicts:
        if v.verdict != "explained":
            print(v.render())
    counts = {
        k: sum(1 for v in verdicts if v.verdict == k) for k in ("explained", "violation", "unknown")
    }
    steps = sum(v.steps for v in verdicts)
    print(
        f"{len(verdicts)} ledgers, {steps} steps: {counts['explained']} explained, "
        f"{counts['violation']} violation(s), {counts['unknown']} unknown"
    )
    if args.json is not None:
        args.json.write_text(json.dumps([v.__dict__ for v in verdicts], indent=1) + "\n")
    if counts["violation"]:
        return 1
    return 2 if counts["unknown"] or not verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
