"""AutoRecovery's rules that no invariant reads: a spec that broke one would still pass
every config, so each is shown here, on the reachable steps of a config that takes it, or
called as the trace check and the refinement machine call it. Each test kills a spec
mutant that survived every config (tests/mutation/verdicts.toml names which)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bkref.spec.configs import NAMED
from bkref.spec.protocol import (
    CLOSED,
    DOWN,
    UP,
    State,
    _ledger_bookies,
    _segment_needs_repair,
    auditor_checks_ledger_replicas,
    auditor_loses_session,
    auditor_node,
    bit,
    bookies_of,
    initial_state,
    ledger_on,
    missing_entries,
    operator_disables_autorecovery,
    segments_before_swaps,
    set_at,
    set_ledger_on,
    with_swap,
    worker_acquires_ledger_lock,
    worker_copies_fragment,
    worker_releases_lock,
)
from tests.spec.test_open_ledgers import Step, _steps

C_LOCK = NAMED["c-lock"]


@pytest.fixture(scope="module")
def c_lock() -> list[Step]:
    return list(_steps(C_LOCK))


def _without_entries(s: State, b: int, ledger: int) -> State:
    """``s`` with bookie ``b``'s replicas of ``ledger`` lost (an add that never arrived)."""
    return s._replace(b_ledgers=set_ledger_on(s, b, ledger, (0, *ledger_on(s, b, ledger)[1:])))


def test_a_worker_copies_the_fragment_of_a_bookie_down_at_its_lock_once_it_is_back(
    c_lock: list[Step],
) -> None:
    # BookKeeper's worker checks the ledger once, when it holds the lock
    # (ReplicationWorker.rereplicate, apache/bookkeeper 9590a97f), and copies every
    # fragment that check found, though the bookie may come back meanwhile. The spec's
    # worker keeps that view (wk_seen): every bookie of the ledger not UP at the lock,
    # crashed (DOWN) as well as unregistered or refused.
    locks = [(s, a, t) for s, (name, a), t in c_lock if name == "worker_acquires_ledger_lock"]
    down = 0
    for s, args, t in locks:
        w, ledger = (int(str(x)) for x in args)
        named = tuple(bookies_of(_ledger_bookies(s, ledger)))
        want = sum(bit(b) for b in named if s.b_up[b] != UP)
        assert t.wk_seen[w] == want, (s, args)
        down += any(s.b_up[b] == DOWN for b in named)
    assert down, "no worker took a lock while a bookie of its ledger was down"
    # And it copies the fragment of a bookie its view names once that bookie is UP again
    # and misses no entry: nothing but the view at the lock names such a bookie (the task
    # lists it as lost, and it is not lost now).
    back = 0
    for s, (name, args), _t in c_lock:
        if name != "worker_copies_fragment":
            continue
        w, idx = (int(str(x)) for x in args)
        ledger = s.wk[w][1]
        copied = _segment_needs_repair(C_LOCK, s, ledger, idx, s.wk_seen[w])
        if s.b_up[copied] == UP and not missing_entries(C_LOCK, s, ledger, idx, copied):
            assert s.wk_seen[w] >> copied & 1
            back += 1
    assert back, "no worker copied a fragment of a bookie back since its lock"


def test_a_bookie_misses_only_the_entries_of_its_own_write_sets() -> None:
    # Striped (E = 3 > Wq = 2): e0 belongs on b0 and b1 only, so b2, holding nothing,
    # misses nothing: the periodic check must not list it, nor a worker repair it.
    cfg = NAMED["m-742"]
    s = initial_state(cfg)
    wl = cfg.writer_ledger
    assert (cfg.ensemble, cfg.write_quorum) == (3, 2)
    assert s.meta_segments[wl] == ((0, (0, 1, 2)),)
    assert [ledger_on(s, b, wl)[0] for b in (0, 1, 2)] == [1, 1, 0]  # e0 on b0, b1
    assert [missing_entries(cfg, s, wl, 0, b) for b in (0, 1, 2)] == [0, 0, 0]
    assert missing_entries(cfg, _without_entries(s, 0, wl), wl, 0, 0) == 1


def test_the_periodic_check_rewrites_a_task_only_for_a_bookie_new_to_it() -> None:
    # BookKeeper's check and bkref's write a ledger's task only when they find a bookie
    # it does not list yet: a rewrite bumps its version, and a worker's versioned delete
    # then fails, so a check that rewrote the same task would keep it for ever. Config c
    # with the check on: its closed ledger 0 holds e0 on b0-b2; b2 loses its replica.
    cfg = replace(NAMED["c"], periodic_check=True)
    s = initial_state(cfg)
    assert s.meta_status[0] == CLOSED
    assert auditor_node(s) >= 0
    lost = _without_entries(s, 2, 0)
    assert missing_entries(cfg, lost, 0, 0, 2) == 1
    assert auditor_checks_ledger_replicas(cfg, s, 0) is None  # nothing missing
    marked = auditor_checks_ledger_replicas(cfg, lost, 0)
    assert marked is not None
    assert marked.meta_task[0] == (s.meta_task[0][0] + 1, bit(2))
    assert auditor_checks_ledger_replicas(cfg, marked, 0) is None  # b2 is listed already


