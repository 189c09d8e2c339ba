"""Cluster backends, in Jepsen's ``db`` vocabulary: set up, tear down, kill, start, pause.

A backend owns the processes of one campaign run. The runner and the nemesis
talk only to this interface, so that backends can replace each other: the
local one here (loopback), the namespace one (:mod:`nemesis.db_netns`, each
node in its own network namespace, partitions, lazyfs) and, later, Docker.
Bookies are named ``bookie-<i>``, ZooKeeper servers ``zk<i>``, the workload's
node ``client``.

The local backend runs the cluster of ``impl.cluster.local`` (a private
ZooKeeper and N bookie processes) on 127.0.0.1. On loopback it injects
process faults (kill -9, restart, SIGSTOP, SIGCONT; a session expiry is a
pause longer than the session timeout) and disk corruption (flipped bytes,
a cut journal tail, a wiped disk); partitions need the namespace network and
are refused here with a clear error rather than silently skipped.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from impl.cluster.local import ClusterError, LocalCluster
from impl.cluster.process import log_tail
from impl.meta import layout
from nemesis import disk

if TYPE_CHECKING:
    from kazoo.client import KazooClient

T = TypeVar("T")

# A bookie's ZooKeeper session timeout in campaigns (zkTimeout, ms): short, so
# that session expiry faults fit in a run.
BOOKIE_SESSION_MS = 4000

# AutoRecovery inside every bookie process, with waits short enough for a campaign:
# the open-ledger grace period, the worker's back-off, and a periodic ledger check.
AUTORECOVERY_SETTINGS: dict[str, object] = {
    "autoRecoveryDaemonEnabled": True,
    "openLedgerRereplicationGracePeriod": 10000,
    "rwRereplicateBackoffMs": 1000,
    "auditorPeriodicCheckInterval": 30,
}


def bookie_settings(autorecovery: bool) -> dict[str, object]:
    """Bookie config parameters every backend sets."""
    return {"zkTimeout": BOOKIE_SESSION_MS, **(AUTORECOVERY_SETTINGS if autorecovery else {})}


class FaultNotSupportedError(RuntimeError):
    """This backend cannot inject the requested fault."""


class NodeRefusedError(RuntimeError):
    """A node exited while starting, on purpose (a bookie whose cookie does not match)."""


class ClusterBackend(Protocol):
    """What the runner and the nemesis need from a cluster."""

    @property
    def name(self) -> str: ...
    @property
    def fault_kinds(self) -> frozenset[str]: ...
    @property
    def session_timeout(self) -> float:
        """Seconds after which a silent bookie's ZooKeeper session expires."""
        ...

    def setup(self) -> None: ...
    def teardown(self) -> None: ...
    @property
    def zk_connect(self) -> str: ...
    @property
    def bookies(self) -> list[str]: ...
    @property
    def zookeepers(self) -> list[str]:
        """ZooKeeper servers the nemesis may kill or pause (none for a standalone server)."""
        ...

    @property
    def network(self) -> list[str]:
        """Nodes a partition may separate (none without a network of namespaces)."""
        ...

    @property
    def clients(self) -> list[str]: ...
    def kill(self, node: str) -> None: ...
    def start(self, node: str) -> None:
        """Restart a killed node; NodeRefusedError if it refuses to (and stays down)."""
        ...

    def pause(self, node: str) -> None: ...
    def resume(self, node: str) -> None: ...
    def partition(self, grudge: Mapping[str, frozenset[str]]) -> None: ...
    def heal(self) -> None: ...
    def lose_unsynced(self, node: str) -> None:
        """Kill -9 a bookie and drop every write it had not fsynced (a machine crash)."""
        ...

    def corrupt(self, node: str, kind: str, rng: random.Random) -> str:
        """``flip`` bytes of a running bookie's entry log; for ``truncate`` and ``wipe``
        kill it first. Returns what was done."""
        ...

    def run_client(self, fn: Callable[[], T]) -> T:
        """Call ``fn`` where the workload's clients live (their network namespace)."""
        ...

    def logs(self) -> dict[str, str]: ...
    def bookie_configs(self) -> dict[str, Path]:
        """Each bookie's config file, for dumping what it stores once it is stopped."""
        ...


