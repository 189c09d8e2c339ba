"""Histories into Spark: reading, JSON Lines conversion, pairing, validation.

Input is the shared history format (:mod:`bkref.linearizability.history`): a Parquet
file or a directory of them (one history, or many campaign runs told apart by a
``run`` column), or JSON Lines. JSON Lines is read and validated by
``bkref.linearizability.history`` and converted to Parquet on the way in, a file per
run; a directory without Parquet files is searched for ``*.jsonl`` files, each
one a run named by its path (a campaign's ``run-*/history.jsonl``).

Pairing (:func:`operations`) joins each invocation with the next line of its
process, per run, with a window; the format's cross-line rules that can be
checked per process are checked on the way (:func:`validate`): a completion has
an open invocation with the same ``f`` and ledger, a process runs one
operation at a time and is not reused after an ``info``. Index order within a
run is trusted (Parquet rows have no line order to check it against).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bkref.linearizability.history import FIELDS, NEMESIS, HistoryError, Op
from bkref.linearizability.history_files import parquet_schema, read_jsonl

NO_OPERATIONS = (
    "no operations: expected a history of at least one operation ({why}); --allow-empty accepts it"
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

RUN_COLUMN = "run"
BATCH = 65_536


def jsonl_to_parquet(path: Path, out: Path, run: str) -> int:
    """Validate a JSON Lines history and write it as Parquet with a ``run`` column."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    base = parquet_schema()
    schema = base.append(pa.field(RUN_COLUMN, pa.string(), nullable=False))
    n = 0
    with pq.ParquetWriter(str(out), schema, compression="zstd") as writer:
        cols: dict[str, list[Any]] = {name: [] for name in (*FIELDS, RUN_COLUMN)}

        def flush() -> None:
            if cols["index"]:
                writer.write_table(pa.table(cols, schema=schema))
                for c in cols.values():
                    c.clear()

        ops: Iterator[Op] = read_jsonl(path)
        for op in ops:
            cols["index"].append(op.index)
            cols["time"].append(op.time)
            cols["process"].append(None if op.process == NEMESIS else op.process)
            cols["type"].append(op.type)
            cols["f"].append(op.f)
            cols["ledger"].append(op.ledger)
            cols["value"].append(
                None if op.value is None else json.dumps(op.value, separators=(",", ":"))
            )
            cols[RUN_COLUMN].append(run)
            n += 1
            if n % BATCH == 0:
                flush()
        flush()
    return n


def _jsonl_files(path: Path) -> list[tuple[Path, str]]:
    if path.is_file():
        return [(path, "")]
    files = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
    return [(f, str(f.parent.relative_to(path)) if f.parent != path else f.stem) for f in files]


