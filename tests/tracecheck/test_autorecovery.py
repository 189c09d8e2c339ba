"""The trace checker on runs AutoRecovery repaired: its auditor's marks and its workers'
locks, copies and metadata writes replayed through the spec, and the same runs with
one AutoRecovery step changed."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bkref.tracecheck.cli import check
from bkref.tracecheck.load import read_dir
from bkref.tracecheck.names import MARKS
from bkref.tracecheck.project import Event, Run, project
from bkref.tracecheck.search import Verdict
from tests.tracecheck.conftest import Repaired

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

Lines = list[dict[str, Any]]


def _verdict(traces: Path, ledger: int, budget: float = 60.0) -> Verdict:
    (v,) = check(traces, budget, [ledger])
    return v


def _changed(repaired: Repaired, tmp_path: Path, change: Callable[[Lines], Lines]) -> Path:
    """A copy of the run's traces where ``change(lines)`` rewrote each AutoRecovery node's
    lines (it returns them, changed or not). A line it added goes where its time puts it
    among the node's own, as the node would have written it: appended, it would follow
    whatever the node logged later (the cluster's teardown can end the auditor's session
    and mark again: a mark after that is one no auditor could write)."""
    out = tmp_path / "traces"
    shutil.copytree(repaired.traces, out)
    for f in out.glob("trace-autorecovery-*.jsonl"):
        lines: Lines = [json.loads(x) for x in f.read_text().splitlines()]
        lines = _in_time(lines, change(lines))
        for i, x in enumerate(lines):
            x["seq"] = i
        f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out


def _in_time(before: Lines, after: Lines) -> Lines:
    """``after`` with the lines that are not ``before``'s moved among the others by time."""
    mine = {id(x) for x in before}
    added = sorted((x for x in after if id(x) not in mine), key=lambda x: int(x["t"]))
    out: Lines = []
    for x in (x for x in after if id(x) in mine):
        while added and int(added[0]["t"]) < int(x["t"]):
            out.append(added.pop(0))
        out.append(x)
    return out + added


def _autorecovery_lines(repaired: Repaired) -> Lines:
    """Every AutoRecovery node's trace lines of the recorded run."""
    return [
        json.loads(x)
        for f in sorted(repaired.traces.glob("trace-autorecovery-*.jsonl"))
        for x in f.read_text().splitlines()
    ]


def _created(repaired: Repaired) -> dict[str, Any]:
    """The writer's line that created the closed ledger."""
    lines = (repaired.traces / "trace-writer.jsonl").read_text().splitlines()
    return next(
        x
        for x in map(json.loads, lines)
        if x["action"] == "writer_creates_ledger" and x["ledger"] == repaired.closed
    )


def _finds_nothing(node: str, ledger: int, worker: str, t: int) -> Lines:
    """A worker (on its own bookie) takes a new task of ``ledger`` at ``t`` and finds
    nothing to do: it verifies the ledger and deletes the task."""
    x = {"node": node, "ledger": ledger, "worker": worker}
    return [
        {**x, "t": t, "action": "worker_acquires_ledger_lock", "version": 0, "bookie": worker},
        {**x, "t": t + 1, "action": "worker_verifies_ledger_replicated"},
        {**x, "t": t + 2, "action": "worker_deletes_task", "version": 0, "deleted": True},
    ]


def _registers(traces: Path, bookie: str, t: int) -> None:
    """Add to ``bookie``'s trace in ``traces`` a registration in ZooKeeper at ``t``."""
    f = traces / f"trace-{bookie.replace(':', '_')}.jsonl"
    lines: Lines = [json.loads(x) for x in f.read_text().splitlines()]
    again = {"node": bookie, "t": t, "action": "registered", "bookie": bookie}
    lines = sorted([*lines, again], key=lambda x: int(x["t"]))
    for i, x in enumerate(lines):
        x["seq"] = i
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_closed_ledger_repaired_after_its_bookie_crashed_is_explained(
    repaired: Repaired,
) -> None:
    v = _verdict(repaired.traces, repaired.closed)
    assert v.verdict == "explained", v.render()
    assert v.replayed == v.steps


