"""Check histories for linearizability: verdict, anomalies, timing, HTML timeline.

    bkref check HISTORY... [--model ledger|register|cas-register|kv]
                [--engine auto|fast|search|unique] [--html OUT] [--json] [--budget S]
                [--jobs N] [--allow-empty]

Engines: ``fast`` is the ledger checker (ledger model); ``unique`` decides
register, cas-register and kv histories whose writes are unique without search
(:mod:`bkref.linearizability.unique`); ``search`` is the Wing-Gong search
(:mod:`bkref.linearizability.wgl`), for any model. ``auto`` picks fast for
ledgers, and for the other models unique for each key whose writes are
unique and the search for the others (the report's engine: unique, search or
unique+search; each key's says which decided it).

Exit status: 0 linearizable, 1 not linearizable, 2 unknown (out of time) or
bad input: a file that cannot be read or parsed, an argument out of range, or
a history without operations (unless --allow-empty).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from bkref.linearizability import unique, wgl
from bkref.linearizability.anomalies import NO_LINEARIZATION, NO_LINEARIZATION_PROOF
from bkref.linearizability.durability import Durability, describe
from bkref.linearizability.edn_history import edn_model, read_edn
from bkref.linearizability.history import HistoryError, Op, Operation, pair
from bkref.linearizability.history_files import read_history
from bkref.linearizability.ledger_checker import LedgerCheckResult, check_ledgers
from bkref.linearizability.models import MODELS, describe_ledger_op, to_ledger_op
from bkref.linearizability.peer import read_jepsen_log, sniff
from bkref.linearizability.timeline import Bar, Section, render
from bkref.spec.cli_args import positive_float, positive_int

EXIT = {"valid": 0, "invalid": 1, "unknown": 2}
SHOW = 20  # anomalies printed per file


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref check",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Decide whether histories are linearizable.\n\n"
            "HISTORY is bkref's format (JSON Lines, or Parquet: a file or a directory;\n"
            "see bkref/linearizability/history.py), a Jepsen cas-register log, or EDN:\n"
            "Jepsen's history.edn as `bkref history export` writes it, or Porcupine's kv maps\n"
            "(recognised by content; see bkref/linearizability/edn_history.py). Several files are\n"
            "checked one after another, so a history too big for memory can be split into\n"
            "files of whole ledgers.\n\n"
            "Models:\n"
            + "".join(f"  {m.name:<13} {m.help}\n" for m in MODELS.values())
            + "\nThe ledger model is checked by the ledger checker (no search, O(n log n)),\n"
            "or with --engine search by the generic Wing-Gong search over spec.ledger_model.\n"
            "Registers and kv stores whose writes are unique (each write writes a value\n"
            "never written before, nor the initial value) are decided without search\n"
            "(--engine unique, O(n log n)); --engine auto uses it for every key whose writes\n"
            "are unique and searches the others (--engine search searches every key).\n"
            "Ledger histories are also checked for durability: every acknowledged entry\n"
            "read back after the ledger's last recovery. A ledger never recovered, or not\n"
            "read back in full, is not judged (durability unknown, with the reason): that\n"
            "leaves the verdict valid. Anomalies use Jepsen's names (lost-write,\n"
            "stale-read, ...) and give the history indices of the invocations that prove them."
        ),
        epilog=(
            "exit status: 0 linearizable, 1 not linearizable, 2 unknown or bad input (a file "
            "that cannot be read or parsed, an argument out of range, or a history with no "
            "operations unless --allow-empty: a pipeline that lost its history must not pass)"
        ),
    )
    p.add_argument("history", nargs="+", type=Path, help="history file(s) or Parquet directories")
    p.add_argument(
        "--model",
        choices=sorted(MODELS),
        default=None,
        help="sequential model (default: ledger; cas-register for Jepsen logs; for EDN, "
        "the model its operations belong to)",
    )
    p.add_argument(
        "--engine",
        choices=("auto", "fast", "search", "unique"),
        default="auto",
        help="fast: the ledger checker; search: generic WGL search; unique: no search, for "
        "register/cas-register/kv histories whose writes are unique (auto: fast for ledgers, "
        "else unique for each key whose writes are unique and search for the others)",
    )
    p.add_argument("--html", type=Path, metavar="OUT", help="write an HTML timeline to OUT")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument(
        "--budget",
        type=positive_float,
        default=None,
        metavar="S",
        help="give up after S seconds (> 0): unknown",
    )
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        help="worker processes for the search (>= 1; default: CPUs)",
    )
    p.add_argument("--no-validate", action="store_true", help="skip format validation (faster)")
    p.add_argument(
        "--allow-empty",
        action="store_true",
        help="accept a history without operations as valid (by default it is bad input, exit 2)",
    )
    return p


def _check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors that argparse's types cannot see; exits 2 before any file is read."""
    if args.engine == "fast" and args.model not in (None, "ledger"):
        p.error(f"--engine fast checks the ledger model only, not {args.model}")
    if args.engine == "unique" and args.model not in (None, *unique.SUPPORTED):
        p.error(
            f"--engine unique checks the register, cas-register and kv models, not {args.model}"
        )
    if args.html is not None and (args.html.is_dir() or not args.html.parent.is_dir()):
        p.error(f"--html {args.html}: expected a file in an existing directory")


