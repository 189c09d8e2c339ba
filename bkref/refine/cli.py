"""Hold the implementation against the spec, step by step (refinement, Hypothesis).

``bkref refine`` runs the refinement machine (:mod:`bkref.refine.machine`) on each
named spec config the driver supports: bkref's bookies on real storage files,
its writer and recovery client, ledger metadata in a real ZooKeeper that this
command starts on 127.0.0.1 (or ``--zookeeper HOST:PORT`` to use one already
running). Exit 0: no counterexample; 1: a counterexample, printed as the spec
steps that lead to the first disagreement, both states side by side, and the
command that replays it; 2: bad input or a failure to run.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bkref.refine.driver import Driver, ImplementationError
from bkref.refine.machine import RunStats, run
from bkref.spec import configs
from bkref.spec.cli_args import positive_int
from bkref.spec.config import Config

DRIVERS = ("bkref", "spec")
# Every named config: the full and short ones, and the mutants' (run here with the correct
# spec: they are small configs with the faults that expose each known bug).
NAMED = configs.NAMED
PROGRESS_EVERY = 10.0  # seconds between progress lines on stderr
PARTS = ("setup", "implementation", "abstraction", "comparison", "spec")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref refine",
        description=__doc__.splitlines()[0],
        epilog="Configs the driver cannot run yet are listed, with the reason, by --list. "
        "Planted bugs: " + ", ".join(_plant_names()) + ".",
    )
    p.add_argument(
        "--config",
        default="",
        help="comma-separated spec configs (default: every config the driver supports)",
    )
    p.add_argument("--examples", type=positive_int, default=200, help="examples per config")
    p.add_argument("--seed", type=int, default=0, help="Hypothesis seed (same seed, same run)")
    p.add_argument("--steps", type=positive_int, default=60, help="spec steps per example at most")
    p.add_argument(
        "--plant",
        default="",
        help="comma-separated planted bugs to switch on in the implementation",
    )
    p.add_argument("--driver", choices=DRIVERS, default="bkref", help="the implementation")
    p.add_argument("--zookeeper", default="", help="HOST:PORT of a running ZooKeeper to use")
    p.add_argument("--workdir", type=Path, default=None, help="where bookie files go (temp dir)")
    p.add_argument("--list", action="store_true", help="list configs and whether they run")
    return p


def _plant_names() -> list[str]:
    from bkref.impl.core.planted import PLANTS

    return list(PLANTS)


def _unsupported(driver: str, cfg: Config) -> list[str]:
    if driver == "spec":
        return []
    from bkref.refine.bkref_driver import BkrefDriver

    return BkrefDriver.unsupported_reasons(cfg)


def _list(driver: str) -> int:
    for name, cfg in NAMED.items():
        why = _unsupported(driver, cfg)
        width = max(map(len, NAMED))
        print(f"{name:{width}s} {'runs' if not why else 'not yet: ' + '; '.join(why)}")
    return 0


def _summary(name: str, stats: RunStats, seconds: float) -> str:
    shares = ", ".join(f"{p} {100 * stats.seconds[p] / seconds:.0f}%" for p in PARTS)
    rest = max(0.0, seconds - sum(stats.seconds[p] for p in PARTS))
    shares += f", Hypothesis and the rest {100 * rest / seconds:.0f}%"
    line = (
        f"config {name}: {stats.examples:,} examples, {stats.steps:,} spec steps "
        f"({stats.followups:,} follow-ups), {len(stats.states):,} distinct abstract states, "
        f"{seconds:.1f} s, {stats.steps / seconds:,.0f} steps/s ({shares})"
    )
    taken = ", ".join(f"{a} x{n:,}" for a, n in sorted(stats.actions.items()))
    line += f"\n  spec steps taken: {taken}"
    never = sorted(stats.enabled - set(stats.actions))
    if never:
        line += f"\n  offered but never taken: {', '.join(never)}"
    if stats.refused:
        refused = "; ".join(f"{a} x{n}: {stats.refused_why[a]}" for a, n in stats.refused.items())
        line += f"\n  steps the implementation cannot take: {refused}"
    return line


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    if args.list:
        return _list(args.driver)
    from bkref.impl.core.planted import UnknownPlantError, validate

    try:
        plants = validate(p.strip() for p in args.plant.split(",") if p.strip())
    except UnknownPlantError as e:
        print(f"bkref refine: {e}", file=sys.stderr)
        return 2
    if plants and args.driver != "bkref":
        print("bkref refine: --plant needs --driver bkref", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.config.split(",") if n.strip()]
    for n in names:
        if n not in NAMED:
            print(f"bkref refine: no config {n!r}; known: {', '.join(NAMED)}", file=sys.stderr)
            return 2
        why = _unsupported(args.driver, NAMED[n])
        if why:
            print(f"bkref refine: config {n} cannot run yet: {'; '.join(why)}", file=sys.stderr)
            return 2
    if not names:
        names = [n for n, c in NAMED.items() if not _unsupported(args.driver, c)]
    try:
        return _run(args, names, plants)
    except ImplementationError as e:
        print(f"bkref refine: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, names: list[str], plants: frozenset[str]) -> int:
    if args.driver == "spec":
        from bkref.refine.spec_driver import SpecDriver

        return _each(args, names, plants, SpecDriver)
    from kazoo.client import KazooClient

    from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble, ZooKeeperSettings
    from bkref.refine.bkref_driver import BkrefDriver

    # A SIGTERM unwinds like Ctrl-C, so the ZooKeeper this command started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ensemble = None
    hosts = args.zookeeper
    with tempfile.TemporaryDirectory(prefix="bkref-refine-zk-") as tmp:
        if not hosts:
            print("starting ZooKeeper on 127.0.0.1 ...", file=sys.stderr)
            # No fsync per transaction: the machine never crashes this server, and its
            # examples write hundreds of znodes each (a third of the time with fsync).
            settings = ZooKeeperSettings(force_sync=False)
            # A refine killed by SIGKILL (a mutation run's timeout) takes its server with it.
            ensemble = ZooKeeperEnsemble(
                directory=Path(tmp), size=1, settings=settings, die_with_owner=True
            )
            ensemble.start()
            hosts = ensemble.connection_string
        zk = KazooClient(hosts=hosts)
        try:
            zk.start(timeout=15)
        except Exception as e:  # kazoo raises its own timeout types
            if ensemble is not None:
                ensemble.stop()
            raise ImplementationError(f"cannot reach ZooKeeper at {hosts}: {e}") from e
        try:
            return _each(
                args, names, plants, lambda: BkrefDriver(zk, workdir=args.workdir, plants=plants)
            )
        finally:
            zk.stop()
            zk.close()
            if ensemble is not None:
                ensemble.stop()


class _Progress:
    """A line on stderr at most every PROGRESS_EVERY seconds, so long runs show life."""

    def __init__(self, name: str, started: float) -> None:
        self.name, self.started, self.shown = name, started, started

    def __call__(self, stats: RunStats) -> None:
        now = time.monotonic()
        if now - self.shown < PROGRESS_EVERY:
            return
        self.shown = now
        print(
            f"  {self.name}: {stats.examples:,} examples, {stats.steps:,} spec steps, "
            f"{len(stats.states):,} distinct abstract states, {now - self.started:.0f} s",
            file=sys.stderr,
            flush=True,
        )


def _each(
    args: argparse.Namespace,
    names: list[str],
    plants: frozenset[str],
    new_driver: Callable[[], Driver],
) -> int:
    status = 0
    for name in names:
        cfg = NAMED[name]
        print(
            f"refining config {name} ({cfg.bounds()}) against {args.driver}"
            + (f" with planted {', '.join(sorted(plants))}" if plants else "")
            + f": {args.examples} examples, seed {args.seed}",
            file=sys.stderr,
        )
        t0 = time.monotonic()
        stats, found = run(
            cfg,
            new_driver,
            examples=args.examples,
            seed=args.seed,
            steps=args.steps,
            stats=RunStats(on_example=_Progress(name, t0)),
        )
        print(_summary(name, stats, time.monotonic() - t0))
        if found is not None:
            status = 1
            print()
            print(found.report())
            replay = (
                f"bkref refine --driver {args.driver} --config {name} --seed {args.seed} "
                f"--examples {args.examples} --steps {args.steps}"
                + (f" --plant {','.join(sorted(plants))}" if plants else "")
            )
            print(f"\nfirst found in example {stats.first_failure}; replay: {replay}")
    return status
