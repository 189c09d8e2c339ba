"""A local cluster: a private ZooKeeper plus N bookie processes under one directory.

Layout of DIR: ``zookeeper/`` (the launcher's), ``bookie-<i>/`` with
``bookie.toml``, ``journal/``, ``ledgers/`` and ``bookie.log``, and
``cluster.json`` recording every process with its PID, so that ``status``
and ``down`` work from another process. Processes are stopped by PID, and
only when the PID still runs our command line.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from bkref.impl.bookie.config import BookieConfig
from bkref.impl.cli.plants import plant_argv
from bkref.impl.cluster.process import (
    StateFileError,
    log_tail,
    pid_alive,
    read_state,
    runs_with,
    stop_pid,
    write_state,
)
from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble, free_port
from bkref.impl.meta import layout

STATE_FILE = "cluster.json"


class ClusterError(RuntimeError):
    pass


@dataclass
class BookieProcess:
    index: int
    port: int
    directory: str
    pid: int | None = None
    http_port: int | None = None  # its /metrics and admin API (None: not served)

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        return Path(self.directory) / "bookie.toml"

    @property
    def log_path(self) -> Path:
        return Path(self.directory) / "bookie.log"


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _is_ours(b: BookieProcess) -> bool:
    return b.pid is not None and runs_with(b.pid, b.config_path)


def distinct_port(taken: set[int], draw: Callable[[], int] = free_port) -> int:
    """A free port not in ``taken``. Bookies start without waiting for each other, so a
    port drawn for one is free again until its process binds it, and the OS may hand it
    out twice: two bookies with one id, the second refused for the first one's cookie
    (seen once in a verify run: "directory ... has no cookie but ZooKeeper has one")."""
    for _ in range(100):
        port = draw()
        if port not in taken:
            return port
    raise ClusterError(f"no free port outside {len(taken)} taken ones after 100 draws")


@dataclass
class LocalCluster:
    directory: Path
    bookie_overrides: dict[str, Any] = field(default_factory=dict)
    zookeeper: ZooKeeperEnsemble | None = None
    bookies: list[BookieProcess] = field(default_factory=list)
    zk_root: str = "/ledgers"
    autorecovery: bool = False  # each bookie process also runs an AutoRecovery node
    plants: frozenset[str] = frozenset()  # planted bugs (test-only): `bkref bookie --plant`
    trace_dir: Path | None = None  # bookies log their protocol steps here (`--trace`)
    metrics: bool = False  # each bookie serves /metrics and the admin API on a port of its own
    _children: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.directory = Path(self.directory).resolve()

    @property
    def connection_string(self) -> str:
        assert self.zookeeper is not None
        return self.zookeeper.connection_string

    # ------------------------------------------------------------ lifecycle

    def up(self, bookies: int, *, timeout: float = 60.0, zk_connect: str | None = None) -> None:
        """Start ZooKeeper (unless ``zk_connect`` names one) and ``bookies`` bookies; return
        once every bookie is registered."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if zk_connect is None:
            self.zookeeper = ZooKeeperEnsemble(directory=self.directory / "zookeeper", size=1)
            self.zookeeper.start(timeout=timeout)
            self._zk_hosts = self.zookeeper.connection_string
        else:
            self._zk_hosts = zk_connect
        for _ in range(bookies):
            self.add_bookie(wait=False)
        self._save()
        self.wait_registered([b.index for b in self.bookies], timeout)

    @property
    def zk_hosts(self) -> str:
        return self._zk_hosts

    def add_bookie(
        self, *, wait: bool = True, timeout: float = 60.0, **overrides: object
    ) -> BookieProcess:
        i = len(self.bookies)
        d = self.directory / f"bookie-{i}"
        d.mkdir(parents=True, exist_ok=True)
        b = BookieProcess(i, self._new_port(), str(d))
        settings = {**self.bookie_overrides, **overrides}
        if self.metrics:
            b.http_port = self._new_port()
            settings |= {"httpServerEnabled": True, "httpServerPort": b.http_port}
        cfg = BookieConfig.from_dict(
            {
                "bookiePort": b.port,
                "journalDirectory": str(d / "journal"),
                "ledgerDirectories": [str(d / "ledgers")],
                "zkServers": self._zk_hosts,
                "zkLedgersRootPath": self.zk_root,
                "rack": f"/rack-{i}",
                **settings,
            }
        )
        b.config_path.write_text(cfg.to_toml())
        self.bookies.append(b)
        self.start_bookie(i, wait=wait, timeout=timeout)
        return b

    def _new_port(self) -> int:
        """A free port that no bookie of this cluster was given (see :func:`distinct_port`)."""
        taken = {p for b in self.bookies for p in (b.port, b.http_port) if p is not None}
        return distinct_port(taken)

    def write_config(self, index: int, **overrides: object) -> None:
        b = self.bookies[index]
        cfg = BookieConfig.load(b.config_path)
        d = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
        b.config_path.write_text(BookieConfig.from_dict({**d, **overrides}).to_toml())

    def start_bookie(self, index: int, *, wait: bool = True, timeout: float = 60.0) -> None:
        b = self.bookies[index]
        if b.pid is not None and pid_alive(b.pid):
            raise ClusterError(f"bookie {index} is already running (pid {b.pid})")
        stale = self._owners([index])
        with b.log_path.open("ab") as log:
            p = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bkref.impl.bookie",
                    "--config",
                    str(b.config_path),
                    *(["--autorecovery"] if self.autorecovery else []),
                    *plant_argv(self.plants),
                    *(["--trace", str(self.trace_dir)] if self.trace_dir is not None else []),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._children[index] = p
        b.pid = p.pid
        self._save()
        if wait:
            self.wait_registered([index], timeout, stale=stale)

    def _owners(self, indexes: list[int]) -> dict[str, int]:
        """Session ids of the registrations that exist now (a killed bookie's linger until
        its session expires)."""
        zk = KazooClient(hosts=self._zk_hosts)
        zk.start(timeout=15)
        try:
            return self._registered(zk, indexes)
        finally:
            zk.stop()
            zk.close()

    def _registered(self, zk: KazooClient, indexes: list[int]) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in indexes:
            bid = self.bookies[i].bookie_id
            for path in (layout.available(self.zk_root), layout.readonly(self.zk_root)):
                stat = zk.exists(f"{path}/{bid}")
                if stat is not None:
                    out[bid] = int(stat.ephemeralOwner)
        return out

    def wait_registered(
        self, indexes: list[int], timeout: float = 60.0, stale: dict[str, int] | None = None
    ) -> None:
        """Wait until each bookie has registered (by a session other than ``stale``'s) and
        accepts connections: a bookie registers before it listens (see ``BookieServer.serve``),
        so on a loaded machine a registered bookie may still refuse a client for a while."""
        stale = stale or {}
        zk = KazooClient(hosts=self._zk_hosts)
        zk.start(timeout=15)
        try:
            deadline = time.monotonic() + timeout
            while True:
                owners = self._registered(zk, indexes)
                missing = [
                    i
                    for i in indexes
                    if owners.get(self.bookies[i].bookie_id)
                    in (None, stale.get(self.bookies[i].bookie_id))
                    or not _accepts(self.bookies[i].port)
                ]
                if not missing:
                    return
                for i in missing:
                    b = self.bookies[i]
                    child = self._children.get(i)
                    dead = (child.poll() is not None) if child else not (b.pid and pid_alive(b.pid))
                    if dead:
                        b.pid = None
                        self._save()
                        raise ClusterError(
                            f"bookie {i} ({b.bookie_id}) exited during start:\n" + self.log_tail(i)
                        )
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"bookies {missing} did not register and listen within {timeout} s"
                    )
                time.sleep(0.1)
        finally:
            zk.stop()
            zk.close()

    def log_tail(self, index: int, lines: int = 20) -> str:
        return log_tail(self.bookies[index].log_path, lines)

    def kill_bookie(self, index: int) -> None:
        """SIGKILL, as a crash would."""
        self._signal(index, signal.SIGKILL, 0.0)

    def stop_bookie(self, index: int, grace: float = 10.0) -> None:
        self._signal(index, signal.SIGTERM, grace)

    def signal_bookie(self, index: int, sig: signal.Signals) -> None:
        b = self.bookies[index]
        if b.pid is not None and _is_ours(b):
            os.kill(b.pid, sig)

    def _signal(self, index: int, sig: signal.Signals, grace: float) -> None:
        b = self.bookies[index]
        if b.pid is None:
            return
        child = self._children.pop(index, None)
        # Not our child and no longer running our config: the PID was re-used.
        if child is not None or _is_ours(b):
            stop_pid(b.pid, child=child, sig=sig, grace=grace)
        b.pid = None
        self._save()

    def down(self) -> None:
        for b in self.bookies:
            self.stop_bookie(b.index)
        if self.zookeeper is not None:
            self.zookeeper.stop()
        self._save()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ------------------------------------------------------------ status and state

    def status(self) -> list[dict[str, Any]]:
        zk = [] if self.zookeeper is None else list(self.zookeeper.servers.values())
        rows: list[dict[str, Any]] = [
            {
                "role": "zookeeper",
                "address": s.address,
                "pid": s.pid,
                "alive": bool(s.pid and pid_alive(s.pid)),
            }
            for s in zk
        ]
        rows += [
            {
                "role": "bookie",
                "address": b.bookie_id,
                "pid": b.pid,
                "alive": bool(b.pid and pid_alive(b.pid)),
                "directory": b.directory,
                **({} if b.http_port is None else {"metrics": f"http://127.0.0.1:{b.http_port}"}),
            }
            for b in self.bookies
        ]
        return rows

    def _save(self) -> None:
        state = {
            "zk_hosts": self._zk_hosts,
            "zk_root": self.zk_root,
            "has_zookeeper": self.zookeeper is not None,
            "autorecovery": self.autorecovery,
            "metrics": self.metrics,
            "plants": sorted(self.plants),
            "trace_dir": None if self.trace_dir is None else str(self.trace_dir),
            "bookie_overrides": self.bookie_overrides,
            "bookies": [asdict(b) for b in self.bookies],
        }
        write_state(self.directory / STATE_FILE, state)

    @classmethod
    def load(cls, directory: Path) -> LocalCluster:
        path = Path(directory).resolve() / STATE_FILE
        try:
            state = read_state(
                path,
                f"no cluster was started in {directory} ({path} is missing)",
                "the cluster's state bkref writes",
            )
        except StateFileError as e:
            raise ClusterError(str(e)) from None
        try:
            c = cls(
                Path(directory),
                dict(state["bookie_overrides"]),
                zk_root=state["zk_root"],
                autorecovery=bool(state.get("autorecovery", False)),
                metrics=bool(state.get("metrics", False)),
                plants=frozenset(state.get("plants", ())),
                trace_dir=None if state.get("trace_dir") is None else Path(state["trace_dir"]),
            )
            c._zk_hosts = state["zk_hosts"]
            has_zookeeper = state["has_zookeeper"]
            bookies = [BookieProcess(**raw) for raw in state["bookies"]]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ClusterError(
                f"{path}: not a cluster state file bkref wrote ({type(e).__name__}: {e})"
            ) from None
        if has_zookeeper:
            c.zookeeper = ZooKeeperEnsemble.load(c.directory / "zookeeper")
        for b in bookies:
            if b.pid is not None and not (pid_alive(b.pid) and _is_ours(b)):
                b.pid = None
            c.bookies.append(b)
        return c
