"""lazyfs: a FUSE passthrough that keeps written data in memory until fsync.

Killing a process does not lose its unsynced writes: the kernel's page cache
keeps them. A power failure does. To test that a bookie acknowledges only
what it has fsynced, its data dirs sit on this filesystem (after Jepsen's
lazyfs): ``write`` stores the bytes in this daemon's memory, ``fsync`` writes
them to the backing directory and syncs it, and the ``lose-unsynced`` command
drops every byte that was never fsynced, as a machine crash would.

Run: ``python -m bkref.nemesis.lazyfs BACKING_DIR MOUNTPOINT`` (foreground; root, or
a user allowed to mount FUSE). Control it by writing a command to the file
``MOUNTPOINT/.lazyfs-control`` (it is not listed by ``readdir``):

- ``lose-unsynced``: forget every write that was not fsynced (the crash);
- ``sync-all``: write and sync everything (a clean shutdown).

Reading the control file returns ``dirty_bytes=N``. Metadata operations
(create, rename, unlink, mkdir, truncate) go to the backing directory at once:
only file *data* is lazy, as in the page cache of a filesystem that journals
metadata.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fuse  # fusepy, over libfuse2

from bkref.impl.cluster.process import stop_pid

CONTROL = "/.lazyfs-control"


@dataclass
class _Dirty:
    """Unsynced writes of one file, in write order (later extents win)."""

    extents: list[tuple[int, bytes]] = field(default_factory=list)

    @property
    def end(self) -> int:
        return max((off + len(data) for off, data in self.extents), default=0)

    @property
    def size(self) -> int:
        return sum(len(data) for _, data in self.extents)

    def overlay(self, buf: bytearray, offset: int) -> None:
        """Apply the extents that overlap ``[offset, offset + len(buf))`` to ``buf``."""
        stop = offset + len(buf)
        for off, data in self.extents:
            lo, hi = max(off, offset), min(off + len(data), stop)
            if lo < hi:
                buf[lo - offset : hi - offset] = data[lo - off : hi - off]

    def truncate(self, length: int) -> None:
        self.extents = [
            (off, data[: max(0, length - off)]) for off, data in self.extents if off < length
        ]


class LazyFS(fuse.Operations):  # type: ignore[misc]  # fusepy ships no type information
    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.dirty: dict[str, _Dirty] = {}
        # Not ``self.lock``: fusepy would take that for the POSIX-lock operation.
        self._mutex = threading.RLock()

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    # ------------------------------------------------------------ control

    def _command(self, text: str) -> None:
        command = text.strip()
        if command == "lose-unsynced":
            with self._mutex:
                self.dirty.clear()
        elif command == "sync-all":
            with self._mutex:
                for path in list(self.dirty):
                    self._sync(path)
        else:
            raise fuse.FuseOSError(errno.EINVAL)

    def _status(self) -> bytes:
        with self._mutex:
            return f"dirty_bytes={sum(d.size for d in self.dirty.values())}\n".encode()

    def _sync(self, path: str) -> None:
        d = self.dirty.pop(path, None)
        fd = os.open(self._full(path), os.O_WRONLY)
        try:
            if d is not None:
                for off, data in d.extents:
                    os.pwrite(fd, data, off)
            os.fsync(fd)
        finally:
            os.close(fd)

    # ------------------------------------------------------------ metadata

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        if path == CONTROL:
            return {"st_mode": 0o100600, "st_nlink": 1, "st_size": len(self._status())}
        st = os.lstat(self._full(path))
        attrs = {
            key: getattr(st, key)
            for key in (
                "st_atime",
                "st_ctime",
                "st_gid",
                "st_mode",
                "st_mtime",
                "st_nlink",
                "st_size",
                "st_uid",
            )
        }
        with self._mutex:
            d = self.dirty.get(path)
            if d is not None:
                attrs["st_size"] = max(attrs["st_size"], d.end)
        return attrs

    def readdir(self, path: str, fh: int) -> Iterator[str]:
        yield from [".", "..", *os.listdir(self._full(path))]

    def access(self, path: str, amode: int) -> None:
        if path != CONTROL and not os.access(self._full(path), amode):
            raise fuse.FuseOSError(errno.EACCES)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._full(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self._full(path), uid, gid)

    def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
        os.utime(self._full(path), times)

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._full(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._full(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._full(path))
        with self._mutex:
            self.dirty.pop(path, None)

    def rename(self, old: str, new: str) -> None:
        os.rename(self._full(old), self._full(new))
        with self._mutex:
            self.dirty.pop(new, None)
            if old in self.dirty:
                self.dirty[new] = self.dirty.pop(old)

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._full(path))
        return {
            key: getattr(st, key)
            for key in (
                "f_bavail",
                "f_bfree",
                "f_blocks",
                "f_bsize",
                "f_favail",
                "f_ffree",
                "f_files",
                "f_flag",
                "f_frsize",
                "f_namemax",
            )
        }

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        if path == CONTROL:
            return  # opened with O_TRUNC to write a command
        with self._mutex:
            os.truncate(self._full(path), length)
            d = self.dirty.get(path)
            if d is not None:
                d.truncate(length)

    # ------------------------------------------------------------ data

    # The handle only reads the backing file: writes go to memory, and _sync
    # opens the file for writing when they become durable.
    def open(self, path: str, flags: int) -> int:
        if path == CONTROL:
            return 0
        return os.open(self._full(path), os.O_RDONLY)

    def create(self, path: str, mode: int, fi: object = None) -> int:
        full = self._full(path)
        with self._mutex:
            os.close(os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode))
            self.dirty.pop(path, None)
        return os.open(full, os.O_RDONLY)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        if path == CONTROL:
            return self._status()[offset : offset + size]
        with self._mutex:
            d = self.dirty.get(path)
            end = os.fstat(fh).st_size if d is None else max(os.fstat(fh).st_size, d.end)
            n = max(0, min(size, end - offset))
            buf = bytearray(n)
            disk = os.pread(fh, n, offset) if n else b""
            buf[: len(disk)] = disk
            if d is not None:
                d.overlay(buf, offset)
            return bytes(buf)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        if path == CONTROL:
            self._command(data.decode("utf-8", "replace"))
            return len(data)
        with self._mutex:
            self.dirty.setdefault(path, _Dirty()).extents.append((offset, bytes(data)))
        return len(data)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        if path == CONTROL:
            return
        with self._mutex:
            self._sync(path)

    def flush(self, path: str, fh: int) -> None:
        return None  # close() is not a sync point: the data stays lazy

    def release(self, path: str, fh: int) -> None:
        if path != CONTROL:
            os.close(fh)


def _in_namespace(argv: list[str], pid: int | None) -> list[str]:
    """``argv`` run in ``pid``'s mount namespace (nsenter execs it: same PID), or as is."""
    return argv if pid is None else ["nsenter", "-t", str(pid), "-m", "--", *argv]


