"""Model-check the protocol spec: list configs and mutants, check, walk, liveness.

    bkref spec list
    bkref spec check --config NAME [--mutant NAME] [--workers N] [--walk N --seed S] [--json]
    bkref spec check --mutant NAME          (uses the config the mutant needs)
    bkref spec check --config NAME --spark [--master URL] [--partitions N]
    bkref spec coverage [--config NAME ...] [--json]
    bkref spec build [--force]             (compile the checker's modules with mypyc)

Exit status: 0 when no invariant is violated (and liveness holds, where the
config names a liveness goal), 1 with a trace when one is, 2 on bad arguments.
``coverage`` exits 1 when a branch of an action no config reaches has no recorded
reason, or when two metadata writers race on a ledger in no config (``bkref.spec.coverage``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn, TextIO

from bkref.spec.build import running
from bkref.spec.checker import Result, WalkResult, check, print_progress_header, walk
from bkref.spec.checkpoint import CheckpointError
from bkref.spec.cli_args import positive_int
from bkref.spec.config import MUTANTS, Config
from bkref.spec.configs import BIG_CONFIGS, CHECKABLE, CONFIGS, MUTANT_CONFIGS, NAMED
from bkref.spec.trace import dumps, format_trace, trace_json
from bkref.spec.visited import collision_probability


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # exit 2 on bad arguments, as documented
        self.print_usage(sys.stderr)
        print(f"bkref spec: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="bkref spec",
        description=__doc__.splitlines()[0],
        epilog="Exit status: 0 no violation, 1 violation (trace printed), 2 bad arguments.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="one line per named config and per mutant")
    c = sub.add_parser(
        "check",
        help="exhaustive BFS (or random walks) over a config",
        description="Check every invariant in every reachable state of a config; print a "
        "shortest trace on a violation. With --walk, follow random actions instead, for "
        "configs beyond exhaustive reach; like TLC's simulation mode, it reports how many "
        "distinct states (up to symmetry, by 64-bit fingerprint) the walks saw.",
    )
    c.add_argument("--config", help="a config name from `bkref spec list`")
    c.add_argument("--mutant", help="switch on a mutant (without --config: its own config)")
    c.add_argument(
        "--walk", type=positive_int, metavar="N", help="random walks of N (>= 1) actions in all"
    )
    c.add_argument("--seed", type=int, default=0, help="seed of the random walks (default 0)")
    c.add_argument(
        "--max-states", type=positive_int, metavar="N", help="stop the BFS after N (>= 1) states"
    )
    c.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="processes expanding each large BFS layer (>= 1; default 1; same result for every N)",
    )
    c.add_argument("--no-symmetry", action="store_true", help="do not identify bookie renamings")
    c.add_argument(
        "--fingerprints",
        action="store_true",
        help="keep 64-bit fingerprints of visited states, and BFS layers on disk, instead of "
        "whole states: a fraction of the memory, for big configs; prints the estimated "
        "chance that two states collided",
    )
    c.add_argument(
        "--checkpoint",
        type=Path,
        metavar="DIR",
        help="with --fingerprints: save the search in DIR at the end of every BFS level, and "
        "go on from what DIR holds (run the same command again after a stop or a crash). "
        "Needs a fixed PYTHONHASHSEED, the same for every run",
    )
    c.add_argument(
        "--spark",
        action="store_true",
        help="run the BFS on Spark (bkref.spark_checks.spec_bfs): level by level, states "
        "and visited fingerprints partitioned over the executors; same counts and verdicts. "
        "Liveness stays local",
    )
    c.add_argument(
        "--master", metavar="URL", help="with --spark: the Spark master (default local[*])"
    )
    c.add_argument(
        "--partitions",
        type=positive_int,
        metavar="N",
        help="with --spark: partitions of each level and of the visited set "
        "(default twice the executors' cores)",
    )
    c.add_argument("--no-liveness", action="store_true", help="skip the config's liveness goal")
    c.add_argument("--no-fairness", action="store_true", help="liveness without fairness")
    c.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    c.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    e = sub.add_parser(
        "example",
        help="a mutant's stored shortest counterexample",
        description="Print the shortest trace by which the checker catches a mutant, as "
        "stored with bkref (bkref/spec/examples/; `python -m bkref.spec.examples` "
        "regenerates them). `bkref spec check --mutant NAME` finds it again.",
    )
    e.add_argument("mutant", help="a mutant name from `bkref spec list`")
    v = sub.add_parser(
        "coverage",
        help="which actions and branches of the spec the configs reach",
        description="Check configs exhaustively and report, per action, the distinct states "
        "it is enabled in, and per return statement of each action function (a guard "
        "refusing the step, or a path to a successor) the configs that reach it, and per "
        "pair of metadata writers (writer, recovery client, worker, auditor) the configs in "
        "which they race on one ledger. Exit 1 when a branch no config reaches has no "
        "'# unreachable: <why>' comment beside it, or a pair races in no config.",
    )
    v.add_argument(
        "--config",
        action="append",
        metavar="NAME",
        help="a config name (repeatable; default: every named config)",
    )
    v.add_argument(
        "--max-states", type=positive_int, metavar="N", help="stop each check after N states"
    )
    v.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    v.add_argument(
        "--markdown", metavar="FILE", help="also write the coverage page for reviewers to FILE"
    )
    v.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    b = sub.add_parser(
        "build",
        help="compile the spec's core modules with mypyc, for faster checks",
        description="Compile the spec's core modules (bkref.spec.build.MODULES), unchanged, "
        "with mypyc into a build named by a hash of their source. Every later `bkref spec` "
        "run imports that build instead of the source while the source is unchanged "
        "(BKREF_SPEC=pure runs the source; BKREF_SPEC=compiled insists on the build). "
        "Needs mypyc (with mypy) and a C compiler; about 2 CPU minutes.",
    )
    b.add_argument("--force", action="store_true", help="compile even if a current build exists")
    return p


def _build(force: bool) -> int:
    from bkref.spec.build import build

    try:
        build(force=force)
    except RuntimeError as e:
        print(f"bkref spec build: {e}", file=sys.stderr)
        return 2
    return 0


def _list() -> int:
    for name, cfg in CONFIGS.items():
        print(f"config {name}: {cfg.description} ({cfg.bounds()})")
    for name, cfg in BIG_CONFIGS.items():
        print(f"big config {name}: {cfg.description} ({cfg.bounds()}; check with --fingerprints)")
    for name, bug in MUTANTS.items():
        print(f"mutant {name}: {bug} [config {MUTANT_CONFIGS[name].name}]")
    return 0


def _resolve(args: argparse.Namespace) -> Config:
    if args.config is None and args.mutant is None:
        raise SystemExit(_bad("check needs --config or --mutant"))
    if args.mutant is not None and args.mutant not in MUTANTS:
        raise SystemExit(_bad(f"unknown mutant {args.mutant!r}; see `bkref spec list`"))
    if args.config is None:
        cfg = MUTANT_CONFIGS[args.mutant]
    elif args.config in CHECKABLE:
        cfg = CHECKABLE[args.config]
    else:
        raise SystemExit(_bad(f"unknown config {args.config!r}; see `bkref spec list`"))
    return cfg.with_mutant(args.mutant) if args.mutant else cfg


def _bad(message: str) -> int:
    print(f"bkref spec: {message}", file=sys.stderr)
    return 2


def _summary(r: Result) -> dict[str, Any]:
    return {
        "config": r.config.name,
        "mutants": sorted(r.config.mutants),
        "spec": running(),
        "explored": r.explored,
        "distinct": r.distinct,
        "depth": r.depth,
        "levels": r.levels,  # new distinct states per BFS depth, Init's first
        "seconds": round(r.seconds, 2),
        "states_per_second": round(r.rate),
        "complete": r.complete,
        "fingerprints": r.fingerprints,
        "collision_probability": r.collision_probability,
        "rss_bytes": r.rss,
        "skipped_invariants": list(r.skipped),
        "violation": r.violation,
        "trace": trace_json(r.trace) if r.violation else [],
    }


def _walk_summary(r: WalkResult) -> dict[str, Any]:
    return {
        "config": r.config.name,
        "mutants": sorted(r.config.mutants),
        "seed": r.seed,
        "steps": r.steps,
        "walks": r.walks,
        "max_depth": r.max_depth,
        "distinct": r.distinct,
        "collision_probability": collision_probability(r.distinct),
        "seconds": round(r.seconds, 2),
        "violation": r.violation,
        "trace": trace_json(r.trace) if r.violation else [],
    }


def _coverage(args: argparse.Namespace) -> int:
    from bkref.spec.coverage import ViolationError, report, write_markdown

    names = args.config or list(NAMED)
    unknown = [n for n in names if n not in NAMED]
    if unknown:
        return _bad(f"unknown config(s) {unknown}; see `bkref spec list`")
    progress = None if args.quiet else sys.stderr
    if progress is not None:
        print(f"coverage of {len(names)} config(s), exhaustive checks:", file=progress)
    try:
        r = report([NAMED[n] for n in names], max_states=args.max_states, progress=progress)
    except ViolationError as e:
        print(f"bkref spec coverage: {e}", file=sys.stderr)
        return 1
    if args.markdown is not None:
        with open(args.markdown, "w") as f:
            write_markdown(r, f)
    if args.json:
        print(dumps(r.to_json()))
    else:
        r.write_text(sys.stdout)
    return 1 if r.unexplained() or r.unraced() or r.without_effect() or r.unspent() else 0


# Searches installed beside the checker's own, by name: the Spark BFS lives in
# bkref.spark_checks, which the spec does not import (pyproject.toml's
# ``bkref.spec.searches`` entry points).
SEARCHES = "bkref.spec.searches"


def _on_spark(args: argparse.Namespace, cfg: Config, progress: TextIO | None) -> Result:
    from importlib.metadata import entry_points

    found = entry_points(group=SEARCHES, name="spark")
    if not found:
        raise SystemExit(
            _bad("--spark: no Spark search installed (bkref.spark_checks); reinstall bkref")
        )
    search = next(iter(found)).load()
    result: Result = search(
        cfg,
        master=args.master,
        partitions=args.partitions,
        symmetry=not args.no_symmetry,
        max_states=args.max_states,
        progress=progress,
    )
    return result


def _check(args: argparse.Namespace) -> int:
    cfg = _resolve(args)
    if not args.spark and (args.master or args.partitions):
        return _bad("--master and --partitions go with --spark")
    if args.spark and (args.walk is not None or args.workers > 1):
        return _bad("--spark runs the BFS on Spark's executors: not with --walk or --workers")
    if args.checkpoint is not None and (not args.fingerprints or args.spark or args.walk):
        return _bad("--checkpoint goes with --fingerprints, and not with --spark or --walk")
    progress = None if args.quiet or args.json else sys.stderr
    if progress is not None:
        print_progress_header(cfg, progress)
    if args.walk is not None:
        w = walk(cfg, args.walk, args.seed)
        if args.json:
            print(dumps(_walk_summary(w)))
        else:
            print(
                f"{w.steps:,} steps in {w.walks:,} walks (seed {w.seed}), deepest {w.max_depth}, "
                f"{w.distinct:,} distinct states, {w.seconds:.1f} s"
            )
            if w.violation:
                print(f"VIOLATION of {w.violation} (reproduce with --seed {w.seed}):")
                print(format_trace(w.trace))
            else:
                print("no invariant violated")
        return 1 if w.violation else 0
    if args.spark:
        r = _on_spark(args, cfg, progress)
    else:
        r = check(
            cfg,
            symmetry=not args.no_symmetry,
            max_states=args.max_states,
            progress=progress,
            workers=args.workers,
            fingerprints=args.fingerprints,
            checkpoint=args.checkpoint,
        )
    if args.json:
        summary = _summary(r)
    else:
        print(
            f"{r.distinct:,} distinct states, {r.explored:,} explored, depth {r.depth}, "
            f"{r.seconds:.1f} s, {r.rate:,.0f} states/s, {r.rss / 2**20:,.0f} MiB"
            + ("" if r.complete or r.violation else " (incomplete: state limit)")
        )
        if r.fingerprints:
            p = r.collision_probability
            print(f"64-bit fingerprints: estimated collision probability {p:.1e}")
        if r.skipped:
            print(f"not checked under this config: {', '.join(r.skipped)}")
        if r.violation:
            print(f"VIOLATION of {r.violation}; a shortest trace:")
            print(format_trace(r.trace))
        else:
            print("no invariant violated")
    status = 1 if r.violation else 0
    if not r.violation and cfg.liveness and not args.no_liveness and r.complete:
        from bkref.spec.liveness import check_liveness

        lv = check_liveness(cfg, fair=not args.no_fairness)
        if args.json:
            summary["liveness"] = {"goal": lv.goal, "holds": lv.holds, "reason": lv.reason}
        else:
            fairness = "no fairness" if args.no_fairness else "weak fairness"
            print(f"liveness <>{lv.goal} under {fairness}: {'holds' if lv.holds else 'FAILS'}")
            if not lv.holds:
                print(lv.reason)
                print(format_trace(lv.prefix))
                if lv.cycle:
                    print("   then forever: " + " -> ".join(lv.cycle))
        status = status or (0 if lv.holds else 1)
    if args.json:
        print(dumps(summary))
    return status


def _example(mutant: str) -> int:
    from bkref.spec.examples import EXAMPLES

    if mutant not in MUTANTS:
        known = ", ".join(MUTANTS)
        print(f"bkref spec: unknown mutant {mutant!r}; known: {known}", file=sys.stderr)
        return 2
    path = EXAMPLES / f"{mutant}.txt"
    if not path.is_file():
        print(f"bkref spec: no stored example at {path}: reinstall bkref", file=sys.stderr)
        return 2
    print(path.read_text(), end="")
    return 0


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
        if args.command == "list":
            return _list()
        if args.command == "coverage":
            return _coverage(args)
        if args.command == "example":
            return _example(args.mutant)
        if args.command == "build":
            return _build(args.force)
        return _check(args)
    except CheckpointError as e:
        return _bad(str(e))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
