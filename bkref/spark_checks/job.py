"""Check very large histories on Spark: linearizability, durability, replication.

    bkref spark-check PATH [--master URL] [--out DIR] [--model M] [--dumps DIR]
    spark-submit bkref/spark_checks/job.py PATH [--out DIR] ...

PATH is a history in bkref's format: a Parquet file or directory (with a
``run`` column when several campaign runs are checked together), or JSON Lines
(a file, or a directory of them such as a campaign's, one run per file),
converted to Parquet on the way in. The jobs run on ``local[*]`` unless
``--master`` (or spark-submit) names a cluster:

- linearizable: the ledger checker's algorithm per ledger, in Spark SQL
  (:mod:`bkref.spark_checks.ledger`); for other models the generic search per key
  through applyInPandas (:mod:`bkref.spark_checks.generic`);
- durability: acknowledged adds against the final reads after each ledger's
  last recovery (:mod:`bkref.spark_checks.durability`);
- replication (with ``--dumps``): every entry of every closed ledger on the Wq
  bookies of its segment, with equal digests (:mod:`bkref.spark_checks.replication`).

Results go to DIR (default ``out/spark-check``): Parquet tables, summary.json
and index.html (:mod:`bkref.spark_checks.report`). Exit status: 0 valid, 1 anomalies
found, 2 could not run (bad input, Spark failed, or a search ran out of time).
Bad input is found before Spark starts where that is cheap (see
:func:`bkref.spark_checks.load.check_input`): a missing or unreadable path, a file
that is not Parquet or UTF-8 JSON Lines, an empty history (no operations;
``--allow-empty`` accepts it), numbers out of range.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from bkref.linearizability.durability import describe
from bkref.linearizability.history import HistoryError
from bkref.spec.cli_args import positive_float, positive_int

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

EXAMPLES: Final = 50  # anomalies shown on the HTML page
ANOMALY_COLUMNS: Final = ("check", "run", "ledger", "kind", "ops", "message")


class Progress:
    """One line per stage on stderr: ``bkref spark-check: [2/6] ... (12.3 s)``."""

    def __init__(self, stages: int, quiet: bool = False) -> None:
        self.stages = stages
        self.n = 0
        self.quiet = quiet
        self.started = time.monotonic()

    def __call__(self, what: str) -> None:
        self.n += 1
        if not self.quiet:
            took = time.monotonic() - self.started
            print(
                f"bkref spark-check: [{self.n}/{self.stages}] {what} ({took:.1f} s)",
                file=sys.stderr,
                flush=True,
            )


@dataclass
class Checks:
    """The checks' DataFrames over one input (lazy until written or collected)."""

    paired: DataFrame
    anomalies: dict[str, DataFrame] = field(default_factory=dict)  # check -> anomaly rows
    tables: dict[str, DataFrame] = field(default_factory=dict)  # name -> table to write
    extra: dict[str, DataFrame] = field(default_factory=dict)


def prepare(
    spark: SparkSession,
    path: Path,
    *,
    workdir: Path | None = None,
    figures: dict[str, int] | None = None,
    model: str = "ledger",
) -> DataFrame:
    """Read, pair and validate a history; the operations are cached. For the
    ledger model, :func:`bkref.spark_checks.ledger.frame` of the paired operations
    (narrow, partitioned by ledger, the input of both the ledger and the
    durability check); for the others the paired operations with their values'
    JSON text (the generic checker's input).
    ``figures`` (if given) receives ``lines``: the history's lines, nemesis included."""
    from bkref.spark_checks import load

    ops = load.read_ops(spark, path, workdir=workdir)
    if model == "ledger":
        from bkref.spark_checks import ledger

        paired = ledger.frame(load.operations(ops, text=False)).persist()
    else:
        paired = load.operations(ops, text=True).persist()
    load.validate(paired)
    if figures is not None:
        figures["lines"] = ops.count()
    return paired


