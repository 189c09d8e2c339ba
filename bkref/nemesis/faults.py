# need(backend, Pausable) passes a protocol class as type[C], which mypy would refuse.
# mypy: disable-error-code="type-abstract"
"""The fault kinds: one record each, the only place a fault is described.

A :class:`Fault` says what a fault does and claims, which nodes it may aim
at, how long it lasts at least, what a backend needs to perform it, and how
the nemesis starts and stops it. Everything else reads :data:`FAULTS`: the
generator (targets, claims, lengths: :mod:`bkref.nemesis.generator`), the nemesis
(start and stop: :mod:`bkref.nemesis.nemesis`), the command line (names, groups,
which backend can perform which kind), the checks (which kinds destroy synced
data, which refusals to restart are expected) and the report (colours). A new
fault kind is a new record here, and the methods of the backends that can
perform it (:mod:`bkref.nemesis.backends.capabilities`).

The kinds, and what happens at a window's start and stop:

- ``kill``: kill -9 a bookie or a ZooKeeper server; restart it at stop.
- ``pause``: SIGSTOP a bookie or a ZooKeeper server; SIGCONT at stop.
- ``partition``: a grudge over the network's nodes in one of Jepsen's shapes
  (isolate one node, halves, a ring of majorities, a bridge, or the clients
  cut from ZooKeeper); healed at stop.
- ``expire``: a bookie's ZooKeeper session expires (cut from every ZooKeeper
  server, or paused where there is no network of nodes, for longer than the
  session timeout).
- ``lose-unsynced``: kill -9 a bookie and drop every write it had not fsynced
  (a machine crash, on lazyfs); restart at stop.
- ``power-loss``: the same for every bookie at once; they restart together.
- ``kill-writer``: kill -9 a writer process of the workload (its ledger is
  left open with adds in flight; the workload starts a new writer process).
- ``kill-auditor``, ``expire-auditor``: ``kill`` and ``expire`` aimed at
  whichever bookie is the elected auditor when the window starts (the target
  is the symbol ``auditor``; the nemesis resolves it through the election and
  records which node it hit), so that every run with them forces an auditor
  failover while ledgers need repair.
- ``flip``, ``truncate``, ``wipe``: disk corruption, all on one *victim*
  bookie per run (one disk failure: the replication factor covers it): flip
  bytes in an entry log while it runs; kill it, cut its journal's tail and
  restart it; kill it, wipe its disk and try to restart it (its cookie must
  make it refuse; it stays out for the rest of the run).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from bkref.nemesis.backends.capabilities import (
    DiskFaults,
    LosesUnsynced,
    Partitionable,
    Pausable,
    ProcessControl,
    need,
)
from bkref.nemesis.partition import complete_grudge

Grudge = tuple[tuple[str, tuple[str, ...]], ...]  # hashable: node -> nodes it drops
AUDITOR = "auditor"  # the target of auditor windows until the nemesis resolves it


def freeze_grudge(grudge: dict[str, frozenset[str]]) -> Grudge:
    """A grudge as hashable, ordered data (nodes that drop nothing left out)."""
    return tuple(sorted((n, tuple(sorted(g))) for n, g in grudge.items() if g))


def cut_from(node: str, others: Sequence[str]) -> Grudge:
    """``node`` and ``others`` drop each other's packets (a session expiry's grudge)."""
    return freeze_grudge(complete_grudge([[node], list(others)]))


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


class Aim(Enum):
    """What a fault's window may name as its target (and so, what it claims)."""

    NODE = "a bookie or a ZooKeeper server"
    BOOKIE = "a bookie"
    VICTIM = "the run's victim bookie (the one disk that fails)"
    NETWORK = "the network (the window names the partition's shape)"
    EVERY_BOOKIE = "every bookie at once"
    AUDITOR = "the elected auditor, resolved when the window starts (any bookie)"
    WRITER = "a writer process of the workload"


class Shape(Enum):
    """The grudge a window carries, drawn by the generator."""

    NONE = "no grudge"
    PARTITION = "one of Jepsen's partition shapes over the network"
    CUT_FROM_ZOOKEEPER = "the target cut from every ZooKeeper server (where there are some)"


