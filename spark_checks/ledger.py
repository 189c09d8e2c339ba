"""Per-ledger linearizability on Spark: the ledger checker's algorithm in SQL.

The same decision as :mod:`linearizability.ledger_checker` (read its docstring
for why no search is needed), written only with Spark's built-in operations so
that it runs in the JVM and scales with the cluster:

1. Each operation gets a key ``e``: the entry of an add or read, the value of
   a LAC read; creates, closes and unknown reads, LAC reads and closes get
   negative keys of their own (:data:`CREATES`, :data:`CLOSES`, :data:`OTHER`).
   One aggregation by (run, ledger, e) gathers, per entry, the acknowledged
   adds, the unknown ones, the reads that found it and did not, and the LAC
   reads that returned it, as small sorted arrays.
2. One window per ledger, ordered by ``e``, takes the running maxima of the
   chain of adds: the latest invocation among the adds of the entries up to
   ``e`` (the add chosen for each entry: the acknowledged one, else the
   earliest unknown one whose data matches the reads) and among the "no such
   entry" reads of those entries. The same window counts the entries with an
   add, so the first entry never written is known without another pass.
3. One aggregation per ledger gives the ledger's facts: the create's floor,
   the first close (by completion) and its last entry, the proven entries,
   hence ``N``, the entries that exist.
4. Each (ledger, e) row, joined with its ledger's facts, is compared with its
   bounds and yields the anomalies it proves; a second pass per ledger checks
   the closes against the chain at ``N - 1``.

The anomaly names, the operations named and the messages are the ledger
checker's (messages quote data as Python's ``repr`` does for printable text).
Unlike the ledger checker, every anomaly is kept (it keeps 50 per kind and
ledger and counts the rest); the counts agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

INF: Final = 1 << 62  # the completion of an operation whose outcome is unknown
CREATES: Final = -3
CLOSES: Final = -4
OTHER: Final = -2  # unknown reads, LAC reads and closes: counted, constrain nothing
MALFORMED: Final = -9
KEY: Final = ("run", "ledger")

LEDGER_FS: Final = ("create", "add", "read", "read_lac", "close", "recover")

ANOMALY_SCHEMA: Final = "kind string, ops array<long>, message string"


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


def _repr(c: Column) -> Column:
    """Python's repr of a str, for printable text without both kinds of quote."""
    from pyspark.sql import functions as sf

    plain = sf.regexp_replace(c, r"\\", r"\\\\")
    return (
        sf.when(~c.contains("'"), sf.concat(sf.lit("'"), plain, sf.lit("'")))
        .when(~c.contains('"'), sf.concat(sf.lit('"'), plain, sf.lit('"')))
        .otherwise(sf.concat(sf.lit("'"), sf.regexp_replace(plain, "'", r"\\'"), sf.lit("'")))
    )


def _s(c: Column | int) -> Column:
    from pyspark.sql import functions as sf

    return (sf.lit(c) if isinstance(c, int) else c).cast("string")


def _anomaly(cond: Column, kind: str | Column, ops: list[Column], *message: Column | str) -> Column:
    from pyspark.sql import functions as sf

    parts = [sf.lit(m) if isinstance(m, str) else m for m in message]
    return sf.when(
        cond,
        sf.struct(
            (sf.lit(kind) if isinstance(kind, str) else kind).alias("kind"),
            _ops(ops).alias("ops"),
            sf.concat(*parts).alias("message"),
        ),
    )


def _ops(ops: list[Column]) -> Column:
    from pyspark.sql import functions as sf

    if not ops:
        return sf.array().cast("array<long>")
    return sf.array(*[o.cast("long") for o in ops])


# The bounds of an operation that takes effect after add e: the create (floor),
# the latest add of the chain up to e, the latest "no such entry" read of an
# entry up to e. (kind of cause, column of its invocation, column naming its entry)
_CAUSES: Final = (
    ("create", "floor", None),
    ("add", "best_add", "add_e"),
    ("missing", "best_miss", "miss_e"),
)


