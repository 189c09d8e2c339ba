"""The replication audit on bookie dumps made by hand, good and bad."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bkref.spark_checks.replication import DumpError, audit, read_dumps
from bkref.spec.quorum import write_set_positions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

BOOKIES = ["b0", "b1", "b2", "b3"]
# ledger 1: E=3, Wq=2, 10 entries, an ensemble change at entry 6 (b1 replaced by b3);
# ledger 2: still open (not audited).
LEDGERS: list[dict[str, Any]] = [
    {
        "ledger": 1,
        "state": "CLOSED",
        "last_entry": 9,
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "segments": [
            {"first_entry": 6, "ensemble": ["b0", "b3", "b2"]},
            {"first_entry": 0, "ensemble": ["b0", "b1", "b2"]},
        ],
    },
    {
        "ledger": 2,
        "state": "OPEN",
        "last_entry": -1,
        "ensemble_size": 3,
        "write_quorum": 3,
        "ack_quorum": 2,
        "segments": [{"first_entry": 0, "ensemble": ["b1", "b2", "b3"]}],
    },
]


def _replicas() -> list[dict[str, Any]]:
    """Every entry of ledger 1 on its write set (per spec.quorum), and nothing of ledger 2."""
    rows: list[dict[str, Any]] = []
    for e in range(10):
        ensemble = ["b0", "b3", "b2"] if e >= 6 else ["b0", "b1", "b2"]
        rows.extend(
            {"bookie": ensemble[p], "ledger": 1, "entry": e, "digest": f"d{e}"}
            for p in write_set_positions(e, 3, 2)
        )
    rows.append({"bookie": "b1", "ledger": 1, "entry": 7, "digest": "d7"})  # a leftover copy
    return rows


def _write(root: Path, entries: list[dict[str, Any]], ledgers: list[dict[str, Any]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, rows in (("entries", entries), ("ledgers", ledgers)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _findings(spark: SparkSession, root: Path) -> list[tuple[str, int, int, tuple[str, ...]]]:
    _, details = audit(*read_dumps(spark, root))
    return sorted(
        (r["kind"], r["ledger"], r["entry"], tuple(r["bookies"])) for r in details.collect()
    )


def test_fully_replicated_closed_ledger_passes(spark: SparkSession, tmp_path: Path) -> None:
    assert _findings(spark, _write(tmp_path, _replicas(), LEDGERS)) == []


def test_missing_replica_and_digest_mismatch_are_found(spark: SparkSession, tmp_path: Path) -> None:
    rows = _replicas()
    # entry 7 lives on positions (1, 2) of the second ensemble: b3 and b2; drop b3's copy
    rows = [r for r in rows if not (r["entry"] == 7 and r["bookie"] == "b3")]
    for r in rows:
        if r["entry"] == 2 and r["bookie"] == "b0":
            r["digest"] = "corrupt"
    got = _findings(spark, _write(tmp_path, rows, LEDGERS))
    assert got == [
        ("digest-mismatch", 1, 2, ("b0", "b2")),  # sorted by digest: "corrupt" < "d2"
        ("under-replicated", 1, 7, ("b3",)),
    ]
    anomalies, _ = audit(*read_dumps(spark, tmp_path))
    messages = sorted(r["message"] for r in anomalies.collect())
    assert "is not on bookie b3 of its write set" in messages[1]
    assert "b0=corrupt, b2=d2" in messages[0]


def test_a_differing_copy_outside_the_write_set_is_not_a_replica(
    spark: SparkSession, tmp_path: Path
) -> None:
    # b1 left the ensemble at entry 6; its leftover copy of entry 7 was corrupted since
    # (a flip fault), and the open ledger 2 has differing copies: neither is audited.
    rows = _replicas()
    for r in rows:
        if (r["entry"], r["bookie"]) == (7, "b1"):
            r["digest"] = "flipped"
    rows += [
        {"bookie": "b1", "ledger": 2, "entry": 0, "digest": "x"},
        {"bookie": "b2", "ledger": 2, "entry": 0, "digest": "y"},
    ]
    assert _findings(spark, _write(tmp_path, rows, LEDGERS)) == []


def test_a_dump_without_ledger_metadata_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    tmp_path.joinpath("entries.jsonl").write_text("")
    with pytest.raises(DumpError, match="no ledgers"):
        read_dumps(spark, tmp_path)
