"""A worker's lock lost with its ZooKeeper session or its process (``autorecovery.
lock_losses``): the spec's ``worker_loses_lock``, which no node logs, placed where the
trace shows it, and what the worker did after it."""

from __future__ import annotations

from bkref.tracecheck.autorecovery import LOCK_LOST, lock_losses
from bkref.tracecheck.load import Line
from bkref.tracecheck.names import CAS, COPY, LOCK, RELEASE

A, B = "127.0.0.1:3181", "127.0.0.1:3182"


def _line(node: str, t: int, action: str, **args: object) -> Line:
    return Line(node, t, t, action, {"ledger": 7, **args})


def _lock(node: str, bookie: str, t: int) -> Line:
    return _line(node, t, LOCK, worker=bookie, bookie=bookie, version=0)


def _copy(node: str, bookie: str, t: int) -> Line:
    return _line(node, t, COPY, segment=0, lost="127.0.0.1:3185", bookie=bookie)


def _actions(lines: list[Line]) -> list[str]:
    return [x.action for x in lines]


def test_a_lock_taken_while_another_worker_works_follows_that_one_s_loss() -> None:
    a, b = f"autorecovery-{A}-0", f"autorecovery-{B}-0"
    mine = {
        a: [_lock(a, A, 10), _copy(a, A, 20), _line(a, 40, CAS, bookie=A, outcome="written")],
        b: [_lock(b, B, 30), _line(b, 50, RELEASE, worker=B, why="failed: delete")],
    }
    after, dropped = lock_losses(mine)
    assert _actions(mine[a]) == [LOCK, COPY, LOCK_LOST, CAS]
    loss = mine[a][2]
    assert 20 < loss.t < 30
    assert loss["worker"] == A
    assert after == [(mine[b][0], loss)]  # b's lock comes after a's loss
    assert dropped == []


def test_a_copy_after_the_loss_is_taken_out() -> None:
    a, b = f"autorecovery-{A}-0", f"autorecovery-{B}-0"
    late = _copy(a, A, 40)
    why = 'failed: RepairError("ledger 7: lost the ledger\'s lock (session expired?)")'
    mine = {
        a: [_lock(a, A, 10), late, _line(a, 50, RELEASE, worker=A, why=why)],
        b: [_lock(b, B, 30)],
    }
    _after, dropped = lock_losses(mine)
    assert _actions(mine[a]) == [LOCK, LOCK_LOST, RELEASE]
    assert dropped == [late]


def test_a_release_refused_for_want_of_the_lock_follows_its_loss() -> None:
    a = f"autorecovery-{A}-0"
    why = 'failed: RepairError("ledger 7: lost the ledger\'s lock (session expired?)")'
    mine = {a: [_lock(a, A, 10), _copy(a, A, 20), _line(a, 50, RELEASE, worker=A, why=why)]}
    after, dropped = lock_losses(mine)
    assert _actions(mine[a]) == [LOCK, COPY, LOCK_LOST, RELEASE]
    assert 20 < mine[a][2].t < 50
    assert (after, dropped) == ([], [])


def test_a_process_that_died_at_work_loses_its_lock_and_lets_the_ledger_go() -> None:
    dead, next_start = f"autorecovery-{A}-0", f"autorecovery-{A}-1"
    mine = {dead: [_lock(dead, A, 10)], next_start: [_lock(next_start, A, 30)]}
    after, _dropped = lock_losses(mine)
    assert _actions(mine[dead]) == [LOCK, LOCK_LOST, RELEASE]
    loss, release = mine[dead][1:]
    assert release["why"] == "its process died"
    assert after == [(mine[next_start][0], loss), (mine[next_start][0], release)]


def test_attempts_one_after_another_lose_nothing() -> None:
    a, b = f"autorecovery-{A}-0", f"autorecovery-{B}-0"
    mine = {
        a: [_lock(a, A, 10), _line(a, 20, RELEASE, worker=A, why="failed: copy")],
        b: [_lock(b, B, 30), _line(b, 40, "worker_deletes_task", worker=B, deleted=True)],
    }
    before = {n: list(v) for n, v in mine.items()}
    assert lock_losses(mine) == ([], [])
    assert mine == before
