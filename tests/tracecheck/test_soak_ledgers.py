"""Ledgers of soak runs the trace check once left unknown, kept as their traces
(``tests/data/tracecheck-soak``, each cut to one ledger's lines and the lines that name no
ledger): each must stay explained, and the same trace with one step changed must not be."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bkref.tracecheck.cli import check

DATA = Path(__file__).resolve().parents[1] / "data" / "tracecheck-soak"
WORKER = "trace-autorecovery-127.0.0.1_3181-0.jsonl"


def _ledger(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.iterdir() if p.is_dir()))
def test_a_soak_ledger_once_unknown_is_explained(name: str) -> None:
    (v,) = check(DATA / name, 20.0, [_ledger(name)])
    assert v.verdict == "explained", v.render()


def test_a_ledger_whose_creation_left_no_line_is_unknown_and_the_unknown_outcome_explains_it(
    tmp_path: Path,
) -> None:
    """netns-101 ledger 28: its creation's answer was lost, and the client traced nothing
    (unknown); the client's line for it now, with its outcome unknown, explains it."""
    run = tmp_path / "run"
    shutil.copytree(DATA / "netns-101-ledger-28", run)
    client = run / "trace-client.jsonl"
    lines = [json.loads(x) for x in client.read_text().splitlines()]
    (create,) = [x for x in lines if x["action"] == "writer_creates_ledger"]
    assert (create["ledger"], create["outcome"]) == (28, "unknown")
    kept = [x for x in lines if x is not create]
    for seq, x in enumerate(kept):  # numbered without a gap, as the client would have
        x["seq"] = seq
    client.write_text("".join(json.dumps(x) + "\n" for x in kept))
    (v,) = check(run, 20.0, [28])
    assert v.verdict == "unknown", v.render()
    assert v.reason == "created by a client that left no trace", v.render()


FINDINGS = DATA.parent / "tracecheck-findings"


def test_a_fence_answered_before_it_was_durable_is_a_violation() -> None:
    """netns-29 ledger 454: a bookie answered a recovery's fencing reads while the fence
    an earlier request started was not durable, then restarted unfenced (bkref's bug,
    fixed since; the trace stays as the run wrote it)."""
    (v,) = check(FINDINGS / "netns-29-ledger-454", 20.0, [454])
    assert v.verdict == "violation", v.render()
    assert v.reason == "b2 came back unfenced; the spec's bookie keeps its fence", v.render()
    assert "bookie_restarts(bookie=127.0.0.1:3183" in v.event


def test_a_fencing_read_answered_from_an_add_decided_after_it_is_a_violation(
    tmp_path: Path,
) -> None:
    """netns-56 ledger 184: a recovery's fencing reads and its write-backs of the same
    entries reached 3184 in one event-loop turn while the fence was on its way to the
    journal; each read looked its entry up only at its answer, after the write-back was
    applied, and answered "found" (bkref's bug, fixed since). With the answers the bookie
    gives now, from what it held when it decided each read, the trace is explained."""
    (v,) = check(FINDINGS / "netns-56-ledger-184", 20.0, [184])
    assert v.verdict == "violation", v.render()
    assert v.reason == "the spec's b1 lacks e42; the bookie answered found", v.render()
    run = tmp_path / "run"
    shutil.copytree(FINDINGS / "netns-56-ledger-184", run)
    answered: set[tuple[str, int]] = set()
    for p in sorted(run.glob("trace-127.0.0.1_*.jsonl")):
        lines = [json.loads(x) for x in p.read_text().splitlines()]
        writes = [x for x in lines if x["action"] == "bookie_handles_add" and x["recovery"]]
        for x in lines:
            if x["action"] != "bookie_handles_recovery_read" or not x["found"]:
                continue
            later = (a for a in writes if x["decided"] < a["decided"] < x["t"])
            if any(a["entry"] == x["entry"] for a in later):
                x["found"], x["status"] = False, "NO_SUCH_ENTRY"
                answered.add((x["bookie"], x["rid"]))
        p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    client = run / "trace-client.jsonl"
    lines = [json.loads(x) for x in client.read_text().splitlines()]
    for x in lines:
        if x["action"].endswith("receives_read_response") and (x["bookie"], x["rid"]) in answered:
            x["status"] = "NO_SUCH_ENTRY"
    client.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert len(answered) == 6
    (v,) = check(run, 20.0, [184])
    assert v.verdict == "explained", v.render()


def test_a_mark_written_after_a_copy_of_its_bookie_explains_the_copy_not_any_copy(
    tmp_path: Path,
) -> None:
    """docker-15 ledger 403: a worker copied 3182's fragment (its session had expired,
    which no node logs) before the audit that read it lost wrote its mark. The same trace
    with one entry left out of that copy is a violation."""
    run = tmp_path / "run"
    shutil.copytree(DATA / "docker-15-ledger-403", run)
    worker = run / WORKER
    lines = [json.loads(x) for x in worker.read_text().splitlines()]
    (copy,) = [x for x in lines if x["action"] == "worker_copies_fragment"]
    dropped = copy["entries"].pop(1)
    copy["sends"] = [s for s in copy["sends"] if s.get("entry") != dropped]
    worker.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (v,) = check(run, 20.0, [403])
    assert v.verdict == "violation", v.render()
    assert "worker_copies_fragment" in v.event, v.render()


