"""A bookie cut off from ZooKeeper while it runs (``bookie_loses_session``): unregistered,
it is lost for the auditor and the workers and serves on for the clients. Each claim is
shown on the reachable states of ``c-session``, the config that budgets it."""

from __future__ import annotations

import pytest

from bkref.spec.config import Config
from bkref.spec.configs import NAMED
from bkref.spec.protocol import B_SESSION, UNREGISTERED, UP
from tests.spec.test_open_ledgers import Step, _steps

CFG: Config = NAMED["c-session"]


@pytest.fixture(scope="module")
def steps() -> list[Step]:
    return list(_steps(CFG))


def test_a_session_loss_unregisters_a_bookie_and_keeps_what_it_stored(
    steps: list[Step],
) -> None:
    losses = [(s, a, t) for s, (name, a), t in steps if name == "bookie_loses_session"]
    assert losses
    for s, args, t in losses:
        b = int(str(args[0]))
        assert (s.b_up[b], t.b_up[b]) == (UP, UNREGISTERED)
        assert t.b_ledgers == s.b_ledgers
        assert t.b_signed == s.b_signed
        assert t.msgs == s.msgs  # its connections to clients stay up
        assert t.au_stale == 1  # the auditor sees a registration change
        assert t.budget[B_SESSION] == s.budget[B_SESSION] - 1


def test_an_unregistered_bookie_serves_the_writer_and_the_recovery(steps: list[Step]) -> None:
    served = {
        name
        for s, (name, a), _t in steps
        if name.startswith("bookie_handles_") and s.b_up[int(str(a[0][1]))] == UNREGISTERED  # type: ignore[index]
    }
    assert {"bookie_handles_add", "bookie_handles_fencing_lac_read"} <= served


def test_the_auditor_marks_an_unregistered_bookie_and_a_worker_moves_its_replica(
    steps: list[Step],
) -> None:
    """The worker's swap changes the metadata while the bookie it replaces still serves:
    the race this step exists for has an effect."""
    wl = CFG.writer_ledger
    marked = [
        (s, t)
        for s, (name, _a), t in steps
        if name == "auditor_marks_ledgers_of_lost_bookies" and UNREGISTERED in s.b_up
    ]
    assert marked
    for s, t in marked:
        b = s.b_up.index(UNREGISTERED)
        if any(b in ens for _f, ens in s.meta_segments[wl]):
            assert t.meta_task[wl][1] >> b & 1, "an unregistered bookie is lost to the auditor"
    swapped = [
        (s, t)
        for s, (name, _a), t in steps
        if name == "worker_updates_segment_ensemble"
        and t.meta_segments[wl] != s.meta_segments[wl]
        and any(
            s.b_up[old] == UNREGISTERED
            for (_f, ens), (_g, now) in zip(s.meta_segments[wl], t.meta_segments[wl], strict=True)
            for old in set(ens) - set(now)
        )
    ]
    assert swapped


def test_an_unregistered_bookie_registers_again(steps: list[Step]) -> None:
    back = [(s, a, t) for s, (name, a), t in steps if name == "bookie_registers_again"]
    assert back
    for s, args, t in back:
        b = int(str(args[0]))
        assert (s.b_up[b], t.b_up[b]) == (UNREGISTERED, UP)
        assert t.au_stale == 1


def test_a_worker_copies_what_it_saw_lost_with_its_lock_even_once_it_is_back(
    steps: list[Step],
) -> None:
    """BookKeeper's worker checks the ledger once under the lock and replicates every
    fragment that check found; bkref's does too (``WorkerCore._look``). Found by
    ``bkref refine --config c-session --seed 1``: bkref's worker copied the second
    fragment of a bookie that had registered again after its first copy."""
    back = []
    for s, (name, args), t in steps:
        if name != "worker_copies_fragment":
            continue
        w = int(str(args[0]))
        pending = t.wk[w][3]
        assert pending is not None
        lost = pending[1]
        assert s.b_up[lost] != UP or s.wk_seen[w] >> lost & 1, "copied a bookie it never saw lost"
        if s.b_up[lost] == UP:
            back.append((s, w, lost))
    assert back
    # The view is the worker's own: taken with the lock, dropped with it.
    for s, (name, args), t in steps:
        if name == "worker_acquires_ledger_lock":
            w = int(str(args[0]))
            ledger = int(str(args[1]))
            down = {b for _f, ens in t.meta_segments[ledger] for b in ens if s.b_up[b] != UP}
            assert t.wk_seen[w] == sum(1 << b for b in down)
        elif name in ("worker_releases_lock", "worker_deletes_task", "worker_fails_repair"):
            assert t.wk_seen[int(str(args[0]))] == 0
