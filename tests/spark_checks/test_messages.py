"""Anomaly messages as Spark SQL text, from the shared templates (no Spark needed)."""

from __future__ import annotations

import pytest

from bkref.linearizability import anomalies as msg
from bkref.spark_checks.messages import message_sql


def test_the_sql_rendering_follows_the_template() -> None:
    sql = message_sql(msg.DUPLICATE_ADDS, e="x.e", unused="y")
    assert sql == "concat('two adds of entry ', cast(x.e as string), ' were acknowledged')"
    assert "CASE WHEN instr(r.data" in message_sql(
        msg.READ_BACK_TWICE, e="e", read="r.data", other="o"
    )
    with pytest.raises(ValueError, match="needs the field 'other'"):
        message_sql(msg.READ_BACK_TWICE, e="e", read="r.data")
