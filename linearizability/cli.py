"""Validate histories and convert them between JSON Lines and Parquet."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from linearizability.history import HistoryError, read_history, write_history


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref history",
        description=(
            "Work with histories in bkref's format (JSON Lines, or Parquet for large ones; "
            "see linearizability/history.py for the format)."
        ),
    )
    sub = p.add_subparsers(dest="action", required=True)
    v = sub.add_parser(
        "validate", help="check that a history is well formed; print counts per operation"
    )
    v.add_argument("history", type=Path, help="a .jsonl file, a .parquet file or a directory")
    c = sub.add_parser("convert", help="convert between JSON Lines and Parquet (by suffix)")
    c.add_argument("source", type=Path)
    c.add_argument("target", type=Path, help="*.parquet for Parquet, anything else for JSON Lines")
    return p


def history_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.action == "validate":
            counts: Counter[tuple[str, str]] = Counter()
            for op in read_history(args.history):
                counts[(op.f, op.type)] += 1
            total = sum(counts.values())
            print(f"{args.history}: valid, {total} ops")
            for (f, typ), n in sorted(counts.items()):
                print(f"  {f:<12} {typ:<7} {n}")
            return 0
        n = write_history(read_history(args.source), args.target)
        print(f"wrote {n} ops to {args.target}")
        return 0
    except HistoryError as e:
        print(f"bkref history: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"bkref history: {e}", file=sys.stderr)
        return 2
