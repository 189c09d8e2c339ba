"""`bkref check`: verdicts, exit codes, JSON, the HTML timeline, bad input."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from bkref.linearizability.check_cli import _Progress, main
from bkref.linearizability.generate import ledger_history, to_ops
from bkref.linearizability.history_files import write_history
from bkref.linearizability.plant import plant

PEER = Path(__file__).resolve().parents[1] / "data" / "peer-histories"


def _history(tmp_path: Path, kind: str | None, suffix: str = ".jsonl") -> Path:
    for seed in range(50):
        rng = random.Random(seed)
        ops = to_ops(ledger_history(rng, adds=8, reads=12, end="recover"))
        if kind is not None:
            bad = plant(rng, ops, kind)
            if bad is None:
                continue
            ops = bad
        path = tmp_path / f"h{suffix}"
        write_history(ops, path)
        return path
    raise AssertionError("no history")


def test_valid_ledger_history_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(_history(tmp_path, None))]) == 0
    assert "VALID" in capsys.readouterr().out


def test_parquet_is_read_too(tmp_path: Path) -> None:
    assert main([str(_history(tmp_path, None, ".parquet"))]) == 0


def test_invalid_history_exits_1_and_names_the_anomaly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _history(tmp_path, "lost-write")
    html_out = tmp_path / "t.html"
    assert main([str(path), "--json", "--html", str(html_out)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "invalid"
    (file_report,) = report["files"]
    assert "lost-write" in file_report["anomaly_counts"]
    assert all(a["ops"] for a in file_report["anomalies"])
    page = html_out.read_text()
    assert "lost-write" in page
    assert 'class="window"' in page
    assert "hot" in page
    assert not re.search(r"(src|href)=\"?https?:", page), "the timeline must not need a network"


def test_search_engine_agrees_on_the_ledger(tmp_path: Path) -> None:
    assert main([str(_history(tmp_path, "stale-read")), "--engine", "search"]) == 1


def test_peer_formats_are_recognised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(PEER / "jepsen" / "etcd_002.log")]) == 0
    html_out = tmp_path / "t.html"
    assert main([str(PEER / "kv" / "c01-bad.txt"), "--html", str(html_out)]) == 1
    out = capsys.readouterr().out
    # The anomaly in the table's words (the same as bkref spark-check's).
    assert "nonlinearizable: key " in out
    assert "cannot take effect after the longest linearizable prefix (op [" in out
    page = html_out.read_text()
    assert "longest linearizable prefix" in page
    assert "linearized #1" in page


def test_out_of_budget_is_unknown_exit_2(tmp_path: Path) -> None:
    lines = [
        json.dumps(
            {
                "index": i,
                "time": i,
                "process": i,
                "type": "invoke",
                "f": "write",
                "ledger": None,
                "value": i,
            }
        )
        for i in range(18)
    ]
    lines += [
        json.dumps(
            {
                "index": 18 + i,
                "time": 18 + i,
                "process": i,
                "type": "ok",
                "f": "write",
                "ledger": None,
                "value": i,
            }
        )
        for i in range(18)
    ]
    lines += [
        json.dumps(
            {
                "index": 36,
                "time": 36,
                "process": 99,
                "type": "invoke",
                "f": "read",
                "ledger": None,
                "value": None,
            }
        ),
        json.dumps(
            {
                "index": 37,
                "time": 37,
                "process": 99,
                "type": "ok",
                "f": "read",
                "ledger": None,
                "value": -1,
            }
        ),
    ]
    path = tmp_path / "h.jsonl"
    path.write_text("\n".join(lines) + "\n")
    # The search: the unique-writes engine would see at once that -1 was never written.
    assert main([str(path), "--model", "register", "--engine", "search", "--budget", "0.2"]) == 2


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"index": 0, "time": 0, "process": 0, "type": "ok", "f": "add", "ledger": 1}\n'
    )
    assert main([str(path)]) == 2
    assert "completion without invocation" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.jsonl")]) == 2


def test_help_explains(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "exit status" in out
    assert "cas-register" in out
    assert "Jepsen" in out


def test_files_of_whole_ledgers_are_checked_one_after_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(3)
    paths = []
    for lid in (1, 2):
        ops = to_ops(ledger_history(rng, ledger=lid, adds=5, reads=5, end="close"))
        if lid == 2:
            bad = plant(rng, ops, "disagreeing-closes")
            assert bad is not None
            ops = bad
        paths.append(tmp_path / f"ledger{lid}.jsonl")
        write_history(ops, paths[-1])
    assert main([str(p) for p in paths]) == 1
    out = capsys.readouterr().out
    assert "overall: INVALID" in out
    assert "disagreeing-closes" in out


def test_long_work_reports_progress_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    progress = _Progress(quiet=False)
    progress(1000)  # too soon: silent
    progress.last -= 5
    progress(200_000)
    progress.last -= 5
    progress.keys(3, 10)
    err = capsys.readouterr().err
    assert "200,000 ops read" in err
    assert "3 of 10 keys decided" in err
    assert "1,000" not in err
