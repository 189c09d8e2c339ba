"""Run a Jepsen-style fault campaign on a local cluster, check it, and report."""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from impl.cluster.local import LocalCluster
from nemesis.db import LocalBackend
from nemesis.generator import FAULT_KINDS
from nemesis.netns import cleanup_leftovers
from nemesis.report import render
from nemesis.runner import RunSpec, run_once
from nemesis.workload import WorkloadSpec


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref campaign",
        description=(
            "Start a real cluster (a private ZooKeeper and N bookie processes), run the ledger "
            "workload while the nemesis injects faults, heal, read everything back, and check "
            "the history for linearizability and durability. Writes history.jsonl, "
            "results.json, timeline.html per run and report.html + results.json for the "
            "campaign. Exit 0: every run valid; 1: an anomaly was found; 2: a run could "
            "not complete. `bkref campaign cleanup --out DIR` stops what an interrupted "
            "campaign left running."
        ),
    )
    p.add_argument("action", nargs="?", choices=["run", "cleanup"], default="run")
    p.add_argument(
        "--faults",
        default=",".join(FAULT_KINDS),
        help=f"comma-separated fault kinds: {', '.join(FAULT_KINDS)} (default all)",
    )
    p.add_argument(
        "--time", type=float, default=60.0, help="seconds of faults per run (default 60)"
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the first run (default: random)")
    p.add_argument("--runs", type=int, default=1, help="runs, seeds seed, seed+1, ... (default 1)")
    p.add_argument("--bookies", type=int, default=5, help="bookies in the cluster (default 5)")
    p.add_argument("--writers", type=int, default=3, help="concurrent writers (default 3)")
    p.add_argument("--readers", type=int, default=2, help="concurrent readers (default 2)")
    p.add_argument("--in-flight", type=int, default=8, help="adds in flight per writer (default 8)")
    p.add_argument(
        "--out", type=Path, default=None, help="output directory (default out/campaign-<time>)"
    )
    return p


def _cleanup(out: Path | None, console: Console) -> int:
    if out is None:
        console.print("bkref campaign cleanup: give --out DIR, the campaign's output directory")
        return 2
    stopped = 0
    for state in sorted(out.glob("run-*/cluster/cluster.json")):
        LocalCluster.load(state.parent).down()
        stopped += 1
    removed = cleanup_leftovers()
    console.print(f"stopped {stopped} cluster(s) under {out}; removed {len(removed)} namespace(s)")
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    console = Console(stderr=True, highlight=False)
    if args.action == "cleanup":
        return _cleanup(args.out, console)
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = sorted(set(faults) - set(FAULT_KINDS))
    if unknown or args.runs < 1 or args.bookies < 3 or args.time <= 0:
        console.print(
            f"bkref campaign: bad arguments: unknown faults {unknown} (known: {FAULT_KINDS})"
            if unknown
            else "bkref campaign: need --runs >= 1, --bookies >= 3 and --time > 0"
        )
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    out: Path = args.out or Path("out") / time.strftime("campaign-%Y%m%d-%H%M%S")
    out = out.resolve()
    workload = WorkloadSpec(writers=args.writers, readers=args.readers, in_flight=args.in_flight)
    runs = []
    for k in range(args.runs):
        run_seed = seed + k
        directory = out / f"run-{k}-seed-{run_seed}"
        console.rule(f"run {k + 1}/{args.runs}, seed {run_seed}")
        spec = RunSpec(run_seed, args.time, faults, args.bookies, workload)
        backend = LocalBackend(directory / "cluster", bookies=args.bookies)
        result = run_once(spec, backend, directory, console.log)
        runs.append(asdict(result))
        verdict = {True: "valid", False: "INVALID", None: "could not run"}[result.valid]
        console.print(f"run {k}: {verdict}; {sum(result.ops.values())} ops, faults {result.faults}")
        if result.valid is not True:
            console.print(
                f"  reproduce with --seed {run_seed} (details in {directory}/results.json)"
            )
    valid = all(r["valid"] is True for r in runs)
    campaign = {
        "valid": valid if all(r["valid"] is not None for r in runs) else None,
        "backend": "local",
        "faults": list(faults),
        "time": args.time,
        "seed": seed,
        "runs": runs,
    }
    (out / "results.json").write_text(json.dumps(campaign, indent=2) + "\n")
    (out / "report.html").write_text(render(campaign, out))
    console.print(f"report: {out / 'report.html'}")
    if any(r["valid"] is None for r in runs):
        return 2
    return 0 if valid else 1
