"""The model checker's BFS on Spark (local[2]) against the local checker: the same
distinct states, explored transitions, depth and completeness on complete configs; on
a mutant, the same invariant violated at the same depth, with a shortest trace that
replays. `make spec-check-spark` holds every named config to this
(tests/spark_checks/spec_check_spark.py); the standalone cluster's case is in
test_cluster.py."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from bkref.spark_checks.spec_bfs import check_on_spark, stable_fingerprint
from bkref.spec import cli as spec_cli
from bkref.spec.checker import check
from bkref.spec.configs import MUTANT_CONFIGS, NAMED
from bkref.spec.invariants import INVARIANTS
from bkref.spec.protocol import initial_state, next_states

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow

# Small named configs reaching different actions: a writer, its ensemble change and
# recoveries with a message loss (m-4651); the auditor and two AutoRecovery workers
# (m-two-workers). `make spec-check-spark` runs every named config.
# m-4651 (13 levels, about 30 s of a loaded worker) is left to `make verify-full`.
CONFIGS = [pytest.param("m-4651", marks=pytest.mark.full), "m-two-workers"]


@pytest.mark.parametrize("name", CONFIGS)
def test_the_spark_bfs_finds_what_the_local_checker_finds(
    spark: SparkSession, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = NAMED[name]
    local = check(cfg)
    caplog.set_level(logging.DEBUG, logger="bkref.spark_checks.spec_bfs")
    on_spark = check_on_spark(cfg, sc=spark.sparkContext, partitions=3)
    # Each level merges each partition once, never an earlier level's again (``parents``
    # derived from an uncached ``merged`` ran the merge itself and left ``merged``, with
    # its lineage back to the first level, to the next level's job: a-reply took 355 s
    # on Spark, 66 s once fixed).
    merges = [r.getMessage() for r in caplog.records if "merge tasks" in r.getMessage()]
    assert len(merges) == on_spark.depth + 1  # the last level finds nothing new
    assert all(m.endswith(": 3 merge tasks for 3 partitions") for m in merges), merges
    assert local.complete
    assert on_spark.complete
    assert (on_spark.distinct, on_spark.explored, on_spark.depth) == (
        local.distinct,
        local.explored,
        local.depth,
    )
    assert on_spark.violation is None
    assert on_spark.fingerprints


def test_a_mutant_is_caught_at_the_same_depth_with_a_shortest_trace(spark: SparkSession) -> None:
    mutant = "release-deletes-any-lock"  # caught at depth 6
    cfg = MUTANT_CONFIGS[mutant].with_mutant(mutant)
    local = check(cfg)
    on_spark = check_on_spark(cfg, sc=spark.sparkContext, partitions=2)
    assert local.violation is not None
    assert (on_spark.violation, on_spark.depth) == (local.violation, local.depth)
    assert not on_spark.complete
    trace = on_spark.trace
    assert len(trace) == len(local.trace) == local.depth + 1
    assert trace[0].state == initial_state(cfg)
    for before, after in itertools.pairwise(trace):
        assert after.state in [t for _, t in next_states(cfg, before.state)]
    assert on_spark.violation is not None
    violated = {inv.__name__: inv for inv in INVARIANTS}[on_spark.violation]
    assert not violated(cfg, trace[-1].state)
    assert all(violated(cfg, step.state) for step in trace[:-1])  # shortest: not earlier


def test_a_state_limit_stops_at_the_end_of_a_level(spark: SparkSession) -> None:
    cfg = NAMED["m-two-workers"]
    r = check_on_spark(cfg, sc=spark.sparkContext, partitions=2, max_states=50)
    assert not r.complete
    assert r.violation is None
    assert 50 <= r.distinct < check(cfg).distinct


def test_another_master_beside_the_active_session_is_an_error(spark: SparkSession) -> None:
    with pytest.raises(ValueError, match=r"session on local\[2\] is active"):
        check_on_spark(NAMED["m-two-workers"], master="spark://127.0.0.1:7077")
    assert not spark.sparkContext._jsc.sc().isStopped()


def test_fingerprints_are_the_same_in_every_process() -> None:
    """Executors are many Python processes, each with its own hash() secret."""
    code = "from bkref.spark_checks.spec_bfs import stable_fingerprint as f; print(f(b'x'))"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert int(other) == stable_fingerprint(b"x")
    assert stable_fingerprint(b"x") != stable_fingerprint(b"y")


def test_the_cli_runs_on_spark_and_says_what_goes_with_it(
    spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    # In this process: the search, found by its entry point, takes the tests' session
    # (its master is local[2]) and leaves it running.
    mutant = "worker-skips-ledger-lock"  # caught at depth 4
    argv = ["check", "--mutant", mutant, "--spark", "--master", "local[2]", "--json"]
    assert spec_cli.main(argv) == 1
    summary = json.loads(capsys.readouterr().out)
    local = check(MUTANT_CONFIGS[mutant].with_mutant(mutant))
    assert (summary["violation"], summary["depth"]) == (local.violation, local.depth)
    assert summary["fingerprints"] is True
    assert len(summary["trace"]) == local.depth + 1
    assert not spark.sparkContext._jsc.sc().isStopped()
    for bad, said in (
        (["--config", "live-check", "--master", "local[2]"], "go with --spark"),
        (["--config", "live-check", "--spark", "--walk", "5"], "not with --walk"),
    ):
        assert spec_cli.main(["check", *bad]) == 2
        assert said in capsys.readouterr().err


# Two more searches (about 15 s): `make verify-full` keeps the script from rotting.
@pytest.mark.full
def test_the_every_config_comparison_passes_a_config_and_fails_a_difference(
    spark: SparkSession,
) -> None:
    from tests.spark_checks import spec_check_spark

    same = spec_check_spark.compare(["m-two-workers"], spark.sparkContext, partitions=2)
    assert [row["same"] for row in same] == [True]
    assert same[0]["local"]["distinct"] == same[0]["spark"]["distinct"] > 1
    wrong = spec_check_spark.compare(
        ["m-two-workers"], spark.sparkContext, partitions=2, spark_max_states=10
    )
    assert [row["same"] for row in wrong] == [False]
