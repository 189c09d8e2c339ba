"""The ledger checker: planted anomalies are found and named, valid histories
pass, and it agrees with the generic search over the spec's ledger model."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bkref.linearizability import wgl
from bkref.linearizability.anomalies import ANOMALY_KINDS
from bkref.linearizability.generate import Event, interleave, ledger_history, many_ledgers, to_ops
from bkref.linearizability.history import HistoryError, Op, pair, validate
from bkref.linearizability.ledger_checker import check_ledgers
from bkref.linearizability.plant import plant


def _small(rng: random.Random) -> list[Op]:
    return to_ops(
        ledger_history(
            rng,
            adds=rng.randint(0, 6),
            reads=rng.randint(0, 7),
            readers=rng.randint(1, 3),
            in_flight=rng.randint(1, 4),
            end=rng.choice(["recover", "close", None]),
            create=rng.random() < 0.5,
            crash=0.15,
        )
    )


def _generic(ops: list[Op]) -> str:
    return wgl.check("ledger", pair(ops), budget=30, jobs=1).verdict


@pytest.mark.parametrize("seed", range(40))
def test_generated_histories_are_valid_for_both_checkers(seed: int) -> None:
    rng = random.Random(seed)
    ops = _small(rng)
    list(validate(ops))  # well formed
    result = check_ledgers(ops)
    assert result.valid, result.anomalies
    assert _generic(ops) == "valid"


@pytest.mark.parametrize("kind", ANOMALY_KINDS)
def test_every_planted_anomaly_is_found_and_named(kind: str) -> None:
    planted = 0
    for seed in range(60):
        rng = random.Random(seed)
        ops = to_ops(
            ledger_history(
                rng,
                adds=rng.randint(2, 8),
                reads=rng.randint(4, 12),
                end=rng.choice(["recover", "close"]),
                create=seed % 2 == 0,
            )
        )
        bad = plant(rng, ops, kind)
        if bad is None:
            continue
        planted += 1
        list(validate(bad))
        result = check_ledgers(bad)
        assert not result.valid
        assert kind in result.counts, (seed, result.counts)
        named = [a for a in result.anomalies if a.kind == kind]
        indices = {op.index for op in bad if op.type == "invoke"}
        assert all(set(a.ops) <= indices for a in named), "an anomaly names invocations"
        assert all(a.message for a in named)
        assert _generic(bad) == "invalid"
    assert planted >= 20, f"only {planted} histories had room for {kind}"


def test_many_ledgers_are_checked_apart() -> None:
    rng = random.Random(7)
    ops = many_ledgers(rng, 5, 300, end="recover")
    list(validate(ops))
    result = check_ledgers(ops)
    assert result.valid
    assert sorted(result.ledgers) == [1, 2, 3, 4, 5]
    histories = [
        ledger_history(rng, ledger=i, adds=30, reads=40, first_process=1000 * i) for i in (1, 2, 3)
    ]
    bad3 = plant(rng, to_ops(histories[2]), "stale-read")
    assert bad3 is not None
    histories[2] = [(o.process, o.type, o.f, o.ledger, o.value) for o in bad3]
    mixed = interleave(rng, histories)
    list(validate(mixed))
    result = check_ledgers(mixed)
    assert [lid for lid, v in result.ledgers.items() if not v.valid] == [3]
    assert {a.ledger for a in result.anomalies} == {3}


def test_a_fenced_add_may_still_be_in_the_ledger() -> None:
    # Recovery found the add on one bookie and kept it, though the writer was told "fenced".
    add = {"entry": 0, "data": "a"}
    ops = to_ops(
        [
            (0, "invoke", "add", 1, add),
            (1, "invoke", "recover", 1, None),
            (1, "ok", "recover", 1, {"last_entry": 0}),
            (0, "fail", "add", 1, {"error": "fenced"}),
        ]
    )
    assert check_ledgers(ops).valid
    assert _generic(ops) == "valid"
    # Any other failure means it did not happen.
    other = [op._replace(value={"error": "timeout"}) if op.type == "fail" else op for op in ops]
    assert not check_ledgers(other).valid
    assert _generic(other) == "invalid"


def _two_acked_adds() -> list[Event]:
    a0, a1 = {"entry": 0, "data": "a"}, {"entry": 1, "data": "b"}
    return [
        (0, "invoke", "add", 1, a0),
        (0, "ok", "add", 1, a0),
        (1, "invoke", "add", 1, a1),
        (1, "ok", "add", 1, a1),
    ]


def test_a_lac_that_goes_back_across_readers_is_valid_for_both_checkers() -> None:
    # Reader 3 reached bookies with an older hint than reader 2 did, after it.
    ops = to_ops(
        [
            *_two_acked_adds(),
            (2, "invoke", "read_lac", 1, None),
            (2, "ok", "read_lac", 1, {"lac": 1}),
            (3, "invoke", "read_lac", 1, None),
            (3, "ok", "read_lac", 1, {"lac": 0}),
            (4, "invoke", "read_lac", 1, None),
            (4, "ok", "read_lac", 1, {"lac": -1}),
        ]
    )
    list(validate(ops))
    result = check_ledgers(ops)
    assert result.valid, result.anomalies
    assert _generic(ops) == "valid"


def test_a_stale_lac_after_close_is_valid_for_both_checkers() -> None:
    ops = to_ops(
        [
            *_two_acked_adds(),
            (2, "invoke", "close", 1, None),
            (2, "ok", "close", 1, {"last_entry": 1}),
            (3, "invoke", "read_lac", 1, None),
            (3, "ok", "read_lac", 1, {"lac": 0}),
            (4, "invoke", "recover", 1, None),
            (4, "ok", "recover", 1, {"last_entry": 1}),
            (5, "invoke", "read_lac", 1, None),
            (5, "ok", "read_lac", 1, {"lac": -1}),
        ]
    )
    list(validate(ops))
    result = check_ledgers(ops)
    assert result.valid, result.anomalies
    assert result.ledgers[1].closed_at == 1
    assert _generic(ops) == "valid"


@pytest.mark.parametrize("lac_before_close", [True, False])
def test_a_lac_above_the_closed_last_entry_is_an_anomaly_for_both_checkers(
    lac_before_close: bool,
) -> None:
    # Entry 1 was sent (never acknowledged) and the LAC says it was confirmed,
    # yet recovery closed the ledger at 0: a confirmed entry was truncated.
    a0, a1 = {"entry": 0, "data": "a"}, {"entry": 1, "data": "b"}
    lac: list[Event] = [(3, "invoke", "read_lac", 1, None), (3, "ok", "read_lac", 1, {"lac": 1})]
    recover: list[Event] = [
        (2, "invoke", "recover", 1, None),
        (2, "ok", "recover", 1, {"last_entry": 0}),
    ]
    events: list[Event] = [
        (0, "invoke", "add", 1, a0),
        (0, "ok", "add", 1, a0),
        (1, "invoke", "add", 1, a1),
        *(lac + recover if lac_before_close else recover + lac),
    ]
    ops = to_ops(events)
    list(validate(ops))
    result = check_ledgers(ops)
    assert not result.valid
    assert set(result.counts) == {"read-of-truncated-entry"}, result.counts
    assert _generic(ops) == "invalid"


def test_a_lac_above_the_entries_that_exist_is_a_future_read_for_both_checkers() -> None:
    # LAC 0 returned before the add of entry 0 was even invoked.
    a0 = {"entry": 0, "data": "a"}
    ops = to_ops(
        [
            (1, "invoke", "read_lac", 1, None),
            (1, "ok", "read_lac", 1, {"lac": 0}),
            (0, "invoke", "add", 1, a0),
            (0, "ok", "add", 1, a0),
        ]
    )
    list(validate(ops))
    result = check_ledgers(ops)
    assert not result.valid
    assert set(result.counts) == {"future-read"}, result.counts
    assert _generic(ops) == "invalid"
    # Returned while the add was in flight, before its ack: it may take effect after it.
    overlapping = to_ops(
        [
            (0, "invoke", "add", 1, a0),
            (1, "invoke", "read_lac", 1, None),
            (1, "ok", "read_lac", 1, {"lac": 0}),
            (0, "ok", "add", 1, a0),
        ]
    )
    assert check_ledgers(overlapping).valid
    assert _generic(overlapping) == "valid"


def test_generated_valid_histories_have_lacs_that_go_back_and_lag_a_close() -> None:
    went_back = lagged_close = 0
    for seed in range(40):
        rng = random.Random(seed)
        ops = to_ops(ledger_history(rng, adds=10, reads=30, end=rng.choice(["recover", "close"])))
        assert check_ledgers(ops).valid
        highest_done = -1  # the highest LAC returned so far
        closed_at: int | None = None
        started: dict[object, int] = {}  # process -> highest LAC done when it was invoked
        for op in ops:
            if op.type == "invoke":
                started[op.process] = highest_done
            elif op.f == "read_lac" and op.type == "ok":
                v = op.value["lac"]
                went_back += v < started[op.process]
                lagged_close += closed_at is not None and v < closed_at
                highest_done = max(highest_done, v)
            elif op.f in ("close", "recover") and op.type == "ok" and closed_at is None:
                closed_at = op.value["last_entry"]
    assert went_back >= 5
    assert lagged_close >= 5


def test_malformed_values_are_bad_input() -> None:
    ops = to_ops([(0, "invoke", "add", 1, {"entry": -1, "data": "a"}), (0, "ok", "add", 1, None)])
    with pytest.raises(HistoryError, match="entry"):
        check_ledgers(ops)


# ---------------------------------------------------------------- agreement with the search


def _mutate(rng: random.Random, ops: list[Op]) -> list[Op]:
    """One random change that keeps the history well formed (or returns it unchanged)."""
    original, ops = ops, list(ops)
    if not ops:
        return ops
    i = rng.randrange(len(ops))
    op = ops[i]
    v: Any = op.value
    choice = rng.randrange(7)
    if choice == 0 and isinstance(v, dict) and "entry" in v:
        ops[i] = op._replace(value={**v, "entry": max(0, v["entry"] + rng.choice((-1, 1)))})
    elif choice == 1 and isinstance(v, dict) and "found" in v:
        flipped = {"entry": v["entry"], "found": not v["found"]}
        if flipped["found"]:
            flipped["data"] = f"1.{v['entry']}.0"
        ops[i] = op._replace(value=flipped)
    elif choice == 2 and isinstance(v, dict) and ("lac" in v or "last_entry" in v):
        key = "lac" if "lac" in v else "last_entry"
        ops[i] = op._replace(value={key: max(-1, v[key] + rng.choice((-1, 1)))})
    elif choice == 3 and op.type == "ok":
        ops[i] = op._replace(type="info")  # the client lost the reply
    elif choice == 4 and i + 1 < len(ops) and ops[i + 1].process != op.process:
        ops[i], ops[i + 1] = ops[i + 1], op  # move an event across another process's event
    elif choice == 5 and isinstance(v, dict) and "data" in v:
        ops[i] = op._replace(value={**v, "data": "x"})
    elif choice == 6 and op.type == "invoke":
        # Copy a whole operation to a later place, on a new process: a second
        # add of an entry id, another close, another read...
        done = next((o for o in ops[i + 1 :] if o.process == op.process), None)
        if done is not None:
            fresh = max(int(o.process) for o in ops) + 1
            at = rng.randrange(i, len(ops) + 1)
            end = rng.randrange(at, len(ops) + 1)
            ops.insert(end, done._replace(process=fresh))
            ops.insert(at, op._replace(process=fresh))
    ops = [o._replace(index=k) for k, o in enumerate(ops)]
    try:
        list(validate(ops))
    except HistoryError:
        return original  # the change broke the format (e.g. a completion before its call)
    return ops


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), mutations=st.integers(0, 5))
def test_ledger_checker_agrees_with_the_generic_search(seed: int, mutations: int) -> None:
    rng = random.Random(seed)
    ops = _small(rng)
    if rng.random() < 0.3:
        ops = ops[: rng.randrange(len(ops) + 1)]  # a prefix: ops never completed
    for _ in range(mutations):
        ops = _mutate(rng, ops)
    fast = check_ledgers(ops)
    assert fast.verdict == _generic(ops), (fast.anomalies, [o.to_json() for o in ops])


def test_an_absurd_last_entry_is_a_skip_not_a_memory_blowup() -> None:
    ops = to_ops(
        [
            (0, "invoke", "add", 1, {"entry": 0, "data": "a"}),
            (0, "ok", "add", 1, {"entry": 0, "data": "a"}),
            (1, "invoke", "recover", 1, None),
            (1, "ok", "recover", 1, {"last_entry": 10**15}),
            (2, "invoke", "read_lac", 1, None),
            (2, "ok", "read_lac", 1, {"lac": 10**14}),
        ]
    )
    result = check_ledgers(ops)
    assert not result.valid
    assert "skip" in result.counts
    assert result.ledgers[1].entries == 1


def test_nemesis_operations_are_ignored_by_both_checkers() -> None:
    rng = random.Random(11)
    events = ledger_history(rng, adds=4, reads=4, end="recover")
    events[3:3] = [("nemesis", "info", "partition", None, ["b1"])]
    events.append(("nemesis", "info", "partition", None, "healed"))
    ops = to_ops(events)
    list(validate(ops))
    assert check_ledgers(ops).valid
    assert _generic(ops) == "valid"


def test_generic_search_of_many_ledgers_in_worker_processes() -> None:
    rng = random.Random(21)
    histories = [
        ledger_history(rng, ledger=lid, adds=6, reads=6, first_process=100 * lid)
        for lid in (1, 2, 3)
    ]
    bad2 = plant(rng, to_ops(histories[1]), "future-read")
    assert bad2 is not None
    histories[1] = [(o.process, o.type, o.f, o.ledger, o.value) for o in bad2]
    ops = interleave(rng, histories)
    result = wgl.check("ledger", pair(ops), jobs=2, parallel_min_ops=0, exhaustive=True)
    assert result.verdict == "invalid"
    assert {p.key: p.verdict for p in result.partitions} == {1: "valid", 2: "invalid", 3: "valid"}
    assert check_ledgers(ops).verdict == "invalid"