class LocalBackend:
    """ZooKeeper and bookies as local processes on 127.0.0.1 (no partitions)."""

    name = "local"
    fault_kinds = frozenset(
        {
            "kill",
            "pause",
            "expire",
            "kill-writer",
            "kill-auditor",
            "expire-auditor",
            "flip",
            "truncate",
            "wipe",
        }
    )

    def __init__(self, directory: Path, bookies: int = 5, *, autorecovery: bool = True) -> None:
        self.directory = directory
        self.size = bookies
        self.cluster = LocalCluster(
            directory=directory, bookie_overrides=bookie_settings(autorecovery)
        )

    @property
    def session_timeout(self) -> float:
        return BOOKIE_SESSION_MS / 1000

    def setup(self) -> None:
        self.cluster.up(self.size)

    def teardown(self) -> None:
        for b in self.cluster.bookies:  # a stopped process cannot take SIGTERM
            self.cluster.signal_bookie(b.index, signal.SIGCONT)
        self.cluster.down()

    @property
    def zk_connect(self) -> str:
        return self.cluster.zk_hosts

    @property
    def bookies(self) -> list[str]:
        return [f"bookie-{b.index}" for b in self.cluster.bookies]

    @property
    def zookeepers(self) -> list[str]:
        return []

    @property
    def network(self) -> list[str]:
        return []

    @property
    def clients(self) -> list[str]:
        return []

    def _index(self, node: str) -> int:
        prefix, _, number = node.partition("-")
        if prefix != "bookie" or not number.isdigit() or int(number) >= len(self.cluster.bookies):
            raise ValueError(f"no such node {node!r}; the nodes are {self.bookies}")
        return int(number)

    def kill(self, node: str) -> None:
        self.cluster.kill_bookie(self._index(node))

    def start(self, node: str) -> None:
        try:
            self.cluster.start_bookie(self._index(node))
        except ClusterError as e:
            if "refusing to start" in str(e):
                raise NodeRefusedError(str(e)) from e
            raise

    def pause(self, node: str) -> None:
        self.cluster.signal_bookie(self._index(node), signal.SIGSTOP)

    def resume(self, node: str) -> None:
        self.cluster.signal_bookie(self._index(node), signal.SIGCONT)

    def partition(self, grudge: Mapping[str, frozenset[str]]) -> None:
        raise FaultNotSupportedError(
            "the loopback backend cannot partition nodes; partitions need each node in its "
            "own network namespace: use --backend netns (as root)"
        )

    def heal(self) -> None:
        """Nothing to heal on loopback: there are no partitions."""

    def lose_unsynced(self, node: str) -> None:
        raise FaultNotSupportedError(
            "the loopback backend keeps bookie data on the host's filesystem, where a killed "
            "process loses nothing; losing unsynced writes needs lazyfs: use --backend netns"
        )

    def corrupt(self, node: str, kind: str, rng: random.Random) -> str:
        b = self.cluster.bookies[self._index(node)]
        d = Path(b.directory)
        if kind == "flip":
            return disk.flip_bytes(d / "ledgers", rng)
        self.kill(node)
        if kind == "truncate":
            return disk.truncate_tail(d / "journal", rng)
        if kind == "wipe":
            return disk.wipe([d / "journal", d / "ledgers"])
        raise ValueError(f"unknown disk fault {kind!r}")

    def run_client(self, fn: Callable[[], T]) -> T:
        return fn()

    def logs(self) -> dict[str, str]:
        return {f"bookie-{b.index}": log_tail(b.log_path, 200) for b in self.cluster.bookies}

    def bookie_configs(self) -> dict[str, Path]:
        return {f"bookie-{b.index}": b.config_path for b in self.cluster.bookies}


def registration_owners(
    admin: KazooClient, root: str, ports: Mapping[str, int], names: list[str]
) -> dict[str, int]:
    """The session that registered each of ``names`` (bookies serving 127.0.0.1:<port>),
    writable or read-only; a name is missing while its bookie is not registered."""
    out: dict[str, int] = {}
    for name in names:
        bid = f"127.0.0.1:{ports[name]}"
        for path in (layout.available(root), layout.readonly(root)):
            stat = admin.exists(f"{path}/{bid}")
            if stat is not None:
                out[name] = int(stat.ephemeralOwner)
    return out
