"""Mutation testing of the spec and the protocol core (cosmic-ray), and docs/mutation.md.

    python -m tests.mutation run TARGET [--sample N] [--seed S] [--workers W] [--budget S]
    python -m tests.mutation report TARGET
    python -m tests.mutation show TARGET LINE-OR-JOB

TARGET is a table of pyproject.toml's ``[tool.bkref.mutation]``: ``spec`` (the spec's
protocol.py against `make spec-check`'s verdicts, tests/mutation/spec_kill.py) or
``core`` (bkref/impl/core against its tests and the refinement machine). ``run``
resumes the session in ``out/mutation/TARGET`` when its sources, sample, seed and
workers are the same, else starts a new one; when every sampled mutant ran (or the
budget is spent) it rewrites the target's section of docs/mutation.md. Exit 0 when the
report was written, 2 on bad arguments or a failed cosmic-ray.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.mutation.score import (
    CREDITED,
    Score,
    last_json,
    load_verdicts,
    mark_syntax_errors,
    mutant_key,
    outcome,
)
from tests.mutation.session import ROOT, Session, Target

DOC = ROOT / "docs" / "mutation.md"


def _session(args: argparse.Namespace) -> Session:
    work = Path(args.work).resolve() if args.work else ROOT / "out" / "mutation" / args.target
    return Session(Target.load(args.target), work)


def _log(message: str) -> None:
    stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


class TerminatedError(Exception):
    """A SIGTERM: stop as a spent budget does."""


def _interrupt(_signum: int, _frame: object) -> None:
    raise TerminatedError


def again_jobs(sc: Score) -> set[str]:
    """What ``--again`` runs: every mutant without a judgement of its own. The errors
    (nothing judged them), and the survivors and timeouts without a credited verdict."""
    unjudged = {r["job"] for r in sc.results if outcome(r) == "error"}
    return unjudged | {
        r["job"] for r in sc.survivors if sc.verdict(r).get("verdict") not in CREDITED
    }


def set_timeout(s: Session, seconds: float) -> None:
    """The seconds each mutant of the session may take from now on (its cosmic-ray config)."""
    config = s.work / "mutation.toml"
    config.write_text(re.sub(r"(?m)^timeout = .*$", f"timeout = {seconds}", config.read_text()))


def run(args: argparse.Namespace) -> int:
    s = _session(args)
    if args.fresh or not s.matches(args.sample, args.seed, args.workers):
        s.create(args.sample, args.seed, args.workers, log=_log)
    else:
        _log(f"{args.target}: resuming {s.work} ({s.progress()})")
    if args.again:
        s.again(again_jobs(_score(s)))
    if args.timeout is not None:
        set_timeout(s, args.timeout)
    baseline = s.target.baseline_command
    if baseline and not (s.work / "baseline.json").exists():
        _log(f"{args.target}: measuring the unmutated baseline")
        command = baseline.format(python=sys.executable, work=s.work)
        subprocess.run(shlex.split(command), cwd=s.shards()[0], check=True)
    try:
        done = s.run(args.budget, log=_log)
    except (TerminatedError, KeyboardInterrupt):  # s.run stopped its execs before this
        _log(f"{args.target}: interrupted; keeping what ran")
        done = False
    _log(f"{args.target}: {s.progress()}{'' if done else ' (budget spent; run again to go on)'}")
    if args.scratch:  # a measurement (BENCHMARKS' scaling): the record stays as it is
        _log(f"{args.target}: scratch session in {s.work}; results and docs left alone")
        return 0
    s.store()
    write_report(s)
    return 0


def _score(s: Session) -> Score:
    results = s.results()
    sources = {p: (ROOT / p).read_text() for p in {r["module"] for r in results}}
    mark_syntax_errors(results, sources)
    keys = {r["job"]: mutant_key(r, sources[r["module"]]) for r in results}
    return Score(s.target.name, results, keys, load_verdicts())


def section(s: Session) -> str:
    """The target's section of docs/mutation.md."""
    sc, meta = _score(s), s.meta()
    lo, hi = sc.interval
    c = sc.counts
    ran = len(sc.results)
    lines = [
        f"## {s.target.name}: {', '.join(s.target.modules)}",
        "",
        f"Run {meta.get('ran_at') or 'at an unrecorded revision'}: "
        f"`python -m tests.mutation run {s.target.name} "
        f"--sample {meta['sample']} --seed {meta['seed']} --workers {meta['workers']}` "
        f"({meta['seconds'] / 60:.0f} min of wall time on {meta['workers']} workers)."
        + "".join(
            f" Its survivors without a verdict and its errors ({a['jobs']}) then ran again, "
            f"{a['at']}, with the tests added since (`--again`)."
            for a in meta.get("again", [])
        ),
        "",
        f"- mutants: {meta['population']:,} in all, {meta['filtered']:,} after the operator "
        f"filter, of which {meta.get('annotations', 0):,} in annotations (left out), "
        f"{meta['sampled']} sampled uniformly from the rest, **{ran} ran**"
        + ("" if ran == meta["sampled"] else f" ({meta['sampled'] - ran} still pending)"),
        f"- killed {c.get('killed', 0)}, survived {c.get('survived', 0)}, timeout "
        f"{c.get('timeout', 0)} (of those {len(sc.survivors)}, {sc.equivalent} judged "
        f"equivalent, {sc.killed_later} killed by a config or a test added since), "
        f"incompetent {c.get('incompetent', 0)}, error {c.get('error', 0)}",
        f"- **score {sc.score:.1%}** (killed, equivalent or killed since, of killed, "
        f"survived and timed out), 95% Wilson interval {lo:.1%} to {hi:.1%}",
        "",
    ]
    kills: dict[str, int] = {}
    for r in sc.results:
        if outcome(r) == "killed":
            by = _kill_kind(r["output"])
            kills[by] = kills.get(by, 0) + 1
    if kills:
        lines += ["What killed them:", ""]
        lines += [f"- {k}: {n}" for k, n in sorted(kills.items(), key=lambda kv: -kv[1])]
        lines.append("")
    if sc.survivors:
        lines += [
            "Survivors and timeouts (verdicts in tests/mutation/verdicts.toml):",
            "",
            "| where | operator | line | verdict | reason |",
            "|---|---|---|---|---|",
        ]
        for r in sc.survivors:
            v = sc.verdict(r)
            text = sc.keys[r["job"]].split(":", 3)[3].replace("|", "\\|")
            where = f"{r['module']}:{r['line']} `{r['definition']}`" + (
                " (timed out)" if outcome(r) == "timeout" else ""
            )
            op = r["operator"].removeprefix("core/")
            lines.append(
                f"| {where} | {op} | `{text}` | {v.get('verdict', '**none yet**')}"
                + (f" (`{v['config']}`)" if v.get("config") else "")
                + (f" (`{v['test']}`)" if v.get("test") else "")
                + " | "
                f"{v.get('reason', _survivor_clue(r))} |"
            )
        lines.append("")
    return "\n".join(lines)


