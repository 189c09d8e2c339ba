"""Anomalies on Spark, in the words of :mod:`bkref.linearizability.anomalies`.

A :class:`~linearizability.anomalies.Message` is rendered here as a Spark
expression over columns: its literal text as literals, each field as the
column (or SQL expression) given for it, cast to a string, and a ``!r`` field
quoted as Python's ``repr`` quotes printable text. So the Spark jobs and the
single-process checkers say the same things from one template.

Two renderings of each: :class:`~pyspark.sql.Column` objects
(:func:`message`, :func:`anomaly`), and SQL text (:func:`message_sql`,
:func:`anomaly_sql`) for the per-row comparisons of :mod:`bkref.spark_checks.ledger`,
where one expression crossing to the JVM in one call is much cheaper than
thousands of Column calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, TypeVar

if TYPE_CHECKING:
    from pyspark.sql import Column

    from bkref.linearizability.anomalies import Message

ANOMALY_SQL_TYPE: Final = "array<struct<kind:string,ops:array<bigint>,message:string>>"
EMPTY_SQL: Final = f"cast(array() as {ANOMALY_SQL_TYPE})"
T = TypeVar("T")


def _field(m: Message, name: str, fields: Mapping[str, T]) -> T:
    if name not in fields:
        raise ValueError(f"{m.template!r} needs the field {name!r}")
    return fields[name]


# ---------------------------------------------------------------- Column objects


def repr_of(c: Column) -> Column:
    """Python's repr of a str, for printable text."""
    from pyspark.sql import functions as sf

    plain = sf.regexp_replace(c, r"\\", r"\\\\")
    return (
        sf.when(~c.contains("'"), sf.concat(sf.lit("'"), plain, sf.lit("'")))
        .when(~c.contains('"'), sf.concat(sf.lit('"'), plain, sf.lit('"')))
        .otherwise(sf.concat(sf.lit("'"), sf.regexp_replace(plain, "'", r"\\'"), sf.lit("'")))
    )


def message(m: Message, **fields: Column) -> Column:
    """``m`` rendered over columns: a string column (null where a field is null)."""
    from pyspark.sql import functions as sf

    parts: list[Column] = []
    for text, name, quoted in m.parts:
        if text:
            parts.append(sf.lit(text))
        if name is not None:
            c = _field(m, name, fields)
            parts.append(repr_of(c) if quoted else c.cast("string"))
    return sf.concat(*parts)


def ops_array(ops: list[Column] | Column) -> Column:
    """The history indices that prove an anomaly (columns, or an array column),
    as ``array<long>``."""
    from pyspark.sql import functions as sf

    if not isinstance(ops, list):
        return ops.cast("array<long>")
    if not ops:
        return sf.array().cast("array<long>")
    return sf.array(*[o.cast("long") for o in ops])


def anomaly(m: Message, ops: list[Column] | Column, **fields: Column) -> Column:
    """An anomaly struct (kind, ops, message) of kind ``m.kind``."""
    from pyspark.sql import functions as sf

    return sf.struct(
        sf.lit(m.kind).alias("kind"),
        ops_array(ops).alias("ops"),
        message(m, **fields).alias("message"),
    )


# ---------------------------------------------------------------- SQL text


def quote(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def repr_sql(c: str) -> str:
    """Python's repr of a str, for printable text (as :func:`repr_of`), in SQL."""
    sq, dq, bs = quote("'"), quote('"'), quote("\\")
    plain = f"replace({c}, {bs}, {quote(chr(92) * 2)})"
    return (
        f"CASE WHEN instr({c}, {sq}) = 0 THEN concat({sq}, {plain}, {sq}) "
        f"WHEN instr({c}, {dq}) = 0 THEN concat({dq}, {plain}, {dq}) "
        f"ELSE concat({sq}, replace({plain}, {sq}, {quote(chr(92) + chr(39))}), {sq}) END"
    )


def message_sql(m: Message, **fields: str) -> str:
    """``m`` rendered over SQL expressions (one per field), as SQL text."""
    parts: list[str] = []
    for text, name, quoted in m.parts:
        if text:
            parts.append(quote(text))
        if name is not None:
            expr = _field(m, name, fields)
            parts.append(repr_sql(expr) if quoted else f"cast({expr} as string)")
    return "concat(" + ", ".join(parts) + ")"


def anomaly_sql(m: Message, ops: list[str], **fields: str) -> str:
    """An anomaly struct (kind, ops, message) of kind ``m.kind``, as SQL text."""
    arr = ", ".join(f"cast({o} as bigint)" for o in ops)
    return (
        f"named_struct('kind', {quote(m.kind)}, 'ops', array({arr}), "
        f"'message', {message_sql(m, **fields)})"
    )


def when_sql(cond: str, m: Message, ops: list[str], **fields: str) -> str:
    """SQL: the anomaly where ``cond`` holds, else null."""
    return f"CASE WHEN {cond} THEN {anomaly_sql(m, ops, **fields)} END"