def test_an_open_ledger_recovered_and_repaired_by_a_worker_is_explained(
    repaired: Repaired,
) -> None:
    v = _verdict(repaired.traces, repaired.open)
    assert v.verdict == "explained", v.render()


def test_a_copy_of_other_entries_than_the_lost_bookie_held_is_a_violation(
    repaired: Repaired, tmp_path: Path
) -> None:
    def change(lines: Lines) -> Lines:
        for x in lines:
            if x["action"] == "worker_copies_fragment" and x.get("ledger") == repaired.closed:
                x["entries"] = x["entries"][1:]
        return lines

    v = _verdict(_changed(repaired, tmp_path, change), repaired.closed)
    assert v.verdict == "violation", v.render()
    assert "worker_copies_fragment" in v.event
    assert "the spec's worker copies" in v.reason  # what it copied, not that it did


def test_a_worker_that_repairs_a_ledger_no_auditor_marked_is_a_violation(
    repaired: Repaired, tmp_path: Path
) -> None:
    def change(lines: Lines) -> Lines:
        return [
            x
            for x in lines
            if not (x["action"].startswith("auditor_") and x.get("ledger") == repaired.closed)
        ]

    v = _verdict(_changed(repaired, tmp_path, change), repaired.closed)
    assert v.verdict == "violation", v.render()
    assert "worker_acquires_ledger_lock" in v.event


def test_a_metadata_write_that_replaces_another_bookie_is_a_violation(
    repaired: Repaired, tmp_path: Path
) -> None:
    def change(lines: Lines) -> Lines:
        for x in lines:
            if (
                x["action"] == "worker_updates_segment_ensemble"
                and x.get("ledger") == repaired.closed
            ):
                x["lost"] = x["bookie"]  # claims it replaced itself: the lost one stays
        return lines

    v = _verdict(_changed(repaired, tmp_path, change), repaired.closed)
    assert v.verdict == "violation", v.render()
    assert "worker_updates_segment_ensemble" in v.event


def test_a_metadata_write_without_its_copy_is_a_violation(
    repaired: Repaired, tmp_path: Path
) -> None:
    """The planted bug repair-without-copy: the worker records the new replica without
    copying the fragment to it. The copy is the worker's own step, so no order of the
    other nodes' steps can stand in for it: a violation, not the unknown of a worker
    that decided on an earlier view."""

    unsent: set[tuple[str, int]] = set()  # (the worker's address, request id) of its adds

    def change(lines: Lines) -> Lines:
        local = {x["bookie"]: x["local"] for x in lines if x["action"] == "connected"}
        kept = []
        for x in lines:
            if x["action"] == "worker_copies_fragment" and x.get("ledger") == repaired.closed:
                unsent.update((local[a["bookie"]], a["rid"]) for a in x["sends"])
            else:
                kept.append(x)
        return kept

    traces = _changed(repaired, tmp_path, change)
    assert unsent
    for f in traces.glob("trace-127.*.jsonl"):  # the target took no adds: none was sent
        lines = [json.loads(x) for x in f.read_text().splitlines()]
        kept = [x for x in lines if (x.get("peer"), x.get("rid")) not in unsent]
        for i, x in enumerate(kept):
            x["seq"] = i
        f.write_text("".join(json.dumps(x) + "\n" for x in kept))
    v = _verdict(traces, repaired.closed)
    assert v.verdict == "violation", v.render()
    assert "worker_updates_segment_ensemble" in v.event
    assert "without copying that fragment first" in v.reason


