"""Fault schedules as pure data: which fault hits which node, when, and for how long.

Jepsen's generators are pure, composable descriptions of what to do; here a
schedule is a list of :class:`FaultWindow` computed from a seed before the run
starts, so that a run can be printed, inspected and reproduced from its seed
alone. The runner only walks the list in real time.

A window is one fault from ``start`` to ``stop`` seconds into the run (kill a
bookie and restart it at ``stop``; pause it and resume it at ``stop``). The
composition rules: windows of one target never overlap, at most
``max_concurrent`` windows are open at once (so that an ensemble keeps
enough live bookies to make progress), and every window closes before the
safety phase ends, so that the heal phase starts from a whole cluster.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

FAULT_KINDS = ("kill", "pause")


@dataclass(frozen=True, order=True)
class FaultWindow:
    """One fault on one target, between two instants of the run (seconds)."""

    start: float
    stop: float
    kind: str
    target: str

    def to_json(self) -> dict[str, object]:
        return {
            "start": round(self.start, 3),
            "stop": round(self.stop, 3),
            "kind": self.kind,
            "target": self.target,
        }


@dataclass(frozen=True)
class ScheduleSpec:
    """What a schedule may contain; the seed decides the rest."""

    duration: float  # seconds of the safety phase
    kinds: tuple[str, ...] = FAULT_KINDS
    targets: tuple[str, ...] = ()
    mean_interval: float = 4.0  # mean seconds between fault starts (exponential)
    min_length: float = 1.0  # seconds a fault lasts at least
    max_length: float = 6.0
    max_concurrent: int = 1

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kind(s) {sorted(unknown)}; known: {FAULT_KINDS}")
        if not 0 < self.min_length <= self.max_length:
            raise ValueError("need 0 < min_length <= max_length")
        if self.max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")


def schedule(spec: ScheduleSpec, seed: int) -> list[FaultWindow]:
    """The fault windows of one run, sorted by start; the same seed gives the same list."""
    if not spec.kinds or not spec.targets:
        return []
    rng = random.Random(seed)
    windows: list[FaultWindow] = []
    t = rng.expovariate(1 / spec.mean_interval)
    while t < spec.duration - spec.min_length:
        length = min(rng.uniform(spec.min_length, spec.max_length), spec.duration - t)
        open_now = [w for w in windows if w.start <= t < w.stop]
        busy = {w.target for w in open_now}
        free: Sequence[str] = [x for x in spec.targets if x not in busy]
        if len(open_now) < spec.max_concurrent and free:
            # Exact floats: rounding a start up past the next instant would let
            # two windows of one target overlap.
            stop = min(t + length, spec.duration)
            windows.append(FaultWindow(t, stop, rng.choice(spec.kinds), rng.choice(free)))
        t += rng.expovariate(1 / spec.mean_interval)
    return sorted(windows)
