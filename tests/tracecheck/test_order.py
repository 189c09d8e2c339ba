"""A bookie's steps are ordered only where they conflict: the needs ``project`` finds
through indexes are the pairwise conflicts, up to what an earlier need already orders."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkref.tracecheck import order
from bkref.tracecheck import project as projection
from bkref.tracecheck.load import CONNECTED, Line, read_dir
from bkref.tracecheck.order import FAULTS, conflict, refused
from bkref.tracecheck.project import Event, Run, Send, project
from tests.tracecheck.conftest import Recorded, Repaired


def _pairwise(taken: list[Event]) -> None:
    """Every earlier step a step conflicts with; and a refused add, the first fence since
    the last restart (any fence explains its refusal)."""
    for i, ev in enumerate(taken):
        ev.needs = [x for x in taken[:i] if conflict(x, ev)]
        if ev.kind == "handle" and ev.line.action == "bookie_handles_add" and refused(ev):
            after = [x for x in taken[:i] if x.kind in FAULTS]
            start = taken.index(after[-1]) + 1 if after else 0
            fences = [x for x in taken[start:i] if x.kind == "handle" and _fences(x)]
            ev.needs += fences[:1]


def _fences(ev: Event) -> bool:
    assert ev.request is not None
    action = ev.line.action
    return action == "bookie_handles_fencing_lac_read" or (
        action == "bookie_handles_recovery_read" and ev.request.fence
    )


def _implied(ev: Event, memo: dict[int, set[int]]) -> set[int]:
    """Every step that must come before ``ev`` by its needs, transitively."""
    if id(ev) not in memo:
        memo[id(ev)] = set()
        for n in ev.needs:
            memo[id(ev)] |= {id(n), *_implied(n, memo)}
    return memo[id(ev)]


def _assert_same(fast: list[Event], slow: list[Event]) -> int:
    """``fast``'s needs are among ``slow``'s (the same steps), and imply all of them."""
    twin = {id(b): a for a, b in zip(fast, slow, strict=True)}
    memo: dict[int, set[int]] = {}
    for a, b in zip(fast, slow, strict=True):
        pairwise = {id(twin[id(n)]) for n in b.needs}
        assert {id(n) for n in a.needs} <= pairwise, a.describe()
        assert pairwise <= _implied(a, memo), a.describe()
    return sum(1 for b in slow if b.needs)


def _step(n: int, action: str, entry: int = -1, *, fence: bool = False, sender: str = "") -> Event:
    line = Line("127.0.0.1:3181", n, n, action, {"bookie": "127.0.0.1:3181"})
    if action == "bookie_restarts":
        return Event("restart", line)
    send = Send(("c", "127.0.0.1:3181", n), "add", "127.0.0.1:3181", entry, -1, fence, sender)
    return Event("handle", line, request=send)


def test_a_restart_orders_what_came_before_it() -> None:
    """Steps after a restart need it, and through it everything before it."""

    def bookie() -> list[Event]:
        return [
            _step(0, "bookie_handles_add", 0, sender="writer"),
            _step(1, "bookie_handles_fencing_lac_read"),
            _step(2, "bookie_handles_add", 1, sender="writer"),
            _step(3, "bookie_restarts"),
            _step(4, "bookie_handles_add", 1, sender="writer"),
            _step(5, "bookie_handles_recovery_read", 1, fence=True, sender="rc"),
            _step(6, "bookie_handles_add", 2, sender="rc"),
            _step(7, "bookie_handles_recovery_read", 2, sender="rc"),
        ]

    fast, slow = bookie(), bookie()
    order.order_conflicts(fast)
    _pairwise(slow)
    assert _assert_same(fast, slow) == 7  # all but the first
    assert [n.line.seq for n in fast[4].needs] == [3]  # not the fencing read before it
    assert [n.line.seq for n in fast[7].needs] == [3, 6]


def _same_order(traces: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    run = Run(read_dir(traces))
    compared = 0
    for ledger in run.ledgers():
        fast = project(run, ledger)
        with monkeypatch.context() as m:
            m.setattr(projection, "order_conflicts", _pairwise)
            slow = project(run, ledger)
        assert fast.unknown == slow.unknown
        compared += _assert_same(
            [a for lane in fast.lanes for a in lane], [b for lane in slow.lanes for b in lane]
        )
    return compared


@pytest.mark.zookeeper
def test_recorded_runs_keep_every_pairwise_conflict(
    recorded: Recorded, repaired: Repaired, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fences, recovery reads, restarts (recorded) and AutoRecovery's copies (repaired)."""
    assert _same_order(recorded.traces, monkeypatch) > 20
    assert _same_order(repaired.traces, monkeypatch) > 20


