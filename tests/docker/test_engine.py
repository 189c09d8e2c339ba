"""The private Docker engine starts in its own namespace and leaves the host's untouched."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bkref.nemesis.backends.docker import cleanup
from bkref.nemesis.docker_engine import (
    CGROUP_PARENT,
    CGROUP_ROOT,
    DockerEngine,
    cgroup_mounts,
    missing_packages,
    netns_name,
    wrapper_script,
)
from bkref.nemesis.lazyfs import LazyMount, daemons_in_namespace_of
from tests.docker.hostnet import host_network

MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
22 1 0:20 / /proc rw,relatime - proc proc rw
"""


def test_cgroup_mounts_repeat_every_host_hierarchy() -> None:
    assert cgroup_mounts(MOUNTINFO) == [
        ("/sys/fs/cgroup", "tmpfs", "mode=755"),
        ("/sys/fs/cgroup/cpu", "cgroup", "cpu"),
        ("/sys/fs/cgroup/devices", "cgroup", "devices"),
        ("/sys/fs/cgroup/systemd", "cgroup", "none,name=systemd"),
        ("/sys/fs/cgroup/unified", "cgroup2", ""),
    ]


def test_wrapper_mounts_in_order_then_execs() -> None:
    script = wrapper_script(cgroup_mounts(MOUNTINFO)).splitlines()
    mounts = [line for line in script if line.startswith("mount ")]
    assert mounts[0] == "mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup"
    assert "mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd" in mounts
    assert "mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified" in mounts
    assert script[-1] == 'exec "$@"'


def test_each_engine_directory_has_its_own_namespace(tmp_path: Path) -> None:
    assert netns_name(tmp_path / "a") != netns_name(tmp_path / "b")
    assert netns_name(tmp_path / "a").startswith("bkref-docker-")


CAN_START = os.geteuid() == 0 and not missing_packages()
WHY = "not root" if os.geteuid() != 0 else f"missing Debian packages {missing_packages()}"


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.skipif(not CAN_START, reason=f"the private Docker engine cannot start here: {WHY}")
def test_engine_runs_in_its_own_namespace_and_leaves_the_host_as_it_was() -> None:
    # A short directory: containerd's unix sockets live under it.
    directory = Path("/tmp") / f"bkref-dkt-{os.getpid()}"
    engine = DockerEngine(directory)
    before = host_network()
    try:
        engine.start()
        assert engine.status().running
        info = engine.client().info()
        assert info.server_version
        assert info.cgroup_driver == "cgroupfs"
        assert (Path("/run/netns") / engine.netns).exists()
        # A crashed campaign leaves its bookies' lazyfs daemons mounted in the engine's
        # mount namespace: `bkref campaign cleanup` unmounts and stops them, then the engine.
        pid = engine.pid()
        assert pid is not None
        orphan = LazyMount(
            directory / "b0" / "backing", directory / "b0" / "disk", namespace_of=pid
        )
        orphan.start()
        assert orphan.process is not None
        daemon = orphan.process.pid
        assert daemons_in_namespace_of(pid) == [(daemon, orphan.mountpoint)]
        removed = cleanup(engine)
        assert f"lazyfs mount {orphan.mountpoint} (pid {daemon})" in removed
        assert orphan.process.wait(timeout=10) is not None  # it exited; reaped here
    finally:
        engine.stop()
        shutil.rmtree(directory, ignore_errors=True)
    assert not engine.status().running
    assert not (Path("/run/netns") / engine.netns).exists()
    assert not any((h / CGROUP_PARENT).exists() for h in CGROUP_ROOT.iterdir())
    assert str(directory) not in Path("/proc/self/mountinfo").read_text()
    assert host_network() == before
