"""Per-ledger linearizability on Spark: the ledger checker's algorithm in SQL.

The same decision as :mod:`bkref.linearizability.ledger_checker` (read its docstring
for why no search is needed), written only with Spark's built-in operations so
that it runs in the JVM and scales with the cluster:

1. Each operation gets a key ``e``: the entry of an add or read, the value of
   a LAC read; creates, closes and unknown reads, LAC reads and closes get
   negative keys of their own (:data:`CREATES`, :data:`CLOSES`, :data:`OTHER`).
   One aggregation by (run, ledger, e) gathers, per entry, the acknowledged
   adds, the unknown ones, the reads that found it and did not, and the LAC
   reads that returned it, as small sorted arrays (:func:`_per_entry`).
2. One window per ledger, ordered by ``e``, takes the running maxima of the
   chain of adds: the latest invocation among the adds of the entries up to
   ``e`` (the add chosen for each entry: the acknowledged one, else the
   earliest unknown one whose data matches the reads) and among the "no such
   entry" reads of those entries. The same window counts the entries with an
   add, so the first entry never written is known without another pass
   (:func:`_chain`).
3. One aggregation per ledger gives the ledger's facts: the create's floor,
   the first close (by completion) and its last entry, the proven entries,
   hence ``N``, the entries that exist (:func:`_facts`), and what they prove
   alone (:func:`_ledger_anomalies`).
4. Each (ledger, e) row, joined with its ledger's facts, is compared with its
   bounds and yields the anomalies it proves (:func:`_row_anomalies`); the
   entries below ``N`` with no row are skipped (:func:`_skips`); a second pass
   per ledger checks the closes against the chain at ``N - 1``
   (:func:`_close_anomalies`).

The anomaly names, the operations named and the messages are the ledger
checker's: the messages are rendered from the templates of
:mod:`bkref.linearizability.anomalies` by :mod:`bkref.spark_checks.messages`.
Unlike the ledger checker, every anomaly is kept (it keeps 50 per kind and
ledger and counts the rest); the counts agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from bkref.linearizability import anomalies as msg
from bkref.spark_checks.messages import EMPTY_SQL, anomaly, anomaly_sql, when_sql

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

INF: Final = 1 << 62  # the completion of an operation whose outcome is unknown
CREATES: Final = -3
CLOSES: Final = -4
OTHER: Final = -2  # unknown reads, LAC reads and closes: counted, constrain nothing
MALFORMED: Final = -9
KEY: Final = ("run", "ledger")

LEDGER_FS: Final = ("create", "add", "read", "read_lac", "close", "recover")


# The partition key of :func:`frame`: a hash of (run, ledger), a column of its
# own so that every aggregation and window keyed by (run, ledger, ...) finds
# the frame already partitioned (a literal run, when the input has no run
# column, would otherwise hide the partitioning from the planner).
PART: Final = "part"


def frame(paired: DataFrame, partitions: int | None = None) -> DataFrame:
    """The paired operations, typed and narrow, hash-partitioned by (run, ledger):
    one frame for the ledger check, the durability check, validation and the
    summary's figures (cache it).

    Columns: part, run, ledger, f, call, problem (as :func:`load.operations`);
    the ledger checker's view of the operation, null ``e`` for the operations
    it does not record (failed ones, those without a ledger, broken pairings):
    e (its key, see the module's docstring), end (completion index, or
    :data:`INF` if unknown), known (completed ok), data (an add's, a read's),
    found, last (a close's or recovery's last entry); for the durability
    check: ret (completion index), oentry and odata (the completion's entry,
    and an add's completed data); dt (completion time minus invocation time of
    an ok operation, for the latency figures).
    """
    from pyspark.sql import functions as sf

    inv, out = sf.col("i"), sf.col("o")  # parsed once, by load.operations
    f = sf.col("f")
    ok = sf.col("ctype") == "ok"
    fenced = (f == "add") & (sf.col("ctype") == "fail") & (out["error"] == "fenced")
    status = (
        sf.when(ok, "ok")
        .when((sf.col("ctype") == "fail") & ~sf.coalesce(fenced, sf.lit(False)), "fail")
        .otherwise("info")
    )
    recorded = sf.col("problem").isNull() & sf.col("ledger").isNotNull() & (status != "fail")
    known = sf.coalesce(ok, sf.lit(False))
    entry = sf.when(f.isin("add", "read"), inv["entry"])
    malformed = (
        ~f.isin(*LEDGER_FS)
        | (f.isin("add", "read") & (entry.isNull() | (entry < 0)))
        | ((f == "add") & inv["data"].isNull())
        | ((f == "read") & known & (out["found"].isNull() | (out["found"] & out["data"].isNull())))
        | ((f == "read_lac") & known & (out["lac"].isNull() | (out["lac"] < -1)))
        | (
            f.isin("close", "recover")
            & known
            & (out["last_entry"].isNull() | (out["last_entry"] < -1))
        )
    )
    e = (
        sf.when(~recorded, None)
        .when(malformed, MALFORMED)
        .when(f == "add", entry)
        .when(f == "create", CREATES)
        .when(~known, OTHER)
        .when(f == "read", entry)
        .when(f == "read_lac", out["lac"])
        .otherwise(CLOSES)
    )
    df = paired.select(
        sf.xxhash64("run", "ledger").alias(PART),
        "run",
        "ledger",
        "f",
        "call",
        "problem",
        e.cast("long").alias("e"),
        sf.when(known, sf.col("ret")).otherwise(sf.lit(INF)).alias("end"),
        known.alias("known"),
        sf.when(f == "add", inv["data"]).when(f == "read", out["data"]).alias("data"),
        sf.when(f == "read", out["found"]).alias("found"),
        sf.when(f.isin("close", "recover"), out["last_entry"]).alias("last"),
        "ret",
        sf.when(known & f.isin("add", "read"), out["entry"]).alias("oentry"),
        sf.when(known & (f == "add"), out["data"]).alias("odata"),
        sf.when(known, sf.col("t_ret") - sf.col("t_call")).alias("dt"),
    )
    return df.repartition(partitions, PART) if partitions else df.repartition(PART)


# The bounds of an operation that takes effect after add e: the create (floor),
# the latest add of the chain up to e, the latest "no such entry" read of an
# entry up to e. (kind of cause, column of its invocation, column naming its entry)
_CAUSES: Final = (
    ("create", "floor", None),
    ("add", "best_add", "add_e"),
    ("missing", "best_miss", "miss_e"),
)


# The facts of its ledger that each (ledger, e) row is compared with (and "requirer").
_ROW_FACTS: Final = ("floor", "closed_at", "close_op", "close_ret", "close_f", "n0", "n")


def check(ops: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(anomalies, ledgers) of :func:`frame`'s operations: every anomaly with its
    run, ledger and operations; per ledger its operations, entries (N), last
    entry if closed and anomaly count."""
    from pyspark.sql import functions as sf

    g = _chain(_per_entry(ops.where(sf.col("e").isNotNull()))).persist()
    facts = _facts(g).persist()
    rows = g.join(sf.broadcast(facts.select(*KEY, *_ROW_FACTS, "requirer")), list(KEY))
    anomalies = (
        _ledger_anomalies(facts)
        .unionByName(_row_anomalies(rows))
        .unionByName(_skips(rows, facts))
        .unionByName(_close_anomalies(rows, facts))
    )
    ledgers = facts.select(
        *KEY, "operations", sf.col("n").alias("entries"), "closed_at", "malformed"
    )
    return anomalies, ledgers