def build(
    paired: DataFrame,
    *,
    model: str = "ledger",
    dumps: tuple[DataFrame, DataFrame] | None = None,
    budget: float | None = None,
) -> Checks:
    """The checks for ``model`` (and the replication audit given dumps) over
    :func:`prepare`'s operations for that model."""
    from pyspark.sql import functions as sf

    checks = Checks(paired)
    if model == "ledger":
        from bkref.spark_checks import durability, ledger

        lin, ledgers = ledger.check(paired)
        checks.anomalies["linearizable"] = lin
        checks.tables["ledgers"] = ledgers
        dur, totals, unknown = durability.check(paired)
        checks.anomalies["durability"] = dur
        checks.extra["durability_totals"] = totals
        checks.tables["durability_unknown"] = unknown
    else:
        from bkref.spark_checks import generic

        keys = generic.check(paired, model, budget=budget).persist()
        checks.tables["keys"] = keys
        checks.anomalies["linearizable"] = generic.anomalies(keys)
    if dumps is not None:
        from bkref.spark_checks import replication

        rep, details = replication.audit(*dumps)
        checks.anomalies["replication"] = rep
        checks.tables["replication"] = details
    for name, df in checks.anomalies.items():
        checks.anomalies[name] = df.select(
            sf.lit(name).alias("check"),
            "run",
            sf.col("ledger").cast("long").alias("ledger"),
            "kind",
            "ops",
            "message",
        )
    return checks


