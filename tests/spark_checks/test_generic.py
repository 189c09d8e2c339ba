"""The generic checker on Spark (applyInPandas per key) against linearizability.wgl."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest

from bkref.linearizability import wgl
from bkref.linearizability.history import Op, pair
from bkref.linearizability.history_files import write_jsonl
from bkref.spark_checks.generic import anomalies, check
from bkref.spark_checks.job import prepare

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession


def register_history(rng: random.Random, keys: int, ops: int) -> list[Op]:
    """Concurrent reads and writes of ``keys`` registers (the ``ledger`` column),
    linearizable by construction: each takes effect between its invocation and
    completion; some crash (info) after or without taking effect."""
    state: dict[int, int | None] = dict.fromkeys(range(keys))
    active: dict[int, list[object]] = {}  # process -> [key, f, value, applied, result]
    out: list[Op] = []
    next_process, started = 0, 0

    def emit(p: int, typ: str, f: str, key: int, value: object) -> None:
        out.append(Op(len(out), len(out), p, typ, f, key, value))  # type: ignore[arg-type]

    while started < ops or active:
        moves = []
        if started < ops and len(active) < 4:
            moves.append("invoke")
        moves += [f"apply {p}" for p, a in active.items() if not a[3]]
        moves += [f"complete {p}" for p, a in active.items() if a[3]]
        move = rng.choice(moves)
        if move == "invoke":
            p, next_process, started = next_process, next_process + 1, started + 1
            key, f = rng.randrange(keys), rng.choice(("read", "write"))
            value = rng.randrange(5) if f == "write" else None
            active[p] = [key, f, value, False, None]
            emit(p, "invoke", f, key, value)
            continue
        p = int(move.split()[1])
        a = active[p]
        key = int(a[0])  # type: ignore[call-overload]
        if move.startswith("apply"):
            a[3] = True
            if a[1] == "write":
                state[key] = a[2]  # type: ignore[assignment]
            else:
                a[4] = state[key]
            continue
        del active[p]
        if rng.random() < 0.05:
            emit(p, "info", str(a[1]), key, None)
        else:
            emit(p, "ok", str(a[1]), key, a[4] if a[1] == "read" else a[2])
    return out


def _bad(ops: list[Op]) -> list[Op]:
    """A read of key 0 that returns a value nobody wrote."""
    n = len(ops)
    return [
        *ops,
        Op(n, n, 10_000, "invoke", "read", 0, None),
        Op(n + 1, n + 1, 10_000, "ok", "read", 0, 99),
    ]


@pytest.fixture(scope="module")
def histories() -> dict[str, list[Op]]:
    rng = random.Random(11)
    good = [register_history(rng, 3, 60) for _ in range(3)]
    return {"good-0": good[0], "good-1": good[1], "good-2": good[2], "bad": _bad(good[0])}


def test_verdicts_per_key_equal_the_search(
    spark: SparkSession, histories: dict[str, list[Op]], tmp_path: Path
) -> None:
    for name, ops in histories.items():
        (tmp_path / name).mkdir()
        write_jsonl(ops, tmp_path / name / "history.jsonl")
    results = check(prepare(spark, tmp_path, model="register"), "register").collect()
    got = {(r["run"], r["key"]): (r["verdict"], r["blocked_op"]) for r in results}
    expected = {}
    for name, ops in histories.items():
        for p in wgl.check("register", pair(ops), exhaustive=True).partitions:
            blocked = p.calls[p.blocked].call if p.blocked is not None else None
            expected[(name, str(p.key))] = (p.verdict, blocked)
    assert got == expected
    assert got[("bad", "0")][0] == "invalid"
    assert all(v == "valid" for (run, _), (v, _) in got.items() if run != "bad")


def test_an_invalid_key_is_a_nonlinearizable_anomaly_naming_the_blocked_read(
    spark: SparkSession, histories: dict[str, list[Op]], tmp_path: Path
) -> None:
    ops = histories["bad"]
    write_jsonl(ops, tmp_path / "bad.jsonl")
    [row] = anomalies(
        check(prepare(spark, tmp_path / "bad.jsonl", model="register"), "register")
    ).collect()
    assert row["kind"] == "nonlinearizable"
    assert row["ops"][-1] == len(ops) - 2  # the invocation of the impossible read
    assert "read() -> 99" in row["message"]


def test_the_ledger_model_is_not_searched_on_spark(spark: SparkSession, tmp_path: Path) -> None:
    write_jsonl([], tmp_path / "empty.jsonl")
    with pytest.raises(ValueError, match="generic Spark checker"):
        check(prepare(spark, tmp_path / "empty.jsonl", model="register"), "ledger")