def _explode(df: DataFrame, anomalies: Column | str) -> DataFrame:
    """One row per anomaly of an array column (its nulls dropped): run, ledger,
    kind, ops, message."""
    from pyspark.sql import functions as sf

    kept = sf.filter(anomalies, lambda a: a.isNotNull())
    return df.select(*KEY, sf.explode(kept).alias("a")).select(*KEY, "a.kind", "a.ops", "a.message")


def _per_entry(lops: DataFrame) -> DataFrame:
    """Step 1: one row per (run, ledger, e), what the ledger's operations say of
    entry e, as small sorted arrays and the scalars that summarize them."""
    from pyspark.sql import functions as sf

    is_add, is_read = sf.col("f") == "add", sf.col("f") == "read"
    known, found = sf.col("known"), sf.col("found")
    e = sf.col("e")

    def arr(cond: Column, *fields: str) -> Column:
        return sf.array_sort(sf.collect_list(sf.when(cond, sf.struct(*fields))))

    is_found = is_read & known & found & (e >= 0)
    is_miss = is_read & known & ~found & (e >= 0)
    is_lac = (sf.col("f") == "read_lac") & known & (e >= -1)
    return lops.groupBy(PART, *KEY, "e").agg(
        sf.count(sf.lit(1)).alias("cnt"),
        sf.min(sf.when(e == MALFORMED, sf.col("call"))).alias("malformed"),
        arr(is_add & known & (e >= 0), "end", "call", "data").alias("ok_adds"),
        arr(is_add & ~known & (e >= 0), "call", "data").alias("opt_adds"),
        arr(is_found, "end", "call", "data").alias("found"),
        arr(is_miss, "end", "call").alias("miss"),
        arr(is_lac, "end", "call").alias("lacs"),
        arr(sf.col("f") == "create", "end", "call").alias("creates"),
        arr(e == CLOSES, "end", "call", "last", "f").alias("closes"),
        # fixed-width summaries of the arrays: the chain's running maximum of
        # the "no such entry" reads, and what :func:`_may_prove` needs
        sf.max(sf.when(is_miss, sf.col("call"))).alias("miss_max"),
        sf.min(sf.when(is_miss, sf.col("end"))).alias("miss_end"),
        sf.min(sf.when(is_found, sf.col("end"))).alias("found_end"),
        sf.min(sf.when(is_found, sf.col("data"))).alias("found_lo"),
        sf.max(sf.when(is_found, sf.col("data"))).alias("found_hi"),
        sf.min(sf.when(is_lac, sf.col("end"))).alias("lac_end"),
    )


