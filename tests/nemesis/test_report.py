"""The campaign report: every kind of anomaly a run's checks produce, every figure a check
reports (never a bare ``{}``), and fault labels placed so that none overlaps another."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bkref.nemesis.report import render
from bkref.nemesis.report_charts import axis_end, fault_labels
from bkref.nemesis.report_checks import figures
from bkref.nemesis.runner import RunResult


def run_result(tmp_path: Path, i: int = 0, *, valid: bool = False) -> dict[str, Any]:
    """A run with a history, a replication, a trace and a clean cluster check."""
    run = RunResult(
        seed=7 + i,
        directory=str(tmp_path / f"run-{i}"),
        valid=valid,
        error=None,
        checks={
            "durability": {
                "valid": valid,
                "acknowledged": 71_583,
                "ledgers": 514,
                "final_reads": 71_684,
                "counts": {} if valid else {"lost-write": 1},
                "anomalies": []
                if valid
                else [
                    {"kind": "lost-write", "ledger": 3, "ops": [12, 40], "message": "entry 5 lost"}
                ],
                "unknown_ledgers": 2,
                "unknown": {"never recovered": 2},
                "unknown_examples": [{"ledger": 8, "reason": "never recovered"}],
            },
            "replication": {
                "valid": valid,
                "converge_seconds": 3.5,
                "entries_audited": 71_684,
                "full_check_marked": 0,
                "counts": {} if valid else {"under-replicated": 1},
                "anomalies": []
                if valid
                else [
                    {"kind": "under-replicated", "ledger": 51, "entry": 128, "bookie": "b:3181"},
                    {"kind": "not-repaired-after-heal", "tasks_left": [9], "message": "60 s"},
                ],
            },
            "cluster": {"valid": True, "anomalies": []},
            "trace": {
                "valid": True,
                "anomalies": [],
                "counts": {"ledgers": 514, "explained": 514, "violation": 0, "unknown": 0},
                "unknown_reasons": {},
                "unknown_ledgers": [],
                "seconds": 25.2,
                "peak_mib": 346.8,
            },
        },
        ops={"add:ok": 10},
        faults={"kill": 1, "pause": 1, "lose-unsynced": 1},
        windows=[],
        latency_ms={"add": {"count": 10, "p50": 2.0, "p99": 9.0, "max": 12.0}},
        seconds=12.0,
        throughput=[[s, 100 + 10 * s, 20, 1] for s in range(60)],
        add_latency=[[s, 4.5, 31.0 + s] for s in range(55)],
        under_replicated=[[s, max(0, 20 - abs(s - 30))] for s in range(72)],
        spans=[
            {"kind": "kill", "target": "bookie-1", "start": 0.5, "stop": 1.5},
            {"kind": "lose-unsynced", "target": "bookie-4", "start": 20.0, "stop": 24.0},
            {"kind": "pause", "target": "bookie-4", "start": 21.0, "stop": 23.0},
            {"kind": "partition", "target": "majorities-ring", "start": 69.0, "stop": 70.5},
        ],
        scraped={
            "scrapes": {"ok": 300, "failed": 12},
            "add_latency": [[s, 1.5, 9.0] for s in range(58)],
            "under_replicated": [[s, max(0, 18 - abs(s - 31))] for s in range(70)],
        },
    )
    return asdict(run)


def campaign(tmp_path: Path, runs: int = 1) -> dict[str, Any]:
    return {
        "valid": False,
        "backend": "local",
        "faults": ["kill", "pause", "lose-unsynced", "partition"],
        "time": 60,
        "runs": [run_result(tmp_path, i, valid=i > 0) for i in range(runs)],
    }


def _text(page: str) -> str:
    """What the page shows, without its scripts (plotly.js and the figures' data)."""
    return re.sub(r"<script.*?</script>", "", page, flags=re.S)


def test_history_replication_and_cluster_anomalies_all_render(tmp_path: Path) -> None:
    page = render(campaign(tmp_path), tmp_path)
    shown = _text(page)
    assert "ops [12, 40]" in shown
    assert "entry 5 lost" in shown
    assert "entry 128, bookie b:3181" in shown
    assert "not-repaired-after-heal" in shown
    assert "tasks_left [9]" in shown
    # Each anomaly naming a ledger links to that ledger in the run's timeline.
    assert '<a href="run-0/timeline.html#ledger-3">ledger 3</a>' in shown
    assert '<a href="run-0/timeline.html#ledger-8">ledger 8</a>' in shown  # an unknown one


def test_each_run_has_one_chart_with_every_series_and_the_script_is_embedded(
    tmp_path: Path,
) -> None:
    page = render(campaign(tmp_path, runs=2), tmp_path)
    assert page.count('class="plotly-graph-div"') == 2
    assert 'id="chart-run-0"' in page
    assert 'id="chart-run-1"' in page
    for name in ("adds (per second)", "add p99 (ms)", "bookie add p99 (ms)"):
        assert page.count(f'"{name}"') == 2, name  # a trace's name, in each run's figure
    # The bookies' own count of marked ledgers (/metrics) replaces the campaign's sample.
    assert page.count("bkref_under_replicated_ledgers") == 2
    assert "sampled by the campaign" not in page
    assert "300 scrapes, 12 failed" in _text(page)
    assert "cdn.plot.ly" not in _text(page)  # no network at view time
    assert page.count("Plotly.newPlot") >= 2


def test_a_checks_section_names_every_figure_and_never_prints_a_bare_mapping(
    tmp_path: Path,
) -> None:
    page = render(campaign(tmp_path), tmp_path)
    shown = _text(page)
    assert "{}" not in shown
    for words in (
        "acknowledged entries</td><td>71,583",
        "entries found by the final reads</td><td>71,684",
        "unknown ledgers by reason</td><td>never recovered 2",
        "seconds to converge after the heal</td><td>3.5",
        "explained by the spec</td><td>514",
        "check&#x27;s peak memory (MiB)</td><td>346.8",
        "anomalies</td><td>none",  # the cluster check
        "anomalies</td><td>lost-write 1",
    ):
        assert words in shown, words


def test_a_figure_a_check_gains_is_shown_under_its_own_name() -> None:
    rows = dict(figures("replication", {"valid": True, "anomalies": [], "bytes_copied": 4096}))
    assert rows["bytes copied"] == "4,096"
    assert rows["anomalies"] == "none"


def test_fault_labels_that_would_overlap_go_to_separate_lanes() -> None:
    spans = [
        {"kind": "lose-unsynced", "target": "bookie-4", "start": 20.0, "stop": 24.0},
        {"kind": "pause", "target": "bookie-4", "start": 21.0, "stop": 23.0},
        {"kind": "kill", "target": "bookie-1", "start": 40.0, "stop": 41.0},
    ]
    labels = fault_labels(spans, 72.0)
    assert [lb.lane for lb in labels] == [0, 1, 0]  # the kill is far enough to share lane 0
    assert [lb.anchor for lb in labels] == ["left"] * 3


def test_a_label_that_would_run_off_the_right_edge_ends_at_it() -> None:
    (label,) = fault_labels(
        [{"kind": "partition", "target": "majorities-ring", "start": 71.0, "stop": 72.0}], 72.0
    )
    assert (label.anchor, label.x) == ("right", 72.0)


def test_every_panel_spans_the_longest_series_or_fault_window(tmp_path: Path) -> None:
    run = run_result(tmp_path)
    assert axis_end(run) == 72.0  # under_replicated's 72 seconds, past the others
    run["spans"].append({"kind": "kill", "target": "bookie-2", "start": 70.0, "stop": 80.0})
    assert axis_end(run) == 80.0
