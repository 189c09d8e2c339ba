"""What every cluster backend shares: its facts, the bookies' settings, corruption, restarts.

A backend owns the processes of one campaign run and speaks Jepsen's ``db``
vocabulary: set up, tear down, and whatever capabilities
(:mod:`bkref.nemesis.backends.capabilities`) it has. Bookies are named
``bookie-<i>``, ZooKeeper servers ``zk<i>``, the workload's node ``client``.
:class:`Backend` is the base of all of them; :class:`NodeNetwork` is the base
of the two whose nodes each have a network of their own (namespaces,
containers) and whose bookies therefore register ``127.0.0.1:<port>`` behind
forwarding rules; :class:`LazyfsDisks` gives a backend's bookies a lazyfs
disk and so the capability to lose unsynced writes.
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from bkref.impl.bookie.config import BookieConfig
from bkref.impl.meta import layout
from bkref.nemesis import disk

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from bkref.nemesis.lazyfs import LazyMount

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
BOOKIE_BASE_PORT = 3181  # bookie i serves on 127.0.0.1:<this + i> (node networks)
HTTP_BASE_PORT = 8080  # and its /metrics and admin API on <this + i> (httpServerPort)
ZK_ROOT = "/ledgers"
COOKIE_EXIT = 3  # `bkref bookie` exits with 3 when its cookie check refuses to start


def bookie_settings(autorecovery: bool) -> dict[str, object]:
    """Bookie config parameters every backend sets."""
    return {"zkTimeout": BOOKIE_SESSION_MS, **(AUTORECOVERY_SETTINGS if autorecovery else {})}


class BackendError(RuntimeError):
    """The cluster could not be set up, or a node could not be (re)started."""


class NodeRefusedError(RuntimeError):
    """A node exited while starting, on purpose (a bookie whose cookie does not match)."""


class Backend(ABC):
    """A cluster of one run: ZooKeeper and bookies, and the client's place among them."""

    name: str

    def __init__(
        self,
        directory: Path,
        bookies: int,
        *,
        plants: frozenset[str] = frozenset(),
        autorecovery: bool = True,
        trace_dir: Path | None = None,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.size = bookies
        self.plants = plants  # planted bugs (test-only): every bookie gets --plant NAME
        self.autorecovery = autorecovery
        # Every bookie (and its AutoRecovery) logs its protocol steps here (--trace).
        self.trace_dir = None if trace_dir is None else Path(trace_dir).resolve()

    def trace_argv(self, inside: str | None = None) -> list[str]:
        """A bookie's ``--trace DIR`` arguments (none when the run records no traces);
        ``inside``: the directory as the bookie sees it, if not at the host's path."""
        if self.trace_dir is None:
            return []
        return ["--trace", inside if inside is not None else str(self.trace_dir)]

    @property
    def session_timeout(self) -> float:
        """Seconds after which a silent bookie's ZooKeeper session expires."""
        return BOOKIE_SESSION_MS / 1000

    @property
    def fault_kinds(self) -> frozenset[str]:
        """The fault kinds this backend can perform (nemesis.faults)."""
        from bkref.nemesis.faults import performable

        return performable(self)

    @property
    def bookies(self) -> list[str]:
        return [f"bookie-{i}" for i in range(self.size)]

    @property
    def zookeepers(self) -> list[str]:
        """ZooKeeper servers the nemesis may kill or pause (none for a standalone server)."""
        return []

    @property
    def network(self) -> list[str]:
        """Nodes a partition may separate (none without a network of nodes)."""
        return []

    @property
    def clients(self) -> list[str]:
        """The workload's nodes among them (a partition may cut them off)."""
        return []

    @property
    @abstractmethod
    def zk_connect(self) -> str: ...

    @abstractmethod
    def setup(self) -> None: ...

    @abstractmethod
    def teardown(self) -> None:
        """Remove every process (and mount, namespace, container) the backend made."""

    @abstractmethod
    def kill(self, node: str) -> None: ...

    @abstractmethod
    def start(self, node: str) -> None:
        """Restart a killed node; NodeRefusedError if it refuses to (and stays down)."""

    @abstractmethod
    def heal(self) -> None:
        """Revert every fault still in force: partitions, paused nodes."""

    @abstractmethod
    def data_dir(self, node: str) -> Path:
        """Where this process reads and writes bookie ``node``'s journal and ledgers."""

    def corrupt(self, node: str, kind: str, rng: random.Random) -> str:
        """``flip`` bytes of a running bookie's entry log; for ``truncate`` and ``wipe``
        kill it first. Returns what was done."""
        data = self.data_dir(node)
        if kind == "flip":
            return disk.flip_bytes(data / "ledgers", rng)
        self.kill(node)
        if kind == "truncate":
            return disk.truncate_tail(data / "journal", rng)
        if kind == "wipe":
            return disk.wipe([data / "journal", data / "ledgers"])
        raise ValueError(f"unknown disk fault {kind!r}")

    def run_client(self, fn: Callable[[], T]) -> T:
        """Call ``fn`` where the workload's clients live (their network namespace)."""
        return fn()

    def metrics_targets(self) -> dict[str, str]:
        """Each bookie's HTTP server (``http://host:port``), which serves ``/metrics``."""
        return {}

    def scrape_in(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` where every bookie's HTTP server can be reached and no partition
        cuts it off."""
        fn()

    @abstractmethod
    def logs(self) -> dict[str, str]:
        """The tail of each node's log."""

    @abstractmethod
    def bookie_configs(self) -> dict[str, Path]:
        """Each bookie's config file, for dumping what it stores once it is stopped."""


class NodeNetwork(Backend):
    """A backend whose nodes each have a network of their own (namespaces, containers).

    Bookies serve on 127.0.0.1 only (``bkref.impl.bookie`` accepts no other address) and
    register ``127.0.0.1:<port>``, each on a port of its own; forwarding rules
    (:meth:`forwarding_rules`) make each one reachable at its node's address, so that
    packets carry real addresses and a grudge cuts exactly the links it names. An
    admin ZooKeeper client, which no partition names, waits for bookies to register.
    """

    poll = 0.1  # seconds between looks at ZooKeeper while bookies register
    mounts: dict[str, LazyMount]  # bookies whose data is on lazyfs (set by each backend)
    _admin: KazooClient | None = None  # set up with the cluster

    @property
    def ports(self) -> dict[str, int]:
        """The port each bookie serves on, at 127.0.0.1 in its own node."""
        return {b: BOOKIE_BASE_PORT + i for i, b in enumerate(self.bookies)}

    @property
    def http_ports(self) -> dict[str, int]:
        """The port of each bookie's /metrics and admin API, at 127.0.0.1 in its node."""
        return {b: HTTP_BASE_PORT + i for i, b in enumerate(self.bookies)}

    @abstractmethod
    def node_ip(self, node: str) -> str:
        """``node``'s address on the nodes' network."""

    def metrics_targets(self) -> dict[str, str]:
        return {b: f"http://{self.node_ip(b)}:{port}" for b, port in self.http_ports.items()}

    def bookie_config(self, b: str, root: str) -> BookieConfig:
        """Bookie ``b``'s config, with its journal and ledgers under ``root``."""
        return BookieConfig.from_dict(
            {
                "bookiePort": self.ports[b],
                "journalDirectory": f"{root}/journal",
                "ledgerDirectories": [f"{root}/ledgers"],
                "zkServers": self.zk_connect,
                "zkLedgersRootPath": ZK_ROOT,
                "rack": f"/rack-{self.bookies.index(b)}",
                "httpServerEnabled": True,
                "httpServerPort": self.http_ports[b],
                **bookie_settings(self.autorecovery),
            }
        )

    def forwarding_rules(self, node: str, ip: Callable[[str], str]) -> list[str]:
        """iptables nat rules for ``node``: its bookie's ports (if it has one: the bookie's
        and its HTTP server's) forwarded from its address to its loopback, every other
        bookie's 127.0.0.1:<port> sent to that bookie's address, and loopback sources
        rewritten to its own address."""
        rules = [
            f"-A PREROUTING -i eth0 -p tcp --dport {port[node]} "
            f"-j DNAT --to-destination 127.0.0.1:{port[node]}"
            for port in (self.ports, self.http_ports)
            if node in port
        ]
        rules += [
            f"-A OUTPUT -d 127.0.0.1/32 -p tcp --dport {port} "
            f"-j DNAT --to-destination {ip(other)}:{port}"
            for other, port in self.ports.items()
            if other != node
        ]
        rules.append(f"-A POSTROUTING -o eth0 -s 127.0.0.1/32 -j SNAT --to-source {ip(node)}")
        return rules

    def prepare_disk(self, b: str) -> None:
        """Make bookie ``b``'s disk ready before it first starts (plain: nothing to do)."""

    @abstractmethod
    def _exit_status(self, name: str) -> int | None:
        """``name``'s exit status if its process has exited (after its bookkeeping), else
        None."""

    @abstractmethod
    def _tail(self, name: str) -> str:
        """The last lines of ``name``'s log."""

    @abstractmethod
    def _mark_out(self, name: str) -> None:
        """``name`` refused to start: it stays down for the rest of the run."""

    def _registered(self, names: list[str]) -> dict[str, int]:
        assert self._admin is not None
        return registration_owners(self._admin, ZK_ROOT, self.ports, names)

    def _wait_registered(self, names: list[str], stale: dict[str, int], timeout: float) -> None:
        """Return once each of ``names`` is registered by a session other than its
        ``stale`` one; NodeRefusedError if one's cookie made it exit, BackendError if one
        exited otherwise or the time ran out."""
        deadline = time.monotonic() + timeout
        while True:
            owners = self._registered(names)
            missing = [n for n in names if owners.get(n) in (None, stale.get(n))]
            if not missing:
                return
            for name in missing:
                status = self._exit_status(name)
                if status is None:
                    continue
                tail = self._tail(name)
                if status == COOKIE_EXIT:
                    self._mark_out(name)
                    raise NodeRefusedError(f"{name} refused to start:\n{tail}")
                raise BackendError(f"{name} exited with status {status} while starting:\n{tail}")
            if time.monotonic() > deadline:
                raise BackendError(f"{missing} did not register within {timeout:.0f} s")
            time.sleep(self.poll)


class LazyfsDisks(NodeNetwork):
    """Bookie data on lazyfs (:mod:`bkref.nemesis.lazyfs`): one daemon per bookie, which plays
    the node's page cache and disk. It outlives a kill -9 of the bookie (a process crash
    keeps the page cache), and :meth:`lose_unsynced` drops what the bookie never fsynced
    (a crash of the node): the ``LosesUnsynced`` capability, the same wherever it is
    mixed in. A backend mixes this in before its own class."""

    @abstractmethod
    def _new_mount(self, b: str) -> LazyMount:
        """Bookie ``b``'s lazyfs mount, not started yet."""

    def _mounted(self) -> None:
        """A mount was added (before it starts): record it, for a later cleanup."""

    def prepare_disk(self, b: str) -> None:
        mount = self._new_mount(b)
        self.mounts[b] = mount
        self._mounted()
        mount.start()

    def lose_unsynced(self, node: str) -> None:
        """kill -9 bookie ``node``, then drop every write it had not fsynced."""
        self.kill(node)
        self.mounts[node].lose_unsynced()


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
