"""A Disk that can lose power: real files, plus a record of what fsync made durable.

A killed process keeps its page cache, so killing a bookie never shows a bug
that acknowledges before fsync. :class:`CrashDisk` writes real files (a live
bookie reads exactly what it wrote) and remembers, per file and per directory,
what a power loss would keep; :meth:`CrashDisk.crash` then rewrites the
directories to that, and storage reopened on them sees what the machine would
have found after the power came back.

The model (POSIX's promises, nothing a particular file system adds):

- A file's content is durable up to its last ``fsync``/``fdatasync``. Appends
  after it are lost; an overwrite or ``O_TRUNC`` after it is undone (the
  durable bytes are kept aside the moment they are first overwritten, so
  append-only files cost no copies).
- A directory's entries (created, renamed, removed names) are durable as of
  its last ``fsync_dir``. A file created but never named durably disappears;
  a rename or unlink not followed by one is undone, with the old file's
  durable content (kept aside before the name moved).
- Files already present when the disk first touches a directory, and files
  created by others (not through this disk), count as durable. Directories
  themselves (``mkdir``) are not modelled: they survive.

``power_off_after(n)`` lets ``n`` more changes through and fails every later
one with :class:`PowerLossError` (an ``OSError``, which storage handles as a failed
write), so a test can crash at any step inside a checkpoint or a GC.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bkref.impl.storage.disk import Bytes, OsDisk

Keep = Callable[[Path, int, int], int]


class PowerLossError(OSError):
    """A change attempted after the power went off (see ``CrashDisk.power_off_after``)."""


@dataclass(eq=False, slots=True)
class _Inode:
    path: Path | None  # where the file is now; None once unlinked or replaced
    durable: int  # bytes of the file at ``path`` known durable (a prefix of it)
    saved: bytes | None = None  # the durable content, once the file no longer has it as a prefix


@dataclass(slots=True)
class _Dir:
    current: dict[str, _Inode]  # the names a running process sees
    durable: dict[str, _Inode]  # the names as of the last fsync_dir


@dataclass(slots=True)
class _Handle:
    path: Path  # as opened, for messages
    inode: _Inode | None  # None: opened read-only
    append: bool


@dataclass(slots=True)
class CrashReport:
    """What :meth:`CrashDisk.crash` dropped."""

    truncated: dict[Path, int] = field(default_factory=dict)  # path -> bytes lost at its tail
    removed: list[Path] = field(default_factory=list)  # names never made durable
    restored: list[Path] = field(default_factory=list)  # old content put back (rename, unlink,
    # overwrite or O_TRUNC not made durable)

    @property
    def lost_anything(self) -> bool:
        return bool(self.truncated or self.removed or self.restored)


def _read(path: Path, n: int) -> bytes:
    with path.open("rb") as f:
        data = f.read(n)
    if len(data) != n:
        raise RuntimeError(f"CrashDisk: {path} is shorter ({len(data)}) than its durable {n} bytes")
    return data


class CrashDisk:
    """Real files on the real file system, with :meth:`crash` to lose what was not fsynced.

    ``real_sync``: also call the real fsync (the default, so timing stays that of a real
    disk); False skips it, which is faster and changes nothing in what :meth:`crash` keeps.
    """

    def __init__(self, *, real_sync: bool = True) -> None:
        self.real_sync = real_sync
        self.changes = 0  # changes made so far (each write, sync, create, rename, unlink)
        self._budget: int | None = None
        self._dirs: dict[Path, _Dir] = {}
        self._handles: dict[int, _Handle] = {}
        # Storage changes files from two threads (journal, checkpoint); keep the records whole.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CrashDisk(real_sync={self.real_sync}, changes={self.changes})"

    # ------------------------------------------------------------ power

    def power_off_after(self, changes: int | None) -> None:
        """Let ``changes`` more changes through, then fail each one (None: never)."""
        with self._lock:
            self._budget = changes

    @property
    def powered(self) -> bool:
        return self._budget is None or self._budget > 0

    def _change(self) -> None:
        if self._budget is not None:
            if self._budget <= 0:
                raise PowerLossError(errno.EIO, "power lost (CrashDisk)")
            self._budget -= 1
        self.changes += 1

    # ------------------------------------------------------------ bookkeeping

    def _dir(self, directory: Path) -> _Dir:
        d = self._dirs.get(directory)
        if d is None:
            # First touch: what is there already is taken as durable.
            files = {
                e.name: _Inode(directory / e.name, e.stat().st_size)
                for e in os.scandir(directory)
                if e.is_file(follow_symlinks=False)
            }
            d = self._dirs[directory] = _Dir(files, dict(files))
        return d

    def _locate(self, path: Path) -> tuple[_Dir, Path, str, _Inode | None]:
        directory = Path(os.path.realpath(path.parent))
        d = self._dir(directory)
        name = path.name
        inode = d.current.get(name)
        if inode is None and (directory / name).is_file():
            # Made by someone else since the first touch (a cookie, a test): durable.
            inode = d.current[name] = _Inode(directory / name, (directory / name).stat().st_size)
            d.durable.setdefault(name, inode)
        return d, directory, name, inode

    def _durably_named(self, inode: _Inode) -> bool:
        return any(i is inode for d in self._dirs.values() for i in d.durable.values())

    def _durable_content(self, inode: _Inode) -> bytes:
        if inode.saved is not None:
            return inode.saved
        assert inode.path is not None, "a detached file always has its content saved"
        return _read(inode.path, inode.durable)

    def _save(self, inode: _Inode) -> None:
        """Keep the durable bytes aside before the file stops holding them as a prefix."""
        if inode.saved is None and inode.durable and inode.path is not None:
            inode.saved = _read(inode.path, inode.durable)

    def _detach(self, inode: _Inode) -> None:
        """The name goes (unlink, replaced): keep the content if a crash can bring it back."""
        if self._durably_named(inode):
            inode.saved = self._durable_content(inode)
        inode.path = None

    # ------------------------------------------------------------ Disk

    def open(self, path: Path, flags: int, mode: int, /) -> int:
        changing = flags & (os.O_CREAT | os.O_TRUNC) or flags & os.O_ACCMODE != os.O_RDONLY
        with self._lock:
            if not changing:
                fd = os.open(path, flags, mode)
                self._handles[fd] = _Handle(path, None, False)
                return fd
            self._change()
            d, directory, name, inode = self._locate(path)
            if inode is not None and flags & os.O_TRUNC:
                self._save(inode)
            if flags & os.O_ACCMODE == os.O_WRONLY:
                # Readable, so that fsync can keep a copy of a file unlinked while open.
                flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
            fd = os.open(path, flags, mode)
            if inode is None:
                inode = d.current[name] = _Inode(directory / name, 0)
            self._handles[fd] = _Handle(path, inode, bool(flags & os.O_APPEND))
            return fd

    def _overwrites(self, h: _Handle, offset: int) -> None:
        if h.inode is not None and not h.append and offset < h.inode.durable:
            self._save(h.inode)

    def write(self, fd: int, data: Bytes, /) -> int:
        with self._lock:
            self._change()
            h = self._handles.get(fd)
            if h is not None and not h.append:
                self._overwrites(h, os.lseek(fd, 0, os.SEEK_CUR))
            return os.write(fd, data)

    def pwrite(self, fd: int, data: Bytes, offset: int, /) -> int:
        with self._lock:
            self._change()
            h = self._handles.get(fd)
            if h is not None:
                self._overwrites(h, offset)
            return os.pwrite(fd, data, offset)

    def _sync(self, fd: int, real: Callable[[int], None]) -> None:
        with self._lock:
            self._change()
            if self.real_sync:
                real(fd)
            h = self._handles.get(fd)
            if h is None or h.inode is None:
                return
            inode = h.inode
            size = os.fstat(fd).st_size
            if inode.path is None:  # unlinked while open: a crash may still bring it back
                inode.saved = os.pread(fd, size, 0) if self._durably_named(inode) else None
            else:
                inode.saved = None
                inode.durable = size

    def fsync(self, fd: int, /) -> None:
        self._sync(fd, os.fsync)

    def fdatasync(self, fd: int, /) -> None:
        self._sync(fd, os.fdatasync)

    def close(self, fd: int, /) -> None:
        # Never fails for lack of power: a dying process closes its files too.
        with self._lock:
            if self._handles.pop(fd, None) is None:
                # Stricter than os.close: the number may already belong to another file.
                raise OSError(errno.EBADF, f"CrashDisk: fd {fd} is not open on this disk")
            os.close(fd)

    def replace(self, src: Path, dst: Path, /) -> None:
        with self._lock:
            self._change()
            sd, _, sname, inode = self._locate(src)
            dd, ddir, dname, old = self._locate(dst)
            if inode is None:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(src))
            if old is not None and old is not inode:
                self._detach(old)
            os.replace(src, dst)
            del sd.current[sname]
            dd.current[dname] = inode
            inode.path = ddir / dname

    def unlink(self, path: Path, /, missing_ok: bool = False) -> None:
        with self._lock:
            self._change()
            d, _, name, inode = self._locate(path)
            if inode is None:
                path.unlink(missing_ok=missing_ok)
                return
            self._detach(inode)
            path.unlink()
            del d.current[name]

    def fsync_dir(self, directory: Path, /) -> None:
        with self._lock:
            self._change()
            if self.real_sync:
                OsDisk.fsync_dir(directory)
            d = self._dir(Path(os.path.realpath(directory)))
            d.durable = dict(d.current)

    # ------------------------------------------------------------ inspection and crash

    def durable_size(self, path: Path) -> int | None:
        """Bytes of ``path`` a crash now would keep (None: the name itself would go)."""
        with self._lock:
            d, _, name, _ = self._locate(path)
            inode = d.durable.get(name)
            if inode is None:
                return None
            return len(inode.saved) if inode.saved is not None else inode.durable

    def crash(self, keep: Keep | None = None) -> CrashReport:
        """Power loss: leave every file and directory this disk changed as durable, and
        power back on. Storage must be abandoned first (no file of this disk open).

        ``keep(path, durable, size)``: for a file whose durable bytes are a prefix of it,
        how many bytes survive (clamped to ``durable..size``), to model a torn tail;
        by default exactly the durable ones."""
        with self._lock:
            if self._handles:
                names = sorted(str(h.path) for h in self._handles.values())
                raise RuntimeError(
                    f"CrashDisk.crash() with files still open ({', '.join(names)}): "
                    "abandon the storage first"
                )
            report = CrashReport()
            # Read everything to put back before changing anything: a durable name's
            # content may now live under another name that is about to go.
            cut: dict[Path, int] = {}
            put: dict[Path, bytes] = {}
            for directory, d in self._dirs.items():
                for name, inode in d.durable.items():
                    p = directory / name
                    if inode.path == p and inode.saved is None:
                        size = p.stat().st_size
                        n = inode.durable if keep is None else keep(p, inode.durable, size)
                        cut[p] = min(max(n, inode.durable), size)
                    else:
                        put[p] = self._durable_content(inode)
            for directory, d in self._dirs.items():
                for name in d.current:
                    p = directory / name
                    if p not in cut:
                        p.unlink()
                        if p not in put:
                            report.removed.append(p)
            for p, n in cut.items():
                size = p.stat().st_size
                if n < size:
                    os.truncate(p, n)
                    report.truncated[p] = size - n
            for p, data in put.items():
                p.write_bytes(data)
                report.restored.append(p)
            self._dirs.clear()
            self._budget = None
            return report