def _require_ops(path: Path, fmt: str, model: str) -> None:
    """A history without one operation is bad input: it proves nothing, and a
    pipeline that lost its history must not pass. Reads up to the first op."""
    if next(iter(_read(path, fmt, False, model)), None) is None:
        raise HistoryError(
            "no operations: expected a history of at least one operation (the file is "
            "empty, or has only the header line); --allow-empty accepts it",
            source=str(path),
        )


class _Progress:
    """Reports on stderr when a check runs long, at most every two seconds."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.monotonic()
        self.last = self.started

    def __call__(self, count: int) -> None:
        now = time.monotonic()
        if self.quiet or now - self.last < 2:
            return
        self.last = now
        rate = count / (now - self.started)
        print(f"bkref check: {count:,} ops read ({rate:,.0f} ops/s)", file=sys.stderr, flush=True)

    def keys(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.quiet or now - self.last < 2:
            return
        self.last = now
        took = now - self.started
        print(
            f"bkref check: {done} of {total} keys decided ({took:.0f} s)",
            file=sys.stderr,
            flush=True,
        )


def _read(path: Path, fmt: str, validate: bool, model: str) -> Iterator[Op]:
    if fmt == "jepsen-log":
        return read_jepsen_log(path)
    if fmt == "edn":
        return read_edn(str(path), model=model, check=validate)
    return read_history(path, check=validate)


def _ledger_bars(ops: Iterable[Op], ledgers: set[int], hot: set[int]) -> dict[int, list[Bar]]:
    bars: dict[int, list[Bar]] = {}
    for o in pair(ops):
        if o.ledger not in ledgers:
            continue
        try:
            r = to_ledger_op(o.f, o.status, o.input, o.output, o.call)
        except HistoryError:
            r = None
        label = describe_ledger_op(r[0]) if r else o.f
        status = "fail" if o.complete is not None and o.complete.type == "fail" else o.status
        bar = Bar(str(o.process), o.call, o.ret, label, status, o.call in hot)
        bars.setdefault(o.ledger, []).append(bar)
    return bars


def _tap(ops: Iterable[Op], durability: Durability | None) -> Iterator[Op]:
    """``ops``, each also fed to the durability check (one read of the file)."""
    if durability is None:
        yield from ops
        return
    for op in ops:
        durability.feed(op)
        yield op


def _check_ledger_file(
    path: Path, fmt: str, args: argparse.Namespace, progress: _Progress, durability: Durability
) -> tuple[dict[str, Any], list[Section]]:
    result: LedgerCheckResult = check_ledgers(
        _tap(_read(path, fmt, not args.no_validate, "ledger"), durability), progress=progress
    )
    report: dict[str, Any] = {
        "file": str(path),
        "model": "ledger",
        "engine": "fast",
        "verdict": result.verdict,
        "ops": result.ops,
        "ledgers": len(result.ledgers),
        "invalid_ledgers": sorted(lid for lid, v in result.ledgers.items() if not v.valid),
        "anomaly_counts": dict(result.counts),
        "anomalies": [a.to_json() for a in result.anomalies],
        "seconds": round(result.seconds, 3),
    }
    sections: list[Section] = []
    if args.html:
        shown = set(report["invalid_ledgers"][:20]) or set(sorted(result.ledgers)[:5])
        hot = {i for a in result.anomalies if a.ledger in shown for i in a.ops}
        bars = _ledger_bars(_read(path, fmt, False, "ledger"), shown, hot)
        for lid in sorted(shown):
            v = result.ledgers[lid]
            lb = bars.get(lid, [])
            hot_bars = [b for b in lb if b.hot]
            window = (
                (min(b.call for b in hot_bars), max(b.ret for b in hot_bars)) if hot_bars else None
            )
            notes = [f"{a.kind}: {a.message} (ops {list(a.ops)})" for a in v.anomalies[:SHOW]]
            if v.closed_at is not None:
                notes.append(f"closed at entry {v.closed_at}")
            verdict = "valid" if v.valid else "invalid"
            sections.append(Section(f"ledger {lid}", verdict, lb, notes, window))
    return report, sections


def _check_search_file(  # noqa: PLR0917
    path: Path,
    fmt: str,
    model: str,
    args: argparse.Namespace,
    progress: _Progress,
    durability: Durability | None,
) -> tuple[dict[str, Any], list[Section]]:
    # Reading allocates millions of small objects and no cycles: without the
    # collector's rescans of what is already read it takes a tenth less time.
    collecting = gc.isenabled()
    gc.disable()
    try:
        lines = list(_tap(_read(path, fmt, not args.no_validate, model), durability))
        operations: list[Operation] = pair(lines)
    finally:
        if collecting:
            gc.enable()
    if args.engine in ("auto", "unique") and model in unique.SUPPORTED:
        # auto: the keys whose writes are unique without search, the others by it.
        try:
            result = unique.check(
                model,
                operations,
                budget=args.budget,
                search_others=args.engine == "auto",
                jobs=args.jobs,
                progress=progress.keys,
            )
        except unique.NotApplicable as e:
            raise HistoryError(str(e)) from None
    else:
        result = wgl.check(
            model, operations, budget=args.budget, jobs=args.jobs, progress=progress.keys
        )
    engines = {p.engine for p in result.partitions} or {"search"}
    engine = "+".join(sorted(engines, reverse=True))  # unique, search or unique+search
    m = MODELS[model]
    parts = []
    for p in result.partitions:
        entry: dict[str, Any] = {
            "key": _jsonable(p.key),
            "verdict": p.verdict,
            "operations": len(p.calls),
            "engine": p.engine,
        }
        if p.verdict == "invalid" and p.blocked is not None:
            blocked = p.calls[p.blocked]
            entry["blocked_op"] = blocked.call
            entry["blocked"] = m.describe(blocked.input)
            entry["linearized_prefix"] = [p.calls[i].call for i in p.linearization]
        if p.proof:
            entry["proof_ops"] = [p.calls[i].call for i in p.proof]
            entry["reason"] = p.reason
        if p.note:
            entry["note"] = p.note
        parts.append(entry)
    report: dict[str, Any] = {
        "file": str(path),
        "model": model,
        "engine": engine,
        "verdict": result.verdict,
        "ops": len(lines),  # history lines, as for the ledger checker
        "operations": len(operations),  # invocations with their completions
        "partitions": parts,
        "seconds": round(result.seconds, 3),
    }
    sections: list[Section] = []
    if args.html:
        chosen = [p for p in result.partitions if p.verdict != "valid"][:20] or result.partitions[
            :5
        ]
        for p in chosen:
            hot = {p.blocked} if p.blocked is not None else set()
            hot.update(p.proof)
            if p.verdict == "invalid" and p.linearization and not p.proof:
                hot.add(p.linearization[-1])
            order = {op: k for k, op in enumerate(p.linearization, start=1)}
            bars = []
            for i, c in enumerate(p.calls):
                o = operations[c.op]
                status = (
                    "fail" if o.complete is not None and o.complete.type == "fail" else o.status
                )
                bars.append(
                    Bar(
                        str(o.process),
                        c.call,
                        c.ret,
                        m.describe(c.input),
                        status,
                        hot=i in hot,
                        order=order.get(i),
                    )
                )
            notes = []
            if p.reason:
                notes.append(p.reason)
            elif p.verdict == "invalid" and p.blocked is not None:
                notes.append(
                    f"longest linearizable prefix: {len(p.linearization)} operations; then "
                    f"[{p.calls[p.blocked].call}] {m.describe(p.calls[p.blocked].input)} "
                    "cannot take effect before it completes"
                )
            if p.note:
                notes.append(p.note)
            sections.append(Section(f"key {p.key!r}", p.verdict, bars, notes, p.window))
    return report, sections


def _add_durability(report: dict[str, Any], durability: Durability) -> None:
    """The durability check of a ledger history as ``report["durability"]``; its
    anomalies make the file invalid."""
    result = durability.result()
    report["durability"] = result
    if not result["valid"]:
        report["verdict"] = "invalid"


def _jsonable(key: object) -> object:
    return key if isinstance(key, str | int | float | type(None)) else repr(key)


def _print_report(report: dict[str, Any]) -> None:
    head = f"{report['file']}: {report['verdict'].upper()}"
    ops, secs = report["ops"], report["seconds"]
    rate = f", {ops / secs:,.0f} ops/s" if secs > 0 else ""
    print(
        f"{head}  ({report['model']} model, {report['engine']}; {ops:,} ops in {secs:.2f} s{rate})"
    )
    if report["engine"] == "fast":
        print(f"  ledgers: {report['ledgers']}, not linearizable: {len(report['invalid_ledgers'])}")
        for kind, n in sorted(report["anomaly_counts"].items()):
            print(f"  {kind}: {n}")
        for a in report["anomalies"][:SHOW]:
            print(f"    ledger {a['ledger']} {a['kind']}: {a['message']} (ops {a['ops']})")
        _print_durability(report)
        return
    bad = [p for p in report["partitions"] if p["verdict"] != "valid"]
    print(f"  keys: {len(report['partitions'])}, not linearizable or unknown: {len(bad)}")
    for p in bad[:SHOW]:
        if "reason" in p:  # proved by the unique-writes engine
            text = NO_LINEARIZATION_PROOF.render(key=repr(p["key"]), reason=p["reason"])
            line = f"    {NO_LINEARIZATION_PROOF.kind}: {text} (ops {p['proof_ops']})"
        elif "blocked_op" in p:  # the anomaly, in the words bkref spark-check uses too
            text = NO_LINEARIZATION.render(key=repr(p["key"]), blocked=p["blocked"])
            line = (
                f"    {NO_LINEARIZATION.kind}: {text} "
                f"(op [{p['blocked_op']}], after {len(p['linearized_prefix'])} ops)"
            )
        else:
            line = f"    key {p['key']!r}: {p['verdict']}"
        if "note" in p:
            line += f" ({p['note']})"
        print(line)
    _print_durability(report)


def _print_durability(report: dict[str, Any]) -> None:
    if "durability" not in report:
        return
    durability = report["durability"]
    print(f"  {describe(durability)}")
    for kind, n in sorted(durability["counts"].items()):
        print(f"  durability {kind}: {n}")
    for a in durability["anomalies"][:SHOW]:
        print(f"    ledger {a['ledger']} {a['kind']}: {a['message']} (ops {a['ops']})")


def _check_files(
    args: argparse.Namespace, progress: _Progress
) -> tuple[list[dict[str, Any]], list[Section]]:
    """Each history's report, and the timeline's sections; HistoryError or OSError if
    one cannot be read."""
    reports: list[dict[str, Any]] = []
    sections: list[Section] = []
    for path in args.history:
        if not path.exists():
            raise HistoryError("no such file or directory", source=str(path))
        fmt = sniff(path)
        if args.model is not None:
            model = args.model
        elif fmt == "edn":
            model = edn_model(str(path))
        else:
            model = "cas-register" if fmt == "jepsen-log" else "ledger"
        fast = model == "ledger" and args.engine != "search"
        if args.engine == "fast" and model != "ledger":
            raise HistoryError(
                f"--engine fast checks the ledger model only, not {model}", source=str(path)
            )
        if args.engine == "unique" and model not in unique.SUPPORTED:
            raise HistoryError(
                f"--engine unique checks the register, cas-register and kv models, not {model}",
                source=str(path),
            )
        durability = Durability() if model == "ledger" else None
        try:
            if not args.allow_empty:
                _require_ops(path, fmt, model)
            if durability is not None and fast:
                report, secs = _check_ledger_file(path, fmt, args, progress, durability)
            else:
                report, secs = _check_search_file(path, fmt, model, args, progress, durability)
            if durability is not None:
                _add_durability(report, durability)
        except HistoryError as e:  # the models' errors name the index, not the file
            if e.source is not None:
                raise
            raise HistoryError(e.reason, line=e.line, source=str(path)) from None
        reports.append(report)
        sections += [
            replace(s, title=f"{path.name}: {s.title}") if len(args.history) > 1 else s
            for s in secs
        ]
    return reports, sections


def _verdict(reports: list[dict[str, Any]]) -> str:
    verdicts = {r["verdict"] for r in reports}
    return "invalid" if "invalid" in verdicts else "unknown" if "unknown" in verdicts else "valid"


def _write_html(
    out: Path, verdict: str, reports: list[dict[str, Any]], sections: list[Section]
) -> None:
    summary = [f"{r['file']}: {r['verdict']} ({r['ops']:,} ops, {r['seconds']} s)" for r in reports]
    out.write_text(render(f"bkref check: {verdict}", sections, summary), encoding="utf-8")


def write_timeline(history: Path, out: Path) -> str:
    """Check ``history`` as ``bkref check HISTORY --html OUT`` does and write its HTML
    timeline to ``out``, printing nothing; returns the verdict. HistoryError or OSError
    if the history cannot be read."""
    args = _parser().parse_args([str(history), "--html", str(out)])
    reports, sections = _check_files(args, _Progress(quiet=True))
    verdict = _verdict(reports)
    _write_html(out, verdict, reports, sections)
    return verdict


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check_arguments(parser, args)
    started = time.monotonic()
    try:
        reports, sections = _check_files(args, _Progress(quiet=args.json))
    except (HistoryError, OSError) as e:
        if args.json:
            print(json.dumps({"verdict": "unknown", "error": str(e)}))
        print(f"bkref check: {e}", file=sys.stderr)
        return 2
    verdict = _verdict(reports)
    took = time.monotonic() - started
    if args.html:
        _write_html(args.html, verdict, reports, sections)
    if args.json:
        print(json.dumps({"verdict": verdict, "seconds": round(took, 3), "files": reports}))
    else:
        for r in reports:
            _print_report(r)
        if len(reports) > 1:
            print(f"overall: {verdict.upper()} ({took:.2f} s)")
        if args.html:
            print(f"timeline: {args.html}")
    return EXIT[verdict]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
