"""The Docker backend: every node a container of the private engine, faults from inside.

Nodes: ``zk1``..``zk3`` (a ZooKeeper ensemble) and ``bookie-0``..``bookie-N``,
each a container of ``bkref-node:latest`` on a bridge network of its own
(``bkref-<run>``) with a fixed address. The control process (the workload,
kazoo, this backend's admin client) runs in the engine's network namespace
(:func:`bkref.impl.cluster.netns.run_in_netns`) and talks to container addresses
directly; the client is therefore not a partitionable node here.

Bookies serve on 127.0.0.1 only and register ``127.0.0.1:<port>``, each on a
port of its own, so addresses are rewritten as on the namespace backend: a
bookie container forwards ``<its address>:<port>`` to its loopback and sends
``127.0.0.1:<port of bookie j>`` to bookie j (iptables nat rules, loaded by
the container before it execs the bookie; ``route_localnet``), and the
engine's namespace sends ``127.0.0.1:<port>`` to the bookie's container.

Capabilities: ``docker kill``/``start`` and ``pause``/``unpause`` (the
freezer cgroup) of bookies and ZooKeeper servers; partitions by iptables DROP
rules in each container's network namespace (entered by the container's PID,
so no ``docker exec``), re-applied when a container restarts; disk corruption
on the bookies' data directories, bind mounts under the run directory (the
host reads them for the dumps after the run).

A killed container's address refuses connections (a TCP reset, made in the
sender's own namespace), as a node whose bookie process died does on the
namespace backend. Without it, packets to a stopped container are dropped and
a client's connect waits for the container to come back: a request the client
logged while its bookie was down would be taken by the restarted bookie, which
the trace check, placing the unlogged crash at the auditor's mark, cannot
explain.

In :class:`LazyfsDockerBackend` (the default) bookie data is on lazyfs
(:mod:`bkref.nemesis.lazyfs`), as on the namespace backend, so that it can lose
what a bookie never fsynced: one daemon per bookie, a child of this process,
mounted in the engine's mount namespace (where the engine resolves bind
mounts; the host's ``/`` is a private mount, so a mount made on the host would
not reach it) and bind-mounted into the bookie's container at ``/disk``. The
daemon plays the node's page cache and disk, exactly as on the namespace
backend (:class:`bkref.nemesis.backends.base.LazyfsDisks`). The containers need no
FUSE device and no extra privilege. :class:`DockerBackend` keeps bookie data
on plain bind mounts (``--no-lazyfs``) and cannot lose unsynced writes.

Traces (``--trace``): the run's trace directory is bind-mounted into every bookie
container at ``/traces``, where the bookie and its AutoRecovery write their files
(as root; the host reads them); the workload and its writer processes run on the
host and write there directly. The trace check compares ``t``, each node's
``CLOCK_MONOTONIC``, across nodes: containers read the host's clock because
Docker gives them no time namespace, and setup checks that each bookie's
container has none.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from kazoo.client import KazooClient
from python_on_whales import Container, DockerClient
from python_on_whales.exceptions import DockerException

from bkref.impl.cli.plants import plant_argv
from bkref.impl.cluster.netns import run_in_netns
from bkref.nemesis.backends.base import BackendError, LazyfsDisks, NodeNetwork, NodeRefusedError
from bkref.nemesis.docker_engine import DockerEngine
from bkref.nemesis.docker_images import IMAGE, build
from bkref.nemesis.lazyfs import LazyMount, daemons_in_namespace_of, stop_daemon

T = TypeVar("T")
LABEL = "bkref.run"
DISK = "/disk"  # where a bookie container sees its lazyfs (its journal and ledgers)
TRACES = "/traces"  # where a bookie container sees the run's trace directory


class DockerBackendError(BackendError):
    """The Docker cluster could not be set up or a node could not be (re)started."""


def _sh(argv: list[str], stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise DockerBackendError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return done.stdout


class DockerBackend(NodeNetwork):
    """A 3-server ZooKeeper ensemble and N bookies, each a container; bookie data on
    plain bind mounts (``--no-lazyfs``)."""

    name = "docker"
    poll = 0.2

    def __init__(
        self,
        directory: Path,
        bookies: int = 5,
        *,
        engine: DockerEngine | None = None,
        plants: frozenset[str] = frozenset(),
        autorecovery: bool = True,
        trace_dir: Path | None = None,
    ) -> None:
        super().__init__(
            directory, bookies, plants=plants, autorecovery=autorecovery, trace_dir=trace_dir
        )
        self.engine = engine or DockerEngine()
        self.run_id = uuid.uuid4().hex[:8]
        self.network_name = f"bkref-{self.run_id}"
        self.bridge = f"bk{self.run_id}"
        self.chain = f"BKREF-{self.run_id}".upper()
        # One /24 per run, out of the range Docker picks its default networks from.
        self.subnet_prefix = f"10.{200 + int(self.run_id[:2], 16) % 50}.{int(self.run_id[2:4], 16)}"
        self.containers: dict[str, Container] = {}
        self.mounts: dict[str, LazyMount] = {}
        self._grudge: dict[str, frozenset[str]] = {}
        self._paused: set[str] = set()
        self._down: set[str] = set()  # killed and not started again: they refuse connections
        self._out: set[str] = set()
        self._started_engine = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------ the cluster's facts

    @property
    def zookeepers(self) -> list[str]:
        return ["zk1", "zk2", "zk3"]

    @property
    def network(self) -> list[str]:
        return [*self.zookeepers, *self.bookies]

    def ip(self, node: str) -> str:
        if node in self.zookeepers:
            return f"{self.subnet_prefix}.{10 + int(node[2:])}"
        return f"{self.subnet_prefix}.{20 + self.bookies.index(node)}"

    @property
    def gateway(self) -> str:
        return f"{self.subnet_prefix}.1"

    @property
    def zk_connect(self) -> str:
        return ",".join(f"{self.ip(z)}:2181" for z in self.zookeepers)

    @property
    def docker(self) -> DockerClient:
        return self.engine.client()

    # ------------------------------------------------------------ setup

    def setup(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.trace_dir is not None:
            self.trace_dir.mkdir(parents=True, exist_ok=True)  # ours, not the engine's
        if not self.engine.status().running:
            self.engine.start()
            self._started_engine = True
        build(self.docker, log=self.directory / "image-build.log")
        self.docker.network.create(
            self.network_name,
            driver="bridge",
            subnet=f"{self.subnet_prefix}.0/24",
            gateway=self.gateway,
            labels={LABEL: self.run_id},
            options=[f"com.docker.network.bridge.name={self.bridge}"],
        )
        self._engine_nat()
        for z in self.zookeepers:
            self._write_zookeeper(z)
            self._create(z, ["zookeeper", "/data/zoo.cfg", z[2:]])
        self._admin = self.run_client(lambda: KazooClient(self.zk_connect))
        admin = self._admin
        self.run_client(lambda: admin.start(timeout=90))
        for b in self.bookies:
            self.prepare_disk(b)
            self._write_bookie(b)
            self._create(b, self.bookie_command(b), entrypoint="sh")
            if self.trace_dir is not None:
                self._check_clock(b)
        self._wait_registered(self.bookies, {}, timeout=90)

    def data_dir(self, node: str) -> Path:
        mount = self.mounts.get(node)
        return mount.view if mount is not None else self.directory / node / "data"

    def bookie_command(self, b: str) -> list[str]:
        """Bookie ``b``'s container command (for ``sh``): load its nat rules, then exec
        the bookie, with AutoRecovery, planted bugs and traces as the run has them."""
        argv = [
            "bookie",
            "/data/bookie.toml",
            *(["--autorecovery"] if self.autorecovery else []),
            *plant_argv(self.plants),
            *self.trace_argv(TRACES),
        ]
        return ["-c", 'iptables-restore /data/nat.rules && exec bkref-node "$@"', "--", *argv]

    def volumes(self, node: str) -> list[tuple[str, str]]:
        """(host path, container path) bound into ``node``'s container: its data, and a
        bookie's lazyfs and the run's trace directory."""
        volumes = [(str(self.directory / node / "data"), "/data")]
        if node in self.mounts:
            volumes.append((str(self.mounts[node].mountpoint), DISK))
        if node in self.bookies and self.trace_dir is not None:
            volumes.append((str(self.trace_dir), TRACES))
        return volumes

    def _create(self, node: str, command: list[str], entrypoint: str | None = None) -> None:
        (self.directory / node / "data").mkdir(parents=True, exist_ok=True)
        self.containers[node] = self.docker.run(
            IMAGE,
            command,
            name=f"{self.network_name}-{node}",
            hostname=node,
            detach=True,
            networks=[self.network_name],
            ip=self.ip(node),
            volumes=self.volumes(node),
            labels={LABEL: self.run_id},
            cap_add=["NET_ADMIN"],
            sysctl={"net.ipv4.conf.all.route_localnet": "1"},
            entrypoint=entrypoint,
        )

    def _check_clock(self, node: str) -> None:
        """Refuse a container with a time namespace of its own: its monotonic clock would
        not be the host's, and the trace check compares ``t`` across nodes."""
        pid = self.docker.container.inspect(self.containers[node]).state.pid
        other = foreign_time_namespace(pid) if pid else None
        if other is not None:
            raise DockerBackendError(
                f"{node}'s container has a time namespace of its own ({other}): the "
                "monotonic times of its trace cannot be compared with the other nodes'"
            )

    def _write_zookeeper(self, z: str) -> None:
        data = self.directory / z / "data"
        data.mkdir(parents=True, exist_ok=True)
        servers = "\n".join(
            f"server.{other[2:]}={self.ip(other)}:2888:3888" for other in self.zookeepers
        )
        (data / "zoo.cfg").write_text(
            "tickTime=500\ninitLimit=20\nsyncLimit=10\ndataDir=/data/zk\nclientPort=2181\n"
            "4lw.commands.whitelist=*\n" + servers + "\n"
        )

    def _write_bookie(self, b: str) -> None:
        data = self.directory / b / "data"
        data.mkdir(parents=True, exist_ok=True)
        inside = DISK if b in self.mounts else "/data"
        (data / "bookie.toml").write_text(self.bookie_config(b, inside).to_toml())
        # The same bookie as the host sees it, for dumping its data after the run.
        host = self.bookie_config(b, str(self.data_dir(b)))
        (self.directory / b / "bookie.toml").write_text(host.to_toml())
        rules = ["*nat", *self.forwarding_rules(b, self.ip), "COMMIT"]
        (data / "nat.rules").write_text("\n".join(rules) + "\n")

    def _engine_iptables(self, *args: str, table: str = "nat") -> str:
        return _sh(["ip", "netns", "exec", self.engine.netns, "iptables", "-t", table, *args])

    def _engine_nat(self) -> None:
        """In the engine's namespace: 127.0.0.1:<port of a bookie> goes to its container;
        a chain of the filter table refuses connections to killed nodes."""
        _sh(["ip", "netns", "exec", self.engine.netns, "sysctl", "-qw",
             "net.ipv4.conf.all.route_localnet=1"])  # fmt: skip
        self._engine_iptables("-N", self.chain, table="filter")
        self._engine_iptables("-I", "OUTPUT", "-j", self.chain, table="filter")
        self._engine_iptables("-N", self.chain)
        self._engine_iptables("-I", "OUTPUT", "-j", self.chain)
        self._engine_iptables("-I", "POSTROUTING", "-o", self.bridge, "-s", "127.0.0.1/32",
                              "-j", "SNAT", "--to-source", self.gateway)  # fmt: skip
        for b, port in self.ports.items():
            self._engine_iptables("-A", self.chain, "-d", "127.0.0.1/32", "-p", "tcp",
                                  "--dport", str(port), "-j", "DNAT",
                                  "--to-destination", f"{self.ip(b)}:{port}")  # fmt: skip

    def _drop_engine_nat(self) -> None:
        with contextlib.suppress(DockerBackendError):
            self._engine_iptables("-D", "OUTPUT", "-j", self.chain, table="filter")
        with contextlib.suppress(DockerBackendError):
            self._engine_iptables("-F", self.chain, table="filter")
            self._engine_iptables("-X", self.chain, table="filter")
        with contextlib.suppress(DockerBackendError):
            self._engine_iptables("-D", "OUTPUT", "-j", self.chain)
        with contextlib.suppress(DockerBackendError):
            self._engine_iptables("-D", "POSTROUTING", "-o", self.bridge, "-s", "127.0.0.1/32",
                                  "-j", "SNAT", "--to-source", self.gateway)  # fmt: skip
        with contextlib.suppress(DockerBackendError):
            self._engine_iptables("-F", self.chain)
            self._engine_iptables("-X", self.chain)

    # ------------------------------------------------------------ registration

    def _exit_status(self, name: str) -> int | None:
        state = self.docker.container.inspect(self.containers[name]).state
        return None if state.running else state.exit_code

    def _tail(self, name: str) -> str:
        return str(self.docker.container.logs(self.containers[name], tail=8))

    def _mark_out(self, name: str) -> None:
        self._out.add(name)

    # ------------------------------------------------------------ faults

    def _container(self, node: str) -> Container:
        if node not in self.containers:
            raise ValueError(f"no such node {node!r}; nodes: {self.network}")
        return self.containers[node]

    def kill(self, node: str) -> None:
        c = self._container(node)
        with self._lock:
            if node in self._paused:
                self.docker.container.unpause(c)
                self._paused.discard(node)
        with contextlib.suppress(DockerException):  # already down
            self.docker.container.kill(c)
        self.docker.container.inspect(c)  # waits for the engine to see it stop
        self._set_down(node, True)

    def start(self, node: str) -> None:
        c = self._container(node)
        if node in self._out:
            raise NodeRefusedError(f"{node} refused to start earlier and stays down")
        if self.docker.container.inspect(c).state.running:
            return
        stale = self._registered([node]) if node in self.ports else {}
        self.docker.container.start(c)
        self._apply(node)
        self._set_down(node, False)
        if node in self.ports:
            self._wait_registered([node], stale, timeout=60)

    def pause(self, node: str) -> None:
        c = self._container(node)
        with self._lock:
            if node not in self._paused and self.docker.container.inspect(c).state.running:
                self.docker.container.pause(c)
                self._paused.add(node)

    def resume(self, node: str) -> None:
        c = self._container(node)
        with self._lock:
            if node in self._paused:
                with contextlib.suppress(DockerException):
                    self.docker.container.unpause(c)
                self._paused.discard(node)

    def _in_node(self, node: str, *argv: str, stdin: str | None = None) -> None:
        """Run a command in a running container's network namespace (from the host)."""
        pid = self.docker.container.inspect(self._container(node)).state.pid
        if not pid:
            return  # down: its rules are applied when it starts again
        _sh(["nsenter", "-t", str(pid), "-n", *argv], stdin)

    def filter_rules(self, node: str) -> list[str]:
        """``node``'s filter table: packets from the nodes its grudge names dropped, and
        connections to killed nodes reset."""
        return [
            "*filter",
            ":INPUT ACCEPT [0:0]",
            ":FORWARD ACCEPT [0:0]",
            ":OUTPUT ACCEPT [0:0]",
            *(f"-A INPUT -s {self.ip(o)} -j DROP" for o in sorted(self._grudge.get(node, ()))),
            *(f"-A OUTPUT {self._refused(o)}" for o in sorted(self._down - {node})),
            "COMMIT",
        ]

    def _refused(self, node: str) -> str:
        return f"-d {self.ip(node)}/32 -p tcp -j REJECT --reject-with tcp-reset"

    def _apply(self, node: str) -> None:
        self._in_node(node, "iptables-restore", stdin="\n".join(self.filter_rules(node)) + "\n")

    def _set_down(self, node: str, down: bool) -> None:
        """Make connections to ``node`` refused (``down``) or not, from everywhere."""
        if down == (node in self._down):
            return
        if down:
            self._down.add(node)
            self._engine_iptables("-A", self.chain, *self._refused(node).split(), table="filter")
        else:
            self._down.discard(node)
            self._engine_iptables("-D", self.chain, *self._refused(node).split(), table="filter")
        for other in self.network:
            if other != node:
                self._apply(other)

    def partition(self, grudge: Mapping[str, frozenset[str]]) -> None:
        unknown = (set(grudge) | set().union(*grudge.values())) - set(self.network)
        if unknown:
            raise ValueError(f"cannot partition {sorted(unknown)}; nodes: {self.network}")
        self._grudge = dict(grudge)
        for node in self.network:
            self._apply(node)

    def heal(self) -> None:
        self._grudge = {}
        for node in self.network:
            self._apply(node)
        for node in sorted(self._paused):
            self.resume(node)

    def run_client(self, fn: Callable[[], T]) -> T:
        return run_in_netns(self.engine.netns, fn)

    def node_ip(self, node: str) -> str:
        return self.ip(node)

    def scrape_in(self, fn: Callable[[], None]) -> None:
        run_in_netns(self.engine.netns, fn)

    def logs(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for node, c in self.containers.items():
            try:
                text = str(self.docker.container.logs(c, tail=200))
            except DockerException as e:
                text = f"(no logs: {e})"
            out[node] = text
        return out

    def bookie_configs(self) -> dict[str, Path]:
        return {b: self.directory / b / "bookie.toml" for b in self.bookies if b in self.containers}

    # ------------------------------------------------------------ teardown

    def teardown(self) -> None:
        """Remove every container, the network and the engine's rules; all steps run."""
        errors: list[str] = []
        if self._admin is not None:
            admin = self._admin
            with contextlib.suppress(Exception):
                self.run_client(lambda: (admin.stop(), admin.close()))
            self._admin = None
        for node, c in self.containers.items():
            try:
                text = str(self.docker.container.logs(c))
                (self.directory / node / "container.log").write_text(text)
            except (DockerException, OSError) as e:
                errors.append(f"logs of {node}: {e}")
        for what, fn in (
            ("remove containers", lambda: errors.extend(remove_run(self.docker, self.run_id))),
            *((f"unmount lazyfs of {b}", m.stop) for b, m in self.mounts.items()),
            ("engine nat rules", self._drop_engine_nat),
            ("stop the engine", self.engine.stop if self._started_engine else lambda: None),
        ):
            try:
                fn()
            except Exception as e:
                errors.append(f"{what}: {type(e).__name__}: {e}")
        if errors:
            raise DockerBackendError("teardown was incomplete: " + "; ".join(errors))


class LazyfsDockerBackend(LazyfsDisks, DockerBackend):
    """The Docker backend with each bookie's data on lazyfs, mounted in the engine's
    mount namespace (``<bookie>/disk``) and bound into its container at ``/disk``: it
    can lose unsynced writes."""

    def _new_mount(self, b: str) -> LazyMount:
        d = self.directory / b
        return LazyMount(
            d / "backing", d / "disk", log=d / "lazyfs.log", namespace_of=self.engine.pid()
        )


def foreign_time_namespace(pid: int) -> str | None:
    """Process ``pid``'s time namespace if it is not this process's, else None (also when
    the kernel has no time namespaces or ``pid`` is gone)."""
    try:
        theirs = os.readlink(f"/proc/{pid}/ns/time")
        ours = os.readlink("/proc/self/ns/time")
    except OSError:
        return None
    return theirs if theirs != ours else None


def remove_run(docker: DockerClient, run_id: str | None = None) -> list[str]:
    """Remove the containers and networks of one run (all runs: None); returns errors."""
    errors: list[str] = []
    label = f"{LABEL}={run_id}" if run_id else LABEL
    for c in docker.container.list(all=True, filters=[("label", label)]):
        try:
            docker.container.remove(c, force=True, volumes=True)
        except DockerException as e:
            errors.append(f"remove {c.name}: {e}")
    for n in docker.network.list(filters=[("label", label)]):
        try:
            docker.network.remove(n)
        except DockerException as e:
            errors.append(f"remove network {n.name}: {e}")
    return errors


def cleanup(engine: DockerEngine | None = None) -> list[str]:
    """What `bkref campaign cleanup` removes for Docker: every run's containers, the engine."""
    engine = engine or DockerEngine()
    if not engine.status().running:
        return engine.stop() if engine.pid() is not None else []
    docker = engine.client()
    names = [c.name for c in docker.container.list(all=True, filters=[("label", LABEL)])]
    errors = remove_run(docker)
    removed = [f"container {n}" for n in names]
    pid = engine.pid()
    for daemon, mountpoint in daemons_in_namespace_of(pid) if pid is not None else []:
        stop_daemon(daemon, mountpoint)
        removed.append(f"lazyfs mount {mountpoint} (pid {daemon})")
    return removed + errors + engine.stop()
