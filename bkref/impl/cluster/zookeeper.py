"""Start Debian's ZooKeeper as our own child processes: standalone or an ensemble.

Never the system service: each server gets a private ``zoo.cfg``, data dir and
log file under a directory we own, listens only on 127.0.0.1 (or the host we
are given), and is stopped by the PID we started. The state of a running
ensemble is written to ``<dir>/zookeeper.json`` so that another process (the
``bkref zookeeper`` CLI, a campaign's cleanup) can find and stop it.

Short ``tickTime`` and session timeouts are the defaults, because tests and
campaigns want session expiry and leader election to happen in seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from bkref.impl.cluster.netns import run_in_netns
from bkref.impl.cluster.process import (
    StateFileError,
    log_tail,
    pid_alive,
    read_state,
    runs_with,
    stop_pid,
    write_state,
)

STATE_FILE = "zookeeper.json"
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
# Debian's zookeeper.jar names its dependencies in its manifest's Class-Path;
# slf4j-simple (same Debian package as slf4j-api) gives us a log to read.
DEFAULT_CLASSPATH = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")


class ZooKeeperError(RuntimeError):
    """ZooKeeper could not be started, reached or stopped; the message says why."""


@dataclass(frozen=True)
class ZooKeeperSettings:
    """Server settings; names follow zoo.cfg. Defaults are short, for tests."""

    tick_time_ms: int = 200
    init_limit: int = 20  # ticks a follower may take to connect and sync to the leader
    sync_limit: int = 10  # ticks a follower may lag behind the leader
    min_session_timeout_ms: int = 400
    max_session_timeout_ms: int = 30_000
    heap_mb: int = 256
    # fsync of the transaction log before each answer. Off only where no test crashes the
    # machine (a killed server's writes are in the page cache all the same): the
    # refinement machine writes hundreds of znodes per example.
    force_sync: bool = True


@dataclass
class ZooKeeperServer:
    """One server of an ensemble and where it lives."""

    server_id: int
    host: str
    client_port: int
    quorum_port: int
    election_port: int
    directory: str
    pid: int | None = None
    netns: str | None = None  # the network namespace it runs in; None: this one

    @property
    def address(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def config_path(self) -> Path:
        return Path(self.directory) / "zoo.cfg"

    @property
    def log_path(self) -> Path:
        return Path(self.directory) / "zookeeper.log"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def four_letter_word(host: str, port: int, word: str, timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command (``srvr``, ``ruok``, ...) and return the reply."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(word.encode("ascii"))
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def server_mode(server: ZooKeeperServer) -> str | None:
    """``leader``, ``follower`` or ``standalone`` if the server serves clients, else None."""
    try:
        reply = run_in_netns(
            server.netns, lambda: four_letter_word(server.host, server.client_port, "srvr")
        )
    except OSError:
        return None
    for line in reply.splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None  # "This ZooKeeper instance is not currently serving requests"


def _find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and Path(java_home, "bin", "java").exists():
        return str(Path(java_home, "bin", "java"))
    java = shutil.which("java")
    if java is None:
        raise ZooKeeperError(
            "no `java` on PATH and JAVA_HOME is not set; ZooKeeper needs a JRE. "
            "Run `make setup` (it installs default-jre-headless) or set JAVA_HOME."
        )
    return java


def _classpath(conf_dir: Path) -> str:
    override = os.environ.get("BKREF_ZOOKEEPER_CLASSPATH")
    jars = override.split(":") if override else [j for j in DEFAULT_CLASSPATH if Path(j).exists()]
    if not any(Path(j).name.startswith("zookeeper") for j in jars):
        raise ZooKeeperError(
            "ZooKeeper's jar was not found at /usr/share/java/zookeeper.jar. "
            "Install Debian's `zookeeper` package (`make setup` does) or set "
            "BKREF_ZOOKEEPER_CLASSPATH to a classpath that contains it."
        )
    return ":".join([str(conf_dir), *jars])


def _setpriv() -> str:
    found = shutil.which("setpriv")
    if found is None:
        raise ZooKeeperError(
            "setpriv was not found: a server that dies with its owner needs it. Install "
            "Debian's `util-linux` package, or start the ensemble without die_with_owner."
        )
    return found


@dataclass
class ZooKeeperEnsemble:
    """A standalone server (size 1) or an ensemble of ``size`` servers.

    By default every server listens on ``host`` (127.0.0.1) on ports the OS
    picks. With ``placement`` (one ``(network namespace, address)`` pair per
    server) each server runs inside its own namespace on its own address
    with the standard ports, so that partitions between them are real.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Servers
    are addressed by their ``server_id`` (1-based, the ``myid`` of zoo.cfg).

    With ``die_with_owner`` each server gets SIGKILL when the thread that
    started it ends (Linux's parent-death signal, set by util-linux's
    ``setpriv``), so an owner killed before its ``stop()`` leaves no orphan
    server behind. For owners that start servers on their main thread only: a
    server started from a worker thread would die with that thread.
    """

    directory: Path
    size: int = 1
    host: str = "127.0.0.1"
    placement: list[tuple[str, str]] | None = None
    settings: ZooKeeperSettings = field(default_factory=ZooKeeperSettings)
    die_with_owner: bool = False
    servers: dict[int, ZooKeeperServer] = field(default_factory=dict)
    _children: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.placement is not None:
            self.size = len(self.placement)
        if self.size < 1:
            raise ValueError(f"an ensemble needs at least one server, not {self.size}")
        self.directory = Path(self.directory).resolve()

    # ------------------------------------------------------------ addresses

    @property
    def connection_string(self) -> str:
        """The client connection string, e.g. ``127.0.0.1:2181,127.0.0.1:2182``."""
        return ",".join(s.address for s in self.servers.values())

    def mode(self, server_id: int) -> str | None:
        return server_mode(self.servers[server_id])

    def leader(self) -> int | None:
        """The server id of the current leader (or of the standalone server)."""
        for sid, server in self.servers.items():
            if server_mode(server) in {"leader", "standalone"}:
                return sid
        return None

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 60.0) -> None:
        """Write the configs, start every server and wait until the ensemble serves."""
        if not self.servers:
            self._plan()
        for sid in self.servers:
            self.start_server(sid, wait=False)
        self.wait_serving(timeout)

    def _plan(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for sid in range(1, self.size + 1):
            server_dir = self.directory / f"zk{sid}"
            if self.placement is not None:
                netns, address = self.placement[sid - 1]
                ports = (2181, 2888, 3888)  # each server has an address of its own
            else:
                netns, address = None, self.host
                ports = (free_port(address), free_port(address), free_port(address))
            self.servers[sid] = ZooKeeperServer(
                server_id=sid,
                host=address,
                client_port=ports[0],
                quorum_port=ports[1],
                election_port=ports[2],
                directory=str(server_dir),
                netns=netns,
            )
        for server in self.servers.values():
            self._write_config(server)

    def _write_config(self, server: ZooKeeperServer) -> None:
        s = self.settings
        data_dir = Path(server.directory) / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={s.tick_time_ms}",
            f"initLimit={s.init_limit}",
            f"syncLimit={s.sync_limit}",
            f"dataDir={data_dir}",
            f"clientPort={server.client_port}",
            f"clientPortAddress={server.host}",
            f"minSessionTimeout={s.min_session_timeout_ms}",
            f"maxSessionTimeout={s.max_session_timeout_ms}",
            "admin.enableServer=false",  # its Jetty would take port 8080
            "4lw.commands.whitelist=*",  # srvr/ruok/stat for readiness and leader checks
            "autopurge.purgeInterval=0",
        ]
        if not s.force_sync:
            lines.append("forceSync=no")
        if self.size > 1:
            (data_dir / "myid").write_text(f"{server.server_id}\n")
            lines += [
                f"server.{o.server_id}={o.host}:{o.quorum_port}:{o.election_port}"
                for o in self.servers.values()
            ]
        else:
            lines.append("standaloneEnabled=true")
        server.config_path.write_text("\n".join(lines) + "\n")

    def start_server(self, server_id: int, *, wait: bool = True, timeout: float = 60.0) -> None:
        """Start (or restart) one server with its existing config and data."""
        server = self.servers[server_id]
        if server.pid is not None and pid_alive(server.pid):
            raise ZooKeeperError(
                f"ZooKeeper server {server_id} is already running (pid {server.pid})"
            )
        prefix = ["ip", "netns", "exec", server.netns] if server.netns else []
        if self.die_with_owner:
            prefix = [_setpriv(), "--pdeathsig", "KILL", "--", *prefix]
        argv = [
            *prefix,  # setpriv and `ip netns exec` exec java: the PID we record is java's
            _find_java(),
            f"-Xmx{self.settings.heap_mb}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # faster start; these servers are small
            "-Djava.net.preferIPv4Stack=true",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-cp",
            _classpath(Path(server.directory)),
            MAIN_CLASS,
            str(server.config_path),
        ]
        log = server.log_path.open("ab")
        try:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=server.directory,
                start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not java's
            )
        finally:
            log.close()
        self._children[server_id] = child
        server.pid = child.pid
        self._save_state()
        if wait:
            self._wait(lambda: server_mode(server) is not None, timeout, f"server {server_id}")

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Wait until every running server serves and, for an ensemble, one leads."""

        def ready() -> bool:
            running = [s for s in self.servers.values() if s.pid is not None]
            modes = [server_mode(s) for s in running]
            return all(m is not None for m in modes) and any(
                m in {"leader", "standalone"} for m in modes
            )

        self._wait(ready, timeout, "the ensemble")

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            for sid, child in self._children.items():
                if child.poll() is not None and self.servers[sid].pid == child.pid:
                    raise ZooKeeperError(
                        f"ZooKeeper server {sid} exited with status {child.returncode} while "
                        f"starting; see its log {self.servers[sid].log_path}:\n"
                        + self._log_tail(sid)
                    )
            time.sleep(0.1)
        logs = "\n".join(f"--- server {sid}\n{self._log_tail(sid)}" for sid in self.servers)
        raise ZooKeeperError(
            f"{what} did not serve within {timeout:.0f} s; last log lines:\n{logs}"
        )

    def _log_tail(self, server_id: int) -> str:
        return log_tail(self.servers[server_id].log_path, 15)

    def kill(self, server_id: int) -> None:
        """SIGKILL one server, as a crash would."""
        self._signal_and_reap(server_id, signal.SIGKILL, grace=0.0)

    def stop_server(self, server_id: int, grace: float = 5.0) -> None:
        """SIGTERM one server, then SIGKILL after ``grace`` seconds."""
        self._signal_and_reap(server_id, signal.SIGTERM, grace=grace)

    def stop(self) -> None:
        """Stop every server we started, by PID; safe to call twice."""
        for sid in self.servers:
            self.stop_server(sid)

    def _signal_and_reap(self, server_id: int, sig: signal.Signals, grace: float) -> None:
        server = self.servers[server_id]
        pid = server.pid
        if pid is None:
            return
        child = self._children.pop(server_id, None)
        # Not our child and no longer running our config: the PID was re-used.
        if child is not None or runs_with(pid, server.config_path):
            stop_pid(pid, child=child, sig=sig, grace=grace)
        server.pid = None
        self._save_state()

    # ------------------------------------------------------------ persistence

    def _save_state(self) -> None:
        state = {
            "size": self.size,
            "host": self.host,
            "placement": self.placement,
            "settings": asdict(self.settings),
            "servers": [asdict(s) for s in self.servers.values()],
        }
        write_state(self.directory / STATE_FILE, state)

    @classmethod
    def load(cls, directory: Path) -> ZooKeeperEnsemble:
        """The ensemble recorded in ``directory`` by an earlier :meth:`start`."""
        path = Path(directory).resolve() / STATE_FILE
        try:
            state = read_state(
                path,
                f"no ZooKeeper was started in {directory} ({path} does not exist)",
                "the ensemble's state bkref writes",
            )
        except StateFileError as e:
            raise ZooKeeperError(str(e)) from None
        try:
            ensemble = cls(
                directory=Path(directory),
                size=int(state["size"]),
                host=str(state["host"]),
                placement=[(str(ns), str(ip)) for ns, ip in state.get("placement") or []] or None,
                settings=ZooKeeperSettings(**state["settings"]),
            )
            servers = [ZooKeeperServer(**raw) for raw in state["servers"]]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ZooKeeperError(
                f"{path}: not a ZooKeeper state file bkref wrote ({type(e).__name__}: {e})"
            ) from None
        for server in servers:
            if server.pid is not None and not (
                pid_alive(server.pid) and runs_with(server.pid, server.config_path)
            ):
                server.pid = None
            ensemble.servers[server.server_id] = server
        return ensemble

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