def _durability_summary(
    totals: DataFrame, unknown: DataFrame, counts: dict[str, int]
) -> dict[str, Any]:
    """The durability figures in :func:`bkref.linearizability.durability.check_durability`'s
    fields (``describe`` words them), summed over the runs."""
    from pyspark.sql import functions as sf

    t = totals.agg(*(sf.sum(c).alias(c) for c in ("acknowledged", "final_reads", "ledgers")))
    row = t.first()
    assert row is not None
    reasons = {
        r["reason"]: int(r["n"])
        for r in unknown.groupBy("reason").agg(sf.count(sf.lit(1)).alias("n")).collect()
    }
    return {
        "acknowledged": int(row["acknowledged"] or 0),
        "final_reads": int(row["final_reads"] or 0),
        "ledgers": int(row["ledgers"] or 0),
        "counts": counts,
        "unknown_ledgers": sum(reasons.values()),
        "unknown": reasons,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref spark-check",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
        epilog="exit status: 0 valid, 1 anomalies found, 2 could not run: bad input (an "
        "unreadable or malformed history, or one with no operations unless --allow-empty), "
        "Spark failed, or a search ran out of time",
    )
    p.add_argument("path", type=Path, help="history: Parquet file/directory or JSON Lines")
    p.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    p.add_argument("--out", type=Path, default=Path("out/spark-check"), help="output directory")
    p.add_argument(
        "--model",
        default="ledger",
        choices=("ledger", "register", "cas-register", "kv"),
        help="ledger (default): the search-free ledger checker and durability; "
        "others: the generic search per key",
    )
    p.add_argument("--dumps", type=Path, help="bookie dumps for the replication audit")
    p.add_argument(
        "--budget", type=positive_float, help="seconds (> 0) per key for the generic search"
    )
    p.add_argument(
        "--partitions", type=positive_int, help="shuffle partitions (default: 2 per core)"
    )
    p.add_argument(
        "--allow-empty",
        action="store_true",
        help="accept a history without operations (by default: bad input, exit 2)",
    )
    p.add_argument("--verbose", action="store_true", help="Spark's warnings on stderr")
    p.add_argument("--progress-bar", action="store_true", help="Spark's console progress bar")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def run(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as sf

    from bkref.spark_checks import report, session

    started = time.monotonic()
    progress = Progress(6 if args.dumps else 5, quiet=args.quiet)
    spark = session.session(
        args.master,
        verbose=args.verbose,
        shuffle_partitions=args.partitions,
        progress_bar=args.progress_bar,
        input_bytes=session.input_bytes(args.path),
    )
    master = spark.sparkContext.master
    progress(f"Spark {spark.version} on {master}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bkref-spark-"))
    try:
        figures: dict[str, int] = {}
        paired = prepare(spark, args.path, workdir=work, figures=figures, model=args.model)
        ops_total = paired.agg(
            sf.count(sf.lit(1)).alias("operations"), sf.countDistinct("run").alias("runs")
        ).first()
        assert ops_total is not None
        progress(
            f"read {args.path}: {ops_total['operations']:,} operations "
            f"in {ops_total['runs']} run(s)"
        )
        dumps = None
        if args.dumps:
            from bkref.spark_checks import replication

            dumps = replication.read_dumps(spark, args.dumps)
        checks = build(paired, model=args.model, dumps=dumps, budget=args.budget)
        anomalies = None
        for df in checks.anomalies.values():
            anomalies = df if anomalies is None else anomalies.unionByName(df)
        assert anomalies is not None
        anomalies.write.mode("overwrite").parquet(str(out / "anomalies"))
        written = spark.read.parquet(str(out / "anomalies"))
        found = report.counts(written)
        progress(
            "checked "
            + ", ".join(
                f"{c}: {sum(found.get(c, {}).values()):,} anomalies" for c in checks.anomalies
            )
        )
        summary: dict[str, Any] = {
            "path": str(args.path),
            "master": master,
            "model": args.model,
            "runs": ops_total["runs"],
            "ops": figures["lines"],
            "operations": ops_total["operations"],
            "anomalies": {c: found.get(c, {}) for c in checks.anomalies},
        }
        for name, df in checks.tables.items():
            if name == "ledgers":
                from bkref.spark_checks.ledger import with_counts

                lin = written.where(sf.col("check") == "linearizable")
                df = with_counts(df, lin)  # noqa: PLW2901 - the table as written
            df.write.mode("overwrite").parquet(str(out / name))
        if "ledgers" in checks.tables:
            ledgers = spark.read.parquet(str(out / "ledgers"))
            bad = ledgers.where(sf.col("malformed").isNotNull()).orderBy("run", "malformed").first()
            if bad is not None:
                where = f"run {bad['run']!r} " if bad["run"] else ""
                raise HistoryError(
                    f"{where}index {bad['malformed']}: not a ledger operation, "
                    "or its value lacks a field the ledger model needs"
                )
            summary["ledgers"] = ledgers.count()
            summary["durability"] = _durability_summary(
                checks.extra["durability_totals"],
                spark.read.parquet(str(out / "durability_unknown")),
                found.get("durability", {}),
            )
        unknown = 0
        if "keys" in checks.tables:
            keys = spark.read.parquet(str(out / "keys"))
            summary["keys"] = keys.count()
            unknown = keys.where(sf.col("verdict") == "unknown").count()
            summary["unknown_keys"] = unknown
        progress("wrote tables")
        summary["latency_ms"] = report.latency(paired)
        any_anomaly = any(found.get(c) for c in checks.anomalies)
        summary["verdict"] = "invalid" if any_anomaly else "unknown" if unknown else "valid"
        summary["seconds"] = round(time.monotonic() - started, 1)
        examples = [
            r.asDict()
            for r in written.orderBy("check", "run", "ledger", "kind").limit(EXAMPLES).collect()
        ]
        report.write_json(summary, out)
        page = report.write_html(summary, examples, out)
        progress(f"{summary['verdict']}: summary in {out / 'summary.json'}, page {page}")
        if not args.quiet:
            if "durability" in summary:
                print(describe(summary["durability"]))
            for check, kinds in summary["anomalies"].items():
                for kind, n in kinds.items():
                    print(f"  {check} {kind}: {n:,}")
        return 1 if any_anomaly else 2 if unknown else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_arguments(args: argparse.Namespace) -> None:
    """Bad input found without Spark: raises HistoryError or ValueError."""
    from bkref.spark_checks import load

    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out}: not a directory")
    if args.dumps is not None:
        from bkref.spark_checks import replication

        replication.check_dumps(args.dumps)
    load.check_input(args.path, allow_empty=args.allow_empty)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        _check_arguments(args)
        return run(args)
    except (HistoryError, OSError, ValueError) as e:
        print(f"bkref spark-check: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a failed Spark job: its message, not a JVM stack
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"bkref spark-check: Spark failed: {first}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # spark-submit bkref/spark_checks/job.py ...
    sys.exit(main())
