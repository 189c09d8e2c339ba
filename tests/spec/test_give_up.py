"""A recovery that gives up (D18): the spec step on every reachable state of ``a-give-up``."""

from __future__ import annotations

from collections import Counter

import pytest

from bkref.spec.configs import NAMED
from bkref.spec.protocol import (
    ADD,
    B_GIVE_UP,
    CLOSED,
    IN_RECOVERY,
    ORPHAN,
    RC_FENCING,
    RC_IDLE,
    RC_READING,
    SERVING,
    UP,
    Msg,
    bookies_of,
    ensemble_mask,
    recovery_of,
    write_set,
)
from tests.spec.test_open_ledgers import Step, _steps

CFG = NAMED["a-give-up"]


@pytest.fixture(scope="module")
def steps() -> list[Step]:
    return list(_steps(CFG))


def _attempts(m: Msg, c: int) -> bool:
    """Whether ``m`` is recovery client ``c``'s own (an add's sender is ``c + 1``)."""
    return m[4] == (c + 1 if m[0] == ADD else c)


def test_a_recovery_gives_up_only_when_every_bookie_it_waits_for_is_down(
    steps: list[Step],
) -> None:
    wl = CFG.writer_ledger
    phases = set()
    gave_up = [(s, a, t) for s, (name, a), t in steps if name == "recovery_client_gives_up"]
    assert gave_up
    for s, args, t in gave_up:
        c = int(str(args[0]))
        r = recovery_of(s, c)
        phases.add(r.phase)
        if r.phase == RC_FENCING:
            waiting = ensemble_mask(r.segments[-1][1]) & ~r.fenced
        else:
            assert r.phase == RC_READING
            waiting = write_set(CFG, r.read_segments, r.reading) & ~r.negative
        assert waiting
        assert all(s.b_up[b] != UP for b in bookies_of(waiting))
        # The attempt is over: the client is idle, the ledger stays IN_RECOVERY, and no
        # request in flight is the attempt's own any more (its answers are heard by nobody).
        assert recovery_of(t, c).phase == RC_IDLE
        assert s.meta_status[wl] == t.meta_status[wl] == IN_RECOVERY
        assert not any(_attempts(m, c) for m in t.msgs)
        # Each of the attempt's requests to a bookie still serving stays in flight as the
        # same request to the same bookie, heard by nobody; those to a bookie down are gone.
        own = [m for m in s.msgs if _attempts(m, c)]
        unheard = [(k, b, e, x, ORPHAN) for k, b, e, x, _ in own if s.b_up[b] in SERVING]
        assert Counter(t.msgs) == Counter(s.msgs) - Counter(own) + Counter(unheard)
        assert t.budget[B_GIVE_UP] == s.budget[B_GIVE_UP] - 1
    # Both of bkref's and BookKeeper's failure points are reached.
    assert phases == {RC_FENCING, RC_READING}


def test_a_failed_attempt_s_write_back_lands_unheard_and_the_next_attempt_closes(
    steps: list[Step],
) -> None:
    landed = [
        (s, t)
        for s, (name, a), t in steps
        if name == "bookie_handles_add" and a[0][4] == ORPHAN  # type: ignore[index]
    ]
    assert landed
    for s, t in landed:
        assert t.rc == s.rc  # nobody heard the answer
    # Recoveries that started again after a give-up close the ledger.
    wl = CFG.writer_ledger
    assert any(
        name == "recovery_client_closes_ledger"
        and s.budget[B_GIVE_UP] == 0
        and t.meta_status[wl] == CLOSED
        for s, (name, _a), t in steps
    )
