"""The generic checker on small hand-made histories whose verdict is obvious."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bkref.linearizability import wgl
from bkref.linearizability.history import JSON, Op, Operation, OpType, pair
from bkref.linearizability.models import CAS_REGISTER, KV, REGISTER


def _ops(*events: tuple[int, OpType, str, JSON]) -> list[Operation]:
    """(process, type, f, value) in real-time order; one register (ledger None)."""
    return pair(Op(i, i, p, t, f, None, v) for i, (p, t, f, v) in enumerate(events))


def test_sequential_write_then_read_is_valid() -> None:
    h = _ops(
        (0, "invoke", "write", 1),
        (0, "ok", "write", 1),
        (1, "invoke", "read", None),
        (1, "ok", "read", 1),
    )
    assert wgl.check(REGISTER, h).verdict == "valid"


def test_stale_read_after_write_is_invalid_and_names_the_read() -> None:
    h = _ops(
        (0, "invoke", "write", 1),
        (0, "ok", "write", 1),
        (1, "invoke", "read", None),
        (1, "ok", "read", None),
    )
    r = wgl.check(REGISTER, h)
    assert r.verdict == "invalid"
    (part,) = r.partitions
    assert part.blocked is not None
    assert part.calls[part.blocked].call == 2  # the read
    assert part.window == (2, 3)


def test_concurrent_ops_may_take_effect_in_either_order() -> None:
    h = _ops(
        (0, "invoke", "write", 1),
        (1, "invoke", "read", None),
        (1, "ok", "read", None),
        (2, "invoke", "read", None),
        (2, "ok", "read", 1),
        (0, "ok", "write", 1),
    )
    assert wgl.check(REGISTER, h).verdict == "valid"


def test_an_info_write_may_take_effect_late_or_never() -> None:
    late = _ops(
        (0, "invoke", "write", 1),
        (0, "info", "write", 1),
        (1, "invoke", "read", None),
        (1, "ok", "read", None),
        (2, "invoke", "read", None),
        (2, "ok", "read", 1),
    )
    assert wgl.check(REGISTER, late).verdict == "valid"
    never = _ops((0, "invoke", "write", 1), (1, "invoke", "read", None), (1, "ok", "read", None))
    assert wgl.check(REGISTER, never).verdict == "valid"
    # but it cannot take effect before it was invoked
    early = _ops((1, "invoke", "read", None), (1, "ok", "read", 1), (0, "invoke", "write", 1))
    assert wgl.check(REGISTER, early).verdict == "invalid"


def test_failed_cas_did_not_happen() -> None:
    h = _ops(
        (0, "invoke", "cas", [None, 2]),
        (0, "fail", "cas", [None, 2]),
        (1, "invoke", "read", None),
        (1, "ok", "read", None),
    )
    assert wgl.check(CAS_REGISTER, h).verdict == "valid"
    ok = _ops(
        (0, "invoke", "cas", [None, 2]),
        (0, "ok", "cas", [None, 2]),
        (1, "invoke", "read", None),
        (1, "ok", "read", None),
    )
    assert wgl.check(CAS_REGISTER, ok).verdict == "invalid"


def test_keys_are_checked_apart_and_the_bad_one_is_named() -> None:
    def kv(p: int, t: OpType, f: str, key: str, value: JSON) -> tuple[int, OpType, str, JSON]:
        return (p, t, f, {"key": key, "value": value})

    h = _ops(
        kv(0, "invoke", "append", "a", "x"),
        kv(0, "ok", "append", "a", "x"),
        kv(1, "invoke", "append", "b", "y"),
        kv(1, "ok", "append", "b", "y"),
        kv(2, "invoke", "get", "a", None),
        kv(2, "ok", "get", "a", "x"),
        kv(3, "invoke", "get", "b", None),
        kv(3, "ok", "get", "b", "yy"),
    )
    r = wgl.check(KV, h, exhaustive=True)
    assert r.verdict == "invalid"
    assert {p.key: p.verdict for p in r.partitions} == {"a": "valid", "b": "invalid"}


def test_the_budget_turns_a_long_search_into_unknown() -> None:
    # Many concurrent writes and a final impossible read: the search must try
    # every order of the writes before it can say invalid.
    n = 18
    events: list[tuple[int, OpType, str, JSON]] = [(p, "invoke", "write", p) for p in range(n)]
    events += [(p, "ok", "write", p) for p in range(n)]
    events += [(n, "invoke", "read", None), (n, "ok", "read", -1)]
    r = wgl.check(REGISTER, _ops(*events), budget=0.2)
    assert r.verdict == "unknown"
    assert r.partitions[0].note == "out of time"


def test_search_alone_reports_a_linearization() -> None:
    h = _ops(
        (0, "invoke", "write", 1),
        (1, "invoke", "write", 2),
        (0, "ok", "write", 1),
        (1, "ok", "write", 2),
        (2, "invoke", "read", None),
        (2, "ok", "read", 1),
    )
    parts = wgl.partition(REGISTER, h)
    result = wgl.search(REGISTER, parts[None])
    assert result.verdict == "valid"
    order = [result.calls[i].input for i in result.linearization]
    assert order[-2:] == [("write", 1, None), ("read", None, 1)]
    assert all(c.ret != math.inf for c in result.calls)


def test_keys_still_open_after_a_while_go_to_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two registers, each with concurrent writes and then a read: of the value
    # the search tries last (register 0), or of none written (register 1).
    # Thousands of search steps each, so both are still open after one round.
    n = 9
    ops: list[Op] = []
    for reg, seen in ((0, 0), (1, -1)):
        base = len(ops)
        ops += [Op(base + p, 0, p, "invoke", "write", reg, p) for p in range(n)]
        ops += [Op(base + n + p, 0, p, "ok", "write", reg, p) for p in range(n)]
        ops += [
            Op(base + 2 * n, 0, n, "invoke", "read", reg, None),
            Op(base + 2 * n + 1, 0, n, "ok", "read", reg, seen),
        ]
    handed: list[int] = []
    in_workers = wgl._in_workers

    def spy(name: str, parts: Any, *args: Any) -> list[wgl.PartitionResult]:
        handed.append(len(parts))
        return in_workers(name, parts, *args)

    monkeypatch.setattr(wgl, "_in_workers", spy)
    monkeypatch.setattr(wgl, "PARALLEL_AFTER", 0.0)
    r = wgl.check(REGISTER, pair(ops), jobs=2, exhaustive=True)
    assert handed == [2]
    assert [p.verdict for p in r.partitions] == ["valid", "invalid"]
    bad = r.partitions[1]
    assert bad.blocked is not None
    assert bad.calls[bad.blocked].input == ("read", None, -1)
