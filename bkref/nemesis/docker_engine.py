"""A private Docker engine: Debian's ``dockerd`` in a network namespace of its own.

The engine is our own process, with its own data root, exec root, pidfile and
unix socket under one directory, and it runs inside a network namespace made
for it (``bkref-docker``), so that its bridges, veth pairs and iptables rules
live there and never in the host's namespace. The campaign's control process
enters that namespace (:func:`bkref.impl.cluster.netns.run_in_netns`) and talks to
container addresses directly.

``ip netns exec`` gives the engine a private mount namespace in which /sys is
mounted again, without /sys/fs/cgroup; dockerd then fails with "Devices
cgroup isn't mounted". So it starts through a small wrapper that mounts the
host's cgroup hierarchies again (read from /proc/self/mountinfo) inside that
private mount namespace, then execs dockerd. Every mount the engine makes
(the cgroup hierarchies, overlay layers, containerd's state) is in that mount
namespace and disappears with its last process. Containers' cgroups go under
``bkref-docker`` in each hierarchy (``--cgroup-parent``), so stopping can
remove exactly the directories the engine made.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from python_on_whales import DockerClient

from bkref.impl.cluster.process import log_tail, pid_alive, runs_with, stop_pid, wait_until

DEFAULT_DIR = Path("/var/lib/bkref-docker")
NETNS_PREFIX = "bkref-docker"
CGROUP_PARENT = "bkref-docker"
CGROUP_ROOT = Path("/sys/fs/cgroup")
REQUIRED = {"dockerd": "docker.io", "containerd": "docker.io", "runc": "docker.io"}


class EngineError(RuntimeError):
    """The private engine cannot start, or stop cleanly."""


def netns_name(directory: Path) -> str:
    """The engine's network namespace: one per engine directory."""
    directory = directory.resolve()
    if directory == DEFAULT_DIR:
        return NETNS_PREFIX
    return f"{NETNS_PREFIX}-{hashlib.sha256(str(directory).encode()).hexdigest()[:8]}"


def cgroup_mounts(mountinfo: str) -> list[tuple[str, str, str]]:
    """The host's cgroup filesystems under /sys/fs/cgroup: (mount point, fstype, options).

    Options are what ``mount -o`` needs to mount the same hierarchy again: the
    controllers (``none`` for a named hierarchy without any) and ``name=``.
    """
    found: list[tuple[str, str, str]] = []
    for line in mountinfo.splitlines():
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        point = pre.split()[4]
        fstype, _source, superopts = [*post.split(), "", ""][:3]
        if not point.startswith(str(CGROUP_ROOT)):
            continue
        if fstype == "tmpfs" and point == str(CGROUP_ROOT):
            found.append((point, "tmpfs", "mode=755"))
        elif fstype == "cgroup2":
            found.append((point, "cgroup2", ""))
        elif fstype == "cgroup":
            opts = [o for o in superopts.split(",") if o not in ("rw", "ro")]
            if all(o.startswith("name=") for o in opts):
                opts.insert(0, "none")
            found.append((point, "cgroup", ",".join(opts)))
    return found


def wrapper_script(mounts: list[tuple[str, str, str]]) -> str:
    """A shell script that mounts ``mounts`` in order, then execs its arguments."""
    lines = ["#!/bin/sh", "# Written by nemesis.docker_engine: see its docstring.", "set -e"]
    for point, fstype, opts in mounts:
        option = f" -o {opts}" if opts else ""
        lines.append(f"mkdir -p {point}")
        lines.append(f"mount -t {fstype}{option} {fstype} {point}")
    lines.append('exec "$@"')
    return "\n".join(lines) + "\n"


def missing_packages() -> list[str]:
    """Debian packages the engine needs that are not installed."""
    return sorted({pkg for tool, pkg in REQUIRED.items() if shutil.which(tool) is None})


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@dataclass
class EngineStatus:
    running: bool
    pid: int | None
    socket: Path
    netns: str
    detail: str


