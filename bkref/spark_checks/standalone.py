"""A real standalone Spark cluster on 127.0.0.1: one master, one worker.

    python -m bkref.spark_checks.standalone --dir DIR   # prints the master URL, waits

Both are the pyspark package's own JVMs (``bin/spark-class`` with the
``Master`` and ``Worker`` classes, ``SPARK_HOME`` the package directory),
bound to 127.0.0.1 only, on free ports chosen at start. Under DIR: each
process's log (``master.log``, ``worker.log``, stdout and stderr together) and
the worker's ``work/`` (one directory per application with its executors'
logs). The worker offers the machine's cores and :data:`WORKER_MEMORY`.

:class:`StandaloneCluster` is a context manager: entering starts the master,
then the worker, and returns once the master's JSON (``/json/`` on its web UI
port) lists the worker ALIVE; leaving stops both. Each JVM leads a process
group of its own (spark-class execs java in place), so stopping signals the
group: the worker's executors go with it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

HOST: Final = "127.0.0.1"
WORKER_MEMORY: Final = "2g"  # for the executors; the check's tables are a few GB at most here
START_TIMEOUT: Final = 90.0  # seconds for the worker to register (a cold JVM takes ~10 s)
STOP_TIMEOUT: Final = 15.0  # seconds after SIGTERM before SIGKILL
# Spark properties of both JVMs: no REST submission server (it would take the
# fixed port 6066 and clash with a second cluster), and the executors' logs
# under work/ kept until the directory is removed.
PROPERTIES: Final = """\
spark.master.rest.enabled false
spark.worker.cleanup.enabled false
"""
MASTER_CLASS: Final = "org.apache.spark.deploy.master.Master"
WORKER_CLASS: Final = "org.apache.spark.deploy.worker.Worker"


class ClusterError(RuntimeError):
    """The cluster did not come up; the message names the log to read."""


def spark_home() -> Path:
    """The pyspark package directory: it holds ``bin/spark-class`` and ``jars/``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    """A port nobody listens on now (the JVM binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _env(home: Path) -> dict[str, str]:
    # Not the caller's PYTHONPATH: executors import bkref from the zip the
    # driver ships (session.py), as on a cluster of other machines.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SPARK_HOME"] = str(home)
    env["SPARK_LOCAL_IP"] = HOST  # every socket of the JVMs and their executors on loopback
    env["SPARK_LOCAL_HOSTNAME"] = HOST  # and the name they advertise
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


def group_members(pgids: list[int]) -> list[int]:
    """PIDs of the live processes (zombies are dead) in any of these process groups."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited while we looked
            continue
        if fields[0] != "Z" and int(fields[2]) in pgids:
            found.append(int(stat.parent.name))
    return found


@dataclass
class StandaloneCluster:
    """One master and one worker under ``directory``; see the module docstring."""

    directory: Path
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    memory: str = WORKER_MEMORY
    timeout: float = START_TIMEOUT
    master_port: int = 0
    master_ui_port: int = 0
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started_in: float = 0.0  # seconds from start to the worker ALIVE

    @property
    def url(self) -> str:
        """The master URL for ``--master``."""
        return f"spark://{HOST}:{self.master_port}"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.master_ui_port}"

    def log(self, role: str) -> Path:
        return self.directory / f"{role}.log"

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes.values()]

    def _spawn(self, role: str, args: list[str], env: dict[str, str]) -> None:
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        with open(self.log(role), "ab") as log:
            self.processes[role] = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.directory,
                start_new_session=True,  # its own process group: stop() signals the group
            )

    def state(self) -> dict[str, Any]:
        """The master's view: workers, active and completed applications."""
        url = f"{self.ui_url}/json/"  # http on 127.0.0.1, built here
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310
            data: dict[str, Any] = json.load(r)
        return data

    def start(self) -> StandaloneCluster:
        began = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        work = self.directory / "work"
        work.mkdir(exist_ok=True)
        env = _env(spark_home())
        properties = self.directory / "spark.properties"
        properties.write_text(PROPERTIES)
        common = ["--host", HOST, "--properties-file", str(properties)]
        self.master_port, self.master_ui_port = free_port(), free_port()
        ui = str(self.master_ui_port)
        try:
            self._spawn(
                "master",
                [MASTER_CLASS, *common, "--port", str(self.master_port), "--webui-port", ui],
                env,
            )
            worker = [WORKER_CLASS, *common, "--port", str(free_port())]
            worker += ["--webui-port", str(free_port()), "--cores", str(self.cores)]
            worker += ["--memory", self.memory, "--work-dir", str(work), self.url]
            self._spawn("worker", worker, env)
            self._await_worker(began + self.timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def _await_worker(self, deadline: float) -> None:
        """Until the master lists an ALIVE worker; a JVM that exits or the
        deadline passing is a ClusterError naming the log to read."""
        while True:
            for role, p in self.processes.items():
                if p.poll() is not None:
                    raise ClusterError(
                        f"the Spark {role} exited with status {p.returncode} before the "
                        f"worker registered; see {self.log(role)}"
                    )
            with contextlib.suppress(OSError, ValueError):  # the UI is not up yet
                if any(w.get("state") == "ALIVE" for w in self.state().get("workers", [])):
                    return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"no Spark worker registered with {self.url} within {self.timeout:.0f} s; "
                    f"see {self.log('worker')} and {self.log('master')}"
                )
            time.sleep(0.25)

    def stop(self) -> None:
        """SIGTERM to each process group (worker first: it takes its executors
        down), wait, then SIGKILL what is left."""
        for role in ("worker", "master"):
            p = self.processes.get(role)
            if p is not None and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes.values():
            try:
                p.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        # an executor survives its worker's SIGKILL in the worker's group: sweep the groups,
        # then wait until they are empty (a SIGKILL is delivered, not yet acted on, when
        # killpg returns): stop() returns only once nothing it started runs.
        groups = [p.pid for p in self.processes.values()]
        deadline = time.monotonic() + STOP_TIMEOUT
        while left := group_members(groups):
            for pgid in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"Spark processes {sorted(left)} still run {STOP_TIMEOUT:.0f} s after "
                    "SIGKILL (uninterruptible sleep?); look at them with ps and end them by PID"
                )
            time.sleep(0.05)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None, out: IO[str] = sys.stdout) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bkref.spark_checks.standalone",
        description="Start a standalone Spark master and worker on 127.0.0.1, print the "
        "master URL, wait until interrupted, stop both.",
    )
    p.add_argument("--dir", type=Path, required=True, help="logs and the worker's work dir")
    p.add_argument("--memory", default=WORKER_MEMORY, help=f"worker memory ({WORKER_MEMORY})")
    args = p.parse_args(argv)
    if args.dir.exists() and not args.dir.is_dir():
        print(f"standalone: --dir {args.dir}: not a directory; name a directory", file=sys.stderr)
        return 2
    try:
        with StandaloneCluster(args.dir, memory=args.memory) as c:
            print(c.url, file=out, flush=True)
            up = f"master UI {c.ui_url}; up in {c.started_in:.1f} s; Ctrl-C stops"
            print(up, file=sys.stderr)
            # blocked first so that sigwait, not the default handler, receives them
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    except ClusterError as e:
        print(f"standalone: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
