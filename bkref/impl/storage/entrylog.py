"""Entry logs: entries of all ledgers interleaved in append-only files, buffered.

A record is ``u32 length | u64 ledger | u64 entry | body`` (length counts ledger,
entry and body). The entry's own digest protects the body; the entry log does
not add a checksum, so a corrupt copy reaches the client, which detects the
digest mismatch and reads another replica. Files are ``<id>.log``; a new one
starts when the current one passes ``logSizeLimit``, and a restarted bookie
always starts a new one (old files are never appended to).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

from bkref.impl.storage.disk import OS_DISK, Disk

_REC = struct.Struct(">IQQ")


def log_path(directory: Path, log_id: int) -> Path:
    return directory / f"{log_id:08x}.log"


def log_ids(directory: Path) -> list[int]:
    return sorted(int(p.stem, 16) for p in directory.glob("*.log"))


class EntryLogger:
    def __init__(
        self, directory: Path, size_limit: int = 1024 * 1024 * 1024, disk: Disk = OS_DISK
    ) -> None:
        self.directory = directory
        self._disk = disk
        self.size_limit = size_limit
        existing = log_ids(directory)
        self.current = (existing[-1] + 1) if existing else 0
        self._readers: dict[int, int] = {}
        self._fd = self._create(self.current)
        self._written = 0  # bytes of the current log handed to the OS
        self._buf = bytearray()
        self._unsynced: list[int] = []  # fds of rolled logs awaiting fsync

    def _create(self, log_id: int) -> int:
        fd = self._disk.open(
            log_path(self.directory, log_id), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644
        )
        try:
            self._disk.fsync_dir(self.directory)
        except BaseException:
            self._disk.close(fd)  # nobody else holds it
            raise
        return fd

    def add(self, ledger_id: int, entry_id: int, body: bytes) -> tuple[int, int]:
        """Append; returns (log id, offset). Buffered until :meth:`flush`."""
        if self._written + len(self._buf) >= self.size_limit:
            self._roll()
        offset = self._written + len(self._buf)
        self._buf += _REC.pack(16 + len(body), ledger_id, entry_id)
        self._buf += body
        return self.current, offset

    def _roll(self) -> None:
        self.write_buffer()
        # Create the next log first: if that fails, the current one stays as it was, and
        # close/abandon do not close its descriptor twice.
        fd = self._create(self.current + 1)
        self._unsynced.append(self._fd)
        self.current += 1
        self._fd = fd
        self._written = 0

    def write_buffer(self) -> None:
        if self._buf:
            self._disk.pwrite(self._fd, self._buf, self._written)
            self._written += len(self._buf)
            self._buf.clear()

    def flush(self) -> None:
        """Write buffered records and fsync every log written since the last flush."""
        self.write_buffer()
        self._disk.fsync(self._fd)
        for fd in list(self._unsynced):
            self._disk.fsync(fd)
            self._unsynced.remove(fd)  # before the close, so a failure never closes it twice
            self._disk.close(fd)

    def read(self, log_id: int, offset: int) -> tuple[int, int, bytes]:
        """(ledger, entry, body) of the record at ``offset``."""
        if log_id == self.current and offset >= self._written:
            pos = offset - self._written
            length, ledger, entry = _REC.unpack_from(self._buf, pos)
            return ledger, entry, bytes(self._buf[pos + _REC.size : pos + 4 + length])
        fd = self._reader(log_id)
        head = os.pread(fd, _REC.size, offset)
        if len(head) < _REC.size:
            raise OSError(f"entry log {log_id:x}: record at {offset} cut short")
        length, ledger, entry = _REC.unpack(head)
        body = os.pread(fd, length - 16, offset + _REC.size)
        if len(body) != length - 16:
            raise OSError(f"entry log {log_id:x}: body at {offset} cut short")
        return ledger, entry, body

    def _reader(self, log_id: int) -> int:
        if log_id == self.current:
            return self._fd
        fd = self._readers.get(log_id)
        if fd is None:
            fd = self._disk.open(log_path(self.directory, log_id), os.O_RDONLY, 0)
            self._readers[log_id] = fd
        return fd

    def scan(self, log_id: int) -> Iterator[tuple[int, int, int, int]]:
        """(offset, ledger, entry, record size) of each complete record of a log."""
        data = log_path(self.directory, log_id).read_bytes()
        if log_id == self.current:
            data += bytes(self._buf)
        pos = 0
        while pos + _REC.size <= len(data):
            length, ledger, entry = _REC.unpack_from(data, pos)
            if length < 16 or pos + 4 + length > len(data):
                return  # a partial record from a crash before the log was flushed
            yield pos, ledger, entry, 4 + length
            pos += 4 + length

    def delete(self, log_id: int) -> None:
        if log_id == self.current:
            raise ValueError("cannot delete the entry log being written")
        fd = self._readers.pop(log_id, None)
        if fd is not None:
            self._disk.close(fd)
        self._disk.unlink(log_path(self.directory, log_id), missing_ok=True)
        self._disk.fsync_dir(self.directory)

    def abandon(self) -> None:
        self._buf.clear()
        for fd in [self._fd, *self._unsynced, *self._readers.values()]:
            self._disk.close(fd)
        self._readers.clear()
        self._unsynced.clear()

    def close(self) -> None:
        self.flush()
        self._disk.close(self._fd)
        for fd in self._readers.values():
            self._disk.close(fd)
        self._readers.clear()