def _chain(g: DataFrame) -> DataFrame:
    """Step 2: the add chosen for each entry, and the running maxima of the chain
    (``best_add``, ``best_miss`` and the entries naming them), the entries with
    an add up to e (``adds_upto``) and the previous row's e."""
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    e = sf.col("e")
    found0 = sf.get("found", 0)
    matching = sf.when(
        sf.size("found") > 0, sf.filter("opt_adds", lambda a: a["data"] == found0["data"])
    ).otherwise(sf.col("opt_adds"))
    chosen = sf.when(
        sf.size("ok_adds") > 0,
        sf.struct(
            sf.get("ok_adds", 0)["call"].alias("call"),
            sf.get("ok_adds", 0)["end"].alias("end"),
            sf.get("ok_adds", 0)["data"].alias("data"),
        ),
    ).when(
        sf.size(matching) > 0,
        sf.struct(
            sf.array_min(matching)["call"].alias("call"),
            sf.lit(INF).cast("long").alias("end"),
            sf.array_min(matching)["data"].alias("data"),
        ),
    )
    miss_max = sf.col("miss_max")
    w = Window.partitionBy(PART, *KEY).orderBy("e").rowsBetween(Window.unboundedPreceding, 0)
    has_add = (sf.size("ok_adds") > 0) | (sf.size("opt_adds") > 0)
    g = g.withColumn("chosen", chosen).withColumn("has_add", has_add & (e >= 0))
    g = g.select(
        "*",
        sf.max(sf.struct(sf.col("chosen")["call"].alias("c"), e.alias("e"))).over(w).alias("ba"),
        sf.max(sf.struct(miss_max.alias("c"), e.alias("e"))).over(w).alias("bm"),
        sf.sum(sf.col("has_add").cast("long")).over(w).alias("adds_upto"),
        sf.lag("e").over(Window.partitionBy(PART, *KEY).orderBy("e")).alias("prev_e"),
    )
    return _bests(g, "*").drop("ba", "bm")