def test_an_auditor_s_mark_is_tried_where_its_audit_was_decided() -> None:
    """An audit reads the registrations (``decided``), then each ledger, then writes its
    marks: a client's ensemble change between the read and the mark can have replaced the
    bookie the mark names, and the spec's audit names it only before that change. The
    search tries the mark first at ``decided`` (netns soak seed 15, ledger 197: tried at
    its line, the search backtracked over every event in between until its budget ran
    out)."""
    from bkref.tracecheck.search import HEARD, LOST, _when

    change = Event("step", Line("client", 7, 2_000, "writer_changes_ensemble", {}))
    mark = Event(
        "step",
        Line(
            "autorecovery-0",
            3,
            3_000,
            "auditor_marks_ledgers_of_lost_bookies",
            {"replicas": {"127.0.0.1:3181": "LOST"}, "rewrite": True, "decided": 1_000},
        ),
    )
    undecided = Event(
        "step", Line("autorecovery-0", 4, 4_000, "auditor_marks_ledgers_of_lost_bookies", {})
    )
    moves = [(undecided, LOST), (change, LOST), (mark, LOST)]
    assert [ev for ev, _how in sorted(moves, key=_when)] == [mark, change, undecided]
    # A bookie's step heard at the client's receipt is still tried at the receipt.
    handle = _step(5, "bookie_handles_add", 0, sender="writer")
    handle.receipt = Event("receipt", Line("client", 8, 2_500, "writer_receives_add_response", {}))
    assert _when((handle, HEARD)) == (2_500, 0)


def test_a_refused_add_needs_one_fence_and_nothing_needs_it() -> None:
    """A writer's add refused as fenced stores nothing: it needs the first fence before it
    (any fence explains the refusal), not every fencing read since, and a later fencing
    LAC read does not wait for it (netns-61 ledger 269: waiting made a cycle)."""
    steps = [
        _step(0, "bookie_handles_fencing_lac_read"),
        _step(1, "bookie_handles_recovery_read", 5, fence=True, sender="rc"),
        _step(2, "bookie_handles_add", 6, sender="writer"),
        _step(3, "bookie_handles_fencing_lac_read"),
        _step(4, "bookie_handles_add", 5, sender="rc"),
    ]
    steps[2].line.args["status"] = "FENCED"
    order.order_conflicts(steps)
    assert [n.line.seq for n in steps[2].needs] == [0]
    assert steps[3].needs == []
    # A recovery's add of entry 5 is taken: after the LAC reads and the read of its entry.
    assert [n.line.seq for n in steps[4].needs] == [0, 1, 3]


def test_a_bookie_step_is_matched_to_any_node_that_opened_its_peer_address() -> None:
    """Two nodes in their own network namespaces can both open 127.0.0.1:P to a bookie
    (netns-75 ledger 14): the last opener is tried first, then the others."""
    nodes = {
        "w1": [Line("w1", 0, 10, CONNECTED, {"bookie": "b", "local": "127.0.0.1:7"})],
        "w2": [Line("w2", 0, 20, CONNECTED, {"bookie": "b", "local": "127.0.0.1:7"})],
    }
    peers = projection._Peers(nodes)
    assert peers.nodes("b", "127.0.0.1:7", 30) == ["w2"]
    assert peers.nodes("b", "127.0.0.1:7", 30, every=True) == ["w2", "w1"]
    assert peers.nodes("b", "127.0.0.1:7", 15, every=True) == ["w1", "w2"]
    assert peers.nodes("b", "10.0.0.9:7", 5) == ["w1"]  # behind NAT: by port, the first
