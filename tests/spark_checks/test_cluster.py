"""`bkref spark-check` on a real standalone cluster gives local[2]'s verdicts, and
`bkref spec check --spark` there counts what the local checker counts.

One master and one worker (:mod:`bkref.spark_checks.standalone`) on 127.0.0.1
for the module. Each history is checked twice by a `bkref spark-check`
process, on the cluster and on local[2], and the two verdicts must be equal.
The executors' Python is the venv's with bkref hidden (see :func:`_no_bkref`),
as on machines where bkref is not installed: they import it only from the zip
the driver ships, so a module missing from that zip fails the run here.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from bkref.linearizability.history import Op
from bkref.linearizability.history_files import write_jsonl
from bkref.spark_checks.standalone import HOST, ClusterError, StandaloneCluster, group_members
from tests.spark_checks.test_generic import register_history

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BKREF = str(Path(sys.executable).with_name("bkref"))
PARTITIONS = "4"  # the cluster's default (200) costs minutes on histories this small
CHECK_TIMEOUT = 600  # seconds for one spark-check on a loaded 2-core machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    c = StandaloneCluster(tmp_path_factory.mktemp("standalone"))
    with c:
        print(f"standalone cluster up in {c.started_in:.1f} s")
        yield c


def _no_bkref(directory: Path) -> Path:
    """A Python for the executors: the venv's, with its editable bkref finder
    removed, running the module Spark names (``-m pyspark.daemon``)."""
    boot = directory / "no_bkref.py"
    boot.write_text(
        "import runpy, sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path\n"
        "                    if 'editable' not in getattr(f, '__module__', '')]\n"
        "sys.path_hooks[:] = [h for h in sys.path_hooks\n"
        "                     if 'editable' not in getattr(h, '__module__', '')]\n"
        "sys.path_importer_cache.clear()\n"
        "assert sys.argv[1] == '-m', sys.argv\n"
        "module, sys.argv = sys.argv[2], [sys.argv[0], *sys.argv[3:]]\n"
        "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
    )
    python = directory / "python-no-bkref"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{boot}" "$@"\n')
    python.chmod(0o755)
    return python


def spark_check(history: Path, master: str, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    """Run `bkref spark-check` as its own process; its exit status and summary. On a
    cluster the executors' Python has bkref hidden; a local run ships no zip, so its
    Python workers are the venv's own."""
    env = dict(os.environ, SPARK_LOCAL_IP=HOST)
    if not master.startswith("local"):
        env["PYSPARK_PYTHON"] = str(_no_bkref(out.parent))
    argv = [BKREF, "spark-check", str(history), "--master", master, "--out", str(out)]
    argv += ["--partitions", PARTITIONS, "--quiet", *extra]
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=CHECK_TIMEOUT, check=False
    )
    assert done.returncode in (0, 1), f"{master}: exit {done.returncode}: {done.stderr[-2000:]}"
    return done.returncode, json.loads((out / "summary.json").read_text())