def _bests(df: DataFrame, *keep: str) -> DataFrame:
    """``ba`` and ``bm`` (struct of invocation ``c``, entry ``e``) as the chain's
    bounds: best_add, add_e, best_miss, miss_e (-1 where none)."""
    from pyspark.sql import functions as sf

    return df.select(
        *keep,
        sf.coalesce(sf.col("ba")["c"], sf.lit(-1)).alias("best_add"),
        sf.coalesce(sf.col("ba")["e"], sf.lit(-1)).alias("add_e"),
        sf.coalesce(sf.col("bm")["c"], sf.lit(-1)).alias("best_miss"),
        sf.coalesce(sf.col("bm")["e"], sf.lit(-1)).alias("miss_e"),
    )


def _ok_creates() -> Column:
    from pyspark.sql import functions as sf

    return sf.filter(sf.coalesce(sf.col("creates"), sf.array()), lambda c: c["end"] != INF)


def _closes() -> Column:
    """The ledger's closes and recoveries, by completion: the first is the witness."""
    from pyspark.sql import functions as sf

    return sf.coalesce(sf.col("closes"), sf.array())


def _facts(g: DataFrame) -> DataFrame:
    """Step 3: one row per ledger: its operations, the create's floor, the first
    close, the proven entries, hence ``n`` (N, the entries that exist; ``n0``
    before an absurd N is cut at the first entry never written) and the
    operation that requires them (``requirer``)."""
    from pyspark.sql import functions as sf

    e = sf.col("e")
    found0 = sf.get("found", 0)
    evidence = (e >= 0) & (
        (sf.size("ok_adds") > 0) | (sf.size("found") > 0) | (sf.size("lacs") > 0)
    )
    proof = sf.coalesce(sf.get("ok_adds", 0)["call"], found0["call"], sf.get("lacs", 0)["call"])
    facts = g.groupBy(PART, *KEY).agg(
        sf.sum("cnt").alias("operations"),
        sf.min("malformed").alias("malformed"),
        sf.first(sf.when(e == CREATES, sf.col("creates")), ignorenulls=True).alias("creates"),
        sf.first(sf.when(e == CLOSES, sf.col("closes")), ignorenulls=True).alias("closes"),
        sf.max(sf.when(evidence, sf.struct(e.alias("e"), proof.alias("op")))).alias("proven"),
        sf.max(sf.when(sf.col("has_add") & (sf.col("adds_upto") == e + 1), e + 1)).alias("mex"),
        sf.max(sf.when(e >= 0, e)).alias("max_e"),
    )
    creates = sf.coalesce(sf.col("creates"), sf.array())
    floor = sf.coalesce(
        sf.array_min(sf.transform(_ok_creates(), lambda c: c["call"])),
        sf.array_min(sf.transform(creates, lambda c: c["call"])),
        sf.lit(-1),
    )
    first = sf.get(_closes(), 0)
    closed = sf.size(_closes()) > 0
    proven_e = sf.coalesce(sf.col("proven")["e"], sf.lit(-1))
    n_raw = sf.when(closed, first["last"] + 1).otherwise(proven_e + 1)
    requirer = sf.when(closed, first["call"]).otherwise(
        sf.coalesce(sf.col("proven")["op"], sf.lit(-1))
    )
    return facts.select(
        "*",
        floor.alias("floor"),
        sf.when(closed, first["last"]).alias("closed_at"),
        sf.when(closed, first["call"]).alias("close_op"),
        sf.when(closed, first["end"]).alias("close_ret"),
        sf.when(closed, first["f"]).alias("close_f"),
        n_raw.alias("n0"),
        requirer.alias("requirer"),
        (n_raw > 2 * sf.col("operations") + 16).alias("capped"),
    ).withColumn(
        "n",
        sf.when(sf.col("capped"), sf.coalesce(sf.col("mex"), sf.lit(0))).otherwise(sf.col("n0")),
    )


