"""Run a Jepsen-style fault campaign on a local cluster, check it, and report."""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from bkref.impl.cli.args import int_range, non_negative_int, positive_float, positive_int
from bkref.impl.cli.plants import add_plant_argument
from bkref.linearizability.durability import describe
from bkref.nemesis.browser import BrowserError, find_chromium, screenshot
from bkref.nemesis.faults import (
    DEFAULT_KINDS,
    FAULT_GROUPS,
    FAULT_KINDS,
    VICTIM_KINDS,
    expand_kinds,
    performable,
)
from bkref.nemesis.netns import namespaces_supported
from bkref.nemesis.workload import WorkloadSpec

# netns and docker: every node has its own network; bookie data on lazyfs unless --no-lazyfs.
NODE_DEFAULT_FAULTS = ("kill", "pause", "partition", "expire")
LAZYFS_DEFAULT_FAULTS = (*NODE_DEFAULT_FAULTS, "lose-unsynced")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref campaign",
        description=(
            "Start a real cluster (ZooKeeper and N bookie processes), run the ledger workload "
            "while the nemesis injects faults, heal, read everything back, and check the "
            "history for linearizability and durability. Writes history.jsonl, results.json, "
            "timeline.html per run and report.html + results.json for the campaign. Exit 0: "
            "every run valid; 1: an anomaly was found; 2: a run could not complete. "
            "`bkref campaign cleanup [--out DIR]` removes what an interrupted campaign left "
            "(processes, lazyfs mounts, network namespaces)."
        ),
    )
    p.add_argument("action", nargs="?", choices=["run", "cleanup"], default="run")
    p.add_argument(
        "--backend",
        choices=["auto", "netns", "local", "docker"],
        default="auto",
        help=(
            "netns: every node in its own network namespace (3 ZooKeeper servers, partitions, "
            "bookie data on lazyfs; needs root); local: loopback, process and disk-corruption "
            "faults only; docker: every node a container of the private engine (`bkref docker`; "
            "root, make docker-setup; bookie data on lazyfs); auto (default): netns when "
            "namespaces can be created, else local"
        ),
    )
    p.add_argument(
        "--faults",
        default=None,
        help=(
            f"comma-separated fault kinds: {', '.join(FAULT_KINDS)}, or the groups "
            f"{', '.join(FAULT_GROUPS)} (default: {','.join(LAZYFS_DEFAULT_FAULTS)} on netns "
            f"and docker, without lose-unsynced under --no-lazyfs; {','.join(DEFAULT_KINDS)} "
            "on local)"
        ),
    )
    p.add_argument(
        "--time",
        type=positive_float,
        default=60.0,
        help="seconds of faults per run (> 0; default 60)",
    )
    p.add_argument(
        "--seed",
        type=non_negative_int,
        default=None,
        help="seed of the first run (>= 0; default: random)",
    )
    p.add_argument(
        "--runs", type=positive_int, default=1, help="runs, seeds seed, seed+1, ... (default 1)"
    )
    p.add_argument(
        "--bookies", type=int_range(3), default=5, help="bookies in the cluster (>= 3; default 5)"
    )
    p.add_argument(
        "--writers", type=positive_int, default=3, help="concurrent writers (>= 1; default 3)"
    )
    p.add_argument(
        "--readers", type=non_negative_int, default=2, help="concurrent readers (default 2)"
    )
    p.add_argument(
        "--in-flight",
        type=positive_int,
        default=8,
        help="adds in flight per writer (>= 1; default 8)",
    )
    p.add_argument(
        "--entries-per-ledger",
        type=positive_int,
        default=150,
        help="adds a writer makes before it closes or abandons its ledger (default 150); "
        "longer ledgers stay open longer, which widens the window of faults on open ledgers",
    )
    p.add_argument(
        "--fault-length",
        default="1,6",
        metavar="MIN,MAX",
        help="seconds each fault window lasts, drawn uniformly (default 1,6); a bookie "
        "killed for longer than its ZooKeeper session (4 s) is lost to the auditor and "
        "repaired by AutoRecovery; session expiries last at least the session plus 4 s",
    )
    p.add_argument(
        "--quorum",
        default=None,
        help=(
            "E,Wq,Aq of the workload's ledgers (default 3,2,2; 3,3,2 when a fault destroys "
            "synced data on a bookie: then one lost copy cannot make recovery truncate)"
        ),
    )
    add_plant_argument(p, "every bookie, writer process and client of the campaign")
    p.add_argument(
        "--no-lazyfs",
        action="store_true",
        help="netns, docker: bookie data on plain disk (no lose-unsynced or power-loss faults)",
    )
    p.add_argument(
        "--no-autorecovery",
        action="store_true",
        help="bookies without AutoRecovery, and no convergence or replication check after "
        "the heal (by default every bookie runs AutoRecovery, the cluster must repair every "
        "ledger after the heal, and a dump of every bookie is audited)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="every bookie, its AutoRecovery, every writer and the client log their protocol "
        "steps in run-*/traces, and the run's checks replay them through the spec (bkref "
        "trace check)",
    )
    p.add_argument(
        "--trace-budget",
        type=float,
        default=300.0,
        help="seconds the trace check may take per run; ledgers left are unknown (default 300)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="output directory (default out/campaign-<time>)"
    )
    return p