def test_a_mark_from_both_early_reads_names_only_bookies_the_ledger_had(tmp_path: Path) -> None:
    """netns-29 ledger 9: an audit read the registrations while 3181, 3182 and 3185 were
    unregistered and the ledger before a worker swapped 3185 out; its mark (all three
    lost) landed after all three came back (``auditor_marks_from_earlier_view_and_scan``).
    The same mark naming 3183 too, which the ledger never had, is not explained."""
    run = tmp_path / "run"
    shutil.copytree(DATA / "netns-29-ledger-9", run)
    auditor = run / "trace-autorecovery-127.0.0.1_3184-1.jsonl"
    lines = [json.loads(x) for x in auditor.read_text().splitlines()]
    (mark,) = [x for x in lines if x["action"].startswith("auditor_marks") and x["seq"] == 12]
    mark["replicas"]["127.0.0.1:3183"] = "LOST"
    auditor.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (v,) = check(run, 5.0, [9])
    assert v.verdict != "explained", v.render()
    assert "#12 auditor_marks_ledgers_of_lost_bookies" in v.render(), v.render()


def test_a_dead_auditor_s_unlogged_mark_explains_a_task_only_if_it_died(tmp_path: Path) -> None:
    """netns-40 ledger 205: the auditor at 3181 was killed in its audit after writing
    the mark of ledger 205 (3182 lost) and before logging it; a worker then took that
    task. Had the auditor process lived on (no later process of its node), its audit
    would have logged every mark it wrote, and no order explains the task."""
    (v,) = check(DATA / "netns-40-ledger-205", 20.0, [205])
    assert v.verdict == "explained", v.render()
    run = tmp_path / "run"
    shutil.copytree(DATA / "netns-40-ledger-205", run)
    (run / "trace-autorecovery-127.0.0.1_3181-1.jsonl").unlink()
    (v,) = check(run, 5.0, [205])
    assert v.verdict != "explained", v.render()
    assert "worker_acquires_ledger_lock(worker=127.0.0.1:3182" in v.render(), v.render()


def test_an_add_answered_ok_where_the_spec_s_bookie_is_fenced_is_a_violation(
    tmp_path: Path,
) -> None:
    """netns-61 ledger 269 (explained since refused adds need only one fence): the same
    trace with one of 3184's refusals of the writer's adds turned into an acknowledgement
    is a violation, found at that add."""
    run = tmp_path / "run"
    shutil.copytree(DATA / "netns-61-ledger-269", run)
    bookie = run / "trace-127.0.0.1_3184.jsonl"
    lines = [json.loads(x) for x in bookie.read_text().splitlines()]
    (add,) = [x for x in lines if x.get("rid") == 13129]  # entry 138, refused as fenced
    add["status"] = "OK"
    bookie.write_text("".join(json.dumps(x) + "\n" for x in lines))
    client = run / "trace-client.jsonl"
    lines = [json.loads(x) for x in client.read_text().splitlines()]
    (got,) = [x for x in lines if x.get("rid") == 13129 and x.get("bookie") == add["bookie"]]
    got["status"] = "OK"
    client.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (v,) = check(run, 20.0, [269])
    assert v.verdict == "violation", v.render()
    assert "bookie_handles_add" in v.event, v.render()
    assert "entry=138" in v.event, v.render()


def test_a_mark_whose_write_failed_on_the_connection_is_logged_and_explains_the_task(
    tmp_path: Path,
) -> None:
    """docker-27 ledger 78: the auditor at 3181 lost its ZooKeeper connection while it
    marked the ledgers of lost 3185; the mark of ledger 78 landed but its answer did not,
    so the auditor logged nothing, and a worker later took a task no line named (bkref's
    bug, fixed since: such a mark is logged with its outcome unknown). With the line the
    auditor writes now, the trace is explained."""
    (v,) = check(FINDINGS / "docker-27-ledger-78", 20.0, [78])
    assert v.verdict == "violation", v.render()
    assert v.reason == "a worker took the lock of a ledger no auditor marked: it has no task"
    run = tmp_path / "run"
    shutil.copytree(FINDINGS / "docker-27-ledger-78", run)
    auditor = run / "trace-autorecovery-127.0.0.1_3181-0.jsonl"
    lines = [json.loads(x) for x in auditor.read_text().splitlines()]
    i = next(k for k, x in enumerate(lines) if x["action"] == "auditor_loses_session")
    mark = {
        "node": lines[i]["node"],
        "t": lines[i]["t"] - 1,
        "action": "auditor_marks_ledgers_of_lost_bookies",
        "ledger": 78,
        "replicas": {"127.0.0.1:3185": "LOST"},
        "rewrite": True,
        "decided": 84404342249541,  # the audit's, as its other marks say
        "outcome": "unknown",
    }
    lines.insert(i, mark)
    auditor.write_text("".join(json.dumps(x | {"seq": n}) + "\n" for n, x in enumerate(lines)))
    (v,) = check(run, 20.0, [78])
    assert v.verdict == "explained", v.render()
