"""Cluster backends, in Jepsen's ``db`` vocabulary: set up, tear down, kill, start, pause.

A backend owns the processes of one campaign run. The runner and the nemesis
talk only to this interface, so that the Docker backend can replace the local
one. Nodes are named ``bookie-<i>``.

The local backend runs the cluster of ``impl.cluster.local`` (a private
ZooKeeper and N bookie processes) on 127.0.0.1. On loopback it injects
process faults only (kill -9, restart, SIGSTOP, SIGCONT); partitions need the
namespace network of :mod:`nemesis.netns` and are refused here with a clear
error rather than silently skipped.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Protocol

from impl.cluster.local import LocalCluster
from impl.cluster.process import log_tail


class FaultNotSupportedError(RuntimeError):
    """This backend cannot inject the requested fault."""


class ClusterBackend(Protocol):
    """What the runner and the nemesis need from a cluster."""

    def setup(self) -> None: ...
    def teardown(self) -> None: ...
    @property
    def zk_connect(self) -> str: ...
    @property
    def bookies(self) -> list[str]: ...
    def kill(self, node: str) -> None: ...
    def start(self, node: str) -> None: ...
    def pause(self, node: str) -> None: ...
    def resume(self, node: str) -> None: ...
    def partition(self, grudge: dict[str, frozenset[str]]) -> None: ...
    def heal(self) -> None: ...
    def logs(self) -> dict[str, str]: ...


class LocalBackend:
    """ZooKeeper and bookies as local processes on 127.0.0.1 (process faults only)."""

    def __init__(self, directory: Path, bookies: int = 5) -> None:
        self.directory = directory
        self.size = bookies
        self.cluster = LocalCluster(directory=directory)

    def setup(self) -> None:
        self.cluster.up(self.size)

    def teardown(self) -> None:
        self.cluster.down()

    @property
    def zk_connect(self) -> str:
        return self.cluster.zk_hosts

    @property
    def bookies(self) -> list[str]:
        return [f"bookie-{b.index}" for b in self.cluster.bookies]

    def _index(self, node: str) -> int:
        prefix, _, number = node.partition("-")
        if prefix != "bookie" or not number.isdigit() or int(number) >= len(self.cluster.bookies):
            raise ValueError(f"no such node {node!r}; the nodes are {self.bookies}")
        return int(number)

    def kill(self, node: str) -> None:
        self.cluster.kill_bookie(self._index(node))

    def start(self, node: str) -> None:
        self.cluster.start_bookie(self._index(node))

    def pause(self, node: str) -> None:
        self.cluster.signal_bookie(self._index(node), signal.SIGSTOP)

    def resume(self, node: str) -> None:
        self.cluster.signal_bookie(self._index(node), signal.SIGCONT)

    def partition(self, grudge: dict[str, frozenset[str]]) -> None:
        raise FaultNotSupportedError(
            "the loopback backend cannot partition nodes; partitions need each node in its "
            "own network namespace (nemesis.netns), which this backend does not use yet"
        )

    def heal(self) -> None:
        """Nothing to heal on loopback: there are no partitions."""

    def logs(self) -> dict[str, str]:
        return {f"bookie-{b.index}": log_tail(b.log_path, 200) for b in self.cluster.bookies}
