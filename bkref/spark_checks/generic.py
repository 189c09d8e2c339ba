"""The generic checker on Spark: Wing-Gong search per key, through applyInPandas.

For models other than the ledger (a register, a cas-register, a key-value
store: :data:`bkref.linearizability.models.MODELS`), the history is split by the
model's key (P-compositionality) with Spark's own partitioning, and each key's
operations are searched by :func:`bkref.linearizability.wgl.search` in a Python
worker. The key column is computed in SQL: the ``ledger`` column for registers
(one register per id; null is one register), the JSON text of ``value.key`` for
the key-value store. Each key's result row names the operation that could not
be placed (``blocked_op``) and the last one of the longest linearizable prefix.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame

RESULT_SCHEMA: Final = (
    "run string, key string, verdict string, operations long, blocked_op long, "
    "blocked string, prefix_last long, note string"
)


def _search_group(model: str, budget: float | None, pdf: pd.DataFrame) -> pd.DataFrame:
    """One (run, key) group: rebuild its operations and search them."""
    import time

    import pandas as pd

    from bkref.linearizability import wgl
    from bkref.linearizability.history import Op, Operation
    from bkref.linearizability.models import MODELS

    m = MODELS[model]
    operations = []
    for r in pdf.sort_values("call").itertuples(index=False):
        ledger = None if pd.isna(r.ledger) else int(r.ledger)
        inv = Op(
            int(r.call),
            int(r.t_call),
            int(r.process),
            "invoke",
            r.f,
            ledger,
            None if r.inv is None else json.loads(r.inv),
        )
        done = None
        if not pd.isna(r.ret):
            done = Op(
                int(r.ret),
                int(r.t_ret),
                int(r.process),
                r.ctype,
                r.f,
                ledger,
                None if r.out is None else json.loads(r.out),
            )
        operations.append(Operation(inv, done))
    deadline = math.inf if budget is None else time.monotonic() + budget
    run = str(pdf["run"].iloc[0])
    key = str(pdf["key"].iloc[0])
    rows: list[dict[str, Any]] = []
    for calls in wgl.partition(m, operations).values():
        p = wgl.search(m, calls, key, deadline)
        blocked = p.calls[p.blocked] if p.blocked is not None else None
        rows.append(
            {
                "run": run,
                "key": key,
                "verdict": p.verdict,
                "operations": len(p.calls),
                "blocked_op": None if blocked is None else blocked.call,
                "blocked": None if blocked is None else m.describe(blocked.input),
                "prefix_last": p.calls[p.linearization[-1]].call
                if p.linearization and blocked
                else None,
                "note": p.note or None,
            }
        )
    if not rows:  # every operation failed: nothing to place
        rows.append(
            {
                "run": run,
                "key": key,
                "verdict": "valid",
                "operations": 0,
                "blocked_op": None,
                "blocked": None,
                "prefix_last": None,
                "note": None,
            }
        )
    return pd.DataFrame(rows, columns=[c.split()[0] for c in RESULT_SCHEMA.split(", ")])


def check(paired: DataFrame, model: str, *, budget: float | None = None) -> DataFrame:
    """Per (run, key): verdict, operations, and for an invalid key the blocked operation."""
    from pyspark.sql import functions as sf

    from bkref.linearizability.models import MODELS

    if model not in MODELS or model == "ledger":
        raise ValueError(f"the generic Spark checker takes {sorted(set(MODELS) - {'ledger'})}")
    key = (
        sf.get_json_object("inv", "$.key")
        if model == "kv"
        else sf.coalesce(sf.col("ledger").cast("string"), sf.lit("null"))
    )
    df = paired.where(sf.col("problem").isNull()).withColumn("key", key)

    def fn(pdf: pd.DataFrame) -> pd.DataFrame:
        return _search_group(model, budget, pdf)

    cols = [
        "run",
        "key",
        "process",
        "f",
        "call",
        "t_call",
        "ret",
        "t_ret",
        "ctype",
        "ledger",
        "inv",
        "out",
    ]
    return df.select(*cols).groupBy("run", "key").applyInPandas(fn, RESULT_SCHEMA)


def anomalies(results: DataFrame) -> DataFrame:
    """Invalid keys as anomaly rows (kind ``nonlinearizable``), naming the last
    operation of the longest linearizable prefix and the one that could not follow."""
    from pyspark.sql import functions as sf

    from bkref.linearizability import anomalies as msg
    from bkref.spark_checks.messages import message

    return results.where(sf.col("verdict") == "invalid").select(
        "run",
        sf.lit(None).cast("long").alias("ledger"),
        sf.lit(msg.NO_LINEARIZATION.kind).alias("kind"),
        sf.filter(sf.array("prefix_last", "blocked_op"), lambda x: x.isNotNull()).alias("ops"),
        message(msg.NO_LINEARIZATION, key=sf.col("key"), blocked=sf.col("blocked")).alias(
            "message"
        ),
    )