def _verdict(summary: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on where the job ran."""
    keys = ("verdict", "anomalies", "operations", "ops", "ledgers", "keys", "durability")
    return {k: summary.get(k) for k in keys}


def _gen_history(out: Path, *extra: str) -> Path:
    argv = [BKREF, "gen-history", "--ops", "4000", "--ledgers", "4", "--seed", "21"]
    subprocess.run([*argv, "--out", str(out), *extra], check=True, capture_output=True)
    return out


def _both(
    cluster: StandaloneCluster, history: Path, work: Path, *extra: str
) -> tuple[int, dict[str, Any]]:
    """The history checked on the cluster and on local[2]: equal verdicts; the
    cluster's exit status and summary. The cluster's application must have
    completed on the master, with executors on the standalone worker."""
    completed = {a["id"] for a in cluster.state()["completedapps"]}
    on_cluster = spark_check(history, cluster.url, work / "cluster", *extra)
    local = spark_check(history, "local[2]", work / "local", *extra)
    assert on_cluster[0] == local[0]
    assert _verdict(on_cluster[1]) == _verdict(local[1])
    assert on_cluster[1]["master"] == cluster.url
    assert local[1]["master"] == "local[2]"
    new = [a for a in cluster.state()["completedapps"] if a["id"] not in completed]
    assert [a["name"] for a in new] == ["bkref spark-check"]
    took = f"{on_cluster[1]['seconds']} s on {cluster.url}, {local[1]['seconds']} s on local[2]"
    print(f"spark-check {history.name}: {took}")  # shown by pytest -s
    app_dir = cluster.directory / "work" / new[0]["id"]
    assert list(app_dir.glob("*/stderr")), f"no executor ran on the worker ({app_dir})"
    return on_cluster


# Two more jobs on each master (about 110 CPU s, 8 minutes of a loaded verify): `make
# spark-cluster-test` runs them; verify holds the cluster to local[2] with the job below.
@pytest.mark.full
def test_a_valid_run_and_a_planted_lost_write_get_the_same_verdicts_on_both(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    # Two runs in one job (a directory of JSON Lines files, converted on the driver): one
    # valid, one with a lost write planted. One job per master keeps the test's time down.
    runs = tmp_path / "runs"
    runs.mkdir()
    _gen_history(runs / "good.jsonl")
    _gen_history(runs / "bad.jsonl", "--anomaly", "lost-write")
    status, summary = _both(cluster, runs, tmp_path)
    assert status == 1
    assert summary["runs"] == 2
    assert summary["ledgers"] == 8
    assert summary["anomalies"]["durability"]["lost-write"] == 1
    found = pq.read_table(tmp_path / "cluster" / "anomalies").to_pylist()
    assert {a["run"] for a in found} == {"bad"}, "the valid run got an anomaly"


def _bad_register(rng: random.Random) -> list[Op]:
    """A register history with a read of a value nobody wrote."""
    ops = register_history(rng, 3, 200)
    n = len(ops)
    return [
        *ops,
        Op(n, n, 10_000, "invoke", "read", 0, None),
        Op(n + 1, n + 1, 10_000, "ok", "read", 0, 99),
    ]


def test_the_generic_search_runs_in_the_executors_python_from_the_shipped_zip(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    # applyInPandas: the executors' Python unpickles bkref.spark_checks.generic
    history = tmp_path / "register.jsonl"
    write_jsonl(_bad_register(random.Random(4)), history)
    status, summary = _both(cluster, history, tmp_path, "--model", "register")
    assert status == 1
    assert summary["anomalies"] == {"linearizable": {"nonlinearizable": 1}}


# The spec's BFS on the cluster (bkref.spark_checks.spec_bfs): its executors import the
# spec from the shipped zip. In `make spark-cluster-test` and verify-full (a third
# application, about a minute of a loaded verify); verify runs the BFS on local[2].
@pytest.mark.full
def test_the_spec_bfs_on_the_cluster_counts_what_the_local_checker_counts(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    from bkref.spec.checker import check
    from bkref.spec.configs import NAMED

    env = dict(os.environ, SPARK_LOCAL_IP=HOST, PYSPARK_PYTHON=str(_no_bkref(tmp_path)))
    completed = {a["id"] for a in cluster.state()["completedapps"]}
    argv = [BKREF, "spec", "check", "--config", "m-two-workers", "--spark", "--json"]
    done = subprocess.run(
        [*argv, "--master", cluster.url, "--partitions", PARTITIONS],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    local = check(NAMED["m-two-workers"])
    assert (summary["distinct"], summary["explored"], summary["depth"]) == (
        local.distinct,
        local.explored,
        local.depth,
    )
    assert summary["complete"] is True
    new = [a for a in cluster.state()["completedapps"] if a["id"] not in completed]
    assert [a["name"] for a in new] == ["bkref spec check m-two-workers"]
    assert list((cluster.directory / "work" / new[0]["id"]).glob("*/stderr"))


def test_stopping_the_cluster_leaves_no_process(cluster: StandaloneCluster) -> None:
    groups = cluster.pids()
    assert len(groups) == 2
    assert group_members(groups)  # the master and worker JVMs, before
    cluster.stop()
    assert group_members(groups) == []
    assert all(p.poll() is not None for p in cluster.processes.values())


def test_a_worker_not_up_by_the_deadline_is_an_error_naming_its_log(tmp_path: Path) -> None:
    c = StandaloneCluster(tmp_path, timeout=0.1)  # a JVM takes seconds to start
    with pytest.raises(ClusterError, match=r"no Spark worker registered .* see .*worker\.log"):
        c.start()
    assert len(c.pids()) == 2
    assert group_members(c.pids()) == []  # start stopped what it had started