def _ledger_anomalies(facts: DataFrame) -> DataFrame:
    """What a ledger's facts prove: two creates of it, an absurd N, closes that
    disagree with the first."""
    from pyspark.sql import functions as sf

    ok_creates = _ok_creates()
    first = sf.get(_closes(), 0)
    disagreeing = sf.filter(
        _closes(), lambda c: (c["call"] != first["call"]) & (c["last"] != first["last"])
    )
    found = sf.concat(
        sf.array(
            sf.when(
                sf.size(ok_creates) > 1,
                anomaly(
                    msg.DUPLICATE_CREATES,
                    sf.transform(ok_creates, lambda c: c["call"]),  # in completion order
                    n=sf.size(ok_creates),
                    ledger=sf.col("ledger"),
                ),
            ),
            sf.when(
                sf.col("capped"),
                anomaly(
                    msg.SKIPPED_RANGE,
                    [sf.col("requirer")],
                    first=sf.col("n"),
                    last=sf.col("n0") - 1,
                ),
            ),
        ),
        sf.transform(
            disagreeing,
            lambda c: anomaly(
                msg.DISAGREEING_CLOSES,
                [first["call"], c["call"]],
                first_f=first["f"],
                first_last=first["last"],
                f=c["f"],
                last=c["last"],
            ),
        ),
    )
    return _explode(facts, found)


def _row_anomalies(rows: DataFrame) -> DataFrame:
    """What each (ledger, e) row proves, on the few rows that may prove something."""
    from pyspark.sql import functions as sf

    return _explode(rows.where(sf.expr(_may_prove())), sf.expr(_row_anomalies_sql()))


def _skips(rows: DataFrame, facts: DataFrame) -> DataFrame:
    """Entries below N with no row at all: never written (skip)."""
    from pyspark.sql import functions as sf

    e = sf.col("e")
    gaps_lo = sf.greatest(sf.coalesce(sf.col("prev_e"), sf.lit(-1)), sf.lit(-1)) + 1
    gaps_hi = sf.least(e, sf.col("n")) - 1
    gap_rows = rows.where((e >= 0) & (gaps_lo <= gaps_hi)).select(
        *KEY, sf.explode(sf.sequence(gaps_lo, gaps_hi)).alias("gap"), "requirer"
    )
    tail = facts.select(
        *KEY,
        (sf.greatest(sf.coalesce(sf.col("max_e"), sf.lit(-1)), sf.lit(-1)) + 1).alias("lo"),
        (sf.col("n") - 1).alias("hi"),
        "requirer",
    ).where(sf.col("lo") <= sf.col("hi"))
    tail_rows = tail.select(*KEY, sf.explode(sf.sequence("lo", "hi")).alias("gap"), "requirer")
    skip = anomaly(msg.SKIPPED, [sf.col("requirer")], e=sf.col("gap"))
    return (
        gap_rows.unionByName(tail_rows)
        .select(*KEY, skip.alias("a"))
        .select(*KEY, "a.kind", "a.ops", "a.message")
    )