class Hands(Protocol):
    """What a fault's start and stop act through: the nemesis (:mod:`bkref.nemesis.nemesis`)."""

    @property
    def backend(self) -> object: ...
    @property
    def rng(self) -> random.Random: ...
    def kill_writer(self) -> int | None:
        """kill -9 a writer process of the workload; its pid, or None if none runs."""
        ...

    def restart(self, node: str) -> dict[str, Any]:
        """Start ``node`` again, unless it refused to start earlier in the run."""
        ...

    def restart_together(self, nodes: Sequence[str], w: FaultWindow) -> dict[str, Any]:
        """Start ``nodes`` at once (the machines come back together after a power cut)."""
        ...

    def live_bookies(self) -> list[str]:
        """The bookies that have not refused to start."""
        ...


Action = Callable[[Hands, FaultWindow], dict[str, Any]]


def _nothing(_: Hands, __: FaultWindow) -> dict[str, Any]:
    return {}


def _kill(h: Hands, w: FaultWindow) -> dict[str, Any]:
    need(h.backend, ProcessControl).kill(w.target)
    return {}


def _restart(h: Hands, w: FaultWindow) -> dict[str, Any]:
    return h.restart(w.target)


def _pause(h: Hands, w: FaultWindow) -> dict[str, Any]:
    need(h.backend, Pausable).pause(w.target)
    return {}


def _resume(h: Hands, w: FaultWindow) -> dict[str, Any]:
    need(h.backend, Pausable).resume(w.target)
    return {}


def _partition(h: Hands, w: FaultWindow) -> dict[str, Any]:
    need(h.backend, Partitionable).partition(w.grudge_dict())
    return {}


def _heal(h: Hands, w: FaultWindow) -> dict[str, Any]:
    need(h.backend, Partitionable).heal()
    return {}


def _expire(h: Hands, w: FaultWindow) -> dict[str, Any]:
    # Cut from ZooKeeper where there is a network of nodes; else paused past the session.
    return _partition(h, w) if w.grudge else _pause(h, w)


def _unexpire(h: Hands, w: FaultWindow) -> dict[str, Any]:
    return _heal(h, w) if w.grudge else _resume(h, w)


def _lose_unsynced(h: Hands, w: FaultWindow) -> dict[str, Any]:
    need(h.backend, LosesUnsynced).lose_unsynced(w.target)
    return {}


def _power_cut(h: Hands, w: FaultWindow) -> dict[str, Any]:
    disks = need(h.backend, LosesUnsynced)
    for node in h.live_bookies():
        disks.lose_unsynced(node)
    return {}


def _power_back(h: Hands, w: FaultWindow) -> dict[str, Any]:
    return h.restart_together(h.live_bookies(), w)


def _kill_writer(h: Hands, w: FaultWindow) -> dict[str, Any]:
    pid = h.kill_writer()  # the workload starts another writer by itself
    return {"pid": pid} if pid else {"skipped": "no writer process"}


def _corrupt(h: Hands, w: FaultWindow) -> dict[str, Any]:
    return {"did": need(h.backend, DiskFaults).corrupt(w.target, w.kind, h.rng)}