class DockerEngine:
    """Start, stop and inspect the private engine whose files live in ``directory``."""

    def __init__(self, directory: Path = DEFAULT_DIR) -> None:
        self.directory = directory.resolve()
        self.netns = netns_name(self.directory)
        self.socket = self.directory / "docker.sock"
        self.pidfile = self.directory / "dockerd.pid"
        self.log = self.directory / "dockerd.log"
        self.data_root = self.directory / "data"
        self.exec_root = self.directory / "exec"
        self.wrapper = self.directory / "dockerd-wrapper.sh"
        # `ip netns exec` and the wrapper exec dockerd: this child is dockerd itself.
        self._child: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def client(self) -> DockerClient:
        return DockerClient(host=self.host)

    def pid(self) -> int | None:
        """dockerd's PID, if the pidfile names a live dockerd of this directory."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) and runs_with(pid, self.data_root) else None

    def responds(self) -> bool:
        if not self.socket.exists():
            return False
        done = _run(["docker", "-H", self.host, "version", "--format", "{{.Server.Version}}"])
        return done.returncode == 0

    def status(self) -> EngineStatus:
        pid = self.pid()
        up = pid is not None and self.responds()
        if up:
            detail = f"dockerd {pid} answers on {self.socket}, in network namespace {self.netns}"
        elif pid is not None:
            detail = f"dockerd {pid} runs but does not answer on {self.socket}"
        else:
            detail = f"no engine runs from {self.directory}"
        return EngineStatus(up, pid, self.socket, self.netns, detail)

    # ------------------------------------------------------------ start

    def _check_can_start(self) -> None:
        if os.geteuid() != 0:
            raise EngineError(
                "the private Docker engine needs root (network namespaces, mounts, cgroups)"
            )
        missing = missing_packages()
        if missing:
            raise EngineError(
                f"Debian packages missing: {' '.join(missing)}; run `make docker-setup`"
            )
        if len(str(self.exec_root)) > 60:  # containerd's sockets live there (108-byte limit)
            raise EngineError(f"engine directory {self.directory} is too long for unix sockets")

    def start(self, timeout: float = 60.0) -> float:
        """Start the engine (no-op if it already answers); returns the seconds it took."""
        t0 = time.monotonic()
        if self.status().running:
            return 0.0
        self._check_can_start()
        self.stop()  # whatever a crashed engine left
        for d in (self.directory, self.data_root, self.exec_root):
            d.mkdir(parents=True, exist_ok=True)
        self.wrapper.write_text(
            wrapper_script(cgroup_mounts(Path("/proc/self/mountinfo").read_text()))
        )
        self.wrapper.chmod(0o755)
        self._ip(["netns", "add", self.netns])
        self._ip(["netns", "exec", self.netns, "ip", "link", "set", "lo", "up"])
        argv = [
            "ip", "netns", "exec", self.netns, str(self.wrapper),
            "dockerd",
            "--data-root", str(self.data_root),
            "--exec-root", str(self.exec_root),
            "--pidfile", str(self.pidfile),
            "-H", self.host,
            "--cgroup-parent", CGROUP_PARENT,
            "--containerd-namespace", "bkref",
            "--containerd-plugins-namespace", "bkref-plugins",
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self._child = proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        if not wait_until(lambda: proc.poll() is not None or self.status().running, timeout, 0.2):
            self.stop()
            raise EngineError(
                f"dockerd did not answer on {self.socket} within {timeout:.0f}s; "
                f"the end of {self.log}:\n{log_tail(self.log, 20)}"
            )
        if proc.poll() is not None:
            self.stop()
            raise EngineError(
                f"dockerd exited with {proc.returncode}; the end of {self.log}:\n"
                f"{log_tail(self.log, 20)}"
            )
        return time.monotonic() - t0

    def _ip(self, args: list[str]) -> None:
        done = _run(["ip", *args])
        if done.returncode != 0:
            raise EngineError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")

    # ------------------------------------------------------------ stop

    def stop(self) -> list[str]:
        """Stop the engine and remove what it made; returns what was removed."""
        removed: list[str] = []
        pid = self.pid()
        if pid is not None:
            child = self._child if self._child is not None and self._child.pid == pid else None
            stop_pid(pid, child=child, grace=20.0)  # it stops its containers and containerd
            removed.append(f"dockerd {pid}")
        if self._child is not None and self._child.poll() is None:
            stop_pid(self._child.pid, child=self._child)
        if self._child is not None:
            self._child.wait()
            self._child = None
        netns_file = Path("/run/netns") / self.netns
        if netns_file.exists():
            # Whatever still runs there (a shim, a container) was started by this engine.
            pids = _run(["ip", "netns", "pids", self.netns]).stdout.split()
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(p), signal.SIGKILL)
                removed.append(f"process {p}")
            wait_until(lambda: not _run(["ip", "netns", "pids", self.netns]).stdout.strip(), 10)
            self._ip(["netns", "del", self.netns])
            removed.append(f"network namespace {self.netns}")
        removed += self._remove_cgroups()
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()
        return removed

    def _remove_cgroups(self) -> list[str]:
        removed: list[str] = []
        if not CGROUP_ROOT.is_dir():
            return removed
        for hierarchy in sorted(CGROUP_ROOT.iterdir()):
            top = hierarchy / CGROUP_PARENT
            if not top.is_dir():
                continue
            # Children first: a cgroup directory goes only once it is empty of cgroups.
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
                removed.append(f"cgroup {top}")
        return removed