def _close_anomalies(rows: DataFrame, facts: DataFrame) -> DataFrame:
    """The closes that agree with the first, against the chain at N - 1."""
    from pyspark.sql import functions as sf

    e = sf.col("e")
    at_end = (
        rows.where((e >= 0) & (e < sf.col("n")))
        .groupBy(PART, *KEY)
        .agg(
            sf.max(sf.struct(sf.col("best_add").alias("c"), sf.col("add_e").alias("e"))).alias(
                "ba"
            ),
            sf.max(sf.struct(sf.col("best_miss").alias("c"), sf.col("miss_e").alias("e"))).alias(
                "bm"
            ),
        )
    )
    cl = facts.where(sf.size(_closes()) > 0).join(at_end, [PART, *KEY], "left")
    cl = cl.withColumn(
        "c", sf.explode(sf.filter("closes", lambda c: c["last"] == sf.col("closed_at")))
    ).withColumn("e", sf.col("n") - 1)
    cl = _bests(cl, *KEY, "floor", "e", "c")
    return _explode(cl, sf.expr(_too_early_sql("close", "c.call", "c.end", "e", "c.f")))


def with_counts(ledgers: DataFrame, anomalies: DataFrame) -> DataFrame:
    """The ledgers table with each ledger's number of anomalies (pass the
    anomalies once computed, e.g. read back from Parquet, not recomputed)."""
    from pyspark.sql import functions as sf

    counts = anomalies.groupBy(*KEY).agg(sf.count(sf.lit(1)).alias("anomalies"))
    return ledgers.join(counts, list(KEY), "left").select(
        *KEY,
        "operations",
        "entries",
        "closed_at",
        sf.coalesce(sf.col("anomalies"), sf.lit(0)).alias("anomalies"),
        "malformed",
    )


# ---------------------------------------------------------------- SQL text
# The per-row comparisons are written as SQL text: one expression crosses from
# Python to the JVM in one call (building it from Column objects costs
# thousands of calls, seconds on a loaded machine).


def _too_early_sql(victim: str, call: str, ret: str, e: str, f: str = "'close'") -> str:
    """SQL: an array of the anomalies of an operation (a ``victim`` of
    :data:`bkref.linearizability.anomalies.TOO_EARLY`) completed no later than one of
    its bounds (nulls where none)."""
    out = []
    for cause, bound, named in _CAUSES:
        cause_sql = bound if cause == "create" else f"(CASE WHEN {e} >= 0 THEN {bound} ELSE -1 END)"
        m = msg.TOO_EARLY[(cause, victim)]
        out.append(
            when_sql(f"{ret} <= {cause_sql}", m, [cause_sql, call], e=e, c=named or "-1", f=f)
        )
    return "array(" + ", ".join(out) + ")"


def _may_prove() -> str:
    """SQL: false only for (ledger, e) rows that prove no anomaly (most rows), from
    scalars, so that :func:`_row_anomalies` (arrays, lambdas) runs on few rows.
    Each clause covers some of its parts: an operation completed no later than
    one of its bounds (the chosen add, the found reads, the LAC reads: their
    earliest completion against the latest bound), the entry beyond the close
    point or without a chosen add, two acknowledged adds, reads that disagree
    with each other or with the acknowledged add, a "no such entry" read
    completed before the create."""
    bound = (
        "greatest(floor, CASE WHEN e >= 0 THEN best_add ELSE -1 END, "
        "CASE WHEN e >= 0 THEN best_miss ELSE -1 END)"
    )
    ok0 = "get(ok_adds, 0).data"
    clauses = [
        "(closed_at IS NOT NULL AND e >= n0)",
        "(e >= 0 AND e < n AND chosen IS NULL)",
        f"(e >= 0 AND e < n AND chosen IS NOT NULL AND chosen.end <= {bound})",
        f"(e >= 0 AND e < n AND found_end <= {bound})",
        f"(e < n AND lac_end <= {bound})",
        "miss_end <= floor",
        "size(ok_adds) > 1",
        "NOT (found_lo <=> found_hi)",
        f"(size(ok_adds) > 0 AND size(found) > 0 "
        f"AND NOT (found_lo <=> {ok0} AND found_hi <=> {ok0}))",
    ]
    # a null clause proves nothing, as a null condition adds no anomaly there
    return " OR ".join(f"coalesce({c}, false)" for c in clauses)


