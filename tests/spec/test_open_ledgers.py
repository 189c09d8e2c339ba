"""AutoRecovery on open ledgers and the races that change data: the spec steps added for
them, each shown on a reachable state of the config that exercises it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import cast

import pytest

from bkref.spec.checker import check
from bkref.spec.config import Config
from bkref.spec.configs import NAMED, mutant_config
from bkref.spec.protocol import (
    CLOSED,
    IN_RECOVERY,
    OPEN,
    RC_WRITING,
    UP,
    Label,
    State,
    initial_state,
    missing_entries,
    next_states,
    recovery_of,
    segment_is_closed,
    set_at,
    worker_copies_fragment,
    worker_fences_open_ledger,
    worker_releases_lock,
    worker_verifies_ledger_replicated,
)

Step = tuple[State, Label, State]


def _steps(cfg: Config) -> Iterator[Step]:
    """Every transition of the config's reachable state graph (up to a mutant's violation)."""
    if not cfg.mutants:  # the check expands every state once: its steps, kept as it goes
        seen: list[Step] = []

        def expand(c: Config, s: State) -> list[tuple[Label, State]]:
            out = next_states(c, s)
            seen.extend((s, label, t) for label, t in out)
            return out

        r = check(cfg, expand=expand)
        assert r.violation is None
        assert r.complete
        yield from seen
        return
    # A violation stops the check with states found but not expanded: expand them all.
    r = check(cfg, keep_graph=True)
    assert r.graph is not None
    for s in r.graph.states:
        for label, t in next_states(cfg, s):
            yield s, label, t


def _find(cfg: Config, pred: Callable[[Step], bool]) -> Step | None:
    return next((st for st in _steps(cfg) if pred(st)), None)


class _SearchDoneError(Exception):
    """Raised in the check's expand hook: the search has seen what it looks for."""


def _reaches(cfg: Config, done: Callable[[Step], bool]) -> bool:
    """Whether the check of a correct config takes a step after which ``done`` (called on
    every step, in the order of the breadth-first search) holds: it stops there, where
    ``_steps`` would go on to the end of the graph."""

    def expand(c: Config, s: State) -> list[tuple[Label, State]]:
        out = next_states(c, s)
        if any(done((s, label, t)) for label, t in out):
            raise _SearchDoneError
        return out

    try:
        r = check(cfg, expand=expand)
    except _SearchDoneError:
        return True
    assert r.violation is None
    return False


@pytest.fixture(scope="module")
def open_check() -> list[Step]:
    return list(_steps(NAMED["c-open-check"]))


def test_the_periodic_check_marks_a_live_bookie_of_an_open_ledger_s_closed_segment(
    open_check: list[Step],
) -> None:
    wl = NAMED["c-open-check"].writer_ledger
    marks = [
        (s, t)
        for s, (name, _a), t in open_check
        if name == "auditor_checks_ledger_replicas" and s.meta_status[wl] == OPEN
    ]
    assert marks
    for s, t in marks:
        new = t.meta_task[wl][1] & ~s.meta_task[wl][1]
        segs = s.meta_segments[wl]
        # only bookies of closed segments (not the open last one alone), all of them live
        closed = {b for _f, ens in segs[:-1] for b in ens}
        assert all(b in closed and s.b_up[b] == UP for b in range(8) if new >> b & 1)


def test_a_worker_swaps_a_closed_segment_of_a_ledger_still_being_written(
    open_check: list[Step],
) -> None:
    wl = NAMED["c-open-check"].writer_ledger
    assert any(
        name == "worker_updates_segment_ensemble"
        and s.meta_status[wl] == OPEN
        and t.meta_segments[wl][:-1] != s.meta_segments[wl][:-1]
        for s, (name, _a), t in open_check
    )


def test_a_copy_carries_each_entry_s_signed_lac_to_the_new_replica(
    open_check: list[Step],
) -> None:
    wl = NAMED["c-open-check"].writer_ledger
    copies = [
        (s, t, s.wk[cast(int, a[0])][0])
        for s, (name, a), t in open_check
        if name == "worker_copies_fragment"
    ]
    raised = [(s, t, b) for s, t, b in copies if t.b_ledgers[b][wl][3] > s.b_ledgers[b][wl][3]]
    assert raised  # e1, signed with LAC 0, copied: the target's LAC goes from -1 to 0
    for _s, t, target in raised:
        held = t.b_ledgers[target][wl][0]
        signed = [t.b_signed[target][e] for e in range(len(t.b_signed[target])) if held >> e & 1]
        assert t.b_ledgers[target][wl][3] == max(signed)


def test_the_writer_resends_only_once_its_ensemble_change_landed() -> None:
    for name, mutants in (("m-1591", False), ("acks-before-ensemble-change-lands", True)):
        cfg = mutant_config(name) if mutants else NAMED[name]
        early = _find(
            cfg, lambda st: st[1][0] == "writer_resends_add" and st[0].w_change is not None
        )
        # BookKeeper (and bkref) re-send after the CAS; only BOOKKEEPER-1591 sends before.
        assert (early is not None) == mutants


def test_a_recovery_changes_no_ensemble_once_its_close_is_decided() -> None:
    cfg = NAMED["m-1591"]  # one entry, one message loss: a write-back may time out

    def late_change(st: Step) -> bool:
        s, (name, _a), _t = st
        r = recovery_of(s, 0)
        return (
            name == "recovery_client_changes_ensemble"
            and r.phase == RC_WRITING
            and (r.lac >= r.last)
        )

    assert _find(cfg, late_change) is None
    assert _find(cfg, lambda st: st[1][0] == "recovery_client_changes_ensemble") is not None


