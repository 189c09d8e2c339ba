"""The campaign report renders every kind of anomaly a run's checks produce."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from bkref.nemesis.report import render
from bkref.nemesis.runner import RunResult


def test_history_replication_and_cluster_anomalies_all_render(tmp_path: Path) -> None:
    run = RunResult(
        seed=7,
        directory=str(tmp_path / "run"),
        valid=False,
        error=None,
        checks={
            "durability": {
                "valid": False,
                "counts": {"lost-write": 1},
                "anomalies": [
                    {"kind": "lost-write", "ledger": 3, "ops": [12, 40], "message": "entry 5 lost"}
                ],
            },
            "replication": {
                "valid": False,
                "counts": {"under-replicated": 1},
                "anomalies": [
                    {"kind": "under-replicated", "ledger": 51, "entry": 128, "bookie": "b:3181"},
                    {"kind": "not-repaired-after-heal", "tasks_left": [9], "message": "60 s"},
                ],
            },
        },
        ops={"add:ok": 10},
        faults={"kill": 1},
        windows=[],
        latency_ms={},
        seconds=12.0,
        throughput=[[0, 5, 9, 1], [1, 0, 3, 0]],
        add_latency=[[0, 4.5, 31.0], [1, 0.0, 0.0]],
        under_replicated=[[0, 0], [1, 4], [2, 1], [3, 0]],
        spans=[{"kind": "kill", "target": "bookie-1", "start": 0.5, "stop": 1.5}],
    )
    page = render(
        {"valid": False, "backend": "local", "faults": ["kill"], "time": 10, "runs": [asdict(run)]},
        tmp_path,
    )
    assert "ops [12, 40]" in page
    assert "entry 5 lost" in page
    assert "entry 128, bookie b:3181" in page
    assert "not-repaired-after-heal" in page
    assert "tasks_left [9]" in page
    assert page.count("<svg") == 3  # throughput, add latency, re-replication over time
    assert page.count("<rect") == 3  # the kill window, shaded on each
    assert "add p99 (ms)" in page
    assert "ledgers marked under-replicated (ledgers)" in page