def test_a_bookie_cut_off_from_zookeeper_while_it_ran_is_explained(
    repaired: Repaired, tmp_path: Path
) -> None:
    """Marked lost, it served the writer's adds on and registered again without a restart:
    its session expired while it ran (a pause, a partition from ZooKeeper), the spec's
    ``bookie_loses_session`` and ``bookie_registers_again``. With no registration after
    the mark, the worker found replicated a ledger whose bookie the spec still has
    unregistered: never a violation; unknown (a worker's view), unless the recorded run
    lost that bookie itself (its fixture under load)."""
    create = _created(repaired)
    # A bookie that took the writer's adds after the mark below; one the recorded run never
    # marked lost, if there is one (under load a bookie's session may expire for real).
    marked = {
        b
        for f in repaired.traces.glob("trace-autorecovery-*.jsonl")
        for x in map(json.loads, f.read_text().splitlines())
        if x["action"] in MARKS and x.get("ledger") == repaired.closed
        for b, why in x["replicas"].items()
        if why == "LOST"
    }
    alive = next((b for b in create["ensemble"][1:] if b not in marked), create["ensemble"][1])

    def early_mark(lines: Lines) -> Lines:
        if not any(x["action"] == "node_wins_auditor_election" for x in lines):
            return lines
        mark = {
            "node": lines[0]["node"],
            "t": create["t"] + 1,
            "action": "auditor_marks_ledgers_of_lost_bookies",
            "ledger": repaired.closed,
            "replicas": {alive: "LOST"},
            "rewrite": True,
        }
        return [mark, *lines]

    cut_off = _changed(repaired, tmp_path, early_mark)
    _registers(cut_off, alive, create["t"] + 2)
    v = _verdict(cut_off, repaired.closed)
    assert v.verdict == "explained", v.render()

    v = _verdict(_changed(repaired, tmp_path / "never-back", early_mark), repaired.closed)
    assert v.verdict != "violation", v.render()
    if alive not in marked:  # else the run's own loss and repair of it may explain it
        assert v.verdict == "unknown", v.render()
        assert "worker_verifies_ledger_replicated" in v.reason


def test_a_dedicated_worker_is_unknown(repaired: Repaired, tmp_path: Path) -> None:
    """A worker with no bookie of its own copies elsewhere; the spec's copies to its own."""

    def change(lines: Lines) -> Lines:
        for x in lines:
            if x["action"] == "worker_acquires_ledger_lock":
                x["bookie"] = None
        return lines

    v = _verdict(_changed(repaired, tmp_path, change), repaired.closed)
    assert v.verdict == "unknown", v.render()
    assert "dedicated worker" in v.reason


def test_a_bookie_back_before_its_mark_was_written_is_marked_lost_all_the_same(
    repaired: Repaired, tmp_path: Path
) -> None:
    """An audit decides which bookies are lost when it reads the registrations, and writes
    its marks after reading every ledger (seconds, with many): a bookie that registered
    again in between is marked lost all the same. A restarted bookie's registration
    (``decided`` < t < the mark's t) is not tied to either side of the mark: the spec's
    restart may come after the audit (a campaign had two ledgers unknown while it could
    not), or before it, the audit having read the registrations before
    (``auditor_marks_from_earlier_view``; netns-45 ledger 416 of a soak needed that
    order). Without the stamp, the audit read them after: the registration came before
    any mark and is dropped."""
    lost = [
        json.loads(x)
        for x in (repaired.traces / f"trace-{repaired.lost.replace(':', '_')}.jsonl")
        .read_text()
        .splitlines()
    ]
    back = max(x["t"] for x in lost if x["action"] == "registered")

    def late_mark(stamped: bool) -> Callable[[Lines], Lines]:
        def change(lines: Lines) -> Lines:
            for x in lines:
                if x["action"] in MARKS and x.get("ledger") == repaired.closed:
                    x["t"], x["decided"] = back + 1, back - 1
                    if not stamped:
                        del x["decided"]
            return lines

        return change

    def registration(traces: Path) -> tuple[Event | None, set[str]]:
        lt = project(Run(read_dir(traces)), repaired.closed)
        came_back = {b for bs in lt.came_back.values() for b in bs}
        return next(
            (e for lane in lt.lanes for e in lane if e.kind == "register" and e.t == back),
            None,
        ), came_back

    stamped = _changed(repaired, tmp_path / "stamped", late_mark(True))
    reg, came_back = registration(stamped)
    assert reg is not None
    assert reg.marked_after
    assert not [n for n in reg.needs if n.line.action in MARKS]
    assert came_back == {repaired.lost}
    v = _verdict(stamped, repaired.closed)
    assert v.verdict == "explained", v.render()
    unstamped = _changed(repaired, tmp_path / "unstamped", late_mark(False))
    assert registration(unstamped) == (None, set())


