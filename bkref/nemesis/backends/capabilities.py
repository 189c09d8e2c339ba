"""What a backend can do to its nodes, one small protocol per capability.

Jepsen's ``db`` protocols split a database's abilities the same way (``DB``:
setup and teardown; ``Kill``: kill and start; ``Pause``: pause and resume):
a backend implements the ones it can perform, and a fault needs the ones its
record names (:mod:`bkref.nemesis.faults`). Every protocol is runtime-checkable and
has methods only, so that both ``isinstance(backend, Pausable)`` and
``issubclass(NamespaceBackend, Pausable)`` answer (the command line asks the
class, before any cluster exists).

Every backend can kill, restart and corrupt its bookies; pausing, partitions
and losing unsynced writes depend on the backend (and, for the last, on where
its bookies keep their data).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Protocol, TypeVar, runtime_checkable

C = TypeVar("C")


class FaultNotSupportedError(RuntimeError):
    """This backend cannot inject the requested fault."""


@runtime_checkable
class ProcessControl(Protocol):
    """kill -9 a node's process and start it again."""

    def kill(self, node: str) -> None: ...

    def start(self, node: str) -> None:
        """Restart a killed node; NodeRefusedError if it refuses to (and stays down)."""
        ...


@runtime_checkable
class Pausable(Protocol):
    """Freeze a node's process (SIGSTOP, the freezer cgroup) and thaw it."""

    def pause(self, node: str) -> None: ...

    def resume(self, node: str) -> None: ...


@runtime_checkable
class Partitionable(Protocol):
    """Drop packets between nodes (a grudge: node -> the nodes it drops), and heal."""

    def partition(self, grudge: Mapping[str, frozenset[str]]) -> None: ...

    def heal(self) -> None:
        """End every partition and resume every paused node."""
        ...


@runtime_checkable
class DiskFaults(Protocol):
    """Destroy data a bookie had fsynced."""

    def corrupt(self, node: str, kind: str, rng: random.Random) -> str:
        """``flip`` bytes of a running bookie's entry log; for ``truncate`` (cut its
        journal's tail) and ``wipe`` (empty its disk) kill it first. Returns what was done.
        """
        ...


@runtime_checkable
class LosesUnsynced(Protocol):
    """Crash a bookie's machine: its data is on lazyfs, whose daemon plays the machine's
    page cache. A kill -9 of the bookie alone keeps the page cache (what the bookie had
    written, fsynced or not, survives); ``lose_unsynced`` kills the bookie and then drops
    every write it had not fsynced, as a power cut would. The same on every backend that
    has it; a backend whose bookies are on plain disks does not have it at all."""

    def lose_unsynced(self, node: str) -> None: ...


def need(backend: object, capability: type[C]) -> C:
    """``backend`` as ``capability``, or FaultNotSupportedError naming what it lacks."""
    if not isinstance(backend, capability):
        name = getattr(backend, "name", type(backend).__name__)
        raise FaultNotSupportedError(
            f"the {name} backend cannot do this: it is not {capability.__name__} "
            f"({(capability.__doc__ or '').splitlines()[0]})"
        )
    return backend
