"""One history, one durability verdict: `bkref check`, `bkref spark-check` and the
campaign's checks agree, with and without the campaign's ending (a recovery
then final reads of every ledger).

A ledger the history cannot decide is "durability unknown" with its reason on
all three paths, never a lost write; a write really lost (acknowledged beyond
the recovery's last entry) is found on all three, with or without final reads.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bkref.linearizability import check_cli
from bkref.linearizability.durability import describe
from bkref.linearizability.gen_cli import generate
from bkref.linearizability.history import Op, validate
from bkref.linearizability.history_files import write_jsonl
from bkref.linearizability.plant import drop_final_reads
from bkref.nemesis.checker import check_history
from bkref.spark_checks import job

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FIELDS = ("acknowledged", "final_reads", "ledgers", "counts", "unknown_ledgers", "unknown")


def _never_recovered(ops: list[Op], ledger: int) -> list[Op]:
    """``ops`` as if ``ledger`` had been left open: no recovery, no final reads."""
    kept = drop_final_reads(ops, random.Random(0), ledgers=(ledger,))
    return [o for o in kept if not (o.ledger == ledger and o.f == "recover")]


def _histories() -> dict[str, tuple[list[Op], int]]:
    """name -> (history, the exit status every path must give)."""
    full = list(validate(generate(1500, 4, seed=11)))
    part = drop_final_reads(full, random.Random(3), share=0.4, ledgers=(1,))
    part = drop_final_reads(part, random.Random(4), ledgers=(2,))
    lost = list(validate(generate(1500, 4, seed=12, anomaly="lost-write")))
    return {
        "with-final-reads": (full, 0),
        "without-final-reads": (drop_final_reads(full, random.Random(1)), 0),
        "each-reason": (_never_recovered(part, 3), 0),
        "lost-without-final-reads": (drop_final_reads(lost, random.Random(2)), 1),
    }


HISTORIES = _histories()


# "without-final-reads" gives one reason, which "each-reason" gives too: its run of the
# three paths is left to `make verify-full`.
CASES = [
    pytest.param(name, marks=pytest.mark.full) if name == "without-final-reads" else name
    for name in HISTORIES
]


@pytest.mark.parametrize("name", CASES)
def test_check_spark_check_and_the_campaign_give_one_durability_verdict(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    del spark  # the session the job reuses
    ops, status = HISTORIES[name]
    path = tmp_path / "history.jsonl"
    write_jsonl(ops, path)

    campaign = check_history(ops)
    campaign_verdict = "valid" if all(c["valid"] for c in campaign.values()) else "invalid"

    capsys.readouterr()
    assert check_cli.main([str(path), "--json"]) == status
    [checked] = json.loads(capsys.readouterr().out)["files"]

    out = tmp_path / "spark"
    argv = [str(path), "--out", str(out), "--master", "local[2]", "--quiet"]
    assert job.main(argv) == status
    summary = json.loads((out / "summary.json").read_text())

    verdict = {0: "valid", 1: "invalid"}[status]
    assert (checked["verdict"], summary["verdict"], campaign_verdict) == (verdict,) * 3
    durability: dict[str, Any] = campaign["durability"]
    expected = {k: durability[k] for k in FIELDS}
    assert {k: checked["durability"][k] for k in FIELDS} == expected
    assert {k: summary["durability"][k] for k in FIELDS} == expected
    assert summary["anomalies"]["durability"] == durability["counts"]
    # the same words on the Spark page as on check's console and the campaign's
    assert describe(durability) in (out / "index.html").read_text()


def test_the_histories_cover_every_reason_and_a_real_loss() -> None:
    """What the test above compares is not vacuous."""
    results = {name: check_history(ops)["durability"] for name, (ops, _) in HISTORIES.items()}
    assert results["with-final-reads"]["unknown_ledgers"] == 0
    assert results["with-final-reads"]["acknowledged"] > 0
    assert results["without-final-reads"]["unknown"] == {"recovered but not read back": 4}
    assert set(results["each-reason"]["unknown"]) == {
        "never recovered",
        "recovered but not read back",
        "read back only in part",
    }
    lost = results["lost-without-final-reads"]
    assert lost["counts"].get("lost-write", 0) > 0
    assert lost["unknown_ledgers"] > 0  # decided though nothing was read back