def _row_anomalies_sql() -> str:
    """SQL: the anomalies one (ledger, e) row proves (e >= 0: an entry; -1: LAC -1)."""
    ok0, found0 = "get(ok_adds, 0)", "get(found, 0)"
    in_chain = "(e >= 0 AND e < n)"
    beyond = "(closed_at IS NOT NULL AND e >= n0)"
    at = {"e": "e", "f": "close_f", "closed_at": "closed_at"}  # past the close point
    no_chosen = f"{in_chain} AND chosen IS NULL"
    singles = [
        # an acknowledged add beyond the close point
        when_sql(
            f"{beyond} AND size(ok_adds) > 0 AND {ok0}.call > close_ret",
            msg.ACK_AFTER_FENCE,
            [f"{ok0}.call", "close_op"],
            **at,
        ),
        when_sql(
            f"{beyond} AND size(ok_adds) > 0 AND {ok0}.call <= close_ret",
            msg.LOST_BEYOND_CLOSE,
            [f"{ok0}.call", "close_op"],
            **at,
        ),
        when_sql(
            f"{beyond} AND size(found) > 0",
            msg.READ_BEYOND_CLOSE,
            [f"{found0}.call", "close_op"],
            **at,
        ),
        # the chain: the add chosen for the entry, or why there is none
        when_sql(
            f"{no_chosen} AND size(opt_adds) > 0",
            msg.READ_UNWRITTEN_DATA,
            [f"{found0}.call", "array_min(opt_adds).call"],
            e="e",
            read=f"{found0}.data",
        ),
        when_sql(
            f"{no_chosen} AND size(opt_adds) = 0 AND size(found) > 0",
            msg.READ_NEVER_WRITTEN,
            [f"{found0}.call"],
            e="e",
        ),
        when_sql(
            f"{no_chosen} AND size(opt_adds) = 0 AND size(found) = 0",
            msg.SKIPPED,
            ["requirer"],
            e="e",
        ),
        when_sql(
            f"{in_chain} AND size(ok_adds) > 0 AND size(found) > 0 AND {found0}.data != {ok0}.data",
            msg.READ_OTHER_DATA,
            [f"{ok0}.call", f"{found0}.call"],
            e="e",
            data=f"{ok0}.data",
            read=f"{found0}.data",
        ),
    ]
    chain_add = (
        f"CASE WHEN {in_chain} AND chosen IS NOT NULL "
        f"THEN {_too_early_sql('add', 'chosen.call', 'chosen.end', 'e')} ELSE {EMPTY_SQL} END"
    )
    duplicates = anomaly_sql(msg.DUPLICATE_ADDS, [f"{ok0}.call", "a.call"], e="e")
    divergent = anomaly_sql(
        msg.DIVERGENT_READS,
        [f"{found0}.call", "r.call"],
        e="e",
        read=f"{found0}.data",
        other="r.data",
    )
    lac_truncated = anomaly_sql(msg.LAC_BEYOND_CLOSE, ["x.call", "close_op"], **at)
    miss_floor = anomaly_sql(msg.TOO_EARLY[("create", "read")], ["floor", "m.call"], e="e")
    parts = [
        "array(" + ", ".join(singles) + ")",
        chain_add,
        f"transform(filter(ok_adds, a -> a.call != {ok0}.call), a -> {duplicates})",
        f"transform(filter(found, r -> r.data != {found0}.data), r -> {divergent})",
        f"transform(filter(lacs, x -> {beyond}), x -> {lac_truncated})",
        f"transform(filter(miss, m -> m.end <= floor), m -> {miss_floor})",
        f"CASE WHEN {in_chain} THEN flatten(transform(found, r -> "
        f"{_too_early_sql('read', 'r.call', 'r.end', 'e')})) ELSE {EMPTY_SQL} END",
        "CASE WHEN e < n THEN flatten(transform(lacs, x -> "
        f"{_too_early_sql('lac', 'x.call', 'x.end', 'e')})) ELSE {EMPTY_SQL} END",
    ]
    return "concat(" + ", ".join(parts) + ")"
