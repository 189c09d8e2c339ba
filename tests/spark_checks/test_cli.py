"""`bkref spark-check` and `bkref gen-history` end to end: exit codes and outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bkref.linearizability import gen_cli
from bkref.linearizability.history import Op
from bkref.linearizability.history_files import read_history, write_jsonl, write_parquet
from bkref.linearizability.ledger_checker import check_ledgers
from bkref.spark_checks import job

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _spark_check(path: Path, out: Path) -> int:
    return job.main([str(path), "--out", str(out), "--master", "local[2]", "--quiet"])


def test_gen_history_writes_a_valid_history_or_one_with_the_anomaly_planted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = tmp_path / "good.parquet", tmp_path / "bad.jsonl"
    assert gen_cli.main(["--ops", "2000", "--ledgers", "3", "--seed", "5", "--out", str(good)]) == 0
    argv = ["--ops", "2000", "--ledgers", "3", "--anomaly", "skip", "--out", str(bad)]
    assert gen_cli.main(argv) == 0
    assert "skip planted" in capsys.readouterr().out
    assert check_ledgers(read_history(good)).valid
    assert set(check_ledgers(read_history(bad)).counts) == {"skip"}
    assert gen_cli.main(["--ops", "0", "--out", str(good)]) == 2


def test_a_valid_history_exits_0_with_tables_summary_and_page(
    spark: SparkSession, tmp_path: Path
) -> None:
    history = tmp_path / "h.parquet"
    write_parquet(gen_cli.generate(1500, 3, seed=1), history)
    out = tmp_path / "out"
    assert _spark_check(history, out) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "valid"
    assert summary["ledgers"] == 3
    assert summary["anomalies"] == {"linearizable": {}, "durability": {}}
    assert summary["ops"] == sum(1 for _ in read_history(history))
    assert {"add", "read", "recover"} <= set(summary["latency_ms"])
    assert "valid" in (out / "index.html").read_text()
    assert spark.read.parquet(str(out / "ledgers")).count() == 3
    assert spark.read.parquet(str(out / "anomalies")).count() == 0


def test_a_planted_anomaly_exits_1_and_is_in_the_anomaly_table(
    spark: SparkSession, tmp_path: Path
) -> None:
    history = tmp_path / "h.jsonl"
    write_jsonl(gen_cli.generate(1500, 3, seed=2, anomaly="divergent-read"), history)
    out = tmp_path / "out"
    assert _spark_check(history, out) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "invalid"
    expected = dict(check_ledgers(read_history(history)).counts)
    assert summary["anomalies"]["linearizable"] == expected == {"divergent-read": 5}
    rows = spark.read.parquet(str(out / "anomalies")).collect()
    assert {(r["check"], r["kind"]) for r in rows} == {("linearizable", "divergent-read")}
    assert all(len(r["ops"]) == 2 for r in rows)
    assert "divergent-read" in (out / "index.html").read_text()


def test_a_malformed_history_exits_2_naming_the_operation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = tmp_path / "h.parquet"
    ops = [
        Op(0, 0, 1, "invoke", "add", 1, {"entry": 0, "data": "a"}),
        Op(1, 1, 1, "ok", "add", 1, {"entry": 0, "data": "a"}),
        Op(2, 2, 2, "ok", "read", 1, {"entry": 0, "found": False}),  # never invoked
    ]
    write_parquet(ops, history)  # the Parquet writer does not validate; Spark does
    assert _spark_check(history, tmp_path / "out") == 2
    assert "index 2: completion without invocation on process 2" in capsys.readouterr().err


def test_a_missing_path_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _spark_check(tmp_path / "nothing.jsonl", tmp_path / "out") == 2
    assert "no such file" in capsys.readouterr().err