def test_a_mark_read_before_a_registration_after_a_worker_found_it_whole_is_explained(
    repaired: Repaired, tmp_path: Path
) -> None:
    """A bookie cut off from ZooKeeper is marked lost; it registers again; a worker takes
    the ledger's task, finds the bookie whole and deletes the task; then a mark decided
    before the registration lands, naming it lost again (a netns campaign had 21 such
    ledgers). Only an audit that read the registrations before the bookie came back
    explains both the worker's view and the mark: ``auditor_marks_from_earlier_view``."""
    create = _created(repaired)
    lines = _autorecovery_lines(repaired)
    mine = [x for x in lines if x.get("ledger") == repaired.closed]
    # The worker that deleted the task, and its lock before the delete: a slow run may have
    # other workers (and later audits) take the ledger too, and the lines are by node.
    done = min(
        (x for x in mine if x["action"] == "worker_deletes_task" and x["deleted"]),
        key=lambda x: int(x["t"]),
    )
    lock = max(
        (
            x
            for x in mine
            if x["action"] == "worker_acquires_ledger_lock"
            and x["node"] == done["node"]
            and int(x["t"]) < int(done["t"])
        ),
        key=lambda x: int(x["t"]),
    )
    alive = next(b for b in create["ensemble"] if b != repaired.lost)

    def marks(lines: Lines) -> Lines:
        node = lines[0]["node"] if lines else ""
        if node == lock["node"]:  # the worker takes the new task and finds nothing to do
            return [*lines, *_finds_nothing(node, repaired.closed, lock["worker"], done["t"] + 2)]
        if not any(x["action"] == "node_wins_auditor_election" for x in lines):
            return lines
        mark = {
            "node": lines[0]["node"],
            "action": "auditor_marks_ledgers_of_lost_bookies",
            "ledger": repaired.closed,
            "replicas": {alive: "LOST"},
            "rewrite": True,
        }
        first = {**mark, "t": create["t"] + 1}
        late = {**mark, "t": done["t"] + 1, "decided": lock["t"] - 2}
        return sorted([first, *lines, late], key=lambda x: int(x["t"]))

    traces = _changed(repaired, tmp_path, marks)
    _registers(traces, alive, lock["t"] - 1)
    lt = project(Run(read_dir(traces)), repaired.closed)
    registers = [e for lane in lt.lanes for e in lane if e.kind == "register"]
    # The one added above (a slow run may have the bookie register on its own as well).
    planted = [e for e in registers if e.line["bookie"] == alive and e.t == lock["t"] - 1]
    assert len(planted) == 1, [e.describe() for e in registers]
    reg = planted[0]
    assert reg.marked_after  # its session expired while it ran: either order
    assert not [n for n in reg.needs if n.line.action in MARKS]
    assert {b for bs in lt.came_back.values() for b in bs} == {alive}
    v = _verdict(traces, repaired.closed)
    assert v.verdict == "explained", v.render()