def test_only_a_leading_auditor_with_autorecovery_enabled_checks_replicas() -> None:
    # BookKeeper's periodic check is a task of the elected Auditor, and an audit is
    # skipped while ledger replication is disabled. next_states offers the check only
    # then; the trace check and the refinement machine call it by name.
    cfg = replace(NAMED["c"], periodic_check=True, elections=1, toggles=1)
    s = initial_state(cfg)
    lost = _without_entries(s, 2, 0)
    assert auditor_checks_ledger_replicas(cfg, lost, 0) is not None
    leaderless = auditor_loses_session(cfg, lost)
    assert leaderless is not None
    assert auditor_node(leaderless) < 0
    assert leaderless.meta_autorecovery
    assert auditor_checks_ledger_replicas(cfg, leaderless, 0) is None
    disabled = operator_disables_autorecovery(cfg, lost)
    assert disabled is not None
    assert auditor_node(disabled) >= 0
    assert not disabled.meta_autorecovery
    assert auditor_checks_ledger_replicas(cfg, disabled, 0) is None


def test_a_worker_takes_a_lock_only_while_idle_with_autorecovery_enabled() -> None:
    # BookKeeper's ReplicationWorker takes one ledger at a time, and takes none while
    # ledger replication is disabled (ZkLedgerUnderreplicationManager.
    # getLedgerToRereplicate waits in waitIfLedgerReplicationDisabled). next_states
    # offers the lock to every idle worker: this guard alone refuses it while
    # AutoRecovery is off, and the refinement machine calls it by name.
    # Config c with the check on: its closed ledger 0 gets a task, b2 having lost e0.
    cfg = replace(NAMED["c"], periodic_check=True, toggles=1)
    marked = auditor_checks_ledger_replicas(cfg, _without_entries(initial_state(cfg), 2, 0), 0)
    assert marked is not None
    assert marked.meta_task[0][1] == bit(2)
    w = 0
    locked = worker_acquires_ledger_lock(cfg, marked, w, 0)
    assert locked is not None
    assert locked.wk[w][1] == 0
    # Holding ledger 0's lock, the worker takes no other ledger's, though it has a task.
    second = locked._replace(meta_task=set_at(locked.meta_task, 1, (1, bit(2))))
    assert second.meta_lock[1] < 0
    assert worker_acquires_ledger_lock(cfg, second, w, 1) is None
    # With AutoRecovery disabled, an idle worker takes no lock.
    disabled = operator_disables_autorecovery(cfg, marked)
    assert disabled is not None
    assert not disabled.meta_autorecovery
    assert worker_acquires_ledger_lock(cfg, disabled, w, 0) is None


def test_a_worker_s_copy_does_not_wait_for_another_worker_s_lost_lock(
    c_lock: list[Step],
) -> None:
    # A worker that lost its lock (wk_unlocked) copies no more; the others go on. Whether
    # a worker may copy depends on its own bit only, and c-lock reaches a copy beside
    # the lost lock of a worker numbered above it (where a shift without its mask, the
    # mutant, would still see a bit).
    beside = 0
    for s, (name, args), _t in c_lock:
        for w in range(len(s.wk)):
            alone = s._replace(wk_unlocked=s.wk_unlocked & bit(w))
            for idx in range(len(s.meta_segments[s.wk[w][1]]) if s.wk[w][1] >= 0 else 0):
                may = worker_copies_fragment(C_LOCK, s, w, idx) is not None
                assert may == (worker_copies_fragment(C_LOCK, alone, w, idx) is not None)
        if name == "worker_copies_fragment":
            w = int(str(args[0]))
            beside += bool(s.wk_unlocked >> (w + 1))
    assert beside, "no copy beside the lost lock of a worker numbered above"


def test_a_failure_is_recorded_only_in_a_task_still_there(c_lock: list[Step]) -> None:
    # bkref's record_failure writes the task at the version it read; a task another worker
    # deleted at that version is gone (no znode), and nothing is written. next_states and
    # the trace check offer the recording release only while the task is there
    # (shares_task); the action holds to it on its own, whoever calls it.
    deleted = 0
    for s, _label, _t in c_lock:
        for w, (_b, ledger, tv, _p) in enumerate(s.wk):
            if ledger < 0 or not s.wk_unlocked >> w & 1 or s.meta_task[ledger] != (tv, 0):
                continue
            deleted += 1
            t = worker_releases_lock(C_LOCK, s, w, 1)
            assert t is not None
            assert t.meta_task == s.meta_task
    assert deleted, "no worker outlived its task's deletion at the version it read"


def test_the_segments_before_the_swaps_name_only_bookies_the_segment_had() -> None:
    # The audit whose read came before a worker's swap: the refinement driver builds that
    # read's metadata with segments_before_swaps (bkref/refine/bkref_autorecovery.py), as
    # the hand-written mutant audit-marks-only-its-earlier-scan does. Each swap is a
    # record (segment, filled, replaced); a bookie swapped back in is replaced no more (-1).
    assert with_swap((), 0, 3, 1) == ((0, 3, 1),)
    chain = with_swap(with_swap((), 0, 3, 1), 0, 4, 3)  # b1 -> b3 -> b4
    assert segments_before_swaps(((0, (0, 4, 2)),), chain) == ((0, (0, 1, 2)),)
    back = with_swap(with_swap((), 0, 3, 1), 0, 1, 3)  # b1 -> b3 -> b1
    assert back == ((0, 1, 3), (0, 3, -1))
    # Only the last swap is undone: the segment as a read between the two saw it. Never
    # the -1 of a forgotten link, which is no bookie.
    assert segments_before_swaps(((0, (0, 1, 2)),), back) == ((0, (0, 3, 2)),)
