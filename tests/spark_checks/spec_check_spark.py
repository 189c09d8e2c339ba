"""Every named config (what `make spec-check` checks) on Spark and locally: the same
distinct states, explored transitions, depth, new states per level and verdict, or exit 1.

    python -m tests.spark_checks.spec_check_spark [--master URL] [--partitions N] [NAME ...]

`make spec-check-spark` runs it on local[2] over every named config: far longer than
`make spec-check`, since each BFS level is a Spark job (BENCHMARKS.md, 'Model checking on
Spark'). tests/spark_checks/test_spec_bfs.py runs it on one config, and shows it fails on
a difference.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from bkref.spark_checks.spec_bfs import check_on_spark
from bkref.spec.checker import Result, check
from bkref.spec.configs import NAMED

if TYPE_CHECKING:
    from pyspark import SparkContext

FIELDS = ("distinct", "explored", "depth", "complete", "violation", "levels")


def _fields(r: Result) -> dict[str, Any]:
    return {k: getattr(r, k) for k in FIELDS} | {"seconds": round(r.seconds, 1)}


def compare(
    names: list[str],
    sc: SparkContext,
    *,
    partitions: int | None = None,
    spark_max_states: int | None = None,
    log: Any = None,
) -> list[dict[str, Any]]:
    """Per config: both results and whether they agree (``spark_max_states`` stops the
    Spark search early: how the test shows a difference is caught)."""
    rows = []
    for name in names:
        cfg = NAMED[name]
        local = check(cfg)
        on_spark = check_on_spark(cfg, sc=sc, partitions=partitions, max_states=spark_max_states)
        a, b = _fields(local), _fields(on_spark)
        same = all(a[k] == b[k] for k in FIELDS)
        rows.append({"config": name, "same": same, "local": a, "spark": b})
        if log is not None:
            print(
                f"{name}: {'same' if same else 'DIFFERENT'}: local {a}, spark {b}",
                file=log,
                flush=True,
            )
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="spec_check_spark", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", metavar="NAME", help="configs (default: every named)")
    p.add_argument("--master", default="local[2]", help="the Spark master (default local[2])")
    p.add_argument("--partitions", type=int, help="partitions of each level")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in NAMED]
    if unknown:
        print(f"spec_check_spark: unknown config(s) {unknown}", file=sys.stderr)
        return 2
    from bkref.spark_checks.session import session

    started = time.monotonic()
    s = session(args.master, app="bkref spec-check-spark")
    try:
        rows = compare(
            args.names or list(NAMED), s.sparkContext, partitions=args.partitions, log=sys.stdout
        )
    finally:
        s.stop()
    bad = [r["config"] for r in rows if not r["same"]]
    took = time.monotonic() - started
    print(f"{len(rows) - len(bad)} of {len(rows)} configs the same on Spark, {took:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
