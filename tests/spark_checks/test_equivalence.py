"""The Spark verdicts equal linearizability's on the same histories.

One Spark pass over a corpus of histories, one run each: random valid
campaign-shaped histories, each anomaly kind planted, histories made by hand
for the corner cases (unknown and fenced adds, duplicate creates, no create,
an absurd close), and a slice of a real campaign's history. Every run is then
compared with the single-process checkers: the ledger checker
(``check_ledgers``) and the durability check (``check_durability``).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bkref.linearizability.anomalies import ANOMALY_KINDS
from bkref.linearizability.durability import MAX_ANOMALIES, check_durability
from bkref.linearizability.gen_cli import generate
from bkref.linearizability.generate import ledger_history, to_ops
from bkref.linearizability.history import Op, validate
from bkref.linearizability.history_files import read_jsonl, write_jsonl
from bkref.linearizability.ledger_checker import MAX_EXAMPLES, check_ledgers
from bkref.linearizability.plant import drop_final_reads
from bkref.spark_checks.job import build, prepare
from bkref.spark_checks.ledger import with_counts

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CAMPAIGN_SLICE = Path(__file__).parent / "data" / "campaign-slice.jsonl"
Row = tuple[str, int, tuple[int, ...], str]  # kind, ledger, ops, message


def _op(i: int, p: int, typ: str, f: str, ledger: int | None, value: object) -> Op:  # noqa: PLR0917
    return Op(i, 1000 * i, p, typ, f, ledger, value)  # type: ignore[arg-type]


def _by_hand() -> dict[str, list[Op]]:
    """Small histories for what the generator rarely makes."""
    add = {"entry": 0, "data": "a"}
    h: dict[str, list[tuple[int, str, str, int | None, object]]] = {
        # an unknown add that a read proves, a fenced add, a failed read
        "hand-unknown-adds": [
            (1, "invoke", "add", 3, add),
            (2, "invoke", "add", 3, {"entry": 1, "data": "b"}),
            (1, "info", "add", 3, None),
            (2, "fail", "add", 3, {"error": "fenced"}),
            (3, "invoke", "read", 3, {"entry": 0}),
            (3, "ok", "read", 3, {"entry": 0, "found": True, "data": "a"}),
            (3, "invoke", "read", 3, {"entry": 1}),
            (3, "fail", "read", 3, {"error": "timeout"}),
            (4, "invoke", "recover", 3, None),
            (4, "ok", "recover", 3, {"last_entry": 1}),
        ],
        # two creates returning one id; a read before the create; no such entry
        # after the data was read (stale); a LAC of -1
        "hand-creates": [
            (9, "invoke", "read", 4, {"entry": 0}),
            (9, "ok", "read", 4, {"entry": 0, "found": False}),
            (1, "invoke", "create", None, {"ensemble": 3}),
            (2, "invoke", "create", None, {"ensemble": 3}),
            (1, "ok", "create", 4, {"ensemble": 3}),
            (2, "ok", "create", 4, {"ensemble": 3}),
            (3, "invoke", "read_lac", 4, None),
            (3, "ok", "read_lac", 4, {"lac": -1}),
            (5, "invoke", "add", 4, add),
            (5, "ok", "add", 4, add),
            (6, "invoke", "read", 4, {"entry": 0}),
            (6, "ok", "read", 4, {"entry": 0, "found": True, "data": "a"}),
            (7, "invoke", "read", 4, {"entry": 0}),
            (7, "ok", "read", 4, {"entry": 0, "found": False}),
            (8, "invoke", "close", 4, None),
            (8, "ok", "close", 4, {"last_entry": 0}),
        ],
        # a close at an entry far beyond anything written (the chain is cut at
        # the first entry never written); an open ledger whose LAC proves entries
        # nobody wrote; an add whose data no read agrees with
        "hand-absurd": [
            (1, "invoke", "add", 5, add),
            (1, "ok", "add", 5, add),
            (2, "invoke", "close", 5, None),
            (2, "ok", "close", 5, {"last_entry": 1000}),
            (3, "invoke", "read_lac", 6, None),
            (3, "ok", "read_lac", 6, {"lac": 2}),
            (4, "invoke", "add", 6, {"entry": 1, "data": "x"}),
            (5, "invoke", "read", 6, {"entry": 1}),
            (5, "ok", "read", 6, {"entry": 1, "found": True, "data": "y"}),
            (6, "invoke", "read", 6, {"entry": 1}),
            (6, "ok", "read", 6, {"entry": 1, "found": True, "data": "it's \\ 'quoted'"}),
        ],
    }
    return {name: [_op(i, *e) for i, e in enumerate(events)] for name, events in h.items()}


def corpus() -> dict[str, list[Op]]:
    runs: dict[str, list[Op]] = {}
    for seed in range(3):
        runs[f"valid-{seed}"] = list(validate(generate(1500, 4, seed=seed)))
    for i, kind in enumerate(ANOMALY_KINDS):
        runs[f"planted-{kind}"] = list(validate(generate(1200, 3, seed=100 + i, anomaly=kind)))
    # ledgers left open, closed by the writer, with many crashes
    rng = random.Random(7)
    events = ledger_history(rng, ledger=1, adds=40, reads=60, end=None, crash=0.2)
    events += ledger_history(rng, ledger=2, adds=40, reads=60, end="close", first_process=500)
    events += ledger_history(rng, ledger=3, adds=10, reads=10, create=False, first_process=900)
    runs["open-and-closed"] = to_ops(events)
    # durability the history cannot decide: no final reads; some ledgers read in part
    runs["no-final-reads"] = drop_final_reads(runs["valid-0"], random.Random(1))
    runs["part-final-reads"] = drop_final_reads(
        runs["valid-1"], random.Random(2), share=0.3, ledgers=(1, 2)
    )
    runs.update(_by_hand())
    runs["campaign-slice"] = list(read_jsonl(CAMPAIGN_SLICE))
    return runs


@dataclass
class Results:
    runs: dict[str, list[Op]]
    linearizable: dict[str, list[Row]] = field(default_factory=lambda: defaultdict(list))
    durability: dict[str, list[Row]] = field(default_factory=lambda: defaultdict(list))
    ledgers: dict[str, dict[int, dict[str, Any]]] = field(default_factory=lambda: defaultdict(dict))
    durability_totals: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # run -> (ledger, reason, acknowledged, unread) of the ledgers not judged
    durability_unknown: dict[str, list[tuple[int, str, int, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )


@pytest.fixture(scope="module")
def results(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Results:
    root = tmp_path_factory.mktemp("corpus")
    runs = corpus()
    for name, ops in runs.items():
        (root / name).mkdir()
        write_jsonl(ops, root / name / "history.jsonl")
    checks = build(prepare(spark, root))
    out = Results(runs)
    for check, table in (("linearizable", out.linearizable), ("durability", out.durability)):
        for r in checks.anomalies[check].collect():
            table[r["run"]].append((r["kind"], r["ledger"], tuple(r["ops"]), r["message"]))
    ledgers = with_counts(checks.tables["ledgers"], checks.anomalies["linearizable"])
    for r in ledgers.collect():
        out.ledgers[r["run"]][r["ledger"]] = r.asDict()
    for r in checks.extra["durability_totals"].collect():
        out.durability_totals[r["run"]] = (r["acknowledged"], r["final_reads"], r["ledgers"])
    for r in checks.tables["durability_unknown"].collect():
        row = (r["ledger"], r["reason"], r["acknowledged"], r["unread"])
        out.durability_unknown[r["run"]].append(row)
    return out


RUNS = list(corpus())


def _same(got: list[Row], expected: list[Row], counts: Counter[tuple[int, str]], cap: int) -> None:
    """Equal anomaly lists; where the reference kept only ``cap`` of a kind and
    ledger, equal counts and the reference's examples among Spark's."""
    got_counts = Counter((ledger, kind) for kind, ledger, *_ in got)
    assert got_counts == counts
    capped = {k for k, n in counts.items() if n > cap}
    full = sorted(a for a in got if (a[1], a[0]) not in capped)
    assert full == sorted(a for a in expected if (a[1], a[0]) not in capped)
    assert {a for a in expected if (a[1], a[0]) in capped} <= set(got)


@pytest.mark.parametrize("run", RUNS)
def test_ledger_anomalies_equal_the_ledger_checkers(results: Results, run: str) -> None:
    reference = check_ledgers(results.runs[run])
    expected = [(a.kind, a.ledger, a.ops, a.message) for a in reference.anomalies]
    counts: Counter[tuple[int, str]] = Counter()
    for lid, v in reference.ledgers.items():
        for kind, n in v.counts.items():
            counts[(lid, kind)] += n
    _same(results.linearizable[run], expected, counts, MAX_EXAMPLES)
    # per ledger: the entries that exist, the close point, the operations
    ledgers = results.ledgers[run]
    assert sorted(ledgers) == sorted(reference.ledgers)
    for lid, v in reference.ledgers.items():
        got = ledgers[lid]
        assert (got["operations"], got["entries"], got["closed_at"]) == (
            v.operations,
            v.entries,
            v.closed_at,
        )
        assert got["anomalies"] == sum(v.counts.values())


@pytest.mark.parametrize("run", RUNS)
def test_durability_anomalies_equal_the_durability_check(results: Results, run: str) -> None:
    reference = check_durability(results.runs[run])
    expected = [
        (a["kind"], a["ledger"], tuple(a["ops"]), a["message"]) for a in reference["anomalies"]
    ]
    got = results.durability[run]
    assert Counter(a[0] for a in got) == Counter(reference["counts"])
    if len(got) <= MAX_ANOMALIES:
        assert sorted(got) == sorted(expected)
    assert results.durability_totals.get(run, (0, 0, 0)) == (
        reference["acknowledged"],
        reference["final_reads"],
        reference["ledgers"],
    )
    unknown = [
        (u["ledger"], u["reason"], u["acknowledged"], u["unread"])
        for u in reference["unknown_examples"]
    ]
    assert sorted(results.durability_unknown[run]) == unknown


@pytest.mark.parametrize("kind", ANOMALY_KINDS)
def test_every_planted_kind_is_found_with_its_witnesses(results: Results, kind: str) -> None:
    found = [a for a in results.linearizable[f"planted-{kind}"] if a[0] == kind]
    assert found
    assert all(a[2] and a[3] for a in found)  # operations that prove it, and why


@pytest.mark.parametrize("run", ["valid-0", "valid-1", "valid-2", "campaign-slice"])
def test_valid_histories_pass_both_checks(results: Results, run: str) -> None:
    assert results.linearizable[run] == []
    assert results.durability[run] == []
    assert results.durability_totals[run][0] > 0


def test_histories_without_final_reads_are_unknown_for_durability_not_lost(
    results: Results,
) -> None:
    for run in ("no-final-reads", "part-final-reads"):
        assert results.linearizable[run] == []
        assert results.durability[run] == []
    reasons = {run: {u[1] for u in results.durability_unknown[run]} for run in RUNS}
    assert reasons["no-final-reads"] == {"recovered but not read back"}
    assert reasons["part-final-reads"] == {"read back only in part"}
    assert "never recovered" in reasons["open-and-closed"]  # closed by the writer, or open
    assert reasons["valid-0"] == set()


def test_the_corner_cases_are_anomalies_indeed(results: Results) -> None:
    kinds = {run: {a[0] for a in results.linearizable[run]} for run in RUNS}
    assert kinds["hand-unknown-adds"] == set()  # unknown adds may take effect: valid
    assert {"duplicate", "future-read", "stale-read"} <= kinds["hand-creates"]
    assert {"skip", "divergent-read"} <= kinds["hand-absurd"]
    messages = [a[3] for a in results.linearizable["hand-absurd"]]
    assert any("""it's \\\\ 'quoted'""" in m for m in messages)