def _kill_kind(output: str) -> str:
    by = str(last_json(output).get("by", ""))
    if by.startswith("crashed"):
        return "the spec raised at a reachable state"
    if "hand-written mutant" in by:
        return "a hand-written mutant no longer caught as before"
    if "liveness" in by:
        return "a liveness goal fails"
    if " violates " in by:
        return f"an invariant violated ({by.split(' violates ')[1]})"
    if by.startswith("core tests:"):
        return "a test of the core failed"
    if by.startswith("spec tests:"):
        return "a test of the spec failed"
    if by.startswith("bkref refine:"):
        return "the refinement machine found a step the spec does not take"
    return by or "a test failed"


def _survivor_clue(r: dict[str, Any]) -> str:
    if outcome(r) == "timeout":
        return "timed out: no verdict yet"
    v = last_json(str(r["output"]))
    if "ran" in v and not v["ran"]:
        return "no test or config executes it"
    changed = v.get("changed") or {}
    exploded = list(v.get("exploded") or [])
    parts = [
        f"{k} {a:,}→{b:,}{' (bound)' if k in exploded else ''}" for k, (a, b) in changed.items()
    ]
    # A hand-written mutant's config that passed its bound without its violation.
    parts += [f"{k} (bound)" for k in exploded if k not in changed]
    if not parts:
        ran = v.get("ran")
        if "changed" not in v:  # the core's test: tests and configs passed
            return f"passed the {len(ran or [])} test files and configs that execute it"
        return "same distinct states on every config" + (
            f" that executes it ({len(ran)})" if isinstance(ran, list) else ""
        )
    return "states differ: " + ", ".join(parts)


