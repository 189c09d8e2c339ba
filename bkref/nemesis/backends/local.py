"""The local backend: ZooKeeper and bookies as processes on 127.0.0.1.

It runs the cluster of ``bkref.impl.cluster.local`` (a private ZooKeeper and N
bookie processes). On loopback it kills and restarts bookies (kill -9),
pauses them (SIGSTOP, SIGCONT; a session expiry is a pause longer than the
session timeout) and corrupts their disks. It has no network of nodes, so it
cannot partition, and its bookies keep their data on the host's filesystem,
where a killed process loses nothing: it lacks those two capabilities, and a
campaign that asks for them is refused before it starts.
"""

from __future__ import annotations

import signal
from pathlib import Path

from bkref.impl.cluster.local import ClusterError, LocalCluster
from bkref.impl.cluster.process import log_tail
from bkref.nemesis.backends.base import Backend, NodeRefusedError, bookie_settings


class LocalBackend(Backend):
    """ZooKeeper and bookies as local processes on 127.0.0.1 (no partitions, no lazyfs)."""

    name = "local"

    def __init__(
        self,
        directory: Path,
        bookies: int = 5,
        *,
        plants: frozenset[str] = frozenset(),
        autorecovery: bool = True,
        trace_dir: Path | None = None,
    ) -> None:
        super().__init__(
            directory, bookies, plants=plants, autorecovery=autorecovery, trace_dir=trace_dir
        )
        self.cluster = LocalCluster(
            directory=directory,
            bookie_overrides=bookie_settings(autorecovery),
            plants=plants,
            trace_dir=self.trace_dir,
            metrics=True,  # each bookie's /metrics, scraped for the report
        )

    def setup(self) -> None:
        self.cluster.up(self.size)

    def teardown(self) -> None:
        self.heal()  # a stopped process cannot take SIGTERM
        self.cluster.down()

    @property
    def zk_connect(self) -> str:
        return self.cluster.zk_hosts

    def metrics_targets(self) -> dict[str, str]:
        return {
            f"bookie-{b.index}": f"http://127.0.0.1:{b.http_port}"
            for b in self.cluster.bookies
            if b.http_port is not None
        }

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

    def heal(self) -> None:
        """No partitions on loopback: resume every bookie (a running one ignores it)."""
        for b in self.cluster.bookies:
            self.cluster.signal_bookie(b.index, signal.SIGCONT)

    def data_dir(self, node: str) -> Path:
        return Path(self.cluster.bookies[self._index(node)].directory)

    def logs(self) -> dict[str, str]:
        return {f"bookie-{b.index}": log_tail(b.log_path, 200) for b in self.cluster.bookies}

    def bookie_configs(self) -> dict[str, Path]:
        return {f"bookie-{b.index}": b.config_path for b in self.cluster.bookies}
