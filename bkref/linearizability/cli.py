"""Validate histories, convert them between JSON Lines and Parquet, export them as EDN."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from bkref.linearizability.edn_history import plan_export, write_edn
from bkref.linearizability.history import HistoryError, Op
from bkref.linearizability.history_files import nonempty, read_history, write_history
from bkref.linearizability.models import MODELS

EMPTY_HINT = "; --allow-empty accepts it"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref history",
        description=(
            "Work with histories in bkref's format (JSON Lines, or Parquet for large ones; "
            "see bkref/linearizability/history.py for the format)."
        ),
        epilog=(
            "exit status: 0 done, 2 bad input: a file that cannot be read or parsed, a "
            "malformed history, or one with no operations (unless --allow-empty)"
        ),
    )
    sub = p.add_subparsers(dest="action", required=True)
    v = sub.add_parser(
        "validate",
        help="check that a history is well formed; print counts per operation",
        epilog="exit status: 0 valid, 2 unreadable, malformed or empty (no operations)",
    )
    v.add_argument("history", type=Path, help="a .jsonl file, a .parquet file or a directory")
    c = sub.add_parser(
        "convert",
        help="convert between JSON Lines and Parquet (by suffix)",
        epilog="exit status: 0 written, 2 the source is unreadable, malformed or empty "
        "(no operations), or the target cannot be written (a partial target is removed)",
    )
    c.add_argument("source", type=Path)
    c.add_argument("target", type=Path, help="*.parquet for Parquet, anything else for JSON Lines")
    e = sub.add_parser(
        "export",
        help="write a history in Jepsen's format (history.edn), for Knossos, Elle and Jepsen",
        description=(
            "Write a bkref history as Jepsen writes history.edn: one EDN map per operation "
            "per line (:index, :time, :type, :process, :f, :value), values shaped as "
            "Jepsen's tests write them for the model; see bkref/linearizability/edn_history.py."
        ),
        epilog="exit status: 0 written, 2 the source is unreadable, malformed or empty (no "
        "operations), an op has no EDN shape for the model, or the target cannot be written "
        "(a partial target is removed)",
    )
    e.add_argument("source", type=Path, help="a .jsonl file, a .parquet file or a directory")
    e.add_argument("--format", choices=("edn",), default="edn", help="the format to write (edn)")
    e.add_argument(
        "--model",
        choices=sorted(MODELS),
        default=None,
        help="the model whose value shapes to write (default: from the operations)",
    )
    e.add_argument("-o", "--output", type=Path, default=None, help="write here (default: stdout)")
    for sp in (v, c, e):
        sp.add_argument(
            "--allow-empty",
            action="store_true",
            help="accept a history without operations (by default: bad input, exit 2)",
        )
    return p


def _ops(path: Path, allow_empty: bool) -> Iterator[Op]:
    ops = read_history(path)
    return ops if allow_empty else nonempty(ops, str(path), hint=EMPTY_HINT)


def _convert(source: Path, target: Path, allow_empty: bool) -> int:
    if target.is_dir():
        raise HistoryError("is a directory; expected a file to write", source=str(target))
    existed = target.exists()
    try:
        return write_history(_ops(source, allow_empty), target)
    except BaseException:
        if not existed:  # no half-written history is left behind
            target.unlink(missing_ok=True)
        raise


def _export(args: argparse.Namespace) -> int:
    """Two passes over the source: the first decides the model and, for
    registers, whether ops carry a ledger; the second writes."""
    model, keyed = plan_export(_ops(args.source, args.allow_empty), args.model)
    ops = read_history(args.source)
    out: Path | None = args.output
    if out is None:
        n = write_edn(ops, sys.stdout, model, keyed=keyed)
        sys.stdout.flush()
        return n
    if out.is_dir():
        raise HistoryError("is a directory; expected a file to write", source=str(out))
    existed = out.exists()
    try:
        with open(out, "w", encoding="utf-8") as stream:
            return write_edn(ops, stream, model, keyed=keyed)
    except BaseException:
        if not existed:  # no half-written history is left behind
            out.unlink(missing_ok=True)
        raise


def history_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.action == "validate":
            counts: Counter[tuple[str, str]] = Counter()
            for op in _ops(args.history, args.allow_empty):
                counts[(op.f, op.type)] += 1
            total = sum(counts.values())
            print(f"{args.history}: valid, {total} ops")
            for (f, typ), n in sorted(counts.items()):
                print(f"  {f:<12} {typ:<7} {n}")
            return 0
        if args.action == "export":
            n = _export(args)
            if args.output is not None:
                print(f"wrote {n} ops to {args.output}", file=sys.stderr)
            return 0
        n = _convert(args.source, args.target, args.allow_empty)
        print(f"wrote {n} ops to {args.target}")
        return 0
    except HistoryError as e:
        if e.source is None and args.action == "export":  # the writer names the index only
            e = HistoryError(e.reason, source=str(args.source))
        print(f"bkref history: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        where = e.filename if e.filename is not None else args.action
        print(f"bkref history: {where}: {e.strerror or e}", file=sys.stderr)
        return 2