def write_report(s: Session) -> None:
    begin, end = f"<!-- mutation:{s.target.name} -->", f"<!-- /mutation:{s.target.name} -->"
    block = f"{begin}\n{section(s)}\n{end}"
    text = DOC.read_text() if DOC.exists() else "# Mutation testing\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _m: block, text) if pattern.search(text) else f"{text}\n{block}\n"
    DOC.write_text(text)
    _log(f"wrote {DOC.relative_to(ROOT)}")


def show(args: argparse.Namespace) -> int:
    s = _session(args)
    for r in s.results():
        if args.which in (r["job"], str(r["line"])):
            print(f"{r['module']}:{r['line']}:{r['column']} {r['operator']} -> {outcome(r)}")
            print(f"key = {mutant_key(r, (ROOT / r['module']).read_text())!r}")  # verdicts.toml
            print(r["diff"])
            print(r["output"][-3000:])
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run (or resume) a target's sampled session, then report")
    r.add_argument("target")
    r.add_argument("--sample", type=int, default=300, help="mutants drawn (default 300)")
    r.add_argument("--seed", type=int, default=1, help="seed of the sample (default 1)")
    r.add_argument("--workers", type=int, default=2, help="parallel shards (default 2)")
    r.add_argument("--budget", type=float, default=4 * 3600, help="seconds (default 4 h)")
    r.add_argument("--work", help="session directory (default out/mutation/TARGET)")
    r.add_argument("--fresh", action="store_true", help="start over even if resumable")
    r.add_argument(
        "--again",
        action="store_true",
        help="run the session's errors, and its survivors and timeouts without a credited "
        "verdict, again with today's tests (after adding tests that kill them)",
    )
    r.add_argument(
        "--timeout",
        type=float,
        help="seconds a mutant may take from now on (default: the target's, in "
        "pyproject.toml); a longer one for timeouts run --again on a loaded machine",
    )
    r.add_argument(
        "--scratch",
        action="store_true",
        help="a measurement: store no results and leave docs/mutation.md alone (use --work)",
    )
    rep = sub.add_parser(
        "report", help="keep what ran (tests/mutation/results) and rewrite docs/mutation.md"
    )
    rep.add_argument("target")
    rep.add_argument("--work")
    sh = sub.add_parser("show", help="a mutant's diff and its test's output")
    sh.add_argument("target")
    sh.add_argument("which", help="a job id or a line number")
    sh.add_argument("--work")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        if (
            args.sample < 1
            or args.workers < 1
            or args.budget <= 0
            or (args.timeout is not None and args.timeout <= 0)
        ):
            print(
                "--sample and --workers must be >= 1, --budget and --timeout > 0", file=sys.stderr
            )
            return 2
        # A SIGTERM (or a Ctrl-C) unwinds: the execs and their tests are stopped and what
        # ran is kept and reported; the next run resumes the rest.
        signal.signal(signal.SIGTERM, _interrupt)
        return run(args)
    if args.command == "report":
        s = _session(args)
        s.store()
        write_report(s)
        return 0
    return show(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