def _cleanup(out: Path | None, console: Console) -> int:
    from bkref.impl.cluster.local import LocalCluster
    from bkref.nemesis.backends.netns import cleanup as cleanup_netns
    from bkref.nemesis.docker_engine import missing_packages as docker_missing

    stopped = 0
    directories: list[Path] = []
    if out is not None:
        for state in sorted(out.glob("run-*/cluster/cluster.json")):
            LocalCluster.load(state.parent).down()
            stopped += 1
        directories = [p.parent for p in sorted(out.glob("run-*/cluster/netns-cluster.json"))]
    removed = cleanup_netns(directories=directories)
    if os.geteuid() == 0 and not docker_missing():
        from bkref.nemesis.backends.docker import cleanup as cleanup_docker

        removed += cleanup_docker()
    console.print(f"stopped {stopped} local cluster(s); removed {len(removed)} leftover(s)")
    for what in removed:
        console.print(f"  {what}")
    return 0


def _choose_backend(requested: str, console: Console) -> str | None:
    if requested == "local":
        return "local"
    if requested == "docker":
        from bkref.nemesis.docker_engine import missing_packages as docker_missing

        if os.geteuid() != 0 or docker_missing():
            why = "not root" if os.geteuid() != 0 else "run `make docker-setup`"
            _bad(f"--backend docker is not possible here: {why}")
            return None
        return "docker"
    ok, why = namespaces_supported()
    if ok:
        return "netns"
    if requested == "netns":
        _bad(f"--backend netns is not possible here: {why}")
        return None
    console.print(
        f"[yellow]network namespaces are not available ({why}); falling back to the local "
        "backend: loopback, process and disk-corruption faults only, no partitions[/yellow]"
    )
    return "local"


def _quorum(text: str | None, faults: tuple[str, ...]) -> tuple[int, int, int]:
    if text is None:
        return (3, 3, 2) if VICTIM_KINDS & set(faults) else (3, 2, 2)
    try:
        e, wq, aq = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--quorum wants E,Wq,Aq (three integers), got {text!r}") from None
    if not e >= wq >= aq >= 1:
        raise ValueError(f"--quorum: need E >= Wq >= Aq >= 1, got {text}")
    return e, wq, aq


