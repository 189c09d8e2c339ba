"""A bookie's storage: journal + entry logs + index, checkpoints, replay, GC and compaction.

Add path (as the seed describes): append to the entry log, update the index in
memory, append to the journal; the reply waits for the journal's fsync.

Checkpoint (the sync thread, every ``flushInterval``): take the journal's
LastLogMark, flush the entry logs and the index, persist the mark; journal
files before the mark are then deleted. Everything before the mark is in the
entry logs and index on disk, so a restart replays the journal from the mark.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

from bkref.impl.core.bookie import (
    JournalAdd,
    JournalFence,
    JournalMasterKey,
    JournalRecord,
    LedgerInfo,
)
from bkref.impl.core.checksum import crc32c
from bkref.impl.core.digest import peek_fields
from bkref.impl.core.planted import active as planted
from bkref.impl.storage.disk import OS_DISK, Disk
from bkref.impl.storage.entrylog import EntryLogger, log_ids
from bkref.impl.storage.index import IndexStore, LedgerIndex
from bkref.impl.storage.journal import (
    Callback,
    Journal,
    LogMark,
    journal_ids,
    journal_path,
)
from bkref.impl.storage.records import BadTail, decode_records, encode_record

log = logging.getLogger(__name__)

_MARK = struct.Struct(">QQI")


@dataclass(frozen=True, slots=True)
class StorageConfig:
    journal_sync_data: bool = True  # journalSyncData
    journal_max_group_wait_ms: float = 2.0  # journalMaxGroupWaitMSec
    journal_buffered_writes_threshold: int = 512 * 1024  # journalBufferedWritesThreshold
    journal_flush_when_queue_empty: bool = False  # journalFlushWhenQueueEmpty
    journal_max_size: int = 2048 * 1024 * 1024  # journalMaxSizeMB
    entry_log_size_limit: int = 1024 * 1024 * 1024  # logSizeLimit


@dataclass(slots=True)
class ReplayReport:
    journals: int = 0
    records: int = 0
    truncated: list[str] = field(default_factory=list)


@dataclass(slots=True)
class GcReport:
    deleted_ledgers: list[int] = field(default_factory=list)
    deleted_logs: list[int] = field(default_factory=list)
    compacted_logs: list[int] = field(default_factory=list)
    bytes_reclaimed: int = 0


class BookieStorage:
    """``disk``: how files are changed (a ``CrashDisk`` lets a test lose what was not
    fsynced). ``plants``: the planted bugs to switch on (none by default)."""

    def __init__(
        self,
        journal_dir: Path,
        ledger_dir: Path,
        config: StorageConfig | None = None,
        *,
        disk: Disk = OS_DISK,
        plants: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config or StorageConfig()
        self.journal_dir = journal_dir
        self.ledger_dir = ledger_dir
        self.disk = disk
        journal_dir.mkdir(parents=True, exist_ok=True)
        (ledger_dir / "index").mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # index and entry-log buffer
        self._maintenance = threading.Lock()  # one checkpoint / GC at a time
        self.index = IndexStore(ledger_dir / "index", disk)
        self.entrylog = EntryLogger(ledger_dir, self.config.entry_log_size_limit, disk)
        # PLANTED BUG switch (test-only, bkref/impl/core/planted.py): replay forgets LACs.
        self._replay_forgets_lac = planted("bookie-forgets-lac-on-replay", plants)
        self.replay = self._replay()
        ids = journal_ids(journal_dir)
        c = self.config
        self.journal = Journal(
            journal_dir,
            (ids[-1] + 1) if ids else 0,
            sync_data=c.journal_sync_data,
            max_group_wait_ms=c.journal_max_group_wait_ms,
            buffered_threshold=c.journal_buffered_writes_threshold,
            max_size=c.journal_max_size,
            flush_when_queue_empty=c.journal_flush_when_queue_empty,
            disk=disk,
            plants=plants,
        )
        self.checkpoint()

    # ------------------------------------------------------------ state for the core

    def ledger_infos(self) -> dict[int, LedgerInfo]:
        with self._lock:
            return {
                lg: LedgerInfo(ix.master_key, ix.fenced, ix.lac, max(ix.entries, default=-1))
                for lg, ix in self.index.ledgers.items()
            }

    def contents(self) -> dict[int, tuple[int, bool, int]]:
        """Per ledger: its entries (a mask, bit e for entry e), whether it is fenced,
        and its LAC. What a trace's ``bookie_restarts`` says the bookie came back with."""
        with self._lock:
            return {
                lg: (sum(1 << e for e in ix.entries), ix.fenced, ix.lac)
                for lg, ix in self.index.ledgers.items()
            }

    def ledger_ids(self) -> set[int]:
        with self._lock:
            return set(self.index.ledgers)

    # ------------------------------------------------------------ add / read

    def persist(self, records: tuple[JournalRecord, ...], callback: Callback) -> None:
        """Apply ``records`` to the entry log and index, then journal them; ``callback``
        runs (on the journal thread) once they are durable."""
        with self._lock:
            for r in records:
                self._apply(r)
        self.journal.append(b"".join(encode_record(r) for r in records), callback)

    def _apply(self, r: JournalRecord, *, replaying: bool = False) -> None:
        ix = self.index.ledgers.get(r.ledger_id)
        if isinstance(r, JournalMasterKey):
            if ix is None:
                self.index.ledgers[r.ledger_id] = LedgerIndex(r.master_key)
                self.index.dirty.add(r.ledger_id)
            return
        if ix is None:  # records of a ledger deleted by GC since; nothing to keep
            return
        if isinstance(r, JournalFence):
            ix.fenced = True
        elif isinstance(r, JournalAdd):
            ix.entries[r.entry_id] = self.entrylog.add(r.ledger_id, r.entry_id, r.body)
            if not (replaying and self._replay_forgets_lac):
                ix.lac = max(ix.lac, peek_fields(r.body)[2])
        self.index.dirty.add(r.ledger_id)

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        with self._lock:
            ix = self.index.ledgers.get(ledger_id)
            loc = None if ix is None else ix.entries.get(entry_id)
            if loc is None:
                return None
            _, _, body = self.entrylog.read(*loc)
            return body

    # ------------------------------------------------------------ checkpoint

    def checkpoint(self) -> LogMark:
        """Flush entry logs and index, then persist the LastLogMark and drop older journals."""
        with self._maintenance:
            mark = self.journal.mark()
            with self._lock:
                self.entrylog.write_buffer()
                snapshot = self.index.snapshot_dirty()
            self.entrylog.flush()
            self.index.write(snapshot)
            self._write_mark(mark)
            for jid in journal_ids(self.journal_dir):
                if jid < mark.journal_id:
                    self.disk.unlink(journal_path(self.journal_dir, jid))
            return mark

    def _mark_path(self) -> Path:
        return self.journal_dir / "lastMark"

    def _write_mark(self, mark: LogMark) -> None:
        data = struct.pack(">QQ", mark.journal_id, mark.offset)
        tmp = self.journal_dir / "lastMark.tmp"
        fd = self.disk.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self.disk.write(fd, data + struct.pack(">I", crc32c(data)))
            self.disk.fsync(fd)
        finally:
            self.disk.close(fd)
        self.disk.replace(tmp, self._mark_path())
        self.disk.fsync_dir(self.journal_dir)

    def read_mark(self) -> LogMark:
        p = self._mark_path()
        if not p.exists():
            return LogMark(0, 0)
        raw = p.read_bytes()
        if len(raw) != _MARK.size or crc32c(raw[:16]) != _MARK.unpack(raw)[2]:
            log.warning("LastLogMark %s is corrupt; replaying every journal file", p)
            return LogMark(0, 0)
        jid, off, _ = _MARK.unpack(raw)
        return LogMark(jid, off)

    # ------------------------------------------------------------ replay

    def _replay(self) -> ReplayReport:
        report = ReplayReport()
        mark = self.read_mark()
        for jid in journal_ids(self.journal_dir):
            if jid < mark.journal_id:
                continue
            path = journal_path(self.journal_dir, jid)
            data = path.read_bytes()
            start = mark.offset if jid == mark.journal_id else 0
            report.journals += 1
            for item in decode_records(data, start):
                if isinstance(item, BadTail):
                    msg = (
                        f"journal {path}: {item.reason} at offset {item.offset}; ignoring the "
                        f"last {item.trailing} bytes (a torn write: that record was never "
                        "acknowledged, so nothing acknowledged is lost)"
                    )
                    log.warning("%s", msg)
                    report.truncated.append(msg)
                    break
                _, _, rec = item
                self._apply(rec, replaying=True)
                report.records += 1
        if report.records:
            log.info(
                "replayed %d journal records from %d files after LastLogMark %s",
                report.records,
                report.journals,
                mark,
            )
        return report

    # ------------------------------------------------------------ GC and compaction

    def entry_log_usage(self) -> dict[int, tuple[int, int]]:
        """Per finished entry log: (bytes still referenced by the index, total bytes)."""
        out: dict[int, tuple[int, int]] = {}
        with self._lock:
            live = {loc for ix in self.index.ledgers.values() for loc in ix.entries.values()}
            current = self.entrylog.current
        for lid in log_ids(self.ledger_dir):
            if lid == current:
                continue
            used = total = 0
            for off, _lg, _e, size in self.entrylog.scan(lid):
                total += size
                if (lid, off) in live:
                    used += size
            out[lid] = (used, total)
        return out

    def garbage_collect(
        self, live_ledgers: set[int], candidates: set[int], compaction_threshold: float = 0.0
    ) -> GcReport:
        """Delete ``candidates`` missing from ``live_ledgers``; remove unreferenced entry logs;
        compact logs whose live fraction is below ``compaction_threshold``.

        ``candidates`` must be the bookie's ledgers taken *before* ``live_ledgers`` was
        listed, so that a ledger created after the listing is never deleted."""
        report = GcReport()
        with self._maintenance, self._lock:
            for lg in sorted(candidates - live_ledgers):
                if lg in self.index.ledgers:
                    self.index.delete(lg)
                    report.deleted_ledgers.append(lg)
        if report.deleted_ledgers:
            # Move the LastLogMark past the deleted ledgers' journal records, or a restart
            # would replay them and bring the ledgers back until the next GC.
            self.checkpoint()
        for lid, (used, total) in self.entry_log_usage().items():
            if used == 0:
                self._delete_log(lid)
                report.deleted_logs.append(lid)
                report.bytes_reclaimed += total
            elif total and used / total < compaction_threshold:
                self._compact(lid)
                report.compacted_logs.append(lid)
                report.bytes_reclaimed += total - used
        return report

    def _delete_log(self, lid: int) -> None:
        with self._maintenance, self._lock:
            self.entrylog.delete(lid)

    def _compact(self, lid: int) -> None:
        """Copy the live entries of log ``lid`` to the current log, then delete ``lid``."""
        with self._maintenance:
            with self._lock:
                locs = {
                    (lg, e): loc
                    for lg, ix in self.index.ledgers.items()
                    for e, loc in ix.entries.items()
                    if loc[0] == lid
                }
                for (lg, e), loc in sorted(locs.items()):
                    _, _, body = self.entrylog.read(*loc)
                    self.index.ledgers[lg].entries[e] = self.entrylog.add(lg, e, body)
                    self.index.dirty.add(lg)
                self.entrylog.write_buffer()
                snapshot = self.index.snapshot_dirty()
            # The copies and the index pointing at them are durable before the old log goes.
            self.entrylog.flush()
            self.index.write(snapshot)
            with self._lock:
                self.entrylog.delete(lid)

    def entry_log_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.ledger_dir.glob("*.log"))

    def disk_bytes(self) -> int:
        total = 0
        for d in (self.journal_dir, self.ledger_dir):
            for root, _dirs, files in os.walk(d):
                total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
        return total

    def close(self) -> None:
        """Clean shutdown: a last checkpoint, so a restart has no journal to replay."""
        self.journal.close()
        self.checkpoint()
        with self._lock:
            self.entrylog.close()

    def abandon(self) -> None:
        """Stop as a crash would (tests): journal writes finish, buffered entry-log bytes are
        lost and nothing is checkpointed. The page cache survives a killed process; on a
        ``CrashDisk``, ``disk.crash()`` afterwards loses what was not fsynced as well."""
        self.journal.close()
        self.entrylog.abandon()