def test_a_worker_may_fence_a_ledger_already_in_recovery_or_copy_its_closed_segments() -> None:
    cfg = NAMED["c-merge"]
    wl = cfg.writer_ledger
    wanted = {"worker_fences_open_ledger", "worker_copies_fragment"}
    taken: set[str] = set()

    def both(step: Step) -> bool:
        s, (name, _a), _t = step
        if s.meta_status[wl] == IN_RECOVERY:
            taken.add(name)
        return wanted <= taken

    # Both within the first few hundred of c-merge's 156,948 states.
    assert _reaches(cfg, both), f"in recovery, workers took only {sorted(taken & wanted)}"


def test_a_worker_repairs_a_listed_replica_that_came_back_missing_entries() -> None:
    # c-check-crash: the check lists a bookie whose add was lost; it crashes and restarts
    # without the entry. The worker checks the replicas its task lists, as BookKeeper's
    # does, and copies that one though it is live again. A search of its own, without the
    # checker's symmetry reduction, so that it knows which bookie crashed.
    cfg = NAMED["c-check-crash"]
    wl = cfg.writer_ledger
    start = (initial_state(cfg), -1)  # a state, and the bookie that crashed (-1: none)
    seen, queue = {start}, deque([start])
    # Found after 1,335 pairs; the space without symmetry takes minutes to exhaust.
    while queue and len(seen) < 50_000:
        s, crashed = queue.popleft()
        for (name, args), t in next_states(cfg, s):
            if name == "worker_copies_fragment" and crashed >= 0:
                pending = t.wk[0][3]
                assert isinstance(pending, tuple)
                if (
                    pending[1] == crashed
                    and s.b_up[crashed] == UP
                    and s.meta_task[wl][1] & (1 << crashed)
                    and missing_entries(cfg, s, wl, pending[0], crashed)
                ):
                    return
            nxt = (t, int(str(args[0])) if name == "bookie_crashes" else crashed)
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    raise AssertionError(
        f"no worker copies a listed replica that crashed and came back ({len(seen):,} searched)"
    )


def test_a_worker_whose_task_moved_on_verifies_as_if_its_task_listed_nothing() -> None:
    # A mark since the worker took its lock (the periodic check's) bumped the task's
    # version: the worker's versioned delete fails whatever it decides, and the replicas
    # the new task lists are no verdict of its own. It verifies as a worker whose task
    # listed no bookie would (found by `bkref refine --config c-check-crash --seed 2`).
    cfg = NAMED["c-open-check"]
    moved_on = 0
    for s in {s for s, _label, _t in _steps(cfg)}:
        for w, (_b, ledger, tv, _pending) in enumerate(s.wk):
            if ledger < 0 or s.meta_task[ledger][0] == tv:
                continue
            moved_on += 1
            nothing_listed = s._replace(meta_task=set_at(s.meta_task, ledger, (tv, 0)))
            got = worker_verifies_ledger_replicated(cfg, s, w)
            want = worker_verifies_ledger_replicated(cfg, nothing_listed, w)
            assert (got is None) == (want is None), s
            if got is not None and want is not None:
                assert got.wk == want.wk
    assert moved_on  # the config reaches such workers


def test_a_worker_with_a_verdict_to_act_on_keeps_its_lock(open_check: list[Step]) -> None:
    # A worker lets the lock go when it cannot repair the ledger, or waits for its open
    # last segment to close: a live bookie its task lists there still takes the writer's
    # adds (worker_releases_lock). A worker that can fence the ledger, or verify it
    # replicated under the task it read, does that instead of letting go.
    cfg = NAMED["c-open-check"]
    acts = 0
    for s in {s for s, _label, _t in open_check}:
        for w, (_b, ledger, tv, _pending) in enumerate(s.wk):
            if ledger < 0 or s.wk_unlocked >> w & 1:
                continue  # no lock, or one ZooKeeper dropped: it may let go at any point
            listed = s.meta_task[ledger][1]
            last = s.meta_segments[ledger][-1][1]
            if s.meta_status[ledger] != CLOSED and any(
                listed >> b & 1 and s.b_up[b] == UP for b in last
            ):
                continue  # it may wait for the close
            verifies = s.meta_task[ledger][0] == tv and worker_verifies_ledger_replicated(cfg, s, w)
            if worker_fences_open_ledger(cfg, s, w) or verifies:
                acts += 1
                assert worker_releases_lock(cfg, s, w) is None, s
    assert acts  # the config reaches such workers


def test_a_worker_repairs_a_live_replica_only_if_its_task_lists_it(
    open_check: list[Step],
) -> None:
    # The worker checks the live replicas its task lists (bkref's WorkerCore probes only
    # those, replication.py), and those it saw lost when it took the lock; a live replica
    # missing entries that neither names waits for an audit to list it. The check must
    # reach such replicas, or the rule is not shown.
    cfg = NAMED["c-open-check"]
    unlisted = 0
    for s in {s for s, _label, _t in open_check}:
        for w, (_b, ledger, _tv, _pending) in enumerate(s.wk):
            if ledger < 0:
                continue
            named = s.meta_task[ledger][1] | s.wk_seen[w]
            for idx, (_first, ens) in enumerate(s.meta_segments[ledger]):
                if not segment_is_closed(s, ledger, idx):
                    continue
                for b in ens:
                    if s.b_up[b] != UP or named >> b & 1:
                        continue
                    if missing_entries(cfg, s, ledger, idx, b):
                        unlisted += 1
                        assert worker_copies_fragment(cfg, s, w, idx, lost=b) is None, s
    assert unlisted
