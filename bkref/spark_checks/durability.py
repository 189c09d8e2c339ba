"""Durability on Spark: the decision of :mod:`bkref.linearizability.durability`.

Per (run, ledger): the last acknowledged recovery (by invocation) fixes the
close point; every acknowledged add must be at or below it and found, with its
payload, by a read invoked after that recovery completed (the last read that
found it decides; reads that all found nothing are a lost write); no final
read beyond the close point; one payload per entry id (two acknowledged adds
are a ``duplicate``, two final reads with different data a ``divergent-read``).
A ledger never recovered, or with an acknowledged entry at or below its close
point that no final read answered for, is not judged: durability unknown, with
the single-process check's reason. Aggregations and joins only; the anomaly
names, operations and messages are those of the single-process check (one
table of messages, :mod:`bkref.linearizability.anomalies`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from bkref.linearizability import anomalies as msg
from bkref.linearizability.durability import NEVER_RECOVERED, NOT_READ_BACK, READ_IN_PART
from bkref.spark_checks.ledger import PART
from bkref.spark_checks.messages import anomaly

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

KEY: Final = ("run", "ledger")


def check(ops: DataFrame) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(anomalies, totals, unknown) of :func:`bkref.spark_checks.ledger.frame`'s
    operations (partitioned by ledger: no shuffle here): anomalies with run,
    ledger, kind, ops, message; totals one row per run with ``acknowledged``,
    ``final_reads`` and ``ledgers``; unknown one row per ledger not judged, with
    run, ledger, reason, acknowledged, unread."""
    from pyspark.sql import functions as sf

    ok = ops.where(
        sf.col("problem").isNull()
        & sf.col("known")
        & sf.col("ledger").isNotNull()
        & sf.col("f").isin("add", "recover", "read")
    )
    adds = ok.where(sf.col("f") == "add").select(
        PART, *KEY, sf.col("oentry").alias("entry"), sf.col("odata").alias("data"), "call"
    )
    acked = (
        adds.groupBy(PART, *KEY, "entry")
        .agg(
            sf.max(sf.struct("call", "data")).alias("last"),
            sf.min("call").alias("first_call"),
            sf.collect_list("call").alias("calls"),
        )
        .persist()
    )
    recovers = sf.broadcast(
        ok.where(sf.col("f") == "recover")
        .groupBy(PART, *KEY)
        .agg(sf.max(sf.struct("call", "ret", "last")).alias("r"))
        .select(
            *KEY,
            sf.col("r")["call"].alias("rec_call"),
            sf.col("r")["ret"].alias("rec_ret"),
            sf.col("r")["last"].alias("rec_last"),
        )
    )
    found = sf.coalesce(sf.col("found"), sf.lit(False))
    read = sf.when(found, sf.struct("call", "data"))  # null for "no such entry"
    answered = (  # every entry a final read answered for, found or not
        ok.where(sf.col("f") == "read")
        .join(recovers, list(KEY))
        .where(sf.col("call") > sf.col("rec_ret"))
        .groupBy(PART, *KEY, sf.col("oentry").alias("entry"))
        .agg(
            sf.min(read).alias("first"),
            sf.max(read).alias("last_read"),
            sf.collect_list(read).alias("reads"),
        )
        .persist()
    )
    finals = answered.where(sf.col("last_read").isNotNull())

    a = (
        acked.join(recovers, list(KEY), "left")
        .join(answered.withColumn("answered", sf.lit(True)), [PART, *KEY, "entry"], "left")
        .persist()
    )
    data = sf.col("last")["data"]
    add_call = sf.col("last")["call"]
    entry, rec_last = sf.col("entry"), sf.col("rec_last")
    acked_anoms = a.select(
        *KEY,
        sf.when(sf.col("rec_call").isNull(), None)  # undecided: never recovered
        .when(
            sf.col("entry") > sf.col("rec_last"),
            anomaly(
                msg.LOST_BEYOND_CLOSE,
                [add_call, sf.col("rec_call")],
                e=entry,
                f=sf.lit("recovery"),
                closed_at=rec_last,
            ),
        )
        .when(sf.col("answered").isNull(), None)  # undecided: no final read answered
        .when(
            sf.col("last_read").isNull(),
            anomaly(msg.LOST_UNREAD, [add_call, sf.col("rec_call")], e=entry),
        )
        .when(
            sf.col("last_read")["data"] != data,
            anomaly(
                msg.READ_BACK_OTHER_DATA,
                [add_call, sf.col("last_read")["call"]],
                e=entry,
                data=data,
                read=sf.col("last_read")["data"],
            ),
        )
        .alias("a"),
    )
    f = finals.join(recovers, list(KEY))
    truncated = f.where(sf.col("entry") > sf.col("rec_last")).select(
        *KEY,
        anomaly(
            msg.READ_BACK_BEYOND_RECOVERY,
            [sf.col("last_read")["call"], sf.col("rec_call")],
            e=entry,
            last=rec_last,
        ).alias("a"),
    )
    duplicates = (
        acked.select(*KEY, "entry", "first_call", sf.explode("calls").alias("call"))
        .where(sf.col("call") != sf.col("first_call"))
        .select(
            *KEY,
            anomaly(msg.DUPLICATE_ADDS, [sf.col("first_call"), sf.col("call")], e=entry).alias("a"),
        )
    )
    two_payloads = (
        finals.select(*KEY, "entry", "first", sf.explode("reads").alias("r"))
        .where(sf.col("r")["data"] != sf.col("first")["data"])
        .select(
            *KEY,
            anomaly(
                msg.READ_BACK_TWICE,
                [sf.col("first")["call"], sf.col("r")["call"]],
                e=entry,
                read=sf.col("first")["data"],
                other=sf.col("r")["data"],
            ).alias("a"),
        )
    )
    anomalies = (
        acked_anoms.unionByName(truncated)
        .unionByName(duplicates)
        .unionByName(two_payloads)
        .where(sf.col("a").isNotNull())
        .select(*KEY, "a.kind", "a.ops", "a.message")
    )
    # Per ledger: acknowledged entries, those at or below the close point with and
    # without a final read (linearizability.durability.unknown_reason, in SQL).
    below = sf.col("rec_call").isNotNull() & (sf.col("entry") <= sf.col("rec_last"))
    per_ledger = a.groupBy(*KEY).agg(
        sf.count(sf.lit(1)).alias("acknowledged"),
        sf.max(sf.col("rec_call").isNotNull()).alias("recovered"),
        sf.sum((below & sf.col("answered").isNull()).cast("long")).alias("unread"),
        sf.sum((below & sf.col("answered").isNotNull()).cast("long")).alias("read"),
    )
    reason = (
        sf.when(~sf.col("recovered"), NEVER_RECOVERED)
        .when(sf.col("unread") == 0, None)
        .when(sf.col("read") > 0, READ_IN_PART)
        .otherwise(NOT_READ_BACK)
    )
    unknown = per_ledger.select(
        *KEY,
        reason.alias("reason"),
        "acknowledged",
        sf.when(sf.col("recovered"), sf.col("unread"))
        .otherwise(sf.col("acknowledged"))
        .alias("unread"),
    ).where(sf.col("reason").isNotNull())
    totals = (
        per_ledger.groupBy("run")
        .agg(
            sf.sum("acknowledged").alias("acknowledged"),
            sf.count(sf.lit(1)).alias("ledgers"),
        )
        .join(finals.groupBy("run").agg(sf.count(sf.lit(1)).alias("final_reads")), "run", "full")
        .select(
            "run",
            sf.coalesce("acknowledged", sf.lit(0)).alias("acknowledged"),
            sf.coalesce("final_reads", sf.lit(0)).alias("final_reads"),
            sf.coalesce("ledgers", sf.lit(0)).alias("ledgers"),
        )
    )
    return anomalies, totals, unknown
