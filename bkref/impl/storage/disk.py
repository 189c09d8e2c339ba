"""The file-system calls through which bookie storage changes its files.

Storage opens, writes, fsyncs, renames and removes files only through a
:class:`Disk`, so that a test can substitute one that models what a power loss
keeps (:class:`bkref.impl.storage.crashdisk.CrashDisk`). Reads (``pread``,
``read_bytes``, ``glob``) go to the file system directly: every disk keeps real
files, so what a running bookie reads is the same whichever disk it has.

:class:`OsDisk`, the default, *is* the ``os`` module for the calls on the add
path (its attributes are the ``os`` functions themselves), so it adds no
wrapper frame, copy or lock to the hot path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

Bytes = bytes | bytearray | memoryview


class Disk(Protocol):
    """The calls storage makes to change files. Semantics are those of ``os``."""

    def open(self, path: Path, flags: int, mode: int, /) -> int: ...

    def write(self, fd: int, data: Bytes, /) -> int: ...

    def pwrite(self, fd: int, data: Bytes, offset: int, /) -> int: ...

    def fsync(self, fd: int, /) -> None: ...

    def fdatasync(self, fd: int, /) -> None: ...

    def close(self, fd: int, /) -> None: ...

    def replace(self, src: Path, dst: Path, /) -> None: ...

    def unlink(self, path: Path, /, missing_ok: bool = False) -> None:
        """Remove a name (``Path.unlink``); the removal is durable only after :meth:`fsync_dir`."""
        ...

    def fsync_dir(self, directory: Path, /) -> None:
        """Make the directory's entries (creations, renames, removals) durable."""
        ...


class OsDisk:
    """Real files, real fsync: exactly the ``os`` calls, with no extra cost."""

    open = staticmethod(os.open)
    write = staticmethod(os.write)
    pwrite = staticmethod(os.pwrite)
    fsync = staticmethod(os.fsync)
    fdatasync = staticmethod(os.fdatasync)
    close = staticmethod(os.close)
    replace = staticmethod(os.replace)

    @staticmethod
    def unlink(path: Path, /, missing_ok: bool = False) -> None:
        path.unlink(missing_ok=missing_ok)

    @staticmethod
    def fsync_dir(directory: Path, /) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        return "OsDisk()"


OS_DISK: Disk = OsDisk()
