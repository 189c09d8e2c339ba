"""The Docker backend's containers as it would create them, without an engine: what each
binds and runs, and the clock check of traced runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bkref.nemesis.backends.docker import TRACES, DockerBackend, foreign_time_namespace
from bkref.nemesis.docker_engine import DockerEngine


def _backend(tmp_path: Path, *, traced: bool) -> DockerBackend:
    return DockerBackend(
        tmp_path / "cluster",
        3,
        engine=DockerEngine(tmp_path / "engine"),  # never started
        plants=frozenset({"ack-before-fsync"}),
        trace_dir=tmp_path / "run" / "traces" if traced else None,
    )


def _bookie_argv(command: list[str]) -> list[str]:
    """What ``sh -c ENTRY -- ARGV`` passes to bkref-node."""
    assert command[0] == "-c"
    assert command[1].endswith('exec bkref-node "$@"')
    assert command[2] == "--"
    return command[3:]


def test_a_traced_run_binds_its_trace_directory_into_each_bookie_and_names_it(
    tmp_path: Path,
) -> None:
    backend = _backend(tmp_path, traced=True)
    traces = str(tmp_path / "run" / "traces")
    for b in backend.bookies:
        assert backend.volumes(b) == [
            (str(tmp_path / "cluster" / b / "data"), "/data"),
            (traces, TRACES),
        ]
        argv = _bookie_argv(backend.bookie_command(b))
        assert argv == [
            "bookie",
            "/data/bookie.toml",
            "--autorecovery",
            "--plant",
            "ack-before-fsync",
            "--trace",
            TRACES,
        ]
    for z in backend.zookeepers:  # ZooKeeper logs no steps
        assert backend.volumes(z) == [(str(tmp_path / "cluster" / z / "data"), "/data")]


def test_an_untraced_run_binds_and_names_no_trace_directory(tmp_path: Path) -> None:
    backend = _backend(tmp_path, traced=False)
    for b in backend.bookies:
        assert [inside for _, inside in backend.volumes(b)] == ["/data"]
        assert "--trace" not in _bookie_argv(backend.bookie_command(b))


def test_a_process_in_a_time_namespace_of_its_own_is_told_apart() -> None:
    assert foreign_time_namespace(os.getpid()) is None
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("unshare --time needs root")
    # The child of `unshare --time --fork` is in the new namespace; it prints its pid
    # (and dies with unshare).
    with subprocess.Popen(
        ["unshare", "--time", "--fork", "--kill-child", "sh", "-c", "echo $$; exec sleep 30"],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                pytest.skip("unshare --time failed here")
            other = foreign_time_namespace(int(line))
            assert other is not None
            assert other.startswith("time:[")
        finally:
            proc.kill()


def test_a_node_drops_its_grudge_and_resets_connections_to_killed_nodes(tmp_path: Path) -> None:
    backend = _backend(tmp_path, traced=False)
    backend._grudge = {"bookie-0": frozenset({"zk1"})}
    backend._down = {"bookie-0", "bookie-2"}
    rules = backend.filter_rules("bookie-0")
    assert rules[0] == "*filter"
    assert rules[-1] == "COMMIT"
    assert [r for r in rules if r.startswith("-A")] == [
        f"-A INPUT -s {backend.ip('zk1')} -j DROP",
        f"-A OUTPUT -d {backend.ip('bookie-2')}/32 -p tcp -j REJECT --reject-with tcp-reset",
    ]
    assert [r for r in backend.filter_rules("zk2") if r.startswith("-A")] == [
        f"-A OUTPUT -d {backend.ip(b)}/32 -p tcp -j REJECT --reject-with tcp-reset"
        for b in ("bookie-0", "bookie-2")
    ]
