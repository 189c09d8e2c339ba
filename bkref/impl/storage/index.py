"""The index: per ledger, its master key, fence state, LAC and where each entry lives.

Kept in memory (BookKeeper's LedgerCache) and flushed by the sync thread to
``<ledger>.idx`` files, each written whole to a temporary file, fsynced and
renamed, so a crash leaves either the old or the new index, never a torn one.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from bkref.impl.core.checksum import crc32c
from bkref.impl.storage.disk import OS_DISK, Disk

_MAGIC = b"BKIX"
_HEAD = struct.Struct(">4sBBqH")  # magic, version, fenced, lac, key length
_COUNT = struct.Struct(">I")
_ENTRY = struct.Struct(">QIQ")  # entry id, log id, offset
_CRC = struct.Struct(">I")


class IndexCorruptError(RuntimeError):
    pass


@dataclass(slots=True)
class LedgerIndex:
    master_key: bytes
    fenced: bool = False
    lac: int = -1
    entries: dict[int, tuple[int, int]] = field(default_factory=dict)

    def encode(self) -> bytes:
        parts = [
            _HEAD.pack(_MAGIC, 1, int(self.fenced), self.lac, len(self.master_key)),
            self.master_key,
            _COUNT.pack(len(self.entries)),
        ]
        parts += [_ENTRY.pack(e, lg, off) for e, (lg, off) in sorted(self.entries.items())]
        data = b"".join(parts)
        return data + _CRC.pack(crc32c(data))

    @staticmethod
    def decode(data: bytes, name: str) -> LedgerIndex:
        if len(data) < _HEAD.size + _COUNT.size + _CRC.size or _CRC.unpack(data[-4:])[0] != crc32c(
            data[:-4]
        ):
            raise IndexCorruptError(f"index file {name} is corrupt (bad checksum or size)")
        magic, _version, fenced, lac, klen = _HEAD.unpack_from(data, 0)
        if magic != _MAGIC:
            raise IndexCorruptError(f"index file {name} has bad magic {magic!r}")
        pos = _HEAD.size
        key = data[pos : pos + klen]
        pos += klen
        (count,) = _COUNT.unpack_from(data, pos)
        pos += _COUNT.size
        entries = {}
        for _ in range(count):
            e, lg, off = _ENTRY.unpack_from(data, pos)
            entries[e] = (lg, off)
            pos += _ENTRY.size
        return LedgerIndex(key, bool(fenced), lac, entries)


class IndexStore:
    def __init__(self, directory: Path, disk: Disk = OS_DISK) -> None:
        self.directory = directory
        self._disk = disk
        self.ledgers: dict[int, LedgerIndex] = {}
        self.dirty: set[int] = set()
        self._unlinked = False  # index files removed since the directory was last synced
        for p in directory.glob("*.idx"):
            self.ledgers[int(p.stem)] = LedgerIndex.decode(p.read_bytes(), str(p))
        for p in directory.glob("*.idx.tmp"):
            self._disk.unlink(p)  # an unfinished flush; the journal still holds its records

    def path(self, ledger_id: int) -> Path:
        return self.directory / f"{ledger_id}.idx"

    def snapshot_dirty(self) -> dict[int, bytes]:
        """Encoded copies of the dirty ledgers (taken under the storage lock)."""
        out = {lg: self.ledgers[lg].encode() for lg in self.dirty if lg in self.ledgers}
        self.dirty.clear()
        return out

    def write(self, encoded: dict[int, bytes]) -> None:
        """Persist snapshots (outside the lock): temporary file, fsync, rename, fsync dir.
        Deletions become durable here too: GC checkpoints before it removes the entry logs
        a deleted ledger used, so a power loss cannot bring back an index pointing at them."""
        for lg, data in encoded.items():
            tmp = self.directory / f"{lg}.idx.tmp"
            fd = self._disk.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                self._disk.write(fd, data)
                self._disk.fsync(fd)
            finally:
                self._disk.close(fd)
            self._disk.replace(tmp, self.path(lg))
        if encoded or self._unlinked:
            self._disk.fsync_dir(self.directory)
            self._unlinked = False

    def delete(self, ledger_id: int) -> None:
        self.ledgers.pop(ledger_id, None)
        self.dirty.discard(ledger_id)
        self._disk.unlink(self.path(ledger_id), missing_ok=True)
        self._unlinked = True
