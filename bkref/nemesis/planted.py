"""Do the campaign's checks catch each planted bug? ``make planted`` answers it.

For every bug in :mod:`bkref.impl.core.planted` a campaign can see (``CAMPAIGN_PLANTS``; the
refinement-only ones lose nothing a history shows), run campaigns of the default length
with the bug switched on, with the faults that exercise it, on seeds 1, 2, 3,
... until one run is found invalid (the bug detected) or ``--runs`` runs came
out valid (missed). The bar: each bug detected in at least one of three
runs. Each campaign is an ordinary ``bkref campaign`` (its report and results
are kept under ``--out``); exit 0 when every bug was detected, 1 when one was
missed, 2 when a campaign could not run.

With ``--trace`` every campaign records its nodes' traces, and the table also says
whether the trace check (the protocol replayed through the spec) caught the bug
in that run, and the first step it found that no spec behaviour allows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bkref.impl.core.planted import CAMPAIGN_PLANTS


@dataclass(frozen=True)
class Exercise:
    """The campaign arguments that give one planted bug its chance."""

    faults: str
    extra: tuple[str, ...] = ()
    why: str = ""


EXERCISES: dict[str, Exercise] = {
    "ack-before-fsync": Exercise(
        "lose-unsynced,power-loss",
        why="crashes that drop what was never fsynced",
    ),
    "recovery-reads-without-fence": Exercise(
        "kill,pause",
        why="the workload's recoveries race live writers; faults only add crashes",
    ),
    "repair-without-copy": Exercise(
        "kill",
        ("--fault-length", "8,12"),
        why="bookies down for twice their session or more are repaired by AutoRecovery",
    ),
    "repair-open-segment-without-fence": Exercise(
        "expire",
        ("--entries-per-ledger", "100000"),
        why="an expired bookie is lost to the auditor while the writer still adds to it "
        "(ledgers outlive the run, so each one on the expired bookie is open at the repair)",
    ),
}


@dataclass
class Outcome:
    plant: str
    faults: str
    runs: list[dict[str, object]]  # per campaign: seed, exit code, verdict, seconds
    detected: bool
    error: str | None = None
    trace_detected: bool = False  # with --trace: the trace check caught it in some run


def _campaign(plant: str, seed: int, args: argparse.Namespace, out: Path) -> tuple[int, float]:
    ex = EXERCISES[plant]
    cmd = [
        sys.executable,
        "-m",
        "bkref.impl.cli.main",
        "campaign",
        "--plant",
        plant,
        "--faults",
        ex.faults,
        "--time",
        str(args.time),
        "--seed",
        str(seed),
        "--out",
        str(out),
        *ex.extra,
        *(["--trace"] if args.trace else []),
    ]
    t0 = time.monotonic()
    code = run_to_end(cmd)
    return code, time.monotonic() - t0


def run_to_end(cmd: list[str]) -> int:
    """Run ``cmd`` and wait for its end, through Ctrl-C; then raise KeyboardInterrupt if
    there was one. The terminal's Ctrl-C reaches the campaign too, which tears its cluster
    down before it exits; subprocess.run would SIGKILL it a quarter of a second into
    that, orphaning the cluster's processes (and a second signal would cut it short)."""
    child = subprocess.Popen(cmd)
    interrupted = False
    while True:
        try:
            code = child.wait()
        except KeyboardInterrupt:
            if not interrupted:
                print(
                    "planted: interrupted; waiting for the campaign to tear its cluster down",
                    file=sys.stderr,
                    flush=True,
                )
            interrupted = True
            continue
        if interrupted:
            raise KeyboardInterrupt
        return code


def _trace_verdict(out: Path) -> str:
    """What the run's trace check said: the first step no spec behaviour allows, or
    "missed" (explained or unknown), from the campaign's results."""
    try:
        results = json.loads((out / "results.json").read_text())
        check = results["runs"][0]["checks"]["trace"]
    except (OSError, ValueError, KeyError, IndexError):
        return "missed"  # no trace check ran (the run could not complete)
    if check["valid"]:
        return "missed"
    first = check["anomalies"][0]
    return f"caught: ledger {first['ledger']}: {first['message']}"[:400]


def _run_all(plants: list[str], args: argparse.Namespace, outcomes: list[Outcome]) -> None:
    for plant in plants:
        ex = EXERCISES[plant]
        print(f"== {plant}: faults {ex.faults} ({ex.why})", flush=True)
        outcome = Outcome(plant, ex.faults, [], detected=False)
        for k in range(args.runs):
            seed = args.seed + k
            out = args.out / plant / f"seed-{seed}"
            code, seconds = _campaign(plant, seed, args, out)
            verdict = {0: "valid (missed)", 1: "INVALID (caught)"}.get(code, "could not run")
            run: dict[str, object] = {
                "seed": seed,
                "exit": code,
                "verdict": verdict,
                "seconds": round(seconds),
            }
            if args.trace:
                run["trace"] = _trace_verdict(out)
                outcome.trace_detected = outcome.trace_detected or run["trace"] != "missed"
            outcome.runs.append(run)
            print(f"   seed {seed}: {verdict}, {seconds:.0f} s", flush=True)
            if args.trace:
                print(f"   trace check: {run['trace']}", flush=True)
            if code == 1:
                outcome.detected = True
                break
            if code != 0:
                outcome.error = f"campaign with seed {seed} exited {code}"
                break
        outcomes.append(outcome)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bkref.nemesis.planted",
        description=(
            "Run campaigns with each planted bug switched on (bkref/impl/core/planted.py) until "
            "the checks catch it or --runs campaigns came out valid. Exit 0: every bug "
            "was caught; 1: one was missed; 2: a campaign could not run."
        ),
    )
    p.add_argument(
        "--plant", action="append", choices=CAMPAIGN_PLANTS, help="only these (repeatable)"
    )
    p.add_argument("--runs", type=int, default=3, help="campaigns per bug at most (default 3)")
    p.add_argument("--time", type=float, default=60.0, help="seconds per campaign (default 60)")
    p.add_argument("--seed", type=int, default=1, help="seed of the first campaign (default 1)")
    p.add_argument("--out", type=Path, default=Path("out/planted"), help="default out/planted")
    p.add_argument(
        "--trace",
        action="store_true",
        help="record traces and say whether the trace check caught each bug too",
    )
    args = p.parse_args(argv)
    plants = args.plant or list(CAMPAIGN_PLANTS)
    outcomes: list[Outcome] = []
    try:
        _run_all(plants, args, outcomes)
    except KeyboardInterrupt:
        print("planted: interrupted; no bug's result is final", file=sys.stderr)
        return 130
    args.out.mkdir(parents=True, exist_ok=True)
    summary = [asdict(o) for o in outcomes]
    (args.out / "planted.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\nplanted bug                          caught  runs" + ("  trace" if args.trace else ""))
    for o in outcomes:
        state = "yes" if o.detected else ("ERROR" if o.error else "NO")
        trace = ("   yes" if o.trace_detected else "   no") if args.trace else ""
        print(f"{o.plant:<36} {state:<7} {len(o.runs):<5}{trace}")
    print(f"details: {args.out / 'planted.json'}")
    if any(o.error for o in outcomes):
        return 2
    return 0 if all(o.detected for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