def _parquet_rows(file: Path) -> int:
    """The row count in a Parquet file's footer, after checking the format's
    columns are there; a file that is not Parquet is a HistoryError."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(str(file))
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HistoryError(f"not a readable Parquet file ({first})", source=str(file)) from None
    names = set(meta.schema.to_arrow_schema().names)
    missing = [c for c in FIELDS if c not in names]
    if missing:
        raise HistoryError(f"missing column(s) {missing}", source=str(file))
    return int(meta.num_rows)


def check_input(path: Path, *, allow_empty: bool = False) -> None:
    """What can be checked in a second, before Spark starts: the path exists;
    a Parquet file's footer (every file of a directory) is readable and names
    the format's columns; each JSON Lines file is UTF-8 and its first
    operation parses and is valid. A history without operations is an error
    unless ``allow_empty``. Raises :class:`HistoryError` naming the file (and
    the line). The rest of a JSON Lines file is checked as it is converted."""
    if not path.exists():
        raise HistoryError("no such file or directory", source=str(path))
    if path.is_dir():
        parquet = sorted(p for p in path.rglob("*.parquet") if p.is_file())
    else:
        parquet = [path] if path.suffix == ".parquet" else []
    if parquet:
        rows = sum(_parquet_rows(f) for f in parquet)
        if rows == 0 and not allow_empty:
            raise HistoryError(NO_OPERATIONS.format(why="no Parquet rows"), source=str(path))
        return
    files = _jsonl_files(path)
    if not files:
        raise HistoryError("no .parquet or .jsonl history here", source=str(path))
    for f, _ in files:
        first = next(read_jsonl(f), None)  # reads up to the first operation
        if first is None and not allow_empty:
            why = "the file is empty, or has only the header line"
            raise HistoryError(NO_OPERATIONS.format(why=why), source=str(f))


def read_ops(spark: SparkSession, path: Path, *, workdir: Path | None = None) -> DataFrame:
    """The history's lines as a DataFrame with the format's columns and ``run``."""
    from pyspark.sql import functions as sf

    if not path.exists():
        raise HistoryError("no such file or directory", source=str(path))
    parquet = path.suffix == ".parquet" or (
        path.is_dir() and any(p.is_file() for p in path.rglob("*.parquet"))
    )
    if not parquet:
        files = _jsonl_files(path)
        if not files:
            raise HistoryError("no .parquet or .jsonl history here", source=str(path))
        target = Path(tempfile.mkdtemp(prefix="bkref-spark-in-", dir=workdir))
        if workdir is None:  # Spark reads it lazily: it lives as long as this process
            atexit.register(shutil.rmtree, target, True)
        for i, (f, run) in enumerate(files):
            jsonl_to_parquet(f, target / f"part-{i:05d}.parquet", run)
        path = target
    df = spark.read.option("recursiveFileLookup", "true").parquet(str(path))
    missing = [c for c in FIELDS if c not in df.columns]
    if missing:
        raise HistoryError(f"missing column(s) {missing}", source=str(path))
    run_col = sf.col(RUN_COLUMN).cast("string") if RUN_COLUMN in df.columns else sf.lit("")
    return df.select(
        run_col.alias("run"),
        sf.col("index").cast("long").alias("index"),
        sf.col("time").cast("long").alias("time"),
        sf.col("process").cast("long").alias("process"),
        sf.col("type").cast("string").alias("type"),
        sf.col("f").cast("string").alias("f"),
        sf.col("ledger").cast("long").alias("ledger"),
        sf.col("value").cast("string").alias("value"),
    )


# The fields of every ledger operation's value (invocation or completion): the
# values are parsed once, here, and the checks read these structs.
VALUE_SCHEMA = "entry long, data string, found boolean, lac long, last_entry long, error string"


def operations(ops: DataFrame, *, text: bool = True) -> DataFrame:
    """Invocations paired with their completions, one row per operation.

    Columns: run, process, f, call (invocation index), t_call, ret (completion
    index, null if none), t_ret, ctype (completion type, null if none), ledger
    (the completion's, else the invocation's), i and o (the values parsed with
    :data:`VALUE_SCHEMA`), inv and out (JSON text of the values; only if
    ``text``: the generic checker needs them, the ledger checks do not),
    problem (why the pairing breaks a rule of the format, else null).
    Nemesis lines are dropped; completions appear only inside their operation,
    except a completion without an invocation, kept as a row with a problem.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    # The process first: the sort's prefix is then a long, not the run's text.
    w = Window.partitionBy("process", "run").orderBy("index")
    # Only the raw columns cross the shuffle, once each (a struct of the next
    # line's fields, built before the window, would ship every line twice);
    # the values are parsed after it, each line once (as an invocation's own
    # value or as its completion's).
    fields = ("index", "time", "type", "f", "ledger", "value")
    lines = ops.where(sf.col("process").isNotNull()).select(
        "run",
        "process",
        *fields,
        sf.lead(sf.col("index").isNull()).over(w).alias("has_next"),
        *(sf.lead(c).over(w).alias(f"n_{c}") for c in fields),
        sf.lag("type").over(w).alias("prv"),
    )
    has_next = sf.col("has_next").isNotNull()
    n_type, n_f, n_ledger = sf.col("n_type"), sf.col("n_f"), sf.col("n_ledger")
    completes = has_next & (n_type != "invoke")
    is_invoke = sf.col("type") == "invoke"
    problem = (
        sf.when(
            is_invoke & (sf.col("prv") == "info"),
            sf.concat(sf.lit("process "), sf.col("process"), sf.lit(" reused after an info")),
        )
        .when(
            is_invoke & has_next & (n_type == "invoke"),
            sf.concat(sf.lit("two open invocations on process "), sf.col("process")),
        )
        .when(
            is_invoke & completes & (n_f != sf.col("f")),
            sf.concat(
                sf.lit("completion "),
                n_f,
                sf.lit(" does not match the invocation "),
                sf.col("f"),
            ),
        )
        .when(
            is_invoke
            & completes
            & sf.col("ledger").isNotNull()
            & ~n_ledger.eqNullSafe(sf.col("ledger")),
            sf.concat(sf.lit("completion names another ledger than its invocation")),
        )
        .when(
            ~is_invoke & (sf.col("prv").isNull() | (sf.col("prv") != "invoke")),
            sf.concat(sf.lit("completion without invocation on process "), sf.col("process")),
        )
    )
    keep = is_invoke | problem.isNotNull()
    return lines.where(keep).select(
        "run",
        "process",
        "f",
        sf.col("index").alias("call"),
        sf.col("time").alias("t_call"),
        sf.when(completes, sf.col("n_index")).alias("ret"),
        sf.when(completes, sf.col("n_time")).alias("t_ret"),
        sf.when(completes, n_type).alias("ctype"),
        sf.coalesce(sf.when(completes, n_ledger), sf.col("ledger")).alias("ledger"),
        sf.from_json("value", VALUE_SCHEMA).alias("i"),
        sf.when(completes, sf.from_json("n_value", VALUE_SCHEMA)).alias("o"),
        *(
            [sf.col("value").alias("inv"), sf.when(completes, sf.col("n_value")).alias("out")]
            if text
            else []
        ),
        problem.alias("problem"),
    )


def validate(paired: DataFrame) -> None:
    """Raise :class:`HistoryError` naming the first operation that breaks a rule."""
    from pyspark.sql import functions as sf

    bad = paired.where(sf.col("problem").isNotNull()).orderBy("run", "call").limit(1).collect()
    if bad:
        row = bad[0]
        run = f"run {row['run']!r} " if row["run"] else ""
        raise HistoryError(f"{run}index {row['call']}: {row['problem']}")
