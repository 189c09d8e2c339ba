"""lazyfs over real FUSE: unsynced writes are lost on a simulated crash, synced ones are not."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkref.nemesis.lazyfs import LazyMount

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or os.geteuid() != 0,
    reason="lazyfs needs /dev/fuse and root to mount",
)


@pytest.fixture
def lazy(tmp_path: Path) -> Iterator[LazyMount]:
    mount = LazyMount(tmp_path / "backing", tmp_path / "mnt", log=tmp_path / "lazyfs.log")
    mount.start()
    try:
        yield mount
    finally:
        mount.stop()


def _append(path: Path, data: bytes, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def test_unsynced_writes_are_visible_until_the_crash_and_then_lost(lazy: LazyMount) -> None:
    journal = lazy.mountpoint / "journal.txn"
    _append(journal, b"entry-0;", sync=True)
    _append(journal, b"entry-1;", sync=False)

    # Readers (a restarted bookie would be one) see the page cache: both entries.
    assert journal.read_bytes() == b"entry-0;entry-1;"
    assert (lazy.backing / "journal.txn").read_bytes() == b"entry-0;"
    assert lazy.dirty_bytes() == len(b"entry-1;")

    lazy.lose_unsynced()
    assert journal.read_bytes() == b"entry-0;"
    assert lazy.dirty_bytes() == 0


def test_fsync_makes_earlier_writes_durable(lazy: LazyMount) -> None:
    log = lazy.mountpoint / "entrylog" / "0.log"
    log.parent.mkdir()
    fd = os.open(log, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"aaaa", 0)
        os.pwrite(fd, b"bb", 1)  # overlapping writes: the later one wins
        os.fsync(fd)
        os.pwrite(fd, b"zz", 10)  # a hole, then unsynced data past it
        assert os.pread(fd, 12, 0) == b"abba" + bytes(6) + b"zz"
    finally:
        os.close(fd)
    lazy.lose_unsynced()
    assert log.read_bytes() == b"abba"
    assert (lazy.backing / "entrylog" / "0.log").read_bytes() == b"abba"


def test_rename_carries_unsynced_data_and_unlink_drops_it(lazy: LazyMount) -> None:
    tmp, final = lazy.mountpoint / "cookie.tmp", lazy.mountpoint / "cookie"
    _append(tmp, b"instance-1", sync=False)
    tmp.rename(final)
    assert final.read_bytes() == b"instance-1"
    # The rename is durable metadata; the data was never synced: an empty cookie
    # after a crash is exactly the bug a write-rename without fsync has.
    lazy.lose_unsynced()
    assert final.exists()
    assert final.read_bytes() == b""

    _append(final, b"x", sync=False)
    final.unlink()
    assert lazy.dirty_bytes() == 0


def test_unknown_control_command_is_rejected(lazy: LazyMount) -> None:
    with pytest.raises(OSError, match="Invalid argument"):
        lazy.control("format-disk")


def test_a_mount_in_another_mount_namespace_is_reached_through_its_view(tmp_path: Path) -> None:
    # The Docker backend mounts lazyfs in the private engine's mount namespace (the
    # host's / is private, so a host mount would not reach the engine's containers).
    # A process in a mount namespace of our own stands in for the engine here.
    holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "600"])
    try:
        deadline = time.monotonic() + 30  # generous: a loaded machine starts it late
        while os.readlink(f"/proc/{holder.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            assert time.monotonic() < deadline, "unshare did not enter a new mount namespace"
            time.sleep(0.01)
        mount = LazyMount(tmp_path / "backing", tmp_path / "mnt", namespace_of=holder.pid)
        mount.start()
        try:
            assert not os.path.ismount(mount.mountpoint)  # not in our namespace
            assert mount.view != mount.mountpoint
            assert os.path.ismount(mount.view)
            _append(mount.view / "journal.txn", b"synced;", sync=True)
            _append(mount.view / "journal.txn", b"unsynced;", sync=False)
            # A process in that namespace (a container's bookie) sees the page cache.
            seen = subprocess.run(
                [
                    "nsenter",
                    "-t",
                    str(holder.pid),
                    "-m",
                    "cat",
                    str(mount.mountpoint / "journal.txn"),
                ],
                capture_output=True,
                check=True,
            ).stdout
            assert seen == b"synced;unsynced;"
            assert mount.dirty_bytes() == len(b"unsynced;")
            mount.lose_unsynced()
            assert (mount.view / "journal.txn").read_bytes() == b"synced;"
        finally:
            mount.stop()
        assert mount.process is None
        assert (tmp_path / "backing" / "journal.txn").read_bytes() == b"synced;"
    finally:
        holder.kill()
        holder.wait()


def test_posix_locks_work_on_lazyfs(lazy: LazyMount) -> None:
    # The kernel keeps POSIX locks itself unless the filesystem claims the lock
    # operation; an attribute of that name once made every fcntl lock fail (EINVAL).
    with (lazy.mountpoint / "lockfile").open("w") as f:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(f, fcntl.LOCK_UN)
