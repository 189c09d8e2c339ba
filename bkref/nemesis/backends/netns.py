"""The namespace backend: every node in its own network namespace, real partitions.

Nodes, each a namespace of :class:`bkref.nemesis.netns.NamespaceNetwork` joined to
one bridge: ``zk1``..``zk3`` (a ZooKeeper ensemble), ``bookie-0``..``bookie-N``,
``client`` (the workload: the runner calls it through :meth:`run_client`, in
a thread that has entered the namespace, so that every socket the client,
kazoo and their threads open is there) and ``admin`` (this backend's own
ZooKeeper client, which waits for bookies to register; no partition names it,
so it always sees the ensemble).

Bookies serve on 127.0.0.1 (``bkref.impl.bookie`` accepts no other address, and
registers ``127.0.0.1:<port>``), each on a port of its own. So that the
others reach it, its namespace forwards ``<its address>:<port>`` to its
loopback (iptables DNAT, ``route_localnet``), and every bookie and client
namespace sends ``127.0.0.1:<port of bookie j>`` to bookie j's address (DNAT
in OUTPUT, SNAT to its own address). Packets then carry the real addresses,
and a grudge's DROP rules in the filter table cut exactly the links it names.

Capabilities: kill -9/restart and SIGSTOP/SIGCONT of bookies and ZooKeeper
servers; partitions (any grudge over the nodes but ``admin``); disk corruption
(:mod:`bkref.nemesis.disk`); and, in :class:`LazyfsNamespaceBackend` (the default),
bookie data on lazyfs (:mod:`bkref.nemesis.lazyfs`), so that a crash may drop what
was never fsynced. Every bookie process runs AutoRecovery too (unless the
backend is made without it), so the auditor and the replication workers live
in the bookies' namespaces.

Teardown always runs to the end, step by step, and removes every process,
mount and namespace the backend made. What it made is written to
``<directory>/netns-cluster.json`` as it goes, and the directory is named in
a registry, so that :func:`cleanup` (``bkref campaign cleanup``) can remove
what a crashed runner left.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient

from bkref.impl.cli.plants import plant_argv
from bkref.impl.cluster.netns import run_in_netns
from bkref.impl.cluster.process import log_tail, pid_alive, runs_with, stop_pid, write_state
from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble, ZooKeeperError
from bkref.nemesis.backends.base import BackendError, LazyfsDisks, NodeNetwork, NodeRefusedError
from bkref.nemesis.lazyfs import LazyMount
from bkref.nemesis.netns import (
    NamespaceNetwork,
    cleanup_leftovers,
    default_registry_dir,
    owner,
    owner_alive,
)

T = TypeVar("T")
STATE_FILE = "netns-cluster.json"


@dataclass
class Service:
    """One process of the cluster that runs in a node's namespace."""

    name: str  # "bookie-0"
    node: str  # the network node it runs in
    argv: list[str]
    marker: str  # its config file: a PID is ours only while its command line names it
    log: str
    pid: int | None = None
    out: bool = False  # refused to start (a wiped disk): stays down for the run