def test_a_bookie_s_crash_is_a_step_of_its_own_before_its_restart(repaired: Repaired) -> None:
    """No node logs a crash. It is a step between the bookie's last logged line and its
    restart, so that a worker may copy the fragments of a bookie that is down and not
    yet marked lost (BookKeeper's worker checks every bookie of the ledger): a campaign
    had two such ledgers unknown while the crash was taken only at the restart."""
    lt = project(Run(read_dir(repaired.traces)), repaired.closed)
    events = [e for lane in lt.lanes for e in lane]
    restarts = [e for e in events if e.kind == "restart" and e.line["bookie"] == repaired.lost]
    assert restarts
    for r in restarts:
        (crash,) = [n for n in r.needs if n.kind == "crash"]
        assert crash.line["bookie"] == repaired.lost
        assert crash.t < r.t
        # After every step the bookie took of this ledger before its restart.
        before = [
            e
            for e in events
            if e.kind == "handle" and e.line.node == r.line.node and e.line.seq < r.line.seq
        ]
        assert before
        assert all(e.t < crash.t for e in before)
        # Ordered after them: they are its needs (since the restart before, if any).
        since = max((x.line.seq for x in restarts if x.line.seq < r.line.seq), default=-1)
        assert {id(e) for e in before if e.line.seq > since} <= {id(n) for n in crash.needs}


def test_a_mark_from_a_scan_older_than_the_worker_s_swap_is_explained(
    repaired: Repaired, tmp_path: Path
) -> None:
    """An audit reads the registrations, every ledger, then marks: one that read the closed
    ledger before the worker swapped the lost bookie out marks that bookie after the
    swap, in a ledger that no longer names it, and a worker takes the new task and finds
    nothing to do (a Docker campaign had six such ledgers). The spec's
    ``auditor_marks_from_earlier_scan`` names the bookie a swap replaced."""
    lines = _autorecovery_lines(repaired)
    swap = next(
        x
        for x in lines
        if x["action"] == "worker_updates_segment_ensemble" and x["ledger"] == repaired.closed
    )
    # The repair's end: the task's delete after the swap. Not the ledger's last line: the
    # cluster's teardown can end the auditor's session, and the next auditor marks the
    # ledger again with the bookies stopping around it (a loaded verify run did), after
    # the lost bookie is back.
    after = next(
        x["t"]
        for x in lines
        if x["action"] == "worker_deletes_task"
        and x["ledger"] == repaired.closed
        and x["t"] > swap["t"]
    )

    worker = swap["bookie"]

    def stale_mark(who: str) -> Callable[[Lines], Lines]:
        def change(lines: Lines) -> Lines:
            node = lines[0]["node"] if lines else ""
            if node == swap["node"]:  # the worker takes the new task and finds nothing to do
                return [*lines, *_finds_nothing(node, repaired.closed, worker, after + 2)]
            if not any(x["action"] == "node_wins_auditor_election" for x in lines):
                return lines
            mark = {
                "node": node,
                "t": after + 1,
                "action": "auditor_marks_ledgers_of_lost_bookies",
                "ledger": repaired.closed,
                "replicas": {who: "LOST"},
                "rewrite": True,
                "decided": swap["t"] - 1,
            }
            return [*lines, mark]

        return change

    traces = _changed(repaired, tmp_path, stale_mark(repaired.lost))
    v = _verdict(traces, repaired.closed)
    assert v.verdict == "explained", v.render()


def test_a_worker_killed_in_its_copy_left_adds_like_a_failed_copy_s(
    repaired: Repaired, tmp_path: Path
) -> None:
    """SIGKILLed while copying, a worker never logs the copy (its line names the adds at
    the end): its target answered adds no logged step sent. They are a failed copy's,
    which the target may keep (a campaign's kill had one: 'a client that left no trace',
    then a restart that 'came back with LAC 148', crying wolf before the target counted
    as copied to).

    The kill falls in the node's last copy of the ledger: an earlier one may have failed
    (a loaded CI run's did) and its retry opened a new connection to the target, whose
    ``connected`` line a kill in the retry leaves in the trace. Cut at the first copy,
    that line went too, and the retry's adds came from a connection no one opened."""

    def killed_in_copy(lines: Lines) -> Lines:
        copies = [
            i
            for i, x in enumerate(lines)
            if x["action"] == "worker_copies_fragment" and x["ledger"] == repaired.closed
        ]
        return lines[: copies[-1]] if copies else lines

    v = _verdict(_changed(repaired, tmp_path, killed_in_copy), repaired.closed)
    assert v.verdict != "violation", v.render()
    assert "left no trace" not in v.reason, v.render()


