"""The trace checker on traces of real runs: runs the spec explains, the same runs with
one step changed, and a planted bug. Each changed trace must get a violation that names
the changed step, never an unknown."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bkref.spec.protocol import ACTIONS
from bkref.tracecheck import cli
from bkref.tracecheck import search as tracecheck_search
from bkref.tracecheck.cli import check, main
from bkref.tracecheck.load import CONNECTED, REGISTERED, REPLACEMENT, STOPPED
from bkref.tracecheck.project import LedgerTrace
from bkref.tracecheck.search import Verdict
from tests.tracecheck.conftest import Recorded

pytestmark = pytest.mark.zookeeper

Lines = list[dict[str, Any]]


def _read(path: Path) -> Lines:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _write(path: Path, lines: Lines) -> None:
    for i, x in enumerate(lines):
        x["seq"] = i  # a changed file is still numbered in order
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _copy(recorded: Recorded, tmp_path: Path) -> Path:
    out = tmp_path / "traces"
    shutil.copytree(recorded.traces, out)
    return out


def _verdict(traces: Path, ledger: int) -> Verdict:
    (v,) = check(traces, 60.0, [ledger])
    return v


def _bookie_files(traces: Path) -> list[Path]:
    return [f for f in sorted(traces.glob("trace-*.jsonl")) if f.stem.count("_")]


def test_a_recorded_run_is_explained_by_the_spec(recorded: Recorded) -> None:
    v = _verdict(recorded.traces, recorded.recovered)
    assert v.verdict == "explained", v.render()
    # Ten adds on two bookies each, their receipts, a recovery's fencing, reads and
    # write-backs: every step replayed.
    assert v.steps > 60
    assert v.replayed == v.steps


def test_recovery_reads_without_fence_is_caught_at_its_first_unfenced_read(
    recorded: Recorded,
) -> None:
    v = _verdict(recorded.traces, recorded.planted)
    assert v.verdict == "violation", v.render()
    assert "recovery_client_starts_recovery" in v.event
    assert "without the fence flag" in v.reason
    assert any(x.startswith("recovery_client_starts_recovery") for x in v.offered)


def test_an_ack_taken_in_after_the_add_that_piggybacks_it_is_a_violation(
    recorded: Recorded, tmp_path: Path
) -> None:
    traces = _copy(recorded, tmp_path)
    path = traces / "trace-writer.jsonl"
    lines = _read(path)
    mine = [x for x in lines if x.get("ledger") == recorded.recovered]
    send = next(x for x in mine if x["action"] == "writer_sends_add" and x["lac"] >= 0)
    k = send["lac"]
    # The ack that confirmed entry k: the last receipt for k before the send.
    ack = [
        x
        for x in mine[: mine.index(send)]
        if x["action"] == "writer_receives_add_response" and x["entry"] == k
    ][-1]
    lines.remove(ack)
    lines.insert(lines.index(send) + 1, ack)  # now taken in after the send that needs it
    _write(path, lines)
    v = _verdict(traces, recorded.recovered)
    assert v.verdict == "violation", v.render()
    assert "writer_sends_add" in v.event
    assert f"entry={send['entry']}" in v.event
    assert f"carrying LAC {k}" in v.reason


def test_a_bookie_that_takes_an_add_after_a_fence_is_a_violation(
    recorded: Recorded, tmp_path: Path
) -> None:
    traces = _copy(recorded, tmp_path)
    lid = recorded.fenced
    # The writer's add after the recovery: its bookies answered FENCED. One of them now
    # says OK, and the writer took that OK in.
    for path in _bookie_files(traces):
        lines = _read(path)
        refused = [
            x
            for x in lines
            if x.get("ledger") == lid
            and x["action"] == "bookie_handles_add"
            and x["status"] == "FENCED"
        ]
        if refused:
            refused[0]["status"] = "OK"
            _write(path, lines)
            break
    rid, bookie = refused[0]["rid"], refused[0]["bookie"]
    path = traces / "trace-writer.jsonl"
    lines = _read(path)
    for x in lines:
        if x.get("ledger") == lid and x.get("rid") == rid and x.get("bookie") == bookie:
            x["status"] = "OK"
    _write(path, lines)
    v = _verdict(traces, lid)
    assert v.verdict == "violation", v.render()
    assert "bookie_handles_add" in v.event
    assert f"entry={refused[0]['entry']}" in v.event
    assert "refuses (fenced)" in v.reason


def _stale_close(recorded: Recorded, tmp_path: Path, **change: object) -> Verdict:
    """The verdict on the run where the recovery whose close lost the race logged it as
    closed, with ``change`` on its line too."""
    traces = _copy(recorded, tmp_path)
    lid = recorded.recovered
    for name in ("recoverer", "racer"):
        path = traces / f"trace-{name}.jsonl"
        lines = _read(path)
        close = [
            x
            for x in lines
            if x["action"] == "recovery_client_closes_ledger"
            and x["ledger"] == lid
            and x["outcome"] == "lost"  # the other recovery had closed it first
        ]
        if close:
            close[0]["outcome"] = "closed"  # as if its CAS had landed on the stale version
            close[0].update(change)
            _write(path, lines)
            break
    return _verdict(traces, lid)


def test_a_close_on_a_stale_metadata_version_is_a_violation(
    recorded: Recorded, tmp_path: Path
) -> None:
    v = _stale_close(recorded, tmp_path)
    assert v.verdict == "violation", v.render()
    assert "recovery_client_closes_ledger" in v.event
    assert "ends lost" in v.reason


def test_a_close_read_back_after_a_lost_connection_may_be_the_other_recovery_s(
    recorded: Recorded, tmp_path: Path
) -> None:
    """bkref's ``cas_ledger`` counts a write whose answer was lost as done when it reads
    back the very metadata it wrote: the identical close the other recovery wrote first
    (two recoveries of one ledger in a campaign's ZooKeeper-wide expiry). Said on the line
    (``read_back``), it is no violation; a different last entry still is."""
    v = _stale_close(recorded, tmp_path, read_back=True)
    assert v.verdict == "explained", v.render()
    v = _stale_close(recorded, tmp_path / "other", read_back=True, last=0)
    assert v.verdict == "violation", v.render()


def test_a_bookie_restarted_mid_ledger_is_explained(recorded: Recorded) -> None:
    v = _verdict(recorded.traces, recorded.restarted)
    assert v.verdict == "explained", v.render()


def test_a_bookie_that_comes_back_without_an_entry_it_acknowledged_is_a_violation(
    recorded: Recorded, tmp_path: Path
) -> None:
    traces = _copy(recorded, tmp_path)
    lid = str(recorded.restarted)
    for path in _bookie_files(traces):
        lines = _read(path)
        back = [x for x in lines if x["action"] == "bookie_restarts" and lid in x["ledgers"]]
        if back:
            held = back[0]["ledgers"][lid]
            mask = int(held["entries"], 16)
            first = (mask & -mask).bit_length() - 1
            held["entries"] = hex(mask & ~(1 << first))  # the replay lost its first entry
            _write(path, lines)
            break
    v = _verdict(traces, recorded.restarted)
    assert v.verdict == "violation", v.render()
    assert "bookie_restarts" in v.event
    assert f"came back without e{first}," in v.reason


def test_a_ledger_whose_recovery_left_no_trace_is_unknown_not_a_violation(
    recorded: Recorded, tmp_path: Path
) -> None:
    traces = _copy(recorded, tmp_path)
    (traces / "trace-racer.jsonl").unlink()
    v = _verdict(traces, recorded.recovered)
    assert v.verdict == "unknown"
    assert "left no trace" in v.reason


def test_the_command_exits_1_on_a_violation_and_prints_the_step(
    recorded: Recorded, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "verdicts.json"
    assert main(["check", str(recorded.traces), "--json", str(out)]) == 1
    text = capsys.readouterr().out
    assert f"ledger {recorded.planted}: violation" in text
    assert "4 ledgers" in text
    assert "3 explained, 1 violation(s), 0 unknown" in text
    verdicts = {v["ledger"]: v["verdict"] for v in json.loads(out.read_text())}
    assert verdicts == {
        recorded.recovered: "explained",
        recorded.planted: "violation",
        recorded.fenced: "explained",
        recorded.restarted: "explained",
    }
    assert main(["check", str(recorded.traces), "--ledger", str(recorded.recovered)]) == 0


def test_every_line_is_a_spec_action_or_a_connection(recorded: Recorded) -> None:
    names = {a.__name__ for a in ACTIONS} | {CONNECTED, REPLACEMENT, STOPPED, REGISTERED}
    seen = set()
    for f in recorded.traces.glob("trace-*.jsonl"):
        lines = _read(f)
        assert [x["seq"] for x in lines] == list(range(len(lines)))
        seen |= {x["action"] for x in lines}
    assert seen <= names
    # Writers, recoveries and bookies all logged: every kind of step the check joins.
    assert {
        "writer_creates_ledger",
        "writer_sends_add",
        "writer_receives_add_response",
        "writer_closes_ledger",
        "recovery_client_starts_recovery",
        "recovery_client_receives_fencing_response",
        "recovery_client_completes_fencing",
        "recovery_client_receives_read_response",
        "recovery_client_receives_add_response",
        "recovery_client_closes_ledger",
        "bookie_handles_add",
        "bookie_handles_fencing_lac_read",
        "bookie_handles_recovery_read",
        CONNECTED,
    } <= seen


def test_ledgers_out_of_their_share_get_what_the_budget_has_left(
    recorded: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger that ran out of its share of the budget is searched again with what the
    first pass left, instead of staying unknown while the budget is mostly unspent."""
    calls: dict[int, list[float]] = {}
    real = tracecheck_search.search

    def search(lt: LedgerTrace, budget: float = 60.0) -> Verdict:
        calls.setdefault(lt.ledger, []).append(budget)
        # The first pass runs out at once, as a hard ledger's share would.
        return real(lt, 0.0 if len(calls[lt.ledger]) == 1 else budget)

    plain = [(v.ledger, v.verdict) for v in check(recorded.traces, 120.0, [])]
    monkeypatch.setattr(cli, "search", search)
    verdicts = check(recorded.traces, 120.0, [])
    assert [(v.ledger, v.verdict) for v in verdicts] == plain  # none left unknown
    assert all(len(b) == 2 and b[1] > cli.LEDGER_SHARE for b in calls.values()), calls