def check(ops: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(anomalies, ledgers) of :func:`frame`'s operations: every anomaly with its
    run, ledger and operations; per ledger its operations, entries (N), last
    entry if closed and anomaly count."""
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    lops = ops.where(sf.col("e").isNotNull())
    is_add, is_read = sf.col("f") == "add", sf.col("f") == "read"
    known, found = sf.col("known"), sf.col("found")
    e = sf.col("e")

    def arr(cond: Column, *fields: str) -> Column:
        return sf.array_sort(sf.collect_list(sf.when(cond, sf.struct(*fields))))

    is_found = is_read & known & found & (e >= 0)
    is_miss = is_read & known & ~found & (e >= 0)
    is_lac = (sf.col("f") == "read_lac") & known & (e >= -1)
    g = lops.groupBy(PART, *KEY, "e").agg(
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

    # The add chosen for entry e, and the running maxima of the chain.
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
    g = g.select(
        "*",
        sf.coalesce(sf.col("ba")["c"], sf.lit(-1)).alias("best_add"),
        sf.coalesce(sf.col("ba")["e"], sf.lit(-1)).alias("add_e"),
        sf.coalesce(sf.col("bm")["c"], sf.lit(-1)).alias("best_miss"),
        sf.coalesce(sf.col("bm")["e"], sf.lit(-1)).alias("miss_e"),
    ).drop("ba", "bm")
    g = g.persist()

    # The ledger's facts.
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
    ok_creates = sf.filter(creates, lambda c: c["end"] != INF)
    floor = sf.coalesce(
        sf.array_min(sf.transform(ok_creates, lambda c: c["call"])),
        sf.array_min(sf.transform(creates, lambda c: c["call"])),
        sf.lit(-1),
    )
    closes = sf.coalesce(sf.col("closes"), sf.array())
    first = sf.get(closes, 0)
    closed = sf.size(closes) > 0
    proven_e = sf.coalesce(sf.col("proven")["e"], sf.lit(-1))
    n_raw = sf.when(closed, first["last"] + 1).otherwise(proven_e + 1)
    requirer = sf.when(closed, first["call"]).otherwise(
        sf.coalesce(sf.col("proven")["op"], sf.lit(-1))
    )
    facts = facts.select(
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
    facts = facts.persist()

    ledger_anoms = sf.concat(
        sf.array(
            _anomaly(
                sf.size(ok_creates) > 1,
                "duplicate",
                [],
                _s(sf.size(ok_creates)),
                " creates returned ledger ",
                _s(sf.col("ledger")),
            ),
            _anomaly(
                sf.col("capped"),
                "skip",
                [sf.col("requirer")],
                "entries ",
                _s(sf.col("n")),
                "..",
                _s(sf.col("n0") - 1),
                " were never written, yet ",
                _s(sf.col("n0") - 1),
                " exists",
            ),
        ),
        sf.transform(
            sf.filter(
                closes, lambda c: (c["call"] != first["call"]) & (c["last"] != first["last"])
            ),
            lambda c: sf.struct(
                sf.lit("disagreeing-closes").alias("kind"),
                sf.array(first["call"].cast("long"), c["call"].cast("long")).alias("ops"),
                sf.concat(
                    first["f"],
                    sf.lit(" closed at entry "),
                    _s(first["last"]),
                    sf.lit(" but "),
                    c["f"],
                    sf.lit(" at entry "),
                    _s(c["last"]),
                ).alias("message"),
            ),
        ),
    )
    # the duplicate creates' ops: every ok create, in completion order
    ledger_level = facts.select(
        *KEY,
        sf.explode(sf.filter(ledger_anoms, lambda a: a.isNotNull())).alias("a"),
        sf.transform(ok_creates, lambda c: c["call"].cast("long")).alias("create_ops"),
    ).select(
        *KEY,
        sf.col("a")["kind"].alias("kind"),
        sf.when(sf.col("a")["kind"] == "duplicate", sf.col("create_ops"))
        .otherwise(sf.col("a")["ops"])
        .alias("ops"),
        sf.col("a")["message"].alias("message"),
    )

    rows = g.join(
        sf.broadcast(
            facts.select(
                *KEY,
                "floor",
                "closed_at",
                "close_op",
                "close_ret",
                "close_f",
                "n0",
                "n",
                "requirer",
            )
        ),
        list(KEY),
    )
    rows_anoms = rows.where(sf.expr(_may_prove())).withColumn("rows_anoms", _row_anomalies())
    row_level = rows_anoms.select(
        *KEY, sf.explode(sf.filter("rows_anoms", lambda a: a.isNotNull())).alias("a")
    ).select(*KEY, "a.kind", "a.ops", "a.message")

    # Entries below N with no row at all: never written (skip).
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
    skips = gap_rows.unionByName(tail_rows).select(
        *KEY,
        sf.lit("skip").alias("kind"),
        sf.array(sf.col("requirer").cast("long")).alias("ops"),
        sf.concat(
            sf.lit("entry "),
            _s(sf.col("gap")),
            sf.lit(" was never written, yet a later entry exists"),
        ).alias("message"),
    )

    # Closes against the chain at N - 1.
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
    cl = facts.where(sf.size(sf.coalesce("closes", sf.array())) > 0).join(
        at_end, [PART, *KEY], "left"
    )
    cl = cl.select(
        *KEY,
        "floor",
        (sf.col("n") - 1).alias("e"),
        sf.coalesce(sf.col("ba")["c"], sf.lit(-1)).alias("best_add"),
        sf.coalesce(sf.col("ba")["e"], sf.lit(-1)).alias("add_e"),
        sf.coalesce(sf.col("bm")["c"], sf.lit(-1)).alias("best_miss"),
        sf.coalesce(sf.col("bm")["e"], sf.lit(-1)).alias("miss_e"),
        sf.explode(sf.filter("closes", lambda c: c["last"] == sf.col("closed_at"))).alias("c"),
    )
    close_level = cl.select(
        *KEY,
        sf.explode(
            sf.filter(
                sf.expr(_too_early_sql("close", "c.call", "c.end", "e", "c.f")),
                lambda a: a.isNotNull(),
            )
        ).alias("a"),
    ).select(*KEY, "a.kind", "a.ops", "a.message")

    anomalies = ledger_level.unionByName(row_level).unionByName(skips).unionByName(close_level)
    ledgers = facts.select(
        *KEY, "operations", sf.col("n").alias("entries"), "closed_at", "malformed"
    )
    return anomalies, ledgers


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


def _q(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _repr_sql(c: str) -> str:
    """Python's repr of a str, for printable text (as :func:`_repr`)."""
    sq, dq, bs = _q("'"), _q('"'), _q("\\")
    plain = f"replace({c}, {bs}, {_q(chr(92) * 2)})"
    return (
        f"CASE WHEN instr({c}, {sq}) = 0 THEN concat({sq}, {plain}, {sq}) "
        f"WHEN instr({c}, {dq}) = 0 THEN concat({dq}, {plain}, {dq}) "
        f"ELSE concat({sq}, replace({plain}, {sq}, {_q(chr(92) + chr(39))}), {sq}) END"
    )


def _msg(*parts: str) -> str:
    """concat of parts: ``"text"`` pieces are literals, ``{expr}`` pieces SQL."""
    out = []
    for part in parts:
        if part.startswith("{") and part.endswith("}"):
            out.append(f"cast({part[1:-1]} as string)")
        else:
            out.append(_q(part))
    return "concat(" + ", ".join(out) + ")"


def _struct_sql(kind: str, ops: list[str], message: str) -> str:
    arr = ", ".join(f"cast({o} as bigint)" for o in ops)
    return f"named_struct('kind', {_q(kind)}, 'ops', array({arr}), 'message', {message})"


def _when_sql(cond: str, kind: str, ops: list[str], message: str) -> str:
    return f"CASE WHEN {cond} THEN {_struct_sql(kind, ops, message)} END"


_EMPTY_SQL: Final = "cast(array() as array<struct<kind:string,ops:array<bigint>,message:string>>)"


def _too_early_sql(victim: str, call: str, ret: str, e: str, f: str = "'close'") -> str:
    """SQL: an array of the anomalies of an operation
    completed no later than one of its bounds (nulls where none)."""
    out = []
    es = "{" + e + "}"
    fs = "{" + f + "}"
    for cause, bound, named in _CAUSES:
        c = "{" + (named or "-1") + "}"
        kind = (
            "stale-read"
            if cause == "missing"
            else ("nonmonotonic" if cause == victim == "add" else "future-read")
        )
        before = " completed before the ledger's create was invoked"
        templates: dict[str, dict[str, tuple[str, ...]]] = {
            "create": {
                "add": ("add of entry ", es, before),
                "read": ("read of entry ", es, before),
                "lac": ("read_lac" + before,),
                "close": (fs, before),
            },
            "add": {
                "add": (
                    "add of entry ",
                    es,
                    " was acknowledged before the add of entry ",
                    c,
                    " was invoked",
                ),
                "read": ("read found entry ", es, " before the add of entry ", c, " was invoked"),
                "lac": ("read_lac returned ", es, " before the add of entry ", c, " was invoked"),
                "close": (
                    fs,
                    " returned last entry ",
                    es,
                    " before the add of entry ",
                    c,
                    " was invoked",
                ),
            },
            "missing": {
                "add": (
                    "no such entry ",
                    c,
                    " in a read that began after entry ",
                    es,
                    " was acknowledged",
                ),
                "read": (
                    "no such entry ",
                    c,
                    " in a read that began after entry ",
                    es,
                    " was read",
                ),
                "lac": ("no such entry ", c, " in a read that began after LAC ", es, " was read"),
                "close": (
                    "no such entry ",
                    c,
                    " in a read that began after ",
                    fs,
                    " returned ",
                    es,
                ),
            },
        }
        cause_sql = bound if cause == "create" else f"(CASE WHEN {e} >= 0 THEN {bound} ELSE -1 END)"
        message = _msg(*templates[cause][victim])
        out.append(_when_sql(f"{ret} <= {cause_sql}", kind, [cause_sql, call], message))
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


def _row_anomalies() -> Column:
    """The anomalies one (ledger, e) row proves (e >= 0: an entry; -1: LAC -1)."""
    from pyspark.sql import functions as sf

    ok0, found0 = "get(ok_adds, 0)", "get(found, 0)"
    in_chain = "(e >= 0 AND e < n)"
    beyond = "(closed_at IS NOT NULL AND e >= n0)"
    at = ("{close_f}", " closed the ledger at ", "{closed_at}")
    singles = [
        # an acknowledged add beyond the close point
        _when_sql(
            f"{beyond} AND size(ok_adds) > 0 AND {ok0}.call > close_ret",
            "ack-after-fence",
            [f"{ok0}.call", "close_op"],
            _msg("add of entry ", "{e}", " was sent after ", *at, ", and acknowledged"),
        ),
        _when_sql(
            f"{beyond} AND size(ok_adds) > 0 AND {ok0}.call <= close_ret",
            "lost-write",
            [f"{ok0}.call", "close_op"],
            _msg("entry ", "{e}", " was acknowledged but ", *at),
        ),
        _when_sql(
            f"{beyond} AND size(found) > 0",
            "read-of-truncated-entry",
            [f"{found0}.call", "close_op"],
            _msg("entry ", "{e}", " was read but ", *at),
        ),
        # the chain: the add chosen for the entry, or why there is none
        _when_sql(
            f"{in_chain} AND chosen IS NULL AND size(opt_adds) > 0",
            "divergent-read",
            [f"{found0}.call", "array_min(opt_adds).call"],
            "concat("
            + ", ".join(
                [
                    _q("entry "),
                    "cast(e as string)",
                    _q(" was read as "),
                    _repr_sql(f"{found0}.data"),
                    _q(", which no add of entry "),
                    "cast(e as string)",
                    _q(" wrote"),
                ]
            )
            + ")",
        ),
        _when_sql(
            f"{in_chain} AND chosen IS NULL AND size(opt_adds) = 0 AND size(found) > 0",
            "future-read",
            [f"{found0}.call"],
            _msg("entry ", "{e}", " was read but never written"),
        ),
        _when_sql(
            f"{in_chain} AND chosen IS NULL AND size(opt_adds) = 0 AND size(found) = 0",
            "skip",
            ["requirer"],
            _msg("entry ", "{e}", " was never written, yet a later entry exists"),
        ),
        _when_sql(
            f"{in_chain} AND size(ok_adds) > 0 AND size(found) > 0 AND {found0}.data != {ok0}.data",
            "divergent-read",
            [f"{ok0}.call", f"{found0}.call"],
            "concat("
            + ", ".join(
                [
                    _q("entry "),
                    "cast(e as string)",
                    _q(" was written as "),
                    _repr_sql(f"{ok0}.data"),
                    _q(" but read as "),
                    _repr_sql(f"{found0}.data"),
                ]
            )
            + ")",
        ),
    ]
    chain_add = (
        f"CASE WHEN {in_chain} AND chosen IS NOT NULL "
        f"THEN {_too_early_sql('add', 'chosen.call', 'chosen.end', 'e')} ELSE {_EMPTY_SQL} END"
    )
    duplicates = (
        f"transform(filter(ok_adds, a -> a.call != {ok0}.call), a -> "
        + _struct_sql(
            "duplicate",
            [f"{ok0}.call", "a.call"],
            _msg("two adds of entry ", "{e}", " were acknowledged"),
        )
        + ")"
    )
    divergent = (
        f"transform(filter(found, r -> r.data != {found0}.data), r -> "
        + _struct_sql(
            "divergent-read",
            [f"{found0}.call", "r.call"],
            "concat("
            + ", ".join(
                [
                    _q("entry "),
                    "cast(e as string)",
                    _q(" read as "),
                    _repr_sql(f"{found0}.data"),
                    _q(" and as "),
                    _repr_sql("r.data"),
                ]
            )
            + ")",
        )
        + ")"
    )
    lac_truncated = (
        f"transform(filter(lacs, x -> {beyond}), x -> "
        + _struct_sql(
            "read-of-truncated-entry",
            ["x.call", "close_op"],
            _msg("LAC ", "{e}", " was read but ", *at),
        )
        + ")"
    )
    miss_floor = (
        "transform(filter(miss, m -> m.end <= floor), m -> "
        + _struct_sql(
            "future-read",
            ["floor", "m.call"],
            _msg("read of entry ", "{e}", " completed before the ledger's create was invoked"),
        )
        + ")"
    )
    read_checks = (
        f"CASE WHEN {in_chain} THEN flatten(transform(found, r -> "
        f"{_too_early_sql('read', 'r.call', 'r.end', 'e')})) ELSE {_EMPTY_SQL} END"
    )
    lac_checks = (
        "CASE WHEN e < n THEN flatten(transform(lacs, x -> "
        f"{_too_early_sql('lac', 'x.call', 'x.end', 'e')})) ELSE {_EMPTY_SQL} END"
    )
    parts = [
        "array(" + ", ".join(singles) + ")",
        chain_add,
        duplicates,
        divergent,
        lac_truncated,
        miss_floor,
        read_checks,
        lac_checks,
    ]
    return sf.expr("concat(" + ", ".join(parts) + ")")