def _fault_length(text: str) -> tuple[float, float]:
    parts = text.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        low, high = float(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(f"--fault-length wants MIN,MAX in seconds, got {text!r}") from None
    if not 0 < low <= high:
        raise ValueError(f"--fault-length needs 0 < MIN <= MAX, got {text}")
    if not math.isfinite(high):
        raise ValueError(f"--fault-length needs finite seconds, got {text}")
    return low, high


def _bad(message: str) -> int:
    """A usage error: one line on stderr (not through rich, which wraps), exit 2."""
    print(f"bkref campaign: {message}", file=sys.stderr)
    return 2


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM tears down like Ctrl-C


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    # What runs a campaign (Docker's client, plotly, the cluster) is imported once the
    # arguments are read: a usage error or --help answers at once.
    from bkref.nemesis.backends import backend_class, make_backend
    from bkref.nemesis.report import render
    from bkref.nemesis.runner import RunSpec, run_once

    console = Console(stderr=True, highlight=False)
    if args.action == "cleanup":
        return _cleanup(args.out, console)
    # Every argument is checked before the backend is chosen (that may create a
    # network namespace) and before anything starts.
    try:
        chosen = (
            expand_kinds([f for f in args.faults.split(",") if f])
            if args.faults is not None
            else None
        )
        quorum = _quorum(args.quorum, ()) if args.quorum is not None else None
        fault_length = _fault_length(args.fault_length)
    except ValueError as err:
        return _bad(f"bad arguments: {err}")
    if quorum is not None and quorum[0] > args.bookies:
        return _bad(f"--quorum {args.quorum}: the ensemble is larger than --bookies {args.bookies}")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        return _bad(f"--out {args.out}: not a directory")
    if not args.trace_budget > 0:
        return _bad(f"--trace-budget {args.trace_budget}: must be positive")
    backend_name = _choose_backend(args.backend, console)
    if backend_name is None:
        return 2
    default = (
        DEFAULT_KINDS
        if backend_name == "local"
        else NODE_DEFAULT_FAULTS
        if args.no_lazyfs
        else LAZYFS_DEFAULT_FAULTS
    )
    faults = chosen if chosen is not None else expand_kinds(default)
    e, wq, aq = quorum if quorum is not None else _quorum(None, faults)
    supported = performable(backend_class(backend_name, lazyfs=not args.no_lazyfs))
    unsupported = sorted(set(faults) - supported)
    if unsupported:
        return _bad(
            f"the {backend_name} backend cannot inject {unsupported}; it "
            f"supports {sorted(supported)}"
        )
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    out: Path = args.out or Path("out") / time.strftime("campaign-%Y%m%d-%H%M%S")
    out = out.resolve()
    workload = WorkloadSpec(
        writers=args.writers,
        readers=args.readers,
        in_flight=args.in_flight,
        entries_per_ledger=args.entries_per_ledger,
        ensemble=e,
        write_quorum=wq,
        ack_quorum=aq,
    )
    plant = tuple(sorted(set(args.plant)))  # choices= refused unknown names
    previous = signal.signal(signal.SIGTERM, _interrupt)
    runs: list[dict[str, Any]] = []
    interrupted = False
    try:
        for k in range(args.runs):
            run_seed = seed + k
            directory = out / f"run-{k}-seed-{run_seed}"
            console.rule(f"run {k + 1}/{args.runs}, seed {run_seed}, backend {backend_name}")
            ar = not args.no_autorecovery
            spec = RunSpec(
                run_seed,
                args.time,
                faults,
                args.bookies,
                workload,
                plant,
                autorecovery=ar,
                fault_length=fault_length,
                trace=args.trace,
                trace_budget=args.trace_budget,
            )
            backend = make_backend(
                backend_name,
                directory / "cluster",
                args.bookies,
                lazyfs=not args.no_lazyfs,
                plants=frozenset(plant),
                autorecovery=ar,
                trace_dir=directory / "traces" if args.trace else None,
            )
            with Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"),
                console=console,
                transient=True,
            ) as bar:
                task = bar.add_task(f"run {k}", total=args.time, status="setting up")

                def progress(p: dict[str, Any], bar: Progress = bar, task: TaskID = task) -> None:
                    bar.update(
                        task,
                        completed=min(args.time, p["seconds"]),
                        status=(
                            f"{p['ops']} ops: {p.get('ok', 0)} ok, {p.get('fail', 0)} fail, "
                            f"{p.get('info', 0)} info; {p.get('faults', 0)} nemesis events"
                        ),
                    )

                result = run_once(spec, backend, directory, bar.console.log, progress)
            runs.append(asdict(result))
            verdict = {True: "valid", False: "INVALID", None: "could not run"}[result.valid]
            console.print(
                f"run {k}: {verdict}; {sum(result.ops.values())} ops, faults {result.faults}, "
                f"{result.seconds} s"
            )
            if "durability" in result.checks:
                console.print(f"  {describe(result.checks['durability'])}", markup=False)
            if result.valid is False:
                for name, check in result.checks.items():
                    if not check["valid"]:
                        console.print(f"  {name}: {check.get('counts') or check['anomalies'][:3]}")
            if result.valid is not True:
                console.print(
                    f"  reproduce with --seed {run_seed} (details in {directory}/results.json)"
                )
    except KeyboardInterrupt:
        interrupted = True
        console.print("[yellow]interrupted: the cluster of the current run was torn down[/yellow]")
    finally:
        signal.signal(signal.SIGTERM, previous)
    valid = bool(runs) and all(r["valid"] is True for r in runs)
    campaign = {
        "valid": valid if runs and all(r["valid"] is not None for r in runs) else None,
        "backend": backend_name,
        "faults": list(faults),
        "plant": list(plant),
        "quorum": [e, wq, aq],
        "time": args.time,
        "seed": seed,
        "interrupted": interrupted,
        "runs": runs,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(campaign, indent=2) + "\n")
    (out / "report.html").write_text(render(campaign, out))
    console.print(f"report: {out / 'report.html'}")
    if find_chromium() is not None:  # a picture of the page, as a browser draws it
        try:
            height = min(16_000, 800 + 1_800 * len(runs))
            screenshot(out / "report.html", out / "report.png", height=height)
            console.print(f"report as drawn by Chromium: {out / 'report.png'}")
        except BrowserError as e:
            console.print(f"[yellow]no screenshot of the report: {e}[/yellow]")
    if interrupted:
        # The client's threads may be blocked on a cluster that no longer exists, and
        # the interpreter would wait for them at exit: everything is written, so go now.
        console.file.flush()
        os._exit(130)
    if any(r["valid"] is None for r in runs):
        return 2
    return 0 if valid else 1
