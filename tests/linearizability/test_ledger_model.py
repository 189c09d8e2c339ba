"""bkref.spec.ledger_model, one rule at a time."""

from __future__ import annotations

from bkref.spec.ledger_model import LedgerOp, LedgerState, initial_state, step


def _run(*ops: LedgerOp, created: bool = True) -> LedgerState | None:
    state = initial_state(created)
    for op in ops:
        after = step(state, op)
        if not after:
            return None
        assert len(after) == 1
        (state,) = after
    return state


def test_adds_take_the_next_entry_id_only() -> None:
    s = _run(LedgerOp("add", 0, "a"), LedgerOp("add", 1, "b"))
    assert s is not None
    assert s.entries == ("a", "b")
    assert _run(LedgerOp("add", 1, "b")) is None  # a hole
    assert _run(LedgerOp("add", 0, "a"), LedgerOp("add", 0, "a")) is None  # a duplicate


def test_reads_see_exactly_the_added_entries() -> None:
    add = LedgerOp("add", 0, "a")
    assert _run(add, LedgerOp("read", 0, "a", True)) is not None
    assert _run(add, LedgerOp("read", 0, "b", True)) is None  # divergent
    assert _run(LedgerOp("read", 0, found=False)) is not None
    assert _run(add, LedgerOp("read", 0, found=False)) is None  # stale
    assert _run(LedgerOp("read", 0, "a", True)) is None  # future


def test_lac_is_a_lower_bound_that_may_go_back_and_lag_a_close() -> None:
    adds = (LedgerOp("add", 0, "a"), LedgerOp("add", 1, "b"))
    assert _run(LedgerOp("read_lac", result=-1)) is not None
    assert _run(*adds, LedgerOp("read_lac", result=0)) is not None  # lagging is fine
    assert _run(*adds, LedgerOp("read_lac", result=1), LedgerOp("read_lac", result=0)) is not None
    assert _run(*adds, LedgerOp("read_lac", result=0), LedgerOp("close", result=1)) is not None
    closed = (*adds, LedgerOp("close", result=1))
    assert _run(*closed, LedgerOp("read_lac", result=1)) is not None
    assert _run(*closed, LedgerOp("read_lac", result=0)) is not None  # stale after close
    assert _run(*closed, LedgerOp("read_lac", result=-1)) is not None
    s = _run(*closed, LedgerOp("read_lac", result=0))
    assert s == _run(*closed)  # a LAC read changes nothing
    assert "lac" not in LedgerState._fields


def test_lac_never_exceeds_the_added_entries_open_or_closed() -> None:
    adds = (LedgerOp("add", 0, "a"), LedgerOp("add", 1, "b"))
    assert _run(*adds, LedgerOp("read_lac", result=2)) is None  # beyond the entries
    assert _run(LedgerOp("read_lac", result=0)) is None  # before any add
    assert _run(*adds, LedgerOp("read_lac", result=-2)) is None
    closed = (*adds, LedgerOp("close", result=1))
    assert _run(*closed, LedgerOp("read_lac", result=2)) is None  # above the closed last entry
    unknown = step(initial_state()._replace(entries=("a", "b")), LedgerOp("read_lac", known=False))
    assert unknown == frozenset({initial_state()._replace(entries=("a", "b"))})


def test_close_and_recovery_fix_the_last_entry_and_fence_adds() -> None:
    add = LedgerOp("add", 0, "a")
    assert _run(add, LedgerOp("recover", result=0)) is not None
    assert _run(add, LedgerOp("recover", result=-1)) is None  # lost write
    assert _run(add, LedgerOp("recover", result=0), LedgerOp("add", 1, "b")) is None  # fenced
    assert _run(add, LedgerOp("close", result=0), LedgerOp("recover", result=0)) is not None
    assert _run(add, LedgerOp("close", result=0), LedgerOp("recover", result=1)) is None


def test_create_comes_first_and_once() -> None:
    assert _run(LedgerOp("add", 0, "a"), created=False) is None
    assert _run(LedgerOp("create"), LedgerOp("add", 0, "a"), created=False) is not None
    assert _run(LedgerOp("create"), LedgerOp("create"), created=False) is None