@dataclass(frozen=True)
class Fault:
    """One fault kind: what it does, what it claims, and how it is done and undone."""

    name: str
    does: str  # one line: what its window's start and stop do
    aim: Aim
    start: Action
    stop: Action = _nothing
    needs: tuple[type, ...] = ()  # capabilities a backend must have (backends.capabilities)
    # The window also claims the network: no other window that claims it may overlap.
    claims_network: bool = False
    # The window outlasts a bookie's ZooKeeper session (ScheduleSpec.expire_length).
    outlasts_session: bool = False
    shape: Shape = Shape.NONE
    # The target stays down for the rest of the run (its restart is refused, as expected):
    # only in the run's second half, so that the target's other faults get their turn
    # first, and no later window names it.
    out_for_good: bool = False
    groups: tuple[str, ...] = ()  # command-line names for several kinds at once
    colour: str = "#bdbdbd"  # of its windows in the report's charts

    @property
    def destroys_synced_data(self) -> bool:
        """It destroys data a bookie had fsynced: Wq = Aq cannot cover it."""
        return self.aim is Aim.VICTIM

    def performable_by(self, backend: object) -> bool:
        """True if ``backend`` (an instance, or a class before any cluster exists) has
        every capability this fault needs."""
        cls = backend if isinstance(backend, type) else type(backend)
        return all(issubclass(cls, c) for c in self.needs)


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "kill",
            "kill -9 a bookie or a ZooKeeper server; restart it at the window's end",
            Aim.NODE,
            _kill,
            _restart,
            needs=(ProcessControl,),
            groups=("process",),
            colour="#e57373",
        ),
        Fault(
            "pause",
            "SIGSTOP a bookie or a ZooKeeper server; SIGCONT at the window's end",
            Aim.NODE,
            _pause,
            _resume,
            needs=(Pausable,),
            groups=("process",),
            colour="#ffb74d",
        ),
        Fault(
            "partition",
            "a grudge over the network's nodes in one of Jepsen's shapes; healed at the end",
            Aim.NETWORK,
            _partition,
            _heal,
            needs=(Partitionable,),
            claims_network=True,
            shape=Shape.PARTITION,
            colour="#64b5f6",
        ),
        Fault(
            "expire",
            "a bookie's ZooKeeper session expires: cut from every ZooKeeper server (paused "
            "where there is no network of nodes) for longer than the session timeout",
            Aim.BOOKIE,
            _expire,
            _unexpire,
            needs=(Pausable,),  # and Partitionable wherever the cluster has ZooKeeper nodes
            claims_network=True,
            outlasts_session=True,
            shape=Shape.CUT_FROM_ZOOKEEPER,
            colour="#9575cd",
        ),
        Fault(
            "lose-unsynced",
            "kill -9 a bookie and drop every write it had not fsynced; restart at the end",
            Aim.BOOKIE,
            _lose_unsynced,
            _restart,
            needs=(LosesUnsynced,),
            groups=("disk",),
            colour="#f06292",
        ),
        Fault(
            "power-loss",
            "lose-unsynced for every bookie at once; they restart together at the end",
            Aim.EVERY_BOOKIE,
            _power_cut,
            _power_back,
            needs=(LosesUnsynced,),
            groups=("disk",),
            colour="#d32f2f",
        ),
        Fault(
            "kill-writer",
            "kill -9 a writer process of the workload, which starts another",
            Aim.WRITER,
            _kill_writer,
            groups=("process",),
            colour="#90a4ae",
        ),
        Fault(
            "kill-auditor",
            "kill aimed at the elected auditor",
            Aim.AUDITOR,
            _kill,
            _restart,
            needs=(ProcessControl,),
            groups=("autorecovery",),
            colour="#ef9a9a",
        ),
        Fault(
            "expire-auditor",
            "expire aimed at the elected auditor",
            Aim.AUDITOR,
            _expire,
            _unexpire,
            needs=(Pausable,),
            claims_network=True,
            outlasts_session=True,
            shape=Shape.CUT_FROM_ZOOKEEPER,
            groups=("autorecovery",),
            colour="#b39ddb",
        ),
        Fault(
            "flip",
            "flip bytes in the victim's entry log while it runs",
            Aim.VICTIM,
            _corrupt,
            needs=(DiskFaults,),
            groups=("disk", "corrupt"),
            colour="#a1887f",
        ),
        Fault(
            "truncate",
            "kill the victim, cut its journal's tail; restart it at the end",
            Aim.VICTIM,
            _corrupt,
            _restart,
            needs=(DiskFaults, ProcessControl),
            groups=("disk", "corrupt"),
            colour="#8d6e63",
        ),
        Fault(
            "wipe",
            "kill the victim, wipe its disk; at the end it must refuse to start (its cookie)",
            Aim.VICTIM,
            _corrupt,
            _restart,
            needs=(DiskFaults, ProcessControl),
            out_for_good=True,
            groups=("disk", "corrupt"),
            colour="#5d4037",
        ),
    )
}
FAULT_KINDS = tuple(FAULTS)
DEFAULT_KINDS = ("kill", "pause")
# Names the command line accepts for several kinds at once.
FAULT_GROUPS: dict[str, tuple[str, ...]] = {
    **{
        group: tuple(f.name for f in FAULTS.values() if group in f.groups)
        for group in dict.fromkeys(g for f in FAULTS.values() for g in f.groups)
    },
    "all": FAULT_KINDS,
}
# Kinds that destroy data a bookie had fsynced: they hit one victim bookie per run.
VICTIM_KINDS = frozenset(f.name for f in FAULTS.values() if f.destroys_synced_data)
# Kinds aimed at the elected auditor, resolved when the window starts.
AUDITOR_KINDS = frozenset(f.name for f in FAULTS.values() if f.aim is Aim.AUDITOR)


def fault(kind: str) -> Fault:
    """The record of ``kind``; ValueError naming the known kinds if there is none."""
    try:
        return FAULTS[kind]
    except KeyError:
        raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}") from None


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


def performable(backend: object) -> frozenset[str]:
    """The fault kinds ``backend`` (an instance or a class) can perform."""
    return frozenset(f.name for f in FAULTS.values() if f.performable_by(backend))
