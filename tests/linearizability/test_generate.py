"""The columnar generator (``bkref gen-history``): valid histories, planted
anomalies found, the same seed the same history, JSON formatted exactly."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bkref.linearizability.anomalies import ANOMALY_KINDS
from bkref.linearizability.columnar import columnar_history, format_rows, write_columnar
from bkref.linearizability.durability import check_durability
from bkref.linearizability.history import Op, validate
from bkref.linearizability.history_files import read_history
from bkref.linearizability.ledger_checker import check_ledgers


def _ops(path: Path) -> list[Op]:
    return list(validate(read_history(path)))


@pytest.mark.parametrize("seed", range(4))
def test_columnar_histories_are_valid_and_campaign_shaped(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "h.parquet"
    n = write_columnar(columnar_history(4000, 5, seed=seed), path)
    ops = _ops(path)
    assert len(ops) == n
    assert 3500 < n < 4500
    assert check_ledgers(ops).valid
    assert check_durability(ops)["valid"]
    kinds = Counter(f"{op.f} {op.type}" for op in ops)
    # every kind of operation and outcome the checkers distinguish
    for key in ["create ok", "add ok", "add info", "read ok", "read_lac ok", "add fail"]:
        assert kinds[key] > 0, key
    assert kinds["recover ok"] == 5
    assert any(isinstance(op.value, dict) and op.value.get("found") is False for op in ops)


@pytest.mark.parametrize("kind", ANOMALY_KINDS)
def test_each_planted_kind_is_found(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "h.jsonl"
    write_columnar(columnar_history(3000, 3, seed=8, anomaly=kind), path)
    result = check_ledgers(_ops(path))
    assert kind in result.counts


def test_same_seed_same_history_across_worker_processes(tmp_path: Path) -> None:
    # 130 ledgers of 8 lines: three batches, drawn by a pool of processes
    a, b, c = (tmp_path / f"{x}.parquet" for x in "abc")
    write_columnar(columnar_history(1040, 130, seed=3, anomaly="stale-read"), a)
    write_columnar(columnar_history(1040, 130, seed=3, anomaly="stale-read"), b)
    write_columnar(columnar_history(1040, 130, seed=4), c)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    ops = _ops(a)
    assert [op.index for op in ops] == list(range(len(ops)))
    assert set(check_ledgers(ops).counts) == {"stale-read"}


def test_format_rows_writes_numbers_as_python_does() -> None:
    rng = np.random.default_rng(0)
    v = np.concatenate([[0, -1, 9, 10, -10, 2**62], rng.integers(-(10**12), 10**12, 200)])
    w = rng.integers(0, 1000, len(v))
    got = format_rows(['{"a":', v, ',"b":"x.', w, '"}'], len(v))
    assert isinstance(got, pa.StringArray)
    pairs = zip(v, w, strict=True)
    want = [json.dumps({"a": int(x), "b": f"x.{y}"}, separators=(",", ":")) for x, y in pairs]
    assert got.to_pylist() == want
