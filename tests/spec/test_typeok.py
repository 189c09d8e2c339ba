"""TypeOK refuses a malformed state: a value a variable may not hold, not only a violation
of the protocol. The checker reads TypeOK like any invariant; a spec mutant that writes a
value out of its range (tests/mutation/verdicts.toml, a bookie's LAC of -2) must fail it."""

from __future__ import annotations

import pytest

from bkref.spec.configs import NAMED
from bkref.spec.invariants import TypeOK
from bkref.spec.protocol import (
    B_REPAIR_FAIL,
    NONE,
    OPEN,
    State,
    budget_bounds,
    initial_state,
    ledger_on,
    set_at,
    set_ledger_on,
)


@pytest.mark.parametrize("name", sorted(NAMED))
def test_every_named_config_starts_in_a_well_typed_state(name: str) -> None:
    cfg = NAMED[name]
    assert TypeOK(cfg, initial_state(cfg))


def _with_bookie_lac(s: State, lac: int) -> State:
    synced, unsynced, fenced, _lac = ledger_on(s, 0, 0)
    return s._replace(b_ledgers=set_ledger_on(s, 0, 0, (synced, unsynced, fenced, lac)))


def test_a_bookie_lac_outside_the_entry_ids_is_refused() -> None:
    # An LAC is an entry id or -1 (none): -2 is no LAC, nor is an id past every ledger's
    # entries (config c: one entry in the writer's ledger and one in its closed ledger).
    cfg = NAMED["c"]
    s = initial_state(cfg)
    top = max(cfg.entries, cfg.closed_entries)
    assert top == 1
    assert TypeOK(cfg, _with_bookie_lac(s, -1))
    assert TypeOK(cfg, _with_bookie_lac(s, top - 1))
    assert not TypeOK(cfg, _with_bookie_lac(s, -2))
    assert not TypeOK(cfg, _with_bookie_lac(s, top))


def test_a_fence_flag_other_than_0_or_1_is_refused() -> None:
    cfg = NAMED["c"]
    s = initial_state(cfg)
    synced, unsynced, _f, lac = ledger_on(s, 0, 0)
    assert not TypeOK(cfg, s._replace(b_ledgers=set_ledger_on(s, 0, 0, (synced, unsynced, 2, lac))))


def test_a_writer_lac_below_minus_one_or_a_negative_budget_is_refused() -> None:
    cfg = NAMED["a"]
    s = initial_state(cfg)
    assert not TypeOK(cfg, s._replace(w_lac=-2))
    assert not TypeOK(cfg, s._replace(budget=(-1, *s.budget[1:])))


def test_a_budget_above_its_config_s_bound_is_refused() -> None:
    # An environment step spends its budget; none gives one back. A budget above the
    # config's bound is a step that counted the wrong way (a repair failure adding one:
    # tests/mutation/verdicts.toml), and the bound would no longer bound anything.
    cfg = NAMED["c-lock"]
    s = initial_state(cfg)
    bounds = budget_bounds(cfg)
    assert s.budget == bounds
    assert bounds[B_REPAIR_FAIL] >= 1
    spent = s._replace(budget=set_at(bounds, B_REPAIR_FAIL, 0))
    assert TypeOK(cfg, spent)
    assert not TypeOK(
        cfg, s._replace(budget=set_at(bounds, B_REPAIR_FAIL, bounds[B_REPAIR_FAIL] + 1))
    )


def test_a_signed_lac_is_held_for_the_entries_a_bookie_stores_and_only_those() -> None:
    # b_signed: per bookie, per entry of the writer's ledger, the LAC its stored copy is
    # signed with; -2 for none stored. m-2615 starts with e0 on its write set, signed -1.
    cfg = NAMED["m-2615"]
    s = initial_state(cfg)
    wl = cfg.writer_ledger
    stores = [bool(ledger_on(s, b, wl)[0] & 1) for b in range(cfg.bookies)]
    assert [s.b_signed[b][0] for b in range(cfg.bookies)] == [-1 if x else -2 for x in stores]
    assert TypeOK(cfg, s)
    b_in, b_out = stores.index(True), stores.index(False)

    def signed(b: int, lac: int) -> State:
        return s._replace(b_signed=set_at(s.b_signed, b, set_at(s.b_signed[b], 0, lac)))

    assert not TypeOK(cfg, signed(b_in, -2))  # e0 stored there, signed with nothing
    assert not TypeOK(cfg, signed(b_out, -1))  # e0 not stored there, signed all the same


def test_a_ledger_has_segments_exactly_when_it_was_created() -> None:
    # The writer's create writes a ledger's first segment with its OPEN status; no step
    # removes the last one. worker_copies_fragment's verdict of equivalence
    # (tests/mutation/verdicts.toml) rests on it: no segment of a NONE ledger exists.
    cfg = NAMED["a-short"]
    s = initial_state(cfg)
    wl = cfg.writer_ledger
    assert not cfg.writer_ledger_created
    assert (s.meta_status[wl], s.meta_segments[wl]) == (NONE, ())
    assert TypeOK(cfg, s)
    segment = ((0, tuple(range(cfg.ensemble))),)
    assert not TypeOK(cfg, s._replace(meta_segments=set_at(s.meta_segments, wl, segment)))
    assert not TypeOK(cfg, s._replace(meta_status=set_at(s.meta_status, wl, OPEN)))
