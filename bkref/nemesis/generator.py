"""Fault schedules as pure data: which fault hits which node, when, and for how long.

Jepsen's generators are pure, composable descriptions of what to do; here a
schedule is a list of :class:`~nemesis.faults.FaultWindow` computed from a
seed before the run starts, so that a run can be printed, inspected and
reproduced from its seed alone. The runner only walks the list in real time.

A window is one fault from ``start`` to ``stop`` seconds into the run. What
each kind does, aims at and claims is its record in :mod:`bkref.nemesis.faults`.

The composition rules: windows that claim the same resource (a node; every
bookie for a fault that aims at every bookie or at the auditor, which may be
any of them; the network for faults that claim it: partitions and session
expiries) never overlap, at most ``max_concurrent`` windows are open at once
(so that an ensemble keeps enough live bookies to make progress), a window
that must outlast a session lasts at least ``expire_length``, faults that
destroy synced data all hit one victim bookie per run, a fault that takes its
target out for good comes only in the run's second half and no window after
it names that target, and every window closes before the safety phase ends,
so that the heal phase starts from a whole cluster.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bkref.nemesis.faults import (
    AUDITOR,
    DEFAULT_KINDS,
    FAULT_KINDS,
    FAULTS,
    Aim,
    Fault,
    FaultWindow,
    Grudge,
    Shape,
    cut_from,
    freeze_grudge,
)
from bkref.nemesis.partition import bridge, complete_grudge, halves, isolate, majorities_ring

PARTITION_SHAPES = ("isolate", "halves", "majorities-ring", "bridge", "zk-cut")


@dataclass(frozen=True)
class ScheduleSpec:
    """What a schedule may contain; the seed decides the rest."""

    duration: float  # seconds of the safety phase
    kinds: tuple[str, ...] = DEFAULT_KINDS
    targets: tuple[str, ...] = ()  # bookies
    zookeepers: tuple[str, ...] = ()  # ZooKeeper servers kill and pause may also hit
    network: tuple[str, ...] = ()  # every node of the network (partitions)
    clients: tuple[str, ...] = ()  # the workload's nodes (zk-cut)
    mean_interval: float = 4.0  # mean seconds between fault starts (exponential)
    min_length: float = 1.0  # seconds a fault lasts at least
    max_length: float = 6.0
    expire_length: float = 8.0  # an expire window lasts at least this (> session timeout)
    max_concurrent: int = 1

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kind(s) {sorted(unknown)}; known: {FAULT_KINDS}")
        if not 0 < self.min_length <= self.max_length:
            raise ValueError("need 0 < min_length <= max_length")
        if self.max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")


def _grudge(spec: ScheduleSpec, rng: random.Random) -> tuple[str, Grudge] | None:
    nodes = list(spec.network)
    shapes = [
        s
        for s in PARTITION_SHAPES
        if (s != "zk-cut" or (spec.clients and spec.zookeepers))
        and (s != "bridge" or len(nodes) >= 3)
    ]
    if len(nodes) < 2 or not shapes:
        return None
    shape = rng.choice(shapes)
    if shape == "isolate":
        node = rng.choice(nodes)
        return f"isolate:{node}", freeze_grudge(isolate(nodes, node))
    if shape == "halves":
        return shape, freeze_grudge(halves(nodes, rng))
    if shape == "majorities-ring":
        return shape, freeze_grudge(majorities_ring(nodes, rng))
    if shape == "bridge":
        return shape, freeze_grudge(bridge(nodes, rng))
    rest = [n for n in nodes if n not in spec.clients and n not in spec.zookeepers]
    return shape, freeze_grudge(complete_grudge([list(spec.clients) + rest, list(spec.zookeepers)]))


def _candidates(spec: ScheduleSpec, f: Fault, victim: str) -> list[str]:
    """The targets a window of ``f`` may name."""
    return {
        Aim.NODE: [*spec.targets, *spec.zookeepers],
        Aim.BOOKIE: list(spec.targets),
        Aim.VICTIM: [victim],
        Aim.NETWORK: ["network"],
        Aim.EVERY_BOOKIE: ["bookies"],
        Aim.AUDITOR: [AUDITOR],
        Aim.WRITER: ["writer"],
    }[f.aim]


def claims(spec: ScheduleSpec, f: Fault, target: str) -> frozenset[str]:
    """What a window of ``f`` on ``target`` holds while it is open."""
    if f.aim is Aim.NETWORK:
        held: frozenset[str] = frozenset()
    elif f.aim in (Aim.EVERY_BOOKIE, Aim.AUDITOR):  # any bookie may turn out to be the auditor
        held = frozenset(spec.targets)
    else:
        held = frozenset({target})
    return held | ({"network"} if f.claims_network else set())


def schedule(spec: ScheduleSpec, seed: int) -> list[FaultWindow]:
    """The fault windows of one run, sorted by start; the same seed gives the same list."""
    if not spec.kinds or not spec.targets:
        return []
    rng = random.Random(seed)
    victim = rng.choice(spec.targets)
    out: str | None = None  # a target taken out for good
    windows: list[FaultWindow] = []
    t = rng.expovariate(1 / spec.mean_interval)
    while t < spec.duration - spec.min_length:
        length = rng.uniform(spec.min_length, spec.max_length)
        f = FAULTS[rng.choice(spec.kinds)]
        if f.outlasts_session:
            length = max(length, spec.expire_length)
        stop = min(t + length, spec.duration)
        candidates = [c for c in _candidates(spec, f, victim) if c != out]
        open_now = [w for w in windows if w.start <= t < w.stop]
        busy = frozenset().union(*(claims(spec, FAULTS[w.kind], w.target) for w in open_now))
        free = [c for c in candidates if not claims(spec, f, c) & busy]
        fits = (not f.outlasts_session or stop - t >= spec.expire_length) and (
            not f.out_for_good or t >= spec.duration / 2
        )
        if len(open_now) < spec.max_concurrent and free and fits:
            # Exact floats: rounding a start up past the next instant would let
            # two windows of one target overlap.
            target = rng.choice(free)
            grudge: Grudge = ()
            if f.shape is Shape.PARTITION:
                shaped = _grudge(spec, rng)
                if shaped is None:
                    t += rng.expovariate(1 / spec.mean_interval)
                    continue
                target, grudge = shaped
            elif f.shape is Shape.CUT_FROM_ZOOKEEPER and f.aim is not Aim.AUDITOR:
                # (an auditor window is cut when the nemesis knows which node it hits)
                grudge = cut_from(target, spec.zookeepers) if spec.zookeepers else ()
            windows.append(FaultWindow(t, stop, f.name, target, grudge))
            if f.out_for_good:
                out = target
        t += rng.expovariate(1 / spec.mean_interval)
    return sorted(windows)
