"""A bookie that registered again while it ran, and that no audit marked lost in between
(or only after a worker copied its fragments): its session expired unseen
(``autorecovery.expiries``), a spec step placed where a worker's look shows it, or
nowhere when no worker looked."""

from __future__ import annotations

from bkref.tracecheck.autorecovery import EXPIRED, expiries
from bkref.tracecheck.load import REGISTERED, Line
from bkref.tracecheck.names import COPY, LOCK

B = "127.0.0.1:3185"


def _reg(t: int, seq: int) -> Line:
    return Line(B, seq, t, REGISTERED, {"bookie": B})


def _worker(lock_t: int, lost: str | None) -> dict[str, list[Line]]:
    w = "autorecovery-127.0.0.1:3181-0"
    lines = [Line(w, 0, lock_t, LOCK, {"ledger": 10, "bookie": "127.0.0.1:3181"})]
    if lost is not None:
        lines.append(Line(w, 1, lock_t + 70, COPY, {"ledger": 10, "lost": lost}))
    return {w: lines}


def _mark(decided: int, written: int | None = None) -> Line:
    return Line(
        "auditor",
        5,
        decided + 10 if written is None else written,
        "auditor_marks_ledgers_of_lost_bookies",
        {
            "ledger": 10,
            "replicas": {B: "LOST"},
            "decided": decided,
        },
    )


def test_a_worker_that_copied_its_fragments_saw_it_expired_before_its_lock() -> None:
    again = _reg(1000, 1)
    out = expiries([_reg(0, 0), again], _worker(400, B), {})
    assert list(out) == [id(again)]
    expire = out[id(again)]
    assert (expire.action, expire["bookie"], expire.t) == (EXPIRED, B, 399)


def test_a_worker_that_copied_another_bookie_times_it_just_before_it_came_back() -> None:
    again = _reg(1000, 1)
    assert expiries([_reg(0, 0), again], _worker(400, "127.0.0.1:3184"), {})[id(again)].t == 999


def test_an_expiry_an_audit_marked_or_no_worker_saw_is_not_one() -> None:
    regs = [_reg(0, 0), _reg(1000, 1)]
    assert expiries(regs, _worker(400, B), {B: [_mark(300)]}) == {}  # the mark's own choice
    assert expiries(regs, _worker(1500, B), {}) == {}  # no worker looked meanwhile
    assert expiries(regs, {}, {}) == {}


def test_a_mark_written_after_a_worker_copied_its_fragments_leaves_the_expiry() -> None:
    # The audit read the bookie lost before the worker's lock, and wrote its mark after
    # the copy (docker-15 ledger 403): the worker saw the expiry first.
    again = _reg(1000, 1)
    out = expiries([_reg(0, 0), again], _worker(400, B), {B: [_mark(300, written=900)]})
    assert out[id(again)].t == 399


def test_a_registration_after_a_restart_is_no_expiry() -> None:
    restart = Line(B, 1, 500, "bookie_restarts", {"bookie": B})
    assert expiries([_reg(0, 0), restart, _reg(1000, 2)], _worker(700, B), {}) == {}
    assert expiries([_reg(1000, 0)], _worker(700, B), {}) == {}  # its first registration