def _umount(mountpoint: Path, namespace_of: int | None = None) -> None:
    """Lazily unmount ``mountpoint`` (in ``namespace_of``'s mount namespace)."""
    argv = _in_namespace(["umount", "-l", str(mountpoint)], namespace_of)
    subprocess.run(argv, check=False, capture_output=True)


class LazyMount:
    """A lazyfs daemon we started: mount, crash (lose unsynced data), unmount.

    ``namespace_of``: the PID of a process whose mount namespace the daemon
    mounts in, instead of ours (the private Docker engine's, so that its
    containers can bind-mount the lazyfs; the host's ``/`` is a private mount,
    so a mount made here would not reach the engine). This process then reaches
    the filesystem at :attr:`view`, through ``/proc/<daemon>/root``.
    """

    def __init__(
        self,
        backing: Path,
        mountpoint: Path,
        log: Path | None = None,
        *,
        namespace_of: int | None = None,
    ) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.log = log
        self.namespace_of = namespace_of
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def view(self) -> Path:
        """Where this process reads and writes the mounted filesystem."""
        if self.namespace_of is None:
            return self.mountpoint
        if self.process is None:
            raise RuntimeError(f"lazyfs of {self.mountpoint} is not running")
        return Path(f"/proc/{self.process.pid}/root{self.mountpoint.resolve()}")

    def mounted(self) -> bool:
        if self.namespace_of is not None and self.process is None:
            return False  # no daemon: nothing of ours is mounted there
        return os.path.ismount(self.view)

    def start(self, timeout: float = 10.0) -> None:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        argv = _in_namespace(
            [sys.executable, "-m", "bkref.nemesis.lazyfs", str(self.backing), str(self.mountpoint)],
            self.namespace_of,
        )
        out = self.log.open("ab") if self.log else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            if not isinstance(out, int):
                out.close()
        deadline = time.monotonic() + timeout
        while not self.mounted():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"lazyfs did not mount {self.mountpoint} (is /dev/fuse usable and libfuse2 "
                    "installed? `make setup` installs it)"
                )
            time.sleep(0.02)

    def control(self, command: str) -> None:
        (self.view / CONTROL.lstrip("/")).write_text(command)

    def lose_unsynced(self) -> None:
        """The crash: every byte written but not fsynced is gone."""
        self.control("lose-unsynced")

    def dirty_bytes(self) -> int:
        text = (self.view / CONTROL.lstrip("/")).read_text()
        return int(text.strip().split("=", 1)[1])

    def stop(self) -> None:
        """Unmount (unsynced data is dropped, as in a crash) and reap the daemon."""
        if self.mounted():
            # Entered through the daemon, which lives there: the engine may be gone by now.
            daemon = self.process.pid if self.namespace_of is not None and self.process else None
            _umount(self.mountpoint, daemon)
        if self.process is not None:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


def daemons_in_namespace_of(pid: int) -> list[tuple[int, Path]]:
    """The lazyfs daemons mounted in ``pid``'s mount namespace: (daemon PID, mount point).

    For cleaning up after a crashed campaign: a daemon in the private Docker
    engine's namespace can only be one a campaign started there.
    """
    try:
        target = os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return []
    found: list[tuple[int, Path]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == pid:
            continue
        try:
            if os.readlink(entry / "ns" / "mnt") != target:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if len(argv) >= 5 and argv[-4:-2] == [b"-m", b"bkref.nemesis.lazyfs"]:
            found.append((int(entry.name), Path(os.fsdecode(argv[-1]))))
    return found


def stop_daemon(pid: int, mountpoint: Path) -> None:
    """Unmount a daemon's filesystem in its own mount namespace; it then exits (or is killed)."""
    _umount(mountpoint, pid)
    stop_pid(pid, grace=10.0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] in {"-h", "--help"}:
        print(__doc__)
        return 0 if args and args[0] in {"-h", "--help"} else 2
    root, mountpoint = args
    fuse.FUSE(LazyFS(root), mountpoint, foreground=True, nothreads=False, default_permissions=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
