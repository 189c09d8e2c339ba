"""Cluster backends, in Jepsen's ``db`` vocabulary: set up, tear down, kill, start, pause.

A backend owns the processes of one campaign run. The runner and the nemesis
talk only to :class:`~nemesis.backends.base.Backend` and to the capabilities
a backend has (:mod:`bkref.nemesis.backends.capabilities`), so that backends can
replace each other:

- ``local`` (:mod:`bkref.nemesis.backends.local`): loopback processes; kill,
  pause, disk corruption.
- ``netns`` (:mod:`bkref.nemesis.backends.netns`): each node in its own network
  namespace; also partitions, and with bookie data on lazyfs (the default)
  crashes that lose unsynced writes.
- ``docker`` (:mod:`bkref.nemesis.backends.docker`): each node a container of the
  private engine; the same capabilities as ``netns``.

This module imports none of them until :func:`make_backend` is called (the
Docker one needs python-on-whales).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bkref.nemesis.backends.base import Backend

BACKENDS = ("local", "netns", "docker")


def backend_class(kind: str, *, lazyfs: bool) -> type[Backend]:
    """The class of backend ``kind`` (its bookies on lazyfs where it has them and
    ``lazyfs`` asks for it): the command line asks it what it can perform."""
    if kind == "local":
        from bkref.nemesis.backends.local import LocalBackend

        return LocalBackend
    if kind == "netns":
        from bkref.nemesis.backends.netns import LazyfsNamespaceBackend, NamespaceBackend

        return LazyfsNamespaceBackend if lazyfs else NamespaceBackend
    if kind == "docker":
        from bkref.nemesis.backends.docker import DockerBackend, LazyfsDockerBackend

        return LazyfsDockerBackend if lazyfs else DockerBackend
    raise ValueError(f"unknown backend {kind!r}; known: {', '.join(BACKENDS)}")


def make_backend(
    kind: str,
    directory: Path,
    bookies: int,
    *,
    lazyfs: bool = True,
    plants: frozenset[str] = frozenset(),
    autorecovery: bool = True,
    trace_dir: Path | None = None,
) -> Backend:
    """A backend of ``kind`` for one run, its cluster under ``directory``."""
    cls = backend_class(kind, lazyfs=lazyfs)
    return cls(directory, bookies, plants=plants, autorecovery=autorecovery, trace_dir=trace_dir)
