"""Fault schedules as pure data: which fault hits which node, when, and for how long.

Jepsen's generators are pure, composable descriptions of what to do; here a
schedule is a list of :class:`FaultWindow` computed from a seed before the run
starts, so that a run can be printed, inspected and reproduced from its seed
alone. The runner only walks the list in real time.

A window is one fault from ``start`` to ``stop`` seconds into the run. The
kinds, and what happens at the window's start and stop:

- ``kill``: kill -9 a bookie or a ZooKeeper server; restart it at ``stop``.
- ``pause``: SIGSTOP a bookie or a ZooKeeper server; SIGCONT at ``stop``.
- ``partition``: a grudge over the network's nodes in one of Jepsen's shapes
  (isolate one node, halves, a ring of majorities, a bridge, or the clients
  cut from ZooKeeper); healed at ``stop``.
- ``expire``: a bookie's ZooKeeper session expires (cut from every ZooKeeper
  server, or paused on loopback, for longer than the session timeout); the
  window lasts at least ``expire_length``.
- ``lose-unsynced``: kill -9 a bookie and drop every write it had not
  fsynced (a machine crash, on lazyfs); restart at ``stop``.
- ``power-loss``: the same for every bookie at once.
- ``kill-writer``: kill -9 a writer process of the workload (its ledger is
  left open with adds in flight; the workload starts a new writer process).
- ``kill-auditor``, ``expire-auditor``: the same as ``kill`` and ``expire``, aimed
  at whichever bookie is the elected auditor when the window starts (the target
  is the symbol ``auditor``; the nemesis resolves it through the election and
  records which node it hit), so that every run with them forces an auditor
  failover while ledgers need repair.
- ``flip``, ``truncate``, ``wipe``: disk corruption, all on one *victim*
  bookie per run (one disk failure: the replication factor covers it):
  flip bytes in an entry log while it runs; kill it, cut its journal's tail
  and restart it; kill it, wipe its disk and try to restart it (its cookie
  must make it refuse; it stays out for the rest of the run, so no window
  after a wipe names the victim; at most one wipe, in the run's second half).

The composition rules: windows that claim the same resource (a node; every
bookie for ``power-loss``; the network for ``partition`` and ``expire``)
never overlap, at most ``max_concurrent`` windows are open at once (so that
an ensemble keeps enough live bookies to make progress), and every window
closes before the safety phase ends, so that the heal phase starts from a
whole cluster.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from nemesis.partition import bridge, complete_grudge, halves, isolate, majorities_ring

FAULT_KINDS = (
    "kill",
    "pause",
    "partition",
    "expire",
    "lose-unsynced",
    "power-loss",
    "kill-writer",
    "kill-auditor",
    "expire-auditor",
    "flip",
    "truncate",
    "wipe",
)
DEFAULT_KINDS = ("kill", "pause")
# Names the command line accepts for several kinds at once.
FAULT_GROUPS: dict[str, tuple[str, ...]] = {
    "process": ("kill", "pause", "kill-writer"),
    "disk": ("lose-unsynced", "power-loss", "flip", "truncate", "wipe"),
    "corrupt": ("flip", "truncate", "wipe"),
    "autorecovery": ("kill-auditor", "expire-auditor"),
    "all": FAULT_KINDS,
}
# Kinds that destroy data a bookie had fsynced: they hit one victim bookie per run.
VICTIM_KINDS = frozenset({"flip", "truncate", "wipe"})
# Kinds aimed at the elected auditor, resolved when the window starts.
AUDITOR_KINDS = frozenset({"kill-auditor", "expire-auditor"})
AUDITOR = "auditor"
PARTITION_SHAPES = ("isolate", "halves", "majorities-ring", "bridge", "zk-cut")

Grudge = tuple[tuple[str, tuple[str, ...]], ...]  # hashable: node -> nodes it drops


def expand_kinds(names: Sequence[str]) -> tuple[str, ...]:
    """Fault kinds named directly or through a group, in FAULT_KINDS order."""
    wanted: set[str] = set()
    for name in names:
        wanted.update(FAULT_GROUPS.get(name, (name,)))
    unknown = sorted(wanted - set(FAULT_KINDS))
    if unknown:
        raise ValueError(
            f"unknown fault kind(s) {unknown}; known: {', '.join(FAULT_KINDS)} "
            f"and the groups {', '.join(FAULT_GROUPS)}"
        )
    return tuple(k for k in FAULT_KINDS if k in wanted)


@dataclass(frozen=True, order=True)
class FaultWindow:
    """One fault on one target, between two instants of the run (seconds)."""

    start: float
    stop: float
    kind: str
    target: str
    grudge: Grudge = ()  # partitions and session expiry: who drops whose packets

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "start": round(self.start, 3),
            "stop": round(self.stop, 3),
            "kind": self.kind,
            "target": self.target,
        }
        if self.grudge:
            out["grudge"] = {n: list(g) for n, g in self.grudge}
        return out

    def grudge_dict(self) -> dict[str, frozenset[str]]:
        return {n: frozenset(g) for n, g in self.grudge}


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


def freeze_grudge(grudge: dict[str, frozenset[str]]) -> Grudge:
    """A grudge as hashable, ordered data (nodes that drop nothing left out)."""
    return tuple(sorted((n, tuple(sorted(g))) for n, g in grudge.items() if g))


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


def _claims(spec: ScheduleSpec, kind: str, target: str) -> frozenset[str]:
    if kind == "power-loss":
        return frozenset(spec.targets)
    if kind in AUDITOR_KINDS:  # any bookie may turn out to be the auditor
        return frozenset(spec.targets) | ({"network"} if kind == "expire-auditor" else set())
    if kind == "partition":
        return frozenset({"network"})
    if kind == "expire":
        return frozenset({target, "network"})
    return frozenset({target})


def schedule(spec: ScheduleSpec, seed: int) -> list[FaultWindow]:
    """The fault windows of one run, sorted by start; the same seed gives the same list."""
    if not spec.kinds or not spec.targets:
        return []
    rng = random.Random(seed)
    victim = rng.choice(spec.targets)
    wiped = False
    windows: list[FaultWindow] = []
    t = rng.expovariate(1 / spec.mean_interval)
    while t < spec.duration - spec.min_length:
        length = rng.uniform(spec.min_length, spec.max_length)
        kind = rng.choice(spec.kinds)
        if kind in ("expire", "expire-auditor"):
            length = max(length, spec.expire_length)
        stop = min(t + length, spec.duration)
        grudge: Grudge = ()
        candidates: Sequence[str]
        if kind in ("kill", "pause"):
            candidates = [*spec.targets, *spec.zookeepers]
        elif kind in VICTIM_KINDS:
            candidates = [victim]
        elif kind == "partition":
            candidates = ["network"]
        elif kind == "power-loss":
            candidates = ["bookies"]
        elif kind in AUDITOR_KINDS:
            candidates = [AUDITOR]
        elif kind == "kill-writer":
            candidates = ["writer"]
        else:
            candidates = list(spec.targets)
        if wiped:
            candidates = [c for c in candidates if c != victim]
        open_now = [w for w in windows if w.start <= t < w.stop]
        busy = frozenset().union(*(_claims(spec, w.kind, w.target) for w in open_now))
        free = [c for c in candidates if not _claims(spec, kind, c) & busy]
        expiring = kind in ("expire", "expire-auditor")
        fits = (not expiring or stop - t >= spec.expire_length) and (
            # A wipe takes the victim out for good: only in the second half, so that
            # its other disk faults get their turn first.
            kind != "wipe" or t >= spec.duration / 2
        )
        if len(open_now) < spec.max_concurrent and free and fits:
            # Exact floats: rounding a start up past the next instant would let
            # two windows of one target overlap.
            target = rng.choice(free)
            if kind == "partition":
                shaped = _grudge(spec, rng)
                if shaped is not None:
                    target, grudge = shaped
                    windows.append(FaultWindow(t, stop, kind, target, grudge))
            elif kind == "expire" and spec.zookeepers:
                cut = complete_grudge([[target], list(spec.zookeepers)])
                windows.append(FaultWindow(t, stop, kind, target, freeze_grudge(cut)))
            else:
                windows.append(FaultWindow(t, stop, kind, target))
                wiped = wiped or kind == "wipe"
        t += rng.expovariate(1 / spec.mean_interval)
    return sorted(windows)
