"""Fault schedules: reproducible from the seed, and within their composition rules."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bkref.nemesis.faults import AUDITOR_KINDS, FAULT_KINDS, VICTIM_KINDS, expand_kinds
from bkref.nemesis.generator import ScheduleSpec, schedule

TARGETS = ("bookie-0", "bookie-1", "bookie-2", "bookie-3", "bookie-4")


@settings(deadline=None, max_examples=300)  # pure, but the machine's load varies
@given(
    seed=st.integers(0, 2**32),
    duration=st.floats(5, 300),
    concurrent=st.integers(1, 3),
    mean=st.floats(0.5, 10),
)
@example(seed=326, duration=273.6321273818971, concurrent=2, mean=0.5)  # found by CI
def test_schedule_respects_duration_targets_and_concurrency(
    seed: int, duration: float, concurrent: int, mean: float
) -> None:
    spec = ScheduleSpec(duration, targets=TARGETS, mean_interval=mean, max_concurrent=concurrent)
    windows = schedule(spec, seed)
    assert windows == schedule(spec, seed)  # the seed alone reproduces the schedule
    for w in windows:
        assert 0 < w.start < w.stop <= duration
        assert w.kind in spec.kinds
        assert w.target in TARGETS
    for a, b in itertools.combinations(windows, 2):
        if a.target == b.target:
            assert a.stop <= b.start or b.stop <= a.start, (a, b)
    for w in windows:
        open_at_start = [x for x in windows if x.start <= w.start < x.stop]
        assert len(open_at_start) <= concurrent


def test_a_long_schedule_uses_every_kind_and_different_seeds_differ() -> None:
    spec = ScheduleSpec(600, targets=TARGETS)
    windows = schedule(spec, 7)
    assert {w.kind for w in windows} == {"kill", "pause"}
    assert len({w.target for w in windows}) == len(TARGETS)
    assert windows != schedule(spec, 8)


def test_no_targets_or_kinds_means_no_faults() -> None:
    assert schedule(ScheduleSpec(60, targets=()), 1) == []
    assert schedule(ScheduleSpec(60, kinds=(), targets=TARGETS), 1) == []


def test_unknown_fault_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        ScheduleSpec(60, kinds=("meteor",), targets=TARGETS)


BOOKIES = TARGETS
ZKS = ("zk1", "zk2", "zk3")
NETWORK = (*ZKS, *BOOKIES, "client")


def _full(duration: float, concurrent: int = 1, mean: float = 2.0) -> ScheduleSpec:
    return ScheduleSpec(
        duration,
        kinds=FAULT_KINDS,
        targets=BOOKIES,
        zookeepers=ZKS,
        network=NETWORK,
        clients=("client",),
        mean_interval=mean,
        max_concurrent=concurrent,
    )


@settings(deadline=None, max_examples=200)
@given(seed=st.integers(0, 2**32), duration=st.floats(10, 600), concurrent=st.integers(1, 3))
def test_every_kind_keeps_its_rules(seed: int, duration: float, concurrent: int) -> None:
    spec = _full(duration, concurrent)
    windows = schedule(spec, seed)
    assert windows == schedule(spec, seed)
    victims = {w.target for w in windows if w.kind in VICTIM_KINDS}
    assert len(victims) <= 1  # disk corruption hits one bookie per run
    wipes = [w for w in windows if w.kind == "wipe"]
    assert len(wipes) <= 1
    assert all(w.start >= duration / 2 for w in wipes)
    for w in windows:
        assert 0 < w.start < w.stop <= duration
        if w.kind in ("kill", "pause"):
            assert w.target in BOOKIES + ZKS
        if w.kind == "expire":
            assert w.stop - w.start >= spec.expire_length
            assert w.grudge_dict()[w.target] == frozenset(ZKS)
        if w.kind == "kill-writer":
            assert w.target == "writer"
        if w.kind in AUDITOR_KINDS:  # resolved to a bookie only when the window opens
            assert w.target == "auditor"
            assert not w.grudge
            if w.kind == "expire-auditor":
                assert w.stop - w.start >= spec.expire_length
        if w.kind == "partition":
            nodes = set(w.grudge_dict()) | {m for g in w.grudge_dict().values() for m in g}
            assert nodes <= set(NETWORK)
            assert w.grudge  # a partition that cuts nothing would test nothing
        if wipes and w.start > wipes[0].start:
            assert w.target != wipes[0].target  # the wiped bookie stays out
    for a, b in itertools.combinations(windows, 2):
        overlap = a.start < b.stop and b.start < a.stop
        if overlap:
            assert a.target != b.target, (a, b)
            # Every bookie is down, or any bookie may be the auditor: nothing else on one.
            if {a.kind, b.kind} & (AUDITOR_KINDS | {"power-loss"}):
                assert not {a.target, b.target} & set(BOOKIES), (a, b)
            assert not ({a.kind, b.kind} <= {"partition", "expire", "expire-auditor"}), (a, b)


def test_a_long_schedule_of_all_faults_uses_every_kind_and_shape() -> None:
    windows = schedule(_full(3000), 11)
    assert {w.kind for w in windows} == set(FAULT_KINDS)
    shapes = {w.target.split(":")[0] for w in windows if w.kind == "partition"}
    assert shapes == {"isolate", "halves", "majorities-ring", "bridge", "zk-cut"}
    cut = next(w for w in windows if w.target == "zk-cut").grudge_dict()
    assert cut["client"] == frozenset(ZKS)
    assert {w.to_json()["kind"] for w in windows} == set(FAULT_KINDS)


def test_groups_expand_and_unknown_names_are_named() -> None:
    assert expand_kinds(["disk", "kill"]) == (
        "kill",
        "lose-unsynced",
        "power-loss",
        "flip",
        "truncate",
        "wipe",
    )
    assert expand_kinds(["all"]) == FAULT_KINDS
    with pytest.raises(ValueError, match="meteor"):
        expand_kinds(["meteor"])
