"""The replication audit: after the heal phase, every entry of every closed
ledger is on the Wq bookies of its segment, and all its replicas agree.

Bookie dumps, the audit's input, are a directory with two tables, each as JSON
Lines (``NAME.jsonl``) or Parquet (``NAME.parquet``, a file or a directory):

``entries``: one row per entry a bookie stores::

    {"bookie": "127.0.0.1:3181", "ledger": 7, "entry": 0, "digest": "9a0364b9"}

``ledgers``: one row per ledger, its metadata as the metadata store holds it::

    {"ledger": 7, "state": "CLOSED", "last_entry": 41, "ensemble_size": 3,
     "write_quorum": 2, "ack_quorum": 2,
     "segments": [{"first_entry": 0, "ensemble": ["b0", "b1", "b2"]},
                  {"first_entry": 20, "ensemble": ["b0", "b3", "b2"]}]}

Both may carry a ``run`` column (a string) to audit several campaign runs at
once. ``digest`` is any text that is equal for equal entry contents (the
entry's stored digest, or a hash of its payload).

An entry ``e`` of a closed ledger belongs to the segment with the largest
``first_entry <= e``; its write set is the bookies at ensemble positions
``(e + i) mod E`` for ``i < Wq`` (round-robin striping, as
``bkref.spec.quorum.write_set_positions``). Anomalies:

- ``under-replicated``: a bookie of the entry's write set does not store it;
- ``digest-mismatch``: the copies on the entry's write set differ (copies on other
  bookies, left over from before a repair moved the segment, are not replicas: see
  ``bkref.linearizability.replication``).

Open or in-recovery ledgers are not audited: their last segment may still be
written or recovered.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final

from bkref.linearizability import anomalies as msg
from bkref.spark_checks.messages import message

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ENTRIES_SCHEMA: Final = "run string, bookie string, ledger long, entry long, digest string"
LEDGERS_SCHEMA: Final = (
    "run string, ledger long, state string, last_entry long, ensemble_size long, "
    "write_quorum long, ack_quorum long, "
    "segments array<struct<first_entry: long, ensemble: array<string>>>"
)


class DumpError(ValueError):
    """The dump directory is missing a table or a column."""


def _candidates(root: Path, name: str) -> tuple[Path, ...]:
    return (root / f"{name}.parquet", root / name, root / f"{name}.jsonl")


def check_dumps(root: Path) -> None:
    """Before Spark starts: ``root`` is a directory with both tables."""
    if not root.is_dir():
        raise DumpError(f"--dumps {root}: not a directory")
    for name in ("entries", "ledgers"):
        if not any(c.exists() for c in _candidates(root, name)):
            raise DumpError(f"{root}: no {name}.jsonl or {name}.parquet")


def _table(spark: SparkSession, root: Path, name: str, schema: str) -> DataFrame:
    from pyspark.sql import functions as sf

    for candidate in _candidates(root, name):
        if not candidate.exists():
            continue
        if candidate.suffix == ".jsonl":
            df = spark.read.schema(schema).json(str(candidate))
        else:
            df = spark.read.option("recursiveFileLookup", "true").parquet(str(candidate))
        wanted = [c.strip().split(" ")[0] for c in _top_level(schema)]
        missing = [c for c in wanted if c not in df.columns and c != "run"]
        if missing:
            raise DumpError(f"{candidate}: missing column(s) {missing}")
        run = sf.col("run").cast("string") if "run" in df.columns else sf.lit("")
        return df.withColumn("run", sf.coalesce(run, sf.lit("")))
    raise DumpError(f"{root}: no {name}.jsonl or {name}.parquet")


def _top_level(schema: str) -> list[str]:
    """The top-level fields of a DDL schema (commas inside <...> do not split)."""
    out, depth, cur = [], 0, ""
    for ch in schema:
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def read_dumps(spark: SparkSession, root: Path) -> tuple[DataFrame, DataFrame]:
    return (
        _table(spark, root, "entries", ENTRIES_SCHEMA),
        _table(spark, root, "ledgers", LEDGERS_SCHEMA),
    )


def audit(entries: DataFrame, ledgers: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(anomalies, details): anomaly rows as the other checks have them, and one
    row per finding with the entry, bookie and digests."""
    from pyspark.sql import functions as sf

    base = ledgers.where((sf.upper("state") == "CLOSED") & (sf.col("last_entry") >= 0)).select(
        "run",
        "ledger",
        sf.col("ensemble_size").cast("int").alias("E"),
        sf.col("write_quorum").cast("int").alias("Wq"),
        sf.array_sort(
            sf.transform(
                "segments",
                lambda s: sf.struct(
                    s["first_entry"].alias("first"), s["ensemble"].alias("ensemble")
                ),
            )
        ).alias("segments"),
        sf.explode(sf.sequence(sf.lit(0).cast("long"), sf.col("last_entry"))).alias("entry"),
    )
    seg = sf.filter("segments", lambda s: s["first"] <= sf.col("entry"))
    ensemble = sf.get(seg, sf.size(seg) - 1)["ensemble"]
    expected = base.select(
        "run",
        "ledger",
        "entry",
        sf.explode(
            sf.transform(
                sf.sequence(sf.lit(0), sf.col("Wq") - 1),
                lambda i: sf.get(ensemble, ((sf.col("entry") + i) % sf.col("E")).cast("int")),
            )
        ).alias("bookie"),
    )
    stored = entries.select("run", "bookie", "ledger", "entry", "digest")
    missing = expected.join(stored, ["run", "ledger", "entry", "bookie"], "left_anti").select(
        "run",
        "ledger",
        "entry",
        sf.lit("under-replicated").alias("kind"),
        sf.array("bookie").alias("bookies"),
        sf.array().cast("array<string>").alias("digests"),
        message(
            msg.NOT_ON_WRITE_SET,
            e=sf.col("entry"),
            ledger=sf.col("ledger"),
            bookie=sf.coalesce(sf.col("bookie"), sf.lit("?")),
        ).alias("message"),
    )
    replicas = expected.join(stored, ["run", "ledger", "entry", "bookie"])
    mismatch = (
        replicas.groupBy("run", "ledger", "entry")
        .agg(
            sf.array_sort(sf.collect_list(sf.struct("digest", "bookie"))).alias("replicas"),
            sf.countDistinct("digest").alias("digests_n"),
        )
        .where(sf.col("digests_n") > 1)
        .select(
            "run",
            "ledger",
            "entry",
            sf.lit("digest-mismatch").alias("kind"),
            sf.transform("replicas", lambda r: r["bookie"]).alias("bookies"),
            sf.transform("replicas", lambda r: r["digest"]).alias("digests"),
            message(
                msg.REPLICAS_DIFFER,
                e=sf.col("entry"),
                ledger=sf.col("ledger"),
                copies=sf.array_join(
                    sf.transform(
                        "replicas", lambda r: sf.concat(r["bookie"], sf.lit("="), r["digest"])
                    ),
                    ", ",
                ),
            ).alias("message"),
        )
    )
    details = missing.unionByName(mismatch)
    anomalies = details.select(
        "run", "ledger", "kind", sf.array().cast("array<long>").alias("ops"), "message"
    )
    return anomalies, details