def _lock_taken_beside(repaired: Repaired, tmp_path: Path, before: str) -> Path:
    """The run's traces where a second worker took the closed ledger's lock while the first
    worked on it, just before the first one's ``before`` step (ZooKeeper had dropped the
    first one's lock with its session), verified the ledger once the first one's swap
    had landed, and let it go (its delete failed)."""
    mine = _autorecovery_lines(repaired)
    steps = [x for x in mine if x.get("ledger") == repaired.closed]
    cas = next(x for x in steps if x["action"] == "worker_updates_segment_ensemble")
    mine_ = [x for x in steps if x["node"] == cas["node"] and x["t"] <= cas["t"]]
    lock = [x for x in mine_ if x["action"] == "worker_acquires_ledger_lock"][-1]
    at = next(x["t"] for x in mine_ if x["t"] > lock["t"] and x["action"] == before) - 1
    # A node whose own attempts at the ledger (deferred ones) all ended before that lock.
    other = next(
        n
        for n in sorted({x["node"] for x in mine} - {cas["node"]})
        if all(x["t"] < lock["t"] for x in steps if x["node"] == n)
    )
    own = other.removeprefix("autorecovery-").rsplit("-", 1)[0]
    x = {"node": other, "ledger": repaired.closed, "worker": own}
    beside = [
        {**x, "t": at, "action": "worker_acquires_ledger_lock", "bookie": own, "version": 0},
        {**x, "t": cas["t"] + 1, "action": "worker_verifies_ledger_replicated"},
        {**x, "t": cas["t"] + 2, "action": "worker_releases_lock", "why": "failed: delete"},
    ]

    def change(lines: Lines) -> Lines:
        if not lines or lines[0]["node"] != other:
            return lines
        return sorted(lines + beside, key=lambda y: int(y["t"]))

    return _changed(repaired, tmp_path, change)


def test_a_worker_that_lost_its_lock_may_still_write_the_swap_it_had_copied(
    repaired: Repaired, tmp_path: Path
) -> None:
    """A worker whose lock ZooKeeper dropped after its copy (its session expired) while
    another took the ledger: its lock check had passed, and its swap lands beside the
    other's attempt (the spec's ``worker_loses_lock``, placed before the other's lock)."""
    traces = _lock_taken_beside(repaired, tmp_path, "worker_updates_segment_ensemble")
    v = _verdict(traces, repaired.closed)
    assert v.verdict == "explained", v.render()
    lt = project(Run(read_dir(traces)), repaired.closed)
    events = [e for lane in lt.lanes for e in lane]
    (loss,) = [e for e in events if e.line.action == "worker_loses_lock"]
    (lock,) = [e for e in events if loss in e.needs]
    assert lock.line.action == "worker_acquires_ledger_lock"
    assert lock.line.node != loss.line.node
    assert [e.line.action for e in lt.lanes[loss.lane][loss.pos + 1 :]][:1] == [
        "worker_updates_segment_ensemble"
    ]


def test_a_swap_whose_copy_came_after_the_lock_was_lost_is_a_violation(
    repaired: Repaired, tmp_path: Path
) -> None:
    """bkref's worker asks whether it still owns the lock before each metadata write: a
    copy made after another worker took the lock never becomes a swap."""
    traces = _lock_taken_beside(repaired, tmp_path, "worker_copies_fragment")
    v = _verdict(traces, repaired.closed)
    assert v.verdict == "violation", v.render()
    assert "without copying that fragment first" in v.reason, v.render()
