"""A short real campaign: a local cluster, the workload under kill and pause faults, checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from impl.cluster.process import pid_alive
from nemesis.db import LocalBackend
from nemesis.runner import RunSpec, run_once
from nemesis.workload import WorkloadSpec

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


def test_short_campaign_injects_faults_and_is_valid(
    tmp_path: Path,
) -> None:
    spec = RunSpec(
        seed=3,
        duration=10.0,
        faults=("kill", "pause"),
        bookies=4,
        workload=WorkloadSpec(writers=2, readers=2, in_flight=4, entries_per_ledger=40),
    )
    backend = LocalBackend(tmp_path / "cluster", bookies=4)
    messages: list[str] = []
    result = run_once(spec, backend, tmp_path / "run", messages.append)

    assert result.error is None, result.error
    assert result.windows, "seed 3 schedules at least one fault in 10 s"
    assert sum(result.faults.values()) == len(result.windows)
    assert result.ops.get("add:ok", 0) > 0
    assert result.ops.get("recover:ok", 0) >= result.ops.get("create:ok", 0)

    durability = result.checks["durability"]
    assert durability["valid"], durability["anomalies"][:5]
    assert durability["acknowledged"] == result.ops["add:ok"]
    assert durability["final_reads"] >= durability["acknowledged"]
    linearizable = result.checks["linearizable"]
    assert linearizable["ledgers"] == result.ops["create:ok"]
    assert linearizable["valid"], linearizable["anomalies"][:5]
    assert result.valid is True

    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["seed"] == 3
    assert (tmp_path / "run" / "history.jsonl").stat().st_size > 0
    assert "<svg" in (tmp_path / "run" / "timeline.html").read_text()
    assert any(m.startswith("nemesis: ") for m in messages)

    # Teardown stopped every process the campaign started.
    state = json.loads((tmp_path / "cluster" / "cluster.json").read_text())
    pids = [b["pid"] for b in state["bookies"] if b.get("pid")]
    assert not [p for p in pids if pid_alive(p)]