class NamespaceBackend(NodeNetwork):
    """A 3-node ZooKeeper ensemble, N bookies and the client, each in a namespace;
    bookie data on plain disks (``--no-lazyfs``)."""

    name = "netns"

    def __init__(
        self,
        directory: Path,
        bookies: int = 5,
        *,
        zookeepers: int = 3,
        plants: frozenset[str] = frozenset(),
        registry_dir: Path | None = None,
        autorecovery: bool = True,
        trace_dir: Path | None = None,
    ) -> None:
        super().__init__(
            directory, bookies, plants=plants, autorecovery=autorecovery, trace_dir=trace_dir
        )
        self.zk_size = zookeepers
        self.net = NamespaceNetwork(
            [
                *(f"zk{i}" for i in range(1, zookeepers + 1)),
                *(f"bookie-{i}" for i in range(bookies)),
                "client",
                "admin",
            ],
            registry_dir=registry_dir,
        )
        self.registry = (registry_dir or default_registry_dir()).parent / "campaigns"
        self.ensemble: ZooKeeperEnsemble | None = None
        self.services: dict[str, Service] = {}
        self.mounts: dict[str, LazyMount] = {}
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._paused: set[str] = set()
        self._save_lock = threading.Lock()

    # ------------------------------------------------------------ the cluster's facts

    @property
    def zk_connect(self) -> str:
        return ",".join(f"{self.net.nodes[z].ip}:2181" for z in self.zookeepers)

    @property
    def zookeepers(self) -> list[str]:
        return [f"zk{i}" for i in range(1, self.zk_size + 1)]

    @property
    def network(self) -> list[str]:
        return [*self.zookeepers, *self.bookies, *self.clients]

    @property
    def clients(self) -> list[str]:
        return ["client"]

    # ------------------------------------------------------------ setup

    def setup(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.registry.mkdir(parents=True, exist_ok=True)
        (self.registry / f"{self.net.run_id}.json").write_text(
            json.dumps({"directory": str(self.directory), "owner": owner()}) + "\n"
        )
        self._save()
        self.net.setup()
        self._plan()
        self._save()
        self._forward_ports()
        placement = [(self.net.nodes[z].netns, self.net.nodes[z].ip) for z in self.zookeepers]
        self.ensemble = ZooKeeperEnsemble(
            directory=self.directory / "zookeeper", placement=placement
        )
        self.ensemble.start(timeout=90)
        self._save()
        admin = run_in_netns(self.net.nodes["admin"].netns, lambda: KazooClient(self.zk_connect))
        self._admin = admin
        run_in_netns(self.net.nodes["admin"].netns, lambda: admin.start(timeout=30))
        for b in self.bookies:
            self.prepare_disk(b)
            self.data_dir(b).mkdir(parents=True, exist_ok=True)
        for b in self.bookies:
            self._start_service(b)
        self._wait_registered(self.bookies, {}, timeout=60)

    def data_dir(self, node: str) -> Path:
        return self.directory / node / "data"

    def _plan(self) -> None:
        for b in self.bookies:
            d = self.directory / b
            d.mkdir(parents=True, exist_ok=True)
            config = d / "bookie.toml"
            config.write_text(self.bookie_config(b, str(self.data_dir(b))).to_toml())
            argv = [
                sys.executable,
                "-m",
                "bkref.impl.bookie",
                "--config",
                str(config),
                *plant_argv(self.plants),
                *self.trace_argv(),
            ]
            self.services[b] = Service(b, b, argv, str(config), str(d / "bookie.log"))

    def _forward_ports(self) -> None:
        """Make each bookie's 127.0.0.1:<port> reachable from the other namespaces."""
        for node in [*self.bookies, "client", "admin"]:
            self.net.run(node, "sysctl", "-qw", "net.ipv4.conf.eth0.route_localnet=1")
            self.net.load_nat(node, self.forwarding_rules(node, lambda n: self.net.nodes[n].ip))

    # ------------------------------------------------------------ processes

    def _start_service(self, name: str) -> None:
        s = self.services[name]
        if s.pid is not None and pid_alive(s.pid):
            raise BackendError(f"{name} is already running (pid {s.pid})")
        with open(s.log, "ab") as log:
            child = subprocess.Popen(
                self.net.exec_argv(s.node, s.argv),  # `ip netns exec` execs: the PID is ours
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._children[name] = child
        s.pid = child.pid
        self._save()

    def _stop_service(self, name: str, sig: signal.Signals, grace: float) -> None:
        s = self.services[name]
        if s.pid is None:
            return
        child = self._children.pop(name, None)
        if child is not None or runs_with(s.pid, s.marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(s.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            stop_pid(s.pid, child=child, sig=sig, grace=grace)
        s.pid = None
        self._paused.discard(name)
        self._save()

    def _exit_status(self, name: str) -> int | None:
        child = self._children.get(name)
        if child is None or child.poll() is None:
            return None
        self.services[name].pid = None
        self._children.pop(name)
        self._save()
        return child.returncode

    def _tail(self, name: str) -> str:
        return log_tail(Path(self.services[name].log), 8)

    def _mark_out(self, name: str) -> None:
        self.services[name].out = True
        self._save()

    def _zk_id(self, node: str) -> int | None:
        if node in self.zookeepers:
            return int(node[2:])
        if node not in self.services:
            raise ValueError(f"no such node {node!r}; nodes: {self.network}")
        return None

    def _pid(self, node: str) -> int | None:
        sid = self._zk_id(node)
        if sid is None:
            return self.services[node].pid
        assert self.ensemble is not None
        return self.ensemble.servers[sid].pid

    # ------------------------------------------------------------ faults

    def kill(self, node: str) -> None:
        sid = self._zk_id(node)
        self._paused.discard(node)
        if sid is None:
            self._stop_service(node, signal.SIGKILL, 0.0)
        else:
            assert self.ensemble is not None
            self.ensemble.kill(sid)

    def start(self, node: str) -> None:
        sid = self._zk_id(node)
        if sid is not None:
            assert self.ensemble is not None
            if self.ensemble.servers[sid].pid is None:
                try:
                    self.ensemble.start_server(sid, wait=True, timeout=60)
                except ZooKeeperError as e:
                    raise BackendError(str(e)) from e
            return
        s = self.services[node]
        if s.out:
            raise NodeRefusedError(f"{node} refused to start earlier and stays down")
        if s.pid is not None and pid_alive(s.pid):
            return
        if node not in self.ports:  # not a bookie: nothing to wait for in ZooKeeper
            self._start_service(node)
            return
        stale = self._registered([node])
        self._start_service(node)
        self._wait_registered([node], stale, timeout=60)

    def pause(self, node: str) -> None:
        pid = self._pid(node)
        if pid is not None:
            os.kill(pid, signal.SIGSTOP)
            self._paused.add(node)

    def resume(self, node: str) -> None:
        pid = self._pid(node)
        self._paused.discard(node)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def partition(self, grudge: Mapping[str, frozenset[str]]) -> None:
        if "admin" in grudge or any("admin" in g for g in grudge.values()):
            raise ValueError("the admin node is never partitioned")
        self.net.apply_grudge(grudge)

    def heal(self) -> None:
        self.net.heal()
        for node in sorted(self._paused):
            self.resume(node)

    def run_client(self, fn: Callable[[], T]) -> T:
        return run_in_netns(self.net.nodes["client"].netns, fn)

    def node_ip(self, node: str) -> str:
        return self.net.nodes[node].ip

    def scrape_in(self, fn: Callable[[], None]) -> None:
        run_in_netns(self.net.nodes["admin"].netns, fn)  # no grudge names admin

    def logs(self) -> dict[str, str]:
        out = {name: log_tail(Path(s.log), 200) for name, s in self.services.items()}
        if self.ensemble is not None:
            for sid, server in self.ensemble.servers.items():
                out[f"zk{sid}"] = log_tail(server.log_path, 200)
        return out

    def bookie_configs(self) -> dict[str, Path]:
        return {b: Path(self.services[b].marker) for b in self.bookies if b in self.services}

    # ------------------------------------------------------------ teardown

    def teardown(self) -> None:
        """Remove every process, mount and namespace; every step runs even if one fails."""
        errors: list[str] = []

        def step(what: str, fn: Callable[[], object]) -> None:
            try:
                fn()
            except Exception as e:
                errors.append(f"{what}: {type(e).__name__}: {e}")

        if self._admin is not None:
            admin = self._admin
            step("admin ZooKeeper client", lambda: (admin.stop(), admin.close()))
            self._admin = None
        for name in list(self.services):
            step(f"stop {name}", functools.partial(self._stop_service, name, signal.SIGTERM, 5.0))
        if self.ensemble is not None:
            for server in self.ensemble.servers.values():
                if server.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(server.pid, signal.SIGCONT)
            step("stop ZooKeeper", self.ensemble.stop)
        for name, mount in self.mounts.items():
            step(f"unmount lazyfs of {name}", mount.stop)
        step("delete namespaces", self.net.teardown)
        (self.registry / f"{self.net.run_id}.json").unlink(missing_ok=True)
        self._save()
        if errors:
            raise BackendError("teardown was incomplete: " + "; ".join(errors))

    # ------------------------------------------------------------ state, cleanup

    def _save(self) -> None:
        with self._save_lock:  # restarts may run in parallel (a power cut's end)
            self._write_state()

    def _write_state(self) -> None:
        state: dict[str, Any] = {
            "owner": owner(),
            "run_id": self.net.run_id,
            "net_registry": str(self.net.registry),
            "namespaces": [n.netns for n in self.net.nodes.values()] + [self.net.bridge_ns],
            "zookeeper": str(self.directory / "zookeeper") if self.ensemble else None,
            "services": [asdict(s) for s in self.services.values()],
            "mounts": {
                name: {"mountpoint": str(m.mountpoint), "pid": m.process.pid if m.process else None}
                for name, m in self.mounts.items()
            },
        }
        write_state(self.directory / STATE_FILE, state)


class LazyfsNamespaceBackend(LazyfsDisks, NamespaceBackend):
    """The namespace backend with each bookie's data on lazyfs, mounted at its data
    directory (``<bookie>/data``, backed by ``<bookie>/backing``): it can lose unsynced
    writes."""

    def _new_mount(self, b: str) -> LazyMount:
        d = self.directory / b
        return LazyMount(d / "backing", self.data_dir(b), log=d / "lazyfs.log")

    def _mounted(self) -> None:
        self._save()


def cleanup(registry_dir: Path | None = None, directories: list[Path] | None = None) -> list[str]:
    """Stop what crashed or interrupted namespace campaigns left; what was removed.

    Campaign directories come from the registry, for campaigns whose runner is
    gone (and from ``directories``, which the caller vouches for); for each,
    its bookies (by PID, only while they run our config), ZooKeeper servers,
    lazyfs mounts and daemons; then every namespace a network registry names.
    """
    registry = (registry_dir or default_registry_dir()).parent / "campaigns"
    found: list[Path] = list(directories or [])
    entries = sorted(registry.glob("*.json")) if registry.is_dir() else []
    leftovers = []
    for entry in entries:
        with contextlib.suppress(OSError, ValueError, KeyError):
            recorded = json.loads(entry.read_text())
            if not owner_alive(recorded):  # a campaign in progress is not a leftover
                found.append(Path(recorded["directory"]))
                leftovers.append(entry)
    removed: list[str] = []
    for directory in found:
        path = directory / STATE_FILE
        if not path.exists():
            continue
        state = json.loads(path.read_text())
        if owner_alive(state):
            continue  # its runner is still running: not a leftover
        for raw in state.get("services", []):
            pid = raw.get("pid")
            if pid and pid_alive(pid) and runs_with(pid, raw["marker"]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                stop_pid(pid, sig=signal.SIGKILL, grace=0.0)
                removed.append(f"process {raw['name']} (pid {pid})")
        if state.get("zookeeper"):
            with contextlib.suppress(ZooKeeperError):
                ZooKeeperEnsemble.load(Path(state["zookeeper"])).stop()
                removed.append(f"ZooKeeper under {state['zookeeper']}")
        for name, m in state.get("mounts", {}).items():
            if os.path.ismount(m["mountpoint"]):
                subprocess.run(["umount", "-l", m["mountpoint"]], check=False)
                removed.append(f"lazyfs mount of {name}")
            pid = m.get("pid")
            if pid and pid_alive(pid) and runs_with(pid, m["mountpoint"]):
                stop_pid(pid, sig=signal.SIGKILL, grace=0.0)
    removed += [f"namespace {ns}" for ns in cleanup_leftovers(registry_dir)]
    for entry in leftovers:
        entry.unlink(missing_ok=True)
    return removed
